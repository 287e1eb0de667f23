"""A wider margin to leave ``critical_path`` for another topological order?

The shipped pick's worst family (``segformer``) comes from rows where it leaves the
safest order, ``critical_path``, for another topological order (``topo``,
``lexico_topo``) predicted a few points better, and that order is far worse. Among the
topological orders the predicted differences are small and the placements they lead to
can still be far apart. This measures a pick that leaves the safest order for another
order of `TOPOLOGICAL_ORDERS` only when the predicted gain over it exceeds ``t`` (the
shipped ranking otherwise: the 2% tie tolerance, then the safest order among the tied),
on the shipped features and regressor in the family folds of ``travorder evaluate
--folds K``:

- the shipped pick (``t`` none), and each ``t`` of the grid fixed in every fold (read
  off the evaluation rows themselves: an optimistic bound);
- ``t`` chosen per fold by a 3-fold family cross-validation of its training rows,
  minimising the inner families worse than ``critical_path`` by more than 1 point first
  (``families``) or the inner mean regret alone (``regret``): the honest figure.

Per variant: mean regret, the ratio to always ``critical_path`` per scenario, and the
families worse than it by more than 1 point (the study's tie gap for greedy).

    python benchmarks/predictor_cousins.py [--folds 10]
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from predictor_signals import regrets_by_scenario, with_splits  # beside this
from travorder.placement.orders import TOPOLOGICAL_ORDERS
from travorder.predictor.dataset import TrainingData
from travorder.predictor.evaluate import family_folds
from travorder.predictor.model import DEFAULT_TOLERANCE, OrderPredictor, tie_ranking

GRID = (None, 0.02, 0.03, 0.05, 0.1, 0.2)
NOISE = 0.01


def held_out(data: TrainingData, rows: np.ndarray, fold: np.ndarray
             ) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """Expected regrets of ``rows`` from regressors fitted on the other folds, and each
    fold's safety (the training rows' mean regret per order)."""
    E, safety = np.zeros((len(rows), data.times.shape[1])), {}
    for f in np.unique(fold):
        train, test = rows[fold != f], rows[fold == f]
        model = OrderPredictor("regressor").fit(data.X.iloc[train], data.times.iloc[train],
                                                data.family[train])
        E[fold == f], safety[f] = model.expected_regret(data.X.iloc[test]), model.mean_regret_
    return E, safety


def pick(E: np.ndarray, safety: np.ndarray, near: np.ndarray, t: float | None
         ) -> np.ndarray:
    """The shipped pick, kept on the safest order where it would leave it for a ``near``
    order predicted at most ``t`` better (``None``: the shipped pick)."""
    p = tie_ranking(E, safety, DEFAULT_TOLERANCE, -E)[:, 0]
    if t is None:
        return p
    safest = int(np.argmin(safety))
    gain = E[:, safest] - E[np.arange(len(p)), p]
    return np.where(near[safest] & near[p] & (p != safest) & (gain <= t), safest, p)


def picks(E: np.ndarray, fold: np.ndarray, safety: dict[int, np.ndarray], near: np.ndarray,
          t: float | dict[int, float | None] | None) -> np.ndarray:
    """`pick` per fold, with that fold's safety and ``t`` (one for all or per fold)."""
    out = np.zeros(len(E), dtype=np.int64)
    for f in np.unique(fold):
        m = fold == f
        out[m] = pick(E[m], safety[f], near, t[f] if isinstance(t, dict) else t)
    return out


def worse(regret: np.ndarray, reference: np.ndarray, family: np.ndarray) -> pd.Series:
    """The families whose mean regret exceeds the reference's by more than `NOISE`."""
    excess = pd.Series(regret - reference).groupby(family).mean()
    return excess[excess > NOISE].sort_values(ascending=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", default="bundled:greedy")
    ap.add_argument("--folds", type=int, default=10)
    args = ap.parse_args()
    data = with_splits([args.data])
    R, ref, scenario, names = regrets_by_scenario(data)
    near = np.array([o in TOPOLOGICAL_ORDERS for o in data.orders])
    every = np.arange(len(R))
    fold = family_folds(data.family, args.folds, data.family)
    E, safety = held_out(data, every, fold)

    chosen: dict[str, dict[int, float | None]] = {"families": {}, "regret": {}}
    for f in np.unique(fold):
        rows = every[fold != f]
        inner = family_folds(data.family[rows], 3, data.family[rows])
        Ei, si = held_out(data, rows, inner)
        keys = {}
        for t in GRID:
            r = R[rows, picks(Ei, inner, si, near, t)]
            keys[t] = (len(worse(r, ref[rows], data.family[rows])), r.mean())
        chosen["families"][f] = min(GRID, key=lambda t: keys[t])
        chosen["regret"][f] = min(GRID, key=lambda t: keys[t][1])

    print("| variant | mean regret | " + " | ".join(names) + " | families worse |")
    print("|" + " --- |" * (len(names) + 3))
    variants = {"shipped" if t is None else f"t = {t} in every fold": t for t in GRID}
    variants |= {f"t chosen per fold ({k}: {', '.join(map(str, c.values()))})": c
                 for k, c in chosen.items()}
    for name, t in variants.items():
        r = R[every, picks(E, fold, safety, near, t)]
        cells = [f"{r[scenario == s].mean() / ref[scenario == s].mean():.2f}" for s in names]
        flagged = ", ".join(f"`{k}` +{100 * v:.1f}" for k, v in
                            worse(r, ref, data.family).items()) or "none"
        print(f"| {name} | {100 * r.mean():.2f}% | " + " | ".join(cells) + f" | {flagged} |")


if __name__ == "__main__":
    main()
