"""The training-step simulator: a compiled (numba) discrete-event list scheduler.

`Simulator(graph, cluster)` precomputes the arrays once (compute times, edge lists in a
fixed order, the lower bound); `run`, `step_time` and `run_batch` then evaluate
placements. The semantics are specified by the plain-Python
:func:`travorder.placement.reference.simulate_reference`, which this module reproduces
operation for operation, so both give bit-identical results; ``docs/simulator.md``
describes them in prose.

Every tie is broken by :func:`tie_rank` (level, then name) rather than by node index, so
a placement's simulated step does not depend on how the graph's nodes are numbered.
A cluster with ``semantics = "placeto"`` is simulated by Placeto's rules instead
(`_simulate_placeto`; its ties follow the node order, as Placeto's do).

>>> from travorder.placement.clusters import load_cluster
>>> g = OpGraph(["a", "b"], [0], [1], time_us=[10.0, 20.0], edge_bytes=[76_000.0])
>>> r = simulate(g, [0, 1], load_cluster("k80x3"))
>>> round(r.step_time_us, 3)  # 10 + 5.7 gap, 10 us transfer, 20 + 5.7
51.4
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from travorder.errors import TravorderError
from travorder.graph import OpGraph
from travorder.graph.opgraph import check_graph
from travorder.placement._jit import jit
from travorder.placement.clusters import (
    LINK_MODELS,
    Cluster,
    ClusterSource,
    check_in_range,
    compute_times,
    load_cluster,
    work_times,
)

if TYPE_CHECKING:
    from travorder.placement.timeline import Timeline

# Event kinds, in the order they are handled at equal times: finishes free memory and make
# ops ready before transfers start and devices pick their next op.
FINISH, SEND, DISPATCH = 0, 1, 2
# Under placeto semantics: finishes (memory only), then Placeto's own events in its order
# ("remove_dependency" < "run_bus" < "run_dev"): an input arrives, a bus or a device takes
# the next item of its queue.
P_FINISH, P_ARRIVE, P_BUS, P_DEVICE = 0, 1, 2, 3
# An event's key packs its kind above its id, so that keys order by kind, then id.
KIND_SHIFT = 56
ID_MASK = (1 << KIND_SHIFT) - 1
_U1 = np.uint64(1)  # unsigned index arithmetic (numba makes uint64 with int64 a float)


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
    fastest time over the devices; communication counts as zero. Under ``placeto``
    semantics the launch gap does not delay an op's output, so the path counts the gap of
    its last op only.
    """
    work = work_times(graph, cluster) if cluster.semantics == "placeto" else None
    return _lower_bound(graph, compute_times(graph, cluster), tie_rank(graph), work)


def _lower_bound(graph: OpGraph, times: np.ndarray, rank: np.ndarray,
                 work: np.ndarray | None) -> float:
    if graph.n_nodes == 0:
        return 0.0
    t_min = times.min(axis=1)
    total = float(np.sum(t_min[np.argsort(rank)]))  # summed in a numbering-free order
    ptr, idx = graph.pred_csr
    path = t_min if work is None else work.min(axis=1)
    return max(total / times.shape[1],
               _critical_path(graph.topo_order, ptr, idx, path, t_min))


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


class Transfer(NamedTuple):
    """One transfer of a simulated step: ``node``'s output sent from device ``src`` to the
    devices ``dst`` (one device, except under ``placeto`` semantics), ``bytes`` bytes, on
    its queue from ``start_us`` until it arrives at ``end_us``."""

    node: int
    src: int
    dst: tuple[int, ...]
    bytes: float
    start_us: float
    end_us: float


