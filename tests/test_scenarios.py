"""Study scenarios: pipelined micro-batches, batch scaling, memory pressure, the
single-device floor and construction ties."""

from __future__ import annotations

import json
import math
import re
import sqlite3

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.strategies import random_dags
from travorder.cli import main
from travorder.datasets.synthetic import chain
from travorder.errors import GraphError, TravorderError
from travorder.graph import OpGraph, save_graph, training_graph
from travorder.graph.batch import scale_batch
from travorder.graph.coarsen import coarsen
from travorder.graph.pipeline import expand_order, micro_batch_graph, pipeline_graph
from travorder.graph.prepare import placed_graph
from travorder.placement import Simulator, load_cluster, place_graph, traversal_order
from travorder.placement.orders import ORDERS, TOPOLOGICAL_ORDERS
from travorder.placement.placers.heuristics import single
from travorder.study import run_study
from travorder.study.export import dataset_frame
from travorder.study.scenarios import Scenario, parse_scenarios, single_device_peak
from travorder.study.spec import StudySpec

K80 = load_cluster("k80x3")


def _train(g: OpGraph) -> OpGraph:
    """``g``'s training step at a batch of 6: up to 6 micro-batches."""
    return training_graph(g.replace(meta={"batch_size": 6}))


# ------------------------------------------------------------------ pipeline graph
@settings(max_examples=40, deadline=None)
@given(random_dags(max_nodes=20), st.integers(0, 2**31 - 1))
def test_one_micro_batch_is_the_training_step(g, seed):
    t = _train(g)
    p = pipeline_graph(t, 1)
    assert p == t
    placements = np.random.default_rng(seed).integers(0, 3, (5, t.n_nodes))
    a, b = Simulator(t, K80), Simulator(p, K80)
    for x in placements:
        ra, rb = a.run(x), b.run(x)
        assert ra.step_time_us == rb.step_time_us
        assert ra.peak_memory.tolist() == rb.peak_memory.tolist()


@settings(max_examples=30, deadline=None)
@given(random_dags(max_nodes=15), st.integers(2, 6))
def test_one_device_grows_with_micro_batches_only_by_launch_gaps(g, m):
    t = _train(g)
    p = pipeline_graph(t, m)
    assert p.n_nodes == m * t.n_nodes
    one = Simulator(t, K80).run(np.zeros(t.n_nodes, dtype=np.int64)).step_time_us
    many = Simulator(p, K80).run(np.zeros(p.n_nodes, dtype=np.int64)).step_time_us
    gap = K80.devices[0].launch_us
    assert many == pytest.approx(one + (m - 1) * t.n_nodes * gap, rel=1e-9)


@settings(max_examples=30, deadline=None)
@given(random_dags(max_nodes=15), st.integers(2, 5))
def test_copies_share_costs_params_and_devices(g, m):
    t = _train(g)
    p = pipeline_graph(t, m)
    n = t.n_nodes
    assert p.flops.sum() == pytest.approx(t.flops.sum())
    assert p.param_bytes.sum() == pytest.approx(t.param_bytes.sum())  # counted once
    assert np.allclose(p.output_bytes.reshape(m, n).sum(axis=0), t.output_bytes)
    for copy in range(m):
        assert (p.colocation[copy * n:(copy + 1) * n] == p.colocation[:n]).all()
    base = micro_batch_graph(p)
    assert base.names.tolist() == t.names.tolist()
    assert np.array_equal(base.src, t.src) and np.array_equal(base.dst, t.dst)
    for placer in ("greedy", "random", "contiguous"):
        r = place_graph(p, K80, placer, "topo_lifo", seed=1)
        per_op = r.placement.reshape(m, n)
        assert (per_op == per_op[0]).all()  # every copy of an op on one device


def test_weight_gradients_accumulate_across_micro_batches():
    t = training_graph(chain(0, n_layers=2))
    p = pipeline_graph(t, 3)
    n = t.n_nodes
    with_params = {int(c) for c in t.colocation[t.param_bytes > 0]}
    acc = [i for i in range(n) if t.is_backward[i] and t.colocation[i] in with_params]
    edges = set(zip(p.src.tolist(), p.dst.tolist(), strict=True))
    for i in acc:
        assert {(i, n + i), (n + i, 2 * n + i)} <= edges
    # the step ends with the last micro-batch's backward pass
    r = Simulator(p, K80).run(np.zeros(p.n_nodes, dtype=np.int64))
    assert int(np.argmax(r.finish_us)) >= 2 * n


