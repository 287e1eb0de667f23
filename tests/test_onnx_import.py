"""ONNX import: FLOPs, bytes and parameters of the example models checked by hand,
per-op FLOPs rules, unknown shapes, external data, control flow and bad files."""

from __future__ import annotations

import re
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from travorder.datasets.onnx_examples import (
    inception_block,
    residual_cnn,
    rnn_unrolled,
    transformer_block,
    transformer_stack,
)
from travorder.errors import FormatError, GraphError, TravorderError
from travorder.graph import OpGraph, load_graph
from travorder.graph.native import load_native, save_graph
from travorder.graph.onnx_import import read_onnx

F32 = 4  # bytes per float32
I64 = 8  # bytes per int64


def by_name(g: OpGraph, column: str) -> dict[str, float]:
    return dict(zip(g.names.tolist(), getattr(g, column).tolist(), strict=True))


def edges_by_name(g: OpGraph) -> dict[tuple[str, str], float]:
    n = g.names.tolist()
    return {(n[s], n[d]): b for s, d, b in zip(g.src.tolist(), g.dst.tolist(),
                                               g.edge_bytes.tolist(), strict=True)}


def value(name: str, shape: list[int | str] | None, elem: int = TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def model_of(nodes, inputs, outputs, initializers=(), opset: int = 17, domains=()):
    graph = helper.make_graph(nodes, "test", inputs, outputs, list(initializers))
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, 1) for d in domains)]
    return helper.make_model(graph, opset_imports=opsets)


def weight(name: str, shape: tuple[int, ...]) -> TensorProto:
    return numpy_helper.from_array(np.zeros(shape, np.float32), name)


# ---------------------------------------------------------------- example models
def test_residual_cnn_by_hand():
    g = read_onnx(residual_cnn(batch=2, image=8, in_channels=3, width=4, blocks=1, classes=5))
    act = 2 * 4 * 8 * 8  # elements of every activation before the head: 512
    conv_stem = 2 * act * (3 * 3 * 3) + act  # 27 MACs per output, + bias
    conv_block = 2 * act * (4 * 3 * 3) + act
    assert by_name(g, "flops") == {
        "stem.conv": conv_stem, "stem.bn": 2 * act, "stem.relu": act,
        "block1.conv1": conv_block, "block1.bn1": 2 * act, "block1.relu1": act,
        "block1.conv2": conv_block, "block1.bn2": 2 * act, "block1.add": act,
        "block1.relu2": act,
        "head.pool": act,  # one add per input element
        "head.flatten": 0,
        "logits": 2 * (2 * 5) * 4 + 2 * 5,  # Gemm M=2 N=5 K=4, + C
    }
    out = by_name(g, "output_bytes")
    assert out["stem.conv"] == out["block1.relu2"] == act * F32
    assert out["head.pool"] == out["head.flatten"] == 2 * 4 * F32
    assert out["logits"] == 2 * 5 * F32
    params = by_name(g, "param_bytes")
    assert params["stem.conv"] == (4 * 3 * 3 * 3 + 4) * F32
    assert params["block1.conv1"] == (4 * 4 * 3 * 3 + 4) * F32
    assert params["stem.bn"] == 4 * 4 * F32  # scale, bias, mean, var
    assert params["logits"] == (5 * 4 + 5) * F32
    assert params["block1.add"] == params["head.flatten"] == 0
    edges = edges_by_name(g)
    assert len(edges) == 13
    assert edges["stem.relu", "block1.add"] == act * F32  # the skip connection
    assert edges["head.flatten", "logits"] == 2 * 4 * F32
    assert g.meta["batch_size"] == 2 and g.meta["dtype"] == "float32"
    assert g.meta["n_unknown_shape_ops"] == 0 and g.meta["unrated_op_types"] == {}


def test_inception_block_by_hand():
    g = read_onnx(inception_block(batch=1, image=8, in_channels=4, c1=2, c3=(2, 4),
                                  c5=(1, 2), pool_proj=2))
    hw = 8 * 8

    def conv(c_out, c_in, k):  # output elements x MACs per output x 2, + bias
        return 2 * (c_out * hw) * (c_in * k * k) + c_out * hw

    flops = by_name(g, "flops")
    assert flops["b1.conv1x1"] == conv(2, 4, 1) == 1152
    assert flops["b3.conv3x3"] == conv(4, 2, 3) == 9472
    assert flops["b5.reduce"] == conv(1, 4, 1) == 576
    assert flops["b5.conv5x5"] == conv(2, 1, 5) == 6528
    assert flops["bp.pool"] == 4 * hw * 9  # 3x3 window per output element
    assert flops["b3.conv3x3.relu"] == 4 * hw and flops["y"] == 0
    assert g.flops.sum() == (
        conv(2, 4, 1) + conv(2, 4, 1) + conv(4, 2, 3) + conv(1, 4, 1) + conv(2, 1, 5)
        + 4 * hw * 9 + conv(2, 4, 1) + (2 + 2 + 4 + 1 + 2 + 2) * hw)
    assert by_name(g, "output_bytes")["y"] == (2 + 4 + 2 + 2) * hw * F32
    assert by_name(g, "param_bytes")["b3.conv3x3"] == (4 * 2 * 9 + 4) * F32
    assert g.param_bytes.sum() == (
        (2 * 4 + 2) + (2 * 4 + 2) + (4 * 2 * 9 + 4) + (1 * 4 + 1) + (2 * 1 * 25 + 2)
        + (2 * 4 + 2)) * F32
    assert g.n_edges == 13
    sources = sorted(g.names[g.in_degree == 0].tolist())
    assert sources == ["b1.conv1x1", "b3.reduce", "b5.reduce", "bp.pool"]


