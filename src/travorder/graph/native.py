"""travorder's own graph file format: gzipped, column-wise JSON.

The document is ``{"format": "travorder.opgraph", "format_version": 1, "meta": {...},
"nodes": {column: [...]}, "edges": {"src": [...], "dst": [...], "bytes": [...]}}``.
Loading checks the format name and version and refuses anything else.

>>> import tempfile, os
>>> from travorder.graph.opgraph import OpGraph
>>> g = OpGraph.from_records([{"name": "a"}, {"name": "b"}], [("a", "b")], name="t")
>>> path = os.path.join(tempfile.mkdtemp(), "t.json.gz")
>>> save_graph(g, path); load_native(path) == g
True
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from typing import Any

import numpy as np

from travorder.errors import (
    FormatError,
    GraphError,
    TravorderError,
    check_format,
    parse_json,
    write_file,
)
from travorder.graph.opgraph import NODE_KEYS, OpGraph, check_graph

FORMAT_NAME = "travorder.opgraph"
FORMAT_VERSION = 1


def graph_to_dict(g: OpGraph) -> dict[str, Any]:
    """The JSON document for ``g`` (see the module docstring)."""
    recs = g.node_records()
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "meta": dict(g.meta),
        "nodes": {c: [r[c] for r in recs] for c in NODE_KEYS},
        "edges": {"src": g.src.tolist(), "dst": g.dst.tolist(),
                  "bytes": g.edge_bytes.tolist()},
    }


def graph_from_dict(doc: Any, source: str = "document") -> OpGraph:
    """Inverse of :func:`graph_to_dict`; checks the format name and version, and each
    field's type (a `FormatError` naming the field)."""
    check_format(doc, source, FORMAT_NAME, FORMAT_VERSION, "graph")
    meta = doc.get("meta") or {}
    if not isinstance(meta, dict):
        raise FormatError(f"{source}: graph field 'meta' is not an object")
    nodes = {c: _column(doc, "nodes", c, source) for c in NODE_KEYS}
    edges = {c: _column(doc, "edges", c, source) for c in _EDGE_COLUMNS}
    if not len(nodes["name"]):
        raise FormatError(f"{source}: graph has no nodes")
    return OpGraph(nodes["name"], edges["src"], edges["dst"], op_types=nodes["op_type"],
                   flops=nodes["flops"], output_bytes=nodes["output_bytes"],
                   param_bytes=nodes["param_bytes"], time_us=nodes["time_us"],
                   colocation=nodes["colocation"], is_backward=nodes["is_backward"],
                   edge_bytes=edges["bytes"], meta=meta)


#: Per column: the numpy dtype kind its values must have, and what that is in words.
_KINDS = {"name": ("U", "strings"), "op_type": ("U", "strings"), "colocation": ("i", "integers"),
          "is_backward": ("b", "true or false"), "src": ("i", "integers"),
          "dst": ("i", "integers")}
_EDGE_COLUMNS = ("src", "dst", "bytes")


def _column(doc: dict[str, Any], table: str, column: str, source: str) -> Any:
    """Column ``column`` of table ``table`` of graph document ``doc``: checked to be of the
    kind `_KINDS` says (default: numbers, ``null`` read as NaN), and an array of numbers
    (a list of strings or flags as it is)."""
    field = f"{table}.{column}"
    if not isinstance(doc.get(table), dict) or column not in doc[table]:
        raise FormatError(f"{source}: travorder graph is missing field {field!r}")
    values = doc[table][column]
    kind, words = _KINDS.get(column, ("f", "numbers"))
    if not isinstance(values, list) or (kind in "Ub" and not set(map(type, values)) <= {
            str if kind == "U" else bool}):
        raise FormatError(f"{source}: graph field {field!r} must be a list of {words}")
    if kind in "Ub":
        return values  # as OpGraph takes them
    if kind == "f" and not all(v is None or type(v) in (int, float) for v in values):
        raise FormatError(f"{source}: graph field {field!r} must be a list of {words}")
    try:
        array = np.asarray(values, dtype=float if kind == "f" else None)
    except (TypeError, ValueError, OverflowError):  # OverflowError: a 400-digit integer
        array = None
    if array is None or array.ndim != 1 or (array.size and kind == "i"
                                             and array.dtype.kind != "i"):
        raise FormatError(f"{source}: graph field {field!r} must be a list of {words}")
    return array.astype(np.int64) if kind == "i" else array


def check_native_path(path: str | os.PathLike[str]) -> None:
    """Refuse a file name that does not end in ``.json.gz`` (a graph saved as ``g.onnx``
    would not be ONNX)."""
    if not os.fspath(path).lower().endswith(".json.gz"):
        raise TravorderError(f"travorder graphs are gzipped JSON: give a file name ending "
                             f"in .json.gz, not {os.fspath(path)!r}")


def save_graph(g: OpGraph, path: str | os.PathLike[str]) -> None:
    """Write ``g`` to ``path`` (gzipped JSON, a name ending in ``.json.gz``), atomically:
    no half-written file on error."""
    check_graph(g, "save_graph")
    check_native_path(path)
    if not g.n_nodes:
        raise GraphError("a graph of no nodes cannot be saved: a graph file holds at least one")
    try:  # strict JSON: a NaN or an object in meta would not read back as it was
        data = json.dumps(graph_to_dict(g), separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise GraphError(f"graph {g.name!r} cannot be saved: its meta holds a value JSON "
                         f"cannot hold ({exc})") from None
    # No name, no time in the gzip header: same graph, same bytes.
    write_file(path, gzip.compress(data, mtime=0), "graph")


def load_native(path: str | os.PathLike[str]) -> OpGraph:
    """Read a graph written by :func:`save_graph`."""
    try:
        with gzip.open(path, "rb") as f:
            doc = parse_json(f.read())
    except (OSError, EOFError, zlib.error, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FormatError(f"{path}: broken travorder graph file ({exc})") from None
    return graph_from_dict(doc, str(path))
