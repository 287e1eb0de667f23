"""The study: spec, runner (in-process, loky, Ray), result store, export, report."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from travorder.datasets.synthetic import chain, rnn
from travorder.errors import FormatError, TravorderError
from travorder.featurize import FEATURE_SCHEMA_VERSION
from travorder.graph import OpGraph, prepare_graph
from travorder.placement import PLACERS, load_cluster
from travorder.placement.placers.heuristics import greedy
from travorder.study import ResultStore, StudySpec, load_spec, run_study
from travorder.study.export import (
    as_placed,
    dataset_frame,
    dataset_orders,
    deduplicate,
    export_dataset,
    load_dataset,
    read_sources,
)
from travorder.study.jobs import make_job, run_job
from travorder.study.report import (
    _sentence,
    granularity,
    recommendations,
    scenario_summary,
    write_report,
)
from travorder.study.store import OUTCOME_COLUMNS, decode_placement

SMALL = {
    "name": "small",
    "orders": ["topo", "bfs", "random"],
    "seeds": [0],
    "order_seeds": {"random": [0, 1]},
    "clusters": ["k80x3"],
    "placer": {"name": "greedy"},
    "graphs": {"coarsen_max_nodes": 40, "synthetic": [
        {"family": "chain", "seeds": [0, 1], "params": {"n_layers": 5}},
        {"family": "rnn", "seeds": [0], "params": {"timesteps": 3, "cell_nodes": 4}}]},
}


def spec(**changes: object) -> StudySpec:
    return StudySpec.from_dict({**SMALL, **changes})


def outcomes(path: Path) -> dict[str, tuple]:
    """job_id -> outcome columns of the store at ``path``."""
    con = sqlite3.connect(path)
    rows = con.execute(f"SELECT job_id, {', '.join(OUTCOME_COLUMNS)} FROM jobs").fetchall()
    con.close()
    return {r[0]: r[1:] for r in rows}


# ---------------------------------------------------------------------------- spec
def test_spec_jobs_and_hash():
    s = spec()
    assert [g.name for g in s.select_graphs()] == [
        chain(0, n_layers=5).name, chain(1, n_layers=5).name,
        rnn(0, timesteps=3, cell_nodes=4).name]
    assert s.seeds_for("random") == (0, 1) and s.seeds_for("topo") == (0,)
    assert s.spec_hash == spec().spec_hash != spec(seeds=[1]).spec_hash
    assert StudySpec.from_dict({**SMALL, "seeds": 2}).seeds == (0, 1)
    assert spec(orders="study", order_seeds={}).orders == ("alpha", "topo_lifo", "reversed_topo",
                                           "dfs_preorder", "dfs_postorder", "bfs")


def test_a_whole_number_for_a_float_option_is_one_configuration():
    pytest.importorskip("torch")
    specs = [spec(placer={"name": "rl", "options": {"gamma": g, "episodes": 2}})
             for g in (1, 1.0)]
    assert [repr(s.placer_options) for s in specs] == ["{'gamma': 1.0, 'episodes': 2}"] * 2
    assert specs[0].spec_hash == specs[1].spec_hash
    graph = specs[0].select_graphs()[0]
    jobs = [make_job(graph, load_cluster("k80x3"), "topo", "rl", s.placer_options, 0)
            for s in specs]
    assert jobs[0].config_hash == jobs[1].config_hash


def test_prepare_graph_expands_and_coarsens():
    g = spec().select_graphs()[2]  # rnn, more than 40 nodes
    assert prepare_graph(g, training=False) == g
    assert prepare_graph(g, training=True).n_nodes == 2 * g.n_nodes
    small = prepare_graph(g, training=True, coarsen_max_nodes=40)
    assert small.n_nodes <= 40 and small.name == g.name and small.meta["family"] == "rnn"


@pytest.mark.parametrize(("changes", "message"), [
    ({"name": ""}, "name must be a non-empty string"),
    ({"colour": 1}, "unknown setting 'colour'"),
    ({"orders": ["topo", "nope"]}, "unknown order 'nope'"),
    ({"orders": []}, "orders"),
    ({"seeds": [0, 0]}, "lists a seed twice"),
    ({"seeds": -1}, "positive count"),
    ({"seeds": [1.5]}, r"integers in \[0, 2\*\*63\), got \[1.5\]"),
    ({"seeds": [2**63]}, r"integers in \[0, 2\*\*63\)"),  # SQLite keeps 64-bit integers
    ({"seeds": 10**40}, r"positive count \(at most 10000\)"),
    ({"order_seeds": {"random": [-1]}}, r"order_seeds.random must be .* integers in \[0"),
    ({"clusters": ["k80x3", "nowhere"]}, "unknown cluster 'nowhere'"),
    ({"clusters": ["missing.toml"]}, "no such cluster file"),
    ({"placer": {"name": "magic"}}, "unknown placer 'magic'"),
    ({"placer": {"name": ["greedy"]}}, r"unknown placer \['greedy'\]"),  # was unhashable
    ({"placer": {"name": "rl", "options": {"preset": [1]}}}, r"unknown rl preset \[1\]"),
    ({"graphs": {"synthetic": [{"family": ["chain"]}]}}, "unknown synthetic family"),
    ({"placer": {"name": "greedy", "budget": 3}}, "unknown setting 'budget'"),
    ({"placer": {"name": "rl", "options": {"episodes": "5"}}},  # another config hash
     "placer.options.episodes is the string '5': write it as a number, without quotes"),
    ({"placer": {"name": "greedy", "options": {"colocate": "false"}}}, "as a boolean"),
    ({"placer": {"name": "rl", "options": {"colocate": "yes"}}},  # once read as true
     r"placer.options.colocate is the string 'yes': write it as a boolean \(true or false\)"),
    ({"scenarios": {"memory": [1, True]}},  # once "gives True twice"
     "scenario memory must be a fraction in \\(0, 1\\] of the single-device peak, got True"),
    ({"placer": {"name": "greedy", "options": {"colocat": False}}},
     "placer.options: placer 'greedy' has no option 'colocat'"),
    ({"placer": {"name": "rl", "options": {"gamma": 2}}}, r"rl option gamma must be in \(0, 1\]"),
    ({"order_seeds": {"alpha": [1]}}, "order_seeds names 'alpha'"),
    ({"graphs": {}}, "graphs selects nothing"),
    ({"graphs": {"synthetic": [{"family": "hexagon"}]}}, "unknown synthetic family"),
    ({"graphs": {"synthetic": [{"seeds": [1]}]}}, "a graphs.synthetic entry lacks its family"),
    ({"scenarios": {"batch": ["train", "train"]}}, "scenarios.batch gives 'train' twice"),
    ({"graphs": {"synthetic": [{"family": "chain", "params": {"n_lay": 3}}]}},
     r"chain params: unknown setting 'n_lay' \(expected n_layers, kind, width"),
    ({"graphs": {"corpus": {"families": ["nope"], "size": 3}}}, "unknown setting 'size'"),
    ({"graphs": {"corpus": {"max_nodes": 0}}}, "max_nodes must be a positive integer"),
    ({"graphs": {"corpus": True, "coarsen_max_nodes": -5}}, "coarsen_max_nodes"),
    ({"graphs": {"corpus": True, "coarsen_max_nodes": 2**63}},  # once a store's traceback
     r"graphs.coarsen_max_nodes must be an integer in \[0, 2\*\*63\)"),
    ({"graphs": {"corpus": True, "training": "yes"}}, "graphs.training must be true"),
    ({"graphs": {"files": ["no_such_graph.onnx"]}}, "no such graph file"),
    ({"graphs": {"files": ["/"]}}, "'/' is a folder, not a graph file"),  # once "no such"
    ({"graphs": {"files": [{"path": "no_such_graph.onnx", "family": ""}]}},
     "graphs.files family must be a non-empty string"),
])
def test_spec_errors(changes, message):
    with pytest.raises(TravorderError, match=message):
        StudySpec.from_dict({**SMALL, **changes})


@pytest.mark.parametrize(("graphs", "message"), [
    ({"corpus": {"families": ["nofam"]}}, "graphs.corpus: no graph in the corpus has family"),
    ({"corpus": {"max_nodes": 1}}, "graphs.corpus: no graph of the corpus passes"),
    ({"synthetic": [{"family": "chain", "params": {"n_layers": -1}}]},
     "graphs.synthetic family 'chain': n_layers"),
    ({"synthetic": [{"family": "chain", "params": {"n_layers": 10**8}}]},
     "graphs.synthetic family 'chain': n_layers must be an integer from 1 to 100,000"),
    ({"synthetic": [{"family": "rnn", "params": {"timesteps": 100_000}}]},
     "graphs.synthetic family 'rnn': this rnn graph grows past 100,000 ops"),
])
def test_selection_errors_name_the_spec_and_the_setting(graphs, message):
    spec = StudySpec.from_dict({**SMALL, "graphs": graphs}, source="study spec 's.toml'")
    with pytest.raises(TravorderError, match=f"^study spec 's.toml': {message}"):
        spec.select_graphs()


def test_an_address_needs_the_ray_backend(tmp_path):
    with pytest.raises(TravorderError, match="an address is for the ray backend"):
        run_study(StudySpec.from_dict(SMALL), tmp_path / "s.sqlite", address="auto")
    assert not (tmp_path / "s.sqlite").exists()


def test_ray_at_an_address_that_does_not_answer_is_one_error_without_a_store(tmp_path):
    pytest.importorskip("ray")
    with pytest.raises(TravorderError, match=r"cannot connect to Ray at '127\.0\.0\.1:1': "
                                             "Connection refused"):
        run_study(StudySpec.from_dict(SMALL), tmp_path / "s.sqlite", backend="ray",
                  address="127.0.0.1:1")
    assert not (tmp_path / "s.sqlite").exists()


def test_a_finished_study_needs_no_ray(tmp_path, monkeypatch):
    from travorder.study import runner

    store = tmp_path / "s.sqlite"
    run_study(spec(), store, progress=False)
    monkeypatch.setattr(runner, "_start_ray", None)  # called: a TypeError
    monkeypatch.setitem(sys.modules, "ray", None)  # imported: an ImportError
    again = run_study(spec(), store, backend="ray", address="127.0.0.1:1", progress=False)
    assert again.skipped == again.total and again.ran == 0


def test_one_run_at_a_time_writes_a_store(tmp_path):
    import fcntl

    store = tmp_path / "s.sqlite"
    run_study(spec(), store, progress=False)
    with store.open("rb") as held:  # as a run in another process holds it
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(TravorderError, match="another study run is writing"):
            run_study(spec(), store, progress=False)
    again = run_study(spec(), store, progress=False)  # the lock went with its holder
    assert again.skipped == again.total


@contextlib.contextmanager
def _unwritable(path: Path):
    """``path`` (a file or folder) that cannot be written, for root too (``chattr +i``);
    skips where neither way works."""
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(0o555 if path.is_dir() else 0o444)
        try:
            yield
        finally:
            path.chmod(mode)
        return
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
        pytest.skip("cannot make a file unwritable for root here")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_a_store_that_cannot_be_made_leaves_no_empty_file(tmp_path):
    store = tmp_path / "s.sqlite"
    (tmp_path / "s.sqlite-wal").mkdir()  # where SQLite writes its log
    with pytest.raises(TravorderError, match=r"cannot make the result store .*s\.sqlite'"):
        run_study(spec(), store, progress=False)  # once "not a travorder result store"
    assert not store.exists()  # once left behind, empty


def test_a_store_that_cannot_be_written_is_one_error_and_is_read_where_it_lies(tmp_path):
    store = tmp_path / "runs" / "s.sqlite"
    store.parent.mkdir()
    run_study(spec(), store, progress=False)
    before = outcomes(store)
    message = f"cannot write the result store {re.escape(repr(str(store)))}: attempt to " \
              f"write a readonly database"  # once sqlite3.OperationalError, a traceback
    with _unwritable(store), pytest.raises(TravorderError, match=message):
        run_study(spec(orders=["topo", "bfs"], order_seeds={}), store, progress=False)
    assert outcomes(store) == before
    with _unwritable(store.parent):  # once "not a travorder result store (unable to open"
        with ResultStore(store, create=False) as readonly:
            assert readonly.status()["done"] == len(before)
        assert len(dataset_frame(store)) > 0


def test_a_scenario_name_keeps_its_definition_in_a_store(tmp_path):
    store = tmp_path / "s.sqlite"
    first = {"name": "pipe", "batch": "train", "micro_batches": 2}
    small = {"orders": ["topo", "bfs"], "order_seeds": {}}
    run_study(spec(**small, scenarios=[first]), store, progress=False)
    before = outcomes(store)
    with pytest.raises(TravorderError, match=r"scenario 'pipe' is defined otherwise in store "
                                             r".*\(micro_batches 2, now 4\): give it another"):
        run_study(spec(**small, scenarios=[{**first, "micro_batches": 4}]), store,
                  progress=False)
    assert outcomes(store) == before  # the earlier rows keep their features
    renamed = run_study(spec(**small, scenarios=[{**first, "name": "pipe4",
                                                  "micro_batches": 4}]), store, progress=False)
    assert renamed.ran == renamed.total


def test_an_empty_file_is_no_store_until_ray_answers(tmp_path):
    pytest.importorskip("ray")
    empty = tmp_path / "s.sqlite"
    empty.touch()
    with pytest.raises(TravorderError, match="cannot connect to Ray"):
        run_study(spec(), empty, backend="ray", address="127.0.0.1:1", progress=False)
    assert empty.stat().st_size == 0


def test_spec_missing_setting_and_file(tmp_path):
    doc = {k: v for k, v in SMALL.items() if k != "placer"}
    with pytest.raises(TravorderError, match="missing setting 'placer'"):
        StudySpec.from_dict(doc)
    with pytest.raises(FormatError, match="no such study spec"):
        load_spec(tmp_path / "absent.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = [")
    with pytest.raises(FormatError, match="not valid TOML"):
        load_spec(bad)


def test_spec_file_paths_are_relative_to_the_spec(tmp_path):
    (tmp_path / "c.toml").write_text(
        'name = "mine"\nlink_model = "link"\ndevices = [{name = "d", count = 2, '
        'peak_flops = 1e12, mem_bw = 1e11}]\nlinks = {bandwidth = 1000.0, latency = 1.0}\n')
    (tmp_path / "s.toml").write_text(
        'name = "x"\norders = ["topo"]\nclusters = ["c.toml", "k80x3"]\n'
        '[placer]\nname = "greedy"\n[graphs]\nsynthetic = [{family = "chain"}]\n')
    s = load_spec(tmp_path / "s.toml")
    assert [c.name for c in s.clusters] == ["mine", "k80x3"]
    with pytest.raises(TravorderError, match=r"s\.toml.*unknown placer"):
        (tmp_path / "s.toml").write_text(
            (tmp_path / "s.toml").read_text().replace('"greedy"', '"gredy"'))
        load_spec(tmp_path / "s.toml")


def test_a_cluster_too_slow_for_a_float_writes_nothing(tmp_path, capsys):
    from travorder.cli import main

    (tmp_path / "c.toml").write_text(
        'name = "crawl"\nlink_model = "link"\ndevices = [{name = "d", count = 2, '
        'peak_flops = 1e-300, mem_bw = 1e11}]\nlinks = {bandwidth = 1000.0, latency = 1.0}\n')
    (tmp_path / "s.toml").write_text(
        'name = "x"\norders = ["topo"]\nclusters = ["c.toml"]\n'
        '[placer]\nname = "greedy"\n[graphs]\nsynthetic = [{family = "chain"}]\n')
    store = tmp_path / "s.sqlite"
    assert main(["study", "run", str(tmp_path / "s.toml"), "--store", str(store)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "times add up to more than a float holds" in err
    assert "graph '3-op check' on cluster 'crawl'" in err  # not graph ''
    assert not store.exists()


# ---------------------------------------------------------------------------- jobs
def test_run_job_is_the_placement_of_the_prepared_graph():
    s = spec()
    g, c = s.select_graphs()[0], load_cluster("k80x3")
    job = make_job(g, c, "bfs", "greedy", {}, seed=0, training=True)
    prepared = prepare_graph(g, True)
    out = run_job(job, prepared, c)
    from travorder.placement import place_graph
    direct = place_graph(prepared, c, "greedy", "bfs", 0)
    assert out["placement"] == direct.placement.tolist()
    assert out["step_time_us"] == direct.step_time_us
    assert out["study_hash"] == prepared.graph_hash and out["study_nodes"] == 2 * g.n_nodes
    # The key: same inputs, same id; a different option or cluster, another config.
    assert job.job_id == make_job(g, c, "bfs", "greedy", {}, 0).job_id
    assert job.config_hash != make_job(g, c, "bfs", "greedy", {"colocate": False},
                                       0).config_hash
    assert job.config_hash != make_job(g, load_cluster("pcie4x4"), "bfs", "greedy", {},
                                       0).config_hash


# ---------------------------------------------------------------------------- runner
def test_study_runs_resumes_and_adds_only_new_jobs(tmp_path):
    store = tmp_path / "s.sqlite"
    first = run_study(spec(), store, progress=False)
    assert (first.total, first.skipped, first.ran, first.done, first.failed) == (12, 0, 12,
                                                                                 12, 0)
    before = outcomes(store)
    again = run_study(spec(), store, progress=False)
    assert (again.ran, again.skipped) == (0, 12)
    more = run_study(spec(seeds=[0, 1]), store, progress=False)  # topo, bfs get seed 1
    assert (more.total, more.skipped, more.ran) == (18, 12, 6)
    after = outcomes(store)
    assert {k: after[k] for k in before} == before
    with ResultStore(store) as st:
        status = st.status()
        assert st.integrity_check() == "ok"
    assert (status["done"], status["failed"]) == (18, 0)
    assert [(x["total"], x["done"], x["pending"]) for x in status["studies"]] == [
        (12, 12, 0), (18, 18, 0)]
    # Stored placements decode to the placer's output on the prepared graph.
    con = sqlite3.connect(store)
    blob, name = con.execute("SELECT placement, graph_name FROM jobs WHERE order_name = "
                             "'topo' AND seed = 0 ORDER BY graph_name LIMIT 1").fetchone()
    con.close()
    g = prepare_graph(spec().select_graphs()[0], True, 40)
    from travorder.placement import place_graph
    assert name == g.name
    assert decode_placement(blob).tolist() == place_graph(g, "k80x3").placement.tolist()


def _explode(graph, cluster, order, seed):
    if graph.name.startswith("syn_rnn"):
        raise RuntimeError("boom on " + graph.name)
    return greedy(graph, cluster, order, seed)


def test_a_failing_job_is_stored_and_the_study_goes_on(tmp_path, monkeypatch):
    monkeypatch.setitem(PLACERS, "explode", _explode)
    store = tmp_path / "s.sqlite"
    s = spec(placer={"name": "explode"})
    summary = run_study(s, store, progress=False)
    assert (summary.done, summary.failed) == (8, 4)
    con = sqlite3.connect(store)
    rows = con.execute("SELECT graph_name, status, error, step_time_us FROM jobs "
                       "WHERE status = 'failed'").fetchall()
    con.close()
    rnn_name = s.select_graphs()[2].name
    assert {r[0] for r in rows} == {rnn_name}
    assert all(f"RuntimeError: boom on {rnn_name}" in r[2] and r[3] is None for r in rows)
    # Failed jobs run again; once they succeed their rows are replaced.
    monkeypatch.setitem(PLACERS, "explode", lambda g, c, o, s: greedy(g, c, o, s))
    again = run_study(s, store, progress=False)
    assert (again.skipped, again.ran, again.failed) == (8, 4, 0)
    with ResultStore(store) as st:
        assert st.status()["failed"] == 0 and st.status()["done"] == 12


def test_a_graph_whose_costs_overflow_leaves_no_store_and_no_pending_run(tmp_path):
    import warnings

    huge = tmp_path / "huge.json"  # a profiled graph of three ops of 1e304 ms each
    huge.write_text(json.dumps({
        "nodes": [{"id": i, "fpgaLatency": 1e304, "size": 10.0} for i in range(3)],
        "edges": [{"sourceId": 0, "destId": 1}, {"sourceId": 1, "destId": 2}]}))
    bad, store = spec(graphs={"files": [str(huge)]}), tmp_path / "s.sqlite"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's overflow warnings once came first
        with pytest.raises(TravorderError, match="'huge' on cluster 'k80x3': its op and "
                                                 "transfer times add up to more than a"):
            run_study(bad, store, progress=False)
    assert list(tmp_path.iterdir()) == [huge]  # once a store with a pending run
    run_study(spec(), store, progress=False)
    with ResultStore(store) as st:
        before = st.status()
    with pytest.raises(TravorderError, match="add up to more than a float holds"):
        run_study(bad, store, progress=False)
    with ResultStore(store) as st:  # the finished study kept, no run of the bad one
        assert st.status() == before


def test_runner_argument_errors(tmp_path):
    with pytest.raises(TravorderError, match="unknown backend 'dask'"):
        run_study(spec(), tmp_path / "s.sqlite", backend="dask")
    with pytest.raises(TravorderError, match="jobs must be a positive integer"):
        run_study(spec(), tmp_path / "s.sqlite", jobs=0)
    with pytest.raises(TravorderError, match=r"placer 'rl' on cluster 'v100x4-nvlink'.*3 devices"):
        run_study(spec(placer={"name": "rl", "options": {"preset": "paper"}},
                       clusters=["k80x3", "v100x4-nvlink"]), tmp_path / "s.sqlite",
                  progress=False)
    assert not (tmp_path / "s.sqlite").exists()
    (tmp_path / "junk.sqlite").write_text("not a database, not at all" * 100)
    with pytest.raises(FormatError, match="not a travorder result store"):
        ResultStore(tmp_path / "junk.sqlite")


def test_every_bundled_spec_passes_the_runners_preflight():
    """Each shipped spec's placer runs with its options on each of its clusters (as
    `run_study` checks before it writes anything), and each scenario's micro-batches fit
    each graph's batch: the paper preset is pinned to k80x3."""
    from travorder.study import runner

    specs = sorted((Path(runner.__file__).parent / "specs").glob("*.toml"))
    assert len(specs) >= 10
    for path in specs:
        loaded = load_spec(path)
        runner._preflight(loaded, loaded.select_graphs())
    four = spec(placer={"name": "rl", "options": {"preset": "paper"}},
                clusters=["v100x4-nvlink"])
    with pytest.raises(TravorderError, match="paper preset is the study's setting on 3"):
        runner._preflight(four, [])


