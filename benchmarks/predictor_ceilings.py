"""What knowing a row's group is worth: fixed orders per cluster, family, graph, in-sample.

For each scenario of a study dataset, the mean regret (step time over the row's best,
minus 1) of always taking the order with the lowest mean regret

- ``best-fixed``: over all the scenario's rows;
- ``per-cluster``: over the rows of the row's cluster;
- ``per-family``: over the rows of the row's family (every cluster);
- ``per-graph``: over the rows of the row's graph (every cluster);
- ``per-family-cluster``: over the rows of the row's family on the row's cluster;

each chosen on the rows it is then measured on (in-sample: an optimistic bound for any
rule that knows only that group), with its ratio to ``best-fixed``. A leave-family-out
predictor never sees the held-out family, so reaching a ratio that even ``per-family``
misses means telling the rows of one family apart.

A second table says where ``best-fixed``'s regret lies: the share of the rows where its
order is more than `FAR` off the best, their share of its regret, and how many orders
are best on them.

    python benchmarks/predictor_ceilings.py [--data bundled:greedy] [--placer greedy]
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from travorder.predictor.dataset import design_matrix
from travorder.study.export import read_sources

GROUPINGS = {
    "best-fixed": [],
    "per-cluster": ["cluster"],
    "per-family": ["family"],
    "per-graph": ["graph_hash"],
    "per-family-cluster": ["family", "cluster"],
}
FAR = 0.05


def fixed_per_group(regret: pd.DataFrame, keys: pd.DataFrame) -> float:
    """Mean regret of the order with the lowest mean regret within each group of rows
    (rows grouped by the columns of ``keys``; no column: one group).

    >>> r = pd.DataFrame({"a": [0.0, 0.2], "b": [0.1, 0.0]})
    >>> fixed_per_group(r, pd.DataFrame(index=r.index)), fixed_per_group(r, r[["a"]])
    (0.05, 0.0)
    """
    if keys.shape[1] == 0:
        return float(regret.mean().min())
    means = regret.groupby([keys[c].to_numpy() for c in keys.columns]).transform("mean")
    pick = means.to_numpy().argmin(axis=1)
    return float(regret.to_numpy()[np.arange(len(regret)), pick].mean())


def ceilings(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per scenario (and ``all``): each grouping's mean regret (module docstring)."""
    data = design_matrix(frame)
    times = data.times
    regret = times.div(times.min(axis=1), axis=0) - 1
    meta = data.frame
    rows = []
    for scenario in [*sorted(meta["scenario"].unique()), "all"]:
        sel = (meta["scenario"] == scenario).to_numpy() if scenario != "all" else \
            np.ones(len(meta), dtype=bool)
        r, m = regret[sel], meta[sel]
        keys = {n: m[cols + (["scenario"] if scenario == "all" else [])]
                for n, cols in GROUPINGS.items()}
        fixed = r[r.mean().idxmin()]
        far = (fixed > FAR).to_numpy()
        rows.append({"scenario": scenario, "rows": int(sel.sum()),
                     **{n: fixed_per_group(r, k) for n, k in keys.items()},
                     "far_rows": far.mean(), "far_regret": fixed[far].sum() / fixed.sum(),
                     "far_winners": r[far].idxmin(axis=1).nunique()})
    return pd.DataFrame(rows).set_index("scenario")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", nargs="+", default=["bundled:greedy"])
    ap.add_argument("--placer", default="greedy")
    args = ap.parse_args()
    frame = read_sources(args.data)
    frame = frame[frame["placer"] == args.placer].reset_index(drop=True)
    table = ceilings(frame)
    names = list(GROUPINGS)
    print("| scenario | rows | " + " | ".join(names) + " |")
    print("| --- | --- |" + " --- |" * len(names))
    for scenario, row in table.iterrows():
        cells = [f"{100 * row[n]:.2f}%" + (f" ({row[n] / row['best-fixed']:.2f})"
                                            if n != "best-fixed" else "") for n in names]
        print(f"| {scenario} | {int(row['rows']):,} | " + " | ".join(cells) + " |")
    print(f"\n| scenario | rows where best-fixed is > {FAR:.0%} off | their share of its "
          "regret | orders best on them |\n| --- | --- | --- | --- |")
    for scenario, row in table.iterrows():
        print(f"| {scenario} | {row['far_rows']:.1%} | {row['far_regret']:.0%} | "
              f"{int(row['far_winners'])} |")

if __name__ == "__main__":
    main()
