"""RL where one device cannot hold the training step: feasible starts, masks, penalties."""

from __future__ import annotations

import dataclasses

import pytest

from travorder.datasets import synthetic
from travorder.graph import OpGraph, training_graph
from travorder.placement.clusters import Cluster, load_cluster
from travorder.placement.orders import traversal_order
from travorder.placement.placers import place_graph
from travorder.placement.rl.env import PlacementEnv, feasible_starts
from travorder.placement.rl.trainer import RLConfig, train
from travorder.placement.simulator import Simulator
from travorder.study.scenarios import Scenario

GRAPH = training_graph(synthetic.inception(seed=0, n_modules=2))


def squeezed(graph: OpGraph, fraction: float, preset: str = "k80x3") -> Cluster:
    """``preset`` with every device's memory ``fraction`` of the single-device peak."""
    return Scenario(memory=fraction).cluster_for(graph, load_cluster(preset))


def test_single_device_does_not_fit_at_half_the_peak() -> None:
    c = squeezed(GRAPH, 0.5)
    assert not place_graph(GRAPH, c, "single").feasible
    assert any(Simulator(GRAPH, c).run(p).feasible for p in feasible_starts(GRAPH, c))


@pytest.mark.parametrize("memory", ["mask", "penalty"])
def test_the_search_starts_feasible_and_ends_feasible(memory: str) -> None:
    c = squeezed(GRAPH, 0.5)
    env = PlacementEnv(GRAPH, c, traversal_order(GRAPH, "topo_lifo"), memory=memory)
    _, info = env.reset(seed=0)
    assert info["feasible"] and env.best_feasible
    sim = Simulator(GRAPH, c)
    best_start = min(sim.run(p).step_time_us for p in feasible_starts(GRAPH, c)
                     if sim.run(p).feasible)
    assert info["step_time_us"] == best_start
    run = train(GRAPH, c, traversal_order(GRAPH, "bfs"), 0,
                RLConfig(episodes=6, memory=memory))
    assert run.feasible and sim.run(run.placement).feasible
    assert run.step_time_us == sim.step_time(run.placement) <= best_start
    assert run.best_curve[-1] == run.step_time_us


def test_the_heuristic_starts_are_simulated_once_per_search() -> None:
    env = PlacementEnv(GRAPH, squeezed(GRAPH, 0.5), traversal_order(GRAPH, "topo_lifo"),
                       memory="penalty")  # penalty: no simulations for the masks
    at_start, start_best = env.simulations, env.best_step_us
    assert at_start == 1 + len(feasible_starts(GRAPH, env.cluster))
    env.reset(seed=0)  # a fresh environment has its starts already
    assert env.simulations == at_start
    for d in (1, 2) * (len(env.order) // 2):  # an episode that moves ops about
        *_, done, _, _ = env.step(d)
        if done:
            break
    before = env.simulations
    env.reset(seed=1)  # a new search: the best placement found is forgotten
    assert env.simulations == before + at_start and env.best_step_us == start_best


def test_the_mask_falls_back_to_the_devices_that_overflow_least() -> None:
    # one op with 300 B of training state; devices of 250, 280 and 250 B: none fits
    g = OpGraph(["a"], [], [], time_us=[10.0], param_bytes=[100.0])
    c0 = load_cluster("k80x3")
    c = dataclasses.replace(c0, devices=tuple(
        dataclasses.replace(d, memory=m) for d, m in zip(c0.devices, (250.0, 280.0, 250.0),
                                                        strict=True)))
    env = PlacementEnv(g, c, [0])
    obs, info = env.reset(seed=0)
    assert not info["feasible"]
    assert obs["action_mask"].tolist() == [0, 1, 0]  # 300 B overflow 280 B least
    _, _, _, _, info = env.step(0)
    assert info["device"] == 1 and env.best_placement.tolist() == [1]


def test_the_paper_preset_beats_the_heuristic_start_under_memory_pressure() -> None:
    c = squeezed(GRAPH, 0.5)
    run = train(GRAPH, c, traversal_order(GRAPH, "topo_lifo"), 0, RLConfig.paper())
    sim = Simulator(GRAPH, c)
    starts = [sim.run(p) for p in feasible_starts(GRAPH, c)]
    assert run.feasible
    assert run.step_time_us <= min(r.step_time_us for r in starts if r.feasible)
