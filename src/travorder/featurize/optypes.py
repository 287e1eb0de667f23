"""Op-type categories: each node of a graph falls in exactly one of `OP_CATEGORIES`.

Op types are matched case-insensitively against ONNX operator names (with the common
onnxruntime and TensorFlow spellings). Two categories also look at the neighbourhood,
because exporters often write these blocks out as plain ops:

- ``attention``: an op type containing "attention", or a ``Softmax`` with a ``MatMul``
  (or ``Einsum``/``BatchMatMul``) at most 3 edges upstream (the scores, possibly scaled
  and masked) and one at most 2 edges downstream (the weighted values). A classifier's
  final Softmax has no product after it and stays ``elementwise``.
- ``recurrent``: ``LSTM``/``GRU``/``RNN``/``Loop``/``Scan``, or a gate product of an
  unrolled cell: a ``Mul`` with both a ``Sigmoid`` and a ``Tanh`` among its inputs.

The first matching category wins, in the order of `OP_CATEGORIES`; ops that match none
are ``other`` (reductions, ``TopK``, unknown or empty op types).

>>> from travorder.graph import OpGraph
>>> g = OpGraph.from_records(
...     [{"name": n, "op_type": t} for n, t in
...      [("q", "MatMul"), ("s", "Softmax"), ("v", "MatMul"), ("c", "Conv")]],
...     [("q", "s"), ("s", "v"), ("v", "c")])
>>> [OP_CATEGORIES[i] for i in op_categories(g)]
['matmul', 'attention', 'matmul', 'conv']
"""

from __future__ import annotations

import numpy as np

from travorder.graph import OpGraph
from travorder.graph.opgraph import check_graph

#: Category names, in order of precedence.
OP_CATEGORIES = (
    "attention", "recurrent", "conv", "matmul", "normalization", "pooling", "elementwise",
    "data_movement", "other",
)


def _names(text: str) -> frozenset[str]:
    return frozenset(text.lower().split())


_OP_TYPES = {
    "recurrent": _names("LSTM GRU RNN Loop Scan"),
    "conv": _names("Conv ConvTranspose ConvInteger QLinearConv DeformConv Conv1D Conv2D "
                   "Conv3D DepthwiseConv2dNative"),
    "matmul": _names("MatMul Gemm MatMulInteger QLinearMatMul FusedMatMul Einsum "
                     "BatchMatMul BatchMatMulV2"),
    "normalization": _names(
        "BatchNormalization LayerNormalization InstanceNormalization GroupNormalization "
        "MeanVarianceNormalization RMSNormalization SimplifiedLayerNormalization "
        "SkipLayerNormalization SkipSimplifiedLayerNormalization LpNormalization LRN "
        "FusedBatchNorm FusedBatchNormV3"),
    "pooling": _names("MaxPool AveragePool LpPool GlobalAveragePool GlobalMaxPool "
                      "GlobalLpPool MaxRoiPool RoiAlign MaxUnpool AvgPool"),
    "elementwise": _names(
        "Abs Neg Floor Ceil Round Sign Reciprocal Sqrt Relu Relu6 LeakyRelu PRelu "
        "ThresholdedRelu Shrink Clip Not IsNaN IsInf Add AddV2 BiasAdd Sub Mul Div Mod "
        "Where Equal Greater GreaterOrEqual Less LessOrEqual And Or Xor BitShift Exp Log "
        "Pow Sigmoid Tanh Erf Sin Cos Softplus Softsign Elu Selu Celu HardSigmoid "
        "HardSwish Gelu FastGelu BiasGelu QuickGelu Mish Silu Swish Softmax LogSoftmax "
        "Hardmax Sum Max Min Mean Maximum Minimum Cast CastLike Dropout QuantizeLinear "
        "DequantizeLinear"),
    "data_movement": _names(
        "Reshape Transpose Gather GatherElements GatherND Scatter ScatterElements "
        "ScatterND Concat ConcatV2 Split Slice Shape Size Squeeze Unsqueeze Flatten "
        "Expand Tile Pad Identity ConstantOfShape Range DepthToSpace SpaceToDepth NonZero "
        "Compress OneHot EyeLike Trilu ReverseSequence Resize Upsample"),
}
_PRODUCTS = _names("MatMul Einsum BatchMatMul BatchMatMulV2 FusedMatMul")


def _within(src: np.ndarray, dst: np.ndarray, start: np.ndarray, hops: int) -> np.ndarray:
    """Nodes reached from a ``start`` node in 1..``hops`` steps along edges ``src -> dst``."""
    reach = np.zeros(start.size, dtype=bool)
    front = start
    for _ in range(hops):
        front = np.bincount(dst[front[src]], minlength=start.size) > 0
        reach |= front
    return reach


def op_categories(g: OpGraph) -> np.ndarray:
    """Index into `OP_CATEGORIES` of every node of ``g``."""
    ops = np.char.lower(check_graph(g, "op_categories").op_types.astype(str))
    is_op = {cat: np.isin(ops, list(names)) for cat, names in _OP_TYPES.items()}
    n = g.n_nodes
    product = np.isin(ops, list(_PRODUCTS))
    attention = (np.char.find(ops, "attention") >= 0) | (
        (ops == "softmax") & _within(g.src, g.dst, product, 3)
        & _within(g.dst, g.src, product, 2)
    )
    gate = ((ops == "mul") & _within(g.src, g.dst, ops == "sigmoid", 1)
            & _within(g.src, g.dst, ops == "tanh", 1))
    masks = [attention, is_op["recurrent"] | gate,
             *(is_op[c] for c in OP_CATEGORIES[2:-1]), np.ones(n, dtype=bool)]
    return np.argmax(np.vstack(masks), axis=0).astype(np.int64)