def test_transformer_block_by_hand():
    b, s, d, h, ff = 1, 4, 8, 2, 16
    g = read_onnx(transformer_block(batch=b, seq=s, d_model=d, heads=h, d_ff=ff))
    assert g.n_nodes == 33  # the 4 Constant nodes are not nodes
    bsd, dh = b * s * d, d // h
    flops = by_name(g, "flops")
    assert flops["layer1.ln1"] == 5 * bsd
    assert flops["layer1.attn.q.matmul"] == 2 * bsd * d
    assert flops["layer1.attn.q.split_heads"] == flops["layer1.attn.k.transpose"] == 0
    assert flops["layer1.attn.scores"] == 2 * (b * h * s * s) * dh  # Q K^T per head
    assert flops["layer1.attn.softmax"] == 5 * (b * h * s * s)
    assert flops["layer1.attn.context"] == 2 * (b * h * s * dh) * s
    assert flops["layer1.mlp.fc1.matmul"] == 2 * (b * s * ff) * d
    assert flops["layer1.mlp.gelu.erf"] == 4 * b * s * ff
    assert flops["layer1.mlp.fc2.matmul"] == 2 * bsd * ff
    total = (2 * 5 * bsd                       # two LayerNorms
             + 4 * (2 * bsd * d + bsd)         # q, k, v, out projections + bias
             + 2 * 2 * b * h * s * s * dh      # scores and context
             + b * h * s * s * (1 + 5)         # scale and softmax
             + 2 * bsd                         # two residual adds
             + 2 * b * s * ff * d + b * s * ff  # fc1 + bias
             + b * s * ff * (1 + 4 + 1 + 1 + 1)  # GELU: div, erf, add, mul, mul
             + 2 * bsd * ff + bsd)             # fc2 + bias
    assert g.flops.sum() == total == 5920
    params = by_name(g, "param_bytes")
    assert params["layer1.attn.q.matmul"] == d * d * F32
    assert params["layer1.attn.q.split_heads"] == 4 * I64  # the target-shape initializer
    assert params["layer1.attn.scaled"] == F32  # a Constant node's scalar
    assert params["layer1.mlp.fc2.matmul"] == ff * d * F32
    out = by_name(g, "output_bytes")
    assert out["layer1.attn.scores"] == b * h * s * s * F32
    assert out["y"] == bsd * F32
    edges = edges_by_name(g)
    assert edges["layer1.attn.k.transpose", "layer1.attn.scores"] == bsd * F32
    assert ("layer1.attn.residual", "y") in edges  # the second residual connection


def test_rnn_unrolled_by_hand_and_shared_weights():
    steps, b, i, h = 3, 2, 4, 8
    g = read_onnx(rnn_unrolled(steps=steps, batch=b, input_size=i, hidden=h))
    assert g.n_nodes == 15 * steps + 2
    g4 = b * 4 * h  # gate pre-activation elements
    step = (2 * g4 * i + 2 * g4 * h  # x W and h R
            + 2 * g4                 # two adds
            + 4 * 4 * b * h          # 3 sigmoids and a tanh on the gates
            + 3 * b * h              # f*c, i*g, add
            + 4 * b * h + b * h)     # tanh(c), o * tanh(c)
    assert step == 2048
    assert g.flops.sum() == steps * step
    params = by_name(g, "param_bytes")
    # W, R and b are shared: counted at their first consumers only
    assert params["step1.x_matmul"] == i * 4 * h * F32
    assert params["step1.h_matmul"] == h * 4 * h * F32
    assert params["step2.x_matmul"] == params["step3.h_matmul"] == 0
    assert g.param_bytes.sum() == (i * 4 * h + h * 4 * h + 4 * h) * F32 + (steps + 1) * I64
    edges = edges_by_name(g)
    assert edges["step1.h", "step2.h_matmul"] == b * h * F32
    assert edges["split", "step2.x"] == b * 1 * i * F32
    assert by_name(g, "output_bytes")["split"] == steps * b * i * F32
    assert by_name(g, "output_bytes")["hs"] == steps * b * h * F32


def test_transformer_stack_size_and_dynamic_reshapes():
    g = read_onnx(transformer_stack(n_layers=3, dynamic_reshape=True, seq=8, vocab=32))
    assert g.n_nodes == 4 + 57 * 3
    assert g.meta["n_unknown_shape_ops"] == 0  # Shape -> Gather -> Concat resolved
    static = read_onnx(transformer_stack(n_layers=3, seq=8, vocab=32))
    assert static.n_nodes == 4 + 33 * 3
    assert g.flops.sum() == static.flops.sum()  # shape arithmetic costs nothing
    assert g.meta["dtype"] == "float32"  # from the weights: the input is int64 ids
    assert by_name(g, "flops")["logits"] == 2 * (8 * 32) * 32


