"""The study's dataset: one row per (graph, scenario, cluster, placer configuration).

Columns (see docs/study.md):

- the graph: ``graph``, ``graph_hash`` (as selected), ``family``, ``source``,
  ``source_nodes`` (before preparation), ``scenario`` and its definition
  ``scenario_def`` (JSON, `Scenario.to_dict`), ``n_nodes`` / ``n_edges`` (the
  prepared graph the placer saw), ``training``, ``coarsen_max_nodes``; its features
  ``f_<name>`` (of the prepared graph) and ``feature_schema``;
- the cluster: ``cluster`` (as the scenario set it) and its features ``c_<name>``; the
  scenario features ``s_<name>`` (`travorder.featurize.scenario`); the placer:
  ``placer``, ``placer_options`` (JSON), ``config_hash``;
- the single-device floor: ``single_device_us``, ``single_device_feasible``;
- per order ``o`` that ran: ``time_<o>`` the mean step time (us) over its seeds,
  ``se_<o>`` its standard error (0 for one seed), ``seeds_<o>`` the number of seeds,
  ``feasible_<o>`` the share of seeds whose placement fits memory;
- ``best_order``, ``best_time_us``, ``ties`` (comma-separated, fastest first),
  ``n_ties``, ``speedup`` (single-device time / best time; NaN when one device does not
  fit), ``construction_ties``, and the size of the order effect: ``worst_order`` and
  ``gap_worst`` (worst / best - 1), ``second_order`` (the fastest order that is not a
  construction tie of the best), ``gap_second`` and ``second_tied``.

Only finished jobs count. The best order has the lowest mean among the orders whose every
seed is feasible (among all orders if none is). An order ``o`` is *tied* with the best
``b`` when the gap between their means is within the noise of either::

    time_o - time_b <= max(rel_tol * time_b, Z * sqrt(se_o**2 + se_b**2))

with ``rel_tol`` = 1% (the gap that counts for deterministic runs) and ``Z`` = 2 (about a
95% two-sided test for the difference of two means). Orders that visited the identical
node sequence, or reached the identical placement, on every seed are *construction
ties*: ``construction_ties`` lists such groups (``a=b;c=d``), they are tied with each
other by construction, and ``second_order`` skips them, so that the order effect is
measured between orders that really differ. The best order is always in ``ties``; the
predictor learns the set ``ties`` and regret is measured with the means.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from travorder.errors import FormatError, TravorderError, check_regular, write_file
from travorder.featurize import FEATURE_NAMES, FEATURE_SCHEMA_VERSION
from travorder.graph import OpGraph
from travorder.placement import ORDERS, Cluster
from travorder.placement.placers import falls_back
from travorder.study.scenarios import Scenario, row_scenario, scenario_definitions
from travorder.study.store import ResultStore

#: The relative gap under which an order counts as tied with the best (1%).
REL_TOL = 0.01

#: Standard errors of the difference of two means within which two orders are tied.
Z = 2.0

#: The datasets of the bundled study, in ``travorder/study/data``: each name's parts.
BUNDLED_DATASETS = {
    "greedy": ("greedy.parquet", "greedy-clusters.parquet"),
    "rl": ("rl.parquet", *(f"rl-pipelined-{i}.parquet" for i in range(1, 6)),
           *(f"rl-full-{i}.parquet" for i in range(1, 5)),
           *(f"rl-4gpu-{i}.parquet" for i in range(1, 4))),
    "greedy-perturbed": ("greedy-perturbed.parquet",),
    "rl-perturbed": ("rl-perturbed.parquet", *(f"rl-perturbed-{i}.parquet" for i in (2, 3))),
}

_GROUP = ["graph_hash", "graph_name", "scenario", "cluster", "cluster_hash", "placer",
          "config_hash", "placer_options", "training", "coarsen_max_nodes"]


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
        f"SELECT {', '.join(_GROUP)}, order_name, seed, step_time_us, feasible, placement, "
        f"order_hash, single_device_us, single_device_feasible, study_hash "
        f"FROM jobs WHERE status = 'done'{where}", store.connection, params=params)


def tied_with(time_o: float, se_o: float, time_b: float, se_b: float,
              rel_tol: float = REL_TOL) -> bool:
    """Whether order ``o`` is tied with the best order ``b`` (see the module docstring).

    >>> tied_with(100.5, 0.0, 100.0, 0.0), tied_with(103.0, 0.0, 100.0, 0.0)
    (True, False)
    >>> tied_with(110.0, 4.0, 100.0, 3.0)  # 10 < 2 * 5
    True
    """
    return time_o - time_b <= max(rel_tol * time_b, Z * float(np.hypot(se_o, se_b)))


def _construction_groups(per_order: dict[str, Any]) -> list[list[str]]:
    """Groups of orders with identical sequences or placements on every seed."""
    keys = {}
    for o, g in per_order.items():
        by_seed = g.sort_values("seed")
        keys[o] = (tuple(by_seed["seed"]), tuple(by_seed["order_hash"]),
                   tuple(by_seed["placement"]))
    parent = {o: o for o in keys}

    def root(o: str) -> str:
        while parent[o] != o:
            o = parent[o]
        return o

    names = list(keys)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            ka, kb = keys[a], keys[b]
            if ka[0] == kb[0] and (ka[1] == kb[1] or ka[2] == kb[2]):
                parent[root(b)] = root(a)
    groups: dict[str, list[str]] = {}
    for o in names:
        groups.setdefault(root(o), []).append(o)
    return [g for g in groups.values() if len(g) > 1]


def _row(key: tuple[Any, ...], jobs: Any, orders: list[str], rel_tol: float
         ) -> dict[str, Any]:
    rec: dict[str, Any] = dict(zip(_GROUP, key, strict=True))
    per_order = dict(tuple(jobs.groupby("order_name", sort=False)))
    times, ses, feasible = {}, {}, {}
    for o in orders:
        g = per_order.get(o)
        n = 0 if g is None else len(g)
        times[o] = float(g["step_time_us"].mean()) if n else np.nan
        ses[o] = float(g["step_time_us"].std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0
        feasible[o] = float(g["feasible"].mean()) if n else np.nan
        rec.update({f"time_{o}": times[o], f"se_{o}": ses[o], f"seeds_{o}": n,
                    f"feasible_{o}": feasible[o]})
    groups = _construction_groups({o: per_order[o] for o in orders if o in per_order})
    first = jobs.iloc[0]
    single_ok = bool(first["single_device_feasible"])
    single_us = np.nan if first["single_device_us"] is None else float(
        first["single_device_us"])
    rec.update({"study_hash": first["study_hash"], "single_device_us": single_us,
                "single_device_feasible": single_ok,
                **_summary(times, ses, feasible, groups, single_us, single_ok, rel_tol)})
    return rec


def _summary(times: dict[str, float], ses: dict[str, float], feasible: dict[str, float],
             groups: list[list[str]], single_us: float, single_ok: bool, rel_tol: float
             ) -> dict[str, Any]:
    """A row's columns from ``best_order`` to ``second_tied`` (the module docstring)."""
    ran = [o for o in times if not np.isnan(times[o])]
    pool = [o for o in ran if feasible[o] == 1.0] or ran
    pool.sort(key=lambda o: (times[o], o))
    best = pool[0]
    same = next((set(g) for g in groups if best in g), {best})
    ties = [o for o in pool if o in same
            or tied_with(times[o], ses[o], times[best], ses[best], rel_tol)]
    others = [o for o in pool if o not in same]
    worst = max(ran, key=lambda o: (times[o], o))
    return {
        "best_order": best, "best_time_us": times[best],
        "ties": ",".join(ties), "n_ties": len(ties),
        "speedup": single_us / times[best] if single_ok else np.nan,
        "construction_ties": ";".join("=".join(g) for g in groups),
        "worst_order": worst, "gap_worst": times[worst] / times[best] - 1,
        "second_order": others[0] if others else None,
        "gap_second": times[others[0]] / times[best] - 1 if others else np.nan,
        "second_tied": (tied_with(times[others[0]], ses[others[0]], times[best],
                                  ses[best], rel_tol) if others else True),
    }