def test_every_bundled_spec_has_its_dataset_in_a_bundled_dataset():
    """``specs/NAME.toml`` is exported to ``data/NAME.parquet`` (docs/study.md), and each
    export is a part of exactly one of `BUNDLED_DATASETS`."""
    from travorder.study import runner
    from travorder.study.export import BUNDLED_DATASETS

    root = Path(runner.__file__).parent
    specs = {p.stem for p in (root / "specs").glob("*.toml")}
    data = {p.stem for p in (root / "data").glob("*.parquet")}
    parts = [Path(p).stem for ps in BUNDLED_DATASETS.values() for p in ps]
    assert specs == data == set(parts) and len(parts) == len(set(parts))


def test_a_bad_placer_option_writes_nothing(tmp_path):
    with pytest.raises(TravorderError, match="episodes must be at least 1"):  # read
        spec(placer={"name": "rl", "options": {"episodes": -3}})
    # the paper preset fits the options, not a 4-device cluster: the runner's preflight
    bad = spec(placer={"name": "rl", "options": {"preset": "paper"}},
               clusters=["v100x4-nvlink"])
    store = tmp_path / "s.sqlite"
    with pytest.raises(TravorderError, match="paper preset is the study's setting"):
        run_study(bad, store, progress=False)
    assert not store.exists()
    run_study(spec(), store, progress=False)
    with ResultStore(store) as st:
        before = st.status()
    with pytest.raises(TravorderError, match="paper preset is the study's setting"):
        run_study(bad, store, progress=False)
    with ResultStore(store) as st:
        assert st.status() == before and len(before["studies"]) == 1


