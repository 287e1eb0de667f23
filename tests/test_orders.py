"""Traversal orders: permutations, topological or not, tie-breaking, the study's definitions."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings

from travorder.errors import TravorderError
from travorder.graph import OpGraph
from travorder.placement.orders import (
    ORDERS,
    STUDY_ORDERS,
    TOPOLOGICAL_ORDERS,
    bottom_levels,
    get_order,
    identical_orders,
    traversal_order,
)

from .strategies import random_dags


def nx24_topological_sort(G: nx.DiGraph) -> list:
    """networkx 2.4's ``topological_sort`` as documented there: zero-in-degree nodes in node
    order on a list used as a stack (``pop()`` from the end); a popped node's children, in
    adjacency order, are appended when their remaining in-degree reaches zero."""
    indegree_map = {v: d for v, d in G.in_degree() if d > 0}
    zero_indegree = [v for v, d in G.in_degree() if d == 0]
    out = []
    while zero_indegree:
        node = zero_indegree.pop()
        for _, child in G.edges(node):
            indegree_map[child] -= 1
            if indegree_map[child] == 0:
                zero_indegree.append(child)
                del indegree_map[child]
        out.append(node)
    return out


def study_bfs(G: nx.DiGraph) -> list:
    """The study's ``bfs_sort``: a BFS per source (sorted), first occurrence kept."""
    with_duplicates = []
    for source in sorted(v for v, d in G.in_degree() if d == 0):
        with_duplicates.append(source)
        with_duplicates += [v for _, v in nx.bfs_edges(G, source)]
    seen: set = set()
    return [v for v in with_duplicates if not (v in seen or seen.add(v))]


def with_costs(g: OpGraph, flops: object = None, time_us: object = None) -> OpGraph:
    """The same structure with other costs."""
    return OpGraph(g.names, g.src, g.dst, flops=g.flops if flops is None else flops,
                   time_us=time_us)


def as_indices(g: OpGraph, names: list) -> list[int]:
    return [g.index[v] for v in names]


def is_topological(g: OpGraph, order: np.ndarray) -> bool:
    pos = np.empty(g.n_nodes, dtype=np.int64)
    pos[order] = np.arange(g.n_nodes)
    return bool(np.all(pos[g.src] < pos[g.dst]))


# index: name -- edges in this order: in->m, in->z, m->a, z->out, a->out
HAND = OpGraph(["in", "m", "z", "a", "out"], [0, 0, 1, 2, 3], [1, 2, 3, 4, 4],
               flops=[1, 1, 5, 1, 1], meta={"name": "hand"})


@pytest.mark.parametrize(("name", "expected"), [
    ("topo", [0, 1, 2, 3, 4]),            # FIFO: m and z freed together, by index
    ("topo_lifo", [0, 2, 1, 3, 4]),       # stack: z pushed last, visited first
    ("reversed_topo", [4, 3, 1, 2, 0]),
    ("lexico_topo", [0, 1, 3, 2, 4]),     # a < z once m is visited
    ("dfs_preorder", [0, 1, 3, 4, 2]),
    ("dfs_postorder", [4, 3, 1, 2, 0]),
    ("reverse_postorder", [0, 2, 1, 3, 4]),
    ("bfs", [0, 1, 2, 3, 4]),
    ("alpha", [3, 0, 1, 4, 2]),           # a, in, m, out, z
    ("critical_path", [0, 2, 1, 3, 4]),   # bottom levels 7, 3, 6, 2, 1
])
def test_hand_example(name: str, expected: list[int]) -> None:
    assert traversal_order(HAND, name).tolist() == expected


def test_bottom_levels_hand() -> None:
    assert bottom_levels(HAND).tolist() == [7.0, 3.0, 6.0, 2.0, 1.0]


def test_critical_path_uses_time_us_when_every_node_has_it() -> None:
    g = with_costs(HAND, time_us=[1.0, 9.0, 1.0, 3.0, 1.0])
    assert traversal_order(g, "critical_path").tolist() == [0, 1, 3, 2, 4]
    partial = with_costs(HAND, time_us=[1.0, 9.0, np.nan, 1.0, 1.0])  # falls back to flops
    assert traversal_order(partial, "critical_path").tolist() == [0, 2, 1, 3, 4]


def test_critical_path_ties_by_topo_position() -> None:
    # equal bottom levels for the two branches; index order differs from topo order
    g = OpGraph(["s", "late", "early", "x"], [0, 0, 2], [2, 3, 1], flops=[1, 1, 1, 2])
    assert g.topo_order.tolist() == [0, 2, 3, 1]
    assert bottom_levels(g).tolist() == [3.0, 1.0, 2.0, 2.0]
    assert traversal_order(g, "critical_path").tolist() == [0, 2, 3, 1]


def test_bfs_sources_by_name_and_not_topological() -> None:
    # sources "s2" (index 0) and "s1" (index 1): s1's search goes first
    g = OpGraph(["s2", "s1", "x"], [0, 1], [2, 2])
    assert traversal_order(g, "bfs").tolist() == [1, 2, 0]
    # x (3) is found through m before its other predecessor y (4) is listed
    g = OpGraph(["s", "m", "n", "x", "y"], [0, 0, 1, 2, 4], [1, 2, 3, 4, 3])
    order = traversal_order(g, "bfs")
    assert order.tolist() == [0, 1, 2, 3, 4]
    assert not is_topological(g, order)