def _tie_groups(ties: Any) -> list[list[str]]:
    """The groups of a row's ``construction_ties`` (``a=b;c=d``; none if missing)."""
    return [g.split("=") for g in ties.split(";") if g] if isinstance(ties, str) else []


def _row_summary(rec: dict[str, Any], orders: list[str], groups: list[list[str]],
                 single_ok: bool, rel_tol: float = REL_TOL) -> dict[str, Any]:
    """`_summary` of a dataset row ``rec`` (a dict); missing ``se_`` count as 0 and
    missing ``feasible_`` as 1."""
    return _summary({o: rec[f"time_{o}"] for o in orders},
                    {o: rec.get(f"se_{o}", 0.0) for o in orders},
                    {o: rec.get(f"feasible_{o}", 1.0) for o in orders}, groups,
                    rec.get("single_device_us", np.nan), single_ok, rel_tol)


#: The columns of the single-device floor, which `as_placed` needs.
FLOOR_COLUMNS = ("single_device_us", "single_device_feasible")


def as_placed(data: Any, rel_tol: float = REL_TOL) -> Any:
    """``data`` as `travorder.place` hands placements back: with the single-device floor.

    Where one device holds the step and an order's placement is slower than it, or does
    not fit memory on some seed (`travorder.placement.placers.falls_back`), its
    ``time_``, ``se_`` and ``feasible_`` become the single device's (``se`` 0), and the
    summary columns follow (rows without any step time stay as they are). A dataset
    without ``se_`` or ``feasible_`` columns counts as one seed per order, feasible (the
    columns are added). Over several seeds the floor applies to the mean, which can only
    overstate that order's mean step time as placed (the mean of ``min(time, floor)`` is
    at most the ``min`` of the mean), and the floored order's ``se`` 0 can only make
    ties with it stricter.

    >>> import pandas as pd
    >>> row = {"single_device_us": 100.0, "single_device_feasible": True,
    ...        "construction_ties": "", "time_a": 90.0, "se_a": 0.0, "feasible_a": 1.0,
    ...        "time_b": 130.0, "se_b": 0.0, "feasible_b": 1.0}
    >>> placed = as_placed(pd.DataFrame([row]))
    >>> r = placed.iloc[0]
    >>> float(r["time_b"]), r["best_order"], round(float(r["gap_worst"]), 3)
    (100.0, 'a', 0.111)
    """
    missing = [c for c in FLOOR_COLUMNS if c not in data.columns]
    if missing:
        raise TravorderError(f"dataset lacks the single-device floor ({missing[0]!r}); "
                             "export it again from its result store")
    import pandas as pd

    out = data.copy()
    orders = dataset_orders(data)
    single = data["single_device_us"].to_numpy(dtype=float)
    fits = (data["single_device_feasible"].to_numpy(dtype=float, na_value=0.0) > 0) & (
        np.isfinite(single))
    for o in orders:
        t = data[f"time_{o}"].to_numpy(dtype=float)
        se, feasible = order_column(data, "se", o), order_column(data, "feasible", o)
        floor = falls_back(t, feasible >= 1.0, single, fits) & ~np.isnan(t)  # o did not run
        out[f"time_{o}"] = np.where(floor, single, t)
        out[f"se_{o}"] = np.where(floor, 0.0, se)
        out[f"feasible_{o}"] = np.where(floor, 1.0, feasible)
    timed = out[[f"time_{o}" for o in orders]].notna().any(axis=1).to_numpy()
    summaries = [_row_summary(rec, orders, _tie_groups(rec.get("construction_ties")),
                              bool(ok), rel_tol)
                 for rec, ok in zip(out[timed].to_dict("records"), fits[timed],
                                    strict=True)]
    new = pd.DataFrame(summaries, index=out.index[timed])
    for column in new.columns:
        before = out[column] if column in out.columns else pd.Series(np.nan, index=out.index)
        out[column] = new[column].reindex(out.index).where(timed, before)
    return out


