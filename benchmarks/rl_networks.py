"""RL runs with the numpy network against the torch one: the same seeds, side by side.

Both networks compute the same policy and update up to float rounding, so a run with a
given seed may follow another trajectory once a rounding difference flips a sampled
device. This runs ``paper`` runs (50 episodes) with both on a few synthetic training
graphs (k80x3, order ``topo_lifo``) and prints, per graph, the mean best step time over
the seeds for each network with its standard error, the mean paired difference, and on
how many seeds the two runs ended identical (same best step time and learning curve).

``--micro-batches M`` pipelines each graph into ``M`` micro-batches; ``--memory F``
gives every device ``F`` times the graph's single-device peak memory.

    python benchmarks/rl_networks.py [--seeds 8] [--families inception enas_cnn ...]
                                     [--micro-batches M] [--memory F]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys

from travorder.datasets import synthetic
from travorder.graph import training_graph
from travorder.graph.pipeline import pipeline_graph
from travorder.placement.clusters import load_cluster
from travorder.placement.orders import traversal_order
from travorder.placement.rl.trainer import NETWORKS, RLConfig, train
from travorder.study.scenarios import Scenario

SIZES = {"inception": {"n_modules": 5}, "enas_cnn": {"n_cells": 4},
         "transformer": {"n_layers": 3}, "resnet": {}, "rnn": {"timesteps": 5},
         "seq2seq": {"src_len": 4, "tgt_len": 4}}


def _mean_se(values: list[float]) -> str:
    se = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0
    return f"{statistics.mean(values) / 1e3:.3f} +- {se / 1e3:.3f} ms"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--families", nargs="+", default=["inception", "enas_cnn",
                                                      "transformer"], choices=sorted(SIZES))
    ap.add_argument("--micro-batches", type=int, default=1, help="pipeline each graph")
    ap.add_argument("--memory", type=float, help="device memory, times the single-device peak")
    args = ap.parse_args(argv)
    for family in args.families:
        graph = training_graph(getattr(synthetic, family)(seed=0, **SIZES[family]))
        if args.micro_batches > 1:
            graph = pipeline_graph(graph, args.micro_batches)
        cluster = load_cluster("k80x3")
        if args.memory is not None:
            cluster = Scenario(memory=args.memory).cluster_for(graph, cluster)
        order = traversal_order(graph, "topo_lifo")
        best: dict[str, list[float]] = {network: [] for network in NETWORKS}
        same = 0
        for seed in range(args.seeds):
            runs = {network: train(graph, cluster, order, seed,
                                   dataclasses.replace(RLConfig.paper(), network=network))
                    for network in NETWORKS}
            for network, run in runs.items():
                best[network].append(run.step_time_us)
            a, b = runs.values()
            same += a.step_time_us == b.step_time_us and a.curve == b.curve
        diff = [x - y for x, y in zip(best["numpy"], best["torch"], strict=True)]
        print(f"{family} training graph, {graph.n_nodes} nodes, {args.micro_batches} "
              f"micro-batch(es), memory {args.memory or 'full'}, {args.seeds} seeds: "
              + "; ".join(f"{network} {_mean_se(best[network])}" for network in NETWORKS)
              + f"; numpy - torch {_mean_se(diff)}; identical runs {same}/{args.seeds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
