"""The training-step simulator: a compiled (numba) discrete-event list scheduler.

`Simulator(graph, cluster)` precomputes the arrays once (compute times, edge lists in a
fixed order, the lower bound); `run`, `step_time` and `run_batch` then evaluate
placements. The semantics are specified by the plain-Python
:func:`travorder.placement.reference.simulate_reference`, which this module reproduces
operation for operation, so both give bit-identical results; ``docs/simulator.md``
describes them in prose.

Every tie is broken by :func:`tie_rank` (level, then name) rather than by node index, so
a placement's simulated step does not depend on how the graph's nodes are numbered.

>>> from travorder.placement.clusters import load_cluster
>>> g = OpGraph(["a", "b"], [0], [1], time_us=[10.0, 20.0], edge_bytes=[76_000.0])
>>> r = simulate(g, [0, 1], load_cluster("k80x3"))
>>> round(r.step_time_us, 3)  # 10 + 5.7 gap, 10 us transfer, 20 + 5.7
51.4
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, NamedTuple

import numpy as np
from numba import njit

from travorder.errors import TravorderError
from travorder.graph import OpGraph
from travorder.placement.clusters import LINK_MODELS, Cluster, compute_times

# Event kinds, in the order they are handled at equal times: finishes free memory and make
# ops ready before transfers start and devices pick their next op.
FINISH, SEND, DISPATCH = 0, 1, 2


@dataclass(frozen=True, eq=False)
class SimResult:
    """The simulated training step of one placement.

    Times in us, memory in bytes. ``efficiency = lower_bound_us / step_time_us`` (1 for an
    empty graph). ``busy_us`` and ``peak_memory`` are per device; ``feasible`` is whether
    every device's peak fits its memory. ``start_us``/``finish_us`` are per node.
    """

    step_time_us: float
    lower_bound_us: float
    efficiency: float
    busy_us: np.ndarray
    peak_memory: np.ndarray
    bytes_moved: float
    n_transfers: int
    feasible: bool
    start_us: np.ndarray
    finish_us: np.ndarray

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SimResult):
            return NotImplemented
        return all(np.array_equal(getattr(self, f.name), getattr(other, f.name))
                   for f in fields(self))

    __hash__ = None  # type: ignore[assignment]


class BatchResult(NamedTuple):
    """Step times (us), memory feasibility and overflow of many placements, one entry per
    row. ``overflow`` is the largest ``(peak - capacity) / capacity`` over the devices
    (at most 0 when the placement fits; 0 where every capacity is unlimited)."""

    step_time_us: np.ndarray
    feasible: np.ndarray
    overflow: np.ndarray


def tie_rank(graph: OpGraph) -> np.ndarray:
    """Each node's position when nodes are sorted by (level, name).

    The simulator breaks every tie with it; it depends only on the graph's structure and
    names, never on the node numbering.

    >>> tie_rank(OpGraph(["b", "a", "c"], [2], [0])).tolist()
    [2, 0, 1]
    """
    rank = np.empty(graph.n_nodes, dtype=np.int64)
    rank[np.lexsort((graph.names, graph.levels))] = np.arange(graph.n_nodes)
    return rank


def lower_bound(graph: OpGraph, cluster: Cluster) -> float:
    """A lower bound on the step time of any placement, in us.

    ``max(sum(t_min) / n_devices, critical path of t_min)`` where ``t_min`` is each op's
    fastest time over the devices; communication counts as zero.
    """
    return _lower_bound(graph, compute_times(graph, cluster), tie_rank(graph))


def _lower_bound(graph: OpGraph, times: np.ndarray, rank: np.ndarray) -> float:
    if graph.n_nodes == 0:
        return 0.0
    t_min = times.min(axis=1)
    total = float(np.sum(t_min[np.argsort(rank)]))  # summed in a numbering-free order
    ptr, idx = graph.pred_csr
    return max(total / times.shape[1], _critical_path(graph.topo_order, ptr, idx, t_min))


def check_placement(graph: OpGraph, cluster: Cluster, placement: Any) -> np.ndarray:
    """``placement`` as an int64 array (one row per placement if 2-D), or TravorderError."""
    a = np.asarray(placement)
    if a.ndim not in (1, 2) or a.shape[-1] != graph.n_nodes:
        got = a.shape[-1] if a.ndim else a.size
        raise TravorderError(f"a placement needs one device per node: got {got} entries for "
                             f"the {graph.n_nodes} nodes of {graph.name!r}")
    if a.size and (a.dtype == bool or not np.issubdtype(a.dtype, np.integer)):
        raise TravorderError(f"a placement must hold integer device indices, got {a.dtype}")
    if a.size and (a.min() < 0 or a.max() >= cluster.n_devices):
        at = np.argwhere((a < 0) | (a >= cluster.n_devices))[0]
        raise TravorderError(
            f"placement puts node {str(graph.names[at[-1]])!r} on device {a[tuple(at)]}, but "
            f"cluster {cluster.name!r} has devices 0..{cluster.n_devices - 1}")
    return np.ascontiguousarray(a, dtype=np.int64)


class Simulator:
    """Simulate many placements of one graph on one cluster.

    >>> from travorder.placement.clusters import load_cluster
    >>> g = OpGraph(["a", "b", "c"], [0, 0], [1, 2], time_us=[5.0, 5.0, 5.0])
    >>> sim = Simulator(g, load_cluster("v100x4-nvlink"))
    >>> sim.step_time([0, 0, 0]), sim.lower_bound_us
    (27.0, 18.0)
    """

    def __init__(self, graph: OpGraph, cluster: Cluster) -> None:
        self.graph = graph
        self.cluster = cluster
        self.compute_us = compute_times(graph, cluster)
        n = graph.n_nodes
        rank = tie_rank(graph)
        self.lower_bound_us = _lower_bound(graph, self.compute_us, rank)
        self._rank = rank
        self._node_at = np.argsort(rank)
        # Edges in a numbering-free order: leaving a node by the consumer's rank, entering
        # a node by the producer's rank.
        out = np.lexsort((rank[graph.dst], rank[graph.src]))
        inn = np.lexsort((rank[graph.src], rank[graph.dst]))
        self._out_ptr = _ptr_by_rank(graph.src[out], self._node_at, n)
        self._out_eid = out.astype(np.int64)
        self._in_ptr = _ptr_by_rank(graph.dst[inn], self._node_at, n)
        self._in_eid = inn.astype(np.int64)
        self._param_mem = graph.param_bytes * cluster.param_copies
        self._capacity = np.array([d.memory for d in cluster.devices])
        self._model = LINK_MODELS.index(cluster.link_model)

    def _args(self) -> tuple:
        g, c = self.graph, self.cluster
        return (self.compute_us, self._rank, self._node_at, g.src, g.dst, g.edge_bytes,
                self._out_ptr, self._out_eid, self._in_ptr, self._in_eid,
                g.output_bytes, self._param_mem, c.bandwidth, c.latency, self._model,
                c.busy_after_us)

    def _one(self, placement: Any) -> np.ndarray:
        p = check_placement(self.graph, self.cluster, placement)
        if p.ndim != 1:
            raise TravorderError("run() and step_time() take one placement; use run_batch() "
                                 "for many")
        return p

    def run(self, placement: Any) -> SimResult:
        """Simulate one placement (device index per node) in full."""
        step, start, finish, busy, peak, moved, n_tr = _simulate(self._one(placement),
                                                                 *self._args())
        return SimResult(
            step_time_us=step, lower_bound_us=self.lower_bound_us,
            efficiency=self.lower_bound_us / step if step > 0 else 1.0,
            busy_us=busy, peak_memory=peak, bytes_moved=moved, n_transfers=n_tr,
            feasible=bool(np.all(peak <= self._capacity)), start_us=start, finish_us=finish,
        )

    def step_time(self, placement: Any) -> float:
        """The step time of one placement, in us (`run` for everything else)."""
        return _simulate(self._one(placement), *self._args())[0]

    def run_batch(self, placements: Any) -> BatchResult:
        """Step times and feasibility of a ``(k, n_nodes)`` array of placements."""
        p = check_placement(self.graph, self.cluster, placements)
        if p.ndim != 2:
            raise TravorderError("run_batch() takes a 2-D array, one placement per row")
        return BatchResult(*_simulate_batch(p, self._capacity, *self._args()))


def simulate(graph: OpGraph, placement: Any, cluster: Cluster) -> SimResult:
    """Simulate one training step of ``graph`` placed by ``placement`` on ``cluster``."""
    return Simulator(graph, cluster).run(placement)


def _ptr_by_rank(key: np.ndarray, node_at: np.ndarray, n: int) -> np.ndarray:
    """``(n, 2)`` start/stop of each node's edges in an edge list sorted by node rank
    (``node_at[r]`` is the node of rank ``r``)."""
    counts = np.bincount(key, minlength=n)
    ptr = np.empty((n, 2), dtype=np.int64)
    ptr[node_at, 1] = np.cumsum(counts[node_at])
    ptr[:, 0] = ptr[:, 1] - counts
    return ptr


# --------------------------------------------------------------------- compiled core


@njit(cache=True)
def _critical_path(topo: np.ndarray, ptr: np.ndarray, idx: np.ndarray, cost: np.ndarray
                   ) -> float:
    finish = np.zeros(cost.size)
    longest = 0.0
    for v in topo:
        t = 0.0
        for k in range(ptr[v], ptr[v + 1]):
            if finish[idx[k]] > t:
                t = finish[idx[k]]
        finish[v] = t + cost[v]
        if finish[v] > longest:
            longest = finish[v]
    return longest


@njit(cache=True)
def _ev_push(ht, hk, size, t, k):
    """Push event (t, k) on the binary min-heap (ht, hk); returns the new size."""
    i = size
    while i > 0:
        p = (i - 1) >> 1
        if ht[p] < t or (ht[p] == t and hk[p] < k):
            break
        ht[i] = ht[p]
        hk[i] = hk[p]
        i = p
    ht[i] = t
    hk[i] = k
    return size + 1


@njit(cache=True)
def _ev_pop(ht, hk, size):
    """Remove the top event; returns the new size (the top was read by the caller)."""
    size -= 1
    t = ht[size]
    k = hk[size]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size and (ht[c + 1] < ht[c] or (ht[c + 1] == ht[c] and hk[c + 1] < hk[c])):
            c += 1
        if t < ht[c] or (t == ht[c] and k < hk[c]):
            break
        ht[i] = ht[c]
        hk[i] = hk[c]
        i = c
    ht[i] = t
    hk[i] = k
    return size


@njit(cache=True)
def _before(u, v, ready, rank):
    return ready[u] < ready[v] or (ready[u] == ready[v] and rank[u] < rank[v])


@njit(cache=True)
def _rq_push(heap, base, size, v, ready, rank):
    """Push op v on a device's ready heap (heap[base:base+size]); returns the new size."""
    i = size
    while i > 0:
        p = (i - 1) >> 1
        if _before(heap[base + p], v, ready, rank):
            break
        heap[base + i] = heap[base + p]
        i = p
    heap[base + i] = v
    return size + 1