def dataset_frame(store_path: str | os.PathLike[str], rel_tol: float = REL_TOL,
                  study: str | None = None) -> Any:
    """The dataset of the store at ``store_path`` as a pandas DataFrame (see the module):
    of all its finished jobs, or of those of the latest run of the study named
    ``study`` (so that results of graphs since changed are left out)."""
    import pandas as pd

    from travorder.featurize.cluster import CLUSTER_FEATURE_NAMES, cluster_features
    from travorder.featurize.scenario import SCENARIO_FEATURE_NAMES

    if not (rel_tol >= 0):
        raise TravorderError(f"rel_tol must be non-negative, got {rel_tol!r}")
    with ResultStore(store_path, create=False) as store:
        jobs = _jobs_frame(store, study)
        graphs = pd.read_sql_query("SELECT * FROM graphs", store.connection)
        clusters = dict(store.connection.execute(
            "SELECT cluster_hash, definition FROM clusters").fetchall())
        pairs = pd.read_sql_query("SELECT * FROM pairs", store.connection)
        scenarios = scenario_definitions(store.connection, str(store_path))
    if jobs.empty:
        raise TravorderError(f"{store_path}: no finished job to export")
    names = set(jobs["order_name"])
    orders = [o for o in ORDERS if o in names] + sorted(names - set(ORDERS))
    data = pd.DataFrame([_row(key, g, orders, rel_tol)
                         for key, g in jobs.groupby(_GROUP, sort=False)])

    feats = pd.DataFrame([json.loads(f) for f in graphs["features"]]).add_prefix("f_")
    graphs = pd.concat([graphs.drop(columns="features"), feats], axis=1)
    graphs = graphs.rename(columns={"name": "graph_name"}).drop(columns="study_hash")
    data = data.merge(graphs, on=["graph_hash", "graph_name", "scenario", "training",
                                  "coarsen_max_nodes"], how="left")
    sfeats = pd.DataFrame([json.loads(f) for f in pairs["features"]]).add_prefix("s_")
    pairs = pd.concat([pairs.drop(columns="features"), sfeats], axis=1)
    data = data.merge(pairs, on=["study_hash", "cluster_hash"], how="left")
    cfeats = {h: cluster_features(Cluster.from_dict(json.loads(d)))
              for h, d in clusters.items()}
    cdf = pd.DataFrame.from_dict(cfeats, orient="index").add_prefix("c_")
    data = data.merge(cdf, left_on="cluster_hash", right_index=True, how="left")

    data = _own_families(data.rename(columns={"graph_name": "graph"}))
    data["training"] = data["training"].astype(bool)
    data["scenario_def"] = [json.dumps(scenarios.get(n, Scenario(name=n)).to_dict(),
                                       sort_keys=True) for n in data["scenario"]]
    front = ["graph", "graph_hash", "family", "source", "source_nodes", "scenario",
             "scenario_def",
             "n_nodes", "n_edges", "training", "coarsen_max_nodes", "cluster", "placer",
             "placer_options", "config_hash", "feature_schema"]
    fcols = [f"f_{n}" for n in FEATURE_NAMES if f"f_{n}" in data.columns]
    fcols += sorted(c for c in data.columns if c.startswith("f_") and c not in fcols)
    ccols = [f"c_{n}" for n in CLUSTER_FEATURE_NAMES if f"c_{n}" in data.columns]
    scols = [f"s_{n}" for n in SCENARIO_FEATURE_NAMES if f"s_{n}" in data.columns]
    ocols = [f"{k}_{o}" for o in orders for k in ("time", "se", "seeds", "feasible")]
    tail = ["single_device_us", "single_device_feasible", "best_order", "best_time_us",
            "ties", "n_ties", "speedup", "construction_ties", "worst_order", "gap_worst",
            "second_order", "gap_second", "second_tied"]
    cols = [*front, *fcols, *ccols, *scols, *ocols, *tail]
    return (data[cols].sort_values(["placer", "scenario", "cluster", "family", "graph"])
            .reset_index(drop=True))


