"""How much does the learned pick depend on LightGBM's random seed, and does a seed
ensemble (`OrderPredictor(n_seeds=K)`) take that out?

The regressor draws the rows and columns each tree sees from its ``random_state``
(``subsample``, ``colsample_bytree``). This fits the shipped features and parameters
once per seed (``n_seeds=1``, ``random_state`` 0, 1, ...) in the family folds of
``travorder evaluate --folds K``, keeps each fit's held-out scores, and ranks the rows
with:

- each seed alone;
- the first ``K`` seeds averaged (what ``OrderPredictor(n_seeds=K)`` fits, the same
  models), for each ``K`` of ``--sizes``;
- every set of ``K`` of the seeds (at most ``--draws`` of them, drawn at random): the
  median and range of the figures and the share of sets with no family worse.

Per variant: mean regret, the ratio to always ``critical_path`` per scenario, and the
families worse than it by more than 1 point (the study's tie gap for greedy).

    python benchmarks/predictor_seeds.py [--seeds 12] [--sizes 1,2,4,8] [--folds 10]
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np
from joblib import Parallel, delayed

from predictor_cousins import worse  # beside this
from predictor_signals import regrets_by_scenario, with_splits
from travorder.predictor.dataset import TrainingData
from travorder.predictor.evaluate import family_folds
from travorder.predictor.model import OrderPredictor


def fold_scores(data: TrainingData, fold: np.ndarray, f: int, seed: int
                ) -> tuple[int, int, np.ndarray, OrderPredictor]:
    """Held-out scores of fold ``f`` from a one-seed regressor fitted on the others."""
    train = fold != f
    model = OrderPredictor("regressor", n_seeds=1, random_state=seed, n_jobs=1).fit(
        data.X[train], data.times[train], data.family[train])
    return f, seed, model.scores(data.X[fold == f]), model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", default="bundled:greedy")
    ap.add_argument("--folds", type=int, default=10)
    ap.add_argument("--seeds", type=int, default=12)
    ap.add_argument("--sizes", default="1,2,4,8")
    ap.add_argument("--draws", type=int, default=200)
    args = ap.parse_args()
    data = with_splits([args.data])
    R, ref, scenario, names = regrets_by_scenario(data)
    fold = family_folds(data.family, args.folds, data.family)
    fits = Parallel(n_jobs=-1)(delayed(fold_scores)(data, fold, f, s)
                               for s in range(args.seeds) for f in np.unique(fold))
    scores = np.zeros((args.seeds, *R.shape))
    ranker = {}  # per fold, a fitted model: ranks as every seed's (same rows, same safety)
    for f, s, sc, model in fits:
        scores[s, fold == f] = sc
        ranker[f] = model

    def figures(seeds: tuple[int, ...]) -> tuple[float, list[float], dict[str, float]]:
        mean = scores[list(seeds)].mean(axis=0)
        pick = np.zeros(len(R), dtype=np.int64)
        for f, model in ranker.items():
            pick[fold == f] = model.rank(mean[fold == f])[:, 0]
        r = R[np.arange(len(R)), pick]
        ratios = [r[scenario == s].mean() / ref[scenario == s].mean() for s in names]
        return float(r.mean()), ratios, worse(r, ref, data.family).to_dict()

    print("| variant | mean regret | " + " | ".join(names) + " | families worse |")
    print("|" + " --- |" * (len(names) + 3))
    rows = [(f"seed {s} alone", (s,)) for s in range(args.seeds)]
    rows += [(f"seeds 0-{k - 1} (`n_seeds={k}`)", tuple(range(k)))
             for k in map(int, args.sizes.split(",")) if k > 1]
    for name, seeds in rows:
        m, ratios, flagged = figures(seeds)
        print(f"| {name} | {100 * m:.2f}% | " + " | ".join(f"{x:.2f}" for x in ratios)
              + " | " + (", ".join(f"`{k}` +{100 * v:.1f}" for k, v in flagged.items())
                         or "none") + " |")

    print("\n| seeds per set | sets | mean regret, median (range) | "
          + " | ".join(names) + " | sets with no family worse |")
    print("|" + " --- |" * (len(names) + 4))
    rng = np.random.default_rng(0)
    for k in map(int, args.sizes.split(",")):
        sets = list(itertools.combinations(range(args.seeds), k))
        if len(sets) > args.draws:
            sets = [sets[i] for i in rng.choice(len(sets), args.draws, replace=False)]
        res = [figures(s) for s in sets]
        m = np.array([x[0] for x in res])
        ratios = np.array([x[1] for x in res])
        free = np.mean([not x[2] for x in res])
        cells = [f"{np.median(c):.2f} ({c.min():.2f}-{c.max():.2f})" for c in ratios.T]
        print(f"| {k} | {len(sets)} | {100 * np.median(m):.2f}% ({100 * m.min():.2f}-"
              f"{100 * m.max():.2f}%) | " + " | ".join(cells) + f" | {free:.2f} |")


if __name__ == "__main__":
    main()
