"""Placers: hand-checked placements, memory, order sensitivity, the placement file."""

from __future__ import annotations

import dataclasses
import json
import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from travorder.errors import FormatError, TravorderError
from travorder.graph import OpGraph, training_graph
from travorder.placement.clusters import Cluster, Device, load_cluster
from travorder.placement.orders import traversal_order
from travorder.placement.placement_file import load_placement, save_placement
from travorder.placement.placers import PLACERS, PlacementResult, place_graph, register_placer
from travorder.placement.placers.baechi import favourite_children
from travorder.placement.placers.heuristics import greedy
from travorder.placement.placers.schedule import DeviceBook
from travorder.placement.simulator import simulate

from .strategies import dags_with_placement, random_dags


def cluster(n: int = 2, memory: float = math.inf, bandwidth: float = 1000.0,
            latency: float = 5.0, link_model: str = "link", flops: tuple = (),
            semantics: str = "travorder") -> Cluster:
    """``n`` devices without launch gap; transfers take ``latency + bytes / bandwidth``."""
    peaks = flops or (1e12,) * n
    return Cluster("test", tuple(Device(f"g{i}", p, 1e12, memory, 0.0)
                                 for i, p in enumerate(peaks)),
                   bandwidth, latency, link_model, semantics=semantics)


# two independent chains a1 -> a2 -> a3 and b1 -> b2 -> b3, 10 us per op, 1 kB per edge
CHAINS = OpGraph(["a1", "a2", "a3", "b1", "b2", "b3"], [0, 1, 3, 4], [1, 2, 4, 5],
                 time_us=[10.0] * 6, edge_bytes=[1000.0] * 4, meta={"name": "chains"})
# r feeds b (0 bytes: 5 us transfer) and a (3 kB: 8 us); b comes first in topo order
FORK = OpGraph(["r", "b", "a"], [0, 0], [1, 2], time_us=[10.0] * 3,
               edge_bytes=[0.0, 3000.0], meta={"name": "fork"})


def test_a_numpy_seed_gives_a_result_that_writes_as_json() -> None:
    r = place_graph(CHAINS, cluster(), placer="random", seed=np.int64(3))
    assert type(r.seed) is int and json.loads(json.dumps(r.to_dict()))["seed"] == 3
    same = place_graph(CHAINS, cluster(), placer="random", seed=3)
    assert r.placement.tolist() == same.placement.tolist()


def test_greedy_puts_independent_chains_apart() -> None:
    r = place_graph(CHAINS, cluster(), placer="greedy", order="topo")
    assert r.placement.tolist() == [0, 0, 0, 1, 1, 1]
    assert (r.step_time_us, r.lower_bound_us, r.efficiency) == (30.0, 30.0, 1.0)
    assert r.feasible and r.placer == "greedy" and r.order == "topo"


def test_greedy_depends_on_the_order() -> None:
    # reversed_topo visits a3, a2, a1, b3, b2, b1: no placed inputs, so each op goes
    # where it finishes first and the chains alternate between the devices
    assert traversal_order(CHAINS, "reversed_topo").tolist() == [2, 1, 0, 5, 4, 3]
    r = place_graph(CHAINS, cluster(), placer="greedy", order="reversed_topo")
    assert r.placement.tolist() == [0, 1, 0, 1, 0, 1]
    # a2 waits for a1's 6 us transfer, a3 for a2's: 10 + 6 + 10 + 6 + 10
    assert r.step_time_us == 42.0
    # topo_lifo visits chain b first, so b takes device 0
    assert place_graph(CHAINS, cluster(), "greedy", "topo_lifo").placement.tolist() == [
        1, 1, 1, 0, 0, 0]


def test_greedy_weighs_transfers() -> None:
    # slow link: the second branch waits on device 0 rather than cross it
    g = OpGraph(["r", "x", "y"], [0, 0], [1, 2], time_us=[10.0] * 3,
                edge_bytes=[20_000.0] * 2)
    assert place_graph(g, cluster(), "greedy").placement.tolist() == [0, 0, 0]
    assert place_graph(g, cluster(bandwidth=1e9, latency=0.0), "greedy").placement.tolist() == [
        0, 0, 1]


