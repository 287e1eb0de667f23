"""The result store: one SQLite file (stdlib ``sqlite3``, WAL journal) per study store.

Tables (``STORE_VERSION`` 2; see docs/study.md for every column):

- ``jobs``: one row per job, keyed by ``job_id`` and UNIQUE over the key columns
  ``(graph_hash, graph_name, scenario, cluster, order_name, placer, config_hash, seed)``;
  the settings (``training``, ``coarsen_max_nodes``, ``placer_options`` JSON,
  ``cluster_hash`` of the cluster as the scenario set it), ``status`` (``done`` or
  ``failed``), the outcome (``step_time_us``, ``lower_bound_us``, ``efficiency``,
  ``feasible``, ``peak_memory_bytes``, ``learning_curve`` JSON,
  ``placement`` as a zlib-compressed little-endian int16 array, see `decode_placement`,
  the single-device floor ``single_device_us`` and ``single_device_feasible``,
  ``order_hash`` of the visited node sequence, ``study_hash``, ``study_nodes``),
  timings (``wall_s``, ``placer_wall_s``), ``versions`` JSON, ``error`` (the traceback of
  a failed job) and ``finished`` (UTC).
- ``graphs``: per selected graph, scenario and preparation: name, family, source, sizes
  before and after preparation, the prepared graph's hash, its features (JSON) and their
  schema version.
- ``clusters``: the hash of a cluster's definition, its name and definition (JSON).
- ``pairs``: scenario features (JSON) of a prepared graph (``study_hash``) on a cluster
  (``cluster_hash``).
- ``studies`` and ``plan``: each run of a spec against the store, keyed by its plan hash
  (the spec's hash and the ids of the jobs it resolved to: the same spec over a changed
  corpus is another plan), and the ids of its jobs, so `ResultStore.status` can count
  what is done, failed and pending per study.

Only one process writes (the runner's main process), each job's row in its own
transaction, so a killed runner loses at most the jobs still running; a job that is
``done`` is never written again. Readers may look at the store while it is written.

>>> import tempfile, os
>>> with ResultStore(os.path.join(tempfile.mkdtemp(), "s.sqlite")) as store:
...     store.integrity_check(), store.status()["done"]
('ok', 0)
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from travorder.errors import FormatError, TravorderError
from travorder.graph import OpGraph
from travorder.placement import Cluster
from travorder.study.jobs import Job, cluster_hash

STORE_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    graph_hash TEXT NOT NULL, graph_name TEXT NOT NULL, scenario TEXT NOT NULL,
    cluster TEXT NOT NULL,
    order_name TEXT NOT NULL, placer TEXT NOT NULL, config_hash TEXT NOT NULL,
    seed INTEGER NOT NULL,
    training INTEGER NOT NULL, coarsen_max_nodes INTEGER NOT NULL,
    placer_options TEXT NOT NULL, cluster_hash TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('done', 'failed')),
    step_time_us REAL, lower_bound_us REAL, efficiency REAL, feasible INTEGER,
    peak_memory_bytes REAL, learning_curve TEXT, placement BLOB,
    single_device_us REAL, single_device_feasible INTEGER, order_hash TEXT,
    study_hash TEXT, study_nodes INTEGER,
    wall_s REAL, placer_wall_s REAL, versions TEXT, error TEXT, finished TEXT NOT NULL,
    UNIQUE (graph_hash, graph_name, scenario, cluster, order_name, placer, config_hash, seed)
);
CREATE TABLE IF NOT EXISTS graphs (
    graph_hash TEXT NOT NULL, name TEXT NOT NULL, scenario TEXT NOT NULL,
    training INTEGER NOT NULL, coarsen_max_nodes INTEGER NOT NULL,
    family TEXT, source TEXT, source_nodes INTEGER NOT NULL, source_edges INTEGER NOT NULL,
    study_hash TEXT NOT NULL, n_nodes INTEGER NOT NULL, n_edges INTEGER NOT NULL,
    features TEXT NOT NULL, feature_schema INTEGER NOT NULL,
    PRIMARY KEY (graph_hash, name, scenario, training, coarsen_max_nodes)
);
CREATE TABLE IF NOT EXISTS clusters (
    cluster_hash TEXT PRIMARY KEY, name TEXT NOT NULL, definition TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS pairs (
    study_hash TEXT NOT NULL, cluster_hash TEXT NOT NULL, features TEXT NOT NULL,
    PRIMARY KEY (study_hash, cluster_hash)
);
CREATE TABLE IF NOT EXISTS studies (
    plan_hash TEXT PRIMARY KEY, spec_hash TEXT NOT NULL, name TEXT NOT NULL,
    spec TEXT NOT NULL, n_jobs INTEGER NOT NULL, created TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS plan (
    plan_hash TEXT NOT NULL, job_id TEXT NOT NULL, PRIMARY KEY (plan_hash, job_id)
) WITHOUT ROWID;
"""