def export_dataset(store_path: str | os.PathLike[str], out: str | os.PathLike[str],
                   rel_tol: float = REL_TOL, study: str | None = None) -> Any:
    """Write the dataset of ``store_path`` (see `dataset_frame`) to ``out``: Parquet
    (``.parquet``, zstd) or CSV (``.csv``, or ``.csv.gz`` compressed); returns it."""
    out = Path(out)
    kind = _kind(out)
    data = dataset_frame(store_path, rel_tol, study)
    out.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    if kind == "parquet":
        data.to_parquet(buf, index=False, compression="zstd")
    else:
        data.to_csv(buf, index=False,
                    compression="gzip" if out.name.lower().endswith(".gz") else None)
    write_file(out, buf.getvalue(), "dataset")
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
    if path.is_dir():
        raise FormatError(f"{str(path)!r} is a folder, not a dataset file (a study's "
                          f".parquet or .csv)")
    kind = _kind(path)
    if not path.is_file():
        check_regular(path, "dataset file")
        raise FormatError(f"no such dataset {str(path)!r}")
    try:
        data = pd.read_parquet(path) if kind == "parquet" else pd.read_csv(path)
    except Exception as exc:  # pyarrow and pandas raise many types for a broken file
        raise FormatError(f"{path}: not a readable dataset ({exc})") from None
    missing = [c for c in ("graph", "graph_hash", "family", "cluster", "best_order", "ties")
               if c not in data.columns]
    if missing or not dataset_orders(data):
        raise FormatError(f"{path}: not a travorder study dataset (no column "
                          f"{(missing or ['time_<order>'])[0]!r})")
    if data.empty:
        raise FormatError(f"{path}: the dataset has no rows")
    numeric = [c for c in data.columns if c.startswith(("f_", "s_", "c_", "time_"))]
    if bad := next((c for c in numeric if not pd.api.types.is_numeric_dtype(data[c])), None):
        raise FormatError(f"{path}: column {bad!r} holds values that are not numbers")
    if problem := _content_problem(data):
        raise FormatError(f"{path}: {problem}")
    return _own_families(data)  # exported before files without one got theirs


