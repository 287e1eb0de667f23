"""Synthetic graph families: determinism, metadata, sizes, shapes and costs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from travorder.datasets.onnx_examples import residual_cnn
from travorder.datasets.synthetic import (
    SYNTHETIC_FAMILIES,
    SYNTHETIC_SET,
    densenet,
    enas_cnn,
    inception,
    random_dag,
    resnet,
    rnn,
    seq2seq,
    transformer,
    unet,
)
from travorder.errors import TravorderError
from travorder.graph.native import graph_from_dict, graph_to_dict
from travorder.graph.onnx_flops import RULES
from travorder.graph.onnx_import import read_onnx
from travorder.graph.opgraph import OpGraph

FAMILIES = sorted(SYNTHETIC_FAMILIES)

# A small and a larger parameter set per family.
SIZES = {
    "chain": ({"n_layers": 4}, {"n_layers": 12}),
    "inception": ({"n_modules": 2}, {"n_modules": 6}),
    "resnet": ({"blocks": (1, 1)}, {"blocks": (2, 3, 3)}),
    "densenet": ({"blocks": (2, 2)}, {"blocks": (3, 6)}),
    "unet": ({"depth": 2}, {"depth": 4, "convs_per_level": 3}),
    "transformer": ({"n_layers": 1}, {"n_layers": 4}),
    "seq2seq": ({"src_len": 3, "tgt_len": 2, "n_layers": 1},
                {"src_len": 6, "tgt_len": 5, "n_layers": 2}),
    "rnn": ({"timesteps": 2, "cell_nodes": 3}, {"timesteps": 6, "cell_nodes": 5}),
    "enas_cnn": ({"n_cells": 2, "cell_nodes": 2}, {"n_cells": 6, "cell_nodes": 4}),
    "random_dag": ({"n_nodes": 20}, {"n_nodes": 80}),
}


def small(family: str, seed: int = 0, **kw: object) -> OpGraph:
    return SYNTHETIC_FAMILIES[family](seed, **{**SIZES[family][0], **kw})


def test_every_family_has_sizes_and_a_bundled_set() -> None:
    assert set(SIZES) == set(SYNTHETIC_FAMILIES) == set(SYNTHETIC_SET)
    assert len(SYNTHETIC_FAMILIES) == 10


@pytest.mark.parametrize("family", FAMILIES)
def test_deterministic_per_seed_and_seeds_differ(family: str) -> None:
    g = small(family, seed=3)
    again = small(family, seed=3)
    assert g.graph_hash == again.graph_hash and g == again
    assert small(family, seed=4).graph_hash != g.graph_hash


@pytest.mark.parametrize("family", FAMILIES)
def test_metadata(family: str) -> None:
    g = small(family, seed=5, batch_size=4)
    meta = dict(g.meta)
    assert meta["family"] == family
    assert meta["source"] == f"synthetic:{family}"
    assert meta["name"] == f"syn_{family}_n{g.n_nodes}_s5"
    assert meta["batch_size"] == 4 and meta["dtype"] == "float32"
    assert meta["builder"] == "travorder.datasets.synthetic" and meta["builder_version"] >= 1
    assert small(family, name="mine").name == "mine"


@pytest.mark.parametrize("family", FAMILIES)
def test_graphs_are_valid_and_costed(family: str) -> None:
    g = small(family, seed=1)
    # the constructor validated it; it survives travorder's own format unchanged
    assert graph_from_dict(json.loads(json.dumps(graph_to_dict(g)))) == g
    assert set(g.op_types.tolist()) <= set(RULES), "op types the importer knows"
    assert np.all(g.output_bytes > 0) and np.all(g.edge_bytes > 0)
    compute = np.isin(g.op_types, ["Conv", "MatMul", "Gemm"])
    assert compute.any() and np.all(g.flops[compute] > 0)
    assert g.param_bytes.sum() > 0
    # one weakly connected piece: every node touches an edge
    assert g.n_nodes == 1 or np.all(g.in_degree + g.out_degree > 0)


@settings(max_examples=60, deadline=None)
@given(family=st.sampled_from(FAMILIES), seed=st.integers(0, 2**32 - 1))
def test_any_seed_gives_a_valid_deterministic_graph(family: str, seed: int) -> None:
    g = small(family, seed=seed)  # the OpGraph constructor validates it
    assert small(family, seed=seed).graph_hash == g.graph_hash
    assert set(g.op_types.tolist()) <= set(RULES)
    assert np.all(g.output_bytes > 0) and g.flops.sum() > 0


@settings(max_examples=60, deadline=None)
@given(n_nodes=st.integers(1, 120), n_layers=st.integers(1, 30),
       max_in_degree=st.integers(1, 4), seed=st.integers(0, 1000))
def test_random_dag_shape(n_nodes: int, n_layers: int, max_in_degree: int, seed: int) -> None:
    g = random_dag(seed, n_nodes=n_nodes, n_layers=n_layers, max_in_degree=max_in_degree)
    assert g.n_nodes == n_nodes
    assert np.flatnonzero(g.in_degree == 0).tolist() == [0]  # one source: the first conv
    assert g.levels.max() + 1 <= max(n_layers, min(n_nodes, 2))


@pytest.mark.parametrize("family", FAMILIES)
def test_sizes_follow_parameters(family: str) -> None:
    lo, hi = (SYNTHETIC_FAMILIES[family](0, **kw) for kw in SIZES[family])
    assert hi.n_nodes > lo.n_nodes
    assert hi.n_edges > lo.n_edges


def test_batch_size_scales_activations_not_weights() -> None:
    g1 = resnet(0, blocks=(1,), batch_size=1)
    g8 = resnet(0, blocks=(1,), batch_size=8)
    assert np.array_equal(g8.output_bytes, 8 * g1.output_bytes)
    assert np.array_equal(g8.param_bytes, g1.param_bytes)


def test_costs_follow_the_onnx_importer() -> None:
    """A synthetic ResNet and the same network built as ONNX and imported agree op by op;
    the only difference is the ONNX model's conv bias (one FLOP per output element)."""
    g = resnet(0, blocks=(2,), width=16, image_size=32, batch_size=1, bottleneck=False)
    ref = read_onnx(residual_cnn(batch=1, image=32, width=16, blocks=2, classes=1000))
    assert g.op_types.tolist() == ref.op_types.tolist()
    assert (g.src.tolist(), g.dst.tolist()) == (ref.src.tolist(), ref.dst.tolist())
    assert np.array_equal(g.output_bytes, ref.output_bytes)
    assert np.array_equal(g.edge_bytes, ref.edge_bytes)
    conv = g.op_types == "Conv"
    assert np.array_equal(ref.flops - g.flops, np.where(conv, 16 * 32 * 32, 0))
    assert np.array_equal(ref.param_bytes - g.param_bytes, np.where(conv, 16 * 4, 0))
    # hand-checked: the stem conv, 3 -> 16 channels, 3x3, 32x32 output
    assert g.flops[0] == 2 * 16 * 32 * 32 * 3 * 9
    assert g.param_bytes[0] == 16 * 3 * 9 * 4