def test_orders_of_a_pipelined_graph_keep_copies_together():
    t = training_graph(chain(0, n_layers=3))
    p = pipeline_graph(t, 4)
    for name in ("topo", "alpha", "dfs_preorder", "critical_path"):
        base = traversal_order(t, name)
        assert traversal_order(p, name).tolist() == expand_order(base, t.n_nodes, 4).tolist()


def test_pipeline_bad_input():
    t = training_graph(chain(0, n_layers=2))
    for m in (0, -1, 1.5, True):
        with pytest.raises(GraphError, match="micro-batches must be an integer >= 1"):
            pipeline_graph(t, m)
    with pytest.raises(GraphError, match="already pipelined"):
        pipeline_graph(pipeline_graph(t, 2), 2)
    with pytest.raises(GraphError, match="pipelined forward graph: expand the training"):
        training_graph(pipeline_graph(chain(0, n_layers=2), 2))


def test_a_pipeline_past_the_node_cap_is_refused_before_it_is_built(monkeypatch):
    import travorder.graph.pipeline

    t = training_graph(chain(0, n_layers=2))  # no batch size: any count of samples
    monkeypatch.setattr(travorder.graph.pipeline, "MAX_PIPELINED_NODES", 10 * t.n_nodes)
    assert pipeline_graph(t, 10).n_nodes == 10 * t.n_nodes
    with pytest.raises(GraphError, match=rf"^11 micro-batches of the {t.n_nodes}-node step "
                                         r".* \(give at most 10 micro-batches\)$"):
        pipeline_graph(t, 11)


def test_pipelines_accumulate_whatever_the_colocation_ids():
    g = OpGraph(["a", "b"], [0], [1], flops=[1.0, 1.0], param_bytes=[4.0, 0.0])
    small, huge = (pipeline_graph(training_graph(g.replace(colocation=[c, -1])), 2)
                   for c in (0, 10**12))  # ids index no array
    assert huge.n_edges == small.n_edges == 2 * 4 + 1  # a_grad/mb0 -> a_grad/mb1


@pytest.mark.parametrize("max_nodes", [8, 9, 17])
def test_a_coarsened_or_reordered_pipeline_gets_sound_orders_or_an_error(max_nodes):
    p = pipeline_graph(training_graph(chain(0, n_layers=3)), 2)
    c = coarsen(p, max_nodes).graph  # no longer laid out by micro-batch: a plain graph
    for name in ORDERS:
        order = traversal_order(c, name)
        position = np.empty(c.n_nodes, dtype=np.int64)
        position[order] = np.arange(c.n_nodes)
        assert sorted(order.tolist()) == list(range(c.n_nodes))
        assert name not in TOPOLOGICAL_ORDERS or (position[c.src] < position[c.dst]).all()
    swapped = np.arange(p.n_nodes)
    swapped[[0, 1]] = 1, 0  # micro-batch 0's first two nodes: tags right, stems not
    for permutation in (np.arange(p.n_nodes)[::-1], swapped):
        with pytest.raises(GraphError, match="not laid out as pipeline_graph lays them out"):
            traversal_order(p.permute(permutation), "topo")


# ------------------------------------------------------------------ batch
@settings(max_examples=40, deadline=None)
@given(random_dags(max_nodes=20, with_time=True), st.integers(1, 4), st.integers(1, 512))
def test_batch_scaling_is_exact_and_leaves_parameters(g, exported, batch):
    g = g.replace(meta={"batch_size": exported})
    s = scale_batch(g, batch)
    f = batch / exported
    assert s.meta["batch_size"] == batch
    assert np.array_equal(s.flops, g.flops * f)
    assert np.array_equal(s.output_bytes, g.output_bytes * f)
    assert np.array_equal(s.edge_bytes, g.edge_bytes * f)
    assert np.array_equal(s.time_us, g.time_us * f)
    assert np.array_equal(s.param_bytes, g.param_bytes)


