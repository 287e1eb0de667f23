"""Does a regressor fitted on one scenario's rows (or one scenario's and cluster's) pick
better there than one fitted on every row?

On a study dataset's scenarios without pipelining, in the family folds of ``travorder
evaluate --folds K``, the regressor on the graph, cluster and scenario features (no
structure block, ``--seeds`` seeds per order) fitted

- ``all``: on every training row (every scenario), as `travorder train` fits;
- ``scenario``: on the training rows of the scenario it is scored on;
- ``cluster``: on the training rows of that scenario and of the row's cluster;

each scored on the held-out families' rows of the scenario, as a ratio of its mean regret
to the best fixed order's (chosen on the same training rows of the scenario).

    python benchmarks/predictor_specialised.py [--data bundled:greedy] [--seeds 2]
"""

from __future__ import annotations

import argparse

import numpy as np

from travorder.predictor.dataset import design_matrix
from travorder.predictor.evaluate import family_folds
from travorder.predictor.model import OrderPredictor, regrets
from travorder.study.export import read_sources

SCENARIOS = ("batch=export", "batch=train", "batch=train,mem=0.6")
VARIANTS = ("all", "scenario", "cluster", "best-fixed")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", nargs="+", default=["bundled:greedy"])
    ap.add_argument("--placer", default="greedy")
    ap.add_argument("--folds", type=int, default=10)
    ap.add_argument("--seeds", type=int, default=2)
    args = ap.parse_args()
    frame = read_sources(args.data)
    data = design_matrix(frame[frame["placer"] == args.placer].reset_index(drop=True))
    X, times, family = data.X, data.times, data.family
    regret = regrets(times.to_numpy())
    scenario = data.frame["scenario"].to_numpy()
    cluster = data.frame["cluster"].to_numpy()
    fold = family_folds(family, args.folds)
    picked = {v: np.full(len(X), np.nan) for v in VARIANTS}

    def score(variant: str, train: np.ndarray, test: np.ndarray) -> None:
        model = OrderPredictor("regressor", n_seeds=args.seeds)
        model.fit(X[train], times[train], groups=family[train])
        column = times.columns.get_indexer(model.predict(X[test]))
        picked[variant][test] = regret[np.flatnonzero(test), column]

    for f in range(fold.max() + 1):
        train, held = fold != f, fold == f
        score("all", train, held & np.isin(scenario, SCENARIOS))
        for s in SCENARIOS:
            test = held & (scenario == s)
            score("scenario", train & (scenario == s), test)
            fixed = regret[train & (scenario == s)].mean(axis=0).argmin()
            picked["best-fixed"][test] = regret[test, fixed]
            for c in np.unique(cluster[test]):
                score("cluster", train & (scenario == s) & (cluster == c), test & (cluster == c))
        print(f"fold {f + 1}/{fold.max() + 1}", flush=True)
    print("\n| scenario | best fixed order | " + " | ".join(VARIANTS[:-1]) + " |\n"
          "| --- | --- |" + " --- |" * (len(VARIANTS) - 1))
    for s in SCENARIOS:
        sel = scenario == s
        fixed = picked["best-fixed"][sel].mean()
        print(f"| {s} | {100 * fixed:.2f}% | " + " | ".join(
            f"{picked[v][sel].mean() / fixed:.2f}" for v in VARIANTS[:-1]) + " |")


if __name__ == "__main__":
    main()