#: The columns of ``jobs`` that hold the outcome (the same on every backend and machine).
OUTCOME_COLUMNS = ("status", "step_time_us", "lower_bound_us", "efficiency", "feasible",
                   "peak_memory_bytes", "learning_curve", "placement", "single_device_us",
                   "single_device_feasible", "order_hash", "study_hash", "study_nodes")

_JOB_COLUMNS = ("job_id", "graph_hash", "graph_name", "scenario", "cluster", "order_name",
                "placer", "config_hash", "seed", "training", "coarsen_max_nodes",
                "placer_options", "cluster_hash", *OUTCOME_COLUMNS, "wall_s",
                "placer_wall_s", "versions", "error", "finished")

_UPSERT = (f"INSERT INTO jobs ({', '.join(_JOB_COLUMNS)}) "
           f"VALUES ({', '.join('?' * len(_JOB_COLUMNS))}) "
           f"ON CONFLICT (job_id) DO UPDATE SET "
           + ", ".join(f"{c} = excluded.{c}" for c in _JOB_COLUMNS[1:])
           + " WHERE jobs.status != 'done'")


def encode_placement(placement: Iterable[int]) -> bytes:
    """A placement as zlib-compressed little-endian int16 (see `decode_placement`)."""
    return zlib.compress(np.asarray(list(placement), dtype="<i2").tobytes(), 6)


