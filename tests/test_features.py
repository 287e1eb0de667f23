"""Graph features: hand-checked values, op categories, invariance, schema."""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from travorder.errors import GraphError
from travorder.featurize import (
    FEATURE_NAMES,
    FEATURE_SCHEMA_VERSION,
    OP_CATEGORIES,
    feature_vector,
    graph_features,
    op_categories,
)
from travorder.graph import OpGraph, training_graph

from .strategies import random_dags


def graph(nodes: list[tuple[str, str]], edges: list[tuple], **attrs: list) -> OpGraph:
    records = [{"name": n, "op_type": t} for n, t in nodes]
    for key, values in attrs.items():
        for rec, v in zip(records, values, strict=True):
            rec[key] = v
    return OpGraph.from_records(records, edges)


def five() -> OpGraph:
    """a -> {b, c} -> d -> e, plus the skip a -> d."""
    return graph(
        [("a", "Conv"), ("b", "Relu"), ("c", "MatMul"), ("d", "Add"), ("e", "Softmax")],
        [("a", "b", 4), ("a", "c", 4), ("a", "d", 4), ("b", "d", 2), ("c", "d", 2),
         ("d", "e", 4)],
        flops=[40, 10, 30, 10, 10], param_bytes=[100, 0, 0, 0, 0],
    )


def test_schema_constants():
    assert FEATURE_SCHEMA_VERSION == 1
    assert isinstance(FEATURE_NAMES, tuple) and all(isinstance(x, str) for x in FEATURE_NAMES)
    assert len(set(FEATURE_NAMES)) == len(FEATURE_NAMES)
    f = graph_features(five())
    assert tuple(f) == FEATURE_NAMES
    v = feature_vector(five())
    assert v.dtype == np.float64 and v.shape == (len(FEATURE_NAMES),)
    assert v.tolist() == list(f.values())


def test_docs_table_lists_every_feature_in_order():
    doc = (Path(__file__).parents[1] / "docs" / "features.md").read_text()
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \|", doc, re.MULTILINE)
    assert [name for _, name in rows] == list(FEATURE_NAMES)
    assert [int(i) for i, _ in rows] == list(range(1, len(FEATURE_NAMES) + 1))
    assert f"`FEATURE_SCHEMA_VERSION` is **{FEATURE_SCHEMA_VERSION}**" in doc


def test_hand_checked_values():
    f = graph_features(five())
    expected = {
        "n_nodes": 5, "n_edges": 6, "log_n_nodes": math.log(6), "log_n_edges": math.log(7),
        "edges_per_node": 1.2,
        # levels a:0, b:1, c:1, d:2, e:3 -> sizes [1, 2, 1, 1]
        "depth": 4, "depth_share": 0.8, "width": 2, "width_share": 0.4,
        "level_size_mean": 1.25, "level_size_std": math.sqrt(0.1875),
        "level_size_cv": math.sqrt(0.1875) / 1.25,
        # in-degrees of b, c, d, e: 1, 1, 3, 1; out-degrees of a, b, c, d: 3, 1, 1, 1
        "fan_in_mean": 1.5, "fan_in_std": math.sqrt(0.75), "fan_in_max": 3,
        "fan_out_mean": 1.5, "fan_out_std": math.sqrt(0.75), "fan_out_max": 3,
        "n_branch": 1, "branch_share": 0.2, "n_merge": 1, "merge_share": 0.2,
        # only a -> d spans two levels
        "n_skip": 1, "skip_share": 1 / 6, "skip_span_mean": 2, "skip_span_max": 2,
        "skip_span_mean_norm": 2 / 3, "skip_span_max_norm": 2 / 3,
        "n_sources": 1, "source_share": 0.2, "n_sinks": 1, "sink_share": 0.2,
        # critical path a -> c -> d -> e = 40 + 30 + 10 + 10
        "cost_is_time": 0, "cost_total": 100, "critical_path_cost": 90,
        "parallelism": 100 / 90, "comm_bytes_total": 20, "bytes_per_cost": 0.2,
        "param_bytes_total": 100,
        # sorted costs 10, 10, 10, 30, 40: 2 * 380 / (5 * 100) - 6 / 5
        "cost_gini": 0.32, "cost_top10_share": 0.4,
        "op_attention_share": 0, "op_recurrent_share": 0, "op_conv_share": 0.2,
        "op_matmul_share": 0.2, "op_normalization_share": 0, "op_pooling_share": 0,
        "op_elementwise_share": 0.6,  # the final Softmax has no product after it
        "op_data_movement_share": 0, "op_other_share": 0,
        "backward_share": 0,
    }
    assert set(expected) == set(FEATURE_NAMES)
    assert f == pytest.approx(expected, rel=1e-12)


def test_single_op_and_measured_times():
    f = graph_features(graph([("x", "Gemm")], [], time_us=[7.5], flops=[100]))
    assert (f["depth"], f["width"], f["n_skip"], f["skip_span_max_norm"]) == (1, 1, 0, 0)
    assert (f["cost_is_time"], f["cost_total"], f["parallelism"]) == (1, 7.5, 1)
    assert (f["cost_gini"], f["cost_top10_share"], f["fan_in_mean"]) == (0, 1, 0)
    with pytest.raises(GraphError, match="without nodes"):
        graph_features(OpGraph([], [], []))


