"""One episode of `PlacementEnv` played by the policy in a single compiled call.

`play_episode` does what the trainer's step-by-step loop over `PlacementEnv.step` does
-- the step context of the current node, the head's logits, the device choice, the move,
the simulation and the reward, the bookkeeping of the best placement and of the context
-- for a whole episode inside one numba kernel, so an episode costs one call from
Python instead of several per node. A node whose colocation group was decided earlier
in the episode (a *forced* step) only marks itself done. The results are the same as
the loop's, node for node: the same contexts, masks, actions, rewards and placements
(the head's float32 arithmetic may round differently from numpy's in the last bit; the
tests compare whole runs).

Sampling draws one uniform number per decision with a choice, in the order of the
decisions, from the run's ``numpy.random.Generator``, as the loop does: the kernel gets
enough numbers for every group, and the generator is then moved on by exactly as many
as were used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from travorder.placement._jit import jit
from travorder.placement.rl.env import PlacementEnv
from travorder.placement.rl.policy import EpisodeHead, StepContext, _context
from travorder.placement.simulator import _overflow, _run, _workspace


@dataclass(frozen=True, eq=False)
class Episode:
    """What an episode did, one row per step in the order (all ``n`` steps), and how many
    placements it simulated."""

    nodes: np.ndarray
    contexts: np.ndarray
    masks: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    simulations: int


@jit()
def _log(cost):  # pragma: no cover - compiled
    return math.log(max(cost, 1e-9))


@jit()
def _evaluate(place, memory, capacity, penalty, ws, sim):  # pragma: no cover - compiled
    """(cost, step time, feasible, overflow) of one placement, as `PlacementEnv`, simulated
    in the workspace ``ws`` (`_workspace`) with the simulator's arguments ``sim``; without
    ``memory`` (when every placement fits) only its times are simulated."""
    res = _run(ws, place, False, memory, *sim)
    step = res[0]
    feasible = np.all(res[4] <= capacity)
    over = _overflow(res[4], capacity)
    cost = step if feasible else step * (1.0 + penalty * max(over, 0.0))
    return cost, step, feasible, over


@jit()
def _matvec(w_t, x, out):  # pragma: no cover - compiled
    """``out = w @ x`` from ``w``'s transpose: row by row of ``w_t``, contiguous and
    vectorised, each output summing its terms in the order of ``x``."""
    out[:] = 0.0
    for j in range(x.size):
        xj = x[j]
        for i in range(out.size):
            out[i] += w_t[j, i] * xj


@jit()
def _head(v, ctx, first, ctx_t, w2_t, b2, w3_t, b3, h1, h2,
          logits):  # pragma: no cover - compiled
    """`EpisodeHead` of node ``v`` into ``logits``, through the work rows ``h1``, ``h2``
    (the weights transposed)."""
    _matvec(ctx_t, ctx, h1)
    for i in range(h1.size):
        h1[i] = max(first[v, i] + h1[i], np.float32(0.0))
    _matvec(w2_t, h1, h2)
    for i in range(h2.size):
        h2[i] = max(h2[i] + b2[i], np.float32(0.0))
    _matvec(w3_t, h2, logits)
    for i in range(logits.size):
        logits[i] += b3[i]


@jit()
def _choose(logits, mask, greedy, u, cdf):  # pragma: no cover - compiled
    """The trainer's choice: argmax, or inverse-CDF sampling with ``u`` (``cdf``: a work
    row), over ``mask``."""
    top = np.float32(-np.inf)
    best = 0
    for a in range(mask.size):
        if mask[a] and logits[a] > top:
            top, best = logits[a], a
    if greedy:
        return best
    acc = np.float32(0.0)
    for a in range(mask.size):
        if mask[a]:
            acc += np.exp(logits[a] - top)
        cdf[a] = acc
    x = u * cdf[-1]
    a = 0
    while a < cdf.size and cdf[a] <= x:
        a += 1
    if a < mask.size:
        return a
    return np.flatnonzero(mask)[-1]  # u * total rounded up


@jit()
def _update_rows(rows, on, total, cost, v, lo, hi, by_group, device,
                 n_dev):  # pragma: no cover - compiled
    """`StepContext.update` (``on``: its ``_device``) for node ``v`` whose group
    ``by_group[lo:hi]`` is on ``device``."""
    if rows[v, 2 + device] == 1.0:
        total[1] += 1.0 - rows[v, 1]
        rows[v, 1] = 1.0
        return
    width = rows.shape[1]
    before = np.zeros(width)
    for k in range(lo, hi):
        before += rows[by_group[k]]
    total -= before
    for k in range(lo, hi):
        w = by_group[k]
        rows[w, 2:2 + 2 * n_dev] = 0.0
        rows[w, 2 + device] = 1.0
        rows[w, 2 + n_dev + device] = cost[w]
        on[w] = device
    rows[v, 1] = 1.0
    after = np.zeros(width)
    for k in range(lo, hi):
        after += rows[by_group[k]]
    total += after


@jit()
def _play(order, group, by_group, bounds, place, state, best_place, check_mask, memory,
          capacity, penalty, sim, rows, on, total, cost_norm, set_ptr, set_idx, first,
          ctx_t, w2_t, b2, w3_t, b3, greedy, uniforms, reset_cands, contexts, masks,
          actions, rewards):  # pragma: no cover - compiled
    """Play one episode in place; ``state`` is ``[cost, step, feasible, overflow,
    best_cost, best_step, best_feasible, best_overflow]``; ``reset_cands`` holds the
    first node's candidates (step times, feasibility, overflow) when the reset simulated
    them, else is empty; ``memory``: whether the simulations track memory (else every
    placement fits). Returns how many uniforms were used and how many placements were
    simulated."""
    n = order.size
    n_dev = masks.shape[1]
    decided = np.zeros(bounds.size - 1, dtype=np.bool_)
    ws = _workspace(n, sim[3].size, n_dev, False)  # sim[3]: the out-edges
    cand = place.copy()
    c_cost = np.empty(n_dev)
    c_step = np.empty(n_dev)
    c_feas = np.empty(n_dev, dtype=np.bool_)
    c_over = np.empty(n_dev)
    h1, h2 = np.empty(b2.size, dtype=b2.dtype), np.empty(b2.size, dtype=b2.dtype)
    logits, cdf = np.empty(n_dev, dtype=b3.dtype), np.empty(n_dev, dtype=b3.dtype)
    used = 0
    sims = 0
    for t in range(n):
        v = order[t]
        gid = group[v]
        lo, hi = bounds[gid], bounds[gid + 1]
        here = place[v]
        if decided[gid]:  # forced: the group's device was chosen earlier
            masks[t, here] = True
            actions[t] = here
            _update_rows(rows, on, total, cost_norm, v, lo, hi, by_group, here, n_dev)
            continue
        simulated = False
        if check_mask:  # every candidate simulated: the mask, and the chosen one's cost
            simulated = True
            cand[:] = place
            any_feasible = False
            low = np.inf
            stays = True  # the group on ``here``: that candidate is the present placement
            for k in range(lo, hi):
                stays &= place[by_group[k]] == here
            for d in range(n_dev):
                if t == 0 and reset_cands.shape[0] == 3:
                    step, feasible = reset_cands[0, d], reset_cands[1, d] > 0.5
                    over = reset_cands[2, d]
                    cost = step if feasible else step * (1.0 + penalty * max(over, 0.0))
                elif d == here and stays:
                    cost, step, feasible, over = state[0], state[1], state[2] > 0.5, state[3]
                else:
                    for k in range(lo, hi):
                        cand[by_group[k]] = d
                    cost, step, feasible, over = _evaluate(cand, memory, capacity, penalty,
                                                           ws, sim)
                    sims += 1
                c_cost[d] = cost
                c_step[d] = step
                c_feas[d] = feasible
                c_over[d] = over
                any_feasible |= c_feas[d]
                low = min(low, c_over[d])
            for d in range(n_dev):
                masks[t, d] = c_feas[d] if any_feasible else c_over[d] == low
        else:
            masks[t, :] = True
        if masks[t].sum() > 1:
            ctx = _context(v, rows, on, total, set_ptr, set_idx, n_dev)
            contexts[t] = ctx
            _head(v, ctx, first, ctx_t, w2_t, b2, w3_t, b3, h1, h2, logits)
            d = _choose(logits, masks[t], greedy, uniforms[used] if not greedy else 0.0,
                        cdf)
            if not greedy:
                used += 1
        else:
            d = np.flatnonzero(masks[t])[0]
        actions[t] = d
        if here != d:
            for k in range(lo, hi):
                place[by_group[k]] = d
            old = state[0]
            if simulated:
                cost, step, feasible, over = c_cost[d], c_step[d], c_feas[d], c_over[d]
            else:
                cost, step, feasible, over = _evaluate(place, memory, capacity, penalty, ws,
                                                       sim)
                sims += 1
            state[0], state[1], state[2], state[3] = cost, step, feasible, over
            rewards[t] = _log(old) - _log(cost)
            best_feasible = state[6] > 0.5
            if (feasible and not best_feasible) or (feasible == best_feasible
                                                    and cost < state[4]):
                best_place[:] = place
                state[4:8] = state[0:4]
        decided[gid] = True
        _update_rows(rows, on, total, cost_norm, v, lo, hi, by_group, d, n_dev)
    return used, sims


def _transposed(w: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(w.T)


def play_episode(env: PlacementEnv, context: StepContext, head: EpisodeHead, greedy: bool,
                 rng: np.random.Generator) -> Episode:
    """Play the episode `env` was just reset for; `env` and `context` end as after the
    last `PlacementEnv.step` and `StepContext.update`."""
    n, n_dev = env.graph.n_nodes, env.n_devices
    n_groups = env._bounds.size - 1
    if greedy:
        uniforms = np.zeros(1)
    else:
        saved = rng.bit_generator.state
        uniforms = rng.random(n_groups)
    contexts = np.zeros((n, context.width), dtype=np.float32)
    masks = np.zeros((n, n_dev), dtype=bool)
    actions = np.zeros(n, dtype=np.int64)
    rewards = np.zeros(n)
    state = np.array([env.cost, env.step_us, env.feasible, env.overflow, env.best_cost,
                      env.best_step_us, env.best_feasible, env.best_overflow])
    best = env.best_placement
    (w2, b2), (w3, b3) = head._layers
    reset_cands = (np.zeros((0, n_dev)) if env._cand is None else
                   np.stack([env._cand.step_time_us, env._cand.feasible, env._cand.overflow]))
    used, sims = _play(env.order, env._group, env._by_group, env._bounds, env.placement,
                       state, best, env.memory == "mask" and not env.always_fits,
                       not env.always_fits, env.capacity, env.memory_penalty, env.sim._args,
                       context._rows, context._device, context._total, context._cost,
                       context.pg.set_ptr, context.pg.set_idx, head._first,
                       _transposed(head._context), _transposed(w2), b2, _transposed(w3), b3,
                       greedy, uniforms, reset_cands, contexts, masks, actions, rewards)
    if not greedy:
        rng.bit_generator.state = saved
        rng.random(used)
    env.cost, env.step_us, env.overflow = float(state[0]), float(state[1]), float(state[3])
    env.best_cost, env.best_step_us = float(state[4]), float(state[5])
    env.best_overflow = float(state[7])
    env.feasible, env.best_feasible = bool(state[2]), bool(state[6])
    env.done[:] = 1
    env.t = n
    env.simulations += sims
    return Episode(env.order.copy(), contexts, masks, actions, rewards, sims)