def test_no_more_loky_workers_than_work(tmp_path, monkeypatch):
    import joblib

    asked, real = [], joblib.Parallel

    def counting(n_jobs, **kwargs):  # records the pool's size, runs on two at most
        asked.append(n_jobs)
        return real(n_jobs=min(n_jobs, 2), **kwargs)

    monkeypatch.setattr(joblib, "Parallel", counting)
    s = spec()
    assert run_study(s, tmp_path / "s.sqlite", jobs=100_000, progress=False).done == 12
    chunks = len(s.select_graphs()) * len(s.clusters) * len(s.scenarios)
    assert len(asked) == 2 and max(asked) <= chunks  # once 100,000 workers to start


@pytest.mark.slow
def test_loky_workers_store_the_same_outcomes(tmp_path):
    run_study(spec(), tmp_path / "one.sqlite", jobs=1, progress=False)
    summary = run_study(spec(), tmp_path / "two.sqlite", jobs=2, progress=False)
    assert summary.done == 12
    assert outcomes(tmp_path / "one.sqlite") == outcomes(tmp_path / "two.sqlite")


RL_SPEC = {**SMALL, "orders": ["topo", "dfs_preorder"], "seeds": [0, 1], "order_seeds": {},
           "placer": {"name": "rl", "options": {"episodes": 3}},
           "graphs": {"coarsen_max_nodes": 24, "synthetic": [
               {"family": "chain", "seeds": [0], "params": {"n_layers": 5}},
               {"family": "rnn", "seeds": [0], "params": {"timesteps": 3, "cell_nodes": 4}}]}}