def test_dfs_preorder_starts_from_every_node_in_index_order() -> None:
    g = OpGraph(["b", "a"], [1], [0])  # a -> b, but b has the lower index
    assert traversal_order(g, "dfs_preorder").tolist() == [0, 1]
    assert traversal_order(g, "reverse_postorder").tolist() == [1, 0]


def test_topo_lifo_goes_deep_into_last_branch() -> None:
    # two chains from one root: LIFO finishes the second chain before starting the first
    g = OpGraph(["r", "a1", "a2", "b1", "b2"], [0, 1, 0, 3], [1, 2, 3, 4])
    assert traversal_order(g, "topo_lifo").tolist() == [0, 3, 4, 1, 2]
    assert traversal_order(g, "topo").tolist() == [0, 1, 3, 2, 4]


def test_study_orders_registered() -> None:
    assert set(STUDY_ORDERS) <= set(ORDERS)
    assert len(STUDY_ORDERS) == 6
    assert set(ORDERS) >= TOPOLOGICAL_ORDERS


def test_study_orders_are_the_published_ones() -> None:
    # the study's topo is networkx 2.4's LIFO order, its reversed_topo that order reversed
    assert STUDY_ORDERS == ("alpha", "topo_lifo", "reversed_topo", "dfs_preorder",
                            "dfs_postorder", "bfs")


def test_reversed_topo_and_dfs_postorder_differ_when_the_search_starts_inside() -> None:
    # c -> a: the search starts at a (index 0), which has a predecessor
    g = OpGraph(["a", "b", "c"], [2], [0])
    assert traversal_order(g, "reversed_topo").tolist() == [1, 0, 2]
    assert traversal_order(g, "dfs_postorder").tolist() == [0, 1, 2]
    assert identical_orders(g) == [("alpha", "dfs_preorder", "dfs_postorder")]
    tree = OpGraph(["a", "b", "c", "d"], [0, 0, 1], [1, 2, 3])
    assert ("reversed_topo", "dfs_postorder") in identical_orders(tree)


@settings(max_examples=60, deadline=None)
@given(random_dags(max_nodes=25))
def test_every_order_is_a_permutation_and_topological_ones_are(g: OpGraph) -> None:
    for name in ORDERS:
        order = traversal_order(g, name, seed=3)
        assert order.dtype == np.int64
        assert sorted(order.tolist()) == list(range(g.n_nodes)), name
        if name in TOPOLOGICAL_ORDERS:
            assert is_topological(g, order), name
    assert traversal_order(g, "topo").tolist() == g.topo_order.tolist()
    if g.n_edges:
        assert not is_topological(g, traversal_order(g, "dfs_postorder"))
        assert not is_topological(g, traversal_order(g, "reversed_topo"))


@settings(max_examples=60, deadline=None)
@given(random_dags(max_nodes=25))
def test_study_orders_match_the_study_code(g: OpGraph) -> None:
    G = g.to_networkx()  # keys are names, in index order; successors in edge order
    assert traversal_order(g, "topo_lifo").tolist() == as_indices(g, nx24_topological_sort(G))
    assert traversal_order(g, "reversed_topo").tolist() == as_indices(
        g, nx24_topological_sort(G)[::-1])
    assert traversal_order(g, "dfs_preorder").tolist() == as_indices(
        g, list(nx.dfs_preorder_nodes(G)))
    assert traversal_order(g, "dfs_postorder").tolist() == as_indices(
        g, list(nx.dfs_postorder_nodes(G)))
    assert traversal_order(g, "bfs").tolist() == as_indices(g, study_bfs(G))
    assert traversal_order(g, "lexico_topo").tolist() == as_indices(
        g, list(nx.lexicographical_topological_sort(G)))
    assert traversal_order(g, "alpha").tolist() == as_indices(g, sorted(G.nodes))


@settings(max_examples=40, deadline=None)
@given(random_dags(max_nodes=25))
def test_zero_costs_make_critical_path_the_topo_order(g: OpGraph) -> None:
    z = with_costs(g, flops=np.zeros(g.n_nodes))
    assert traversal_order(z, "critical_path").tolist() == g.topo_order.tolist()


def test_deterministic_per_seed() -> None:
    g = OpGraph([f"n{i}" for i in range(50)], np.arange(49), np.arange(1, 50))
    for name in ORDERS:
        assert traversal_order(g, name, 7).tolist() == traversal_order(g, name, 7).tolist()
    assert traversal_order(g, "random", 1).tolist() != traversal_order(g, "random", 2).tolist()
    assert traversal_order(g, "topo", 1).tolist() == traversal_order(g, "topo", 2).tolist()


def test_unknown_order_lists_the_valid_names() -> None:
    with pytest.raises(TravorderError, match=r"unknown order 'depth'; valid orders: alpha, bfs"):
        get_order("depth")
    with pytest.raises(TravorderError, match="unknown order"):
        traversal_order(HAND, "Topo")
