"""Where ``critical_path`` fails, is another order reliably better?

Most of the best fixed order's regret without pipelining sits in a tenth of the rows.
This asks whether a learned pick could find those rows and what it could do there. On a
study dataset (default ``bundled:greedy``) with the shipped features (graph, cluster and
scenario features and the order splits), in the family folds of ``travorder evaluate
--folds K``:

- a LightGBM classifier, held out by fold, predicts from those features whether
  ``critical_path`` ends more than ``--bad`` (5%) from the row's best order; its AUC
  per scenario;
- on the rows it ranks most likely (the top 5, 10 and 20% of each scenario): the
  share of ``critical_path``'s regret they carry, the mean regret of every fixed
  order there, of the best of them and of the shipped regressor's held-out pick.

If the rows can be found but every fixed order is far from the best on them, the best
order there changes from row to row: telling it needs more than the features know.

Last, per scenario, the pick's ratio to ``critical_path``'s mean regret and that of the
pick with an oracle gate, which keeps ``critical_path`` wherever the pick is worse: what
the pick could reach if it never left ``critical_path`` for the worse. And the
``--families`` families where the pick is furthest above ``critical_path``, with the
rows that make most of it.

    python benchmarks/predictor_hard_rows.py [--folds 10] [--bad 0.05]
"""

from __future__ import annotations

import argparse
import time

import lightgbm as lgb
import numpy as np
import pandas as pd
from sklearn.metrics import roc_auc_score

from predictor_signals import REFERENCE, held_out_picks, with_splits  # beside this
from travorder.predictor.evaluate import family_folds
from travorder.predictor.model import regrets

SHARES = (0.05, 0.1, 0.2)


def held_out_proba(X: np.ndarray, y: np.ndarray, fold: np.ndarray) -> np.ndarray:
    """P(y) per row from a classifier fitted on the other folds."""
    p = np.zeros(len(y))
    for f in np.unique(fold):
        train = fold != f
        clf = lgb.LGBMClassifier(n_estimators=300, learning_rate=0.03, subsample=0.8,
                                 subsample_freq=1, colsample_bytree=0.5, n_jobs=1,
                                 random_state=0, verbose=-1)
        p[~train] = clf.fit(X[train], y[train]).predict_proba(X[~train])[:, 1]
    return p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", default="bundled:greedy")
    ap.add_argument("--folds", type=int, default=10)
    ap.add_argument("--bad", type=float, default=0.05,
                    help="critical_path fails on a row when its regret exceeds this")
    ap.add_argument("--families", type=int, default=2)
    args = ap.parse_args()
    t0 = time.perf_counter()
    data = with_splits([args.data])
    regret = regrets(data.times.to_numpy())
    fixed = regret[:, data.orders.index(REFERENCE)]
    pick = held_out_picks(data, args.folds)
    picked = regret[np.arange(len(regret)), pick]
    bad = fixed > args.bad
    proba = held_out_proba(data.X, bad, family_folds(data.family, args.folds))
    scenario = data.frame["scenario"].to_numpy()
    print(f"{args.data}: {len(regret)} rows, {args.folds} family folds, "
          f"{time.perf_counter() - t0:.0f} s; `{REFERENCE}` fails: regret > {args.bad:.0%}")
    usable = [j for j in range(len(data.orders)) if regret[:, j].mean() < 1]  # not x2 on avg
    print("| scenario | fails | AUC | top rows | their share of its regret | pick | best "
          "fixed there | " + " | ".join(data.orders[j] for j in usable) + " |")
    print("|" + " --- |" * (7 + len(usable)))
    for s in dict.fromkeys(scenario):
        rows = np.flatnonzero(scenario == s)
        auc = roc_auc_score(bad[rows], proba[rows])
        for share in SHARES:
            top = rows[np.argsort(-proba[rows], kind="stable")[:int(share * rows.size)]]
            mean = 100 * regret[top].mean(axis=0)
            best = int(mean.argmin())
            cells = [f"{s}", f"{bad[rows].mean():.1%}", f"{auc:.3f}", f"{share:.0%}",
                     f"{fixed[top].sum() / fixed[rows].sum():.2f}",
                     f"{100 * picked[top].mean():.1f}%",
                     f"{data.orders[best]} {mean[best]:.1f}%",
                     *(f"{mean[j]:.1f}%" for j in usable)]
            print("| " + " | ".join(cells) + " |")
    gated = np.minimum(picked, fixed)
    print("\n| scenario | pick / critical_path | with an oracle gate |\n| --- | --- | --- |")
    for s in dict.fromkeys(scenario):
        rows = scenario == s
        print(f"| {s} | {picked[rows].mean() / fixed[rows].mean():.2f} | "
              f"{gated[rows].mean() / fixed[rows].mean():.2f} |")
    excess = pd.Series(picked - fixed).groupby(data.family).mean().nlargest(args.families)
    frame = data.frame
    for family, x in excess.items():
        rows = np.flatnonzero(data.family == family)
        print(f"\n{family}: {rows.size} rows, pick {100 * picked[rows].mean():.2f}% against "
              f"{100 * fixed[rows].mean():.2f}% (+{100 * x:.2f} points); its largest rows:")
        for r in rows[np.argsort(fixed[rows] - picked[rows], kind="stable")[:3]]:
            print(f"  {frame['graph'][r]} {frame['scenario'][r]} {frame['cluster'][r]}: "
                  f"{data.orders[pick[r]]} {100 * picked[r]:.1f}% against "
                  f"{100 * fixed[r]:.1f}%")


if __name__ == "__main__":
    main()
