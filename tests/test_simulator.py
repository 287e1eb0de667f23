"""The training-step simulator: hand-checked schedules, memory, properties, bad input."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from travorder.errors import TravorderError
from travorder.graph import OpGraph
from travorder.placement import (
    Cluster,
    Device,
    Simulator,
    compute_times,
    load_cluster,
    lower_bound,
    simulate,
    tie_rank,
)
from travorder.placement.reference import reference_timeline

from .strategies import dags_with_placement


def cluster(model: str, n: int = 3, *, bw: float = 100.0, lat: float = 0.0,
            busy: float = 0.0, gap: float = 0.0, memory: float = math.inf,
            copies: float = 3.0, semantics: str = "travorder") -> Cluster:
    """``n`` identical devices; measured op times are used as they are (plus ``gap``)."""
    devices = tuple(Device(f"d{i}", 1e12, 1e11, memory, gap) for i in range(n))
    return Cluster(f"test-{model}", devices, bw, lat, model, busy, copies,
                   semantics=semantics)


def graph(times: dict[str, float], edges=(), out_bytes=None, params=None) -> OpGraph:
    """Ops with measured times; edges ``(src, dst, bytes)``."""
    out_bytes, params = out_bytes or {}, params or {}
    return OpGraph.from_records(
        [{"name": k, "time_us": t, "output_bytes": out_bytes.get(k, 0.0),
          "param_bytes": params.get(k, 0.0)} for k, t in times.items()],
        edges, name="hand")


def run(g: OpGraph, placement: dict[str, int], c: Cluster):
    """Simulate with both implementations, check they agree exactly (transfers too),
    return the result."""
    p = [placement[name] for name in g.names.tolist()]
    fast = Simulator(g, c).timeline(p)
    ref = reference_timeline(g, p, c)
    assert fast.result == ref.result == simulate(g, p, c)
    assert fast.transfers == ref.transfers
    return fast.result


def starts(r, g: OpGraph) -> dict[str, float]:
    return dict(zip(g.names.tolist(), r.start_us.tolist(), strict=True))


# ------------------------------------------------------------------ hand-checked schedules


def test_chain_on_one_device_adds_the_launch_gap():
    g = graph({"a": 10, "b": 20, "c": 30}, [("a", "b", 1e3), ("b", "c", 1e3)])
    r = run(g, {"a": 0, "b": 0, "c": 0}, cluster("bus", gap=5.0))
    assert r.step_time_us == 75.0
    assert starts(r, g) == {"a": 0, "b": 15, "c": 40}
    assert r.busy_us.tolist() == [75.0, 0.0, 0.0]
    assert (r.n_transfers, r.bytes_moved) == (0, 0.0)
    assert r.lower_bound_us == 75.0 and r.efficiency == 1.0


@pytest.mark.parametrize("model", ["bus", "channel", "link"])
def test_chain_across_devices_pays_latency_plus_bytes_over_bandwidth(model):
    g = graph({"a": 10, "b": 20}, [("a", "b", 1e3)])
    r = run(g, {"a": 0, "b": 1}, cluster(model, lat=2.0))
    assert starts(r, g) == {"a": 0, "b": 22}  # transfer 10 -> 10 + 2 + 1000 / 100
    assert r.step_time_us == 42.0
    assert (r.n_transfers, r.bytes_moved) == (1, 1e3)
    assert r.lower_bound_us == 30.0 and r.efficiency == 30 / 42


@pytest.mark.parametrize(("model", "busy", "c_start", "step"), [
    ("bus", 25.0, 55.0, 75.0),  # one outgoing bus: 10-20, busy to 45, then 45-55
    ("channel", 0.0, 30.0, 50.0),  # the sender's channel: 10-20, then 20-30
    ("link", 0.0, 20.0, 40.0),  # one link per pair: both 10-20
])
def test_fork_two_sends_from_one_device(model, busy, c_start, step):
    g = graph({"a": 10, "b": 20, "c": 20}, [("a", "b", 1e3), ("a", "c", 1e3)])
    r = run(g, {"a": 0, "b": 1, "c": 2}, cluster(model, busy=busy))
    assert starts(r, g) == {"a": 0, "b": 20, "c": c_start}
    assert r.step_time_us == step


@pytest.mark.parametrize(("model", "c_start"), [
    ("bus", 25.0), ("link", 25.0),  # b's transfer 15-25 runs alongside a's 10-20
    ("channel", 30.0),  # both arrive through c's channel: b's waits until 20
])
def test_join_from_two_devices(model, c_start):
    g = graph({"a": 10, "b": 15, "c": 5}, [("a", "c", 1e3), ("b", "c", 1e3)])
    r = run(g, {"a": 0, "b": 1, "c": 2}, cluster(model))
    assert starts(r, g)["c"] == c_start
    assert r.step_time_us == c_start + 5


@pytest.mark.parametrize(("model", "w_start"), [("channel", 30.0), ("link", 22.0)])
def test_channel_send_waits_for_a_receive_on_the_same_device(model, w_start):
    # x on d0 sends to y on d1 (10-20); z on d1 finishes at 12 and sends to w on d2:
    # with channels d1's channel is busy receiving until 20.
    g = graph({"x": 10, "y": 5, "z": 12, "w": 5}, [("x", "y", 1e3), ("z", "w", 1e3)])
    r = run(g, {"x": 0, "y": 1, "z": 1, "w": 2}, cluster(model))
    assert starts(r, g) == {"x": 0, "z": 0, "y": 20, "w": w_start}


def test_tensor_consumed_twice_on_a_device_is_sent_once():
    g = graph({"a": 10, "b": 5, "c": 5}, [("a", "b", 1e3), ("a", "c", 500.0)],
              out_bytes={"a": 1e3})
    r = run(g, {"a": 0, "b": 1, "c": 1}, cluster("bus"))
    assert (r.n_transfers, r.bytes_moved) == (1, 1e3)  # the larger edge, once
    assert starts(r, g) == {"a": 0, "b": 20, "c": 25}  # equal ready times: by name
    assert r.peak_memory.tolist() == [1e3, 1e3, 0.0]
    r2 = run(g, {"a": 0, "b": 1, "c": 2}, cluster("bus"))
    assert (r2.n_transfers, r2.bytes_moved) == (2, 1.5e3)


def test_ties_are_broken_by_name_not_by_node_index():
    g = graph({"zeta": 10, "alpha": 20})
    r = run(g, {"zeta": 0, "alpha": 0}, cluster("link"))
    assert starts(r, g) == {"alpha": 0, "zeta": 20}


def test_ties_prefer_the_lower_level():
    # "b" (level 1) and "a2" (level 2) are both ready at 10 on d0: "b" goes first although
    # "a2" sorts first by name.
    g = graph({"a": 10, "a1": 0, "a1b": 0, "a2": 5, "b": 5},
              [("a", "b", 0.0), ("a1", "a1b", 0.0), ("a1b", "a2", 0.0), ("a", "a2", 0.0)])
    r = run(g, {"a": 0, "a1": 1, "a1b": 1, "a2": 0, "b": 0}, cluster("link", bw=math.inf))
    assert starts(r, g) == {"a": 0, "a1": 0, "a1b": 0, "b": 10, "a2": 15}


def test_list_scheduling_anomaly_faster_links_can_slow_a_step():
    # Greedy FIFO list scheduling is not monotone (Graham's anomalies): with instant
    # transfers A arrives on d0 first and delays B, the head of the long chain B -> C.
    g = graph({"P": 1, "Q": 2, "A": 100, "B": 1, "C": 1000},
              [("P", "A", 0.0), ("Q", "B", 0.0), ("B", "C", 0.0)])
    place = {"P": 1, "Q": 0, "A": 0, "B": 0, "C": 1}
    slow = run(g, place, cluster("link", 2, lat=5.0))
    assert starts(slow, g) == {"P": 0, "Q": 0, "B": 2, "A": 6, "C": 8}
    instant = run(g, place, cluster("link", 2, bw=math.inf))
    assert starts(instant, g) == {"P": 0, "Q": 0, "A": 2, "B": 102, "C": 103}
    assert (slow.step_time_us, instant.step_time_us) == (1008.0, 1103.0)


# ------------------------------------------------------------------ placeto semantics
# Each rule of Placeto's simulator by hand, under both semantics. Bus of 100 B/us: 1000 B
# take 10 us.

PLACETO = "placeto"


def bus(semantics: str, *, gap: float = 0.0, busy: float = 25.0) -> Cluster:
    return cluster("bus", gap=gap, busy=busy, semantics=semantics)


@pytest.mark.parametrize(("semantics", "c_start", "step", "n_transfers", "moved"), [
    # one transfer per destination device, each carrying its largest edge:
    # d0's bus sends a->b 10-20 (1000 B), is busy until 45, sends a->c 45-50 (500 B);
    # b runs 20-40, c 50-70
    ("travorder", 50.0, 70.0, 2, 1500.0),
    # one transfer per output tensor, of one size (the largest edge, 1000 B): 10-20, to
    # d1 and d2 at once; b and c both run 20-40; the bus is busy until 20 + 25 = 45,
    # and that counts in the step
    (PLACETO, 20.0, 45.0, 1, 1000.0),
])
def test_a_tensor_consumed_on_two_remote_devices(semantics, c_start, step, n_transfers,
                                                 moved):
    g = graph({"a": 10, "b": 20, "c": 20}, [("a", "b", 1e3), ("a", "c", 500.0)])
    r = run(g, {"a": 0, "b": 1, "c": 2}, bus(semantics))
    assert starts(r, g) == {"a": 0, "b": 20, "c": c_start}
    assert (r.step_time_us, r.n_transfers, r.bytes_moved) == (step, n_transfers, moved)


@pytest.mark.parametrize(("semantics", "z_start", "b_start", "step", "busy"), [
    # every op pays the 5 us gap: a 0-15, z 15-20 (0 + 5), b 20-45
    ("travorder", 15.0, 20.0, 45.0, 45.0),
    # the gap delays the device, and there is none after an op of time 0: a 0-10, the
    # device free at 15; z 15-15, free at 15; b 15-35, free at 40 = the step
    (PLACETO, 15.0, 15.0, 40.0, 40.0),
])
def test_a_chain_with_a_zero_cost_op(semantics, z_start, b_start, step, busy):
    g = graph({"a": 10, "z": 0, "b": 20}, [("a", "z", 0.0), ("z", "b", 0.0)])
    r = run(g, {"a": 0, "z": 0, "b": 0}, bus(semantics, gap=5.0))
    assert starts(r, g) == {"a": 0, "z": z_start, "b": b_start}
    assert r.step_time_us == step and r.busy_us[0] == busy


@pytest.mark.parametrize(("semantics", "b_start", "step"), [
    # the gap is part of a's time: a 0-15, the empty transfer 15-15, b 15-40
    ("travorder", 15.0, 40.0),
    # the gap delays the device, not the output: a 0-10, transfer 10-10, b 10-30; d1 is
    # free at 30 + 5 = 35 = the step
    (PLACETO, 10.0, 35.0),
])
def test_the_gap_delays_the_device_not_the_output(semantics, b_start, step):
    g = graph({"a": 10, "b": 20}, [("a", "b", 0.0)])
    r = run(g, {"a": 0, "b": 1}, bus(semantics, gap=5.0, busy=0.0))
    assert starts(r, g) == {"a": 0, "b": b_start}
    assert r.step_time_us == step


@pytest.mark.parametrize(("semantics", "step"), [
    ("travorder", 25.0),  # a 0-10, transfer 10-20, b 20-25: the step ends with b
    (PLACETO, 45.0),  # the bus stays busy until 20 + 25 = 45, and Placeto counts it
])
def test_the_trailing_bus_time(semantics, step):
    g = graph({"a": 10, "b": 5}, [("a", "b", 1e3)])
    r = run(g, {"a": 0, "b": 1}, bus(semantics))
    assert starts(r, g) == {"a": 0, "b": 20}
    assert r.step_time_us == step


@pytest.mark.parametrize(("semantics", "first"), [
    ("travorder", "alpha"),  # tie rank: level, then name
    (PLACETO, "zeta"),  # Placeto's insertion order: sources in the graph's node order
])
def test_ties_between_two_sources(semantics, first):
    g = graph({"zeta": 10, "alpha": 20})
    r = run(g, {"zeta": 0, "alpha": 0}, bus(semantics))
    assert starts(r, g)[first] == 0.0


@pytest.mark.parametrize(("semantics", "z_start", "c_start"), [
    ("travorder", 25.0, 20.0),  # c and z are both ready at 20: tie rank, c < z by name
    # Placeto queues ops in the order their inputs arrive, and arrivals at one time in
    # the order (producer name, consumer name): (a, z) before (b, c)
    (PLACETO, 20.0, 25.0),
])
def test_ops_ready_at_one_time(semantics, z_start, c_start):
    # a (d2) -> z and b (d0) -> c, on d1; both tensors take 10-20 on their own bus
    g = graph({"b": 10, "a": 10, "c": 5, "z": 5}, [("a", "z", 1e3), ("b", "c", 1e3)])
    r = run(g, {"a": 2, "b": 0, "c": 1, "z": 1}, bus(semantics))
    assert starts(r, g) == {"a": 0, "b": 0, "c": c_start, "z": z_start}


def test_placeto_lower_bound_counts_the_gap_of_the_last_op_only():
    g = graph({"a": 10, "b": 20}, [("a", "b", 0.0)])
    c = bus(PLACETO, gap=5.0)
    assert lower_bound(g, c) == 35.0  # a's 10, then b's 20 + 5
    assert lower_bound(g, bus("travorder", gap=5.0)) == 40.0
    # a 0-10, the empty transfer 10-10 (the bus busy until 35), b 10-30, d1 free at 35
    assert run(g, {"a": 0, "b": 1}, c).step_time_us == 35.0


# ------------------------------------------------------------------ memory


@pytest.mark.parametrize(("copies", "peak"), [(3.0, 530.0), (1.0, 510.0)])
def test_memory_on_one_device_frees_before_it_allocates(copies, peak):
    # params 10 x copies; a (100) until b ends, b (200) until c ends, c (300): when b
    # ends, a is freed before c starts, so the peak is params + 200 + 300.
    g = graph({"a": 1, "b": 1, "c": 1}, [("a", "b", 100.0), ("b", "c", 200.0)],
              out_bytes={"a": 100, "b": 200, "c": 300}, params={"a": 10})
    r = run(g, {"a": 0, "b": 0, "c": 0}, cluster("link", copies=copies))
    assert r.peak_memory.tolist() == [peak, 0.0, 0.0]


def test_memory_of_a_received_copy_and_feasibility():
    g = graph({"a": 10, "b": 10}, [("a", "b", 1e3)], out_bytes={"a": 1e3, "b": 50.0},
              params={"a": 7.0})
    r = run(g, {"a": 0, "b": 1}, cluster("link", 2, memory=1050.0, copies=1.0))
    # d0: a's params and its output until b finishes; d1: the copy and b's output
    assert r.peak_memory.tolist() == [1007.0, 1050.0]
    assert r.feasible
    r = run(g, {"a": 0, "b": 1}, cluster("link", 2, memory=1049.0, copies=1.0))
    assert not r.feasible


def test_a_sent_output_stays_live_after_its_op_finishes():
    # a (d0) -> b (d1, runs 20-30); c on d0 starts at 10: a's 1000 B still live with c's.
    g = graph({"a": 10, "b": 10, "c": 30}, [("a", "b", 1e3)],
              out_bytes={"a": 1e3, "c": 500.0})
    r = run(g, {"a": 0, "b": 1, "c": 0}, cluster("link", 2))
    assert r.peak_memory[0] == 1500.0


# ------------------------------------------------------------------ simulator object


def test_simulator_reuses_its_precomputation_and_batches():
    g = graph({"a": 10, "b": 20, "c": 30}, [("a", "b", 1e3), ("a", "c", 100.0)],
              out_bytes={"a": 1e3, "c": 600.0})
    c = cluster("bus", memory=1500.0)
    sim = Simulator(g, c)
    places = np.array([[0, 0, 0], [0, 1, 2], [0, 1, 1]])
    batch = sim.run_batch(places)
    # [0, 1, 1]: one transfer (1000 B) feeds b and c on d1; there 1000 + 600 B > 1500
    assert batch.step_time_us.tolist() == [sim.step_time(p) for p in places] \
        == [60.0, 51.0, 70.0]
    assert batch.feasible.tolist() == [sim.run(p).feasible for p in places] \
        == [False, True, False]
    expected = [max((sim.run(p).peak_memory - 1500.0) / 1500.0) for p in places]
    assert batch.overflow.tolist() == pytest.approx(expected)
    assert (batch.overflow > 0).tolist() == (~batch.feasible).tolist()
    assert Simulator(g, cluster("bus")).run_batch(places).overflow.tolist() == [0.0] * 3
    assert sim.lower_bound_us == lower_bound(g, c) == 40.0


def test_lower_bound_is_total_work_over_devices_or_critical_path():
    g = graph({"a": 10, "b": 20, "c": 30, "d": 40})
    assert lower_bound(g, cluster("link", 2)) == 50.0  # 100 / 2
    g = graph({"a": 10, "b": 20, "c": 30}, [("a", "b", 0), ("b", "c", 0)])
    assert lower_bound(g, cluster("link", 3)) == 60.0  # the chain


def test_tie_rank_ignores_numbering():
    g = graph({"b": 1, "a": 1, "c": 1}, [("c", "b", 0.0)])
    assert tie_rank(g).tolist() == [2, 0, 1]  # levels: b 1, a 0, c 0


# ------------------------------------------------------------------ properties


@st.composite
def pipelines(draw, n_devices: int = 3, max_nodes: int = 20):
    """A DAG in which the ops of each device form a chain, and that placement."""
    n = draw(st.integers(1, max_nodes))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    device = rng.integers(0, n_devices, n)
    edges = {(i, j) for i, j in zip(*np.triu_indices(n, 1), strict=True)
             if rng.random() < 0.15}
    for d in range(n_devices):
        ops = np.flatnonzero(device == d).tolist()
        edges |= set(itertools.pairwise(ops))
    src, dst = np.array(sorted(edges), dtype=np.int64).reshape(-1, 2).T
    g = OpGraph([f"op{i}" for i in range(n)], src, dst, time_us=rng.uniform(1, 100, n),
                edge_bytes=rng.integers(0, 1 << 16, src.size).astype(float))
    return g, device


def _with_devices(c: Cluster, n: int) -> Cluster:
    return dataclasses.replace(c, devices=c.devices[:n], bandwidth=c.bandwidth[:n, :n],
                               latency=c.latency[:n, :n])


@pytest.mark.parametrize(("preset", "with_time"), [
    ("k80x3", True), ("pcie4x4", False), ("v100x4-nvlink", True), ("baechi-4", False),
    ("k80x3-placeto", True), ("k80x3-placeto", False)])
def test_fast_and_reference_agree_exactly(preset, with_time):
    c = load_cluster(preset)

    @settings(max_examples=40, deadline=None)
    @given(dags_with_placement(n_devices=c.n_devices, max_nodes=25, with_time=with_time))
    def check(case):
        g, p = case
        sim = Simulator(g, c)
        fast, ref = sim.timeline(p), reference_timeline(g, p, c)
        assert fast.result == ref.result == sim.run(p)
        assert fast.transfers == ref.transfers
        assert sim.run_batch(p[None]).step_time_us.tolist() == [fast.result.step_time_us]
        r = fast.result
        assert r.step_time_us >= r.lower_bound_us * (1 - 1e-12)  # rounding only
        assert 0 < r.efficiency <= 1 + 1e-12
        assert r.n_transfers == len(fast.transfers)
        assert r.bytes_moved == pytest.approx(sum(t.bytes for t in fast.transfers))

    check()


@settings(max_examples=60, deadline=None)
@given(dags_with_placement(n_devices=3, max_nodes=25, with_time=True),
       st.sampled_from(["k80x3", "baechi-4", "v100x4-nvlink"]))
def test_numbering_does_not_change_the_step(case, preset):
    g, p = case
    c = _with_devices(load_cluster(preset), 3)
    perm = np.random.default_rng(g.n_nodes).permutation(g.n_nodes)
    r, r2 = simulate(g, p, c), simulate(g.permute(perm), p[perm], c)
    assert r2.step_time_us == r.step_time_us
    assert r2.start_us.tolist() == r.start_us[perm].tolist()
    assert r2.peak_memory.tolist() == r.peak_memory.tolist()


@settings(max_examples=60, deadline=None)
@given(dags_with_placement(n_devices=3, max_nodes=25, with_time=True),
       st.sampled_from(["k80x3", "baechi-4", "v100x4-nvlink"]))
def test_times_alone_give_the_same_step(case, preset):
    """The core without memory tracking (what RL runs where every placement fits) has
    the full simulation's times; its peaks are the parameters' bytes."""
    from travorder.placement.simulator import _param_memory, _places, _run, _workspace

    g, p = case
    c = _with_devices(load_cluster(preset), 3)
    sim = Simulator(g, c)
    full = sim.run(p)
    node_at = sim._args[1]
    ws = _workspace(g.n_nodes, g.n_edges, 3, False)
    step, start, _, _, peak, moved, n_transfers = _run(ws, p, False, False, *sim._args)
    assert step == full.step_time_us and moved == full.bytes_moved
    assert n_transfers == full.n_transfers
    assert start[sim._rank].tolist() == full.start_us.tolist()
    pl = np.empty(g.n_nodes, dtype=np.uint32)
    _places(p, node_at, 3, pl)
    assert peak.tolist() == _param_memory(pl, sim._args[8], 3).tolist()


@settings(max_examples=120, deadline=None)
@given(dags_with_placement(n_devices=3, max_nodes=25),
       st.sampled_from([("bus", "travorder"), ("channel", "travorder"), ("link", "travorder"),
                        ("bus", PLACETO)]),
       st.integers(0, 2**32 - 1))
def test_many_ties_and_zero_durations(case, model_semantics, seed):
    """Times of 0-3 us, gaps of 0 or 1 us and round transfer times make ties everywhere:
    the two simulators still agree and, under travorder's semantics, the numbering still
    does not matter."""
    g, p = case
    model, semantics = model_semantics
    rng = np.random.default_rng(seed)
    g = g.replace(time_us=rng.integers(0, 4, g.n_nodes).astype(float),
                  edge_bytes=rng.integers(0, 3, g.n_edges) * 100.0)
    c = cluster(model, busy=float(rng.integers(0, 3)), lat=float(rng.integers(0, 2)),
                gap=float(rng.integers(0, 2)), semantics=semantics)
    sim = Simulator(g, c)
    r, ref = sim.timeline(p), reference_timeline(g, p, c)
    assert r.result == ref.result and r.transfers == ref.transfers
    r = r.result
    if semantics == PLACETO:
        return  # Placeto's ties follow the node order
    perm = rng.permutation(g.n_nodes)
    r2 = simulate(g.permute(perm), p[perm], c)
    assert r2.step_time_us == r.step_time_us >= r.lower_bound_us
    assert r2.start_us.tolist() == r.start_us[perm].tolist()
    assert r2.peak_memory.tolist() == r.peak_memory.tolist()


@settings(max_examples=50, deadline=None)
@given(dags_with_placement(n_devices=3, max_nodes=25), st.integers(0, 2),
       st.sampled_from(["k80x3", "k80x3-placeto"]))
def test_all_on_one_device_is_the_sum_of_compute_times(case, device, preset):
    g, _ = case
    c = load_cluster(preset)
    r = simulate(g, np.full(g.n_nodes, device), c)
    assert r.step_time_us == pytest.approx(math.fsum(compute_times(g, c)[:, device]),
                                           rel=1e-12)
    assert r.n_transfers == 0


@settings(max_examples=60, deadline=None)
@given(pipelines(), st.sampled_from(["k80x3", "baechi-4", "v100x4-nvlink"]))
def test_instant_links_never_slower_when_devices_have_no_choice(case, preset):
    # With no choice of the next op on any device, the step is a longest path and can only
    # shrink with faster links; in general it can grow (see the anomaly test above).
    g, p = case
    c = _with_devices(load_cluster(preset), 3)
    instant = dataclasses.replace(c, bandwidth=math.inf, latency=0.0, busy_after_us=0.0)
    assert simulate(g, p, instant).step_time_us <= simulate(g, p, c).step_time_us


@settings(max_examples=60, deadline=None)
@given(dags_with_placement(n_devices=3, max_nodes=25, with_time=True))
def test_devices_follow_fifo_list_scheduling(case):
    """Checked from the result alone: with instant transfers an op is ready when its last
    predecessor finishes; each device then starts, whenever it is free, the ready op with
    the earliest ready time (ties by tie rank), and never idles while one is ready."""
    g, p = case
    c = load_cluster("k80x3")
    r = simulate(g, p, dataclasses.replace(c, bandwidth=math.inf, busy_after_us=0.0))
    rank = tie_rank(g)
    ready = [max((r.finish_us[u] for u in g.predecessors(v)), default=0.0)
             for v in range(g.n_nodes)]
    for d in range(c.n_devices):
        left = set(np.flatnonzero(p == d).tolist())
        free = 0.0
        for v in sorted(left, key=lambda v: (r.start_us[v], rank[v])):
            t = max(free, min(ready[u] for u in left))
            assert r.start_us[v] == t
            assert v == min((u for u in left if ready[u] <= t), key=lambda u: (ready[u], rank[u]))
            free = r.finish_us[v]
            left.remove(v)


# ------------------------------------------------------------------ bad input


def test_bad_placements():
    g = graph({"a": 1, "b": 1}, [("a", "b", 1.0)])
    sim = Simulator(g, cluster("bus"))
    with pytest.raises(TravorderError, match="got 3 entries for the 2 nodes of 'hand'"):
        sim.run([0, 1, 2])
    with pytest.raises(TravorderError, match="node 'b' on device 3, but cluster 'test-bus' "
                                             r"has devices 0\.\.2"):
        sim.run([0, 3])
    with pytest.raises(TravorderError, match="node 'a' on device -1"):
        sim.step_time([-1, 0])
    with pytest.raises(TravorderError, match="integer device indices, got float64"):
        sim.run([0.0, 1.5])
    with pytest.raises(TravorderError, match="use run_batch"):
        sim.run([[0, 1]])
    with pytest.raises(TravorderError, match="one placement per row"):
        sim.run_batch([0, 1])
    with pytest.raises(TravorderError, match=r"node 'b' on device 7"):
        sim.run_batch([[0, 1], [0, 7]])


def test_times_beyond_a_float_are_refused_not_simulated(recwarn):
    # once a step of inf us and an efficiency of nan, behind an overflow warning
    g = OpGraph.from_records([{"name": "a", "flops": 1e12}, {"name": "b", "flops": 1e12}],
                             [("a", "b", 1e300)], name="big")
    fine = cluster("link")
    slow = dataclasses.replace(fine, devices=tuple(
        dataclasses.replace(d, peak_flops=1e-300) for d in fine.devices))
    message = (r"^graph 'big' on cluster 'test-link': its op and transfer times add up to "
               r"more than a float holds; check")
    with pytest.raises(TravorderError, match=message):
        Simulator(g, slow)
    thin = dataclasses.replace(fine, bandwidth=np.full((3, 3), 1e-10))
    with pytest.raises(TravorderError, match=message):
        simulate(g, [0, 1], thin)
    one = dataclasses.replace(thin, devices=fine.devices[:1], bandwidth=1e-10, latency=0.0)
    assert simulate(g, [0, 0], one).step_time_us < math.inf  # nothing to send
    assert not recwarn.list


def test_compiles_uncached_where_numba_has_nowhere_to_write():
    """With no folder numba can cache in (a read-only install, no writable home folder:
    here no cache locator at all), the compiled modules import and compile in memory
    (numba raised at import)."""
    import os
    import subprocess
    import sys

    code = ("import travorder.placement.rl.trainer\n"
            "from travorder.placement._jit import CACHE\n"
            "print(CACHE)\n")
    env = {**os.environ, "NUMBA_CACHE_LOCATOR_CLASSES": "IPythonCacheLocator"}
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True)
    assert out.stdout.strip() == "False"


@pytest.mark.slow
def test_batch_kernels_are_compiled_once_across_processes(tmp_path):
    """numba's cache keeps one entry per batch kernel however many processes use it (a
    kernel taking the core as an argument gained one per process, and broke past ~20)."""
    import os
    import subprocess
    import sys

    code = ("import numpy as np\nfrom travorder.placement import Simulator, load_cluster\n"
            "from travorder.graph import OpGraph\n"
            "g = OpGraph(['a', 'b', 'c'], [0, 0], [1, 2], flops=[1e9] * 3)\n"
            "for c in ('k80x3', 'k80x3-placeto'):\n"
            "    Simulator(g, load_cluster(c)).run_batch(np.array([[0, 1, 2], [0, 0, 0]]))\n")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    for _ in range(2):
        subprocess.run([sys.executable, "-c", code], env=env, check=True)
    kernels = sorted(p.name.split("-")[0] for p in tmp_path.rglob("simulator._batch*.nbc"))
    assert kernels == ["simulator._batch", "simulator._batch_placeto"]
