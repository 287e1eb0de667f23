"""Coarsening: merge ops into groups so that placers see a smaller graph.

`coarsen(g, max_nodes)` contracts ``g`` until at most ``max_nodes`` groups remain, in
four phases, each stopping as soon as the target is met:

1. **fuse**: in topological order, an op whose type is in `FUSIBLE_OP_TYPES`
   (elementwise, normalisation and view ops) joins its producer when all its inputs come
   from one group;
2. **chains**: an edge ``u -> v`` where ``u`` has one successor and ``v`` one
   predecessor is contracted, cheapest pair first;
3. **neighbours**: the cheapest group merges with a neighbour: its cheapest neighbour if
   that keeps the graph acyclic, else its nearest successor or nearest predecessor in
   topological order, the cheaper pair first (both are always safe, see below);
4. **fallback**: if the target is still not met (several weakly connected components,
   or forward and backward ops that cannot be separated), groups adjacent in a
   topological order of the contracted graph are merged, cheapest pair first.

"Cheapest" is by summed `OpGraph.cost`. Phases 1-3 never merge a forward op with a backward
op; phase 4 does only when no same-direction pair is adjacent in its order. Every
contraction keeps the graph acyclic, so any ``max_nodes >= 1`` is reached, exactly.

Acyclicity: contracting an edge ``u -> v`` closes a cycle iff another path leads from
``u`` to ``v``. Every group keeps a position in a topological order of the contracted
graph. Such a path would start with a successor of ``u`` positioned before ``v`` and end
with a predecessor of ``v`` positioned after ``u``. If either does not exist (``v`` is
``u``'s nearest successor, or ``u`` is ``v``'s nearest predecessor, as in phases 1 and 2)
the contraction is safe and the merged group takes ``v``'s (resp. ``u``'s) position, in
constant time per neighbour. Otherwise a search visits the groups positioned between
``u`` and ``v`` (looking at no more than `CHECK_LIMIT` edges, else the contraction is
skipped) and the order is repaired as in Pearce and Kelly's dynamic topological sort
(JEA 2006). A 20,000-op graph coarsens in one to two seconds.

A group becomes one node of the coarse graph:

- ``name``: its first member's (lowest index) name; groups are numbered in that order;
- ``op_type`` and ``is_backward``: those of its costliest member;
- ``flops``, ``param_bytes``, ``time_us``: sums over members (``time_us`` is NaN if a
  member's is);
- ``output_bytes``: the outputs that leave the group: of members with an edge to
  another group or with no successor at all;
- ``colocation``: members' colocation groups are joined into classes (a group holding
  members of groups 3 and 5 ties 3 and 5 together), and every group touching a class gets
  the class's smallest id; -1 if no member is colocated. A coarse placement that honours
  this honours the original colocation.
- edges: one per pair of groups; a member's tensor is sent once to each consuming group
  (the largest bytes of its edges to that group), summed over the members.

>>> from travorder.graph.opgraph import OpGraph, _frozen
>>> g = OpGraph.from_records(
...     [{"name": "conv", "op_type": "Conv", "flops": 90},
...      {"name": "relu", "op_type": "Relu", "flops": 1},
...      {"name": "fc", "op_type": "Gemm", "flops": 50}],
...     [("conv", "relu"), ("relu", "fc")])
>>> c = coarsen(g, 2)
>>> c.graph.names.tolist(), c.graph.flops.tolist(), c.group_of.tolist()
(['conv', 'fc'], [91.0, 50.0], [0, 0, 1])
>>> c.expand([1, 0]).tolist()
[1, 1, 0]
"""

from __future__ import annotations

import heapq
import itertools
import operator
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from travorder.errors import GraphError
from travorder.graph.opgraph import OpGraph, _frozen, check_graph
from travorder.graph.pipeline import unpipelined_meta

#: Op types (compared case-insensitively) that phase 1 fuses into their producer.
FUSIBLE_OP_TYPES = frozenset(
    x.lower()
    for x in (
        # activations and elementwise arithmetic
        "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu", "Gelu", "Sigmoid",
        "HardSigmoid", "HardSwish", "Tanh", "Softplus", "Softsign", "Mish", "Clip", "Add",
        "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Exp", "Log", "Neg", "Abs",
        "Erf", "Cast", "Dropout",
        # normalisation
        "BatchNormalization", "LayerNormalization", "InstanceNormalization",
        "GroupNormalization",
        # views
        "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose",
    )
)


#: Most edges one acyclicity check may look at; a contraction that needs more is
#: skipped, which keeps coarsening near-linear.
CHECK_LIMIT = 256


