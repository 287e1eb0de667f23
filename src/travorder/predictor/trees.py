"""`TreeEnsemble`: a LightGBM text model evaluated with numpy alone.

`recommend-order` must start fast, and ``import lightgbm`` imports scikit-learn and with
it scipy.stats, seconds before the first prediction. The saved models are LightGBM's own
text format; this reads that format and computes the same raw scores as
``Booster.predict(X, raw_score=True)`` (numerical splits, LightGBM's missing-value rules),
so predicting needs no LightGBM. Fitting and SHAP explanations still use LightGBM.

>>> import numpy as np, lightgbm as lgb
>>> X = np.arange(40.0).reshape(20, 2)
>>> booster = lgb.train({"verbose": -1, "min_data_in_leaf": 2, "num_threads": 1},
...                     lgb.Dataset(X, X[:, 0]), 5)
>>> ens = TreeEnsemble(booster.model_to_string())
>>> bool(np.allclose(ens.raw_scores(X)[:, 0], booster.predict(X, raw_score=True)))
True
"""

from __future__ import annotations

import re

import numpy as np

from travorder.errors import FormatError

_DEFAULT_LEFT = 2  # decision_type bit: missing values go left
_MISSING_ZERO, _MISSING_NAN = 1, 2  # decision_type bits 2-3: what counts as missing
_ZERO = 1e-35  # LightGBM's kZeroThreshold
_TREE_KEYS = ("num_leaves", "num_cat", "is_linear", "split_feature", "threshold",
              "decision_type", "left_child", "right_child", "leaf_value")
_TREE_LINE = re.compile(rf"^({'|'.join(_TREE_KEYS)})=(.*)$", re.M)
# What LightGBM writes for training diagnostics only: neither predicting nor SHAP (which
# needs the leaf and internal counts) reads them, and they are half a model's text.
_UNUSED_LINE = re.compile(
    r"^(?:tree_sizes|split_gain|internal_value|internal_weight|leaf_weight)=.*\n", re.M)


def compact(text: str) -> str:
    """A LightGBM text model without the lines that only describe its training (split
    gains, internal values and weights, leaf weights, tree sizes): LightGBM loads it,
    and it predicts and explains (SHAP) exactly as the full text.

    >>> compact("tree\\nTree=0\\nsplit_gain=1.5\\nleaf_value=0.25\\n")
    'tree\\nTree=0\\nleaf_value=0.25\\n'
    """
    return _UNUSED_LINE.sub("", text)


class TreeEnsemble:
    """The trees of one LightGBM text model, flattened into arrays.

    ``num_class`` scores per row (``num_tree_per_iteration`` in LightGBM's terms),
    ``num_feature`` input columns, ``objective`` as LightGBM wrote it, ``text`` the model
    as read (so it can be saved unchanged).
    """

    def __init__(self, text: str) -> None:
        self.text = text
        if not text.startswith("tree\n"):
            raise FormatError("not a LightGBM text model")
        body, found, _ = text.partition("\nend of trees")
        if not found:
            raise FormatError("LightGBM model is truncated (no 'end of trees')")
        header = dict(re.findall(r"^(\w+)=(.*)$", body[:body.find("\nTree=")], re.M))
        try:
            self.num_class = int(header["num_tree_per_iteration"])
            self.num_feature = int(header["max_feature_idx"]) + 1
        except (KeyError, ValueError) as exc:
            raise FormatError(f"LightGBM model header lacks {exc}") from None
        self.objective = header.get("objective", "")
        if "\naverage_output\n" in body:
            raise FormatError("LightGBM random-forest models are not supported")
        fields: dict[str, list[str]] = {k: [] for k in _TREE_KEYS}
        for key, value in _TREE_LINE.findall(body):
            fields[key].append(value)
        if any(v != "0" for v in fields["num_cat"] + fields["is_linear"]):
            raise FormatError("LightGBM models with categorical or linear trees are not "
                              "supported")
        try:
            n_leaves = np.array(fields["num_leaves"], dtype=np.int64)
            if np.any(n_leaves < 1):
                raise ValueError("a tree without leaves")
            self._leaf_value = _values(fields, "leaf_value", np.float64, n_leaves.sum())
            n_split = n_leaves - 1
            self._feature = _values(fields, "split_feature", np.int64, n_split.sum())
            self._threshold = _values(fields, "threshold", np.float64, n_split.sum())
            decision_type = _values(fields, "decision_type", np.int64, n_split.sum())
            kids = [_values(fields, k, np.int64, n_split.sum())
                    for k in ("left_child", "right_child")]
        except ValueError as exc:
            raise FormatError(f"broken LightGBM model ({exc})") from None
        # One array for all trees: children >= 0 are nodes, < 0 are leaves (~leaf).
        node_start = np.cumsum(n_split) - n_split
        leaf_start = np.cumsum(n_leaves) - n_leaves
        tree_of = np.repeat(np.arange(n_leaves.size), n_split)
        self._left, self._right = (np.where(c >= 0, c + node_start[tree_of],
                                            c - leaf_start[tree_of]) for c in kids)
        self._roots = np.where(n_split > 0, node_start, ~leaf_start)
        self._default_left = (decision_type & _DEFAULT_LEFT) > 0
        self._missing = (decision_type >> 2) & 3
        if n_leaves.size % max(self.num_class, 1) or np.any(self._feature >= self.num_feature):
            raise FormatError("LightGBM model is inconsistent (trees, classes or features)")

    @property
    def num_trees(self) -> int:
        return int(self._roots.size)

    def raw_scores(self, X: np.ndarray) -> np.ndarray:
        """Raw scores ``(n_rows, num_class)``: the sum of each class's trees' leaf values,
        before the objective's link (sigmoid, softmax)."""
        X = np.asarray(X, dtype=np.float64)
        n = X.shape[0]
        node = np.repeat(self._roots[:, None], n, axis=1)  # (trees, rows)
        rows = np.broadcast_to(np.arange(n), node.shape)
        while True:
            at = np.nonzero(node >= 0)
            if at[0].size == 0:
                break
            i = node[at]
            x = X[rows[at], self._feature[i]]
            missing_type = self._missing[i]
            nan = np.isnan(x)
            x = np.where(nan & (missing_type != _MISSING_NAN), 0.0, x)
            is_missing = ((missing_type == _MISSING_ZERO) & (np.abs(x) <= _ZERO)) | (
                (missing_type == _MISSING_NAN) & nan)
            go_left = np.where(is_missing, self._default_left[i], x <= self._threshold[i])
            node[at] = np.where(go_left, self._left[i], self._right[i])
        values = self._leaf_value[~node]  # (trees, rows)
        k = max(self.num_class, 1)
        return values.reshape(-1, k, n).sum(axis=0).T


def _values(fields: dict[str, list[str]], key: str, dtype: type, count: int) -> np.ndarray:
    """All trees' ``key`` arrays, concatenated; there must be ``count`` values."""
    try:  # the text parser: several times faster than numbers from a list of strings
        out = np.fromstring(" ".join(fields[key]), dtype=dtype, sep=" ")
    except ValueError:
        raise ValueError(f"a value of {key} is not a number") from None
    if out.size != count:
        raise ValueError(f"{out.size} values of {key} for {count}")
    return out
