"""Hypothesis strategies shared by the property tests: random DAGs with costs."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from travorder.graph import OpGraph

OP_TYPES = ("Conv", "MatMul", "Relu", "Add", "BatchNormalization", "Softmax", "Gemm")


@st.composite
def random_dags(
    draw: st.DrawFn,
    min_nodes: int = 1,
    max_nodes: int = 30,
    with_time: bool = False,
) -> OpGraph:
    """A random DAG: edges only from lower to higher index, then nodes shuffled.

    Everything is drawn from hypothesis itself (no numpy seed), so a failing example
    shrinks to a smaller graph: fewer nodes, fewer edges, the identity numbering, small
    costs. Every node does some work; names are unique strings unrelated to the order.
    """
    n = draw(st.integers(min_nodes, max_nodes))
    density = draw(st.integers(5, 50))  # percent of the earlier nodes joined, on average
    edges = []
    for j in range(n):  # node j's inputs among nodes 0..j-1; a draw shrunk to 0: no edge
        keep = draw(st.lists(st.integers(0, 99), min_size=j, max_size=j))
        edges += [(i, j) for i, k in enumerate(keep) if k >= 100 - density]
    perm = draw(st.permutations(range(n)))  # hide the topological numbering
    inv = np.empty(n, dtype=np.int64)
    inv[perm] = np.arange(n)

    def values(lo: int, hi: int) -> np.ndarray:
        return np.array(draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n)),
                        dtype=float)

    out_bytes = values(1, (1 << 20) - 1)
    tags = draw(st.lists(st.integers(0, 1 << 30), min_size=n, max_size=n))
    op_types = draw(st.lists(st.sampled_from(OP_TYPES), min_size=n, max_size=n))
    time_us = (draw(st.lists(st.floats(1.0, 500.0), min_size=n, max_size=n))
               if with_time else None)
    src = np.array([u for u, _ in edges], dtype=np.int64)
    dst = np.array([v for _, v in edges], dtype=np.int64)
    return OpGraph(
        [f"n{tag}_{i}" for i, tag in enumerate(tags)],
        inv[src], inv[dst],
        op_types=op_types,
        flops=values(1, (1 << 30) - 1)[list(perm)],
        output_bytes=out_bytes[list(perm)],
        param_bytes=values(0, (1 << 20) - 1)[list(perm)],
        time_us=time_us,
        edge_bytes=out_bytes[src] if edges else [],
        meta={"name": f"random{n}", "family": "random", "source": "hypothesis"},
    )


@st.composite
def dags_with_placement(
    draw: st.DrawFn, n_devices: int = 3, max_nodes: int = 30, with_time: bool = False
) -> tuple[OpGraph, np.ndarray]:
    """A random DAG and a random device per node in ``0..n_devices-1``."""
    g = draw(random_dags(max_nodes=max_nodes, with_time=with_time))
    placement = draw(st.lists(st.integers(0, n_devices - 1), min_size=g.n_nodes,
                              max_size=g.n_nodes))
    return g, np.array(placement, dtype=np.int64)
