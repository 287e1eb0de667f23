"""Placeto's placement MDP as a Gymnasium environment.

An episode visits every node once, in the traversal order; at each step the action is
the device of the node being visited (the *current* node), the placement is simulated
and the reward is ``log(old cost) - log(new cost)``, so an improvement is positive and an
episode's rewards sum to ``log(cost at start) - log(cost at end)``. The cost is the
simulated step time (us), times ``1 + memory_penalty * overflow`` in ``"penalty"``
mode (below).

Each episode starts from the best placement found so far, as in the study (at first
every node on device 0). "Best" prefers feasible placements, then lower cost. A seeded
``reset(seed=...)`` starts a new search (the best placement is forgotten); ``reset()``
continues it.

Colocation (``colocate=True``, as the other placers): a node's colocation group moves
with it, and a group is decided at the first of its members the episode visits; the later
members get a one-device mask and change nothing.

Memory (``memory``):

* ``"mask"`` (default): a device is allowed only if the placement stays feasible (peak
  memory within every device's capacity). If no device is, those that overflow least
  are. A step can therefore never turn a feasible placement infeasible. When even the
  worst case (`worst_case_memory`: every parameter and every tensor on one device) fits
  the smallest device, every placement is feasible and nothing is simulated for the
  mask; otherwise the candidate placements are simulated as one batch and the chosen
  one's step time is reused (the candidate that leaves the node where it is is the
  present placement, whose result is known and not simulated again).
* ``"penalty"``: every device is allowed and the cost of an infeasible placement is
  ``step_time * (1 + memory_penalty * overflow)``, ``overflow`` being the largest
  ``(peak - capacity) / capacity`` over the devices.

An action outside the mask is remapped to the node's present device if that is allowed,
else to the lowest allowed device; ``info["device"]`` reports the device applied.

Observation (a dict): ``node`` (the current node; 0 once the episode is over),
``placement``, ``done`` (visited this episode), ``start`` (each node's start time in
the episode's starting placement, as a fraction of its step time) and ``action_mask``.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from travorder.errors import TravorderError
from travorder.graph import OpGraph, colocation_groups
from travorder.placement.clusters import Cluster
from travorder.placement.simulator import BatchResult, Simulator

MEMORY_MODES = ("mask", "penalty")


def worst_case_memory(graph: OpGraph, cluster: Cluster) -> float:
    """Bytes one device would hold if it had every op's parameters and, of every op, the
    larger of its output and its largest sent tensor (a device holds a tensor or one
    received copy of it, never both): an upper bound on any device's peak, any placement.
    """
    largest_edge = np.zeros(graph.n_nodes)
    np.maximum.at(largest_edge, graph.src, graph.edge_bytes)
    return float(np.sum(graph.param_bytes * cluster.param_copies)
                 + np.sum(np.maximum(graph.output_bytes, largest_edge)))


def feasible_starts(graph: OpGraph, cluster: Cluster, colocate: bool = True
                    ) -> list[np.ndarray]:
    """Placements of heuristics that mind memory (``contiguous`` and ``greedy`` in
    ``topo`` order, ``m_etf``): where to start when one device cannot hold the step."""
    from travorder.placement.placers import PLACERS

    return [PLACERS[name](graph, cluster, graph.topo_order, 0, colocate=colocate)
            for name in ("contiguous", "greedy", "m_etf")]


def _log(cost: float) -> float:
    return math.log(max(cost, 1e-9))  # a graph of zero-time ops has a 0 us step


def check_order(graph: OpGraph, order: Any) -> np.ndarray:
    """``order`` as an int64 permutation of the node indices, or TravorderError."""
    a = np.asarray(order)
    if (a.ndim != 1 or not np.issubdtype(a.dtype, np.integer)
            or not np.array_equal(np.sort(a), np.arange(graph.n_nodes))):
        raise TravorderError(f"a traversal order must be a permutation of the "
                             f"{graph.n_nodes} node indices of {graph.name!r}")
    return a.astype(np.int64)


class PlacementEnv(gym.Env):
    """Sequential placement of ``graph`` on ``cluster`` in traversal ``order``.

    ``order`` is a permutation of node indices (see `travorder.placement.orders`);
    ``simulator`` may be passed to share its precomputation.

    >>> from travorder.placement.clusters import load_cluster
    >>> g = OpGraph(["a", "b"], [], [], time_us=[10.0, 10.0])
    >>> env = PlacementEnv(g, load_cluster("k80x3"), [0, 1])
    >>> obs, info = env.reset(seed=0)
    >>> obs, reward, *_ = env.step(0)   # a stays on device 0
    >>> obs, reward, terminated, _, info = env.step(1)   # b moves to device 1
    >>> terminated, info["step_time_us"], round(reward, 3)  # log(31.4 / 15.7)
    (True, 15.7, 0.693)
    """

    metadata = {"render_modes": []}  # noqa: RUF012 (Gymnasium's convention)

    def __init__(self, graph: OpGraph, cluster: Cluster, order: Any, *,
                 memory: str = "mask", memory_penalty: float = 10.0, colocate: bool = True,
                 simulator: Simulator | None = None) -> None:
        if graph.n_nodes == 0:
            raise TravorderError(f"graph {graph.name!r} has no nodes to place")
        if memory not in MEMORY_MODES:
            raise TravorderError(f"unknown memory mode {memory!r} (expected "
                                 f"{' or '.join(MEMORY_MODES)})")
        if not (memory_penalty >= 0 and math.isfinite(memory_penalty)):
            raise TravorderError(f"memory_penalty must be finite and non-negative, got "
                                 f"{memory_penalty}")
        self.graph, self.cluster = graph, cluster
        self.order = check_order(graph, order)
        self.memory, self.memory_penalty = memory, float(memory_penalty)
        self.colocate = colocate
        self.simulations = 0  # placements simulated for costs and masks (not start times)
        self._start_of = np.empty(0, dtype=np.int64)  # the placement of the start times
        self.sim = simulator or Simulator(graph, cluster)
        self.capacity = np.array([d.memory for d in cluster.devices])
        self.always_fits = bool(worst_case_memory(graph, cluster) <= self.capacity.min())
        n, n_dev = graph.n_nodes, cluster.n_devices
        self.n_devices = n_dev
        group = colocation_groups(graph, colocate)
        by_group = np.argsort(group, kind="stable")
        bounds = np.searchsorted(group[by_group], np.arange(group.max() + 2))
        self._group, self._by_group, self._bounds = group, by_group, bounds
        self.action_space = spaces.Discrete(n_dev)
        self.observation_space = spaces.Dict({
            "node": spaces.Discrete(n),
            "placement": spaces.MultiDiscrete(np.full(n, n_dev)),
            "done": spaces.MultiBinary(n),
            "start": spaces.Box(0.0, 1.0, (n,), dtype=np.float64),
            "action_mask": spaces.MultiBinary(n_dev),
        })
        self._restart()

    # ---------------------------------------------------------------- bookkeeping
    def members(self, v: int) -> np.ndarray:
        """The nodes that move with ``v`` (its colocation group, ``v`` included)."""
        g = self._group[v]
        return self._by_group[self._bounds[g]:self._bounds[g + 1]]

    def deciders(self) -> np.ndarray:
        """The nodes where an episode can take a decision, sorted: the first member of
        each colocation group in the order (the others follow it)."""
        _, first = np.unique(self._group[self.order], return_index=True)
        return np.sort(self.order[first])

    def _cost(self, step: float, feasible: bool, overflow: float) -> float:
        """The cost the reward sees: the step time, penalised when over memory."""
        return step if feasible else step * (1.0 + self.memory_penalty * max(overflow, 0.0))

    def _evaluate(self, placement: np.ndarray) -> tuple[float, float, bool, float]:
        """(cost, step time, feasible, overflow) of a placement."""
        res = self.sim.run_batch(placement[None])
        self.simulations += 1
        step, feasible, over = (float(res.step_time_us[0]), bool(res.feasible[0]),
                                float(res.overflow[0]))
        return self._cost(step, feasible, over), step, feasible, over

    def _restart(self) -> None:
        self._fresh = True  # no episode since: a seeded reset need not start over
        self.best_placement = np.zeros(self.graph.n_nodes, dtype=np.int64)
        (self.best_cost, self.best_step_us, self.best_feasible,
         self.best_overflow) = self._evaluate(self.best_placement)
        if not self.best_feasible:  # one device cannot hold the step: start from a heuristic
            for placement in feasible_starts(self.graph, self.cluster, self.colocate):
                cost, step, feasible, over = self._evaluate(placement)
                if self._better(cost, feasible):
                    self.best_placement = placement
                    (self.best_cost, self.best_step_us, self.best_feasible,
                     self.best_overflow) = cost, step, feasible, over

    def _better(self, cost: float, feasible: bool) -> bool:
        return (not feasible, cost) < (not self.best_feasible, self.best_cost)

    def _candidates(self, v: int) -> tuple[np.ndarray, BatchResult | None]:
        """The action mask for node ``v`` and, when they were simulated, the results of
        the candidate placements (one per device)."""
        n_dev = self.n_devices
        mask = np.ones(n_dev, dtype=np.int8)
        if self._decided[self._group[v]]:
            mask[:] = 0
            mask[self.placement[v]] = 1
            return mask, None
        if self.memory == "penalty" or self.always_fits:
            return mask, None
        members, here = self.members(v), self.placement[v]
        # the group staying where it is leaves the present placement: known, not simulated
        stays = np.all(self.placement[members] == here)
        devices = np.flatnonzero(np.arange(n_dev) != here) if stays else np.arange(n_dev)
        cands = np.repeat(self.placement[None], devices.size, axis=0)
        cands[:, members] = devices[:, None]
        res = self.sim.run_batch(cands)
        self.simulations += devices.size
        step = np.full(n_dev, self.step_us)
        feasible = np.full(n_dev, self.feasible)
        over = np.full(n_dev, self.overflow)
        step[devices], feasible[devices], over[devices] = res
        # the feasible devices, or else those that overflow least
        mask[:] = feasible if feasible.any() else over == over.min()
        return mask, BatchResult(step, feasible, over)

    def _obs(self) -> dict[str, Any]:
        return {
            "node": int(self.order[self.t]) if self.t < self.order.size else 0,
            "placement": self.placement.copy(),
            "done": self.done.copy(),
            "start": self._start.copy(),
            "action_mask": self._mask.copy(),
        }

    def _info(self) -> dict[str, Any]:
        return {"step_time_us": self.step_us, "feasible": self.feasible,
                "best_step_time_us": self.best_step_us}

    # ---------------------------------------------------------------- Gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        if seed is not None and not self._fresh:
            self._restart()
        self._fresh = False
        self.placement = self.best_placement.copy()
        self.cost, self.step_us = self.best_cost, self.best_step_us
        self.feasible, self.overflow = self.best_feasible, self.best_overflow
        if not np.array_equal(self.placement, self._start_of):  # else the same start times
            r = self.sim.run(self.placement)
            self._start = r.start_us / r.step_time_us if r.step_time_us > 0 else r.start_us
            self._start_of = self.placement.copy()
        self.done = np.zeros(self.graph.n_nodes, dtype=np.int8)
        self._decided = np.zeros(self._bounds.size - 1, dtype=bool)
        self.t = 0
        self._mask, self._cand = self._candidates(int(self.order[0]))
        return self._obs(), self._info()

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        if self.t >= self.order.size:
            raise TravorderError("the episode is over; call reset()")
        v = int(self.order[self.t])
        d = int(action)
        if not (0 <= d < self.n_devices and self._mask[d]):
            here = int(self.placement[v])
            d = here if self._mask[here] else int(np.flatnonzero(self._mask)[0])
        moved = self.members(v)
        reward = 0.0
        if self.placement[v] != d:
            self.placement[moved] = d
            old = self.cost
            if self._cand is not None:  # simulated for the mask already
                self.step_us = float(self._cand.step_time_us[d])
                self.feasible = bool(self._cand.feasible[d])
                self.overflow = float(self._cand.overflow[d])
                self.cost = self._cost(self.step_us, self.feasible, self.overflow)
            else:
                self.cost, self.step_us, self.feasible, self.overflow = self._evaluate(
                    self.placement)
            reward = _log(old) - _log(self.cost)
            if self._better(self.cost, self.feasible):
                self.best_placement = self.placement.copy()
                self.best_cost, self.best_step_us = self.cost, self.step_us
                self.best_feasible, self.best_overflow = self.feasible, self.overflow
        self._decided[self._group[v]] = True
        self.done[v] = 1
        self.t += 1
        terminated = self.t == self.order.size
        if not terminated:
            self._mask, self._cand = self._candidates(int(self.order[self.t]))
        info = self._info()
        info.update(device=d, moved=moved.copy())
        return self._obs(), reward, terminated, False, info