@pytest.mark.parametrize("build", [residual_cnn, inception_block, transformer_block,
                                   rnn_unrolled])
def test_round_trip_through_native_format(build, tmp_path):
    g = read_onnx(build())
    path = tmp_path / "g.json.gz"
    save_graph(g, path)
    back = load_native(path)
    assert back == g
    assert dict(back.meta) == dict(g.meta)
    assert back.op_types.tolist() == g.op_types.tolist()


def test_meta_and_load_graph_dispatch(tmp_path):
    path = tmp_path / "cnn.onnx"
    onnx.save(residual_cnn(blocks=1), path)
    g = load_graph(path)
    assert g.meta["name"] == "cnn" and g.meta["source"] == str(path)
    assert g.meta["importer"] == "onnx" and g.meta["opset"] == 17
    assert read_onnx(path.read_bytes()).meta["source"] == "<in-memory ONNX model>"
    assert read_onnx(path, name="x").name == "x"


# ---------------------------------------------------------------- op rules
def one_op(op, inputs, out_shape, attrs=None, opset=17, initializers=(), n_out=1):
    ins = [value(n, s) for n, s in inputs]
    outs = [f"y{k}" for k in range(n_out)]
    node = helper.make_node(op, [n for n, _ in inputs] + [t.name for t in initializers],
                            outs, name="op", **(attrs or {}))
    return model_of([node], ins, [value(outs[0], out_shape)], initializers, opset)


RULE_CASES = [
    # grouped conv: 2 input channels per group, 3x3 kernel
    ("grouped conv", one_op("Conv", [("x", [1, 4, 6, 6]), ("w", [8, 2, 3, 3])], None,
                            {"group": 2}), 2 * (8 * 4 * 4) * (2 * 9)),
    ("depthwise conv + bias", one_op("Conv", [("x", [1, 4, 5, 5]), ("w", [4, 1, 3, 3]),
                                              ("b", [4])], None,
                                     {"group": 4, "pads": [1, 1, 1, 1]}),
     2 * 100 * 9 + 100),
    ("conv transpose", one_op("ConvTranspose", [("x", [1, 2, 3, 3]), ("w", [2, 4, 2, 2])],
                              None, {"strides": [2, 2]}), 2 * 18 * (4 * 2 * 2)),
    ("batched matmul, broadcast B", one_op("MatMul", [("a", [2, 3, 4, 5]), ("b", [5, 6])],
                                           None), 2 * (2 * 3 * 4 * 6) * 5),
    ("broadcast batch dims", one_op("MatMul", [("a", [3, 1, 4, 5]), ("b", [2, 5, 6])], None),
     2 * (3 * 2 * 4 * 6) * 5),
    ("gemm transA + C", one_op("Gemm", [("a", [5, 3]), ("b", [5, 4]), ("c", [4])], None,
                               {"transA": 1}), 2 * (3 * 4) * 5 + 3 * 4),
    ("einsum bmm", one_op("Einsum", [("a", [2, 3, 4]), ("b", [2, 4, 5])], None,
                          {"equation": "bij,bjk->bik"}), 2 * (2 * 3 * 4 * 5)),
    ("einsum ellipsis", one_op("Einsum", [("a", [7, 2, 3]), ("b", [1, 3, 4])], None,
                               {"equation": "...ij,...jk->...ik"}), 2 * 7 * (2 * 3 * 4)),
    ("average pool", one_op("AveragePool", [("x", [1, 3, 4, 4])], None,
                            {"kernel_shape": [2, 2], "strides": [2, 2]}), 12 * 4),
    ("global max pool", one_op("GlobalMaxPool", [("x", [2, 3, 4, 4])], None), 96),
    ("reduce mean", one_op("ReduceMean", [("x", [2, 3, 4])], None, {"axes": [-1]}, opset=17),
     24),
    ("softmax", one_op("Softmax", [("x", [2, 5])], None), 5 * 10),
    ("layer norm", one_op("LayerNormalization", [("x", [2, 6]), ("s", [6])], None), 5 * 12),
    ("gelu op", one_op("Gelu", [("x", [3, 4])], None, opset=20), 8 * 12),
    ("sigmoid", one_op("Sigmoid", [("x", [3, 4])], None), 4 * 12),
    ("variadic max", one_op("Max", [("a", [3]), ("b", [3]), ("c", [3])], None), 2 * 3),
    ("attention op (opset 23)", one_op("Attention", [("q", [2, 4, 8, 16]),
                                                     ("k", [2, 4, 10, 16]),
                                                     ("v", [2, 4, 10, 32])], None, opset=23),
     (2 * 4 * 8 * 10) * (2 * 16 + 2 * 32 + 5)),
    ("reshape moves data only", one_op("Reshape", [("x", [2, 6])], None,
                                       initializers=[numpy_helper.from_array(
                                           np.array([3, 4], np.int64), "shape")]), 0),
]


