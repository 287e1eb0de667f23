"""Does the order that wins on a coarsened graph win on the graph a user places?

For the corpus graphs whose training step has more than ``--max-nodes`` ops (1000 by
default, what the bundled greedy study coarsened to before), greedy places each step in
the greedy study's scenarios without pipelining and on its three clusters twice under
every deterministic order: coarsened to ``--max-nodes`` groups, and whole. Per scenario
it prints how often the coarsened graph's best order is also best (within 1%) on the
whole graph, and the regret on the whole graph of: that order (what a perfect predictor of
coarsened labels would get), always ``critical_path``, and ``critical_path`` on the
coarsened graph (what the coarsened study saw). Step times are simulated on the graph
placed (docs/study.md, "What coarsening did to the greedy labels").

    python benchmarks/coarsened_labels.py [--max-nodes 1000] [--every 1] [--jobs 2]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from joblib import Parallel, delayed

from travorder.datasets.corpus import load_corpus
from travorder.graph import prepare_graph
from travorder.placement import load_cluster
from travorder.placement.orders import ORDERS
from travorder.placement.placers import place_graph
from travorder.study import load_spec
from travorder.study.export import REL_TOL

SPEC = Path(__file__).resolve().parents[1] / "src/travorder/study/specs/greedy.toml"
DETERMINISTIC = [o for o in ORDERS if o != "random"]
CP = DETERMINISTIC.index("critical_path")


def _times(g, spec, max_nodes: int) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """Per scenario and cluster: step times per order, coarsened and whole."""
    out = []
    for s in spec.scenarios:
        if s.micro_batches > 1:
            continue
        graphs = [s.prepare(g, spec.training, m) for m in (max_nodes, 0)]
        for name in spec.clusters:
            times = [[place_graph(p, s.cluster_for(p, load_cluster(name)), "greedy",
                                  order=o).step_time_us for o in DETERMINISTIC]
                     for p in graphs]
            out.append((s.name, np.array(times[0]), np.array(times[1])))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-nodes", type=int, default=1000)
    ap.add_argument("--every", type=int, default=1, help="use every N-th large graph")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    spec = load_spec(SPEC)
    large = [g for g in load_corpus()
             if prepare_graph(g, spec.training).n_nodes > args.max_nodes][::args.every]
    t0 = time.perf_counter()
    per_graph = Parallel(n_jobs=args.jobs)(delayed(_times)(g, spec, args.max_nodes)
                                           for g in large)
    rows = [r for rs in per_graph for r in rs]
    print(f"{len(large)} graphs of more than {args.max_nodes} ops in training, "
          f"{len(rows)} rows, {time.perf_counter() - t0:.0f} s")
    print(f"{'scenario':<22} {'rows':>5} {'same best':>10} {'coarse best':>12} "
          f"{'critical_path':>14} {'critical_path, coarse':>22}")
    print(f"{'':<22} {'':>5} {'':>10} {'(whole graph regret)':>27} {'(coarse regret)':>22}")
    for scenario in dict.fromkeys(r[0] for r in rows):
        coarse = np.array([r[1] for r in rows if r[0] == scenario])
        whole = np.array([r[2] for r in rows if r[0] == scenario])
        regret = whole / whole.min(axis=1, keepdims=True) - 1.0
        picked = regret[np.arange(len(regret)), coarse.argmin(axis=1)]
        coarse_cp = coarse[:, CP] / coarse.min(axis=1) - 1.0
        print(f"{scenario:<22} {len(regret):>5} {100 * (picked <= REL_TOL).mean():>9.1f}% "
              f"{100 * picked.mean():>11.2f}% {100 * regret[:, CP].mean():>13.2f}% "
              f"{100 * coarse_cp.mean():>21.2f}%")


if __name__ == "__main__":
    main()
