"""REINFORCE for the Placeto-style placer, top to bottom in `train`.

One run trains a fresh policy on one graph (as the study did): ``episodes`` episodes of
`PlacementEnv`, each visiting every node once in the traversal order. Every
``eval_every``-th episode picks the most likely device at each step and is not used for
learning; the others sample, and after each of them the policy takes one Adam step on

``loss = -mean_t (G_t - b_t) log pi(a_t | s_t) - entropy_coef * mean_t H(pi(. | s_t))``

over the steps that had a choice, where ``G_t`` is the return from step ``t`` on and
``b_t`` the mean of ``G_t`` over the last ``baseline_window`` training episodes (zero
before the first), with the gradient norm clipped to ``grad_clip``.

A run is deterministic for a given seed on CPU: the policy's initial weights come from
``torch.manual_seed(seed)`` (the caller's torch random state is left as it was), the
sampling from ``numpy.random.default_rng(seed)``, and torch and numpy's BLAS run on
``threads`` threads (one).

The graph network, the loss's gradient and the Adam step run in numpy with hand-derived
gradients (`NumpyNetwork`) or, with ``network="torch"``, in torch with autograd and
`FlatAdam` (the reference, and the path of the bundled RL study; the ``sage`` encoder
always runs there). The two agree to float rounding, so a run with a given seed may
follow another trajectory under each.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from threadpoolctl import ThreadpoolController

from travorder.errors import TravorderError
from travorder.graph import OpGraph
from travorder.placement._jit import jit
from travorder.placement.clusters import Cluster
from travorder.placement.orders import check_visit
from travorder.placement.rl.env import MEMORY_MODES, PlacementEnv
from travorder.placement.rl.episode import Episode, play_episode
from travorder.placement.rl.network import NumpyNetwork
from travorder.placement.rl.policy import (
    EpisodeHead,
    PlacementPolicy,
    PolicyGraph,
    StepContext,
    static_features,
)
from travorder.placement.simulator import Simulator

ENCODERS = ("placeto", "sage")

#: Where the policy's network, gradient and Adam step run: numpy (`NumpyNetwork`) or
#: torch (`TorchNetwork`, the reference; the same up to float rounding, slower).
NETWORKS = ("numpy", "torch")


#: The widest graph network and head (``dim``, ``hidden``) and the most threads a run
#: takes: far above any use, below what exhausts memory or torch's thread count.
MAX_WIDTH, MAX_THREADS = 4096, 1024


@dataclass(frozen=True)
class RLConfig:
    """Settings of one RL placement run.

    The defaults follow Placeto and the study (50 episodes, every 5th greedy, Adam 1e-3,
    gradient clip 1.25) except for the returns: ``gamma = 0.5`` and a 10-episode
    baseline, with which learning shows within 50 episodes (Placeto's undiscounted
    returns and all-episode baseline are in `paper`; see ``docs/rl.md``).

    ``episodes``: episodes per run; ``eval_every``: every this many episodes one is
    greedy and not learnt from; ``lr``: Adam's learning rate; ``grad_clip``: the largest
    gradient norm; ``entropy_coef``: weight of the entropy bonus; ``baseline_window``:
    how many recent training episodes the per-step baseline averages; ``gamma``: discount
    of the returns; ``encoder``: ``"placeto"`` or ``"sage"``; ``dim`` / ``hidden``:
    widths of the graph network and of the head; ``memory`` / ``memory_penalty`` /
    ``colocate``: see `PlacementEnv`; ``threads``: torch and BLAS threads during the run;
    ``network``: ``"numpy"`` or ``"torch"`` (`NETWORKS`; see the module).
    """

    episodes: int = 50
    eval_every: int = 5
    lr: float = 1e-3
    grad_clip: float = 1.25
    entropy_coef: float = 0.01
    baseline_window: int = 10
    gamma: float = 0.5
    encoder: str = "placeto"
    dim: int = 32
    hidden: int = 64
    memory: str = "mask"
    memory_penalty: float = 10.0
    colocate: bool = True
    threads: int = 1
    network: str = "numpy"

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            kind = {"int": int, "float": float, "str": str, "bool": bool}[f.type]
            if isinstance(value, str) and kind is not str:
                value = _parse(f.name, value, kind)
            if isinstance(value, np.integer | np.floating | np.bool_):  # np.int64(3): 3
                value = value.item()
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if kind is bool and type(value) is int and value in (0, 1):  # -O colocate=0
                value = bool(value)
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise TravorderError(f"rl option {f.name} must be {f.type}, got {value!r}")
            object.__setattr__(self, f.name, value)
        checks = [
            (self.episodes >= 1, "episodes must be at least 1"),
            (self.eval_every >= 1, "eval_every must be at least 1"),
            (self.lr > 0 and math.isfinite(self.lr),
             f"lr must be positive and finite, got {self.lr}"),
            (self.grad_clip > 0, "grad_clip must be positive"),
            (self.entropy_coef >= 0 and math.isfinite(self.entropy_coef),
             f"entropy_coef must be finite and non-negative, got {self.entropy_coef}"),
            (self.baseline_window >= 1, "baseline_window must be at least 1"),
            (0 < self.gamma <= 1, "gamma must be in (0, 1]"),
            (self.encoder in ENCODERS, f"encoder must be one of {', '.join(ENCODERS)}"),
            (1 <= self.dim <= MAX_WIDTH and 1 <= self.hidden <= MAX_WIDTH,
             f"dim and hidden must be between 1 and {MAX_WIDTH}"),
            (self.memory in MEMORY_MODES, f"memory must be one of {', '.join(MEMORY_MODES)}"),
            (self.memory_penalty >= 0 and math.isfinite(self.memory_penalty),
             f"memory_penalty must be finite and non-negative, got "
             f"{self.memory_penalty}"),
            (1 <= self.threads <= MAX_THREADS, f"threads must be between 1 and {MAX_THREADS}"),
            (self.network in NETWORKS, f"network must be one of {', '.join(NETWORKS)}"),
        ]
        for ok, message in checks:
            if not ok:
                raise TravorderError(f"rl option {message}")

    @classmethod
    def paper(cls) -> RLConfig:
        """The study's setting, pinned: Placeto's REINFORCE with log step-time rewards,
        undiscounted returns (``disc_factor = 1``), a per-step baseline over all earlier
        episodes (``bl_n_rnds = 1000``), 50 episodes with every 5th greedy, Adam 1e-3,
        clip 1.25 and Placeto's encoder, on the ``k80x3`` cluster (3 devices), which
        `rl_place` enforces. The entropy weight and the network widths are not given
        by the study and are the defaults'."""
        return cls(episodes=50, eval_every=5, lr=1e-3, grad_clip=1.25, entropy_coef=0.01,
                   baseline_window=1000, gamma=1.0, encoder="placeto", dim=32, hidden=64,
                   memory="mask", memory_penalty=10.0, colocate=True, threads=1)

    @classmethod
    def paper_long(cls) -> RLConfig:
        """`paper` trained six times longer: 300 episodes (every 5th greedy), everything
        else the study's. For graphs where 50 episodes stop short (``docs/rl.md``)."""
        return dataclasses.replace(cls.paper(), episodes=300)

    @classmethod
    def from_options(cls, preset: str = "default", **options: Any) -> RLConfig:
        """A preset (``"default"``, ``"paper"`` or ``"paper_long"``) with some fields
        replaced; option values may be strings (as from a command line)."""
        if not isinstance(preset, str) or preset not in PRESETS:
            raise TravorderError(f"unknown rl preset {preset!r} (expected "
                                 f"{', '.join(PRESETS)})")
        names = [f.name for f in dataclasses.fields(cls)]
        for key in options:
            if key not in names:
                raise TravorderError(f"placer 'rl' has no option {key!r} (options: preset, "
                                     f"{', '.join(names)})")
        return dataclasses.replace(PRESETS[preset](), **options)