@pytest.mark.parametrize(("label", "model", "flops"), RULE_CASES,
                         ids=[c[0] for c in RULE_CASES])
def test_op_flops_rules(label, model, flops):
    g = read_onnx(model)
    assert g.meta["n_unknown_shape_ops"] == 0, label
    assert g.flops.tolist() == [flops]


def test_recurrent_ops():
    seq, batch, inp, hid = 5, 2, 3, 4
    x = value("x", [seq, batch, inp])
    lstm = model_of(
        [helper.make_node("LSTM", ["x", "W", "R", "B"], ["Y", "Y_h", "Y_c"], name="lstm",
                          hidden_size=hid)],
        [x], [value("Y", None)],
        [weight("W", (1, 4 * hid, inp)), weight("R", (1, 4 * hid, hid)),
         weight("B", (1, 8 * hid))])
    g = read_onnx(lstm)
    per_row = 2 * 4 * hid * (inp + hid) + 24 * hid + 2 * 4 * hid  # gates, arithmetic, bias
    assert g.flops.tolist() == [seq * batch * per_row] == [3520]
    assert g.output_bytes.tolist() == [(seq * batch * hid + 2 * batch * hid) * F32]
    assert g.param_bytes.tolist() == [(4 * hid * inp + 4 * hid * hid + 8 * hid) * F32]
    gru = model_of(
        [helper.make_node("GRU", ["x", "W", "R"], ["Y"], name="gru", hidden_size=hid,
                          direction="bidirectional")],
        [x], [value("Y", None)],
        [weight("W", (2, 3 * hid, inp)), weight("R", (2, 3 * hid, hid))])
    assert read_onnx(gru).flops.tolist() == [seq * batch * 2 * (2 * 3 * hid * (inp + hid)
                                                                 + 17 * hid)]


def test_op_without_rule_is_costed_and_reported():
    g = read_onnx(one_op("Det", [("x", [2, 3, 3])], None))
    assert g.flops.tolist() == [2.0]  # one per output element
    assert g.meta["unrated_op_types"] == {"Det": 1}


def test_onnxruntime_packed_attention_has_its_own_rule():
    # com.microsoft Attention: x (2, 16, 64), one packed Q/K/V weight (64, 192), 4 heads;
    # once read as ONNX's Attention (the weight as K: 1.6 MFLOP, no warning)
    node = helper.make_node("Attention", ["x", "w", "b"], ["y"], name="att",
                            domain="com.microsoft", num_heads=4)
    model = model_of([node], [value("x", [2, 16, 64])], [value("y", [2, 16, 64])],
                     [weight("w", (64, 192)), weight("b", (192,))], domains=["com.microsoft"])
    g = read_onnx(model)
    scores = 2 * 4 * 16 * 16  # batch, heads, queries, keys
    assert g.flops.tolist() == [2 * 32 * 64 * 192 + 32 * 192 + scores * (2 * 16 + 2 * 16 + 5)]
    assert g.meta["unrated_op_types"] == {} and g.meta["n_unknown_shape_ops"] == 0
    # unequal Q/K/V sizes, a mask and 10 past keys: the past lengthens the keys
    node = helper.make_node("Attention", ["x", "w", "b", "mask", "past"], ["y"], name="att",
                            domain="com.microsoft", num_heads=4,
                            qkv_hidden_sizes=[96, 96, 64])
    model = model_of([node], [value("x", [2, 16, 64]), value("mask", [2, 26]),
                              value("past", [2, 2, 4, 10, 24])], [value("y", [2, 16, 64])],
                     [weight("w", (64, 256)), weight("b", (256,))], domains=["com.microsoft"])
    scores = 2 * 4 * 16 * (16 + 10)
    assert read_onnx(model).flops.tolist() == [
        2 * 32 * 64 * 256 + 32 * 256 + scores * (2 * 24 + 2 * 16 + 5 + 1)]


def test_onnxruntime_multi_head_attention_has_its_own_rule():
    # com.microsoft MultiHeadAttention, 4 heads: q (2, 16, 64) over k, v (2, 10, 64) and a
    # bias of Q, K and V (192); once unrated (1 FLOP per output element: 2,048)
    node = helper.make_node("MultiHeadAttention", ["q", "k", "v", "b"], ["y"], name="mha",
                            domain="com.microsoft", num_heads=4)
    model = model_of([node], [value("q", [2, 16, 64]), value("k", [2, 10, 64]),
                              value("v", [2, 10, 64])], [value("y", [2, 16, 64])],
                     [weight("b", (192,))], domains=["com.microsoft"])
    g = read_onnx(model)
    scores = 2 * 4 * 16 * 10
    assert g.flops.tolist() == [2 * 16 * 64 + 2 * 2 * 10 * 64 + scores * (2 * 16 + 2 * 16 + 5)]
    assert g.meta["unrated_op_types"] == {}
    # Q/K/V packed (batch, seq, heads, 3, head_size), an attention bias, 6 past keys
    node = helper.make_node("MultiHeadAttention", ["qkv", "", "", "", "", "ab", "pk", "pv"],
                            ["y"], name="mha", domain="com.microsoft", num_heads=4)
    model = model_of([node], [value("qkv", [2, 16, 4, 3, 16]), value("ab", [1, 4, 16, 22]),
                              value("pk", [2, 4, 6, 16]), value("pv", [2, 4, 6, 16])],
                     [value("y", [2, 16, 64])], domains=["com.microsoft"])
    scores = 2 * 4 * 16 * (16 + 6)
    assert read_onnx(model).flops.tolist() == [scores * (2 * 16 + 2 * 16 + 5 + 1)]
    # keys already split into heads (batch, heads, kv_seq, head_size)
    node = helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["y"], name="mha",
                            domain="com.microsoft", num_heads=4)
    model = model_of([node], [value("q", [2, 16, 64]), value("k", [2, 4, 12, 16]),
                              value("v", [2, 4, 12, 16])], [value("y", [2, 16, 64])],
                     domains=["com.microsoft"])
    assert read_onnx(model).flops.tolist() == [2 * 4 * 16 * 12 * (2 * 16 + 2 * 16 + 5)]


