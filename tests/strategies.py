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
    edge_prob: float | None = None,
    with_time: bool = False,
) -> OpGraph:
    """A random DAG: edges only from lower to higher index, then nodes shuffled.

    Costs are drawn so that every node does some work; names are random unique strings.
    """
    n = draw(st.integers(min_nodes, max_nodes))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    p = edge_prob if edge_prob is not None else draw(st.floats(0.05, 0.5))
    iu, ju = np.triu_indices(n, k=1)
    keep = rng.random(iu.size) < p
    src, dst = iu[keep], ju[keep]
    perm = rng.permutation(n)  # hide the topological numbering
    inv = np.empty(n, dtype=np.int64)
    inv[perm] = np.arange(n)
    out_bytes = rng.integers(1, 1 << 20, n).astype(float)
    return OpGraph(
        [f"n{rng.integers(1 << 30)}_{i}" for i in range(n)],
        inv[src], inv[dst],
        op_types=[OP_TYPES[k] for k in rng.integers(0, len(OP_TYPES), n)],
        flops=rng.integers(1, 1 << 30, n).astype(float)[perm],
        output_bytes=out_bytes[perm],
        param_bytes=rng.integers(0, 1 << 20, n).astype(float)[perm],
        time_us=(rng.uniform(1, 500, n) if with_time else None),
        edge_bytes=out_bytes[src],
        meta={"name": f"random{seed}", "family": "random", "source": "hypothesis"},
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