def test_contiguous_splits_compute_evenly() -> None:
    chain = OpGraph(list("abcd"), [0, 1, 2], [1, 2, 3], time_us=[3.0, 1.0, 1.0, 3.0])
    assert place_graph(chain, cluster(), "contiguous").placement.tolist() == [0, 0, 1, 1]
    heavy_tail = OpGraph(list("abcd"), [0, 1, 2], [1, 2, 3], time_us=[1.0, 1.0, 1.0, 5.0])
    assert place_graph(heavy_tail, cluster(), "contiguous").placement.tolist() == [0, 0, 0, 1]
    # along the order given: reversed, the heavy node comes first
    assert place_graph(heavy_tail, cluster(), "contiguous", "reversed_topo").placement.tolist() == [
        1, 1, 1, 0]


def test_simple_placers() -> None:
    c = cluster(3)
    g = OpGraph(list("abcde"), [], [], time_us=[1.0] * 5)
    assert place_graph(g, c, "single").placement.tolist() == [0] * 5
    assert place_graph(g, c, "round_robin").placement.tolist() == [0, 1, 2, 0, 1]
    assert place_graph(g, c, "round_robin", "topo_lifo").placement.tolist() == [1, 0, 2, 1, 0]
    r1, r2 = place_graph(g, c, "random", seed=1), place_graph(g, c, "random", seed=1)
    assert r1.placement.tolist() == r2.placement.tolist()
    assert {tuple(place_graph(g, c, "random", seed=s).placement) for s in range(5)} != {
        tuple(r1.placement)}
    # single picks the fastest device of a heterogeneous cluster (FLOP-costed graph)
    flops = OpGraph(["a", "b"], [0], [1], flops=[1e9, 1e9])
    fast = cluster(3, flops=(1e12, 4e12, 2e12))
    assert place_graph(flops, fast, "single").placement.tolist() == [1, 1]


def test_m_etf_starts_each_op_as_early_as_it_can() -> None:
    # at 10 us both children are ready; b (first in topo order) takes device 0 at 10,
    # a would start at 20 there but at 18 on device 1 (5 us latency + 3 us)
    r = place_graph(FORK, cluster(), "m_etf")
    assert r.placement.tolist() == [0, 0, 1]
    assert r.step_time_us == 28.0
    # with a costly transfer, the idle device is not worth it
    slow = OpGraph(["r", "b", "a"], [0, 0], [1, 2], time_us=[10.0] * 3,
                   edge_bytes=[0.0, 30_000.0])
    assert place_graph(slow, cluster(), "m_etf").placement.tolist() == [0, 0, 0]


def test_favourite_children_lp() -> None:
    c = cluster()
    chain = OpGraph(list("abc"), [0, 1], [1, 2], time_us=[10.0] * 3, edge_bytes=[1e3] * 2)
    assert favourite_children(chain, c).tolist() == [1, 2, -1]
    # a's edge (8 us) costs more than b's (5 us): a is r's favourite
    assert favourite_children(FORK, c).tolist() == [2, -1, -1]
    # equal edges: the LP splits 0.5/0.5, the first edge wins
    even = OpGraph(list("rxy"), [0, 0], [1, 2], time_us=[10.0] * 3, edge_bytes=[1e3] * 2)
    assert favourite_children(even, c).tolist() == [1, -1, -1]
    assert favourite_children(OpGraph(["a"], [], []), c).tolist() == [-1]


def test_m_sct_keeps_the_favourite_child_with_its_parent() -> None:
    # device 0 waits for a (r's favourite) instead of running b; b goes to device 1
    r = place_graph(FORK, cluster(), "m_sct")
    assert r.placement.tolist() == [0, 1, 0]
    assert r.step_time_us == 25.0


def test_m_topo_fills_devices_by_memory_share() -> None:
    # 4 ops of 100 B output, no parameters: share = 400 / 2 + 100 = 300 B per device
    g = OpGraph(list("abcd"), [0, 1, 2], [1, 2, 3], time_us=[1.0] * 4,
                output_bytes=[100.0] * 4)
    assert place_graph(g, cluster(), "m_topo").placement.tolist() == [0, 0, 0, 1]


