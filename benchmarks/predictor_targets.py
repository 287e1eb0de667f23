"""What the per-order regressors learn from: targets, segments, weights and ensembles.

For a study dataset (default ``bundled:greedy``), fits per family-grouped fold a set of
LightGBM regressors, one per order, in each variant below (the shipped model's
parameters and features: graph, cluster and scenario; ``--structure order_stats`` adds
the order statistics), ranks the held-out rows' expected regrets with tie tolerances 0
and 0.02 (`tie_ranking`, the training rows' best fixed order the safest), and prints
the mean regret (%), the worst family's excess over ``best-fixed``, the families worse
beyond noise and the ratio to ``best-fixed`` per scenario (`evaluate`), then the
families worse beyond noise by name:

- ``shipped``: ``log(step time / best)`` over every row (`OrderPredictor("regressor")`);
- ``relative``: ``log(step time / the best fixed order's)``, that order's prediction 0;
- ``clip1.5``: the shipped target clipped at ``log 1.5``;
- ``weighted``: the shipped target, each micro-batch count's rows weighted by the inverse
  of their mean squared target (clipped at ``log 2``);
- ``pipelined-split``: one set of regressors for the rows without pipelining and one
  for the pipelined rows;
- ``per-micro-batches``: one set per micro-batch count (1, 4, 8);
- ``per-scenario``: one set per scenario;
- ``quantile``: the shipped target, each regressor fitted to its 0.75 quantile (a
  risk-averse pick: an order whose regret is heavy-tailed ranks lower);
- ``probe``: the shipped target, with three features of one placement beside the
  others: the single-device step time (log10), whether one device holds the step, and
  the log speedup over one device of the training rows' best fixed order (the study's
  step time for it; recommending would place the graph once with that order);
- ``a+b``: the mean of two variants' ``log(1 + expected regret)``.

    python benchmarks/predictor_targets.py [--data bundled:greedy] [--folds 10]
        [--structure order_stats]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np
import pandas as pd
from joblib import Parallel, delayed

from predictor_gates import print_worse_families  # benchmarks/predictor_gates.py, beside this
from travorder.predictor.dataset import design_matrix
from travorder.predictor.evaluate import evaluate, family_folds
from travorder.predictor.model import OrderPredictor, regrets, tie_ranking
from travorder.predictor.train import read_sources, structure_columns

ENSEMBLES = (("shipped", "per-scenario"), ("shipped", "pipelined-split"),
             ("per-scenario", "pipelined-split"), ("shipped", "quantile"))
QUANTILE = 0.75


def _per_order(X: np.ndarray, Y: np.ndarray, X_test: np.ndarray,
               weight: np.ndarray | None = None, **params: float | str) -> np.ndarray:
    """One LightGBM regressor per column of ``Y`` (the shipped parameters, updated by
    ``params``), predicted."""
    import lightgbm as lgb

    params = OrderPredictor("regressor")._lgb_params() | params
    return np.column_stack([lgb.LGBMRegressor(**params).fit(X, y, sample_weight=weight)
                            .predict(X_test) for y in Y.T])


def _segmented(X: np.ndarray, log_ratio: np.ndarray, segment: np.ndarray,
               train: np.ndarray, test: np.ndarray) -> np.ndarray:
    out = np.zeros((test.size, log_ratio.shape[1]))
    for s in np.unique(segment[test]):
        rows, held_out = train[segment[train] == s], segment[test] == s
        out[held_out] = _per_order(X[rows], log_ratio[rows], X[test[held_out]])
    return out


def _variant(name: str, X: np.ndarray, T: np.ndarray, segments: dict[str, np.ndarray],
             single: np.ndarray, train: np.ndarray, test: np.ndarray) -> np.ndarray:
    """The held-out rows' predicted log-ratios to their best order (``single``: the
    single-device step time and whether one device holds the step, per row)."""
    log_ratio = np.log(T / T.min(axis=1, keepdims=True))
    ref = (np.exp(log_ratio[train]) - 1).mean(axis=0).argmin()
    if name == "relative":
        pred = _per_order(X[train], np.log(T[train] / T[train, ref, None]), X[test])
        pred[:, ref] = 0.0
        return pred - pred.min(axis=1, keepdims=True)
    if name == "quantile":
        return _per_order(X[train], log_ratio[train], X[test], objective="quantile",
                          alpha=QUANTILE)
    if name == "probe":
        probe = np.column_stack([np.log10(single[:, 0]), single[:, 1],
                                 np.log(single[:, 0] / T[:, ref])])
        Xp = np.hstack([X, probe])
        return _per_order(Xp[train], log_ratio[train], Xp[test])
    if name == "clip1.5":
        return _per_order(X[train], np.minimum(log_ratio[train], np.log(1.5)), X[test])
    if name == "weighted":
        mb, y = segments["per-micro-batches"][train], np.minimum(log_ratio[train], np.log(2))
        weight = np.zeros(train.size)
        for v in np.unique(mb):
            weight[mb == v] = 1 / np.mean(y[mb == v] ** 2)
        return _per_order(X[train], log_ratio[train], X[test], weight / weight.mean())
    if name in segments:
        return _segmented(X, log_ratio, segments[name], train, test)
    return _per_order(X[train], log_ratio[train], X[test])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", default="bundled:greedy")
    ap.add_argument("--folds", type=int, default=10)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--structure", default="", help="extra feature blocks, e.g. order_stats")
    args = ap.parse_args()
    frame = read_sources([args.data])
    data = design_matrix(frame)
    blocks = tuple(b for b in args.structure.split(",") if b)
    if blocks:
        data = replace(data, X=pd.concat(
            [data.X, *structure_columns(data, blocks, args.folds).columns.values()], axis=1))
    X, T = data.X.to_numpy(float), data.times.to_numpy(float)
    regret = regrets(T)
    fold = family_folds(data.family, args.folds)
    mb = data.X["s_micro_batches"].to_numpy()
    segments = {"pipelined-split": mb > 1, "per-micro-batches": mb,
                "per-scenario": frame["scenario"].astype(str).to_numpy()}
    single = data.frame[["single_device_us", "single_device_feasible"]].to_numpy(float)
    names = ["shipped", "relative", "clip1.5", "weighted", *segments, "quantile", "probe"]
    safety = np.zeros(T.shape)
    for f in np.unique(fold):
        safety[fold == f] = regret[fold != f].mean(axis=0)
    predicted = {}
    for name in names:
        start = time.perf_counter()
        parts = Parallel(n_jobs=args.jobs)(
            delayed(_variant)(name, X, T, segments, single, np.flatnonzero(fold != f),
                              np.flatnonzero(fold == f)) for f in np.unique(fold))
        predicted[name] = np.zeros(T.shape)
        for f, part in zip(np.unique(fold), parts, strict=True):
            predicted[name][fold == f] = part
        print(f"{name}: {time.perf_counter() - start:.0f} s", flush=True)
    for a, b in ENSEMBLES:
        predicted[f"{a}+{b}"] = (predicted[a] + predicted[b]) / 2
    rankings = {f"{name} tol {t:g}": tie_ranking(np.expm1(np.maximum(p, 0)), safety, t)
                for name, p in predicted.items() for t in (0.0, 0.02)}
    ev = evaluate(data, kinds=(), rankings=rankings, verify=(), folds=args.folds)
    methods = [*rankings, "best-fixed"]
    per_scenario = ev.breakdown.xs("all", level="cluster")["mean_regret"].unstack("method")
    ratio = per_scenario[methods].div(per_scenario["best-fixed"], axis=0).T
    table = pd.concat([ev.table.loc[methods, ["mean_regret", "worst_family_excess",
                                              "families_worse"]], ratio], axis=1)
    table["mean_regret"] *= 100
    table["worst_family_excess"] *= 100
    with pd.option_context("display.width", 250):
        print(table.round({"mean_regret": 2, "worst_family_excess": 1, **{
            s: 3 for s in ratio.columns}}).to_string())
    print_worse_families(ev, list(rankings))


if __name__ == "__main__":
    main()
