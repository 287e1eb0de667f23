"""Cost perturbation: op and edge noise, the devices' op floor, perturbed study scenarios."""

from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import travorder.study
from tests.strategies import random_dags
from travorder.datasets.synthetic import chain
from travorder.errors import GraphError, TravorderError
from travorder.graph import prepare_graph
from travorder.graph.perturb import lognormal_factors, perturb_costs
from travorder.placement import load_cluster
from travorder.placement.clusters import Cluster, Device, compute_times, save_cluster, work_times
from travorder.study import run_study
from travorder.study.export import bundled_dataset, dataset_frame, unperturbed_twins
from travorder.study.jobs import cluster_hash
from travorder.study.scenarios import Scenario, parse_scenarios
from travorder.study.spec import StudySpec, load_spec

K80 = load_cluster("k80x3")
SEEDS = st.integers(0, 2**31 - 1)
NOISE = st.floats(0.0, 1.0)


# ------------------------------------------------------------------ the graph transform
@settings(max_examples=30, deadline=None)
@given(random_dags(max_nodes=20, with_time=True), SEEDS)
def test_zero_noise_is_the_identity(g, seed):
    assert perturb_costs(g, 0.0, 0.0, seed) is g
    assert perturb_costs(g, 0, 0, seed).graph_hash == g.graph_hash


@settings(max_examples=40, deadline=None)
@given(random_dags(max_nodes=20, with_time=True), NOISE, NOISE, SEEDS)
def test_noise_keeps_structure_and_memory_and_is_deterministic(g, op, edge, seed):
    p = perturb_costs(g, op, edge, seed)
    for field in ("names", "op_types", "src", "dst", "colocation", "is_backward",
                  "output_bytes", "param_bytes"):
        assert getattr(p, field).tolist() == getattr(g, field).tolist()
    assert dict(p.meta) == dict(g.meta)
    for a in (p.flops, p.time_us, p.edge_bytes):
        assert np.all(np.isfinite(a)) and np.all(a >= 0)
    # one factor per op scales its FLOPs and its measured time alike
    assert np.allclose(p.flops / g.flops, p.time_us / g.time_us, rtol=1e-12)
    if op == 0:
        assert p.flops.tolist() == g.flops.tolist()
    if edge == 0:
        assert p.edge_bytes.tolist() == g.edge_bytes.tolist()
    assert perturb_costs(g, op, edge, seed) == p


def test_seed_and_graph_pick_the_noise():
    g = chain(0, n_layers=6)
    a, b = perturb_costs(g, 0.3, 0.3, 0), perturb_costs(g, 0.3, 0.3, 1)
    assert not np.allclose(a.flops, b.flops) and not np.allclose(a.edge_bytes, b.edge_bytes)
    # another graph with the same seed draws its own factors
    h = g.replace(meta={"name": "other"}, names=[f"x{i}" for i in range(g.n_nodes)])
    assert not np.allclose(perturb_costs(h, 0.3, 0.0, 0).flops / h.flops, a.flops / g.flops)


@pytest.mark.parametrize("sigma", [0.2, 0.5])
def test_factors_are_mean_preserving_lognormal(sigma):
    f = lognormal_factors(np.random.default_rng(0), sigma, 400_000)
    assert f.mean() == pytest.approx(1.0, abs=0.005)
    assert np.log(f).std() == pytest.approx(sigma, rel=0.01)
    assert f.std() == pytest.approx(math.sqrt(math.exp(sigma**2) - 1), rel=0.02)


@pytest.mark.parametrize(("args", "message"), [
    ((-0.1, 0.0, 0), r"op_noise must be a number in \[0, 3\], got -0.1"),
    ((0.0, math.inf, 0), "edge_noise must be a number in"),
    ((math.nan, 0.0, 0), "op_noise must be a number in"),
    ((True, 0.0, 0), r"op_noise must be a number in \[0, 3\], got True"),
    ((1e300, 0.0, 0), "op_noise must be a number in"),  # would draw factors of 0
    ((0.0, 3.5, 0), "edge_noise must be a number in"),
    ((0.1, 0.1, -1), "seed must be an integer >= 0, got -1"),
    ((0.1, 0.1, 1.5), "seed must be an integer >= 0"),
])
def test_perturb_bad_input(args, message):
    with pytest.raises(GraphError, match=message):
        perturb_costs(chain(0), *args)


# ------------------------------------------------------------------ the devices' op floor
def _floored(cluster: Cluster, floor: float) -> Cluster:
    return dataclasses.replace(cluster, devices=tuple(
        dataclasses.replace(d, min_op_us=floor) for d in cluster.devices))


