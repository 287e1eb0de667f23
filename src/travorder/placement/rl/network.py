"""The Placeto policy's forward and backward pass and its Adam step in numpy and numba.

`NumpyNetwork` computes what `PlacementPolicy` (Placeto encoder) and the trainer's loss,
``loss.backward()`` and `FlatAdam` compute, with hand-derived gradients and no torch
operation: the episode table (message passes in the compiled kernels of `policy`, set
aggregations as sums over each node's ancestors or descendants), the head over an episode's
decisions, the REINFORCE loss's gradient, global-norm clipping and Adam (one compiled
loop), all over one flat float32 parameter vector. A torch update costs a few hundred
small tensor operations, each with dispatch and autograd overhead that dwarfs its
arithmetic on graphs of a few hundred nodes; here it is a few dozen numpy calls. The set
means and the head are computed only for the nodes that can decide (the others never
read them), so their cost grows with the decisions rather than with the nodes.

The arithmetic is torch's (float32, the same formulas); the products run through
numpy's BLAS instead of torch's and sum in another order, and the sums over ancestors
and descendants are built from nested sets (`SetSums`) where torch multiplies by the
dense reachability matrix, so results agree with the torch path to float rounding (the
tests compare gradients and whole updates), not bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from travorder.placement._jit import jit
from travorder.placement.rl.policy import (
    Direction,
    EpisodeHead,
    PlacementPolicy,
    PolicyGraph,
    _csr,
    _pass_forward,
)

_PASSES = ("encoder.forward_pass", "encoder.backward_pass")
_SETS = ("sets.transforms.0", "sets.transforms.1", "sets.transforms.2")
_HEAD = ("head.0", "head.2", "head.4")


@dataclass(eq=False)
class Table:
    """An episode table (the rows of `NumpyNetwork.rows`) and what its backward pass
    needs."""

    table: np.ndarray
    x: np.ndarray
    passes: list[tuple[np.ndarray, np.ndarray]]  # (pre, hid) per direction
    h: np.ndarray  # the message passes' output, every node
    sets: list[tuple[np.ndarray, np.ndarray, np.ndarray]]  # per set: the first layer's
    # output before and after its ReLU, and the transform's output
    head_first: np.ndarray | None = None  # the head's first layer on the table's rows


@jit()
def _set_sums(order, base, ptr, idx, values):  # pragma: no cover - compiled
    """`SetSums` of ``values``: row ``v`` is row ``base[v]`` (none if -1) plus ``values``'
    rows ``idx[ptr[v]:ptr[v + 1]]``, in ``order``."""
    out = np.zeros_like(values)
    for v in order:
        o = out[v]
        if base[v] >= 0:
            o[:] = out[base[v]]
        for k in range(ptr[v], ptr[v + 1]):
            x = values[idx[k]]
            for c in range(x.size):
                o[c] += x[c]
    return out


@dataclass(frozen=True, eq=False)
class SetSums:
    """Sums of per-node rows over each node's ancestors (or descendants), built on the
    nesting of these sets: a node's set holds the set of each of its predecessors, so it
    is the largest one's (its *base*'s) plus a few more nodes, ``idx[ptr[v]:ptr[v+1]]``.
    On training graphs that is a few thousand additions of a row where the product with
    the reachability matrix makes hundreds of thousands (1,872 against 735,820 on the
    1,252-node seq2seq).

    >>> from travorder.graph import OpGraph
    >>> g = OpGraph(["a", "b", "c"], [0, 0, 1], [1, 2, 2])
    >>> pg = PolicyGraph(g, np.ones(3))
    >>> ancestors = SetSums.of(pg.descendants.numpy().T != 0, pg.forward)
    >>> ancestors(np.array([[1.0], [10.0], [100.0]])).ravel().tolist()
    [0.0, 1.0, 11.0]
    """

    order: np.ndarray
    base: np.ndarray
    ptr: np.ndarray
    idx: np.ndarray

    @classmethod
    def of(cls, member: np.ndarray, direction: Direction) -> SetSums:
        """The sums over the sets ``member[v]`` (boolean ``(n, n)``: ``member[v, u]``, u is
        in v's set), where the set of each of v's neighbours in ``direction`` (its
        predecessors for ancestors, its successors for descendants) and that neighbour
        are in v's set."""
        n = member.shape[0]
        size = member.sum(axis=1)
        child = np.repeat(np.arange(n), np.diff(direction.ptr))
        parent = direction.idx
        by_size = np.lexsort((size[parent], child))  # each child's largest parent last
        last = np.flatnonzero(np.diff(child[by_size], append=n))
        base = np.full(n, -1, dtype=np.int64)
        base[child[by_size][last]] = parent[by_size][last]
        extra = member.copy()
        has = base >= 0
        extra[has] &= ~member[base[has]]
        return cls(direction.order, base, *_csr(extra))

    def __call__(self, values: np.ndarray) -> np.ndarray:
        """Row ``v``: the sum of ``values``' rows over v's set."""
        return _set_sums(self.order, self.base, self.ptr, self.idx, values)


@jit(fastmath=True)
def _pass_gradient(order, ptr, idx, pre, hid, w1, w2, grad_h):  # pragma: no cover
    """The gradients of one message pass (`policy._Recursion`) with respect to its base
    (``g_pre``), to the messages (``g_msg``) and to the message MLP's hidden layer
    (``g_hid``); the weights' gradients are products of these, done by the caller.
    Only the recursion runs node by node, in the direction's order reversed."""
    dim = pre.shape[1]
    width = w1.shape[0]
    g_pre = np.zeros_like(pre)
    g_msg = np.zeros_like(pre)
    g_hid = np.zeros_like(hid)
    for v in order[::-1]:  # every user of m_v comes later in the order
        for i in range(dim):  # row by row: contiguous, vectorised
            gm = g_msg[v, i]
            for j in range(width):
                g_hid[v, j] += w2[i, j] * gm
        for j in range(width):
            if hid[v, j] <= 0:
                g_hid[v, j] = 0.0
        for j in range(dim):
            g_pre[v, j] = grad_h[v, j]
        for i in range(width):
            ga = g_hid[v, i]
            for j in range(dim):
                g_pre[v, j] += w1[i, j] * ga
        for j in range(dim):
            if pre[v, j] <= 0:
                g_pre[v, j] = 0.0
        for k in range(ptr[v], ptr[v + 1]):
            u = idx[k]
            for j in range(dim):
                g_msg[u, j] += g_pre[v, j]
    return g_pre, g_msg, g_hid


@jit(fastmath=True)
def _adam(flat, grad, exp_avg, exp_avg_sq, lr, grad_clip, beta1, beta2, eps,
          steps):  # pragma: no cover - compiled
    """Clip ``grad``'s norm to ``grad_clip``, then one Adam step, in place (float32
    arithmetic, the norm summed in float64)."""
    sq = 0.0
    for i in range(grad.size):
        sq += grad[i] * grad[i]
    dtype = flat.dtype.type
    scale = dtype(min(grad_clip / (math.sqrt(sq) + 1e-6), 1.0))
    step_size = dtype(lr / (1 - beta1 ** steps))
    root = dtype(1.0 / math.sqrt(1 - beta2 ** steps))
    b1c, b2 = dtype(1 - beta1), dtype(beta2)
    b2c, epsilon = dtype(1 - beta2), dtype(eps)
    for i in range(grad.size):
        g = grad[i] * scale
        grad[i] = g
        exp_avg[i] += b1c * (g - exp_avg[i])
        exp_avg_sq[i] = b2 * exp_avg_sq[i] + b2c * g * g
        flat[i] -= step_size * exp_avg[i] / (np.sqrt(exp_avg_sq[i]) * root + epsilon)


def _relu(a: np.ndarray) -> np.ndarray:
    return np.maximum(a, np.float32(0.0))


class NumpyNetwork:
    """A `PlacementPolicy` with the Placeto encoder on the graph ``pg``, its weights
    copied into one flat vector (float32, as the policy's), trained by REINFORCE with
    Adam and gradient-norm clipping (``lr``, ``grad_clip``, ``betas`` and ``eps`` are
    `FlatAdam`'s).

    ``rows`` are the nodes whose table rows the head may read (sorted; default: all):
    the nodes where a decision can be taken. The message passes and the set transforms
    run over every node, but the set means, the head and their gradients only over
    ``rows``, so their cost grows with the decisions, not with the nodes (a pipelined
    graph's copies of a node follow the first one).
    """

    def __init__(self, policy: PlacementPolicy, pg: PolicyGraph, lr: float,
                 grad_clip: float, rows: np.ndarray | None = None,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        named = [(name, p.detach().numpy()) for name, p in policy.named_parameters()]
        self.flat = np.concatenate([p.ravel() for _, p in named])
        self.grad = np.zeros_like(self.flat)
        self.w: dict[str, np.ndarray] = {}
        self.g: dict[str, np.ndarray] = {}
        offset = 0
        for name, p in named:
            self.w[name] = self.flat[offset:offset + p.size].reshape(p.shape)
            self.g[name] = self.grad[offset:offset + p.size].reshape(p.shape)
            offset += p.size
        self.dim = self.w["encoder.forward_pass.update.bias"].size
        self.lr, self.grad_clip, self.betas, self.eps = lr, grad_clip, betas, eps
        self.exp_avg = np.zeros_like(self.flat)
        self.exp_avg_sq = np.zeros_like(self.flat)
        self.steps = 0

        self.pg = pg
        n = pg.n_nodes
        self.rows = np.arange(n) if rows is None else np.asarray(rows, dtype=np.int64)
        self._position = np.full(n, -1, dtype=np.int64)  # node -> its row in a table
        self._position[self.rows] = np.arange(self.rows.size)
        desc = pg.descendants.numpy() != 0
        self._ancestors = SetSums.of(desc.T, pg.forward)
        self._descendants = SetSums.of(desc, pg.backward)
        self._inverse = pg.inverse_sizes(self.dim).numpy()[self.rows]

    def _linear(self, a: np.ndarray, name: str) -> np.ndarray:
        out = a @ self.w[f"{name}.weight"].T
        out += self.w[f"{name}.bias"]
        return out

    def _linear_grad(self, g_out: np.ndarray, a: np.ndarray, name: str,
                     g_in: bool = True) -> np.ndarray | None:
        """Accumulate the weight and bias gradients of ``out = a W^T + b`` and return
        the gradient with respect to ``a``."""
        self.g[f"{name}.weight"] += g_out.T @ a
        self.g[f"{name}.bias"] += g_out.sum(axis=0)
        return g_out @ self.w[f"{name}.weight"] if g_in else None

    # ---------------------------------------------------------------- forward
    def node_table(self, x: np.ndarray, grad: bool = True) -> Table:
        """`PlacementPolicy.node_table` of the features ``x`` (`static_features`) at
        ``rows``, with what its backward pass needs (kept whatever ``grad``: it costs
        nothing more)."""
        pg = self.pg
        x = x.astype(self.flat.dtype, copy=False)
        passes, hs = [], []
        for prefix, direction in zip(_PASSES, (pg.forward, pg.backward), strict=True):
            base = self._linear(x, f"{prefix}.update")
            w = self.w
            pre, hid = _pass_forward(direction.order, direction.ptr, direction.idx, base,
                                     w[f"{prefix}.message.0.weight"],
                                     w[f"{prefix}.message.0.bias"],
                                     w[f"{prefix}.message.1.weight"],
                                     w[f"{prefix}.message.1.bias"])
            passes.append((pre, hid))
            hs.append(_relu(pre))
        h = np.concatenate(hs, axis=1)
        sets, outs = [], []
        for prefix in _SETS:
            first = self._linear(h, f"{prefix}.0")
            hidden = _relu(first)
            out = _relu(self._linear(hidden, f"{prefix}.2"))
            sets.append((first, hidden, out))
            outs.append(out)
        fa, fd, fp = outs
        up = self._ancestors(np.concatenate([fa, fp], axis=1))[self.rows]
        down = self._descendants(np.concatenate([fd, fp], axis=1))[self.rows]
        dim = self.dim
        parallel = (fp.sum(axis=0, keepdims=True) - down[:, dim:] - up[:, dim:]
                    - fp[self.rows])
        sums = np.concatenate([up[:, :dim], down[:, :dim], parallel], axis=1)
        table = np.concatenate([h[self.rows], sums * self._inverse], axis=1)
        return Table(table, x, passes, h, sets)

    def episode_head(self, t: Table) -> EpisodeHead:
        """The head for playing an episode on table ``t`` (whose first layer the update
        reuses); it reads the nodes of ``rows`` only."""
        w, b = self.w["head.0.weight"], self.w["head.0.bias"]
        k = t.table.shape[1]
        t.head_first = t.table @ w[:, :k].T
        t.head_first += b
        first = np.zeros((self.pg.n_nodes, b.size), dtype=b.dtype)
        first[self.rows] = t.head_first
        return EpisodeHead(first, w[:, k:].copy(),
                           [(self.w[f"{name}.weight"], self.w[f"{name}.bias"])
                            for name in _HEAD[1:]])

    def update(self, t: Table, nodes: np.ndarray, contexts: np.ndarray, masks: np.ndarray,
               actions: np.ndarray, advantage: np.ndarray, entropy_coef: float) -> None:
        """One Adam step on the REINFORCE loss over the decisions at ``nodes``."""
        self.gradient(t, nodes, contexts, masks, actions, advantage, entropy_coef)
        self.step()

    # ---------------------------------------------------------------- backward
    def gradient(self, t: Table, nodes: np.ndarray, contexts: np.ndarray, masks: np.ndarray,
                 actions: np.ndarray, advantage: np.ndarray, entropy_coef: float) -> float:
        """Set ``grad`` to the gradient of the trainer's loss over the decisions at
        ``nodes`` (distinct, in ``rows``) and return the loss."""
        self.grad[:] = 0.0
        m, k = nodes.size, t.table.shape[1]
        if t.head_first is None:
            self.episode_head(t)
        w1 = self.w["head.0.weight"]
        at = self._position[nodes]
        a1 = t.head_first[at] + contexts @ w1[:, k:].T
        r1 = _relu(a1)
        a2 = self._linear(r1, "head.2")
        r2 = _relu(a2)
        logits = self._linear(r2, "head.4")

        # masked log-softmax, the log-probability taken and the entropy
        z = np.where(masks, logits, np.float32(-np.inf))
        top = z.max(axis=1, keepdims=True)
        lse = top + np.log(np.exp(z - top).sum(axis=1, keepdims=True))
        log_p = np.where(masks, logits - lse, np.float32(0.0))
        p = np.where(masks, np.exp(log_p), np.float32(0.0))
        entropy = -(p * log_p).sum(axis=1)
        taken = log_p[np.arange(m), actions]
        loss = -(advantage * taken).mean() - entropy_coef * entropy.mean()
        # d loss / d logits: -(adv / m) (onehot - p) + (c / m) p (log_p + H)
        onehot = np.zeros_like(p)
        onehot[np.arange(m), actions] = 1.0
        g = (-(advantage / m)[:, None] * (onehot - p)
             + entropy_coef / m * p * (log_p + entropy[:, None]))
        g = np.where(masks, g, np.float32(0.0))

        g = self._linear_grad(g, r2, "head.4") * (a2 > 0)
        g = self._linear_grad(g, r1, "head.2") * (a1 > 0)
        g_w1 = self.g["head.0.weight"]
        g_w1[:, :k] = g.T @ t.table[at]
        g_w1[:, k:] = g.T @ contexts
        self.g["head.0.bias"][:] = g.sum(axis=0)
        g_rows = g @ w1[:, :k]
        g_table = np.zeros_like(t.table)
        g_table[at] = g_rows
        self._table_gradient(t, g_table)
        return float(loss)

    def _table_gradient(self, t: Table, g_table: np.ndarray) -> None:
        dim = self.dim
        two = 2 * dim
        g_h = np.zeros_like(t.h)
        g_h[self.rows] = g_table[:, :two]
        g_sums = g_table[:, two:] * self._inverse
        g_par = g_sums[:, 2 * dim:]
        # up = [fa, fp] summed over each row's ancestors, down = [fd, fp] over its
        # descendants, parallel = sum(fp) - down_p - up_p - fp[rows]; so a node's
        # gradient from up sums over the rows it is an ancestor of (its descendants among
        # the rows), and from down over its ancestors among the rows
        g_up, g_down = np.zeros((2, self.pg.n_nodes, 2 * dim), dtype=g_sums.dtype)
        g_up[self.rows] = np.concatenate([g_sums[:, :dim], -g_par], axis=1)
        g_down[self.rows] = np.concatenate([g_sums[:, dim:2 * dim], -g_par], axis=1)
        from_up, from_down = self._descendants(g_up), self._ancestors(g_down)
        g_fp = from_up[:, dim:] + from_down[:, dim:] + g_par.sum(axis=0)
        g_fp[self.rows] -= g_par
        for prefix, (first, hidden, out), g_out in zip(
                _SETS, t.sets, (from_up[:, :dim], from_down[:, :dim], g_fp), strict=True):
            g = self._linear_grad(g_out * (out > 0), hidden, f"{prefix}.2")
            g_h += self._linear_grad(g * (first > 0), t.h, f"{prefix}.0")
        pg = self.pg
        for i, (prefix, direction) in enumerate(zip(_PASSES, (pg.forward, pg.backward),
                                                    strict=True)):
            pre, hid = t.passes[i]
            w = self.w
            g_base, g_msg, g_hid = _pass_gradient(
                direction.order, direction.ptr, direction.idx, pre, hid,
                w[f"{prefix}.message.0.weight"], w[f"{prefix}.message.1.weight"],
                np.ascontiguousarray(g_h[:, i * dim:(i + 1) * dim]))
            self._linear_grad(g_msg, _relu(hid), f"{prefix}.message.1", g_in=False)
            self._linear_grad(g_hid, t.h[:, i * dim:(i + 1) * dim], f"{prefix}.message.0",
                              g_in=False)
            self._linear_grad(g_base, t.x, f"{prefix}.update", g_in=False)

    # ---------------------------------------------------------------- Adam
    def step(self) -> None:
        """Clip ``grad``'s norm to ``grad_clip``, then one Adam step (`FlatAdam`'s
        arithmetic, fused in one compiled loop)."""
        self.steps += 1
        _adam(self.flat, self.grad, self.exp_avg, self.exp_avg_sq, self.lr, self.grad_clip,
              *self.betas, self.eps, self.steps)