def _content_problem(data: Any) -> str:
    """What makes a dataset's values unusable (``""``: nothing): what a hand-edited or
    foreign file gets wrong, refused here rather than as a KeyError in a report or a model
    with a made-up order."""
    columns = set(data.columns)
    if dup := next((c for c in data.columns if "." in c and c.rsplit(".", 1)[1].isdigit()
                    and c.rsplit(".", 1)[0] in columns), None):  # pandas renames a repeat
        return f"column {dup.rsplit('.', 1)[0]!r} appears twice"
    if unknown := [o for o in dataset_orders(data) if o not in ORDERS]:
        return f"column 'time_{unknown[0]}' is the step time of no order"
    needed = [f"f_{n}" for n in FEATURE_NAMES] if FEATURE_SCHEMA_VERSION in set(
        data.get("feature_schema", [FEATURE_SCHEMA_VERSION])) else []  # older: others
    if lacking := [c for c in needed if c not in columns]:
        return f"no column {lacking[0]!r} (of an older travorder, or edited?)"
    for column in ("graph", "graph_hash", "cluster", "scenario", "best_order"):
        if column in columns and not all(isinstance(v, str) and v != ""
                                         for v in data[column].unique()):
            return f"column {column!r} has rows without a name (empty or not text)"
    features = data[[c for c in data.columns if c.startswith(("f_", "s_", "c_"))]]
    if not np.isfinite(features.to_numpy(dtype=float)).all():
        return "a feature is not a finite number in some rows"
    if bad := bad_step_time(data, dataset_orders(data)):
        return f"a step time is not finite and positive in some rows: {bad[0]} ({bad[1]})"
    if "coarsen_max_nodes" in columns and not _whole_numbers(data["coarsen_max_nodes"]):
        return "column 'coarsen_max_nodes' holds values that are not whole numbers"
    # Names, not per row: a source may hold fewer orders than its rows' summary names
    # (read_sources recomputes the summary where sources are merged).
    if bad := next((b for b in data["best_order"].unique() if b not in ORDERS), None):
        return f"best_order {bad!r} is no order"
    for ties in data["ties"].dropna().unique():
        if not isinstance(ties, str) or not set(ties.split(",")) <= {*ORDERS, ""}:
            return f"ties {ties!r} names something that is no order"
    if "scenario_def" in columns:
        for text in data["scenario_def"].dropna().unique():
            try:
                row_scenario(text)
            except (TravorderError, TypeError, ValueError) as exc:
                return f"scenario_def {str(text)[:40]!r} is not a scenario ({exc})"
    return ""


