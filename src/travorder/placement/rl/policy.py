"""The placement policy: a Placeto graph network in PyTorch (GraphSAGE as an option).

The policy scores the devices for the node the placer is visiting. Its input is
Placeto's node feature vector ``[cost, out_size, done, current, start_time, one-hot
device]``, each column normalised. The traversal order only decides which node is asked
next, never how messages flow: the message passes follow the graph's topological order.

The network is split by how often its inputs change, so that an episode of ``n`` decisions
costs one pass of the graph network instead of ``n`` (Placeto re-ran it at every step):

* **Episode table** (:meth:`PlacementPolicy.node_table`, once per episode). The features
  fixed during an episode -- cost, output size, and each node's start time and device in
  the placement the episode starts from -- go through Placeto's two message passes
  (forward over predecessors, backward over successors) and then Placeto's three
  aggregators: the mean of a learned transform over each node's ancestors, descendants
  and parallel nodes (neither). One row per node.
* **Step context** (`StepContext`, every step, no parameters). The features that change
  at every step -- ``done`` and each node's present device -- enter linearly: for the
  current node ``v``, the fraction of ``done`` nodes, the fraction on each device and the
  share of compute time on each device, over six sets: ``v``, its predecessors,
  successors, ancestors, descendants and parallel nodes. ``current`` is which row the
  head reads, so it needs no column. Exact, ``O(n)`` per step, nothing stale.
* **Head** (:meth:`PlacementPolicy.forward`): an MLP over ``[table row of v, step
  context of v]`` gives one logit per device.

While an episode is played the head runs in numpy (`EpisodeHead`); for the update it runs
again over all the episode's steps at once, on the table of the episode: in numpy with
hand-derived gradients (`network.NumpyNetwork`, the default) or in torch with autograd.

Speed. A message pass is a recursion along the topological order: each node waits for
its neighbours' messages. Run level by level in torch (all nodes of a level at once) it
costs a dozen small tensor operations per level, and training graphs are deep (a
ResNet's has about as many levels as nodes): some 25 ms forward and 40 ms backward per
pass for 190 nodes. Here the recursion runs node by node in a compiled kernel (numba)
with hand-derived gradients (checked against autograd in the tests): about 1 ms forward
and 1.5 ms backward. The aggregators are products with the reachability matrix of `PolicyGraph`,
computed once per graph with bit sets and kept dense (``4 n**2`` bytes: 25 MB for 2,500
nodes; deep graphs make it dense anyway, and dense products are faster than torch's
sparse ones there).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from travorder.errors import TravorderError
from travorder.graph import OpGraph
from travorder.placement._jit import jit

#: The sets the step context summarises, in the order of its blocks.
CONTEXT_SETS = ("self", "predecessors", "successors", "ancestors", "descendants", "parallel")


def descendant_matrix(graph: OpGraph) -> np.ndarray:
    """Boolean ``(n, n)`` reachability: ``[u, v]`` is True when ``v`` is a descendant of ``u``.

    Built in reverse topological order with packed bit sets (``n**2 / 8`` bytes while
    building, ``n**2`` for the result), which is fast for a few thousand nodes.

    >>> g = OpGraph(["a", "b", "c"], [0, 1], [1, 2])
    >>> descendant_matrix(g).astype(int).tolist()
    [[0, 1, 1], [0, 0, 1], [0, 0, 0]]
    """
    n = graph.n_nodes
    bits = np.zeros((n, (n + 7) // 8), dtype=np.uint8)
    own = np.packbits(np.eye(n, dtype=bool), axis=1)
    ptr, idx = graph.succ_csr
    for v in graph.topo_order[::-1].tolist():
        succ = idx[ptr[v]:ptr[v + 1]]
        if succ.size:
            bits[v] = np.bitwise_or.reduce(bits[succ] | own[succ], axis=0)
    return np.unpackbits(bits, axis=1, count=n).astype(bool)


@dataclass(frozen=True, eq=False)
class Direction:
    """One message-pass direction: ``order`` is a topological order for it and the
    neighbours whose messages node ``v`` sums are ``idx[ptr[v]:ptr[v+1]]``."""

    order: np.ndarray
    ptr: np.ndarray
    idx: np.ndarray


@jit(fastmath=True)
def _pass_forward(order, ptr, idx, base, w1, b1, w2, b2):  # pragma: no cover - compiled
    n, dim = base.shape
    width = w1.shape[0]
    pre = np.zeros_like(base)
    hid = np.zeros((n, width), dtype=base.dtype)
    msg = np.zeros_like(base)
    h = np.zeros(dim, dtype=base.dtype)
    r = np.zeros(width, dtype=base.dtype)
    for v in order:
        for j in range(dim):
            pre[v, j] = base[v, j]
        for k in range(ptr[v], ptr[v + 1]):
            u = idx[k]
            for j in range(dim):
                pre[v, j] += msg[u, j]
        for j in range(dim):
            h[j] = max(pre[v, j], 0)
        for i in range(width):
            acc = b1[i]
            for j in range(dim):
                acc += w1[i, j] * h[j]
            hid[v, i] = acc
            r[i] = max(acc, 0)
        for i in range(dim):
            acc = b2[i]
            for j in range(width):
                acc += w2[i, j] * r[j]
            msg[v, i] = acc
    return pre, hid


@jit(fastmath=True)
def _pass_backward(order, ptr, idx, pre, hid, w1, w2, grad_h):  # pragma: no cover
    # The products with w1 and w2 run row by row (contiguous, vectorised), each output
    # summing its terms in the same order as a column-by-column dot product would.
    dim = pre.shape[1]
    width = w1.shape[0]
    g_pre = np.zeros_like(pre)
    g_msg = np.zeros_like(pre)
    gw1, gb1 = np.zeros_like(w1), np.zeros(width, dtype=pre.dtype)
    gw2, gb2 = np.zeros_like(w2), np.zeros(dim, dtype=pre.dtype)
    ga = np.zeros(width, dtype=pre.dtype)
    ga64 = np.zeros(width)  # the gradient at the hidden layer, summed in float64
    gh = np.zeros(dim, dtype=pre.dtype)
    for v in order[::-1]:  # every user of m_v comes later in the order
        for i in range(dim):
            gm = g_msg[v, i]
            gb2[i] += gm
            for j in range(width):
                gw2[i, j] += gm * max(hid[v, j], 0)
        ga64[:] = 0.0
        for i in range(dim):
            gm = g_msg[v, i]
            for j in range(width):
                ga64[j] += w2[i, j] * gm
        for j in range(width):
            if hid[v, j] <= 0:
                ga64[j] = 0.0
            ga[j] = ga64[j]
            gb1[j] += ga64[j]
        for i in range(width):
            for j in range(dim):
                gw1[i, j] += ga[i] * max(pre[v, j], 0)
        gh[:] = grad_h[v]
        for i in range(width):
            for j in range(dim):
                gh[j] += w1[i, j] * ga[i]
        for j in range(dim):
            g_pre[v, j] = gh[j] if pre[v, j] > 0 else 0.0
        for k in range(ptr[v], ptr[v + 1]):
            u = idx[k]
            for j in range(dim):
                g_msg[u, j] += g_pre[v, j]
    return g_pre, gw1, gb1, gw2, gb2


class _Recursion(torch.autograd.Function):
    """``h = relu(pre)``, ``pre_v = base_v + sum_{u in N(v)} m_u``,
    ``m_v = w2 relu(w1 h_v + b1) + b2``, node by node in the direction's order."""

    @staticmethod
    def forward(ctx, base, w1, b1, w2, b2, direction):  # type: ignore[override]
        arrays = [t.detach().numpy() for t in (base, w1, b1, w2, b2)]
        pre, hid = _pass_forward(direction.order, direction.ptr, direction.idx, *arrays)
        ctx.save_for_backward(w1, w2)
        ctx.direction, ctx.pre, ctx.hid = direction, pre, hid
        return torch.from_numpy(np.maximum(pre, 0))

    @staticmethod
    def backward(ctx, grad_h):  # type: ignore[override]
        d = ctx.direction
        w1, w2 = (w.detach().numpy() for w in ctx.saved_tensors)
        grads = _pass_backward(d.order, d.ptr, d.idx, ctx.pre, ctx.hid, w1, w2,
                               np.ascontiguousarray(grad_h.numpy()))
        return (*(torch.from_numpy(g) for g in grads), None)