def _parse(name: str, text: str, kind: type) -> Any:
    if kind is bool:
        if text.lower() in ("true", "1", "yes", "on"):
            return True
        if text.lower() in ("false", "0", "no", "off"):
            return False
    else:
        try:
            return kind(text)
        except ValueError:
            pass
    raise TravorderError(f"rl option {name} must be {kind.__name__}, got {text!r}")


#: Presets by name: functions returning an `RLConfig`.
PRESETS = {"default": RLConfig, "paper": RLConfig.paper, "paper_long": RLConfig.paper_long}


@dataclass(frozen=True, eq=False)
class RLRun:
    """The outcome of `train`.

    ``placement`` is the best placement seen (feasible first, then fastest) with its
    ``step_time_us``, ``efficiency`` and ``feasible``. Per episode: ``curve`` is the
    step time of the episode's final placement, ``best_curve`` the best step time so far,
    ``greedy`` whether the episode was a greedy one. Time: ``env_s`` in the
    environment's set-up and resets (including the heuristic start under memory
    pressure), ``play_s`` playing the episodes (decisions and simulations; with the
    ``stepwise`` engine the environment's steps are counted here too), ``network_s``
    the graph network's pass at the start of each episode, ``update_s`` the REINFORCE
    updates (loss, backward, clipping, Adam), ``wall_s`` the whole run;
    ``policy_s = wall_s - env_s``. ``simulations``: placements simulated for rewards
    and masks.
    """

    placement: np.ndarray
    step_time_us: float
    efficiency: float
    feasible: bool
    curve: list[float]
    best_curve: list[float]
    greedy: list[bool]
    env_s: float
    policy_s: float
    wall_s: float
    config: RLConfig
    play_s: float = 0.0
    network_s: float = 0.0
    update_s: float = 0.0
    simulations: int = 0


