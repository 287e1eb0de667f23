"""The simulator's semantics, as plain Python: the reference the compiled core must match.

:func:`simulate_reference` is slow and written to be read. The compiled
:class:`~travorder.placement.simulator.Simulator` performs the same floating-point
operations in the same order, so the two agree bit for bit.

One training step is simulated as discrete events:

* Each device runs one op at a time, to completion. An op is *ready* once every input has
  arrived on its device; an idle device starts the ready op with the earliest ready time
  (ties: the lower :func:`~travorder.placement.simulator.tie_rank`, i.e. level then name).
  An op takes its compute time, which includes the device's launch gap.
* When an op finishes, its output goes once to each other device that hosts a consumer:
  one transfer carrying the largest edge to that device. A transfer of ``b`` bytes from
  device ``i`` to ``j`` takes ``latency[i, j] + b / bandwidth[i, j]`` and holds its queue
  that long plus ``busy_after_us``. The queues (``link_model``): ``bus`` one per sender,
  ``channel`` one per device shared by sends and receives (a transfer holds both the
  sender's and the receiver's), ``link`` one per ordered pair. Transfers are granted in
  the order they are requested (the producer's finish, then its tie rank, then the
  destination device); none overtakes an earlier one on a shared queue.
* Memory per device: ``param_bytes * param_copies`` of its ops, plus each op's output from
  the op's start until its last consumer (on any device) finishes (a sink's until its own
  finish), plus each received copy from its transfer's start until its last consumer on
  that device finishes. At equal times memory is freed before it is allocated.
* Events at equal times are handled in the order: op finishes (by tie rank), transfer
  starts (by request order), devices picking their next op (by device index).
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np

from travorder.graph import OpGraph
from travorder.placement.clusters import Cluster, compute_times
from travorder.placement.simulator import (
    DISPATCH,
    FINISH,
    SEND,
    SimResult,
    check_placement,
    lower_bound,
)


def simulate_reference(graph: OpGraph, placement: Any, cluster: Cluster) -> SimResult:
    """Simulate one training step (reference implementation; see the module docstring)."""
    place = check_placement(graph, cluster, placement).tolist()
    n, n_dev = graph.n_nodes, cluster.n_devices
    times = compute_times(graph, cluster)
    cost = [float(times[v, place[v]]) for v in range(n)]
    src, dst = graph.src.tolist(), graph.dst.tolist()
    edge_bytes, out_bytes = graph.edge_bytes.tolist(), graph.output_bytes.tolist()
    bandwidth, latency = cluster.bandwidth.tolist(), cluster.latency.tolist()

    # Tie rank: position in the order (level, name); it breaks every tie.
    levels, names = graph.levels.tolist(), graph.names.tolist()
    by_rank = sorted(range(n), key=lambda v: (levels[v], names[v]))
    rank = [0] * n
    for r, v in enumerate(by_rank):
        rank[v] = r
    out_edges = [[] for _ in range(n)]
    in_edges = [[] for _ in range(n)]
    for e in range(len(src)):
        out_edges[src[e]].append(e)
        in_edges[dst[e]].append(e)
    for v in range(n):
        out_edges[v].sort(key=lambda e: rank[dst[e]])
        in_edges[v].sort(key=lambda e: rank[src[e]])

    memory = [0.0] * n_dev
    for v in by_rank:
        memory[place[v]] += float(graph.param_bytes[v]) * cluster.param_copies
    peak = list(memory)

    waiting = [len(in_edges[v]) for v in range(n)]  # inputs not yet arrived
    uses_left = [len(out_edges[v]) for v in range(n)]  # consumers not yet finished
    ready_at = [0.0] * n
    start, finish = [0.0] * n, [0.0] * n
    ready_ops: list[list[tuple[float, int, int]]] = [[] for _ in range(n_dev)]
    running = [False] * n_dev
    free_at = [0.0] * n_dev
    busy = [0.0] * n_dev
    queue_free: dict[Any, float] = {}  # transfer queue -> time it is free again
    copies: list[dict[str, Any]] = []  # received copies: device, bytes, consumers left
    copy_of_edge: dict[int, int] = {}
    moved = 0.0
    events: list[tuple[float, int, int]] = []  # (time, kind, id)

    def allocate(d: int, nbytes: float) -> None:
        memory[d] += nbytes
        peak[d] = max(peak[d], memory[d])

    def make_ready(u: int) -> None:
        d = place[u]
        heapq.heappush(ready_ops[d], (ready_at[u], rank[u], u))
        if not running[d] and ready_ops[d][0][2] == u:
            heapq.heappush(events, (max(ready_at[u], free_at[d]), DISPATCH, d))

    def transfer(sender: int, receiver: int, nbytes: float, t: float) -> tuple[float, float]:
        queues = {"bus": [("bus", sender)],
                  "channel": [("channel", sender), ("channel", receiver)],
                  "link": [("link", sender, receiver)]}[cluster.link_model]
        begin = t
        for q in queues:
            begin = max(begin, queue_free.get(q, 0.0))
        end = begin + (latency[sender][receiver] + nbytes / bandwidth[sender][receiver])
        for q in queues:
            queue_free[q] = end + cluster.busy_after_us
        return begin, end

    for v in by_rank:
        if waiting[v] == 0:
            make_ready(v)

    step = 0.0
    while events:
        t, kind, ident = heapq.heappop(events)
        if kind == DISPATCH:  # device `ident` may start its first ready op
            d = ident
            if running[d] or not ready_ops[d] or ready_ops[d][0][0] > t:
                continue  # stale: the device is busy or its first op is not ready yet
            v = heapq.heappop(ready_ops[d])[2]
            running[d] = True
            start[v] = t
            busy[d] += cost[v]
            allocate(d, out_bytes[v])
            heapq.heappush(events, (t + cost[v], FINISH, rank[v]))
        elif kind == SEND:  # transfer `ident` starts: its copy takes the receiver's memory
            allocate(copies[ident]["device"], copies[ident]["bytes"])
        else:  # the op of tie rank `ident` finishes: free memory, send, wake consumers
            v = by_rank[ident]
            d = place[v]
            running[d], free_at[d], finish[v], step = False, t, t, t
            for e in in_edges[v]:
                if e in copy_of_edge:
                    c = copies[copy_of_edge[e]]
                    c["left"] -= 1
                    if c["left"] == 0:
                        memory[d] -= c["bytes"]
                u = src[e]
                uses_left[u] -= 1
                if uses_left[u] == 0:
                    memory[place[u]] -= out_bytes[u]
            if not out_edges[v]:
                memory[d] -= out_bytes[v]

            arrival = {d: t}
            copy_to: dict[int, int] = {}
            for x in range(n_dev):
                to_x = [e for e in out_edges[v] if place[dst[e]] == x]
                if x == d or not to_x:
                    continue
                nbytes = max(edge_bytes[e] for e in to_x)
                begin, arrival[x] = transfer(d, x, nbytes, t)
                copy_to[x] = len(copies)
                copies.append({"device": x, "bytes": nbytes, "left": len(to_x)})
                moved += nbytes
                heapq.heappush(events, (begin, SEND, copy_to[x]))
            for e in out_edges[v]:
                u = dst[e]
                x = place[u]
                if x != d:
                    copy_of_edge[e] = copy_to[x]
                ready_at[u] = max(ready_at[u], arrival[x])
                waiting[u] -= 1
                if waiting[u] == 0:
                    make_ready(u)
            if ready_ops[d]:
                heapq.heappush(events, (max(ready_ops[d][0][0], t), DISPATCH, d))

    lb = lower_bound(graph, cluster)
    capacity = [dev.memory for dev in cluster.devices]
    return SimResult(
        step_time_us=step, lower_bound_us=lb, efficiency=lb / step if step > 0 else 1.0,
        busy_us=np.array(busy), peak_memory=np.array(peak), bytes_moved=moved,
        n_transfers=len(copies), feasible=all(p <= c for p, c in zip(peak, capacity, strict=True)),
        start_us=np.array(start), finish_us=np.array(finish),
    )
