"""Synthetic model-graph families, each a seeded generator of forward `OpGraph` s.

Every generator in :data:`SYNTHETIC_FAMILIES` takes a ``seed`` and size parameters with
defaults, and is deterministic per seed: the same arguments give the same graph (same
``graph_hash``). Size parameters left as ``None`` (channels, image size, hidden size,
sequence length...) are drawn from ranges seen in real models, so one family covers a
spread of shapes. Sizes are integers from 1 to :data:`MAX_SIZE` and a graph has at most
:data:`MAX_OPS` ops; a bad argument is one `TravorderError` naming it. Graphs carry ONNX
operator names (``Conv``, ``MatMul``, ``Softmax``...) at the granularity of torch's ONNX
export of a training-mode forward pass (as :mod:`travorder.datasets.zoo` builds real
models), so op-type features mean the same on synthetic and imported graphs: a
BatchNormalization after every Conv, GlobalAveragePool and Flatten before the
classifier, attention as MatMul/Softmax chains with Reshape/Transpose around the heads,
Dropout where HuggingFace models have it.
``seq2seq`` and ``rnn`` split each recurrent cell into its gate ops, as the TensorFlow
graphs of the study did.

Costs come from tensor shapes (float32), with the conventions of
:mod:`travorder.graph.onnx_import`: ``Conv``/``MatMul``/``Gemm`` count 2 FLOPs per
multiply-add, pooling one per window element, normalisation and elementwise ops a few per
output element; ``output_bytes`` is the output tensor's size, an edge carries the tensor
it passes (a ``Split`` sends each consumer its slice), and ``param_bytes`` counts each
weight once, on its first user (recurrent weights are shared across timesteps).

Families (the study's families in brackets):

========== =================================================================
chain       layered chains: VGG-style conv stacks or MLPs
inception   Inception-style modules of 3-5 parallel branches joined by Concat
resnet      ResNet-style residual stages (basic or bottleneck blocks)
densenet    DenseNet-style dense blocks: every layer concatenates all before it
unet        U-Net encoder-decoder with long skip connections
transformer encoder (post-LN, BERT-like) or decoder (pre-LN, GPT-like) stacks
seq2seq     LSTM encoder + LSTM decoder with Luong attention, unrolled (nmt)
rnn         ENAS recurrent cells unrolled over timesteps (ptb)
enas_cnn    ENAS micro cells of random ops with random cell inputs (cifar10)
random_dag  random layered DAGs with a realistic op mix
========== =================================================================

``python -m travorder.datasets.synthetic --out DIR`` regenerates the bundled synthetic
set (:data:`SYNTHETIC_SET`) into a corpus directory (see :mod:`travorder.datasets.corpus`).

How the costs compare with real graphs
--------------------------------------
Per-node FLOPs and output bytes of :data:`SYNTHETIC_SET` (built at batch size 1, the
zoo's default) against ten real models built by
:func:`travorder.datasets.zoo.export_graph` (training-mode forward, batch 1, sequence
128): torchvision resnet50, densenet121, googlenet, mobilenet_v2, efficientnet_b0,
vgg16 and vit_b_16, and HuggingFace bert_base, gpt2 and t5_small. log10 quantiles
10/50/90 %, FLOPs over the nodes with FLOPs > 0:

======================= ====== ================= ================= ==========
group                   nodes  FLOPs / node      bytes / node      0-FLOP ops
======================= ====== ================= ================= ==========
real CNNs (6)            1330  3.97  5.30  7.61  3.66  5.30  6.21  7 %
synthetic CNN families  13843  4.09  5.29  7.85  4.31  5.29  6.32  8 %
real transformers (4)    2081  4.21  5.59  8.43  5.42  5.59  6.20  41 %
synthetic transformer    3533  4.82  5.90  8.48  5.42  5.90  6.50  33 %
======================= ====== ================= ================= ==========

The CNN families (chain, inception, resnet, densenet, unet, enas_cnn, random_dag) match
closely: two-sample Kolmogorov-Smirnov statistic 0.05 on log FLOPs and 0.10 on log
bytes, and a similar op mix (Conv 24 % vs 28 %, BatchNormalization 20 % vs 25 %, Relu
22 % vs 18 %). The synthetic transformers (KS 0.17) sit 0.3 decades higher at the
median, their widths and sequence lengths being drawn up to 1024 and 256, and carry
fewer zero-FLOP view ops than exported HuggingFace models. ``rnn`` and ``seq2seq`` have
no counterpart among exported models (torch writes an LSTM as one op); at batch 1 their
gate ops are small (median 4e3 FLOPs, 8 kB), like
:func:`travorder.datasets.onnx_examples.rnn_unrolled` at hidden size 512. All costs
but the weights scale linearly with ``batch_size``.

>>> g = resnet(seed=0, blocks=(1, 1), bottleneck=False, image_size=32)
>>> g.meta["family"], g.meta["source"], g.n_nodes
('resnet', 'synthetic:resnet', 22)
>>> resnet(seed=0, blocks=(1, 1), bottleneck=False, image_size=32) == g
True
"""

from __future__ import annotations

import argparse
import functools
import inspect
import math
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, get_args, get_type_hints

import numpy as np

from travorder.datasets.corpus import (
    DEFAULT_MAX_NODES,
    MANIFEST_NAME,
    add_to_corpus,
    remove_from_corpus,
)
from travorder.datasets.zoo import DEFAULT_BATCH_SIZE
from travorder.errors import TravorderError
from travorder.graph.opgraph import OpGraph

BUILDER = "travorder.datasets.synthetic"
#: Version of the generators; bump it whenever a generator's output changes.
BUILDER_VERSION = 1
#: The largest size parameter a generator takes, and the most ops it builds: a mistyped
#: size fails at once with a clear error instead of building for minutes.
MAX_SIZE = MAX_OPS = 100_000