def test_colocation_groups_stay_together() -> None:
    t = training_graph(CHAINS)
    for name in PLACERS:
        p = place_graph(t, cluster(), name, "topo").placement
        fwd, bwd = p[:6], p[6:]
        assert fwd.tolist() == bwd.tolist(), name
    free = place_graph(t, cluster(3), "round_robin", colocate=False).placement
    assert free[:6].tolist() != free[6:].tolist()


# a chain of four 100-byte outputs on devices of 250 bytes: two ops per device at most
TIGHT = OpGraph(list("abcd"), [0, 1, 2], [1, 2, 3], time_us=[10.0] * 4,
                output_bytes=[100.0] * 4, meta={"name": "tight"})


@pytest.mark.parametrize("name", sorted(set(PLACERS) - {"single"}))
def test_placers_respect_memory(name: str) -> None:
    r = place_graph(TIGHT, cluster(memory=250.0), name)
    assert r.feasible, r.placement
    assert np.all(r.peak_memory <= 250.0)
    if name != "rl":  # the list placers fill a device before opening the next
        assert len(set(r.placement.tolist())) == 2


@pytest.mark.parametrize("name", sorted(PLACERS))
def test_infeasible_is_reported(name: str) -> None:
    r = place_graph(TIGHT, cluster(memory=50.0), name)
    assert not r.feasible
    assert r.peak_memory.max() > 50.0
    if name == "single":  # two live tensors at a time: 200 B
        assert place_graph(TIGHT, cluster(memory=200.0), name).feasible
        assert not place_graph(TIGHT, cluster(memory=199.0), name).feasible


@pytest.mark.parametrize("rules", [("link", "travorder"), ("bus", "placeto")])
@settings(max_examples=50, deadline=None)
@given(dags_with_placement(n_devices=3, max_nodes=20), st.integers(0, 2**16))
def test_memory_estimate_bounds_the_simulated_peak(rules: tuple, case: tuple, seed: int
                                                   ) -> None:
    g, p = case
    c = cluster(3, link_model=rules[0], semantics=rules[1])
    book = DeviceBook(g, c, colocate=False)
    for v in np.random.default_rng(seed).permutation(g.n_nodes).tolist():
        book.assign(v, int(p[v]))
    peak = simulate(g, p, c).peak_memory
    assert np.all(peak <= np.array(book.used) * (1 + 1e-9) + 1e-6)


@pytest.mark.parametrize("name", ["greedy", "contiguous", "m_etf", "m_sct"])
def test_placers_count_placetos_one_tensor_size_in_memory(name: str) -> None:
    # a sends 1 kB to b and 0 B to c; under Placeto's rules a copy of a on c is 1 kB,
    # which d1 (1 B) cannot hold: everything fits on d0
    g = OpGraph(["a", "b", "c"], [0, 0], [1, 2], time_us=[1.0] * 3,
                edge_bytes=[1000.0, 0.0])
    c = Cluster("t", (Device("d0", 1e12, 1e11), Device("d1", 1e12, 1e11, memory=1.0)),
                100.0, 0.0, "bus", semantics="placeto")
    r = place_graph(g, c, placer=name, order="topo")
    assert r.feasible and r.placement.tolist() == [0, 0, 0]


@settings(max_examples=25, deadline=None)
@given(random_dags(max_nodes=20, with_time=True), st.sampled_from(["topo", "bfs", "random"]))
def test_every_placer_gives_a_valid_deterministic_placement(g: OpGraph, order: str) -> None:
    c = load_cluster("k80x3")
    for name in PLACERS:
        r = place_graph(g, c, name, order, seed=4)
        assert r.placement.dtype == np.int64 and r.placement.shape == (g.n_nodes,)
        assert r.placement.min(initial=0) >= 0 and r.placement.max(initial=0) < 3
        assert r.step_time_us >= r.lower_bound_us * (1 - 1e-12)
        assert r.placement.tolist() == place_graph(g, c, name, order, seed=4).placement.tolist()


