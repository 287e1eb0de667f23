"""The study report: an HTML page with PNG figures and a recommendations table.

The scenario table gives, per placer, scenario, coarsening level (`coarsening`) and cluster
(`scenario_summary`): the rows, the share where one device cannot hold the step, the share
where the best placement beats one device, the median speed-up over one device, and the
share where the order matters: the best order beats the worst by more than 5%, beats the
second (the fastest order that is not a construction tie of the best) beyond noise, and does
so by more than 5%. Where graphs ran at more than one coarsening level, a second table
compares the order effect on those graphs at each level (`granularity`).

For each placer, scenario and coarsening level in the store (clusters pooled):

- ``wins_<placer>_<scenario>_<level>.png``: per family, the winning share of each order (a
  graph whose best order is tied with others credits each of them ``1 / n_ties``) and its mean
  rank (1 = fastest; tied means share the average rank), as heatmaps;
- ``ratio_<placer>_<scenario>_<level>.png``: per order, the ratio of its step time to the
  best order's on each graph (box plot over graphs, points for the graphs);
- ``curves_<cluster>_<scenario>_<config>.png`` (when the store has ``rl`` runs): per
  cluster, scenario and placer configuration (``config`` starts its ``config_hash``; the
  title gives its options), the mean RL learning curve per order, each run's step time
  per episode divided by its first episode's; the greedy evaluation episodes make the
  saw-tooth;
- ``timeline_<placer>_<family>.png``: per family, the simulated step of the best and of
  the worst order (the seed nearest each order's mean) on one row, the family's row
  where they differ most, on a graph of at most `TIMELINE_NODES` nodes where there is one,
  that can be found again (in the bundled corpus, by hash, or at its source path) and
  that its scenario prepares to the graph the jobs placed. The placements and learning
  curves are in the result stores: a report of datasets alone has neither figure.

Heatmaps of more than a dozen families repeat the order names above them; log axes are
labelled with plain numbers.

The recommendations table gives, per placer, scenario, coarsening level and family (over
its clusters), the order with the lowest geometric-mean ratio to the best order (ties: the
larger winning share), that ratio, its winning share, the runner-up, and for comparison the
ratio of ``topo`` (of ``topo_lifo``, the published study's ``topo``, where ``topo`` did not
run; column ``topo_order`` says which), over the ``orders`` that ran there; where all of them
are within the tie tolerance of the best (a placer that fixes its own visiting order,
say), the page says "any order".

Given ``evaluations`` (per placer, the predictor's leave-family-out evaluation on this
study's dataset, which ``travorder study report --evaluate`` computes), the report adds
its table: the predictor kinds against the fixed-order baselines.
"""

from __future__ import annotations

import glob
import html
import io
import json
import os
import re
import shutil
import tempfile
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from travorder.errors import TravorderError
from travorder.study.export import (
    REL_TOL,
    dataset_orders,
    is_store,
    order_column,
    read_sources,
    row_graph,
    study_filter,
)
from travorder.study.store import ResultStore


def win_shares(data: Any) -> Any:
    """Per row of a dataset, each order's share of the win (``1 / n_ties`` for each
    order in ``ties``, else 0), as a DataFrame with one column per order."""
    import pandas as pd

    orders = dataset_orders(data)
    shares = np.zeros((len(data), len(orders)))
    col = {o: i for i, o in enumerate(orders)}
    for r, ties in enumerate(data["ties"].astype(str)):
        names = ties.split(",")
        for o in names:
            shares[r, col[o]] = 1.0 / len(names)
    return pd.DataFrame(shares, columns=orders, index=data.index)


