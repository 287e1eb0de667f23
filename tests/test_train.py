"""Training from study datasets with the structure features, and the shipped default model
against the bundled dataset it was trained on."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from travorder.api import recommend_order
from travorder.errors import FormatError, TravorderError
from travorder.placement.clusters import load_cluster
from travorder.predictor.active import bundled_model_dir
from travorder.predictor.dataset import data_hash, design_matrix, prepared_graphs
from travorder.predictor.model import MANIFEST, OrderPredictor
from travorder.predictor.structure import structure_features
from travorder.predictor.train import (
    evaluate_sources,
    fallback_order,
    read_sources,
    structure_columns,
    train_predictor,
)
from travorder.study.export import bundled_dataset


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory) -> str:
    """Four families of the bundled RL dataset's coarsened parts (one study setting: a
    model learns from one coarsening level), as an exported dataset file."""
    frame = bundled_dataset("rl")
    frame = frame[frame["coarsen_max_nodes"] == 200]
    families = sorted(frame["family"].unique())[:4]
    path = tmp_path_factory.mktemp("data") / "small.parquet"
    frame[frame["family"].isin(families)].to_parquet(path)
    return str(path)


def test_train_with_order_statistics_and_the_graph_network(small_dataset, tmp_path):
    pytest.importorskip("torch_geometric")
    from travorder.predictor.gnn import GNNParams

    out = tmp_path / "model"
    lines: list[str] = []
    res = train_predictor([small_dataset], out, kinds=("regressor",),
                          params={"n_estimators": 10, "min_child_samples": 2},
                          folds=None, gnn_params=GNNParams(epochs=1, hidden=8),
                          progress=lines.append)
    # The structure blocks come before any fold, and each network fit says so.
    k = pd.read_parquet(small_dataset)["family"].nunique()
    expected = ["note: the rows mix 2 placer configurations: ", "the orders of ",
                "order statistics of ", "order splits of ",
                *(f"graph network: fold {i}/{k} (training on " for i in range(1, k + 1)),
                "graph network: all "]
    assert all(line.startswith(e) for line, e in zip(lines, expected, strict=False))
    assert lines[len(expected)] == "features: graph"
    t = res.evaluation.table
    methods = ["regressor", "regressor(order_stats)", "regressor(order_split)",
               "regressor(gnn)", "regressor(order_stats+order_split+gnn)"]
    assert {*methods, "graph_net"} <= set(t.index)
    assert res.method == t.loc[methods, "mean_regret"].idxmin()
    assert "against the best fixed order" in res.comparison
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["method"] == res.method and manifest["comparison"] == res.comparison
    assert manifest["vs_best_fixed"]["best_fixed"] == res.evaluation.best_fixed
    assert set(manifest["feature_ranges"]) >= {"f_n_nodes", "c_n_devices"}
    assert ("graph_net" in manifest) == ("gnn" in manifest["structure"])
    rec = recommend_order("examples/resnet_small.onnx", predictor=str(out))
    assert rec.order in manifest["classes"] and rec.tied[0] == rec.order


def test_train_without_the_graphs_falls_back_to_graph_features(small_dataset, tmp_path):
    frame = pd.read_parquet(small_dataset)
    frame["graph_hash"] = "x" + frame["graph_hash"].str[1:]  # graphs the corpus does not hold
    path = tmp_path / "unknown.parquet"
    frame.to_parquet(path)
    res = train_predictor([path], tmp_path / "model", kinds=("regressor",),
                          params={"n_estimators": 5, "min_child_samples": 2}, folds=2)
    manifest = json.loads((tmp_path / "model" / MANIFEST).read_text())
    assert res.method == "regressor" and manifest["structure"] == []
    assert "not in the corpus" in manifest["chosen_because"]
    res = train_predictor([path], tmp_path / "model", kinds=("regressor",),
                          params={"n_estimators": 5, "min_child_samples": 2}, folds=10)
    manifest = json.loads((tmp_path / "model" / MANIFEST).read_text())
    assert manifest["evaluation_folds"] == 4  # four families: four folds, not ten
    with pytest.raises(TravorderError, match=r"not in the corpus \(e\.g\. .*\), and the "
                                             r"order_stats, order_split and gnn blocks need "
                                             r"the graphs the study placed: leave those"):
        evaluate_sources([path], kinds=("regressor",), structure=["order_stats"], folds=2)


def test_train_without_the_clusters_skips_the_order_splits(small_dataset, tmp_path):
    # a study on a cluster file that is not here: its rows keep their c_ columns, but the
    # splits cannot be costed
    frame = pd.read_parquet(small_dataset).assign(cluster="lab-cluster.toml")
    path = tmp_path / "lab.parquet"
    frame.to_parquet(path)
    res = train_predictor([path], tmp_path / "model", kinds=("regressor",),
                          params={"n_estimators": 5, "min_child_samples": 2}, folds=2,
                          structure=("order_stats", "order_split"))
    manifest = json.loads((tmp_path / "model" / MANIFEST).read_text())
    assert "order_split" not in manifest["structure"]
    assert "regressor(order_stats)" in res.evaluation.table.index
    assert "no order splits: " in manifest["chosen_because"]
    with pytest.raises(TravorderError, match=r"no order splits: .*lab-cluster\.toml"):
        evaluate_sources([path], kinds=("regressor",), structure=["order_split"], folds=2)


def test_evaluate_reads_the_graphs_of_the_corpus_given(small_dataset, tmp_path, capsys):
    from travorder.cli import main
    from travorder.datasets.corpus import add_to_corpus, load_corpus, read_manifest

    hashes = set(pd.read_parquet(small_dataset)["graph_hash"])
    names = [e["name"] for e in read_manifest() if e["graph_hash"] in hashes]
    graphs = load_corpus(names=names)
    add_to_corpus(graphs, tmp_path / "all")
    add_to_corpus(graphs[:1], tmp_path / "one")
    argv = ["evaluate", "--data", small_dataset, "--kinds", "regressor", "--folds", "2",
            "--structure", "order_stats", "--corpus"]
    assert main([*argv, str(tmp_path / "all")]) == 0
    assert "order statistics of 20 prepared graphs" in capsys.readouterr().err  # 10 x 2
    assert main([*argv, str(tmp_path / "one")]) == 2
    assert "not in the corpus" in capsys.readouterr().err


def test_orders_left_out_of_a_mix_of_studies_are_said(small_dataset, tmp_path):
    frame = pd.read_parquet(small_dataset)
    families = sorted(frame["family"].unique())
    fewer = frame[frame["family"].isin(families[:2])].drop(
        columns=[f"{p}_alpha" for p in ("time", "se", "seeds", "feasible")])
    parts = [tmp_path / "all.parquet", tmp_path / "fewer.parquet"]
    frame[frame["family"].isin(families[2:])].to_parquet(parts[0])
    fewer.to_parquet(parts[1])
    lines: list[str] = []
    ev = evaluate_sources(parts, kinds=("regressor",), folds=2, progress=lines.append,
                          params={"n_estimators": 5, "min_child_samples": 2})
    assert "note: 1 order left out, which not every row has: alpha; learning the 5 every " \
        "row has" in lines
    assert "alpha" not in ev.table.columns.tolist() + ev.table.index.tolist()


def test_evaluation_notes_folds_and_configurations_and_checks_the_corpus(small_dataset,
                                                                         tmp_path):
    frame = pd.read_parquet(small_dataset)
    families = sorted(frame["family"].unique())
    mixed = frame.assign(placer_options=np.where(frame["family"] == families[0],
                                                 '{"episodes": 6}', '{"preset": "paper"}'))
    path = tmp_path / "mixed.parquet"
    mixed.to_parquet(path)
    lines: list[str] = []
    evaluate_sources([path], kinds=("regressor",), folds=10, progress=lines.append,
                     params={"n_estimators": 5, "min_child_samples": 2})
    n = int((frame["family"] == families[0]).sum())
    assert "note: 10 folds, but 4 families: one family per fold" in lines
    assert (f"note: the rows mix 2 placer configurations: {{\"preset\": \"paper\"}} "
            f"({len(frame) - n} rows); {{\"episodes\": 6}} ({n} rows)") in lines
    for run in (lambda: evaluate_sources([path], corpus_dir=str(tmp_path / "nodir")),
                lambda: train_predictor([path], tmp_path / "model",
                                        corpus_dir=str(tmp_path / "nodir"))):
        with pytest.raises(TravorderError, match=r"corpus '.*nodir': no such folder"):
            run()
    assert not (tmp_path / "model").exists()


def test_train_refuses_two_study_settings_before_evaluating(small_dataset, tmp_path,
                                                            monkeypatch):
    from travorder.predictor import train

    frame = pd.read_parquet(small_dataset)
    full = frame.assign(coarsen_max_nodes=0, graph_hash="f" + frame["graph_hash"].str[1:])
    path = tmp_path / "mixed.parquet"
    pd.concat([frame, full]).to_parquet(path)
    monkeypatch.setattr(train, "structure_columns", None)  # never reached
    with pytest.raises(TravorderError, match=r"mix several coarsen_max_nodes settings "
                                             r"\(200, 0\)"):
        train_predictor([str(path)], tmp_path / "model", kinds=("regressor",))
    assert not (tmp_path / "model").exists()


def test_shipped_model_records_its_evaluation_on_the_bundled_dataset():
    model, manifest = OrderPredictor.load(bundled_model_dir())
    frame = read_sources(["bundled:greedy"])  # the bundled study it learned from
    frame = frame[frame["placer"] == manifest["placer"]].reset_index(drop=True)
    assert data_hash(frame) == manifest["data_hash"]  # trained on exactly these rows
    data = design_matrix(frame)
    regret = data.times.to_numpy() / data.times.min(axis=1).to_numpy()[:, None] - 1
    fixed = dict(zip(data.orders, regret.mean(axis=0), strict=True))
    best_fixed = min(fixed, key=fixed.get)
    vs = manifest["vs_best_fixed"]
    assert vs["best_fixed"] == f"always-{best_fixed}"
    assert vs["best_fixed_mean_regret"] == pytest.approx(fixed[best_fixed])
    table = {r["method"]: r for r in manifest["evaluation"]["table"]}
    assert table[vs["method"]]["mean_regret"] == pytest.approx(vs["mean_regret"], abs=1e-4)
    assert vs["method"] == manifest["method"] and model.kind == vs["method"].split("(")[0]
    # The shipped method beats always using the best fixed order, held out by family: that
    # order chosen on the training folds, and the best over all rows.
    assert vs["mean_regret"] < vs["best_fixed_mean_regret"]
    assert table["best-fixed"]["mean_regret"] == pytest.approx(
        vs["best_fixed_training_folds_mean_regret"], abs=1e-4)
    # Where the orders are far apart (the pipelined scenarios) the learned pick alone
    # halves the best fixed order's regret, elsewhere it beats it (docs/predictor.md).
    breakdown = {(r["scenario"], r["method"]): r["mean_regret"]
                 for r in manifest["evaluation"]["breakdown"] if r["cluster"] == "all"}
    for s in manifest["scenarios"]:
        ratio = breakdown[s["name"], vs["method"]] / breakdown[s["name"], "best-fixed"]
        assert ratio <= (0.5 if s["micro_batches"] > 1 else 0.85), (s["name"], ratio)
    # ... and is worse than that order beyond noise (1 point) on no held-out family (the
    # seed ensemble: a single fit flagged one or two families, which ones depending on its
    # random seed; docs/predictor.md, "The default model: seed ensembles").
    assert vs["families_worse"] == 0
    assert table[vs["method"]]["worst_family_excess"] <= 0.01
    assert table[vs["method"]]["families_worse"] == vs["families_worse"]
    families = [r for r in manifest["evaluation"]["families"] if r["method"] == vs["method"]]
    assert len(families) == len(manifest["families"])
    assert sum(r["worse"] for r in families) == vs["families_worse"]
    scenarios = {r["scenario"] for r in manifest["evaluation"]["breakdown"]}
    assert scenarios == {s["name"] for s in manifest["scenarios"]}
    assert np.isfinite(model.mean_regret_).all()


def test_recommending_computes_the_columns_the_shipped_model_learned_from():
    model, manifest = OrderPredictor.load(bundled_model_dir())
    frame = read_sources(["bundled:greedy"])
    data = design_matrix(frame)
    assert fallback_order(data.times) == model.classes_[model.mean_regret_.argmin()]
    # the smallest graph's rows on two clusters, one pipelined
    small = frame.index[frame["graph_hash"] == frame.loc[frame["n_nodes"].idxmin(),
                                                         "graph_hash"]]
    rows = [i for i in small if frame.loc[i, "cluster"] in ("k80x3", "pcie4x4")][::3]
    part = design_matrix(frame.loc[rows].reset_index(drop=True), data.orders)
    learned = pd.concat(structure_columns(part, manifest["structure"], None,
                                          reference=fallback_order(data.times))
                        .columns.values(), axis=1)
    graphs, graph_of_row = prepared_graphs(part.frame)
    for r, gi in enumerate(graph_of_row):
        seen = structure_features(graphs[gi], load_cluster(part.frame["cluster"][r]),
                                  part.X.iloc[r].to_dict(), model, manifest)
        assert seen == pytest.approx(learned.iloc[r].to_dict(), rel=1e-12)
        assert set(model.feature_names_in_) <= set(part.X.columns) | set(seen)


def test_shipped_rl_model_learned_from_the_coarsened_rl_study():
    directory = bundled_model_dir("rl")
    assert directory.name == "default_rl"
    model, manifest = OrderPredictor.load(directory)
    assert manifest["placer"] == "rl" and manifest["coarsen_max_nodes"] == 200
    data = resources.files("travorder.study").joinpath("data")
    parts = ("rl.parquet", *(f"rl-pipelined-{i}.parquet" for i in range(1, 6)),
             *(f"rl-4gpu-{i}.parquet" for i in range(1, 4)))
    frame = read_sources([Path(str(data / p)) for p in parts])
    assert data_hash(frame) == manifest["data_hash"]  # the coarsened parts, exactly
    vs = manifest["vs_best_fixed"]
    # No order effect beyond noise in these rows: the model only has to be no worse than
    # the best fixed order on its held-out families, and on none beyond noise.
    assert vs["mean_regret"] <= vs["best_fixed_training_folds_mean_regret"]
    assert vs["families_worse"] == 0
    assert set(model.classes_) == set(manifest["orders"])


def test_shipped_models_are_seed_ensembles_of_the_current_defaults():
    for placer in ("greedy", "rl"):
        model = OrderPredictor.load(bundled_model_dir(placer))[0]
        assert model.get_params() == OrderPredictor(kind="regressor").get_params()
        assert len(model.models_) == model.n_seeds * model.classes_.size
        # saved compact: none of LightGBM's training diagnostics
        assert all("\nsplit_gain=" not in m.text for m in model.models_)


def test_a_model_with_the_graph_network_ships_its_weights(small_dataset, tmp_path,
                                                         monkeypatch):
    pytest.importorskip("torch_geometric")
    import travorder.predictor.train as train
    from travorder.predictor.gnn import GNNParams

    real = train.evaluate

    def network_wins(data, kinds, params, **kw):  # make a variant with the network win
        ev = real(data, kinds, params, **kw)
        if not any(c.startswith("g_") for c in data.X.columns):
            ev.table.loc[list(kinds), "mean_regret"] += 1.0
        return ev

    monkeypatch.setattr(train, "evaluate", network_wins)
    out = tmp_path / "model"
    res = train.train_predictor([small_dataset], out, kinds=("regressor",),
                                params={"n_estimators": 5, "min_child_samples": 2},
                                folds=2, gnn_params=GNNParams(epochs=1, hidden=8))
    manifest = json.loads((out / MANIFEST).read_text())
    assert "gnn" in manifest["structure"] and (out / manifest["graph_net"]["file"]).exists()
    model, _ = OrderPredictor.load(out)
    assert model.graph_net_.orders == manifest["classes"]
    rec = recommend_order("examples/resnet_small.onnx", predictor=str(out))
    assert rec.order in manifest["classes"] and res.method.startswith("regressor(")
    (out / manifest["graph_net"]["file"]).write_bytes(b"not an npz")
    with pytest.raises(FormatError, match="broken graph network"):
        OrderPredictor.load(out)
