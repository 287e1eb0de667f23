"""Command line: ``recommend-order`` and ``travorder <command>``.

Every command imports what it needs when it runs, so ``recommend-order`` and
``travorder info`` start fast and never import torch. A user error (bad file, unknown
name) prints one line on stderr and exits with code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from travorder.errors import (
    BatchError,
    DimsError,
    TravorderError,
    json_text,
    write_file,
    writes_in_place,
)

EXIT_USAGE = 2


def _print_json(obj: Any) -> None:
    print(json_text(obj, indent=2))


def _check_out(path: str | None, *inputs: str | None, json_of: str = "") -> None:
    """Refuse, before any work, an output file whose folder does not exist (a typo in a
    path should not create folders), that names a folder, or that is one of the command's
    ``inputs`` (it would be replaced); given ``json_of`` (what the file holds), one whose
    name does not end in ``.json`` (a store or a model in the way would be replaced)."""
    if path is None:
        return
    out = Path(path)
    if json_of and out.suffix.lower() != ".json":
        raise TravorderError(f"{path!r}: {json_of} is written as JSON; give a file name "
                             f"ending in .json")
    _check_parent(out, path)
    if out.is_dir():
        raise TravorderError(f"{path!r} is a directory, not a file")
    for given in inputs:
        if given and out.exists() and Path(given).exists() and os.path.samefile(out, given):
            raise TravorderError(f"{path!r} is an input of the command ({given!r}): writing "
                                 f"it would replace it; give another name")
    if writes_in_place(out):
        if not os.access(out, os.W_OK):
            raise TravorderError(f"cannot write {path!r}: Permission denied")
        return
    _check_writable(Path(os.path.realpath(out)).parent, path)  # what `write_file` writes


def _check_out_dir(path: str) -> None:
    """Refuse, before any work, an output folder that is a file or whose parent folder
    does not exist (only the output folder itself is made), or that cannot be written."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise TravorderError(f"{path!r} is a file, not a folder")
    if not out.is_dir():
        _check_parent(out, path)
    _check_writable(out if out.is_dir() else out.parent, path)


def _cluster_file(cluster: str | None) -> str | None:
    """The file a ``--cluster`` reads: none for a preset's name, even beside a file so
    named."""
    from travorder.placement.clusters import PRESETS

    return None if cluster in PRESETS else cluster


def _check_parent(out: Path, path: str) -> None:
    """A one-line error unless the folder ``out`` is to be made in exists."""
    if out.parent.exists() and not out.parent.is_dir():
        raise TravorderError(f"{str(out.parent)!r} is a file, not a folder, in {path!r}")
    if not out.parent.is_dir():
        raise TravorderError(f"no such directory {str(out.parent)!r} for {path!r}")


def _check_writable(folder: Path, path: str) -> None:
    """A one-line error unless a new file can be made in ``folder`` (for ``path``)."""
    import tempfile

    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise TravorderError(f"cannot write {path!r}: {exc.strerror or exc}") from None


def _write_json(path: str, doc: Any) -> None:
    """Write JSON atomically, so an error never leaves a half-written file."""
    write_file(path, json_text(doc, indent=2) + "\n", "JSON")


def _human(x: float, unit: str = "") -> str:
    if x == math.inf:
        return "unlimited"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {prefix}{unit}"
    small = x != 0 and abs(x) < 1  # 0.5 FLOP/s, not 0
    return f"{x:{'.3g' if small else '.0f'}} {unit}".rstrip()


# --------------------------------------------------------------------------- graph
def _load(path: str, dims: dict[str, int] | None, *, training: bool = False,
          batch: int | None = None, micro_batches: int = 1) -> Any:
    """The graph of model file ``path`` with its symbolic dimensions bound to ``dims``: its
    training step if ``training``, at ``batch`` over ``micro_batches``
    (`travorder.graph.prepare.placed_graph`)."""
    from travorder.graph import load_graph, training_graph
    from travorder.graph.prepare import placed_graph

    g = load_graph(path, dims=dims)
    if batch is not None or micro_batches != 1:
        return placed_graph(g, training, batch, micro_batches)
    return training_graph(g) if training else g


def cmd_info(args: argparse.Namespace) -> None:
    import numpy as np

    from travorder.graph import training_graph
    from travorder.graph.batch import bind_hint
    from travorder.graph.load import describe_unrated

    g = _load(args.model, args.dims)
    info = {
        "name": g.name,
        "family": g.meta.get("family"),
        "source": g.meta.get("source"),
        "nodes": g.n_nodes,
        "edges": g.n_edges,
        "flops": float(g.flops.sum()),
        "param_bytes": float(g.param_bytes.sum()),
        "activation_bytes": float(g.output_bytes.sum()),
        "measured_ops": int((~np.isnan(g.time_us)).sum()),
        "backward_ops": int(g.is_backward.sum()),
        # what the placers and recommend-order work on: the training step
        "training_step_nodes": training_graph(g).n_nodes,
        "unknown_shape_ops": list(g.meta.get("unknown_shape_ops") or []),
        "unrated_op_types": dict(g.meta.get("unrated_op_types") or {}),
        "symbolic_dims": list(g.meta.get("symbolic_dims") or []),
        "dims": dict(g.meta.get("dims") or {}),
        "batch_size": g.meta.get("batch_size"),
    }
    if args.features:
        from travorder.featurize import FEATURE_SCHEMA_VERSION, graph_features

        info["feature_schema_version"] = FEATURE_SCHEMA_VERSION
        info["features"] = graph_features(g)
    if args.json:
        _print_json(info)
        return
    from rich.table import Table

    training = info["backward_ops"] > 0
    table = Table(title=f"{info['name']}", show_header=False)
    table.add_row("graph", "training step (forward and backward ops)" if training else
                  f"forward (placed as a training step of {info['training_step_nodes']} "
                  "nodes)")
    table.add_row("nodes / edges", f"{info['nodes']} / {info['edges']}")
    table.add_row("FLOPs (forward and backward)" if training else "FLOPs (forward)",
                  _human(info["flops"], "FLOP"))
    table.add_row("parameters", _human(info["param_bytes"], "B"))
    table.add_row("activations", _human(info["activation_bytes"], "B"))
    table.add_row("family / source",
                  f"{info['family'] or 'unknown'} / {info['source'] or 'unknown'}")
    table.add_row("batch", str(info["batch_size"] or "unknown"))
    if info["dims"]:
        table.add_row("bound dimensions", ", ".join(f"{k}={v}" for k, v in info["dims"].items()))
    if symbolic := info["symbolic_dims"]:
        table.add_row("symbolic dimensions", f"{', '.join(symbolic)} (unbound: "
                                             f"{bind_hint(symbolic)})")
    table.add_row("measured ops", str(info["measured_ops"]))
    table.add_row("backward ops", str(info["backward_ops"]))
    unknown = info["unknown_shape_ops"]
    table.add_row(
        "unknown-shape ops",
        f"{len(unknown)}" + (f" ({', '.join(unknown[:5])}{', ...' if len(unknown) > 5 else ''})"
                             if unknown else ""),
    )
    if unrated := info["unrated_op_types"]:
        table.add_row("ops without a FLOPs rule",
                      f"{sum(unrated.values())} ({describe_unrated(unrated)}): 1 FLOP per output "
                      f"element each")
    if args.features:
        table.add_row("[bold]features[/bold]", f"schema v{info['feature_schema_version']}")
        for k, v in info["features"].items():
            table.add_row(k, f"{v:.6g}")
    _console().print(table)


