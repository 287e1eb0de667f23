"""One RL placement run: wall time and where it goes (simulation, environment, policy).

The graph is the training graph of the synthetic Inception-style family (5 modules,
seed 0: 210 nodes) on ``k80x3``, order ``topo``, 50 episodes with the default `RLConfig`,
torch on one thread. A one-episode run first compiles the numba kernels, so the timed run
measures steady state. Reported: wall and CPU time of the run, the time inside the
simulator, the rest of the environment, and the policy (features, network forward and
backward, sampling, updates); the best step time next to ``single``, and the mean step
time of the first and last ten episodes. Target: at most 15 s per run on one core.

    python benchmarks/rl.py [--family inception] [--episodes 50] [--order topo]
                            [--encoder placeto] [--seed 0] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np

from travorder.datasets import synthetic
from travorder.graph import training_graph
from travorder.placement.clusters import load_cluster
from travorder.placement.orders import traversal_order
from travorder.placement.placers import place_graph
from travorder.placement.rl.trainer import RLConfig, train
from travorder.placement.simulator import Simulator

SIZES = {"inception": {"n_modules": 5}, "resnet": {}, "transformer": {"n_layers": 3},
         "enas_cnn": {"n_cells": 4}}


class TimedSimulator(Simulator):
    """A `Simulator` that adds up the time spent in its calls."""

    seconds = 0.0

    def run(self, placement: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return super().run(placement)
        finally:
            self.seconds += time.perf_counter() - t0

    def run_batch(self, placements: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return super().run_batch(placements)
        finally:
            self.seconds += time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", default="inception", choices=sorted(SIZES))
    ap.add_argument("--episodes", type=int, default=50)
    ap.add_argument("--order", default="topo")
    ap.add_argument("--encoder", default="placeto", choices=["placeto", "sage"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the figures to this JSON file")
    args = ap.parse_args(argv)

    graph = training_graph(getattr(synthetic, args.family)(seed=0, **SIZES[args.family]))
    cluster = load_cluster("k80x3")
    order = traversal_order(graph, args.order)
    config = RLConfig(episodes=args.episodes, encoder=args.encoder)
    train(graph, cluster, order, args.seed, RLConfig(episodes=1, encoder=args.encoder))

    sim = TimedSimulator(graph, cluster)
    cpu0 = time.process_time()
    run = train(graph, cluster, order, args.seed, config, simulator=sim)
    cpu = time.process_time() - cpu0
    single = place_graph(graph, cluster, "single").step_time_us
    curve = np.array(run.curve)
    steps = args.episodes * graph.n_nodes
    figures = {
        "graph": f"{args.family} training graph", "nodes": graph.n_nodes,
        "edges": graph.n_edges, "cluster": cluster.name, "order": args.order,
        "encoder": args.encoder, "episodes": args.episodes, "wall_s": run.wall_s,
        "cpu_s": cpu, "simulator_s": sim.seconds, "environment_other_s": run.env_s - sim.seconds,
        "policy_s": run.policy_s, "us_per_step": 1e6 * run.wall_s / steps,
        "best_step_time_us": run.step_time_us, "efficiency": run.efficiency,
        "single_step_time_us": single, "first10_mean_us": float(curve[:10].mean()),
        "last10_mean_us": float(curve[-10:].mean()),
    }
    print(f"{figures['graph']}: {graph.n_nodes} nodes, {graph.n_edges} edges; "
          f"{cluster.name}, order {args.order}, {args.encoder} encoder, "
          f"{args.episodes} episodes")
    print(f"  wall {run.wall_s:.2f} s (CPU {cpu:.2f} s), "
          f"{figures['us_per_step']:.0f} us per step")
    print(f"  simulator {sim.seconds:.2f} s, rest of the environment "
          f"{figures['environment_other_s']:.2f} s, policy {run.policy_s:.2f} s")
    print(f"  best {run.step_time_us / 1e3:.2f} ms (efficiency {run.efficiency:.3f}), "
          f"single {single / 1e3:.2f} ms; mean of episodes 1-10 "
          f"{curve[:10].mean() / 1e3:.2f} ms, last 10 {curve[-10:].mean() / 1e3:.2f} ms")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