def ratios(data: Any) -> Any:
    """Per row, each order's mean step time divided by the best order's; infinite for
    an order with an infeasible seed where the best order is feasible (it would not run).
    """
    orders = dataset_orders(data)
    times = data[[f"time_{o}" for o in orders]].to_numpy()
    feasible = np.column_stack([order_column(data, "feasible", o) for o in orders])
    column = {o: j for j, o in enumerate(orders)}
    best_ok = feasible[np.arange(len(data)), [column[b] for b in data["best_order"]]] == 1.0
    out = data[[f"time_{o}" for o in orders]].copy()
    out.columns = orders
    out[:] = np.where((feasible < 1.0) & best_ok[:, None], np.inf,
                      times / data["best_time_us"].to_numpy()[:, None])
    return out


def ranks(data: Any) -> Any:
    """Per row, each order's rank by mean step time (1 = fastest, ties averaged)."""
    return ratios(data).rank(axis=1, method="average")


def coarsening(data: Any) -> Any:
    """Per row, the coarsening level of the graph its placer saw: ``"<=N nodes"`` (graphs
    bigger than N were coarsened to N) or ``"none"``."""
    import pandas as pd

    caps = [json.loads(d).get("coarsen_max_nodes") or int(c)
            for d, c in zip(data["scenario_def"], data["coarsen_max_nodes"], strict=True)]
    return pd.Series([f"<={c} nodes" if c else "none" for c in caps], index=data.index)


def recommendations(data: Any, rel_tol: float = REL_TOL) -> Any:
    """The recommendations table (see the module docstring) as a DataFrame; column
    ``equivalent`` lists the orders whose mean ratio is within ``rel_tol`` of the
    recommended order's."""
    import pandas as pd

    rows = []
    wins, ratio = win_shares(data), ratios(data)
    for (placer, scenario, level, family), idx in data.groupby(
            ["placer", "scenario", coarsening(data), "family"]).groups.items():
        share = wins.loc[idx].mean()
        geo = np.exp(np.log(ratio.loc[idx]).mean()).dropna()  # the orders that ran here
        reference = "topo" if "topo" in geo else "topo_lifo"
        ranked = sorted(geo.index, key=lambda o: (geo[o], -share[o], o))
        best, second = ranked[0], ranked[1] if len(ranked) > 1 else None
        rows.append({
            "placer": placer, "scenario": scenario, "coarsening": level, "family": family,
            "graphs": int(data.loc[idx, "graph"].nunique()),
            "clusters": int(data.loc[idx, "cluster"].nunique()),
            "recommended": best, "orders": len(ranked),
            "equivalent": ",".join(o for o in ranked if geo[o] <= geo[best] * (1 + rel_tol)),
            "win_share": float(share[best]),
            "mean_ratio": float(geo[best]),
            "runner_up": second, "runner_up_ratio": float(geo[second]) if second else None,
            "topo_ratio": float(geo[reference]) if reference in geo else None,
            "topo_order": reference if reference in geo else None,
        })
    return pd.DataFrame(rows)


#: Timelines are drawn for a graph of at most this many nodes where the family has one.
TIMELINE_NODES = 400

#: The gap between the best and the worst order above which the order matters (5%).
MATTERS = 0.05


