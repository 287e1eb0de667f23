"""How a sequential placer should visit a pipelined graph: two ways, side by side.

For corpus graphs at their training batch, coarsened to 200 groups and unrolled over M
micro-batches, greedy places the graph under several orders computed two ways:

- *unrolled*: the order applied to the pipelined graph itself;
- *together*: the order of micro-batch 0's graph, each op followed by its copies
  (`travorder.placement.traversal_order` on a pipelined graph, what travorder uses).

It prints, per graph, cluster and M, the speed-up over one device of the worst and the
best order each way, and the median over graphs (docs/study.md, "Scenarios").

    python benchmarks/pipeline_order.py [--graphs resnet50 bert_base ...]
"""

from __future__ import annotations

import argparse

import numpy as np

from travorder.datasets.corpus import load_corpus
from travorder.placement import Simulator, load_cluster, traversal_order
from travorder.placement.orders import get_order
from travorder.placement.placers.heuristics import greedy, single
from travorder.study.scenarios import Scenario

ORDERS = ("topo", "topo_lifo", "dfs_preorder", "critical_path", "lexico_topo",
          "reverse_postorder", "bfs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", nargs="+", default=[
        "resnet50", "bert_base", "inception_v3", "gpt2", "vgg19_bn", "densenet121"])
    parser.add_argument("--clusters", nargs="+", default=["k80x3", "v100x4-nvlink"])
    parser.add_argument("--micro-batches", nargs="+", type=int, default=[4, 8])
    args = parser.parse_args()
    graphs = load_corpus(names=args.graphs)
    print(f"{'cluster':14} {'M':>2} {'graph':14} {'unrolled worst/best':>20} "
          f"{'together worst/best':>20}")
    for cname in args.clusters:
        cluster = load_cluster(cname)
        for m in args.micro_batches:
            scenario = Scenario(batch="train", micro_batches=m, coarsen_max_nodes=200)
            summary = []
            for g in graphs:
                p = scenario.prepare(g, training=True, coarsen_max_nodes=0)
                sim = Simulator(p, cluster)
                one = sim.run(single(p, cluster, None, 0)).step_time_us
                unrolled = [one / sim.run(greedy(p, cluster, get_order(o)(p, 0), 0))
                            .step_time_us for o in ORDERS]
                together = [one / sim.run(greedy(p, cluster, traversal_order(p, o), 0))
                            .step_time_us for o in ORDERS]
                row = (min(unrolled), max(unrolled), min(together), max(together))
                summary.append(row)
                print(f"{cname:14} {m:>2} {g.name:14} {row[0]:>9.2f} / {row[1]:<8.2f} "
                      f"{row[2]:>9.2f} / {row[3]:<8.2f}", flush=True)
            med = np.median(np.array(summary), axis=0)
            print(f"{cname:14} {m:>2} {'median':14} {med[0]:>9.2f} / {med[1]:<8.2f} "
                  f"{med[2]:>9.2f} / {med[3]:<8.2f}", flush=True)


if __name__ == "__main__":
    main()
