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
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from travorder.errors import TravorderError, check_flag, check_seed
from travorder.graph import OpGraph
from travorder.graph.opgraph import check_graph
from travorder.placement.clusters import (
    Cluster,
    ClusterSource,
    check_in_range,
    compute_times,
    load_cluster,
)
from travorder.placement.orders import traversal_order
from travorder.placement.placers.baechi import m_etf, m_sct, m_topo
from travorder.placement.placers.heuristics import (
    contiguous,
    greedy,
    random,
    round_robin,
    single,
)
from travorder.placement.rl import rl_options, rl_place
from travorder.placement.simulator import Simulator, check_placement

PlacerFn = Callable[..., Any]

#: The placers that fix their own visiting order (Baechi's, and one device for all):
#: every traversal order gives them the same placement.
ORDER_FREE = frozenset({"single", "m_topo", "m_etf", "m_sct"})

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

    The single-device floor: ``single_device_us`` is the step time with every node on the
    device `single` picks, ``single_device_feasible`` whether that fits in memory,
    ``speedup`` the floor's step time over this one. ``fallback`` is True when
    `place_graph` was asked for the floor (``floor=True``) and returned the single-device
    placement because the placer's was slower or did not fit; ``placer_step_time_us`` is
    then the step time the placer itself reached (else equal to ``step_time_us``).
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
    single_device_us: float = math.nan
    single_device_feasible: bool = False
    fallback: bool = False
    placer_step_time_us: float = math.nan
    recommendation: Any = None

    @property
    def speedup(self) -> float:
        """The single-device step time over this placement's (> 1: faster than one device)."""
        return self.single_device_us / self.step_time_us if self.step_time_us else 1.0

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
            "single_device_us": self.single_device_us,
            "single_device_feasible": self.single_device_feasible,
            "speedup": self.speedup,
            "fallback": self.fallback,
            "placer_step_time_us": self.placer_step_time_us,
            "recommendation": (None if self.recommendation is None
                               else self.recommendation.to_dict()),
        }


def _check_options(name: str, fn: PlacerFn, options: dict[str, Any]) -> None:
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    allowed = list(params)[4:]
    for key, value in options.items():
        if key not in allowed:
            valid = ", ".join(allowed) if allowed else "none"
            raise TravorderError(f"placer {name!r} has no option {key!r} (options: {valid})")
        default = params[key].default
        if isinstance(default, bool) and not isinstance(value, bool | np.bool_):
            raise TravorderError(f"placer {name!r} option {key} must be true or false, got "
                                 f"{value!r}")


def canonical_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """The options of placer ``name`` checked, each value as the placer reads it (for
    ``rl``, ``gamma = 1`` is ``1.0``), so that one configuration has one hash.

    >>> canonical_options("greedy", {"colocate": False})
    {'colocate': False}
    """
    fn = get_placer(name)
    _check_options(name, fn, options)
    return rl_options(options) if fn is rl_place else dict(options)


def place_graph(graph: OpGraph, cluster: ClusterSource, placer: str = "greedy",
                order: str = "topo", seed: int = 0, *, floor: bool = False,
                **options: Any) -> PlacementResult:
    """Place `graph` on `cluster` (a `Cluster`, preset name or file) with `placer`, visiting
    nodes in traversal `order`; `options` go to the placer (e.g. ``colocate=False``).

    The result always carries the single-device floor. With ``floor=True``, a placement
    slower than a feasible single-device one (or infeasible where that one fits) is
    replaced by the single-device placement, flagged ``fallback``.

    Raises TravorderError for an unknown placer, order or option, and for op and transfer
    times that overflow a float (`check_in_range`).
    """
    cluster = load_cluster(cluster)
    check_graph(graph, "place_graph")
    seed = check_seed(seed)  # np.int64 too: the result's seed is an int
    fn = get_placer(placer)
    _check_options(placer, fn, options)
    check_in_range(graph, cluster, compute_times(graph, cluster))  # before a placer sums
    t0 = time.perf_counter()
    visit = traversal_order(graph, order, seed)
    out = fn(graph, cluster, visit, seed, **options)
    wall = time.perf_counter() - t0
    placement, curve = out if isinstance(out, tuple) else (out, None)
    return evaluate_placement(graph, cluster, placement, placer=placer, order=order,
                              seed=seed, wall_s=wall, learning_curve=curve, floor=floor)


def falls_back(step_time_us: Any, feasible: Any, single_device_us: Any,
               single_device_feasible: Any) -> Any:
    """Whether the single-device placement replaces a placer's (elementwise): one device
    fits, and the placer's placement does not or is slower.

    >>> bool(falls_back(120.0, True, 100.0, True)), bool(falls_back(90.0, False, 100.0, True))
    (True, True)
    >>> bool(falls_back(90.0, True, 100.0, True)), bool(falls_back(120.0, True, 100.0, False))
    (False, False)
    """
    return np.logical_and(single_device_feasible, np.logical_or(
        np.logical_not(feasible), np.less(single_device_us, step_time_us)))


def evaluate_placement(graph: OpGraph, cluster: Cluster, placement: Any, *, placer: str,
                       order: str, seed: int, wall_s: float,
                       learning_curve: Any = None, floor: bool = False) -> PlacementResult:
    """The `PlacementResult` of a placement a placer made: simulated, with the
    single-device floor (see `place_graph` for ``floor``)."""
    cluster = load_cluster(cluster)
    check_graph(graph, "evaluate_placement")
    seed, floor = check_seed(seed), check_flag(floor, "floor")
    placement = check_placement(graph, cluster, placement)
    if placement.ndim != 1:
        raise TravorderError("evaluate_placement takes one placement (a device per node)")
    simulator = Simulator(graph, cluster)
    sim = simulator.run(placement)
    alone = single(graph, cluster, np.arange(graph.n_nodes), seed)
    floor_sim = simulator.run(alone)
    fallback = floor and bool(falls_back(sim.step_time_us, sim.feasible,
                                         floor_sim.step_time_us, floor_sim.feasible))
    chosen, chosen_sim = (alone, floor_sim) if fallback else (placement, sim)
    return PlacementResult(
        placement=chosen, step_time_us=chosen_sim.step_time_us,
        lower_bound_us=chosen_sim.lower_bound_us, efficiency=chosen_sim.efficiency,
        feasible=chosen_sim.feasible, peak_memory=chosen_sim.peak_memory, placer=placer,
        order=order, seed=seed, wall_s=wall_s,
        learning_curve=None if learning_curve is None else list(learning_curve),
        graph_hash=graph.graph_hash, single_device_us=floor_sim.step_time_us,
        single_device_feasible=floor_sim.feasible, fallback=fallback,
        placer_step_time_us=sim.step_time_us,
    )


def with_floor(result: PlacementResult, graph: OpGraph, cluster: Cluster) -> PlacementResult:
    """``result`` (a placement of ``graph`` on ``cluster``) as `place_graph` with
    ``floor=True`` would have returned it."""
    return evaluate_placement(graph, cluster, result.placement, placer=result.placer,
                              order=result.order, seed=result.seed, wall_s=result.wall_s,
                              learning_curve=result.learning_curve, floor=True)
