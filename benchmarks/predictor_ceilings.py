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

The same groupings out of sample: each row takes the order best on its group's rows of
the other graphs (a graph alone in its group: the order best on every other graph's
rows), so what knowing the group is worth for a graph never seen; ``per-graph`` there
takes the order best on the row's graph on the other clusters (a cluster never seen).
Beside them, ``nearest-graphs``: the order best on the `NEAREST` graphs of other
families nearest to the row's graph in the graph features (standardised), on the row's
cluster: what a leave-family-out rule could learn from the graphs that look alike.

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
#: Out of sample: the grouping and the column whose value each row's choice leaves out.
HELD_OUT = {n: (cols, "cluster" if n == "per-graph" else "graph_hash")
            for n, cols in GROUPINGS.items()}
NEAREST = 10
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


def _group_ids(keys: pd.DataFrame) -> np.ndarray:
    """Per row, a number for its group: its values of ``keys``' columns (none: one group)."""
    if keys.shape[1] == 0:
        return np.zeros(len(keys), dtype=np.int64)
    return keys.groupby(list(keys.columns)).ngroup().to_numpy()


def fixed_per_group_held_out(regret: pd.DataFrame, keys: pd.DataFrame,
                             held: pd.Series) -> float:
    """Like `fixed_per_group`, but each row's order is chosen on the rows of its group whose
    ``held`` value differs from its own (none: on all such rows of every group).

    >>> r = pd.DataFrame({"a": [0.0, 0.2, 0.0], "b": [0.1, 0.0, 0.3]})
    >>> round(fixed_per_group_held_out(r, r[[]], pd.Series([1, 2, 3])), 4)  # a, a, b
    0.1667
    """
    values = regret.to_numpy()
    group, own = _group_ids(keys), _group_ids(held.to_frame())
    both = _group_ids(pd.DataFrame({"group": group, "own": own}))

    def sums(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        total = np.zeros((labels.max() + 1, values.shape[1]))
        np.add.at(total, labels, values)
        return total[labels], np.bincount(labels)[labels][:, None]

    (s_group, n_group), (s_both, n_both), (s_own, n_own) = sums(group), sums(both), sums(own)
    others = np.where(n_group > n_both, (s_group - s_both) / np.maximum(n_group - n_both, 1),
                      (values.sum(axis=0) - s_own) / np.maximum(len(values) - n_own, 1))
    return float(values[np.arange(len(values)), others.argmin(axis=1)].mean())


def nearest_graphs(regret: pd.DataFrame, graph_features: pd.DataFrame, family: np.ndarray,
                   cluster: np.ndarray, k: int = NEAREST) -> float:
    """Mean regret of each row taking the order best on the ``k`` rows of other families
    on its ``cluster`` whose graph features are nearest to its own (module docstring).

    >>> r = pd.DataFrame({"a": [0.0, 0.0, 0.3], "b": [0.2, 0.1, 0.0]})
    >>> f = pd.DataFrame({"f": [0.0, 0.1, 5.0]})
    >>> round(nearest_graphs(r, f, np.array(["x", "y", "z"]), np.zeros(3), k=1), 4)  # a, a, a
    0.1
    """
    f = graph_features.to_numpy(dtype=float)
    f = np.nan_to_num((f - np.nanmean(f, axis=0)) / (np.nanstd(f, axis=0) + 1e-12))
    values = regret.to_numpy()
    picked = []
    for i in range(len(values)):
        near = np.flatnonzero((family != family[i]) & (cluster == cluster[i]))
        near = near[np.argsort(((f[near] - f[i]) ** 2).sum(axis=1), kind="stable")[:k]]
        picked.append(values[i, values[near].mean(axis=0).argmin()] if near.size else np.nan)
    return float(np.nanmean(picked))


def ceilings(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per scenario (and ``all``): each grouping's mean regret (module docstring)."""
    data = design_matrix(frame)
    times = data.times
    regret = times.div(times.min(axis=1), axis=0) - 1
    meta = data.frame
    graph_columns = [c for c in data.X.columns if c.startswith("f_")]
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
                     **{f"{n} held out": fixed_per_group_held_out(
                         r, keys[n], m[HELD_OUT[n][1]]) for n in GROUPINGS},
                     "nearest-graphs held out": nearest_graphs(
                         r, data.X[graph_columns][sel], m["family"].to_numpy(),
                         _group_ids(keys["per-cluster"])),
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
    for suffix, title, extra in [
            ("", "in sample", []),
            (" held out", "held out (other graphs; per-graph: other clusters)",
             ["nearest-graphs"])]:
        names = [n + suffix for n in [*GROUPINGS, *extra]]
        print(f"\n{title}\n\n| scenario | rows | " + " | ".join([*GROUPINGS, *extra])
              + " |")
        print("| --- | --- |" + " --- |" * len(names))
        for scenario, row in table.iterrows():
            cells = [f"{100 * row[n]:.2f}%" + (f" ({row[n] / row[names[0]]:.2f})"
                                                if n != names[0] else "") for n in names]
            print(f"| {scenario} | {int(row['rows']):,} | " + " | ".join(cells) + " |")
    print(f"\n| scenario | rows where best-fixed is > {FAR:.0%} off | their share of its "
          "regret | orders best on them |\n| --- | --- | --- | --- |")
    for scenario, row in table.iterrows():
        print(f"| {scenario} | {row['far_rows']:.1%} | {row['far_regret']:.0%} | "
              f"{int(row['far_winners'])} |")

if __name__ == "__main__":
    main()
