"""coarsen: merging ops into groups, the coarse graph, and the mapping back."""

from __future__ import annotations

import math
import time

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from travorder.errors import GraphError
from travorder.graph import Coarsening, OpGraph, coarsen, training_graph

from .strategies import random_dags


def graph(nodes: list[tuple], edges: list[tuple], **meta) -> OpGraph:
    """Nodes as (name, op_type, flops[, output_bytes[, colocation]])."""
    keys = ("name", "op_type", "flops", "output_bytes", "colocation")
    return OpGraph.from_records([dict(zip(keys, nd, strict=False)) for nd in nodes], edges,
                                **meta)


def residual() -> OpGraph:
    return graph(
        [("x", "Conv", 100, 8), ("r", "Relu", 1, 8), ("c2", "Conv", 100, 16),
         ("add", "Add", 1, 4)],
        [("x", "r"), ("r", "c2"), ("c2", "add"), ("x", "add", 3)],
        name="res",
    )


def edge_map(g: OpGraph) -> dict[tuple[str, str], float]:
    n = g.names.tolist()
    return {(n[s], n[d]): b for s, d, b in zip(g.src.tolist(), g.dst.tolist(),
                                               g.edge_bytes.tolist(), strict=True)}


def test_big_enough_is_the_identity():
    g = residual()
    c = coarsen(g, 4)
    assert c.graph is g and c.original is g
    assert c.group_of.tolist() == [0, 1, 2, 3]
    assert c.expand([2, 1, 0, 1]).tolist() == [2, 1, 0, 1]


def test_fusion_puts_the_relu_into_its_conv():
    c = coarsen(residual(), 3)
    assert c.group_of.tolist() == [0, 0, 1, 2]
    cg = c.graph
    assert cg.names.tolist() == ["x", "c2", "add"]
    assert cg.op_types.tolist() == ["Conv", "Conv", "Add"]
    assert cg.flops.tolist() == [101, 100, 1]
    # x's output leaves the group (to add) and so does r's (to c2).
    assert cg.output_bytes.tolist() == [16, 16, 4]
    assert edge_map(cg) == {("x", "c2"): 8, ("x", "add"): 3, ("c2", "add"): 16}
    assert cg.meta["name"] == "res" and cg.meta["coarsened_from_nodes"] == 4


def test_cheapest_neighbours_merge_next():
    c = coarsen(residual(), 2)
    # The cheapest group (add, 1) joins its cheapest neighbour c2.
    assert c.group_of.tolist() == [0, 0, 1, 1]
    assert c.graph.names.tolist() == ["x", "c2"]
    assert c.graph.op_types.tolist() == ["Conv", "Conv"]
    assert edge_map(c.graph) == {("x", "c2"): 8 + 3}
    assert c.graph.output_bytes.tolist() == [16, 4]
    assert coarsen(residual(), 1).group_of.tolist() == [0, 0, 0, 0]


def test_a_contraction_that_would_close_a_cycle_is_refused():
    # The cheapest pair is (a, c), but merging it would make {a, c} -> b -> {a, c}.
    g = graph([("a", "Conv", 1), ("b", "Conv", 100), ("c", "Conv", 1)],
              [("a", "b"), ("b", "c"), ("a", "c")])
    c = coarsen(g, 2)
    assert c.group_of.tolist() == [0, 0, 1]
    assert c.graph.flops.tolist() == [101, 1]


def test_chains_collapse_cheapest_link_first():
    g = graph([(x, "Conv", f) for x, f in zip("abcde", [1, 1, 50, 1, 60], strict=True)],
              [("a", "b"), ("b", "c"), ("c", "d"), ("d", "e")])
    assert coarsen(g, 4).group_of.tolist() == [0, 0, 1, 2, 3]
    assert coarsen(g, 3).group_of.tolist() == [0, 0, 1, 1, 2]


def test_disconnected_groups_merge_along_a_topological_order():
    g = graph([("p", "Conv", 5), ("q", "Conv", 1), ("s", "Conv", 2)], [])
    assert coarsen(g, 2).group_of.tolist() == [0, 1, 1]
    assert coarsen(g, 1).group_of.tolist() == [0, 0, 0]


def test_forward_and_backward_ops_stay_apart():
    fwd = graph([("a", "Conv", 1), ("b", "Conv", 2), ("c", "Conv", 3)],
                [("a", "b"), ("b", "c")])
    t = training_graph(fwd)
    c = coarsen(t, 2)
    assert c.group_of.tolist() == [0, 0, 0, 1, 1, 1]
    assert c.graph.is_backward.tolist() == [False, True]
    assert c.graph.flops.tolist() == [6, 12]
    # Forward a, b, c were colocated with a', b', c': the classes join into one.
    assert c.graph.colocation.tolist() == [0, 0]


