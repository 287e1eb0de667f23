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

Part 1 runs every placer but ``rl`` with the ``topo`` order; part 2 runs ``greedy`` with
every order and reports the ratio of the worst to the best step time, over all orders, over
the topological ones and over the study's six. Part 3 runs ``rl`` (seed 0, 50 episodes) on
``k80x3`` with each of the six study orders: its best step time next to ``single``,
``greedy``, ``m_etf`` and ``m_sct`` (order ``topo``), its spread over the orders, and
whether it learns (mean step time of the last ten episodes below that of the first ten).
A graph above ``--rl-max-nodes`` (the 2,512-node seq2seq) is coarsened to that size with
`coarsen` for part 3, and every placer of part 3 runs on the coarsened copy. RL times are
CPU time of this process, which the load of other jobs does not inflate.

    python benchmarks/placers.py [--quick] [--parts 1 2 3] [--rl-episodes 50]
                                 [--rl-max-nodes 500] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable
from dataclasses import replace

import numpy as np
from rich.console import Console
from rich.table import Table

from travorder.datasets import onnx_examples, synthetic
from travorder.graph import OpGraph, coarsen, training_graph
from travorder.graph.onnx_import import read_onnx
from travorder.placement.clusters import Cluster, load_cluster
from travorder.placement.orders import ORDERS, STUDY_ORDERS, TOPOLOGICAL_ORDERS
from travorder.placement.placers import PLACERS, place_graph
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


BASELINES = ("single", "greedy", "m_etf", "m_sct")
TIES = "An order named with +k ties with k others."


def new_table(title: str, *cols: str) -> Table:
    """A table with `cols`: names left-aligned, figures right-aligned."""
    table = Table(title=title)
    for col in cols:
        text = col in ("cluster", "graph", "placer") or col.endswith("order")
        table.add_column(col, justify="left" if text else "right")
    return table


def ms(us: float) -> str:
    """`us` microseconds as milliseconds, two decimals."""
    return f"{us / 1e3:.2f}"


def spread(step: dict[str, float], orders: Iterable[str]) -> float:
    """The worst step time over the best among `orders`."""
    vals = [step[o] for o in orders]
    return max(vals) / min(vals)


def extremes(step: dict[str, float]) -> tuple[str, str]:
    """The best and the worst order of `step`, each with ``+k`` if k others tie with it."""
    def name(target: float) -> str:
        tied = [o for o, t in step.items() if t == target]
        return tied[0] + (f" +{len(tied) - 1}" if len(tied) > 1 else "")
    return name(min(step.values())), name(max(step.values()))


def part1(console: Console, gs: dict[str, OpGraph], presets: list[Cluster],
          rows: list[dict]) -> None:
    """Every placer but ``rl``, order topo, on each preset and on the tight cluster."""
    for cluster in [*presets, None]:
        title = cluster.name if cluster else "k80x3 with memory at 45% of one device's need"
        table = new_table(f"Part 1 — every placer, order topo — {title}",
                          "graph", "placer", "step ms", "efficiency", "feasible", "wall s")
        for g_name, g in gs.items():
            c = cluster or tight(presets[0], g)
            for p_name in [p for p in PLACERS if p != "rl"]:
                r = place_graph(g, c, p_name, "topo")
                rows.append({"part": 1, "cluster": c.name, "graph": g_name, "placer": p_name,
                             "order": "topo", "step_time_us": r.step_time_us,
                             "efficiency": r.efficiency, "feasible": r.feasible,
                             "wall_s": r.wall_s})
                table.add_row(g_name, p_name, ms(r.step_time_us), f"{r.efficiency:.3f}",
                              "yes" if r.feasible else "NO", f"{r.wall_s:.3f}")
            table.add_section()
        console.print(table)


def part2(console: Console, gs: dict[str, OpGraph], presets: list[Cluster],
          rows: list[dict]) -> None:
    """Greedy with every order: the spread of its step time."""
    table = new_table("Part 2 — greedy: step time over the orders (max/min ratio)",
                      "cluster", "graph", "best order", "best ms", "worst order", "worst ms",
                      "all", "topological", "study six", "wall s")
    for cluster in presets:
        for g_name, g in gs.items():
            t0 = time.perf_counter()
            step = {o: place_graph(g, cluster, "greedy", o).step_time_us for o in ORDERS}
            wall = time.perf_counter() - t0
            ratios = [spread(step, s) for s in (ORDERS, TOPOLOGICAL_ORDERS, STUDY_ORDERS)]
            rows.append({"part": 2, "cluster": cluster.name, "graph": g_name,
                         "step_time_us": step, "best": min(step, key=step.get),
                         "worst": max(step, key=step.get),
                         **dict(zip(("spread_all", "spread_topological", "spread_study"),
                                    ratios, strict=True))})
            best, worst = extremes(step)
            table.add_row(cluster.name, g_name, best, ms(min(step.values())), worst,
                          ms(max(step.values())), *(f"{x:.3f}" for x in ratios),
                          f"{wall:.2f}")
        table.add_section()
    console.print(table)
    console.print("Topological orders: " + ", ".join(sorted(TOPOLOGICAL_ORDERS))
                  + ". Study six: " + ", ".join(STUDY_ORDERS) + ". " + TIES)


