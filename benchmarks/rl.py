"""RL placement runs: runs per second and where the time goes (play, network, update).

The graph is the training graph of a synthetic family (default: Inception-style, 5
modules, seed 0: 210 nodes; ``--family seq2seq``: 10 + 10 steps, 1,252 nodes) on
``k80x3``, order ``topo_lifo`` (the study's ``topo``), preset ``paper`` (50 episodes),
torch and BLAS on one thread. A one-episode run first compiles (or loads) the numba kernels, so
the timed runs measure steady state; each engine runs ``--repeat`` times and the fastest
CPU time is reported.

Engines: ``compiled`` plays an episode in one compiled call (`play_episode`);
``stepwise`` plays it through `PlacementEnv.step`, one Python call per node (the
reference path, the same results). Reported per engine: CPU and wall seconds per run,
runs per second, and the split of a run: *play* (the episodes: decisions and simulation),
*network* (the graph network's pass at the start of each episode), *update* (REINFORCE:
loss, backward, clipping, Adam), the rest (set-up, resets); the number of placements
simulated and the best step time next to ``single``.

``--memory F`` gives every device ``F`` times the graph's single-device peak memory
(the memory-pressured case: every decision simulates its candidates for the mask);
``--micro-batches M`` pipelines the graph into ``M`` micro-batches (each op colocated
with its copies: as many decisions, ``M`` times the nodes); ``--network torch`` runs the
policy's network and update in torch (`RLConfig.network`; default numpy).

Side by side: ``--against SRC`` runs the benchmark (compiled engine) alternately with
this source tree and with ``SRC`` (the ``src`` folder of another checkout, e.g. the
base commit), each in a fresh process, ``--pairs`` times, and prints both CPU times per
run, their paired ratios and medians, the simulations per run, and whether both runs
gave the same result. ``SRC`` may be as old as the RL issue's base (1a7f132: ``git
archive 1a7f132 src | tar -x -C OLD``), which had only the step-by-step engine; its
runs then play step by step and count no simulations.

    python benchmarks/rl.py [--family inception] [--preset paper] [--episodes N]
                            [--order topo_lifo] [--engine both] [--repeat 2]
                            [--seed 0] [--memory F] [--micro-batches M]
                            [--network numpy|torch] [--json OUT] [--against SRC [--pairs 3]]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Only names that trees back to the base (1a7f132) have are imported here, so
# that ``--against`` can time them; the newer ones are imported where they are used.
from travorder.datasets import synthetic
from travorder.graph import OpGraph, training_graph
from travorder.placement.clusters import Cluster, load_cluster
from travorder.placement.orders import traversal_order
from travorder.placement.rl import trainer
from travorder.placement.rl.trainer import RLConfig, train

# A tree before the compiled engine has one engine, played step by step.
ENGINES = getattr(trainer, "ENGINES", ("stepwise",))
PRESETS = getattr(trainer, "PRESETS", {"default": None, "paper": None})

SIZES = {"inception": {"n_modules": 5}, "resnet": {}, "transformer": {"n_layers": 3},
         "enas_cnn": {"n_cells": 4}, "seq2seq": {"src_len": 10, "tgt_len": 10}}


def bench_graph(family: str, micro_batches: int = 1, memory: float | None = None
                ) -> tuple[OpGraph, Cluster]:
    """The benchmark's training graph of ``family`` (`SIZES`), pipelined over
    ``micro_batches``, and ``k80x3`` with ``memory`` times its single-device peak."""
    graph = training_graph(getattr(synthetic, family)(seed=0, **SIZES[family]))
    if micro_batches > 1:
        from travorder.graph.pipeline import pipeline_graph

        graph = pipeline_graph(graph, micro_batches)
    cluster = load_cluster("k80x3")
    if memory is not None:
        from travorder.study.scenarios import Scenario

        cluster = Scenario(memory=memory).cluster_for(graph, cluster)
    return graph, cluster


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", default="inception", choices=sorted(SIZES))
    ap.add_argument("--preset", default="paper", choices=sorted(PRESETS))
    ap.add_argument("--episodes", type=int, help="override the preset's episodes")
    ap.add_argument("--order", default="topo_lifo")
    ap.add_argument("--engine", default="both", choices=[*ENGINES, "both"])
    ap.add_argument("--repeat", type=int, default=2, help="timed runs per engine")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--memory", type=float, help="device memory, times the single-device peak")
    ap.add_argument("--micro-batches", type=int, default=1, help="pipeline the graph")
    ap.add_argument("--network", help="where the policy's network and update run "
                    "(RLConfig.network; default: the preset's)")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    ap.add_argument("--against", help="another source tree to compare with, side by side")
    ap.add_argument("--pairs", type=int, default=3, help="alternations with --against")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # one side of --against: JSON here
    args = ap.parse_args(argv)
    if args.against:
        return side_by_side(args)

    graph, cluster, order, config = setting(args)
    if args.child:
        return child(args, graph, cluster, order, config)
    engines = ENGINES if args.engine == "both" else (args.engine,)
    from travorder.placement.placers import place_graph

    single = place_graph(graph, cluster, "single").step_time_us
    print(f"{args.family} training graph: {graph.n_nodes} nodes, {graph.n_edges} edges, "
          f"{args.micro_batches} micro-batch(es); {cluster.name}, memory "
          f"{args.memory or 'full'}, order {args.order}, preset {args.preset}, {config.episodes} "
          f"episodes, seed {args.seed}")
    figures: dict = {"graph": f"{args.family} training graph", "nodes": graph.n_nodes,
                     "edges": graph.n_edges, "cluster": cluster.name, "order": args.order,
                     "preset": args.preset, "episodes": config.episodes,
                     "single_step_time_us": single, "engines": {}}
    for engine in engines:
        cpu, run = fastest_run(graph, cluster, order, config, args, engine=engine)
        rest = run.wall_s - run.play_s - run.network_s - run.update_s
        f = {"cpu_s": cpu, "wall_s": run.wall_s, "runs_per_s": 1.0 / cpu,
             "play_s": run.play_s, "network_s": run.network_s, "update_s": run.update_s,
             "other_s": rest, "simulations": run.simulations,
             "best_step_time_us": run.step_time_us, "efficiency": run.efficiency,
             "curve_sum_us": sum(run.curve)}
        figures["engines"][engine] = f
        print(f"  {engine:>8}: {cpu:.3f} s CPU per run ({f['runs_per_s']:.2f} runs/s), "
              f"wall {run.wall_s:.3f} s = play {run.play_s:.3f} + network "
              f"{run.network_s:.3f} + update {run.update_s:.3f} + other {rest:.3f}; "
              f"{run.simulations} simulations; best {run.step_time_us / 1e3:.2f} ms "
              f"(efficiency {run.efficiency:.3f}, single {single / 1e3:.2f} ms)")
    if len(engines) == 2:
        a, b = (figures["engines"][e] for e in ENGINES)
        same = a["curve_sum_us"] == b["curve_sum_us"] and (a["best_step_time_us"]
                                                           == b["best_step_time_us"])
        print(f"  stepwise / compiled CPU: {b['cpu_s'] / a['cpu_s']:.2f}x; same run: {same}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(figures, fh, indent=2)
    return 0


def setting(args: argparse.Namespace) -> tuple[OpGraph, Cluster, object, RLConfig]:
    """The graph, cluster, order and RL settings that ``args`` name."""
    graph, cluster = bench_graph(args.family, args.micro_batches, args.memory)
    options = {key: value for key, value in (("episodes", args.episodes),
                                             ("network", args.network)) if value is not None}
    return (graph, cluster, traversal_order(graph, args.order),
            RLConfig.from_options(args.preset, **options))


def fastest_run(graph: OpGraph, cluster: Cluster, order: object, config: RLConfig,
                args: argparse.Namespace, **engine: str) -> tuple[float, object]:
    """CPU seconds and result of the fastest of ``args.repeat`` runs, after a one-episode
    run that compiles (or loads) the kernels."""
    train(graph, cluster, order, args.seed, RLConfig(episodes=1), **engine)
    best = None
    for _ in range(args.repeat):
        cpu0 = time.process_time()
        run = train(graph, cluster, order, args.seed, config, **engine)
        cpu = time.process_time() - cpu0
        if best is None or cpu < best[0]:
            best = (cpu, run)
    return best


def child(args: argparse.Namespace, graph: OpGraph, cluster: Cluster, order: object,
          config: RLConfig) -> int:
    """One side of ``--against``: the fastest run's CPU seconds and result as JSON, with
    the API of every tree back to the issue's base (the compiled engine where it exists,
    no simulation count before it was recorded)."""
    engine = {"engine": "compiled"} if "compiled" in ENGINES else {}
    cpu, run = fastest_run(graph, cluster, order, config, args, **engine)
    figures = {"cpu_s": cpu, "best_step_time_us": run.step_time_us,
               "curve_sum_us": sum(run.curve), "simulations": getattr(run, "simulations", None)}
    Path(args.child).write_text(json.dumps(figures), encoding="utf-8")
    return 0


def side_by_side(args: argparse.Namespace) -> int:
    """Alternate runs of this tree and of ``args.against``; print paired CPU ratios."""
    own = [f"--{key.replace('_', '-')}={value}" for key, value in vars(args).items()
           if value is not None and key not in ("engine", "json", "against", "pairs", "child")]
    trees = {"this": Path(__file__).resolve().parents[1] / "src",
             "against": Path(args.against).resolve()}
    cpu: dict[str, list[float]] = {name: [] for name in trees}
    results, simulations = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.pairs):
            for name, src in trees.items():
                out = Path(tmp) / f"{name}.json"
                subprocess.run([sys.executable, __file__, *own, "--child", str(out)],
                               check=True, stdout=subprocess.DEVNULL,
                               env={**os.environ, "PYTHONPATH": str(src)})
                figures = json.loads(out.read_text())
                cpu[name].append(figures["cpu_s"])
                results[name] = (figures["best_step_time_us"], figures["curve_sum_us"])
                simulations[name] = figures["simulations"]
    ratios = [b / a for a, b in zip(cpu["this"], cpu["against"], strict=True)]
    for name, src in trees.items():
        print(f"  {name:>7} ({src}): CPU per run " + ", ".join(f"{c:.3f}" for c in cpu[name])
              + f" s; median {statistics.median(cpu[name]):.3f} s; {simulations[name]} "
              "simulations")
    print("  against / this, paired: " + ", ".join(f"{r:.2f}x" for r in ratios)
          + f"; median {statistics.median(ratios):.2f}x; same result: "
          f"{results['this'] == results['against']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