def test_colocation_classes_join_when_a_group_spans_them():
    g = graph([("a", "Conv", 1, 4, 3), ("b", "Conv", 1, 4, 5), ("c", "Conv", 100, 4, 5),
               ("d", "Conv", 100, 4)],
              [("a", "b"), ("b", "c"), ("c", "d")])
    c = coarsen(g, 3)
    assert c.group_of.tolist() == [0, 0, 1, 2]
    assert c.graph.colocation.tolist() == [3, 3, -1]


def test_a_tensor_goes_once_to_each_consuming_group():
    g = graph([("p", "Conv", 100, 8), ("q", "Conv", 1, 2), ("r", "Conv", 1, 5)],
              [("p", "q", 8), ("p", "r", 6), ("q", "r")])
    c = coarsen(g, 2)
    assert c.group_of.tolist() == [0, 1, 1]
    assert edge_map(c.graph) == {("p", "q"): 8}
    assert c.graph.output_bytes.tolist() == [8, 5]  # q's output stays inside


def test_measured_times_add_up_and_unknown_stays_unknown():
    g = residual().replace(time_us=[4.0, 1.0, 3.0, math.nan])
    c = coarsen(g, 2)
    assert c.graph.time_us[0] == 5.0 and np.isnan(c.graph.time_us[1])


def test_expand_checks_the_placement_length():
    c = coarsen(residual(), 2)
    assert c.expand(np.array([1, 0])).tolist() == [1, 1, 0, 0]
    with pytest.raises(GraphError, match="needs 2 values"):
        c.expand([0, 1, 2])


@pytest.mark.parametrize("bad", [0, -3, 1.5, "2", True])  # True: once one node
def test_bad_max_nodes(bad):
    with pytest.raises(GraphError, match="max_nodes"):
        coarsen(residual(), bad)


def check_coarsening(g: OpGraph, c: Coarsening, k: int) -> None:
    cg = c.graph
    assert cg.n_nodes == min(k, g.n_nodes)
    assert c.group_of.shape == (g.n_nodes,) and not c.group_of.flags.writeable
    assert np.array_equal(np.unique(c.group_of), np.arange(cg.n_nodes))
    assert np.array_equal(c.expand(np.arange(cg.n_nodes)), c.group_of)
    for field in ("flops", "param_bytes"):  # integer-valued: sums are exact
        assert getattr(cg, field).sum() == getattr(g, field).sum()
    assert np.isclose(np.nansum(cg.time_us), np.nansum(g.time_us))
    # The coarse edges are exactly the group pairs the fine edges connect.
    gs, gd = c.group_of[g.src], c.group_of[g.dst]
    pairs = {(a, b) for a, b in zip(gs.tolist(), gd.tolist(), strict=True) if a != b}
    assert pairs == set(zip(cg.src.tolist(), cg.dst.tolist(), strict=True))
    assert nx.is_directed_acyclic_graph(cg.to_networkx())
    # Groups are numbered by their first member, which gives the group its name.
    first = [int(np.flatnonzero(c.group_of == i)[0]) for i in range(cg.n_nodes)]
    assert first == sorted(first)
    assert cg.names.tolist() == g.names[first].tolist()


@settings(max_examples=80, deadline=None)
@given(random_dags(max_nodes=40, with_time=True), st.integers(1, 45), st.booleans())
def test_coarsening_random_dags(g, k, training):
    g = training_graph(g) if training else g
    check_coarsening(g, coarsen(g, k), k)


def layered_dag(n: int, seed: int = 0) -> OpGraph:
    """A long layered graph: every op feeds the next and one of the 40 ops after it."""
    rng = np.random.default_rng(seed)
    i = np.arange(n - 1)
    far = np.minimum(i + rng.integers(2, 40, n - 1), n - 1)
    src = np.concatenate([i, i[far > i + 1]])
    dst = np.concatenate([i + 1, far[far > i + 1]])
    ops = np.array(["Conv", "Relu", "MatMul", "Add", "Softmax"])[rng.integers(0, 5, n)]
    return OpGraph([f"op{k}" for k in range(n)], src, dst, op_types=ops,
                   flops=rng.integers(1, 1000, n).astype(float))


@pytest.mark.slow
def test_twenty_thousand_ops_coarsen_in_seconds():
    g = training_graph(layered_dag(10_000))
    for k in (2_000, 100):
        start = time.process_time()
        c = coarsen(g, k)
        assert time.process_time() - start < 20
        check_coarsening(g, c, k)
