"""What a Simulator's construction costs, and its overflow check's share of it.

A layered DAG of 16,000 nodes (1,000 per layer, each reading two nodes of the layer
before) on ``k80x3``: the median over 50 repeats of ``Simulator(graph, cluster)``, of its
overflow check alone (`_check_in_range`) and of an `OpGraph` rebuilt with its
validation (``graph.replace``), taken in turns so that load on a shared machine falls on
all three alike.

    python benchmarks/simulator_setup.py [--nodes 16000] [--repeats 50]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from travorder.graph import OpGraph
from travorder.placement import load_cluster
from travorder.placement.clusters import compute_times
from travorder.placement.simulator import Simulator, _check_in_range


def layered(n: int, width: int, seed: int = 0) -> OpGraph:
    rng = np.random.default_rng(seed)
    src, dst = [], []
    for v in range(width, n):
        layer = v // width
        for u in rng.choice(np.arange((layer - 1) * width, layer * width), 2, replace=False):
            src.append(int(u))
            dst.append(v)
    return OpGraph([f"n{i}" for i in range(n)], src, dst, flops=rng.uniform(1e6, 1e9, n),
                   edge_bytes=rng.uniform(1e3, 1e6, len(src)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16_000)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    graph, cluster = layered(args.nodes, 1000), load_cluster("k80x3")
    times = compute_times(graph, cluster)
    runs: dict[str, list[float]] = {"Simulator()": [], "overflow check": [],
                                    "OpGraph.replace": []}
    steps = (lambda: Simulator(graph, cluster), lambda: _check_in_range(graph, cluster, times),
             lambda: graph.replace(flops=graph.flops))
    for _ in range(args.repeats):
        for key, step in zip(runs, steps, strict=True):
            start = time.perf_counter()
            step()
            runs[key].append(time.perf_counter() - start)
    ms = {k: statistics.median(v) * 1e3 for k, v in runs.items()}
    print(f"{graph.n_nodes} nodes, {graph.n_edges} edges, medians of {args.repeats}:")
    for key, value in ms.items():
        print(f"  {key:16s} {value:8.3f} ms")
    print(f"  the check is {ms['overflow check'] / ms['Simulator()']:.1%} of a construction")


if __name__ == "__main__":
    main()