def test_onnxruntime_group_query_attention_has_its_own_rule():
    # 8 query heads sharing 2 key/value heads of 16, 4 new tokens: the scores are 8 heads'
    # over the 20 keys of the present key (16 past, 4 new)
    node = helper.make_node("GroupQueryAttention",
                            ["q", "k", "v", "pk", "pv", "seqlens", "total"],
                            ["y", "present_k", "present_v"], name="gqa",
                            domain="com.microsoft", num_heads=8, kv_num_heads=2)
    inputs = [value("q", [2, 4, 128]), value("k", [2, 4, 32]), value("v", [2, 4, 32]),
              value("pk", [2, 2, 16, 16]), value("pv", [2, 2, 16, 16]),
              value("seqlens", [2], TensorProto.INT32), value("total", [1], TensorProto.INT32)]
    present = [value("present_k", [2, 2, 20, 16]), value("present_v", [2, 2, 20, 16])]
    g = read_onnx(model_of([node], inputs, [value("y", [2, 4, 128]), *present],
                           domains=["com.microsoft"]))
    assert g.flops.tolist() == [2 * 8 * 4 * 20 * (4 * 16 + 5)]
    assert g.meta["unrated_op_types"] == {}
    # without the present key's shape: the past and the new keys
    node = helper.make_node("GroupQueryAttention",
                            ["q", "k", "v", "pk", "pv", "seqlens", "total"], ["y"],
                            name="gqa", domain="com.microsoft", num_heads=8, kv_num_heads=2)
    g = read_onnx(model_of([node], inputs, [value("y", [2, 4, 128])],
                           domains=["com.microsoft"]))
    assert g.flops.tolist() == [2 * 8 * 4 * 20 * (4 * 16 + 5)]


@pytest.mark.parametrize(("op", "inputs", "attrs", "opset", "error"), [
    ("Gemm", [("a", [4]), ("b", [4, 5])], {}, 17, "IndexError"),
    ("MatMul", [("a", []), ("b", [4, 5])], {}, 17, "IndexError"),
    ("Attention", [("q", [1, 8, 32]), ("k", [1, 10, 32]), ("v", [1, 10, 32])],
     {"q_num_heads": 0, "kv_num_heads": 0}, 23, "ZeroDivisionError"),
])
def test_shapes_an_op_does_not_take_are_one_error_naming_the_node(op, inputs, attrs, opset,
                                                                  error):
    # shape inference, not strict, lets them through; the rules once raised a traceback
    model = one_op(op, inputs, [1, 5], attrs, opset=opset)
    given = ", ".join(str(shape) for _, shape in inputs)
    with pytest.raises(FormatError, match=rf"node 'op' \({op}\): its inputs of shapes "
                                          rf"{re.escape(given)} or its attributes are not "
                                          rf"what {op} takes \({error}"):
        read_onnx(model)


def test_a_tensor_of_more_elements_than_a_float_counts_is_refused():
    model = model_of([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                     [value("x", [2**62] * 18)], [value("y", [2**62] * 18)])
    with pytest.raises(FormatError, match="tensor 'y' has more elements than a float counts "
                                          r"\(its 18 dimensions multiply past 1e308\)"):
        read_onnx(model)


# ---------------------------------------------------------------- edges and params
def test_edges_merge_tensors_per_pair_and_count_each_tensor_once():
    model = model_of(
        [helper.make_node("Split", ["x"], ["a", "b"], name="split", axis=1, num_outputs=2),
         helper.make_node("Add", ["a", "b"], ["s"], name="add"),
         helper.make_node("Mul", ["s", "s"], ["y"], name="square")],
        [value("x", [2, 8])], [value("y", None)], opset=18)
    g = read_onnx(model)
    assert edges_by_name(g) == {("split", "add"): 2 * 2 * 4 * F32,  # two distinct tensors
                                ("add", "square"): 2 * 4 * F32}     # one tensor read twice
    assert by_name(g, "output_bytes")["split"] == 2 * 2 * 4 * F32


def test_constant_nodes_are_parameters_not_nodes():
    const = helper.make_node("Constant", [], ["c"], name="const",
                             value=numpy_helper.from_array(np.ones((2, 3), np.float32)))
    model = model_of([const, helper.make_node("Add", ["x", "c"], ["y"], name="add"),
                      helper.make_node("Mul", ["y", "c"], ["z"], name="mul")],
                     [value("x", [2, 3])], [value("z", None)])
    g = read_onnx(model)
    assert g.names.tolist() == ["add", "mul"]
    assert by_name(g, "param_bytes") == {"add": 6 * F32, "mul": 0}


def test_node_names_made_unique_and_non_empty():
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Relu", ["a"], ["b"], name="r"),
             helper.make_node("Relu", ["b"], ["c"], name="r"),
             helper.make_node("Relu", ["c"], ["d"], name="r_1")]
    g = read_onnx(model_of(nodes, [value("x", [2])], [value("d", None)]))
    assert g.names.tolist() == ["Relu_0", "r", "r_1", "r_1_1"]