@dataclass(frozen=True, eq=False)
class Coarsening:
    """The result of `coarsen`: the coarse graph and the op -> group mapping.

    ``graph`` is the coarse `OpGraph` (one node per group), ``group_of[i]`` the group of
    op ``i`` of ``original``.
    """

    graph: OpGraph
    group_of: np.ndarray
    original: OpGraph

    def expand(self, group_placement: np.ndarray) -> np.ndarray:
        """Per-op values (e.g. devices) from per-group values: ``group_placement[group_of]``."""
        p = np.asarray(group_placement)
        if p.shape != (self.graph.n_nodes,):
            raise GraphError(
                f"a placement of the coarse graph needs {self.graph.n_nodes} values, "
                f"got shape {p.shape}"
            )
        return p[self.group_of]


class _Quotient:
    """The contracted graph while groups merge.

    Groups are named by a representative op (union-find). Each live group has successor
    and predecessor sets, a cost, a direction mask (1 forward, 2 backward) and a
    topological position (distinct integers, increasing along every edge).
    """

    def __init__(self, g: OpGraph, cost: np.ndarray) -> None:
        n = g.n_nodes
        self.succ: list[set[int]] = [set() for _ in range(n)]
        self.pred: list[set[int]] = [set() for _ in range(n)]
        for u, v in zip(g.src.tolist(), g.dst.tolist(), strict=True):
            self.succ[u].add(v)
            self.pred[v].add(u)
        self.pos = [0] * n
        for i, v in enumerate(g.topo_order.tolist()):
            self.pos[v] = i
        self.cost = cost.tolist()
        self.mask = np.where(g.is_backward, 2, 1).tolist()
        self.parent = list(range(n))
        self.n_groups = n

    def find(self, x: int) -> int:
        parent = self.parent
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def alive(self) -> list[int]:
        return [x for x in range(len(self.parent)) if self.parent[x] == x]

    def _union(self, x: int, y: int) -> None:
        """Absorb group ``x`` into group ``y`` (bookkeeping shared by all phases)."""
        self.cost[y] += self.cost[x]
        self.mask[y] |= self.mask[x]
        self.parent[x] = y
        self.n_groups -= 1

    def _within(self, start: int, nbrs: list[set[int]], inside: Callable[[int], bool],
                stop: int) -> set[int] | None:
        """Groups reachable from ``start`` through ``nbrs`` while ``inside`` holds.

        None if ``stop`` is reached or the search looks at more than `CHECK_LIMIT` edges.
        """
        seen: set[int] = set()
        stack = [start]
        budget = CHECK_LIMIT
        while stack:
            x = stack.pop()
            budget -= len(nbrs[x])
            if budget < 0:
                return None
            for y in nbrs[x]:
                if y == stop and x != start:
                    return None
                if y not in seen and inside(y):
                    seen.add(y)
                    stack.append(y)
        return seen

    def contract(self, a: int, b: int) -> int | None:
        """Contract edge ``a -> b`` unless another path ``a ~> b`` may exist.

        Returns the surviving group, or None (nothing changed) if the contraction would
        close a cycle or its check would look at more than `CHECK_LIMIT` edges.
        """
        succ, pred, pos = self.succ, self.pred, self.pos
        lo, hi = pos[a], pos[b]
        if not any(pos[p] > lo for p in pred[b]):
            keep_pos = lo  # a is b's nearest predecessor
        elif not any(pos[s] < hi for s in succ[a]):
            keep_pos = hi  # b is a's nearest successor
        else:
            # F: groups reachable from a, positioned before b; reaching b means a cycle.
            # B: ancestors of b positioned after a (none is in F). Reorder B < a+b < F.
            fwd = self._within(a, succ, lambda x: pos[x] < hi, b)
            bwd = None if fwd is None else self._within(b, pred, lambda x: pos[x] > lo, a)
            if fwd is None or bwd is None:
                return None
            before = sorted(bwd, key=pos.__getitem__)
            after = sorted(fwd, key=pos.__getitem__)
            slots = sorted([lo, hi, *(pos[x] for x in before), *(pos[x] for x in after)])
            for x, s in zip(before, slots[1:], strict=False):
                pos[x] = s
            keep_pos = slots[len(before) + 1]
            for x, s in zip(after, slots[len(before) + 2:], strict=True):
                pos[x] = s
        x, y = (a, b) if len(succ[a]) + len(pred[a]) < len(succ[b]) + len(pred[b]) else (b, a)
        for s in succ[x]:
            pred[s].discard(x)
            if s != y:
                pred[s].add(y)
                succ[y].add(s)
        for p in pred[x]:
            succ[p].discard(x)
            if p != y:
                succ[p].add(y)
                pred[y].add(p)
        succ[x] = pred[x] = set()
        pos[y] = keep_pos
        self._union(x, y)
        return y

    def fuse(self, g: OpGraph, target: int) -> None:
        """Phase 1: fusible ops join their single producing group, in topological order."""
        fusible = np.isin(np.char.lower(g.op_types), list(FUSIBLE_OP_TYPES)).tolist()
        for v in g.topo_order.tolist():
            if self.n_groups <= target:
                return
            # v is still a singleton: merges so far only touched ops before it.
            if fusible[v] and len(self.pred[v]) == 1:
                (u,) = self.pred[v]
                if self.mask[u] == self.mask[v]:
                    self.contract(u, v)

    def chain_edges(self, y: int) -> list[tuple[int, int]]:
        """The edges at ``y`` that link a chain (one successor -> one predecessor)."""
        succ, pred, mask = self.succ, self.pred, self.mask
        out = []
        if len(succ[y]) == 1:
            (s,) = succ[y]
            if len(pred[s]) == 1 and mask[s] == mask[y]:
                out.append((y, s))
        if len(pred[y]) == 1:
            (p,) = pred[y]
            if len(succ[p]) == 1 and mask[p] == mask[y]:
                out.append((p, y))
        return out

    def merge_chains(self, target: int) -> None:
        """Phase 2: contract chain links, cheapest pair first.

        A group's cost only grows, so a heap key is a lower bound: an outdated entry is
        pushed again with its current key when popped (lazy re-keying).
        """
        cost, find = self.cost, self.find
        heap = [(cost[a] + cost[b], a, b) for x in self.alive()
                for a, b in self.chain_edges(x) if a == x]
        heapq.heapify(heap)
        while heap and self.n_groups > target:
            key, a, b = heapq.heappop(heap)
            a, b = find(a), find(b)
            if (a, b) not in self.chain_edges(a):
                continue
            if key < cost[a] + cost[b]:
                heapq.heappush(heap, (cost[a] + cost[b], a, b))
                continue
            y = self.contract(a, b)
            if y is not None:
                for u, v in self.chain_edges(y):
                    heapq.heappush(heap, (cost[u] + cost[v], u, v))

    def _partners(self, g: int) -> list[tuple[int, int]]:
        """Edges to try for group ``g``: to its cheapest neighbour, then to its nearest
        successor and predecessor (cheaper first); same direction only."""
        pos, cost, m = self.pos, self.cost, self.mask[g]
        succ = [s for s in self.succ[g] if self.mask[s] == m]
        pred = [p for p in self.pred[g] if self.mask[p] == m]
        near = []
        if succ:
            near.append((g, min(succ, key=pos.__getitem__)))
        if pred:
            near.append((max(pred, key=pos.__getitem__), g))
        near.sort(key=lambda e: (cost[e[0]] + cost[e[1]], pos[e[0]]))
        edges = [(g, s) for s in succ] + [(p, g) for p in pred]
        if edges:
            cheapest = min(edges, key=lambda e: (cost[e[0]] + cost[e[1]], pos[e[0]]))
            if cheapest not in near:
                near.insert(0, cheapest)
        return near

    def merge_neighbours(self, target: int) -> None:
        """Phase 3: the cheapest group merges with a neighbour (see the module docstring).

        A group with no acceptable partner waits until one of its neighbours changes.
        """
        cost, parent = self.cost, self.parent
        heap = [(cost[x], x) for x in self.alive()]
        heapq.heapify(heap)
        waiting: set[int] = set()
        while heap and self.n_groups > target:
            key, g = heapq.heappop(heap)
            if parent[g] != g:
                continue
            if key < cost[g]:
                heapq.heappush(heap, (cost[g], g))
                continue
            y = next((y for a, b in self._partners(g)
                      if (y := self.contract(a, b)) is not None), None)
            if y is None:
                waiting.add(g)
                continue
            heapq.heappush(heap, (cost[y], y))
            waiting.discard(y)
            for z in waiting & (self.succ[y] | self.pred[y]):
                waiting.discard(z)
                heapq.heappush(heap, (cost[z], z))

    def merge_consecutive(self, target: int) -> None:
        """Phase 4: merge groups adjacent in topological order, same direction first."""
        order = sorted(self.alive(), key=self.pos.__getitem__)
        nxt: dict[int, int | None] = dict(zip(order, [*order[1:], None], strict=True))
        prv: dict[int, int | None] = dict(zip(order, [None, *order[:-1]], strict=True))
        cost, mask, parent = self.cost, self.mask, self.parent

        def key(a: int, b: int) -> tuple[bool, float]:
            return mask[a] != mask[b], cost[a] + cost[b]

        heap = [(*key(a, b), a, b) for a, b in itertools.pairwise(order)]
        heapq.heapify(heap)
        while self.n_groups > target:
            *k, a, b = heapq.heappop(heap)
            if parent[a] != a or nxt[a] != b or tuple(k) != key(a, b):
                continue  # outdated: every merge pushes its new pairs afresh
            self._union(b, a)
            nxt[a] = nxt[b]
            if nxt[b] is not None:
                prv[nxt[b]] = a
            for u, v in ((prv[a], a), (a, nxt[a])):
                if u is not None and v is not None:
                    heapq.heappush(heap, (*key(u, v), u, v))