@pytest.mark.slow
def test_loky_and_ray_give_identical_results(tmp_path):
    pytest.importorskip("ray")
    for name, s in (("greedy", spec()), ("rl", StudySpec.from_dict(RL_SPEC))):
        loky, ray_ = tmp_path / f"{name}-loky.sqlite", tmp_path / f"{name}-ray.sqlite"
        a = run_study(s, loky, jobs=2, backend="loky", progress=False)
        b = run_study(s, ray_, jobs=2, backend="ray", progress=False)
        assert a.done == b.done == a.total and a.failed == 0
        assert outcomes(loky) == outcomes(ray_)
        if name == "rl":
            curves = [json.loads(v[OUTCOME_COLUMNS.index("learning_curve")])
                      for v in outcomes(ray_).values()]
            assert all(len(c) == 3 for c in curves)


_RUNNER = """
import sys
from travorder.study import StudySpec, run_study
spec = StudySpec.from_dict({"name": "fault", "orders": "all", "seeds": [0, 1, 2],
    "clusters": ["k80x3", "v100x4-nvlink"], "placer": {"name": "greedy"},
    "graphs": {"coarsen_max_nodes": 150, "synthetic": [
        {"family": f, "seeds": [0, 1, 2]} for f in ("chain", "resnet", "unet", "rnn")]}})
print(run_study(spec, sys.argv[1], jobs=2, progress=False), flush=True)
"""


@pytest.mark.slow
def test_sigkill_mid_study_loses_nothing_and_resumes(tmp_path):
    store = tmp_path / "fault.sqlite"
    proc = subprocess.Popen([sys.executable, "-c", _RUNNER, str(store)],
                            start_new_session=True)
    try:
        snapshot: dict[str, tuple] = {}
        deadline = time.monotonic() + 240
        while len(snapshot) < 60 and time.monotonic() < deadline:
            time.sleep(0.2)
            if store.exists():
                with contextlib.suppress(sqlite3.OperationalError):  # no schema yet
                    snapshot = outcomes(store)
        assert len(snapshot) >= 60, "the study did not get going"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    killed = outcomes(store)
    with ResultStore(store) as st:
        assert st.integrity_check() == "ok"
        total = st.status()["studies"][0]["total"]
    assert len(killed) < total, "killed too late to test anything"
    assert {k: killed[k] for k in snapshot} == snapshot
    con = sqlite3.connect(store)
    dup = con.execute("SELECT COUNT(*) FROM (SELECT 1 FROM jobs GROUP BY graph_hash, "
                      "graph_name, cluster, order_name, placer, config_hash, seed "
                      "HAVING COUNT(*) > 1)").fetchone()[0]
    con.close()
    assert dup == 0
    out = subprocess.run([sys.executable, "-c", _RUNNER, str(store)], check=True,
                         capture_output=True, text=True).stdout
    assert f"skipped={len(killed)}" in out and "failed=0" in out
    resumed = outcomes(store)
    assert len(resumed) == total
    clean = tmp_path / "clean.sqlite"
    subprocess.run([sys.executable, "-c", _RUNNER, str(clean)], check=True,
                   capture_output=True)
    assert outcomes(clean) == resumed


_LONG_SPEC = """
name = "long"
orders = "all"
seeds = [0, 1, 2]
clusters = ["k80x3", "v100x4-nvlink"]

[placer]
name = "greedy"

[[graphs.synthetic]]
family = "resnet"
seeds = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
"""


def _children(pid: int) -> list[int]:
    """The PIDs whose parent is ``pid`` (Linux /proc)."""
    kids = []
    for d in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            if d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[1]
                                        .split()[1]) == pid:
                kids.append(int(d.name))
    return kids


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie waiting to be reaped does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_sigkill_of_the_runner_takes_its_workers_along(tmp_path):
    spec_path, store = tmp_path / "long.toml", tmp_path / "long.sqlite"
    spec_path.write_text(_LONG_SPEC)
    proc = subprocess.Popen([sys.executable, "-m", "travorder.cli", "study", "run",
                             str(spec_path), "--store", str(store), "--jobs", "2",
                             "--no-progress"], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        done: dict[str, tuple] = {}
        while len(done) < 4 and time.monotonic() < deadline:  # the workers are busy
            time.sleep(0.3)
            with contextlib.suppress(sqlite3.OperationalError):
                done = outcomes(store) if store.exists() else {}
        kids = _children(proc.pid)
        workers = [k for k in kids
                   if "loky" in Path(f"/proc/{k}/cmdline").read_text()]
        assert len(done) >= 4 and len(workers) >= 2, (len(done), kids)
        assert proc.poll() is None, "the study finished before the kill"
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(k) for k in kids):
        time.sleep(0.2)
    left = [k for k in kids if _alive(k)]
    for k in left:  # do not leave them behind when the test fails
        with contextlib.suppress(ProcessLookupError):
            os.kill(k, signal.SIGKILL)
    assert not left, f"{len(left)} of {len(kids)} child processes outlived the runner"