@settings(max_examples=30, deadline=None)
@given(random_dags(max_nodes=20), st.floats(0.0, 50.0))
def test_op_floor_raises_only_short_ops_that_do_work(g, floor):
    g = g.replace(flops=np.where(np.arange(g.n_nodes) % 3 == 0, 0.0, g.flops),
                  output_bytes=np.zeros(g.n_nodes), param_bytes=np.zeros(g.n_nodes),
                  edge_bytes=np.zeros(g.n_edges))
    plain, floored = work_times(g, K80), work_times(g, _floored(K80, floor))
    assert np.array_equal(floored, np.where(plain > 0, np.maximum(plain, floor), 0.0))
    gap = K80.devices[0].launch_us
    assert np.array_equal(compute_times(g, _floored(K80, floor)), floored + gap)


def test_op_floor_in_cluster_files_and_hashes(tmp_path):
    # a cluster without a floor keeps its definition (and so every job key)
    assert all("min_op_us" not in d for d in K80.to_dict()["devices"])
    floored = _floored(K80, 5.0)
    assert floored.to_dict()["devices"][0]["min_op_us"] == 5.0
    assert cluster_hash(floored) != cluster_hash(K80) and floored != K80
    path = tmp_path / "c.toml"
    save_cluster(floored, path)
    assert load_cluster(path) == floored
    with pytest.raises(TravorderError, match="min_op_us must be finite and non-negative"):
        Device("d", peak_flops=1e12, mem_bw=1e11, min_op_us=-1.0)


# ------------------------------------------------------------------ perturbed scenarios
def test_perturbation_names_and_definitions():
    s = Scenario(batch="train", micro_batches=4, op_noise=0.2, edge_noise=0.1,
                 latency_us=5, perturb_seed=3)
    assert s.name == "batch=train,mb=4,opnoise=0.2,edgenoise=0.1,lat=5,pseed=3"
    assert Scenario.from_dict(s.to_dict()) == s
    assert s.to_dict() == {**s.to_dict(), "op_noise": 0.2, "latency_us": 5.0}
    assert Scenario(latency_us=5).to_dict() == Scenario(latency_us=5.0).to_dict()
    plain = Scenario(batch="train", perturb_seed=0, op_noise=0.0, latency_us=0)
    assert plain.name == "batch=train" and plain == Scenario(batch="train")
    noisy = Scenario(batch="train", micro_batches=4, op_noise=0.2, edge_noise=0.1,
                     latency_us=5, perturb_seed=3, name="mine")
    assert noisy.unperturbed() == Scenario(batch="train", micro_batches=4)
    assert set(plain.to_dict()) == {"batch", "micro_batches", "memory",
                                    "coarsen_max_nodes", "name"}
    assert [x.name for x in parse_scenarios({"op_noise": [0.0, 0.2]}, "spec")] == [
        "batch=export", "batch=export,opnoise=0.2"]


def test_derived_names_tell_every_setting_apart():
    # ``:g`` keeps six digits: these pairs once shared a name, so one spec could not list
    # both and a store refused the second as a redefinition
    pairs = [({"perturb_seed": 1234567}, {"perturb_seed": 1234568}),
             ({"memory": 0.6}, {"memory": 0.6000001}),
             ({"latency_us": 5.0}, {"latency_us": 5.0000001})]
    for a, b in pairs:
        assert Scenario(**a).name != Scenario(**b).name
    assert len(parse_scenarios({"perturb_seed": [1234567, 1234568]}, "spec")) == 2
    assert Scenario(perturb_seed=2**63 - 1).name == f"batch=export,pseed={2**63 - 1}"
    assert Scenario(memory=0.6000001).name == "batch=export,mem=0.6000001"


def test_bundled_scenarios_keep_their_definitions():
    for which in ("greedy", "rl", "greedy-perturbed", "rl-perturbed"):
        for text in set(bundled_dataset(which)["scenario_def"]):
            s = Scenario.from_dict(json.loads(text))
            assert json.dumps(s.to_dict(), sort_keys=True) == text


@pytest.mark.parametrize(("perturbed", "base"), [("greedy-perturbed", "greedy"),
                                                  ("rl-perturbed", "rl")])
def test_every_bundled_perturbed_row_has_one_unperturbed_twin(perturbed, base):
    rows = bundled_dataset(perturbed)
    twins = unperturbed_twins(rows, bundled_dataset(base))
    assert len(twins) == len(rows) and not set(twins["scenario"]) & set(rows["scenario"])
    for key in ("graph_hash", "cluster", "placer", "coarsen_max_nodes"):
        assert (twins[key].to_numpy() == rows[key].to_numpy()).all()
    assert [Scenario.from_dict(json.loads(d)).unperturbed().to_dict() for d in
            rows["scenario_def"]] == [json.loads(d) for d in twins["scenario_def"]]


