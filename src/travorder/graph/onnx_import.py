"""Import an ONNX model as an :class:`~travorder.graph.OpGraph`.

The model is loaded without its external data (a ``.onnx`` file keeps the shapes of its
weights even when the ``.data`` file next to it is missing; of a ``.data`` file that is
there, only the small integer tensors that data propagation reads, shapes and axes, are
read), its shapes are inferred
with :func:`onnx.shape_inference.infer_shapes` (with data propagation, so shapes
computed by ``Shape -> Gather -> Concat`` chains resolve, and shapes the model already
records in ``value_info``, e.g. an exporter's for custom ops, are kept), and then:

- every ONNX node is an OpGraph node, named ``node.name`` or ``<op_type>_<index>``
  (a repeated name gets ``_1``, ``_2``, ...); graph inputs, initializers and
  ``Constant`` nodes are not nodes (a Constant's output is treated as an initializer);
- an edge ``u -> v`` for every tensor ``u`` produces and ``v`` consumes; the tensors of
  one ``(u, v)`` pair are merged into one edge carrying the sum of their bytes;
- ``output_bytes`` is the sum of the bytes of a node's outputs (shape x element size);
- ``param_bytes`` is the bytes of the initializers and Constant tensors a node reads.
  A tensor read by several nodes (tied or shared weights) is counted once, at its first
  consumer in the file's node order, so the graph's total is the model's size;
- ``flops`` follow the rules of :mod:`travorder.graph.onnx_flops`.

Nothing is silently zero: nodes with an output shape that stays unknown, or whose
FLOPs need an unknown input shape, are listed in ``meta["unknown_shape_ops"]`` (and
counted in ``meta["n_unknown_shape_ops"]``); their unknown parts count 0. Op types
without a FLOPs rule are costed at 1 FLOP per output element and listed with their
counts in ``meta["unrated_op_types"]``. Symbolic input dimensions (``batch``, ``seq``)
leave shapes unknown; ``meta["symbolic_dims"]`` names them and ``dims=`` binds them.
A tensor the file declares (an initializer, a graph input, output or value_info) with an
element type ONNX does not define, or with a negative size, is refused naming it (a
value's dimension of -1 is an exporter's "any", and unknown).

Model-local functions are inlined first. Control flow (``If``, ``Loop``, ``Scan``: any
node with a subgraph) is refused with a :class:`~travorder.errors.FormatError` naming
the node (inside a function: the function and the node that calls it), since its cost
depends on run-time data.

>>> from travorder.datasets.onnx_examples import residual_cnn
>>> g = read_onnx(residual_cnn(blocks=1))
>>> g.n_nodes, g.meta["importer"], g.meta["n_unknown_shape_ops"]
(13, 'onnx', 0)
"""

from __future__ import annotations

import math
import os
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import onnx
import onnx.external_data_helper
import onnx.inliner
from google.protobuf.message import DecodeError
from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto, helper

from travorder.errors import DimsError, FormatError, first_line
from travorder.graph.load import check_dims, sniff_format
from travorder.graph.onnx_flops import has_flops_rule, node_flops
from travorder.graph.opgraph import OpGraph

OnnxSource = str | os.PathLike[str] | bytes | ModelProto