class Simulator:
    """Simulate many placements of one graph on one cluster.

    >>> from travorder.placement.clusters import load_cluster
    >>> g = OpGraph(["a", "b", "c"], [0, 0], [1, 2], time_us=[5.0, 5.0, 5.0])
    >>> sim = Simulator(g, load_cluster("v100x4-nvlink"))
    >>> sim.step_time([0, 0, 0]), sim.lower_bound_us
    (27.0, 18.0)
    """

    def __init__(self, graph: OpGraph, cluster: ClusterSource) -> None:
        self.graph = graph = check_graph(graph, "Simulator")
        self.cluster = cluster = load_cluster(cluster)  # a preset name or file too
        self.compute_us = compute_times(graph, cluster)
        check_in_range(graph, cluster, self.compute_us)
        n = graph.n_nodes
        rank = tie_rank(graph)
        node_at = np.argsort(rank)
        self._rank, self._node_at = rank, node_at
        self._placeto = cluster.semantics == "placeto"
        work = work_times(graph, cluster) if self._placeto else None
        self.lower_bound_us = _lower_bound(graph, self.compute_us, rank, work)
        self._capacity = np.array([d.memory for d in cluster.devices])
        # Everything the core reads is laid out in rank order (node of rank r at row r,
        # each node's edges contiguous and sorted by the other end's rank), so that a
        # step, which proceeds roughly in rank order, reads memory roughly in sequence.
        src_r, dst_r = rank[graph.src], rank[graph.dst]
        out = np.lexsort((dst_r, src_r))
        inn = np.lexsort((src_r, dst_r))
        out_pos = np.empty(graph.n_edges, dtype=np.int64)
        out_pos[out] = np.arange(graph.n_edges)
        optr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(src_r, minlength=n), out=optr[1:])
        iptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(dst_r, minlength=n), out=iptr[1:])
        # in-edge k of rank r: producer's rank isrc[k]; its position in the out-edges iout[k]
        # 32 bits, half the bytes of int64: a wide layer's edges stay in cache; unsigned,
        # as numba indexes with an unsigned index without checking for one below 0
        u32 = np.uint32
        graph_arrays = (node_at, optr.astype(u32), dst_r[out].astype(u32), iptr.astype(u32),
                        src_r[inn].astype(u32), out_pos[inn].astype(u32),
                        graph.output_bytes[node_at],
                        (graph.param_bytes * cluster.param_copies)[node_at])
        if not self._placeto:
            self._args = (np.ascontiguousarray(self.compute_us[node_at]), *graph_arrays,
                          graph.edge_bytes[out], cluster.bandwidth, cluster.latency,
                          LINK_MODELS.index(cluster.link_model), cluster.busy_after_us)
            return
        gap = np.array([d.launch_us for d in cluster.devices])
        work_r = np.ascontiguousarray(work[node_at])
        off = np.argmax(~np.eye(cluster.n_devices, dtype=bool), axis=1)  # any other device
        rows = np.arange(cluster.n_devices)
        name_rank = _name_rank(graph)[node_at]
        tensor = graph.largest_out_edge_bytes[node_at]  # Placeto's: one size per tensor
        self._args = (work_r, np.where(work_r != 0.0, gap, 0.0), *graph_arrays, tensor,
                      name_rank, np.argsort(name_rank),
                      rank[np.flatnonzero(graph.in_degree == 0)],
                      cluster.latency[rows, off], cluster.bandwidth[rows, off],
                      cluster.busy_after_us)

    def _one(self, placement: Any) -> np.ndarray:
        p = check_placement(self.graph, self.cluster, placement)
        if p.ndim != 1:
            raise TravorderError("run() and step_time() take one placement; use run_batch() "
                                 "for many")
        return p

    def _core(self, placement: np.ndarray, record: bool) -> tuple:
        core = _simulate_placeto if self._placeto else _simulate
        return core(placement, record, *self._args)

    def run(self, placement: Any) -> SimResult:
        """Simulate one placement (device index per node) in full."""
        return self._result(self._core(self._one(placement), False))

    def _result(self, out: tuple) -> SimResult:
        step, start, finish, busy, peak, moved, n_tr = out[:7]
        start, finish = start[self._rank], finish[self._rank]  # rank order to node order
        return SimResult(
            step_time_us=step, lower_bound_us=self.lower_bound_us,
            efficiency=self.lower_bound_us / step if step > 0 else 1.0,
            busy_us=busy, peak_memory=peak, bytes_moved=moved, n_transfers=n_tr,
            feasible=bool(np.all(peak <= self._capacity)), start_us=start, finish_us=finish,
        )

    def timeline(self, placement: Any) -> Timeline:
        """`run`, recording every transfer too: the `Timeline` that
        :mod:`travorder.placement.timeline` draws and exports (slower than `run`)."""
        from travorder.placement.timeline import Timeline

        p = self._one(placement)
        out = self._core(p, True)
        tr_node, tr_start, tr_end, tr_bytes, copy_dev, copy_tr = out[7:]
        dst: list[list[int]] = [[] for _ in range(tr_node.size)]
        for x, k in zip(copy_dev.tolist(), copy_tr.tolist(), strict=True):
            dst[k].append(x)
        nodes = self._node_at[tr_node].tolist()
        transfers = tuple(
            Transfer(v, int(p[v]), tuple(d), b, s, e) for v, d, b, s, e in zip(
                nodes, dst, tr_bytes.tolist(), tr_start.tolist(), tr_end.tolist(),
                strict=True))
        return Timeline(self.graph, self.cluster, p, self._result(out), transfers)

    def step_time(self, placement: Any) -> float:
        """The step time of one placement, in us (`run` for everything else)."""
        return self._core(self._one(placement), False)[0]

    def run_batch(self, placements: Any) -> BatchResult:
        """Step times and feasibility of a ``(k, n_nodes)`` array of placements."""
        p = check_placement(self.graph, self.cluster, placements)
        if p.ndim != 2:
            raise TravorderError("run_batch() takes a 2-D array, one placement per row")
        batch = _batch_placeto if self._placeto else _batch
        return BatchResult(*batch(p, self._capacity, *self._args))


