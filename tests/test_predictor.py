"""OrderPredictor, its evaluation, model files, the library API and `recommend-order`."""

from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest

from travorder.api import place, recommend_order
from travorder.cli import recommend_main
from travorder.datasets.onnx_examples import residual_cnn
from travorder.datasets.synthetic import SYNTHETIC_FAMILIES
from travorder.errors import FormatError, TravorderError, json_text
from travorder.featurize import FEATURE_SCHEMA_VERSION, graph_features
from travorder.graph import load_graph, training_graph
from travorder.predictor.active import bundled_model_dir
from travorder.predictor.dataset import design_matrix
from travorder.predictor.evaluate import evaluate
from travorder.predictor.model import KINDS, MANIFEST, TREES_FILE, OrderPredictor

from .models import save_dynamic_model

ORDERS = ["topo", "bfs", "dfs_preorder"]
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    """A small dataset whose best order is a known function of the features: `bfs` wins on
    parallel graphs (parallelism > 1.15), `topo` on the rest, `dfs_preorder` never."""
    rows = []
    for fam in ("chain", "resnet", "inception", "rnn", "transformer"):
        for seed in range(4):
            g = training_graph(SYNTHETIC_FAMILIES[fam](seed=seed))
            f = graph_features(g)
            wide = f["parallelism"] > 1.15
            for cluster in ("k80x3", "v100x4-nvlink"):
                rows.append({"family": fam, "cluster": cluster, "graph_hash": g.graph_hash,
                             **{f"f_{k}": v for k, v in f.items()},
                             "time_topo": 1.3 if wide else 1.0,
                             "time_bfs": 1.0 if wide else 1.4,
                             "time_dfs_preorder": 2.0, "ties": ""})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def model_dir(frame, tmp_path_factory) -> str:
    data = design_matrix(frame)
    out = tmp_path_factory.mktemp("model")
    OrderPredictor("classifier", n_estimators=30, min_child_samples=2).fit(
        data.X, data.times).save(out, feature_schema_version=FEATURE_SCHEMA_VERSION)
    return str(out)


@pytest.mark.parametrize("kind", KINDS)
def test_save_load_round_trip_predicts_identically(frame, kind, tmp_path):
    data = design_matrix(frame)
    p = OrderPredictor(kind, n_estimators=20, min_child_samples=2).fit(data.X, data.times)
    p.save(tmp_path, feature_schema_version=FEATURE_SCHEMA_VERSION)
    q, manifest = OrderPredictor.load(tmp_path)
    assert manifest["kind"] == kind and manifest["classes"] == ORDERS
    # the libraries the features and the fit came from, to tell why a refit differs
    import lightgbm
    import pandas as pd

    assert {"python", "travorder", "numpy", "pandas", "lightgbm"} <= set(
        manifest["library_versions"])
    assert manifest["library_versions"]["pandas"] == pd.__version__
    assert manifest["library_versions"]["lightgbm"] == lightgbm.__version__
    assert list(q.feature_names_in_) == list(data.X.columns)
    np.testing.assert_array_equal(p.predict(data.X), q.predict(data.X))
    np.testing.assert_allclose(p.predict_proba(data.X), q.predict_proba(data.X))
    np.testing.assert_allclose(p.explain(data.X[:3]), q.explain(data.X[:3]))


def test_a_save_that_cannot_be_made_leaves_the_model_there_whole(frame, tmp_path):
    data = design_matrix(frame)
    p = OrderPredictor("classifier", n_estimators=5, min_child_samples=2).fit(data.X,
                                                                            data.times)
    p.save(tmp_path)
    before = {f.name: f.read_bytes() for f in tmp_path.iterdir()}
    for extra, message in (({"note": object()}, "manifest entries must be JSON values"),
                           ({"classes": ["x", "y"]}, "manifest entry 'classes' is the "
                                                     "model's own")):
        with pytest.raises(TravorderError, match=message):  # once a TypeError, its trees
            p.save(tmp_path, **extra)  # replaced; or predictions of the classes given
        assert {f.name: f.read_bytes() for f in tmp_path.iterdir()} == before
    np.testing.assert_array_equal(OrderPredictor.load(tmp_path)[0].predict(data.X),
                                  p.predict(data.X))


def test_learns_the_rule_and_beats_fixed_orders(frame):
    data = design_matrix(frame)
    ev = evaluate(data, kinds=("classifier",), params={"n_estimators": 30,
                                                       "min_child_samples": 2})
    t = ev.table
    assert t.loc["oracle", "mean_regret"] == 0 and t.loc["oracle", "top1"] == 1
    assert t.loc["always-dfs_preorder", "mean_regret"] == pytest.approx(
        (data.times["dfs_preorder"] / data.times.min(axis=1) - 1).mean())
    assert ev.best_fixed in ("always-topo", "always-bfs")
    assert t.loc["classifier", "mean_regret"] < t.loc[ev.best_fixed, "mean_regret"]


def test_verified_shortlists(frame):
    data = design_matrix(frame)
    ev = evaluate(data, kinds=("classifier",), params={"n_estimators": 30,
                                                       "min_child_samples": 2}, verify=(1, 2))
    t = ev.table
    # topo and bfs together always hold the best order here, so a shortlist of two that
    # holds both has no regret; the predictor's shortlist holds the training folds' best
    # fixed order and the classifier's choice, so it is never worse than either.
    for col in ("mean_regret", "top1"):
        assert t.loc["shortlist1", col] == t.loc["most-frequent", col]
    assert t.loc["shortlist2", "mean_regret"] == 0 and t.loc["shortlist2", "top1"] == 1
    assert t.loc["classifier+verify2", "mean_regret"] <= min(
        t.loc["classifier", "mean_regret"], t.loc[ev.best_fixed, "mean_regret"])
    assert t.loc["classifier+verify2", "worst_family_excess"] <= 0
    p = OrderPredictor("classifier", n_estimators=30, min_child_samples=2).fit(data.X,
                                                                              data.times)
    short = p.shortlist(data.X, 3)
    assert (p.classes_[short[:, 0]] == p.predict(data.X)).all()  # the pick first,
    assert (short[:, :2] == p.mean_regret_.argmin()).any(axis=1).all()  # then the safest
    assert (np.sort(short, axis=1) == np.arange(3)).all()  # each order once
    with pytest.raises(TravorderError, match="1 to 3 orders"):
        evaluate(data, kinds=(), verify=(4,))


@pytest.mark.parametrize("kind", ["classifier", "ranker"])
def test_exactly_tied_orders_all_win(frame, kind):
    # bfs repeats topo's step times exactly (as identical sequences do) on every row: the
    # two must come out alike, whichever column comes first.
    data = design_matrix(frame.assign(time_bfs=frame["time_topo"]))
    params = {"n_estimators": 20, "min_child_samples": 2, "n_seeds": 1}
    p = OrderPredictor(kind, **params).fit(data.X, data.times)
    topo, bfs = (list(p.classes_).index(o) for o in ("topo", "bfs"))
    np.testing.assert_allclose(p.regret_table_[topo], p.regret_table_[bfs])
    # Bagging and column sampling draw the two a little apart, no more (with the first
    # column taking the ties, 1.0 and 0.57 apart at most).
    proba = p.predict_proba(data.X)
    assert proba[:, topo].mean() == pytest.approx(proba[:, bfs].mean(), abs=0.1)
    assert np.abs(proba[:, topo] - proba[:, bfs]).max() < 0.25


def test_explain_explains_the_recommended_order():
    # A is the safer order in training; on x < 50 B is 1.5% faster, within the 2% tie
    # tolerance, so A is recommended although B scores higher.
    rng = np.random.default_rng(0)
    X = pd.DataFrame({"x": rng.uniform(0, 100, 80), "y": rng.uniform(0, 1, 80)})
    low = X["x"].to_numpy() < 50
    T = pd.DataFrame({"A": np.where(low, 101.5, 100.0), "B": np.where(low, 100.0, 130.0)})
    p = OrderPredictor("regressor", n_estimators=30, min_child_samples=3, n_seeds=1).fit(X, T)
    row = pd.DataFrame({"x": [10.0], "y": [0.5]})
    assert p.predict(row).tolist() == ["A"] and p.scores(row).argmax() == 1
    np.testing.assert_allclose(p.explain(row), p.explain(row, orders=[0]))
    assert not np.allclose(p.explain(row), p.explain(row, orders=[1]))
    for bad in ([2], [0.0], ["A"], [0, 1]):
        with pytest.raises(TravorderError, match="one order index"):
            p.explain(row, orders=bad)