def scenario_summary(data: Any, rel_tol: float = REL_TOL) -> Any:
    """Per placer, scenario, coarsening level and cluster: ``rows``;
    ``one_device_infeasible`` (share of rows where one device cannot hold the step);
    ``beats_one_device`` (share where the best order's placement is feasible and, where one
    device fits, more than ``rel_tol`` faster than it); ``median_speedup`` over one device
    (rows where it fits); ``no_feasible`` (rows where no order found a feasible placement);
    ``order_matters_5pct`` (best vs worst order > `MATTERS`); ``beyond_noise`` (best vs
    second beyond noise, `travorder.study.export.tied_with`); ``second_5pct`` (best vs
    second beyond noise and by more than `MATTERS`); ``median_gap_second`` (second / best -
    1)."""
    import pandas as pd

    orders = dataset_orders(data)
    feasible = np.column_stack([order_column(data, "feasible", o) for o in orders]) == 1.0
    rows = []
    for (placer, scenario, level, cluster), idx in data.groupby(
            ["placer", "scenario", coarsening(data), "cluster"], sort=False).groups.items():
        part = data.loc[idx]
        fits = part["single_device_feasible"].astype(bool)
        best_ok = feasible[data.index.get_indexer(idx)].any(axis=1)
        beats = best_ok & (~fits | (part["speedup"] > 1 + rel_tol))
        matters = part["gap_worst"] > MATTERS
        noise = ~part["second_tied"].astype(bool)
        rows.append({
            "placer": placer, "scenario": scenario, "coarsening": level, "cluster": cluster,
            "rows": len(part),
            "one_device_infeasible": float((~fits).mean()),
            "beats_one_device": float(beats.mean()),
            "median_speedup": float(part.loc[fits, "speedup"].median()) if fits.any()
            else np.nan,
            "no_feasible": int((~best_ok).sum()),
            "order_matters_5pct": float(matters.mean()),
            "beyond_noise": float(noise.mean()),
            "second_5pct": float((noise & (part["gap_second"] > MATTERS)).mean()),
            "median_gap_second": float(part["gap_second"].median()),
        })
    return pd.DataFrame(rows)


def granularity(data: Any) -> Any:
    """The order effect at each coarsening level, over the graphs that ran at more than
    one level (same placer, scenario and cluster): per level, ``rows``, ``beyond_noise``
    and ``second_5pct`` (as `scenario_summary`, shares), ``order_matters_5pct``,
    ``median_gap_worst`` (worst / best - 1) and ``best_orders`` (how often each order was
    the best, most first)."""
    import pandas as pd

    data = data.reset_index(drop=True)
    level = coarsening(data)
    keys = ["placer", "scenario", "cluster", "graph"]
    n_levels = level.groupby([data[k] for k in keys]).transform("nunique")
    both = data[n_levels > 1]
    rows = []
    for (placer, scenario, cluster, lvl), idx in both.groupby(
            ["placer", "scenario", "cluster", level[n_levels > 1]]).groups.items():
        part = both.loc[idx]
        noise = ~part["second_tied"].astype(bool)
        best = part["best_order"].value_counts()
        rows.append({
            "placer": placer, "scenario": scenario, "cluster": cluster, "coarsening": lvl,
            "rows": len(part),
            "beyond_noise": float(noise.mean()),
            "second_5pct": float((noise & (part["gap_second"] > MATTERS)).mean()),
            "order_matters_5pct": float((part["gap_worst"] > MATTERS).mean()),
            "median_gap_worst": float(part["gap_worst"].median()),
            "best_orders": ", ".join(f"{o} {n}" for o, n in best.items()),
        })
    return pd.DataFrame(rows, columns=["placer", "scenario", "cluster", "coarsening", "rows",
                                       "beyond_noise", "second_5pct", "order_matters_5pct",
                                       "median_gap_worst", "best_orders"])


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)


#: Heatmaps with more rows (families) than this repeat the order names above them.
_REPEAT_AXIS_ROWS = 12

#: What the RL learning-curve figures say about their saw-tooth.
CURVES_NOTE = ("One figure per cluster, scenario and placer configuration. Every "
               "eval_every-th episode (5 by default) is a greedy evaluation that takes the "
               "most likely device at each step: the saw-tooth of the curves.")


def _plain_log_ticks(axis: Any) -> None:
    """Tick labels of a log axis as plain numbers (``6``, not ``6x10^0``); minor ticks
    labelled at 2, 3 and 5 times a power of ten only, so they do not crowd."""
    from matplotlib.ticker import FuncFormatter

    def minor(v: float, _: Any) -> str:
        return f"{v:g}" if f"{v:.0e}"[0] in "235" else ""

    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(FuncFormatter(minor))


