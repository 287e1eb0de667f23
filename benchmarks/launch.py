"""Measured versus simulated training-step time of placements applied to real models.

For a residual CNN, a transformer block and an unrolled RNN (travorder.datasets.torch_examples):
capture the model, place its training graph on the cluster with several placers and
orders (plus an op-by-op alternating placement), apply every distinct placement to the
model on the devices, time training steps (forward, loss, backward, SGD step), and print
the simulated and the measured step time of each placement with the Spearman rank
correlation per model and over all placements.

The cluster is calibrated from the devices (``travorder.placement.calibrate``) unless
``--cluster`` names a preset or file. With fewer than two GPUs the devices default to
three entries of ``cpu``: every placement still runs, all devices mapped to one, which
checks the plumbing; the measured times then do not depend on the placement and their
correlation with the simulation means nothing.

    python benchmarks/launch.py                       # all GPUs, or 3 x cpu
    python benchmarks/launch.py --devices cuda:0,cuda:1,cuda:2,cuda:3 --steps 30
    python benchmarks/launch.py --json launch.json    # also write every row
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

from travorder.datasets.torch_examples import MODELS, loss_for
from travorder.errors import TravorderError
from travorder.graph import training_graph
from travorder.placement import Simulator, load_cluster
from travorder.placement.calibrate import calibrate
from travorder.placement.capture import capture_graph
from travorder.placement.launch import apply, check_device, time_step, to_device
from travorder.placement.placers import place_graph

PLACERS = ("single", "round_robin", "contiguous", "greedy", "m_topo", "m_etf", "m_sct")
ORDERS = ("topo", "reversed_topo", "dfs_preorder", "dfs_postorder", "bfs", "alpha")
#: Placers whose result depends on the order; the others run with `topo` only.
ORDER_SENSITIVE = ("round_robin", "contiguous", "greedy")


def placements(tg, cluster) -> list[tuple[str, str, np.ndarray, float]]:
    """Distinct (placer, order, placement, simulated us) of training graph ``tg``."""
    seen, rows = set(), []
    for placer in PLACERS:
        for order in ORDERS if placer in ORDER_SENSITIVE else ("topo",):
            r = place_graph(tg, cluster, placer=placer, order=order)
            key = r.placement.tobytes()
            if key not in seen:
                seen.add(key)
                rows.append((placer, order, r.placement, r.step_time_us))
    n = tg.n_nodes // 2
    alternating = np.tile(np.arange(n) % cluster.n_devices, 2)  # backward with forward
    if alternating.tobytes() not in seen:
        sim = Simulator(tg, cluster).run(alternating).step_time_us
        rows.append(("alternating", "-", alternating, sim))
    return rows


def run_model(name: str, devices: list[str], cluster, scale: int, batch: int | None,
              steps: int) -> list[dict]:
    kwargs = {"scale": scale} | ({"batch": batch} if batch else {})
    model, x, y = MODELS[name](**kwargs)
    x = tuple(t.to(devices[0]) for t in x)
    loss = loss_for(name)
    tg = training_graph(capture_graph(model, x))
    rows = []
    for placer, order, placement, sim_us in placements(tg, cluster):
        placed = apply(copy.deepcopy(model), x, placement, devices)
        times = time_step(placed, x, lambda out: loss(out, y.to(out.device)), steps=steps,
                          warmup=3)
        copies = sum(n.op == "call_function" and n.target is to_device
                     for n in placed.graph.nodes)
        rows.append({"model": name, "placer": placer, "order": order,
                     "devices_used": int(np.unique(placement).size), "copies": copies,
                     "simulated_us": sim_us, "measured_us": times.median_us,
                     "measured_min_us": times.min_us})
        print(f"{name:12s} {placer:12s} {order:14s} {rows[-1]['devices_used']:4d} "
              f"{copies:6d} {sim_us:12.1f} {times.median_us:12.1f} {times.min_us:12.1f}",
              flush=True)
    return rows


def _rho(rows: list[dict]) -> float:
    sim = [r["simulated_us"] for r in rows]
    meas = [r["measured_us"] for r in rows]
    if len(rows) < 3 or np.ptp(sim) == 0 or np.ptp(meas) == 0:
        return float("nan")
    return float(spearmanr(sim, meas).statistic)


def main() -> None:
    gpus = torch.cuda.device_count()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", help="comma-separated torch devices "
                        "(default: every GPU if there are two or more, else cpu,cpu,cpu)")
    parser.add_argument("--cluster", help="preset or cluster file (default: calibrate)")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--scale", type=int, default=8 if gpus >= 2 else 1,
                        help="model width multiplier")
    parser.add_argument("--batch", type=int, default=64 if gpus >= 2 else None)
    parser.add_argument("--steps", type=int, default=20 if gpus >= 2 else 5)
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: 1 when "
                        "every device is a CPU, so that timings on a busy machine are not "
                        "wrecked by waiting threads)")
    parser.add_argument("--json", help="write the rows to this JSON file")
    args = parser.parse_args()

    if args.devices:
        devices = args.devices.split(",")
        if not gpus and any(d.strip().startswith("cuda") for d in devices):
            print(f"no GPU on this machine: running {len(devices)} CPU devices instead of "
                  f"{args.devices}")  # as calibrate does
            devices = ["cpu"] * len(devices)
        try:
            devices = [check_device(d) for d in devices]
        except TravorderError as exc:
            raise SystemExit(f"error: {exc}") from None
    else:
        devices = [f"cuda:{i}" for i in range(gpus)] if gpus >= 2 else ["cpu"] * 3
    plumbing = len({torch.device(d) for d in devices}) == 1
    if args.threads or all(torch.device(d).type == "cpu" for d in devices):
        torch.set_num_threads(args.threads or 1)
    t0 = time.perf_counter()
    if args.cluster:
        cluster = load_cluster(args.cluster)
    else:
        cluster = calibrate(devices, log=lambda line: print(f"calibrate: {line}"))
    print(f"cluster {cluster.name} ({cluster.n_devices} devices, calibrated/loaded in "
          f"{time.perf_counter() - t0:.1f} s); torch {torch.__version__}; devices "
          f"{','.join(devices)}")
    if plumbing:
        print("all devices map to one: a plumbing run, measured times do not depend on "
              "the placement")
    if cluster.n_devices != len(devices):
        raise SystemExit(f"cluster has {cluster.n_devices} devices, {len(devices)} given")

    print(f"{'model':12s} {'placer':12s} {'order':14s} {'devs':>4s} {'copies':>6s} "
          f"{'simulated_us':>12s} {'measured_us':>12s} {'(min)':>12s}")
    rows = []
    for name in args.models.split(","):
        rows += run_model(name, devices, cluster, args.scale, args.batch, args.steps)

    print("\nSpearman rank correlation, simulated vs measured (median) step time:")
    for name in args.models.split(","):
        mine = [r for r in rows if r["model"] == name]
        print(f"  {name:12s} {_rho(mine):6.3f}  ({len(mine)} placements)")
    print(f"  {'all':12s} {_rho(rows):6.3f}  ({len(rows)} placements)")
    print(f"total {time.perf_counter() - t0:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"devices": devices, "cluster":
                                               cluster.to_dict(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
