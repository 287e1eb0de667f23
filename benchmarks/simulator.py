"""Simulator speed: compiled core (single and batch) against the plain-Python reference,
and the compiled core's cost per node from 250 to 16k nodes.

A ~1,000-node training graph (a residual network with two-branch blocks, expanded with
its backward pass) on 4-device clusters, random placements; prints the median time per
placement of each implementation and the speed-up, and the first-call compile time.
Then random layered DAGs of 250 to 16,000 nodes, narrow (8 nodes per layer) and wide
(n / 16 per layer), each node reading 1-3 nodes of the layer before: ns per node per
placement (`step_time`: median over placements; `run_batch`: the best of five batches,
the figure least disturbed by other load; random placements on ``k80x3``, and
``k80x3-placeto``'s batch). Times are CPU time of this thread (``time.thread_time``),
which for this single-threaded code equals wall time on an idle machine and counts
neither other processes nor the worker threads of a BLAS library.

``--against OLD.py`` compares with another version of the simulator module (say
``git show REV:src/travorder/placement/simulator.py > OLD.py``) on a busy machine: the
two ``run_batch`` take turns on the same placements, five times each, must give the same
step times, and the table adds the other's batch figure and the speed-up (the median of
the five ratios).

    python benchmarks/simulator.py [--placements 200] [--seed 0] [--sizes 250,...]
                                   [--against OLD.py]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time

import numpy as np

from travorder.graph import OpGraph, training_graph
from travorder.placement import Simulator, load_cluster
from travorder.placement.reference import simulate_reference


def residual_forward(blocks: int = 54, width: int = 256, batch: int = 32) -> OpGraph:
    """A chain of residual blocks: conv-bn-relu-conv-bn on one branch, a projection on
    the other every fourth block, an add and a relu."""
    act = 4.0 * batch * width * 14 * 14
    conv_flops = 2.0 * batch * width * width * 9 * 14 * 14
    nodes = [{"name": "input", "op_type": "Input", "output_bytes": act}]
    edges = []
    prev = "input"
    for b in range(blocks):
        p = f"block{b}"
        chain = [("conv1", "Conv", conv_flops, 9 * width * width * 4.0),
                 ("bn1", "BatchNormalization", 4 * act, 8.0 * width),
                 ("relu1", "Relu", act, 0.0),
                 ("conv2", "Conv", conv_flops, 9 * width * width * 4.0),
                 ("bn2", "BatchNormalization", 4 * act, 8.0 * width)]
        last = prev
        for name, op, flops, params in chain:
            nodes.append({"name": f"{p}/{name}", "op_type": op, "flops": flops,
                          "output_bytes": act, "param_bytes": params})
            edges.append((last, f"{p}/{name}"))
            last = f"{p}/{name}"
        skip = prev
        if b % 4 == 0:
            for name, op, flops, params in [("proj", "Conv", conv_flops / 9, width * width * 4.0),
                                            ("proj_bn", "BatchNormalization", 4 * act, 8.0 * width),
                                            ("scale", "Mul", act, 0.0)]:
                nodes.append({"name": f"{p}/{name}", "op_type": op, "flops": flops,
                              "output_bytes": act, "param_bytes": params})
                edges.append((skip, f"{p}/{name}"))
                skip = f"{p}/{name}"
        else:
            nodes += [{"name": f"{p}/id", "op_type": "Identity", "output_bytes": act},
                      {"name": f"{p}/id2", "op_type": "Identity", "output_bytes": act}]
            edges += [(skip, f"{p}/id"), (f"{p}/id", f"{p}/id2")]
            skip = f"{p}/id2"
        nodes += [{"name": f"{p}/add", "op_type": "Add", "flops": act / 4, "output_bytes": act},
                  {"name": f"{p}/out", "op_type": "Relu", "flops": act / 4, "output_bytes": act}]
        edges += [(last, f"{p}/add"), (skip, f"{p}/add"), (f"{p}/add", f"{p}/out")]
        prev = f"{p}/out"
    return OpGraph.from_records(nodes, edges, name=f"residual{blocks}", family="synthetic",
                                source="benchmarks/simulator.py", batch_size=batch)


def layered_dag(n: int, width: int, seed: int = 0) -> OpGraph:
    """``n`` nodes in layers of ``width``; each node reads 1-3 nodes of the layer before."""
    rng = np.random.default_rng(seed)
    layer = np.arange(n) // width
    src, dst = [], []
    for v in range(width, n):
        lo = (layer[v] - 1) * width
        for u in set(rng.integers(lo, lo + width, rng.integers(1, 4)).tolist()):
            src.append(u)
            dst.append(v)
    out = rng.integers(1, 1 << 20, n).astype(float)
    return OpGraph([f"op{v}" for v in range(n)], src, dst, time_us=rng.uniform(1, 100, n),
                   output_bytes=out, edge_bytes=out[src],
                   meta={"name": f"layered{n}x{width}"})


def _times_us(fns, reps: int) -> list[list[float]]:
    """Each function's times in us, over ``reps`` rounds in which they take turns."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(reps):
        for fn, out in zip(fns, times, strict=True):
            t0 = time.thread_time()
            fn()
            out.append((time.thread_time() - t0) * 1e6)
    return times


