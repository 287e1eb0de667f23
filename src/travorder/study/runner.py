"""Run a study: the jobs of a spec that the store has not finished, on joblib or Ray.

`run_study` selects the spec's graphs, lists its jobs (`spec_jobs`), skips the ones the
store holds as done, prepares the graphs that still have jobs in each of their scenarios
(`Scenario.prepare` and `Scenario.cluster_for`; graph and scenario features into the
store), and runs the rest. Before it opens the store it checks the placer's options once
per cluster on a three-node graph, and each scenario's micro-batches against each graph's
batch, so a bad option or scenario is one error, not a failed study, and leaves no store
and no pending run behind. The backends:

- ``backend="loky"``: joblib's loky process pool with ``jobs`` workers
  (``Parallel(return_as="generator_unordered")``); with ``jobs=1`` the jobs run in this
  process. Workers exit within a second or two when the runner dies, even by SIGKILL (they
  watch their parent process), and loky's resource tracker follows them.
- ``backend="ray"``: one Ray task per job (1 CPU each) on the cluster at ``address``
  (``"auto"``: the one this machine belongs to), or on a local Ray with ``jobs`` CPUs
  started for the run and shut down after it.

Jobs go to the workers in chunks, one per prepared graph and cluster (the graph travels
once for all its orders and seeds), largest graphs first; results stream back as chunks
finish, and each job's row is written to the store in its own transaction by this
process only. A job that raises is stored as failed
with its traceback and the study goes on; failed jobs run again on the next run.
Ctrl-C (KeyboardInterrupt) stops dispatching, cancels what is running and returns; what
finished is kept.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from travorder.errors import TravorderError
from travorder.graph import OpGraph
from travorder.placement import Cluster, place_graph
from travorder.study.jobs import Job, cluster_hash, run_jobs_safely, spec_jobs
from travorder.study.scenarios import Scenario, features_of, scenario_definitions
from travorder.study.spec import StudySpec, load_spec
from travorder.study.store import ResultStore

BACKENDS = ("loky", "ray")

_PREFLIGHT = OpGraph(["a", "b", "c"], [0, 1], [1, 2], flops=[1e6, 1e6, 1e6],
                     output_bytes=[1e3, 1e3, 1e3], meta={"name": "3-op check"})


@dataclass(frozen=True)
class StudySummary:
    """What `run_study` did: the spec's ``total`` jobs, ``skipped`` (already done),
    ``ran`` (finished in this run), of which ``done`` and ``failed``, whether it was
    ``interrupted``, and its ``wall_s``."""

    name: str
    spec_hash: str
    total: int
    skipped: int
    ran: int
    done: int
    failed: int
    interrupted: bool
    wall_s: float

    @property
    def pending(self) -> int:
        """Jobs of the spec neither done nor failed (as `travorder study status` counts
        them; failed ones run again on the next run too)."""
        return self.total - self.skipped - self.ran


def _preflight(spec: StudySpec, graphs: list[OpGraph]) -> None:
    for cluster in spec.clusters:
        try:
            place_graph(_PREFLIGHT, cluster, spec.placer, spec.orders[0], 0, **spec.placer_options)
        except TravorderError as exc:
            raise TravorderError(f"{spec.source}: placer {spec.placer!r} on cluster "
                                 f"{cluster.name!r}: {exc}") from None
    for scenario in spec.scenarios:
        for graph in graphs:
            try:
                scenario.check_batch(graph)
            except TravorderError as exc:
                raise TravorderError(f"{spec.source}: scenario {scenario.name!r} on graph "
                                     f"{graph.name!r}: {exc}") from None


Graphs = dict[tuple[str, str], OpGraph]
Clusters = dict[tuple[str, str, str], Cluster]


def _prepare_one(spec: StudySpec, graph: OpGraph, scenario: Scenario
                 ) -> tuple[OpGraph, dict[str, float], list[tuple[Cluster, dict[str, float]]]]:
    from travorder.featurize import graph_features

    prepared = spec.prepare(graph, scenario)
    clusters = [scenario.cluster_for(prepared, c) for c in spec.clusters]
    pairs = [(c, features_of(prepared, c)) for c in clusters]  # costs past a float: refused
    return prepared, graph_features(prepared), pairs


def _prepare(spec: StudySpec, graphs: list[OpGraph], store: ResultStore,
             wanted: set[tuple[str, str]], n_workers: int, progress: bool
             ) -> tuple[Graphs, Clusters]:
    """Prepare the (graph name, scenario name) pairs in ``wanted``, on ``n_workers``
    processes, and describe them in the store: graph and scenario features, and the
    clusters as the scenario set them."""
    from joblib import delayed

    from travorder.featurize import FEATURE_SCHEMA_VERSION

    by_name = {g.name: g for g in graphs}
    scenarios = {s.name: s for s in spec.scenarios}
    todo = sorted(wanted)
    prepared_graphs: Graphs = {}
    clusters: Clusters = {}
    with _loky(n_workers, len(todo), "generator") as parallel, \
            progress_bar(progress and bool(todo)) as bar:
        results = parallel(delayed(_prepare_one)(spec, by_name[g], scenarios[s])
                           for g, s in todo)
        task = bar.add_task("preparing graphs", total=len(todo), detail="")
        for (name, sname), (prepared, feats, pairs) in zip(todo, results, strict=True):
            store.add_graph(by_name[name], sname, prepared, spec.training,
                            spec.coarsen_max_nodes, feats, FEATURE_SCHEMA_VERSION)
            for cluster, pair_feats in pairs:
                store.add_pair(prepared.graph_hash, cluster, pair_feats)
                clusters[name, sname, cluster.name] = cluster
            prepared_graphs[name, sname] = prepared
            bar.update(task, advance=1)
    return prepared_graphs, clusters


def _inputs(job: Job, graphs: Graphs, clusters: Clusters) -> tuple[OpGraph, Cluster]:
    return (graphs[job.graph_name, job.scenario],
            clusters[job.graph_name, job.scenario, job.cluster])


def _chunks(jobs: list[Job]) -> list[list[Job]]:
    """The jobs grouped by prepared graph and cluster, in the order of their first job."""
    groups: dict[tuple[str, str, str], list[Job]] = {}
    for job in jobs:
        groups.setdefault((job.graph_name, job.scenario, job.cluster), []).append(job)
    return list(groups.values())


def _exit_with_parent(parent: int, interval_s: float = 0.5) -> None:
    """Run at the start of each loky worker: end the worker when its parent ``parent``
    (the runner) is gone.

    A runner killed with SIGKILL cannot shut its loky pool down; its workers would run on,
    reparented, for ever (and loky's resource tracker with them, since they hold its
    pipe). A daemon thread checks the parent every ``interval_s`` and exits when it
    changes.
    """

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        os._exit(1)

    threading.Thread(target=watch, name="travorder-parent-watch", daemon=True).start()


@contextlib.contextmanager
def _loky(n_workers: int, n_tasks: int, return_as: str) -> Iterator[Any]:
    """A joblib loky pool whose workers end with this process (`_exit_with_parent`), of
    no more workers than tasks (``--jobs 100000`` once started them all)."""
    from joblib import Parallel, parallel_config

    with parallel_config(backend="loky", initializer=_exit_with_parent,
                         initargs=(os.getpid(),)):
        yield Parallel(n_jobs=min(n_workers, max(n_tasks, 1)), return_as=return_as)


def _shutdown_loky() -> None:
    """End the loky workers now, while the command still turns Ctrl-C and SIGTERM into a
    clean stop, rather than when the interpreter exits (a second or two later)."""
    from joblib.externals.loky import reusable_executor

    # loky keeps its reusable pool in a module global (a private one: if a joblib release
    # renames it, the workers end at exit instead, as before)
    if (pool := getattr(reusable_executor, "_executor", None)) is not None:
        pool.shutdown(wait=True)


def _run_loky(jobs: list[Job], graphs: Graphs, clusters: Clusters, n_workers: int
              ) -> Iterator[list[tuple[Job, dict[str, Any]]]]:
    from joblib import delayed

    chunks = _chunks(jobs)
    with _loky(n_workers, len(chunks), "generator_unordered") as parallel:
        yield from parallel(delayed(run_jobs_safely)(chunk, *_inputs(chunk[0], graphs,
                                                                     clusters))
                            for chunk in chunks)


def _start_ray(n_workers: int, address: str | None) -> bool:
    """Start Ray or connect to it at ``address``; whether this call started it."""
    try:
        import ray
    except ImportError:
        raise TravorderError("the ray backend needs Ray: pip install 'travorder[ray]'"
                             ) from None
    if ray.is_initialized():
        return False
    host, _, port = address.removeprefix("ray://").rpartition(":") if address else ("", "", "")
    host = host.removeprefix("[").removesuffix("]")  # an IPv6 address: [::1]:6379
    if host and port.isdigit():  # Ray itself waits minutes for an address that never answers
        try:
            socket.create_connection((host, int(port)), timeout=10).close()
        except OSError as exc:
            raise TravorderError(f"cannot connect to Ray at {address!r}: "
                                 f"{exc.strerror or exc}") from None
    try:
        if address is None:
            ray.init(num_cpus=n_workers, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
    except ConnectionError as exc:
        raise TravorderError(f"cannot connect to Ray at {address!r}: {exc}") from None
    return True


@contextlib.contextmanager
def _sole_writer(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on the store's file while a run writes it, so that a second
    `run_study` on the same store is refused instead of running every job again (the
    readers, `status` and `export`, take no lock). Released whenever the process ends."""
    try:
        import fcntl
    except ImportError:  # not on POSIX: no lock
        yield
        return
    with path.open("rb") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise TravorderError(f"another study run is writing {str(path)!r}: wait for it "
                                 f"to finish, or stop it (finished jobs are kept)") from None
        yield