def cmd_convert(args: argparse.Namespace) -> None:
    from travorder.graph import save_graph
    from travorder.graph.native import check_native_path

    check_native_path(args.out)
    _check_out(args.out, args.model)
    g = _load(args.model, args.dims, training=args.training)
    save_graph(g, args.out)
    print(f"wrote {args.out}: {g.n_nodes} nodes, {g.n_edges} edges")


# --------------------------------------------------------------------------- placement
def _console() -> Any:
    """A rich console; when stdout is not a terminal (a pipe, a file) tables are printed
    at full width, never cut to 80 columns with an ellipsis. A reader that goes away
    (``| head``) stops the command quietly, as for plain prints (rich would exit 1)."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError

    return _Console() if sys.stdout.isatty() else _Console(width=100_000)


def _table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    from rich.table import Table

    table = Table(title=title, min_width=len(title))  # a title is never wrapped
    # The first column names the rows: never cut it, let the others wrap instead.
    table.add_column(columns[0], no_wrap=True,
                     min_width=max((len(str(r[0])) for r in rows), default=0))
    for c in columns[1:]:
        table.add_column(c)
    for r in rows:
        table.add_row(*(str(x) for x in r))
    _console().print(table)


def cmd_orders(args: argparse.Namespace) -> None:
    from travorder.placement.orders import ORDERS, TOPOLOGICAL_ORDERS, traversal_order

    g = _load(args.model, args.dims, training=args.training)
    names = [args.order] if args.order else list(ORDERS)
    orders = {n: traversal_order(g, n, args.seed) for n in names}
    if args.json:
        _print_json({n: g.names[o].tolist() for n, o in orders.items()})
        return
    if args.order:
        print("\n".join(g.names[orders[args.order]].tolist()))
        return
    show = 8
    rows = [(n, "yes" if n in TOPOLOGICAL_ORDERS else "no",
             " ".join(g.names[o[:show]].tolist()) + (" ..." if o.size > show else ""))
            for n, o in orders.items()]
    _table(f"traversal orders of {g.name} ({g.n_nodes} nodes)",
           ["order", "topological", f"first {show} nodes"], rows)


def cmd_clusters(args: argparse.Namespace) -> None:
    from travorder.placement.clusters import PRESETS, load_cluster

    if args.name:
        c = load_cluster(args.name)
        _print_json(c.to_dict()) if args.json else print(_cluster_text(c))
        return
    if args.json:
        _print_json({n: c.to_dict() for n, c in PRESETS.items()})
        return
    rows = [(n, c.n_devices, c.link_model, ", ".join(sorted({d.name.split(":")[0]
                                                               for d in c.devices})),
             c.description) for n, c in PRESETS.items()]
    _table("cluster presets", ["name", "devices", "link model", "device types",
                               "description"], rows)


def _cluster_text(c: Any) -> str:
    import numpy as np

    lines = [f"{c.name}: {c.n_devices} device{'s' * (c.n_devices != 1)}, link model "
             f"{c.link_model}, semantics {c.semantics}, {c.param_copies:g} copies of the "
             f"parameters"]
    lines += [f"  {d.name}: {_human(d.peak_flops, 'FLOP/s')}, {_human(d.mem_bw, 'B/s')}, "
              f"memory {_human(d.memory, 'B')}, gap {d.launch_us:.1f} us" for d in c.devices]
    off = ~np.eye(c.n_devices, dtype=bool)
    if off.any():
        bw, lat = np.asarray(c.bandwidth)[off] * 1e6, np.asarray(c.latency)[off]  # B/s

        def span(x: Any, fmt: Callable[[float], str]) -> str:
            lo, hi = fmt(float(x.min())), fmt(float(x.max()))
            return lo if lo == hi else f"{lo} to {hi}"

        links = (f"  links: {span(bw, lambda v: _human(v, 'B/s'))}, latency "
                 f"{span(lat, lambda v: f'{v:.1f} us')}, busy "
                 f"{c.busy_after_us:.1f} us after each transfer")
        varies = bw.min() != bw.max() or lat.min() != lat.max()
        lines.append(f"{links} (--json: every pair)" if varies else links)
    return "\n".join(lines)


def _print_sim(title: str, step_us: float, lb_us: float, eff: float, feasible: bool,
               peak: Any, cluster: Any, extra: Sequence[tuple[str, str]] = ()) -> None:
    rows = [("step time", f"{step_us / 1e3:.3f} ms"), ("lower bound", f"{lb_us / 1e3:.3f} ms"),
            ("efficiency", f"{eff:.3f}"), ("memory feasible", "yes" if feasible else "NO"),
            *extra]
    rows += [(f"peak memory {d.name}", f"{_human(float(p), 'B')} of {_human(d.memory, 'B')}")
             for d, p in zip(cluster.devices, peak, strict=True)]
    _table(title, ["", ""], rows)


def _floor_row(r: Any) -> tuple[str, str]:
    if not r.single_device_feasible:
        return ("vs one device", "one device does not fit")
    return ("vs one device", f"{r.speedup:.2f}x faster" if r.speedup >= 1
            else f"{1 / r.speedup:.2f}x slower")


def _print_fallback(r: Any) -> None:
    if r.fallback:
        print(f"note: {r.placer}'s placement ({r.placer_step_time_us / 1e3:.3f} ms) was "
              f"slower than one device or did not fit; using the single-device placement "
              f"({r.step_time_us / 1e3:.3f} ms)")


def _option_value(text: str) -> Any:
    """A ``--option`` value: true/false, an integer or a number, else the text itself."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _placer_options(pairs: Sequence[str] | None) -> dict[str, Any]:
    """``--option KEY=VALUE`` pairs as a dict of placer options."""
    options: dict[str, Any] = {}
    for pair in pairs or ():
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise TravorderError(f"--option takes KEY=VALUE (e.g. episodes=200), got {pair!r}")
        if key in options:
            raise TravorderError(f"--option {key} given twice")
        options[key] = _option_value(text.strip())
    return options


def cmd_place(args: argparse.Namespace) -> None:
    from travorder.placement.clusters import load_cluster
    from travorder.placement.placement_file import placement_doc

    _check_out(args.out, args.model, _cluster_file(args.cluster), json_of="a placement")
    options = _placer_options(args.option)
    if args.coarsen is not None and args.coarsen < 1:
        raise TravorderError(f"--coarsen takes a positive number of nodes, got {args.coarsen}")
    g = _load(args.model, args.dims, training=not args.forward_only, batch=args.batch,
              micro_batches=args.micro_batches)
    cluster = load_cluster(args.cluster)
    with _episode_progress(args.placer == "rl"):
        r, coarse_nodes = _place(args, g, cluster, options)
    doc = placement_doc(r, g, cluster)
    if args.out:
        _write_json(args.out, doc)
    if args.json:
        _print_json({k: v for k, v in doc.items() if k not in ("placement", "cluster")})
    else:
        how = "" if coarse_nodes is None else (
            f", coarsened to {coarse_nodes} nodes" if coarse_nodes < g.n_nodes else
            f", not coarsened ({g.n_nodes} nodes, at most {args.coarsen})")
        _print_sim(f"{args.placer} placement of {g.name} on {cluster.name}, order "
                   f"{args.order}{how}",
                   r.step_time_us, r.lower_bound_us, r.efficiency, r.feasible, r.peak_memory,
                   cluster, [("placer wall time", f"{r.wall_s:.3f} s"), _floor_row(r)])
        _print_fallback(r)
        if args.out:
            print(f"wrote {args.out}")