def simulate(graph: OpGraph, placement: Any, cluster: ClusterSource) -> SimResult:
    """Simulate one training step of ``graph`` placed by ``placement`` on ``cluster`` (a
    `Cluster`, preset name or cluster file)."""
    return Simulator(check_graph(graph, "simulate"), cluster).run(placement)


def _name_rank(graph: OpGraph) -> np.ndarray:
    """Each node's position in name order (Placeto breaks equal-time events by name)."""
    rank = np.empty(graph.n_nodes, dtype=np.int64)
    rank[np.argsort(graph.names, kind="stable")] = np.arange(graph.n_nodes)
    return rank


# --------------------------------------------------------------------- compiled core


@jit()
def _critical_path(topo: np.ndarray, ptr: np.ndarray, idx: np.ndarray, cost: np.ndarray,
                   last: np.ndarray) -> float:
    """The longest path where every op takes ``cost`` but the path's last op ``last``."""
    finish = np.zeros(cost.size)
    longest = 0.0
    for v in topo:
        t = 0.0
        for k in range(ptr[v], ptr[v + 1]):
            if finish[idx[k]] > t:
                t = finish[idx[k]]
        finish[v] = t + cost[v]
        if t + last[v] > longest:
            longest = t + last[v]
    return longest


@intrinsic
def _prefetch(typingctx, arr, idx):  # pragma: no cover - compiled
    """Ask the cache for ``arr[idx]`` ahead of its use (a hint: no effect on results)."""

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]],
                                       wraparound=False)
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
            "llvm.prefetch.p0i8")
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])  # read, keep
        return context.get_dummy_value()

    return types.void(arr, idx), codegen


@jit(inline="always")
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


@jit(inline="always")
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


@jit(inline="always")
def _ev_insert(ht, hk, size, t, k):
    """Insert event (t, k) in the list (ht, hk) kept in decreasing order, the next event
    last; returns the new size."""
    i = size
    while i > 0 and (ht[i - 1] < t or (ht[i - 1] == t and hk[i - 1] < k)):
        ht[i] = ht[i - 1]
        hk[i] = hk[i - 1]
        i -= 1
    ht[i] = t
    hk[i] = k
    return size + 1


@jit()
def _places(place, node_at, n_dev, pl):
    """The device of each rank into ``pl`` (32 bits: small, as it is read at random), and
    where each device's slice of a per-node queue begins."""
    n = node_at.size
    # four rows of counts: consecutive ranks on one device do not wait for each other
    count = np.zeros((4, n_dev + 1), dtype=np.int64)
    for r in range(n):
        pl[r] = place[node_at[r]]
        count[r & 3, pl[r] + 1] += 1
    base = np.zeros(n_dev + 1, dtype=np.int64)
    for d in range(n_dev):
        base[d + 1] = base[d] + count[:, d + 1].sum()
    return base


@jit()
def _param_memory(pl, param_mem, n_dev):
    """The parameter bytes each device holds from the start."""
    mem = np.zeros(n_dev)
    for r in range(pl.size):
        # most ops hold no parameters, and adding 0.0 changes no sum: skipping them leaves
        # a chain of dependent additions only where there are parameters
        if param_mem[r] != 0.0:
            mem[pl[r]] += param_mem[r]
    return mem


@jit()
def _simulate(place, record, times, node_at, optr, odst, iptr, isrc, iout, out_bytes,
              param_mem, obytes, bw, lat, model, busy_after):
    """travorder's semantics, in rank space (node ``node_at[r]`` is rank ``r``): returns
    the step time, start and finish per rank, busy time and peak memory per device, bytes
    moved, the number of transfers and, if ``record``, the transfers."""
    ws = _workspace(node_at.size, odst.size, bw.shape[0], record)
    step, start, cost, busy, peak, moved, n_copies = _run(
        ws, place, record, True, times, node_at, optr, odst, iptr, isrc, iout, out_bytes,
        param_mem, obytes, bw, lat, model, busy_after)
    k = n_copies if record else 0
    # (positions in `_workspace`'s tuple)
    copy_dev, copy_bytes, copy_start, tr_node, tr_end = ws[12], ws[14], ws[16], ws[18], ws[19]
    # an op's finish is the time of its FINISH event, start + cost
    return (step, start, start + cost, busy, peak, moved,
            n_copies, tr_node[:k], copy_start[:k], tr_end[:k], copy_bytes[:k],
            copy_dev[:k], np.arange(k))


