"""`TreeEnsemble`: a LightGBM model evaluated with numpy alone.

`recommend-order` must start fast, and ``import lightgbm`` imports scikit-learn and with
it scipy.stats, seconds before the first prediction. This reads LightGBM's text format
and computes the same raw scores as ``Booster.predict(X, raw_score=True)`` (numerical
splits, LightGBM's missing-value rules), so predicting needs no LightGBM. A model is
saved as its trees' arrays (``.npz``), which load without parsing any text, and gives
back its LightGBM text unchanged for LightGBM to explain (SHAP). Fitting and explaining
still use LightGBM.

>>> import numpy as np, lightgbm as lgb
>>> X = np.arange(40.0).reshape(20, 2)
>>> booster = lgb.train({"verbose": -1, "min_data_in_leaf": 2, "num_threads": 1},
...                     lgb.Dataset(X, X[:, 0]), 5)
>>> ens = TreeEnsemble.from_text(compact(booster.model_to_string()))
>>> bool(np.allclose(ens.raw_scores(X)[:, 0], booster.predict(X, raw_score=True)))
True
>>> ens.text == compact(booster.model_to_string())
True
"""

from __future__ import annotations

import functools
import io
import os
import re
import zipfile
from collections.abc import Mapping, Sequence

import numpy as np

from travorder.errors import FormatError

_DEFAULT_LEFT = 2  # decision_type bit: missing values go left
_MISSING_ZERO, _MISSING_NAN = 1, 2  # decision_type bits 2-3: what counts as missing
_ZERO = 1e-35  # LightGBM's kZeroThreshold
# The per-tree arrays kept; the text's line order within a tree is _BLOCK_ORDER.
_PER_SPLIT = ("split_feature", "threshold", "decision_type", "left_child", "right_child",
              "internal_count")
_PER_LEAF = ("leaf_value", "leaf_count")
_ARRAYS = ("num_leaves", "shrinkage", *_PER_SPLIT, *_PER_LEAF)
_BLOCK_ORDER = ("split_feature", "threshold", "decision_type", "left_child", "right_child",
                "leaf_value", "leaf_count", "internal_count")
_DTYPES = {k: np.float64 if k in ("shrinkage", "threshold", "leaf_value") else np.int64
           for k in _ARRAYS}
_FORMATS = {k: "%.17g" if _DTYPES[k] is np.float64 else "%d" for k in _ARRAYS}  # LightGBM's
_TREE_LINE = re.compile(rf"^({'|'.join((*_ARRAYS, 'num_cat', 'is_linear'))})=(.*)$", re.M)
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
    """The trees of one LightGBM model, flattened into arrays.

    ``num_class`` scores per row (``num_tree_per_iteration`` in LightGBM's terms),
    ``num_feature`` input columns, ``objective`` as LightGBM wrote it, ``trees`` the
    per-tree, per-split and per-leaf arrays. Read from LightGBM's text (`from_text`) or
    from the arrays `save_trees` writes (`load_trees`: no text to parse, which was most of
    the time a cold `recommend-order` spent on the model); ``text`` is the model as
    `compact` LightGBM text, byte for byte what `from_text` read when that was compact, so
    LightGBM can load it to explain.
    """

    def __init__(self, header: str, trees: Mapping[str, np.ndarray], footer: str) -> None:
        self.header, self.footer = header, footer
        self.trees = {k: np.asarray(trees[k]) for k in _ARRAYS}
        header_fields = dict(re.findall(r"^(\w+)=(.*)$", header, re.M))
        try:
            self.num_class = int(header_fields["num_tree_per_iteration"])
            self.num_feature = int(header_fields["max_feature_idx"]) + 1
        except (KeyError, ValueError) as exc:
            raise FormatError(f"LightGBM model header lacks {exc}") from None
        self.objective = header_fields.get("objective", "")
        if "\naverage_output\n" in header:
            raise FormatError("LightGBM random-forest models are not supported")
        n_leaves = self.trees["num_leaves"].astype(np.int64)
        if np.any(n_leaves < 1):
            raise FormatError("broken LightGBM model (a tree without leaves)")
        n_split = n_leaves - 1
        for key in _ARRAYS:
            count = int(_sizes(key, n_leaves).sum())
            if self.trees[key].shape != (count,):
                raise FormatError(f"broken LightGBM model ({self.trees[key].size} values of "
                                  f"{key} for {count})")
        self._leaf_value = self.trees["leaf_value"].astype(np.float64)
        self._feature = self.trees["split_feature"].astype(np.int64)
        self._threshold = self.trees["threshold"].astype(np.float64)
        decision_type = self.trees["decision_type"].astype(np.int64)
        # One array for all trees: children >= 0 are nodes, < 0 are leaves (~leaf).
        node_start = np.cumsum(n_split) - n_split
        leaf_start = np.cumsum(n_leaves) - n_leaves
        tree_of = np.repeat(np.arange(n_leaves.size), n_split)
        self._left, self._right = (
            np.where(c >= 0, c + node_start[tree_of], c - leaf_start[tree_of])
            for c in (self.trees[k].astype(np.int64) for k in ("left_child", "right_child")))
        self._roots = np.where(n_split > 0, node_start, ~leaf_start)
        self._default_left = (decision_type & _DEFAULT_LEFT) > 0
        self._missing = (decision_type >> 2) & 3
        if (n_leaves.size % max(self.num_class, 1) or np.any(self._feature >= self.num_feature)
                or np.any((self._left >= n_split.sum()) | (self._right >= n_split.sum()))
                or np.any((~self._left >= n_leaves.sum()) | (~self._right >= n_leaves.sum()))):
            raise FormatError("LightGBM model is inconsistent (trees, classes, features or "
                              "children)")

    @classmethod
    def from_text(cls, text: str) -> TreeEnsemble:
        """Read LightGBM's text format (full or `compact`)."""
        if not text.startswith("tree\n"):
            raise FormatError("not a LightGBM text model")
        body, found, tail = text.partition("\nend of trees")
        if not found:
            raise FormatError("LightGBM model is truncated (no 'end of trees')")
        first = body.find("\nTree=")
        header = body[:first + 1] if first >= 0 else body + "\n"
        fields: dict[str, list[str]] = {k: [] for k in (*_ARRAYS, "num_cat", "is_linear")}
        for key, value in _TREE_LINE.findall(body):
            fields[key].append(value)
        if any(v != "0" for v in fields["num_cat"] + fields["is_linear"]):
            raise FormatError("LightGBM models with categorical or linear trees are not "
                              "supported")
        try:
            trees = {k: _values(fields, k, _DTYPES[k]) for k in _ARRAYS}
        except ValueError as exc:
            raise FormatError(f"broken LightGBM model ({exc})") from None
        return cls(header, trees, "end of trees" + tail)

    @functools.cached_property
    def text(self) -> str:
        """The model as `compact` LightGBM text (what LightGBM loads, to explain)."""
        n_leaves = self.trees["num_leaves"].astype(np.int64)
        lines = {k: [" ".join(_FORMATS[k] % x for x in part) for part in
                     np.split(self.trees[k], np.cumsum(_sizes(k, n_leaves))[:-1])]
                 for k in _BLOCK_ORDER}
        blocks = [
            f"Tree={i}\nnum_leaves={n}\nnum_cat=0\n"
            + "".join(f"{k}={lines[k][i]}\n" for k in _BLOCK_ORDER)
            + f"is_linear=0\nshrinkage={self.trees['shrinkage'][i]:g}\n\n\n"
            for i, n in enumerate(n_leaves)]
        return self.header + "".join(blocks) + self.footer

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


