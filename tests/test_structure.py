"""What the predictor sees of a graph's structure: node features, order statistics and the
graph network, whose numpy forward pass must match the torch one it was trained as."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from travorder.datasets.synthetic import SYNTHETIC_FAMILIES
from travorder.errors import FormatError
from travorder.featurize.cluster import CLUSTER_FEATURE_NAMES
from travorder.graph import OpGraph, training_graph
from travorder.placement.clusters import load_cluster
from travorder.placement.orders import traversal_order
from travorder.predictor.dataset import cluster_columns
from travorder.predictor.structure import (
    NODE_FEATURES,
    ORDER_STATS,
    GraphNet,
    extra_features,
    node_features,
    order_statistics,
)

DIAMOND = OpGraph(["a", "b", "c", "d"], [0, 0, 1, 2], [1, 2, 3, 3],
                  flops=[1.0, 5.0, 1.0, 1.0], edge_bytes=[10, 10, 10, 10])


def test_node_features_of_a_diamond():
    x = node_features(DIAMOND)
    assert x.shape == (4, len(NODE_FEATURES)) and np.isfinite(x).all()
    col = {name: x[:, i] for i, name in enumerate(NODE_FEATURES)}
    assert col["level"].tolist() == [0, 0.5, 0.5, 1]
    # bottom level over the longest cost path a-b-d = 7: a 7, b 6, c 2, d 1
    np.testing.assert_allclose(col["bottom_level"], [1, 6 / 7, 2 / 7, 1 / 7])
    np.testing.assert_allclose(col["top_level"], [0, 1 / 7, 1 / 7, 6 / 7])


def test_order_statistics_tell_orders_apart():
    orders = {"topo": np.array([0, 1, 2, 3]), "backwards": np.array([3, 2, 1, 0]),
              "critical_last": np.array([0, 2, 1, 3])}
    s = order_statistics(DIAMOND, orders)
    assert set(s) == {f"o_{o}_{k}" for o in orders for k in ORDER_STATS}
    assert s["o_topo_back_edges"] == 0 and s["o_backwards_back_edges"] == 1
    assert s["o_backwards_back_bytes"] == 1
    assert s["o_topo_bottom_level_corr"] < 0 < s["o_backwards_bottom_level_corr"]
    # the critical path a-b-d: visited at positions 0, 1, 3 by topo, 0, 2, 3 otherwise
    assert s["o_topo_critical_pos"] == pytest.approx(4 / 9)
    assert s["o_critical_last_critical_pos"] == pytest.approx(5 / 9)
    assert s["o_topo_adjacent"] == pytest.approx(2 / 3)  # a-b, c-d joined; b-c not


@pytest.fixture(scope="module")
def trained():
    pytest.importorskip("torch_geometric")
    from travorder.predictor.gnn import GNNParams, fit_gnn

    graphs = [training_graph(SYNTHETIC_FAMILIES[f](seed=s))
              for f in ("chain", "resnet", "inception") for s in range(2)]
    clusters = [cluster_columns(load_cluster(c)) for c in ("k80x3", "v100x4-nvlink")]
    cnames = [f"c_{n}" for n in CLUSTER_FEATURE_NAMES]
    rows = [(i, c) for i in range(len(graphs)) for c in range(2)]
    C = np.array([[clusters[c][n] for n in cnames] for _, c in rows])
    rng = np.random.default_rng(0)
    log_ratio = rng.uniform(0, 0.3, (len(rows), 3))
    net = fit_gnn(graphs, np.array([i for i, _ in rows]), C, log_ratio,
                  ["topo", "bfs", "dfs_preorder"], cnames, GNNParams(epochs=3, hidden=8))
    return net, graphs, clusters, C


def test_numpy_forward_matches_torch(trained):
    from travorder.predictor.gnn import predict_torch

    net, graphs, clusters, C = trained
    np_net = net.numpy()
    for g in graphs:
        emb, scores = predict_torch(net, g, C[:2])
        np.testing.assert_allclose(np_net.embed(g), emb, rtol=1e-4, atol=1e-5)
        for c, want in zip(clusters, scores, strict=True):
            np.testing.assert_allclose(np_net.head(np_net.embed(g), c), want, rtol=1e-4,
                                       atol=1e-5)


def test_weights_round_trip_through_npz_without_pickles(trained, tmp_path):
    from travorder.predictor.gnn import export_weights

    net, graphs, clusters, _ = trained
    path = tmp_path / "net.npz"
    export_weights(net, path)
    with np.load(path, allow_pickle=False) as z:  # plain arrays only
        assert "conv0.lin_self.weight" in z.files
    loaded = GraphNet.load(path, hashlib.sha256(path.read_bytes()).hexdigest())
    assert loaded.orders == ["topo", "bfs", "dfs_preorder"]
    want = net.numpy().features(graphs[0], clusters)
    assert loaded.features(graphs[0], clusters) == want
    assert set(want[0]) == {f"g_emb{i}" for i in range(loaded.embedding_size)} | {
        "g_topo", "g_bfs", "g_dfs_preorder"}
    row = clusters[0]
    assert extra_features(graphs[0], row, ["gnn"], loaded) == want[0]
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(FormatError, match="checksum"):
        GraphNet.load(path, "0" * 64)
    with pytest.raises(FormatError, match="broken graph network"):
        GraphNet.load(path)


def test_extra_features_refuse_unknown_blocks():
    with pytest.raises(FormatError, match="unknown feature block 'magic'"):
        extra_features(DIAMOND, {}, ["magic"])
    orders = {o: traversal_order(DIAMOND, o) for o in ("topo", "bfs")}
    assert extra_features(DIAMOND, {}, ["order_stats"], orders=list(orders)) == \
        order_statistics(DIAMOND, orders)
