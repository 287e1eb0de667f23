"""The Placeto policy's forward and backward pass and its Adam step in numpy and numba.

`NumpyNetwork` computes what `PlacementPolicy` (Placeto encoder) and the trainer's loss,
``loss.backward()`` and `FlatAdam` compute, with hand-derived gradients and no torch
operation: the episode table (message passes in the compiled kernels of `policy`, set
aggregations as products with the reachability matrix), the head over an episode's
decisions, the REINFORCE loss's gradient, global-norm clipping and Adam, all over one
flat float32 parameter vector. A torch update costs a few hundred small tensor
operations, each with dispatch and autograd overhead that dwarfs its arithmetic on
graphs of a few hundred nodes; here it is a few dozen numpy calls.

The arithmetic is torch's (float32, the same formulas); the products run through
numpy's BLAS instead of torch's, so results agree with the torch path to float rounding
(the tests compare gradients and whole updates), not bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from travorder.placement.rl.policy import (
    EpisodeHead,
    PlacementPolicy,
    PolicyGraph,
    _pass_backward,
    _pass_forward,
)

_PASSES = ("encoder.forward_pass", "encoder.backward_pass")
_SETS = ("sets.transforms.0", "sets.transforms.1", "sets.transforms.2")
_HEAD = ("head.0", "head.2", "head.4")


@dataclass(eq=False)
class Table:
    """An episode table and what its backward pass needs."""

    table: np.ndarray
    x: np.ndarray
    passes: list[tuple[np.ndarray, np.ndarray]]  # (pre, hid) per direction
    h: np.ndarray
    sets: list[tuple[np.ndarray, np.ndarray]]  # (first layer's output, relu'd output) per set


def _relu(a: np.ndarray) -> np.ndarray:
    return np.maximum(a, np.float32(0.0))


class NumpyNetwork:
    """A `PlacementPolicy` with the Placeto encoder, its weights copied into one flat
    float32 vector, trained by REINFORCE with Adam and gradient-norm clipping.

    ``lr``, ``grad_clip``, ``betas`` and ``eps`` are `FlatAdam`'s.
    """

    def __init__(self, policy: PlacementPolicy, lr: float, grad_clip: float,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        named = [(name, p.detach().numpy()) for name, p in policy.named_parameters()]
        self.flat = np.concatenate([p.ravel() for _, p in named])  # float32 as torch's
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
    def node_table(self, x: np.ndarray, pg: PolicyGraph, grad: bool = True) -> Table:
        """`PlacementPolicy.node_table` of the features ``x`` (`static_features`), with
        what its backward pass needs (kept whatever ``grad``: it costs nothing more)."""
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
            out = _relu(self._linear(_relu(first), f"{prefix}.2"))
            sets.append((first, out))
            outs.append(out)
        fa, fd, fp = outs
        desc = pg.descendants.numpy()
        up = desc.T @ np.concatenate([fa, fp], axis=1)
        down = desc @ np.concatenate([fd, fp], axis=1)
        dim = self.dim
        parallel = fp.sum(axis=0, keepdims=True) - down[:, dim:] - up[:, dim:] - fp
        sums = np.concatenate([up[:, :dim], down[:, :dim], parallel], axis=1)
        table = np.concatenate([h, sums * pg.inverse_sizes(dim).numpy()], axis=1)
        return Table(table, x, passes, h, sets)

    def episode_head(self, t: Table) -> EpisodeHead:
        """The head for playing an episode on table ``t``."""
        return EpisodeHead.of_layers(
            [(self.w[f"{name}.weight"], self.w[f"{name}.bias"]) for name in _HEAD], t.table)

    def update(self, t: Table, pg: PolicyGraph, nodes: np.ndarray, contexts: np.ndarray,
               masks: np.ndarray, actions: np.ndarray, advantage: np.ndarray,
               entropy_coef: float) -> None:
        """One Adam step on the REINFORCE loss over the decisions at ``nodes``."""
        self.gradient(t, pg, nodes, contexts, masks, actions, advantage, entropy_coef)
        self.step()

    # ---------------------------------------------------------------- backward
    def gradient(self, t: Table, pg: PolicyGraph, nodes: np.ndarray, contexts: np.ndarray,
                 masks: np.ndarray, actions: np.ndarray, advantage: np.ndarray,
                 entropy_coef: float) -> float:
        """Set ``grad`` to the gradient of the trainer's loss over the decisions at
        ``nodes`` (distinct) and return the loss."""
        self.grad[:] = 0.0
        m, k = nodes.size, t.table.shape[1]
        rows = t.table[nodes]
        inputs = np.concatenate([rows, contexts], axis=1)
        a1 = self._linear(inputs, "head.0")
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
        self._linear_grad(g, inputs, "head.0", g_in=False)
        g_rows = g @ self.w["head.0.weight"][:, :k]
        g_table = np.zeros_like(t.table)
        g_table[nodes] = g_rows
        self._table_gradient(t, pg, g_table)
        return float(loss)

    def _table_gradient(self, t: Table, pg: PolicyGraph, g_table: np.ndarray) -> None:
        dim = self.dim
        two = 2 * dim
        g_h = g_table[:, :two].copy()
        g_sums = g_table[:, two:] * pg.inverse_sizes(dim).numpy()
        desc = pg.descendants.numpy()
        g_par = g_sums[:, 2 * dim:]
        # up = D^T [fa, fp], down = D [fd, fp], parallel = sum(fp) - down_p - up_p - fp
        from_up = desc @ np.concatenate([g_sums[:, :dim], -g_par], axis=1)
        from_down = desc.T @ np.concatenate([g_sums[:, dim:2 * dim], -g_par], axis=1)
        g_fp = from_up[:, dim:] + from_down[:, dim:] + (g_par.sum(axis=0) - g_par)
        for prefix, (first, out), g_out in zip(_SETS, t.sets,
                                               (from_up[:, :dim], from_down[:, :dim], g_fp),
                                               strict=True):
            g = self._linear_grad(g_out * (out > 0), _relu(first), f"{prefix}.2")
            g_h += self._linear_grad(g * (first > 0), t.h, f"{prefix}.0")
        for i, (prefix, direction) in enumerate(zip(_PASSES, (pg.forward, pg.backward),
                                                    strict=True)):
            pre, hid = t.passes[i]
            w = self.w
            g_base, gw1, gb1, gw2, gb2 = _pass_backward(
                direction.order, direction.ptr, direction.idx, pre, hid,
                w[f"{prefix}.message.0.weight"], w[f"{prefix}.message.1.weight"],
                np.ascontiguousarray(g_h[:, i * dim:(i + 1) * dim]))
            for name, grad in (("0.weight", gw1), ("0.bias", gb1), ("1.weight", gw2),
                               ("1.bias", gb2)):
                self.g[f"{prefix}.message.{name}"] += grad
            self._linear_grad(g_base, t.x, f"{prefix}.update", g_in=False)

    # ---------------------------------------------------------------- Adam
    def step(self) -> None:
        """Clip ``grad``'s norm to ``grad_clip``, then one Adam step (`FlatAdam`'s
        arithmetic)."""
        grad = self.grad
        norm = np.sqrt(np.dot(grad, grad))
        grad *= min(np.float32(self.grad_clip) / (norm + np.float32(1e-6)), np.float32(1.0))
        beta1, beta2 = self.betas
        self.steps += 1
        self.exp_avg += np.float32(1 - beta1) * (grad - self.exp_avg)
        self.exp_avg_sq *= np.float32(beta2)
        self.exp_avg_sq += np.float32(1 - beta2) * grad * grad
        step_size = self.lr / (1 - beta1 ** self.steps)
        denom = np.sqrt(self.exp_avg_sq)
        denom /= np.float32(np.sqrt(1 - beta2 ** self.steps))
        denom += np.float32(self.eps)
        self.flat -= np.float32(step_size) * (self.exp_avg / denom)