def save_trees(models: Sequence[TreeEnsemble], path: str | os.PathLike[str]) -> None:
    """Write ``models`` to one compressed ``.npz``: each array of all their trees end to
    end, ``n_trees`` per model, their headers and footers. The same models give the same
    bytes (no time stamps)."""
    arrays = {"n_trees": np.array([m.num_trees for m in models], dtype=np.int64),
              "headers": np.array([m.header for m in models]),
              "footers": np.array([m.footer for m in models]),
              **{k: _smallest(np.concatenate([np.empty(0, _DTYPES[k])]
                                             + [m.trees[k] for m in models]))
                 for k in _ARRAYS}}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for name, a in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            with z.open(info, "w") as f:
                np.lib.format.write_array(f, a, allow_pickle=False)


def load_trees(data: bytes) -> list[TreeEnsemble]:
    """The models `save_trees` wrote, from the file's bytes (never unpickles)."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            n_trees = z["n_trees"].astype(np.int64)
            headers, footers = z["headers"], z["footers"]
            arrays = {k: z[k] for k in _ARRAYS}
    except (ValueError, KeyError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise FormatError(f"broken tree arrays ({exc})") from None
    n_leaves = arrays["num_leaves"].astype(np.int64)
    if n_trees.sum() != n_leaves.size or np.any(n_trees < 0) \
            or not headers.shape == footers.shape == n_trees.shape:
        raise FormatError("broken tree arrays (models, headers and trees disagree)")
    # Each array is cut where a model's trees end: at the values of the trees before.
    ends = np.cumsum(n_trees)[:-1]
    parts = {k: np.split(arrays[k], np.concatenate([[0], np.cumsum(_sizes(k, n_leaves))])[ends])
             for k in _ARRAYS}
    return [TreeEnsemble(str(headers[i]), {k: parts[k][i] for k in _ARRAYS}, str(footers[i]))
            for i in range(n_trees.size)]


def _sizes(key: str, n_leaves: np.ndarray) -> np.ndarray:
    """How many values of array ``key`` each tree has, given its leaves."""
    if key in _PER_SPLIT:
        return n_leaves - 1
    return n_leaves if key in _PER_LEAF else np.ones_like(n_leaves)


def _values(fields: dict[str, list[str]], key: str, dtype: type) -> np.ndarray:
    """All trees' ``key`` values, concatenated (counts are checked by `TreeEnsemble`)."""
    text = " ".join(fields[key])
    if not text.strip():  # no values at all (trees without splits): numpy would read one 0
        return np.empty(0, dtype=dtype)
    try:  # the text parser: several times faster than numbers from a list of strings
        return np.fromstring(text, dtype=dtype, sep=" ")
    except ValueError:
        raise ValueError(f"a value of {key} is not a number") from None


def _smallest(a: np.ndarray) -> np.ndarray:
    """``a`` in the narrowest integer type that holds it (floats unchanged)."""
    if a.dtype.kind != "i" or a.size == 0:
        return a
    return a.astype(np.result_type(np.min_scalar_type(a.min()), np.min_scalar_type(a.max())))