# ---------------------------------------------------------------------------- export
def _hand_store(path: Path, family: str | None = "fam") -> None:
    """One graph on one cluster: per order, hand-picked step times over seeds."""
    g = OpGraph(["a", "b"], [0], [1], flops=[1e9, 1e9], meta={
        "name": "g", "source": "hand", **({} if family is None else {"family": family})})
    c = load_cluster("k80x3")
    times = {"topo": [(100, 1), (110, 1), (90, 1)],   # mean 100, se 10 / sqrt(3)
             "bfs": [(95, 1)],                          # the best
             "lexico_topo": [(95, 1)],                  # bfs's sequence: a construction tie
             "alpha": [(300, 1), (310, 1)],             # mean 305, far off
             "dfs_preorder": [(80, 0), (80, 1)],        # fastest, but one seed infeasible
             "dfs_postorder": [(95.5, 1)]}              # within 1% of 95
    placements = {"topo": [0, 1], "bfs": [1, 0], "lexico_topo": [1, 0], "alpha": [0, 2],
                  "dfs_preorder": [2, 0], "dfs_postorder": [1, 2]}
    with ResultStore(path) as store:
        store.add_graph(g, "batch=export", g, True, 0, {"x": 1.5, "y": -2.0}, 7)
        store.add_pair(g.graph_hash, c, {"memory_pressure": 0.25})
        store.add_study("hand", {}, "h", [], [c])
        for order, runs in times.items():
            for seed, (t, ok) in enumerate(runs):
                job = make_job(g, c, order, "greedy", {}, seed, True, 0)
                store.record(job, {"status": "done", "step_time_us": float(t),
                                   "feasible": bool(ok), "placement": placements[order],
                                   "order_hash": "same" if order in ("bfs", "lexico_topo")
                                   else order, "single_device_us": 190.0,
                                   "single_device_feasible": True,
                                   "study_hash": g.graph_hash})
        failed = make_job(g, c, "reversed_topo", "greedy", {}, 0, True, 0)
        store.record(failed, {"status": "failed", "error": "boom"})


def test_export_means_errors_and_ties(tmp_path):
    _hand_store(tmp_path / "h.sqlite")
    data = dataset_frame(tmp_path / "h.sqlite")
    assert len(data) == 1
    row = data.iloc[0]
    assert row["time_topo"] == 100 and row["se_topo"] == pytest.approx(10 / math.sqrt(3))
    assert row["seeds_topo"] == 3 and row["seeds_bfs"] == 1 and row["se_bfs"] == 0
    assert row["time_alpha"] == 305 and row["se_alpha"] == pytest.approx(5)
    assert row["feasible_dfs_preorder"] == 0.5
    assert "time_reversed_topo" not in data.columns  # failed jobs do not count
    assert row["best_order"] == "bfs" and row["best_time_us"] == 95
    # lexico_topo: bfs's sequence; dfs_postorder: 95.5 <= 95 * 1.01 = 95.95;
    # topo: 100 - 95 = 5 <= 2 * hypot(5.77, 0) = 11.5
    assert row["ties"] == "bfs,lexico_topo,dfs_postorder,topo" and row["n_ties"] == 4
    assert row["construction_ties"] == "lexico_topo=bfs"
    assert row["second_order"] == "dfs_postorder" and row["second_tied"]
    assert row["gap_second"] == pytest.approx(0.5 / 95)
    assert row["worst_order"] == "alpha" and row["gap_worst"] == pytest.approx(305 / 95 - 1)
    assert row["speedup"] == pytest.approx(2.0) and row["single_device_feasible"]
    assert (row["f_x"], row["f_y"], row["feature_schema"]) == (1.5, -2.0, 7)
    assert row["s_memory_pressure"] == 0.25 and row["scenario"] == "batch=export"
    assert row["c_n_devices"] == 3 and row["family"] == "fam" and row["n_nodes"] == 2
    strict = dataset_frame(tmp_path / "h.sqlite", rel_tol=0.0).iloc[0]
    assert strict["ties"] == "bfs,lexico_topo,topo"


def test_as_placed_applies_the_single_device_floor(tmp_path):
    _hand_store(tmp_path / "h.sqlite")
    raw = dataset_frame(tmp_path / "h.sqlite")
    placed = as_placed(raw)
    row = placed.iloc[0]
    # one device takes 190 us: alpha's 305 us and dfs_preorder (over memory on one of its
    # two seeds) come back as the single-device placement
    assert row["time_alpha"] == row["time_dfs_preorder"] == 190
    assert row["se_alpha"] == 0 and row["feasible_dfs_preorder"] == 1
    assert row["time_topo"] == 100 and row["se_topo"] == raw.iloc[0]["se_topo"]
    assert row["best_order"] == "bfs" and row["ties"] == raw.iloc[0]["ties"]
    assert row["worst_order"] == "dfs_preorder"
    assert row["gap_worst"] == pytest.approx(190 / 95 - 1)
    assert as_placed(placed).equals(placed)
    assert as_placed(raw.assign(single_device_feasible=False))["time_alpha"].iloc[0] == 305
    slow = as_placed(raw.assign(single_device_us=50.0)).iloc[0]
    assert slow["best_time_us"] == 50 and slow["n_ties"] == len(dataset_orders(raw))
    assert slow["speedup"] == 1
    with pytest.raises(TravorderError, match="lacks the single-device floor"):
        as_placed(raw.drop(columns="single_device_us"))
    # a CSV export reads an empty construction_ties as NaN
    export_dataset(tmp_path / "h.sqlite", tmp_path / "d.csv")
    csv = load_dataset(tmp_path / "d.csv").assign(construction_ties=np.nan)
    assert as_placed(csv).iloc[0]["time_alpha"] == 190
    # no single-device time, or no step time at all: the row stays as it is
    unknown = raw.assign(single_device_us=np.nan, single_device_feasible=np.nan)
    assert as_placed(unknown).iloc[0]["time_alpha"] == 305
    times = [c for c in raw.columns if c.startswith("time_")]
    empty = pd.concat([raw, raw.assign(**{c: np.nan for c in times})], ignore_index=True)
    assert as_placed(empty).iloc[1]["best_order"] == "bfs"


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(1, 1e4), min_size=2, max_size=5), st.floats(1, 1e4),
       st.booleans())
def test_as_placed_is_never_slower_than_one_device_that_fits(times, single, fits):
    row = {"single_device_us": single, "single_device_feasible": fits,
           **{f"time_o{i}": t for i, t in enumerate(times)}}
    placed = as_placed(pd.DataFrame([row])).iloc[0]
    expected = [min(t, single) if fits else t for t in times]
    assert [placed[f"time_o{i}"] for i in range(len(times))] == expected
    assert placed["best_time_us"] == min(expected)


@pytest.mark.parametrize("name", ["d.parquet", "d.csv", "d.csv.gz"])
def test_export_round_trip(tmp_path, name):
    _hand_store(tmp_path / "h.sqlite")
    written = export_dataset(tmp_path / "h.sqlite", tmp_path / name)
    back = load_dataset(tmp_path / name)
    assert list(back.columns) == list(written.columns)
    assert back.iloc[0]["ties"] == "bfs,lexico_topo,dfs_postorder,topo"
    assert math.isclose(back.iloc[0]["se_alpha"], 5.0)