def part3(console: Console, gs: dict[str, OpGraph], episodes: int, max_nodes: int,
          rows: list[dict]) -> None:
    """``rl`` on k80x3 with each study order, next to the other placers."""
    cluster = load_cluster("k80x3")
    place_graph(gs["resnet"], cluster, "rl", "topo", episodes=1)  # compile the kernels first
    runs = new_table(f"Part 3 — rl on k80x3, seed 0, {episodes} episodes, each study order "
                     "(first/last 10: mean step time of those episodes)",
                     "graph", "order", "step ms", "efficiency", "feasible",
                     "first 10 ms", "last 10 ms", "cpu s", "wall s")
    summary = new_table("Part 3 — step ms on k80x3: rl's best over the study orders next to "
                        "the other placers (order topo)",
                        "graph", *BASELINES, "rl", "rl eff.", "best order",
                        "worst order", "max/min", "learns")
    notes, n_learns = [], 0
    for g_name, g in gs.items():
        if g.n_nodes > max_nodes:
            notes.append(f"{g_name}@{max_nodes}: {g_name} ({g.n_nodes} nodes) coarsened to "
                         f"{max_nodes} nodes; every placer of part 3 ran on the coarsened copy.")
            g, g_name = coarsen(g, max_nodes).graph, f"{g_name}@{max_nodes}"
        base = {p: place_graph(g, cluster, p, "topo") for p in BASELINES}
        step, learns = {}, 0
        for o in STUDY_ORDERS:
            cpu = time.process_time()
            r = place_graph(g, cluster, "rl", o, episodes=episodes)
            cpu = time.process_time() - cpu
            first, last = np.mean(r.learning_curve[:10]), np.mean(r.learning_curve[-10:])
            step[o], learns = r.step_time_us, learns + (last < first)
            rows.append({"part": 3, "cluster": cluster.name, "graph": g_name,
                         "placer": "rl", "order": o, "step_time_us": r.step_time_us,
                         "efficiency": r.efficiency, "feasible": r.feasible, "cpu_s": cpu,
                         "wall_s": r.wall_s, "learning_curve": r.learning_curve})
            runs.add_row(g_name, o, ms(r.step_time_us), f"{r.efficiency:.3f}",
                         "yes" if r.feasible else "NO", ms(first), ms(last), f"{cpu:.2f}",
                         f"{r.wall_s:.2f}")
        runs.add_section()
        rows += [{"part": 3, "cluster": cluster.name, "graph": g_name, "placer": p,
                  "order": "topo", "step_time_us": r.step_time_us,
                  "efficiency": r.efficiency, "feasible": r.feasible} for p, r in base.items()]
        best_us = min(step.values())
        summary.add_row(g_name, *(ms(r.step_time_us) for r in base.values()), ms(best_us),
                        f"{base['single'].lower_bound_us / best_us:.3f}", *extremes(step),
                        f"{spread(step, STUDY_ORDERS):.3f}", f"{learns} of {len(step)}")
        n_learns += learns
    console.print(runs)
    console.print(summary)
    for line in notes:
        console.print(line)
    console.print(f"Learning visible (mean step time of the last 10 episodes below the first "
                  f"10): {n_learns} of {len(gs) * len(STUDY_ORDERS)} runs. Efficiency (eff.): "
                  "lower bound over step time (the bound is the same for every placer of a graph). "
                  + TIES)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller graphs")
    ap.add_argument("--parts", type=int, nargs="+", choices=[1, 2, 3], default=[1, 2, 3],
                    help="the parts to run")
    ap.add_argument("--rl-episodes", type=int, default=50, help="episodes per rl run")
    ap.add_argument("--rl-max-nodes", type=int, default=500,
                    help="coarsen larger graphs to this size for part 3")
    ap.add_argument("--json", help="also write every row to this JSON file")
    args = ap.parse_args(argv)
    console = Console(width=130)
    gs = graphs(args.quick)
    presets = [load_cluster("k80x3"), load_cluster("v100x4-nvlink")]
    rows: list[dict] = []
    for g_name, g in gs.items():
        console.print(f"[bold]{g_name}[/]: {g.n_nodes} nodes, {g.n_edges} edges")
    if 1 in args.parts:
        part1(console, gs, presets, rows)
    if 2 in args.parts:
        part2(console, gs, presets, rows)
    if 3 in args.parts:
        part3(console, gs, args.rl_episodes, args.rl_max_nodes, rows)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
