"""Placement files: a placement with the graph, cluster and figures it belongs to (JSON).

::

    {"format": "travorder.placement", "format_version": 1,
     "graph": {"name": ..., "graph_hash": ..., "n_nodes": ...},
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

``placement`` maps every node name to a device index into ``devices``, in the graph's
node order. Unlimited memory and infinite bandwidth in the cluster are written as
``null`` so the file is strict JSON.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from travorder.errors import (
    FormatError,
    TravorderError,
    check_format,
    json_text,
    read_text,
    write_file,
)
from travorder.graph import OpGraph
from travorder.placement.clusters import Cluster
from travorder.placement.placers import PlacementResult

FORMAT = "travorder.placement"
FORMAT_VERSION = 1


def placement_doc(result: PlacementResult, graph: OpGraph, cluster: Cluster, *,
                  batch: int | None = None, micro_batches: int = 1) -> dict[str, Any]:
    """The placement file's content as a dict; ``batch`` and ``micro_batches``: the
    training step ``graph`` is of (`travorder.graph.prepare.placed_graph`), recorded so
    that ``travorder simulate`` builds it again."""
    if result.placement.shape != (graph.n_nodes,):
        raise TravorderError(f"the placement has {result.placement.size} entries, graph "
                             f"{graph.name!r} has {graph.n_nodes} nodes")
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "graph": {"name": graph.name, "graph_hash": graph.graph_hash,
                  "n_nodes": graph.n_nodes, "batch": batch, "micro_batches": micro_batches},
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


def save_placement(result: PlacementResult, graph: OpGraph, cluster: Cluster,
                   path: str | os.PathLike[str], *, batch: int | None = None,
                   micro_batches: int = 1) -> None:
    """Write `result` (a placement of `graph` on `cluster`) as a placement file (see
    `placement_doc` for ``batch`` and ``micro_batches``)."""
    doc = placement_doc(result, graph, cluster, batch=batch, micro_batches=micro_batches)
    write_file(path, json_text(doc, indent=1) + "\n", "placement file")


def _read(path: Path) -> dict[str, Any]:
    text = read_text(path, "placement file")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FormatError(f"{str(path)!r} is not a placement file: invalid JSON ({exc})"
                          ) from None
    check_format(doc, str(path), FORMAT, FORMAT_VERSION, "placement file")
    for key, kind in (("graph", dict), ("devices", list), ("placement", dict)):
        if not isinstance(doc.get(key), kind):
            raise FormatError(f"placement file {str(path)!r} lacks a valid {key!r} entry")
    return doc


def load_placement(path: str | os.PathLike[str], graph: OpGraph | None = None,
                   cluster: Cluster | None = None) -> tuple[np.ndarray, dict[str, Any]]:
    """Read a placement file: ``(device per node as int64, the whole document)``.

    Given `graph`, the file must be for that graph (same `graph_hash`) and the array
    follows the graph's node order; otherwise it follows the file's. Device indices must
    index the file's devices and, given `cluster`, that cluster's devices. Problems raise
    :class:`~travorder.errors.FormatError` (the file) or
    :class:`~travorder.errors.TravorderError` (a mismatch).
    """
    path = Path(path)
    doc = _read(path)
    mapping: dict[str, Any] = doc["placement"]
    if graph is not None:
        want = doc["graph"].get("graph_hash")
        if want != graph.graph_hash:
            raise TravorderError(f"placement is for graph {str(want)[:12]}, not "
                                 f"{graph.graph_hash[:12]} ({graph.name!r}): another model, "
                                 f"or its step at another batch or micro-batch count, or "
                                 f"not its training step")
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
        raise TravorderError(f"placement is for {n_dev} devices, cluster {cluster.name!r} "
                             f"has {cluster.n_devices}")
    for name, d in zip(mapping if graph is None else graph.names.tolist(), values,
                       strict=True):
        if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < n_dev:
            raise TravorderError(f"placement file {str(path)!r} puts node {name!r} on "
                                 f"device {d!r}; valid devices are 0..{n_dev - 1}")
    return np.array(values, dtype=np.int64), doc
