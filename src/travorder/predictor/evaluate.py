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
predictor's shortlist of ``k`` orders (`OrderPredictor.shortlist`: its pick, the
training folds' best fixed order, then the highest-ranked others) and keeps the fastest;
its baseline ``shortlist<k>`` does the same with the ``k`` orders most often best in the
training folds.

The best fixed order is chosen on the training folds only, never on the held-out family:
``best-fixed`` uses, for each fold, the order with the lowest mean regret on the other
folds' rows; ``best-fixed-per-scenario`` the same among the training rows of the row's
scenario (a scenario the training rows lack: ``best-fixed``'s order). ``breakdown`` gives
the learned methods, both and the oracle per scenario and per scenario and cluster;
``families`` compares each learned method with ``best-fixed`` per held-out family and flags
the families where it is worse beyond noise: where its mean regret exceeds the best fixed
order's by more than the mean over the family's rows of the study's tie gap between the
two picks, ``max(1 % of the best step time, 2 * sqrt(se_a**2 + se_b**2))`` over the best
step time (`travorder.study.export.tied_with`; 1 point for a deterministic placer).

With ``test=`` another dataset (e.g. the same graphs under perturbed costs), the models
learn from ``data``'s rows of the families not held out and are scored on ``test``'s rows
of the held-out families; the fixed orders are chosen on the same training rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from travorder.errors import TravorderError
from travorder.predictor.dataset import TrainingData
from travorder.predictor.model import KINDS, OrderPredictor, regrets
from travorder.study.export import REL_TOL, Z

#: The baselines every breakdown shows beside the learned methods.
FOCUS = ("best-fixed", "best-fixed-per-scenario", "oracle")
ALL = "all"


@dataclass(frozen=True)
class Evaluation:
    """``table``: one row per method (top1, top2, mean_regret, p90_regret, the worst
    family's excess over ``best-fixed`` and the number of families worse than it beyond
    noise); ``per_family``: mean regret per method and family; ``best_fixed``: the name of
    the ``always-`` baseline with the lowest mean regret over all rows; ``breakdown``: the
    learned methods and `FOCUS` per scenario and cluster (``all``: the scenario's
    clusters together); ``families``: per learned method and held-out family, its mean
    regret, ``best-fixed``'s, the excess, the noise and whether it is worse beyond noise."""

    table: pd.DataFrame
    per_family: pd.DataFrame
    best_fixed: str
    breakdown: pd.DataFrame | None = None
    families: pd.DataFrame | None = None

    def summary(self) -> dict[str, Any]:
        """A JSON-ready summary for manifests and reports."""
        out: dict[str, Any] = {
            "best_fixed": self.best_fixed,
            "table": self.table.round(4).reset_index().to_dict(orient="records")}
        if self.breakdown is not None:
            out["breakdown"] = self.breakdown.round(4).reset_index().to_dict(orient="records")
        if self.families is not None:
            out["families"] = self.families.round(4).reset_index().to_dict(orient="records")
        return out


def _metrics(regret: np.ndarray, hit1: np.ndarray, hit2: np.ndarray) -> dict[str, float]:
    return {"top1": float(hit1.mean()), "top2": float(hit2.mean()),
            "mean_regret": float(regret.mean()),
            "p90_regret": float(np.quantile(regret, 0.9))}


def family_folds(family: np.ndarray, folds: int | None = None,
                 names: np.ndarray | None = None) -> np.ndarray:
    """Fold number per row: each family its own fold (``folds=None``), or the families in
    name order dealt round-robin into ``folds`` folds; ``names``: every family name to
    deal (default: those of ``family``), so two datasets can share their folds."""
    names = np.unique(family) if names is None else np.unique(names)
    index = np.searchsorted(names, family)
    return index if folds is None else index % max(1, min(folds, names.size))


def _scenarios(data: TrainingData) -> np.ndarray:
    frame = data.frame
    return (frame["scenario"].astype(str).to_numpy() if "scenario" in frame.columns
            else np.full(len(frame), ALL))


def _standard_errors(data: TrainingData) -> np.ndarray:
    """Per row and order the standard error of the mean step time (0 where not given)."""
    cols = [f"se_{o}" for o in data.orders]
    if not set(cols) <= set(data.frame.columns):
        return np.zeros(data.times.shape)
    return data.frame[cols].to_numpy(dtype=float, na_value=0.0)


def _check_test(data: TrainingData, test: TrainingData) -> None:
    if list(test.orders) != list(data.orders):
        raise TravorderError(f"test data has the orders {', '.join(test.orders)}; the "
                             f"training data {', '.join(data.orders)}")
    missing = [c for c in data.X.columns if c not in test.X.columns]
    if missing:
        raise TravorderError(f"test data lacks the feature {missing[0]!r} of the training "
                             "data")


def evaluate(data: TrainingData, kinds: Iterable[str] = KINDS,
             params: Mapping[str, Any] | None = None,
             verify: Iterable[int] | None = None, folds: int | None = None,
             rankings: Mapping[str, np.ndarray] | None = None,
             progress: Callable[[str], None] | None = None,
             test: TrainingData | None = None) -> Evaluation:
    """Leave-family-out evaluation of each predictor kind and the baselines, and of
    shortlists of ``verify`` orders checked by placement (default: 2 and 3, as far as
    there are orders); ``folds``: hold out that many
    groups of families in turn instead of one family at a time (`family_folds`).
    ``rankings``: other methods' held-out rankings (per row of the rows scored, order
    indices from best to worst), reported beside them. ``progress`` gets a line before
    each fold of each kind. ``test``: score the held-out families' rows of this dataset
    (same orders and features) instead of ``data``'s."""
    params = dict(params or {})
    if test is None:
        test = data
    else:
        _check_test(data, test)
    every = np.concatenate([data.family, test.family])
    train_fold = family_folds(data.family, folds, every)
    fold = family_folds(test.family, folds, every)
    orders = np.array(data.orders)
    T = test.times.to_numpy()
    regret_all = regrets(T)
    in_ties = np.array([[o in t for o in orders] for t in test.ties])
    n, k = T.shape
    verify = tuple(v for v in (2, 3) if v <= k) if verify is None else tuple(verify)
    if any(not 1 <= v <= k for v in verify):
        raise TravorderError(f"a verified shortlist must have 1 to {k} orders, got {verify}")
    fold_ids = np.unique(fold)
    empty = [f for f in fold_ids if not np.any(train_fold != f)]
    if empty:
        held = ", ".join(sorted(set(test.family[fold == empty[0]])))
        raise TravorderError(f"holding out {held} leaves no training rows")
    T_train = data.times.to_numpy()
    regret_train = regrets(T_train)
    rows = np.arange(n)
    per_row: dict[str, np.ndarray] = {}
    picks: dict[str, np.ndarray] = {}
    hits: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def record(name: str, chosen: np.ndarray, second: np.ndarray) -> None:
        per_row[name] = regret_all[rows, chosen]
        picks[name] = chosen
        hit1 = in_ties[rows, chosen]
        hits[name] = (hit1, hit1 | in_ties[rows, second])

    def record_verified(name: str, shortlists: np.ndarray) -> None:
        for v in verify:
            shortlist = shortlists[:, :v]
            fastest = shortlist[rows, T[rows[:, None], shortlist].argmin(axis=1)]
            record(f"{name}{v}", fastest, fastest)

    longest = max(verify, default=1)
    learned = [*kinds, *(rankings or {})]
    for kind in kinds:
        ranked = np.zeros((n, k), dtype=int)
        shortlists = np.zeros((n, longest), dtype=int)
        for i, f in enumerate(fold_ids):
            held_out = fold == f
            if progress is not None:
                held = ", ".join(sorted(set(test.family[held_out])))
                progress(f"{kind}: fold {i + 1}/{fold_ids.size} (holding out {held})")
            train = train_fold != f
            model = OrderPredictor(kind, **params).fit(data.X[train], data.times[train],
                                                       groups=data.family[train])
            X = test.X.loc[held_out, data.X.columns]
            ranked[held_out] = model.ranking(X)
            shortlists[held_out] = model.shortlist(X, longest)
        record(kind, ranked[:, 0], ranked[:, 1])
        record_verified(f"{kind}+verify", shortlists)

    for name, ranking in (rankings or {}).items():
        record(name, ranking[:, 0], ranking[:, 1])
    for j, o in enumerate(orders):
        record(f"always-{o}", np.full(n, j), np.full(n, j))
    by_frequency = np.zeros((n, k), dtype=int)
    fixed = np.zeros(n, dtype=int)
    fixed_in_scenario = np.zeros(n, dtype=int)
    best = T.argmin(axis=1)
    best_train = T_train.argmin(axis=1)
    scenario, scenario_train = _scenarios(test), _scenarios(data)
    for f in fold_ids:
        held_out, train = fold == f, train_fold != f
        counts = np.bincount(best_train[train], minlength=k)
        by_frequency[held_out] = np.argsort(-counts, kind="stable")
        fixed[held_out] = regret_train[train].mean(axis=0).argmin()
        for s in np.unique(scenario[held_out]):
            rows_s = train & (scenario_train == s)
            fixed_in_scenario[held_out & (scenario == s)] = (
                regret_train[rows_s].mean(axis=0).argmin() if rows_s.any()
                else fixed[held_out][0])
    record("most-frequent", by_frequency[:, 0], by_frequency[:, 0])
    record_verified("shortlist", by_frequency)
    record("best-fixed", fixed, fixed)
    record("best-fixed-per-scenario", fixed_in_scenario, fixed_in_scenario)
    per_row["random"] = regret_all.mean(axis=1)
    hits["random"] = (in_ties.mean(axis=1), np.minimum(1.0, 2 * in_ties.mean(axis=1)))
    record("oracle", best, best)

    table = pd.DataFrame({m: _metrics(per_row[m], *hits[m]) for m in per_row}).T
    always = [f"always-{o}" for o in orders]
    best_fixed = str(table.loc[always, "mean_regret"].idxmin())
    per_family = pd.DataFrame({m: pd.Series(r).groupby(test.family).mean()
                               for m, r in per_row.items()}).T
    table["worst_family_excess"] = (per_family.sub(per_family.loc["best-fixed"], axis=1)
                                    .max(axis=1))
    se = _standard_errors(test)
    families = _families(per_row, picks, learned, T, se, test.family)
    table["families_worse"] = pd.Series(
        {m: int(_families(per_row, picks, [m], T, se, test.family)["worse"].sum())
         for m in picks})
    table.index.name = "method"
    cluster = test.frame["cluster"].astype(str).to_numpy()
    breakdown = _breakdown(per_row, hits, [*learned, *FOCUS], scenario, cluster)
    return Evaluation(table, per_family, best_fixed, breakdown, families)


def _families(per_row: Mapping[str, np.ndarray], picks: Mapping[str, np.ndarray],
              methods: Iterable[str], T: np.ndarray, se: np.ndarray,
              family: np.ndarray) -> pd.DataFrame:
    """Per method and family: its mean regret, ``best-fixed``'s, the excess, the noise
    (the mean of the rows' tie gaps between the two picks, see the module docstring) and
    whether the excess is beyond it."""
    rows = np.arange(T.shape[0])
    base = picks["best-fixed"]
    best = T.min(axis=1)
    out = []
    for m in methods:
        gap = np.maximum(REL_TOL * best, Z * np.hypot(se[rows, picks[m]], se[rows, base]))
        part = pd.DataFrame({"regret": per_row[m], "best_fixed_regret": per_row["best-fixed"],
                             "noise": gap / best}).groupby(family).mean()
        part.insert(0, "rows", pd.Series(family).value_counts())
        part["excess"] = part["regret"] - part["best_fixed_regret"]
        part["worse"] = part["excess"] > part["noise"]
        part.index.name = "family"
        out.append(part.reset_index().assign(method=m))
    columns = ["method", "family", "rows", "regret", "best_fixed_regret", "noise", "excess",
               "worse"]
    frame = pd.concat(out)[columns] if out else pd.DataFrame(columns=columns)
    return (frame.sort_values(["method", "excess"], ascending=[True, False])
            .set_index(["method", "family"]))


def _breakdown(per_row: Mapping[str, np.ndarray],
               hits: Mapping[str, tuple[np.ndarray, np.ndarray]], methods: Iterable[str],
               scenario: np.ndarray, cluster: np.ndarray) -> pd.DataFrame:
    """Per scenario (clusters together, ``cluster`` = ``all``) and per scenario and
    cluster: the rows, and each method's top-1, mean and 90th-percentile regret."""
    out = []
    groups = [(s, ALL, scenario == s) for s in np.unique(scenario)]
    if np.unique(cluster).size > 1:
        groups += [(s, c, (scenario == s) & (cluster == c))
                   for s in np.unique(scenario) for c in np.unique(cluster)]
    for s, c, mask in groups:
        if not mask.any():
            continue
        for m in methods:
            out.append({"scenario": s, "cluster": c, "method": m, "rows": int(mask.sum()),
                        **_metrics(per_row[m][mask], hits[m][0][mask], hits[m][1][mask])})
    return pd.DataFrame(out).set_index(["scenario", "cluster", "method"])