def test_result_to_dict_is_json_ready() -> None:
    r = place_graph(CHAINS, cluster(), "greedy")
    d = r.to_dict()
    assert json.loads(json.dumps(d))["placement"] == [0, 0, 0, 1, 1, 1]
    assert set(d) == {"placement", "step_time_us", "lower_bound_us", "efficiency",
                      "feasible", "peak_memory", "placer", "order", "seed", "wall_s",
                      "learning_curve", "graph_hash", "single_device_us",
                      "single_device_feasible", "speedup", "fallback", "placer_step_time_us",
                      "recommendation"}
    assert d["wall_s"] >= 0 and d["learning_curve"] is None
    assert d["graph_hash"] == CHAINS.graph_hash


def test_registered_placer_with_learning_curve() -> None:
    def toy(graph: OpGraph, cluster: Cluster, order: np.ndarray, seed: int
            ) -> tuple[np.ndarray, list[float]]:
        return np.zeros(graph.n_nodes, dtype=np.int64), [3.0, 2.0]

    register_placer("toy_test", toy)
    try:
        r = place_graph(CHAINS, cluster(), "toy_test")
        assert r.learning_curve == [3.0, 2.0] and r.step_time_us == 60.0
    finally:
        del PLACERS["toy_test"]


def test_bad_input() -> None:
    with pytest.raises(TravorderError, match=r"unknown placer 'best'; valid placers: "
                                             r"contiguous, greedy, m_etf"):
        place_graph(CHAINS, cluster(), "best")
    with pytest.raises(TravorderError, match=r"unknown order 'deep'"):
        place_graph(CHAINS, cluster(), "greedy", "deep")
    with pytest.raises(TravorderError, match=r"placer 'greedy' has no option 'steps' "
                                             r"\(options: colocate\)"):
        place_graph(CHAINS, cluster(), "greedy", steps=3)
    with pytest.raises(TravorderError, match=r"placer 'single' has no option 'colocate' "
                                             r"\(options: none\)"):
        place_graph(CHAINS, cluster(), "single", colocate=True)
    with pytest.raises(TravorderError, match="unknown cluster"):
        place_graph(CHAINS, "k80x99", "greedy")
    with pytest.raises(TravorderError, match="floor must be True or False, not 'no'"):
        place_graph(CHAINS, cluster(), "greedy", floor="no")  # once read as True


@pytest.mark.parametrize("name", sorted(PLACERS))
def test_times_that_overflow_are_one_error_before_any_placer(name) -> None:
    g = OpGraph(["a", "b", "c"], [0, 1], [1, 2], flops=[1e9] * 3, edge_bytes=[1e3] * 2)
    slow = cluster(flops=(1e-300, 1e-300))  # each op 1e309 us: more than a float holds
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # contiguous once warned of nan first
        with pytest.raises(TravorderError, match="add up to more than a float holds"):
            place_graph(g, slow, name)  # m_sct once: scipy's ValueError on an inf bound


def test_m_sct_places_finite_times_beyond_the_lps_range() -> None:
    huge = OpGraph(["r", "b", "a"], [0, 0], [1, 2], time_us=[1e299] * 3,
                   edge_bytes=[0.0, 3000.0])  # FORK with 1e299 us per op
    result = place_graph(huge, cluster(), "m_sct")  # once "LP failed: Model error"
    assert result.step_time_us == pytest.approx(2e299)  # r, then b beside a
    assert favourite_children(huge, cluster()).tolist() == \
        favourite_children(FORK, cluster()).tolist()  # the LP's answer in any unit


@pytest.mark.parametrize("name", ["round_robin", "random", "contiguous", "greedy", "rl"])
def test_a_placer_called_directly_takes_a_permutation_only(name) -> None:
    n = CHAINS.n_nodes
    for order in ([0, 1], [0] * n, [*range(n - 1), -1], np.arange(n) * 1.0):
        with pytest.raises(TravorderError, match="a visiting order is a permutation of"):
            PLACERS[name](CHAINS, cluster(), order, 0)  # once a placement holding -1