def _median_us(fn, reps: int, stat=statistics.median) -> float:
    return stat(_times_us([fn], reps)[0])


def _load_simulator(path: str):
    """The module in ``path``: another version of travorder.placement.simulator."""
    spec = importlib.util.spec_from_file_location("simulator_against", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--placements", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                    default=[250, 1000, 4000, 16000], help="graph sizes (nodes)")
    ap.add_argument("--against", metavar="OLD.py",
                    help="another version of src/travorder/placement/simulator.py")
    args = ap.parse_args()
    against = _load_simulator(args.against) if args.against else None

    graph = training_graph(residual_forward())
    rng = np.random.default_rng(args.seed)
    print(f"graph: {graph.name}, {graph.n_nodes} nodes, {graph.n_edges} edges")
    t0 = time.perf_counter()
    Simulator(graph, load_cluster("k80x3")).step_time(np.zeros(graph.n_nodes, dtype=int))
    print(f"first call (numba compile, or load from its cache): "
          f"{time.perf_counter() - t0:.2f} s")

    header = (f"{'cluster':<16}{'model':<9}{'fast us':>9}{'batch us':>10}"
              f"{'reference us':>14}{'speed-up':>10}{'batch speed-up':>16}")
    print(header)
    for name in ("v100x4-nvlink", "pcie4x4", "baechi-4"):
        cluster = load_cluster(name)
        sim = Simulator(graph, cluster)
        places = rng.integers(0, cluster.n_devices, (args.placements, graph.n_nodes))
        it = iter(range(10**9))
        fast = _median_us(lambda s=sim, p=places, i=it: s.step_time(p[next(i) % len(p)]),
                          args.placements)
        batch = _median_us(lambda s=sim, p=places: s.run_batch(p), 5) / args.placements
        it = iter(range(10**9))
        n_ref = max(5, args.placements // 20)
        ref = _median_us(lambda p=places, c=cluster, i=it: simulate_reference(
            graph, p[next(i) % len(p)], c), n_ref)
        steps = sim.run_batch(places).step_time_us
        assert all(simulate_reference(graph, places[k], cluster).step_time_us == steps[k]
                   for k in range(3))
        print(f"{name:<16}{cluster.link_model:<9}{fast:>9.1f}{batch:>10.1f}{ref:>14.0f}"
              f"{ref / fast:>9.0f}x{ref / batch:>15.0f}x")

    print("\nns per node per placement (random layered DAGs, random placements)")
    print(f"{'nodes':>7}{'shape':>8}{'edges':>8}{'k80x3':>9}{'batch':>8}{'placeto':>9}"
          + (f"{'against':>9}{'speed-up':>10}" if against else ""))
    k80, placeto = load_cluster("k80x3"), load_cluster("k80x3-placeto")
    for n in args.sizes:
        for shape, width in (("narrow", 8), ("wide", max(8, n // 16))):
            g = layered_dag(n, width, args.seed)
            places = rng.integers(0, 3, (max(20, 200_000 // n), n))
            reps = len(places)
            sim = Simulator(g, k80)
            it = iter(range(10**9))
            one = _median_us(lambda s=sim, p=places, i=it: s.step_time(p[next(i) % len(p)]),
                             reps)
            fns = [lambda s=sim, p=places: s.run_batch(p)]
            if against:
                old = against.Simulator(g, k80)
                assert np.array_equal(old.run_batch(places).step_time_us,
                                      sim.run_batch(places).step_time_us)
                fns.append(lambda s=old, p=places: s.run_batch(p))
            times = _times_us(fns, 5)
            batch = min(times[0]) / reps
            sim_pl = Simulator(g, placeto)
            pl = _median_us(lambda s=sim_pl, p=places: s.run_batch(p), 5, min) / reps
            row = (f"{n:>7}{shape:>8}{g.n_edges:>8}{1e3 * one / n:>9.0f}"
                   f"{1e3 * batch / n:>8.0f}{1e3 * pl / n:>9.0f}")
            if against:
                ratio = statistics.median(o / t for t, o in zip(*times, strict=True))
                row += f"{1e3 * min(times[1]) / reps / n:>9.0f}{ratio:>9.2f}x"
            print(row)


if __name__ == "__main__":
    main()
