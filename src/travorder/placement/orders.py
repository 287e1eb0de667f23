"""Traversal orders: the sequence in which a sequential placer visits the nodes.

`ORDERS` maps a name to a function ``(graph, seed=0) -> permutation of node indices``
(an ``np.int64`` array). Every order is a deterministic function of the graph (and of the
seed for ``random``); each docstring states how ties are broken. Where an order follows
networkx, node *insertion order* is the `OpGraph` index order and each node's successors
come in edge order, exactly as :meth:`OpGraph.to_networkx` builds the graph.

The study's six orders (`STUDY_ORDERS`) follow its definitions, quirks included, under
its names except one: the study's ``topo`` was networkx 2.4's ``topological_sort``, which
is `topo_lifo` here, while ``topo`` here is the FIFO Kahn order of `OpGraph.topo_order`;
so `STUDY_ORDERS` holds ``topo_lifo``. The study's ``reversed_topo`` reverses that LIFO
order, as `reversed_topo` does. See docs/orders.md.

>>> from travorder.graph import OpGraph
>>> g = OpGraph(["a", "b", "c", "d"], [0, 0, 1, 2], [1, 2, 3, 3])
>>> traversal_order(g, "topo").tolist(), traversal_order(g, "topo_lifo").tolist()
([0, 1, 2, 3], [0, 2, 1, 3])
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

import networkx as nx
import numpy as np

from travorder.errors import TravorderError, check_seed
from travorder.graph import OpGraph
from travorder.graph.opgraph import check_graph, kahn_order
from travorder.graph.pipeline import expand_order, micro_batch_graph, micro_batches

OrderFn = Callable[[OpGraph, int], np.ndarray]

#: The orders the study ran, as its code defines them; its ``topo`` is `topo_lifo`.
STUDY_ORDERS = ("alpha", "topo_lifo", "reversed_topo", "dfs_preorder", "dfs_postorder", "bfs")


def _perm(nodes: Iterable[int]) -> np.ndarray:
    return np.fromiter(nodes, dtype=np.int64)


def _index_digraph(g: OpGraph) -> nx.DiGraph:
    """A DiGraph on node indices with the insertion orders of `OpGraph.to_networkx`."""
    h = nx.DiGraph()
    h.add_nodes_from(range(g.n_nodes))
    h.add_edges_from(zip(g.src.tolist(), g.dst.tolist(), strict=True))
    return h


def topo(g: OpGraph, seed: int = 0) -> np.ndarray:
    """Kahn's algorithm with a FIFO queue; sources and newly freed nodes queue in index order.

    Identical to `OpGraph.topo_order`. Topological.
    """
    return g.topo_order.copy()


def topo_lifo(g: OpGraph, seed: int = 0) -> np.ndarray:
    """networkx 2.4's ``topological_sort``: Kahn's algorithm with a stack.

    The stack starts with the zero-in-degree nodes in index order and pops from the end;
    a visited node's successors are released in edge order and pushed as they reach in-degree
    zero, so the walk goes deep into the most recently freed branch first. This is the
    study's ``topo``. Topological.
    """
    return kahn_order(g, lifo=True)[0]


def reversed_topo(g: OpGraph, seed: int = 0) -> np.ndarray:
    """The study's ``reversed_topo``: `topo_lifo` reversed (sinks first; not topological)."""
    return topo_lifo(g)[::-1].copy()


def lexico_topo(g: OpGraph, seed: int = 0) -> np.ndarray:
    """networkx ``lexicographical_topological_sort`` keyed by node name.

    Among the nodes whose predecessors are all visited, the one with the smallest name
    (string comparison) goes next. Names are unique, so there are no further ties; the
    order depends on the names, as in the study. Topological.
    """
    names = g.names.tolist()
    return _perm(nx.lexicographical_topological_sort(_index_digraph(g), key=names.__getitem__))


def dfs_preorder(g: OpGraph, seed: int = 0) -> np.ndarray:
    """The study's ``nx.dfs_preorder_nodes(G)`` with no source.

    A depth-first search along out-edges is started from every not yet visited node in
    index order (not only from sources), children in edge order; nodes are listed when
    first reached. Not always topological: a node started from early can precede its
    predecessors.
    """
    return _perm(nx.dfs_preorder_nodes(_index_digraph(g)))


def dfs_postorder(g: OpGraph, seed: int = 0) -> np.ndarray:
    """The study's ``nx.dfs_postorder_nodes(G)``: the same search as `dfs_preorder`,
    listing a node when all its descendants are finished. Reverse-topological (sinks
    first), so never topological on a graph with an edge.
    """
    return _perm(nx.dfs_postorder_nodes(_index_digraph(g)))


def reverse_postorder(g: OpGraph, seed: int = 0) -> np.ndarray:
    """`dfs_postorder` reversed: the classic DFS topological order. Topological."""
    return dfs_postorder(g)[::-1].copy()


def bfs(g: OpGraph, seed: int = 0) -> np.ndarray:
    """The study's ``bfs``: one breadth-first search per source, each node where first found.

    Sources (in-degree zero) are taken in name order; each search runs along out-edges,
    children in edge order. The study ran a fresh BFS per source and dropped repeats; a
    node reachable from an earlier source has all its descendants reachable from it too,
    so skipping already-listed nodes gives the same list in linear time. Not always
    topological (a node is listed when its first predecessor is reached).
    """
    ptr, idx = (a.tolist() for a in g.succ_csr)
    sources = np.flatnonzero(g.in_degree == 0)
    sources = sources[np.argsort(g.names[sources], kind="stable")].tolist()
    seen = [False] * g.n_nodes
    order = []
    for r in sources:
        seen[r] = True
        order.append(r)
        queue = deque([r])
        while queue:
            u = queue.popleft()
            for v in idx[ptr[u]:ptr[u + 1]]:
                if not seen[v]:
                    seen[v] = True
                    order.append(v)
                    queue.append(v)
    return _perm(order)