def test_batch_bad_input():
    g = chain(0, n_layers=2)
    for b in (0, -4, 2.5, 2**63):  # 2**63: once a step of 1e22 ms
        with pytest.raises(GraphError, match=r"batch must be an integer from 1 to 2\*\*63 - 1"):
            scale_batch(g, b)
    with pytest.raises(GraphError, match="records no batch_size"):
        scale_batch(OpGraph(["a"], [], []), 8)
    with pytest.raises(GraphError, match=r"is a training step .* scale its forward graph"):
        scale_batch(_train(g), 8)  # its weight gradients would scale with the batch
    step = _train(g)
    assert step.meta["batch_size"] != 8 and scale_batch(step, step.meta["batch_size"]) is step
    for recorded in ("big", [1], -2, True, 0, math.nan):  # refused when the graph is made
        with pytest.raises(GraphError, match=r"meta batch_size must be a positive number "
                                             rf"\(None: not recorded\), got "
                                             rf"{re.escape(repr(recorded))}$"):
            g.replace(meta={"batch_size": recorded})
    numpy = g.replace(meta={"batch_size": np.int64(4)})
    assert type(numpy.meta["batch_size"]) is int and numpy.meta["batch_size"] == 4
    assert scale_batch(numpy, 8) == scale_batch(g.replace(meta={"batch_size": 4}), 8)


def test_more_micro_batches_than_samples_are_refused_before_pipelining(monkeypatch):
    import travorder.graph.prepare

    g = chain(0, n_layers=2)
    g = g.replace(meta={**g.meta, "batch_size": 2})
    for m in (4, np.int64(4), 10**9):  # a huge count is refused at once, not built
        with pytest.raises(GraphError, match=rf"^{m} micro-batches of a batch of 2: a "
                                             rf"micro-batch holds one sample at least"):
            placed_graph(g, True, None, m)
    with pytest.raises(GraphError, match="4 micro-batches of a batch of 3"):
        placed_graph(g, True, 3, 4)
    step = placed_graph(g, True, np.int64(4), np.int64(4))
    assert step.n_nodes == 4 * training_graph(g).n_nodes
    with pytest.raises(GraphError, match=r"^5 micro-batches of a batch of 2"):
        pipeline_graph(training_graph(g), 5)
    with monkeypatch.context() as m:  # refused before the training step is built
        m.setattr(travorder.graph.prepare, "training_graph", None)
        for bad, message in ((8, "8 micro-batches of a batch of 2"),
                             (0, "micro-batches must be an integer >= 1, got 0"),
                             ("4", "micro-batches must be an integer >= 1, got '4'")):
            with pytest.raises(GraphError, match=f"^{message}"):
                placed_graph(g, True, None, bad)
    huge = Scenario(batch="train", micro_batches=10**40)  # the family's batch is 64
    with pytest.raises(GraphError, match=rf"^{10**40} micro-batches of a batch of 64"):
        huge.prepare(g, training=True, coarsen_max_nodes=0)



