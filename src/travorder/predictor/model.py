"""`OrderPredictor`: which traversal order to use for a graph on a cluster.

A scikit-learn style estimator over LightGBM. ``fit(X, times)`` takes the feature matrix
(one row per graph and cluster) and the step time each order reached on that row
(``times``: a DataFrame with one column per order); the learned attributes end in ``_``.
Three kinds share the interface, so they can be compared on the same folds:

- ``classifier``: `lightgbm.LGBMClassifier` on the best order of each row (a row whose
  orders tie exactly, as identical sequences or placements do, once per tied order,
  weighted to one row in all);
- ``regressor``: one `lightgbm.LGBMRegressor` per order, predicting
  ``log(step time / best step time)``; the recommendation is the smallest prediction.
  With ``row_weight="spread"`` each row weighs ``1 / max(sd, 1%)``, ``sd`` the standard
  deviation of its orders' log-ratios, so rows whose orders are a few percent apart
  count as much as pipelined rows whose orders are 50 % apart (`spread_weights`);
- ``ranker``: `lightgbm.LGBMRanker` (lambdarank), one query per row, one item per order
  (the row's features plus a one-hot of the order), relevance from the order's rank
  (how many orders are faster, so tied orders share it).

Each LightGBM model is fitted ``n_seeds`` times, with random states ``random_state``,
``random_state + 1``, ..., and the fits' raw scores are averaged: a seed ensemble. The
rows and columns each tree sees are drawn per seed (``subsample``, ``colsample_bytree``),
so one fit's idiosyncratic splits, which decide a few picks far from the best, average
out (docs/predictor.md, "The default model: seed ensembles").

``predict_proba`` gives each order's probability of being the best (for the regressor
and the ranker, a softmax of their scores). ``expected_regret`` turns probabilities into
the regret expected from using each order: ``sum_c P(best = c) * R[c, o]`` where
``regret_table_[c, o]`` is the mean regret of order ``o`` on training rows where ``c``
was (tied for) the best; the regressor predicts it directly (``exp(predicted log-ratio) - 1``).
Recommendations go by expected regret (`ranking`): the recommended order is within
``tie_tolerance`` (2 %) of the lowest figure printed, and among the orders that close
(tied within the predictor's noise) the one with the lowest mean regret on the training
data. ``tie_tolerance=None`` chooses the tolerance by family-grouped cross-validation on
the training rows (``fit(..., groups=)``, `TOLERANCES`): a confidence gate, the model's pick
only when it beats the safest order by more than the model's own held-out noise.
``shortlist`` gives the orders worth checking by placement: the recommended order, then
the best fixed order of the training data (lowest ``mean_regret_``), then the others by
expected regret, so that keeping the fastest of two or more is never worse than that
fixed order.

Saved as the LightGBM models' trees in arrays (``trees.npz``, `trees.save_trees`; the one
LightGBM text per file of older models, ``model_<i>.txt.gz`` or ``.txt``, loads too) plus
a JSON manifest (``save`` / ``load``); loading never unpickles and checks the feature
schema and that manifest and models agree. Predicting
runs the saved trees with `TreeEnsemble` (numpy), so a loaded predictor needs neither
LightGBM nor scikit-learn nor pandas: `recommend-order` starts in well under a second.
LightGBM is imported to fit and for SHAP explanations.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import inspect
import json
import math
import os
import zlib
from collections.abc import Mapping
from numbers import Integral, Real
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from travorder.errors import (
    FormatError,
    TravorderError,
    check_format,
    json_text,
    parse_json,
    write_file,
)
from travorder.predictor.trees import TreeEnsemble, compact, load_trees, save_trees
from travorder.versions import library_versions

if TYPE_CHECKING:
    import pandas as pd

#: A feature matrix: a DataFrame with the feature columns, a 2-D array in
#: ``feature_names_in_`` order, or one row as a mapping from feature name to value.
Features = Any

KINDS = ("classifier", "regressor", "ranker")
MANIFEST = "manifest.json"
TREES_FILE = "trees.npz"  # every model's trees (`trees.save_trees`)
FORMAT = "travorder.predictor"
#: 2: every model's trees in `TREES_FILE`; 1 (still read): one LightGBM text per model.
FORMAT_VERSION = 2
READS_VERSIONS = (1, 2)
#: The tie tolerances ``tie_tolerance=None`` chooses from; 0.02 when it cannot choose.
TOLERANCES = (0.0, 0.01, 0.02, 0.03, 0.05, 0.08, 0.12, 0.2, 0.3, 0.5)
DEFAULT_TOLERANCE = 0.02
# Softmax temperature for the regressor's log-ratio predictions: 5 % slower is e^-1 as likely.
_REGRESSOR_TEMPERATURE = 0.05
#: The row weights of ``row_weight``: none, or `spread_weights`.
ROW_WEIGHTS = (None, "spread")
# What a manifest written before these parameters existed was fitted with.
_UNSET_BEFORE = {"subsample": 1.0, "colsample_bytree": 1.0, "row_weight": None,
                 "n_seeds": 1}
# The study's tie rule: orders within 1 % are equal, so a smaller spread is no signal.
_SPREAD_FLOOR = 0.01


def regrets(times: np.ndarray) -> np.ndarray:
    """Per row of step times (rows x orders): each order's regret, its step time over the
    row's best minus 1.

    >>> regrets(np.array([[2.0, 3.0], [4.0, 4.0]])).tolist()
    [[0.0, 0.5], [0.0, 0.0]]
    """
    T = np.asarray(times, dtype=float)
    return T / T.min(axis=1, keepdims=True) - 1.0


def spread_weights(log_ratio: np.ndarray) -> np.ndarray:
    """Per row of ``log_ratio`` (rows x orders, ``log(step time / best)``):
    ``1 / max(standard deviation over the orders, 0.01)``.

    >>> spread_weights(np.log([[1.0, 1.2, 1.44], [1.0, 1.0, 1.001]])).round(2).tolist()
    [6.72, 100.0]
    """
    return 1.0 / np.maximum(np.asarray(log_ratio, dtype=float).std(axis=1), _SPREAD_FLOOR)


def tie_ranking(regret: np.ndarray, safety: np.ndarray, tolerance: float,
                scores: np.ndarray | None = None) -> np.ndarray:
    """Orders from best to worst (per row of ``regret``, the expected regret per order):
    first the orders within ``tolerance`` of the lowest expected regret (tied within the
    predictor's noise), safest first (lowest ``safety``: the mean regret on the training
    data), then the others by expected regret; remaining ties by higher ``scores``, then
    by index."""
    tied = regret <= regret.min(axis=-1, keepdims=True) + tolerance
    keys = (regret if scores is None else -scores, regret,
            np.where(tied, np.broadcast_to(safety, regret.shape), np.inf))
    return np.lexsort(keys, axis=-1)


def softmax(scores: np.ndarray) -> np.ndarray:
    """Softmax over the last axis: per-order scores to probabilities."""
    z = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


class OrderPredictor:
    """Recommend a traversal order from graph and cluster features.

    >>> import numpy as np, pandas as pd
    >>> rng = np.random.default_rng(0)
    >>> X = pd.DataFrame({"width": rng.uniform(1, 10, 60)})
    >>> times = pd.DataFrame({"topo": 5 + X["width"], "dfs_preorder": 10 - X["width"] + 5})
    >>> p = OrderPredictor(n_estimators=20, min_child_samples=3).fit(X, times)
    >>> p.predict(pd.DataFrame({"width": [1.0, 9.0]})).tolist()
    ['topo', 'dfs_preorder']

    The LightGBM parameters are LightGBM's (``subsample`` with a bagging frequency of 1);
    ``row_weight`` weighs the regressor's rows (`ROW_WEIGHTS`), the classifier and the
    ranker weigh rows equally; ``n_seeds`` fits of each model are averaged. ``n_jobs``
    fits run at once (joblib's convention, -1: one per core), each on one thread, so the
    fitted model does not depend on it.
    """

    def __init__(self, kind: str = "classifier", *, n_estimators: int = 200,
                 learning_rate: float = 0.05, n_seeds: int = 8, num_leaves: int = 15,
                 min_child_samples: int = 5, subsample: float = 0.8,
                 colsample_bytree: float = 0.5, row_weight: str | None = "spread",
                 random_state: int = 0, tie_tolerance: float | None = DEFAULT_TOLERANCE,
                 tolerance_folds: int = 3, n_jobs: int = -1) -> None:
        self.kind = kind
        self.tie_tolerance = tie_tolerance
        self.tolerance_folds = tolerance_folds
        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.n_seeds = n_seeds
        self.num_leaves = num_leaves
        self.min_child_samples = min_child_samples
        self.subsample = subsample
        self.colsample_bytree = colsample_bytree
        self.row_weight = row_weight
        self.random_state = random_state
        self.n_jobs = n_jobs

    # ------------------------------------------------------------------ parameters
    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor's parameters (scikit-learn convention; ``deep`` is unused)."""
        names = inspect.signature(type(self).__init__).parameters
        return {name: getattr(self, name) for name in names if name != "self"}

    def set_params(self, **params: Any) -> OrderPredictor:
        """Set constructor parameters (scikit-learn convention)."""
        valid = self.get_params()
        for name, value in params.items():
            if name not in valid:
                raise TravorderError(f"OrderPredictor has no parameter {name!r}")
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        defaults = inspect.signature(type(self).__init__).parameters
        changed = [f"{k}={v!r}" for k, v in self.get_params().items()
                   if v != defaults[k].default]
        return f"OrderPredictor({', '.join(changed)})"

    # ------------------------------------------------------------------ fitting
    def _check_params(self) -> None:
        """A `TravorderError` for a numeric parameter out of its range (before LightGBM
        fails on it with a message of its own)."""
        for name, low in (("n_estimators", 1), ("n_seeds", 1), ("num_leaves", 2),
                          ("min_child_samples", 1), ("tolerance_folds", 2),
                          ("random_state", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Integral) or value < low:
                raise TravorderError(f"{name} must be an integer >= {low}, got {value!r}")
        if isinstance(self.n_jobs, bool) or not isinstance(self.n_jobs, Integral) \
                or self.n_jobs == 0:
            raise TravorderError(f"n_jobs must be a non-zero integer, got {self.n_jobs!r}")
        ranges = {"learning_rate": "(0, inf)", "subsample": "(0, 1]",
                  "colsample_bytree": "(0, 1]", "tie_tolerance": "[0, inf)"}
        for name, text in ranges.items():
            value = getattr(self, name)
            if name == "tie_tolerance" and value is None:  # chosen by cross-validation
                continue
            if isinstance(value, bool) or not isinstance(value, Real) or not (
                    math.isfinite(value) and (value >= 0 if text[0] == "[" else value > 0)
                    and (text[-1] == ")" or value <= 1)):
                raise TravorderError(f"{name} must be a number in {text}, got {value!r}")

    def _lgb_params(self, seed: int = 0) -> dict[str, Any]:
        """LightGBM's parameters for the ``seed``-th fit of a model."""
        return {"n_estimators": self.n_estimators, "learning_rate": self.learning_rate,
                "num_leaves": self.num_leaves, "min_child_samples": self.min_child_samples,
                "subsample": self.subsample, "subsample_freq": 1,
                "colsample_bytree": self.colsample_bytree,
                "random_state": self.random_state + seed, "n_jobs": 1, "verbose": -1,
                "deterministic": True}

    def fit(self, X: Features, times: pd.DataFrame, groups: Any = None) -> OrderPredictor:
        """Learn from features ``X`` and ``times`` (rows x orders, step times, > 0);
        ``groups``: a family per row, for ``tie_tolerance=None`` (`choose_tolerance`)."""
        import lightgbm as lgb
        from joblib import Parallel, delayed

        if self.kind not in KINDS:
            raise TravorderError(f"unknown predictor kind {self.kind!r} (expected "
                                 f"{', '.join(KINDS)})")
        self._check_params()
        if self.row_weight not in ROW_WEIGHTS:
            raise TravorderError(f"unknown row_weight {self.row_weight!r} (expected "
                                 f"{' or '.join(map(repr, ROW_WEIGHTS))})")
        Xa = self._check_X(X, fitting=True)
        if not hasattr(times, "columns"):
            raise TravorderError("times must be a DataFrame with one column per order")
        T = times.to_numpy(dtype=float)
        if T.shape[0] != Xa.shape[0] or T.shape[1] < 2:
            raise TravorderError(f"times must have {Xa.shape[0]} rows and at least two "
                                 f"orders, got shape {T.shape}")
        if not np.all(np.isfinite(T) & (T > 0)):
            raise TravorderError("step times must be finite and positive")
        names = [str(c) for c in times.columns]
        if len(set(names)) < len(names):  # one order twice: the same class twice
            raise TravorderError(f"times names an order twice: {', '.join(names)}")
        if groups is not None and np.shape(groups) != (Xa.shape[0],):
            raise TravorderError(f"groups must give one family per row ({Xa.shape[0]}), "
                                 f"got {np.size(groups)}")
        self.classes_ = np.array(names)
        k = self.classes_.size
        log_ratio = np.log(T / T.min(axis=1, keepdims=True))
        # Orders exactly as fast as the best (identical sequences or placements) all win.
        winners = log_ratio == 0.0
        regret = regrets(T)
        self.mean_regret_ = regret.mean(axis=0)
        self.regret_table_ = np.array([
            regret[winners[:, c]].mean(axis=0) if winners[:, c].any() else
            regret.mean(axis=0) for c in range(k)])
        if self.kind == "classifier":
            # A row once per winner, weighted so that each row weighs one in all.
            rows, best = np.nonzero(winners)
            weight = 1.0 / winners.sum(axis=1)[rows]
            self.labels_ = np.unique(best)  # the orders that were ever best
            fits = [] if self.labels_.size < 2 else [
                delayed(lgb.LGBMClassifier(**self._lgb_params(s)).fit)(
                    Xa[rows], np.searchsorted(self.labels_, best), sample_weight=weight)
                for s in range(self.n_seeds)]
        elif self.kind == "regressor":
            weight = spread_weights(log_ratio) if self.row_weight == "spread" else None
            fits = [delayed(lgb.LGBMRegressor(**self._lgb_params(s)).fit)(
                Xa, log_ratio[:, j], sample_weight=weight)
                for j in range(k) for s in range(self.n_seeds)]
        else:
            # An order's rank: how many orders are faster (tied orders share it).
            ranks = (log_ratio[:, None, :] < log_ratio[:, :, None]).sum(axis=2)
            relevance = (k - 1 - ranks).reshape(-1)
            rows = self._ranker_rows(Xa)
            fits = [delayed(lgb.LGBMRanker(**self._lgb_params(s)).fit)(
                rows, relevance, group=np.full(Xa.shape[0], k)) for s in range(self.n_seeds)]
        # LightGBM releases the GIL while it fits: threads run the fits side by side.
        fitted = Parallel(n_jobs=self.n_jobs, prefer="threads")(fits)
        self.models_ = [TreeEnsemble.from_text(compact(m.booster_.model_to_string()))
                        for m in fitted]
        self.tie_tolerance_ = self.tie_tolerance if self.tie_tolerance is not None \
            else self.choose_tolerance(Xa, times, groups)
        return self

    def choose_tolerance(self, X: Features, times: pd.DataFrame, groups: Any) -> float:
        """The tie tolerance of `TOLERANCES` whose recommendations have the lowest mean
        regret when ``tolerance_folds`` family-grouped folds of the rows are held out in
        turn (the largest among equals); `DEFAULT_TOLERANCE` with fewer than two families.
        Sets ``tolerance_regret_``: that mean regret per tolerance."""
        if groups is None:
            raise TravorderError("tie_tolerance=None chooses the tolerance by family "
                                 "cross-validation: fit needs groups (a family per row)")
        names, index = np.unique(np.asarray(groups, dtype=str), return_inverse=True)
        if names.size < 2:
            self.tolerance_regret_ = {}
            return DEFAULT_TOLERANCE
        fold = index % min(self.tolerance_folds, names.size)
        T = times.to_numpy(dtype=float)
        predicted, safety = np.zeros(T.shape), np.zeros(T.shape)
        for f in np.unique(fold):
            held_out = fold == f
            inner = OrderPredictor(**{**self.get_params(), "tie_tolerance": 0.0}).fit(
                X[~held_out], times[~held_out])
            predicted[held_out] = inner.expected_regret(X[held_out])
            safety[held_out] = inner.mean_regret_
        regret = regrets(T)
        rows = np.arange(T.shape[0])
        self.tolerance_regret_ = {
            t: float(regret[rows, tie_ranking(predicted, safety, t)[:, 0]].mean())
            for t in TOLERANCES}
        low = min(self.tolerance_regret_.values())
        return max(t for t, r in self.tolerance_regret_.items() if r <= low + 1e-12)

    def _check_fitted(self) -> None:
        if not hasattr(self, "models_"):
            raise TravorderError("this OrderPredictor is not fitted yet; call fit first")

    def _check_X(self, X: Features, fitting: bool = False) -> np.ndarray:
        if isinstance(X, Mapping):  # one row by feature name
            if fitting:
                raise TravorderError("fit needs a feature matrix, not a single row")
            if not hasattr(self, "feature_names_in_"):
                raise TravorderError("this predictor was fitted on an array without "
                                     "feature names: give a row as an array")
            self._require_features(X)
            X = [[X[name] for name in self.feature_names_in_]]
        elif hasattr(X, "columns"):  # a DataFrame
            names = np.array([str(c) for c in X.columns])
            if fitting:
                self.feature_names_in_ = names
            elif hasattr(self, "feature_names_in_"):
                self._require_features(names)
                X = X[list(self.feature_names_in_)]
        elif fitting and hasattr(self, "feature_names_in_"):
            del self.feature_names_in_  # a refit on a plain array: names of the old fit
        try:
            Xa = np.asarray(X, dtype=float)
        except (TypeError, ValueError) as exc:
            raise TravorderError(f"X must be a matrix of numbers ({exc})") from None
        if Xa.ndim != 2 or 0 in Xa.shape:
            raise TravorderError(f"X must be 2-D with at least one row and one feature, got "
                                 f"shape {Xa.shape}")
        if fitting:
            self.n_features_in_ = Xa.shape[1]
        elif Xa.shape[1] != self.n_features_in_:
            raise TravorderError(f"X has {Xa.shape[1]} features, the predictor was trained "
                                 f"on {self.n_features_in_}")
        return Xa

    def _require_features(self, names: Any) -> None:
        missing = sorted(set(self.feature_names_in_) - set(names))
        if missing:
            raise TravorderError(f"features missing: {', '.join(missing[:5])}")

    def _ranker_rows(self, Xa: np.ndarray) -> np.ndarray:
        k = self.classes_.size
        return np.hstack([np.repeat(Xa, k, axis=0), np.tile(np.eye(k), (Xa.shape[0], 1))])

    # ------------------------------------------------------------------ predicting
    def scores(self, X: Features) -> np.ndarray:
        """Per-order scores, higher is better: ``(n_rows, n_orders)``; their softmax is
        `predict_proba` (for the classifier they are log-probabilities up to a constant)."""
        self._check_fitted()
        Xa = self._check_X(X)
        k = self.classes_.size
        if self.kind == "regressor":
            pred = np.column_stack([self._raw_scores(Xa, j)[:, 0] for j in range(k)])
            return -pred / _REGRESSOR_TEMPERATURE
        if self.kind == "ranker":
            return self._raw_scores(self._ranker_rows(Xa), 0).reshape(-1, k)
        out = np.full((Xa.shape[0], k), -np.inf)
        if not self.models_:
            out[:, self.labels_[0]] = 0.0
        else:
            raw = self._raw_scores(Xa, 0)
            # Binary: P(second label) = sigmoid(raw), so the log-odds pair is (0, raw).
            out[:, self.labels_] = np.column_stack([np.zeros(len(raw)), raw]) \
                if raw.shape[1] == 1 else raw
        return out

    def _seeds(self, target: int) -> list[TreeEnsemble]:
        """The ``n_seeds`` fits of model ``target`` (an order's, or the only one)."""
        return self.models_[target * self.n_seeds:(target + 1) * self.n_seeds]

    def _raw_scores(self, Xa: np.ndarray, target: int) -> np.ndarray:
        """Model ``target``'s raw scores, averaged over its seeds."""
        return np.mean([m.raw_scores(Xa) for m in self._seeds(target)], axis=0)

    def predict_proba(self, X: Features) -> np.ndarray:
        """Probability of each order (columns as ``classes_``) being the best."""
        return softmax(self.scores(X))

    def predict(self, X: Features) -> np.ndarray:
        """The recommended order for each row: the first of `ranking`."""
        best = self.ranking(X)[:, 0]
        return self.classes_[best]

    def expected_regret(self, X: Features) -> np.ndarray:
        """Expected regret (step time / best - 1) of each order for each row: the
        regressor's own prediction ``exp(predicted log-ratio) - 1``; for the classifier and
        the ranker ``P(best = c) @ regret_table_``."""
        return self.regret_from_scores(self.scores(X))

    def regret_from_scores(self, scores: np.ndarray) -> np.ndarray:
        """`expected_regret` from precomputed `scores`."""
        if self.kind == "regressor":
            return np.expm1(np.maximum(-scores * _REGRESSOR_TEMPERATURE, 0.0))
        return softmax(scores) @ self.regret_table_

    def ranking(self, X: Features) -> np.ndarray:
        """Per row, the orders (indices into ``classes_``) from best to worst: the orders
        within ``tie_tolerance_`` (``tie_tolerance`` or the chosen one) of the lowest
        expected regret first, the one with the lowest
        mean regret on the training rows (the safest) leading, then the others by expected
        regret (`tie_ranking`). What `predict`, `shortlist` and recommendations go by."""
        return self.rank(self.scores(X))

    def rank(self, scores: np.ndarray) -> np.ndarray:
        """`ranking` from precomputed `scores`; see `tie_ranking`."""
        return tie_ranking(self.regret_from_scores(scores), self.mean_regret_,
                           self.tie_tolerance_, scores)

    def shortlist(self, X: Features, k: int) -> np.ndarray:
        """Per row, ``k`` orders to check by placement (indices into ``classes_``): the
        recommended order, then the one with the lowest mean regret on the training rows
        (once two orders are checked, the fastest is never worse than always using it),
        then the others as `ranking` has them."""
        return self.shortlist_from_scores(self.scores(X), k)

    def shortlist_from_scores(self, scores: np.ndarray, k: int) -> np.ndarray:
        """`shortlist` from precomputed `scores`."""
        self._check_fitted()
        if isinstance(k, bool) or not isinstance(k, Integral) or not (
                1 <= k <= self.classes_.size):
            raise TravorderError(f"a shortlist holds 1 to {self.classes_.size} orders, got {k}")
        position = self.rank(scores).argsort(axis=1)  # of each order in the ranking
        key = np.where(position == 0, 0, position + 1)
        anchor = self.mean_regret_.argmin()
        key[:, anchor] = np.minimum(key[:, anchor], 1)
        return key.argsort(axis=1)[:, :k]

    def explain(self, X: Features, orders: Any = None) -> np.ndarray:
        """Per-feature contributions (LightGBM SHAP values) to the score of each row's
        order in ``orders`` (indices into ``classes_``; default: the recommended order,
        the first of `ranking`): ``(n_rows, n_features)``."""
        import lightgbm as lgb

        self._check_fitted()
        Xa = self._check_X(X)
        top = self.ranking(Xa)[:, 0] if orders is None else np.asarray(orders)
        if top.shape != (Xa.shape[0],) or top.dtype.kind not in "iu" or not np.all(
                (top >= 0) & (top < self.classes_.size)):
            raise TravorderError(f"explain needs one order index (0 to "
                                 f"{self.classes_.size - 1}) per row, got {top.tolist()}")
        d = self.n_features_in_

        @functools.cache  # each model read once per call, however many rows
        def boosters(target: int) -> list[lgb.Booster]:
            return [lgb.Booster(model_str=m.text) for m in self._seeds(target)]

        def contrib(target: int, rows: np.ndarray) -> np.ndarray:
            # SHAP values add up like the scores: the seeds' mean is the ensemble's.
            return np.mean([b.predict(rows, pred_contrib=True) for b in boosters(target)],
                           axis=0)

        if self.kind == "regressor":
            c = [contrib(j, Xa[i:i + 1])[0, :d] for i, j in enumerate(top)]
            return -np.array(c) / _REGRESSOR_TEMPERATURE
        if self.kind == "ranker":
            rows = self._ranker_rows(Xa).reshape(Xa.shape[0], -1, d + self.classes_.size)
            return np.array([contrib(0, rows[i, j][None])[0, :d] for i, j in enumerate(top)])
        if not self.models_:
            return np.zeros_like(Xa)
        c = contrib(0, Xa)
        if c.shape[1] == d + 1:  # binary: contributions towards the second label
            out = c[:, :d] * np.where(top == self.labels_[1], 1.0, -1.0)[:, None]
        else:
            per_class = c.reshape(Xa.shape[0], self.labels_.size, d + 1)
            label_pos = np.searchsorted(self.labels_, top).clip(max=self.labels_.size - 1)
            out = per_class[np.arange(Xa.shape[0]), label_pos, :d]
        # An order never best in training has a constant score: nothing contributes.
        return np.where(np.isin(top, self.labels_)[:, None], out, 0.0)

    # ------------------------------------------------------------------ files
    def save(self, directory: str | os.PathLike[str], **manifest: Any) -> None:
        """Write the models' trees (`TREES_FILE`) and ``manifest.json`` (``manifest`` adds entries,
        e.g. the feature schema version, training-data hash, evaluation summary; the
        versions of the libraries loaded, which the features and the fit depend on).
        The files of a model saved there before that this one does not use are removed."""
        import lightgbm as lgb

        self._check_fitted()
        out = check_model_dir(directory)
        if clash := sorted(set(manifest) & _OWN_ENTRIES):  # a model's own: "classes" ...
            raise TravorderError(f"manifest entry {clash[0]!r} is the model's own; give "
                                 f"the entries it lacks")
        try:  # before a file is written: an old model there stays whole
            json_text(manifest)
        except (TypeError, ValueError) as exc:
            raise TravorderError(f"manifest entries must be JSON values: {exc}") from None
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TravorderError(f"cannot make the model folder {str(out)!r}: "
                                 f"{exc.strerror or exc}") from None
        before = model_files(out / MANIFEST)
        save_trees(self.models_, out / TREES_FILE)
        checksums = {TREES_FILE: _sha256(out / TREES_FILE)}
        doc = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "kind": self.kind,
            "params": self.get_params(), "classes": self.classes_.tolist(),
            "feature_names": getattr(self, "feature_names_in_",
                                     np.array([f"x{i}" for i in range(self.n_features_in_)]))
            .tolist(),
            "labels": getattr(self, "labels_", np.arange(self.classes_.size)).tolist(),
            "regret_table": self.regret_table_.tolist(),
            "mean_regret": self.mean_regret_.tolist(), "model_files": checksums,
            "tie_tolerance_used": self.tie_tolerance_,
            "tolerance_regret": {str(t): r for t, r in
                                 getattr(self, "tolerance_regret_", {}).items()},
            "library_versions": {**library_versions(), "lightgbm": lgb.__version__},
            **manifest,
        }
        write_file(out / MANIFEST, json_text(doc, indent=1) + "\n",
                   "model manifest")
        for stale in before - model_files(out / MANIFEST):
            (out / stale).unlink(missing_ok=True)

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> tuple[OrderPredictor, dict[str, Any]]:
        """Read a predictor written by `save`: ``(predictor, manifest)``."""
        d = Path(directory)
        if d.exists() and not d.is_dir():
            raise FormatError(f"{d}: a file, not a predictor's folder (with {MANIFEST})")
        try:
            doc = parse_json((d / MANIFEST).read_text())
        except FileNotFoundError:
            raise FormatError(f"{d}: no predictor here (no {MANIFEST})") from None
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise FormatError(f"{d / MANIFEST}: broken predictor manifest ({exc})") from None
        check_format(doc, str(d / MANIFEST), FORMAT, READS_VERSIONS, "predictor manifest")
        _check_entries(doc, d / MANIFEST)
        try:
            p = cls(**{**_UNSET_BEFORE, **doc["params"]})
            p.classes_ = np.array(doc["classes"])
            p.feature_names_in_ = np.array(doc["feature_names"])
            p.n_features_in_ = p.feature_names_in_.size
            p.labels_ = np.array(doc["labels"], dtype=np.int64)
            p.regret_table_ = np.array(doc["regret_table"], dtype=float)
            p.mean_regret_ = np.array(doc["mean_regret"], dtype=float)
            p.tie_tolerance_ = float(doc.get("tie_tolerance_used",
                                             p.tie_tolerance if p.tie_tolerance is not None
                                             else DEFAULT_TOLERANCE))
            files = dict(doc["model_files"])
        except KeyError as exc:
            raise FormatError(f"{d / MANIFEST}: predictor manifest is missing {exc}") from None
        except (TypeError, ValueError) as exc:
            raise FormatError(f"{d / MANIFEST}: broken predictor manifest ({exc})") from None
        p.models_ = []
        for f, checksum in files.items():
            try:
                data = (d / f).read_bytes()
            except OSError as exc:
                raise FormatError(f"{d / f}: cannot read model ({exc.strerror})") from None
            if hashlib.sha256(data).hexdigest() != checksum:
                raise FormatError(f"{d / f}: broken model (its checksum differs from the "
                                  "manifest's: truncated or edited)")
            try:
                if f.endswith(".npz"):
                    p.models_.extend(load_trees(data))
                else:  # older models: one LightGBM text per file
                    text = (gzip.decompress(data) if f.endswith(".gz") else data).decode()
                    p.models_.append(TreeEnsemble.from_text(text))
            except (FormatError, UnicodeDecodeError, OSError, EOFError, zlib.error) as exc:
                raise FormatError(f"{d / f}: broken model ({exc})") from None
        net = doc.get("graph_net")
        if net is not None:
            from travorder.predictor.structure import GraphNet

            try:
                p.graph_net_ = GraphNet.load(d / net["file"], net["sha256"])
            except (KeyError, TypeError):
                raise FormatError(f"{d / MANIFEST}: broken graph network entry") from None
        p._check_consistent(d)
        return p, doc

    def _check_consistent(self, d: Path) -> None:
        k = self.classes_.size
        n_extra = k if self.kind == "ranker" else 0
        expected = {"classifier": 0 if self.labels_.size == 1 else 1, "regressor": k,
                    "ranker": 1}[self.kind]
        problems = []
        if self.regret_table_.shape != (k, k) or self.mean_regret_.shape != (k,):
            problems.append("regret table")
        if len(self.models_) != expected * self.n_seeds:
            problems.append(f"{len(self.models_)} models for {expected * self.n_seeds}")
        for m in self.models_:
            if m.num_feature != self.n_features_in_ + n_extra:
                problems.append(f"a model with {m.num_feature} features for "
                                f"{self.n_features_in_ + n_extra}")
            if self.kind == "classifier":
                objective = "binary sigmoid:1" if self.labels_.size == 2 \
                    else f"multiclass num_class:{self.labels_.size}"
                if m.objective != objective:
                    problems.append(f"a model with objective {m.objective!r} for "
                                    f"{objective!r}")
        if problems:
            raise FormatError(f"{d}: manifest does not match its model ({problems[0]})")


def _plain_name(x: Any) -> bool:
    return isinstance(x, str) and x not in ("", ".", "..") and Path(x).name == x


def _numbers(x: Any, n: int) -> bool:
    return (isinstance(x, list) and len(x) == n
            and all(isinstance(v, Real) and not isinstance(v, bool) for v in x))


# What a predictor manifest's entries must be, where given: the recommend path reads them
# long after loading, and a wrong type there is a TypeError far from the file.
_ENTRIES: dict[str, tuple[Any, str]] = {
    "params": (lambda v: isinstance(v, dict), "an object"),
    "model_files": (lambda v: isinstance(v, dict) and all(
        _plain_name(k) and isinstance(c, str) for k, c in v.items()),
        "an object of file names in the model's folder and their checksums"),
    "graph_net": (lambda v: v is None or (isinstance(v, dict) and _plain_name(v.get("file"))
                  and isinstance(v.get("sha256"), str)),
                  "an object with a file name in the model's folder and its sha256"),
    "placer": (lambda v: isinstance(v, str), "a placer's name"),
    "training": (lambda v: isinstance(v, bool), "true or false"),
    "coarsen_max_nodes": (lambda v: v is None or (isinstance(v, Integral)
                          and not isinstance(v, bool) and v >= 0),
                          "a number of nodes >= 0 (0: not coarsened)"),
    "feature_ranges": (lambda v: isinstance(v, dict) and all(
        isinstance(k, str) and _numbers(r, 2) and r[0] <= r[1] for k, r in v.items()),
        "an object of feature names and their [min, max]"),
    **{key: (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
             "a list of names") for key in ("clusters", "orders", "families", "structure")},
    "scenarios": (lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v),
                  "a list of scenario tables"),
}


