"""Study jobs: one placement run, identified by its key, and `run_job` that runs it.

A job's key is ``(graph_hash, graph_name, scenario, cluster, order, placer, config_hash,
seed)``: ``graph_hash`` is the hash of the graph *as selected* (before the scenario
prepares it), ``scenario`` the scenario's name, ``config_hash`` covers everything else the
outcome depends on (the placer and its options, the cluster's definition, the scenario's
definition, the graph preparation, and `JOB_VERSION`). The outcome
is a pure function of the key: `run_job` on any machine, in any process, gives the same
outcome apart from its timings and library versions.

>>> from travorder.datasets.synthetic import chain
>>> from travorder.placement import load_cluster
>>> from travorder.graph import prepare_graph
>>> g, c = chain(0, n_layers=4), load_cluster("k80x3")
>>> job = make_job(g, c, "topo", "greedy", {}, seed=0, training=True)
>>> out = run_job(job, prepare_graph(g, True), c)
>>> out["status"], len(out["placement"]) == 2 * g.n_nodes, out["single_device_feasible"]
('done', True, True)
"""

from __future__ import annotations

import hashlib
import json
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from travorder.graph import OpGraph
from travorder.placement import Cluster, place_graph, traversal_order
from travorder.study.scenarios import DEFAULT_SCENARIO, Scenario
from travorder.study.spec import StudySpec
from travorder.versions import library_versions

#: Bump when `run_job` changes what it computes: old results then no longer count as done.
JOB_VERSION = 2

#: The columns of a job's key, in order.
KEY_FIELDS = ("graph_hash", "graph_name", "scenario", "cluster", "order", "placer",
              "config_hash", "seed")


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def cluster_hash(cluster: Cluster) -> str:
    """SHA-256 (hex) of a cluster's definition (its description aside)."""
    definition = cluster.to_dict()
    definition.pop("description")
    return _digest(definition)


def config_hash(placer: str, options: Mapping[str, Any], cluster: Cluster, training: bool,
                coarsen_max_nodes: int, scenario: Scenario = DEFAULT_SCENARIO) -> str:
    """SHA-256 (hex) of what a job's outcome depends on besides graph, order and seed."""
    return _digest({"placer": placer, "options": dict(options),
                    "cluster": cluster_hash(cluster),
                    "training": training, "coarsen_max_nodes": coarsen_max_nodes,
                    "scenario": scenario.to_dict(), "job_version": JOB_VERSION})


@dataclass(frozen=True)
class Job:
    """One placement run: the key fields, then the settings the key's ``config_hash``
    stands for (carried along so a worker can run the job)."""

    graph_hash: str
    graph_name: str
    scenario: str
    cluster: str
    order: str
    placer: str
    config_hash: str
    seed: int
    options: Mapping[str, Any] = field(default_factory=dict, compare=False)
    training: bool = field(default=True, compare=False)
    coarsen_max_nodes: int = field(default=0, compare=False)
    cluster_hash: str = field(default="", compare=False)
    scenario_def: Scenario = field(default=DEFAULT_SCENARIO, compare=False)

    @property
    def key(self) -> tuple[str, str, str, str, str, str, str, int]:
        """The key, in `KEY_FIELDS` order."""
        return tuple(getattr(self, f) for f in KEY_FIELDS)  # type: ignore[return-value]

    @property
    def job_id(self) -> str:
        """A short stable id of the key (32 hex digits of its SHA-256)."""
        return _digest(list(self.key))[:32]


def make_job(graph: OpGraph, cluster: Cluster, order: str, placer: str,
             options: Mapping[str, Any], seed: int, training: bool = True,
             coarsen_max_nodes: int = 0, scenario: Scenario = DEFAULT_SCENARIO) -> Job:
    """The job that places the selected (forward) ``graph``, prepared by ``scenario``."""
    return Job(graph.graph_hash, graph.name, scenario.name, cluster.name, order, placer,
               config_hash(placer, options, cluster, training, coarsen_max_nodes, scenario),
               seed, dict(options), training, coarsen_max_nodes, cluster_hash(cluster),
               scenario)