def coarsen(g: OpGraph, max_nodes: int) -> Coarsening:
    """Merge the ops of ``g`` into at most ``max_nodes`` groups (see the module docstring).

    Returns the identity mapping with ``graph`` = ``g`` itself if ``g`` is small enough.
    """
    check_graph(g, "coarsen")
    try:
        if isinstance(max_nodes, bool | np.bool_):  # True is no count of nodes
            raise TypeError
        max_nodes = operator.index(max_nodes)
    except TypeError:
        raise GraphError(f"max_nodes must be an integer, not {max_nodes!r}") from None
    if max_nodes < 1:
        raise GraphError(f"max_nodes must be at least 1, not {max_nodes}")
    n = g.n_nodes
    if n <= max_nodes:
        return Coarsening(g, _frozen(np.arange(n, dtype=np.int64)), g)

    q = _Quotient(g, g.cost.copy())
    q.fuse(g, max_nodes)
    q.merge_chains(max_nodes)
    q.merge_neighbours(max_nodes)
    if q.n_groups > max_nodes:
        q.merge_consecutive(max_nodes)

    roots = np.array([q.find(x) for x in range(n)], dtype=np.int64)
    _, first, inverse = np.unique(roots, return_index=True, return_inverse=True)
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first)] = np.arange(first.size)
    group_of = rank[inverse]
    return Coarsening(_group_graph(g, group_of, max_nodes), _frozen(group_of), g)


