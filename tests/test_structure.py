"""What the predictor sees of a graph's structure: node features, order statistics, order
splits and the graph network, whose numpy forward pass must match the torch one it was
trained as."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from travorder.datasets.synthetic import SYNTHETIC_FAMILIES
from travorder.errors import FormatError, TravorderError
from travorder.featurize.cluster import CLUSTER_FEATURE_NAMES
from travorder.graph import OpGraph, training_graph
from travorder.placement.clusters import Cluster, load_cluster
from travorder.placement.orders import traversal_order
from travorder.predictor.dataset import cluster_columns
from travorder.predictor.structure import (
    NODE_FEATURES,
    ORDER_STATS,
    SPLIT_STATS,
    GraphNet,
    extra_features,
    group_walk,
    node_features,
    order_splits,
    order_statistics,
    split_pieces,
)

from .strategies import random_dags

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


K80 = load_cluster("k80x3")
CHAIN = OpGraph(list("abcd"), [0, 1, 2], [1, 2, 3], time_us=[100.0] * 4,
                edge_bytes=[7600.0] * 3)


def test_order_splits_of_a_chain_by_hand():
    # k80x3: 100 + 5.7 us per op, T1 = 422.8, an even share 140.93 us. Along a-b-c-d the
    # midpoints 52.85, 158.55, 264.25, 369.95 fall in pieces 0, 1, 1, 2: the middle piece
    # holds two ops, and two edges are cut, each 1 us of bytes + 25 us busy.
    s = order_splits(CHAIN, K80, {"forward": np.arange(4), "inside_out": np.array([1, 2, 0, 3])},
                     "forward")
    assert set(s) == {f"p_{o}_{k}{r}" for o in ("forward", "inside_out")
                      for k in SPLIT_STATS for r in ("", "_rel")}
    share = 4 * 105.7 / 3
    assert s["p_forward_load"] == pytest.approx(np.log(2 * 105.7 / share))
    assert s["p_forward_cut"] == pytest.approx(np.log1p(2 * 26.0 / share))
    assert s["p_forward_est"] == pytest.approx(np.log((2 * 105.7 + 2 * 26.0 / 3) / 422.8))
    # The walk b, c, a, d puts b in piece 0, c and a in 1, d in 2: the same largest piece,
    # but all three edges cut (a-b 1->0, b-c 0->1, c-d 1->2).
    assert s["p_inside_out_load"] == s["p_forward_load"]
    assert s["p_inside_out_cut"] == pytest.approx(np.log1p(3 * 26.0 / share))
    assert s["p_inside_out_cut_rel"] == pytest.approx(
        s["p_inside_out_cut"] - s["p_forward_cut"])
    assert s["p_forward_load_rel"] == s["p_forward_cut_rel"] == 0.0


def test_order_splits_keep_colocation_groups_whole():
    # One group: the placers keep it on one device, so one piece holds everything.
    s = order_splits(CHAIN.replace(colocation=[3] * 4), K80, {"topo": np.arange(4)}, "topo")
    assert s["p_topo_cut"] == 0.0 and s["p_topo_load"] == pytest.approx(np.log(3))


def test_a_colocation_group_comes_at_its_first_visited_member():
    # a and d colocated (a forward op and its gradient op), c and d slow: 105.7, 105.7,
    # 305.7, 305.7 us on k80x3, an even share 274.27. The group {a, d} comes first
    # (midpoint 205.7: piece 0), b at 464.25 (piece 1), c at 669.95 (piece 2): a-b, b-c
    # and c-d are cut. Counted at d, its last member, it would come after b and c
    # (pieces 0, 0, 2) and cut two edges.
    g = CHAIN.replace(time_us=[100.0, 100.0, 300.0, 300.0], colocation=[1, -1, -1, 1])
    s = order_splits(g, K80, {"topo": np.arange(4)}, "topo")
    share = (2 * 105.7 + 2 * 305.7) / 3
    assert s["p_topo_cut"] == pytest.approx(np.log1p(3 * 26.0 / share))
    assert s["p_topo_load"] == pytest.approx(np.log((105.7 + 305.7) / share))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=30), st.randoms(),
       st.integers(1, 4), st.floats(0.1, 50.0))
def test_split_pieces_cut_the_walk_into_consecutive_pieces(labels, rnd, n_pieces, share):
    # Any grouping of the nodes and any visit order: the groups are walked in the order
    # of their first visited member, and the pieces only grow along that walk, each in
    # range, and each group's midpoint along the walk lies in its piece's share of the
    # work (the last piece takes whatever is left).
    group = np.unique(labels, return_inverse=True)[1]
    perm = np.arange(group.size)
    rnd.shuffle(perm)
    work = np.array([rnd.uniform(0.5, 10.0) for _ in range(int(group.max()) + 1)])
    walk = group_walk(group, perm, work.size)
    firsts = [next(i for i, v in enumerate(perm) if group[v] == k) for k in walk]
    assert sorted(walk.tolist()) == list(range(work.size)) and firsts == sorted(firsts)
    piece = split_pieces(group, work, perm, share, n_pieces)[walk]
    assert np.all(np.diff(piece) >= 0) and piece.min() >= 0 and piece.max() < n_pieces
    mid = np.cumsum(work[walk]) - work[walk] / 2
    for m, p in zip(mid.tolist(), piece.tolist(), strict=True):
        assert p * share <= m and (m < (p + 1) * share or p == n_pieces - 1)


def test_order_splits_refuse_a_reference_that_is_not_an_order():
    with pytest.raises(TravorderError, match="relative to 'critical_path', which is not"):
        order_splits(CHAIN, K80, {"topo": np.arange(4)}, "critical_path")


def test_order_splits_on_one_device_and_on_mixed_links():
    one = Cluster.from_dict({**K80.to_dict(), "devices": K80.to_dict()["devices"][:1]})
    s = order_splits(CHAIN, one, {"topo": np.arange(4)}, "topo")
    assert s == {f"p_topo_{k}{r}": 0.0 for k in SPLIT_STATS for r in ("", "_rel")}
    # a transfer costs the mean time per byte over the pairs: one very fast link does not
    # make every cut free
    links = {"bandwidth": [[0, 1e18, 7600], [1e18, 0, 7600], [7600, 7600, 0]], "latency": 0}
    mixed = order_splits(CHAIN, Cluster.from_dict({**K80.to_dict(), "links": links}),
                         {"topo": np.arange(4)}, "topo")
    plain = order_splits(CHAIN, K80, {"topo": np.arange(4)}, "topo")
    share = 4 * 105.7 / 3
    assert mixed["p_topo_cut"] == pytest.approx(np.log1p(2 * (25 + 4 / 6) / share))
    assert plain["p_topo_cut"] == pytest.approx(np.log1p(2 * 26.0 / share))


@settings(max_examples=60, deadline=None)
@given(random_dags(max_nodes=30, with_time=True), st.integers(0, 2**32 - 1),
       st.sampled_from(["k80x3", "v100x4-nvlink", "a100x8-nvlink", "hetero-a100x2-v100x2"]))
def test_order_splits_ignore_node_numbering(g, seed, cluster):
    g = training_graph(g)
    c = load_cluster(cluster)
    perm = np.random.default_rng(seed).permutation(g.n_nodes)
    h = g.permute(perm)
    inv = np.empty_like(perm)
    inv[perm] = np.arange(perm.size)
    orders = {o: traversal_order(g, o) for o in ("topo", "bfs", "critical_path")}
    a = order_splits(g, c, orders, "critical_path")
    b = order_splits(h, c, {o: inv[p] for o, p in orders.items()}, "critical_path")
    assert a.keys() == b.keys()
    np.testing.assert_allclose([a[k] for k in a], [b[k] for k in a], rtol=1e-9, atol=1e-12)
    assert all(a[f"p_{o}_cut"] >= 0 for o in orders)
    if cluster != "hetero-a100x2-v100x2":  # equal devices: the largest piece holds at
        assert all(a[f"p_{o}_load"] >= -1e-12 for o in orders)  # least an even share


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
    assert extra_features(graphs[0], K80, row, ["gnn"], loaded) == want[0]
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(FormatError, match="checksum"):
        GraphNet.load(path, "0" * 64)
    with pytest.raises(FormatError, match="broken graph network"):
        GraphNet.load(path)


def test_extra_features_refuse_unknown_blocks():
    with pytest.raises(FormatError, match="unknown feature block 'magic'"):
        extra_features(DIAMOND, K80, {}, ["magic"])
    orders = {o: traversal_order(DIAMOND, o) for o in ("topo", "bfs")}
    assert extra_features(DIAMOND, K80, {}, ["order_stats"], orders=list(orders)) == \
        order_statistics(DIAMOND, orders)
    assert extra_features(DIAMOND, K80, {}, ["order_split"], orders=["topo", "bfs"],
                          reference="bfs") == order_splits(DIAMOND, K80, orders, "bfs")
