"""Cluster features: what a device cluster looks like to a placer, as numbers.

The function reads a cluster through its attributes (``devices`` with ``peak_flops``,
``mem_bw``, ``memory``; ``bandwidth`` and ``latency`` matrices in B/us and us;
``link_model``; ``busy_after_us``; ``param_copies``), so this stage does not depend on
the placement stage that defines :class:`~travorder.placement.clusters.Cluster`.

Large magnitudes are given as base-10 logarithms; unlimited memory counts as 1 PB.

>>> from travorder.placement.clusters import load_cluster
>>> f = cluster_features(load_cluster("k80x3"))
>>> f["n_devices"], f["link_bus"]
(3.0, 1.0)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from travorder.errors import TravorderError

#: Cluster feature names, in order.
CLUSTER_FEATURE_NAMES = (
    "n_devices",
    "log_peak_flops",
    "peak_flops_ratio",
    "log_mem_bw",
    "log_memory",
    "log_link_bw",
    "link_bw_ratio",
    "link_latency_us",
    "log_flops_per_link_byte",
    "busy_after_us",
    "param_copies",
    "link_bus",
    "link_channel",
    "link_link",
)

_UNLIMITED_MEMORY = 1e15


def cluster_features(cluster: Any) -> dict[str, float]:
    """Features of ``cluster`` (a `travorder.placement.Cluster`), keyed and ordered as
    `CLUSTER_FEATURE_NAMES`."""
    if not hasattr(cluster, "devices"):  # a preset's name: the presets live downstream
        raise TravorderError(f"cluster_features takes a Cluster (travorder.placement."
                             f"load_cluster({cluster!r})), not {cluster!r}")
    peak = np.array([d.peak_flops for d in cluster.devices], dtype=float)
    mem_bw = np.array([d.mem_bw for d in cluster.devices], dtype=float)
    memory = np.array([min(d.memory, _UNLIMITED_MEMORY) for d in cluster.devices])
    n = peak.size
    off = ~np.eye(n, dtype=bool)
    link_bw = np.asarray(cluster.bandwidth, dtype=float)[off] * 1e6  # B/us -> B/s
    link_bw = np.minimum(link_bw, 1e15)  # an infinite link is just a very fast one
    latency = np.asarray(cluster.latency, dtype=float)[off]
    mean_link_bw = float(link_bw.mean()) if n > 1 else 1e15
    return {
        "n_devices": float(n),
        "log_peak_flops": math.log10(peak.mean()),
        "peak_flops_ratio": float(peak.max() / peak.min()),
        "log_mem_bw": math.log10(mem_bw.mean()),
        "log_memory": math.log10(memory.min()),
        "log_link_bw": math.log10(mean_link_bw),
        "link_bw_ratio": float(link_bw.max() / link_bw.min()) if n > 1 else 1.0,
        "link_latency_us": float(latency.mean()) if n > 1 else 0.0,
        "log_flops_per_link_byte": math.log10(peak.mean() / mean_link_bw),
        "busy_after_us": float(cluster.busy_after_us),
        "param_copies": float(cluster.param_copies),
        "link_bus": float(cluster.link_model == "bus"),
        "link_channel": float(cluster.link_model == "channel"),
        "link_link": float(cluster.link_model == "link"),
    }
