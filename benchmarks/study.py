"""Study runner throughput and per-job overhead.

Part 1, throughput: a greedy study (the bundled corpus's chain, resnet, rnn and
transformer graphs as training graphs coarsened to 1000 nodes, four orders, two clusters:
256 jobs; ``--quick``: two families) run into a fresh store with 1 worker (in this
process) and with 2 loky workers; jobs per second over the whole `run_study` call (graph
preparation and worker start included) and the scaling ratio.

Part 2, the bundled greedy study (`src/travorder/study/specs/greedy.toml`: every order,
three clusters, five scenarios) on a sample of its corpus graphs (every 20th; ``--quick``:
every 60th) with 2 loky workers: jobs per second, and the wall time that rate projects
for the whole spec.

Part 3, overhead: a near no-op job (placer ``single`` on a two-node graph, one job per
order x seed) timed three ways: `run_job` called directly, the store's `record` alone,
and whole `run_study` runs per backend. The backend's overhead per job is the runner's
time per job minus the direct call and the store write.

    python benchmarks/study.py [--quick] [--ray] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from travorder.placement import load_cluster
from travorder.study import ResultStore, StudySpec, load_spec, run_study
from travorder.study.jobs import make_job, run_job, spec_jobs

BUNDLED = Path(__file__).resolve().parents[1] / "src/travorder/study/specs/greedy.toml"

GREEDY = {
    "name": "bench-greedy", "orders": ["topo", "topo_lifo", "dfs_preorder", "bfs"],
    "clusters": ["k80x3", "v100x4-nvlink"], "placer": {"name": "greedy"},
    "graphs": {"coarsen_max_nodes": 1000, "corpus": {
        "families": ["chain", "resnet", "rnn", "transformer"]}},
}


def throughput(workers: int, quick: bool, tmp: Path) -> dict[str, float]:
    doc = dict(GREEDY)
    if quick:
        doc["graphs"] = {**doc["graphs"], "corpus": {"families": ["chain", "resnet"]}}
    spec = StudySpec.from_dict(doc)
    summary = run_study(spec, tmp / f"greedy-{workers}.sqlite", jobs=workers, progress=False)
    return {"jobs": summary.ran, "wall_s": summary.wall_s,
            "jobs_per_s": summary.ran / summary.wall_s}


def bundled(quick: bool, tmp: Path) -> dict[str, float]:
    full = load_spec(BUNDLED)
    graphs = full.select_graphs()
    total = len(spec_jobs(full, graphs))
    names = sorted(g.name for g in graphs)[::60 if quick else 20]
    doc = full.to_dict()
    doc["graphs"] = {**doc["graphs"], "corpus": {"names": names}}
    doc["clusters"] = [c.name for c in full.clusters]
    summary = run_study(StudySpec.from_dict(doc), tmp / "bundled.sqlite", jobs=2,
                        progress=False)
    rate = summary.ran / summary.wall_s
    return {"graphs": len(names), "jobs": summary.ran, "wall_s": summary.wall_s,
            "jobs_per_s": rate, "full_jobs": total, "projected_min": total / rate / 60}


def noop_spec(seeds: int) -> StudySpec:
    return StudySpec.from_dict({
        "name": "bench-noop", "orders": "all", "seeds": seeds, "clusters": ["k80x3"],
        "placer": {"name": "single"},
        "graphs": {"training": False, "synthetic": [
            {"family": "chain", "params": {"n_layers": 1, "kind": "mlp"}}]}})


def overhead(seeds: int, backends: list[tuple[str, int]], tmp: Path) -> dict[str, float]:
    spec = noop_spec(seeds)
    g = spec.select_graphs()[0]
    prepared, cluster = spec.prepare(g), load_cluster("k80x3")
    jobs = [make_job(g, cluster, o, "single", {}, s, False) for o in spec.orders
            for s in spec.seeds]
    run_job(jobs[0], prepared, cluster)  # warm up (numba, imports)
    t0 = time.perf_counter()
    outs = [run_job(j, prepared, cluster) for j in jobs]
    direct = (time.perf_counter() - t0) / len(jobs)
    with ResultStore(tmp / "record.sqlite") as store:
        t0 = time.perf_counter()
        for j, out in zip(jobs, outs, strict=True):
            store.record(j, out)
        record = (time.perf_counter() - t0) / len(jobs)
    res = {"n_jobs": len(jobs), "direct_ms": 1e3 * direct, "store_ms": 1e3 * record}
    for backend, workers in backends:
        summary = run_study(spec, tmp / f"noop-{backend}-{workers}.sqlite", jobs=workers,
                            backend=backend, progress=False)
        per = summary.wall_s / summary.ran
        res[f"{backend}{workers}_ms"] = 1e3 * per
        res[f"{backend}{workers}_overhead_ms"] = 1e3 * (per - direct - record)
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer graphs and jobs")
    parser.add_argument("--ray", action="store_true", help="also time the Ray backend")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    console = Console()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        one, two = throughput(1, args.quick, tmp), throughput(2, args.quick, tmp)
        table = Table(title="greedy study throughput (run_study wall, setup included)")
        for col in ("workers", "jobs", "wall s", "jobs/s"):
            table.add_column(col, justify="right")
        for n, r in ((1, one), (2, two)):
            table.add_row(str(n), str(r["jobs"]), f"{r['wall_s']:.1f}",
                          f"{r['jobs_per_s']:.2f}")
        console.print(table)
        ratio = two["jobs_per_s"] / one["jobs_per_s"]
        console.print(f"scaling 2 vs 1 workers: {ratio:.2f}x")
        big = bundled(args.quick, tmp)
        console.print(
            f"bundled greedy study on {big['graphs']} of its graphs, 2 workers: "
            f"{big['jobs']} jobs in {big['wall_s']:.1f} s ({big['jobs_per_s']:.1f} jobs/s); "
            f"the whole spec ({big['full_jobs']} jobs) projects to "
            f"{big['projected_min']:.0f} min")
        backends = [("loky", 1), ("loky", 2)] + ([("ray", 2)] if args.ray else [])
        # loky1 runs in this process: the runner's own cost, no backend.
        over = overhead(10 if args.quick else 30, backends, tmp)
        table = Table(title=f"per-job overhead ({over['n_jobs']} no-op jobs)")
        table.add_column("what")
        table.add_column("ms per job", justify="right")
        for key, value in over.items():
            if key != "n_jobs":
                table.add_row(key.removesuffix("_ms"), f"{value:.2f}")
        console.print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"throughput": {"1": one, "2": two, "scaling": ratio}, "bundled": big,
             "overhead": over},
            indent=2))


if __name__ == "__main__":
    main()