class PolicyGraph:
    """Everything the policy needs to know about one graph, computed once.

    ``cost`` is each node's compute time (us), ``out_size`` its output bytes. The forward
    pass visits nodes in `OpGraph.topo_order`, the backward pass in its reverse; any
    topological order gives the same embeddings (up to float rounding), and the
    traversal order is never used.
    """

    def __init__(self, graph: OpGraph, cost: np.ndarray) -> None:
        n = graph.n_nodes
        self.n_nodes = n
        self.cost = np.asarray(cost, dtype=np.float64)
        self.out_size = graph.output_bytes
        topo = graph.topo_order
        self.forward = Direction(topo, *graph.pred_csr)
        self.backward = Direction(topo[::-1].copy(), *graph.succ_csr)
        self.edge_index = torch.from_numpy(np.stack([graph.src, graph.dst]))

        desc = descendant_matrix(graph)
        anc = desc.T
        # predecessors, successors, ancestors, descendants of each node, as one CSR
        csrs = [graph.pred_csr, graph.succ_csr, _csr(anc), _csr(desc)]
        offsets = np.cumsum([0] + [idx.size for _, idx in csrs])
        self.set_ptr = np.stack([ptr + off for (ptr, _), off in zip(csrs, offsets[:-1],
                                                                     strict=True)])
        self.set_idx = np.concatenate([idx for _, idx in csrs])
        self.descendants = torch.from_numpy(desc.astype(np.float32))  # ancestors: .T
        n_anc, n_desc = anc.sum(axis=1), desc.sum(axis=1)
        self.set_sizes = torch.from_numpy(
            np.stack([n_anc, n_desc, n - 1 - n_anc - n_desc], axis=1).astype(np.float32))
        # the columns of `static_features` that no episode changes, one row each
        self.fixed_features = np.stack([_max_normalised(self.cost),
                                        _max_normalised(self.out_size)]).astype(np.float32)
        self._inverse: dict[int, torch.Tensor] = {}

    def inverse_sizes(self, dim: int) -> torch.Tensor:
        """``1 / size`` of each node's ancestors, descendants and parallel nodes (0 for an
        empty set), each repeated ``dim`` times: the factors that turn sums into means."""
        if dim not in self._inverse:
            sizes = self.set_sizes.repeat_interleave(dim, dim=1)
            self._inverse[dim] = torch.where(sizes > 0, 1.0 / sizes.clamp(min=1.0), 0.0)
        return self._inverse[dim]