def bad_step_time(data: Any, orders: Sequence[str]) -> tuple[str, str] | None:
    """Where ``data`` has a step time of one of ``orders`` that is not finite and positive
    (NaN: an order not run, allowed), and how many rows have one; None if none does."""
    times = data[[f"time_{o}" for o in orders]].to_numpy(dtype=float)
    bad = ~(np.isnan(times) | (np.isfinite(times) & (times > 0)))
    if not bad.any():
        return None
    i, j = np.argwhere(bad)[0]
    where = ", ".join(f"{k} {data[k].iloc[i]!r}" for k in ("graph", "cluster", "scenario")
                      if k in data.columns)
    n = int(bad.any(axis=1).sum())
    return (f"row of {where} has a step time of {times[i, j]} for {orders[j]!r}",
            f"{n} row{'s' * (n != 1)} of {len(data)} with one")


def _whole_numbers(column: Any) -> bool:
    """Whether every value of ``column`` (NaN aside) is a whole number."""
    import pandas as pd

    if not pd.api.types.is_numeric_dtype(column):
        return False
    values = column.dropna().to_numpy(dtype=float)
    return bool(np.all(values == np.round(values)))


def _own_families(data: Any) -> Any:
    """``data`` with each graph that has no family (a study's file that names none)
    as a family of its own, named as the graph."""
    # as the graph names' type first: a column with no family at all is of floats (NaN)
    family = data["family"].astype(data["graph"].dtype)
    return data.assign(family=family.fillna(data["graph"]))


def row_graph(row: Any) -> OpGraph | None:
    """The prepared graph of dataset row ``row`` (the graph its jobs placed), or None if
    it cannot be found again: in the bundled corpus by hash, or at its source path."""
    from travorder.datasets.corpus import load_corpus, read_manifest
    from travorder.graph import load_graph

    names = [e["name"] for e in read_manifest() if e["graph_hash"] == row["graph_hash"]]
    try:
        if names:
            graph = load_corpus(names=names[0])[0]
        elif isinstance(row["source"], str) and Path(row["source"]).is_file():
            graph = load_graph(row["source"])
        else:
            return None
    except TravorderError:
        return None
    if graph.graph_hash != row["graph_hash"]:
        return None
    return row_scenario(row["scenario_def"]).prepare(graph, bool(row["training"]),
                                                     int(row["coarsen_max_nodes"]))


def dataset_orders(data: Any) -> list[str]:
    """The orders with a ``time_<order>`` column in ``data``."""
    return [c[len("time_"):] for c in data.columns if c.startswith("time_")]


#: The value of a missing ``se_`` (one seed) or ``feasible_`` (fits) column.
_ORDER_DEFAULTS = {"se": 0.0, "feasible": 1.0}


def order_column(data: Any, kind: str, order: str) -> np.ndarray:
    """Column ``<kind>_<order>`` of ``data`` as floats; a missing ``se_`` reads as 0
    (one seed) and a missing ``feasible_`` as 1 (a hand-made dataset or one of an
    older travorder)."""
    column = f"{kind}_{order}"
    if column in data.columns:
        return data[column].to_numpy(dtype=float)
    return np.full(len(data), _ORDER_DEFAULTS[kind])


