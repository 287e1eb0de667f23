"""Held-out mean regret of the predictor's feature variants by tie tolerance.

For a study dataset, computes the structure blocks once (order statistics; the graph
network's held-out columns, as `travorder train` does) and evaluates a regressor on the
graph features alone, with each block and with both, and the graph network alone, in
family-grouped folds, for several tie tolerances (`OrderPredictor(tie_tolerance=...)`).

    python benchmarks/predictor_variants.py [--data bundled:greedy] [--folds 10]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np
import pandas as pd

from travorder.predictor.dataset import design_matrix
from travorder.predictor.evaluate import evaluate
from travorder.predictor.model import regrets, tie_ranking
from travorder.predictor.train import read_sources, structure_columns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", default="bundled:greedy")
    ap.add_argument("--folds", type=int, default=10)
    ap.add_argument("--tolerances", default="0,0.005,0.01,0.02,0.03,0.05")
    args = ap.parse_args()
    data = design_matrix(read_sources([args.data]))
    extra = structure_columns(data, ("order_stats", "gnn"), args.folds)
    T = data.times.to_numpy()
    regret = regrets(T)
    net_regret = np.expm1(np.maximum(
        extra.columns["gnn"][[f"g_{o}" for o in data.orders]].to_numpy(), 0))
    fold = np.unique(data.family, return_inverse=True)[1] % args.folds
    safety = np.zeros_like(regret)
    for f in np.unique(fold):
        safety[fold == f] = regret[fold != f].mean(axis=0)
    variants = {"graph features": (), "+ order statistics": ("order_stats",),
                "+ graph network": ("gnn",), "+ both": ("order_stats", "gnn")}
    rows = {}
    for tol in (float(t) for t in args.tolerances.split(",")):
        for name, blocks in variants.items():
            X = pd.concat([data.X, *(extra.columns[b] for b in blocks)], axis=1)
            ev = evaluate(replace(data, X=X), ("regressor",), {"tie_tolerance": tol},
                          verify=(), folds=args.folds,
                          rankings={"net": tie_ranking(net_regret, safety, tol)})
            t = ev.table
            rows.setdefault(name, {})[tol] = (t.loc["regressor", "mean_regret"],
                                              t.loc["regressor", "worst_family_excess"])
            rows.setdefault("graph network alone", {})[tol] = (
                t.loc["net", "mean_regret"], t.loc["net", "worst_family_excess"])
            best_fixed = (ev.best_fixed, t.loc[ev.best_fixed, "mean_regret"])
        print(f"tolerance {tol} done", flush=True)
    tols = sorted(next(iter(rows.values())))
    print(f"{args.data}: {len(T)} rows, {args.folds} family folds; best fixed "
          f"{best_fixed[0]} {100 * best_fixed[1]:.2f}%")
    print("| method | " + " | ".join(f"tolerance {t:g}" for t in tols) + " |")
    for name, by_tol in rows.items():
        print(f"| {name} | " + " | ".join(
            f"{100 * by_tol[t][0]:.2f}% ({100 * by_tol[t][1]:+.1f})" for t in tols) + " |")


if __name__ == "__main__":
    main()