# ---------------------------------------------------------------- unknown shapes
def test_unknown_shapes_are_reported_not_silently_zero():
    nodes = [helper.make_node("Mystery", ["x"], ["m"], name="mystery", domain="com.example"),
             helper.make_node("Relu", ["m"], ["r"], name="after"),
             helper.make_node("Relu", ["x"], ["k"], name="known")]
    model = model_of(nodes, [value("x", [2, 3])], [value("r", None), value("k", None)],
                     domains=["com.example"])
    g = read_onnx(model)
    assert g.meta["unknown_shape_ops"] == ["mystery", "after"]
    assert g.meta["n_unknown_shape_ops"] == 2
    assert g.meta["unrated_op_types"] == {"Mystery": 1}
    assert by_name(g, "flops")["known"] == 6
    # the same op in a domain the model does not import: still one op of unknown shape
    undeclared = model_of(nodes, [value("x", [2, 3])], [value("r", None), value("k", None)])
    assert read_onnx(undeclared).meta["unknown_shape_ops"] == ["mystery", "after"]


def test_symbolic_dims_reported_and_bound():
    model = model_of([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                     [value("x", ["batch", 3])], [value("y", None)])
    g = read_onnx(model)
    assert g.meta["symbolic_dims"] == ["batch"]
    assert g.meta["unknown_shape_ops"] == ["relu"] and g.meta["batch_size"] is None
    bound = read_onnx(model, dims={"batch": 4})
    assert bound.meta["n_unknown_shape_ops"] == 0 and bound.meta["symbolic_dims"] == []
    assert bound.flops.tolist() == [12] and bound.meta["batch_size"] == 4
    with pytest.raises(TravorderError, match="^<in-memory ONNX model>: no symbolic input "
                       r"dimension named seq to bind \(the model has: batch\)"):
        read_onnx(model, dims={"seq": 4})
    for key in (1, ""):
        with pytest.raises(TravorderError, match=r"dims must map symbolic dimension names "
                                                 rf"\(strings\) .* got the key {key!r}$"):
            read_onnx(model, dims={key: 8})
    with pytest.raises(TravorderError, match=r"dims must map symbolic dimension names to "
                                             r"integers, e.g. \{'batch': 8\}, not \['batch'\]"):
        read_onnx(model, dims=["batch"])
    for bad in (0, -2, 2.5, True, "8", 2**63):  # 2**63: once protobuf's traceback
        with pytest.raises(TravorderError, match=r"batch must be bound to an integer from 1 "
                                                 r"to 2\*\*63 - 1, not"):
            read_onnx(model, dims={"batch": bad})


def test_a_batch_dimension_of_minus_one_or_zero_is_no_batch_size():
    for dim in (-1, 0):
        model = model_of([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                         [value("x", [dim, 3])], [value("y", None)])
        assert read_onnx(model).meta["batch_size"] is None


def test_undefined_element_types_and_negative_sizes_are_refused():
    w = numpy_helper.from_array(np.zeros((4, 4), np.float32), "w")
    mm = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
          helper.make_node("Relu", ["h"], ["y"], name="r")]
    assert read_onnx(model_of(mm, [value("x", [2, 4])], [value("y", None)], [w]))
    odd = onnx.TensorProto()
    odd.CopyFrom(w)
    odd.data_type = 999  # once 0 bytes of parameters
    negative = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], np.zeros(16))
    negative.dims[1] = -4
    for inputs, weights, message in [
            ([value("x", [2, 4])], [odd], "initializer 'w' has element type 999, which ONNX "
                                          "does not define"),
            ([value("x", [2, 4], 999)], [w], "input 'x' has element type 999"),
            # once "flops must be finite and non-negative, got -160 on node 'mm'"
            ([value("x", [-5, 4])], [w], r"input 'x' has a dimension of -5 \(a size is 0 "
                                         r"or more, or -1 for any\)"),
            ([value("x", [2, 4])], [negative], r"initializer 'w' has a dimension of -4 \(a "
                                               r"size is 0 or more\)$")]:
        with pytest.raises(FormatError, match=message):
            read_onnx(model_of(mm, inputs, [value("y", None)], weights))


