"""Does the best order survive perturbed costs? A perturbed study against its twin.

Each row of a perturbed dataset (scenarios with ``op_noise``, ``edge_noise``,
``latency_us``) is matched with its twin in the unperturbed dataset
(`travorder.study.export.unperturbed_twins`: the same graph, cluster, placer and
coarsening in the scenario without the perturbation settings). Per scenario and cluster
it prints the rows and

- ``differs``: the share where the perturbed best order is not the unperturbed one;
- ``outside ties``: the share where it is not even among the unperturbed row's ties
  (the label the predictor learns);
- ``regret``: mean and median of the unperturbed best order's step time on the
  perturbed costs over the perturbed best's, minus 1 (what keeping the order found on
  the estimates costs);
- ``fixed``: the same mean regret for the best fixed order of the unperturbed
  scenario (the lowest mean regret over all its rows in ``--base``), and ``kept/fixed``
  the ratio of the two: how far below that fixed order a predictor that knew every
  label of the estimates exactly would get on the perturbed costs.

    python benchmarks/perturbed_best_order.py [--perturbed bundled:greedy-perturbed]
                                              [--base bundled:greedy]
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from travorder.predictor.train import fallback_order
from travorder.study.export import bundled_dataset, load_dataset, unperturbed_twins


def _load(where: str) -> pd.DataFrame:
    if where.startswith("bundled:"):
        return bundled_dataset(where.removeprefix("bundled:"))
    return load_dataset(where)


def compare(perturbed: pd.DataFrame, base: pd.DataFrame) -> pd.DataFrame:
    """One row per perturbed scenario and cluster (module docstring)."""
    twins = unperturbed_twins(perturbed, base)
    m = perturbed.reset_index(drop=True).assign(base_best=twins["best_order"].to_numpy(),
                                                base_ties=twins["ties"].to_numpy())
    times = [c for c in base.columns if c.startswith("time_")]
    fixed = {s: fallback_order(base.loc[base["scenario"] == s, times]).removeprefix("time_")
             for s in twins["scenario"].unique()}
    m = m.assign(fixed_order=twins["scenario"].map(fixed).to_numpy())
    m = m.assign(differs=m["best_order"] != m["base_best"],
                 outside=[o not in t.split(",") for o, t in zip(m["best_order"],
                                                                m["base_ties"], strict=True)],
                 regret=_regret_of(m, "base_best"), fixed=_regret_of(m, "fixed_order"))
    table = m.groupby(["scenario", "cluster"]).agg(
        rows=("differs", "size"), differs=("differs", "mean"),
        outside_ties=("outside", "mean"), regret_mean=("regret", "mean"),
        regret_median=("regret", "median"), fixed_order=("fixed_order", "first"),
        fixed=("fixed", "mean")).reset_index()
    return table.assign(ratio=table["regret_mean"] / table["fixed"])


def _regret_of(rows: pd.DataFrame, order_column: str) -> pd.Series:
    """Per row, the regret of the order its ``order_column`` names."""
    own = rows.apply(lambda r: r[f"time_{r[order_column]}"], axis=1)
    return own / rows["best_time_us"] - 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--perturbed", default="bundled:greedy-perturbed")
    parser.add_argument("--base", default="bundled:greedy")
    args = parser.parse_args()
    perturbed = _load(args.perturbed)
    table = compare(perturbed, _load(args.base))
    print(f"{len(perturbed)} perturbed rows, each with its twin")
    print(f"{'scenario':62} {'cluster':14} {'rows':>5} {'differs':>8} {'outside ties':>13} "
          f"{'regret mean':>12} {'median':>7} {'fixed':>22} {'kept/fixed':>10}")
    for r in table.itertuples(index=False):
        print(f"{r.scenario:62} {r.cluster:14} {r.rows:5d} {r.differs:8.1%} "
              f"{r.outside_ties:13.1%} {r.regret_mean:12.2%} {r.regret_median:7.2%} "
              f"{r.fixed_order:>14} {r.fixed:7.2%} {r.ratio:10.2f}")
    total = np.average(table["differs"], weights=table["rows"])
    print(f"all: differs {total:.1%}, outside ties "
          f"{np.average(table['outside_ties'], weights=table['rows']):.1%}")
    for s, t in table.groupby("scenario", sort=False):
        kept, fixed = (np.average(t[c], weights=t["rows"]) for c in ("regret_mean", "fixed"))
        print(f"{s}: kept {kept:.2%}, fixed {t['fixed_order'].iloc[0]} {fixed:.2%}, "
              f"ratio {kept / fixed:.2f}")


if __name__ == "__main__":
    main()