def _all_done(store_path: str | os.PathLike[str], jobs: list[Job]) -> bool:
    """Whether the store at ``store_path`` exists and has every one of ``jobs`` done."""
    path = Path(store_path)
    if not path.is_file() or path.stat().st_size == 0:
        return False
    with ResultStore(path, create=False) as store:
        return not {j.job_id for j in jobs} - store.done_ids()


def _run_ray(jobs: list[Job], graphs: Graphs, clusters: Clusters
             ) -> Iterator[list[tuple[Job, dict[str, Any]]]]:
    """Run ``jobs`` on Ray, started by `_start_ray`."""
    if not jobs:  # every job done already: Ray was not started
        return
    import ray

    pending: list[Any] = []
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(run_jobs_safely)
        graph_refs = {key: ray.put(g) for key, g in graphs.items()}
        cluster_refs = {key: ray.put(c) for key, c in clusters.items()}
        pending = [task.remote(chunk, graph_refs[chunk[0].graph_name, chunk[0].scenario],
                               cluster_refs[chunk[0].graph_name, chunk[0].scenario,
                                            chunk[0].cluster])
                   for chunk in _chunks(jobs)]
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            yield ray.get(ready[0])
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)


def progress_bar(enabled: bool, **options: Any) -> Any:
    """A rich progress bar on stderr: the task's description, a bar, done of total, the
    task's ``detail`` field, the time elapsed and left (``options`` go to
    `rich.progress.Progress`; disabled unless ``enabled``)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"), TimeElapsedColumn(),
        TextColumn("left"), TimeRemainingColumn(), disable=not enabled,
        **{"console": Console(stderr=True), **options},
    )


def _check_scenario_names(spec: StudySpec, stored: dict[str, Scenario],
                          store_path: str | os.PathLike[str]) -> None:
    """Refuse a scenario whose name the store already gives to another definition: the
    store keys a graph's features by scenario name, so the earlier rows would take the
    new definition's features."""
    for scenario in spec.scenarios:
        before = stored.get(scenario.name)
        if before is None or before == scenario:
            continue
        raise TravorderError(f"scenario {scenario.name!r} is defined otherwise in store "
                             f"{str(store_path)!r} ({scenario.changes_from(before)}): give "
                             f"it another name, or use another store")