@jit()
def _workspace(n, m, n_dev, record):
    """The per-op and per-edge arrays of `_run`, allocated once for a batch of runs (a
    fresh allocation of this size per run comes from the kernel, page by page)."""
    cap = max(m, 1)
    ev_cap = 3 * n + m + n_dev + 1
    rec = cap if record else 0
    return (np.empty(n, dtype=np.uint32), np.empty(n), np.empty(n),  # pl, cost, start
            np.empty(n), np.empty(n, dtype=np.uint32),  # at, av
            np.empty(n), np.empty(n, dtype=np.uint32),  # ft, fv
            np.empty(n, dtype=np.int32), np.empty(n, dtype=np.int32),  # waiting, uses_left
            np.empty(n),  # ready
            np.empty(ev_cap), np.empty(ev_cap, dtype=np.int64),  # ht, hk
            np.empty(cap, dtype=np.int64), np.empty(cap, dtype=np.uint32),  # copy_dev, _of
            np.empty(cap + 1), np.empty(cap + 1, dtype=np.int64),  # copy_bytes, copy_left
            np.empty(cap), np.empty(cap, dtype=np.int64),  # copy_start, next_copy
            np.empty(rec, dtype=np.int64), np.empty(rec))  # tr_node, tr_end


@jit()
def _run(ws, place, record, memory, times, node_at, optr, odst, iptr, isrc, iout,
         out_bytes, param_mem, obytes, bw, lat, model, busy_after):
    """`_simulate` in the arrays ``ws`` of `_workspace`: returns the step time, start and
    cost per rank, busy time and peak memory per device, bytes moved and the number of
    transfers (recorded in ``ws`` if ``record``, which needs ``memory``). Without
    ``memory`` only the times are simulated: the peaks are the parameters' bytes, and
    nothing tracks tensors in memory (no freeing of inputs, no events for the start of
    a transfer); the step time is the same.

    Each device's ready ops, in (ready time, rank) order, are in two queues in its slice
    ``base[d]:base[d+1]``: ops ready as soon as they are found ready (their last input
    was already on the device) are appended in order to a list (``at``/``av`` from
    ``a_head`` to ``a_tail``: the simulated time only grows); ops waiting for a transfer
    go on a binary min-heap (``ft``/``fv``, ``f_size``). A device's first op is the
    smaller of the two heads. (One heap for all would cost a sift through all of a wide
    layer per op.)"""
    (pl, cost, start, at, av, ft, fv, waiting, uses_left, ready, ht, hk, copy_dev, copy_of,
     copy_bytes, copy_left, copy_start, next_copy, tr_node, tr_end) = ws
    n = node_at.size
    n_dev = bw.shape[0]
    base = _places(place, node_at, n_dev, pl)
    for r in range(n):  # (simple loops, which the compiler vectorises)
        waiting[r] = iptr[r + 1] - iptr[r]
    for r in range(n):
        uses_left[r] = optr[r + 1] - optr[r]
    for r in range(n):
        ready[r] = 0.0
        start[r] = 0.0
    for r in range(n):
        cost[r] = times[r, pl[r]]  # read at random later: 8 bytes per op, not a row of times
    mem = _param_memory(pl, param_mem, n_dev)
    peak = mem.copy()

    a_head = base[:n_dev].copy()
    a_tail = base[:n_dev].copy()
    f_size = np.zeros(n_dev, dtype=np.int64)
    fk = ft.view(np.uint64)  # the heap's times as bits (`_rq_rise`)
    running = np.zeros(n_dev, dtype=np.bool_)
    free_at = np.zeros(n_dev)
    busy = np.zeros(n_dev)
    qfree = np.zeros((n_dev, n_dev))  # queue free times: bus/channel row 0, link per pair

    # received copies (copy_*): device, bytes, consumers left; per out-edge, the copy it
    # reads (copy_of). Transfers between one pair of devices start in the order they are
    # granted (they share the sender's queue, or the pair's link), so the event list
    # holds only the next transfer of each pair; the others wait in a per-pair list
    # (next_copy).
    pair_tail = np.full(n_dev * n_dev, -1, dtype=np.int64)
    n_copies = 0
    moved = 0.0
    max_b = np.zeros(n_dev)
    n_cons = np.zeros(n_dev, dtype=np.int64)
    arrival = np.empty(n_dev)
    copy_id = np.empty(n_dev, dtype=np.uint32)
    # an edge between ops on one device reads the copy `local`, which no op frees: the
    # loop over an op's inputs then needs no test of each producer's device
    local = copy_left.size - 1
    copy_left[local] = 1 << 62
    copy_bytes[local] = 0.0

    # events (time, kind << KIND_SHIFT | id), the next one last (`_ev_insert`)
    n_ev = 0

    r = 0
    while r < n and waiting[r] == 0:  # the sources: the first ranks (level 0)
        d = pl[r]
        at[a_tail[d]] = 0.0
        av[a_tail[d]] = r
        a_tail[d] += 1
        r += 1
    for d in range(n_dev):
        if a_tail[d] > a_head[d]:
            n_ev = _ev_insert(ht, hk, n_ev, 0.0, (DISPATCH << KIND_SHIFT) + d)

    step = 0.0
    while n_ev > 0:
        n_ev -= 1
        t = ht[n_ev]
        key = hk[n_ev]
        kind = key >> KIND_SHIFT
        ident = key & ID_MASK
        if kind == SEND:
            c = ident
            d = copy_dev[c]
            mem[d] += copy_bytes[c]
            if mem[d] > peak[d]:
                peak[d] = mem[d]
            nxt = next_copy[c]
            next_copy[c] = -2  # sent
            if nxt >= 0:
                n_ev = _ev_insert(ht, hk, n_ev, copy_start[nxt], (SEND << KIND_SHIFT) + nxt)
            continue
        if kind == FINISH:
            r = ident
            d = pl[r]
            running[d] = False
            free_at[d] = t
            step = t
            o0 = optr[r]
            o1 = optr[r + 1]
            if memory:  # free the inputs this op was the last to use
                for k in range(iptr[r], iptr[r + 1]):
                    u = isrc[k]
                    c = copy_of[iout[k]]  # `local` if u is on d
                    copy_left[c] -= 1
                    if copy_left[c] == 0:
                        mem[d] -= copy_bytes[c]
                    uses_left[u] -= 1
                    if uses_left[u] == 0:
                        mem[pl[u]] -= out_bytes[u]
                if o1 == o0:
                    mem[d] -= out_bytes[r]
            # one transfer per destination device, carrying the largest edge to it
            # without a branch (d's own counts are dropped): edge bytes are not negative
            for k in range(o0, o1):
                x = pl[odst[k]]
                max_b[x] = obytes[k] if obytes[k] > max_b[x] else max_b[x]
                n_cons[x] += 1
            remote = n_cons[d] < o1 - o0
            n_cons[d] = 0
            max_b[d] = 0.0
            arrival[d] = t
            if remote:
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
                    moved += max_b[x]
                    c = n_copies
                    n_copies += 1
                    if memory:
                        copy_id[x] = c
                        copy_dev[c] = x
                        copy_bytes[c] = max_b[x]
                        copy_left[c] = n_cons[x]
                        copy_start[c] = s
                        if record:
                            tr_node[c] = r
                            tr_end[c] = end
                        next_copy[c] = -1
                        q = d * n_dev + x
                        last = pair_tail[q]
                        pair_tail[q] = c
                        if last >= 0 and next_copy[last] == -1:  # last not sent: queue c
                            next_copy[last] = c
                        else:
                            n_ev = _ev_insert(ht, hk, n_ev, s, (SEND << KIND_SHIFT) + c)
                    n_cons[x] = 0
                    max_b[x] = 0.0
            copy_id[d] = local
            for k in range(o0, o1):
                u = odst[k]
                x = pl[u]
                if memory:
                    copy_of[k] = copy_id[x]
                if arrival[x] > ready[u]:
                    ready[u] = arrival[x]
                waiting[u] -= 1
                if waiting[u] == 0:
                    rt = ready[u]
                    b = base[x]
                    h = a_head[x]
                    if rt == t:  # append, after the ops of this time with a lower rank
                        i = a_tail[x]
                        a_tail[x] += 1
                        while i > h and at[i - 1] == rt and av[i - 1] > u:
                            at[i] = at[i - 1]
                            av[i] = av[i - 1]
                            i -= 1
                        at[i] = rt
                        av[i] = u
                        first = i == h and (f_size[x] == 0 or rt < ft[b]
                                            or (rt == ft[b] and u < fv[b]))
                    else:
                        f_size[x] = _rq_push(ft, fk, fv, b, f_size[x], rt, u)
                        first = fv[b] == u and (h == a_tail[x] or rt < at[h]
                                                or (rt == at[h] and u < av[h]))
                    if first and x != d and not running[x]:
                        s = rt if rt > free_at[x] else free_at[x]
                        n_ev = _ev_insert(ht, hk, n_ev, s, (DISPATCH << KIND_SHIFT) + x)
            if a_tail[d] == a_head[d] and f_size[d] == 0:
                continue
            if n_ev > 0 and ht[n_ev - 1] == t:  # the other events of this time come first
                n_ev = _ev_insert(ht, hk, n_ev, t, (DISPATCH << KIND_SHIFT) + d)
                continue
            # else d picks its next op now, as the DISPATCH event would next
        else:
            d = ident
            if running[d]:
                continue
        h = a_head[d]
        b = base[d]
        if h < a_tail[d] and (f_size[d] == 0 or at[h] < ft[b]
                              or (at[h] == ft[b] and av[h] < fv[b])):
            if at[h] > t:
                n_ev = _ev_insert(ht, hk, n_ev, at[h], (DISPATCH << KIND_SHIFT) + d)
                continue
            r = av[h]
            a_head[d] += 1
        elif f_size[d] > 0:
            if ft[b] > t:
                n_ev = _ev_insert(ht, hk, n_ev, ft[b], (DISPATCH << KIND_SHIFT) + d)
                continue
            r = fv[b]
            f_size[d] = _rq_pop(fk, fv, b, f_size[d])
        else:
            continue
        running[d] = True
        # r's edges are read when it finishes, a few events later: fetch them meanwhile
        _prefetch(isrc, iptr[r])
        _prefetch(iout, iptr[r])
        _prefetch(odst, optr[r])
        _prefetch(obytes, optr[r])
        _prefetch(copy_of, optr[r])
        start[r] = t
        busy[d] += cost[r]
        if memory:
            mem[d] += out_bytes[r]
            if mem[d] > peak[d]:
                peak[d] = mem[d]
        n_ev = _ev_insert(ht, hk, n_ev, t + cost[r], (FINISH << KIND_SHIFT) + r)
    return step, start, cost, busy, peak, moved, n_copies


