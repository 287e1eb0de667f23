"""TreeEnsemble: LightGBM models evaluated with numpy give LightGBM's raw scores; saved as
arrays, they give back LightGBM's text unchanged."""

from __future__ import annotations

import lightgbm as lgb
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from travorder.errors import FormatError
from travorder.predictor.trees import TreeEnsemble, compact, load_trees, save_trees


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
    ens = TreeEnsemble.from_text(booster.model_to_string())
    want = booster.predict(X, raw_score=True).reshape(len(X), -1)
    _, unseen = _data(seed + 1, n=50, nan=nan)
    np.testing.assert_array_equal(ens.raw_scores(X), want)
    np.testing.assert_array_equal(ens.raw_scores(unseen),
                                  booster.predict(unseen, raw_score=True).reshape(50, -1))
    assert ens.num_class == want.shape[1] and ens.num_feature == X.shape[1]


def test_tree_without_split_and_header_fields():
    X = np.zeros((10, 2))
    booster = lgb.train({"verbose": -1, "num_threads": 1}, lgb.Dataset(X, np.full(10, 3.0)), 2)
    ens = TreeEnsemble.from_text(booster.model_to_string())
    assert ens.num_trees == booster.num_trees() and ens.objective == "regression"
    np.testing.assert_allclose(ens.raw_scores(np.ones((4, 2)))[:, 0], 3.0)


def test_many_trees_without_a_split():
    # three classes, three rows: every tree a single leaf (numpy reads "  " as one 0)
    booster = lgb.train({"objective": "multiclass", "num_class": 3, "verbose": -1,
                         "num_threads": 1}, lgb.Dataset(np.arange(3.0)[:, None], [0, 1, 2]), 2)
    ens = TreeEnsemble.from_text(booster.model_to_string())
    assert ens.num_trees == booster.num_trees() == 3  # LightGBM stops after one round
    X = np.arange(3.0)[:, None]
    np.testing.assert_allclose(ens.raw_scores(X), booster.predict(X, raw_score=True))


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
        TreeEnsemble.from_text(edit(booster.model_to_string()))


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
    np.testing.assert_array_equal(TreeEnsemble.from_text(short).raw_scores(X),
                                  TreeEnsemble.from_text(full).raw_scores(X))


@settings(max_examples=15, deadline=None)
@given(objectives=st.lists(st.sampled_from(["regression", "binary", "multiclass",
                                            "lambdarank"]), max_size=3),
       seed=st.integers(0, 1000))
def test_saved_arrays_give_back_the_text_and_scores(tmp_path_factory, objectives, seed):
    boosters = [_fit(o, seed + i, 0.2)[0] for i, o in enumerate(objectives)]
    texts = [compact(b.model_to_string()) for b in boosters]
    models = [TreeEnsemble.from_text(t) for t in texts]
    assert [m.text for m in models] == texts  # the text LightGBM explains from
    path = tmp_path_factory.mktemp("trees") / "trees.npz"
    save_trees(models, path)
    again = load_trees(path.read_bytes())
    assert [m.text for m in again] == texts
    _, X = _data(seed, n=30, nan=0.2)
    for m, b in zip(again, boosters, strict=True):
        np.testing.assert_array_equal(m.raw_scores(X),
                                      b.predict(X, raw_score=True).reshape(len(X), -1))
    save_trees(again, path.with_name("again.npz"))  # no time stamps: same bytes
    assert path.with_name("again.npz").read_bytes() == path.read_bytes()


def test_single_leaf_trees_survive_the_arrays(tmp_path):
    booster = lgb.train({"verbose": -1, "num_threads": 1},
                        lgb.Dataset(np.zeros((10, 2)), np.full(10, 3.0)), 2)
    text = compact(booster.model_to_string())
    save_trees([TreeEnsemble.from_text(text)], tmp_path / "t.npz")
    (m,) = load_trees((tmp_path / "t.npz").read_bytes())
    assert m.text == text and m.num_trees == booster.num_trees() >= 1


@pytest.mark.parametrize(("edit", "message"), [
    (lambda b: b[: len(b) // 2], "broken tree arrays"),
    (lambda b: b"tree\n", "broken tree arrays"),
    ("n_trees", "models, headers and trees disagree"),
    ("leaf_value", "values of leaf_value"),
    ("object", "broken tree arrays"),
])
def test_broken_arrays_are_a_format_error(tmp_path, edit, message):
    booster, _ = _fit("regression", 0, 0.0)
    path = tmp_path / "t.npz"
    save_trees([TreeEnsemble.from_text(booster.model_to_string())] * 2, path)
    if callable(edit):
        data = edit(path.read_bytes())
    else:
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
        arrays[edit] = {"n_trees": arrays["n_trees"] + 1,
                        "leaf_value": arrays["leaf_value"][:-1],
                        "object": np.array([None], dtype=object)}[edit]
        if edit == "object":
            arrays["headers"] = arrays.pop("object")
        np.savez(path, **arrays)
        data = path.read_bytes()
    with pytest.raises(FormatError, match=message):
        load_trees(data)


def test_models_without_trees_keep_their_place_in_the_arrays(tmp_path):
    booster, X = _fit("regression", 1, 0.0)
    model = TreeEnsemble.from_text(compact(booster.model_to_string()))
    empty = TreeEnsemble(model.header, {k: v[:0] for k, v in model.trees.items()},
                         model.footer)
    save_trees([empty, model, empty, model], tmp_path / "t.npz")
    again = load_trees((tmp_path / "t.npz").read_bytes())
    assert [m.num_trees for m in again] == [0, model.num_trees, 0, model.num_trees]
    assert again[3].text == model.text
    np.testing.assert_array_equal(again[1].raw_scores(X), model.raw_scores(X))