def test_a_placement_a_placer_returns_is_checked_as_the_simulator_checks_it() -> None:
    n = CHAINS.n_nodes
    for returned, message in [  # each once cast: 0.7 -> 0, True -> 1, "1" -> 1
            (np.full(n, 0.7), "must hold integer device indices, got float64"),
            (np.ones(n, dtype=bool), "must hold integer device indices, got bool"),
            (np.full(n, "1"), "must hold integer device indices"),
            (np.full(n, 5), "on device 5, but cluster")]:
        register_placer("toy_test", lambda graph, c, order, seed, r=returned: r)
        try:
            with pytest.raises(TravorderError, match=message):
                place_graph(CHAINS, cluster(), "toy_test")
        finally:
            del PLACERS["toy_test"]


def test_greedy_on_an_empty_graph() -> None:
    g = OpGraph([], [], [])
    assert greedy(g, cluster(), np.array([], dtype=np.int64), 0).tolist() == []
    r = place_graph(g, cluster(), "m_sct")
    assert r.placement.tolist() == [] and r.step_time_us == 0.0


# ---------------------------------------------------------------- placement files


def saved(tmp_path, g: OpGraph = CHAINS, c: Cluster | None = None) -> tuple:
    c = c or cluster()
    r = place_graph(g, c, "greedy")
    path = tmp_path / "p.json"
    save_placement(r, g, c, path)
    return r, path


def test_placement_file_round_trip(tmp_path) -> None:
    r, path = saved(tmp_path)
    doc = json.loads(path.read_text())
    assert doc["format"] == "travorder.placement" and doc["format_version"] == 1
    assert doc["graph"] == {"name": "chains", "graph_hash": CHAINS.graph_hash, "n_nodes": 6,
                            "training": False, "batch": None, "micro_batches": 1,
                            "dims": {}}
    assert doc["placement"] == {"a1": 0, "a2": 0, "a3": 0, "b1": 1, "b2": 1, "b3": 1}
    assert doc["devices"] == ["g0", "g1"]
    assert doc["cluster"]["name"] == "test"
    assert doc["cluster"]["devices"][0]["memory"] is None  # unlimited, strict JSON
    assert (doc["step_time_us"], doc["efficiency"], doc["feasible"]) == (30.0, 1.0, True)
    assert (doc["placer"], doc["order"], doc["seed"]) == ("greedy", "topo", 0)
    p, doc2 = load_placement(path, CHAINS, cluster())
    assert p.tolist() == r.placement.tolist() and doc2 == doc
    # node order follows the graph given, whatever the file's order
    shuffled = OpGraph(["b3", "b2", "b1", "a3", "a2", "a1"], [5, 4, 2, 1], [4, 3, 1, 0],
                       time_us=[10.0] * 6, edge_bytes=[1000.0] * 4)
    doc["graph"]["graph_hash"] = shuffled.graph_hash
    path.write_text(json.dumps(doc))
    assert load_placement(path, shuffled)[0].tolist() == [1, 1, 1, 0, 0, 0]
    assert load_placement(path)[0].tolist() == [0, 0, 0, 1, 1, 1]


