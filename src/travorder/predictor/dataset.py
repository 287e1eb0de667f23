"""From a study dataset to what the predictor learns from.

A study dataset (``travorder study export``) has one row per (graph, scenario, cluster,
placer): ``graph_hash``, ``family``, ``cluster``, graph features ``f_<name>``, scenario
features ``s_<name>``, and per order the mean step time ``time_<order>``; ``ties`` lists
the orders within noise of the best
(comma-separated) and ``c_<name>`` are the cluster features. `design_matrix` returns the
features, the step-time table and the ties; for a frame without cluster features it
computes them from the ``cluster`` preset name (or a ``cluster_json`` column).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from travorder.errors import TravorderError
from travorder.featurize import FEATURE_SCHEMA_VERSION
from travorder.featurize.cluster import CLUSTER_FEATURE_NAMES, cluster_features
from travorder.placement.clusters import Cluster, load_cluster

if TYPE_CHECKING:  # pandas is imported where frames are built: recommending needs none
    import pandas as pd

    from travorder.graph import OpGraph

TIME_PREFIX = "time_"


@dataclass(frozen=True)
class TrainingData:
    """Features ``X``, step times per order ``times``, ``ties`` (a set of orders per row that
    count as best), ``family`` per row (for grouped evaluation) and the source frame."""

    X: pd.DataFrame
    times: pd.DataFrame
    ties: list[frozenset[str]]
    family: np.ndarray
    frame: pd.DataFrame

    @property
    def orders(self) -> list[str]:
        return list(self.times.columns)


def cluster_columns(cluster: Cluster) -> dict[str, float]:
    """The ``c_`` feature columns of one cluster."""
    return {f"c_{k}": v for k, v in cluster_features(cluster).items()}


def design_matrix(frame: pd.DataFrame, orders: list[str] | None = None) -> TrainingData:
    """Split a study dataset into features, step times, ties and families.

    Rows that lack a step time for one of ``orders`` (default: every ``time_`` column
    present in all rows) are dropped.
    """
    import pandas as pd

    missing = [c for c in ("family", "cluster") if c not in frame.columns]
    if missing:
        raise TravorderError(f"dataset lacks column {missing[0]!r}; is it a study export?")
    if frame["family"].isna().any():  # leave-family-out needs every row's
        raise TravorderError(f"{int(frame['family'].isna().sum())} dataset rows have no "
                             f"family")
    schemas = set(frame["feature_schema"].dropna()) if "feature_schema" in frame else set()
    if other := sorted(schemas - {FEATURE_SCHEMA_VERSION}):
        raise TravorderError(
            f"dataset rows have feature schema {other[0]!r}, this travorder computes schema "
            f"{FEATURE_SCHEMA_VERSION}: run the study again to export them")
    time_cols = [c for c in frame.columns if c.startswith(TIME_PREFIX)]
    if orders is None:
        orders = [c[len(TIME_PREFIX):] for c in time_cols if frame[c].notna().all()]
    absent = [o for o in orders if TIME_PREFIX + o not in frame.columns]
    if absent:
        raise TravorderError(f"dataset has no step times for order {absent[0]!r}")
    if len(orders) < 2:
        raise TravorderError(f"dataset needs step times for at least two orders in every "
                             f"row; its rows share {', '.join(orders) or 'none'}")
    cols = [TIME_PREFIX + o for o in orders]
    frame = frame[frame[cols].notna().all(axis=1)].reset_index(drop=True)
    if frame.empty:
        raise TravorderError("dataset has no row with step times for every order")
    cnames = [f"c_{n}" for n in CLUSTER_FEATURE_NAMES]
    try:
        feats = frame[[c for c in frame.columns if c.startswith("f_")]].astype(float)
        sfeats = frame[[c for c in frame.columns if c.startswith("s_")]].astype(float)
        times = frame[cols].astype(float)
        cfeats = frame[cnames].astype(float) if set(cnames) <= set(frame.columns) else None
    except (TypeError, ValueError) as exc:
        raise TravorderError(f"dataset holds a feature or step time that is not a number "
                             f"({exc})") from None
    from travorder.study.export import bad_step_time  # numba: off recommend-order's path

    if bad := bad_step_time(frame, orders):  # before fitting: fit refuses it after folds
        raise TravorderError(f"dataset {bad[0]}: step times must be finite and positive "
                             f"({bad[1]})")
    if cfeats is None:
        clusters = {c: cluster_columns(load_cluster(c)) for c in frame["cluster"].unique()}
        cfeats = pd.DataFrame([clusters[c] for c in frame["cluster"]], columns=cnames)
    times.columns = orders
    best = times.idxmin(axis=1)
    tie_text = frame["ties"] if "ties" in frame.columns else pd.Series("", index=frame.index)
    ties = [frozenset({b} | (set(t.split(",")) & set(orders) if isinstance(t, str) else set()))
            for b, t in zip(best, tie_text, strict=True)]
    return TrainingData(pd.concat([feats, cfeats, sfeats], axis=1), times, ties,
                        frame["family"].astype(str).to_numpy(), frame)


def data_hash(frame: pd.DataFrame) -> str:
    """SHA-256 (hex, 16 chars) of a dataset's content, for the model manifest."""
    import pandas as pd

    h = hashlib.sha256(pd.util.hash_pandas_object(frame, index=False).to_numpy().tobytes())
    return h.hexdigest()[:16]


def feature_row(graph_feats: dict[str, float], cluster: Cluster,
                scenario_feats: dict[str, float] | None = None) -> dict[str, float]:
    """One design-matrix row by column name: graph features ``f_``, the cluster's ``c_``
    columns and the scenario features ``s_`` (`OrderPredictor` takes it as a one-row
    feature matrix)."""
    return ({f"f_{k}": v for k, v in graph_feats.items()} | cluster_columns(cluster)
            | {f"s_{k}": v for k, v in (scenario_feats or {}).items()})


def prepared_graphs(frame: pd.DataFrame, corpus_dir: str | None = None
                    ) -> tuple[list[OpGraph], np.ndarray]:
    """The graphs a study placed for the rows of its dataset: ``(graphs, graph_of_row)``.

    Each row's graph is looked up in the corpus (the bundled one unless ``corpus_dir``) by
    ``graph_hash`` and prepared as the row's scenario (``scenario_def``), ``training`` and
    ``coarsen_max_nodes`` say.
    """
    from travorder.datasets.corpus import load_corpus
    from travorder.study.scenarios import row_scenario

    by_hash = {g.graph_hash: g for g in load_corpus(corpus_dir=corpus_dir)}
    missing = sorted(set(frame["graph_hash"]) - set(by_hash))
    if missing:
        name = frame.loc[frame["graph_hash"] == missing[0], "graph"].iloc[0] \
            if "graph" in frame.columns else missing[0]
        raise TravorderError(f"{len(missing)} graphs of the dataset are not in the corpus "
                             f"(e.g. {name!r}), and the order_stats, order_split and gnn "
                             f"blocks need the graphs the study placed: leave those blocks "
                             f"out, or give the corpus they came from (--corpus, "
                             f"corpus_dir=)")
    defs = frame["scenario_def"] if "scenario_def" in frame.columns else [None] * len(frame)
    keys = list(zip(frame["graph_hash"], frame.get("training", True),
                    frame.get("coarsen_max_nodes", 0), defs, strict=True))
    unique = list(dict.fromkeys(keys))
    graphs = [row_scenario(d).prepare(by_hash[h], bool(t), int(c)) for h, t, c, d in unique]
    index = {k: i for i, k in enumerate(unique)}
    return graphs, np.array([index[k] for k in keys], dtype=np.int64)
