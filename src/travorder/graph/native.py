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

from travorder.errors import FormatError, check_format, write_file
from travorder.graph.opgraph import OpGraph

FORMAT_NAME = "travorder.opgraph"
FORMAT_VERSION = 1

_NODE_COLUMNS = ("name", "op_type", "flops", "output_bytes", "param_bytes", "time_us",
                 "colocation", "is_backward")


def graph_to_dict(g: OpGraph) -> dict[str, Any]:
    """The JSON document for ``g`` (see the module docstring)."""
    recs = g.node_records()
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "meta": dict(g.meta),
        "nodes": {c: [r[c] for r in recs] for c in _NODE_COLUMNS},
        "edges": {"src": g.src.tolist(), "dst": g.dst.tolist(),
                  "bytes": g.edge_bytes.tolist()},
    }


def graph_from_dict(doc: Any, source: str = "document") -> OpGraph:
    """Inverse of :func:`graph_to_dict`; checks format name and version."""
    check_format(doc, source, FORMAT_NAME, FORMAT_VERSION, "graph")
    try:
        nodes, edges = doc["nodes"], doc["edges"]
        names = nodes["name"]
        return OpGraph(
            names, edges["src"], edges["dst"],
            op_types=nodes["op_type"], flops=nodes["flops"],
            output_bytes=nodes["output_bytes"], param_bytes=nodes["param_bytes"],
            time_us=[float("nan") if t is None else t for t in nodes["time_us"]],
            colocation=nodes["colocation"], is_backward=nodes["is_backward"],
            edge_bytes=edges["bytes"], meta=doc.get("meta") or {},
        )
    except (KeyError, TypeError) as exc:
        raise FormatError(f"{source}: travorder graph is missing field {exc}") from None


def save_graph(g: OpGraph, path: str | os.PathLike[str]) -> None:
    """Write ``g`` to ``path`` (gzipped JSON), atomically: no half-written file on error."""
    data = json.dumps(graph_to_dict(g), separators=(",", ":")).encode()
    # No name, no time in the gzip header: same graph, same bytes.
    write_file(path, gzip.compress(data, mtime=0), "graph")


def load_native(path: str | os.PathLike[str]) -> OpGraph:
    """Read a graph written by :func:`save_graph`."""
    try:
        with gzip.open(path, "rb") as f:
            doc = json.loads(f.read())
    except (OSError, EOFError, zlib.error, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FormatError(f"{path}: broken travorder graph file ({exc})") from None
    return graph_from_dict(doc, str(path))