def _save(fig: Any, path: Path, dpi: int = 110) -> None:
    """Write ``fig`` as a 256-colour PNG and close it: the figures are flat colours and
    text, and a palette keeps a corpus-sized report a few megabytes."""
    import matplotlib.pyplot as plt
    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    Image.open(buf).convert("RGB").quantize(256).save(path, optimize=True)


def _orders_run(data: Any) -> Any:
    """``data`` without the columns of the orders that ran on none of its rows (sources
    whose studies ran other orders: a mix of placers, say)."""
    gone = {o for o in dataset_orders(data) if data[f"time_{o}"].isna().all()}
    return data.drop(columns=[c for c in data.columns
                              if c.partition("_")[0] in ("time", "se", "seeds", "feasible")
                              and c.partition("_")[2] in gone])


def _heatmaps(data: Any, path: Path, title: str) -> None:
    import matplotlib.pyplot as plt

    wins = win_shares(data).groupby(data["family"]).mean()
    rank = ranks(data).groupby(data["family"]).mean()
    # constrained layout keeps the title above the heatmaps (tight_layout let it overlap)
    # the two maps side by side, a row per family (a corpus has dozens)
    fig, axes = plt.subplots(1, 2, figsize=(2 * (2.2 + 0.55 * wins.shape[1]),
                                            2.6 + 0.3 * wins.shape[0]), squeeze=False,
                             layout="constrained")
    for ax, table, label, cmap in ((axes[0, 0], wins, "winning share", "Blues"),
                                   (axes[0, 1], rank, "mean rank", "Blues_r")):
        values = table.to_numpy()
        im = ax.imshow(values, aspect="auto", cmap=cmap)
        ax.set_xticks(range(table.shape[1]), table.columns, rotation=45, ha="right")
        if table.shape[0] > _REPEAT_AXIS_ROWS:  # a tall map: the order names on top too
            top = ax.secondary_xaxis("top")
            top.set_xticks(range(table.shape[1]), table.columns, rotation=45, ha="left")
        ax.set_yticks(range(table.shape[0]), table.index)
        lo, hi = np.nanmin(values), np.nanmax(values)
        for (i, j), v in np.ndenumerate(values):
            level = (v - lo) / (hi - lo) if hi > lo else 0.0
            light = level > 0.5 if label == "winning share" else level < 0.5
            ax.text(j, i, f"{v:.2f}" if label == "winning share" else f"{v:.1f}",
                    ha="center", va="center", fontsize=7, color="w" if light else "k")
        ax.set_title(label)
        fig.colorbar(im, ax=ax, shrink=0.8)
    fig.suptitle(_wrapped(title, fig))
    _save(fig, path, dpi=90)


def _wrapped(title: str, fig: Any) -> str:
    """``title`` in lines that fit ``fig``'s width (a long scenario name is not cut)."""
    return textwrap.fill(title, max(30, int(fig.get_figwidth() * 9)))


def _ratio_plot(data: Any, path: Path, title: str) -> None:
    import matplotlib.pyplot as plt

    table = ratios(data)
    orders = list(table.columns)
    fig, ax = plt.subplots(figsize=(1.5 + 0.8 * len(orders), 4.2))
    values = [table[o].replace(np.inf, np.nan).dropna().to_numpy() for o in orders]
    ax.boxplot(values, showfliers=False)
    rng = np.random.default_rng(0)
    for i, v in enumerate(values, start=1):
        ax.scatter(i + rng.uniform(-0.18, 0.18, v.size), v, s=6, alpha=0.5)
    ax.set_xticks(range(1, len(orders) + 1), orders, rotation=60, ha="right")
    ax.set_yscale("log")
    _plain_log_ticks(ax.yaxis)
    ax.set_ylabel("step time / best order's")
    ax.set_title(_wrapped(title, fig))
    fig.tight_layout()
    _save(fig, path)