def test_a_row_without_a_family_is_refused(frame):
    orphan = frame.copy()
    orphan.loc[:1, "family"] = None
    with pytest.raises(TravorderError, match=r"^2 dataset rows have no family$"):
        design_matrix(orphan)


def test_datasets_that_cannot_be_learned_from_are_one_line(frame):
    with pytest.raises(TravorderError, match="feature schema 99, this travorder computes"):
        design_matrix(frame.assign(feature_schema=99))
    mixed = frame.assign(feature_schema=FEATURE_SCHEMA_VERSION)
    mixed.loc[:3, "feature_schema"] = 0  # a few rows of an older schema among current ones
    with pytest.raises(TravorderError, match="feature schema 0, this travorder computes"):
        design_matrix(mixed)
    assert design_matrix(frame.assign(feature_schema=FEATURE_SCHEMA_VERSION)).orders == ORDERS
    text = frame.astype({"time_bfs": object})
    text.loc[3, "time_bfs"] = "abc"
    with pytest.raises(TravorderError, match="a feature or step time that is not a number"):
        design_matrix(text)
    for bad in (-3.0, 0.0, np.inf):  # refused before any fold is fitted
        wrong = frame.copy()
        wrong.loc[[3, 5], "time_bfs"] = bad
        with pytest.raises(TravorderError, match=rf"^dataset row of .* has a step time "
                                                 rf"of {bad} for 'bfs': step times must be "
                                                 rf"finite and positive \(2 rows of "
                                                 rf"{len(frame)} with one\)$"):
            design_matrix(wrong)
    other = frame.assign(time_bfs=np.nan, time_dfs_preorder=np.nan, time_alpha=1.0)
    with pytest.raises(TravorderError, match=r"at least two orders in every row; its rows "
                                             "share topo$"):
        design_matrix(pd.concat([frame, other], ignore_index=True))


def test_two_orders_are_evaluated_with_the_shortlists_that_fit(frame):
    ev = evaluate(design_matrix(frame.drop(columns="time_dfs_preorder")),
                  kinds=("regressor",), params={"n_estimators": 5}, folds=2)
    assert "regressor+verify2" in ev.table.index
    assert not any("verify3" in name for name in ev.table.index)


def test_ties_count_as_hits(frame):
    tied = frame.assign(ties="topo,bfs")
    ev = evaluate(design_matrix(tied), kinds=(), params={})
    assert ev.table.loc["always-topo", "top1"] == 1.0
    assert ev.table.loc["always-dfs_preorder", "top1"] == 0.0