def test_chain_is_a_path() -> None:
    for kind in ("conv", "mlp"):
        g = SYNTHETIC_FAMILIES["chain"](0, n_layers=6, kind=kind)
        assert g.n_edges == g.n_nodes - 1
        assert g.in_degree.max() == 1 and g.out_degree.max() == 1


def test_resnet_has_skip_edges() -> None:
    g = resnet(0, blocks=(2, 2), bottleneck=False, image_size=32)
    adds = np.flatnonzero(g.op_types == "Add")
    assert adds.size == 4
    lev = g.levels
    for a in adds:
        spans = sorted(lev[a] - lev[g.predecessors(a)])
        assert spans in ([1, 4], [1, 6])  # block output; projection or identity skip
    # the stride-2 stage entry has a projection (1x1 Conv, BatchNormalization) on its skip
    assert [n for n in g.names.tolist() if "downsample" in n] == [
        "layer2/0/downsample/Conv", "layer2/0/downsample/BatchNormalization"]


def test_unet_has_long_skips() -> None:
    g = unet(0, depth=4)
    lev = g.levels
    span = lev[g.dst] - lev[g.src]
    concats = np.flatnonzero(g.op_types == "Concat")
    assert concats.size == 4
    assert span.max() >= 0.75 * lev.max()  # the first level's skip spans the network
    assert np.sum(span > 1) == 4  # one skip per level; every other edge spans 1


def test_inception_has_branches() -> None:
    g = inception(0, n_modules=4, image_size=128)
    concats = np.flatnonzero(g.op_types == "Concat")
    assert concats.size == 4
    assert all(g.in_degree[c] >= 3 for c in concats)
    assert np.sum(g.out_degree >= 3) >= 4  # each module's input fans out to its branches
    assert np.bincount(g.levels).max() >= 3


def test_densenet_layers_read_everything_before_them() -> None:
    g = densenet(0, blocks=(3, 5))
    concat_in = sorted(g.in_degree[g.op_types == "Concat"].tolist())
    # per block: one Concat per layer after the first (2..n inputs) and the block output;
    # block 1 (3 layers): 2, 3, 4 inputs; block 2 (5 layers): 2 to 6
    assert concat_in == [2, 2, 3, 3, 4, 4, 5, 6]


def test_rnn_is_deep_and_narrow() -> None:
    g = rnn(0, timesteps=12, cell_nodes=4)
    widths = np.bincount(g.levels)
    assert g.levels.max() + 1 >= g.n_nodes / 4
    assert np.median(widths) <= 3
    assert np.sum(g.op_types == "ReduceMean") == 12  # one cell output per step
    d = random_dag(0, n_nodes=g.n_nodes)
    assert d.levels.max() < g.levels.max() / 4


