"""Leave-family-out evaluation of order recommendations against fixed-order baselines.

Each family of graphs is held out in turn; the predictor is trained on the others and
recommends an order for every held-out row. Per method:

- ``top1``: the recommended order is the best or tied with it (ties from the dataset);
- ``top2``: one of the two highest-ranked orders (lowest expected regret) is;
- ``regret``: step time with the recommended order / best step time - 1, as the mean,
  the 90th percentile and the mean per family.

Baselines on the same rows: ``always-<order>`` for each order, ``most-frequent`` (the
order most often best in the training folds), ``random`` (the expected regret of a
uniformly random order) and ``oracle`` (0 regret).

With ``verify=(k, ...)``, also the recommendation checked by placement (what
``recommend-order --verify k`` does): ``<kind>+verify<k>`` places the graph with the
predictor's shortlist of ``k`` orders (`OrderPredictor.shortlist`: the training folds'
best fixed order, then the highest-ranked others) and keeps the fastest; its baseline
``shortlist<k>`` does the same with the ``k`` orders most often best in the training folds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from travorder.errors import TravorderError
from travorder.predictor.dataset import TrainingData
from travorder.predictor.model import KINDS, OrderPredictor


@dataclass(frozen=True)
class Evaluation:
    """``table``: one row per method (top1, top2, mean_regret, p90_regret, worst family
    excess over the best fixed order); ``per_family``: mean regret per method and family;
    ``best_fixed``: the name of the best ``always-`` baseline."""

    table: pd.DataFrame
    per_family: pd.DataFrame
    best_fixed: str

    def summary(self) -> dict[str, Any]:
        """A JSON-ready summary for manifests and reports."""
        return {"best_fixed": self.best_fixed,
                "table": self.table.round(4).reset_index().to_dict(orient="records")}


def _metrics(regret: np.ndarray, hit1: np.ndarray, hit2: np.ndarray) -> dict[str, float]:
    return {"top1": float(hit1.mean()), "top2": float(hit2.mean()),
            "mean_regret": float(regret.mean()),
            "p90_regret": float(np.quantile(regret, 0.9))}


def family_folds(family: np.ndarray, folds: int | None = None) -> np.ndarray:
    """Fold number per row: each family its own fold (``folds=None``), or the families in
    name order dealt round-robin into ``folds`` folds."""
    names, index = np.unique(family, return_inverse=True)
    return index if folds is None else index % max(1, min(folds, names.size))


def evaluate(data: TrainingData, kinds: Iterable[str] = KINDS,
             params: Mapping[str, Any] | None = None,
             verify: Iterable[int] = (2, 3), folds: int | None = None,
             rankings: Mapping[str, np.ndarray] | None = None,
             progress: Callable[[str], None] | None = None) -> Evaluation:
    """Leave-family-out evaluation of each predictor kind and the baselines, and of
    shortlists of ``verify`` orders checked by placement; ``folds``: hold out that many
    groups of families in turn instead of one family at a time (`family_folds`).
    ``rankings``: other methods' held-out rankings (per row, order indices from best to
    worst), reported beside them. ``progress`` gets a line before each fold of each kind."""
    params = dict(params or {})
    fold = family_folds(data.family, folds)
    verify = tuple(verify)
    orders = np.array(data.orders)
    T = data.times.to_numpy()
    regret_all = T / T.min(axis=1, keepdims=True) - 1.0
    in_ties = np.array([[o in t for o in orders] for t in data.ties])
    n, k = T.shape
    if any(not 1 <= v <= k for v in verify):
        raise TravorderError(f"a verified shortlist must have 1 to {k} orders, got {verify}")
    rows = np.arange(n)
    per_row: dict[str, np.ndarray] = {}
    hits: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def record(name: str, chosen: np.ndarray, second: np.ndarray) -> None:
        per_row[name] = regret_all[rows, chosen]
        hit1 = in_ties[rows, chosen]
        hits[name] = (hit1, hit1 | in_ties[rows, second])

    def record_verified(name: str, shortlists: np.ndarray) -> None:
        for v in verify:
            shortlist = shortlists[:, :v]
            fastest = shortlist[rows, T[rows[:, None], shortlist].argmin(axis=1)]
            record(f"{name}{v}", fastest, fastest)

    longest = max(verify, default=1)
    for kind in kinds:
        ranked = np.zeros((n, k), dtype=int)
        shortlists = np.zeros((n, longest), dtype=int)
        fold_ids = np.unique(fold)
        for i, f in enumerate(fold_ids):
            test = fold == f
            if progress is not None:
                held = ", ".join(sorted(set(data.family[test])))
                progress(f"{kind}: fold {i + 1}/{fold_ids.size} (holding out {held})")
            model = OrderPredictor(kind, **params).fit(data.X[~test], data.times[~test])
            ranked[test] = model.ranking(data.X[test])
            shortlists[test] = model.shortlist(data.X[test], longest)
        record(kind, ranked[:, 0], ranked[:, 1])
        record_verified(f"{kind}+verify", shortlists)

    for name, ranking in (rankings or {}).items():
        record(name, ranking[:, 0], ranking[:, 1])
    for j, o in enumerate(orders):
        record(f"always-{o}", np.full(n, j), np.full(n, j))
    by_frequency = np.zeros((n, k), dtype=int)
    best = T.argmin(axis=1)
    for f in np.unique(fold):
        test = fold == f
        counts = np.bincount(best[~test], minlength=k) if np.any(~test) else np.ones(k)
        by_frequency[test] = np.argsort(-counts, kind="stable")
    record("most-frequent", by_frequency[:, 0], by_frequency[:, 0])
    record_verified("shortlist", by_frequency)
    per_row["random"] = regret_all.mean(axis=1)
    hits["random"] = (in_ties.mean(axis=1), np.minimum(1.0, 2 * in_ties.mean(axis=1)))
    record("oracle", best, best)

    table = pd.DataFrame({m: _metrics(per_row[m], *hits[m]) for m in per_row}).T
    fixed = [f"always-{o}" for o in orders]
    best_fixed = str(table.loc[fixed, "mean_regret"].idxmin())
    per_family = pd.DataFrame({m: pd.Series(r).groupby(data.family).mean()
                               for m, r in per_row.items()}).T
    table["worst_family_excess"] = (per_family.sub(per_family.loc[best_fixed], axis=1)
                                    .max(axis=1))
    table.index.name = "method"
    return Evaluation(table, per_family, best_fixed)
