"""The simulator's semantics, as plain Python: the reference the compiled core must match.

:func:`simulate_reference` is slow and written to be read. The compiled
:class:`~travorder.placement.simulator.Simulator` performs the same floating-point
operations in the same order, so the two agree bit for bit (`reference_timeline` gives
the transfers too, to compare with `Simulator.timeline`).

One training step is simulated as discrete events under travorder's semantics (for
Placeto's, see `_simulate_placeto` below):

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
from collections import deque
from typing import Any

import numpy as np

from travorder.graph import OpGraph
from travorder.placement.clusters import Cluster, compute_times, work_times
from travorder.placement.simulator import (
    DISPATCH,
    FINISH,
    P_ARRIVE,
    P_BUS,
    P_DEVICE,
    P_FINISH,
    SEND,
    SimResult,
    Transfer,
    check_placement,
    lower_bound,
)
from travorder.placement.timeline import Timeline


def simulate_reference(graph: OpGraph, placement: Any, cluster: Cluster) -> SimResult:
    """Simulate one training step (reference implementation; see the module docstring)."""
    return reference_timeline(graph, placement, cluster).result


def reference_timeline(graph: OpGraph, placement: Any, cluster: Cluster) -> Timeline:
    """`simulate_reference` with every transfer: what `Simulator.timeline` must give."""
    place = check_placement(graph, cluster, placement).tolist()
    run = _simulate_placeto if cluster.semantics == "placeto" else _simulate
    step, start, finish, busy, peak, moved, transfers = run(graph, place, cluster)
    lb = lower_bound(graph, cluster)
    capacity = [dev.memory for dev in cluster.devices]
    result = SimResult(
        step_time_us=step, lower_bound_us=lb, efficiency=lb / step if step > 0 else 1.0,
        busy_us=np.array(busy), peak_memory=np.array(peak), bytes_moved=moved,
        n_transfers=len(transfers),
        feasible=all(p <= c for p, c in zip(peak, capacity, strict=True)),
        start_us=np.array(start), finish_us=np.array(finish),
    )
    return Timeline(graph, cluster, np.array(place, dtype=np.int64), result, tuple(transfers))


def _simulate(graph: OpGraph, place: list[int], cluster: Cluster) -> tuple:
    """travorder's semantics (the module docstring)."""
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
    transfers: list[Transfer] = []
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
                transfers.append(Transfer(v, d, (x,), nbytes, begin, arrival[x]))
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

    return step, start, finish, busy, peak, moved, transfers