@jit(inline="always")
def _rq_push(rq_t, rq_k, rq_v, base, size, t, v):
    """Push op v, ready at t, on a device's ready heap (slice ``base:base+size``)."""
    base = np.uint64(base)
    i = np.uint64(size)
    rq_t[base + i] = t  # t's bits, as rq_k reads them
    _rq_rise(rq_k, rq_v, base, i, rq_k[base + i], v)
    return size + 1


@jit(inline="always")
def _rq_rise(rq_k, rq_v, base, i, k, v):
    """Put op v, ready at the time of bits k, into the hole at position i of a device's
    ready heap, moving the later parents down into it.

    The heap compares the times' bits (``rq_k``, a view of the times as unsigned
    integers), which order as the times do, as none is negative (not even -0.0): an
    integer comparison costs less than a floating-point one. Positions are unsigned:
    numba checks a signed index for a negative value at every access."""
    while i > 0:
        p = (i - _U1) >> _U1
        pk = rq_k[base + p]
        if pk < k or (pk == k and rq_v[base + p] < v):
            break
        rq_k[base + i] = pk
        rq_v[base + i] = rq_v[base + p]
        i = p
    rq_k[base + i] = k
    rq_v[base + i] = v


@jit(inline="always")
def _rq_pop(rq_k, rq_v, base, size):
    """Remove the first op of a device's ready heap; returns the new size.

    Bottom-up (Floyd): the hole left at the root goes down to a leaf along the smaller
    children, chosen without a branch (a sift that compares at every level mispredicts
    about every other level), and the heap's last op rises into it from there."""
    size -= 1
    base = np.uint64(base)
    last = np.uint64(size)
    k = rq_k[base + last]
    v = rq_v[base + last]
    i = np.uint64(0)
    c = _U1
    while c < last:
        if c + _U1 < last:
            ck = rq_k[base + c]
            nk = rq_k[base + c + _U1]
            c += np.uint64((nk < ck) | ((nk == ck) & (rq_v[base + c + _U1] < rq_v[base + c])))
        rq_k[base + i] = rq_k[base + c]
        rq_v[base + i] = rq_v[base + c]
        i = c
        c = i + i + _U1
    _rq_rise(rq_k, rq_v, base, i, k, v)
    return size