def _query(stores: list[Path], study: str | None, select: str, where: str
           ) -> tuple[Any, dict[str, str]]:
    """The finished jobs of ``stores`` (``SELECT select FROM jobs WHERE ... AND where``),
    concatenated, and the cluster definitions by hash."""
    import pandas as pd

    frames, clusters = [], {}
    for path in stores:
        with ResultStore(path, create=False) as store:
            extra, params = study_filter(store, study)
            frames.append(pd.read_sql_query(
                f"SELECT {select} FROM jobs WHERE status = 'done' AND {where}{extra}",
                store.connection, params=params))
            clusters |= dict(store.connection.execute(
                "SELECT cluster_hash, definition FROM clusters").fetchall())
    return pd.concat(frames, ignore_index=True), clusters


def _curves(stores: list[Path], out: Path, study: str | None) -> list[Path]:
    import matplotlib.pyplot as plt

    if not stores:  # datasets hold no learning curves
        return []
    runs, _ = _query(stores, study, "cluster, scenario, config_hash, placer_options, "
                     "order_name, learning_curve", "placer = 'rl' AND learning_curve IS NOT NULL")
    paths = []
    # one figure per configuration: runs of other options or scenarios are not averaged
    for (cluster, scenario, config), part in runs.groupby(["cluster", "scenario",
                                                             "config_hash"]):
        options = json.loads(part["placer_options"].iloc[0])
        every = options.get("eval_every")
        fig, ax = plt.subplots(figsize=(6, 4))
        for order, group in part.groupby("order_name"):
            curves = [np.asarray(json.loads(c), dtype=float) for c in group["learning_curve"]]
            n = min(c.size for c in curves)  # a configuration's runs: the same episodes
            rel = np.array([c[:n] / c[0] for c in curves])
            ax.plot(np.arange(1, n + 1), rel.mean(axis=0), label=f"{order} ({len(curves)})")
        ax.set_xlabel("episode")
        ax.set_ylabel("step time / first episode's (mean over runs)")
        ax.set_title(f"RL learning curves, {cluster}, {scenario}\n"
                     f"{_options_text(options)} (" + (
                         f"one episode in {every}" if every else
                         "at the default eval_every, one episode in 5") +
                     " greedy: the saw-tooth)", fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out / f"curves_{_slug(cluster)}_{_slug(scenario)}_{config[:6]}.png"
        _save(fig, path)
        paths.append(path)
    return paths


def _options_text(options: dict[str, Any]) -> str:
    """Placer options for a figure title: ``preset=paper, episodes=200``."""
    return ", ".join(f"{k}={v}" for k, v in options.items()) or "default options"


def _timelines(stores: list[Path], data: Any, out: Path, study: str | None
               ) -> list[tuple[str, Path]]:
    """The timeline figures (see the module docstring): (placer and cluster, file)."""
    from travorder.placement import Cluster, Simulator
    from travorder.placement.timeline import plot_gantt
    from travorder.study.store import decode_placement

    if not stores:  # the placements are in the stores; datasets hold none
        return []
    jobs, clusters = _query(
        stores, study, "graph_hash, graph_name, scenario, cluster, cluster_hash, placer, "
        "config_hash, order_name, seed, step_time_us, placement, study_hash",
        "placement IS NOT NULL")
    table = ratios(data).replace(np.inf, np.nan)
    figures = []
    for (placer, family), part in data.groupby(["placer", "family"]):
        spread = (table.loc[part.index].max(axis=1) / table.loc[part.index].min(axis=1))
        # the widest spread, on a graph small enough to read (the smallest otherwise)
        small = data.loc[part.index, "n_nodes"] <= TIMELINE_NODES
        order = spread[spread > 1].to_frame("s").assign(small=small).sort_values(
            ["small", "s"], ascending=False).index
        for idx in order:
            row = data.loc[idx]
            cluster = row["cluster"]
            graph = row_graph(row)
            if graph is None:
                continue
            worst = str(table.loc[idx].idxmax())
            tls, titles = [], []
            for order in (row["best_order"], worst):
                runs = jobs[(jobs.graph_hash == row["graph_hash"])
                            & (jobs.graph_name == row["graph"]) & (jobs.cluster == cluster)
                            & (jobs.scenario == row["scenario"])
                            & (jobs.placer == placer) & (jobs.config_hash == row["config_hash"])
                            & (jobs.order_name == order)]
                if runs.empty or runs.iloc[0].study_hash != graph.graph_hash:
                    break
                job = runs.iloc[int(np.argmin(np.abs(runs.step_time_us - row[f"time_{order}"])))]
                c = Cluster.from_dict(json.loads(clusters[job.cluster_hash]))
                tls.append(Simulator(graph, c).timeline(decode_placement(job.placement)))
                titles.append(f"{row['graph']}, {placer}, order {order} (seed {job.seed})")
            if len(tls) == 2:
                path = out / f"timeline_{_slug(placer)}_{_slug(family)}.png"
                _save(plot_gantt(tls, titles=titles), path, dpi=100)
                figures.append((f"{placer}, {family}: {row['scenario']} on {cluster}", path))
                break
    return figures


def _table_html(table: Any) -> str:
    return table.to_html(index=False, float_format=lambda x: f"{x:.3f}", na_rep="",
                         border=0, classes="rec")


def _sentence(r: Any, rel_tol: float) -> str:
    others = r.equivalent.split(",")[1:]
    if len(others) + 1 == r.orders > 1:  # an order-free placer, say: nothing to pick
        return (f"<li><b>{html.escape(r.family)}</b> ({html.escape(r.placer)}): any order "
                f"in {html.escape(r.scenario)}: all {r.orders} within {100 * rel_tol:g}% of "
                f"the best on average</li>")
    also = (f" (as good within {100 * rel_tol:g}%: {', '.join(others)})" if others else "")
    topo = f"; <code>{r.topo_order}</code> {r.topo_ratio:.3f}x" \
        if isinstance(r.topo_order, str) else ""
    return (f"<li><b>{html.escape(r.family)}</b> ({html.escape(r.placer)}): use "
            f"<code>{html.escape(r.recommended)}</code>{html.escape(also)} in "
            f"{html.escape(r.scenario)}: win share "
            f"{100 * r.win_share:.0f}% (orders tied for best share a win), "
            f"{r.mean_ratio:.3f}x the best on average{topo}</li>")


def _evaluation_html(placer: str, ev: Any) -> str:
    table = ev.table.reset_index()
    for col in ("mean_regret", "p90_regret", "worst_family_excess"):
        table[col] = [f"{100 * v:.2f}%" for v in table[col]]
    if "families_worse" in table:  # a count (none for the random order)
        table["families_worse"] = ["" if v != v else f"{v:.0f}" for v in table["families_worse"]]
    return (f"<h3>{html.escape(placer)}: best fixed order "
            f"<code>{html.escape(ev.best_fixed.removeprefix('always-'))}</code></h3>\n"
            + _table_html(table))


def write_report(sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
                 out_dir: str | os.PathLike[str], study: str | None = None,
                 evaluations: dict[str, Any] | None = None) -> list[Path]:
    """Write ``index.html`` and the figures for ``sources`` (result stores, exported
    datasets or bundled ones, see `read_sources`; of a store only its study named
    ``study``, if given) into ``out_dir`` (made if needed, in a folder that exists);
    returns the files written. They are made in a temporary folder (inside ``out_dir``,
    or beside it when it is to be made; named with the process id, so that the next
    report removes one left by a process killed outright) and moved in at the end, so an
    error or an interruption leaves nothing half-written. The timelines
    and learning curves need the stores' jobs: datasets give the tables and the
    per-scenario figures alone. ``evaluations``: per placer, an evaluation with ``table``
    and ``best_fixed`` (`travorder.predictor.evaluate.Evaluation`) to include."""
    import matplotlib

    matplotlib.use("Agg")
    sources = [sources] if isinstance(sources, str | os.PathLike) else list(sources)
    out = Path(out_dir)
    data = read_sources(sources, study, REPORT_COLUMNS)  # bad input: nothing written
    _check_winners(data)
    if out.exists() and not out.is_dir():
        raise TravorderError(f"{str(out)!r} is a file, not a folder")
    target = Path(os.path.realpath(out))
    # in the folder, or beside it when it is to be made: on its file system
    prefix = ".report-" if target.is_dir() else f".{target.name}-"
    parent = target if target.is_dir() else target.parent
    _remove_orphans(parent, prefix)
    try:
        work = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent))
    except OSError as exc:
        raise TravorderError(f"cannot write the report into {str(out)!r}: "
                             f"{exc.strerror or exc}") from None
    try:
        files = _write_report(sources, data, work, study, evaluations)
        if target.is_dir():  # one report per folder: the last one's figures go
            names = {f.name for f in files}
            for old in target.iterdir():
                if (old.name not in names and old.is_file() and old.suffix == ".png"
                        and old.name.startswith(_FIGURE_PREFIXES)):
                    old.unlink()
            for f in files:
                os.replace(f, target / f.name)
        else:
            work.chmod(0o777 & ~_umask())  # a folder as mkdir would make it
            work.rename(target)
        return [out / f.name for f in files]
    finally:
        shutil.rmtree(work, ignore_errors=True)