@njit(cache=True)
def _rq_pop(heap, base, size, ready, rank):
    size -= 1
    v = heap[base + size]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size and _before(heap[base + c + 1], heap[base + c], ready, rank):
            c += 1
        if _before(v, heap[base + c], ready, rank):
            break
        heap[base + i] = heap[base + c]
        i = c
    heap[base + i] = v
    return size


@njit(cache=True)
def _simulate(place, times, rank, node_at, src, dst, ebytes, out_ptr, out_eid, in_ptr,
              in_eid, out_bytes, param_mem, bw, lat, model, busy_after, track_memory=True):
    # track_memory=False leaves out the events that only count received tensors in
    # memory (the peaks then miss them): for callers that know every placement fits
    n = place.size
    n_dev = bw.shape[0]
    m = src.size
    cost = np.empty(n)
    for v in range(n):
        cost[v] = times[v, place[v]]

    # memory: parameters first, summed in rank order
    mem = np.zeros(n_dev)
    for r in range(n):
        v = node_at[r]
        mem[place[v]] += param_mem[v]
    peak = mem.copy()

    # per-device ready heaps, laid out one after the other in `rq`
    rq = np.empty(n, dtype=np.int64)
    rq_base = np.zeros(n_dev, dtype=np.int64)
    rq_size = np.zeros(n_dev, dtype=np.int64)
    counts = np.bincount(place, minlength=n_dev)
    for d in range(1, n_dev):
        rq_base[d] = rq_base[d - 1] + counts[d - 1]

    waiting = np.zeros(n, dtype=np.int64)
    uses_left = np.zeros(n, dtype=np.int64)
    for e in range(m):
        waiting[dst[e]] += 1
        uses_left[src[e]] += 1
    ready = np.zeros(n)
    start = np.zeros(n)
    finish = np.zeros(n)
    running = np.zeros(n_dev, dtype=np.bool_)
    free_at = np.zeros(n_dev)
    busy = np.zeros(n_dev)
    qfree = np.zeros((n_dev, n_dev))  # queue free times: bus/channel row 0, link per pair

    # transfers
    cap = max(m, 1)
    copy_of_edge = np.full(m, -1, dtype=np.int64)
    copy_dev = np.empty(cap, dtype=np.int64)
    copy_bytes = np.empty(cap)
    copy_left = np.empty(cap, dtype=np.int64)
    n_copies = 0
    moved = 0.0
    max_b = np.empty(n_dev)
    n_cons = np.empty(n_dev, dtype=np.int64)
    arrival = np.empty(n_dev)
    copy_id = np.empty(n_dev, dtype=np.int64)

    # event heap: key = kind * K + id, compared after the time
    big = n + m + n_dev + 1
    ev_cap = 3 * n + m + n_dev + 1
    ht = np.empty(ev_cap)
    hk = np.empty(ev_cap, dtype=np.int64)
    n_ev = 0

    for r in range(n):
        v = node_at[r]
        if waiting[v] == 0:
            d = place[v]
            rq_size[d] = _rq_push(rq, rq_base[d], rq_size[d], v, ready, rank)
    for d in range(n_dev):
        if rq_size[d] > 0:
            n_ev = _ev_push(ht, hk, n_ev, 0.0, DISPATCH * big + d)

    step = 0.0
    while n_ev > 0:
        t = ht[0]
        key = hk[0]
        n_ev = _ev_pop(ht, hk, n_ev)
        kind = key // big
        ident = key - kind * big
        if kind == DISPATCH:
            d = ident
            if running[d] or rq_size[d] == 0 or ready[rq[rq_base[d]]] > t:
                continue
            v = rq[rq_base[d]]
            rq_size[d] = _rq_pop(rq, rq_base[d], rq_size[d], ready, rank)
            running[d] = True
            start[v] = t
            busy[d] += cost[v]
            mem[d] += out_bytes[v]
            if mem[d] > peak[d]:
                peak[d] = mem[d]
            n_ev = _ev_push(ht, hk, n_ev, t + cost[v], FINISH * big + rank[v])
        elif kind == SEND:
            c = ident
            d = copy_dev[c]
            mem[d] += copy_bytes[c]
            if mem[d] > peak[d]:
                peak[d] = mem[d]
        else:
            v = node_at[ident]
            d = place[v]
            running[d] = False
            free_at[d] = t
            finish[v] = t
            step = t
            # free the inputs this op was the last to use
            for k in range(in_ptr[v, 0], in_ptr[v, 1]):
                e = in_eid[k]
                u = src[e]
                c = copy_of_edge[e]
                if c >= 0:
                    copy_left[c] -= 1
                    if copy_left[c] == 0:
                        mem[d] -= copy_bytes[c]
                uses_left[u] -= 1
                if uses_left[u] == 0:
                    mem[place[u]] -= out_bytes[u]
            if out_ptr[v, 1] == out_ptr[v, 0]:
                mem[d] -= out_bytes[v]
            # one transfer per destination device, carrying the largest edge to it
            for x in range(n_dev):
                max_b[x] = -1.0
                n_cons[x] = 0
            for k in range(out_ptr[v, 0], out_ptr[v, 1]):
                e = out_eid[k]
                x = place[dst[e]]
                if x != d:
                    n_cons[x] += 1
                    if ebytes[e] > max_b[x]:
                        max_b[x] = ebytes[e]
            arrival[d] = t
            for x in range(n_dev):
                if n_cons[x] == 0:
                    continue
                dur = lat[d, x] + max_b[x] / bw[d, x]
                if model == 0:  # bus: one queue per sender
                    s = t if t > qfree[0, d] else qfree[0, d]
                    end = s + dur
                    qfree[0, d] = end + busy_after
                elif model == 1:  # channel: sender's and receiver's queue, both
                    s = t if t > qfree[0, d] else qfree[0, d]
                    if qfree[0, x] > s:
                        s = qfree[0, x]
                    end = s + dur
                    qfree[0, d] = end + busy_after
                    qfree[0, x] = end + busy_after
                else:  # link: one queue per ordered pair
                    s = t if t > qfree[d, x] else qfree[d, x]
                    end = s + dur
                    qfree[d, x] = end + busy_after
                arrival[x] = end
                copy_id[x] = n_copies
                copy_dev[n_copies] = x
                copy_bytes[n_copies] = max_b[x]
                copy_left[n_copies] = n_cons[x]
                moved += max_b[x]
                if track_memory:
                    n_ev = _ev_push(ht, hk, n_ev, s, SEND * big + n_copies)
                n_copies += 1
            for k in range(out_ptr[v, 0], out_ptr[v, 1]):
                e = out_eid[k]
                u = dst[e]
                x = place[u]
                if x != d:
                    copy_of_edge[e] = copy_id[x]
                if arrival[x] > ready[u]:
                    ready[u] = arrival[x]
                waiting[u] -= 1
                if waiting[u] == 0:
                    rq_size[x] = _rq_push(rq, rq_base[x], rq_size[x], u, ready, rank)
                    if not running[x] and rq[rq_base[x]] == u:
                        s = ready[u] if ready[u] > free_at[x] else free_at[x]
                        n_ev = _ev_push(ht, hk, n_ev, s, DISPATCH * big + x)
            if rq_size[d] > 0:
                u = rq[rq_base[d]]
                s = ready[u] if ready[u] > t else t
                n_ev = _ev_push(ht, hk, n_ev, s, DISPATCH * big + d)
    return step, start, finish, busy, peak, moved, n_copies


@njit(cache=True)
def _simulate_batch(places, capacity, times, rank, node_at, src, dst, ebytes, out_ptr,
                    out_eid, in_ptr, in_eid, out_bytes, param_mem, bw, lat, model,
                    busy_after):
    k = places.shape[0]
    steps = np.empty(k)
    feasible = np.empty(k, dtype=np.bool_)
    overflow = np.empty(k)
    for i in range(k):
        res = _simulate(places[i], times, rank, node_at, src, dst, ebytes, out_ptr, out_eid,
                        in_ptr, in_eid, out_bytes, param_mem, bw, lat, model, busy_after)
        steps[i] = res[0]
        feasible[i] = np.all(res[4] <= capacity)
        overflow[i] = _overflow(res[4], capacity)
    return steps, feasible, overflow


@njit(cache=True)
def _overflow(peak, capacity):  # pragma: no cover - compiled
    """The largest ``(peak - capacity) / capacity``; unlimited devices count as 0."""
    worst = -np.inf
    for d in range(peak.size):
        o = (peak[d] - capacity[d]) / capacity[d] if np.isfinite(capacity[d]) else 0.0
        if o > worst:
            worst = o
    return worst
