"""Simple placers: `single`, `round_robin`, `random`, `contiguous`, and `greedy`.

Each takes ``(graph, cluster, order, seed, **options)`` where ``order`` is the traversal
order as a permutation of node indices, and returns the device of every node. All but
`single` visit the nodes in ``order``, keep colocation groups together (``colocate``,
default on: a group goes where its first visited member goes) and choose only among the
devices where the node still fits the memory estimate of
:class:`~travorder.placement.placers.schedule.DeviceBook`.
"""

from __future__ import annotations

import numpy as np

from travorder.graph import OpGraph
from travorder.placement.clusters import Cluster, compute_times
from travorder.placement.orders import check_visit
from travorder.placement.placers.schedule import DeviceBook, PartialSchedule


def single(graph: OpGraph, cluster: Cluster, order: np.ndarray, seed: int) -> np.ndarray:
    """Every node on the device with the least total compute time (ties: lowest index;
    device 0 on a homogeneous cluster). Ignores memory: if the graph does not fit on one
    device the placement is infeasible."""
    d = int(np.argmin(compute_times(graph, cluster).sum(axis=0)))
    return np.full(graph.n_nodes, d, dtype=np.int64)


def round_robin(graph: OpGraph, cluster: Cluster, order: np.ndarray, seed: int,
                colocate: bool = True) -> np.ndarray:
    """The k-th free decision along the order goes to device ``k mod n_devices``, or to
    the next device after it where the node fits."""
    book = DeviceBook(graph, cluster, colocate)
    n_dev, k = cluster.n_devices, 0
    for v in check_visit(graph, order).tolist():
        cands = book.candidates(v)
        if book.forced(v) < 0:
            cands = sorted(cands, key=lambda d: (d - k) % n_dev)
            k += 1
        book.assign(v, cands[0])
    return book.placement()


def random(graph: OpGraph, cluster: Cluster, order: np.ndarray, seed: int,
           colocate: bool = True) -> np.ndarray:
    """Each free decision along the order picks uniformly among the devices where the node
    fits (``numpy.random.default_rng(seed)``)."""
    rng = np.random.default_rng(seed)
    book = DeviceBook(graph, cluster, colocate)
    for v in check_visit(graph, order).tolist():
        cands = book.candidates(v)
        book.assign(v, cands[int(rng.integers(len(cands)))])
    return book.placement()


def contiguous(graph: OpGraph, cluster: Cluster, order: np.ndarray, seed: int,
               colocate: bool = True) -> np.ndarray:
    """Cut the order into contiguous pieces of balanced compute, piece ``k`` on device ``k``.

    A node's work is its mean compute time over the devices; device ``k`` gets a share of
    the total proportional to its speed (``1 / its total compute time``), and a node goes
    to the piece holding the midpoint of its stretch of the running total. A node that
    does not fit moves on to the next device with room, and the pieces never go back
    unless no later device has room.
    """
    times = compute_times(graph, cluster)
    order = check_visit(graph, order)
    work = times.mean(axis=1)[order]
    speed = 1.0 / np.maximum(times.sum(axis=0), 1e-300)
    bounds = np.cumsum(speed) / speed.sum() * work.sum()
    mids = np.cumsum(work) - work / 2
    piece = np.minimum(np.searchsorted(bounds, mids, side="right"), cluster.n_devices - 1)
    book = DeviceBook(graph, cluster, colocate)
    current = 0
    for v, k in zip(order.tolist(), piece.tolist(), strict=True):
        cands = book.candidates(v)
        if book.forced(v) < 0:
            later = [d for d in cands if d >= max(current, k)]
            if later:
                current = later[0]
            cands = later or cands
        book.assign(v, cands[0])
    return book.placement()


def greedy(graph: OpGraph, cluster: Cluster, order: np.ndarray, seed: int,
           colocate: bool = True) -> np.ndarray:
    """Earliest-finish-time list placement along the order.

    Visit the nodes in the order; put each on the device where it would finish first in
    the :class:`~travorder.placement.placers.schedule.PartialSchedule` of the nodes placed
    so far (ties: lowest device index), among the devices where it fits. In a topological
    order this is list scheduling with that priority; in any other order a node visited
    before some of its predecessors is scheduled as if those inputs were already there,
    and its already-placed successors keep their times, which is what makes the result
    depend on the order.
    """
    sched = PartialSchedule(graph, cluster, colocate)
    for v in check_visit(graph, order).tolist():
        cands = sched.candidates(v)
        best = cands[0] if len(cands) == 1 else min(
            cands, key=lambda d: (sched.estimate(v, d)[1], d))
        sched.place(v, best)
    return sched.placement()
