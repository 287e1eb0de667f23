"""The RL placer: environment, policy network, REINFORCE trainer, the ``rl`` placer."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import warnings
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

from travorder.errors import TravorderError
from travorder.graph import OpGraph, training_graph
from travorder.placement.clusters import Cluster, Device, load_cluster
from travorder.placement.orders import traversal_order
from travorder.placement.placers import PLACERS, place_graph
from travorder.placement.rl import rl_place
from travorder.placement.rl.env import PlacementEnv, worst_case_memory
from travorder.placement.rl.policy import (
    EpisodeHead,
    PlacementPolicy,
    PolicyGraph,
    StepContext,
    _Recursion,
    descendant_matrix,
    static_features,
)
from travorder.placement.rl.trainer import EPISODE_PROGRESS, RLConfig, returns_to_go, train
from travorder.placement.simulator import Simulator

from .strategies import random_dags

torch.set_num_threads(1)  # as in a run; tiny tensors are slower with more threads


def cluster(n: int = 2, memory: float = math.inf) -> Cluster:
    """``n`` devices, no launch gap, transfers ``5 us + bytes / 1000`` on a bus each."""
    return Cluster("test", tuple(Device(f"g{i}", 1e12, 1e12, memory, 0.0) for i in range(n)),
                   1000.0, 5.0, "bus")


# two independent chains a1 -> a2 -> a3 and b1 -> b2 -> b3, 10 us per op, 1 kB per edge
CHAINS = OpGraph(["a1", "a2", "a3", "b1", "b2", "b3"], [0, 1, 3, 4], [1, 2, 4, 5],
                 time_us=[10.0] * 6, edge_bytes=[1000.0] * 4, meta={"name": "chains"})
# two independent 10 us ops holding 200 B of parameters each (600 B with training copies)
PAIR = OpGraph(["a", "b"], [], [], time_us=[10.0, 10.0], param_bytes=[200.0, 200.0],
               meta={"name": "pair"})


def small_training_graph() -> OpGraph:
    fwd = OpGraph.from_records(
        [{"name": n, "flops": f, "output_bytes": 4e5, "param_bytes": 1e5}
         for n, f in [("x", 2e8), ("y", 4e8), ("z", 1e8), ("w", 3e8)]],
        [("x", "y"), ("x", "z"), ("y", "w"), ("z", "w")], name="diamond")
    return training_graph(fwd)


# ---------------------------------------------------------------- environment
@pytest.mark.parametrize("memory", ["mask", "penalty"])
@pytest.mark.parametrize("capacity", [math.inf, 4e6])
def test_env_passes_the_gymnasium_checker(memory: str, capacity: float) -> None:
    g = small_training_graph()
    env = PlacementEnv(g, cluster(3, capacity), traversal_order(g, "dfs_preorder"),
                       memory=memory)
    assert env.always_fits is (capacity == math.inf)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env, skip_render_check=True)


def test_reward_is_old_minus_new_log_step_time() -> None:
    env = PlacementEnv(PAIR, cluster(), [1, 0])
    obs, info = env.reset(seed=0)
    assert obs["node"] == 1 and info["step_time_us"] == 20.0  # both on device 0
    obs, r1, term, trunc, info = env.step(1)  # b moves: the two ops run side by side
    assert (info["step_time_us"], term, trunc) == (10.0, False, False)
    assert r1 == pytest.approx(math.log(2.0))
    assert obs["node"] == 0 and obs["done"].tolist() == [0, 1]
    obs, r2, term, _, info = env.step(1)  # a joins b: slower again, negative reward
    assert (info["step_time_us"], term) == (20.0, True) and r2 == pytest.approx(-r1)
    assert obs["done"].tolist() == [1, 1] and obs["placement"].tolist() == [1, 1]
    # the best placement so far is kept, and the next episode starts from it
    assert env.best_step_us == 10.0 and env.best_placement.tolist() == [0, 1]
    obs, info = env.reset()
    assert obs["placement"].tolist() == [0, 1] and info["step_time_us"] == 10.0
    assert obs["done"].tolist() == [0, 0] and obs["start"].tolist() == [0.0, 0.0]
    obs, _ = env.reset(seed=1)  # a seeded reset starts a new search
    assert obs["placement"].tolist() == [0, 0]


def test_episode_visits_every_node_once_in_the_order_and_rewards_telescope() -> None:
    g = small_training_graph()
    order = traversal_order(g, "bfs")
    env = PlacementEnv(g, cluster(3), order, colocate=False)
    obs, info = env.reset(seed=0)
    rng = np.random.default_rng(0)
    seen, total, start = [], 0.0, info["step_time_us"]
    terminated = False
    while not terminated:
        seen.append(obs["node"])
        obs, r, terminated, _, info = env.step(int(rng.integers(3)))
        total += r
    assert seen == order.tolist()
    assert total == pytest.approx(math.log(start) - math.log(info["step_time_us"]))
    assert info["step_time_us"] == Simulator(g, cluster(3)).step_time(obs["placement"])
    with pytest.raises(TravorderError, match="episode is over"):
        env.step(0)


def test_colocated_nodes_move_together_and_later_members_are_forced() -> None:
    g = small_training_graph()  # x_grad is colocated with x, and so on
    order = traversal_order(g, "topo")
    env = PlacementEnv(g, cluster(3), order)
    obs, _ = env.reset(seed=0)
    x, x_grad = g.index["x"], g.index["x_grad"]
    assert obs["node"] == x and obs["action_mask"].tolist() == [1, 1, 1]
    obs, _, _, _, info = env.step(2)
    assert sorted(info["moved"].tolist()) == [x, x_grad]
    assert obs["placement"][x] == obs["placement"][x_grad] == 2
    while obs["node"] != x_grad:
        obs, *_ = env.step(0)
    assert obs["action_mask"].tolist() == [0, 0, 1]
    obs, reward, _, _, info = env.step(0)  # remapped to the group's device
    assert info["device"] == 2 and reward == 0.0


def test_memory_mask_forbids_overflowing_devices() -> None:
    c = cluster(2, memory=1000.0)  # one op fits a device (600 B), both do not (1200 B)
    assert worst_case_memory(PAIR, c) == 1200.0
    env = PlacementEnv(PAIR, c, [0, 1])
    assert not env.always_fits
    obs, info = env.reset(seed=0)
    # all on device 0 would not fit: the search starts from a feasible heuristic placement
    assert info["feasible"] and obs["placement"].tolist() == [0, 1]
    assert obs["action_mask"].tolist() == [1, 0]  # a may not join b
    obs, _, _, _, info = env.step(1)  # not allowed: remapped to the only allowed device
    assert info["device"] == 0 and info["feasible"]
    assert obs["action_mask"].tolist() == [0, 1]
    obs, _, _, _, info = env.step(0)
    assert info["device"] == 1 and obs["placement"].tolist() == [0, 1]


def test_memory_penalty_scales_the_cost_of_overflow() -> None:
    # both on device 1: 20 us and 1200 B on a 1000 B device, overflow 0.2, cost 20 * 3
    env = PlacementEnv(PAIR, cluster(2, memory=1000.0), [0, 1], memory="penalty",
                       memory_penalty=10.0)
    obs, info = env.reset(seed=0)
    assert obs["action_mask"].tolist() == [1, 1] and env.cost == pytest.approx(10.0)
    _, reward, _, _, info = env.step(1)
    assert not info["feasible"] and env.cost == pytest.approx(60.0)
    assert reward == pytest.approx(-math.log(6.0))
    assert env.best_feasible and env.best_placement.tolist() == [0, 1]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"order": [0, 0]}, "permutation"),
    ({"order": [0]}, "permutation"),
    ({"order": [0, 1], "memory": "ignore"}, "unknown memory mode"),
    ({"order": [0, 1], "memory_penalty": -1.0}, "memory_penalty"),
])
def test_env_rejects_bad_settings(kwargs: dict, message: str) -> None:
    with pytest.raises(TravorderError, match=message):
        PlacementEnv(PAIR, cluster(), **kwargs)


def test_env_rejects_an_empty_graph() -> None:
    with pytest.raises(TravorderError, match="no nodes"):
        PlacementEnv(OpGraph([], [], []), cluster(), [])


# ---------------------------------------------------------------- policy
def test_descendant_matrix_on_a_diamond() -> None:
    g = OpGraph(["a", "b", "c", "d", "e"], [0, 0, 1, 2], [1, 2, 3, 3])
    assert descendant_matrix(g).astype(int).tolist() == [
        [0, 1, 1, 1, 0], [0, 0, 0, 1, 0], [0, 0, 0, 1, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0]]


@settings(max_examples=50, deadline=None)
@given(random_dags(max_nodes=25))
def test_descendant_matrix_is_the_transitive_closure(g: OpGraph) -> None:
    closure = nx.transitive_closure_dag(nx.DiGraph(list(zip(g.src, g.dst, strict=True))))
    expected = np.zeros((g.n_nodes, g.n_nodes), dtype=bool)
    for u, v in closure.edges:
        expected[u, v] = True
    assert np.array_equal(descendant_matrix(g), expected)


def test_step_context_by_hand() -> None:
    # chain a -> b -> c and a lone d; a and d on device 1, b and c on device 0
    g = OpGraph(["a", "b", "c", "d"], [0, 1], [1, 2], time_us=[10.0, 20.0, 30.0, 40.0])
    pg = PolicyGraph(g, g.time_us)
    ctx = StepContext(pg, 2)
    ctx.reset(np.array([1, 0, 0, 1]))
    ctx.update(0, np.array([0]), 1)  # a decided (stays on 1)
    blocks = ctx(1).reshape(6, 5)  # per set: done, on 0, on 1, compute on 0, compute on 1
    assert blocks.tolist() == [
        [0, 1, 0, 1, 0],  # b itself
        [1, 0, 1, 0, 1],  # predecessors: a
        [0, 1, 0, 1, 0],  # successors: c
        [1, 0, 1, 0, 1],  # ancestors: a
        [0, 1, 0, 1, 0],  # descendants: c
        [0, 0, 1, 0, 1],  # parallel: d
    ]
    ctx.update(1, np.array([1]), 1)  # b decided: moves to device 1
    assert ctx(2).reshape(6, 5)[3].tolist() == [1, 0, 1, 0, 1]  # c's ancestors: a, b
    assert ctx(0).reshape(6, 5)[1].tolist() == [0] * 5  # a has no predecessors
    assert ctx(0).reshape(6, 5)[4] == pytest.approx([0.5, 0.5, 0.5, 0.6, 0.4])  # b, c
    assert ctx(3).reshape(6, 5)[5] == pytest.approx([2 / 3, 1 / 3, 2 / 3, 0.5, 0.5])


def _reference_context(ctx: StepContext, v: int) -> np.ndarray:
    """The step context of ``v`` from whole rows summed member by member, in the sets'
    order (the parallel set by difference, as `_context` takes it)."""
    rows, pg, d = ctx._rows, ctx.pg, ctx.n_devices
    sums = [rows[v].copy()]
    for k in range(pg.set_ptr.shape[0]):
        acc = np.zeros(rows.shape[1])
        for u in pg.set_idx[pg.set_ptr[k, v]:pg.set_ptr[k, v + 1]]:
            acc = acc + rows[u]
        sums.append(acc)
    sums.append(ctx._total - sums[0] - sums[3] - sums[4])
    out = np.zeros((len(sums), 1 + 2 * d), dtype=np.float32)
    for k, s in enumerate(sums):
        if s[0] > 0.5:
            out[k, :1 + d] = s[1:2 + d] / s[0]
            if s[-1] > 1e-9 * ctx._total[-1]:
                out[k, 1 + d:] = s[2 + d:-1] / s[-1]
    return out.reshape(-1)


@settings(max_examples=30, deadline=None)
@given(random_dags(min_nodes=2, max_nodes=30), st.integers(0, 2**32 - 1),
       st.integers(2, 4))
def test_step_context_is_the_rows_summed_bit_for_bit(g: OpGraph, seed: int,
                                                     n_devices: int) -> None:
    # the context gathers each member's device and cost instead of its whole row
    rng = np.random.default_rng(seed)
    pg = PolicyGraph(g, rng.random(g.n_nodes) * 1e3)
    ctx = StepContext(pg, n_devices)
    ctx.reset(np.ones(g.n_nodes, dtype=np.int64))
    ctx.update(0, np.arange(g.n_nodes), 0)  # rows the next reset must clear
    placement = rng.integers(0, n_devices, g.n_nodes)
    ctx.reset(placement)
    cost = ctx._cost
    onehot = np.eye(n_devices)[placement]
    assert np.array_equal(ctx._rows, np.column_stack(
        [np.ones(g.n_nodes), np.zeros(g.n_nodes), onehot, onehot * cost[:, None], cost]))
    assert np.array_equal(ctx._total, ctx._rows.sum(axis=0))
    assert np.array_equal(ctx._device, placement)
    for v in rng.permutation(g.n_nodes).tolist():
        for w in range(g.n_nodes):
            assert np.array_equal(ctx(w), _reference_context(ctx, w))
        group = np.union1d([v], rng.choice(g.n_nodes, rng.integers(0, 3)))
        device = int(rng.integers(0, n_devices))
        ctx.update(v, group, device)


@settings(max_examples=20, deadline=None)
@given(random_dags(min_nodes=1, max_nodes=30), st.integers(0, 2**32 - 1))
def test_static_features_are_the_columns_divided_by_their_maximum(g: OpGraph,
                                                                  seed: int) -> None:
    rng = np.random.default_rng(seed)
    pg = PolicyGraph(g, rng.random(g.n_nodes) * 1e3)
    placement, start = rng.integers(0, 3, g.n_nodes), rng.random(g.n_nodes) * 1e4
    x = static_features(pg, placement, start, 3)
    for j, col in enumerate((pg.cost, pg.out_size, start)):
        top = col.max()
        assert np.array_equal(x[:, j], (col / top if top > 0 else 0 * col).astype(np.float32))
    assert np.array_equal(x[:, 3:], np.eye(3, dtype=np.float32)[placement])
    assert x.dtype == np.float32


def _reference_pass(x: torch.Tensor, layer: torch.nn.Module, pg_dir) -> torch.Tensor:
    """The Placeto recursion node by node in plain torch."""
    base = layer.update(x)
    m1, m2 = layer.message
    h, msg = {}, {}
    for v in pg_dir.order.tolist():
        pre = base[v]
        for u in pg_dir.idx[pg_dir.ptr[v]:pg_dir.ptr[v + 1]].tolist():
            pre = pre + msg[u]
        h[v] = torch.relu(pre)
        msg[v] = m2(torch.relu(m1(h[v])))
    return torch.stack([h[v] for v in range(x.shape[0])])


def test_compiled_message_pass_matches_autograd() -> None:
    g = small_training_graph()
    pg = PolicyGraph(g, np.ones(g.n_nodes))
    torch.manual_seed(0)
    policy = PlacementPolicy(3, dim=8)
    x = torch.rand(g.n_nodes, 6)
    for layer, direction in ((policy.encoder.forward_pass, pg.forward),
                             (policy.encoder.backward_pass, pg.backward)):
        weights = torch.randn(g.n_nodes, 8)
        out, ref = layer(x, direction), _reference_pass(x, layer, direction)
        assert torch.allclose(out, ref, atol=1e-6)
        got = torch.autograd.grad((out * weights).sum(), list(layer.parameters()))
        want = torch.autograd.grad((ref * weights).sum(), list(layer.parameters()))
        for a, b in zip(got, want, strict=True):
            assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.slow  # compiles the kernels for float64
def test_compiled_message_pass_passes_gradcheck() -> None:
    g = small_training_graph()
    pg = PolicyGraph(g, np.ones(g.n_nodes))
    torch.manual_seed(0)
    layer = PlacementPolicy(3, dim=8).encoder.forward_pass.double()
    m1, m2 = layer.message
    base = torch.rand(g.n_nodes, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda b, *w: _Recursion.apply(b, *w, pg.forward),
        (base, m1.weight, m1.bias, m2.weight, m2.bias))


def _logits_per_node(g: OpGraph, placement: np.ndarray, start: np.ndarray, seed: int,
                     encoder: str) -> np.ndarray:
    """Logits of every node, with the first half of the nodes (by name) decided."""
    pg = PolicyGraph(g, g.flops)
    torch.manual_seed(seed)
    policy = PlacementPolicy(3, encoder=encoder)
    x = torch.from_numpy(static_features(pg, placement, start, 3))
    table = policy.node_table(x, pg).detach()
    ctx = StepContext(pg, 3)
    ctx.reset(placement)
    for v in np.argsort(g.names)[:g.n_nodes // 2].tolist():
        ctx.update(v, np.array([v]), (placement[v] + 1) % 3)
    contexts = torch.from_numpy(np.stack([ctx(v) for v in range(g.n_nodes)]))
    logits = policy(table, contexts).detach().numpy()
    head = EpisodeHead.of_policy(policy, table)
    assert np.allclose([head(v, contexts[v].numpy()) for v in range(g.n_nodes)], logits,
                       atol=1e-5)
    return logits


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@settings(max_examples=15, deadline=None)
@given(random_dags(min_nodes=2, max_nodes=20), st.integers(0, 2**32 - 1),
       st.sampled_from(["placeto", "sage"]))
def test_policy_does_not_depend_on_node_numbering(g: OpGraph, seed: int,
                                                  encoder: str) -> None:
    rng = np.random.default_rng(seed)
    placement, start = rng.integers(0, 3, g.n_nodes), rng.random(g.n_nodes)
    perm = rng.permutation(g.n_nodes)  # node perm[i] becomes node i
    logits = _logits_per_node(g, placement, start, 0, encoder)
    permuted = _logits_per_node(g.permute(perm), placement[perm], start[perm], 0, encoder)
    assert np.allclose(permuted, logits[perm], atol=1e-4)


def test_policy_rejects_an_unknown_encoder() -> None:
    with pytest.raises(TravorderError, match="unknown encoder"):
        PlacementPolicy(3, encoder="gat")


# ---------------------------------------------------------------- trainer
def test_finds_the_optimum_for_two_independent_chains() -> None:
    # the optimum runs one chain per device: 30 us, the lower bound
    run = train(CHAINS, cluster(2), traversal_order(CHAINS, "topo"), seed=0,
                config=RLConfig(episodes=20))
    p = run.placement.tolist()
    assert p[:3] in ([0] * 3, [1] * 3) and p[3:] == [1 - p[0]] * 3
    assert (run.step_time_us, run.efficiency, run.feasible) == (30.0, 1.0, True)
    assert run.best_curve[-1] == 30.0 and len(run.curve) == 20
    assert run.greedy == [(e + 1) % 5 == 0 for e in range(20)]
    assert all(a >= b for a, b in zip(run.best_curve, run.best_curve[1:], strict=False))


def test_returns_to_go_stay_finite_over_long_episodes() -> None:
    g = returns_to_go(np.full(5000, 0.5), 0.5)
    assert np.all(np.isfinite(g)) and g[-1] == 0.5 and g[0] == pytest.approx(1.0)
    assert returns_to_go(np.array([1.0, -1.0, 2.0]), 1.0).tolist() == [2.0, 1.0, 2.0]


def test_a_fixed_seed_gives_the_same_run() -> None:
    g = small_training_graph()
    order = traversal_order(g, "dfs_preorder")
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    threads = torch.get_num_threads()
    runs = [train(g, load_cluster("k80x3"), order, seed=s, config=RLConfig(episodes=6))
            for s in (7, 7, 8)]
    assert torch.rand(1) == before and torch.get_num_threads() == threads
    assert runs[0].curve == runs[1].curve and runs[0].best_curve == runs[1].best_curve
    assert np.array_equal(runs[0].placement, runs[1].placement)
    assert runs[0].curve != runs[2].curve


def test_episodes_are_reported_where_a_progress_hook_is_set(capsys) -> None:
    g = small_training_graph()
    seen: list[tuple[int, int, float]] = []
    token = EPISODE_PROGRESS.set(lambda *args: seen.append(args))
    try:
        run = train(g, load_cluster("k80x3"), traversal_order(g, "bfs"), seed=0,
                    config=RLConfig(episodes=4))
    finally:
        EPISODE_PROGRESS.reset(token)
    assert seen == [(i + 1, 4, best) for i, best in enumerate(run.best_curve)]
    from travorder.cli import main

    example = Path(__file__).resolve().parents[1] / "examples" / "resnet_small.onnx"
    assert main(["place", str(example), "--placer", "rl", "-O",
                 "episodes=3", "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and json.loads(out)["placer"] == "rl"  # no bar where no terminal is


def test_the_sage_encoder_and_penalty_mode_run() -> None:
    g = small_training_graph()
    run = train(g, cluster(3, 4e6), traversal_order(g, "bfs"), seed=1,
                config=RLConfig(episodes=3, encoder="sage", memory="penalty"))
    assert len(run.curve) == 3 and run.placement.shape == (g.n_nodes,)
    assert run.env_s > 0 and run.policy_s > 0 and run.wall_s >= run.env_s


def test_rl_is_a_placer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(PLACERS, "rl", rl_place)
    r = place_graph(CHAINS, cluster(2), placer="rl", order="dfs_preorder", episodes=10)
    assert r.placer == "rl" and len(r.learning_curve) == 10
    assert r.step_time_us == Simulator(CHAINS, cluster(2)).step_time(r.placement)
    with pytest.raises(TravorderError, match="has no option 'epochs'"):
        place_graph(CHAINS, cluster(2), placer="rl", epochs=3)


def test_config_presets_and_options() -> None:
    paper = RLConfig.paper()
    assert (paper.episodes, paper.eval_every, paper.lr, paper.grad_clip, paper.gamma,
            paper.encoder) == (50, 5, 1e-3, 1.25, 1.0, "placeto")
    assert RLConfig.from_options("paper", episodes="7").episodes == 7
    c = RLConfig.from_options(lr="0.01", colocate="false", encoder="sage")
    assert (c.lr, c.colocate, c.encoder) == (0.01, False, "sage")
    assert RLConfig(lr=1).lr == 1.0 and isinstance(RLConfig(lr=1).lr, float)
    assert RLConfig(colocate=0).colocate is False  # `-O colocate=0` arrives as an int
    numpy = RLConfig(episodes=np.int64(3), lr=np.float32(0.5), colocate=np.bool_(False))
    assert (type(numpy.episodes), numpy.lr, numpy.colocate) == (int, 0.5, False)


@pytest.mark.parametrize(("options", "message"), [
    ({"episodes": 0}, "episodes must be at least 1"),
    ({"episodes": "many"}, "episodes must be int"),
    ({"episodes": 2.5}, "episodes must be int"),
    ({"colocate": "maybe"}, "colocate must be bool"),
    ({"colocate": 2}, "colocate must be bool"),
    ({"threads": 2**31}, "threads must be between 1 and 1024"),
    ({"dim": 10**11}, "dim and hidden must be between 1 and 4096"),
    ({"gamma": 0.0}, "gamma must be in"),
    ({"lr": "inf"}, "lr must be positive and finite, got inf"),
    ({"entropy_coef": math.nan}, "entropy_coef must be finite and non-negative, got nan"),
    ({"encoder": "gat"}, "encoder must be one of"),
    ({"memory": "ignore"}, "memory must be one of"),
    ({"preset": "fast"}, "unknown rl preset"),
    ({"epochs": 3}, "has no option 'epochs'"),
])
def test_bad_options_are_one_clear_error(options: dict, message: str) -> None:
    with pytest.raises(TravorderError, match=message):
        rl_place(CHAINS, cluster(2), np.arange(6), 0, **options)


def test_the_paper_preset_needs_three_devices() -> None:
    with pytest.raises(TravorderError, match="3 devices"):
        rl_place(CHAINS, cluster(2), np.arange(6), 0, preset="paper")


def test_importing_the_rl_package_does_not_import_torch() -> None:
    code = ("import sys, travorder.placement.rl, travorder.placement.placers; "
            "print('torch' in sys.modules, 'gymnasium' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.split() == ["False", "False"]


def _learning_ratios(lr: float, seeds: range) -> list[float]:
    """Per seed, the mean step time of the last 8 sampled episodes over the first 8's, in
    50-episode runs on a 3-cell ENAS CNN on the study's K80s."""
    from travorder.datasets.synthetic import enas_cnn

    g = training_graph(enas_cnn(seed=0, n_cells=3))
    ratios = []
    for seed in seeds:
        run = train(g, load_cluster("k80x3"), traversal_order(g, "topo"), seed=seed,
                    config=RLConfig(lr=lr))
        sampled = np.array(run.curve)[~np.array(run.greedy)]
        ratios.append(float(sampled[-8:].mean() / sampled[:8].mean()))
    return ratios


def _learns(ratios: list[float]) -> bool:
    """The learning criterion: the sampled step time falls by a fifth on at least 4 of 5
    seeds (one seed may stay stuck: seed 3 does)."""
    return sum(r < 0.8 for r in ratios) >= len(ratios) - 1


@pytest.mark.slow
def test_learning_shows_within_fifty_episodes() -> None:
    seeds = range(5)
    trained = _learning_ratios(1e-3, seeds)
    assert _learns(trained), trained
    # The control: the same runs with a frozen policy (Adam with lr 1e-12). Starting each
    # episode from the best placement so far is not learning; it must fail the criterion.
    frozen = _learning_ratios(1e-12, seeds)
    assert not _learns(frozen), frozen
    assert min(frozen) > max(sorted(trained)[:-1]), (trained, frozen)
