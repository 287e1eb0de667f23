"""Placement files: a placement with the graph, cluster and figures it belongs to (JSON).

::

    {"format": "travorder.placement", "format_version": 1,
     "graph": {"name": ..., "graph_hash": ..., "n_nodes": ..., "training": true,
               "batch": 32, "micro_batches": 1, "dims": {"batch": 32}},
     "cluster": {... Cluster.to_dict() ...},
     "devices": ["k80:0", "k80:1", "k80:2"],
     "placement": {"conv1": 0, "relu1": 0, ...},
     "step_time_us": ..., "lower_bound_us": ..., "efficiency": ..., "feasible": true,
     "peak_memory": [...], "placer": "greedy", "order": "topo", "seed": 0, "wall_s": ...,
     "single_device_us": ..., "single_device_feasible": true, "speedup": ...,
     "fallback": false, "placer_step_time_us": ...}

``fallback`` is true when the placer's own placement was slower than one device (or did
not fit where one device does) and the file holds the single-device placement instead;
``placer_step_time_us`` is then what the placer reached.

``graph`` says which graph was placed: ``training`` (a training step, not the forward
graph alone), ``batch`` (the placed graph's batch, as exported or as scaled to; null when
the model records none), ``micro_batches`` and ``dims`` (the values given to the ONNX
model's symbolic input dimensions) are what ``travorder simulate`` and
`travorder.placement.launch.apply` build the graph with again.
``placement`` maps every node name to a device index into ``devices``, in the graph's
node order; ``devices`` are the cluster's device names, distinct (``travorder simulate``
refuses a file whose names are not those of its own cluster; ``--cluster`` places its
device indices on another cluster of as many devices). Unlimited memory and infinite
bandwidth in the cluster are written as ``null`` so the file is strict JSON.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from travorder.errors import (
    FormatError,
    TravorderError,
    check_format,
    json_text,
    parse_json,
    read_text,
    write_file,
)
from travorder.graph import OpGraph
from travorder.graph.opgraph import check_graph
from travorder.graph.pipeline import micro_batches
from travorder.placement.clusters import ClusterSource, load_cluster
from travorder.placement.placers import PlacementResult

FORMAT = "travorder.placement"
FORMAT_VERSION = 1


def placed_step(graph: OpGraph) -> dict[str, Any]:
    """The training step ``graph`` is of, as a placement file records it: ``training``
    (it has backward ops), ``batch`` (its batch size, if an integer), ``micro_batches``
    and ``dims`` (its ONNX model's bound symbolic dimensions).

    >>> from travorder.graph import training_graph
    >>> g = training_graph(OpGraph.from_records([{"name": "a"}], [], batch_size=8))
    >>> placed_step(g)
    {'training': True, 'batch': 8, 'micro_batches': 1, 'dims': {}}
    """
    batch = graph.meta.get("batch_size")
    return {"training": bool(graph.is_backward.any()),
            "batch": batch if isinstance(batch, int) and not isinstance(batch, bool) else None,
            "micro_batches": micro_batches(graph), "dims": dict(graph.meta.get("dims") or {})}


def describe_step(step: Mapping[str, Any]) -> str:
    """A placement file's ``graph`` entry (or `placed_step`'s) in words, for messages.

    >>> describe_step({"training": False, "batch": 64, "micro_batches": 2, "dims": {}})
    'forward only, batch 64, 2 micro-batches'
    """
    micro = step.get("micro_batches", 1)
    return ", ".join([*(["forward only"] if not step.get("training", True) else []),
                      f"batch {step['batch']}" if step.get("batch") else "its own batch",
                      f"{micro} micro-batch{'es' if micro != 1 else ''}",
                      *(f"dim {k}={v}" for k, v in (step.get("dims") or {}).items())])


def placement_doc(result: PlacementResult, graph: OpGraph, cluster: ClusterSource
                  ) -> dict[str, Any]:
    """The placement file's content as a dict. ``graph`` is the graph placed
    (`travorder.graph.prepare.placed_graph`, the one ``result.graph_hash`` names); the
    file records the step it is of, read from its metadata (`placed_step`), so that
    ``travorder simulate`` and `travorder.placement.launch.apply` build it again.
    ``cluster``: a `Cluster`, a preset name or a cluster file."""
    if result.graph_hash and result.graph_hash != graph.graph_hash:
        raise TravorderError(f"the placement is of graph {result.graph_hash[:12]}, not "
                             f"{graph.graph_hash[:12]} ({graph.name!r}, "
                             f"{describe_step(placed_step(graph))}): save it with the graph "
                             f"placed (travorder.api.placed_graph at the same training=, "
                             f"batch= and micro_batches=)")
    if result.placement.shape != (graph.n_nodes,):
        raise TravorderError(f"the placement has {result.placement.size} entries, graph "
                             f"{graph.name!r} has {graph.n_nodes} nodes")
    cluster = load_cluster(cluster)
    if result.peak_memory.size != cluster.n_devices:
        raise TravorderError(f"the placement is for {result.peak_memory.size} devices, "
                             f"cluster {cluster.name!r} has {cluster.n_devices}")
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "graph": {"name": graph.name, "graph_hash": graph.graph_hash,
                  "n_nodes": graph.n_nodes, **placed_step(graph)},
        "cluster": cluster.to_dict(),
        "devices": [d.name for d in cluster.devices],
        "placement": dict(zip(graph.names.tolist(), result.placement.tolist(), strict=True)),
        "step_time_us": result.step_time_us,
        "lower_bound_us": result.lower_bound_us,
        "efficiency": result.efficiency,
        "feasible": result.feasible,
        "peak_memory": result.peak_memory.tolist(),
        "placer": result.placer,
        "order": result.order,
        "seed": result.seed,
        "wall_s": result.wall_s,
        "single_device_us": result.single_device_us,
        "single_device_feasible": result.single_device_feasible,
        "speedup": result.speedup,
        "fallback": result.fallback,
        "placer_step_time_us": result.placer_step_time_us,
    }


def save_placement(result: PlacementResult, graph: OpGraph, cluster: ClusterSource,
                   path: str | os.PathLike[str]) -> None:
    """Write `result` (a placement of `graph`, the graph placed, on `cluster`) as a
    placement file."""
    if not isinstance(result, PlacementResult):
        raise TravorderError(f"save_placement takes a PlacementResult (from place or "
                             f"place_graph), not {type(result).__name__}")
    doc = placement_doc(result, check_graph(graph, "save_placement"), cluster)
    write_file(path, json_text(doc, indent=1) + "\n", "placement file")


def _read(path: Path) -> dict[str, Any]:
    text = read_text(path, "placement file")
    try:
        doc = parse_json(text)
    except json.JSONDecodeError as exc:
        raise FormatError(f"{str(path)!r} is not a placement file: invalid JSON ({exc})"
                          ) from None
    check_format(doc, str(path), FORMAT, FORMAT_VERSION, "placement file")
    for key, kind in (("graph", dict), ("devices", list), ("placement", dict)):
        if not isinstance(doc.get(key), kind):
            raise FormatError(f"placement file {str(path)!r} lacks a valid {key!r} entry")
    devices = doc["devices"]
    if (not devices or not all(isinstance(d, str) for d in devices)
            or len(set(devices)) < len(devices)):
        raise FormatError(f"placement file {str(path)!r}: devices must be a non-empty list "
                          f"of distinct device names, got {devices!r}")
    step = doc["graph"]
    if not isinstance(step.get("graph_hash"), str):  # else "placement is for graph None"
        raise FormatError(f"placement file {str(path)!r} lacks graph.graph_hash (which "
                          f"graph it places)")
    for key, ok, what in (
            ("training", lambda v: isinstance(v, bool), "true or false"),
            ("batch", lambda v: v is None or _count(v), "null or an integer >= 1"),
            ("micro_batches", _count, "an integer >= 1"),
            ("dims", lambda v: isinstance(v, dict) and all(map(_count, v.values())),
             "an object of symbolic dimension names to integers >= 1")):
        if key in step and not ok(step[key]):
            raise FormatError(f"placement file {str(path)!r}: graph.{key} must be {what}, "
                              f"got {step[key]!r}")
    return doc


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def load_placement(path: str | os.PathLike[str], graph: OpGraph | None = None,
                   cluster: ClusterSource | None = None
                   ) -> tuple[np.ndarray, dict[str, Any]]:
    """Read a placement file: ``(device per node as int64, the whole document)``.

    Given `graph`, the file must be for that graph (same `graph_hash`) and the array
    follows the graph's node order; otherwise it follows the file's. Device indices must
    index the file's devices and, given `cluster`, that cluster's devices. Problems raise
    :class:`~travorder.errors.FormatError` (the file) or
    :class:`~travorder.errors.TravorderError` (a mismatch).
    """
    if graph is not None:
        check_graph(graph, "load_placement")
    if cluster is not None:
        cluster = load_cluster(cluster)
    path = Path(path)
    doc = _read(path)
    mapping: dict[str, Any] = doc["placement"]
    if graph is not None:
        want = doc["graph"].get("graph_hash")
        if want != graph.graph_hash:
            raise TravorderError(f"placement is for graph {str(want)[:12]} "
                                 f"({describe_step(doc['graph'])}), not "
                                 f"{graph.graph_hash[:12]} ({graph.name!r}, "
                                 f"{describe_step(placed_step(graph))}): another model, "
                                 f"or its step at another batch, micro-batch count or "
                                 f"symbolic dimensions (--dim), or not its training step")
        missing = [x for x in graph.names.tolist() if x not in mapping]
        if missing:
            raise TravorderError(f"placement file {str(path)!r} does not place node "
                                 f"{missing[0]!r}")
        extra = [x for x in mapping if x not in graph.index]
        if extra:
            raise TravorderError(f"placement file {str(path)!r} places node {extra[0]!r}, "
                                 f"which graph {graph.name!r} lacks")
        values = [mapping[x] for x in graph.names.tolist()]
    else:
        values = list(mapping.values())
    n_dev = len(doc["devices"])
    if cluster is not None and cluster.n_devices != n_dev:
        raise TravorderError(f"placement file {str(path)!r} is for {n_dev} device"
                             f"{'s' if n_dev != 1 else ''}, cluster {cluster.name!r} has "
                             f"{cluster.n_devices}")
    for name, d in zip(mapping if graph is None else graph.names.tolist(), values,
                       strict=True):
        if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < n_dev:
            raise TravorderError(f"placement file {str(path)!r} puts node {name!r} on "
                                 f"device {d!r}; valid devices are 0..{n_dev - 1}")
    return np.array(values, dtype=np.int64), doc