def test_a_graph_without_a_family_is_its_own(tmp_path):
    _hand_store(tmp_path / "h.sqlite", family=None)  # a study's file that names none
    assert dataset_frame(tmp_path / "h.sqlite")["family"].tolist() == ["g"]
    old = dataset_frame(tmp_path / "h.sqlite").assign(family=None)  # exported before
    old.to_csv(tmp_path / "old.csv", index=False)
    assert load_dataset(tmp_path / "old.csv")["family"].tolist() == ["g"]
    write_report(tmp_path / "old.csv", tmp_path / "r")  # datasets alone: no timelines
    assert "<b>g</b> (greedy): use <code>bfs</code>" in (tmp_path / "r" / "index.html"
                                                          ).read_text()


def test_another_programs_database_is_never_written(tmp_path):
    foreign = tmp_path / "app.sqlite"
    with contextlib.closing(sqlite3.connect(foreign)) as c:
        c.execute("CREATE TABLE users (id INTEGER)")
        c.commit()
    before = foreign.read_bytes()
    for create in (False, True):  # neither status/export nor run writes into it
        with pytest.raises(FormatError, match="not a travorder result store \\(it holds "
                                              "users\\)"):
            ResultStore(foreign, create=create)
    assert foreign.read_bytes() == before
    (tmp_path / "empty.sqlite").touch()
    with pytest.raises(FormatError, match="it is empty"):
        ResultStore(tmp_path / "empty.sqlite", create=False)
    ResultStore(tmp_path / "empty.sqlite").close()  # a run may start a store there
    for create in (False, True):
        with pytest.raises(FormatError, match="is a directory, not a result store"):
            ResultStore(tmp_path, create=create)


def test_export_errors(tmp_path):
    with pytest.raises(FormatError, match="no such result store"):
        dataset_frame(tmp_path / "none.sqlite")
    ResultStore(tmp_path / "empty.sqlite").close()
    with pytest.raises(TravorderError, match="no finished job"):
        dataset_frame(tmp_path / "empty.sqlite")
    _hand_store(tmp_path / "h.sqlite")
    with pytest.raises(TravorderError, match=r"must end in \.parquet"):
        export_dataset(tmp_path / "h.sqlite", tmp_path / "d.xlsx")
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    with pytest.raises(FormatError, match="not a travorder study dataset"):
        load_dataset(tmp_path / "x.csv")


def test_a_folder_is_no_dataset(tmp_path):
    (tmp_path / "d.parquet").mkdir()  # once "no such dataset"
    with pytest.raises(FormatError, match=r"d.parquet' is a folder, not a dataset file"):
        load_dataset(tmp_path / "d.parquet")
    (tmp_path / "runs").mkdir()  # once "the dataset file must end in .parquet, ..."
    with pytest.raises(FormatError, match=r"runs' is a folder, not a dataset file"):
        load_dataset(tmp_path / "runs")
    with pytest.raises(FormatError, match=r"runs' is a folder, not a result store or a "
                                          r"dataset file \(a study's .sqlite, .parquet"):
        read_sources([tmp_path / "runs"])


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.assign(time_bfs=d["time_topo"]).rename(columns={"time_bfs": "time_topo"}),
     "column 'time_topo' appears twice"),  # pandas reads the second as time_topo.1
    (lambda d: d.assign(time_sideways=1.0), "'time_sideways' is the step time of no order"),
    (lambda d: d.assign(feature_schema=FEATURE_SCHEMA_VERSION),  # the hand store's: x, y
     "no column 'f_n_nodes'"),
    (lambda d: d.drop(columns="graph_hash"), "no column 'graph_hash'"),
    (lambda d: d.assign(graph=np.nan), "column 'graph' has rows without a name"),
    (lambda d: d.assign(cluster=""), "column 'cluster' has rows without a name"),
    (lambda d: d.assign(f_n_nodes=np.inf), "a feature is not a finite number"),
    (lambda d: d.assign(time_topo=-3.0), "a step time is not finite and positive"),
    (lambda d: d.assign(coarsen_max_nodes="abc"), "'coarsen_max_nodes' holds values that"),
    (lambda d: d.assign(best_order="sideways"), "best_order 'sideways' is no order"),
    (lambda d: d.assign(ties="[[[["), "ties '[[[[' names something that is no order"),
    (lambda d: d.assign(scenario_def="{not json"), "scenario_def '{not json' is not a "),
])
def test_a_dataset_with_unusable_values_is_refused_when_read(tmp_path, edit, message):
    # each once a KeyError or TypeError in report, train or evaluate, or a made-up order
    _hand_store(tmp_path / "h.sqlite")
    export_dataset(tmp_path / "h.sqlite", tmp_path / "d.csv")
    assert not load_dataset(tmp_path / "d.csv").empty
    edit(pd.read_csv(tmp_path / "d.csv")).to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(FormatError, match=re.escape(message)):
        load_dataset(tmp_path / "bad.csv")


# ---------------------------------------------------------------------------- report
def test_report_writes_page_and_figures(tmp_path):
    _hand_store(tmp_path / "h.sqlite")
    files = write_report(tmp_path / "h.sqlite", tmp_path / "report")
    names = sorted(p.name for p in files)
    assert names == ["index.html", "ratio_greedy_batch_export_none.png",
                     "wins_greedy_batch_export_none.png"]
    assert all(p.stat().st_size > 1000 for p in files)
    page = (tmp_path / "report" / "index.html").read_text()
    assert ("<b>fam</b> (greedy): use <code>bfs</code> (as good within 1%: lexico_topo, "
            "dfs_postorder) in batch=export: win share 25% (orders tied for best share a "
            "win), 1.000x the best") in page
    data = dataset_frame(tmp_path / "h.sqlite")
    rec = recommendations(data).iloc[0]
    # Four tied orders share the win; bfs has the lowest ratio (1.0) and name among them.
    assert (rec["recommended"], rec["win_share"]) == ("bfs", pytest.approx(1 / 4))
    assert rec["equivalent"] == "bfs,lexico_topo,dfs_postorder"  # 95.5 / 95 is within 1%
    assert rec["topo_ratio"] == pytest.approx(100 / 95) and rec["topo_order"] == "topo"
    lifo = next(recommendations(data).assign(topo_order="topo_lifo").itertuples())
    assert "; <code>topo_lifo</code> 1.053x" in _sentence(lifo, 0.01)  # the order measured
    tied = next(recommendations(data).assign(equivalent="bfs,topo", orders=2).itertuples())
    assert _sentence(tied, 0.01) == ("<li><b>fam</b> (greedy): any order in batch=export: "
                                     "all 2 within 1% of the best on average</li>")
    summary = scenario_summary(data).iloc[0].to_dict()
    assert summary == {
        "placer": "greedy", "scenario": "batch=export", "coarsening": "none",
        "cluster": "k80x3", "rows": 1,
        "one_device_infeasible": 0.0, "beats_one_device": 1.0, "median_speedup": 2.0,
        "no_feasible": 0, "order_matters_5pct": 1.0, "beyond_noise": 0.0, "second_5pct": 0.0,
        "median_gap_second": pytest.approx(0.5 / 95)}
    assert "Where placement and the order matter" in page