def _place(args: argparse.Namespace, g: Any, cluster: Any, options: dict[str, Any]
           ) -> tuple[Any, int | None]:
    """`cmd_place`'s placement of ``g``, and the node count of the coarse graph it placed
    (None: not coarsened)."""
    import time

    from travorder.placement.placers import evaluate_placement, place_graph

    if args.coarsen is None:
        return place_graph(g, cluster, placer=args.placer, order=args.order, seed=args.seed,
                           floor=True, **options), None
    from travorder.graph import coarsen  # place the coarse graph, expand the placement

    t0 = time.perf_counter()
    groups = coarsen(g, args.coarsen)
    coarse = place_graph(groups.graph, cluster, placer=args.placer, order=args.order,
                         seed=args.seed, **options)
    return evaluate_placement(g, cluster, groups.expand(coarse.placement),
                              placer=args.placer, order=args.order, seed=args.seed,
                              wall_s=time.perf_counter() - t0,
                              learning_curve=coarse.learning_curve,
                              floor=True), groups.graph.n_nodes


@contextlib.contextmanager
def _episode_progress(enabled: bool) -> Iterator[None]:
    """A progress bar on a terminal's stderr of the RL placer's episodes (shown from the
    first episode on, so an option refused before training prints nothing but its
    error)."""
    if not enabled:
        yield
        return
    from rich.console import Console

    console = Console(stderr=True)
    if not console.is_terminal:
        yield
        return
    from travorder.placement.rl.trainer import EPISODE_PROGRESS
    from travorder.study.runner import progress_bar

    bar = progress_bar(True, console=console, transient=True)
    task = None

    def report(done: int, total: int, best_us: float) -> None:
        nonlocal task
        if task is None:
            bar.start()
            task = bar.add_task("RL episodes", total=total, detail="")
        bar.update(task, completed=done, detail=f"best {best_us / 1e3:.3f} ms")

    token = EPISODE_PROGRESS.set(report)
    try:
        yield
    finally:
        EPISODE_PROGRESS.reset(token)
        bar.stop()


def cmd_simulate(args: argparse.Namespace) -> None:
    from travorder.placement.clusters import Cluster, load_cluster
    from travorder.placement.placement_file import load_placement
    from travorder.placement.simulator import Simulator

    _check_out(args.trace, args.model, args.placement, _cluster_file(args.cluster),
               json_of="a Chrome trace")
    _check_out(args.gantt, args.model, args.placement, _cluster_file(args.cluster))
    if args.trace and args.gantt and os.path.realpath(args.trace) == os.path.realpath(
            args.gantt):
        raise TravorderError(f"--trace and --gantt name the same file {args.gantt!r}")
    if args.gantt:
        from travorder.placement.timeline import GANTT_FORMATS

        if Path(args.gantt).suffix.lower().lstrip(".") not in GANTT_FORMATS:
            raise TravorderError(f"--gantt writes {', '.join(GANTT_FORMATS)}: give a file "
                                 f"name ending in one of them, not {args.gantt!r}")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise TravorderError("--gantt needs matplotlib: pip install "
                                 "'travorder[report]'") from None
    _, doc = load_placement(args.placement)
    step = doc["graph"]  # the training step the file was placed for, unless told
    # the file's batch, unless the user gives one, or dimensions other than the file's
    other_dims = args.dims is not None and step.get("dims") and args.dims != step["dims"]
    batch = step.get("batch") if args.batch is None and not other_dims else args.batch
    micro_batches = step.get("micro_batches", 1) if args.micro_batches is None \
        else args.micro_batches
    try:
        g = _load(args.model, step.get("dims") if args.dims is None else args.dims,
                  training=not args.forward_only and step.get("training", True), batch=batch,
                  micro_batches=micro_batches)
    except DimsError as exc:
        if args.dims is not None:
            raise
        raise DimsError(f"{exc}; the dimensions are those of placement file "
                        f"{args.placement!r}: a placement of another model?") from None
    except BatchError as exc:
        if args.batch is not None:
            raise
        raise BatchError(f"{exc}; the batch is that of placement file {args.placement!r}: "
                         f"a placement of another model?") from None
    if args.cluster is None and not isinstance(doc.get("cluster"), dict):
        says = "does not say its cluster" if doc.get("cluster") is None \
            else "has a 'cluster' entry that is not a cluster table"
        raise TravorderError(f"placement file {args.placement!r} {says}: give --cluster")
    if args.cluster is None:
        try:
            cluster = Cluster.from_dict(doc["cluster"])
        except TravorderError as exc:
            raise type(exc)(f"placement file {args.placement!r}: {exc}") from None
        if (names := [d.name for d in cluster.devices]) != doc["devices"]:
            raise TravorderError(f"placement file {args.placement!r} places on devices "
                                 f"{doc['devices']}, but its cluster {cluster.name!r} has "
                                 f"{names} (an edited file?); give --cluster to place its "
                                 f"device indices on a cluster")
    else:
        cluster = load_cluster(args.cluster)
    placement, _ = load_placement(args.placement, g, cluster)
    sim = Simulator(g, cluster)
    if args.trace or args.gantt:
        from travorder.placement.timeline import plot_gantt, write_trace

        tl = sim.timeline(placement)
        r = tl.result
        if args.trace:
            write_trace(tl, args.trace)
        if args.gantt:
            plot_gantt(tl, args.gantt)
    else:
        r = sim.run(placement)
    if args.json:
        _print_json({"step_time_us": r.step_time_us, "lower_bound_us": r.lower_bound_us,
                     "efficiency": r.efficiency, "feasible": r.feasible,
                     "busy_us": r.busy_us, "peak_memory": r.peak_memory,
                     "bytes_moved": r.bytes_moved})
        return
    _print_sim(f"{g.name} on {cluster.name}", r.step_time_us, r.lower_bound_us, r.efficiency,
               r.feasible, r.peak_memory, cluster,
               [("bytes moved", _human(r.bytes_moved, "B"))])
    for path in (args.trace, args.gantt):
        if path:
            print(f"wrote {path}")


def cmd_calibrate(args: argparse.Namespace) -> None:
    try:
        from travorder.placement.calibrate import calibrate_command
    except ImportError:
        raise TravorderError("calibrate needs torch: pip install 'travorder[torch]'") from None
    _check_out(args.out)
    calibrate_command(args.devices, args.out, quick=args.quick, link_model=args.link_model)


# --------------------------------------------------------------------------- study
def cmd_study_run(args: argparse.Namespace) -> int:
    from travorder.placement.placers import ORDER_FREE
    from travorder.study.runner import run_study
    from travorder.study.spec import load_spec

    _check_out(args.store, args.spec)
    spec = load_spec(args.spec)
    if spec.placer in ORDER_FREE and len(spec.orders) > 1:
        print(f"warning: placer {spec.placer!r} fixes its own visiting order: every order "
              f"gives it the same placement, so the study's {len(spec.orders)} orders will "
              f"all tie", file=sys.stderr)
    r = run_study(spec, args.store, jobs=args.jobs, backend=args.backend,
                  address=args.address, progress=not args.no_progress)
    print(f"study {r.name}: {r.total} job{'s' * (r.total != 1)}, {r.skipped} already done, "
          f"ran {r.ran} ({r.done} done, {r.failed} failed) in {r.wall_s:.1f} s; "
          f"{r.pending} pending")
    if r.interrupted:
        print("interrupted: finished jobs are kept; run again to resume", file=sys.stderr)
        return 130
    return 0