def bundled_dataset(name: str = "greedy") -> Any:
    """A dataset of the bundled study (``"greedy"``, ``"rl"``, ``"greedy-perturbed"`` or
    ``"rl-perturbed"``, its parts concatenated; see docs/study.md)."""
    if name not in BUNDLED_DATASETS:
        raise TravorderError(f"unknown bundled dataset {name!r} (expected "
                             f"{', '.join(BUNDLED_DATASETS)})")
    import pandas as pd

    data = resources.files("travorder.study").joinpath("data")
    return pd.concat([load_dataset(Path(str(data.joinpath(part))))
                      for part in BUNDLED_DATASETS[name]], ignore_index=True)


def unperturbed_twins(perturbed: Any, base: Any) -> Any:
    """The rows of ``base`` that are ``perturbed``'s rows on the estimated costs, one per
    perturbed row and in its order: the same graph content, cluster, placer and
    coarsening, in the scenario without the perturbation settings (`Scenario.unperturbed`;
    ``base`` de-duplicated as `deduplicate` does). A perturbed row without exactly one
    twin is an error.

    >>> rows = bundled_dataset("rl-perturbed")
    >>> twins = unperturbed_twins(rows, bundled_dataset("rl"))
    >>> len(twins) == len(rows), sorted(set(twins["scenario"]))
    (True, ['batch=train', 'batch=train,mb=4'])
    """
    keys = ["graph_hash", "cluster", "placer", "coarsen_max_nodes"]
    wanted = perturbed[keys].assign(
        scenario=[row_scenario(d).unperturbed().name for d in perturbed["scenario_def"]],
        _row=np.arange(len(perturbed)))
    matched = wanted.merge(deduplicate(base), on=[*keys, "scenario"], how="inner")
    counts = np.bincount(matched["_row"], minlength=len(perturbed))
    bad = np.flatnonzero(counts != 1)
    if bad.size:
        row = perturbed.iloc[bad[0]]
        raise TravorderError(f"{bad.size} perturbed rows have not exactly one unperturbed "
                             f"twin; the first: {row['graph']} in {row['scenario']} on "
                             f"{row['cluster']} has {counts[bad[0]]}")
    return matched.sort_values("_row").drop(columns="_row").reset_index(drop=True)


def is_store(source: str | os.PathLike[str]) -> bool:
    """Whether ``source`` names a result store (by its suffix) rather than a dataset."""
    return Path(source).suffix.lower() in (".sqlite", ".sqlite3", ".db")


_KEY = ["graph_hash", "cluster", "placer", "config_hash"]


def read_sources(sources: Sequence[str | os.PathLike[str]], study: str | None = None,
                 required: Sequence[str] = ()) -> Any:
    """Concatenate the datasets of result stores, dataset files and bundled datasets
    (``bundled:greedy``, ``bundled:rl``); de-duplicate rows. ``study``: of a store, only
    that study's latest run (`dataset_frame`). ``required``: columns every source must
    have (a dataset of an older version may lack some)."""
    import pandas as pd

    if not sources:
        raise TravorderError("no study results given (stores, datasets or bundled:NAME)")
    if study is not None and not any(is_store(Path(s)) for s in sources):
        raise TravorderError(f"study {study!r} is a study of a result store, and no store "
                             f"is given")
    frames, defined = [], {}  # scenario name -> (definition, source)
    for src in sources:
        p = Path(src)
        if str(src).startswith("bundled:"):
            frames.append(bundled_dataset(str(src).split(":", 1)[1]))
        elif is_store(p):
            frames.append(dataset_frame(p, study=study))
        elif p.is_dir():
            raise FormatError(f"{str(src)!r} is a folder, not a result store or a dataset "
                              f"file (a study's .sqlite, .parquet or .csv)")
        else:
            frames.append(load_dataset(p))
        if missing := [c for c in required if c not in frames[-1].columns]:
            raise TravorderError(f"{str(src)!r}: no column {', '.join(missing)} (a dataset "
                                 f"of an older travorder, or edited?): export it again from "
                                 f"its store")
        for name, text in _scenario_defs(frames[-1]):
            if name not in defined:
                defined[name] = text, src
            elif text != defined[name][0]:
                before, first = row_scenario(defined[name][0]), defined[name][1]
                raise TravorderError(
                    f"scenario {name!r} is defined otherwise in {str(src)!r} than in "
                    f"{str(first)!r} ({row_scenario(text).changes_from(before)}): its rows "
                    f"would be pooled as one scenario; rename it in one study")
    return deduplicate(pd.concat(frames, ignore_index=True))


