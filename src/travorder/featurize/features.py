"""The graph feature vector: structure, costs and op mix of an `OpGraph`.

`graph_features` returns one float per name of `FEATURE_NAMES`, in that order;
docs/features.md defines every feature and says why it may matter for the traversal
order. Any change to the names, their order or their definitions bumps
`FEATURE_SCHEMA_VERSION`, so that a predictor trained on one schema refuses another.

Features depend only on the graph's structure and attributes, never on node names or on
the order nodes are numbered: sums are taken over sorted values, so even floating-point
totals come out bit-identical for a renamed or shuffled graph.

>>> from travorder.graph import OpGraph
>>> g = OpGraph.from_records(
...     [{"name": "a", "op_type": "Conv", "flops": 6},
...      {"name": "b", "op_type": "Relu", "flops": 2},
...      {"name": "c", "op_type": "Add", "flops": 2}],
...     [("a", "b", 4), ("b", "c", 4), ("a", "c", 4)])
>>> f = graph_features(g)
>>> f["depth"], f["n_skip"], f["parallelism"], f["bytes_per_cost"]
(3.0, 1.0, 1.0, 1.2)
"""

from __future__ import annotations

import math

import numpy as np

from travorder.errors import GraphError
from travorder.featurize.optypes import OP_CATEGORIES, op_categories
from travorder.graph import OpGraph
from travorder.graph.opgraph import check_graph

#: Version of the feature definitions; bump it on any change to `FEATURE_NAMES` or to
#: what a feature means.
FEATURE_SCHEMA_VERSION = 1

#: Feature names, in the order of `feature_vector`.
FEATURE_NAMES: tuple[str, ...] = (
    "n_nodes", "n_edges", "log_n_nodes", "log_n_edges", "edges_per_node",
    "depth", "depth_share", "width", "width_share",
    "level_size_mean", "level_size_std", "level_size_cv",
    "fan_in_mean", "fan_in_std", "fan_in_max",
    "fan_out_mean", "fan_out_std", "fan_out_max",
    "n_branch", "branch_share", "n_merge", "merge_share",
    "n_skip", "skip_share", "skip_span_mean", "skip_span_max",
    "skip_span_mean_norm", "skip_span_max_norm",
    "n_sources", "source_share", "n_sinks", "sink_share",
    "cost_is_time", "cost_total", "critical_path_cost", "parallelism",
    "comm_bytes_total", "bytes_per_cost", "param_bytes_total",
    "cost_gini", "cost_top10_share",
    *(f"op_{c}_share" for c in OP_CATEGORIES),
    "backward_share",
)


def _total(x: np.ndarray) -> float:
    """Sum in sorted order: the same bits whatever the node order."""
    return float(np.sort(x).sum())


def _stats(x: np.ndarray) -> tuple[float, float]:
    """Mean and (population) standard deviation; 0 for an empty array."""
    if x.size == 0:
        return 0.0, 0.0
    x = np.sort(x.astype(np.float64))
    mean = float(x.sum()) / x.size
    return mean, math.sqrt(float(np.sort((x - mean) ** 2).sum()) / x.size)


def _ratio(a: float, b: float, empty: float = 0.0) -> float:
    return a / b if b else empty


def critical_path_cost(g: OpGraph, cost: np.ndarray) -> float:
    """The largest total ``cost`` along any path of ``g``, level by level."""
    lev = g.levels
    if g.n_nodes == 0:
        return 0.0
    depth = int(lev.max()) + 1
    by_level = np.argsort(lev, kind="stable")
    node_bounds = np.searchsorted(lev[by_level], np.arange(depth + 1))
    edges = np.argsort(lev[g.dst], kind="stable")
    src, dst = g.src[edges], g.dst[edges]
    edge_bounds = np.searchsorted(lev[dst], np.arange(depth + 1))
    finish = cost.astype(np.float64)
    ready = np.zeros(g.n_nodes)
    for lv in range(1, depth):
        e = slice(edge_bounds[lv], edge_bounds[lv + 1])
        np.maximum.at(ready, dst[e], finish[src[e]])
        nodes = by_level[node_bounds[lv]:node_bounds[lv + 1]]
        finish[nodes] += ready[nodes]
    return float(finish.max())


def _gini(x: np.ndarray) -> float:
    """Gini coefficient of non-negative values (0: all equal, near 1: one holds all)."""
    x = np.sort(x)
    if x.size == 0 or not x[-1] > 0:
        return 0.0
    x = x / x[-1]  # scale-free, and no overflow for costs near the float limit
    ranks = np.arange(1, x.size + 1)
    return float(2 * (ranks * x).sum() / (x.size * x.sum()) - (x.size + 1) / x.size)


def graph_features(g: OpGraph) -> dict[str, float]:
    """The features of ``g`` as ``{name: value}`` in `FEATURE_NAMES` order.

    Raises :class:`~travorder.errors.GraphError` for a graph without nodes.
    """
    check_graph(g, "graph_features")
    n, m = g.n_nodes, g.n_edges
    if n == 0:
        raise GraphError("cannot featurize a graph without nodes")
    lev = g.levels
    depth = int(lev.max()) + 1
    level_sizes = np.bincount(lev)
    size_mean, size_std = _stats(level_sizes)
    fan_in, fan_out = g.in_degree, g.out_degree
    in_mean, in_std = _stats(fan_in[fan_in > 0])
    out_mean, out_std = _stats(fan_out[fan_out > 0])
    span = lev[g.dst] - lev[g.src]
    skip = span[span > 1]
    skip_mean = _stats(skip)[0]
    skip_max = float(skip.max(initial=0))
    n_branch, n_merge = int((fan_out > 1).sum()), int((fan_in > 1).sum())
    n_sources, n_sinks = int((fan_in == 0).sum()), int((fan_out == 0).sum())

    cost = g.cost
    cost_total = _total(cost)
    critical = critical_path_cost(g, cost)
    comm = _total(g.edge_bytes)
    top = np.sort(cost)[::-1][: math.ceil(0.1 * n)]
    mix = np.bincount(op_categories(g), minlength=len(OP_CATEGORIES)) / n

    values = [
        n, m, math.log1p(n), math.log1p(m), m / n,
        depth, depth / n, level_sizes.max(), level_sizes.max() / n,
        size_mean, size_std, _ratio(size_std, size_mean),
        in_mean, in_std, fan_in.max(),
        out_mean, out_std, fan_out.max(),
        n_branch, n_branch / n, n_merge, n_merge / n,
        skip.size, _ratio(skip.size, m), skip_mean, skip_max,
        _ratio(skip_mean, depth - 1), _ratio(skip_max, depth - 1),
        n_sources, n_sources / n, n_sinks, n_sinks / n,
        float(not np.isnan(g.time_us).any()), cost_total, critical,
        _ratio(cost_total, critical, empty=1.0),
        comm, _ratio(comm, cost_total), _total(g.param_bytes),
        _gini(cost), _ratio(_total(top), cost_total),
        *mix.tolist(),
        float(g.is_backward.mean()),
    ]
    return dict(zip(FEATURE_NAMES, map(float, values), strict=True))


def feature_vector(g: OpGraph) -> np.ndarray:
    """`graph_features` as a float64 array in `FEATURE_NAMES` order."""
    return np.fromiter(graph_features(g).values(), dtype=np.float64, count=len(FEATURE_NAMES))
