"""The study's dataset: one row per (graph, cluster, placer configuration).

Columns (see docs/study.md):

- the graph: ``graph``, ``graph_hash`` (as selected), ``family``, ``source``,
  ``source_nodes`` (before preparation), ``n_nodes`` / ``n_edges`` (the prepared graph
  the placer saw), ``training``, ``coarsen_max_nodes``; its features ``f_<name>`` (of the
  prepared graph) and ``feature_schema``;
- the cluster: ``cluster`` and its features ``c_<name>``; the placer: ``placer``,
  ``placer_options`` (JSON), ``config_hash``;
- per order ``o`` that ran: ``time_<o>`` the median step time (us) over its seeds,
  ``spread_<o>`` = (max - min) / median over the seeds (0 for one seed), ``seeds_<o>``
  the number of seeds, ``feasible_<o>`` the share of seeds whose placement fits memory;
- ``best_order``, ``best_time_us``, ``ties`` (comma-separated, fastest first) and
  ``n_ties``.

Only finished jobs count. The best order is the one with the lowest median among the
orders whose every seed is feasible (among all orders if none is). An order is *tied*
with the best when its median is within the noise of the best's:
``time_o <= best * (1 + max(rel_tol, spread_best, spread_o))`` with ``rel_tol`` = 1% by
default, i.e. the gap is no larger than the seed-to-seed spread of either order, or 1%.
The best order is always in ``ties``; an evaluation may count a recommendation in
``ties`` as correct.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from travorder.errors import FormatError, TravorderError
from travorder.placement import ORDERS, Cluster
from travorder.study.store import ResultStore

#: The relative gap under which an order counts as tied with the best (1%).
REL_TOL = 0.01

#: The datasets of the bundled study, in ``travorder/study/data``.
BUNDLED_DATASETS = {"greedy": "greedy.parquet", "rl": "rl.parquet"}

_GROUP = ["graph_hash", "graph_name", "cluster", "cluster_hash", "placer", "config_hash",
          "placer_options", "training", "coarsen_max_nodes"]


def study_filter(store: ResultStore, study: str | None) -> tuple[str, tuple[str, ...]]:
    """An SQL condition on ``jobs`` (``" AND ..."``, parameters) keeping the jobs of the
    latest run (plan) of the study named ``study``; no condition for ``study=None``."""
    if study is None:
        return "", ()
    row = store.connection.execute("SELECT plan_hash FROM studies WHERE name = ? ORDER BY "
                                   "created DESC, rowid DESC LIMIT 1", (study,)).fetchone()
    if row is None:
        names = [r[0] for r in store.connection.execute("SELECT DISTINCT name FROM studies")]
        raise TravorderError(f"{store.path}: no study named {study!r} (studies: "
                             f"{', '.join(names) or 'none'})")
    return " AND job_id IN (SELECT job_id FROM plan WHERE plan_hash = ?)", (row[0],)


def _jobs_frame(store: ResultStore, study: str | None) -> Any:
    import pandas as pd

    where, params = study_filter(store, study)
    return pd.read_sql_query(
        f"SELECT {', '.join(_GROUP)}, order_name, seed, step_time_us, feasible "
        f"FROM jobs WHERE status = 'done'{where}", store.connection, params=params)


def _ties(times: dict[str, float], spreads: dict[str, float], feasible: dict[str, float],
          rel_tol: float) -> list[str]:
    """The orders tied with the best, fastest first (see the module docstring)."""
    ran = [o for o, t in times.items() if not np.isnan(t)]
    pool = [o for o in ran if feasible[o] == 1.0] or ran
    if not pool:
        return []
    pool.sort(key=lambda o: (times[o], o))
    best = pool[0]
    return [o for o in pool
            if times[o] <= times[best] * (1 + max(rel_tol, spreads[best], spreads[o]))]


def dataset_frame(store_path: str | os.PathLike[str], rel_tol: float = REL_TOL,
                  study: str | None = None) -> Any:
    """The dataset of the store at ``store_path`` as a pandas DataFrame (see the module):
    of all its finished jobs, or of those of the latest run of the study named
    ``study`` (so that results of graphs since changed are left out)."""
    import pandas as pd

    from travorder.featurize import FEATURE_NAMES
    from travorder.featurize.cluster import CLUSTER_FEATURE_NAMES, cluster_features

    if not (rel_tol >= 0):
        raise TravorderError(f"rel_tol must be non-negative, got {rel_tol!r}")
    with ResultStore(store_path, create=False) as store:
        jobs = _jobs_frame(store, study)
        graphs = pd.read_sql_query("SELECT * FROM graphs", store.connection)
        clusters = dict(store.connection.execute(
            "SELECT cluster_hash, definition FROM clusters").fetchall())
    if jobs.empty:
        raise TravorderError(f"{store_path}: no finished job to export")
    per = (jobs.groupby([*_GROUP, "order_name"], sort=False)
           .agg(median=("step_time_us", "median"), lo=("step_time_us", "min"),
                hi=("step_time_us", "max"), seeds=("seed", "count"),
                feasible=("feasible", "mean"))
           .reset_index())
    per["spread"] = (per["hi"] - per["lo"]) / per["median"]
    orders = [o for o in ORDERS if o in set(per["order_name"])]
    orders += sorted(set(per["order_name"]) - set(orders))
    wide = per.pivot(index=_GROUP, columns="order_name",
                     values=["median", "spread", "seeds", "feasible"])
    rows = []
    for key, row in wide.iterrows():
        rec: dict[str, Any] = dict(zip(_GROUP, key, strict=True))
        times = {o: float(row[("median", o)]) for o in orders}
        spreads = {o: float(row[("spread", o)]) for o in orders}
        feasible = {o: float(row[("feasible", o)]) for o in orders}
        for o in orders:
            rec[f"time_{o}"] = times[o]
            rec[f"spread_{o}"] = spreads[o]
            seeds = row[("seeds", o)]
            rec[f"seeds_{o}"] = 0 if np.isnan(seeds) else int(seeds)
            rec[f"feasible_{o}"] = feasible[o]
        ties = _ties(times, spreads, feasible, rel_tol)
        rec["best_order"] = ties[0]
        rec["best_time_us"] = times[ties[0]]
        rec["ties"] = ",".join(ties)
        rec["n_ties"] = len(ties)
        rows.append(rec)
    data = pd.DataFrame(rows)

    feats = pd.DataFrame([json.loads(f) for f in graphs["features"]]).add_prefix("f_")
    graphs = pd.concat([graphs.drop(columns="features"), feats], axis=1)
    graphs = graphs.rename(columns={"name": "graph_name"})
    data = data.merge(graphs, on=["graph_hash", "graph_name", "training",
                                  "coarsen_max_nodes"], how="left")
    cfeats = {h: cluster_features(Cluster.from_dict(json.loads(d)))
              for h, d in clusters.items()}
    cdf = pd.DataFrame.from_dict(cfeats, orient="index").add_prefix("c_")
    data = data.merge(cdf, left_on="cluster_hash", right_index=True, how="left")

    data = data.rename(columns={"graph_name": "graph"})
    data["training"] = data["training"].astype(bool)
    front = ["graph", "graph_hash", "family", "source", "source_nodes", "n_nodes", "n_edges",
             "training", "coarsen_max_nodes", "cluster", "placer", "placer_options",
             "config_hash", "feature_schema"]
    known = [f"f_{n}" for n in FEATURE_NAMES] + [f"c_{n}" for n in CLUSTER_FEATURE_NAMES]
    fcols = [c for c in known if c in data.columns and c.startswith("f_")]
    fcols += sorted(c for c in data.columns if c.startswith("f_") and c not in fcols)
    ccols = [c for c in known if c in data.columns and c.startswith("c_")]
    ocols = [f"{k}_{o}" for o in orders for k in ("time", "spread", "seeds", "feasible")]
    cols = [*front, *fcols, *ccols, *ocols, "best_order", "best_time_us", "ties", "n_ties"]
    return (data[cols].sort_values(["placer", "cluster", "family", "graph"])
            .reset_index(drop=True))


def export_dataset(store_path: str | os.PathLike[str], out: str | os.PathLike[str],
                   rel_tol: float = REL_TOL, study: str | None = None) -> Any:
    """Write the dataset of ``store_path`` (see `dataset_frame`) to ``out``: Parquet
    (``.parquet``, zstd) or CSV (``.csv``, or ``.csv.gz`` compressed); returns it."""
    out = Path(out)
    kind = _kind(out)
    data = dataset_frame(store_path, rel_tol, study)
    out.parent.mkdir(parents=True, exist_ok=True)
    if kind == "parquet":
        data.to_parquet(out, index=False, compression="zstd")
    else:
        data.to_csv(out, index=False)
    return data


def _kind(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith((".csv", ".csv.gz")):
        return "csv"
    raise TravorderError(f"{str(path)!r}: the dataset file must end in .parquet, .csv or "
                         f".csv.gz")


def load_dataset(path: str | os.PathLike[str]) -> Any:
    """Read a dataset written by `export_dataset` (Parquet or CSV) as a DataFrame."""
    import pandas as pd

    path = Path(path)
    kind = _kind(path)
    if not path.is_file():
        raise FormatError(f"no such dataset {str(path)!r}")
    try:
        data = pd.read_parquet(path) if kind == "parquet" else pd.read_csv(path)
    except Exception as exc:  # pyarrow and pandas raise many types for a broken file
        raise FormatError(f"{path}: not a readable dataset ({exc})") from None
    missing = [c for c in ("graph", "family", "cluster", "best_order", "ties")
               if c not in data.columns]
    if missing or not dataset_orders(data):
        raise FormatError(f"{path}: not a travorder study dataset (no column "
                          f"{(missing or ['time_<order>'])[0]!r})")
    return data


def dataset_orders(data: Any) -> list[str]:
    """The orders with a ``time_<order>`` column in ``data``."""
    return [c[len("time_"):] for c in data.columns if c.startswith("time_")]


def bundled_dataset(name: str = "greedy") -> Any:
    """A dataset of the bundled study (``"greedy"`` or ``"rl"``; see docs/study.md)."""
    if name not in BUNDLED_DATASETS:
        raise TravorderError(f"unknown bundled dataset {name!r} (expected "
                             f"{', '.join(BUNDLED_DATASETS)})")
    return load_dataset(Path(str(resources.files("travorder.study").joinpath(
        "data", BUNDLED_DATASETS[name]))))