def cmd_study_status(args: argparse.Namespace) -> None:
    from travorder.study.store import ResultStore, format_status

    with ResultStore(args.store, create=False) as store:
        status = store.status()
    _print_json(status) if args.json else print(format_status(status))


def cmd_study_export(args: argparse.Namespace) -> None:
    from travorder.study.export import export_dataset

    _check_out(args.out, args.store)
    data = export_dataset(args.store, args.out, study=args.study)
    print(f"wrote {args.out}: {len(data)} rows")


def cmd_study_report(args: argparse.Namespace) -> None:
    from travorder.study.report import write_report

    _check_out_dir(args.out)
    evaluations = None
    if args.evaluate:
        from travorder.predictor.dataset import design_matrix
        from travorder.predictor.evaluate import evaluate
        from travorder.study.export import read_sources

        frame = read_sources(args.sources, args.study)
        evaluations = {}
        for placer, part in frame.groupby("placer"):
            print(f"evaluating the predictor on the {placer} rows ({len(part)}) ...",
                  file=sys.stderr, flush=True)
            evaluations[placer] = evaluate(
                design_matrix(part.reset_index(drop=True)),
                progress=lambda line: print(line, file=sys.stderr, flush=True))
    files = write_report(args.sources, args.out, study=args.study, evaluations=evaluations)
    print(f"wrote {len(files)} files to {args.out} (open {Path(args.out) / 'index.html'})")


# --------------------------------------------------------------------------- zoo
def cmd_zoo_list(args: argparse.Namespace) -> None:
    from travorder.datasets.corpus import read_manifest, select_entries

    entries = select_entries(read_manifest(args.corpus), families=args.family,
                             sources=args.source)
    if args.json:
        _print_json(entries)
        return
    rows = [(e["name"], e["family"], e["source"], e["nodes"], e["edges"],
             _human(e["flops"], "FLOP"),
             f"{e['original_nodes']} -> {e['nodes']}" if e.get("coarsened") else "")
            for e in entries]
    _table(f"corpus: {len(entries)} graphs", ["name", "family", "source", "nodes", "edges",
                                              "FLOPs", "coarsened"], rows)


def cmd_zoo_build(args: argparse.Namespace) -> None:
    # Writing into the installed package is a deliberate act: it needs its own flag.
    if (args.corpus is None) == (not args.into_bundled):
        raise TravorderError("zoo build writes to --corpus DIR, or with --into-bundled to "
                             "the installed package's corpus (one of the two)")
    from travorder.datasets.corpus import bundled_corpus_dir
    from travorder.datasets.zoo import build_zoo

    def progress(i: int, n: int, model: Any, outcome: Any) -> None:
        what = (f"{outcome.n_nodes} nodes" if hasattr(outcome, "n_nodes")
                else f"FAILED: {outcome.reason}")
        print(f"[{i}/{n}] {model.name}: {what}", flush=True)

    sizes = {k: v for k, v in [("batch_size", args.batch_size), ("seq_len", args.seq_len),
                               ("timeout_s", args.timeout)] if v is not None}
    graphs, failures = build_zoo(args.corpus or bundled_corpus_dir(), names=args.name,
                                 families=args.family, progress=progress, **sizes)
    print(f"built {len(graphs)} graphs; {len(failures)} models failed (listed in the "
          "corpus's zoo_failures.json)")


#: The bundled study datasets (`travorder.study.export.BUNDLED_DATASETS`), for --help.
_BUNDLED = "bundled:NAME (greedy, rl, greedy-perturbed or rl-perturbed)"


# --------------------------------------------------------------------------- predictor
def _print_evaluation(ev: Any, per_family: bool, methods: Sequence[str] | None = None) -> None:
    """The evaluation table, the breakdown per scenario and cluster and the families where
    ``methods`` (default: every learned method) are worst against the best fixed order."""
    rows = [(m, f"{r.top1:.3f}", f"{r.top2:.3f}", f"{100 * r.mean_regret:.2f}%",
             f"{100 * r.p90_regret:.2f}%", f"{100 * r.worst_family_excess:+.2f}%",
             "" if math.isnan(r.families_worse) else int(r.families_worse))
            for m, r in ev.table.iterrows()]
    _table(f"leave-family-out evaluation (best fixed order over all rows: {ev.best_fixed})",
           ["method", "top-1", "top-2", "mean regret", "p90 regret",
            "worst family vs best-fixed", "families worse beyond noise"], rows)
    if methods is None:
        methods = list(dict.fromkeys(ev.families.index.get_level_values("method")))
    shown = [*methods, "best-fixed", "best-fixed-per-scenario"]
    b = ev.breakdown["mean_regret"].unstack("method")
    _table("mean regret per scenario and cluster (best-fixed: chosen on the training folds)",
           ["scenario", "cluster", "rows", *shown,
            *(f"{m} / best-fixed" for m in methods)],
           [(s, c, int(ev.breakdown.loc[(s, c, "oracle"), "rows"]),
             *(f"{100 * r[m]:.2f}%" for m in shown),
             *(f"{r[m] / r['best-fixed']:.2f}" if r["best-fixed"] > 0 else "-"
               for m in methods))
            for (s, c), r in b.iterrows()])
    for m in methods:
        fam = ev.families.loc[m]
        worse = fam[fam["worse"]]
        _table(f"{m}: {len(worse)} of {len(fam)} families worse than best-fixed beyond noise "
               "(the worst five shown when none is)",
               ["family", "rows", m, "best-fixed", "excess", "noise"],
               [(f, int(r.rows), f"{100 * r.regret:.2f}%", f"{100 * r.best_fixed_regret:.2f}%",
                 f"{100 * r.excess:+.2f}", f"{100 * r.noise:.2f}")
                for f, r in (worse if len(worse) else fam.head(5)).iterrows()])
    if per_family:
        methods = [m for m in ev.per_family.index if not m.startswith("always-")]
        fam = ev.per_family.loc[[*methods, ev.best_fixed]].T
        _table("mean regret per held-out family", ["family", *fam.columns],
               [(f, *(f"{100 * v:.2f}%" for v in r)) for f, r in fam.iterrows()])