def _merge_orders(frame: Any, out: Any, groups: Any, orders: list[str]) -> None:
    """Into each group's last row of ``out``, the columns of each order from the group's
    last row that ran it, and the summary columns computed again (`deduplicate`)."""
    import pandas as pd

    number = groups.ngroup().to_numpy()
    rows = groups.ngroup().index.to_numpy()
    last = pd.Series(rows).groupby(number).max().to_numpy()
    ran = {o: ~np.isnan(frame[f"time_{o}"].to_numpy(dtype=float)[rows]) for o in orders}
    taken = {o: pd.Series(np.where(r, rows, -1)).groupby(number).max().to_numpy()
             for o, r in ran.items()}  # per group, the last row that ran o (-1: none)
    merged = np.flatnonzero(np.any([(t >= 0) & (t != last) for t in taken.values()], axis=0))
    if not merged.size:
        return
    for o, t in taken.items():
        move = merged[(t[merged] >= 0) & (t[merged] != last[merged])]
        for column in (f"{k}_{o}" for k in ("time", "se", "seeds", "feasible")):
            if column in frame.columns:
                out.loc[last[move], column] = frame.loc[t[move], column].to_numpy()
    ties = frame["construction_ties"] if "construction_ties" in frame.columns else None
    summaries = []
    for g, rec in zip(merged, out.loc[last[merged]].to_dict("records"), strict=True):
        source = {o: t[g] for o, t in taken.items() if t[g] >= 0}
        in_group = rows[number == g]
        # a construction tie holds between orders whose columns come from one row
        tie_groups = [kept for i in in_group
                      for grp in _tie_groups(None if ties is None else ties.iat[i])
                      if len(kept := [o for o in grp if source.get(o) == i]) > 1]
        single = float(rec.get("single_device_us", np.nan))
        fits = bool(rec.get("single_device_feasible", False)) and np.isfinite(single)
        summaries.append(_row_summary(rec, orders, tie_groups, fits))
    new = pd.DataFrame(summaries, index=last[merged])
    for column in new.columns:
        out.loc[new.index, column] = new[column]


def _scenario_defs(frame: Any) -> list[tuple[str, str]]:
    """The distinct (scenario name, definition) pairs of a dataset's rows, as
    canonical JSON (none for a dataset exported before scenarios)."""
    if "scenario_def" not in frame.columns:
        return []
    pairs = frame[["scenario", "scenario_def"]].drop_duplicates()
    return [(name, json.dumps(row_scenario(text).to_dict(), sort_keys=True))
            for name, text in pairs.itertuples(index=False)]


def deduplicate(frame: Any) -> Any:
    """One row per graph content, cluster and placer configuration: two graphs with one
    structure under two names count once. Of such rows the last one wins, with each order
    it did not run taken from the last row that ran it (two stores that ran different
    orders on one graph add up), and the summary columns computed again over them.

    >>> import pandas as pd
    >>> rows = [{"graph_hash": "g", "cluster": "c", "placer": "p", "config_hash": "h",
    ...          "time_a": 90.0, "time_b": None}, {"graph_hash": "g", "cluster": "c",
    ...          "placer": "p", "config_hash": "h", "time_a": None, "time_b": 80.0}]
    >>> row = deduplicate(pd.DataFrame(rows)).iloc[0]
    >>> float(row["time_a"]), float(row["time_b"]), row["best_order"]
    (90.0, 80.0, 'b')
    """
    key = [k for k in _KEY if k in frame.columns]
    frame = frame.reset_index(drop=True)
    repeated = frame.duplicated(subset=key, keep=False).to_numpy()
    orders = dataset_orders(frame)
    out = frame.copy()
    if orders and repeated.any():
        _merge_orders(frame, out, frame[repeated].groupby(key, sort=False, dropna=False),
                      orders)
    return out.drop_duplicates(subset=key, keep="last").reset_index(drop=True)
