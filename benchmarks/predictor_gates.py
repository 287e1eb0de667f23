"""Confidence gates for the learned pick: tie tolerances, chosen or fixed, per scenario.

For a study dataset, fits a regressor (the shipped model's features: graph, cluster and
scenario; ``--structure order_stats`` adds the order statistics) once per
family-grouped fold, and within each fold's training rows once per inner fold (the inner
cross-validation of `OrderPredictor(tie_tolerance=None)`), then ranks the held-out rows'
expected regrets with:

- ``tol<t>``: a fixed tie tolerance ``t`` (the orders within ``t`` of the lowest expected
  regret go to the safest: the training rows' best fixed order; ``tolinf``: always it);
- ``scen-tol<t>``: the same, the safest order taken among the training rows of the row's
  scenario (the per-scenario best fixed order as the prior);
- ``gate-cv`` / ``scen-gate-cv``: the tolerance chosen per fold by the inner
  cross-validation (lowest inner mean regret, the largest among equals), as
  ``tie_tolerance=None`` does; ``-families``: the fewest inner families worse than the
  inner best fixed order by more than 1 point first, then the lowest mean regret.

and prints, next to the baselines, each one's mean regret, its ratio to ``best-fixed``,
the worst family's excess and the families worse beyond noise (`evaluate`), and the mean
regret per scenario.

    python benchmarks/predictor_gates.py [--data bundled:greedy] [--folds 10]
        [--params '{"num_leaves": 7}'] [--no-inner] [--structure order_stats [--pooled]]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import numpy as np
import pandas as pd

from travorder.predictor.dataset import design_matrix
from travorder.predictor.evaluate import Evaluation, evaluate, family_folds
from travorder.predictor.model import TOLERANCES, OrderPredictor, regrets, tie_ranking
from travorder.predictor.structure import ORDER_STATS
from travorder.predictor.train import read_sources, structure_columns

INNER = 3


def _scenario_safety(regret: np.ndarray, scenario: np.ndarray, train: np.ndarray,
                     rows: np.ndarray) -> np.ndarray:
    """Per row of ``rows``: each order's mean regret on the ``train`` rows of its scenario."""
    out = np.zeros((rows.size, regret.shape[1]))
    for s in np.unique(scenario[rows]):
        same = train[scenario[train] == s]
        out[scenario[rows] == s] = regret[same if same.size else train].mean(axis=0)
    return out