def _scenario_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` under two scenarios: ``a`` as ``frame``; in ``b`` dfs_preorder wins."""
    b = frame.assign(time_dfs_preorder=0.9)
    return pd.concat([frame.assign(scenario="a"), b.assign(scenario="b")], ignore_index=True)


def test_breakdown_per_scenario_and_cluster(frame):
    data = design_matrix(_scenario_frame(frame))
    ev = evaluate(data, kinds=("classifier",), params={"n_estimators": 30,
                                                       "min_child_samples": 2}, verify=())
    b = ev.breakdown
    assert set(b.index.get_level_values("scenario")) == {"a", "b"}
    assert set(b.index.get_level_values("cluster")) == {"all", "k80x3", "v100x4-nvlink"}
    assert set(b.index.get_level_values("method")) == {"classifier", "best-fixed",
                                                       "best-fixed-per-scenario", "oracle"}
    assert b.loc[("a", "all", "oracle"), "rows"] == len(frame)
    # In b, dfs_preorder always wins: the fixed order chosen per scenario on the training
    # folds has no regret there; one order for both scenarios has some.
    assert b.loc[("b", "all", "best-fixed-per-scenario"), "mean_regret"] == 0
    assert b.loc[("b", "all", "best-fixed"), "mean_regret"] > 0
    t = ev.table
    for m in ("classifier", "best-fixed"):  # the parts add up to the whole
        part = b.xs(m, level="method")
        by_cluster = part[part.index.get_level_values("cluster") != "all"]
        for what in (by_cluster, part.xs("all", level="cluster")):
            assert (what["mean_regret"] * what["rows"]).sum() / what["rows"].sum() \
                == pytest.approx(t.loc[m, "mean_regret"])
    assert t.loc["best-fixed-per-scenario", "mean_regret"] < t.loc["best-fixed", "mean_regret"]
    assert json.dumps(ev.summary())  # JSON-ready, breakdown and families too


def test_families_worse_than_the_best_fixed_order_beyond_noise(frame):
    # topo always wins, bfs within 0.4 %: the best fixed order is topo in every fold. A
    # method that picks dfs_preorder on the chain family (2x slower) is worse there beyond
    # the 1 % tie gap of a deterministic placer; bfs on rnn is within it.
    frame = frame.assign(time_topo=1.0, time_bfs=1.004)
    data = design_matrix(frame)
    n, orders = len(frame), data.orders
    bad = np.tile(np.arange(3), (n, 1))
    bad[frame["family"] == "chain"] = [orders.index("dfs_preorder"), 0, 1]
    bad[frame["family"] == "rnn"] = [orders.index("bfs"), 0, 2]
    ev = evaluate(data, kinds=(), rankings={"bad": bad}, verify=())
    fam = ev.families.loc["bad"]
    assert ev.table.loc["best-fixed", "mean_regret"] == ev.table.loc["always-topo",
                                                                     "mean_regret"]
    assert fam.loc["chain", "worse"] and fam.index[0] == "chain"
    assert fam.loc["chain", "noise"] == pytest.approx(0.01)
    assert fam.loc["chain", "excess"] == pytest.approx(
        fam.loc["chain", "regret"] - fam.loc["chain", "best_fixed_regret"])
    assert fam["worse"].sum() == 1 == ev.table.loc["bad", "families_worse"]
    assert ev.table.loc["bad", "worst_family_excess"] == pytest.approx(
        fam.loc["chain", "excess"])
    # Standard errors widen the noise: a 2x gap within two standard errors is a tie.
    noisy = frame.assign(se_topo=1.0, se_dfs_preorder=1.0, se_bfs=1.0)
    ev = evaluate(design_matrix(noisy), kinds=(), rankings={"bad": bad}, verify=())
    assert not ev.families.loc["bad", "worse"].any()


def test_evaluate_on_a_separate_test_dataset(frame):
    # 30 trees of one seed learn the rule of 32 training rows at this rate
    params = {"n_estimators": 30, "min_child_samples": 2, "learning_rate": 0.1, "n_seeds": 1}
    data = design_matrix(frame)
    # The test data: the same rows under other costs, where bfs never wins, and one
    # family the training data does not hold.
    other = frame.assign(time_bfs=1.5)
    extra = other[other["family"] == "rnn"].assign(family="rnn_new")
    test = design_matrix(pd.concat([other, extra], ignore_index=True))
    ev = evaluate(data, kinds=("classifier",), params=params, verify=(2,), test=test)
    t = ev.table
    T = test.times.to_numpy()
    regret = T / T.min(axis=1, keepdims=True) - 1
    # scored on the test rows with the test data's step times ...
    assert t.loc["always-bfs", "mean_regret"] == pytest.approx(regret[:, 1].mean())
    assert t.loc["always-topo", "mean_regret"] == 0 and t.loc["oracle", "top1"] == 1
    assert "rnn_new" in ev.per_family.columns
    # ... by a model that learned the training data's rule (bfs on parallel graphs, which
    # loses in the test data) ...
    assert evaluate(data, kinds=("classifier",), params=params, verify=()).table.loc[
        "classifier", "mean_regret"] < t.loc["classifier", "mean_regret"] / 2
    # ... and the fixed order chosen on the training rows of the other families
    R = data.times.to_numpy() / data.times.min(axis=1).to_numpy()[:, None] - 1
    expected = [regret[i, R[data.family != f].mean(axis=0).argmin()]
                for i, f in enumerate(test.family)]
    assert t.loc["best-fixed", "mean_regret"] == pytest.approx(np.mean(expected))
    with pytest.raises(TravorderError, match="test data has the orders"):
        evaluate(data, kinds=(), test=design_matrix(frame.drop(columns="time_bfs")))
    with pytest.raises(TravorderError, match="test data lacks the feature"):
        evaluate(data, kinds=(), test=design_matrix(frame.drop(columns="f_n_nodes")))


def test_tie_tolerance_chosen_by_family_cross_validation(frame, tmp_path):
    from travorder.predictor.model import TOLERANCES

    data = design_matrix(frame)
    params = {"n_estimators": 20, "min_child_samples": 2, "tie_tolerance": None}
    with pytest.raises(TravorderError, match="fit needs groups"):
        OrderPredictor("regressor", **params).fit(data.X, data.times)
    p = OrderPredictor("regressor", **params).fit(data.X, data.times, groups=data.family)
    assert p.tie_tolerance_ in TOLERANCES and set(p.tolerance_regret_) == set(TOLERANCES)
    low = min(p.tolerance_regret_.values())
    assert p.tolerance_regret_[p.tie_tolerance_] == low  # the largest of the best
    assert all(r > low for t, r in p.tolerance_regret_.items() if t > p.tie_tolerance_)
    p.save(tmp_path, feature_schema_version=FEATURE_SCHEMA_VERSION)
    q, manifest = OrderPredictor.load(tmp_path)
    assert q.tie_tolerance is None and q.tie_tolerance_ == p.tie_tolerance_
    assert manifest["tie_tolerance_used"] == p.tie_tolerance_
    np.testing.assert_array_equal(p.ranking(data.X), q.ranking(data.X))
    one = OrderPredictor("regressor", **params).fit(data.X, data.times,
                                                    groups=["chain"] * len(frame))
    assert one.tie_tolerance_ == 0.02  # one family: nothing to hold out
    # A fixed tolerance is used as given.
    fixed = OrderPredictor("regressor", n_estimators=20, tie_tolerance=0.3).fit(data.X,
                                                                               data.times)
    assert fixed.tie_tolerance_ == 0.3


def test_fit_rejects_bad_times(frame):
    data = design_matrix(frame)
    with pytest.raises(TravorderError, match="finite and positive"):
        OrderPredictor().fit(data.X, data.times * 0)
    with pytest.raises(TravorderError, match="unknown predictor kind"):
        OrderPredictor("oracle").fit(data.X, data.times)
    twice = data.times.iloc[:, [0, 0, 1]]  # once classes_ of one order twice
    with pytest.raises(TravorderError, match="times names an order twice"):
        OrderPredictor().fit(data.X, twice)
    with pytest.raises(TravorderError, match="groups must give one family per row"):
        OrderPredictor(tie_tolerance=None).fit(data.X, data.times, groups="abc")
    with pytest.raises(TravorderError, match="at least one row and one feature"):
        OrderPredictor().fit(data.X.iloc[:, :0], data.times)  # once LightGBM's ValueError
    plain = OrderPredictor(n_estimators=5, min_child_samples=2).fit(data.X.to_numpy(),
                                                                    data.times)
    with pytest.raises(TravorderError, match="fitted on an array without feature names"):
        plain.predict(dict(zip(data.X.columns, data.X.iloc[0], strict=True)))


@pytest.fixture(scope="module")
def onnx_model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("m") / "resnet.onnx"
    onnx.save(residual_cnn(), path)
    return str(path)


def test_recommendation_is_a_distribution_over_orders(model_dir, onnx_model):
    rec = recommend_order(onnx_model, "k80x3", predictor=model_dir, explain=True)
    assert rec.order in ORDERS and rec.runner_up in ORDERS and rec.order != rec.runner_up
    assert sum(rec.probabilities.values()) == pytest.approx(1.0)
    assert rec.probability >= rec.runner_up_probability
    assert rec.runner_up_regret == pytest.approx(rec.expected_regret[rec.runner_up])
    assert rec.contributions is not None and len(rec.contributions) > 10


def test_verify_recommends_the_fastest_of_the_shortlist(capsys, model_dir, onnx_model):
    from travorder.graph.onnx_import import read_onnx
    from travorder.placement.orders import ORDERS as ALL_ORDERS
    from travorder.placement.placers import place_graph

    rec = recommend_order(onnx_model, "k80x3", predictor=model_dir, verify=3)
    study_graph = training_graph(read_onnx(onnx_model))  # the fixture's model: no coarsening
    results = {o: place_graph(study_graph, "k80x3", order=o) for o in ALL_ORDERS}
    # the shortlist, and the orders that visit the graph in the sequence of one of them
    assert set(ORDERS) <= set(rec.verified) and len(_placements(rec)) == len(ORDERS)
    want = {o: results[o].step_time_us for o in rec.verified}
    assert rec.verified == pytest.approx(want)
    assert want[rec.order] == min(want.values())
    assert list(rec.verified.values()) == pytest.approx(sorted(want.values()))  # fastest first
    # the best placement is one device's: the slower orders are floored to it, all tied
    floor = results[rec.order].single_device_us
    assert rec.single_device_us == pytest.approx(floor) == want[rec.order]
    assert sorted(rec.floored) == sorted(o for o in want if want[o] > floor * (1 + 1e-9))
    assert sorted(rec.tied) == sorted(want) and rec.runner_up is None
    assert place(onnx_model, "k80x3", predictor=model_dir, verify=3).order == rec.order
    one = recommend_order(onnx_model, "k80x3", predictor=model_dir, verify=1)
    plain = recommend_order(onnx_model, "k80x3", predictor=model_dir)
    assert one.order == plain.order and len(_placements(one)) == 1  # checks the pick
    assert one.confidence == plain.confidence  # one placement checked compares nothing
    twins = recommend_order(EXAMPLES / "resnet_small.onnx", "v100x4-nvlink", verify=1)
    assert len(twins.verified) == 5 and len(_placements(twins)) == 1  # the pick's sequence
    assert twins.confidence == "low"  # one placement, under five names: still unchecked
    code, out, _ = _run(capsys, str(EXAMPLES / "resnet_small.onnx"), "--verify", "1",
                        "--predictor", str(bundled_model_dir()))
    assert code == 0 and "confidence low: one placement checked" in out  # a warned-of graph
    two = recommend_order(onnx_model, "k80x3", predictor=model_dir, verify=2)
    p, _ = OrderPredictor.load(model_dir)  # then the best fixed order of the training data
    anchor = p.classes_[p.mean_regret_.argmin()]
    assert len(_placements(two)) == 2 and {plain.order, anchor} <= set(two.verified)
    with pytest.raises(TravorderError, match="a shortlist holds 1 to 3 orders, got 4"):
        recommend_order(onnx_model, predictor=model_dir, verify=4)
    code, out, _ = _run(capsys, onnx_model, "--predictor", model_dir, "--verify", "2")
    assert code == 0 and "fastest of 6 of 11 orders checked (the model knows 3; --budget " \
        "checks the others too)" in out  # the two placed and the orders of their sequences
    assert "(2 placements: orders of one node sequence share one)" in out
    code, _, err = _run(capsys, onnx_model, "--predictor", model_dir, "--verify", "-1")
    assert code == 2 and err.count("\n") == 1 and "a shortlist holds 1 to 3" in err


def test_prediction_ignores_node_names_and_numbering(model_dir, onnx_model):
    from travorder.graph import load_graph

    g = load_graph(onnx_model)
    perm = np.random.default_rng(0).permutation(g.n_nodes)
    shuffled = g.permute(perm).replace(names=[f"node{i}" for i in range(g.n_nodes)])
    a = recommend_order(g, "k80x3", predictor=model_dir)
    b = recommend_order(shuffled, "k80x3", predictor=model_dir)
    assert a.order == b.order and a.probabilities == pytest.approx(b.probabilities)


def test_place_auto_uses_the_recommended_order(model_dir, onnx_model):
    rec = recommend_order(onnx_model, "v100x4-nvlink", predictor=model_dir)
    r = place(onnx_model, "v100x4-nvlink", predictor=model_dir)
    assert r.order == rec.order and r.placer == "greedy" and r.feasible


def _placements(rec) -> set:
    """The distinct placements among the orders ``rec`` checked (one per node sequence)."""
    return {next((tuple(g) for g in rec.same_sequence if o in g), o) for o in rec.verified}


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = recommend_main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_recommend_order_cli_json_and_place(capsys, model_dir, onnx_model, tmp_path):
    out_path = tmp_path / "placement.json"
    code, out, _ = _run(capsys, onnx_model, "--predictor", model_dir, "--json", "--place",
                        str(out_path))
    doc = json.loads(out)
    assert code == 0 and doc["order"] in ORDERS
    assert json.loads(out_path.read_text())["order"] == doc["order"]
    code, out, _ = _run(capsys, onnx_model, "--predictor", model_dir, "--explain")
    assert code == 0 and "recommended order" in out and "features that drove it" in out
    explained = [json.loads(_run(capsys, onnx_model, "--predictor", model_dir, "--json",
                                 "--explain", *top)[1])["contributions"]
                 for top in ([], ["--top", "2"])]  # --top once ignored with --json
    assert len(explained[0]) > 2 and explained[1] == dict(list(explained[0].items())[:2])


def _corrupt(model_dir: str, tmp_path, how: str) -> str:
    import shutil

    d = tmp_path / how
    shutil.copytree(model_dir, d)
    manifest = json.loads((d / MANIFEST).read_text())
    if how == "schema":
        manifest["feature_schema_version"] = FEATURE_SCHEMA_VERSION + 1
    elif how == "future":
        manifest["format_version"] = 3
    elif how == "truncated":
        f = d / next(iter(manifest["model_files"]))
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 3])
    elif how == "not npz":  # with the manifest's checksum, so the reading fails
        f = next(iter(manifest["model_files"]))
        (d / f).write_bytes(b"tree\n")
        manifest["model_files"][f] = hashlib.sha256(b"tree\n").hexdigest()
    elif how == "mismatch":
        manifest["feature_names"] = manifest["feature_names"][:-2]
    (d / MANIFEST).write_text(json.dumps(manifest))
    return str(d)


@pytest.mark.parametrize(("how", "message"), [
    ("schema", "feature schema"),
    ("future", "format version 3 is not supported (this travorder reads version 1 or 2)"),
    ("truncated", "broken model (its checksum differs"),
    ("not npz", "broken model (broken tree arrays"),
    ("mismatch", "manifest does not match its model")])
def test_bad_model_files_exit_2_with_one_line(capsys, model_dir, onnx_model, tmp_path, how,
                                              message):
    bad = _corrupt(model_dir, tmp_path, how)
    code, _, err = _run(capsys, onnx_model, "--predictor", bad)
    assert code == 2 and err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize(("entry", "value", "message"), [
    ("feature_ranges", {"f_n_nodes": "x"}, "'feature_ranges' must be an object of feature"),
    ("feature_ranges", {"f_n_nodes": [2, 1]}, "'feature_ranges' must be"),
    ("clusters", "k80x3", "'clusters' must be a list of names"),
    ("structure", "order_split", "'structure' must be a list of names"),
    ("scenarios", 5, "'scenarios' must be a list of scenario tables"),
    ("scenarios", [{"batch": "zz"}], "scenario 1: scenario batch must be"),
    ("coarsen_max_nodes", "10", "'coarsen_max_nodes' must be a number of nodes >= 0"),
    ("placer", 7, "'placer' must be a placer's name, not 7"),
    ("training", "no", "'training' must be true or false"),
    ("params", [1], "'params' must be an object"),
    ("model_files", {"../trees.npz": "ab"}, "'model_files' must be an object of file names"),
    ("labels", "x", "broken predictor manifest (invalid literal"),
])
def test_manifest_entries_of_the_wrong_type_exit_2_with_one_line(
        capsys, model_dir, onnx_model, tmp_path, entry, value, message):
    d = tmp_path / "bad"
    shutil.copytree(model_dir, d)
    manifest = json.loads((d / MANIFEST).read_text())
    (d / MANIFEST).write_text(json.dumps(manifest | {entry: value}))
    code, _, err = _run(capsys, onnx_model, "--predictor", str(d))
    assert code == 2 and err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize("suffix", [".txt.gz", ".txt"])
def test_text_models_of_older_versions_load(model_dir, tmp_path, suffix):
    import gzip

    d = tmp_path / "old"
    shutil.copytree(model_dir, d)
    manifest = json.loads((d / MANIFEST).read_text())
    assert list(manifest["model_files"]) == [TREES_FILE]
    (d / TREES_FILE).unlink()
    new = OrderPredictor.load(model_dir)[0]
    files = {}
    for i, m in enumerate(new.models_):  # as versions before the tree arrays wrote them
        data = gzip.compress(m.text.encode()) if suffix.endswith(".gz") else m.text.encode()
        (d / f"model_{i}{suffix}").write_bytes(data)
        files[f"model_{i}{suffix}"] = hashlib.sha256(data).hexdigest()
    (d / MANIFEST).write_text(json.dumps(manifest | {"model_files": files,
                                                     "format_version": 1}))
    old = OrderPredictor.load(d)[0]
    assert [m.text for m in new.models_] == [m.text for m in old.models_]
    X = np.random.default_rng(0).normal(size=(5, new.n_features_in_))
    np.testing.assert_array_equal(new.scores(X), old.scores(X))

    # Saving over it leaves only the new model's files (and what was not the model's).
    (d / "notes.txt").write_text("mine")
    old.save(d)
    assert sorted(p.name for p in d.iterdir()) == [MANIFEST, "notes.txt", TREES_FILE]
    again, doc = OrderPredictor.load(d)
    assert doc["format_version"] == 2
    np.testing.assert_array_equal(again.scores(X), new.scores(X))


def test_missing_model_dir(tmp_path):
    with pytest.raises(FormatError, match="no predictor here"):
        OrderPredictor.load(tmp_path)
    (tmp_path / "spec.toml").write_text("name = 's'\n")
    with pytest.raises(FormatError, match=r"spec\.toml: a file, not a predictor's folder"):
        OrderPredictor.load(tmp_path / "spec.toml")


def test_recommend_path_never_imports_torch_or_the_training_libraries(model_dir, onnx_model):
    # The cold start of recommend-order depends on it: these take seconds to import.
    # networkx (0.1 s) is imported: the orders are computed to find those that coincide.
    heavy = ["torch", "lightgbm", "sklearn", "pandas", "scipy", "numba"]
    code = ("import sys; from travorder.cli import recommend_main; "
            f"rc = recommend_main([{onnx_model!r}, '--predictor', {model_dir!r}, '--json']); "
            f"assert rc == 0; loaded = [m for m in {heavy!r} if m in sys.modules]; "
            "assert not loaded, f'imported {loaded}'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_native_graph_is_recommended_and_described_without_onnx(model_dir, tmp_path):
    from travorder.graph import save_graph

    g = load_graph(EXAMPLES / "resnet_small.onnx")  # unrated ops, named by the warning
    path = tmp_path / "r.json.gz"
    save_graph(g.replace(meta={**g.meta, "unrated_op_types": {"Det": 2}}), path)
    code = ("import sys, contextlib, io; from travorder.cli import main, recommend_main\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            f"    assert recommend_main([{str(path)!r}, '--predictor', {model_dir!r}]) == 0\n"
            f"    assert main(['info', {str(path)!r}]) == 0\n"
            "assert 'Det x2' in out.getvalue(); assert 'onnx' not in sys.modules")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_shipped_model_recommends_a_2000_node_graph_without_torch(tmp_path):
    # The shipped model may use the order statistics or splits (networkx orders) and the
    # graph network, whose forward pass runs in numpy.
    from travorder.datasets.onnx_examples import transformer_stack

    path = tmp_path / "big.onnx"
    onnx.save(transformer_stack(n_layers=61), path)
    heavy = ["torch", "torch_geometric", "lightgbm", "sklearn", "pandas", "scipy", "numba"]
    code = ("import sys, json, io, contextlib; from travorder.cli import recommend_main; "
            "out = io.StringIO()\n"
            f"with contextlib.redirect_stdout(out): rc = recommend_main([{str(path)!r}, "
            "'--json'])\n"
            f"assert rc == 0; loaded = [m for m in {heavy!r} if m in sys.modules]; "
            "assert not loaded, f'imported {loaded}'; "
            "print(json.loads(out.getvalue())['n_nodes'])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 2000


def test_follows_scikit_learn_parameter_conventions(frame):
    from sklearn.base import clone

    p = OrderPredictor("ranker", n_estimators=7)
    assert p.get_params()["n_estimators"] == 7 and repr(p) == \
        "OrderPredictor(kind='ranker', n_estimators=7)"
    q = clone(p.set_params(num_leaves=4))
    assert q is not p and q.get_params() == p.get_params()
    with pytest.raises(TravorderError, match="no parameter 'depth'"):
        p.set_params(depth=3)
    with pytest.raises(TravorderError, match="not fitted"):
        q.predict(design_matrix(frame).X)


@pytest.mark.parametrize("kind", KINDS)
def test_a_seed_ensemble_averages_its_fits(frame, kind):
    data = design_matrix(frame)
    params = {"n_estimators": 10, "min_child_samples": 2}
    three = OrderPredictor(kind, n_seeds=3, random_state=5, **params).fit(data.X, data.times)
    alone = [OrderPredictor(kind, n_seeds=1, random_state=5 + s, **params)
             .fit(data.X, data.times) for s in range(3)]
    assert len(three.models_) == 3 * len(alone[0].models_)
    if kind == "classifier":  # averaged log-odds; the classes never best stay at -inf
        fitted = three.scores(data.X)[:, three.labels_]
        want = np.mean([a.scores(data.X)[:, a.labels_] for a in alone], axis=0)
    else:
        fitted, want = three.scores(data.X), np.mean([a.scores(data.X) for a in alone], axis=0)
    np.testing.assert_allclose(fitted, want, rtol=1e-12, atol=1e-12)
    # the fits differ (bagging draws per seed), so the average is not one of them
    assert not np.allclose(alone[0].scores(data.X), alone[1].scores(data.X))
    if kind == "regressor":  # SHAP values add up to the averaged score, less the bias
        import lightgbm as lgb

        from travorder.predictor.model import _REGRESSOR_TEMPERATURE

        X = data.X.to_numpy()[:3]
        scores = three.scores(X)
        for i, j in enumerate(three.ranking(X)[:, 0]):
            bias = np.mean([lgb.Booster(model_str=m.text).predict(
                X[i:i + 1], pred_contrib=True)[0, -1] for m in three._seeds(j)])
            assert three.explain(X[i:i + 1]).sum() == pytest.approx(
                scores[i, j] + bias / _REGRESSOR_TEMPERATURE)


def test_parallel_fits_give_the_same_model(frame):
    data = design_matrix(frame)
    params = {"n_estimators": 10, "min_child_samples": 2, "n_seeds": 2}
    one, two = (OrderPredictor("regressor", n_jobs=n, **params).fit(data.X, data.times)
                for n in (1, 2))
    assert [m.text for m in one.models_] == [m.text for m in two.models_]
    for bad in (0, 2.0, True):
        with pytest.raises(TravorderError, match=f"n_seeds must be an integer >= 1, got "
                                                 f"{bad!r}"):
            OrderPredictor("regressor", n_seeds=bad).fit(data.X, data.times)
    numpy_int = OrderPredictor("regressor", **{**params, "n_seeds": np.int64(2)})
    assert len(numpy_int.fit(data.X, data.times).models_) == 2 * data.times.shape[1]


@pytest.mark.parametrize(("param", "value", "message"), [
    ("n_estimators", "a", "n_estimators must be an integer >= 1"),
    ("n_estimators", -1, "n_estimators must be an integer >= 1"),
    ("num_leaves", 1, "num_leaves must be an integer >= 2"),
    ("n_jobs", 0, "n_jobs must be a non-zero integer"),
    ("learning_rate", 0, r"learning_rate must be a number in \(0, inf\)"),
    ("subsample", 2, r"subsample must be a number in \(0, 1\]"),
    ("tie_tolerance", "x", r"tie_tolerance must be a number in \[0, inf\)"),
    ("tie_tolerance", -1, r"tie_tolerance must be a number in \[0, inf\)"),
])
def test_bad_parameters_are_refused_before_fitting(frame, param, value, message):
    data = design_matrix(frame)
    with pytest.raises(TravorderError, match=message):
        OrderPredictor("regressor", **{param: value}).fit(data.X, data.times)


def test_bad_rows_and_shortlist_sizes_are_refused(frame):
    data = design_matrix(frame)
    p = OrderPredictor("regressor", n_estimators=5, n_seeds=1).fit(data.X, data.times)
    for rows, message in ((data.X.head(0), "at least one row"), ("abc", "matrix of numbers")):
        with pytest.raises(TravorderError, match=message):
            p.predict(rows)
    with pytest.raises(TravorderError, match="at least one row"):
        OrderPredictor("regressor").fit(data.X.head(0), data.times.head(0))
    for k in ("a", 1.0, 0):
        with pytest.raises(TravorderError, match="a shortlist holds 1 to 3 orders"):
            p.shortlist(data.X, k)


def test_models_saved_before_seed_ensembles_load_as_one_seed(frame, tmp_path):
    data = design_matrix(frame)
    p = OrderPredictor("regressor", n_estimators=10, min_child_samples=2, n_seeds=1).fit(
        data.X, data.times)
    p.save(tmp_path)
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    for name in ("n_seeds", "n_jobs"):
        del manifest["params"][name]
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    q = OrderPredictor.load(tmp_path)[0]
    assert q.n_seeds == 1
    np.testing.assert_array_equal(q.scores(data.X), p.scores(data.X))


def test_spread_weights_count_rows_whose_orders_are_close():
    # Three rows where topo wins by 2 % and one where bfs wins by 50 %, all alike: the
    # mean log-ratio favours bfs (topo 0.101, bfs 0.015); weighted by 1 / spread (100 for
    # the close rows, the 1 % floor; 4.93 for the far one) topo (0.0066 against 0.0195).
    X = pd.DataFrame({"x": [1.0] * 4})
    times = pd.DataFrame({"topo": [1.0, 1.0, 1.0, 1.5], "bfs": [1.02, 1.02, 1.02, 1.0]})
    params = {"n_estimators": 5, "min_child_samples": 1, "subsample": 1.0,
              "tie_tolerance": 0.0}
    spread = OrderPredictor("regressor", **params).fit(X, times)
    plain = OrderPredictor("regressor", row_weight=None, **params).fit(X, times)
    np.testing.assert_allclose(spread.expected_regret(X[:1]), [[0.00658, 0.01967]],
                               atol=1e-4)
    np.testing.assert_allclose(plain.expected_regret(X[:1]), [[0.10668, 0.01496]],
                               atol=1e-4)
    assert spread.predict(X[:1]) == ["topo"] and plain.predict(X[:1]) == ["bfs"]
    with pytest.raises(TravorderError, match="unknown row_weight 'rows'"):
        OrderPredictor("regressor", row_weight="rows").fit(X, times)


def test_scores_one_row_given_by_feature_name(frame):
    data = design_matrix(frame)
    p = OrderPredictor("regressor", n_estimators=10, min_child_samples=2).fit(data.X, data.times)
    row = data.X.iloc[3].to_dict()
    np.testing.assert_array_equal(p.scores(row), p.scores(data.X[3:4]))
    del row[data.X.columns[0]]
    with pytest.raises(TravorderError, match="features missing"):
        p.scores(row)


def test_refit_on_a_plain_array_forgets_the_old_feature_names(frame, tmp_path):
    data = design_matrix(frame)
    p = OrderPredictor("classifier", n_estimators=5, min_child_samples=2).fit(data.X, data.times)
    p.fit(data.X.to_numpy()[:, :5], data.times)
    assert not hasattr(p, "feature_names_in_") and p.n_features_in_ == 5
    p.save(tmp_path)
    q, manifest = OrderPredictor.load(tmp_path)
    assert manifest["feature_names"] == [f"x{i}" for i in range(5)]
    np.testing.assert_array_equal(q.predict(data.X.to_numpy()[:, :5]),
                                  p.predict(data.X.to_numpy()[:, :5]))


def test_place_auto_says_how_the_order_was_chosen(model_dir, onnx_model):
    plain = place(onnx_model, "k80x3", predictor=model_dir)
    assert plain.recommendation.order == plain.order
    assert plain.recommendation.probability == max(plain.recommendation.probabilities.values())
    assert plain.recommendation.verified is None
    checked = place(onnx_model, "k80x3", predictor=model_dir, verify=2)
    rec = checked.recommendation
    assert checked.order == rec.order and len(_placements(rec)) == 2
    assert rec.verified[checked.order] == min(rec.verified.values())
    assert checked.to_dict()["recommendation"]["verified"] == rec.verified
    assert place(onnx_model, "k80x3", order="topo").recommendation is None


def test_place_auto_checks_orders_with_the_placer_options_it_places_with(model_dir,
                                                                          onnx_model):
    for options in ({"colocate": False}, {}):
        r = place(onnx_model, "v100x4-nvlink", predictor=model_dir, verify=3, **options)
        assert r.recommendation.verified[r.order] == pytest.approx(r.step_time_us)
    with pytest.raises(TravorderError, match="has no option 'no_such_option'"):
        place(onnx_model, "k80x3", predictor=model_dir, verify=2, no_such_option=1)
    for given in ({"verify": 2}, {"budget": 5.0}, {"budget": -5}):
        with pytest.raises(TravorderError, match="order='auto'"):
            place(onnx_model, "k80x3", order="topo", **given)


@pytest.mark.parametrize(("given", "message"), [
    ({"floor": False}, "placer 'greedy' has no option 'floor'"),  # place_graph's own
    ({"graph": 1}, "placer 'greedy' has no option 'graph'"),
    ({"training": "no"}, "training must be True or False, not 'no'"),
    ({"training": None}, "training must be True or False, not None"),
    ({"example_inputs": [1]}, "example_inputs are for tracing a torch module; a model file"),
])
def test_place_refuses_arguments_it_cannot_use(onnx_model, given, message):
    # once a TypeError (an option twice), or silently taken ("no" as true, None as false)
    with pytest.raises(TravorderError, match=re.escape(message)):
        place(onnx_model, "k80x3", order="topo", **given)


def test_recommend_order_refuses_example_inputs_for_a_file(model_dir, onnx_model):
    with pytest.raises(TravorderError, match="leave example_inputs out"):
        recommend_order(onnx_model, predictor=model_dir, example_inputs=[1])
    with pytest.raises(TravorderError, match="explain must be True or False, not 'yes'"):
        recommend_order(onnx_model, predictor=model_dir, explain="yes")


def test_recommends_the_safest_order_tied_at_the_lowest_expected_regret(model_dir, onnx_model):
    rec = recommend_order(onnx_model, "k80x3", predictor=model_dir)
    p, _ = OrderPredictor.load(model_dir)
    low = min(rec.expected_regret.values())
    assert rec.tied == [o for o in p.classes_[np.argsort(p.mean_regret_, kind="stable")]
                        if rec.expected_regret[o] <= low + p.tie_tolerance_][:len(rec.tied)]
    assert set(rec.tied) == {o for o, r in rec.expected_regret.items()
                             if r <= low + p.tie_tolerance_}
    assert rec.order == rec.tied[0] and rec.runner_up not in rec.tied
    assert rec.confidence in ("high", "low") and rec.verified is None and not rec.exact


def test_every_order_tied_names_the_safest_and_no_runner_up(capsys, model_dir, onnx_model,
                                                            tmp_path):
    wide = tmp_path / "wide"
    shutil.copytree(model_dir, wide)
    manifest = json.loads((wide / "manifest.json").read_text())
    manifest["tie_tolerance_used"] = 10.0  # every order within the predictor's noise
    (wide / "manifest.json").write_text(json.dumps(manifest))
    p, _ = OrderPredictor.load(wide)
    rec = recommend_order(onnx_model, "k80x3", predictor=str(wide))
    safest = p.classes_[p.mean_regret_.argmin()]
    assert sorted(rec.tied) == sorted(ORDERS) and rec.order == safest
    code, out, _ = _run(capsys, onnx_model, "--predictor", str(wide))
    assert code == 0
    assert f"(first: {safest}, the safest: lowest mean regret in training)" in out
    assert f"runner-up:         none: all {len(ORDERS)} orders are tied" in out
    assert rec.runner_up is None and math.isnan(rec.runner_up_regret)
    code, out, _ = _run(capsys, onnx_model, "--predictor", str(wide), "--json")
    assert code == 0 and json.loads(out)["runner_up"] is None


def test_budget_checks_orders_and_says_when_the_answer_is_exact(model_dir, onnx_model):
    from travorder.graph.onnx_import import read_onnx
    from travorder.placement.orders import ORDERS as ALL_ORDERS
    from travorder.placement.placers import place_graph

    full = recommend_order(onnx_model, "k80x3", predictor=model_dir, budget=60)
    assert sorted(full.verified) == sorted(ALL_ORDERS) and full.exact  # any order,
    known = recommend_order(onnx_model, "k80x3", predictor=model_dir, verify=3)
    # the model's three first (a shortlist: only), with the orders of their sequences
    assert set(ORDERS) <= set(known.verified) and len(_placements(known)) == 3
    bundled = recommend_order(onnx_model, "k80x3", budget=60,  # knows them all
                              predictor=str(bundled_model_dir()))
    assert bundled.exact and sorted(bundled.verified) == sorted(ALL_ORDERS)
    study_graph = training_graph(read_onnx(onnx_model))
    want = {o: place_graph(study_graph, "k80x3", order=o).step_time_us for o in ALL_ORDERS}
    assert full.verified == pytest.approx(want) and want[full.order] == min(want.values())
    assert full.confidence == "high" and full.check_s > 0
    assert want[bundled.order] == min(want.values())  # the same answer, whatever it knows
    assert set(full.expected_regret) == set(ORDERS)  # predictions of the model's orders only
    one = recommend_order(onnx_model, "k80x3", predictor=model_dir, budget=0)
    plain = recommend_order(onnx_model, "k80x3", predictor=model_dir)
    twins = next(g for g in one.same_sequence if plain.order in g)  # topo's: five orders
    assert one.order == plain.order and not one.exact  # one placement, of five names
    assert list(one.verified) == [plain.order, *(o for o in twins if o != plain.order)]
    assert len(set(one.verified.values())) == 1
    for bad in (-1, "2", True):
        with pytest.raises(TravorderError, match="time budget must be"):
            recommend_order(onnx_model, predictor=model_dir, budget=bad)
    with pytest.raises(TravorderError, match="shortlist size must be an integer"):
        recommend_order(onnx_model, predictor=model_dir, verify="2")


def test_orders_of_one_node_sequence_share_one_outcome(capsys, tmp_path, monkeypatch):
    """On a chain every topological order visits the nodes alike, so they place alike:
    one prediction, one probability, tied, never each other's runner-up, placed once."""
    from travorder.graph import OpGraph, save_graph
    from travorder.placement import placers
    from travorder.placement.orders import ORDERS as ALL_ORDERS
    from travorder.placement.orders import identical_orders

    chain = OpGraph.from_records(
        [{"name": f"l{i}", "op_type": "MatMul", "flops": 1e9 * (i + 1),
          "output_bytes": 4e6, "param_bytes": 1e6} for i in range(4)],
        [(f"l{i}", f"l{i + 1}") for i in range(3)], name="chain", meta={"batch_size": 8})
    path = tmp_path / "chain.json.gz"
    save_graph(chain, path)
    rec = recommend_order(path, "k80x3")  # the bundled model knows every order
    same = identical_orders(training_graph(chain), ALL_ORDERS)
    assert rec.same_sequence == [list(g) for g in same]
    topological = next(g for g in same if "topo" in g)
    assert {"topo", "topo_lifo", "lexico_topo", "critical_path"} <= set(topological)
    for group in same:
        assert len({rec.expected_regret[o] for o in group}) == 1
        assert len({rec.probabilities[o] for o in group}) == 1
    distinct = [o for o in ALL_ORDERS if not any(o in g[1:] for g in same)]
    assert sum(rec.probabilities[o] for o in distinct) == pytest.approx(1.0)
    group = next((g for g in same if rec.order in g), (rec.order,))
    assert set(group) <= set(rec.tied) and rec.runner_up not in group
    assert rec.probability == rec.probabilities[rec.order]

    calls = []
    place = placers.place_graph
    monkeypatch.setattr(placers, "place_graph",
                        lambda *a, **k: calls.append(k["order"]) or place(*a, **k))
    full = recommend_order(path, "k80x3", budget=60)
    assert full.exact and sorted(full.verified) == sorted(ALL_ORDERS)
    assert len(calls) == len(distinct) < len(ALL_ORDERS)  # each sequence placed once
    want = {o: place(training_graph(chain), "k80x3", order=o).step_time_us
            for o in ALL_ORDERS}
    assert full.verified == pytest.approx(want)
    calls.clear()
    short = recommend_order(path, "k80x3", verify=3)  # each sequence placed once
    assert len(calls) == len(_placements(short))
    # each order of a checked sequence is checked: none is the runner-up of its twin
    # (once a twin left out of the shortlist was the runner-up, "7.1% worse")
    for g in same:
        assert set(g) <= set(short.verified) or not set(g) & set(short.verified)
    assert short.runner_up not in short.verified or short.runner_up not in short.tied
    assert not any(short.runner_up in g and set(g) & set(short.tied) for g in same)
    code, out, _ = _run(capsys, str(path), "--budget", "60")
    assert code == 0 and f"({len(distinct)} placements: orders of one node sequence " \
        "share one)" in out
    assert "one node sequence, one placement: " + " = ".join(topological) in out


def test_budget_starts_once_the_pick_is_placed(model_dir, onnx_model, monkeypatch):
    import time

    from travorder.placement import placers

    calls = []

    def slow_first(*args, **kwargs):  # as when the first placement compiles the kernels
        calls.append(kwargs["order"])
        if len(calls) == 1:
            time.sleep(1.0)
        return place(*args, **kwargs)

    place = placers.place_graph
    monkeypatch.setattr(placers, "place_graph", slow_first)
    rec = recommend_order(onnx_model, "k80x3", predictor=model_dir, budget=0.5)
    assert len(rec.verified) >= 2 and rec.check_s >= 1.0  # the 1 s counted in check_s
    calls.clear()
    recommend_order(onnx_model, "k80x3", predictor=model_dir, budget=0)
    assert len(calls) == 1


def test_budget_can_recommend_an_order_the_model_does_not_know(capsys, frame, onnx_model,
                                                               tmp_path):
    # A model of bfs and alpha only: on this graph five orders it never saw are faster.
    two = frame.drop(columns=["time_topo", "time_dfs_preorder"]).assign(time_alpha=1.2)
    data = design_matrix(two)
    OrderPredictor("classifier", n_estimators=10, min_child_samples=2).fit(
        data.X, data.times).save(tmp_path, feature_schema_version=FEATURE_SCHEMA_VERSION)
    rec = recommend_order(onnx_model, "k80x3", predictor=str(tmp_path), budget=60)
    assert rec.exact and rec.order not in ("bfs", "alpha") and len(rec.tied) > 1
    assert math.isnan(rec.probability) and rec.order not in rec.expected_regret
    assert json.loads(json_text(rec.to_dict()))["probability"] is None
    assert list(rec.verified)[:len(rec.tied)] == rec.tied  # fastest first
    assert rec.verified["bfs"] > rec.verified[rec.order]
    explained = recommend_order(onnx_model, "k80x3", predictor=str(tmp_path), budget=60,
                                explain=True)
    assert explained.order == rec.order and explained.contributions is None
    code, out, _ = _run(capsys, onnx_model, "--predictor", str(tmp_path), "--budget", "60",
                        "--explain")
    assert code == 0 and f"features that drove it: none: the model does not know " \
        f"{rec.order}" in out


def test_budget_on_the_command_line(capsys, model_dir, onnx_model):
    code, out, _ = _run(capsys, onnx_model, "--predictor", model_dir, "--budget", "60")
    assert code == 0 and "exact: every order was checked by placement with greedy" in out
    code, out, _ = _run(capsys, onnx_model, "--predictor", model_dir, "--budget", "0")
    assert code == 0 and "fastest of 5 of 11 orders checked (the model knows 3; the " \
        "others are checked after them) by placement with greedy in" in out
    assert " s (1 placement: orders of one node sequence share one)" in out
    code, out, _ = _run(capsys, onnx_model, "--budget", "60", "--predictor",
                        str(bundled_model_dir()))
    assert code == 0 and "exact: every order was checked by placement with greedy" in out
    code, _, err = _run(capsys, onnx_model, "--predictor", model_dir, "--budget", "-2")
    assert code == 2 and err.count("\n") == 1 and "time budget" in err


@pytest.mark.parametrize("check", [["--budget", "60"], ["--verify", "2"], []])
def test_written_placement_has_the_checked_step_time(capsys, model_dir, onnx_model, tmp_path,
                                                     check):
    from travorder.graph import load_graph
    from travorder.placement import simulate
    from travorder.placement.clusters import load_cluster
    from travorder.placement.placement_file import load_placement

    out_path = tmp_path / "placement.json"
    code, out, _ = _run(capsys, onnx_model, "--predictor", model_dir, "--json", "--place",
                        str(out_path), *check)
    doc = json.loads(out)
    graph = training_graph(load_graph(onnx_model))  # the graph the placement applies to
    devices, _ = load_placement(out_path, graph)
    step = simulate(graph, devices, load_cluster("k80x3")).step_time_us
    assert code == 0 and doc["placement"]["step_time_us"] == pytest.approx(step)
    if check:
        assert doc["verified"][doc["order"]] == pytest.approx(step)
    r = place(onnx_model, "k80x3", predictor=model_dir, verify=2 if check else 0)
    assert r.step_time_us == pytest.approx(step)


def test_warns_when_the_graph_lies_outside_the_training_data(capsys, model_dir, onnx_model,
                                                             tmp_path):
    import shutil

    d = tmp_path / "narrow"
    shutil.copytree(model_dir, d)
    manifest = json.loads((d / MANIFEST).read_text())
    manifest["feature_ranges"] = {"f_n_nodes": [1e5, 2e5], "c_n_devices": [1, 8]}
    (d / MANIFEST).write_text(json.dumps(manifest))
    rec = recommend_order(onnx_model, "k80x3", predictor=str(d))
    assert rec.confidence == "low" and len(rec.warnings) == 1
    assert rec.warnings[0].startswith("graph feature n_nodes = ")
    assert "outside the training data's range [1e+05, 2e+05]" in rec.warnings[0]
    code, out, _ = _run(capsys, onnx_model, "--predictor", str(d))
    assert code == 0 and "warning: graph feature n_nodes" in out and "confidence low" in out
    assert "to be sure: --budget 2 checks the orders by placement" in out
    code, out, _ = _run(capsys, onnx_model, "--predictor", str(d), "--budget", "2")
    assert code == 0 and "to be sure" not in out  # checked: nothing to suggest


def test_a_predictor_that_is_no_directory_name_is_refused(onnx_model):
    for bad in (3, ["dir"]):
        with pytest.raises(TravorderError, match="a predictor is a model directory, not "):
            recommend_order(onnx_model, predictor=bad)


def test_warns_when_the_cluster_has_rules_the_model_did_not_learn(onnx_model):
    rec = recommend_order(onnx_model, "k80x3-placeto")  # the bundled model: k80x3 and more
    assert rec.warnings[0] == ("cluster 'k80x3-placeto' is simulated by placeto's rules; "
                               "the model learned under travorder's")
    assert rec.confidence == "low"
    assert not any("placeto" in w for w in recommend_order(onnx_model, "k80x3").warnings)


def test_warns_when_the_model_learned_from_another_placer(onnx_model):
    model_dir = str(bundled_model_dir("m_etf"))  # no model of its own: greedy's
    assert model_dir == str(bundled_model_dir())
    rec = recommend_order(onnx_model, "k80x3", predictor=model_dir, placer="m_etf")
    assert rec.confidence == "low"
    assert rec.warnings[0] == ("the model learned from greedy's placements, not m_etf's: "
                               "its orders are greedy's best")
    assert not any("learned from" in w for w in recommend_order(
        onnx_model, "k80x3", predictor=model_dir).warnings)


def test_warns_that_orders_cannot_differ_on_one_device(capsys, onnx_model, tmp_path):
    import dataclasses

    from travorder.placement.clusters import load_cluster, save_cluster

    k80 = load_cluster("k80x3")
    one = dataclasses.replace(k80, name="one", devices=k80.devices[:1],
                              bandwidth=k80.bandwidth[:1, :1], latency=k80.latency[:1, :1])
    rec = recommend_order(onnx_model, one)
    assert rec.confidence == "high"  # certain, whatever the model's features say
    assert rec.warnings == ["cluster 'one' has one device: every order gives the same "
                            "placement"]
    assert sorted(rec.tied) == sorted(rec.expected_regret) and rec.tie_margin == 0.0
    assert set(rec.expected_regret.values()) == {0.0} and rec.runner_up is None
    assert math.isnan(rec.runner_up_regret) and math.isnan(rec.runner_up_probability)
    assert len(set(rec.probabilities.values())) == 1  # known, not predicted
    save_cluster(one, tmp_path / "one.toml")
    for check in ([], ["--verify", "2"], ["--budget", "0"]):  # nothing to check
        code, out, _ = _run(capsys, onnx_model, "--cluster", str(tmp_path / "one.toml"),
                            *check)
        assert code == 0 and "recommended order: any: every order places everything on " \
            "the one device" in out
        assert "runner-up:         none: all 11 orders are tied" in out  # the model knows 3
        assert "regret" not in out and "outside the training data" not in out
        code, out, _ = _run(capsys, onnx_model, "--cluster", str(tmp_path / "one.toml"),
                            "--json", *check)
        doc = json.loads(out)
        assert code == 0 and doc["runner_up"] is None and doc["runner_up_regret"] is None


def test_checks_over_memory_and_of_zero_time(model_dir, onnx_model, monkeypatch, capsys):
    from types import SimpleNamespace

    import travorder.api

    def fake(times, fits):  # one device does not fit: nothing falls back
        return lambda placed, c, candidates, *args: {
            o: SimpleNamespace(step_time_us=times[o], feasible=fits[o],
                               single_device_us=50.0, single_device_feasible=False)
            for o in candidates}

    monkeypatch.setattr(travorder.api, "identical_orders", lambda *a: [])  # all distinct

    # the fastest placement does not fit: the pick is the fastest that fits, and the
    # runner-up that does not fit has no finite regret (it was -33%)
    times = {"bfs": 100.0, "topo": 120.0, "dfs_preorder": 150.0}
    fits = {"bfs": False, "topo": True, "dfs_preorder": True}
    monkeypatch.setattr(travorder.api, "_check", fake(times, fits))
    rec = recommend_order(onnx_model, "k80x3", predictor=model_dir, verify=len(ORDERS))
    assert (rec.order, rec.runner_up, rec.runner_up_regret) == ("topo", "dfs_preorder", 0.25)
    assert rec.over_memory == ["bfs"]
    fits["dfs_preorder"] = False
    rec = recommend_order(onnx_model, "k80x3", predictor=model_dir, verify=len(ORDERS))
    assert rec.runner_up in rec.over_memory and rec.runner_up_regret == math.inf
    code, out, _ = _run(capsys, onnx_model, "--predictor", model_dir, "--verify", "3")
    assert code == 0 and "bfs 0.100 ms (over memory)" in out
    assert "(its placement does not fit in memory)" in out
    # every step takes no time (ops of no cost on a cluster without gaps): all tied
    monkeypatch.setattr(travorder.api, "_check", fake(dict.fromkeys(ORDERS, 0.0),
                                                      dict.fromkeys(ORDERS, True)))
    rec = recommend_order(onnx_model, "k80x3", predictor=model_dir, verify=len(ORDERS))
    assert sorted(rec.tied) == sorted(ORDERS) and rec.tie_margin == 0.0


def test_checked_orders_are_compared_as_the_placement_written(model_dir, onnx_model,
                                                               monkeypatch, capsys):
    from types import SimpleNamespace

    import travorder.api

    times = {"bfs": 100.0, "topo": 120.0, "dfs_preorder": 150.0}

    def fake(single_us):
        return lambda placed, c, candidates, *args: {
            o: SimpleNamespace(step_time_us=times[o], feasible=o != "dfs_preorder",
                               single_device_us=single_us, single_device_feasible=True)
            for o in candidates}

    monkeypatch.setattr(travorder.api, "identical_orders", lambda *a: [])  # all distinct

    # topo and dfs_preorder (over memory) would write one device, 110 us: 10% slower
    monkeypatch.setattr(travorder.api, "_check", fake(110.0))
    rec = recommend_order(onnx_model, "k80x3", predictor=model_dir, verify=len(ORDERS))
    assert (rec.order, rec.tied, rec.floored) == ("bfs", ["bfs"], ["topo", "dfs_preorder"])
    assert rec.runner_up_regret == pytest.approx(0.1) and rec.single_device_us == 110.0
    assert rec.verified == times  # as measured: the floor is not written over them
    code, out, _ = _run(capsys, onnx_model, "--predictor", model_dir, "--verify", "3")
    assert code == 0 and ("one device (0.110 ms) is faster than the placements of every "
                          "checked order but bfs (or fits where they do not): --place "
                          "would write it for them, were one chosen, and they are compared "
                          "at it") in out  # not bfs's: its own placement is written
    code, out, _ = _run(capsys, onnx_model, "--predictor", model_dir, "--verify", "2")
    floored = next(o for o in ("topo", "dfs_preorder") if f"{o} 0.1" in out)
    assert code == 0 and (f"one device (0.110 ms) is faster than {floored}'s placement"
                          in out) and "would write it for that order" in out
    assert "measured regret 10.0%" in out
    # one device faster than all: whichever is chosen, one device is written
    monkeypatch.setattr(travorder.api, "_check", fake(90.0))
    rec = recommend_order(onnx_model, "k80x3", predictor=model_dir, verify=len(ORDERS))
    assert rec.floored == rec.tied == ["bfs", "topo", "dfs_preorder"]
    assert rec.order == "bfs" and rec.tie_margin == 0.0 and rec.runner_up is None
    code, out, _ = _run(capsys, onnx_model, "--predictor", model_dir, "--verify", "3")
    assert code == 0 and "any of bfs, topo, dfs_preorder: measured within 0.0%" in out
    assert ("one device (0.090 ms) is faster than every checked order's placement (or "
            "fits where they do not): --place writes it for them") in out
    assert "measured regret" not in out
    code, out, _ = _run(capsys, onnx_model, "--predictor", model_dir, "--verify", "1")
    assert code == 0 and "is faster than topo's placement: --place writes it instead" in out
    code, out, _ = _run(capsys, onnx_model, "--predictor", model_dir, "--verify", "3",
                        "--json")
    doc = json.loads(out)
    assert code == 0 and doc["floored"] == doc["tied"] and doc["single_device_us"] == 90.0


@pytest.mark.slow
def test_orders_slower_than_one_device_are_tied_at_the_placement_written(capsys, tmp_path):
    from travorder.graph.prepare import placed_graph
    from travorder.placement import simulate
    from travorder.placement.clusters import load_cluster
    from travorder.placement.placement_file import load_placement

    model = str(Path(__file__).parents[1] / "examples" / "transformer_small.onnx")
    out_path = tmp_path / "p.json"
    code, out, _ = _run(capsys, model, "--verify", "3", "--batch", "16", "--micro-batches",
                        "4", "--json", "--place", str(out_path))
    doc = json.loads(out)
    assert code == 0 and doc["floored"] == doc["tied"] == list(doc["verified"])
    assert min(doc["verified"].values()) > doc["single_device_us"]
    graph = placed_graph(load_graph(model), True, 16, 4)
    devices, _ = load_placement(out_path, graph)
    step = simulate(graph, devices, load_cluster("k80x3")).step_time_us
    assert doc["placement"]["fallback"] and step == pytest.approx(doc["single_device_us"])


def test_ops_without_a_flops_rule_are_a_warning(model_dir, tmp_path, capsys):
    from onnx import TensorProto, helper

    from travorder.cli import main

    det = [helper.make_node("Det", ["x"], [f"d{i}"], name=f"det{i}") for i in range(2)]
    graph = helper.make_graph(
        [*det, helper.make_node("Add", ["d0", "d1"], ["y"], name="add")], "dets",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    path = tmp_path / "dets.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    rec = recommend_order(str(path), "k80x3", predictor=model_dir)
    assert rec.warnings[0] == ("2 of 3 ops are of types without a FLOPs rule (Det x2), "
                               "costed at 1 FLOP per output element")
    assert main(["info", str(path)]) == 0  # once listed by nothing but the meta
    assert "ops without a FLOPs rule │ 2 (Det x2): 1 FLOP per output element each" in \
        capsys.readouterr().out


def test_ops_of_unknown_shape_are_a_warning(model_dir, tmp_path):
    path = save_dynamic_model(tmp_path / "dynamic.onnx")
    rec = recommend_order(path, "k80x3", predictor=model_dir)
    assert rec.warnings[0] == ("2 of 2 ops have tensors of unknown shape and are costed as "
                               "no work (symbolic dimensions: batch; bind them with "
                               "--dim batch=N (dims={'batch': N} in Python))")
    assert rec.confidence == "low"
    with pytest.raises(TravorderError, match="symbolic dimensions batch: bind them"):
        recommend_order(str(path), "k80x3", predictor=model_dir, batch=8)
    bound = recommend_order(str(path), "k80x3", predictor=model_dir, dims={"batch": 8},
                            batch=np.int64(16), micro_batches=np.int64(2))  # numpy's too
    assert not any("unknown shape" in w for w in bound.warnings)
    placed = place(str(path), "k80x3", order="topo", dims={"batch": 8}, batch=16)
    assert placed.step_time_us > place(str(path), "k80x3", order="topo",
                                       dims={"batch": 8}).step_time_us
    with pytest.raises(TravorderError, match="not an ONNX model, so it has no symbolic"):
        place(load_graph(path), "k80x3", order="topo", dims={"batch": 8})


@pytest.mark.parametrize("change", ["peak_flops", "latency"])
def test_times_beyond_a_float_are_refused_before_featurizing(capsys, onnx_model, tmp_path,
                                                              change):
    # once a ValueError (negative split piece) or a math domain error (log10 of 0)
    from travorder.placement.clusters import load_cluster

    doc = load_cluster("k80x3").to_dict()
    if change == "peak_flops":
        doc["devices"] = [d | {"peak_flops": 1e-300} for d in doc["devices"]]
    else:
        doc["links"]["latency"] = 1e308
    path = tmp_path / "c.json"
    path.write_text(json.dumps(doc))
    code, _, err = _run(capsys, onnx_model, "--cluster", str(path))
    assert code == 2 and err.count("\n") == 1 and "more than a float holds" in err, err
