"""Does a regressor fitted on one scenario's rows (or one scenario's and cluster's) pick
better there than one fitted on every row?

On a study dataset, in the family folds of ``travorder evaluate --folds K``, the
regressor on the graph, cluster and scenario features (no structure block, ``--seeds``
seeds per order) fitted

- ``every row``: on every training row (every scenario), as `travorder train` fits;
- ``per scenario``: on the training rows of the row's scenario;
- ``per scenario and cluster``: on the training rows of the row's scenario and cluster;

each scored on the held-out families' rows, as a ratio of its mean regret to
``critical_path``'s per scenario (`predictor_signals.report`; ``critical_path`` is the
best fixed order of every fold of the bundled data). Every scenario and cluster of the
bundled data holds every family, so the folds are the same for the three.

    python benchmarks/predictor_specialised.py [--data bundled:greedy] [--seeds 2]
"""

from __future__ import annotations

import argparse

import numpy as np

from predictor_signals import held_out_picks, report  # beside this
from travorder.predictor.dataset import TrainingData, design_matrix
from travorder.study.export import read_sources


def subset(data: TrainingData, rows: np.ndarray) -> TrainingData:
    """The rows of ``data`` where ``rows`` (a boolean mask) is true."""
    return TrainingData(data.X[rows], data.times[rows],
                        [data.ties[i] for i in np.flatnonzero(rows)], data.family[rows],
                        data.frame[rows])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", nargs="+", default=["bundled:greedy"])
    ap.add_argument("--placer", default="greedy")
    ap.add_argument("--folds", type=int, default=10)
    ap.add_argument("--seeds", type=int, default=2)
    args = ap.parse_args()
    frame = read_sources(args.data)
    data = design_matrix(frame[frame["placer"] == args.placer].reset_index(drop=True))
    scenario = data.frame["scenario"].to_numpy()
    cluster = data.frame["cluster"].to_numpy()
    picks = {"every row": held_out_picks(data, args.folds, n_seeds=args.seeds),
             "per scenario": np.zeros(len(scenario), dtype=np.int64),
             "per scenario and cluster": np.zeros(len(scenario), dtype=np.int64)}
    for s in np.unique(scenario):
        rows = scenario == s
        picks["per scenario"][rows] = held_out_picks(subset(data, rows), args.folds,
                                                     n_seeds=args.seeds)
        for c in np.unique(cluster[rows]):
            both = rows & (cluster == c)
            picks["per scenario and cluster"][both] = held_out_picks(
                subset(data, both), args.folds, n_seeds=args.seeds)
        print(f"{s}: done", flush=True)
    report(data, picks)


if __name__ == "__main__":
    main()