def run_study(spec: StudySpec | str | os.PathLike[str], store_path: str | os.PathLike[str],
              jobs: int = 1, backend: str = "loky", address: str | None = None,
              progress: bool = True) -> StudySummary:
    """Run the jobs of ``spec`` (a `StudySpec` or a spec file) that ``store_path`` has
    not finished, with ``jobs`` workers on ``backend`` (see the module docstring).

    Raises TravorderError for a bad spec, backend or placer option before any job runs.
    """
    start = time.perf_counter()
    if backend not in BACKENDS:
        raise TravorderError(f"unknown backend {backend!r} (expected {', '.join(BACKENDS)})")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise TravorderError(f"jobs must be a positive integer, got {jobs!r}")
    if not isinstance(spec, StudySpec):
        spec = load_spec(Path(spec))
    if address is not None and backend != "ray":
        raise TravorderError("an address is for the ray backend (--backend ray)")
    graphs = spec.select_graphs()
    all_jobs = spec_jobs(spec, graphs)
    _preflight(spec, graphs)  # before the store is touched: a bad spec leaves nothing behind
    with contextlib.ExitStack() as cleanup:
        if backend == "loky":
            cleanup.callback(_shutdown_loky)
        # No Ray: no store either; and no Ray started when every job is done already.
        if backend == "ray" and not _all_done(store_path, all_jobs) and _start_ray(
                jobs, address):
            cleanup.callback(sys.modules["ray"].shutdown)
        store = cleanup.enter_context(ResultStore(store_path))
        cleanup.enter_context(_sole_writer(store.path))
        _check_scenario_names(
            spec, scenario_definitions(store.connection, str(store_path)), store_path)
        done_before = store.done_ids()
        todo = [j for j in all_jobs if j.job_id not in done_before]
        known = store.graph_keys()
        wanted = {(j.graph_name, j.scenario) for j in todo}
        wanted |= {(g.name, s.name) for g in graphs for s in spec.scenarios
                   if (g.graph_hash, g.name, s.name, int(spec.training),
                       spec.coarsen_max_nodes) not in known}
        try:
            prepared, clusters = _prepare(spec, graphs, store, wanted, jobs, progress)
        except TravorderError:  # a graph that cannot be prepared (costs past a float)
            if store.created and not store.status()["studies"]:  # nothing ran
                store.discard()  # under the lock still: no run has it open
            raise
        # Recorded once every graph is prepared: a failure leaves no pending run.
        store.add_study(spec.name, spec.to_dict(), spec.spec_hash, all_jobs,
                        spec.clusters)
        # The store keeps the cluster each job ran on (as its scenario set it).
        todo = [dataclasses.replace(j, cluster_hash=cluster_hash(_inputs(
            j, prepared, clusters)[1])) for j in todo]
        # Largest graphs first, so that the last jobs to finish are short ones.
        todo.sort(key=lambda j: -prepared[j.graph_name, j.scenario].n_nodes)
        skipped = len(all_jobs) - len(todo)
        done = failed = 0
        interrupted = False
        with progress_bar(progress) as bar:
            task = bar.add_task(spec.name, total=len(all_jobs), completed=skipped,
                                detail="failed 0")
            t0 = time.perf_counter()
            results = (_run_loky(todo, prepared, clusters, jobs) if backend == "loky"
                       else _run_ray(todo, prepared, clusters))
            try:
                for chunk in results:
                    for job, outcome in chunk:
                        store.record(job, outcome)
                        if outcome["status"] == "done":
                            done += 1
                        else:
                            failed += 1
                    rate = (done + failed) / max(time.perf_counter() - t0, 1e-9)
                    bar.update(task, advance=len(chunk),
                               detail=f"failed {failed}, {rate:.2f} jobs/s")
            except KeyboardInterrupt:
                interrupted = True
            finally:
                results.close()
    return StudySummary(spec.name, spec.spec_hash, len(all_jobs), skipped, done + failed,
                        done, failed, interrupted, time.perf_counter() - start)
