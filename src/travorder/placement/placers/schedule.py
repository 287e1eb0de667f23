"""The bookkeeping placers share while they assign nodes one at a time.

`DeviceBook` tracks which device each node is on, colocation groups and a memory
estimate per device; `PartialSchedule` adds a list schedule of the placed nodes (device
timelines, transfers on the cluster's link queues) so a placer can ask when a node would
start and finish on each device.

Memory estimate: a device holds ``param_bytes * cluster.param_copies`` and
``output_bytes`` of every node on it, plus one copy of each remote tensor its nodes read
(a producer's tensor counted once per consumer device, at its largest edge to that
device; under Placeto's semantics at its largest edge of all, the one size its copies
have there). That is every byte the simulator ever allocates on the device, so a placement
that fits this estimate is feasible in the simulator too; the converse need not hold
(tensors freed early are counted in full). With colocation on (the default), a group's
memory is reserved on its device when its first member is placed, and the other members
follow that device.

The schedule is an estimate for making decisions: the simulator gives the final step time.
"""

from __future__ import annotations

import itertools

import numpy as np

from travorder.graph import OpGraph, colocation_groups
from travorder.placement.clusters import Cluster, compute_times


class DeviceBook:
    """Device per node (``device``, -1 while unplaced) and estimated memory per device."""

    device: list[int]

    def __init__(self, graph: OpGraph, cluster: Cluster, colocate: bool = True) -> None:
        n, n_dev = graph.n_nodes, cluster.n_devices
        self.graph, self.cluster, self.n_devices = graph, cluster, n_dev
        self.device = [-1] * n
        self.capacity = [d.memory for d in cluster.devices]
        self.used = [0.0] * n_dev
        own = graph.param_bytes * cluster.param_copies + graph.output_bytes
        self.group = colocation_groups(graph, colocate)
        self.group_memory = np.bincount(self.group, weights=own).tolist()
        self.group_device = [-1] * len(self.group_memory)
        # (other end, bytes) per node: the edge's bytes, for transfer times, and the bytes
        # its remote copy takes, which under Placeto's rules is the tensor's one size
        self.edges_in = self._edge_lists(graph.in_edges_csr, graph.src, graph.edge_bytes)
        placeto = cluster.semantics == "placeto"
        copy_bytes = graph.largest_out_edge_bytes[graph.src] if placeto else graph.edge_bytes
        self.copies_in = (self._edge_lists(graph.in_edges_csr, graph.src, copy_bytes)
                          if placeto else self.edges_in)
        self.copies_out = self._edge_lists(graph.out_edges_csr, graph.dst, copy_bytes)
        self.copies: dict[tuple[int, int], float] = {}  # (producer, device) -> bytes held

    @staticmethod
    def _edge_lists(csr: tuple[np.ndarray, np.ndarray], other: np.ndarray,
                    nbytes: np.ndarray) -> list[list[tuple[int, float]]]:
        ptr, eid = csr
        pairs = list(zip(other[eid].tolist(), nbytes[eid].tolist(), strict=True))
        bounds = ptr.tolist()
        return [pairs[a:b] for a, b in itertools.pairwise(bounds)]

    def forced(self, v: int) -> int:
        """The device `v` must go to (its colocation group's), or -1 if free to choose."""
        return self.group_device[self.group[v]]

    def extra_memory(self, v: int, d: int) -> float:
        """Bytes device `d` would gain if `v` were placed on it."""
        g = self.group[v]
        extra = self.group_memory[g] if self.group_device[g] < 0 else 0.0
        for u, b in self.copies_in[v]:
            du = self.device[u]
            if du >= 0 and du != d:
                extra += max(0.0, b - self.copies.get((u, d), 0.0))
        return extra

    def fits(self, v: int, d: int) -> bool:
        return self.used[d] + self.extra_memory(v, d) <= self.capacity[d]

    def candidates(self, v: int) -> list[int]:
        """The devices a placer may choose for `v`, in index order.

        Its group's device if the group is placed; else the devices where it fits; if it
        fits nowhere, the one with the most room left (the placement will be infeasible).
        """
        f = self.forced(v)
        if f >= 0:
            return [f]
        fit = [d for d in range(self.n_devices) if self.fits(v, d)]
        if fit:
            return fit
        room = [self.capacity[d] - self.used[d] - self.extra_memory(v, d)
                for d in range(self.n_devices)]
        return [int(np.argmax(room))]

    def assign(self, v: int, d: int) -> None:
        """Place `v` on `d` and update the memory estimate."""
        g = self.group[v]
        if self.group_device[g] < 0:
            self.group_device[g] = d
            self.used[d] += self.group_memory[g]
        self.device[v] = d
        for u, b in self.copies_in[v]:
            if self.device[u] >= 0 and self.device[u] != d:
                self._copy(u, d, b)
        for w, b in self.copies_out[v]:
            if self.device[w] >= 0 and self.device[w] != d:
                self._copy(v, self.device[w], b)

    def placement(self) -> np.ndarray:
        """The device per node as an int64 array."""
        return np.array(self.device, dtype=np.int64)

    def _copy(self, u: int, d: int, nbytes: float) -> None:
        held = self.copies.get((u, d), 0.0)
        if nbytes > held:
            self.copies[u, d] = nbytes
            self.used[d] += nbytes - held