def returns_to_go(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """``G_t = r_t + gamma * G_{t+1}`` for every step, computed backwards (stable for
    long episodes).

    >>> returns_to_go(np.array([1.0, 2.0, 4.0]), 0.5).tolist()
    [3.0, 4.0, 4.0]
    """
    return _returns(np.ascontiguousarray(rewards, dtype=np.float64), float(gamma))


@jit()
def _returns(rewards, gamma):  # pragma: no cover - compiled
    out = np.empty_like(rewards)
    acc = 0.0
    for t in range(rewards.size - 1, -1, -1):
        acc = rewards[t] + gamma * acc
        out[t] = acc
    return out


class FlatAdam:
    """Adam (no weight decay) and gradient-norm clipping over all of a module's
    parameters at once.

    The parameters and their gradients become views of one flat tensor each (autograd
    accumulates into the zeroed gradient views), so a step is a handful of tensor
    operations whatever the number of layers; the arithmetic is that of
    ``torch.optim.Adam``'s single-tensor path, so results match it (the clipping norm is
    taken over the flat gradient, which may round differently from
    ``clip_grad_norm_``'s norm of per-tensor norms). Avoids ``torch.optim``, whose first
    use imports ``torch._dynamo`` (seconds of start-up).
    """

    def __init__(self, module: torch.nn.Module, lr: float, grad_clip: float,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        self.params = [p for p in module.parameters() if p.requires_grad]
        with torch.no_grad():
            self.flat = torch.cat([p.reshape(-1) for p in self.params])
            self.grad = torch.zeros_like(self.flat)
            offset = 0
            for p in self.params:
                p.data = self.flat[offset:offset + p.numel()].view_as(p)
                p.grad = self.grad[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
        self.lr, self.grad_clip, self.betas, self.eps = lr, grad_clip, betas, eps
        self.exp_avg = torch.zeros_like(self.flat)
        self.exp_avg_sq = torch.zeros_like(self.flat)
        self.steps = 0

    def zero_grad(self) -> None:
        self.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        """Clip the gradient norm to ``grad_clip``, then one Adam step."""
        grad = self.grad
        norm = torch.linalg.vector_norm(grad)
        grad.mul_(torch.clamp(self.grad_clip / (norm + 1e-6), max=1.0))
        beta1, beta2 = self.betas
        self.steps += 1
        self.exp_avg.lerp_(grad, 1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step_size = self.lr / (1 - beta1 ** self.steps)
        denom = (self.exp_avg_sq.sqrt() / math.sqrt(1 - beta2 ** self.steps)).add_(self.eps)
        self.flat.addcdiv_(self.exp_avg, denom, value=-step_size)


class TorchNetwork:
    """The policy in torch, trained with autograd and `FlatAdam`: the reference for
    `NumpyNetwork`, with the same methods."""

    def __init__(self, policy: PlacementPolicy, pg: PolicyGraph, lr: float,
                 grad_clip: float) -> None:
        self.policy, self.pg = policy, pg
        self.optimizer = FlatAdam(policy, lr, grad_clip)

    def node_table(self, x: np.ndarray, grad: bool = True) -> torch.Tensor:
        """The episode table of the features ``x``, with gradients if ``grad``."""
        with torch.set_grad_enabled(grad):
            return self.policy.node_table(torch.from_numpy(x), self.pg)

    def episode_head(self, table: torch.Tensor) -> EpisodeHead:
        return EpisodeHead.of_policy(self.policy, table.detach())

    def loss(self, table: torch.Tensor, nodes: np.ndarray, contexts: np.ndarray,
             masks: np.ndarray, actions: np.ndarray, advantage: np.ndarray,
             entropy_coef: float) -> torch.Tensor:
        """The REINFORCE loss over the decisions at ``nodes`` (see the module)."""
        logits = self.policy(table[nodes], torch.from_numpy(contexts))
        allowed = torch.from_numpy(masks)
        log_p = torch.log_softmax(logits.masked_fill(~allowed, -torch.inf), dim=-1)
        log_p = log_p.masked_fill(~allowed, 0.0)
        taken = log_p.gather(1, torch.from_numpy(actions)[:, None])[:, 0]
        entropy = -(log_p.exp() * log_p).sum(dim=-1)
        return -(torch.from_numpy(advantage) * taken).mean() - entropy_coef * entropy.mean()

    def update(self, table: torch.Tensor, nodes: np.ndarray, contexts: np.ndarray,
               masks: np.ndarray, actions: np.ndarray, advantage: np.ndarray,
               entropy_coef: float) -> None:
        """One Adam step on the REINFORCE loss over the decisions at ``nodes``."""
        loss = self.loss(table, nodes, contexts, masks, actions, advantage, entropy_coef)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()


class ReturnsWindow:
    """The returns of the latest ``window`` sampled episodes (``n`` steps each; at most
    ``episodes`` are appended), kept oldest first in rows of one array, so that `mean`
    is ``np.mean`` over them without stacking them each time (the same sums, in the
    same order, as over a deque of them)."""

    def __init__(self, window: int, n: int, episodes: int) -> None:
        self.window = window
        self._rows = np.zeros((max(min(episodes, 2 * window), 1), n))
        self._kept = 0

    def mean(self) -> np.ndarray:
        """The per-step mean over the window; zeros before the first episode."""
        if not self._kept:
            return np.zeros(self._rows.shape[1])
        return np.mean(self._rows[max(self._kept - self.window, 0):self._kept], axis=0)

    def append(self, returns: np.ndarray) -> None:
        if self._kept == len(self._rows):  # full: keep the latest window - 1, in order
            keep = self.window - 1
            self._rows[:keep] = self._rows[self._kept - keep:self._kept]
            self._kept = keep
        self._rows[self._kept] = returns
        self._kept += 1


def _choose(logits: np.ndarray, mask: np.ndarray, greedy: bool,
            rng: np.random.Generator) -> int:
    z = np.where(mask, logits, -np.inf)
    if greedy:
        return int(np.argmax(z))
    cdf = np.cumsum(np.exp(z - z.max()))
    a = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return a if a < mask.size else int(np.flatnonzero(mask)[-1])  # u * total rounded up


def _play_stepwise(env: PlacementEnv, obs: dict[str, Any], context: StepContext,
                   head: EpisodeHead, greedy: bool, rng: np.random.Generator
                   ) -> tuple[Episode, dict[str, Any]]:
    """Play an episode through `PlacementEnv.step`, one Python call per node: the
    reference for `play_episode`, which gives the same episode in one compiled call."""
    n, n_dev = env.graph.n_nodes, env.n_devices
    nodes = np.empty(n, dtype=np.int64)
    contexts = np.zeros((n, context.width), dtype=np.float32)
    masks = np.zeros((n, n_dev), dtype=bool)
    actions = np.zeros(n, dtype=np.int64)
    rewards = np.zeros(n)
    info: dict[str, Any] = {}
    sims = env.simulations
    for t in range(n):
        v, mask = obs["node"], obs["action_mask"].astype(bool)
        nodes[t], masks[t] = v, mask
        if mask.sum() > 1:
            contexts[t] = context(v)
            actions[t] = _choose(head(v, contexts[t]), mask, greedy, rng)
        else:
            actions[t] = np.flatnonzero(mask)[0]
        obs, rewards[t], _, _, info = env.step(actions[t])
        context.update(v, info["moved"], info["device"])
    return Episode(nodes, contexts, masks, actions, rewards, env.simulations - sims), info


@functools.cache
def _threadpools() -> ThreadpoolController:
    """The loaded thread pools (BLAS's among them), found once: finding them reads the
    process's memory map (milliseconds)."""
    return ThreadpoolController()


#: How an episode is played: in one compiled call, or step by step through the
#: Gymnasium API (the reference; the same results, slower).
ENGINES = ("compiled", "stepwise")


#: Where set, called after each episode of `train` with the episodes played, the episodes
#: in all and the best step time so far (us): ``travorder place --placer rl`` shows a
#: progress bar through it, without the placers' options knowing of it.
EPISODE_PROGRESS: contextvars.ContextVar[Callable[[int, int, float], None] | None] = (
    contextvars.ContextVar("episode_progress", default=None))


def train(graph: OpGraph, cluster: Cluster, order: np.ndarray, seed: int = 0,
          config: RLConfig | None = None, simulator: Simulator | None = None,
          engine: str = "compiled") -> RLRun:
    """Train a Placeto policy on ``graph`` visiting nodes in ``order``; see the module.

    ``engine`` is ``"compiled"`` (`play_episode`) or ``"stepwise"`` (`PlacementEnv.step`
    per node, the reference); both give the same run. On a cluster with Placeto's
    simulator semantics the episodes are played step by step.
    """
    if engine not in ENGINES:
        raise TravorderError(f"unknown engine {engine!r} (expected {' or '.join(ENGINES)})")
    config = config or RLConfig()
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        with torch.random.fork_rng(devices=[]), _threadpools().limit(
                limits=config.threads, user_api="blas"):
            torch.manual_seed(seed)
            return _train(graph, cluster, order, seed, config, simulator, engine)
    finally:
        torch.set_num_threads(threads)


def _train(graph: OpGraph, cluster: Cluster, order: np.ndarray, seed: int,
           config: RLConfig, simulator: Simulator | None, engine: str) -> RLRun:
    start = time.perf_counter()
    env = PlacementEnv(graph, cluster, order, memory=config.memory,
                       memory_penalty=config.memory_penalty, colocate=config.colocate,
                       simulator=simulator)
    env_s = time.perf_counter() - start
    n, n_dev = graph.n_nodes, cluster.n_devices
    pg = PolicyGraph(graph, env.sim.compute_us.mean(axis=1))
    policy = PlacementPolicy(n_dev, encoder=config.encoder, dim=config.dim,
                             hidden=config.hidden)
    net: NumpyNetwork | TorchNetwork
    if config.network == "numpy" and config.encoder == "placeto":
        net = NumpyNetwork(policy, pg, config.lr, config.grad_clip, rows=env.deciders())
    else:
        net = TorchNetwork(policy, pg, config.lr, config.grad_clip)
    context = StepContext(pg, n_dev)
    rng = np.random.default_rng(seed)
    recent_returns = ReturnsWindow(config.baseline_window, n, config.episodes)
    curve, best_curve, greedy_flags = [], [], []
    play_s = network_s = update_s = 0.0

    t0 = time.perf_counter()
    obs, info = env.reset(seed=seed)
    env_s += time.perf_counter() - t0
    report = EPISODE_PROGRESS.get()
    for episode in range(config.episodes):
        if episode:
            t0 = time.perf_counter()
            obs, info = env.reset()
            env_s += time.perf_counter() - t0
        greedy = (episode + 1) % config.eval_every == 0

        # The episode's fixed features go through the graph network once.
        t0 = time.perf_counter()
        x = static_features(pg, obs["placement"], obs["start"], n_dev)
        table = net.node_table(x, grad=not greedy)
        head = net.episode_head(table)
        context.reset(obs["placement"])
        t1 = time.perf_counter()
        network_s += t1 - t0

        # Play the episode.
        if engine == "compiled" and cluster.semantics == "travorder":
            ep = play_episode(env, context, head, greedy, rng)
            info = env._info()
        else:
            ep, info = _play_stepwise(env, obs, context, head, greedy, rng)
        nodes, contexts, masks, actions, rewards = (ep.nodes, ep.contexts, ep.masks,
                                                    ep.actions, ep.rewards)
        play_s += time.perf_counter() - t1
        curve.append(info["step_time_us"])
        best_curve.append(env.best_step_us)
        greedy_flags.append(greedy)
        if report is not None:
            report(episode + 1, config.episodes, env.best_step_us)
        if greedy:
            continue

        # REINFORCE with a per-step baseline over recent episodes.
        t0 = time.perf_counter()
        returns = returns_to_go(rewards, config.gamma)
        baseline = recent_returns.mean()
        recent_returns.append(returns)
        steps = np.flatnonzero(masks.sum(axis=1) > 1)
        if steps.size == 0:
            update_s += time.perf_counter() - t0
            continue
        advantage = (returns - baseline)[steps].astype(np.float32)
        net.update(table, nodes[steps], contexts[steps], masks[steps], actions[steps],
                   advantage, config.entropy_coef)
        update_s += time.perf_counter() - t0

    wall = time.perf_counter() - start
    best = env.best_placement.copy()
    step = env.best_step_us
    lower = env.sim.lower_bound_us
    return RLRun(
        placement=best, step_time_us=step, efficiency=lower / step if step > 0 else 1.0,
        feasible=env.best_feasible, curve=curve, best_curve=best_curve,
        greedy=greedy_flags, env_s=env_s, policy_s=wall - env_s, wall_s=wall,
        config=config, play_s=play_s, network_s=network_s, update_s=update_s,
        simulations=env.simulations,
    )


def rl_place(graph: OpGraph, cluster: Cluster, order: np.ndarray, seed: int = 0, *,
             preset: str = "default", **options: Any) -> tuple[np.ndarray, list[float]]:
    """The ``rl`` placer: train with `RLConfig` ``preset`` and ``options``; return the
    best placement and the learning curve (final step time per episode)."""
    config = RLConfig.from_options(preset, **options)
    order = check_visit(graph, order)
    if preset.startswith("paper") and cluster.n_devices != 3:
        raise TravorderError(f"the {preset} preset is the study's setting on 3 devices "
                             f"(k80x3); cluster {cluster.name!r} has {cluster.n_devices}")
    run = train(graph, cluster, order, seed, config)
    return run.placement, run.curve
