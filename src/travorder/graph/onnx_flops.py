"""Forward FLOPs of one ONNX node from its input and output shapes.

Conventions (one multiply-add = 2 FLOPs; ``numel(T)`` = number of elements of ``T``):

- **Conv** (also ``ConvInteger``, ``QLinearConv``): ``2 * numel(Y) * prod(W.shape[1:])``,
  which is ``C_in / groups * prod(kernel)`` multiply-adds per output element, plus
  ``numel(Y)`` for the bias. **ConvTranspose**: ``2 * numel(X) * prod(W.shape[1:])`` plus
  the bias.
- **MatMul** (also ``MatMulInteger``, ``QLinearMatMul``, ``FusedMatMul``):
  ``2 * numel(Y) * K`` with ``K`` the contracted size, so batched and broadcast products
  count every batch. Attention written as MatMul chains is costed MatMul by MatMul.
  **Gemm**: ``2 * M * N * K`` plus ``M * N`` when ``C`` is given (``alpha``/``beta``
  scaling is not counted).
- **Einsum**: the naive loop nest, ``2 * (operands - 1) * prod(size of every index)``;
  a one-operand Einsum (sum, trace, transpose) costs ``prod(...)``.
- **Attention** (ONNX opset 23): per score element ``2 * head_size_qk + 2 * head_size_v``
  for the two products, 5 for the softmax and 1 for an attention mask.
- **Pooling**: ``numel(Y) * prod(kernel_shape)``; global pooling ``numel(X)``.
- **Normalisation**, per output element: BatchNormalization 2 (inference: a folded
  scale and shift); LayerNormalization, InstanceNormalization, GroupNormalization,
  MeanVarianceNormalization 5 (mean 1, variance 2, normalise and affine 2);
  RMSNormalization and SimplifiedLayerNormalization 4; the ``Skip*`` fused forms 1 more
  for the residual add; LpNormalization 3; LRN ``2 * size + 3``.
- **Softmax**, **LogSoftmax**: 5 per element (max, subtract, exp, sum, divide); Hardmax 1.
- **Elementwise**, per output element: 1 for arithmetic, comparison, logic and
  ReLU-like ops; 4 for transcendental functions and the activations built from them
  (Exp, Log, Pow, Sigmoid, Tanh, Erf, Softplus, Elu, HardSwish, ...); 8 for Gelu and
  Mish; quantize/dequantize 2; variadic Sum/Max/Min ``inputs - 1``, Mean ``inputs``.
- **Reduce***, ArgMax/ArgMin, CumSum, TopK: 1 per *input* element; ReduceL2,
  ReduceSumSquare and ReduceLogSumExp 2.
- **LSTM/GRU/RNN** (G = 4/3/1 gates, hidden size H, input size I, per direction, step
  and batch row): ``2 * G * H * (I + H)`` for the gate products, ``2 * G * H`` for the
  two biases when given, and the gate arithmetic (LSTM 24, GRU 17, RNN 4 per hidden
  unit: 4 per sigmoid or tanh, 1 per multiply or add).
- **Resize/Upsample**: 0 for ``nearest``, else 4 per output element.
- **Data movement** (Reshape, Transpose, Gather, Concat, Slice, Shape, Cast, Pad,
  Dropout in inference, ...): 0 FLOPs; their output bytes are still real.

Any other op type has no rule: it is costed at 1 FLOP per output element and
:func:`has_flops_rule` says so, so an importer can report it.

Rules look ops up by ``op_type``, whatever the domain, so the onnxruntime contrib forms
(``FusedMatMul``, ``FastGelu``, ``SkipLayerNormalization``, ...) share them; an op that a
domain defines with other inputs has its own rule (`DOMAIN_RULES`): onnxruntime's
``com.microsoft`` **Attention** takes ``x`` and one packed Q/K/V weight, and costs its
projection (``2 * numel(x) * W.shape[1]``, plus the bias) and then the attention as above;
its **MultiHeadAttention** (Q, K, V given, or packed) and **GroupQueryAttention** (query
heads sharing key/value heads, the keys of its present key) cost the attention as above
(a bias 1 per projected element; the rotary embedding of GroupQueryAttention is not
counted).

>>> from onnx import helper
>>> node = helper.make_node("MatMul", ["a", "b"], ["y"])
>>> node_flops(node, [(8, 16), (16, 4)], [(8, 4)])
1024.0
>>> node_flops(node, [None, (16, 4)], [(8, 4)]) is None
True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from onnx import NodeProto, helper

Shape = tuple[int, ...]
Shapes = Sequence[Shape | None]
_Rule = Callable[[NodeProto, Shapes, Shapes], float]


class _UnknownShape(Exception):
    """A shape the rule needs is not known."""


def _shape(shapes: Shapes, i: int) -> Shape:
    if i >= len(shapes) or shapes[i] is None:
        raise _UnknownShape
    return shapes[i]  # type: ignore[return-value]


def _numel(shapes: Shapes, i: int) -> int:
    return math.prod(_shape(shapes, i))


def _attr(node: NodeProto, name: str, default: Any) -> Any:
    for a in node.attribute:
        if a.name == name:
            value = helper.get_attribute_value(a)
            return value.decode() if isinstance(value, bytes) else value
    return default


def _has_input(node: NodeProto, i: int) -> bool:
    return len(node.input) > i and bool(node.input[i])


# ---------------------------------------------------------------- contractions
def _conv(w_index: int, bias_index: int | None) -> _Rule:
    def rule(node: NodeProto, ins: Shapes, outs: Shapes) -> float:
        y = _numel(outs, 0)
        macs = y * math.prod(_shape(ins, w_index)[1:])
        has_bias = bias_index is not None and _has_input(node, bias_index)
        return 2.0 * macs + (y if has_bias else 0)

    return rule


def _conv_transpose(node: NodeProto, ins: Shapes, outs: Shapes) -> float:
    macs = _numel(ins, 0) * math.prod(_shape(ins, 1)[1:])
    return 2.0 * macs + (_numel(outs, 0) if _has_input(node, 2) else 0)


def _matmul(node: NodeProto, ins: Shapes, outs: Shapes) -> float:
    a = _shape(ins, 0)
    k = a[-2] if _attr(node, "transA", 0) and len(a) > 1 else a[-1]
    return 2.0 * _numel(outs, 0) * k


def _gemm(node: NodeProto, ins: Shapes, outs: Shapes) -> float:
    a = _shape(ins, 0)
    k = a[0] if _attr(node, "transA", 0) else a[1]
    y = _numel(outs, 0)
    return 2.0 * y * k + (y if _has_input(node, 2) else 0)


def _einsum(node: NodeProto, ins: Shapes, outs: Shapes) -> float:
    terms = _attr(node, "equation", "").replace(" ", "").split("->")[0].split(",")
    sizes: dict[str, int] = {}
    ellipses: list[Shape] = []
    for i, term in enumerate(terms):
        shape = _shape(ins, i)
        head, _, tail = term.partition("...")
        n_ell = len(shape) - len(head) - len(tail)
        ellipses.append(shape[len(head):len(head) + n_ell])
        for letter, dim in zip(head + tail, shape[:len(head)] + shape[len(head) + n_ell:],
                               strict=True):
            sizes[letter] = max(sizes.get(letter, 1), dim)
    loop = math.prod(sizes.values()) * math.prod(np.broadcast_shapes(*ellipses))
    return 2.0 * (len(terms) - 1) * loop if len(terms) > 1 else float(loop)


def _attention(node: NodeProto, ins: Shapes, outs: Shapes) -> float:
    q, k, y = _shape(ins, 0), _shape(ins, 1), _shape(outs, 0)
    if len(q) == 4:  # (batch, heads, q_len, head_size)
        heads, head_qk, head_v, kv_len = q[1], q[3], y[3], k[2]
    else:  # (batch, q_len, heads * head_size)
        heads = _attr(node, "q_num_heads", 1)
        head_qk, head_v, kv_len = q[2] // heads, y[2] // heads, k[1]
    if _has_input(node, 4):  # past_key
        kv_len += _shape(ins, 4)[-2]
    scores = math.prod(q) // head_qk * kv_len
    return float(scores * (2 * head_qk + 2 * head_v + 5 + _has_input(node, 3)))


def _packed_attention(node: NodeProto, ins: Shapes, outs: Shapes) -> float:
    """onnxruntime's ``com.microsoft`` Attention: ``x`` (batch, seq, hidden) projected to
    Q, K and V by one packed weight (hidden, q + k + v), then attention over
    ``num_heads`` heads (past keys of shape (2, batch, heads, past, head_size))."""
    x, w = _shape(ins, 0), _shape(ins, 1)
    sizes = _attr(node, "qkv_hidden_sizes", None) or [w[1] // 3] * 3
    heads = _attr(node, "num_heads", 1)
    rows = math.prod(x[:-1])
    kv_len = x[1] + (_shape(ins, 4)[3] if _has_input(node, 4) else 0)
    project = 2 * rows * x[-1] * w[1] + (rows * w[1] if _has_input(node, 2) else 0)
    scores = rows * heads * kv_len
    return float(project + scores * (2 * (sizes[0] // heads) + 2 * (sizes[2] // heads) + 5
                                     + _has_input(node, 3)))


def _multi_head_attention(node: NodeProto, ins: Shapes, outs: Shapes) -> float:
    """onnxruntime's ``com.microsoft`` MultiHeadAttention: query (batch, seq, hidden), or
    Q/K/V packed as (batch, seq, heads, 3, head_size) without key and value; key
    (batch, kv_seq, hidden), (batch, heads, kv_seq, head_size) or K/V packed as (batch,
    kv_seq, heads, 2, head_size); the bias adds one per projected element; a key padding
    mask or an attention bias one per score; past keys (batch, heads, past, head_size)
    lengthen the keys."""
    q, y = _shape(ins, 0), _shape(outs, 0)
    heads = _attr(node, "num_heads", 1)
    head_qk = q[4] if len(q) == 5 else q[2] // heads
    kv_len = q[1]
    if _has_input(node, 1):
        k = _shape(ins, 1)
        kv_len = k[2] if len(k) == 4 else k[1]
    if _has_input(node, 6):
        kv_len += _shape(ins, 6)[2]
    bias = (sum(_numel(ins, i) for i in range(3) if _has_input(node, i))
            if _has_input(node, 3) else 0)
    scores = q[0] * q[1] * heads * kv_len
    mask = _has_input(node, 4) or _has_input(node, 5)
    return float(bias + scores * (2 * head_qk + 2 * (y[-1] // heads) + 5 + mask))


def _group_query_attention(node: NodeProto, ins: Shapes, outs: Shapes) -> float:
    """onnxruntime's ``com.microsoft`` GroupQueryAttention: ``num_heads`` query heads
    share ``kv_num_heads`` key/value heads, so the scores are those of ``num_heads``
    heads (output (batch, seq, num_heads * head_size)) over the keys the present key
    (batch, kv_num_heads, total, head_size) holds, or the past and the new ones; the
    rotary embedding is not counted."""
    q, y = _shape(ins, 0), _shape(outs, 0)
    heads = _attr(node, "num_heads", 1)
    head = y[-1] // heads
    if len(outs) > 1 and outs[1] is not None:
        kv_len = outs[1][2]
    else:
        kv_len = q[1] + (_shape(ins, 3)[2] if _has_input(node, 3) else 0)
    return float(q[0] * q[1] * heads * kv_len * (4 * head + 5))


# ---------------------------------------------------------------- per element
def _per_output(flops_per_element: float) -> _Rule:
    def rule(node: NodeProto, ins: Shapes, outs: Shapes) -> float:
        return flops_per_element * _numel(outs, 0)

    return rule


def _per_input(flops_per_element: float) -> _Rule:
    def rule(node: NodeProto, ins: Shapes, outs: Shapes) -> float:
        return flops_per_element * _numel(ins, 0)

    return rule


def _variadic(extra: int) -> _Rule:
    def rule(node: NodeProto, ins: Shapes, outs: Shapes) -> float:
        n_inputs = sum(1 for x in node.input if x)
        return float((n_inputs - 1 + extra) * _numel(outs, 0))

    return rule


def _pool(node: NodeProto, ins: Shapes, outs: Shapes) -> float:
    return float(_numel(outs, 0) * math.prod(_attr(node, "kernel_shape", [1])))


def _lrn(node: NodeProto, ins: Shapes, outs: Shapes) -> float:
    return float((2 * _attr(node, "size", 1) + 3) * _numel(outs, 0))


def _resize(node: NodeProto, ins: Shapes, outs: Shapes) -> float:
    return 0.0 if _attr(node, "mode", "nearest") == "nearest" else 4.0 * _numel(outs, 0)


# ---------------------------------------------------------------- recurrent
_RNN_GATES = {"LSTM": (4, 24), "GRU": (3, 17), "RNN": (1, 4)}


def _recurrent(node: NodeProto, ins: Shapes, outs: Shapes) -> float:
    gates, gate_arith = _RNN_GATES[node.op_type]
    x, w = _shape(ins, 0), _shape(ins, 1)  # W: (directions, gates * H, I)
    seq, batch = (x[1], x[0]) if _attr(node, "layout", 0) else (x[0], x[1])
    directions, hidden, inp = w[0], w[1] // gates, w[2]
    per_row = 2 * gates * hidden * (inp + hidden) + gate_arith * hidden
    if _has_input(node, 3):
        per_row += 2 * gates * hidden
    return float(seq * batch * directions * per_row)


def _zero(node: NodeProto, ins: Shapes, outs: Shapes) -> float:
    return 0.0


_UNARY_1 = """Abs Neg Floor Ceil Round Sign Reciprocal Sqrt Relu LeakyRelu PRelu
ThresholdedRelu Shrink Clip Not IsNaN IsInf BitwiseNot RandomNormal RandomNormalLike
RandomUniform RandomUniformLike Bernoulli"""
_BINARY_1 = """Add Sub Mul Div Mod Where Equal Greater GreaterOrEqual Less LessOrEqual And Or Xor
BitShift BitwiseAnd BitwiseOr BitwiseXor"""
_TRANSCENDENTAL_4 = """Exp Log Pow Sigmoid Tanh Erf Sin Cos Tan Asin Acos Atan Sinh Cosh Asinh
Acosh Atanh Softplus Softsign Elu Selu Celu HardSigmoid HardSwish QuickGelu"""
_DATA_MOVEMENT = """Reshape Transpose Gather GatherElements GatherND Scatter ScatterElements
ScatterND Concat Split Slice Shape Size Squeeze Unsqueeze Flatten Expand Tile Pad Identity
Cast CastLike ConstantOfShape Range DepthToSpace SpaceToDepth NonZero Compress OneHot EyeLike
Trilu ReverseSequence Dropout"""

RULES: dict[str, _Rule] = {
    "Conv": _conv(1, 2), "ConvInteger": _conv(1, None), "QLinearConv": _conv(3, 8),
    "ConvTranspose": _conv_transpose,
    "MatMul": _matmul, "MatMulInteger": _matmul, "QLinearMatMul": _matmul,
    "FusedMatMul": _matmul, "Gemm": _gemm, "Einsum": _einsum, "Attention": _attention,
    "MaxPool": _pool, "AveragePool": _pool, "LpPool": _pool,
    "GlobalAveragePool": _per_input(1), "GlobalMaxPool": _per_input(1),
    "GlobalLpPool": _per_input(1),
    "BatchNormalization": _per_output(2), "LayerNormalization": _per_output(5),
    "InstanceNormalization": _per_output(5), "GroupNormalization": _per_output(5),
    "MeanVarianceNormalization": _per_output(5), "RMSNormalization": _per_output(4),
    "SimplifiedLayerNormalization": _per_output(4), "SkipLayerNormalization": _per_output(6),
    "SkipSimplifiedLayerNormalization": _per_output(5), "LpNormalization": _per_output(3),
    "LRN": _lrn,
    "Softmax": _per_output(5), "LogSoftmax": _per_output(5), "Hardmax": _per_output(1),
    "Gelu": _per_output(8), "FastGelu": _per_output(8), "BiasGelu": _per_output(8),
    "Mish": _per_output(8),
    "QuantizeLinear": _per_output(2), "DequantizeLinear": _per_output(2),
    "DynamicQuantizeLinear": _per_output(2),
    "Sum": _variadic(0), "Max": _variadic(0), "Min": _variadic(0), "Mean": _variadic(1),
    "ReduceL2": _per_input(2), "ReduceSumSquare": _per_input(2),
    "ReduceLogSumExp": _per_input(2),
    "LSTM": _recurrent, "GRU": _recurrent, "RNN": _recurrent,
    "Resize": _resize, "Upsample": _resize,
}
_REDUCE_1 = """ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceL1 ReduceLogSum ArgMax
ArgMin CumSum TopK"""
for _rule, _ops in [(_per_output(1), f"{_UNARY_1} {_BINARY_1}"),
                    (_per_output(4), _TRANSCENDENTAL_4),
                    (_per_input(1), _REDUCE_1),
                    (_zero, _DATA_MOVEMENT)]:
    RULES.update(dict.fromkeys(_ops.split(), _rule))


#: The rules of ops that a domain defines otherwise than ONNX does (same op type, other
#: inputs), by ``(domain, op_type)``; they come before `RULES`.
DOMAIN_RULES: dict[tuple[str, str], _Rule] = {
    ("com.microsoft", "Attention"): _packed_attention,
    ("com.microsoft", "MultiHeadAttention"): _multi_head_attention,
    ("com.microsoft", "GroupQueryAttention"): _group_query_attention,
}


def _rule_of(op_type: str, domain: str) -> _Rule | None:
    return DOMAIN_RULES.get((domain, op_type)) or RULES.get(op_type)


def has_flops_rule(op_type: str, domain: str = "") -> bool:
    """Whether ``op_type`` (of ``domain``) has a FLOPs rule (others cost 1 FLOP per
    output element)."""
    return _rule_of(op_type, domain) is not None


def node_flops(node: NodeProto, in_shapes: Shapes, out_shapes: Shapes) -> float | None:
    """FLOPs of ``node`` given the shapes of its inputs and outputs (``None`` where a
    shape is unknown or an optional tensor is absent), or ``None`` when a shape the
    rule needs is unknown.
    """
    rule = _rule_of(node.op_type, node.domain)
    try:
        if rule is None:
            return float(sum(math.prod(_shape(out_shapes, i))
                             for i, name in enumerate(node.output) if name))
        return float(rule(node, in_shapes, out_shapes))
    except _UnknownShape:
        return None


__all__ = ["DOMAIN_RULES", "RULES", "has_flops_rule", "node_flops"]
