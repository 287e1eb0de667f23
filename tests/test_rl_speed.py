"""The compiled episode engine, the flat Adam and the other speed work keep runs the same."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from travorder.datasets import synthetic
from travorder.errors import TravorderError
from travorder.graph import training_graph
from travorder.placement.clusters import load_cluster
from travorder.placement.orders import traversal_order
from travorder.placement.rl.trainer import (
    FlatAdam,
    ReturnsWindow,
    RLConfig,
    returns_to_go,
    train,
)
from travorder.placement.simulator import Simulator

from .strategies import random_dags

GRAPH = training_graph(synthetic.enas_cnn(seed=0, n_cells=2))


def squeezed(fraction: float):
    c = load_cluster("k80x3")
    peak = Simulator(GRAPH, c).run(np.zeros(GRAPH.n_nodes, dtype=np.int64)).peak_memory[0]
    return dataclasses.replace(c, devices=tuple(dataclasses.replace(d, memory=fraction * peak)
                                                for d in c.devices))


@pytest.mark.parametrize(("order", "memory_fraction", "options"), [
    ("topo_lifo", None, {}),
    ("bfs", None, {"colocate": False}),
    ("dfs_preorder", None, {"gamma": 1.0, "baseline_window": 1000}),
    ("alpha", 0.5, {}),
    ("reversed_topo", 0.5, {"memory": "penalty"}),
])
def test_compiled_episodes_equal_the_stepwise_ones(order: str, memory_fraction: float | None,
                                                   options: dict) -> None:
    c = load_cluster("k80x3") if memory_fraction is None else squeezed(memory_fraction)
    config = RLConfig(episodes=7, eval_every=3, **options)
    runs = [train(GRAPH, c, traversal_order(GRAPH, order), 1, config, engine=engine)
            for engine in ("stepwise", "compiled")]
    a, b = runs
    assert a.curve == b.curve and a.best_curve == b.best_curve
    assert np.array_equal(a.placement, b.placement)
    assert (a.step_time_us, a.feasible, a.simulations) == (b.step_time_us, b.feasible,
                                                           b.simulations)


def test_forced_steps_cost_no_simulation() -> None:
    # k80x3 holds the graph: one simulation at most per decision (a group's first member)
    run = train(GRAPH, load_cluster("k80x3"), traversal_order(GRAPH, "topo_lifo"), 0,
                RLConfig(episodes=4))
    groups = GRAPH.n_nodes // 2  # each forward op with its backward op
    assert 0 < run.simulations <= 4 * groups
    assert run.play_s > 0 and run.network_s > 0 and run.update_s > 0


def test_unknown_engine_is_refused() -> None:
    with pytest.raises(TravorderError, match="unknown engine"):
        train(GRAPH, load_cluster("k80x3"), np.arange(GRAPH.n_nodes), engine="fast")


def test_returns_to_go_is_the_discounted_sum() -> None:
    rewards = np.random.default_rng(0).normal(size=50)
    expected = [sum(rewards[k] * 0.9 ** (k - t) for k in range(t, 50)) for t in range(50)]
    assert returns_to_go(rewards, 0.9) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("window", "episodes"), [(1, 9), (3, 20), (10, 40), (1000, 40),
                                                 (4, 4)])
def test_the_returns_window_means_as_a_deque_does(window: int, episodes: int) -> None:
    from collections import deque

    rng = np.random.default_rng(window)
    ours, reference = ReturnsWindow(window, 7, episodes), deque(maxlen=window)
    assert np.array_equal(ours.mean(), np.zeros(7))
    for _ in range(episodes):
        returns = rng.normal(size=7) * 1e3
        ours.append(returns)
        reference.append(returns)
        assert np.array_equal(ours.mean(), np.mean(reference, axis=0))  # bit for bit


def test_flat_adam_matches_torch_adam_with_clipping() -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    ref.load_state_dict(net.state_dict())
    flat = FlatAdam(net, lr=1e-2, grad_clip=0.5)
    adam = torch.optim.Adam(ref.parameters(), lr=1e-2)
    x = torch.randn(16, 4)
    for _ in range(5):
        for model, step in ((net, flat.step), (ref, adam.step)):
            flat.zero_grad()
            for p in ref.parameters():
                p.grad = None
            (model(x) ** 2).sum().backward()
            if model is ref:
                torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
            step()
    for p, q in zip(net.parameters(), ref.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)


def test_the_long_preset_is_the_paper_preset_trained_longer() -> None:
    long, paper = RLConfig.paper_long(), RLConfig.paper()
    assert long.episodes == 300
    assert dataclasses.replace(long, episodes=50) == paper
    assert RLConfig.from_options("paper_long", episodes="60").episodes == 60
    from travorder.placement.rl import rl_place

    with pytest.raises(TravorderError, match="paper_long preset"):
        rl_place(GRAPH, load_cluster("v100x4-nvlink"), np.arange(GRAPH.n_nodes),
                 preset="paper_long")


def test_the_mask_reuses_the_present_placement_and_simulates_the_others() -> None:
    from travorder.placement.rl.env import PlacementEnv

    env = PlacementEnv(GRAPH, squeezed(0.5), traversal_order(GRAPH, "topo_lifo"))
    obs, _ = env.reset(seed=0)
    for _ in range(6):
        v, sims = int(obs["node"]), env.simulations
        mask, cand = env._candidates(v)
        if cand is None:  # a forced step: nothing simulated
            assert env.simulations == sims
        else:  # the group stays together, so its present device needs no simulation
            assert env.simulations == sims + env.n_devices - 1
            every = np.repeat(env.placement[None], env.n_devices, axis=0)
            every[:, env.members(v)] = np.arange(env.n_devices)[:, None]
            full = env.sim.run_batch(every)
            for ours, theirs in zip(cand, full, strict=True):
                assert np.array_equal(ours, theirs)
            assert np.array_equal(mask.astype(bool), full.feasible if full.feasible.any()
                                  else full.overflow == full.overflow.min())
        obs, *_ = env.step(int(np.flatnonzero(mask)[-1]))


def test_a_reset_to_the_same_placement_reuses_its_start_times(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from travorder.placement.rl.env import PlacementEnv

    env = PlacementEnv(GRAPH, load_cluster("k80x3"), traversal_order(GRAPH, "bfs"))
    calls = []
    run = env.sim.run
    monkeypatch.setattr(env.sim, "run", lambda p: calls.append(1) or run(p))
    first, _ = env.reset(seed=0)
    again, _ = env.reset()
    assert len(calls) == 1 and np.array_equal(first["start"], again["start"])
    env.best_placement = env.best_placement.copy()
    env.best_placement[GRAPH.topo_order[0]] = 1  # another start: simulated again
    moved, _ = env.reset()
    assert len(calls) == 2
    r = run(moved["placement"])
    assert np.array_equal(moved["start"], r.start_us / r.step_time_us)


def _decisions(pg, seed: int, dtype):
    """Random episode features and decisions on half the nodes of ``pg``."""
    rng = np.random.default_rng(seed)
    n = pg.n_nodes
    from travorder.placement.rl.policy import static_features

    x = static_features(pg, rng.integers(0, 3, n), rng.random(n), 3).astype(dtype)
    nodes = rng.permutation(n)[:n // 2]
    contexts = rng.random((nodes.size, 42)).astype(dtype)
    masks = rng.random((nodes.size, 3)) < 0.7
    masks[np.arange(nodes.size), rng.integers(0, 3, nodes.size)] = True
    actions = np.array([rng.choice(np.flatnonzero(m)) for m in masks])
    advantage = rng.normal(size=nodes.size).astype(dtype)
    return x, nodes, contexts, masks, actions, advantage


def test_the_numpy_network_has_torchs_gradient() -> None:
    from travorder.placement.rl.network import NumpyNetwork
    from travorder.placement.rl.policy import PlacementPolicy, PolicyGraph
    from travorder.placement.rl.trainer import TorchNetwork

    pg = PolicyGraph(GRAPH, GRAPH.flops.astype(float))
    pg.descendants = pg.descendants.double()  # float64 throughout: no rounding noise
    torch.manual_seed(0)
    policy = PlacementPolicy(3).double()
    x, nodes, contexts, masks, actions, advantage = _decisions(pg, 0, np.float64)
    rows = np.sort(np.concatenate([nodes, [n for n in range(pg.n_nodes) if n % 5 == 0]]))
    net = NumpyNetwork(policy, pg, lr=1e-3, grad_clip=1.25, rows=np.unique(rows))
    t = net.node_table(x)
    ref = TorchNetwork(policy, pg, lr=1e-3, grad_clip=1.25)
    table = ref.node_table(x)
    assert np.allclose(t.table, table.detach().numpy()[net.rows], rtol=1e-12, atol=1e-12)
    loss = net.gradient(t, nodes, contexts, masks, actions, advantage, 0.01)
    ref.optimizer.zero_grad()
    ref_loss = ref.loss(table, nodes, contexts, masks, actions, advantage, 0.01)
    ref_loss.backward()
    assert loss == pytest.approx(ref_loss.detach().item(), rel=1e-12)
    assert np.allclose(net.grad, ref.optimizer.grad.numpy(), rtol=1e-9, atol=1e-14)
    assert np.abs(net.grad).max() > 1e-4  # every part of the network gets a gradient
    for name, grad in net.g.items():
        assert np.abs(grad).max() > 0, name


@settings(max_examples=60, deadline=None)
@given(random_dags(max_nodes=25), st.integers(0, 3))
def test_set_sums_are_the_products_with_the_reachability_matrix(g, seed) -> None:
    from travorder.placement.rl.network import SetSums
    from travorder.placement.rl.policy import PolicyGraph, descendant_matrix

    pg = PolicyGraph(g, np.ones(g.n_nodes))
    desc = descendant_matrix(g)
    values = np.random.default_rng(seed).integers(-9, 9, (g.n_nodes, 3)).astype(float)
    # integers: every order of summation gives the exact same sums
    assert np.array_equal(SetSums.of(desc.T, pg.forward)(values), desc.T @ values)
    assert np.array_equal(SetSums.of(desc, pg.backward)(values), desc @ values)


def test_a_numpy_update_is_torchs_to_float_rounding() -> None:
    from travorder.placement.rl.network import NumpyNetwork
    from travorder.placement.rl.policy import PlacementPolicy, PolicyGraph
    from travorder.placement.rl.trainer import TorchNetwork

    pg = PolicyGraph(GRAPH, GRAPH.flops.astype(float))
    torch.manual_seed(1)
    policy = PlacementPolicy(3)
    net = NumpyNetwork(policy, pg, lr=1e-3, grad_clip=0.05)  # the clipping matters
    ref = TorchNetwork(policy, pg, lr=1e-3, grad_clip=0.05)
    before = net.flat.copy()
    for seed in range(3):
        x, *decisions = _decisions(pg, seed, np.float32)
        net.update(net.node_table(x), *decisions, 0.01)
        ref.update(ref.node_table(x), *decisions, 0.01)
    after = ref.optimizer.flat.numpy()
    assert not np.allclose(after, before)
    # Adam moves each weight by about lr per step: float rounding moves it far less
    assert np.abs(net.flat - after).max() < 1e-5


def test_both_networks_train_alike_and_a_bad_one_is_refused() -> None:
    c, order = load_cluster("k80x3"), traversal_order(GRAPH, "topo_lifo")
    runs = [train(GRAPH, c, order, 0, RLConfig(episodes=6, eval_every=3, network=network))
            for network in ("numpy", "torch")]
    assert runs[0].curve[0] == runs[1].curve[0]  # the same initial weights and draws
    assert runs[0].best_curve[-1] == pytest.approx(runs[1].best_curve[-1], rel=0.05)
    with pytest.raises(TravorderError, match="network must be one of numpy, torch"):
        RLConfig.from_options("paper", network="jax")
