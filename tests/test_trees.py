"""TreeEnsemble: LightGBM text models evaluated with numpy give LightGBM's raw scores."""

from __future__ import annotations

import lightgbm as lgb
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from travorder.errors import FormatError
from travorder.predictor.trees import TreeEnsemble, compact


def _data(seed: int, n: int = 200, d: int = 4, nan: float = 0.0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    X[:, 0] = np.round(X[:, 0])  # many exact zeros and repeated values
    X[rng.random(X.shape) < nan] = np.nan
    return rng, X


def _fit(objective: str, seed: int, nan: float, **params) -> tuple[lgb.Booster, np.ndarray]:
    rng, X = _data(seed, nan=nan)
    base = {"objective": objective, "verbose": -1, "min_data_in_leaf": 3, "num_leaves": 7,
            "num_threads": 1,
            "seed": seed, **params}
    if objective == "multiclass":
        y, base["num_class"] = rng.integers(0, 3, len(X)), 3
    elif objective == "binary":
        y = (np.nan_to_num(X[:, 1]) + rng.normal(size=len(X)) > 0).astype(float)
    elif objective == "lambdarank":
        y = rng.integers(0, 4, len(X))
    else:
        y = np.nan_to_num(X[:, 0]) * 2 + np.nan_to_num(X[:, 1]) + rng.normal(size=len(X))
    train = lgb.Dataset(X, y, group=[10] * 20 if objective == "lambdarank" else None)
    return lgb.train(base, train, num_boost_round=15), X


@settings(max_examples=30, deadline=None)
@given(objective=st.sampled_from(["regression", "binary", "multiclass", "lambdarank"]),
       seed=st.integers(0, 1000), nan=st.sampled_from([0.0, 0.2]),
       zero_as_missing=st.booleans())
def test_raw_scores_equal_lightgbm(objective, seed, nan, zero_as_missing):
    booster, X = _fit(objective, seed, nan, zero_as_missing=zero_as_missing)
    ens = TreeEnsemble(booster.model_to_string())
    want = booster.predict(X, raw_score=True).reshape(len(X), -1)
    _, unseen = _data(seed + 1, n=50, nan=nan)
    np.testing.assert_array_equal(ens.raw_scores(X), want)
    np.testing.assert_array_equal(ens.raw_scores(unseen),
                                  booster.predict(unseen, raw_score=True).reshape(50, -1))
    assert ens.num_class == want.shape[1] and ens.num_feature == X.shape[1]


def test_tree_without_split_and_header_fields():
    X = np.zeros((10, 2))
    booster = lgb.train({"verbose": -1, "num_threads": 1}, lgb.Dataset(X, np.full(10, 3.0)), 2)
    ens = TreeEnsemble(booster.model_to_string())
    assert ens.num_trees == booster.num_trees() and ens.objective == "regression"
    np.testing.assert_allclose(ens.raw_scores(np.ones((4, 2)))[:, 0], 3.0)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda t: t[: len(t) // 2], "truncated"),
    (lambda t: "not a model", "not a LightGBM text model"),
    (lambda t: t.replace("max_feature_idx=", "max_feature=", 1), "header lacks"),
    (lambda t: t.replace("leaf_value=", "leaf_value=1 ", 1), "values of leaf_value"),
    (lambda t: t.replace("threshold=", "threshold=x ", 1), "a value of threshold is not"),
    (lambda t: t.replace("num_cat=0", "num_cat=1", 1), "categorical"),
    (lambda t: t.replace("\nnum_leaves=", "\nnum_leaves=0\nx=", 1), "a tree without leaves"),
])
def test_broken_text_is_a_format_error(edit, message):
    booster, _ = _fit("regression", 0, 0.0)
    with pytest.raises(FormatError, match=message):
        TreeEnsemble(edit(booster.model_to_string()))


@pytest.mark.parametrize("objective", ["regression", "multiclass"])
def test_compact_text_predicts_and_explains_as_the_full_one(objective):
    booster, X = _fit(objective, 3, 0.2)
    full = booster.model_to_string()
    short = compact(full)
    assert len(short) < len(full)
    assert not any(f"\n{k}=" in short for k in ("split_gain", "internal_value",
                                               "internal_weight", "leaf_weight", "tree_sizes"))
    again = lgb.Booster(model_str=short)
    for kw in ({"raw_score": True}, {"pred_contrib": True}):
        np.testing.assert_array_equal(again.predict(X, **kw), booster.predict(X, **kw))
    np.testing.assert_array_equal(TreeEnsemble(short).raw_scores(X),
                                  TreeEnsemble(full).raw_scores(X))
