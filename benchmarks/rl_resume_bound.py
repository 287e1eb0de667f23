"""How much of an RL run's simulations a simulation resumed part-way could skip.

A placement an RL step simulates differs from the episode's present placement (the one
the step starts from) only in the moved colocation group(s), so its discrete-event
simulation is the present placement's up to the first event that reads the device of a
moved node: the finish of one of its predecessors (the very start for a source). A
simulation resumed from a state saved just before that event would skip the events
before it. For every placement a ``paper`` run simulates (stepwise engine: the same run
as the compiled one), this counts the present placement's ops that finish strictly
before that point and prints their share of all the run's op finishes, per order:

* *at most*: a resume from a state saved exactly there, for every simulation (no exact
  resume skips more);
* *saved at the next decision*: each simulated placement saves its state before the
  first event that reads a node of the next group in the order still to be decided (the
  group the episode's next step moves, if it moves one), and a simulation resumes from
  its present placement's saved state when no moved node is read before it.

Saving and restoring the state costs extra; these are shares of events, not of time.
The graphs and options are those of ``benchmarks/rl.py`` (synthetic family's training
graph on ``k80x3``, seed 0).

    python benchmarks/rl_resume_bound.py [--family inception] [--orders topo_lifo,...]
                                         [--memory F] [--micro-batches M] [--episodes N]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

from rl import SIZES, bench_graph  # benchmarks/rl.py, beside this script
from travorder.graph import OpGraph
from travorder.placement.clusters import Cluster
from travorder.placement.orders import STUDY_ORDERS, traversal_order
from travorder.placement.rl.env import PlacementEnv
from travorder.placement.rl.trainer import RLConfig, train
from travorder.placement.simulator import BatchResult, Simulator


class Resumes:
    """Op finishes a resume skips, counted over the placements a run simulates."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self._ptr, self._idx = sim.graph.pred_csr
        self._finish: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}
        self._saved: dict[int, float] = {}  # placement's hash -> when its state was saved
        self.present: np.ndarray | None = None  # None: a start placement, no resume
        self.watch: np.ndarray | None = None  # nodes of the next group to decide
        self.at_most = self.at_next = self.resumed = self.simulated = 0

    def _finish_of(self, placement: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each node's finish time, and all of them sorted."""
        key = placement.tobytes()
        if key not in self._finish:
            if len(self._finish) > 2_000:
                self._finish.clear()
            finish = self.sim.run(placement).finish_us
            self._finish[key] = (finish, np.sort(finish))
        return self._finish[key]

    def _first_read(self, finish: np.ndarray, nodes: np.ndarray) -> float:
        """When the first event that reads the device of one of ``nodes`` happens."""
        first = np.inf
        for v in nodes:
            lo, hi = self._ptr[v], self._ptr[v + 1]
            if lo == hi:
                return -np.inf
            first = min(first, finish[self._idx[lo:hi]].min())
        return first

    def count(self, placement: np.ndarray) -> None:
        self.simulated += 1
        finish, _ = self._finish_of(placement)
        self._saved[hash(placement.tobytes())] = (-np.inf if self.watch is None
                                            else self._first_read(finish, self.watch))
        if self.present is None:
            return
        finish, ordered = self._finish_of(self.present)
        first = self._first_read(finish, np.flatnonzero(placement != self.present))
        self.at_most += int(np.searchsorted(ordered, first, "left"))
        saved = self._saved.get(hash(self.present.tobytes()), -np.inf)
        if saved > -np.inf and first >= saved:
            self.resumed += 1
            self.at_next += int(np.searchsorted(ordered, saved, "left"))


def _next_group(env: PlacementEnv, t: int, deciding: int) -> np.ndarray | None:
    """The members of the first group after step ``t`` of the order still to be decided
    (``deciding`` counts as decided)."""
    for v in env.order[t + 1:]:
        gid = env._group[v]
        if gid != deciding and not env._decided[gid]:
            return env.members(v)
    return None


def measure(graph: OpGraph, cluster: Cluster, order_name: str, config: RLConfig) -> Resumes:
    """The counts of one run."""
    order = traversal_order(graph, order_name)
    res = Resumes(Simulator(graph, cluster))
    originals = (PlacementEnv.reset, PlacementEnv.step, PlacementEnv._candidates,
                 Simulator.run_batch)
    reset, step, candidates, run_batch = originals

    def patched_reset(env: PlacementEnv, **kw: Any) -> Any:
        res.present = res.watch = None
        return reset(env, **kw)

    def patched_step(env: PlacementEnv, action: Any) -> Any:  # simulates the move
        res.present = env.placement.copy()
        res.watch = _next_group(env, env.t, env._group[env.order[env.t]])
        return step(env, action)

    def patched_candidates(env: PlacementEnv, v: int) -> Any:  # simulates the mask's
        res.present = env.placement.copy()
        res.watch = _next_group(env, env.t, env._group[v])
        return candidates(env, v)

    def patched_run_batch(sim: Simulator, placements: Any) -> BatchResult:
        for p in np.asarray(placements):
            res.count(p)
        return run_batch(sim, placements)

    (PlacementEnv.reset, PlacementEnv.step, PlacementEnv._candidates,
     Simulator.run_batch) = (patched_reset, patched_step, patched_candidates,
                             patched_run_batch)
    try:
        train(graph, cluster, order, 0, config, engine="stepwise")
    finally:
        (PlacementEnv.reset, PlacementEnv.step, PlacementEnv._candidates,
         Simulator.run_batch) = originals
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", default="inception", choices=sorted(SIZES))
    ap.add_argument("--orders", default=",".join(STUDY_ORDERS))
    ap.add_argument("--memory", type=float, help="device memory, times the single-device peak")
    ap.add_argument("--micro-batches", type=int, default=1, help="pipeline the graph")
    ap.add_argument("--episodes", type=int, help="override the paper preset's episodes")
    args = ap.parse_args(argv)
    graph, cluster = bench_graph(args.family, args.micro_batches, args.memory)
    options = {} if args.episodes is None else {"episodes": args.episodes}
    config = RLConfig.from_options("paper", **options)
    print(f"{args.family} training graph: {graph.n_nodes} nodes, {args.micro_batches} "
          f"micro-batch(es); {cluster.name}, memory {args.memory or 'full'}, preset paper, "
          f"{config.episodes} episodes, seed 0; share of the simulations' op finishes a "
          "resume skips")
    for name in args.orders.split(","):
        res = measure(graph, cluster, name, config)
        finishes = max(res.simulated * graph.n_nodes, 1)
        print(f"  {name:>14}: {res.simulated} simulations; at most {res.at_most / finishes:.1%}"
              f"; saved at the next decision {res.at_next / finishes:.1%} ("
              f"{res.resumed / max(res.simulated, 1):.0%} resumed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
