"""The timeline of a simulated step, as a picture or a trace file.

`Simulator.timeline(placement)` (or `timeline(graph, placement, cluster)`) gives a
`Timeline`: the `SimResult` and every transfer. From it:

- `critical_path` finds the chain of ops and transfers that ends the step;
- `trace_events` / `write_trace` give the Chrome trace event format (Perfetto,
  chrome://tracing): one track per device and per transfer queue;
- `plot_gantt` draws it with matplotlib (the ``report`` extra).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from travorder.graph import OpGraph
from travorder.placement.clusters import Cluster
from travorder.placement.simulator import SimResult, Simulator, Transfer


@dataclass(frozen=True, eq=False)
class Timeline:
    """A simulated step in full: ``result`` (start and finish of every op) and
    ``transfers`` (in the order they were granted) of ``graph`` placed by ``placement``
    on ``cluster``."""

    graph: OpGraph
    cluster: Cluster
    placement: np.ndarray
    result: SimResult
    transfers: tuple[Transfer, ...]


def timeline(graph: OpGraph, placement: Any, cluster: Cluster) -> Timeline:
    """The `Timeline` of one placement (`Simulator.timeline`)."""
    return Simulator(graph, cluster).timeline(placement)