@jit()
def _simulate_placeto(place, record, work, gap, node_at, optr, odst, iptr, isrc, iout,
                      out_bytes, param_mem, tensor, name_rank, by_name, sources, bus_lat,
                      bus_bw, busy_after):
    """Placeto's semantics (docs/simulator.md), in rank space like `_simulate`.

    Events, at equal times in this order: op finishes (memory only), an input arriving
    (by producer name, then consumer name), a bus taking its next transfer, a device
    taking its next op (both by device index). Device and bus queues are FIFO."""
    n = node_at.size
    n_dev = bus_bw.size
    m = odst.size
    pl = np.empty(n, dtype=np.uint32)
    base = _places(place, node_at, n_dev, pl)
    mem = _param_memory(pl, param_mem, n_dev)
    peak = mem.copy()

    dq = np.empty(n, dtype=np.int64)  # device FIFO queues, slice base[d]:base[d+1]
    bq = np.empty(n, dtype=np.int64)  # bus FIFO queues of producers, same slices
    dq_head = base[:n_dev].copy()
    dq_tail = base[:n_dev].copy()
    bq_head = base[:n_dev].copy()
    bq_tail = base[:n_dev].copy()
    dev_pending = np.zeros(n_dev, dtype=np.bool_)  # an event of this device is queued
    bus_pending = np.zeros(n_dev, dtype=np.bool_)
    waiting = np.empty(n, dtype=np.int64)
    uses_left = np.empty(n, dtype=np.int64)
    for r in range(n):
        waiting[r] = iptr[r + 1] - iptr[r]
        uses_left[r] = optr[r + 1] - optr[r]
    start = np.zeros(n)
    finish = np.zeros(n)
    busy = np.zeros(n_dev)

    cap = max(m, 1)
    copy_of = np.empty(cap, dtype=np.int64)
    copy_dev = np.empty(cap, dtype=np.int64)
    copy_tr = np.empty(cap, dtype=np.int64)
    copy_left = np.empty(cap, dtype=np.int64)
    copy_bytes = np.empty(cap)
    n_copies = 0
    rec = n if record else 0
    tr_node = np.empty(rec, dtype=np.int64)
    tr_start = np.empty(rec)
    tr_end = np.empty(rec)
    n_tr = 0
    moved = 0.0
    n_cons = np.zeros(n_dev, dtype=np.int64)
    copy_id = np.empty(n_dev, dtype=np.int64)

    # event heap of (time, kind << KIND_SHIFT | id); an arrival's id: the producer's and
    # then the consumer's name rank
    ev_cap = 2 * n + m + 2 * n_dev + 1
    ht = np.empty(ev_cap)
    hk = np.empty(ev_cap, dtype=np.int64)
    n_ev = 0

    for r in sources:  # in the graph's node order
        d = pl[r]
        dq[dq_tail[d]] = r
        dq_tail[d] += 1
        if not dev_pending[d]:
            dev_pending[d] = True
            n_ev = _ev_push(ht, hk, n_ev, 0.0, (P_DEVICE << KIND_SHIFT) + d)

    step = 0.0
    while n_ev > 0:
        t = ht[0]
        key = hk[0]
        n_ev = _ev_pop(ht, hk, n_ev)
        kind = key >> KIND_SHIFT
        ident = key & ID_MASK
        if t > step:
            step = t
        if kind == P_FINISH:
            r = ident
            d = pl[r]
            for k in range(iptr[r], iptr[r + 1]):
                u = isrc[k]
                if pl[u] != d:
                    c = copy_of[iout[k]]
                    copy_left[c] -= 1
                    if copy_left[c] == 0:
                        mem[d] -= copy_bytes[c]
                uses_left[u] -= 1
                if uses_left[u] == 0:
                    mem[pl[u]] -= out_bytes[u]
            if optr[r + 1] == optr[r]:
                mem[d] -= out_bytes[r]
        elif kind == P_ARRIVE:
            r = by_name[ident % n]  # the consumer; its producer's name only orders events
            waiting[r] -= 1
            if waiting[r] == 0:
                d = pl[r]
                dq[dq_tail[d]] = r
                dq_tail[d] += 1
                if not dev_pending[d]:
                    dev_pending[d] = True
                    n_ev = _ev_push(ht, hk, n_ev, t, (P_DEVICE << KIND_SHIFT) + d)
        elif kind == P_BUS:
            d = ident
            if bq_head[d] == bq_tail[d]:
                bus_pending[d] = False
                continue
            r = bq[bq_head[d]]
            if finish[r] > t:  # the tensor is not computed yet
                n_ev = _ev_push(ht, hk, n_ev, finish[r], (P_BUS << KIND_SHIFT) + d)
                continue
            bq_head[d] += 1
            end = t + (bus_lat[d] + tensor[r] / bus_bw[d])
            nb = tensor[r]
            for k in range(optr[r], optr[r + 1]):
                x = pl[odst[k]]
                if x != d:
                    n_cons[x] += 1
                    n_ev = _ev_push(ht, hk, n_ev, end, (P_ARRIVE << KIND_SHIFT)
                                    + name_rank[r] * n + name_rank[odst[k]])
            for x in range(n_dev):
                if n_cons[x] == 0:
                    continue
                copy_id[x] = n_copies
                copy_dev[n_copies] = x
                copy_tr[n_copies] = n_tr
                copy_bytes[n_copies] = nb
                copy_left[n_copies] = n_cons[x]
                n_cons[x] = 0
                n_copies += 1
                mem[x] += nb
                if mem[x] > peak[x]:
                    peak[x] = mem[x]
            for k in range(optr[r], optr[r + 1]):
                x = pl[odst[k]]
                if x != d:
                    copy_of[k] = copy_id[x]
            if record:
                tr_node[n_tr] = r
                tr_start[n_tr] = t
                tr_end[n_tr] = end
            n_tr += 1
            moved += nb
            n_ev = _ev_push(ht, hk, n_ev, end + busy_after, (P_BUS << KIND_SHIFT) + d)
        else:
            d = ident
            if dq_head[d] == dq_tail[d]:
                dev_pending[d] = False
                continue
            r = dq[dq_head[d]]
            dq_head[d] += 1
            start[r] = t
            end = t + work[r, d]
            finish[r] = end
            busy[d] += work[r, d] + gap[r, d]
            mem[d] += out_bytes[r]
            if mem[d] > peak[d]:
                peak[d] = mem[d]
            n_ev = _ev_push(ht, hk, n_ev, end + gap[r, d], (P_DEVICE << KIND_SHIFT) + d)
            n_ev = _ev_push(ht, hk, n_ev, end, (P_FINISH << KIND_SHIFT) + r)
            remote = False
            for k in range(optr[r], optr[r + 1]):
                if pl[odst[k]] == d:
                    n_ev = _ev_push(ht, hk, n_ev, end, (P_ARRIVE << KIND_SHIFT)
                                    + name_rank[r] * n + name_rank[odst[k]])
                else:
                    remote = True
            if remote:  # one transfer for the tensor, queued on the bus at the op's end
                bq[bq_tail[d]] = r
                bq_tail[d] += 1
                if not bus_pending[d]:
                    bus_pending[d] = True
                    n_ev = _ev_push(ht, hk, n_ev, end, (P_BUS << KIND_SHIFT) + d)
    k = n_tr if record else 0
    kc = n_copies if record else 0
    tr_bytes = np.empty(k)
    for i in range(k):
        tr_bytes[i] = tensor[tr_node[i]]
    return (step, start, finish, busy, peak, moved,
            n_tr, tr_node[:k], tr_start[:k], tr_end[:k], tr_bytes, copy_dev[:kc].copy(),
            copy_tr[:kc].copy())