def _check_entries(doc: Mapping[str, Any], source: Path) -> None:
    for key, (ok, what) in _ENTRIES.items():
        if key in doc and not ok(doc[key]):
            raise FormatError(f"{source}: predictor manifest entry {key!r} must be {what}, "
                              f"not {json_text(doc[key])[:60]}")


#: The entries `OrderPredictor.save` writes of the model itself.
_OWN_ENTRIES = frozenset({
    "format", "format_version", "kind", "params", "classes", "feature_names", "labels",
    "regret_table", "mean_regret", "model_files", "tie_tolerance_used", "tolerance_regret",
    "library_versions"})


def check_model_dir(directory: str | os.PathLike[str]) -> Path:
    """``directory`` as a folder a model may be saved in: not a file, and not holding a
    ``manifest.json`` of something else (a graph corpus), which saving would replace."""
    out = Path(directory)
    if out.exists() and not out.is_dir():
        raise TravorderError(f"{str(out)!r} is a file; a model is saved in a folder")
    manifest = out / MANIFEST
    if manifest.exists():
        try:
            foreign = parse_json(manifest.read_text()).get("format") != FORMAT
        except (OSError, ValueError, AttributeError):
            foreign = True
        if foreign:
            raise TravorderError(f"{str(out)!r} holds a {MANIFEST} that is not an order "
                                 f"predictor's (a graph corpus?), which the model's would "
                                 f"replace: save the model in another folder")
    return out


def model_files(manifest: Path) -> set[str]:
    """The files in ``manifest``'s directory that the predictor it describes reads (none if
    it is not a readable predictor manifest)."""
    try:
        doc = parse_json(manifest.read_text())
        if doc["format"] != FORMAT:
            return set()
        names = {*doc["model_files"], *([doc["graph_net"]["file"]] if doc.get("graph_net")
                                        else [])}
    except (OSError, ValueError, KeyError, TypeError):
        return set()
    return {n for n in names if _plain_name(n) and n != MANIFEST}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