def test_a_perturbed_row_without_one_twin_is_an_error():
    rows = bundled_dataset("rl-perturbed")
    base = bundled_dataset("rl")
    lone = base[base["graph"] != rows["graph"].iloc[0]]
    with pytest.raises(TravorderError, match=r"^2 perturbed rows have not exactly one "
                       r"unperturbed twin; the first: albert_base in .* on k80x3 has 0$"):
        unperturbed_twins(rows, lone)
    other = unperturbed_twins(rows.iloc[:1], base).assign(config_hash="another placer")
    with pytest.raises(TravorderError, match=r"has 2$"):
        unperturbed_twins(rows, pd.concat([base, other]))


@pytest.mark.parametrize(("table", "message"), [
    ({"op_noise": -0.2}, r"op_noise must be a number in \[0, 3\], got -0.2"),
    ({"op_noise": 1e300}, r"op_noise must be a number in \[0, 3\], got 1e\+300"),
    ({"edge_noise": "high"}, "edge_noise must be a number in"),
    ({"latency_us": math.inf}, r"latency_us must be a number in \[0, 1e\+06\]"),
    ({"latency_us": 1e307}, "latency_us must be a number in"),  # would overflow a step
    ({"perturb_seed": -1}, r"perturb_seed must be an integer in \[0, 2\*\*63\), got -1"),
    ({"perturb_seed": 1.0}, "perturb_seed must be an integer in"),
    ({"perturb_seed": 2**63}, "perturb_seed must be an integer in"),  # no SQLite integer
])
def test_bad_perturbation_settings(table, message):
    with pytest.raises(TravorderError, match=f"spec: scenarios\\[0\\]: scenario {message}"):
        parse_scenarios([table], "spec")


def test_perturbed_scenario_prepares_noisy_step_and_floored_cluster():
    g = chain(0, n_layers=4)
    plain = Scenario(batch="train").prepare(g, training=True, coarsen_max_nodes=0)
    s = Scenario(batch="train", op_noise=0.2, edge_noise=0.2, latency_us=5.0)
    noisy = s.prepare(g, training=True, coarsen_max_nodes=0)
    assert noisy.names.tolist() == plain.names.tolist()
    assert noisy.graph_hash != plain.graph_hash
    # the noise is drawn per op of the training step, forward and backward alike
    step = prepare_graph(Scenario(batch="train").prepare(g, False, 0))
    assert noisy == perturb_costs(step, 0.2, 0.2, 0)
    assert s.cluster_for(noisy, K80) == _floored(K80, 5.0)
    assert Scenario(latency_us=5.0, memory=0.5).cluster_for(plain, K80).devices[0] \
        .min_op_us == 5.0


def test_perturbed_study_exports_its_scenario(tmp_path):
    spec = StudySpec.from_dict({
        "name": "s", "clusters": ["k80x3"], "orders": ["topo", "critical_path"],
        "placer": {"name": "greedy"},
        "scenarios": [{"batch": "train", "micro_batches": 2, "op_noise": 0.2,
                       "edge_noise": 0.2, "latency_us": 5.0}],
        "graphs": {"synthetic": [{"family": "chain", "seeds": [0],
                                  "params": {"n_layers": 4}}]}})
    store = tmp_path / "s.sqlite"
    run_study(spec, store, progress=False)
    row = dataset_frame(store).iloc[0]
    assert row["scenario"] == "batch=train,mb=2,opnoise=0.2,edgenoise=0.2,lat=5"
    assert json.loads(row["scenario_def"])["op_noise"] == 0.2
    assert row["best_time_us"] > 0 and row["s_micro_batches"] == 2
    # a store whose study records a scenario travorder now refuses names itself
    with sqlite3.connect(store) as db:
        (text,) = db.execute("SELECT spec FROM studies").fetchone()
        doc = json.loads(text)
        doc["scenarios"][0]["op_noise"] = 1e300
        db.execute("UPDATE studies SET spec = ?", (json.dumps(doc),))
    db.close()
    with pytest.raises(TravorderError, match=rf"^store '{store}', study 's': scenario "
                                             r"op_noise must be a number in \[0, 3\]"):
        dataset_frame(store)


def test_bundled_perturbed_spec_is_the_greedy_spec_with_noise():
    specs = Path(travorder.study.__file__).parent / "specs"
    base, spec = load_spec(specs / "greedy.toml"), load_spec(specs / "greedy-perturbed.toml")
    a, b = base.to_dict(), spec.to_dict()
    for key in ("orders", "seeds", "order_seeds", "clusters", "placer", "graphs"):
        assert a[key] == b[key], key
    plain = {s.name: s for s in base.scenarios}
    for s in spec.scenarios:
        assert (s.op_noise, s.edge_noise, s.latency_us) == (0.2, 0.2, 5.0)
        twin = dataclasses.replace(s, name="", op_noise=0.0, edge_noise=0.0, latency_us=0.0)
        assert twin.name in plain and twin == plain[twin.name]
