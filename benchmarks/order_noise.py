"""How stable is the best traversal order when the cost model is a little off?

The bundled greedy study measures each order's step time on one cost model, but op times
and tensor sizes are known to a few percent at best. This takes the study's prepared
graphs and clusters, multiplies every op's compute cost (FLOPs, and time where known) and
every tensor's bytes by independent log-normal factors (``--sigma``, 5 % by default),
places each perturbed graph with greedy under the orders that are ever best in the study,
and reports, over rows and perturbations:

- how often the order that was best on the nominal costs is still best within 1 %;
- the mean regret on the perturbed costs of: the nominal best order (what a predictor that
  always knew the study's winner would get: the noise floor of the study's labels),
  always-``critical_path`` (the best fixed order), and each other order.

    python benchmarks/order_noise.py [--sigma 0.05] [--repeats 2] [--every 1] [--jobs 1]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from joblib import Parallel, delayed

from travorder.placement import load_cluster
from travorder.placement.placers import place_graph
from travorder.study import load_spec
from travorder.study.export import REL_TOL

SPEC = Path(__file__).resolve().parents[1] / "src/travorder/study/specs/greedy.toml"
# The orders that are ever best or tied with the best in the bundled greedy study.
ORDERS = ["critical_path", "lexico_topo", "topo", "topo_lifo", "reverse_postorder",
          "dfs_preorder"]


def _perturbed(g, sigma: float, rng: np.random.Generator):
    node = np.exp(rng.normal(0.0, sigma, g.n_nodes))
    edge = np.exp(rng.normal(0.0, sigma, g.n_edges))
    return g.replace(flops=g.flops * node, time_us=g.time_us * node,
                     edge_bytes=g.edge_bytes * edge)


def _graph_times(g, clusters, sigma: float, repeats: int, seed: int) -> np.ndarray:
    """Step times ``(clusters, 1 + repeats, orders)``; index 0 on the nominal costs."""
    rng = np.random.default_rng(seed)
    variants = [g, *(_perturbed(g, sigma, rng) for _ in range(repeats))]
    return np.array([[[place_graph(v, c, "greedy", order=o).step_time_us for o in ORDERS]
                      for v in variants] for c in clusters])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sigma", type=float, default=0.05)
    ap.add_argument("--repeats", type=int, default=2, help="perturbations per graph")
    ap.add_argument("--every", type=int, default=1, help="use every N-th graph")
    ap.add_argument("--jobs", type=int, default=1)
    args = ap.parse_args()
    spec = load_spec(SPEC)
    graphs = spec.select_graphs()[::args.every]
    clusters = [load_cluster(c) for c in spec.clusters]
    t0 = time.perf_counter()
    times = np.concatenate(Parallel(n_jobs=args.jobs)(
        delayed(_graph_times)(spec.prepare(g), clusters, args.sigma, args.repeats, i)
        for i, g in enumerate(graphs)))  # (rows, 1 + repeats, orders)
    wall = time.perf_counter() - t0
    nominal, perturbed = times[:, 0], times[:, 1:]
    regret = perturbed / perturbed.min(axis=2, keepdims=True) - 1.0  # (rows, repeats, orders)
    winner = nominal.argmin(axis=1)
    rows = np.arange(len(times))
    oracle = regret[rows, :, winner]
    still_best = (perturbed[rows, :, winner] <=
                  perturbed.min(axis=2) * (1 + REL_TOL)).mean()
    print(f"{len(times)} rows ({len(graphs)} graphs x {len(clusters)} clusters), "
          f"{args.repeats} perturbations each, sigma {args.sigma:g}; {wall:.0f} s")
    print(f"nominal best order still best within {100 * REL_TOL:g}% after perturbation: "
          f"{100 * still_best:.1f}% of cases")
    print(f"{'method':<34} mean regret   p90 regret  (on the perturbed costs)")
    print(f"{'nominal best order (noise floor)':<34} {100 * oracle.mean():9.2f}%  "
          f"{100 * np.quantile(oracle, 0.9):9.2f}%")
    for j, o in enumerate(ORDERS):
        print(f"{'always-' + o:<34} {100 * regret[:, :, j].mean():9.2f}%  "
              f"{100 * np.quantile(regret[:, :, j], 0.9):9.2f}%")
    nominal_regret = nominal / nominal.min(axis=1, keepdims=True) - 1.0
    print(f"(on the nominal costs: always-critical_path "
          f"{100 * nominal_regret[:, 0].mean():.2f}% mean regret)")


if __name__ == "__main__":
    main()
