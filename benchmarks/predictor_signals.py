"""Held-out regret of the default regressor with more signals than it ships with.

On a study dataset (default ``bundled:greedy``) with the shipped feature set (graph,
cluster and scenario features and the order splits), in family-grouped folds as
``travorder evaluate --folds K`` deals them, the regressor's pick per scenario against
``critical_path`` (the best fixed order on every fold of the bundled data), for:

- ``shipped``: the features and targets of the default model;
- ``+ coarse placement``: per order, the greedy placement of the prepared graph
  coarsened to ``--coarse`` groups (at most half its nodes), the order projected to
  the groups by their first visited member, simulated on the row's cluster (the
  scenario's); log step time relative to ``critical_path``'s and to the row's best;
  also that placement's pick alone (``coarse pick``);
- ``+ memory split``: per order, the largest piece's memory (parameters and outputs, as
  the placers count it) of the order splits over the scenario's device memory, the
  share of the work visited when the running memory first exceeds one device, the
  memory-weighted mean visit position; each relative to ``critical_path``'s;
- ``+ perturbed rows``: also learning from ``--perturbed``'s rows of the training
  families (the same graphs with perturbed costs);
- ``target capped at c``: learning from ``min(log(T / best), c)``.

    python benchmarks/predictor_signals.py [--folds 10] [--coarse 128] [--caps 0.1,0.25]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd
from joblib import Parallel, delayed

from travorder.graph import OpGraph, colocation_groups
from travorder.graph.coarsen import coarsen
from travorder.placement.clusters import compute_times, load_cluster
from travorder.placement.orders import traversal_order
from travorder.placement.placers import get_placer
from travorder.placement.simulator import Simulator
from travorder.predictor.dataset import TrainingData, design_matrix, prepared_graphs
from travorder.predictor.evaluate import family_folds
from travorder.predictor.model import OrderPredictor, regrets
from travorder.predictor.structure import group_walk, split_pieces
from travorder.predictor.train import read_sources, structure_columns
from travorder.study.scenarios import Scenario, row_scenario

REFERENCE = "critical_path"


def with_splits(sources: list[str], orders: list[str] | None = None) -> TrainingData:
    """The greedy rows of ``sources`` with the order splits, as the shipped model has."""
    frame = read_sources(sources)
    data = design_matrix(frame[frame["placer"] == "greedy"].reset_index(drop=True), orders)
    extra = structure_columns(data, ("order_split",), None, reference=REFERENCE)
    return replace(data, X=pd.concat([data.X, *extra.columns.values()], axis=1))


def regrets_by_scenario(data: TrainingData
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """``data``'s regrets (rows x orders), `REFERENCE`'s regret per row, each row's
    scenario and the scenarios in the order they first appear."""
    regret = regrets(data.times.to_numpy())
    scenario = data.frame["scenario"].to_numpy()
    return (regret, regret[:, data.orders.index(REFERENCE)], scenario,
            list(dict.fromkeys(scenario)))


def coarse_placement(g: OpGraph, rows: list[tuple[int, str, Scenario]], orders: list[str],
                     max_nodes: int) -> dict[int, dict[str, float]]:
    """Per row, each order's step time (us; twice it where infeasible) of the greedy
    placement of ``g`` coarsened to at most ``max_nodes`` groups."""
    c = coarsen(g, min(max_nodes, max(g.n_nodes // 2, 2)))
    group = np.asarray(c.group_of)
    greedy = get_placer("greedy")
    visits = {o: group_walk(group, traversal_order(g, o), c.graph.n_nodes) for o in orders}
    out = {}
    for r, name, scenario in rows:
        cluster = scenario.cluster_for(c.graph, load_cluster(name))
        sim = Simulator(c.graph, cluster)
        res = {o: sim.run(greedy(c.graph, cluster, visits[o], 0)) for o in orders}
        out[r] = {o: x.step_time_us * (1 if x.feasible else 2) for o, x in res.items()}
    return out


def memory_split(g: OpGraph, rows: list[tuple[int, str, Scenario]], orders: list[str]
                 ) -> dict[int, dict[str, float]]:
    """Per row, the memory statistics of each order's split (module docstring)."""
    perms = {o: traversal_order(g, o) for o in orders}
    group = colocation_groups(g)
    out = {}
    for r, name, scenario in rows:
        cluster = scenario.cluster_for(g, load_cluster(name))
        own = g.param_bytes * cluster.param_copies + g.output_bytes
        mem = np.bincount(group, weights=own)
        t = compute_times(g, cluster)
        work = np.bincount(group, weights=t.min(axis=1))
        share = max(float(t.sum(axis=0).min()) / t.shape[1], 1e-300)
        capacity = min(d.memory for d in cluster.devices)
        stats = {}
        for o, perm in perms.items():
            piece = split_pieces(group, work, perm, share, t.shape[1])
            pos = np.empty(g.n_nodes, dtype=np.int64)
            pos[perm] = np.arange(g.n_nodes)
            walk = group_walk(group, perm, work.size)
            full = min(int(np.searchsorted(np.cumsum(mem[walk]), capacity)), walk.size - 1)
            stats |= {
                f"m_{o}_piece": float(np.log(max(np.bincount(piece, weights=mem).max(), 1.0)
                                             / capacity)),
                f"m_{o}_fill": float(np.cumsum(work[walk])[full] / max(work.sum(), 1e-300)),
                f"m_{o}_pos": float((pos * own).sum() / max(own.sum(), 1e-12)
                                    / max(g.n_nodes - 1, 1))}
        out[r] = {f"m_{o}_{k}_rel": stats[f"m_{o}_{k}"] - stats[f"m_{REFERENCE}_{k}"]
                  for o in orders for k in ("piece", "fill", "pos")}
    return out