def _csr(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rows, cols = np.nonzero(mask)
    ptr = np.zeros(mask.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=mask.shape[0]), out=ptr[1:])
    return ptr, cols.astype(np.int64)


def _max_normalised(a: np.ndarray) -> np.ndarray:
    top = a.max(initial=0.0)
    return a / top if top > 0 else np.zeros_like(a)


def static_features(pg: PolicyGraph, placement: np.ndarray, start_us: np.ndarray,
                    n_devices: int) -> np.ndarray:
    """The episode's fixed features, ``(n, 3 + n_devices)`` float32.

    Columns: cost, output size and start time, each divided by its column's maximum, then
    the one-hot device of the placement the episode starts from. (``done`` and ``current``
    are zero for every node when an episode starts; they enter through `StepContext`.)
    """
    x = np.zeros((pg.n_nodes, 3 + n_devices), dtype=np.float32)
    x[:, 0], x[:, 1] = pg.fixed_features
    x[:, 2] = _max_normalised(np.asarray(start_us, dtype=np.float64))
    x[np.arange(pg.n_nodes), 3 + np.asarray(placement)] = 1.0
    return x


@jit()
def _context(v, rows, device, total, ptr, idx, n_devices):  # pragma: no cover - compiled
    n_sets, width = ptr.shape[0] + 2, rows.shape[1]
    d = n_devices
    sums = np.zeros((n_sets, width))
    sums[0] = rows[v]
    for k in range(ptr.shape[0]):
        # The columns' sums over the members, in the members' order: the count, and the
        # cost column; per member only its done flag and its cost on its device (the
        # other one-hot columns add exact zeros). The running sum of the device in hand
        # stays in a register until the device changes.
        row = sums[k + 1]
        done = 0.0
        cost = 0.0
        here = -1
        acc = 0.0
        run = 0
        for j in range(ptr[k, v], ptr[k, v + 1]):
            u = idx[j]
            p = device[u]
            if p != here:
                if here >= 0:
                    row[2 + d + here] = acc
                    row[2 + here] += run
                here, acc, run = p, row[2 + d + p], 0
            c = rows[u, width - 1]
            acc += c
            run += 1
            cost += c
            done += rows[u, 1]
        if here >= 0:
            row[2 + d + here] = acc
            row[2 + here] += run
        row[0] = ptr[k, v + 1] - ptr[k, v]
        row[1] = done
        row[width - 1] = cost
    # the parallel set by difference; its sums may keep rounding residue when it is empty
    sums[n_sets - 1] = total - sums[0] - sums[3] - sums[4]
    tiny = 1e-9 * total[width - 1]
    out = np.zeros((n_sets, 1 + 2 * d), dtype=np.float32)
    for k in range(n_sets):
        if sums[k, 0] > 0.5:
            out[k, :1 + d] = sums[k, 1:2 + d] / sums[k, 0]
            if sums[k, width - 1] > tiny:
                out[k, 1 + d:] = sums[k, 2 + d:width - 1] / sums[k, width - 1]
    return out.reshape(-1)