class PartialSchedule(DeviceBook):
    """A `DeviceBook` with a list schedule of the placed nodes.

    Each device runs its nodes one after the other in the order they were placed (a node
    is appended to its device's timeline, never inserted into a gap). A node starts when
    its device is free and the outputs of its *placed* predecessors are on that device;
    predecessors not yet placed do not constrain it. A producer's tensor goes to each
    other device once, when the first consumer there is placed, on the cluster's link
    queue (``bus``: the sender's; ``channel``: sender's and receiver's; ``link``: the
    pair's), taking ``latency + bytes / bandwidth`` and keeping the queue busy
    ``busy_after_us`` more; later consumers on that device reuse the copy.
    """

    def __init__(self, graph: OpGraph, cluster: Cluster, colocate: bool = True,
                 times: np.ndarray | None = None) -> None:
        super().__init__(graph, cluster, colocate)
        self.times = (compute_times(graph, cluster) if times is None else times).tolist()
        self.start = [0.0] * graph.n_nodes
        self.finish = [0.0] * graph.n_nodes
        self.device_free = [0.0] * cluster.n_devices
        self.arrival: dict[tuple[int, int], float] = {}  # (producer, device) -> time
        self._queue: dict[tuple[int, int], float] = {}
        self._bw, self._lat = cluster.bandwidth.tolist(), cluster.latency.tolist()

    def _queues(self, a: int, b: int) -> tuple[tuple[int, int], ...]:
        model = self.cluster.link_model
        if model == "bus":
            return ((a, a),)
        if model == "channel":
            return ((a, a), (b, b))
        return ((a, b),)

    def _transfers(self, v: int, d: int, queue: dict[tuple[int, int], float]
                   ) -> tuple[float, list[tuple[int, float]]]:
        """When the placed inputs of `v` are all on `d`, and the new transfers (producer,
        arrival); `queue` is updated as those transfers are made."""
        ready, new = 0.0, []
        for u, b in self.edges_in[v]:
            du = self.device[u]
            if du < 0:
                continue
            if du == d:
                t = self.finish[u]
            elif (u, d) in self.arrival:
                t = self.arrival[u, d]
            else:
                keys = self._queues(du, d)
                begin = max(self.finish[u], *(queue.get(k, 0.0) for k in keys))
                t = begin + self._lat[du][d] + b / self._bw[du][d]
                for k in keys:
                    queue[k] = t + self.cluster.busy_after_us
                new.append((u, t))
            ready = max(ready, t)
        return ready, new

    def estimate(self, v: int, d: int, not_before: float = 0.0) -> tuple[float, float]:
        """(start, finish) of `v` if it were placed on `d` now, not starting before
        `not_before`."""
        ready, _ = self._transfers(v, d, dict(self._queue))
        s = max(ready, self.device_free[d], not_before)
        return s, s + self.times[v][d]

    def place(self, v: int, d: int, not_before: float = 0.0) -> None:
        """Place `v` on `d`, appending it to the schedule."""
        ready, new = self._transfers(v, d, self._queue)
        for u, t in new:
            self.arrival[u, d] = t
        s = max(ready, self.device_free[d], not_before)
        self.start[v], self.finish[v] = s, s + self.times[v][d]
        self.device_free[d] = self.finish[v]
        self.assign(v, d)