def per_row(data: TrainingData, fn: Callable[..., dict[int, dict[str, float]]],
            *args: object) -> pd.DataFrame:
    """``fn(graph, rows, orders, *args)`` for each prepared graph, in two processes."""
    graphs, graph_of_row = prepared_graphs(data.frame)
    defs = data.frame.get("scenario_def", pd.Series(None, index=data.frame.index))
    scenarios = [row_scenario(d) for d in defs]
    parts = Parallel(n_jobs=2, batch_size=8)(
        delayed(fn)(g, [(r, data.frame["cluster"][r], scenarios[r])
                        for r in np.flatnonzero(graph_of_row == i)], data.orders, *args)
        for i, g in enumerate(graphs))
    rows = {k: v for p in parts for k, v in p.items()}
    return pd.DataFrame([rows[r] for r in range(len(data.frame))])


def held_out_picks(data: TrainingData, folds: int, X: pd.DataFrame | None = None,
                   times: pd.DataFrame | None = None, more: TrainingData | None = None,
                   **params: Any) -> np.ndarray:
    """The default regressor's pick per row (``params``: other parameters for it), each
    fold's rows held out: fitted on ``X`` / ``times`` (default ``data``'s) of the other
    folds, and on ``more``'s rows of the families of the other folds."""
    X = data.X if X is None else X
    times = data.times if times is None else times
    every = data.family if more is None else np.concatenate([data.family, more.family])
    fold = family_folds(data.family, folds, every)
    pick = np.zeros(len(X), dtype=np.int64)
    for f in np.unique(fold):
        train = fold != f
        Xf, Tf, groups = X[train], times[train], data.family[train]
        if more is not None:
            extra = family_folds(more.family, folds, every) != f
            Xf = pd.concat([Xf, more.X.loc[extra, X.columns]], ignore_index=True)
            Tf = pd.concat([Tf, more.times[extra]], ignore_index=True)
            groups = np.concatenate([groups, more.family[extra]])
        model = OrderPredictor("regressor", **params).fit(Xf, Tf, groups)
        pick[~train] = model.ranking(X[~train])[:, 0]
    return pick


def report(data: TrainingData, picks: dict[str, np.ndarray]) -> None:
    """Mean regret per scenario, and its ratio to ``critical_path``'s, per variant."""
    regret, fixed, scenario, names = regrets_by_scenario(data)
    print("| variant | mean regret | " + " | ".join(names) + " |")
    print("|" + " --- |" * (len(names) + 2))
    for name, pick in {REFERENCE: None, **picks}.items():
        r = fixed if pick is None else regret[np.arange(len(regret)), pick]
        cells = [f"{r[scenario == s].mean() / fixed[scenario == s].mean():.2f}"
                 for s in names]
        print(f"| {name} | {100 * r.mean():.2f}% | " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", default="bundled:greedy")
    ap.add_argument("--perturbed", default="bundled:greedy-perturbed")
    ap.add_argument("--folds", type=int, default=10)
    ap.add_argument("--coarse", type=int, default=128)
    ap.add_argument("--caps", default="0.1,0.25")
    args = ap.parse_args()
    t0 = time.perf_counter()
    data = with_splits([args.data])
    picks = {"shipped": held_out_picks(data, args.folds)}
    print(f"shipped done ({time.perf_counter() - t0:.0f} s)", flush=True)

    coarse = per_row(data, coarse_placement, args.coarse)[data.orders]
    log_t = np.log(coarse.to_numpy())
    ref = data.orders.index(REFERENCE)
    cols = pd.DataFrame(
        {f"q_{o}_{kind}": log_t[:, j] - base
         for j, o in enumerate(data.orders)
         for kind, base in (("rel", log_t[:, ref]), ("min", log_t.min(axis=1)))})
    picks[f"coarse pick ({args.coarse} groups)"] = log_t.argmin(axis=1)
    picks["+ coarse placement"] = held_out_picks(data, args.folds,
                                                 pd.concat([data.X, cols], axis=1))
    print(f"coarse placement done ({time.perf_counter() - t0:.0f} s)", flush=True)

    mem = per_row(data, memory_split)
    picks["+ memory split"] = held_out_picks(data, args.folds,
                                             pd.concat([data.X, mem], axis=1))
    print(f"memory split done ({time.perf_counter() - t0:.0f} s)", flush=True)

    more = with_splits([args.perturbed], data.orders)
    picks["+ perturbed rows"] = held_out_picks(data, args.folds, more=more)
    print(f"perturbed rows done ({time.perf_counter() - t0:.0f} s)", flush=True)

    best = data.times.min(axis=1)
    for cap in (float(c) for c in args.caps.split(",")):
        capped = data.times.clip(upper=best * np.exp(cap), axis=0)
        picks[f"target capped at {cap:g}"] = held_out_picks(data, args.folds,
                                                            times=capped)
    print(f"{args.data}: {len(data.X)} rows, {args.folds} family folds, "
          f"{time.perf_counter() - t0:.0f} s; ratio to {REFERENCE} per scenario")
    report(data, picks)


if __name__ == "__main__":
    main()