@jit()
def _reset_rows(rows, device, placement, cost):  # pragma: no cover - compiled
    """`StepContext.reset`: no node done, each on its device of ``placement``; returns
    the rows' column sums, added row after row (as ``rows.sum(axis=0)`` adds them)."""
    n, width = rows.shape
    d = (width - 3) // 2
    total = np.zeros(width)
    for v in range(n):
        rows[v, 1:width - 1] = 0.0
        p = placement[v]
        rows[v, 2 + p] = 1.0
        rows[v, 2 + d + p] = cost[v]
        device[v] = p
        for c in range(width):
            total[c] += rows[v, c]
    return total


class StepContext:
    """The per-step features of the current node's surroundings; no parameters.

    For each set in `CONTEXT_SETS` (the parallel nodes of ``v`` are those neither
    ancestors nor descendants of it, nor ``v``), a block of ``1 + 2 * n_devices`` numbers:
    the fraction of the set already placed in this episode (``done``), the fraction on
    each device, and the fraction of the set's compute time on each device. An empty set
    gives zeros. Call `reset` at the start of an episode and `update` after each step.
    """

    def __init__(self, pg: PolicyGraph, n_devices: int) -> None:
        self.pg = pg
        self.n_devices = n_devices
        self.width = len(CONTEXT_SETS) * (1 + 2 * n_devices)
        self._cost = _max_normalised(pg.cost)
        # per-node columns: count, done, device one-hot, cost * one-hot, cost
        self._rows = np.zeros((pg.n_nodes, 3 + 2 * n_devices))
        self._rows[:, 0] = 1.0
        self._rows[:, -1] = self._cost
        self._device = np.zeros(pg.n_nodes, dtype=np.int64)  # the one-hot's column

    def reset(self, placement: np.ndarray) -> None:
        """Start an episode from ``placement``: nothing is done yet."""
        self._total = _reset_rows(self._rows, self._device, np.asarray(placement),
                                  self._cost)

    def update(self, v: int, nodes: np.ndarray, device: int) -> None:
        """Node ``v`` has been decided and ``nodes`` (its group, ``v`` included) now sit
        on ``device``."""
        r, d = self._rows, self.n_devices
        if r[v, 2 + device] == 1.0:  # the group stayed where it was
            self._total[1] += 1.0 - r[v, 1]
            r[v, 1] = 1.0
            return
        self._total -= r[nodes].sum(axis=0)
        r[nodes, 2:2 + 2 * d] = 0.0
        r[nodes, 2 + device] = 1.0
        r[nodes, 2 + d + device] = self._cost[nodes]
        self._device[nodes] = device
        r[v, 1] = 1.0
        self._total += r[nodes].sum(axis=0)

    def __call__(self, v: int) -> np.ndarray:
        """The context vector of node ``v`` (``width`` float32 numbers)."""
        return _context(v, self._rows, self._device, self._total, self.pg.set_ptr,
                        self.pg.set_idx, self.n_devices)


