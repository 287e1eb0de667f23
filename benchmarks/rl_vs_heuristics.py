"""RL against the heuristic placers on the rows of an RL study dataset.

For every row of the RL dataset(s) (graph x scenario x cluster), the row's prepared graph
is placed again with ``greedy`` under every traversal order (``random`` with seed 0) and
with ``m_etf`` and ``m_sct`` (order ``topo``), each with the single-device floor (RL
starts from that placement where it fits); the best feasible heuristic step time is
compared with RL's best order (its mean over the seeds, ``best_time_us``: what one RL run
is expected to reach, not the luckiest seed). Infeasible placements count as infinitely
slow; rows where neither finds a feasible placement are counted, not compared. Rows are
grouped into *pipelined* (more than one micro-batch), *plain, one device too small* (the
memory-bound rows) and *plain*; per group the table gives the rows, the share where RL is
within 10% of the best heuristic, the share where it beats all of them by more than 1%,
the median ratio RL / best heuristic, and how often each heuristic is the best.

    python benchmarks/rl_vs_heuristics.py [DATASET ...] [--jobs 2] [--csv OUT]

Default dataset: the bundled RL study (``src/travorder/study/data/rl*.parquet``).
"""

from __future__ import annotations

import argparse
import glob
import time
from pathlib import Path

import numpy as np
import pandas as pd
from joblib import Parallel, delayed

from travorder.placement import ORDERS, load_cluster
from travorder.placement.placers import place_graph
from travorder.study.export import load_dataset, row_graph
from travorder.study.scenarios import row_scenario

DATA = Path(__file__).resolve().parents[1] / "src/travorder/study/data"
WITHIN, BEATS = 0.10, 0.01


def heuristics(row: pd.Series) -> dict[str, float]:
    """The best feasible step time (us) of each heuristic on the row's prepared graph."""
    graph = row_graph(row)
    if graph is None:
        return {}
    cluster = row_scenario(row["scenario_def"]).cluster_for(graph, load_cluster(row["cluster"]))

    def time_of(placer: str, order: str) -> float:
        r = place_graph(graph, cluster, placer, order, floor=True)
        return r.step_time_us if r.feasible else np.inf

    return {"greedy": min(time_of("greedy", o) for o in ORDERS),
            "m_etf": time_of("m_etf", "topo"), "m_sct": time_of("m_sct", "topo")}


def group_of(row: pd.Series) -> str:
    if row["s_micro_batches"] > 1:
        return "pipelined"
    return "plain, one device too small" if not row["single_device_feasible"] else "plain"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data", nargs="*", help="RL datasets (default: the bundled ones)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--csv", help="also write the per-row figures here")
    args = ap.parse_args(argv)
    paths = args.data or sorted(glob.glob(str(DATA / "rl*.parquet")))
    data = pd.concat([load_dataset(p) for p in paths], ignore_index=True)
    data = data[data["placer"] == "rl"].reset_index(drop=True)
    print(f"{len(data)} RL rows from {', '.join(Path(p).name for p in paths)}")
    t0 = time.perf_counter()
    found = Parallel(n_jobs=args.jobs)(delayed(heuristics)(r) for _, r in data.iterrows())
    print(f"heuristics placed in {time.perf_counter() - t0:.0f} s ({args.jobs} jobs)")
    h = pd.DataFrame(found)
    ok = h.notna().all(axis=1).to_numpy()
    rl = data["best_time_us"].where(data[[c for c in data if c.startswith("feasible_")]]
                                    .max(axis=1) == 1.0, np.inf)
    best = h.min(axis=1)
    rows = pd.DataFrame({"graph": data["graph"], "family": data["family"],
                         "scenario": data["scenario"], "cluster": data["cluster"],
                         "group": data.apply(group_of, axis=1), "rl_us": rl,
                         "best_heuristic_us": best, "best_heuristic": h.idxmin(axis=1),
                         "ratio": rl / best})[ok]
    print(f"{(~ok).sum()} rows whose graph could not be found again were skipped")
    table = rows.groupby("group").apply(lambda g: pd.Series({
        "rows": len(g),
        "neither_feasible": g.ratio.isna().sum(),
        "rl_within_10pct": (g.ratio.dropna() <= 1 + WITHIN).mean(),
        "rl_beats_all_by_1pct": (g.ratio.dropna() < 1 - BEATS).mean(),
        "median_ratio": g.ratio.replace(np.inf, np.nan).median(),
        "only_heuristics_feasible": (np.isinf(g.rl_us) & ~g.ratio.isna()).sum(),
        "only_rl_feasible": (np.isinf(g.best_heuristic_us) & ~g.ratio.isna()).sum(),
        **{f"best_is_{k}": (g.best_heuristic == k).mean() for k in h.columns}}),
        include_groups=False)
    with pd.option_context("display.width", 200, "display.float_format", "{:.3f}".format):
        print(table.to_string())
    if args.csv:
        rows.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