#: The report's figure files start so (`write_report` replaces those of an earlier report).
_FIGURE_PREFIXES = ("wins_", "ratio_", "curves_", "timeline_")

#: The dataset columns the report reads, beside each order's.
REPORT_COLUMNS = ("graph", "family", "cluster", "placer", "scenario", "scenario_def",
                  "coarsen_max_nodes", "single_device_feasible", "speedup", "gap_worst",
                  "gap_second", "second_tied")


def _check_winners(data: Any) -> None:
    """Refuse rows whose ``best_order`` or ``ties`` name an order without a step time
    there: the summary of a study's orders of which only some are given."""
    times = {o: data[f"time_{o}"].to_numpy(dtype=float) for o in dataset_orders(data)}
    for i, (best, ties) in enumerate(zip(data["best_order"], data["ties"].astype(str),
                                         strict=True)):
        lost = [o for o in dict.fromkeys([best, *ties.split(",")])
                if o not in times or np.isnan(times[o][i])]
        if lost:
            row = data.iloc[i]
            raise TravorderError(
                f"dataset row of graph {row['graph']!r}, cluster {row['cluster']!r}, "
                f"scenario {row['scenario']!r} names {lost[0]!r} among its best orders "
                f"but has no step time for it: give the study's other results as well, "
                f"or export the dataset again")