def test_a_graph_without_batch_size_is_refused_before_the_store_opens(tmp_path, capsys):
    """A scenario that re-costs the batch of a graph that records none fails in the
    runner's preflight, as one line, with nothing written."""
    g = chain(0, n_layers=2).replace(meta={"batch_size": None})
    save_graph(g, tmp_path / "g.json.gz")
    spec = tmp_path / "s.toml"
    spec.write_text('name = "s"\nclusters = ["k80x3"]\norders = ["topo"]\n'
                    '[placer]\nname = "greedy"\n[graphs]\n'
                    'files = [{path = "g.json.gz", family = "chain"}]\n'
                    '[[scenarios]]\nbatch = "train"\n')
    store = tmp_path / "s.sqlite"
    assert main(["study", "run", str(spec), "--store", str(store)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert re.search(r"scenario 'batch=train' on graph '.*': graph '.*' records no "
                     r"batch_size, so it cannot be scaled to batch 64", err), err
    assert not store.exists()
    Scenario(batch="export").check_batch(g)  # as exported: any graph

# ------------------------------------------------------------------ memory and floor
def test_memory_fraction_sets_single_device_feasibility():
    g = training_graph(chain(0, n_layers=6))
    for fraction, fits in ((1.0, True), (0.5, False)):
        c = Scenario(memory=fraction).cluster_for(g, K80)
        assert {d.memory for d in c.devices} == {fraction * single_device_peak(g, K80)}
        r = Simulator(g, c).run(single(g, c, None, 0))
        assert r.feasible is fits


def _loses_to_one_device() -> OpGraph:
    """Two branches joined late with huge outputs: greedy runs them in parallel (the
    inputs are small) and then pays a 3,947 us transfer that one device never pays."""
    return OpGraph(["a", "b", "c", "d"], [0, 0, 1, 2], [1, 2, 3, 3],
                   time_us=[1.0, 40.0, 40.0, 1.0], edge_bytes=[1e3, 1e3, 3e7, 3e7],
                   meta={"name": "fork"})


def test_place_returns_the_floor_when_one_device_is_faster(tmp_path):
    g = _loses_to_one_device()
    own = place_graph(g, K80, "greedy", "topo")
    assert own.speedup < 1 and not own.fallback
    r = place_graph(g, K80, "greedy", "topo", floor=True)
    assert r.fallback and r.placement.tolist() == [0, 0, 0, 0]
    assert r.step_time_us == r.single_device_us == own.single_device_us
    assert r.placer_step_time_us == own.step_time_us > r.step_time_us

    from travorder.graph import save_graph

    path = tmp_path / "fork.json.gz"
    save_graph(g, path)
    out = tmp_path / "p.json"
    assert main(["place", str(path), "--forward-only", "-o", str(out), "--json"]) == 0
    doc = json.loads(out.read_text())
    assert doc["fallback"] is True and set(doc["placement"].values()) == {0}


# ------------------------------------------------------------------ scenarios in a study
def test_scenario_names_and_product():
    assert Scenario().name == "batch=export"
    assert Scenario(batch=32, memory=0.5).name == "batch=32,mem=0.5"
    both = parse_scenarios([{"batch": "train", "micro_batches": 4, "name": "pipe"},
                            {"memory": 0.75}], "spec")
    assert [s.name for s in both] == ["pipe", "batch=export,mem=0.75"]


@pytest.mark.parametrize(("table", "message"), [
    ({"batch": 0}, "batch must be"),
    ({"batch": "huge"}, "batch must be"),
    ({"batch": 2**63}, r"batch must be \"export\", \"train\" or an integer from 1 to 2\*\*63"),
    ({"micro_batches": 0}, "micro_batches must be an integer >= 1"),
    ({"batch": 2, "micro_batches": 4}, "micro_batches 4 exceed its batch 2: a micro-batch"),
    ({"batch": "train", "micro_batches": 10**30},  # the chain's training batch is 64
     rf"s.toml': scenario 'batch=train,mb={10**30}' on graph 'syn_chain_n\d+_s0': "
     rf"{10**30} micro-batches of a batch of 64"),
    ({"memory": 0.0}, r"memory must be a fraction in \(0, 1\]"),
    ({"memory": 1.5}, r"memory must be a fraction in \(0, 1\]"),
    ({"memroy": 0.5}, "unknown scenario key 'memroy'"),
    ({"op_noise": -0.2}, r"op_noise must be a number in \[0, 3\], got -0.2"),
    ({"latency_us": "5us"}, "latency_us must be a number in"),
    ({"coarsen_max_nodes": 10**20}, r"coarsen_max_nodes must be an integer in \[0, 2\*\*63\)"),
    ({"name": ""}, "scenario name must be a non-empty string"),
    ({"name": "  "}, "scenario name must be a non-empty string"),
])
def test_bad_scenarios_are_one_line_and_write_nothing(tmp_path, capsys, table, message):
    lines = "\n".join(f"{k} = {json.dumps(v)}" for k, v in table.items())
    spec = tmp_path / "s.toml"
    spec.write_text('name = "s"\nclusters = ["k80x3"]\norders = ["topo"]\n'
                    '[placer]\nname = "greedy"\n[graphs]\n'
                    'synthetic = [{family = "chain"}]\n[[scenarios]]\n' + lines + "\n")
    store = tmp_path / "s.sqlite"
    assert main(["study", "run", str(spec), "--store", str(store)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert re.search(message, err)
    assert not store.exists()


def _spec(**scenario) -> StudySpec:
    return StudySpec.from_dict({
        "name": "s", "clusters": ["k80x3"], "orders": ["reversed_topo", "dfs_postorder",
                                                       "topo"],
        "placer": {"name": "greedy"}, "scenarios": [scenario],
        "graphs": {"synthetic": [{"family": "chain", "seeds": [0],
                                  "params": {"n_layers": 4}}]}})


def test_study_records_scenarios_floor_and_construction_ties(tmp_path):
    store = tmp_path / "s.sqlite"
    run_study(_spec(batch="train", micro_batches=2), store, progress=False)
    row = dataset_frame(store).iloc[0]
    assert row["scenario"] == "batch=train,mb=2" and row["s_micro_batches"] == 2
    assert row["s_log_batch"] == pytest.approx(np.log10(64))
    assert row["single_device_feasible"] and row["speedup"] > 0
    # on a chain, reversed_topo and dfs_postorder visit the same sequence
    assert "reversed_topo=dfs_postorder" in row["construction_ties"].split(";")
    group = {"reversed_topo", "dfs_postorder"}
    if row["best_order"] in group:
        assert row["second_order"] == "topo" and set(row["ties"].split(",")) >= group
    with sqlite3.connect(store) as db:
        scenarios = {r[0] for r in db.execute("SELECT scenario FROM jobs")}
    assert scenarios == {"batch=train,mb=2"}


def test_infeasible_scenario_is_reported_not_dropped(tmp_path):
    store = tmp_path / "s.sqlite"
    run_study(_spec(memory=0.01), store, progress=False)
    data = dataset_frame(store)
    assert len(data) == 1
    row = data.iloc[0]
    assert not row["single_device_feasible"] and np.isnan(row["speedup"])
    assert row["feasible_topo"] == 0.0 and row["s_memory_pressure"] == pytest.approx(100)


def test_scenario_errors_name_the_spec():
    with pytest.raises(TravorderError, match="two scenarios are named 'batch=export'"):
        parse_scenarios([{}, {"batch": "export"}], "spec")
    with pytest.raises(TravorderError, match="empty list"):
        parse_scenarios([], "spec")


# ------------------------------------------------------------------ recommend-order
def test_recommend_order_places_the_users_batch_and_pipeline(tmp_path, capsys):
    import onnx

    from travorder.cli import recommend_main
    from travorder.datasets.onnx_examples import residual_cnn
    from travorder.graph import load_graph

    model = tmp_path / "m.onnx"
    onnx.save(residual_cnn(), model)
    step = training_graph(load_graph(model))
    out = tmp_path / "p.json"
    assert recommend_main([str(model), "--batch", "8", "--micro-batches", "2", "--json",
                           "--place", str(out)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["n_nodes"] == 2 * step.n_nodes
    written = json.loads(out.read_text())
    assert written["graph"]["n_nodes"] == 2 * step.n_nodes
    assert written["step_time_us"] <= written["single_device_us"] or \
        not written["single_device_feasible"]


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--batch", "0", "batch must be"), ("--batch", "-8", "batch must be"),
    ("--micro-batches", "0", "micro-batches must be an integer >= 1")])
def test_recommend_order_bad_batch_is_one_line(tmp_path, capsys, flag, value, message):
    import onnx

    from travorder.cli import recommend_main
    from travorder.datasets.onnx_examples import residual_cnn

    model = tmp_path / "m.onnx"
    onnx.save(residual_cnn(), model)
    out = tmp_path / "p.json"
    assert recommend_main([str(model), flag, value, "--place", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err and not out.exists()


@settings(max_examples=60, deadline=None)
@given(random_dags(max_nodes=25), st.sampled_from(["k80x3", "v100x4-nvlink", "pcie4x4"]),
       st.integers(1, 3))
def test_single_device_peak_without_the_compiled_simulator_agrees(g, name, m):
    t, c = pipeline_graph(_train(g), m), load_cluster(name)
    assert single_device_peak(t, c, compiled=False) == pytest.approx(
        single_device_peak(t, c), rel=1e-12)