def test_rnn_cell_is_shared_across_steps() -> None:
    g = rnn(2, timesteps=5, cell_nodes=6)
    per_step = [sorted(op for name, op in zip(g.names.tolist(), g.op_types.tolist(),
                                               strict=True) if name.startswith(f"t{s}/"))
                for s in range(5)]
    assert all(p == per_step[1] for p in per_step[1:])
    shared = g.param_bytes[np.char.startswith(g.names, "t3/")]
    assert shared.sum() == 0  # weights counted at their first use only


def test_seq2seq_decoder_attends_to_all_encoder_outputs() -> None:
    g = seq2seq(0, src_len=4, tgt_len=3, n_layers=2)
    memory = g.index["attention/Reshape"]
    assert g.in_degree[g.index["attention/Concat"]] == 4  # top encoder state per step
    # each decoder step reads the memory (context) and its keys (scores)
    assert g.out_degree[memory] == 1 + 3
    assert np.sum(g.op_types == "Softmax") == 3


def test_transformer_layers_share_the_mask() -> None:
    for kind in ("encoder", "decoder"):
        g = transformer(0, n_layers=3, kind=kind)
        assert np.sum(g.op_types == "Softmax") == 3
        assert np.sum(g.op_types == "Dropout") == 1 + 3 * 3  # as HuggingFace models have
        mask = g.index["mask/Mul"]
        assert g.out_degree[mask] == 3
    assert np.sum(g.op_types == "LayerNormalization") == 1 + 2 * 3


def test_enas_cells_have_random_structure() -> None:
    g = enas_cnn(0, n_cells=6, cell_nodes=4)
    assert np.sum(g.op_types == "Add") == 6 * 4
    assert sum("calibrate" in n and op == "Conv" for n, op in
               zip(g.names.tolist(), g.op_types.tolist(), strict=True)) == 12
    cells = [enas_cnn(s, n_cells=6, cell_nodes=4) for s in range(4)]
    assert len({c.n_edges for c in cells} | {c.n_nodes for c in cells}) > 1


def test_random_dag_has_the_requested_size_and_one_source() -> None:
    for seed in range(5):
        g = random_dag(seed, n_nodes=57, n_layers=6)
        assert g.n_nodes == 57
        assert np.sum(g.in_degree == 0) == 1
        assert g.levels.max() + 1 >= 6
    assert random_dag(0, n_nodes=1).n_nodes == 1


@pytest.mark.parametrize(("family", "kwargs", "message"), [
    ("chain", {"n_layers": 0}, "n_layers must be an integer from 1 to 100,000, got 0"),
    ("chain", {"n_layers": 10**8}, "n_layers must be an integer from 1 to 100,000"),
    ("chain", {"n_layers": True}, "n_layers must be an integer"),
    ("chain", {"width": "64"}, "width must be an integer from 1 to 100,000, got '64'"),
    ("chain", {"kind": "cnn"}, "kind must be one of conv, mlp"),
    ("inception", {"width": 0}, "width must be"),
    ("resnet", {"blocks": ()}, "blocks must be a non-empty list of integers from 1"),
    ("resnet", {"bottleneck": 1}, "bottleneck must be true or false, got 1"),
    ("densenet", {"blocks": (2, -1)}, "blocks must be"),
    ("densenet", {"growth_rate": 2.5}, "growth_rate must be"),
    ("unet", {"depth": 4, "image_size": 200}, r"multiple of 2\*\*depth \(image_size 200, "
                                             r"depth 4\)"),
    ("unet", {"depth": 100_000}, "multiple of 2"),
    ("transformer", {"kind": "vit"}, "kind must be one of encoder, decoder"),
    ("rnn", {"batch_size": 0}, "batch_size must be"),
    ("seq2seq", {"hidden": 0}, "hidden must be"),
    ("enas_cnn", {"channels": 0}, "channels must be"),
    ("random_dag", {"n_nodes": 2.5}, "n_nodes must be"),
    ("random_dag", {"max_in_degree": 65}, "max_in_degree must be at most 64, got 65"),
    ("random_dag", {"name": 7}, "name must be a string, got 7"),
])
def test_bad_parameters(family: str, kwargs: dict, message: str) -> None:
    with pytest.raises(TravorderError, match=message):
        SYNTHETIC_FAMILIES[family](0, **kwargs)


def test_a_negative_seed_is_an_error() -> None:
    with pytest.raises(TravorderError, match="seed must be a non-negative integer, got -1"):
        SYNTHETIC_FAMILIES["chain"](-1)


@pytest.mark.parametrize(("family", "kwargs"), [
    ("chain", {"n_layers": 100_000}), ("transformer", {"n_layers": 100_000}),
    ("rnn", {"cell_nodes": 100_000}), ("seq2seq", {"src_len": 100_000}),
])
def test_a_graph_past_max_ops_is_an_error_as_it_grows(family: str, kwargs: dict) -> None:
    with pytest.raises(TravorderError, match=f"^this {family} graph grows past 100,000 ops"):
        SYNTHETIC_FAMILIES[family](0, **kwargs)
