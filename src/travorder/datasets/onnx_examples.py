"""Small, fully shaped ONNX models built with ``onnx.helper``.

Each builder returns an ``onnx.ModelProto`` (opset 17, float32, fixed shapes, random
weights from ``seed``) whose shapes are all inferred; node names say where a node sits
(``block1.conv2``, ``layer3.attn.softmax``). They are small by default and grow with
their parameters:

- :func:`residual_cnn`: a ResNet-style CNN (stem, residual blocks, pooled classifier);
- :func:`inception_block`: one Inception module, four parallel branches concatenated;
- :func:`transformer_block`: one pre-norm transformer encoder layer, attention written
  as MatMul/Softmax chains and GELU through ``Erf``, as exporters write them;
- :func:`transformer_stack`: token embedding, ``n_layers`` such layers and an LM head,
  for big graphs (36 layers with ``dynamic_reshape=True`` give over 2,000 nodes);
- :func:`rnn_unrolled`: an LSTM cell unrolled over ``steps`` time steps, weights shared.

>>> import onnx
>>> model = transformer_block()
>>> onnx.checker.check_model(model)
>>> sum(n.op_type != "Constant" for n in model.graph.node), model.graph.output[0].name
(33, 'y')
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import ModelProto, TensorProto, helper, numpy_helper

OPSET = 17


class _Builder:
    """Collects nodes and initializers; every node output is named after its node."""

    def __init__(self, seed: int) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.rng = np.random.default_rng(seed)

    def weight(self, name: str, shape: Sequence[int], fill: float | None = None) -> str:
        """A float32 initializer: ``fill`` everywhere, or small random values."""
        data = (np.full(shape, fill) if fill is not None
                else self.rng.normal(0.0, 0.02, size=shape))
        self.initializers.append(numpy_helper.from_array(data.astype(np.float32), name))
        return name

    def ints(self, name: str, values: int | Sequence[int]) -> str:
        """An int64 initializer, scalar or vector (shapes, axes, indices, split sizes)."""
        self.initializers.append(numpy_helper.from_array(np.array(values, np.int64), name))
        return name

    def op(self, op_type: str, inputs: Sequence[str], name: str, n_out: int = 1,
           **attrs: object) -> str:
        """Add a node; returns its output (outputs ``name:0``.. when ``n_out`` > 1)."""
        outputs = [name] if n_out == 1 else [f"{name}:{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, name=name, **attrs))
        return name

    def constant(self, name: str, value: float) -> str:
        """A float32 scalar from a ``Constant`` node, as exporters write literals."""
        self.nodes.append(helper.make_node(
            "Constant", [], [name], name=name,
            value=numpy_helper.from_array(np.array(value, np.float32))))
        return name

    def model(self, name: str, inputs: list[onnx.ValueInfoProto], outputs: Sequence[str]
              ) -> ModelProto:
        out_info = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
        graph = helper.make_graph(self.nodes, name, inputs, out_info, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="travorder")
        return onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)


def _float_input(name: str, shape: Sequence[int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _conv(b: _Builder, x: str, name: str, c_in: int, c_out: int, k: int, *,
          stride: int = 1) -> str:
    w = b.weight(f"{name}.weight", (c_out, c_in, k, k))
    bias = b.weight(f"{name}.bias", (c_out,))
    return b.op("Conv", [x, w, bias], name, kernel_shape=[k, k], strides=[stride, stride],
                pads=[k // 2] * 4)


def _batchnorm(b: _Builder, x: str, name: str, c: int) -> str:
    params = [b.weight(f"{name}.{p}", (c,), fill)
              for p, fill in (("scale", 1.0), ("bias", 0.0), ("mean", 0.0), ("var", 1.0))]
    return b.op("BatchNormalization", [x, *params], name)


def residual_cnn(batch: int = 1, image: int = 32, in_channels: int = 3, width: int = 16,
                 blocks: int = 2, classes: int = 10, seed: int = 0) -> ModelProto:
    """A ResNet-style CNN: stem (3x3 conv, BN, ReLU), ``blocks`` residual blocks
    (conv-BN-ReLU-conv-BN, add the block input, ReLU) at ``width`` channels and
    ``image`` x ``image`` resolution, global average pooling, flatten and a Gemm.

    ``3 + 7 * blocks + 3`` nodes; input ``x`` (batch, in_channels, image, image),
    output ``logits`` (batch, classes).
    """
    b = _Builder(seed)
    h = _conv(b, "x", "stem.conv", in_channels, width, 3)
    h = b.op("Relu", [_batchnorm(b, h, "stem.bn", width)], "stem.relu")
    for i in range(1, blocks + 1):
        p = f"block{i}"
        r = _conv(b, h, f"{p}.conv1", width, width, 3)
        r = b.op("Relu", [_batchnorm(b, r, f"{p}.bn1", width)], f"{p}.relu1")
        r = _batchnorm(b, _conv(b, r, f"{p}.conv2", width, width, 3), f"{p}.bn2", width)
        h = b.op("Relu", [b.op("Add", [r, h], f"{p}.add")], f"{p}.relu2")
    h = b.op("Flatten", [b.op("GlobalAveragePool", [h], "head.pool")], "head.flatten")
    b.op("Gemm", [h, b.weight("head.fc.weight", (classes, width)),
                  b.weight("head.fc.bias", (classes,))], "logits", transB=1)
    return b.model("residual_cnn", [_float_input("x", (batch, in_channels, image, image))],
                   ["logits"])


def inception_block(batch: int = 1, image: int = 16, in_channels: int = 16,
                    c1: int = 8, c3: tuple[int, int] = (4, 8), c5: tuple[int, int] = (2, 4),
                    pool_proj: int = 4, seed: int = 0) -> ModelProto:
    """One Inception module (GoogLeNet): branches 1x1; 1x1 -> 3x3; 1x1 -> 5x5;
    3x3 max-pool (stride 1) -> 1x1; every conv followed by ReLU; outputs concatenated.

    ``c3`` and ``c5`` are (reduce, out) channels. 14 nodes; input ``x``
    (batch, in_channels, image, image), output ``y`` with
    ``c1 + c3[1] + c5[1] + pool_proj`` channels.
    """
    b = _Builder(seed)

    def conv_relu(x: str, name: str, c_in: int, c_out: int, k: int) -> str:
        return b.op("Relu", [_conv(b, x, name, c_in, c_out, k)], f"{name}.relu")

    y1 = conv_relu("x", "b1.conv1x1", in_channels, c1, 1)
    y3 = conv_relu(conv_relu("x", "b3.reduce", in_channels, c3[0], 1), "b3.conv3x3",
                   c3[0], c3[1], 3)
    y5 = conv_relu(conv_relu("x", "b5.reduce", in_channels, c5[0], 1), "b5.conv5x5",
                   c5[0], c5[1], 5)
    pooled = b.op("MaxPool", ["x"], "bp.pool", kernel_shape=[3, 3], strides=[1, 1],
                  pads=[1, 1, 1, 1])
    yp = conv_relu(pooled, "bp.proj", in_channels, pool_proj, 1)
    b.op("Concat", [y1, y3, y5, yp], "y", axis=1)
    return b.model("inception_block", [_float_input("x", (batch, in_channels, image, image))],
                   ["y"])


def _reshape(b: _Builder, x: str, name: str, batch_seq: tuple[int, int],
             rest: Sequence[int], dynamic: bool) -> str:
    """Reshape ``x`` to ``(batch, seq, *rest)``. The target shape is an initializer, or
    with ``dynamic`` it is computed at run time from ``Shape(x)`` (Gather, Unsqueeze,
    Concat), as exporters write models with dynamic axes."""
    if not dynamic:
        return b.op("Reshape", [x, b.ints(f"{name}.target", [*batch_seq, *rest])], name)
    shape = b.op("Shape", [x], f"{name}.shape")
    dims = [b.op("Unsqueeze", [b.op("Gather", [shape, b.ints(f"{name}.index{i}", i)],
                                    f"{name}.dim{i}", axis=0), b.ints(f"{name}.axes{i}", [0])],
                 f"{name}.unsqueeze{i}")
            for i in (0, 1)]
    target = b.op("Concat", [*dims, b.ints(f"{name}.rest", rest)], f"{name}.target", axis=0)
    return b.op("Reshape", [x, target], name)


def _linear(b: _Builder, x: str, name: str, d_in: int, d_out: int) -> str:
    h = b.op("MatMul", [x, b.weight(f"{name}.weight", (d_in, d_out))], f"{name}.matmul")
    return b.op("Add", [h, b.weight(f"{name}.bias", (d_out,))], f"{name}.bias_add")


def _layernorm(b: _Builder, x: str, name: str, d: int) -> str:
    return b.op("LayerNormalization", [x, b.weight(f"{name}.scale", (d,), 1.0),
                                       b.weight(f"{name}.bias", (d,), 0.0)], name, axis=-1)


def _transformer_layer(b: _Builder, x: str, p: str, batch: int, seq: int, d_model: int,
                       heads: int, d_ff: int, dynamic: bool, out: str | None = None) -> str:
    """Pre-norm encoder layer: 33 nodes (57 with ``dynamic`` reshapes) and 4 Constant
    nodes; the last node is named ``out`` (default ``<p>.mlp.residual``)."""
    dh = d_model // heads
    h = _layernorm(b, x, f"{p}.ln1", d_model)
    q, k, v = (_reshape(b, _linear(b, h, f"{p}.attn.{t}", d_model, d_model),
                        f"{p}.attn.{t}.split_heads", (batch, seq), (heads, dh), dynamic)
               for t in "qkv")
    q = b.op("Transpose", [q], f"{p}.attn.q.transpose", perm=[0, 2, 1, 3])
    k = b.op("Transpose", [k], f"{p}.attn.k.transpose", perm=[0, 2, 3, 1])
    v = b.op("Transpose", [v], f"{p}.attn.v.transpose", perm=[0, 2, 1, 3])
    scores = b.op("MatMul", [q, k], f"{p}.attn.scores")
    scaled = b.op("Mul", [scores, b.constant(f"{p}.attn.scale", 1 / math.sqrt(dh))],
                  f"{p}.attn.scaled")
    probs = b.op("Softmax", [scaled], f"{p}.attn.softmax", axis=-1)
    ctx = b.op("MatMul", [probs, v], f"{p}.attn.context")
    ctx = b.op("Transpose", [ctx], f"{p}.attn.context.transpose", perm=[0, 2, 1, 3])
    ctx = _reshape(b, ctx, f"{p}.attn.merge_heads", (batch, seq), (d_model,), dynamic)
    x = b.op("Add", [x, _linear(b, ctx, f"{p}.attn.out", d_model, d_model)],
             f"{p}.attn.residual")
    h = _linear(b, _layernorm(b, x, f"{p}.ln2", d_model), f"{p}.mlp.fc1", d_model, d_ff)
    # GELU(h) = h * 0.5 * (1 + erf(h / sqrt(2)))
    g = b.op("Erf", [b.op("Div", [h, b.constant(f"{p}.mlp.gelu.sqrt2", math.sqrt(2))],
                          f"{p}.mlp.gelu.div")], f"{p}.mlp.gelu.erf")
    g = b.op("Add", [g, b.constant(f"{p}.mlp.gelu.one", 1.0)], f"{p}.mlp.gelu.add")
    g = b.op("Mul", [h, g], f"{p}.mlp.gelu.mul")
    g = b.op("Mul", [g, b.constant(f"{p}.mlp.gelu.half", 0.5)], f"{p}.mlp.gelu")
    h = _linear(b, g, f"{p}.mlp.fc2", d_ff, d_model)
    return b.op("Add", [x, h], out or f"{p}.mlp.residual")


def transformer_block(batch: int = 1, seq: int = 16, d_model: int = 32, heads: int = 4,
                      d_ff: int | None = None, dynamic_reshape: bool = False, seed: int = 0
                      ) -> ModelProto:
    """One pre-norm transformer encoder layer on input ``x`` (batch, seq, d_model):
    LayerNorm, Q/K/V projections, heads split by Reshape/Transpose, ``Q K^T`` MatMul,
    scale, Softmax, MatMul with V, heads merged, output projection, residual add;
    LayerNorm, MLP with GELU (``d_ff``, default ``4 * d_model``), residual add.

    33 nodes (57 with ``dynamic_reshape``) besides 4 scalar ``Constant`` nodes; output ``y``.
    """
    b = _Builder(seed)
    _transformer_layer(b, "x", "layer1", batch, seq, d_model, heads, d_ff or 4 * d_model,
                       dynamic_reshape, out="y")
    return b.model("transformer_block", [_float_input("x", (batch, seq, d_model))], ["y"])


def transformer_stack(n_layers: int = 2, batch: int = 1, seq: int = 16, d_model: int = 32,
                      heads: int = 4, d_ff: int | None = None, vocab: int = 64,
                      dynamic_reshape: bool = False, seed: int = 0) -> ModelProto:
    """A decoder-free language model: token ids ``ids`` (batch, seq) int64, embedding
    Gather plus learned positions, ``n_layers`` layers of :func:`transformer_block`,
    final LayerNorm and an LM-head MatMul to ``logits`` (batch, seq, vocab).

    ``4 + 33 * n_layers`` nodes, ``4 + 57 * n_layers`` with ``dynamic_reshape``, besides
    4 scalar ``Constant`` nodes per layer.
    """
    b = _Builder(seed)
    h = b.op("Gather", [b.weight("embed.tokens", (vocab, d_model)), "ids"], "embed.lookup")
    h = b.op("Add", [h, b.weight("embed.positions", (seq, d_model))], "embed.add_positions")
    for i in range(1, n_layers + 1):
        h = _transformer_layer(b, h, f"layer{i}", batch, seq, d_model, heads,
                               d_ff or 4 * d_model, dynamic_reshape)
    h = _layernorm(b, h, "final.ln", d_model)
    b.op("MatMul", [h, b.weight("lm_head.weight", (d_model, vocab))], "logits")
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [batch, seq])
    return b.model("transformer_stack", [ids], ["logits"])


def rnn_unrolled(steps: int = 4, batch: int = 1, input_size: int = 8, hidden: int = 16,
                 seed: int = 0) -> ModelProto:
    """An LSTM cell unrolled over ``steps``: input ``x`` (batch, steps, input_size) split
    into steps, initial state ``h0``/``c0`` (batch, hidden). Per step ``t``: gates
    ``x_t W + h R + b`` (two MatMuls, two Adds), Split into i, f, o, g; three Sigmoids
    and a Tanh; ``c = f*c + i*g``; ``h = o * tanh(c)``. ``W``, ``R`` and ``b`` are shared
    by all steps. Output ``hs`` (steps * batch, hidden): the hidden states concatenated.

    ``15 * steps + 2`` nodes.
    """
    b = _Builder(seed)
    w = b.weight("lstm.W", (input_size, 4 * hidden))
    r = b.weight("lstm.R", (hidden, 4 * hidden))
    bias = b.weight("lstm.b", (4 * hidden,))
    b.op("Split", ["x", b.ints("split.sizes", [1] * steps)], "split", n_out=steps, axis=1)
    axes = b.ints("squeeze.axes", [1])
    h, c, hs = "h0", "c0", []
    for t in range(1, steps + 1):
        p = f"step{t}"
        x_t = b.op("Squeeze", [f"split:{t - 1}", axes], f"{p}.x")
        gates = b.op("Add", [b.op("MatMul", [x_t, w], f"{p}.x_matmul"),
                             b.op("MatMul", [h, r], f"{p}.h_matmul")], f"{p}.gates")
        gates = b.op("Add", [gates, bias], f"{p}.gates_bias")
        split = b.op("Split", [gates], f"{p}.split", n_out=4, axis=1)
        i, f, o = (b.op("Sigmoid", [f"{split}:{j}"], f"{p}.{g}") for j, g in enumerate("ifo"))
        g = b.op("Tanh", [f"{split}:3"], f"{p}.g")
        c = b.op("Add", [b.op("Mul", [f, c], f"{p}.forget"), b.op("Mul", [i, g], f"{p}.input")],
                 f"{p}.c")
        h = b.op("Mul", [o, b.op("Tanh", [c], f"{p}.c_tanh")], f"{p}.h")
        hs.append(h)
    b.op("Concat", hs, "hs", axis=0)
    return b.model("rnn_unrolled", [_float_input("x", (batch, steps, input_size)),
                                    _float_input("h0", (batch, hidden)),
                                    _float_input("c0", (batch, hidden))], ["hs"])


__all__ = ["inception_block", "residual_cnn", "rnn_unrolled", "transformer_block",
           "transformer_stack"]