def _simulate_placeto(graph: OpGraph, place: list[int], cluster: Cluster) -> tuple:
    """Placeto's semantics (docs/simulator.md), as the events of Placeto's simulator.

    An op takes its own time; the device then waits its ``launch_us`` gap (none after an
    op of time 0) before it takes the next op of its FIFO queue. Its output's consumers
    on that device get it at the op's end. If any consumer is elsewhere, the output goes
    once over the device's bus to all of them: the transfer is queued (FIFO) at the op's
    end, takes ``latency + size / bandwidth`` (the size: the op's largest edge), arrives
    on every consumer's device at once, and the bus stays busy ``busy_after_us`` more.
    The step ends with the last event, trailing gaps and bus time included. At equal
    times: op ends (memory only), arrivals (by producer name, then consumer name), buses,
    devices (by index); sources enter their device's queue in the graph's node order.
    Memory follows travorder's rules, a transfer leaving a copy on each receiving device.
    """
    n, n_dev = graph.n_nodes, cluster.n_devices
    work = work_times(graph, cluster)
    cost = [float(work[v, place[v]]) for v in range(n)]
    gap = [cluster.devices[place[v]].launch_us if cost[v] != 0 else 0.0 for v in range(n)]
    src, dst = graph.src.tolist(), graph.dst.tolist()
    names, out_bytes = graph.names.tolist(), graph.output_bytes.tolist()
    tensor = [0.0] * n  # one size per output tensor: its largest edge
    children: list[list[int]] = [[] for _ in range(n)]
    parents: list[list[int]] = [[] for _ in range(n)]
    for e, nbytes in enumerate(graph.edge_bytes.tolist()):
        tensor[src[e]] = max(tensor[src[e]], nbytes)
        children[src[e]].append(dst[e])
        parents[dst[e]].append(src[e])

    # memory is summed in tie-rank order, as under travorder's semantics
    levels = graph.levels.tolist()
    by_rank = sorted(range(n), key=lambda v: (levels[v], names[v]))
    rank = {v: r for r, v in enumerate(by_rank)}
    memory = [0.0] * n_dev
    for v in by_rank:
        memory[place[v]] += float(graph.param_bytes[v]) * cluster.param_copies
    peak = list(memory)

    def allocate(d: int, nbytes: float) -> None:
        memory[d] += nbytes
        peak[d] = max(peak[d], memory[d])

    waiting = [len(parents[v]) for v in range(n)]
    uses_left = [len(children[v]) for v in range(n)]
    copy_on: dict[tuple[int, int], dict[str, float]] = {}  # (producer, device) -> copy
    start, finish, busy = [0.0] * n, [0.0] * n, [0.0] * n_dev
    device_queue: list[deque[int]] = [deque() for _ in range(n_dev)]
    bus_queue: list[deque[int]] = [deque() for _ in range(n_dev)]
    pending = {P_DEVICE: [False] * n_dev, P_BUS: [False] * n_dev}  # an event is queued
    transfers: list[Transfer] = []
    moved = 0.0
    events: list[tuple[float, int, Any]] = []  # (time, kind, id)

    def wake(t: float, kind: int, d: int) -> None:
        if not pending[kind][d]:
            pending[kind][d] = True
            heapq.heappush(events, (t, kind, d))

    def enqueue(t: float, v: int) -> None:
        device_queue[place[v]].append(v)
        wake(t, P_DEVICE, place[v])

    def arrive(t: float, u: int, v: int) -> None:
        heapq.heappush(events, (t, P_ARRIVE, (names[u], names[v], v)))

    for v in range(n):
        if not parents[v]:
            enqueue(0.0, v)

    step = 0.0
    while events:
        t, kind, ident = heapq.heappop(events)
        step = max(step, t)
        if kind == P_FINISH:  # the op of tie rank `ident` ended: free what it last used
            v = by_rank[ident]
            d = place[v]
            for u in sorted(parents[v], key=rank.get):
                if place[u] != d:
                    c = copy_on[u, d]
                    c["left"] -= 1
                    if c["left"] == 0:
                        memory[d] -= c["bytes"]
                uses_left[u] -= 1
                if uses_left[u] == 0:
                    memory[place[u]] -= out_bytes[u]
            if not children[v]:
                memory[d] -= out_bytes[v]
        elif kind == P_ARRIVE:  # an input of op ident[2] is on its device
            v = ident[2]
            waiting[v] -= 1
            if waiting[v] == 0:
                enqueue(t, v)
        elif kind == P_BUS:  # bus of device `ident` is free: send the next tensor
            d = ident
            if not bus_queue[d]:
                pending[P_BUS][d] = False
                continue
            v = bus_queue[d][0]
            if finish[v] > t:  # not computed yet: come back then
                heapq.heappush(events, (finish[v], P_BUS, d))
                continue
            bus_queue[d].popleft()
            x = next(x for x in range(n_dev) if x != d)
            end = t + (cluster.latency[d, x] + tensor[v] / cluster.bandwidth[d, x])
            remote = [c for c in children[v] if place[c] != d]
            receivers = sorted({place[c] for c in remote})
            for x in receivers:
                copy_on[v, x] = {"bytes": tensor[v],
                                 "left": sum(place[c] == x for c in remote)}
                allocate(x, tensor[v])
            for c in remote:
                arrive(end, v, c)
            transfers.append(Transfer(v, d, tuple(receivers), tensor[v], t, end))
            moved += tensor[v]
            heapq.heappush(events, (end + cluster.busy_after_us, P_BUS, d))
        else:  # device `ident` is free: run the next op of its queue
            d = ident
            if not device_queue[d]:
                pending[P_DEVICE][d] = False
                continue
            v = device_queue[d].popleft()
            start[v], finish[v] = t, t + cost[v]
            busy[d] += cost[v] + gap[v]
            allocate(d, out_bytes[v])
            heapq.heappush(events, (finish[v] + gap[v], P_DEVICE, d))
            heapq.heappush(events, (finish[v], P_FINISH, rank[v]))
            for c in children[v]:
                if place[c] == d:
                    arrive(finish[v], v, c)
            if any(place[c] != d for c in children[v]):
                bus_queue[d].append(v)
                wake(finish[v], P_BUS, d)
    return step, start, finish, busy, peak, moved, transfers