def _mlp(*sizes: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class DirectedPass(nn.Module):
    """One Placeto message pass in one direction.

    ``h_v = relu(W x_v + b + sum_{u in N(v)} m_u)`` and ``m_v = f(h_v)``, where ``N(v)``
    are the predecessors (forward pass) or successors (backward pass) and ``f`` is a
    two-layer MLP. ``W x + b`` is one batched product; the recursion runs node by node in
    topological order in a compiled kernel, with hand-derived gradients.
    """

    def __init__(self, in_dim: int, dim: int) -> None:
        super().__init__()
        self.update = nn.Linear(in_dim, dim)
        self.message = nn.ModuleList([nn.Linear(dim, dim), nn.Linear(dim, dim)])

    def forward(self, x: torch.Tensor, direction: Direction) -> torch.Tensor:
        m1, m2 = self.message
        return _Recursion.apply(self.update(x).contiguous(), m1.weight, m1.bias,
                                m2.weight, m2.bias, direction)


class PlacetoEncoder(nn.Module):
    """Placeto's node embedding: a forward pass and a backward pass, concatenated."""

    def __init__(self, in_dim: int, dim: int) -> None:
        super().__init__()
        self.out_dim = 2 * dim
        self.forward_pass = DirectedPass(in_dim, dim)
        self.backward_pass = DirectedPass(in_dim, dim)

    def forward(self, x: torch.Tensor, pg: PolicyGraph) -> torch.Tensor:
        return torch.cat([self.forward_pass(x, pg.forward),
                          self.backward_pass(x, pg.backward)], dim=1)


class SageEncoder(nn.Module):
    """GraphSAGE alternative: ``layers`` mean-aggregating SAGE convolutions over the
    predecessors and as many over the successors, concatenated."""

    def __init__(self, in_dim: int, dim: int, layers: int = 2) -> None:
        from torch_geometric.nn import SAGEConv

        super().__init__()
        self.out_dim = 2 * dim
        sizes = [in_dim] + [dim] * layers
        self.forward_convs = nn.ModuleList(SAGEConv(a, b) for a, b in itertools.pairwise(sizes))
        self.backward_convs = nn.ModuleList(SAGEConv(a, b)
                                            for a, b in itertools.pairwise(sizes))

    def forward(self, x: torch.Tensor, pg: PolicyGraph) -> torch.Tensor:
        out = []
        for convs, edges in ((self.forward_convs, pg.edge_index),
                             (self.backward_convs, pg.edge_index.flip(0))):
            h = x
            for conv in convs:
                h = torch.relu(conv(h, edges))
            out.append(h)
        return torch.cat(out, dim=1)


class SetAggregation(nn.Module):
    """Placeto's aggregators: for each node, the mean of a learned transform of the node
    embeddings over its ancestors, its descendants and its parallel nodes."""

    def __init__(self, in_dim: int, dim: int) -> None:
        super().__init__()
        self.out_dim = 3 * dim
        self.transforms = nn.ModuleList(_mlp(in_dim, dim, dim) for _ in range(3))

    def forward(self, h: torch.Tensor, pg: PolicyGraph) -> torch.Tensor:
        fa, fd, fp = (torch.relu(t(h)) for t in self.transforms)
        dim = fa.shape[1]
        desc = pg.descendants
        # two products with the reachability matrix: over ancestors and descendants
        up = desc.T @ torch.cat([fa, fp], dim=1)
        down = desc @ torch.cat([fd, fp], dim=1)
        sums = torch.cat([up[:, :dim], down[:, :dim],
                          fp.sum(dim=0, keepdim=True) - down[:, dim:] - up[:, dim:] - fp], dim=1)
        return sums * pg.inverse_sizes(dim)


class PlacementPolicy(nn.Module):
    """Device logits for the node being placed.

    ``encoder`` is ``"placeto"`` (`PlacetoEncoder`) or ``"sage"`` (`SageEncoder`);
    ``dim`` is the width of each message pass and aggregator, ``hidden`` of the head's two
    hidden layers.
    """

    def __init__(self, n_devices: int, *, encoder: str = "placeto", dim: int = 32,
                 hidden: int = 64) -> None:
        super().__init__()
        in_dim = 3 + n_devices
        if encoder == "placeto":
            self.encoder: nn.Module = PlacetoEncoder(in_dim, dim)
        elif encoder == "sage":
            self.encoder = SageEncoder(in_dim, dim)
        else:
            raise TravorderError(f"unknown encoder {encoder!r} (expected placeto or sage)")
        self.sets = SetAggregation(self.encoder.out_dim, dim)
        ctx_dim = len(CONTEXT_SETS) * (1 + 2 * n_devices)
        self.head = _mlp(self.encoder.out_dim + self.sets.out_dim + ctx_dim, hidden, hidden,
                         n_devices)

    def node_table(self, x: torch.Tensor, pg: PolicyGraph) -> torch.Tensor:
        """One row per node from the episode's fixed features ``x`` (`static_features`)."""
        h = self.encoder(x, pg)
        return torch.cat([h, self.sets(h, pg)], dim=1)

    def forward(self, rows: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """Logits ``(..., n_devices)`` from table rows and step contexts (`StepContext`)."""
        return self.head(torch.cat([rows, context], dim=-1))


class EpisodeHead:
    """The head (`PlacementPolicy.forward`) for one episode's table, in numpy, without
    gradients.

    Used while an episode is played: the first layer's product with the table is done
    once for all nodes (``first``), so a step costs three small matrix-vector products.
    ``context`` is the first layer's weight on the step context and ``layers`` the
    other layers' ``(weight, bias)``. Valid until the policy's weights change.
    """

    def __init__(self, first: np.ndarray, context: np.ndarray,
                 layers: list[tuple[np.ndarray, np.ndarray]]) -> None:
        self._first, self._context, self._layers = first, context, layers

    @classmethod
    def of_policy(cls, policy: PlacementPolicy, table: torch.Tensor) -> EpisodeHead:
        """The head of a torch `PlacementPolicy` for ``table``."""
        first, *rest = (m for m in policy.head if isinstance(m, nn.Linear))
        k = table.shape[1]
        with torch.no_grad():
            return cls(torch.addmm(first.bias, table, first.weight[:, :k].T).numpy(),
                       first.weight[:, k:].detach().numpy().copy(),
                       [(m.weight.detach().numpy(), m.bias.detach().numpy()) for m in rest])

    def __call__(self, v: int, context: np.ndarray) -> np.ndarray:
        """Logits of node ``v`` given its step context."""
        h = self._first[v] + self._context @ context
        for w, b in self._layers:
            h = w @ np.maximum(h, 0) + b
        return h
