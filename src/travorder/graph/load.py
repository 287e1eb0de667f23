"""Reading and writing graphs in any supported format, chosen by file content.

``load_graph`` looks at the bytes, not only the extension: gzip data is travorder's own
format, a JSON object with ``nodes`` carrying ``fpgaLatency`` is the dnn-partitioning
format, and anything else must parse as an ONNX model.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from numbers import Integral
from pathlib import Path

from travorder.errors import DimsError, FormatError, GraphError, check_regular, parse_json
from travorder.graph.native import graph_from_dict, load_native, save_graph
from travorder.graph.opgraph import OpGraph

GraphSource = str | os.PathLike[str] | OpGraph

_GZIP_MAGIC = b"\x1f\x8b"
_UTF8_BOM = b"\xef\xbb\xbf"


def sniff_format(path: str | os.PathLike[str]) -> str:
    """Name the format of the file at ``path``: ``native``, ``dnn-partitioning`` or ``onnx``.

    Raises :class:`FormatError` for a missing, empty or unreadable file.
    """
    if not os.fspath(path):
        raise FormatError("empty path: give the model file to read")
    p = Path(path)
    if not p.exists():
        raise FormatError(f"{p}: no such file")
    if p.is_dir():
        raise FormatError(f"{p}: is a directory, not a model file")
    check_regular(p, "model file")
    try:
        with p.open("rb") as f:
            head = f.read(4096)
    except OSError as exc:
        raise FormatError(f"{p}: cannot read ({exc.strerror})") from None
    if not head:
        raise FormatError(f"{p}: empty file")
    if head.startswith(_GZIP_MAGIC):
        return "native"
    if head.removeprefix(_UTF8_BOM).lstrip()[:1] in (b"{", b"["):
        return "json"
    return "onnx"


def check_dims(dims: object) -> None:
    """Refuse ``dims`` that are not a mapping of dimension names to integers >= 1 (None:
    no dimensions bound)."""
    if dims is None:
        return
    if not isinstance(dims, Mapping):
        raise DimsError(f"dims must map symbolic dimension names to integers, e.g. "
                        f"{{'batch': 8}}, not {dims!r}")
    for name, value in dims.items():
        if not isinstance(name, str) or not name:
            raise DimsError(f"dims must map symbolic dimension names (strings) to integers, "
                            f"e.g. {{'batch': 8}}, got the key {name!r}")
        if isinstance(value, bool) or not isinstance(value, Integral) or not 1 <= value < 2**63:
            raise DimsError(f"symbolic dimension {name} must be bound to an integer from 1 "
                            f"to 2**63 - 1, not {value!r}")


def describe_unrated(counts: Mapping[str, int]) -> str:
    """An importer's ``meta["unrated_op_types"]`` (op types without a FLOPs rule, and
    how many ops of each) as text, the most common first.

    >>> describe_unrated({"Col2Im": 1, "DeformConv": 2})
    'DeformConv x2, Col2Im'
    """
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(t if n == 1 else f"{t} x{n}" for t, n in ranked)


def load_graph(source: GraphSource, *, dims: Mapping[str, int] | None = None) -> OpGraph:
    """Load an :class:`OpGraph` from a file (ONNX, travorder ``.json.gz``, dnn-partitioning
    JSON) or return ``source`` itself if it already is one. ``dims`` gives values to an
    ONNX model's symbolic input dimensions (`travorder.graph.onnx_import.read_onnx`); a
    graph of another format takes only the values it was made with (``meta["dims"]``).

    >>> load_graph("missing.onnx")
    Traceback (most recent call last):
    ...
    travorder.errors.FormatError: missing.onnx: no such file
    """
    check_dims(dims)
    if dims and (isinstance(source, OpGraph) or sniff_format(source) != "onnx"):
        g = load_graph(source)  # bound when it was made: to these values, or refused
        bound = dict(g.meta.get("dims") or {})
        if bound == dict(dims):
            return g
        where = "an OpGraph" if isinstance(source, OpGraph) else f"{source}"
        raise DimsError(f"{where}: not an ONNX model, so it has no symbolic dimensions "
                        f"to bind (its shapes were fixed when it was made" + (
                            f", with {', '.join(f'{k}={v}' for k, v in bound.items())}"
                            if bound else "") + ")")
    if isinstance(source, OpGraph):
        return source
    fmt = sniff_format(source)
    try:
        if fmt == "native":
            return load_native(source)
        if fmt == "json":
            return _load_json(Path(source))
        from travorder.graph.onnx_import import read_onnx  # onnx is heavy: on demand

        return read_onnx(source, dims=dims)
    except GraphError as exc:  # a cycle, a bad cost...: in which file
        raise GraphError(f"{source}: {exc}") from None


def _load_json(path: Path) -> OpGraph:
    from travorder.graph.dnn_partitioning import from_dnn_partitioning, is_dnn_partitioning

    try:
        doc = parse_json(path.read_text(encoding="utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"{path}: not valid JSON ({exc})") from None
    if isinstance(doc, dict) and "format" in doc:
        return graph_from_dict(doc, str(path))
    if is_dnn_partitioning(doc):
        return from_dnn_partitioning(doc, source=str(path))
    raise FormatError(
        f"{path}: JSON that is neither a travorder graph nor a dnn-partitioning graph"
    )


__all__ = ["GraphSource", "check_dims", "describe_unrated", "load_graph", "save_graph",
           "sniff_format"]
