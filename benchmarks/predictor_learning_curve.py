"""Would more graph families help the learned pick?

On a study dataset (default ``bundled:greedy``) with the shipped features (graph, cluster
and scenario features and the order splits), in the family folds of ``travorder evaluate
--folds K``, the default regressor learns from a share of each fold's training families
(drawn at random, ``--seeds`` draws per share) and picks for the held-out fold. Printed
per share: the mean regret and its ratio to always ``critical_path`` per scenario (the
mean over the draws). A curve still falling at the full share says a larger corpus would
help; a flat one says the rows' features are what limits the pick.

    python benchmarks/predictor_learning_curve.py [--shares 0.25,0.5,0.75,1] [--seeds 2]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from predictor_signals import REFERENCE, regrets_by_scenario, with_splits  # beside this
from travorder.predictor.dataset import TrainingData
from travorder.predictor.evaluate import family_folds
from travorder.predictor.model import OrderPredictor


def subsampled_picks(data: TrainingData, folds: int, share: float, seed: int
                     ) -> np.ndarray:
    """The default regressor's pick per row, fitted on ``share`` of the families of the
    other folds."""
    fold = family_folds(data.family, folds)
    rng = np.random.default_rng(seed)
    pick = np.zeros(len(data.X), dtype=np.int64)
    for f in np.unique(fold):
        families = np.unique(data.family[fold != f])
        kept = rng.choice(families, max(2, round(share * families.size)), replace=False)
        train = np.isin(data.family, kept)
        model = OrderPredictor("regressor").fit(data.X[train], data.times[train],
                                                data.family[train])
        pick[fold == f] = model.ranking(data.X[fold == f])[:, 0]
    return pick


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", default="bundled:greedy")
    ap.add_argument("--folds", type=int, default=10)
    ap.add_argument("--shares", default="0.25,0.5,0.75,1")
    ap.add_argument("--seeds", type=int, default=2, help="draws per share below 1")
    args = ap.parse_args()
    t0 = time.perf_counter()
    data = with_splits([args.data])
    regret, fixed, scenario, names = regrets_by_scenario(data)
    n_train = np.unique(data.family).size * (args.folds - 1) / args.folds
    print("| share of the training families | families | mean regret | "
          + " | ".join(names) + " |")
    print("|" + " --- |" * (len(names) + 3))
    for share in (float(s) for s in args.shares.split(",")):
        seeds = range(args.seeds if share < 1 else 1)
        picked = np.mean([regret[np.arange(len(regret)),
                                 subsampled_picks(data, args.folds, share, s)]
                          for s in seeds], axis=0)
        cells = [f"{picked[scenario == s].mean() / fixed[scenario == s].mean():.2f}"
                 for s in names]
        print(f"| {share:g} | about {share * n_train:.0f} | {100 * picked.mean():.2f}% | "
              + " | ".join(cells) + " |", flush=True)
    print(f"\n{args.data}: {len(regret)} rows, {args.folds} family folds, ratios to "
          f"always {REFERENCE} ({100 * fixed.mean():.2f}%), {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
