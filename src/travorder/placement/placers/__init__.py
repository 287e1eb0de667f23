"""Placers behind one interface: `place_graph` and the `PLACERS` registry.

A placer is a function ``(graph, cluster, order, seed, **options) -> placement`` where
``order`` is the traversal order as a permutation of node indices and the placement is an
int64 array with a device index per node, or a tuple ``(placement, learning_curve)`` for
placers that learn. `place_graph` computes the order, runs the placer, times it, simulates the
placement with :class:`~travorder.placement.simulator.Simulator` and returns a
`PlacementResult`: step times and feasibility always come from the simulator.

`place_graph` places an `OpGraph` as it is; `travorder.place` (`travorder.api`) is the
launcher's call: it also reads model files, expands a forward graph into its training
step and can choose the order (``order="auto"``).

Memory: the placers other than ``single`` choose only devices where the node still fits a
conservative memory estimate (see :mod:`travorder.placement.placers.schedule`); when
nothing fits they go on regardless, and ``feasible`` (the simulator's verdict) is False.

>>> from travorder.graph import OpGraph
>>> g = OpGraph(["a", "b", "c"], [0, 0], [1, 2], time_us=[5.0, 50.0, 50.0])
>>> r = place_graph(g, "v100x4-nvlink", placer="greedy", order="topo")
>>> r.placement.tolist(), r.feasible
([0, 0, 1], True)
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from travorder.errors import TravorderError
from travorder.graph import OpGraph
from travorder.placement.clusters import Cluster, load_cluster
from travorder.placement.orders import traversal_order
from travorder.placement.placers.baechi import m_etf, m_sct, m_topo
from travorder.placement.placers.heuristics import (
    contiguous,
    greedy,
    random,
    round_robin,
    single,
)
from travorder.placement.rl import rl_place
from travorder.placement.simulator import Simulator

PlacerFn = Callable[..., Any]

#: Placer name -> function(graph, cluster, order_indices, seed, **options).
PLACERS: dict[str, PlacerFn] = {
    "single": single,
    "round_robin": round_robin,
    "random": random,
    "contiguous": contiguous,
    "greedy": greedy,
    "m_topo": m_topo,
    "m_etf": m_etf,
    "m_sct": m_sct,
    "rl": rl_place,
}


def register_placer(name: str, fn: PlacerFn) -> None:
    """Add (or replace) a placer in `PLACERS`."""
    PLACERS[name] = fn


def get_placer(name: str) -> PlacerFn:
    """The placer registered under `name`, or TravorderError listing the valid names."""
    try:
        return PLACERS[name]
    except (KeyError, TypeError):
        raise TravorderError(
            f"unknown placer {name!r}; valid placers: {', '.join(sorted(PLACERS))}"
        ) from None


@dataclass(frozen=True, eq=False)
class PlacementResult:
    """A placement and how it performs in the simulator.

    ``placement``: device index per node (int64). ``step_time_us``, ``lower_bound_us``,
    ``efficiency`` (lower bound / step time), ``feasible`` (every device's peak memory
    fits) and ``peak_memory`` (bytes per device) come from the simulator; ``wall_s`` is
    the time spent computing the order and running the placer; ``learning_curve`` the
    step time per episode for placers that learn, else None; ``graph_hash`` that of the
    placed graph; ``recommendation``: when `travorder.place` chose the order
    (``order="auto"``), the `travorder.api.Recommendation` that chose it (its
    ``probability``, and with ``verify`` the step time of each order it checked in
    ``verified``), else None.
    """

    placement: np.ndarray
    step_time_us: float
    lower_bound_us: float
    efficiency: float
    feasible: bool
    peak_memory: np.ndarray
    placer: str
    order: str
    seed: int
    wall_s: float
    learning_curve: list[float] | None = None
    graph_hash: str = ""
    recommendation: Any = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (arrays as lists)."""
        return {
            "placement": self.placement.tolist(),
            "step_time_us": self.step_time_us,
            "lower_bound_us": self.lower_bound_us,
            "efficiency": self.efficiency,
            "feasible": self.feasible,
            "peak_memory": self.peak_memory.tolist(),
            "placer": self.placer,
            "order": self.order,
            "seed": self.seed,
            "wall_s": self.wall_s,
            "learning_curve": self.learning_curve,
            "graph_hash": self.graph_hash,
            "recommendation": (None if self.recommendation is None
                               else self.recommendation.to_dict()),
        }


def _check_options(name: str, fn: PlacerFn, options: dict[str, Any]) -> None:
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    allowed = list(params)[4:]
    for key in options:
        if key not in allowed:
            valid = ", ".join(allowed) if allowed else "none"
            raise TravorderError(f"placer {name!r} has no option {key!r} (options: {valid})")


def place_graph(graph: OpGraph, cluster: Cluster | str, placer: str = "greedy",
          order: str = "topo", seed: int = 0, **options: Any) -> PlacementResult:
    """Place `graph` on `cluster` (a `Cluster`, preset name or file) with `placer`, visiting
    nodes in traversal `order`; `options` go to the placer (e.g. ``colocate=False``).

    Raises TravorderError for an unknown placer, order or option.
    """
    cluster = load_cluster(cluster)
    fn = get_placer(placer)
    _check_options(placer, fn, options)
    t0 = time.perf_counter()
    visit = traversal_order(graph, order, seed)
    out = fn(graph, cluster, visit, seed, **options)
    wall = time.perf_counter() - t0
    placement, curve = out if isinstance(out, tuple) else (out, None)
    sim = Simulator(graph, cluster).run(placement)
    return PlacementResult(
        placement=np.asarray(placement, dtype=np.int64), step_time_us=sim.step_time_us,
        lower_bound_us=sim.lower_bound_us, efficiency=sim.efficiency,
        feasible=sim.feasible, peak_memory=sim.peak_memory, placer=placer, order=order,
        seed=seed, wall_s=wall, learning_curve=None if curve is None else list(curve),
        graph_hash=graph.graph_hash,
    )