def _kinds(text: str) -> list[str]:
    from travorder.predictor.model import KINDS

    kinds = list(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise TravorderError(f"unknown predictor kind {bad[0] if bad else text!r} "
                             f"(expected {', '.join(KINDS)})")
    return kinds


def cmd_train(args: argparse.Namespace) -> None:
    from travorder.predictor.active import DEFAULT_PLACER, check_installable, install_as_default
    from travorder.predictor.train import train_predictor

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if args.force and not args.use_as_default:
        raise TravorderError("--force goes with --use-as-default (it installs a model that "
                             "does not beat the best fixed order)")
    if args.placer is not None:
        _check_placer(args.placer)
    _check_out_dir(args.out)
    if args.use_as_default:  # the data's placer is known only when it is read
        check_installable(args.placer or DEFAULT_PLACER)
    res = train_predictor(args.data, args.out, placer=args.placer, kinds=_kinds(args.kinds),
                          corpus_dir=args.corpus, progress=progress)
    # Installed before anything is printed: a reader gone (`| head`) stops the printing.
    installed = install_as_default(args.out) if args.use_as_default and (
        res.beats_fixed or args.force) else None
    _print_evaluation(res.evaluation, per_family=False, methods=[res.method])
    print(res.comparison)
    print(f"trained {res.method} on {len(res.frame)} rows; wrote {args.out}")
    if not res.beats_fixed:
        table, fixed = res.evaluation.table, "best-fixed"
        worse = (f"{res.method} does not beat the best fixed order on its own held-out "
                 "evaluation "
                 f"(mean regret {100 * table.loc[res.method, 'mean_regret']:.2f}% "
                 f"vs {100 * table.loc[fixed, 'mean_regret']:.2f}%)")
        if args.use_as_default and not args.force:
            raise TravorderError(f"not installed as the default model: {worse}; "
                                 "--force installs it anyway")
        print(f"warning: {worse}", file=sys.stderr)
    if installed:
        print(f"installed as the default model: {installed}")


def cmd_evaluate(args: argparse.Namespace) -> None:
    from travorder.predictor.train import evaluate_sources

    if args.placer is not None:
        _check_placer(args.placer)
    ev = evaluate_sources(args.data, args.test_data, placer=args.placer,
                          kinds=_kinds(args.kinds), structure=_blocks(args.structure),
                          folds=args.folds, placed=args.as_placed, corpus_dir=args.corpus,
                          progress=lambda line: print(line, file=sys.stderr, flush=True))
    if args.json:
        _print_json({**ev.summary(), "as_placed": args.as_placed,
                     "per_family": ev.per_family.to_dict()})
        return
    if args.as_placed:
        print("step times scored as placed: the single-device placement where it is faster "
              "or the order's does not fit memory")
    _print_evaluation(ev, per_family=True)


def _blocks(text: str) -> list[str]:
    from travorder.predictor.structure import check_blocks

    blocks = [b.strip() for b in text.split(",") if b.strip()]
    if text.strip() and not blocks:
        raise TravorderError(f"--structure takes feature block names separated by commas, "
                             f"got {text!r}")
    check_blocks(blocks)
    return blocks


def _check_placer(name: str) -> None:
    from travorder.placement.placers import get_placer

    get_placer(name)  # an unknown name is an error, not the fallback model


def cmd_model_reset(args: argparse.Namespace) -> None:
    from travorder.predictor.active import active_model_dir, reset_default
    from travorder.predictor.model import MANIFEST

    _check_placer(args.placer)
    removed = reset_default(args.placer)
    directory, why = active_model_dir(placer=args.placer)
    print(f"removed the user default model {removed}" if removed is not None
          else "no user default model was installed")
    print(f"recommend-order --placer {args.placer} now uses {directory} ({why})")
    if not (directory / MANIFEST).is_file():
        print(f"warning: {str(directory)!r} holds no model (no {MANIFEST}): recommend-order "
              f"will say so until TRAVORDER_MODEL names one", file=sys.stderr)


def cmd_model_show(args: argparse.Namespace) -> None:
    from travorder.predictor.active import load_predictor

    _check_placer(args.placer)
    _, manifest, where = load_predictor(args.predictor, args.placer)
    if args.json:
        _print_json({"model": where, "manifest": manifest})
        return
    print(f"active model: {where}")
    for key in ("kind", "placer", "orders", "clusters", "families", "n_rows",
                "feature_schema_version", "data_hash", "chosen_because", "travorder_version"):
        if key in manifest:
            value = manifest[key]
            print(f"  {key}: {', '.join(map(str, value)) if isinstance(value, list) else value}")


# --------------------------------------------------------------------------- parser
class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (exit code 2) and whose
    ``lazy_epilog`` (a function) is called only when the help is printed: the registries
    it lists import the placers, too slow for every start."""

    lazy_epilog: Callable[[], str] | None = None

    def format_help(self) -> str:
        if self.lazy_epilog is not None:
            self.epilog = self.lazy_epilog()
        return super().format_help()

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"error: {message} (see {self.prog} --help)\n")

    def parse_known_args(self, args: Any = None, namespace: Any = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        # A command's own parser refuses what it does not know, so the error points at
        # its help (argparse leaves that to the top parser).
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and self._subparsers is None:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        for action in self._actions:  # `--place ""` read as "not given" (or as ".")
            value = getattr(namespace, action.dest, None)
            if action.default != "" and (value == "" or (isinstance(value, list)
                                                         and "" in value)):
                self.error(f"argument {'/'.join(action.option_strings) or action.dest}: "
                           "an empty value (give one, or leave the argument out)")
        return namespace, extras


def _place_epilog() -> str:
    import textwrap

    from travorder.placement.orders import ORDERS, TOPOLOGICAL_ORDERS
    from travorder.placement.placers import PLACERS

    orders = [f"{o} (topological)" if o in TOPOLOGICAL_ORDERS else o for o in ORDERS]
    return "\n".join([
        *textwrap.wrap("placers: " + ", ".join(PLACERS), 78, subsequent_indent="  "),
        *textwrap.wrap("orders (docs/orders.md): " + ", ".join(orders), 78,
                       subsequent_indent="  "),
        "clusters: `travorder clusters` lists the presets"])


def _version_option(parser: argparse.ArgumentParser) -> None:
    from travorder import __version__

    parser.add_argument("--version", action="version", version=f"travorder {__version__}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="travorder",
        description="Study, simulate and recommend traversal orders for device placement.",
    )
    _version_option(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("info", help="summarise a model graph (ONNX, .json.gz, dnn-partitioning)")
    _model_args(p)
    p.add_argument("--features", action="store_true", help="also print the feature vector")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("convert", help="convert a model graph to travorder's .json.gz format")
    _model_args(p)
    p.add_argument("out", help="output .json.gz")
    p.add_argument("--training", action="store_true",
                   help="expand a forward graph into a training-step graph first")
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser("orders", help="print the traversal orders of a model graph")
    _model_args(p)
    p.add_argument("--order", help="print only this order, one node name per line")
    p.add_argument("--seed", type=int, default=0, help="seed for the random order")
    p.add_argument("--training", action="store_true",
                   help="expand a forward graph into a training-step graph first")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_orders)

    p = sub.add_parser("clusters", help="list cluster presets, or show one preset or file")
    p.add_argument("name", nargs="?", help="preset name or .toml/.json cluster file")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_clusters)

    graph_opts = argparse.ArgumentParser(add_help=False)
    graph_opts.add_argument("--forward-only", action="store_true",
                            help="place the graph as it is, without expanding a forward "
                                 "graph into a training-step graph")
    graph_opts.add_argument("--json", action="store_true", help="machine-readable output")
    place_opts = argparse.ArgumentParser(add_help=False)
    _step_options(place_opts)
    simulate_opts = argparse.ArgumentParser(add_help=False)  # default: the file's
    _step_options(simulate_opts, default_micro_batches=None)

    p = sub.add_parser("place", parents=[graph_opts, place_opts],
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       help="place a model graph on a cluster and simulate a training step")
    p.lazy_epilog = _place_epilog
    _model_args(p)
    p.add_argument("--placer", default="greedy",
                   help="placer, from the list below (default: greedy)")
    p.add_argument("--order", default="topo",
                   help="traversal order, from the list below (default: topo)")
    p.add_argument("--cluster", default="k80x3",
                   help="preset name (`travorder clusters` lists them) or .toml/.json "
                        "cluster file (default: k80x3)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed (a non-negative integer) of the random order and of the "
                        "placers that draw (random, rl) (default: 0)")
    p.add_argument("--option", "-O", action="append", metavar="KEY=VALUE",
                   help="a placer option, repeatable (rl: preset=paper, episodes=200, "
                        "encoder=sage, ...; greedy: colocate=false)")
    p.add_argument("--coarsen", type=int, metavar="N",
                   help="place the graph coarsened to at most N nodes, then expand the "
                        "placement to every op (step time of the full graph)")
    p.add_argument("-o", "--out", help="write the placement JSON here")
    p.set_defaults(func=cmd_place)

    p = sub.add_parser("simulate", parents=[graph_opts, simulate_opts],
                       help="simulate a training step of a model graph under a placement")
    _model_args(p)
    p.add_argument("placement", help="placement JSON written by `travorder place`")
    p.add_argument("--cluster", help="preset name or cluster file (default: the placement's)")
    p.add_argument("--trace", metavar="OUT.json",
                   help="write the simulated step as a Chrome trace (open in ui.perfetto.dev)")
    p.add_argument("--gantt", metavar="OUT.png",
                   help="draw the simulated step as a Gantt chart (.png, .svg or .pdf; "
                        "needs matplotlib)")
    p.set_defaults(func=cmd_simulate)

    data_opts = argparse.ArgumentParser(add_help=False)
    data_opts.add_argument("--data", nargs="+", default=["bundled:greedy"], metavar="SRC",
                           help="result stores (.sqlite), datasets (.parquet/.csv) or "
                                f"{_BUNDLED} (default: bundled:greedy)")
    data_opts.add_argument("--placer", help="learn from this placer's results")
    data_opts.add_argument("--kinds", default="classifier,regressor,ranker",
                           help="predictor kinds to compare (comma-separated)")
    data_opts.add_argument("--corpus", metavar="DIR",
                           help="the corpus the studies' graphs came from (`zoo build`), "
                                "for the feature blocks that need the graphs (default: "
                                "the bundled one)")

    p = sub.add_parser("train", parents=[data_opts],
                       help="train the order predictor on study results")
    p.add_argument("--out", required=True, help="directory for the model")
    p.add_argument("--use-as-default", action="store_true",
                   help="install the model so that recommend-order uses it (refused when "
                        "it does not beat the best fixed order, unless --force)")
    p.add_argument("--force", action="store_true",
                   help="with --use-as-default: install even a model that does not beat "
                        "the best fixed order")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("evaluate", parents=[data_opts],
                       help="leave-family-out evaluation of the predictor kinds")
    p.add_argument("--test-data", nargs="+", metavar="SRC",
                   help="score the held-out families' rows of these datasets (e.g. the "
                        "study under perturbed costs) instead of --data's; the models "
                        "still learn from --data")
    p.add_argument("--structure", default="", metavar="BLOCKS",
                   help="feature blocks beside the graph features, comma-separated: "
                        "order_stats, order_split, gnn (default: none)")
    p.add_argument("--folds", type=int, metavar="K",
                   help="hold out K groups of families in turn (default: one family at "
                        "a time)")
    p.add_argument("--as-placed", action="store_true",
                   help="score each order's step time as `travorder place` hands it back: "
                        "the single-device placement where that one is faster or the "
                        "order's does not fit memory (the models still learn from the "
                        "placer's own placements)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("model", help="the active order-prediction model")
    msub = p.add_subparsers(dest="model_command", required=True, metavar="COMMAND")
    placer_opt = argparse.ArgumentParser(add_help=False)
    placer_opt.add_argument("--placer", default="greedy",
                            help="the placer whose model (default: greedy)")
    q = msub.add_parser("show", parents=[placer_opt],
                        help="which model recommend-order uses, and its manifest")
    q.add_argument("--predictor", metavar="DIR", help="show this model directory instead")
    q.add_argument("--json", action="store_true", help="machine-readable output")
    q.set_defaults(func=cmd_model_show)
    q = msub.add_parser("reset", parents=[placer_opt], help="remove the model installed by "
                        "train --use-as-default: back to the bundled model")
    q.set_defaults(func=cmd_model_reset)

    p = sub.add_parser("calibrate", help="measure this machine's devices and links into a "
                                          "cluster file")
    p.add_argument("--devices", help="comma-separated torch devices, e.g. cuda:0,cuda:1 "
                                     "(default: every GPU, or the CPU without one)")
    p.add_argument("--out", required=True, help="cluster file to write (.toml or .json)")
    p.add_argument("--link-model", default="link", choices=["bus", "channel", "link"],
                   help="how transfers share links (default: link)")
    p.add_argument("--quick", action="store_true", help="small sizes: a fast, rough check")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("study", help="run and inspect placement studies")
    ssub = p.add_subparsers(dest="study_command", required=True, metavar="COMMAND")
    store_opt = argparse.ArgumentParser(add_help=False)
    store_opt.add_argument("--store", required=True, help="result store (SQLite file)")
    q = ssub.add_parser("run", parents=[store_opt], help="run the jobs of a study spec "
                                                         "that the store has not finished")
    q.add_argument("spec", help="study spec (TOML); see docs/study.md")
    q.add_argument("--jobs", type=int, default=1, help="parallel workers (default: 1)")
    q.add_argument("--backend", default="loky", choices=["loky", "ray"])
    q.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    q.add_argument("--no-progress", action="store_true", help="no progress bar")
    q.set_defaults(func=cmd_study_run)
    q = ssub.add_parser("status", parents=[store_opt], help="jobs done, failed and pending")
    q.add_argument("--json", action="store_true", help="machine-readable output")
    q.set_defaults(func=cmd_study_status)
    q = ssub.add_parser("export", parents=[store_opt],
                        help="write the dataset (one row per graph and cluster)")
    q.add_argument("--out", required=True, help="dataset file: .parquet, .csv or .csv.gz")
    q.add_argument("--study", help="only the latest run of this study (spec name)")
    q.set_defaults(func=cmd_study_export)
    q = ssub.add_parser("report", help="write an HTML report with figures")
    q.add_argument("sources", nargs="+", metavar="SRC",
                   help="result stores (.sqlite), exported datasets (.parquet/.csv) or "
                        f"{_BUNDLED}; timelines and learning curves come "
                        "from the stores")
    q.add_argument("--out", required=True, help="directory for index.html and the figures")
    q.add_argument("--study", help="of a store, only the latest run of this study (spec name)")
    q.add_argument("--evaluate", action="store_true",
                   help="include the predictor's leave-family-out evaluation (minutes)")
    q.set_defaults(func=cmd_study_report)

    p = sub.add_parser("zoo", help="the bundled model-graph corpus")
    zsub = p.add_subparsers(dest="zoo_command", required=True, metavar="COMMAND")
    corpus_opts = argparse.ArgumentParser(add_help=False)
    corpus_opts.add_argument("--family", nargs="+", help="only these families")
    q = zsub.add_parser("list", parents=[corpus_opts], help="print the corpus manifest")
    q.add_argument("--corpus", help="corpus directory (default: the bundled one)")
    q.add_argument("--source", nargs="+", help="only these sources (e.g. synthetic, timm)")
    q.add_argument("--json", action="store_true", help="machine-readable output")
    q.set_defaults(func=cmd_zoo_list)
    q = zsub.add_parser("build", parents=[corpus_opts],
                        help="export real architectures to the corpus (zoo environment, "
                             "docs/zoo.md)")
    q.add_argument("--corpus", help="corpus directory to write (or --into-bundled)")
    q.add_argument("--name", nargs="+", help="only these models")
    q.add_argument("--batch-size", type=int, help="export batch size (default 1)")
    q.add_argument("--seq-len", type=int, help="sequence length of text models (default 128)")
    q.add_argument("--timeout", type=float, help="seconds allowed per model (default 600)")
    q.add_argument("--into-bundled", action="store_true",
                   help="write into the installed package's corpus (instead of --corpus)")
    q.set_defaults(func=cmd_zoo_build)
    return parser


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread so that clean-ups run (temporary files and
    folders, the store's lock) as they do on Ctrl-C; not an `Exception`, which some
    reader might catch."""


#: The signals received while a command runs (`_run`), and when (`time.monotonic`).
_SIGNALLED: list[tuple[int, float]] = []
#: A second signal this soon after one whose stop is being handled is the same stop
#: (`timeout` signals the process and then its group: two SIGTERMs), not one that should
#: break the first one's clean-up.
_SAME_STOP_S = 1.0
_stopping = False  # the command returned: `_run` is putting the handlers back


def _on_signal(signum: int, frame: Any) -> None:
    """Ctrl-C's KeyboardInterrupt, or `_Terminated`, recorded first: raised while Python
    runs a weakref or garbage-collection callback, it is lost ("Exception ignored"), and
    `_run` raises it again when the command returns."""
    import signal

    now = time.monotonic()
    # A first signal lost in a callback is not being handled: the second one stops.
    again = isinstance(sys.exc_info()[1], KeyboardInterrupt | _Terminated) and bool(
        _SIGNALLED) and now - _SIGNALLED[-1][1] < _SAME_STOP_S
    _SIGNALLED.append((signum, now))
    if not (again or _stopping):
        raise KeyboardInterrupt if signum == signal.SIGINT else _Terminated


def _quiet_unraisable(hook: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``hook`` (`sys.unraisablehook`) without the traceback of an interrupt it lost."""
    def quiet(unraisable: Any) -> None:
        if not isinstance(unraisable.exc_value, KeyboardInterrupt | _Terminated):
            hook(unraisable)
    return quiet


#: The errors of a write to a full disk: without a file named, of the command's output
#: (the files travorder writes name themselves, `travorder.errors.write_file`).
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush of what could not
    be written does not fail again at exit (a stdout without a file, as a notebook's, is
    left as it is)."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _run(func: Callable[[argparse.Namespace], int | None], args: argparse.Namespace) -> int:
    import signal
    import threading

    code = None
    main_thread = threading.current_thread() is threading.main_thread()
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, _on_signal) for s in signals} if main_thread else {}
    hook, sys.unraisablehook = sys.unraisablehook, _quiet_unraisable(sys.unraisablehook)
    global _stopping
    _SIGNALLED.clear()
    _stopping = False
    try:
        code = func(args)
        sys.stdout.flush()  # a full disk under `> out.txt` shows here, not at exit
        if _SIGNALLED and not code:  # an interrupt a callback lost: the command was stopped
            raise KeyboardInterrupt if _SIGNALLED[-1][0] == signal.SIGINT else _Terminated
    except TravorderError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except _Terminated:
        print("terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly
        _drop_stdout()
    except OSError as exc:  # a file or folder that cannot be read or written
        if exc.filename is None and exc.errno in _FULL_ERRNOS:  # stdout on a full disk
            _drop_stdout()
            print(f"error: cannot write the output: {exc.strerror}", file=sys.stderr)
            return EXIT_USAGE
        if exc.filename is None:  # not a file's: a bug, with its traceback
            raise
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        _stopping = True  # a signal now, as the handlers are put back, is only recorded
        sys.unraisablehook = hook
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
    return code or 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``travorder``."""
    args = build_parser().parse_args(argv)
    return _run(args.func, args)


def cmd_recommend(args: argparse.Namespace) -> None:
    from travorder.api import placed_graph, recommend_order
    from travorder.placement.clusters import load_cluster
    from travorder.predictor.active import active_model_dir
    from travorder.predictor.model import MANIFEST, model_files

    if args.place:  # not the model's own files (read only then: start-up time)
        manifest = active_model_dir(args.predictor, args.placer)[0] / MANIFEST
        _check_out(args.place, args.model, _cluster_file(args.cluster), str(manifest),
                   *(str(manifest.parent / f) for f in model_files(manifest)),
                   json_of="a placement")
    if args.top is not None and not args.explain:
        raise TravorderError("--top sets how many features --explain shows: give --explain")
    if args.top is not None and args.top < 1:
        raise TravorderError(f"--top takes a number of features >= 1, got {args.top}")
    g = _load(args.model, args.dims)
    cluster = load_cluster(args.cluster)
    rec = recommend_order(g, cluster, predictor=args.predictor, explain=args.explain,
                          verify=args.verify, budget=args.budget, placer=args.placer,
                          seed=args.seed, batch=args.batch, micro_batches=args.micro_batches)
    placed = None
    if args.place:
        from travorder.placement.placement_file import placement_doc
        from travorder.placement.placers import place_graph, with_floor

        graph = placed_graph(g, True, args.batch, args.micro_batches)
        # A checked placement is written as it was measured (or one device, if faster).
        placed = (with_floor(rec.placement, graph, cluster) if rec.placement else
                  place_graph(graph, cluster, placer=args.placer, order=rec.order,
                              seed=args.seed, floor=True))
        _write_json(args.place, placement_doc(placed, graph, cluster))
    if args.json:
        doc = rec.to_dict()
        if args.top is not None:  # all of them by default: a program takes what it needs
            doc["contributions"] = dict(list(doc["contributions"].items())[:args.top])
        if placed is not None:
            doc["placement"] = {"file": args.place, "placer": args.placer,
                                "step_time_us": placed.step_time_us,
                                "efficiency": placed.efficiency, "feasible": placed.feasible,
                                "single_device_us": placed.single_device_us,
                                "fallback": placed.fallback}
        _print_json(doc)
        return
    forward = int((~g.is_backward).sum())
    print(f"{rec.graph} ({forward} forward ops, placed as a {rec.n_nodes}-node training "
          f"step) on {rec.cluster}")
    checked = rec.verified is not None
    if cluster.n_devices == 1 and not checked:
        print(f"recommended order: any: every order places everything on the one device "
              f"(first: {rec.order})")
    elif len(rec.tied) > 1:
        what = "measured" if checked else "predicted"
        why = "the fastest" if checked else "the safest: lowest mean regret in training"
        print(f"recommended order: any of {', '.join(rec.tied)}: {what} within "
              f"{100 * rec.tie_margin:.1f}% of each other (first: {rec.order}, {why})")
    else:
        print(f"recommended order: {rec.order}")
    if checked:
        from travorder.placement.orders import ORDERS

        known = len(rec.expected_regret)
        how = "exact: every order was checked" if rec.exact else \
            f"fastest of {len(rec.verified)} of {len(ORDERS)} orders checked" + (
                "" if known == len(ORDERS) else f" (the model knows {known}; "
                + ("the others are checked after them" if args.budget is not None else
                   "--budget checks the others too") + ")")
        sequence = {o: i for i, group in enumerate(rec.same_sequence) for o in group}
        placements = len({sequence.get(o, o) for o in rec.verified})
        print(f"  {how} by placement with {args.placer} in {rec.check_s:.2f} s" + (
            "" if placements == len(rec.verified) else
            f" ({placements} placement{'s' * (placements > 1)}: orders of one node "
            f"sequence share one)"))
        print("  checked: " + ", ".join(
            f"{o} {t / 1e3:.3f} ms" + (" (over memory)" if o in rec.over_memory else "")
            for o, t in rec.verified.items()))
        if rec.floored:  # what --place writes for them, and what they are compared by
            print(_floored_line(rec))
        if rec.confidence == "low":
            print(f"  confidence low: one placement checked (probability of being the best "
                  f"{rec.probability:.2f}); a larger --budget compares orders by placement")
    elif cluster.n_devices > 1:
        print(f"  expected regret {100 * rec.expected_regret[rec.order]:.1f}%, probability "
              f"of being the best {rec.probability:.2f}, confidence {rec.confidence}")
        if rec.confidence == "low" and len(rec.tied) < len(rec.expected_regret):
            print("  to be sure: --budget 2 checks the orders by placement and keeps the "
                  "fastest")
    if rec.same_sequence:
        print("  one node sequence, one placement: " + "; ".join(
            " = ".join(group) for group in rec.same_sequence))
    regret = f"{100 * rec.runner_up_regret:.1f}%"
    how = f"measured regret {regret}" if checked and rec.runner_up in rec.verified \
        else f"expected regret {regret}" + (", not checked" if checked else "")
    if rec.runner_up is None:
        print(f"runner-up:         none: all {len(rec.tied)} orders are tied")
    elif rec.runner_up_regret == math.inf:
        print(f"runner-up:         {rec.runner_up}  (its placement does not fit in memory)")
    else:
        print(f"runner-up:         {rec.runner_up}  ({how})")
    for line in rec.warnings[:3]:
        print(f"warning: {line}")
    if len(rec.warnings) > 3:
        print(f"warning: and {len(rec.warnings) - 3} more features outside the training range")
    if args.explain and rec.contributions is None:
        print(f"features that drove it: none: the model does not know {rec.order}")
    elif rec.contributions is not None:
        print("features that drove it (contribution to the score):")
        for name, value in list(rec.contributions.items())[:args.top or _TOP]:
            print(f"  {name:<36} {value:+.3f}")
    if placed is not None:
        print(f"placed with {args.placer}: step time {placed.step_time_us / 1e3:.3f} ms, "
              f"efficiency {placed.efficiency:.3f}, "
              f"{'feasible' if placed.feasible else 'OVER MEMORY'}; "
              f"{_floor_row(placed)[1]}; wrote {args.place}")
        _print_fallback(placed)
    print(f"model: {rec.model}")


def _floored_line(rec: Any) -> str:
    """The line of `cmd_recommend` naming the checked orders whose placement one device
    beats (``rec.floored``), which --place writes one device for."""
    floored, rest = rec.floored, [o for o in rec.verified if o not in rec.floored]
    one = len(floored) == 1
    if one:
        who = f"{floored[0]}'s placement"
    elif not rest:
        who = "every checked order's placement"
    elif len(floored) > len(rest):
        who = f"the placements of every checked order but {', '.join(rest)}"
    else:
        who = f"the placements of {', '.join(floored)}"
    if set(floored) & set(rec.over_memory):
        who += f" (or fits where {'it does' if one else 'they do'} not)"
    # The pick floored: every order is (the fastest is); else --place writes the pick's.
    if rec.order in floored:
        how = "--place writes it instead" if one else \
            "--place writes it for them, and they are compared at it"
    else:
        how = "--place would write it for that order, and it is compared at it" if one \
            else "--place would write it for them, were one chosen, and they are compared at it"
    return f"  one device ({rec.single_device_us / 1e3:.3f} ms) is faster than {who}: {how}"


def _model_args(parser: argparse.ArgumentParser, help: str = "model file") -> None:
    """The model file, and ``--dim`` to bind its symbolic ONNX input dimensions."""
    parser.add_argument("model", help=help)
    parser.add_argument("--dim", action=_DimAction, metavar="NAME=N", dest="dims",
                        help="give the ONNX model's symbolic input dimension NAME the value "
                             "N, repeatable (e.g. --dim batch=32)")


class _DimAction(argparse.Action):
    """Collects ``--dim NAME=N`` into a dict, refusing a malformed or repeated one."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        name, eq, value = str(values).partition("=")
        name = name.strip()
        if not (eq and name and value.strip().isdecimal() and int(value) >= 1):
            parser.error(f"argument --dim: expected NAME=N with N an integer >= 1, "
                         f"got {values!r}")
        dims = dict(getattr(namespace, self.dest) or {})
        if name in dims:
            parser.error(f"argument --dim: {name} given twice")
        dims[name] = int(value)
        setattr(namespace, self.dest, dims)


def _step_options(parser: argparse.ArgumentParser, default_micro_batches: int | None = 1
                  ) -> None:
    """``--batch`` and ``--micro-batches``: the training step a placement is for."""
    recorded = default_micro_batches is None  # simulate: what the placement file says
    parser.add_argument("--batch", type=int, metavar="B",
                        help="the training batch (default: " + (
                            "the placement file's" if recorded else
                            "the batch the model was exported at, or --dim binds") + ")")
    parser.add_argument("--micro-batches", type=int, default=default_micro_batches,
                        metavar="M",
                        help="the training step pipelined over M micro-batches (default: "
                             + ("the placement file's" if recorded else "1") + ")")


#: Features ``recommend-order --explain`` shows by default.
_TOP = 8


def recommend_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="recommend-order",
        description="Recommend the traversal order a sequential device placer should use "
                    "for MODEL on a cluster.",
    )
    _version_option(parser)
    _model_args(parser, "ONNX, travorder .json.gz or dnn-partitioning JSON")
    parser.add_argument("--cluster", default="k80x3",
                        help="cluster preset or .toml/.json file (default: k80x3)")
    _step_options(parser)
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--explain", action="store_true",
                        help="show the features that drove the recommendation")
    parser.add_argument("--top", type=int,
                        help=f"features shown by --explain (default: {_TOP}; with --json: "
                             f"all)")
    parser.add_argument("--place", metavar="OUT.json",
                        help="also place the model with the recommended order; write JSON "
                             "(with --budget or --verify: the checked placement)")
    check = parser.add_mutually_exclusive_group()
    check.add_argument("--budget", type=float, metavar="SECONDS",
                       help="check the predictor's best-ranked orders by placement (its "
                            "pick, then for up to SECONDS more the best fixed order, then "
                            "the others) and recommend the fastest; exact when every "
                            "order fits")
    check.add_argument("--verify", type=int, default=0, metavar="K",
                       help="place the model in the simulator with a shortlist of K "
                            "orders (the predictor's pick, the best fixed order, then the "
                            "highest-ranked) and recommend the fastest (default 0: no "
                            "check)")
    parser.add_argument("--placer", default="greedy",
                        help="the placer the order is for: its predictor recommends, and "
                             "it places for --place, --budget and --verify (default: "
                             "greedy; rl for the RL placer)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed for --place, --budget and --verify")
    parser.add_argument("--predictor", metavar="DIR",
                        help="predictor directory (default: the active model)")
    return parser


def recommend_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``recommend-order``."""
    args = recommend_parser().parse_args(argv)
    return _run(cmd_recommend, args)


if __name__ == "__main__":
    sys.exit(main())