def test_report_replaces_an_earlier_report_and_refuses_datasets_without_its_columns(
        tmp_path):
    _hand_store(tmp_path / "h.sqlite")
    out = tmp_path / "report"
    out.mkdir()
    for name in ("wins_old_scenario.png", "notes.txt", "photo.png"):  # the user's stay
        (out / name).write_text("x")
    orphan = out / ".report-999999999-abc"  # the working folder of a report killed by SIGKILL
    running = out / f".report-{os.getpid()}-abc"  # one of a report still running
    for d in (orphan, running):
        d.mkdir()
        (d / "index.html").write_text("x")
    write_report(tmp_path / "h.sqlite", out)
    assert not orphan.exists()
    shutil.rmtree(running)
    assert sorted(p.name for p in out.iterdir()) == [
        "index.html", "notes.txt", "photo.png", "ratio_greedy_batch_export_none.png",
        "wins_greedy_batch_export_none.png"]
    data = dataset_frame(tmp_path / "h.sqlite")
    data.to_csv(tmp_path / "new.csv", index=False)
    for dropped in (["single_device_us", "single_device_feasible"], ["scenario_def"]):
        data.drop(columns=dropped).to_csv(tmp_path / "old.csv", index=False)
        with pytest.raises(TravorderError, match=rf"old\.csv': no column {dropped[-1]} \(a "
                                                 r"dataset of an older travorder.*export it "
                                                 r"again"):  # alone, or beside a new one
            write_report([tmp_path / "new.csv", tmp_path / "old.csv"], tmp_path / "r2")
        assert not (tmp_path / "r2").exists()


def test_report_reads_a_dataset_without_feasible_columns_and_refuses_lost_winners(tmp_path):
    _hand_store(tmp_path / "h.sqlite")
    data = dataset_frame(tmp_path / "h.sqlite")
    # feasible_ columns missing read as feasible, as in every other reader (was a KeyError)
    data.drop(columns=[c for c in data.columns if c.startswith("feasible_")]).to_csv(
        tmp_path / "nofeas.csv", index=False)
    assert (tmp_path / "r1" / "index.html") in write_report(tmp_path / "nofeas.csv",
                                                            tmp_path / "r1")
    best = data["best_order"].iloc[0]
    lost = (data.drop(columns=[f"{k}_{best}" for k in ("time", "se", "seeds", "feasible")]),
            data.assign(**{f"time_{best}": float("nan")}))  # KeyError; a report of NaN
    for i, edited in enumerate(lost):
        edited.to_csv(tmp_path / "lost.csv", index=False)
        with pytest.raises(TravorderError, match=rf"graph 'g', cluster 'k80x3', scenario "
                                                 rf"'batch=export' names '{best}' among its "
                                                 rf"best orders but has no step time for it"):
            write_report(tmp_path / "lost.csv", tmp_path / f"r{i + 2}")
        assert not (tmp_path / f"r{i + 2}").exists()


def test_report_of_several_sources_keeps_coarsening_levels_apart(tmp_path):
    _hand_store(tmp_path / "h.sqlite")
    export_dataset(tmp_path / "h.sqlite", tmp_path / "h.parquet")
    coarse = load_dataset(tmp_path / "h.parquet").assign(coarsen_max_nodes=200,
                                                         config_hash="other")
    coarse.to_parquet(tmp_path / "c.parquet")
    files = write_report([tmp_path / "c.parquet", tmp_path / "h.sqlite"], tmp_path / "r")
    assert {p.name for p in files} == {
        "index.html", "ratio_greedy_batch_export_none.png", "wins_greedy_batch_export_none.png",
        "ratio_greedy_batch_export_200_nodes.png", "wins_greedy_batch_export_200_nodes.png"}
    page = (tmp_path / "r" / "index.html").read_text()
    assert "from <code>c.parquet, h.sqlite</code>" in page
    summary = scenario_summary(read_sources([tmp_path / "c.parquet", tmp_path / "h.sqlite"]))
    assert sorted(summary["coarsening"]) == ["<=200 nodes", "none"]
    assert summary["rows"].tolist() == [1, 1]
    # the same graph at both levels: compared; the coarse copy's gaps changed by hand
    assert "The order effect at both coarsening levels" in page
    coarse = coarse.assign(gap_worst=0.01, best_order="alpha")
    other = coarse.assign(graph="only_coarse")  # at one level only: not compared
    both = granularity(pd.concat([coarse, other, load_dataset(tmp_path / "h.parquet")]))
    assert both[["coarsening", "rows", "order_matters_5pct", "best_orders"]].to_dict(
        "records") == [
        {"coarsening": "<=200 nodes", "rows": 1, "order_matters_5pct": 0.0,
         "best_orders": "alpha 1"},
        {"coarsening": "none", "rows": 1, "order_matters_5pct": 1.0, "best_orders": "bfs 1"}]
    assert both["median_gap_worst"].tolist() == [0.01, pytest.approx(305 / 95 - 1)]
    assert both["beyond_noise"].tolist() == [0.0, 0.0]


def test_report_of_sources_that_ran_other_orders_names_only_orders_that_ran(tmp_path):
    _hand_store(tmp_path / "h.sqlite")
    export_dataset(tmp_path / "h.sqlite", tmp_path / "h.parquet")
    data = load_dataset(tmp_path / "h.parquet")
    ran = ("topo", "alpha")  # another placer's study of two orders
    other = data.assign(placer="other", config_hash="other", ties="topo", best_order="topo",
                        best_time_us=100.0)
    for o in set(dataset_orders(data)) - set(ran):
        other[[f"time_{o}", f"se_{o}", f"seeds_{o}", f"feasible_{o}"]] = np.nan
    other.to_parquet(tmp_path / "o.parquet")
    mixed = read_sources([tmp_path / "h.parquet", tmp_path / "o.parquet"])
    recs = recommendations(mixed).set_index("placer")
    assert recs.loc["other", ["recommended", "equivalent", "runner_up"]].tolist() == [
        "topo", "topo", "alpha"]
    assert recs.loc["other", "topo_ratio"] == 1.0 and recs.loc["greedy", "recommended"] == "bfs"
    write_report([tmp_path / "h.parquet", tmp_path / "o.parquet"], tmp_path / "r")
    page = (tmp_path / "r" / "index.html").read_text()
    assert "nan" not in page.lower() and "(other): use <code>topo</code>" in page


def test_report_draws_rl_learning_curves(tmp_path):
    store = tmp_path / "rl.sqlite"
    g = OpGraph(["a", "b"], [0], [1], meta={"name": "g", "family": "f", "source": "s"})
    c = load_cluster("k80x3")
    with ResultStore(store) as st:
        st.add_graph(g, "batch=export", g, True, 0, {"x": 1.0}, 1)
        st.add_study("rl", {}, "r", [], [c])
        for order in ("topo", "bfs"):
            for episodes in (3, 12):  # two configurations: two figures, never averaged
                st.record(make_job(g, c, order, "rl", {"episodes": episodes}, 0), {
                    "status": "done", "step_time_us": 10.0, "feasible": True,
                    "learning_curve": list(np.linspace(20, 10, episodes))})
    files = write_report(store, tmp_path / "r")
    curves = sorted(p.name for p in files if p.name.startswith("curves_"))
    assert len(curves) == 2 and all(n.startswith("curves_k80x3_batch_export_") for n in curves)
    page = (tmp_path / "r" / "index.html").read_text()
    assert "is a greedy evaluation" in page and "saw-tooth" in page