# One batch kernel per core: a kernel that took the core as an argument would be compiled
# (and cached) anew in every process, and numba's cache of it breaks after a few dozen.
@jit()
def _batch(places, capacity, *args):  # pragma: no cover - compiled
    """Step time, feasibility and overflow of each row of ``places`` under `_simulate`
    (its own arguments in ``args``)."""
    steps, feasible, overflow = _batch_arrays(places.shape[0])
    ws = _workspace(places.shape[1], args[3].size, args[0].shape[1], False)
    for i in range(places.shape[0]):
        _batch_row(_run(ws, places[i], False, True, *args), capacity, i, steps, feasible,
                   overflow)
    return steps, feasible, overflow


@jit()
def _batch_placeto(places, capacity, *args):  # pragma: no cover - compiled
    """`_batch` under `_simulate_placeto`."""
    steps, feasible, overflow = _batch_arrays(places.shape[0])
    for i in range(places.shape[0]):
        _batch_row(_simulate_placeto(places[i], False, *args), capacity, i, steps, feasible,
                   overflow)
    return steps, feasible, overflow


@jit(inline="always")
def _batch_arrays(k):  # pragma: no cover - compiled
    return np.empty(k), np.empty(k, dtype=np.bool_), np.empty(k)


@jit(inline="always")
def _batch_row(res, capacity, i, steps, feasible, overflow):  # pragma: no cover - compiled
    steps[i] = res[0]
    feasible[i] = np.all(res[4] <= capacity)
    overflow[i] = _overflow(res[4], capacity)


@jit()
def _overflow(peak, capacity):  # pragma: no cover - compiled
    """The largest ``(peak - capacity) / capacity``; unlimited devices count as 0."""
    worst = -np.inf
    for d in range(peak.size):
        o = (peak[d] - capacity[d]) / capacity[d] if np.isfinite(capacity[d]) else 0.0
        if o > worst:
            worst = o
    return worst
