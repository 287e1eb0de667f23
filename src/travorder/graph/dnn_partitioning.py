"""The public JSON format of the dnn-partitioning benchmark (Tarnawski et al., NeurIPS
2020, ``msr-fiddle/dnn-partitioning``) as an :class:`~travorder.graph.OpGraph`.

A document is ``{"nodes": [...], "edges": [...]}`` plus cluster limits
(``maxSizePerFPGA``, ``maxFPGAs``, ``maxCPUs``). Mapping:

- node ``id`` -> a node named ``name`` when the node has one and it is unique, else
  ``str(id)`` (``id`` prefixed with ``"id"`` if another node is named so);
- ``fpgaLatency`` (milliseconds on the accelerator; the format calls any accelerator an
  FPGA) -> ``time_us = fpgaLatency * 1000``, the measured latency that overrides the
  cost model. ``cpuLatency`` is not used; FLOPs and op types are not in the format and
  are left 0 and empty;
- ``size`` (bytes the node's output takes on the accelerator) -> ``output_bytes``;
- ``colorClass`` (nodes of one class must share a device) -> ``colocation``, -1 without;
- ``isBackwardNode`` (true, false, 0 or 1) -> ``is_backward``;
- edge ``sourceId``/``destId`` -> an edge carrying the edge's ``size`` in bytes, or the
  source node's ``size`` without one. ``cost`` (transfer time to CPU memory on the
  benchmark's own link) is not used: travorder's cluster model turns bytes into time.
  Repeated ``(sourceId, destId)`` pairs are one tensor: they merge, keeping the largest
  size.

The cluster limits go to ``meta["dnn_partitioning"]``.

Training graphs come in two layouts. In the *connected* one (the benchmark's operator
graphs) backward edges carry gradients backwards and forward nodes feed backward nodes:
it is a training-step DAG as it stands. In the *mirrored* one (its layer graphs, e.g.
``resnet50_training.json``) the backward half repeats the forward half with its edges in
the forward direction and no edge joins the halves; imported as it is, the backward pass
would run beside the forward pass. A mirrored document is recognised (backward nodes, no
edge between the halves, each backward node shares its ``colorClass`` with exactly one
forward node, and every backward edge mirrors a forward edge) and turned into the
training-step DAG that `~travorder.graph.training_graph` builds: backward edges reversed,
an edge ``f -> f'`` from each forward node to its partner carrying ``f``'s output, and
``meta["dnn_partitioning_layout"] = "mirrored"``. Backward nodes that no edge joins to
the forward nodes in any other way are refused with a `FormatError`.

>>> doc = {"nodes": [{"id": 0, "fpgaLatency": 0.5, "size": 64.0, "isBackwardNode": 0},
...                  {"id": 1, "fpgaLatency": 0.25, "size": 8.0, "isBackwardNode": 0}],
...        "edges": [{"sourceId": 0, "destId": 1, "cost": 0.1, "size": 64.0}]}
>>> g = from_dnn_partitioning(doc)
>>> g.names.tolist(), g.time_us.tolist(), g.edge_bytes.tolist()
(['0', '1'], [500.0, 250.0], [64.0])
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from pathlib import Path
from typing import Any

from travorder.errors import FormatError, parse_json
from travorder.graph.opgraph import OpGraph

_CLUSTER_KEYS = ("maxSizePerFPGA", "maxFPGAs", "maxCPUs")


def is_dnn_partitioning(doc: Any) -> bool:
    """Whether a parsed JSON document looks like the dnn-partitioning format: an object
    with ``nodes`` and ``edges`` lists, a node carrying ``fpgaLatency`` (reading it
    checks that every node does)."""
    if not isinstance(doc, dict):
        return False
    nodes, edges = doc.get("nodes"), doc.get("edges")
    return (isinstance(nodes, list) and isinstance(edges, list)
            and any(isinstance(n, dict) and "fpgaLatency" in n for n in nodes))


def from_dnn_partitioning(
    doc: dict[str, Any] | str | os.PathLike[str], *, source: str = "memory"
) -> OpGraph:
    """Build an OpGraph from a dnn-partitioning document (a parsed dict, or the path of
    a JSON file). Raises :class:`FormatError` with one line for a document that does
    not follow the format (missing fields, duplicate ids, an edge to an unknown id)."""
    if not isinstance(doc, dict):
        path = Path(doc)
        source = str(path)
        doc = _read_json(path)
    if not is_dnn_partitioning(doc):
        raise FormatError(f"{source}: not a dnn-partitioning graph (needs 'nodes' with "
                          "'fpgaLatency' and 'edges')")
    nodes: list[dict[str, Any]] = doc["nodes"]
    for k, n in enumerate(nodes):
        if not isinstance(n, dict):
            raise FormatError(f"{source}: node {k} is not an object")
    ids = [_field(n, "id", int, source, f"node {k}") for k, n in enumerate(nodes)]
    if len(set(ids)) != len(ids):
        dup = next(i for i, c in Counter(ids).items() if c > 1)
        raise FormatError(f"{source}: duplicate node id {dup}")
    index = {node_id: k for k, node_id in enumerate(ids)}

    where = [f"node {i}" for i in ids]
    latency = [_field(n, "fpgaLatency", float, source, w) for n, w in zip(nodes, where,
                                                                          strict=True)]
    size = [_field(n, "size", float, source, w) for n, w in zip(nodes, where, strict=True)]
    color = [_field(n, "colorClass", int, source, w) if n.get("colorClass") is not None
             else -1 for n, w in zip(nodes, where, strict=True)]
    backward = [_field(n, "isBackwardNode", bool, source, w) if "isBackwardNode" in n
                else False for n, w in zip(nodes, where, strict=True)]
    if huge := next((w for w, t in zip(where, latency, strict=True)
                     if not math.isfinite(t * 1000.0)), None):
        raise FormatError(f"{source}: {huge}'s fpgaLatency is too large")
    labels = [str(n.get("name") or "") for n in nodes]
    counts = Counter(labels)
    unique = {lab for lab, c in counts.items() if lab and c == 1}
    names = [lab if lab in unique else _free_name(str(i), unique)
             for lab, i in zip(labels, ids, strict=True)]

    pairs: dict[tuple[int, int], float] = {}
    for k, e in enumerate(doc["edges"]):
        if not isinstance(e, dict):
            raise FormatError(f"{source}: edge {k} is not an object")
        ends = [_field(e, key, int, source, f"edge {k}") for key in ("sourceId", "destId")]
        for key, end in zip(("sourceId", "destId"), ends, strict=True):
            if end not in index:
                raise FormatError(f"{source}: edge {k} ({ends[0]} -> {ends[1]}) has "
                                  f"{key} {end}, which is not a node id")
        u, v = index[ends[0]], index[ends[1]]
        b = _field(e, "size", float, source, f"edge {k}") if "size" in e else size[u]
        pairs[u, v] = max(b, pairs.get((u, v), 0.0))

    layout = "forward"
    if any(backward):
        layout, pairs = _training_layout(pairs, backward, color, size, ids, source)
    meta = {"name": Path(source).stem if source != "memory" else "dnn-partitioning",
            "source": source, "importer": "dnn-partitioning",
            "dnn_partitioning": {k: doc[k] for k in _CLUSTER_KEYS if k in doc},
            "dnn_partitioning_layout": layout}
    return OpGraph(
        names, [u for u, _ in pairs], [v for _, v in pairs],
        output_bytes=size, time_us=[t * 1000.0 for t in latency], colocation=color,
        is_backward=backward, edge_bytes=list(pairs.values()), meta=meta,
    )


def _training_layout(pairs: dict[tuple[int, int], float], backward: list[bool],
                     color: list[int], size: list[float], ids: list[int], source: str
                     ) -> tuple[str, dict[tuple[int, int], float]]:
    """``(layout, edges)`` of a training graph: ``"connected"`` edges as they are, or
    ``"mirrored"`` edges rebuilt into the training-step DAG (see the module docstring)."""
    if any(backward[u] != backward[v] for u, v in pairs):
        return "connected", pairs
    forward_of = {c: [] for c in color}
    for k, c in enumerate(color):
        if not backward[k] and c >= 0:
            forward_of[c].append(k)
    partner = {}
    for k, c in enumerate(color):
        if backward[k]:
            match = forward_of.get(c, []) if c >= 0 else []
            if len(match) != 1:
                raise FormatError(
                    f"{source}: no edge joins the backward nodes to the forward nodes, and "
                    f"backward node {ids[k]} has {len(match)} forward partners by colorClass "
                    f"(needs one): cannot build the training step")
            partner[k] = match[0]
    mirrored = all((partner[u], partner[v]) in pairs for u, v in pairs if backward[u])
    if not mirrored or len(set(partner.values())) != len(partner):
        raise FormatError(f"{source}: no edge joins the backward nodes to the forward "
                          "nodes, and the backward edges do not mirror the forward ones: "
                          "cannot build the training step")
    edges = {((v, u) if backward[u] else (u, v)): b for (u, v), b in pairs.items()}
    for b, f in partner.items():
        edges[f, b] = size[f]  # the saved activations of f, which f' needs
    return "mirrored", edges


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise FormatError(f"{path}: no such file")
    try:
        return parse_json(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"{path}: not valid JSON ({exc})") from None


def _free_name(name: str, taken: set[str]) -> str:
    """``name``, prefixed by ``id`` as often as it takes not to be one of ``taken``."""
    while name in taken:
        name = f"id{name}"
    return name


def _field(obj: dict[str, Any], key: str, kind: type, source: str, where: str) -> Any:
    """``obj[key]`` as an ``int``, a finite ``float`` >= 0 or a ``bool`` (true, false, 0 or
    1), or a one-line FormatError."""
    if key not in obj:
        raise FormatError(f"{source}: {where} has no {key!r}")
    value = obj[key]
    # an int beyond int64 is no cost or id either, and math.isfinite overflows on it
    number = ((isinstance(value, float) and math.isfinite(value))
              or (isinstance(value, int) and abs(value) < 2**63))
    if not (number and (kind is bool or not isinstance(value, bool))
            and (kind is not int or value == int(value))
            and (kind is not float or value >= 0) and (kind is not bool or value in (0, 1))):
        expected = {int: "a whole number", float: "a number >= 0",
                    bool: "true, false, 0 or 1"}[kind]
        raise FormatError(f"{source}: {where} has {key}={value!r}, expected {expected}")
    return kind(value)


__all__ = ["from_dnn_partitioning", "is_dnn_partitioning"]