def alpha(g: OpGraph, seed: int = 0) -> np.ndarray:
    """Node names sorted as strings (code-point order); names are unique. Not topological."""
    return np.argsort(g.names, kind="stable").astype(np.int64)


def bottom_levels(g: OpGraph, cost: np.ndarray | None = None) -> np.ndarray:
    """Longest path cost from each node to a sink, the node's own cost included."""
    cost = g.cost if cost is None else cost
    ptr, idx = g.succ_csr
    bl = np.zeros(g.n_nodes)
    for v in g.topo_order[::-1].tolist():
        succ = idx[ptr[v]:ptr[v + 1]]
        bl[v] = cost[v] + (bl[succ].max() if succ.size else 0.0)
    return bl


def critical_path(g: OpGraph, seed: int = 0) -> np.ndarray:
    """Descending bottom level (`bottom_levels` over `OpGraph.cost`), ties by `topo` position.

    Costs are non-negative, so along an edge ``u -> v`` the bottom level never increases
    (``bl[u] >= cost[u] + bl[v] >= bl[v]``, also in floating point) and equal levels fall
    back to `topo` positions: the order is always topological.
    """
    pos = np.empty(g.n_nodes, dtype=np.int64)
    pos[g.topo_order] = np.arange(g.n_nodes)
    return np.lexsort((pos, -bottom_levels(g))).astype(np.int64)


def random(g: OpGraph, seed: int = 0) -> np.ndarray:
    """A uniform random permutation from ``numpy.random.default_rng(seed)``."""
    return np.random.default_rng(seed).permutation(g.n_nodes).astype(np.int64)


#: Order name -> function(graph, seed=0) -> permutation of node indices.
ORDERS: dict[str, OrderFn] = {
    "topo": topo,
    "topo_lifo": topo_lifo,
    "reversed_topo": reversed_topo,
    "lexico_topo": lexico_topo,
    "dfs_preorder": dfs_preorder,
    "dfs_postorder": dfs_postorder,
    "reverse_postorder": reverse_postorder,
    "bfs": bfs,
    "alpha": alpha,
    "critical_path": critical_path,
    "random": random,
}

#: Orders that are topological on every DAG.
TOPOLOGICAL_ORDERS = frozenset(
    {"topo", "topo_lifo", "lexico_topo", "reverse_postorder", "critical_path"})


def identical_orders(g: OpGraph, names: Iterable[str] = STUDY_ORDERS,
                     seed: int = 0) -> list[tuple[str, ...]]:
    """The orders among ``names`` that give `g` the same node sequence, grouped.

    Groups keep the order of ``names``; orders that match no other are left out. A
    sequential placer makes the same decisions under every order of a group.

    >>> g = OpGraph(["a", "b", "c"], [0, 0], [1, 2])
    >>> identical_orders(g)
    [('alpha', 'dfs_preorder', 'bfs'), ('reversed_topo', 'dfs_postorder')]
    """
    groups: dict[bytes, list[str]] = {}
    for name in names:
        groups.setdefault(traversal_order(g, name, seed).tobytes(), []).append(name)
    return [tuple(group) for group in groups.values() if len(group) > 1]


def get_order(name: str) -> OrderFn:
    """The order function registered under `name`.

    Raises :class:`~travorder.errors.TravorderError` listing the valid names otherwise.
    """
    try:
        return ORDERS[name]
    except (KeyError, TypeError):
        raise TravorderError(
            f"unknown order {name!r}; valid orders: {', '.join(sorted(ORDERS))}") from None


def check_visit(g: OpGraph, order: object) -> np.ndarray:
    """``order`` as int64 if it is a permutation of ``g``'s node indices (what
    `traversal_order` returns and a placer visits), else a `TravorderError`.

    >>> from travorder.graph import OpGraph
    >>> check_visit(OpGraph(["a", "b"], [0], [1]), [1, 0]).tolist()
    [1, 0]
    """
    a = np.asarray(order)
    n = check_graph(g, "a placer").n_nodes
    if a.shape != (n,) or (n and a.dtype.kind not in "iu") or not np.array_equal(
            np.sort(a), np.arange(n)):  # [0, 0, 1] would leave a node unplaced (-1)
        raise TravorderError(f"a visiting order is a permutation of the {n} node indices "
                             f"(traversal_order gives one), got {str(a.tolist())[:60]}")
    return a.astype(np.int64, copy=False)


def traversal_order(g: OpGraph, name: str, seed: int = 0) -> np.ndarray:
    """The permutation of `g`'s node indices that order `name` visits (see `ORDERS`).

    On a pipelined graph (`travorder.graph.pipeline`) the order is that of micro-batch 0's
    graph, each node followed by its copies in micro-batch order. Raises TravorderError
    for an unknown order or a seed that is not a non-negative int.
    """
    seed = check_seed(seed)
    m = micro_batches(check_graph(g, "traversal_order"))
    if m == 1:
        return get_order(name)(g, seed)
    return expand_order(get_order(name)(micro_batch_graph(g), seed), g.n_nodes // m, m)
