"""Every placer on four training graphs and two presets, and greedy's spread over orders.

Graphs (forward graphs expanded with `training_graph`):

- ``resnet``: a ResNet-style CNN, `onnx_examples.residual_cnn` (8 blocks, 64 channels,
  batch 32), imported with `read_onnx`;
- ``inception``: the synthetic Inception-style family (9 modules, seed 0);
- ``transformer``: `onnx_examples.transformer_stack` (4 layers, d_model 512, 8 heads,
  sequence 128, batch 8), imported with `read_onnx`;
- ``seq2seq``: the synthetic LSTM encoder-decoder with attention (seed 0).

Clusters: ``k80x3`` (the study's) and ``v100x4-nvlink``, plus ``k80x3`` with each device's
memory cut to 45% of the graph's single-device peak, to show which placers find a
feasible placement when one device cannot hold the graph.

Part 1 runs every placer with the ``topo`` order; part 2 runs ``greedy`` with every order
and reports the ratio of the worst to the best step time, over all orders, over the
topological ones and over the study's six.

    python benchmarks/placers.py [--quick] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace

from rich.console import Console
from rich.table import Table

from travorder.datasets import onnx_examples, synthetic
from travorder.graph import OpGraph, training_graph
from travorder.graph.onnx_import import read_onnx
from travorder.placement.clusters import Cluster, load_cluster
from travorder.placement.orders import ORDERS, STUDY_ORDERS, TOPOLOGICAL_ORDERS
from travorder.placement.placers import PLACERS, place
from travorder.placement.simulator import simulate


def graphs(quick: bool) -> dict[str, OpGraph]:
    """The benchmark's training graphs (smaller with ``quick``)."""
    scale = 2 if quick else 1
    forward = {
        "resnet": read_onnx(onnx_examples.residual_cnn(batch=32, width=64, blocks=8 // scale),
                            name="resnet"),
        "inception": synthetic.inception(seed=0, n_modules=9 // scale),
        "transformer": read_onnx(onnx_examples.transformer_stack(
            n_layers=4 // scale, batch=8, seq=128, d_model=512, heads=8), name="transformer"),
        "seq2seq": synthetic.seq2seq(seed=0, src_len=20 // scale, tgt_len=20 // scale),
    }
    return {k: training_graph(g) for k, g in forward.items()}


def tight(cluster: Cluster, graph: OpGraph, share: float = 0.45) -> Cluster:
    """`cluster` with every device's memory cut to `share` of the graph's peak on one."""
    peak = float(simulate(graph, [0] * graph.n_nodes, cluster).peak_memory[0])
    devices = tuple(replace(d, memory=share * peak) for d in cluster.devices)
    return replace(cluster, name=f"{cluster.name}@{share:.0%}", devices=devices)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller graphs")
    ap.add_argument("--json", help="also write every row to this JSON file")
    args = ap.parse_args(argv)
    console = Console(width=130)
    gs = graphs(args.quick)
    presets = [load_cluster("k80x3"), load_cluster("v100x4-nvlink")]
    rows = []

    for g_name, g in gs.items():
        console.print(f"[bold]{g_name}[/]: {g.n_nodes} nodes, {g.n_edges} edges")
    for cluster in [*presets, None]:
        title = cluster.name if cluster else "k80x3 with memory at 45% of one device's need"
        table = Table(title=f"Part 1 — every placer, order topo — {title}")
        for col in ("graph", "placer", "step ms", "efficiency", "feasible", "wall s"):
            table.add_column(col, justify="left" if col in ("graph", "placer") else "right")
        for g_name, g in gs.items():
            c = cluster or tight(presets[0], g)
            for p_name in PLACERS:
                r = place(g, c, p_name, "topo")
                rows.append({"part": 1, "cluster": c.name, "graph": g_name, "placer": p_name,
                             "order": "topo", "step_time_us": r.step_time_us,
                             "efficiency": r.efficiency, "feasible": r.feasible,
                             "wall_s": r.wall_s})
                table.add_row(g_name, p_name, f"{r.step_time_us / 1e3:.2f}",
                              f"{r.efficiency:.3f}", "yes" if r.feasible else "NO",
                              f"{r.wall_s:.3f}")
            table.add_section()
        console.print(table)

    table = Table(title="Part 2 — greedy: step time over the orders (max/min ratio)")
    for col in ("cluster", "graph", "best order", "best ms", "worst order", "worst ms",
                "all", "topological", "study six", "wall s"):
        table.add_column(col, justify="left" if "order" in col or col in (
            "cluster", "graph") else "right")
    for cluster in presets:
        for g_name, g in gs.items():
            t0 = time.perf_counter()
            step = {o: place(g, cluster, "greedy", o).step_time_us for o in ORDERS}
            wall = time.perf_counter() - t0

            def spread(names: object, step: dict[str, float] = step) -> float:
                vals = [step[o] for o in names]
                return max(vals) / min(vals)

            best, worst = min(step, key=step.get), max(step, key=step.get)
            rows.append({"part": 2, "cluster": cluster.name, "graph": g_name,
                         "step_time_us": step, "best": best, "worst": worst,
                         "spread_all": spread(ORDERS), "spread_topological":
                         spread(TOPOLOGICAL_ORDERS), "spread_study": spread(STUDY_ORDERS)})
            table.add_row(cluster.name, g_name, best, f"{step[best] / 1e3:.2f}", worst,
                          f"{step[worst] / 1e3:.2f}", f"{spread(ORDERS):.3f}",
                          f"{spread(TOPOLOGICAL_ORDERS):.3f}", f"{spread(STUDY_ORDERS):.3f}",
                          f"{wall:.2f}")
        table.add_section()
    console.print(table)
    console.print("Topological orders: " + ", ".join(sorted(TOPOLOGICAL_ORDERS))
                  + ". Study six: " + ", ".join(STUDY_ORDERS) + ".")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
