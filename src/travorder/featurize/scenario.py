"""Scenario features: what a user can compute for their own model, batch and cluster.

Beside the graph's and the cluster's own features, the predictor sees how the two meet:

- ``log_batch``: log10 of the training batch the graph is costed at (its ``batch_size``);
- ``micro_batches``: the micro-batches the training step is pipelined over (1: none);
- ``memory_pressure``: the single-device peak memory of the training step over the
  smallest device memory (> 1: one device cannot hold the step);
- ``log_compute_to_transfer``: log10 of the step's total compute time over the time to
  send the tensor of every edge once over the cluster's mean link: per edge the mean
  latency and the link's busy time, plus the bytes over the mean bandwidth (a tensor with
  three consumers counts three times; large: compute-bound).

The caller passes the quantities that need the simulator (this stage comes before it):
the compute time per node and the single-device peak.

>>> from travorder.graph import OpGraph
>>> from travorder.placement.clusters import load_cluster
>>> g = OpGraph(["a", "b"], [0], [1], edge_bytes=[7600.0], meta={"batch_size": 10})
>>> f = scenario_features(g, load_cluster("k80x3"), [13.0, 13.0], 6 * 2**30)  # 12 GiB
>>> f["log_batch"], f["micro_batches"], f["memory_pressure"], f["log_compute_to_transfer"]
(1.0, 1.0, 0.5, 0.0)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from travorder.graph import OpGraph

#: Scenario feature names, in order.
SCENARIO_FEATURE_NAMES = ("log_batch", "micro_batches", "memory_pressure",
                          "log_compute_to_transfer")


def scenario_features(graph: OpGraph, cluster: Any, compute_us: Any,
                      single_peak_bytes: float) -> dict[str, float]:
    """Features of ``graph`` on ``cluster`` (see the module): ``compute_us`` is each node's
    compute time (us, e.g. on the fastest device), ``single_peak_bytes`` the peak memory
    of the step with every node on one device."""
    n = len(cluster.devices)
    memory = min(d.memory for d in cluster.devices)
    off = ~np.eye(n, dtype=bool)
    if n > 1:
        bandwidth = float(np.minimum(np.asarray(cluster.bandwidth)[off], 1e15).mean())
        latency = float(np.asarray(cluster.latency)[off].mean())
    else:
        bandwidth, latency = 1e15, 0.0
    transfer = graph.n_edges * (latency + cluster.busy_after_us) + float(
        graph.edge_bytes.sum()) / bandwidth
    compute = float(np.sum(compute_us))
    return {
        "log_batch": math.log10(max(float(graph.meta.get("batch_size") or 1), 1.0)),
        "micro_batches": float(graph.meta.get("micro_batches", 1)),
        "memory_pressure": float(single_peak_bytes) / memory if math.isfinite(memory)
        else 0.0,
        "log_compute_to_transfer": math.log10(max(compute, 1e-9) / max(transfer, 1e-9)),
    }