# ---------------------------------------------------------------- files
def test_external_data_missing_still_loads_weight_shapes(tmp_path):
    model = residual_cnn(blocks=1)
    reference = read_onnx(model)
    path = tmp_path / "cnn.onnx"
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location="cnn.onnx.data", size_threshold=0)
    (tmp_path / "cnn.onnx.data").unlink()
    g = read_onnx(path)
    assert g.param_bytes.sum() == reference.param_bytes.sum() > 0
    assert np.array_equal(g.flops, reference.flops)


def test_a_shape_tensor_in_the_data_file_is_read_for_shape_inference(tmp_path):
    model = model_of([helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
                      helper.make_node("MatMul", ["r", "w"], ["y"], name="mm")],
                     [value("x", [2, 3, 4])], [value("y", None)],
                     [numpy_helper.from_array(np.array([6, 4], np.int64), "shape"),
                      weight("w", (4, 16))])
    reference, path = read_onnx(model), tmp_path / "m.onnx"
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location="m.data", size_threshold=0)
    g = read_onnx(path)  # once 0 FLOPs: the shape was external, so both ops unknown
    assert g.meta["n_unknown_shape_ops"] == 0 and by_name(g, "flops")["mm"] == 2 * 6 * 16 * 4
    assert np.array_equal(g.flops, reference.flops)
    shutil.copy(tmp_path / "m.data", tmp_path.parent / "m.data")
    for edit in ({"location": "../m.data"}, {"length": None}):  # outside; no length given
        stored = onnx.load(path, load_external_data=False)
        for t in stored.graph.initializer:
            entries = {e.key: e.value for e in t.external_data} | edit
            del t.external_data[:]
            for key, v in entries.items():
                if v is not None:
                    t.external_data.add(key=key, value=v)
        onnx.save(stored, tmp_path / "other.onnx")
        assert read_onnx(tmp_path / "other.onnx").meta["n_unknown_shape_ops"] == 2, edit
    (tmp_path.parent / "m.data").unlink()
    (tmp_path / "m.data").unlink()  # without it: unknown, and reported
    assert read_onnx(path).meta["unknown_shape_ops"] == ["reshape", "mm"]


def test_in_memory_weights_are_left_untouched():
    w = numpy_helper.from_array(np.zeros((640, 640), np.float32), "w")  # 1.6 MB
    model = model_of([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                     [value("x", [2, 640])], [value("y", None)], [w])
    g = read_onnx(model)
    assert g.flops.tolist() == [2 * (2 * 640) * 640]
    assert g.param_bytes.tolist() == [640 * 640 * F32]
    assert len(model.graph.initializer[0].raw_data) == 640 * 640 * F32  # left untouched


def test_control_flow_is_refused_with_the_node_name():
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [],
                             [value("t", [2])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [value("e", [2])])
    model = model_of([helper.make_node("If", ["c"], ["y"], name="branch",
                                       then_branch=then, else_branch=other)],
                     [value("x", [2]), value("c", [], TensorProto.BOOL)], [value("y", [2])])
    with pytest.raises(FormatError, match=r"node 'branch' \(If\) has a subgraph"):
        read_onnx(model)
    # inside a model-local function: named as the file names it (once the inlined 'branch__1')
    inner = helper.make_function("local", "block", ["x", "c"], ["y"],
                                 list(model.graph.node), [helper.make_opsetid("", 17)])
    outer = helper.make_function("local", "stage", ["x", "c"], ["y"],
                                 [helper.make_node("block", ["x", "c"], ["y"], domain="local",
                                                   name="call_block")],
                                 [helper.make_opsetid("local", 1)])
    nested = model_of([helper.make_node("stage", ["x", "c"], ["y"], domain="local",
                                        name="stage3")],
                      [value("x", [2]), value("c", [], TensorProto.BOOL)], [value("y", [2])],
                      domains=["local"])
    nested.functions.extend([inner, outer])
    with pytest.raises(FormatError, match=r"node 'branch' \(If\) of function 'block', called "
                                          r"by node 'call_block' \(block\) of function "
                                          r"'stage', called by node 'stage3' \(stage\) has a "
                                          r"subgraph"):
        read_onnx(nested)
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond"], ["cond_out"]),
         helper.make_node("Add", ["v", "v"], ["v_out"])], "body",
        [value("i", [], TensorProto.INT64), value("cond", [], TensorProto.BOOL),
         value("v", [2])],
        [value("cond_out", [], TensorProto.BOOL), value("v_out", [2])])
    loop = model_of([helper.make_node("Loop", ["n", "", "x"], ["y"], body=body)],
                    [value("n", [], TensorProto.INT64), value("x", [2])], [value("y", [2])])
    with pytest.raises(FormatError, match=r"node 'Loop_0' \(Loop\)"):
        read_onnx(loop)


def test_cyclic_onnx_graph_is_a_graph_error():
    nodes = [helper.make_node("Add", ["x", "b"], ["a"], name="A"),
             helper.make_node("Relu", ["a"], ["b"], name="B")]
    with pytest.raises(GraphError, match="cycle"):
        read_onnx(model_of(nodes, [value("x", [2])], [value("b", [2])]))