def test_report_figures_are_readable(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from travorder.study import report

    _hand_store(tmp_path / "h.sqlite")
    row = dataset_frame(tmp_path / "h.sqlite")
    # 20 families: a tall heatmap; ratios from 1 to 6 on the log axis
    data = row.loc[row.index.repeat(20)].reset_index(drop=True)
    data["family"] = [f"family_{i:02d}" for i in range(20)]
    data["time_alpha"] = np.linspace(100, 570, 20)
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figures to inspect
    report._heatmaps(data, tmp_path / "w.png", "a title")
    report._ratio_plot(data, tmp_path / "r.png", "a title")
    monkeypatch.undo()
    heat, ratio = figures
    renderer = heat.canvas.get_renderer()
    title_bottom = heat._suptitle.get_window_extent(renderer).y0
    assert all(ax.get_tightbbox(renderer).y1 <= title_bottom + 1 for ax in heat.axes)
    orders = report.dataset_orders(data)
    for ax in [a for a in heat.axes if a.images]:  # the two heatmaps
        (top,) = ax.child_axes  # the order names repeated above the tall map
        assert [t.get_text() for t in top.get_xticklabels()] == orders
    ratio.canvas.draw()
    labels = [t.get_text() for t in (*ratio.axes[0].get_yticklabels(),
                                     *ratio.axes[0].get_yticklabels(minor=True))]
    assert "2" in labels and "5" in labels
    assert not any("10^" in x or "times" in x for x in labels), labels
    for fig in figures:
        plt.close(fig)


def test_report_includes_the_predictor_evaluation(tmp_path, capsys):
    from travorder.cli import main

    store = tmp_path / "s.sqlite"
    run_study(spec(graphs={**SMALL["graphs"], "synthetic": [
        {"family": fam, "seeds": [0, 1], "params": params}
        for fam, params in [("chain", {"n_layers": 5}), ("rnn", {"timesteps": 3}),
                            ("resnet", {"blocks": [1]})]]}), store, progress=False)
    assert main(["study", "report", str(store), "--out", str(tmp_path / "r"),
                 "--evaluate"]) == 0
    page = (tmp_path / "r" / "index.html").read_text()
    assert "Predictor evaluation (leave-family-out)" in page and "best fixed order" in page
    for method in ("classifier", "regressor", "ranker", "always-topo", "oracle"):
        assert f"<td>{method}</td>" in page
    err = capsys.readouterr().err  # progress, as train's, on stderr
    assert "evaluating the predictor on the greedy rows (6)" in err
    assert "ranker: fold 3/3 (holding out rnn)" in err


def test_ctrl_c_inside_compiled_code_is_an_interrupt_not_a_failed_job(tmp_path,
                                                                      monkeypatch):
    import travorder.study.jobs as jobs

    real, calls = jobs.run_job, []

    def run_job(*args):  # the fifth job (of the second graph) is interrupted in numba's code
        calls.append(1)
        if len(calls) == 5:
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt as exc:
                raise SystemError("returned a result with an exception set") from exc
        return real(*args)

    monkeypatch.setattr(jobs, "run_job", run_job)
    store = tmp_path / "s.sqlite"
    summary = run_study(spec(), store, progress=False)
    assert summary.interrupted and (summary.done, summary.failed) == (4, 0)
    with ResultStore(store) as st:  # once a failed job holding the SystemError
        assert (st.status()["done"], st.status()["failed"]) == (4, 0)
        assert summary.pending == 8 == st.status()["studies"][0]["pending"]
    calls.clear()
    monkeypatch.setattr(jobs, "run_job", lambda *a: 1 / 0)  # a job that fails: not pending
    summary = run_study(spec(), store, progress=False)
    with ResultStore(store) as st:  # as status counts them (the summary once said 8)
        assert (summary.failed, summary.pending, st.status()["studies"][0]["pending"]) == (
            8, 0, 0)


@pytest.mark.slow
def test_ctrl_c_stops_cleanly_and_keeps_what_finished(tmp_path):
    store = tmp_path / "int.sqlite"
    code = ("import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            + _RUNNER)
    proc = subprocess.Popen([sys.executable, "-c", code, str(store)],
                            stdout=subprocess.PIPE, text=True)
    seen: dict[str, tuple] = {}
    deadline = time.monotonic() + 240
    while len(seen) < 20 and time.monotonic() < deadline:
        time.sleep(0.2)
        if store.exists():
            with contextlib.suppress(sqlite3.OperationalError):
                seen = outcomes(store)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "interrupted=True" in out
    kept = outcomes(store)
    assert {k: kept[k] for k in seen} == seen and len(kept) < 792
    with ResultStore(store) as st:
        assert st.integrity_check() == "ok"


def test_a_changed_corpus_is_a_new_plan_and_export_can_keep_only_it(tmp_path):
    store = tmp_path / "s.sqlite"
    run_study(spec(), store, progress=False)
    changed = dict(SMALL["graphs"], synthetic=[{"family": "chain", "seeds": [0],
                                                "params": {"n_layers": 6}}])
    summary = run_study(spec(graphs=changed), store, progress=False)
    assert (summary.total, summary.ran) == (4, 4)
    with ResultStore(store) as st:
        plans = st.status()["studies"]
    assert [(p["name"], p["total"], p["done"]) for p in plans] == [("small", 12, 12),
                                                                     ("small", 4, 4)]
    assert len(dataset_frame(store)) == 4
    latest = dataset_frame(store, study="small")
    assert latest["graph"].tolist() == [spec(graphs=changed).select_graphs()[0].name]
    with pytest.raises(TravorderError, match="no study named 'big'"):
        dataset_frame(store, study="big")


def test_sources_that_ran_other_orders_on_one_graph_add_up(tmp_path):
    data = load_dataset(Path(__file__).parents[1] / "src/travorder/study/data/greedy.parquet")
    data = data[data["construction_ties"] == ""].head(40).reset_index(drop=True)
    orders = dataset_orders(data)
    halves = orders[::2], orders[1::2]
    for name, keep in zip("ab", halves, strict=True):
        part = data.copy()
        for o in set(orders) - set(keep):
            part[[f"time_{o}", f"se_{o}", f"feasible_{o}"]] = np.nan
            part[f"seeds_{o}"] = 0
        part.assign(best_order=keep[0]).to_parquet(tmp_path / f"{name}.parquet")
    merged = read_sources([tmp_path / "a.parquet", tmp_path / "b.parquet"])
    summary = ["best_order", "best_time_us", "ties", "worst_order", "gap_worst",
               "second_order", "gap_second", "second_tied"]
    cols = [f"{k}_{o}" for o in orders for k in ("time", "se", "seeds", "feasible")]
    pd.testing.assert_frame_equal(merged[cols + summary], data[cols + summary],
                                  check_dtype=False)
    # a construction tie is kept between orders taken from the source that found it
    tied = data.head(1).assign(construction_ties=f"{orders[0]}={orders[1]}")
    one = read_sources([tmp_path / "a.parquet"]).head(1).assign(
        construction_ties=f"{orders[0]}={orders[2]}")
    assert deduplicate(pd.concat([tied, one]))["construction_ties"].tolist() == [
        f"{orders[0]}={orders[2]}"]


def test_sources_that_define_one_scenario_name_otherwise_are_refused(tmp_path):
    data = load_dataset(Path(__file__).parents[1] / "src/travorder/study/data/greedy.parquet")
    rows = data[data["scenario"] == "batch=train"].head(3)
    rows.to_parquet(tmp_path / "a.parquet")
    other = json.dumps({**json.loads(rows["scenario_def"].iloc[0]), "micro_batches": 4})
    rows.assign(scenario_def=other, graph_hash="x").to_parquet(tmp_path / "b.parquet")
    with pytest.raises(TravorderError, match=r"scenario 'batch=train' is defined otherwise "
                       r"in '.*b\.parquet' than in '.*a\.parquet' \(micro_batches 1, now 4\)"):
        read_sources([tmp_path / "a.parquet", tmp_path / "b.parquet"])
    assert len(read_sources([tmp_path / "a.parquet", "bundled:greedy-perturbed"])) > 3