def _remove_orphans(parent: Path, prefix: str) -> None:
    """Remove the working folders ``<prefix><pid>-*`` in ``parent`` of reports whose
    process is gone (killed with SIGKILL, which no clean-up survives)."""
    for d in parent.glob(f"{glob.escape(prefix)}*-*"):
        pid = d.name.removeprefix(prefix).split("-", 1)[0]
        if d.is_dir() and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write_report(sources: list[Any], data: Any, out: Path, study: str | None,
                  evaluations: dict[str, Any] | None) -> list[Path]:
    """`write_report` of ``data`` (read from ``sources``) into folder ``out``."""
    stores = [Path(s) for s in sources if is_store(s)]
    written: list[Path] = []
    sections = []
    for (placer, scenario, level), part in data.groupby(
            ["placer", "scenario", coarsening(data)], sort=False):
        part = _orders_run(part.reset_index(drop=True))
        tag = f"{_slug(placer)}_{_slug(scenario)}_{_slug(level).strip('_')}"
        clusters = ", ".join(sorted(part["cluster"].unique()))
        title = f"{placer}, {scenario}, coarsened {level}: {len(part)} rows ({clusters})"
        wins_png, ratio_png = out / f"wins_{tag}.png", out / f"ratio_{tag}.png"
        _heatmaps(part, wins_png, title)
        _ratio_plot(part, ratio_png, title)
        written += [wins_png, ratio_png]
        sections.append(f"<h2>{html.escape(title)}</h2>\n"
                        f'<img src="{wins_png.name}" alt="winning share and rank">\n'
                        f'<img src="{ratio_png.name}" alt="ratio to the best order">')
    timelines = _timelines(stores, data, out, study)
    written += [p for _, p in timelines]
    if timelines:
        sections.append("<h2>Timelines of the best and the worst order</h2>\n<p>Per family, "
                        "one graph's simulated step under its best and its worst order "
                        "(red: the critical path; docs/simulator.md).</p>\n" + "\n".join(
                            f'<h3>{html.escape(what)}</h3><img src="{p.name}" alt="timelines">'
                            for what, p in timelines))
    curves = _curves(stores, out, study)
    written += curves
    sections += ["<h2>RL learning curves</h2>\n" + f"<p>{CURVES_NOTE}</p>\n" + "\n".join(
        f'<img src="{p.name}" alt="learning curves">' for p in curves)] if curves else []
    summary = scenario_summary(data, REL_TOL)
    both = granularity(data)
    levels = ("<h2>The order effect at both coarsening levels</h2>\n<p>The graphs that ran "
              "coarsened and at full granularity, each level's rows (the same graphs): best "
              f"vs second beyond noise; and by more than {100 * MATTERS:g}%; best vs worst "
              f"&gt; {100 * MATTERS:g}%; the median gap best to worst; which orders were "
              f"best.</p>\n{_table_html(both)}") if len(both) else ""
    recs = recommendations(data, REL_TOL)
    sentences = "\n".join(_sentence(r, REL_TOL) for r in recs.itertuples())
    source = html.escape(", ".join(Path(str(s)).name for s in sources))
    evaluation = "".join(_evaluation_html(p, ev) for p, ev in (evaluations or {}).items())
    if evaluation:
        evaluation = ("<h2>Predictor evaluation (leave-family-out)</h2>\n<p>Each family held "
                      "out in turn; regret = step time with the recommended order / the best "
                      "order's - 1 (docs/predictor.md).</p>\n" + evaluation)
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>travorder study report</title>
<style>body{{font-family:sans-serif;max-width:1200px;margin:auto}} img{{max-width:100%}}
table.rec td, table.rec th{{padding:2px 8px;text-align:left}}</style></head><body>
<h1>travorder study report</h1>
<p>{len(data)} rows (graph x scenario x cluster x placer) from <code>{source}</code>.
An order wins a row when its mean step time over the seeds is the best or tied with it:
within max({100 * REL_TOL:g}%, two standard errors of the difference); orders that
visited the same sequence or reached the same placement are tied by construction (see
docs/study.md).</p>
<h2>Where placement and the order matter</h2>
<p>Per scenario, coarsening level and cluster: the share of rows where one device cannot
hold the step, where the best placement beats one device, the median speed-up over one
device, the rows where no order found a feasible placement, and the share where the order
matters: best vs worst order &gt; {100 * MATTERS:g}%; best vs second-best (skipping
construction ties) beyond noise; best vs second-best beyond noise and by more than {100 *
MATTERS:g}%.</p>
{_table_html(summary)}
{levels}
<h2>Recommendations per network family</h2>
<ul>
{sentences}
</ul>
{_table_html(recs)}
{evaluation}
{"".join(sections)}
</body></html>
"""
    index = out / "index.html"
    index.write_text(page, encoding="utf-8")
    if not written:
        raise TravorderError(f"{source}: nothing to report")
    return [index, *written]
