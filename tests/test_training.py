"""training_graph: the backward pass added to a forward graph."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings

from travorder.errors import GraphError
from travorder.graph import OpGraph, training_graph

from .strategies import random_dags


def chain() -> OpGraph:
    return OpGraph.from_records(
        [
            {"name": "a", "op_type": "Conv", "flops": 10, "output_bytes": 8, "param_bytes": 6,
             "time_us": 2.0},
            {"name": "b", "op_type": "Relu", "flops": 1, "output_bytes": 4, "time_us": 0.5},
            {"name": "c", "op_type": "Gemm", "flops": 5, "output_bytes": 2, "param_bytes": 3,
             "time_us": 1.0},
        ],
        [("a", "b", 7), ("b", "c", 4)],
        name="chain", family="test",
    )


def edges(g: OpGraph) -> dict[tuple[str, str], float]:
    n = g.names.tolist()
    return {(n[s], n[d]): b for s, d, b in zip(g.src.tolist(), g.dst.tolist(),
                                               g.edge_bytes.tolist(), strict=True)}


def test_chain_gets_its_backward_pass():
    t = training_graph(chain())
    assert (t.n_nodes, t.n_edges) == (6, 2 + 2 + 3)
    assert t.names.tolist() == ["a", "b", "c", "a_grad", "b_grad", "c_grad"]
    assert t.op_types.tolist() == ["Conv", "Relu", "Gemm"] * 2
    assert t.flops.tolist() == [10, 1, 5, 20, 2, 10]
    assert t.time_us.tolist() == [2.0, 0.5, 1.0, 4.0, 1.0, 2.0]
    assert t.is_backward.tolist() == [False] * 3 + [True] * 3
    assert t.param_bytes.tolist() == [6, 0, 3, 0, 0, 0]
    # a' outputs a's weight gradient (a has no input op); b', c' their input's gradient.
    assert t.output_bytes.tolist() == [8, 4, 2, 6, 7, 4]
    assert edges(t) == {
        ("a", "b"): 7, ("b", "c"): 4,                       # forward
        ("c_grad", "b_grad"): 4, ("b_grad", "a_grad"): 7,   # gradients, reversed
        ("a", "a_grad"): 8, ("b", "b_grad"): 4, ("c", "c_grad"): 2,  # saved activations
    }
    assert t.colocation.tolist() == [0, 1, 2, 0, 1, 2]
    assert t.meta["training"] is True and t.meta["name"] == "chain"
    assert t.meta["family"] == "test"


def test_fork_keeps_existing_colocation_and_numbers_new_groups_after_it():
    g = OpGraph.from_records(
        [{"name": "x", "flops": 4, "output_bytes": 2, "colocation": 5},
         {"name": "l", "flops": 2, "output_bytes": 1},
         {"name": "r", "flops": 3, "output_bytes": 1, "colocation": 5}],
        [("x", "l"), ("x", "r")],
    )
    t = training_graph(g)
    assert t.colocation.tolist() == [5, 6, 5, 5, 6, 5]
    assert edges(t) == {
        ("x", "l"): 2, ("x", "r"): 2, ("l_grad", "x_grad"): 2, ("r_grad", "x_grad"): 2,
        ("x", "x_grad"): 2, ("l", "l_grad"): 1, ("r", "r_grad"): 1,
    }
    # x' waits for both branch gradients; x is a source without parameters.
    assert t.output_bytes.tolist() == [2, 1, 1, 0, 2, 2]
    assert sorted(t.predecessors(t.index["x_grad"]).tolist()) == [0, 4, 5]


def test_factor_scales_flops_and_measured_time_only():
    g = chain().replace(time_us=[2.0, math.nan, 1.0])
    t = training_graph(g, backward_flops_factor=3.0)
    assert t.flops.tolist() == [10, 1, 5, 30, 3, 15]
    assert t.time_us[3] == 6.0 and np.isnan(t.time_us[4]) and t.time_us[5] == 3.0


def test_graphs_with_backward_ops_come_back_unchanged():
    t = training_graph(chain())
    assert training_graph(t) is t
    profiled = chain().replace(is_backward=[False, False, True])
    assert training_graph(profiled) is profiled


def test_backward_names_avoid_clashes():
    g = OpGraph.from_records([{"name": "a"}, {"name": "a_grad"}], [("a", "a_grad")])
    t = training_graph(g)
    assert t.names.tolist() == ["a", "a_grad", "a_grad1", "a_grad_grad1"]


@pytest.mark.parametrize("factor", [-1.0, math.nan, math.inf])
def test_bad_factor(factor):
    with pytest.raises(GraphError, match="backward_flops_factor"):
        training_graph(chain(), backward_flops_factor=factor)


@settings(max_examples=60, deadline=None)
@given(random_dags(max_nodes=25, with_time=True))
def test_training_graph_of_random_dags(g):
    t = training_graph(g)
    n, m = g.n_nodes, g.n_edges
    assert (t.n_nodes, t.n_edges) == (2 * n, 2 * m + n)
    assert np.array_equal(t.flops[n:], 2 * g.flops)
    assert np.allclose(t.time_us[n:], 2 * g.time_us)
    assert np.array_equal(t.colocation[:n], t.colocation[n:])
    assert np.unique(t.colocation[:n]).size == n  # each op its own group with its grad
    assert t.param_bytes.sum() == g.param_bytes.sum()
    e = edges(t)
    names = g.names.tolist()
    for s, d, b in zip(g.src.tolist(), g.dst.tolist(), g.edge_bytes.tolist(), strict=True):
        assert e[(names[d] + "_grad", names[s] + "_grad")] == b
    for i, x in enumerate(names):
        assert e[(x, x + "_grad")] == g.output_bytes[i]
    # Every backward op comes after its forward op.
    pos = np.empty(2 * n, dtype=np.int64)
    pos[t.topo_order] = np.arange(2 * n)
    assert np.all(pos[:n] < pos[n:])


@pytest.mark.parametrize("costs", [{"flops": [1e308, 1.0]}, {"time_us": [1.0, 1e308]}])
def test_a_backward_op_past_a_float_names_its_forward_op(recwarn, costs):
    # once a numpy overflow warning, then "time_us must be finite ... on node 'b_grad'"
    g = OpGraph(["a", "b"], [0], [1], meta={"name": "big"}, **costs)
    op = "a" if "flops" in costs else "b"
    with pytest.raises(GraphError, match=rf"^op '{op}' of 'big': its "
                                         rf"{next(iter(costs))} \(1e\+308\) times 2 for "
                                         r"its backward op is more than a float holds$"):
        training_graph(g)
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