# Initializers with more elements than this go to shape inference without their data:
# only their shapes matter there (data propagation reads small shape and axis tensors),
# copying weights is slow, and protobuf refuses messages over 2 GB.
_STRIP_ELEMENTS = 1024
_SUBGRAPH_TYPES = (AttributeProto.GRAPH, AttributeProto.GRAPHS)
#: The element types of shape and axes tensors.
_SHAPE_TYPES = frozenset({TensorProto.INT64, TensorProto.INT32})
_SUB_BYTE_BITS = {getattr(TensorProto, t): bits for t, bits in (
    ("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4), ("INT2", 2), ("UINT2", 2))
    if hasattr(TensorProto, t)}

Shape = tuple[int, ...]


def read_onnx(
    source: OnnxSource, *, name: str | None = None, dims: Mapping[str, int] | None = None
) -> OpGraph:
    """Read an ONNX model (a path, serialized bytes or an ``onnx.ModelProto``).

    ``name`` sets ``meta["name"]`` (default: the file stem, else the ONNX graph's name).
    ``dims`` gives values to symbolic input dimensions, e.g. ``{"batch": 8}``
    (recorded as ``meta["dims"]``).

    Raises :class:`FormatError` (one line) for a file that is missing, empty, not an
    ONNX model, without nodes (or with Constants only), with control-flow subgraphs,
    declaring a tensor of an undefined element type or a negative size, with a node whose
    input shapes or attributes its op does not take, or a tensor of more elements than a
    float counts, and
    :class:`~travorder.errors.GraphError` for a cyclic graph.
    """
    model, where = _load(source)
    control_flow = _control_flow_node(model)
    if control_flow:
        raise FormatError(
            f"{where}: node {control_flow} has a subgraph; control flow (If/Loop/Scan) "
            "cannot be costed statically, export the model with it unrolled or removed")
    if model.functions:
        model = onnx.inliner.inline_local_functions(model)
    check_dims(dims)
    _check_declared(model.graph, where)
    inferred, symbolic = _infer_shapes(model, dict(dims or {}), where)
    graph = model.graph
    params = {t.name for t in graph.initializer}
    params.update(t.values.name for t in graph.sparse_initializer)
    params.update(n.output[0] for n in graph.node if _is_constant(n))
    if name is None:
        name = (Path(where).stem if where != IN_MEMORY else "") or graph.name or "model"
    meta = {"name": name, "source": where, "importer": "onnx",
            "opset": next((o.version for o in model.opset_import
                           if o.domain in ("", "ai.onnx")), None),
            "symbolic_dims": symbolic, **_input_meta(inferred.graph, params)}
    if dims:
        meta["dims"] = dict(dims)  # recorded, so that a placement file can rebuild the graph
    return _build(graph, _tensor_info(inferred.graph, graph), params, meta)


# ------------------------------------------------------------------ loading
#: What errors name (and ``meta["source"]`` records) for a model given as a ModelProto or
#: bytes rather than a file.
IN_MEMORY = "<in-memory ONNX model>"


def _load(source: OnnxSource) -> tuple[ModelProto, str]:
    if isinstance(source, ModelProto):
        model, where = source, IN_MEMORY
    elif isinstance(source, bytes | bytearray):
        where = IN_MEMORY
        model = _parse(lambda: onnx.load_from_string(bytes(source)), where)
    else:
        where = str(source)
        fmt = sniff_format(source)  # missing, directory, empty: one clear line each
        if fmt != "onnx":
            kind = {"native": "a travorder graph file", "json": "a JSON file"}[fmt]
            raise FormatError(f"{where}: not an ONNX model (it is {kind})")
        # binary protobuf whatever the name (onnx picks a text parser for .json names)
        model = _parse(lambda: onnx.load(source, format="protobuf", load_external_data=False),
                       where)
    if not model.graph.node:
        raise FormatError(f"{where}: not an ONNX model (no graph nodes)")
    if all(_is_constant(n) for n in model.graph.node):  # constants are weights, not ops
        raise FormatError(f"{where}: the graph has only Constant nodes, no op to place")
    return model, where


def _parse(load: Callable[[], ModelProto], where: str) -> ModelProto:
    try:
        return load()
    except DecodeError:
        raise FormatError(
            f"{where}: not an ONNX model (truncated, or not an ONNX protobuf file)"
        ) from None
    except OSError as exc:
        raise FormatError(f"{where}: cannot read ({exc.strerror or exc})") from None


# ------------------------------------------------------------------ shapes
_DATA_TYPES = frozenset(TensorProto.DataType.values())


def _check_declared(graph: GraphProto, where: str) -> None:
    """Refuse an element type ONNX does not define, and a negative size, in the tensors
    the file declares (once counted as 0 bytes, or as negative FLOPs of a later node).
    A declared value's dimension of -1 is an exporter's "any" and reads as unknown."""
    declared = [(f"initializer {t.name!r}", t.data_type, list(t.dims), 0)
                for t in graph.initializer]
    declared += [(f"sparse initializer {t.values.name!r}", t.values.data_type,
                  list(t.dims), 0) for t in graph.sparse_initializer]
    for field in ("input", "output", "value_info"):
        for vi in getattr(graph, field):
            if vi.type.HasField("tensor_type"):
                tt = vi.type.tensor_type
                declared.append((f"{field.replace('_', ' ')} {vi.name!r}", tt.elem_type,
                                 [d.dim_value for d in tt.shape.dim], -1))
    for what, data_type, shape, lowest in declared:
        if data_type not in _DATA_TYPES:
            raise FormatError(f"{where}: {what} has element type {data_type}, which ONNX "
                              f"does not define")
        if bad := [d for d in shape if d < lowest]:
            raise FormatError(f"{where}: {what} has a dimension of {bad[0]} (a size is 0 "
                              f"or more{', or -1 for any' if lowest else ''})")


def _infer_shapes(
    model: ModelProto, dims: dict[str, int], where: str
) -> tuple[ModelProto, list[str]]:
    """Shape inference on a copy without large weight payloads and with ``dims`` bound;
    also returns the symbolic input dimensions left unbound."""
    skeleton = ModelProto(ir_version=model.ir_version)
    skeleton.opset_import.extend(model.opset_import)
    g, src = skeleton.graph, model.graph
    # an op of a domain the model does not import fails inference of the whole model;
    # imported, it is an op of unknown shape as any other custom op
    for domain in sorted({n.domain for n in src.node} - {o.domain for o in model.opset_import}
                         - {"", "ai.onnx"}):
        skeleton.opset_import.add(domain=domain, version=1)
    for field in ("node", "input", "output", "value_info"):
        getattr(g, field).extend(getattr(src, field))
    # shape inference ignores sparse initializers: give it dense stubs
    stubs = [(t.values.name, t.values.data_type, t.dims) for t in src.sparse_initializer]
    for t in src.initializer:
        if t.data_location == TensorProto.EXTERNAL:
            g.initializer.append(_with_shape_data(t, where))
        elif math.prod(t.dims) <= _STRIP_ELEMENTS:
            g.initializer.append(t)
        else:
            stubs.append((t.name, t.data_type, t.dims))
    for stub_name, data_type, stub_dims in stubs:
        stub = g.initializer.add(name=stub_name, data_type=data_type, dims=stub_dims,
                                 data_location=TensorProto.EXTERNAL)
        stub.external_data.add(key="location", value="-")
    params = {t.name for t in src.initializer}
    declared = {d.dim_param for inp in src.input
                if inp.name not in params and inp.type.HasField("tensor_type")
                for d in inp.type.tensor_type.shape.dim if d.dim_param}
    if unknown := sorted(set(dims) - declared):
        raise DimsError(
            f"{where}: no symbolic input dimension named {', '.join(unknown)} to bind "
            f"(the model has: {', '.join(sorted(declared)) or 'none'})"
        )
    for vi in (*g.input, *g.value_info, *g.output):  # exporters repeat the symbols inside
        for d in vi.type.tensor_type.shape.dim:
            if d.dim_param in dims:
                d.dim_value = int(dims[d.dim_param])
    # Not strict: a node whose inference fails leaves its outputs unknown (and reported).
    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton, check_type=False,
                                                     strict_mode=False, data_prop=True)
    except onnx.shape_inference.InferenceError as exc:
        raise FormatError(f"{where}: ONNX shape inference failed: {first_line(exc)}") from None
    return inferred, sorted(declared - set(dims))


def _with_shape_data(tensor: TensorProto, where: str) -> TensorProto:
    """``tensor`` (of external data) with its values read from the data file next to the
    model ``where``, when it is a small integer tensor (a shape or axes, which data
    propagation reads) and the file holds it; else as it is (its values unknown)."""
    n = math.prod(tensor.dims)
    if where == IN_MEMORY or tensor.data_type not in _SHAPE_TYPES or n > _STRIP_ELEMENTS:
        return tensor
    info = {e.key: e.value for e in tensor.external_data}
    base = Path(where).resolve().parent
    # only the tensor's own bytes (none of a whole file), of a file in the model's folder
    if info.get("length") != str(int(n * _itemsize(tensor.data_type))) or not (
            base / info.get("location", "")).resolve().is_relative_to(base):
        return tensor
    loaded = TensorProto()
    loaded.CopyFrom(tensor)
    try:
        onnx.external_data_helper.load_external_data_for_tensor(loaded, str(base))
    except (OSError, ValueError, onnx.checker.ValidationError):  # missing, out of bounds
        return tensor
    return loaded


def _tensor_info(inferred: GraphProto, graph: GraphProto) -> dict[str, tuple[int, Shape | None]]:
    """Tensor name -> (element type, shape or None where unknown)."""
    info: dict[str, tuple[int, Shape | None]] = {}
    for vi in (*inferred.input, *inferred.value_info, *inferred.output):
        if vi.type.HasField("tensor_type"):
            tt = vi.type.tensor_type
            shape = (tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
                     if tt.HasField("shape") else None)
            if shape is not None and -1 not in shape:
                info[vi.name] = (tt.elem_type, shape)
            else:  # a shapeless graph output must not hide a shape found in value_info
                info.setdefault(vi.name, (tt.elem_type, None))
    for t in graph.initializer:
        info[t.name] = (t.data_type, tuple(t.dims))
    for sparse in graph.sparse_initializer:
        info[sparse.values.name] = (sparse.values.data_type, tuple(sparse.dims))
    return info


@lru_cache(maxsize=64)
def _itemsize(elem_type: int) -> float | None:
    """Bytes per element, or None for strings and unknown types."""
    if elem_type in _SUB_BYTE_BITS:
        return _SUB_BYTE_BITS[elem_type] / 8
    try:
        dtype = helper.tensor_dtype_to_np_dtype(elem_type)
    except (KeyError, ValueError, TypeError):
        return None
    return None if dtype.kind == "O" else float(dtype.itemsize)


@lru_cache(maxsize=64)
def _float_dtype_name(elem_type: int) -> str | None:
    try:
        dtype_name = helper.tensor_dtype_to_np_dtype(elem_type).name
    except (KeyError, ValueError, TypeError):
        return None
    return dtype_name if dtype_name.startswith(("float", "bfloat")) else None


# ------------------------------------------------------------------ graph
def _is_constant(node: NodeProto) -> bool:
    return node.op_type == "Constant" and node.domain in ("", "ai.onnx")


def _base_name(node: NodeProto, index: int) -> str:
    return node.name or f"{node.op_type}_{index}"


def _control_flow_node(model: ModelProto) -> str | None:
    """The first node with a subgraph, named as the file names it (inside a model-local
    function: the function and the node that calls it), or None."""
    functions = {(f.domain, f.name): f for f in model.functions}

    def search(nodes: Sequence[NodeProto], seen: frozenset[tuple[str, str]]) -> str | None:
        for i, node in enumerate(nodes):
            name = f"{_base_name(node, i)!r} ({node.op_type})"
            if any(a.type in _SUBGRAPH_TYPES for a in node.attribute):
                return name
            key = (node.domain, node.op_type)
            if key in functions and key not in seen:
                inner = search(functions[key].node, seen | {key})
                if inner:
                    return f"{inner} of function {node.op_type!r}, called by node {name}"
        return None

    return search(model.graph.node, frozenset())


def _input_meta(inferred: GraphProto, params: set[str]) -> dict[str, Any]:
    """``batch_size``: first dimension of the first graph input; ``dtype``: of the first
    float input, else of the first float initializer (token ids in, float weights)."""
    inputs = [i.type.tensor_type for i in inferred.input
              if i.name not in params and i.type.HasField("tensor_type")]
    first = inputs[0].shape.dim if inputs else []
    # unset, -1 or 0 (exporters' "any batch"): none recorded
    batch = first[0].dim_value if first and first[0].dim_value > 0 else None
    elems = [t.elem_type for t in inputs] + [t.data_type for t in inferred.initializer]
    return {"batch_size": batch, "dtype": next(filter(None, map(_float_dtype_name, elems)), None)}


def _build(graph: GraphProto, info: dict[str, tuple[int, Shape | None]], params: set[str],
           meta: dict[str, Any]) -> OpGraph:
    ops = [(i, n) for i, n in enumerate(graph.node) if not _is_constant(n)]

    names: list[str] = []
    taken: set[str] = set()
    for i, node in ops:
        base = cand = _base_name(node, i)
        k = 0
        while cand in taken:
            k += 1
            cand = f"{base}_{k}"
        taken.add(cand)
        names.append(cand)
    producer: dict[str, int] = {}
    for v, (_, node) in enumerate(ops):
        for t in filter(None, node.output):
            if t in producer:
                raise FormatError(f"{meta['source']}: tensor {t!r} is produced by two "
                                  f"nodes, {names[producer[t]]!r} and {names[v]!r}")
            producer[t] = v

    def shape(t: str) -> Shape | None:
        return info[t][1] if t and t in info else None

    def nbytes(t: str) -> float | None:
        s = shape(t)
        size = _itemsize(info[t][0]) if s is not None else None
        if size is None:
            return None
        try:
            return math.prod(s) * size
        except OverflowError:  # an int of more than 1024 bits
            raise FormatError(f"{meta['source']}: tensor {t!r} has more elements than a "
                              f"float counts (its {len(s)} dimensions multiply past "
                              f"1e308)") from None

    flops, out_bytes, param_bytes, unknown = [], [], [], []
    unrated: Counter[str] = Counter()
    edges: defaultdict[tuple[int, int], float] = defaultdict(float)
    params_seen: set[str] = set()
    for v, (_, node) in enumerate(ops):
        outs = [nbytes(t) for t in node.output if t]
        in_shapes = [shape(t) for t in node.input]
        try:
            f = node_flops(node, in_shapes, [shape(t) for t in node.output])
        except OverflowError:
            raise FormatError(f"{meta['source']}: node {names[v]!r} ({node.op_type}) does "
                              f"more FLOPs than a float counts") from None
        except (ArithmeticError, IndexError, ValueError) as exc:  # shapes ONNX's op refuses
            given = ", ".join("?" if x is None else str(list(x)) for x in in_shapes)
            raise FormatError(f"{meta['source']}: node {names[v]!r} ({node.op_type}): its "
                              f"inputs of shapes {given} or its attributes are not what "
                              f"{node.op_type} takes ({type(exc).__name__}: {exc})") from None
        if f is None or None in outs:
            unknown.append(names[v])
        if not has_flops_rule(node.op_type, node.domain):
            unrated[node.op_type] += 1
        flops.append(f or 0.0)
        out_bytes.append(sum(b or 0.0 for b in outs))
        pb = 0.0
        for t in dict.fromkeys(filter(None, node.input)):  # distinct, in order
            if t in params:
                if t not in params_seen:
                    params_seen.add(t)
                    pb += nbytes(t) or 0.0
            elif t in producer:
                edges[producer[t], v] += nbytes(t) or 0.0
        param_bytes.append(pb)

    meta.update(unknown_shape_ops=unknown, n_unknown_shape_ops=len(unknown),
                unrated_op_types=dict(sorted(unrated.items())))
    pairs = list(edges)
    return OpGraph(
        names, [u for u, _ in pairs], [v for _, v in pairs],
        op_types=[n.op_type for _, n in ops], flops=flops, output_bytes=out_bytes,
        param_bytes=param_bytes, edge_bytes=list(edges.values()), meta=meta,
    )


__all__ = ["OnnxSource", "read_onnx"]