def _pooled_regret(X: pd.DataFrame, orders: list[str], log_ratio: np.ndarray,
                   train: np.ndarray, held_out: np.ndarray) -> np.ndarray:
    """Expected regret per order of the ``held_out`` rows from one LightGBM regressor
    fitted on the ``train`` rows' (row, order) pairs (see the module docstring)."""
    import lightgbm as lgb

    k = len(orders)
    graph = X[[c for c in X.columns if not c.startswith("o_")]].to_numpy()
    own = np.stack([X[[f"o_{o}_{s}" for s in ORDER_STATS]].to_numpy() for o in orders],
                   axis=1)
    rel = own - own.mean(axis=1, keepdims=True)

    def pairs(rows: np.ndarray) -> np.ndarray:
        return np.hstack([np.repeat(graph[rows], k, axis=0),
                          own[rows].reshape(rows.size * k, -1),
                          rel[rows].reshape(rows.size * k, -1),
                          np.tile(np.arange(k), rows.size)[:, None]])

    model = lgb.LGBMRegressor(n_estimators=400, learning_rate=0.05, min_child_samples=20,
                              subsample=0.8, subsample_freq=1, colsample_bytree=0.8,
                              verbose=-1, n_jobs=1)
    model.fit(pairs(train), log_ratio[train].reshape(-1),
              categorical_feature=[graph.shape[1] + 2 * len(ORDER_STATS)])
    return np.expm1(np.maximum(model.predict(pairs(held_out)).reshape(-1, k), 0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", default="bundled:greedy")
    ap.add_argument("--folds", type=int, default=10)
    ap.add_argument("--params", default="{}", help="OrderPredictor parameters (JSON)")
    ap.add_argument("--no-inner", action="store_true", help="fixed tolerances only")
    ap.add_argument("--structure", default="", help="extra feature blocks, e.g. order_stats")
    ap.add_argument("--pooled", action="store_true",
                    help="also one regressor over (row, order) pairs (needs order_stats)")
    args = ap.parse_args()
    blocks = tuple(b for b in args.structure.split(",") if b)
    if args.pooled and "order_stats" not in blocks:
        ap.error("--pooled sees each order through its statistics: add --structure "
                 "order_stats")
    params = json.loads(args.params)
    frame = read_sources([args.data])
    data = design_matrix(frame)
    if blocks:
        data = replace(data, X=pd.concat(
            [data.X, *structure_columns(data, blocks, args.folds).columns.values()], axis=1))
    T = data.times.to_numpy()
    regret = regrets(T)
    scenario = frame["scenario"].astype(str).to_numpy()
    fold = family_folds(data.family, args.folds)
    n, k = T.shape
    predicted, safety, scen_safety = np.zeros((n, k)), np.zeros((n, k)), np.zeros((n, k))
    pooled = np.zeros((n, k))
    inner: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    fit_params = {**params, "tie_tolerance": 0.0}
    for f in np.unique(fold):
        held_out, train = np.flatnonzero(fold == f), np.flatnonzero(fold != f)
        model = OrderPredictor("regressor", **fit_params).fit(data.X.iloc[train],
                                                             data.times.iloc[train])
        predicted[held_out] = model.expected_regret(data.X.iloc[held_out])
        safety[held_out] = model.mean_regret_
        scen_safety[held_out] = _scenario_safety(regret, scenario, train, held_out)
        if args.pooled:
            pooled[held_out] = _pooled_regret(data.X, data.orders, np.log1p(regret), train,
                                              held_out)
        if not args.no_inner:
            sub = family_folds(data.family[train], INNER)
            pred, safe, scen = np.zeros((train.size, k)), np.zeros((train.size, k)), \
                np.zeros((train.size, k))
            for g in range(INNER):
                test, rest = train[sub == g], train[sub != g]
                m = OrderPredictor("regressor", **fit_params).fit(data.X.iloc[rest],
                                                                 data.times.iloc[rest])
                pred[sub == g] = m.expected_regret(data.X.iloc[test])
                safe[sub == g] = m.mean_regret_
                scen[sub == g] = _scenario_safety(regret, scenario, rest, test)
            inner[f] = (pred, safe, scen)
        print(f"fold {f + 1}/{np.unique(fold).size} fitted", flush=True)

    rankings = {}
    for t in (*TOLERANCES, np.inf):
        name = "inf" if np.isinf(t) else f"{t:g}"
        rankings[f"tol{name}"] = tie_ranking(predicted, safety, t)
        rankings[f"scen-tol{name}"] = tie_ranking(predicted, scen_safety, t)
    if args.pooled:
        rankings["pooled-tol0.02"] = tie_ranking(pooled, safety, 0.02)
    for label, per_scenario, families_first in (
            ("gate-cv", False, False), ("scen-gate-cv", True, False),
            ("gate-cv-families", False, True), ("scen-gate-cv-families", True, True)):
        if not inner:
            break
        ranked, chosen = np.zeros((n, k), dtype=int), []
        for f, (pred, safe, scen) in inner.items():
            train, held_out = np.flatnonzero(fold != f), fold == f
            prior = scen if per_scenario else safe
            sub = family_folds(data.family[train], INNER)
            fixed = np.zeros(train.size, dtype=int)
            for g in range(INNER):
                fixed[sub == g] = regret[train[sub != g]].mean(axis=0).argmin()
            score = {}
            for t in (*TOLERANCES, np.inf) if families_first else TOLERANCES:
                picked = regret[train, tie_ranking(pred, prior, t)[:, 0]]
                excess = pd.Series(picked - regret[train, fixed]).groupby(
                    data.family[train]).mean()
                # the inner families worse beyond the greedy placer's 1-point tie gap
                worse = int((excess > 0.01).sum()) if families_first else 0
                score[t] = (worse, picked.mean())
            t = max(t for t, r in score.items() if r[0] == min(score.values())[0]
                    and r[1] <= min(score.values())[1] + 1e-12)
            chosen.append(t)
            ranked[held_out] = tie_ranking(predicted[held_out],
                                           (scen_safety if per_scenario else safety)[held_out],
                                           t)
        rankings[label] = ranked
        print(f"{label}: tolerance chosen per fold {chosen}")
    ev = evaluate(data, kinds=(), rankings=rankings, verify=(), folds=args.folds)
    t = ev.table
    fixed = t.loc["best-fixed", "mean_regret"]
    print(f"{args.data}: {n} rows, {args.folds} family folds, "
          f"regressor({'+'.join(blocks)}) {params or ''}")
    print("| method | mean regret | / best-fixed | top-1 | worst family | families worse |")
    for m in [*rankings, "best-fixed", "best-fixed-per-scenario"]:
        r = t.loc[m]
        print(f"| {m} | {100 * r.mean_regret:.2f}% | {r.mean_regret / fixed:.2f} | "
              f"{r.top1:.3f} | {100 * r.worst_family_excess:+.1f} | "
              f"{int(r.families_worse)} |")
    b = ev.breakdown.xs("all", level="cluster")["mean_regret"].unstack("scenario")
    print("| method | " + " | ".join(b.columns) + " |")
    shown = ["tol0.02", "pooled-tol0.02", "gate-cv", "scen-gate-cv", "best-fixed",
             "best-fixed-per-scenario"]
    for m, r in b.loc[[m for m in shown if m in b.index]].iterrows():
        print(f"| {m} | " + " | ".join(f"{100 * v:.2f}%" for v in r) + " |")
    print_worse_families(ev, [m for m in ("tol0.02", "pooled-tol0.02", "gate-cv")
                              if m in rankings])


def print_worse_families(ev: Evaluation, methods: list[str]) -> None:
    """A line per method: the families worse than ``best-fixed`` beyond noise, by name."""
    for m in methods:
        fam = ev.families.loc[m]
        worse = fam[fam["worse"]]
        print(f"{m}: families worse beyond noise: " + (", ".join(
            f"{f} {100 * r.excess:+.1f}" for f, r in worse.iterrows()) or "none"))


if __name__ == "__main__":
    main()