def spec_jobs(spec: StudySpec, graphs: list[OpGraph]) -> list[Job]:
    """Every job of ``spec`` over its selected ``graphs``: graph x scenario x cluster x
    order x seed."""
    return [make_job(g, c, order, spec.placer, spec.placer_options, seed, spec.training,
                     spec.coarsen_max_nodes, scenario)
            for g in graphs for scenario in spec.scenarios for c in spec.clusters
            for order in spec.orders for seed in spec.seeds_for(order)]


def run_job(job: Job, graph: OpGraph, cluster: Cluster) -> dict[str, Any]:
    """Run ``job`` on its prepared ``graph`` and ``cluster`` (the scenario's); return its
    outcome.

    The outcome: ``status`` ``"done"``, ``step_time_us``, ``lower_bound_us``,
    ``efficiency``, ``feasible``, ``peak_memory_bytes`` (largest over devices),
    ``placement`` (device per node of the prepared graph), ``learning_curve`` (or None),
    the single-device floor ``single_device_us`` and ``single_device_feasible``,
    ``order_hash`` (of the node sequence the order visited), ``study_hash`` /
    ``study_nodes`` (the prepared graph), ``placer_wall_s`` (order and placer),
    ``wall_s`` (the whole job) and ``versions``. The placer's own placement is kept even
    when one device is faster. Exceptions propagate; see `run_job_safely`.
    """
    start = time.perf_counter()
    result = place_graph(graph, cluster, placer=job.placer, order=job.order, seed=job.seed,
                   **job.options)
    visit = traversal_order(graph, job.order, job.seed)
    return {
        "status": "done",
        "step_time_us": float(result.step_time_us),
        "lower_bound_us": float(result.lower_bound_us),
        "efficiency": float(result.efficiency),
        "feasible": bool(result.feasible),
        "peak_memory_bytes": float(np.max(result.peak_memory)),
        "placement": result.placement.tolist(),
        "learning_curve": (None if result.learning_curve is None
                           else [float(x) for x in result.learning_curve]),
        "single_device_us": float(result.single_device_us),
        "single_device_feasible": bool(result.single_device_feasible),
        "order_hash": hashlib.sha256(visit.astype("<i8").tobytes()).hexdigest()[:16],
        "study_hash": graph.graph_hash,
        "study_nodes": graph.n_nodes,
        "placer_wall_s": float(result.wall_s),
        "wall_s": time.perf_counter() - start,
        "versions": library_versions(),
        "error": None,
    }


def run_job_safely(job: Job, graph: OpGraph, cluster: Cluster) -> tuple[Job, dict[str, Any]]:
    """`run_job`, with any exception turned into a ``"failed"`` outcome carrying the
    traceback as ``error``; returns the job with its outcome."""
    start = time.perf_counter()
    try:
        return job, run_job(job, graph, cluster)
    except Exception as exc:
        if (stop := _interrupt_in(exc)) is not None:
            raise stop from None  # Ctrl-C stops the run; it is not the job's failure
        return job, {"status": "failed", "error": traceback.format_exc(limit=8).strip(),
                     "wall_s": time.perf_counter() - start, "versions": library_versions()}


def _interrupt_in(exc: BaseException) -> BaseException | None:
    """The interrupt (KeyboardInterrupt, or another exception that is not an `Exception`)
    that ``exc`` was raised in handling, if any: numba's compiled code turns a Ctrl-C
    landing in it into a SystemError caused by the KeyboardInterrupt.

    >>> try:
    ...     try:
    ...         raise KeyboardInterrupt
    ...     except KeyboardInterrupt as k:
    ...         raise SystemError("returned a result with an exception set") from k
    ... except SystemError as e:
    ...     type(_interrupt_in(e)).__name__, _interrupt_in(ValueError())
    ('KeyboardInterrupt', None)
    """
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        if not isinstance(link, Exception):
            return link
        seen.add(id(link))
        link = link.__cause__ or link.__context__
    return None


def run_jobs_safely(jobs: list[Job], graph: OpGraph, cluster: Cluster
                    ) -> list[tuple[Job, dict[str, Any]]]:
    """`run_job_safely` for several jobs of one prepared graph and cluster (a runner sends
    the graph to a worker once for all of them)."""
    return [run_job_safely(job, graph, cluster) for job in jobs]