def decode_placement(blob: bytes) -> np.ndarray:
    """The device per node (int64) stored by `encode_placement`.

    >>> decode_placement(encode_placement([0, 2, 1])).tolist()
    [0, 2, 1]
    """
    return np.frombuffer(zlib.decompress(blob), dtype="<i2").astype(np.int64)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class ResultStore:
    """A study's result store at ``path`` (created if missing, with ``create``); a context
    manager.

    Raises FormatError for a missing file (without ``create``), or one that is not a
    travorder store or is of another version.
    """

    def __init__(self, path: str | os.PathLike[str], create: bool = True) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise FormatError(f"{str(self.path)!r} is a directory, not a result store (a "
                              f"study's .sqlite file)")
        if not create and not self.path.is_file():
            raise FormatError(f"no such result store {str(self.path)!r}")
        self.created = not self.path.exists()
        try:
            self.connection = sqlite3.connect(self.path, timeout=30.0,
                                              isolation_level=None)
            try:
                self._check_foreign(create)  # before anything is written to the file
            except sqlite3.OperationalError:
                if create:
                    raise
                # a store in a folder that cannot be written: no room for its WAL index
                self.connection.close()
                self.connection = sqlite3.connect(
                    f"{self.path.resolve().as_uri()}?immutable=1", uri=True,
                    isolation_level=None)
                self._check_foreign(create)
                self._check_version()
                return
            self.connection.execute("PRAGMA journal_mode=WAL")
            self.connection.execute("PRAGMA synchronous=NORMAL")
            with self._transaction():
                self.connection.execute(_SCHEMA.split(";")[0])  # meta
                row = self._check_version()
                for statement in _SCHEMA.split(";")[1:]:
                    if statement.strip():
                        self.connection.execute(statement)
                if row is None:
                    self.connection.execute(
                        "INSERT INTO meta VALUES ('store_version', ?)", (str(STORE_VERSION),))
        except (sqlite3.DatabaseError, TravorderError) as exc:
            if hasattr(self, "connection"):
                self.connection.close()
            # Made by the connection: not left behind, empty (the file only: its log's
            # path may be what failed, and not the store's).
            if self.created:
                self.path.unlink(missing_ok=True)
            if isinstance(exc, TravorderError):
                raise
            if self.created:
                raise TravorderError(f"cannot make the result store {str(self.path)!r}: "
                                     f"{exc}") from None
            raise FormatError(f"{self.path}: not a travorder result store ({exc})") from None

    def _check_foreign(self, create: bool) -> None:
        """Refuse a database that is not a travorder store (another program's tables, or
        without ``create`` an empty file), so that nothing is written into it."""
        tables = sorted(r[0] for r in self.connection.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'"))
        ours = "meta" in tables and self.connection.execute(
            "SELECT 1 FROM meta WHERE key = 'store_version'").fetchone() is not None
        if not ours and (tables or not create):
            self.connection.close()
            held = f"it holds {', '.join(tables[:3])}" if tables else "it is empty"
            raise FormatError(f"{self.path}: not a travorder result store ({held})")

    def _check_version(self) -> tuple[str] | None:
        """The store's version row (None in a new store); refuse another version."""
        row = self.connection.execute(
            "SELECT value FROM meta WHERE key = 'store_version'").fetchone()
        if row is not None and row[0] != str(STORE_VERSION):
            raise FormatError(
                f"{self.path}: result store version {row[0]} is not supported (this "
                f"travorder reads version {STORE_VERSION}; run the study into a new store)")
        return row

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT``, or ``ROLLBACK`` on an exception; a store
        that cannot be written (read-only, a full disk, locked) is one error."""
        try:
            self.connection.execute("BEGIN IMMEDIATE")
            try:
                yield self.connection
            except BaseException:
                self.connection.execute("ROLLBACK")
                raise
            self.connection.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            raise TravorderError(f"cannot write the result store {str(self.path)!r}: "
                                 f"{exc}") from None

    def close(self) -> None:
        """Close the connection (committed rows are on disk)."""
        self.connection.close()

    def discard(self) -> None:
        """Close the store and delete its files (one this process made, and nothing in
        it worth keeping)."""
        self.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ writing
    def record(self, job: Job, outcome: dict[str, Any]) -> None:
        """Store ``job``'s outcome (as returned by `run_job_safely`) in one transaction.
        A failed row is replaced by a later outcome; a done row is never changed."""
        curve = outcome.get("learning_curve")
        placement = outcome.get("placement")
        flags = {k: None if outcome.get(k) is None else int(outcome[k])
                 for k in ("feasible", "single_device_feasible")}
        row = (
            job.job_id, job.graph_hash, job.graph_name, job.scenario, job.cluster, job.order,
            job.placer, job.config_hash, job.seed, int(job.training), job.coarsen_max_nodes,
            json.dumps(dict(job.options), sort_keys=True), job.cluster_hash,
            outcome["status"],
            outcome.get("step_time_us"), outcome.get("lower_bound_us"),
            outcome.get("efficiency"), flags["feasible"],
            outcome.get("peak_memory_bytes"), None if curve is None else json.dumps(curve),
            None if placement is None else encode_placement(placement),
            outcome.get("single_device_us"), flags["single_device_feasible"],
            outcome.get("order_hash"),
            outcome.get("study_hash"), outcome.get("study_nodes"), outcome.get("wall_s"),
            outcome.get("placer_wall_s"), json.dumps(outcome.get("versions", {})),
            outcome.get("error"), _now(),
        )
        with self._transaction():
            self.connection.execute(_UPSERT, row)

    def add_graph(self, selected: OpGraph, scenario: str, prepared: OpGraph, training: bool,
                  coarsen_max_nodes: int, features: dict[str, float], schema: int) -> None:
        """Describe a selected graph and its prepared form in ``scenario`` (replacing an
        older entry)."""
        with self._transaction():
            self.connection.execute(
                "INSERT OR REPLACE INTO graphs VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (selected.graph_hash, selected.name, scenario, int(training),
                 coarsen_max_nodes,
                 selected.meta.get("family"), selected.meta.get("source"),
                 selected.n_nodes, selected.n_edges, prepared.graph_hash, prepared.n_nodes,
                 prepared.n_edges, json.dumps(features, sort_keys=True), schema))

    def add_pair(self, study_hash: str, cluster: Cluster, features: dict[str, float]
                 ) -> None:
        """Store a cluster (as a scenario set it) and the scenario features of the prepared
        graph ``study_hash`` on it."""
        with self._transaction():
            self.connection.execute(
                "INSERT OR IGNORE INTO clusters VALUES (?,?,?)",
                (cluster_hash(cluster), cluster.name,
                 json.dumps(cluster.to_dict(), sort_keys=True)))
            self.connection.execute(
                "INSERT OR REPLACE INTO pairs VALUES (?,?,?)",
                (study_hash, cluster_hash(cluster), json.dumps(features, sort_keys=True)))

    def add_study(self, name: str, spec: dict[str, Any], spec_hash: str,
                  jobs: list[Job], clusters: Iterable[Cluster]) -> str:
        """Record a run of a spec (its plan), its clusters and its job ids; return the
        plan hash."""
        ids = sorted(j.job_id for j in jobs)
        plan_hash = hashlib.sha256(json.dumps([spec_hash, ids]).encode()).hexdigest()
        with self._transaction():
            self.connection.execute(
                "INSERT OR IGNORE INTO studies VALUES (?,?,?,?,?,?)",
                (plan_hash, spec_hash, name, json.dumps(spec, sort_keys=True), len(ids),
                 _now()))
            self.connection.executemany("INSERT OR IGNORE INTO plan VALUES (?, ?)",
                                        [(plan_hash, i) for i in ids])
            self.connection.executemany(
                "INSERT OR IGNORE INTO clusters VALUES (?,?,?)",
                [(cluster_hash(c), c.name, json.dumps(c.to_dict(), sort_keys=True))
                 for c in clusters])

    # ------------------------------------------------------------------ reading
    def done_ids(self) -> set[str]:
        """The ids of the jobs that finished successfully."""
        return {r[0] for r in self.connection.execute(
            "SELECT job_id FROM jobs WHERE status = 'done'")}

    def graph_keys(self) -> set[tuple[str, str, str, int, int]]:
        """``(graph_hash, name, scenario, training, coarsen_max_nodes)`` of the described
        graphs."""
        return {tuple(r) for r in self.connection.execute(  # type: ignore[misc]
            "SELECT graph_hash, name, scenario, training, coarsen_max_nodes FROM graphs")}

    def integrity_check(self) -> str:
        """SQLite's ``PRAGMA integrity_check``: ``"ok"`` or the problems found."""
        rows = self.connection.execute("PRAGMA integrity_check").fetchall()
        return "\n".join(r[0] for r in rows)

    def status(self) -> dict[str, Any]:
        """Counts: ``done`` and ``failed`` jobs in the store, and per study (spec) run
        against it (each plan) ``name``, ``plan_hash``, ``spec_hash``, ``created``,
        ``total``, ``done``, ``failed``, ``pending``."""
        counts = dict(self.connection.execute(
            "SELECT status, COUNT(*) FROM jobs GROUP BY status").fetchall())
        studies = []
        for plan_hash, spec_hash, name, total, created in self.connection.execute(
                "SELECT plan_hash, spec_hash, name, n_jobs, created FROM studies "
                "ORDER BY created, rowid").fetchall():
            by = dict(self.connection.execute(
                "SELECT j.status, COUNT(*) FROM plan p JOIN jobs j ON j.job_id = p.job_id "
                "WHERE p.plan_hash = ? GROUP BY j.status", (plan_hash,)).fetchall())
            done, failed = by.get("done", 0), by.get("failed", 0)
            studies.append({"name": name, "plan_hash": plan_hash, "spec_hash": spec_hash,
                            "created": created,
                            "total": total, "done": done, "failed": failed,
                            "pending": total - done - failed})
        return {"done": counts.get("done", 0), "failed": counts.get("failed", 0),
                "studies": studies}


def format_status(status: dict[str, Any]) -> str:
    """`ResultStore.status` as text, a line per study and one for the store.

    >>> print(format_status({"done": 3, "failed": 1, "studies": [{"name": "s", "total": 5,
    ...     "done": 3, "failed": 1, "pending": 1, "plan_hash": "ab" * 32}]}))
    s (plan abababababab): 3 done, 1 failed, 1 pending of 5
    store: 3 done, 1 failed
    """
    lines = [f"{s['name']} (plan {s['plan_hash'][:12]}): {s['done']} done, {s['failed']} "
             f"failed, {s['pending']} pending of {s['total']}" for s in status["studies"]]
    lines.append(f"store: {status['done']} done, {status['failed']} failed")
    return "\n".join(lines)