def test_cost_shares_of_costs_near_the_float_limit():
    # each cost and their total fit a float; rank times cost once overflowed (gini NaN)
    ops = [("a", "Gemm"), ("b", "Gemm"), ("c", "Gemm")]
    huge = graph_features(graph(ops, [("a", "b"), ("b", "c")], time_us=[5e307, 5e307, 0]))
    small = graph_features(graph(ops, [("a", "b"), ("b", "c")], time_us=[5.0, 5.0, 0]))
    assert huge["cost_gini"] == pytest.approx(small["cost_gini"]) == pytest.approx(1 / 3)


def test_training_graph_features():
    f = graph_features(training_graph(five()))
    assert f["backward_share"] == 0.5
    assert f["cost_total"] == 300 and f["n_nodes"] == 10


def categories(g: OpGraph) -> list[str]:
    return [OP_CATEGORIES[i] for i in op_categories(g)]


def test_attention_needs_products_before_and_after_the_softmax():
    attention = graph(
        [("q", "MatMul"), ("scale", "Div"), ("mask", "Add"), ("sm", "Softmax"),
         ("drop", "Dropout"), ("v", "MatMul")],
        [("q", "scale"), ("scale", "mask"), ("mask", "sm"), ("sm", "drop"), ("drop", "v")],
    )
    assert categories(attention) == ["matmul", "elementwise", "elementwise", "attention",
                                     "elementwise", "matmul"]
    classifier = graph([("fc", "Gemm"), ("sm", "Softmax")], [("fc", "sm")])
    assert categories(classifier) == ["matmul", "elementwise"]
    fused = graph([("mha", "MultiHeadAttention"), ("y", "attention")], [("mha", "y")])
    assert categories(fused) == ["attention", "attention"]


def test_recurrent_ops_and_gate_products():
    cell = graph(
        [("x", "MatMul"), ("s", "Sigmoid"), ("t", "Tanh"), ("gate", "Mul"), ("lstm", "LSTM"),
         ("silu", "Mul")],
        [("x", "s"), ("x", "t"), ("s", "gate"), ("t", "gate"), ("gate", "lstm"),
         ("x", "silu"), ("s", "silu")],
    )
    assert categories(cell) == ["matmul", "elementwise", "elementwise", "recurrent",
                                "recurrent", "elementwise"]


def test_op_types_match_case_insensitively_and_unknown_is_other():
    g = graph([("a", "conv2d"), ("b", "MAXPOOL"), ("c", "LayerNormalization"),
               ("d", "Reshape"), ("e", "ReduceMean"), ("f", "")], [])
    assert categories(g) == ["conv", "pooling", "normalization", "data_movement", "other",
                             "other"]


def shuffled(g: OpGraph, seed: int) -> OpGraph:
    rng = np.random.default_rng(seed)
    h = g.permute(rng.permutation(g.n_nodes))
    return h.replace(names=[f"renamed{k}" for k in rng.permutation(g.n_nodes)])


@settings(max_examples=80, deadline=None)
@given(random_dags(max_nodes=40, with_time=True), st.integers(0, 2**32 - 1), st.booleans())
def test_features_ignore_names_and_node_order(g, seed, training):
    g = training_graph(g) if training else g
    h = shuffled(g, seed)
    assert not np.array_equal(h.names, g.names)
    assert np.array_equal(feature_vector(h), feature_vector(g))


@settings(max_examples=30, deadline=None)
@given(random_dags(max_nodes=30))
def test_feature_ranges(g):
    f = graph_features(g)
    shares = [x for x in FEATURE_NAMES if x.endswith("_share")]
    assert all(0 <= f[x] <= 1 for x in shares)
    assert sum(f[f"op_{c}_share"] for c in OP_CATEGORIES) == pytest.approx(1)
    assert 0 <= f["cost_gini"] < 1 and f["parallelism"] >= 1
    assert f["critical_path_cost"] <= f["cost_total"]


def test_two_thousand_ops_featurize_well_under_a_second():
    rng = np.random.default_rng(0)
    n = 2000
    i = np.arange(n - 1)
    far = np.minimum(i + rng.integers(2, 30, n - 1), n - 1)
    keep = far > i + 1
    g = OpGraph([f"op{k}" for k in range(n)],
                np.concatenate([i, i[keep]]), np.concatenate([i + 1, far[keep]]),
                op_types=np.array(["MatMul", "Softmax", "Add", "Conv"])[rng.integers(0, 4, n)],
                flops=rng.integers(1, 1000, n).astype(float))
    start = time.process_time()
    feature_vector(g)
    assert time.process_time() - start < 1.0


def test_cluster_features_take_a_cluster_not_its_name():
    from travorder.errors import TravorderError
    from travorder.featurize.cluster import CLUSTER_FEATURE_NAMES, cluster_features
    from travorder.placement.clusters import load_cluster

    assert tuple(cluster_features(load_cluster("k80x3"))) == CLUSTER_FEATURE_NAMES
    with pytest.raises(TravorderError, match=r"takes a Cluster \(travorder.placement."
                                             r"load_cluster\('k80x3'\)\), not 'k80x3'"):
        cluster_features("k80x3")