def _group_graph(g: OpGraph, group_of: np.ndarray, max_nodes: int) -> OpGraph:
    """The coarse graph: one node per group, attributes as in the module docstring."""
    n, k = g.n_nodes, int(group_of.max()) + 1
    idx = np.arange(n)
    by_group = np.lexsort((idx, -g.cost, group_of))
    costliest = by_group[np.unique(group_of[by_group], return_index=True)[1]]
    first = np.full(k, n)
    np.minimum.at(first, group_of, idx)

    gs, gd = group_of[g.src], group_of[g.dst]
    cross = gs != gd
    leaves = g.out_degree == 0
    leaves[g.src[cross]] = True

    # One tensor per (producing op, consuming group): the largest edge, then sum per pair.
    src, dst_group, nbytes = g.src[cross], gd[cross], g.edge_bytes[cross]
    key = src * k + dst_group
    order = np.lexsort((nbytes, key))
    last = np.flatnonzero(np.diff(key[order], append=-1) != 0)
    src, dst_group, nbytes = src[order[last]], dst_group[order[last]], nbytes[order[last]]
    pair, pair_inv = np.unique(group_of[src] * k + dst_group, return_inverse=True)

    def total(values: np.ndarray) -> np.ndarray:
        return np.bincount(group_of, weights=values, minlength=k)

    return OpGraph(
        g.names[first], pair // k, pair % k,
        op_types=g.op_types[costliest],
        flops=total(g.flops),
        output_bytes=total(np.where(leaves, g.output_bytes, 0.0)),
        param_bytes=total(g.param_bytes),
        time_us=total(g.time_us),
        colocation=_group_colocation(g.colocation, group_of, k),
        is_backward=g.is_backward[costliest],
        edge_bytes=np.bincount(pair_inv, weights=nbytes, minlength=pair.size),
        meta={**unpipelined_meta(g.meta), "coarsened_from_nodes": n,
              "coarsened_max_nodes": max_nodes},
    )


def _group_colocation(coloc: np.ndarray, group_of: np.ndarray, k: int) -> np.ndarray:
    """Colocation id per group: the smallest id of the class its members' ids are tied in
    (groups sharing an id are tied, transitively), -1 for groups without one."""
    has = coloc >= 0
    ids, cidx = np.unique(coloc[has], return_inverse=True)
    groups = group_of[has]
    none = np.iinfo(np.int64).max
    # Propagate the smallest id over the bipartite graph groups <-> ids until it settles.
    label = ids
    while True:
        of_group = np.full(k, none)
        np.minimum.at(of_group, groups, label[cidx])
        new = np.full(ids.size, none)
        np.minimum.at(new, cidx, of_group[groups])
        if np.array_equal(new, label):
            return np.where(of_group == none, -1, of_group)
        label = new
