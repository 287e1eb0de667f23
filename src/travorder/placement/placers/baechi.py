"""Baechi's memory-constrained placers (Jeon et al., SoCC 2020): m-TOPO, m-ETF, m-SCT.

Compact versions of the published algorithms over travorder's cost model (compute times
from the cluster, transfers on its link queues, the memory estimate of
:class:`~travorder.placement.placers.schedule.DeviceBook`). They fix their own visiting
order, as Baechi does: the ``order`` argument is accepted for the common interface and
ignored. Baechi's topological order is Kahn's with a FIFO queue, travorder's ``topo``.

- `m_topo`: walk the topological order and fill device 0, then 1, ..., each up to an even
  share of the total memory plus the largest single need (Baechi's uniform m-TOPO),
  never beyond the device's capacity.
- `m_etf`: earliest-task-first list scheduling (Hwang et al. 1989): time moves from event
  to event; an op becomes ready when its predecessors have finished; whenever a device is
  free, the ready (op, device) pair with the earliest start (data arrival included) runs
  next, ties by topological position, then device index; only devices where the op fits
  are considered.
- `m_sct`: small-communication-time scheduling: a linear program relaxes the choice of
  each op's *favourite child* (the one successor that should run on the same device);
  then m-ETF, except that a device whose last op's favourite child is ready, and could
  start earliest on it, waits for that child, running meanwhile only *urgent* ops (ready
  on every device already).
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from travorder.errors import TravorderError
from travorder.graph import OpGraph
from travorder.placement.clusters import Cluster, compute_times
from travorder.placement.placers.schedule import DeviceBook, PartialSchedule


def m_topo(graph: OpGraph, cluster: Cluster, order: np.ndarray, seed: int,
           colocate: bool = True) -> np.ndarray:
    """Baechi's m-TOPO (uniform): contiguous pieces of the topological order, balanced by
    memory. See the module docstring."""
    book = DeviceBook(graph, cluster, colocate)
    n_dev = cluster.n_devices
    share = sum(book.group_memory) / n_dev + max(book.group_memory, default=0.0)
    limit = [min(share, c) for c in book.capacity]
    d = 0
    for v in graph.topo_order.tolist():
        target = book.forced(v)
        if target < 0:
            while d < n_dev - 1 and book.used[d] + book.extra_memory(v, d) > limit[d]:
                d += 1
            target = d if book.fits(v, d) else book.candidates(v)[0]
        book.assign(v, target)
    return book.placement()


#: Op and transfer times (us) above which the favourite-child LP is solved in units of the
#: largest (the same LP; below it the LP stays in us, so that its ties break as they did).
_LARGEST_TIME_US = 1e12


def favourite_children(graph: OpGraph, cluster: Cluster) -> np.ndarray:
    """Each node's favourite child (-1 for none) from Baechi's LP relaxation.

    Variables: per edge ``x_e`` in [0, 1] (1: the edge pays its transfer), per node its
    start ``s_i >= 0``, and the makespan ``w``. Minimise ``w`` subject to
    ``s_i + p_i + c_e x_e <= s_j`` for each edge ``e = i -> j``, ``s_i + p_i <= w``, and
    at most one edge leaving and at most one edge entering each node with ``x_e < 1``
    (``sum x_e >= degree - 1``). ``p_i`` is the op's mean compute time over the devices,
    ``c_e`` the mean transfer time of the edge's bytes over device pairs. Solved with
    scipy's HiGHS; an edge with ``x_e <= 0.5`` is a favourite edge, and where rounding
    leaves a node two of them the first in edge order wins.
    """
    from scipy.optimize import linprog  # here: scipy.optimize takes 0.7 s to import
    from scipy.sparse import coo_matrix

    n, m = graph.n_nodes, graph.n_edges
    fav = np.full(n, -1, dtype=np.int64)
    if m == 0:
        return fav
    p = compute_times(graph, cluster).mean(axis=1)
    off = ~np.eye(cluster.n_devices, dtype=bool)
    if off.any():
        lat, inv_bw = cluster.latency[off].mean(), (1.0 / cluster.bandwidth[off]).mean()
        c = lat + graph.edge_bytes * inv_bw
    else:
        c = np.zeros(m)
    scale = max(p.max(), c.max())
    if scale > _LARGEST_TIME_US:  # HiGHS refuses coefficients near 1e20 as a model error
        p, c = p / scale, c / scale
    es = np.arange(m)
    rows, cols, vals, rhs = [], [], [], []

    def add(r: np.ndarray, col: np.ndarray, v: np.ndarray) -> None:
        rows.append(r)
        cols.append(col)
        vals.append(v)

    # precedence rows 0..m-1: s_i - s_j + c_e x_e <= -p_i
    add(es, m + graph.src, np.ones(m))
    add(es, m + graph.dst, -np.ones(m))
    add(es, es, c)
    rhs.append(-p[graph.src])
    # makespan rows m..m+n-1: s_i - w <= -p_i
    nodes = np.arange(n)
    add(m + nodes, m + nodes, np.ones(n))
    add(m + nodes, np.full(n, m + n), -np.ones(n))
    rhs.append(-p)
    # degree rows: -sum x_e <= 1 - degree, for nodes with two or more such edges
    row = m + n
    for end, degree in ((graph.src, graph.out_degree), (graph.dst, graph.in_degree)):
        many = np.flatnonzero(degree >= 2)
        k = np.full(n, -1)
        k[many] = row + np.arange(many.size)
        sel = k[end] >= 0
        add(k[end][sel], es[sel], -np.ones(int(sel.sum())))
        rhs.append(1.0 - degree[many])
        row += many.size
    a_ub = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                      shape=(row, m + n + 1)).tocsr()
    objective = np.zeros(m + n + 1)
    objective[-1] = 1.0
    bounds = [(0.0, 1.0)] * m + [(0.0, None)] * (n + 1)
    res = linprog(objective, A_ub=a_ub, b_ub=np.concatenate(rhs), bounds=bounds,
                  method="highs")
    if res.status != 0:
        raise TravorderError(f"m_sct: the favourite-child LP failed: {res.message}")
    has_parent = np.zeros(n, dtype=bool)
    for e in np.flatnonzero(res.x[:m] <= 0.5 + 1e-9).tolist():
        u, v = int(graph.src[e]), int(graph.dst[e])
        if fav[u] < 0 and not has_parent[v]:
            fav[u] = v
            has_parent[v] = True
    return fav


def m_etf(graph: OpGraph, cluster: Cluster, order: np.ndarray, seed: int,
          colocate: bool = True) -> np.ndarray:
    """Baechi's m-ETF: earliest-task-first list scheduling within memory (module docstring).
    """
    sched = PartialSchedule(graph, cluster, colocate)
    _list_schedule(sched, None)
    return sched.placement()


def m_sct(graph: OpGraph, cluster: Cluster, order: np.ndarray, seed: int,
          colocate: bool = True) -> np.ndarray:
    """Baechi's m-SCT: m-ETF that keeps favourite children with their parents (module
    docstring, `favourite_children`)."""
    sched = PartialSchedule(graph, cluster, colocate)
    _list_schedule(sched, favourite_children(graph, cluster))
    return sched.placement()


def _list_schedule(sched: PartialSchedule, favourite: np.ndarray | None) -> None:
    """Run ETF (or SCT with `favourite`) to completion, placing every node in `sched`."""
    g = sched.graph
    n, n_dev = g.n_nodes, sched.n_devices
    pos = np.empty(n, dtype=np.int64)
    pos[g.topo_order] = np.arange(n)
    pos_l = pos.tolist()
    fav = favourite.tolist() if favourite is not None else None
    succ_ptr, succ = (a.tolist() for a in g.succ_csr)
    pred_ptr, pred = (a.tolist() for a in g.pred_csr)
    waiting = g.in_degree.tolist()
    pending = [(0.0, pos_l[v], v) for v in range(n) if waiting[v] == 0]
    heapq.heapify(pending)
    ready: list[int] = []
    last = [-1] * n_dev
    t, left = 0.0, n
    while left:
        while pending and pending[0][0] <= t:
            ready.append(heapq.heappop(pending)[2])
        # schedule-able time of every ready op on each device it may use
        starts = {v: {d: max(t, sched.estimate(v, d)[0]) for d in sched.candidates(v)}
                  for v in ready}
        best, wake = None, math.inf
        for d in range(n_dev):
            if sched.device_free[d] > t:
                continue
            choice, wait = _device_choice(d, t, ready, starts, pos_l, fav, last)
            wake = min(wake, wait)
            if choice is not None and (best is None or choice < best):
                best = choice
        if best is not None:
            _, _, d, v = best
            sched.place(v, d, not_before=t)
            last[d] = v
            ready.remove(v)
            left -= 1
            for w in succ[succ_ptr[v]:succ_ptr[v + 1]]:
                waiting[w] -= 1
                if waiting[w] == 0:
                    release = max(sched.finish[u] for u in pred[pred_ptr[w]:pred_ptr[w + 1]])
                    heapq.heappush(pending, (release, pos_l[w], w))
            continue
        later = [wake, *(f for f in sched.device_free if f > t)]
        if pending:
            later.append(pending[0][0])
        nxt = min(later)
        if not nxt > t:
            raise RuntimeError("list scheduling made no progress")  # a bug, not bad input
        t = nxt


def _device_choice(d: int, t: float, ready: list[int], starts: dict[int, dict[int, float]],
                   pos: list[int], fav: list[int] | None, last: list[int]
                   ) -> tuple[tuple[float, int, int, int] | None, float]:
    """What free device `d` runs at time `t`: ``((start, pos, d, op) or None, the next
    time it could run something)``."""
    options = [(starts[v][d], pos[v], d, v) for v in ready if d in starts[v]]
    fc = fav[last[d]] if fav is not None and last[d] >= 0 else -1
    if fc >= 0 and fc in starts and d in starts[fc] and starts[fc][d] == min(
            starts[fc].values()):
        # awake: wait for the favourite child, running only urgent ops meanwhile
        urgent = min(((max(starts[v].values()), pos[v], v) for v in ready if d in starts[v]),
                     default=None)
        if urgent is not None and urgent[0] <= t:
            v = urgent[2]
            return (starts[v][d], pos[v], d, v), math.inf
        if starts[fc][d] <= t:
            return (starts[fc][d], pos[fc], d, fc), math.inf
        return None, min(starts[fc][d], urgent[0] if urgent is not None else math.inf)
    first = min(options, default=None)
    if first is None:
        return None, math.inf
    if first[0] <= t:
        return first, math.inf
    return None, first[0]