_ITEMSIZE = 4  # float32
_Shape = tuple[int, ...]
# FLOPs per output element, as travorder.graph.onnx_flops counts them
_PER_ELEMENT = {"Relu": 1, "Add": 1, "Sub": 1, "Mul": 1, "Div": 1, "Sigmoid": 4, "Tanh": 4,
                "Gelu": 8, "Softmax": 5, "BatchNormalization": 2, "LayerNormalization": 5}


def _numel(shape: _Shape) -> int:
    return math.prod(shape)


class _Net:
    """Collects ops with output shapes and costs; names are scoped like exporters' names.

    A tensor is referred to by an int: an op's index, or a negative id for a graph input
    (graph inputs are tensors, not ops, as in an ONNX import).
    """

    def __init__(self, family: str, seed: int, batch_size: int) -> None:
        self.family, self.seed, self.batch = family, seed, int(batch_size)
        self.rng = np.random.default_rng(seed)
        self.records: list[dict[str, Any]] = []
        self.shapes: dict[int, _Shape] = {}
        self.edges: list[tuple[int, int, float]] = []
        self._send: list[float] = []  # bytes each consumer of an op receives
        self._prefix: list[str] = []
        self._used: dict[str, int] = {}
        self._shared: set[str] = set()

    # ------------------------------------------------------------ plumbing
    @contextmanager
    def scope(self, name: str) -> Iterator[None]:
        self._prefix.append(name)
        try:
            yield
        finally:
            self._prefix.pop()

    def input(self, shape: _Shape) -> int:
        tid = -1 - sum(1 for t in self.shapes if t < 0)
        self.shapes[tid] = shape
        return tid

    def weight(self, n_values: int, shared: str | None = None) -> float:
        """Bytes of a weight; a ``shared`` weight counts only on its first use."""
        if shared is not None:
            if shared in self._shared:
                return 0.0
            self._shared.add(shared)
        return float(n_values * _ITEMSIZE)

    def op(self, op_type: str, inputs: Sequence[int], shape: _Shape, flops: float = 0.0,
           params: float = 0.0, name: str | None = None, send: float | None = None) -> int:
        base = "/".join([*self._prefix, name or op_type])
        k = self._used.get(base, 0)
        self._used[base] = k + 1
        i = len(self.records)
        if i == MAX_OPS:
            raise TravorderError(f"this {self.family} graph grows past {MAX_OPS:,} ops: "
                                 f"lower its size parameters")
        out = float(_numel(shape) * _ITEMSIZE)
        self.records.append({"name": base if k == 0 else f"{base}_{k}", "op_type": op_type,
                             "flops": float(flops), "output_bytes": out,
                             "param_bytes": float(params)})
        self.shapes[i] = tuple(int(s) for s in shape)
        self._send.append(out if send is None else float(send))
        for j in dict.fromkeys(inputs):  # an op reading one tensor twice has one edge
            if j >= 0:
                self.edges.append((j, i, self._send[j]))
        return i

    def graph(self, name: str | None) -> OpGraph:
        names = [r["name"] for r in self.records]
        return OpGraph.from_records(
            self.records, [(names[s], names[d], b) for s, d, b in self.edges],
            name=name or f"syn_{self.family}_n{len(names)}_s{self.seed}",
            family=self.family, source=f"synthetic:{self.family}", batch_size=self.batch,
            dtype="float32", builder=BUILDER,
            builder_version=BUILDER_VERSION, seed=self.seed,
        )

    def draw(self, value: Any, choices: Sequence[Any], what: str = "") -> Any:
        """``value`` if given (checked against ``choices`` when ``what`` names it),
        otherwise one of ``choices`` drawn from the seed."""
        if value is None:
            return choices[int(self.rng.integers(len(choices)))]
        if what and value not in choices:
            raise TravorderError(f"{what} must be one of {', '.join(map(str, choices))}; "
                                 f"got {value!r}")
        return value

    def image(self, image_size: int | None, sizes: Sequence[int], channels: int = 3) -> int:
        s = self.draw(image_size, sizes)
        return self.input((self.batch, channels, s, s))

    # ------------------------------------------------------------ CNN layers (NCHW)
    def conv(self, x: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1,
             bias: bool = False, name: str | None = None) -> int:
        n, cin, h, w = self.shapes[x]
        shape = (n, cout, -(-h // stride), -(-w // stride))
        weights = cout * (cin // groups) * k * k + (cout if bias else 0)
        flops = _numel(shape) * (2 * (cin // groups) * k * k + bias)
        return self.op("Conv", [x], shape, flops, self.weight(weights), name)

    def deconv(self, x: int, cout: int) -> int:
        """A 2x2 stride-2 ConvTranspose: doubles the spatial size."""
        n, cin, h, w = self.shapes[x]
        shape = (n, cout, 2 * h, 2 * w)
        return self.op("ConvTranspose", [x], shape,
                       2 * _numel(self.shapes[x]) * cout * 4 + _numel(shape),
                       self.weight(cin * cout * 4 + cout))

    def bn(self, x: int) -> int:
        shape = self.shapes[x]
        return self.op("BatchNormalization", [x], shape,
                       _PER_ELEMENT["BatchNormalization"] * _numel(shape),
                       self.weight(4 * shape[1]))

    def act(self, x: int, op_type: str = "Relu") -> int:
        return self.eltwise(op_type, [x])

    def conv_bn(self, x: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1) -> int:
        """Conv (no bias) then BatchNormalization."""
        return self.bn(self.conv(x, cout, k, stride, groups))

    def cbr(self, x: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1) -> int:
        """Conv, BatchNormalization, Relu."""
        return self.act(self.conv_bn(x, cout, k, stride, groups))

    def pool(self, x: int, k: int = 3, stride: int = 2, op_type: str = "MaxPool") -> int:
        n, c, h, w = self.shapes[x]
        shape = (n, c, -(-h // stride), -(-w // stride))
        return self.op(op_type, [x], shape, _numel(shape) * k * k)

    def classifier(self, x: int, n_classes: int = 1000) -> int:
        """GlobalAveragePool, Flatten, Gemm: the usual CNN head."""
        n, c = self.shapes[x][:2]
        x = self.op("GlobalAveragePool", [x], (n, c, 1, 1), _numel(self.shapes[x]))
        return self.gemm(self.op("Flatten", [x], (n, c)), n_classes)

    # ------------------------------------------------------------ generic layers
    def eltwise(self, op_type: str, inputs: Sequence[int], shape: _Shape | None = None) -> int:
        shape = shape or max((self.shapes[i] for i in inputs), key=_numel)
        return self.op(op_type, inputs, shape, _PER_ELEMENT[op_type] * _numel(shape))

    def concat(self, inputs: Sequence[int], axis: int = 1) -> int:
        shape = list(self.shapes[inputs[0]])
        shape[axis] = sum(self.shapes[i][axis] for i in inputs)
        return self.op("Concat", inputs, tuple(shape))

    def reshape(self, x: int, shape: _Shape) -> int:
        return self.op("Reshape", [x], shape)

    def gemm(self, x: int, n_out: int, shared: str | None = None) -> int:
        """A 2-D fully connected layer with bias (``Gemm``)."""
        n, k = self.shapes[x]
        return self.op("Gemm", [x], (n, n_out), (2 * k + 1) * n * n_out,
                       self.weight(k * n_out + n_out, shared))

    def linear(self, x: int, n_out: int, bias: bool = True, shared: str | None = None) -> int:
        """``x @ W (+ b)`` over the last axis: MatMul then Add, as exporters emit it."""
        shape = (*self.shapes[x][:-1], n_out)
        k = self.shapes[x][-1]
        y = self.op("MatMul", [x], shape, 2 * _numel(shape) * k, self.weight(k * n_out, shared))
        if bias:
            y = self.op("Add", [y], shape, _numel(shape),
                        self.weight(n_out, shared and shared + "/bias"))
        return y

    def matmul(self, a: int, b: int, shape: _Shape, k: int) -> int:
        """Activation-by-activation MatMul giving ``shape``, inner dimension ``k``."""
        return self.op("MatMul", [a, b], shape, 2 * _numel(shape) * k)

    def layernorm(self, x: int) -> int:
        shape = self.shapes[x]
        return self.op("LayerNormalization", [x], shape,
                       _PER_ELEMENT["LayerNormalization"] * _numel(shape),
                       self.weight(2 * shape[-1]))

    def dropout(self, x: int) -> int:
        return self.op("Dropout", [x], self.shapes[x])

    def softmax(self, x: int) -> int:
        return self.eltwise("Softmax", [x])

    def embedding(self, ids: int, vocab: int, dim: int, shared: str | None = None) -> int:
        shape = (*self.shapes[ids], dim)
        return self.op("Gather", [ids], shape, 0.0, self.weight(vocab * dim, shared))

    def split(self, x: int, parts: int) -> int:
        """One Split op; each consumer receives one of the ``parts`` equal slices."""
        shape = self.shapes[x]
        return self.op("Split", [x], shape, 0.0, send=_numel(shape) * _ITEMSIZE / parts)


def _family(generator: Callable[..., OpGraph]) -> Callable[..., OpGraph]:
    """``generator`` with its arguments checked against their annotations: sizes are
    integers in [1, :data:`MAX_SIZE`] (``blocks`` a non-empty list of them), the seed a
    non-negative integer, flags booleans and names strings; ``None`` draws a value."""
    signature = inspect.signature(generator)
    hints = get_type_hints(generator)

    @functools.wraps(generator)
    def checked(*args: Any, **kwargs: Any) -> OpGraph:
        for key, value in signature.bind(*args, **kwargs).arguments.items():
            _check_argument(key, value, hints[key])
        return generator(*args, **kwargs)

    return checked


def _check_argument(key: str, value: Any, hint: Any) -> None:
    def is_int(v: Any, low: int = 1, high: float = MAX_SIZE) -> bool:
        return isinstance(v, (int, np.integer)) and not isinstance(v, bool) and low <= v <= high

    if value is None and type(None) in get_args(hint):
        return
    if key == "seed":
        ok, what = is_int(value, 0, math.inf), "a non-negative integer"
    elif hint in (int, int | None):
        ok, what = is_int(value), f"an integer from 1 to {MAX_SIZE:,}"
    elif hint == Sequence[int]:
        ok = isinstance(value, (list, tuple)) and len(value) > 0 and all(map(is_int, value))
        what = f"a non-empty list of integers from 1 to {MAX_SIZE:,}"
    elif hint == bool | None:
        ok, what = isinstance(value, (bool, np.bool_)), "true or false"
    else:
        ok, what = isinstance(value, str), "a string"
    if not ok:
        raise TravorderError(f"{key} must be {what}, got {value!r}")


def _widths(net: _Net, total: int, parts: int, low: int = 16) -> list[int]:
    """Split ``total`` channels into ``parts`` random widths, multiples of 8, at least ``low``."""
    share = net.rng.dirichlet(np.full(parts, 2.0))
    return [max(low, round(total * f / 8) * 8) for f in share]


# ============================================================== families
@_family
def chain(seed: int = 0, *, n_layers: int = 16, kind: str | None = None,
          width: int | None = None, image_size: int | None = None, batch_size: int = 32,
          name: str | None = None) -> OpGraph:
    """A layered chain: a VGG-style conv stack (``kind="conv"``) or an MLP (``"mlp"``).

    ``n_layers`` layers of Conv(+BatchNormalization)+Relu with max pooling between stages,
    or of Gemm+Relu; then a classifier.
    """
    net = _Net("chain", seed, batch_size)
    kind = net.draw(kind, ("conv", "mlp"), "kind")
    if kind == "conv":
        x = net.image(image_size, (32, 64, 128, 224))
        c = net.draw(width, (32, 48, 64))
        n_pools = min(5, int(math.log2(net.shapes[x][2])) - 2, n_layers - 1)
        pool_after = set(np.linspace(0, n_layers, n_pools + 2)[1:-1].astype(int).tolist())
        for i in range(n_layers):
            with net.scope(f"features{i}"):
                x = net.cbr(x, c)
                if i + 1 in pool_after:
                    x = net.pool(x, 2, 2)
                    c = min(2 * c, 512)
        net.classifier(x)
    else:
        x = net.input((net.batch, int(net.draw(None, (256, 512, 784, 1024, 3072)))))
        hidden = net.draw(width, (256, 512, 1024, 2048, 4096))
        for i in range(n_layers):
            with net.scope(f"fc{i}"):
                x = net.act(net.gemm(x, hidden))
        net.softmax(net.gemm(x, 1000))
    return net.graph(name)


@_family
def inception(seed: int = 0, *, n_modules: int = 9, width: int | None = None,
              image_size: int | None = None, batch_size: int = 32,
              name: str | None = None) -> OpGraph:
    """Inception-style: a stem, then ``n_modules`` modules of 3-5 parallel branches
    (1x1 conv; 1x1 then one or two 3x3/5x5 convs; pooling then 1x1) joined by Concat,
    with reduction modules (strided branches) at one and two thirds."""
    net = _Net("inception", seed, batch_size)
    x = net.image(image_size, (96, 128, 160, 224, 299))
    c = net.draw(width, (32, 48, 64))
    with net.scope("stem"):
        x = net.pool(net.cbr(x, c, 7, 2), 3, 2)
        x = net.pool(net.cbr(net.cbr(x, c, 1), 3 * c), 3, 2)
    out_c = 4 * c
    reduce_at = {n_modules // 3, 2 * n_modules // 3} - {0}
    for m in range(n_modules):
        with net.scope(f"mixed{m}"):
            reduce = m in reduce_at and net.shapes[x][2] > 4
            if reduce:
                out_c = min(2 * out_c, 2048)
            n_conv = int(net.rng.integers(2, 4 if reduce else 5))
            widths = _widths(net, out_c, n_conv + 1)
            branches = []
            for b in range(n_conv):
                with net.scope(f"branch{b}"):
                    y = net.cbr(x, widths[b] if b == 0 else widths[b] // 2, 1,
                                2 if reduce and b == 0 else 1)
                    for j in range(min(b, 2)):
                        k = int(net.draw(None, (3, 5)))
                        y = net.cbr(y, widths[b], k, 2 if reduce and j == min(b, 2) - 1 else 1)
                branches.append(y)
            with net.scope("branch_pool"):
                y = net.pool(x, 3, 2 if reduce else 1, "MaxPool" if reduce else "AveragePool")
                branches.append(y if reduce else net.cbr(y, widths[-1], 1))
            x = net.concat(branches)
    net.classifier(x)
    return net.graph(name)


@_family
def resnet(seed: int = 0, *, blocks: Sequence[int] = (2, 2, 2, 2), bottleneck: bool | None = None,
           width: int | None = None, image_size: int | None = None, batch_size: int = 32,
           name: str | None = None) -> OpGraph:
    """ResNet-style: a stem, then one stage per entry of ``blocks`` (that many residual
    blocks, basic or bottleneck), each stage halving the resolution; a projection
    (1x1 conv) on the skip path where the shape changes."""
    net = _Net("resnet", seed, batch_size)
    x = net.image(image_size, (32, 64, 128, 224))
    bottleneck = net.draw(bottleneck, (False, True), "bottleneck")
    c = net.draw(width, (32, 64, 96))
    big = net.shapes[x][2] >= 128
    x = net.cbr(x, c, 7 if big else 3, 2 if big else 1)
    if big:
        x = net.pool(x, 3, 2)
    in_c = c
    for stage, n_blocks in enumerate(blocks):
        for b in range(n_blocks):
            stride = 2 if stage > 0 and b == 0 else 1
            out_c = 4 * c if bottleneck else c
            with net.scope(f"layer{stage + 1}/{b}"):
                if bottleneck:
                    y = net.cbr(net.cbr(x, c, 1), c, 3, stride)
                    y = net.conv_bn(y, out_c, 1)
                else:
                    y = net.conv_bn(net.cbr(x, c, 3, stride), c, 3)
                skip = x
                if stride != 1 or in_c != out_c:
                    with net.scope("downsample"):
                        skip = net.conv_bn(x, out_c, 1, stride)
                x = net.act(net.eltwise("Add", [y, skip]))
            in_c = out_c
        c *= 2
    net.classifier(x)
    return net.graph(name)


@_family
def densenet(seed: int = 0, *, blocks: Sequence[int] = (6, 12, 24, 16),
             growth_rate: int | None = None, image_size: int | None = None,
             batch_size: int = 32, name: str | None = None) -> OpGraph:
    """DenseNet-style: dense blocks whose every layer reads the Concat of the block input
    and all earlier layers' outputs (BN-Relu-1x1 conv-BN-Relu-3x3 conv), with transition
    layers (BN-Relu-1x1 conv-AveragePool) between blocks."""
    net = _Net("densenet", seed, batch_size)
    x = net.image(image_size, (32, 64, 128, 224))
    k = net.draw(growth_rate, (12, 24, 32, 48))
    with net.scope("features"):
        x = net.pool(net.cbr(x, 2 * k, 7, 2), 3, 2)
        for bi, n_layers in enumerate(blocks):
            feats = [x]
            for li in range(n_layers):
                with net.scope(f"denseblock{bi + 1}/denselayer{li + 1}"):
                    y = net.concat(feats) if len(feats) > 1 else x
                    y = net.cbr(net.act(net.bn(y)), 4 * k, 1)
                    feats.append(net.conv(y, k, 3))
            x = net.concat(feats)
            if bi < len(blocks) - 1:
                with net.scope(f"transition{bi + 1}"):
                    x = net.conv(net.act(net.bn(x)), net.shapes[x][1] // 2, 1)
                    x = net.pool(x, 2, 2, "AveragePool")
        x = net.act(net.bn(x))
    net.classifier(x)
    return net.graph(name)


@_family
def unet(seed: int = 0, *, depth: int = 4, convs_per_level: int = 2,
         base_channels: int | None = None, image_size: int | None = None,
         batch_size: int = 8, name: str | None = None) -> OpGraph:
    """U-Net: ``depth`` encoder levels (convs then MaxPool), a bottleneck, and ``depth``
    decoder levels (ConvTranspose, Concat with the encoder level's output: the long
    skips, convs), then a 1x1 conv per class."""
    net = _Net("unet", seed, batch_size)
    x = net.image(image_size, (128, 192, 256, 384, 512))
    if net.shapes[x][2] % 2**depth:
        raise TravorderError(f"image_size must be a multiple of 2**depth (image_size "
                             f"{net.shapes[x][2]}, depth {depth})")
    c = net.draw(base_channels, (16, 32, 64))

    def convs(y: int, ch: int) -> int:
        for _ in range(convs_per_level):
            y = net.cbr(y, ch)
        return y

    skips = []
    for d in range(depth):
        with net.scope(f"down{d + 1}"):
            x = convs(x, c * 2**d)
            skips.append(x)
            x = net.pool(x, 2, 2)
    with net.scope("bottleneck"):
        x = convs(x, c * 2**depth)
    for d in reversed(range(depth)):
        with net.scope(f"up{d + 1}"):
            x = convs(net.concat([skips[d], net.deconv(x, c * 2**d)]), c * 2**d)
    net.conv(x, int(net.draw(None, (1, 2, 4, 21))), 1, bias=True, name="head")
    return net.graph(name)


@_family
def transformer(seed: int = 0, *, n_layers: int = 6, kind: str | None = None,
                d_model: int | None = None, seq_len: int | None = None,
                batch_size: int = 8, name: str | None = None) -> OpGraph:
    """A transformer stack as exported to ONNX: per layer Q/K/V projections with
    Reshape/Transpose into heads, scaled masked attention, output projection, a GELU MLP,
    residual Adds, LayerNormalization and Dropout (embeddings, attention probabilities,
    both residual branches). ``kind="encoder"`` is post-LN with a pooler (BERT-like),
    ``"decoder"`` pre-LN with a causal mask and an LM head (GPT-like)."""
    net = _Net("transformer", seed, batch_size)
    kind = net.draw(kind, ("encoder", "decoder"), "kind")
    d = net.draw(d_model, (256, 384, 512, 768, 1024))
    t = net.draw(seq_len, (64, 128, 256))
    heads = max(1, d // 64)
    dh, b = d // heads, net.batch
    vocab = int(net.draw(None, (8000, 30522, 32000, 50257)))
    ids = net.input((b, t))
    with net.scope("embeddings"):
        x = net.embedding(ids, vocab, d)
        x = net.op("Add", [x], (b, t, d), b * t * d, net.weight(t * d), "position")
        if kind == "encoder":
            x = net.layernorm(x)
        x = net.dropout(x)
    with net.scope("mask"):  # built once, read by every layer
        m = net.op("Unsqueeze", [], (b, 1, 1, t))
        mask = net.eltwise("Mul", [net.eltwise("Sub", [m])])

    def heads_of(y: int, last: str) -> int:
        y = net.reshape(y, (b, t, heads, dh))
        return net.op("Transpose", [y], (b, heads, dh, t) if last == "t" else (b, heads, t, dh))

    for i in range(n_layers):
        with net.scope(f"layer{i}"):
            h = net.layernorm(x) if kind == "decoder" else x
            with net.scope("attention"):
                q, k, v = (heads_of(net.linear(h, d), "t" if j == 1 else "d")
                           for j in range(3))
                s = net.matmul(q, k, (b, heads, t, t), dh)
                s = net.softmax(net.eltwise("Add", [net.eltwise("Div", [s]), mask]))
                o = net.matmul(net.dropout(s), v, (b, heads, t, dh), t)
                o = net.reshape(net.op("Transpose", [o], (b, t, heads, dh)), (b, t, d))
                x = net.eltwise("Add", [net.dropout(net.linear(o, d)), x])
            if kind == "encoder":
                x = net.layernorm(x)
            with net.scope("mlp"):
                h = net.layernorm(x) if kind == "decoder" else x
                h = net.linear(net.act(net.linear(h, 4 * d), "Gelu"), d)
                x = net.eltwise("Add", [net.dropout(h), x])
            if kind == "encoder":
                x = net.layernorm(x)
    with net.scope("head"):
        if kind == "encoder":
            cls = net.op("Gather", [x], (b, d))
            net.act(net.gemm(cls, d), "Tanh")
        else:
            net.linear(net.layernorm(x), vocab, bias=False)
    return net.graph(name)


def _lstm_cell(net: _Net, inputs: Sequence[int], c: int | None, hidden: int,
               weights: str) -> tuple[int, int]:
    """One LSTM step split into gate ops, as TensorFlow graphs show it; returns (h, c)."""
    z = net.concat(inputs) if len(inputs) > 1 else inputs[0]
    z = net.split(net.linear(z, 4 * hidden, shared=weights), 4)
    i, f, o = (net.act(z, "Sigmoid") for _ in range(3))
    g = net.act(z, "Tanh")
    c_new = net.eltwise("Mul", [i, g])
    if c is not None:
        c_new = net.eltwise("Add", [net.eltwise("Mul", [f, c]), c_new])
    h = net.eltwise("Mul", [o, net.act(c_new, "Tanh")])
    return h, c_new


@_family
def seq2seq(seed: int = 0, *, src_len: int = 20, tgt_len: int = 20, n_layers: int = 2,
            hidden: int | None = None, batch_size: int = 64,
            name: str | None = None) -> OpGraph:
    """An NMT encoder-decoder unrolled over time: a stacked LSTM encoder over ``src_len``
    steps, a stacked LSTM decoder over ``tgt_len`` steps with Luong attention over all
    encoder outputs (input feeding) and a vocabulary projection per step."""
    net = _Net("seq2seq", seed, batch_size)
    hd = net.draw(hidden, (256, 512, 1024))
    b = net.batch
    vocab = int(net.draw(None, (8000, 16000, 32000)))
    ids = net.input((b,))
    hs: list[int | None] = [None] * n_layers
    cs: list[int | None] = [None] * n_layers
    outputs = []
    for s in range(src_len):
        with net.scope(f"encoder/t{s}"):
            x = net.embedding(ids, vocab, hd, shared="enc_emb")
            for layer in range(n_layers):
                with net.scope(f"cell{layer}"):
                    ins = [x] if hs[layer] is None else [x, hs[layer]]
                    hs[layer], cs[layer] = _lstm_cell(net, ins, cs[layer], hd, f"enc{layer}")
                x = hs[layer]
            outputs.append(x)
    with net.scope("attention"):
        memory = net.reshape(net.concat(outputs), (b, src_len, hd))
        keys = net.linear(memory, hd, bias=False)
    att = None
    for s in range(tgt_len):
        with net.scope(f"decoder/t{s}"):
            x = net.embedding(ids, vocab, hd, shared="dec_emb")
            if att is not None:
                x = net.concat([x, att])
            for layer in range(n_layers):
                with net.scope(f"cell{layer}"):
                    hs[layer], cs[layer] = _lstm_cell(net, [x, hs[layer]], cs[layer], hd,
                                                      f"dec{layer}")
                x = hs[layer]
            with net.scope("attention"):
                a = net.softmax(net.matmul(x, keys, (b, src_len), hd))
                ctx = net.matmul(a, memory, (b, hd), src_len)
                att = net.act(net.linear(net.concat([ctx, x]), hd, bias=False,
                                         shared="att_w"), "Tanh")
            net.linear(att, vocab, shared="proj")
    return net.graph(name)


_RNN_ACTS = ("Tanh", "Relu", "Sigmoid", "Identity")


@_family
def rnn(seed: int = 0, *, timesteps: int = 20, cell_nodes: int = 8, hidden: int | None = None,
        batch_size: int = 64, name: str | None = None) -> OpGraph:
    """ENAS recurrent cells (PTB language model) unrolled over ``timesteps``.

    One random cell per graph, shared by all steps: node 0 mixes the input and the previous
    state; node ``j`` picks an earlier node and an activation and computes a highway update
    ``c*f(W h) + (1-c)*h``; the cell output is the mean of the nodes nothing reads. Deep and
    narrow: the steps form a long chain.
    """
    net = _Net("rnn", seed, batch_size)
    hd = net.draw(hidden, (200, 400, 650, 1000))
    b = net.batch
    vocab = 10000
    parents = [int(net.rng.integers(j)) for j in range(1, cell_nodes)]
    acts = [_RNN_ACTS[int(i)] for i in net.rng.integers(len(_RNN_ACTS), size=cell_nodes)]
    loose = sorted(set(range(cell_nodes)) - set(parents))
    ids = net.input((b,))
    h_prev = None
    outputs = []
    for s in range(timesteps):
        with net.scope(f"t{s}"):
            x = net.embedding(ids, vocab, hd, shared="emb")
            nodes = []
            for j in range(cell_nodes):
                with net.scope(f"node{j}"):
                    if j == 0:
                        src = [x] if h_prev is None else [x, h_prev]
                        z = net.concat(src) if len(src) > 1 else x
                        prev = h_prev
                    else:
                        z = prev = nodes[parents[j - 1]]
                    z = net.split(net.linear(z, 2 * hd, bias=False, shared=f"w{j}"), 2)
                    c = net.act(z, "Sigmoid")
                    h = z if acts[j] == "Identity" else net.act(z, acts[j])
                    h = net.eltwise("Mul", [c, h], (b, hd))
                    if prev is not None:
                        keep = net.eltwise("Mul", [net.eltwise("Sub", [c]), prev])
                        h = net.eltwise("Add", [h, keep])
                    nodes.append(h)
            with net.scope("out"):
                h_prev = net.op("ReduceMean", [net.concat([nodes[j] for j in loose])], (b, hd),
                                len(loose) * b * hd)
            outputs.append(h_prev)
    with net.scope("decoder"):
        y = net.reshape(net.concat(outputs), (timesteps * b, hd))
        net.softmax(net.gemm(y, vocab))
    return net.graph(name)


_ENAS_OPS = ("sep3", "sep5", "avg3", "max3", "identity")


@_family
def enas_cnn(seed: int = 0, *, n_cells: int = 8, cell_nodes: int = 5,
             channels: int | None = None, image_size: int | None = None,
             batch_size: int = 32, name: str | None = None) -> OpGraph:
    """ENAS micro-search CNNs (CIFAR-10): ``n_cells`` cells, reduction cells at one and two
    thirds. Each cell reads the previous cell's output and a random earlier cell's
    output (calibrated by Relu-1x1 conv-BN, strided across resolutions); each of its
    ``cell_nodes`` nodes adds two random ops (separable 3x3/5x5 conv, 3x3 avg/max pool,
    identity) on two random earlier tensors; unused nodes are concatenated."""
    net = _Net("enas_cnn", seed, batch_size)
    x = net.image(image_size, (32, 32, 64))
    c = net.draw(channels, (20, 32, 36, 48))
    with net.scope("stem"):
        x = net.conv_bn(x, 3 * c, 3)
    cells = [x]
    reduce_at = {n_cells // 3, 2 * n_cells // 3} - {0}
    for ci in range(n_cells):
        reduce = ci in reduce_at
        if reduce:
            c *= 2
        with net.scope(f"cell{ci}"):
            other = cells[int(net.rng.integers(len(cells) - 1))] if len(cells) > 1 else x
            size = -(-net.shapes[cells[-1]][2] // (2 if reduce else 1))
            inputs = []
            for j, y in enumerate((cells[-1], other)):
                with net.scope(f"calibrate{j}"):
                    stride = net.shapes[y][2] // size
                    inputs.append(net.conv_bn(net.act(y), c, 1, stride))
            used: set[int] = set()
            for n in range(cell_nodes):
                with net.scope(f"node{n}"):
                    picks = net.rng.integers(len(inputs), size=2)
                    ops = net.rng.integers(len(_ENAS_OPS), size=2)
                    branches = []
                    for p, o in zip(picks.tolist(), ops.tolist(), strict=True):
                        used.add(p)
                        y = inputs[p]
                        kind = _ENAS_OPS[o]
                        if kind.startswith("sep"):
                            k = int(kind[3])
                            y = net.conv(net.act(y), c, k, groups=c)
                            y = net.conv_bn(y, c, 1)
                        elif kind != "identity":
                            y = net.pool(y, 3, 1, "AveragePool" if kind == "avg3" else "MaxPool")
                        branches.append(y)
                    inputs.append(net.eltwise("Add", branches))
            loose = [inputs[i] for i in range(2, len(inputs)) if i not in used]
            x = net.concat(loose) if len(loose) > 1 else loose[0]
        cells.append(x)
    net.classifier(net.act(x), 10)
    return net.graph(name)


@_family
def random_dag(seed: int = 0, *, n_nodes: int = 100, n_layers: int | None = None,
               max_in_degree: int = 3, batch_size: int = 32,
               name: str | None = None) -> OpGraph:
    """A random layered DAG of CNN ops: one source, ``n_layers`` layers (default about
    ``sqrt(n_nodes)``, drawn), each node reads a node of the previous layer and up to
    ``max_in_degree - 1`` more from any earlier layer; every node but the last layer's
    feeds a later one. Op types follow the in-degree (Add/Concat/Mul to join, else Conv,
    BatchNormalization, Relu, pooling...); resolution shrinks and channels grow with depth.
    ``max_in_degree`` is at most 64: each node draws its extra inputs among all earlier
    nodes, which at thousands of inputs per node takes minutes."""
    if max_in_degree > 64:
        raise TravorderError(f"max_in_degree must be at most 64, got {max_in_degree}")
    net = _Net("random_dag", seed, batch_size)
    rng = net.rng
    if n_layers is None:
        n_layers = max(2, round(math.sqrt(n_nodes) * rng.uniform(0.6, 1.6)))
    n_layers = min(n_layers, n_nodes)
    # layer 0 is node 0 alone; the other nodes are cut into n_layers - 1 layers
    cuts = rng.choice(np.arange(2, n_nodes), max(0, n_layers - 2), replace=False)
    ends = np.sort(np.array([1, *cuts.tolist(), n_nodes]))  # layer l ends before ends[l]
    starts = np.concatenate([[0], ends[:-1]])
    layer_of = np.searchsorted(ends, np.arange(n_nodes), side="right")
    size0 = int(net.draw(None, (32, 64, 128, 224)))
    c0 = int(net.draw(None, (16, 32, 64)))
    preds: list[list[int]] = [[] for _ in range(n_nodes)]
    for v in range(1, n_nodes):
        lv = int(layer_of[v])
        first = int(rng.integers(starts[lv - 1], ends[lv - 1]))
        extra = rng.choice(int(starts[lv]), min(int(starts[lv]), max_in_degree - 1),
                           replace=False)
        preds[v] = [first, *(int(u) for u in extra if u != first and rng.random() < 0.3)]
    has_succ = np.zeros(n_nodes, dtype=bool)
    for p in preds:
        has_succ[p] = True
    last = int(layer_of.max())
    for u in np.flatnonzero(~has_succ & (layer_of < last)).tolist():
        preds[int(rng.integers(ends[layer_of[u]], n_nodes))].append(u)
    single = ("Conv", "Conv", "Conv", "BatchNormalization", "Relu", "Relu", "Sigmoid",
              "MaxPool", "AveragePool")
    joins = ("Add", "Add", "Concat", "Mul")
    image = net.image(size0, (size0,))
    ids: list[int] = []
    for v in range(n_nodes):
        depth = layer_of[v] / max(1, last)
        size = max(7, int(size0 / 2 ** round(4 * depth)))
        ch = c0 * 2 ** round(3 * depth)
        ins = [ids[u] for u in sorted(preds[v])]
        with net.scope(f"layer{layer_of[v]}"):
            if v == 0:
                tid = net.conv(image, ch, 3)
            elif len(ins) > 1:
                op = joins[int(rng.integers(len(joins)))]
                shape = (net.batch, ch, size, size)
                tid = net.concat(ins) if op == "Concat" else net.eltwise(op, ins, shape)
            else:
                op = single[int(rng.integers(len(single)))]
                x = ins[0]
                if op == "Conv":
                    stride = max(1, net.shapes[x][2] // size)
                    tid = net.conv(x, ch, int(net.draw(None, (1, 3, 3, 5))), stride)
                elif op == "BatchNormalization":
                    tid = net.bn(x)
                elif op.endswith("Pool"):
                    tid = net.pool(x, 3, 1, op)
                else:
                    tid = net.act(x, op)
        ids.append(tid)
    return net.graph(name)


SYNTHETIC_FAMILIES: dict[str, Callable[..., OpGraph]] = {
    "chain": chain,
    "inception": inception,
    "resnet": resnet,
    "densenet": densenet,
    "unet": unet,
    "transformer": transformer,
    "seq2seq": seq2seq,
    "rnn": rnn,
    "enas_cnn": enas_cnn,
    "random_dag": random_dag,
}


#: The bundled synthetic set: per family, the size parameters of each graph.
SYNTHETIC_SET: dict[str, tuple[dict[str, Any], ...]] = {
    "chain": tuple({"n_layers": n, "kind": k} for n, k in [
        (14, "mlp"), (10, "conv"), (20, "mlp"), (24, "conv"), (40, "conv"), (64, "mlp"),
        (90, "conv"), (150, "conv")]),
    "inception": tuple({"n_modules": n} for n in (2, 3, 5, 7, 9, 12, 16, 22)),
    "resnet": tuple({"blocks": b, "bottleneck": bn} for b, bn in [
        ((1, 1), False), ((2, 2), True), ((1, 1, 1, 1), False), ((2, 2, 2, 2), False),
        ((3, 4, 6, 3), False), ((3, 4, 6, 3), True), ((3, 4, 23, 3), True),
        ((3, 8, 36, 3), True)]),
    "densenet": tuple({"blocks": b} for b in [
        (2, 2), (3, 3, 3), (4, 4, 4), (6, 12), (4, 8, 16, 12), (6, 12, 24, 16),
        (6, 12, 32, 32), (6, 12, 48, 32)]),
    "unet": tuple({"depth": d, "convs_per_level": c} for d, c in [
        (2, 2), (3, 2), (4, 2), (4, 3), (5, 2), (5, 3), (6, 2), (6, 4)]),
    "transformer": tuple({"n_layers": n} for n in (1, 2, 4, 6, 8, 12, 24, 48)),
    "seq2seq": tuple({"src_len": s, "tgt_len": t, "n_layers": n} for s, t, n in [
        (5, 5, 1), (8, 6, 1), (10, 10, 2), (15, 12, 2), (20, 20, 2), (25, 20, 2),
        (30, 30, 2), (40, 30, 3)]),
    "rnn": tuple({"timesteps": t, "cell_nodes": c} for t, c in [
        (3, 4), (5, 6), (8, 8), (10, 8), (15, 8), (20, 10), (25, 12), (35, 8)]),
    "enas_cnn": tuple({"n_cells": n, "cell_nodes": c} for n, c in [
        (3, 5), (4, 4), (6, 5), (8, 7), (10, 5), (12, 5), (15, 4), (20, 5)]),
    "random_dag": tuple({"n_nodes": n} for n in (30, 60, 100, 200, 400, 700, 1000, 1500)),
}


def synthetic_set(seed: int = 0, batch_size: int = DEFAULT_BATCH_SIZE) -> list[OpGraph]:
    """The graphs of :data:`SYNTHETIC_SET`; graph ``i`` of a family gets seed
    ``100 * seed + i``. The default batch size is the zoo's, so that real and synthetic
    graphs of the corpus are costed alike."""
    return [SYNTHETIC_FAMILIES[family](100 * seed + i, batch_size=batch_size, **kwargs)
            for family, specs in SYNTHETIC_SET.items() for i, kwargs in enumerate(specs)]


def build_synthetic_corpus(corpus_dir: str | os.PathLike[str], seed: int = 0,
                           max_nodes: int = DEFAULT_MAX_NODES,
                           batch_size: int = DEFAULT_BATCH_SIZE) -> list[dict[str, Any]]:
    """Replace the synthetic graphs of the corpus at ``corpus_dir`` by
    :func:`synthetic_set` ``(seed, batch_size)``; other graphs stay. Returns the new
    manifest entries.
    """
    graphs = synthetic_set(seed, batch_size)
    if (Path(corpus_dir) / MANIFEST_NAME).exists():
        remove_from_corpus(corpus_dir, sources="synthetic")
    return add_to_corpus(graphs, corpus_dir, max_nodes=max_nodes)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m travorder.datasets.synthetic",
        description="Regenerate the synthetic part of a graph corpus.")
    parser.add_argument("--out", required=True, help="corpus directory (created if missing)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-nodes", type=int, default=DEFAULT_MAX_NODES,
                        help="store larger graphs coarsened to this many nodes")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE)
    args = parser.parse_args(argv)
    try:
        entries = build_synthetic_corpus(args.out, args.seed, args.max_nodes, args.batch_size)
    except TravorderError as exc:
        parser.exit(2, f"error: {exc}\n")
    print(f"{len(entries)} synthetic graphs written to {args.out}")


if __name__ == "__main__":
    main()