def test_tensor_produced_twice_is_refused():
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="one"),
             helper.make_node("Neg", ["x"], ["y"], name="two")]
    with pytest.raises(FormatError, match="tensor 'y' is produced by two nodes"):
        read_onnx(model_of(nodes, [value("x", [2])], [value("y", [2])]))


def _write(tmp_path, name, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(("label", "make", "message"), [
    ("missing", lambda p: p / "nope.onnx", "no such file"),
    ("empty", lambda p: _write(p, "e.onnx", b""), "empty file"),
    ("truncated", lambda p: _write(p, "t.onnx", residual_cnn().SerializeToString()[:700]),
     r"not an ONNX model \(truncated"),
    ("text named .onnx", lambda p: _write(p, "t.onnx", b"hello, not a model\n"),
     "not an ONNX model"),
    ("JSON named .onnx", lambda p: _write(p, "j.onnx", b'{"nodes": []}'),
     r"not an ONNX model \(it is a JSON file\)"),
    ("gzip named .onnx", lambda p: _write(p, "g.onnx", b"\x1f\x8b\x08\x00junk"),
     r"not an ONNX model \(it is a travorder graph file\)"),
    ("model without nodes", lambda p: _write(p, "n.onnx", helper.make_model(
        helper.make_graph([], "g", [], [])).SerializeToString()),
     r"not an ONNX model \(no graph nodes\)"),
    ("model of Constants only", lambda p: _write(p, "c.onnx", helper.make_model(helper.make_graph(
        [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(
            np.ones(4, np.float32)))], "g", [],
        [helper.make_tensor_value_info("c", onnx.TensorProto.FLOAT, [4])])).SerializeToString()),
     "the graph has only Constant nodes, no op to place"),  # once a graph of 0 nodes
    ("another protobuf", lambda p: _write(p, "w.onnx", numpy_helper.from_array(
        np.ones(4, np.float32), "w").SerializeToString()), "not an ONNX model"),
])
def test_bad_files_give_one_clear_line(tmp_path, label, make, message):
    path = make(tmp_path)
    with pytest.raises(FormatError, match=message) as info:
        read_onnx(path)
    assert "\n" not in str(info.value)
    assert str(info.value).startswith(str(path))


def test_bad_bytes_and_empty_model_in_memory():
    with pytest.raises(FormatError, match=r"^<in-memory ONNX model>: not an ONNX model"):
        read_onnx(b"\x0a\xff\xff")
    with pytest.raises(FormatError, match="no graph nodes"):
        read_onnx(onnx.ModelProto())


def test_local_functions_are_inlined():
    swish = helper.make_function(
        "local", "Swish", ["a"], ["b"],
        [helper.make_node("Sigmoid", ["a"], ["s"]), helper.make_node("Mul", ["a", "s"], ["b"])],
        opset_imports=[helper.make_opsetid("", 17)])
    graph = helper.make_graph([helper.make_node("Swish", ["x"], ["y"], domain="local")], "f",
                              [value("x", [2, 3])], [value("y", None)])
    model = helper.make_model(graph, functions=[swish], opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])
    g = read_onnx(model)
    assert sorted(g.op_types.tolist()) == ["Mul", "Sigmoid"]
    assert g.flops.sum() == 4 * 6 + 6 and g.n_edges == 1


def test_sparse_initializer_counts_as_parameter():
    values = numpy_helper.from_array(np.ones(3, np.float32), "w")
    indices = numpy_helper.from_array(np.array([0, 4, 8], np.int64), "w_indices")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "s",
                              [value("x", [2, 3])], [value("y", None)],
                              sparse_initializer=[helper.make_sparse_tensor(values, indices,
                                                                            [3, 3])])
    g = read_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert g.flops.tolist() == [2 * (2 * 3) * 3]
    assert g.param_bytes.tolist() == [3 * 3 * F32]  # the dense size a device holds


def test_batch_and_dtype_from_partly_symbolic_half_input():
    model = model_of([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                     [value("x", [8, "seq"], TensorProto.FLOAT16)],
                     [value("y", None, TensorProto.FLOAT16)])
    g = read_onnx(model)
    assert g.meta["batch_size"] == 8 and g.meta["dtype"] == "float16"
    assert read_onnx(model, dims={"seq": 5}).output_bytes.tolist() == [8 * 5 * 2]


def test_exporter_value_info_fills_custom_op_shapes_and_takes_bound_dims():
    graph = helper.make_graph(
        [helper.make_node("Mystery", ["x"], ["m"], name="mystery", domain="com.example")],
        "v", [value("x", ["batch", 3])], [value("m", None)],
        value_info=[value("m", ["batch", 3])])  # as exporters record custom ops' shapes
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", 1)])
    assert read_onnx(model).meta["unknown_shape_ops"] == ["mystery"]
    g = read_onnx(model, dims={"batch": 2})
    assert g.meta["unknown_shape_ops"] == [] and g.output_bytes.tolist() == [2 * 3 * F32]
    assert g.meta["unrated_op_types"] == {"Mystery": 1} and g.flops.tolist() == [6]