def test_placement_file_errors(tmp_path) -> None:
    _, path = saved(tmp_path)
    other = OpGraph(["x"], [], [], meta={"name": "other"})
    with pytest.raises(TravorderError, match=rf"^placement is for graph "
                                             rf"{CHAINS.graph_hash[:12]} \(forward only, its "
                                             rf"own batch, 1 micro-batch\), not "
                                             rf"{other.graph_hash[:12]} \('other', forward "
                                             rf"only, its own batch, 1 micro-batch\): "
                                             rf"another model, or its step at another "
                                             rf"batch, micro-batch count or symbolic "
                                             rf"dimensions \(--dim\), or not its training "
                                             rf"step$"):
        load_placement(path, other)
    with pytest.raises(TravorderError, match=rf"^placement file '{path}' is for 2 devices, "
                                             r"cluster 'k80x3' has 3$"):
        load_placement(path, CHAINS, load_cluster("k80x3"))
    with pytest.raises(TravorderError, match="cluster 'k80x3' has 3"):  # a preset's name
        load_placement(path, CHAINS, "k80x3")
    with pytest.raises(TravorderError, match="load_placement takes an OpGraph, not str"):
        load_placement(path, "chains.onnx")
    with pytest.raises(TravorderError, match="save_placement takes a PlacementResult"):
        save_placement(np.zeros(6), CHAINS, cluster(), tmp_path / "bad.json")
    assert not (tmp_path / "bad.json").exists()
    doc = json.loads(path.read_text())

    def write(**changes: object) -> None:
        path.write_text(json.dumps({**doc, **changes}))

    write(placement={**doc["placement"], "a1": 2})
    with pytest.raises(TravorderError, match=r"puts node 'a1' on device 2; valid devices "
                                             r"are 0\.\.1"):
        load_placement(path, CHAINS)
    write(placement={**doc["placement"], "b3": "1"})
    with pytest.raises(TravorderError, match="puts node 'b3' on device '1'"):
        load_placement(path)
    write(placement={k: v for k, v in doc["placement"].items() if k != "a2"})
    with pytest.raises(TravorderError, match="does not place node 'a2'"):
        load_placement(path, CHAINS)
    write(placement={**doc["placement"], "zz": 0})
    with pytest.raises(TravorderError, match="places node 'zz', which graph 'chains' lacks"):
        load_placement(path, CHAINS)
    for key, value, says in (("training", "yes", "true or false"),
                             ("batch", "abc", "null or an integer >= 1"),
                             ("micro_batches", 0, "an integer >= 1"),
                             ("dims", {"batch": 0}, "an object of symbolic dimension names")):
        write(graph={**doc["graph"], key: value})
        with pytest.raises(FormatError, match=rf"^placement file '{path}': graph\.{key} must "
                                              rf"be {says}"):
            load_placement(path)
    for devices in ([], ["d0", 1], "d0"):  # no devices once read as "valid devices 0..-1"
        write(devices=devices)
        with pytest.raises(FormatError, match=rf"^placement file '{path}'"):
            load_placement(path)
    write(devices=["d0"])
    with pytest.raises(TravorderError, match=r"is for 1 device, cluster 'k80x3' has 3$"):
        load_placement(path, CHAINS, "k80x3")
    write(format_version=2)
    with pytest.raises(FormatError, match="format version 2 is not supported"):
        load_placement(path)
    write(format="something.else")
    with pytest.raises(FormatError, match="not a travorder placement file"):
        load_placement(path)
    path.write_text("{not json")
    with pytest.raises(FormatError, match="invalid JSON"):
        load_placement(path)
    with pytest.raises(FormatError, match="no such placement file"):
        load_placement(tmp_path / "missing.json")


def test_save_rejects_a_placement_of_another_graph(tmp_path) -> None:
    r = place_graph(CHAINS, cluster(), "greedy")
    with pytest.raises(TravorderError, match=rf"^the placement is of graph "
                                             rf"{CHAINS.graph_hash[:12]}, not "
                                             rf"{FORK.graph_hash[:12]} \('fork', forward only"):
        save_placement(r, FORK, cluster(), tmp_path / "p.json")
    with pytest.raises(TravorderError, match="the placement has 6 entries, graph 'fork' has 3"):
        save_placement(dataclasses.replace(r, graph_hash=""), FORK, cluster(),
                       tmp_path / "p.json")
    assert not (tmp_path / "p.json").exists()
    with pytest.raises(TravorderError, match="the placement is for 2 devices, cluster 'k80x3' "
                                             "has 3"):
        save_placement(r, CHAINS, "k80x3", tmp_path / "p.json")
    assert not (tmp_path / "p.json").exists()
    save_placement(place_graph(CHAINS, "k80x3", "greedy"), CHAINS, "k80x3",
                   tmp_path / "p.json")  # a preset, by name
    assert load_placement(tmp_path / "p.json", CHAINS, load_cluster("k80x3"))[0].size == 6


def test_placement_result_is_frozen() -> None:
    r = place_graph(FORK, cluster(), "single")
    assert isinstance(r, PlacementResult)
    with pytest.raises(AttributeError):
        r.step_time_us = 1.0  # type: ignore[misc]
