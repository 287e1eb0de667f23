"""Apply a placement to a torch model: each op runs on its device, tensors move where an
edge crosses devices, and the model trains like the original.

The launcher path is :func:`travorder.placement.capture.capture_graph` (or
``travorder.place(module, ...)``), a placer, then :func:`apply`; see docs/launch.md.

:func:`apply` captures the module with torch.fx (:mod:`travorder.placement.capture`) and
rewrites its graph:

- every op (``call_module``/``call_function``/``call_method`` node) runs on the device its
  placement names; an input produced on another device is copied there first, once per
  (tensor, device) however many ops on that device use it; copies are differentiable, so
  gradients flow back across devices and autograd runs each backward op on its forward
  op's device (the backward half of a training-graph placement is implied by the forward
  half);
- model inputs are copied to the device of each op that consumes them; outputs stay on
  the device of the op that made them unless ``output_device`` is given;
- every parameter and buffer moves, in place, to the device of its *first user* (in node
  order, the op that owns its ``param_bytes`` in the captured graph); an op on another
  device that uses it (a module called at several places, a tied weight) gets a copy each
  step, and the gradient of the copy flows back to the parameter. A module called off its
  home device runs through ``torch.func.functional_call`` with copied tensors, so buffer
  updates it makes in place (BatchNorm statistics) go to the copy and are lost.
  Parameters no op uses stay where they are.

Like ``Module.to``, ``apply`` moves the module's own parameters: the returned module
shares them with ``module``. Build the optimizer from the returned module's parameters.
Device slots are kept distinct even when two slots name the same device (``["cpu",
"cpu"]``), so every copy and every off-home module call of a placement is in the code
(``applied.code``) and exercised, as no-ops, on a machine without GPUs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import fx
from torch.func import functional_call
from torch.utils._pytree import tree_leaves, tree_map_only

from travorder.errors import TravorderError, check_flag, first_line
from travorder.graph.opgraph import OpGraph
from travorder.graph.prepare import placed_graph
from travorder.graph.training import training_graph
from travorder.placement.capture import OP_KINDS, as_inputs, capture, node_tensors, trace
from travorder.placement.placement_file import describe_step, load_placement


def to_device(value: Any, device: str) -> Any:
    """``value`` with every tensor in it copied to ``device`` (a transfer in the graph)."""
    return tree_map_only(torch.Tensor, lambda t: t.to(device), value)


def call_on_device(module: torch.nn.Module, device: str, /, *args: Any, **kwargs: Any
                   ) -> Any:
    """Call ``module`` on ``device`` with copies of its parameters and buffers there."""
    tensors = {k: t.to(device) for k, t in [*module.named_parameters(),
                                            *module.named_buffers()]}
    return functional_call(module, tensors, args, kwargs)


def parse_device(device: str | torch.device) -> torch.device:
    """``device`` as a `torch.device`, or `TravorderError` if torch does not know the name
    (whether or not this machine has it)."""
    try:
        return torch.device(device)
    except (RuntimeError, TypeError):
        raise TravorderError(f"unknown device {str(device)!r}") from None


def check_device(device: str | torch.device) -> str:
    """The canonical name of ``device`` (``"cuda:0"``), or `TravorderError` if torch does not
    know it or this machine does not have it.

    >>> check_device("cpu")
    'cpu'
    >>> check_device("tpu:0")
    Traceback (most recent call last):
    ...
    travorder.errors.TravorderError: unknown device 'tpu:0'
    """
    d = parse_device(device)
    if d.type == "cuda":
        n = torch.cuda.device_count()
        index = d.index if d.index is not None else (torch.cuda.current_device() if n else 0)
        if index >= n:
            have = f"{n} CUDA device{'s' if n != 1 else ''}" if n else "no CUDA device"
            raise TravorderError(f"device {str(device)!r} is not available: this machine "
                                 f"has {have}")
        return f"cuda:{index}"
    if d.type == "meta":
        raise TravorderError(f"device {str(device)!r} holds no data: it cannot run ops")
    if d.type != "cpu":
        try:
            torch.empty(0, device=d)
        except Exception as exc:
            msg = first_line(exc)
            raise TravorderError(f"device {str(device)!r} is not available: {msg}") from None
    return str(d)


def placement_slots(graph: OpGraph, placement: Any, n_devices: int, *,
                    training: bool | None = None, batch: int | None = None,
                    micro_batches: int | None = None) -> np.ndarray:
    """The device slot (index into the devices list) of every node of ``graph``.

    ``placement``: a `PlacementResult` or an array/sequence of device indices, for
    ``graph`` (one per node), for ``training_graph(graph)`` or for the graph
    `travorder.place` places given ``training``, ``batch`` and ``micro_batches``
    (`placed_graph`; the forward ops of micro-batch 0 are used, whose copies share their
    devices); a mapping node name ->
    device index (names of other nodes are ignored); or a placement file (path), whose
    recorded step fills in those of ``training``, ``batch`` and ``micro_batches`` not
    given (else: a training step at the captured batch, one micro-batch). A
    placement file, or any object with a ``graph_hash`` attribute, must be for one of
    those graphs. A placement file or a `PlacementResult` knows its cluster:
    ``n_devices`` must be that cluster's device count (a placement that happens to use
    only the first devices is still a placement for all).
    """
    expected = getattr(placement, "graph_hash", None)
    peak = getattr(placement, "peak_memory", None)  # one entry per cluster device
    cluster_devices = None if peak is None else len(peak)
    recorded: dict[str, Any] = {}
    if isinstance(placement, str | os.PathLike):
        _, doc = load_placement(placement)
        expected = str(doc["graph"].get("graph_hash"))
        recorded = doc["graph"]
        cluster_devices = len(doc["devices"])
        placement = doc["placement"]
    from_file = [f"{k}=" for k, v in (("training", training), ("batch", batch),
                                      ("micro_batches", micro_batches)) if v is None]
    training = recorded.get("training", True) if training is None else check_flag(
        training, "training")
    batch = recorded.get("batch") if batch is None else batch
    micro_batches = recorded.get("micro_batches", 1) if micro_batches is None \
        else micro_batches
    n = graph.n_nodes
    step_graph = training_graph(graph)
    plain = training and batch is None and micro_batches == 1
    step = step_graph if plain else placed_graph(graph, training, batch, micro_batches)
    asked = {"training": training, "batch": batch, "micro_batches": micro_batches}
    scaled = "" if plain else f" ({describe_step(asked)}" + (
        f", {', '.join(from_file)} as the placement file records" if recorded and from_file
        else "") + ")"
    if expected is not None and expected not in (graph.graph_hash, step_graph.graph_hash,
                                                 step.graph_hash):
        raise TravorderError(
            f"placement is for graph {expected[:12]}, not "
            f"{(graph if plain else step).graph_hash[:12]} ({graph.name!r}){scaled}: "
            f"{_CHANGED}")
    given = f"{n_devices} device{'s were' if n_devices != 1 else ' was'} given"
    if cluster_devices is not None and cluster_devices != n_devices:
        raise TravorderError(f"the placement is for a cluster of {cluster_devices} devices, "
                             f"but {given}")
    placement = getattr(placement, "placement", placement)
    if isinstance(placement, Mapping):  # by name: of a pipeline's copies, if its file says so
        names = (step if expected == step.graph_hash else graph).names.tolist()
        missing = [x for x in names if x not in placement]
        if missing:
            raise TravorderError(f"placement has no device for op {missing[0]!r} "
                                 f"({len(missing)} of {len(names)} ops missing)")
        placement = [placement[x] for x in names]
    slots = np.asarray(placement)
    if slots.ndim != 1 or not (np.issubdtype(slots.dtype, np.integer) or slots.size == 0):
        raise TravorderError("a placement must give each op an integer device index (a "
                             "list, one per op, or a mapping of op names)")
    if slots.size not in (n, step_graph.n_nodes, step.n_nodes):
        also = "" if plain else f", or the {step.n_nodes} of the graph placed{scaled}"
        raise TravorderError(f"placement has {slots.size} devices for the {n} ops of "
                             f"{graph.name} (or the {step_graph.n_nodes} of its training "
                             f"step{also}): {_CHANGED}")
    slots = slots[:n].astype(np.int64)
    bad = np.flatnonzero((slots < 0) | (slots >= n_devices))
    if bad.size:
        i = int(bad[0])
        raise TravorderError(f"placement puts op {str(graph.names[i])!r} on device "
                             f"{slots[i]}, but {given}")
    return slots


_CHANGED = ("the model or its input shapes changed since placing, or it was placed "
            "forward only, at another batch or over micro-batches (give the same "
            "training=, batch= and micro_batches=)")


def _placed_graph(gm: fx.GraphModule, slots: Mapping[str, int], devices: Sequence[str],
                  tensors: Mapping[str, Mapping[str, torch.Tensor]],
                  tensor_slots: Mapping[str, int], output_device: str | None) -> fx.Graph:
    """A copy of ``gm.graph`` with copies and off-home module calls inserted.

    Every node keeps its name; new nodes are inserted into the copy, so they never take an
    existing name.
    """
    graph = fx.Graph()
    old_to_new: dict[fx.Node, fx.Node] = {}
    graph.output(graph.graph_copy(gm.graph, old_to_new))
    # The slot each value is on; None: wherever the caller put it (the inputs).
    where: dict[fx.Node, int | None] = {
        node: next((tensor_slots[k] for k in tensors.get(node.name, {})
                    if k in tensor_slots), None)
        for node in graph.nodes if node.op in ("placeholder", "get_attr")}
    copies: dict[tuple[fx.Node, str], fx.Node] = {}

    def fetch(value: fx.Node, slot: int | None, device: str) -> fx.Node:
        if slot is not None and where[value] == slot:
            return value
        key = (value, device if slot is None else str(slot))
        if key not in copies:
            copies[key] = graph.create_node("call_function", to_device, (value, device),
                                            name=f"{value.name}_to_{key[1]}")
        return copies[key]

    for node in list(graph.nodes):
        if node.op == "output" and output_device is not None:
            with graph.inserting_before(node):
                node.args = fx.map_arg(node.args, lambda a: fetch(a, None, output_device))
        if node.op not in OP_KINDS:
            continue
        slot = slots[node.name]
        with graph.inserting_before(node):
            node.args = fx.map_arg(node.args, lambda a, s=slot: fetch(a, s, devices[s]))
            node.kwargs = fx.map_arg(node.kwargs, lambda a, s=slot: fetch(a, s, devices[s]))
            if node.op == "call_module" and any(tensor_slots[k] != slot
                                                for k in tensors[node.name]):
                module = graph.create_node("get_attr", node.target,
                                           name=f"{node.name}_module")
                node.op, node.target = "call_function", call_on_device
                node.args = (module, devices[slot], *node.args)
        where[node] = slot
    return graph


class ModeFixedGraphModule(fx.GraphModule):
    """A placed module whose forward reads ``training`` (``F.dropout(x,
    training=self.training)``): torch.fx fixed that mode in its code at capture, so it
    refuses to switch (`train`, `eval`) rather than keep running in the old one."""

    captured_training: bool

    def train(self, mode: bool = True) -> ModeFixedGraphModule:
        if bool(mode) != self.captured_training:
            now, asked = ("eval", "train") if mode else ("train", "eval")
            raise TravorderError(
                f"{type(self).__name__} was placed in {now} mode and its forward reads "
                f"self.training, which torch.fx fixed in the placed code: it cannot switch "
                f"to {asked} mode; apply the placement to the module in {asked} mode too "
                f"(module.{asked}(), then apply: the two share parameters)")
        return super().train(mode)


def reads_training(module: torch.nn.Module, n_inputs: int, gm: fx.GraphModule) -> bool:
    """Whether ``module``'s traced code (``gm``, traced in the mode it is in) changes in the
    other mode: its forward, or a submodule's that fx traces through, reads ``training``."""
    modes = {m: m.training for m in module.modules()}
    try:
        for m in modes:
            m.training = not modes[m]
        other = trace(module, n_inputs)
    except TravorderError:  # untraceable in the other mode: it reads the mode too
        return True
    finally:
        for m, mode in modes.items():
            m.training = mode
    return other.code != gm.code


def _move_(tensor: torch.Tensor, device: str) -> None:
    """Move a parameter or buffer in place, keeping its identity (as ``Module.to`` does)."""
    with torch.no_grad():
        tensor.data = tensor.data.to(device)
        if tensor.grad is not None:
            tensor.grad = tensor.grad.to(device)


def apply(module: torch.nn.Module, example_inputs: Any, placement: Any,
          devices: Sequence[str | torch.device], *, output_device: str | None = None,
          training: bool | None = None, batch: int | None = None,
          micro_batches: int | None = None) -> fx.GraphModule:
    """``module`` rewritten to run each op on its placed device (see the module docstring).

    ``example_inputs``: the forward call's positional arguments, used to capture the
    graph (the placement must be of that graph: same shapes). ``placement``: see
    :func:`placement_slots`, with ``training``, ``batch`` and ``micro_batches`` as given
    to `travorder.place` (a placement file says them itself). ``devices``: the torch
    device of each device index of the placement (e.g. ``["cuda:0", "cuda:1"]``, or
    ``["cpu"] * 3`` to test on CPU).

    The returned ``torch.fx.GraphModule`` carries ``devices`` (canonical names per slot),
    ``op_devices`` (op name -> slot), ``tensor_devices`` (parameter/buffer name -> slot
    of its home) and ``op_graph`` (the captured `OpGraph`). Raises `TravorderError` for a
    placement of another graph, of the wrong length, naming a slot beyond ``devices``, or
    made for a cluster of another size than ``devices`` (placement files and
    `PlacementResult`s know it), and for a device torch does not know or this machine lacks.
    A module whose forward reads ``training`` gives a `ModeFixedGraphModule` (it keeps the
    mode ``module`` is in).

    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    >>> placed = apply(net, torch.ones(1, 4), [0, 1], ["cpu", "cpu"])
    >>> placed.op_devices, placed.tensor_devices
    ({'_0': 0, '_1': 1}, {'0.weight': 0, '0.bias': 0})
    """
    if isinstance(devices, str | torch.device):
        raise TravorderError(f"devices must be a list of device names, one per device of "
                             f"the placement (e.g. [{str(devices)!r}]), not one name")
    if not devices:
        raise TravorderError("no devices given")
    devs = [check_device(d) for d in devices]
    out_dev = None if output_device is None else check_device(output_device)
    empty = next((k for k, t in [*module.named_parameters(), *module.named_buffers()]
                  if t.is_meta), None) if isinstance(module, torch.nn.Module) else None
    if empty is not None:
        raise TravorderError(f"{type(module).__name__}'s {empty!r} is on the meta device: it "
                             f"holds no data to place; load the weights first")
    cap = capture(module, example_inputs)
    names = cap.graph.names.tolist()
    slots = dict(zip(names, placement_slots(cap.graph, placement, len(devs),
                                            training=training, batch=batch,
                                            micro_batches=micro_batches).tolist(),
                     strict=True))
    tensor_slots = {t: slots[users[0]] for t, users in cap.tensor_users.items()}
    tensors = node_tensors(cap.module)
    for owned in tensors.values():
        for name, tensor in owned.items():
            if name in tensor_slots:
                _move_(tensor, devs[tensor_slots[name]])

    graph = _placed_graph(cap.module, slots, devs, tensors, tensor_slots, out_dev)
    fixed = reads_training(module, len(as_inputs(example_inputs)), cap.module)
    placed = (ModeFixedGraphModule if fixed else fx.GraphModule)(
        cap.module, graph, class_name=f"Placed{type(module).__name__}")
    placed.training = module.training
    if fixed:
        placed.captured_training = module.training
    placed.devices = tuple(devs)
    placed.op_devices = slots
    placed.tensor_devices = tensor_slots
    placed.op_graph = cap.graph
    return placed


@dataclass(frozen=True)
class StepTimes:
    """Wall-clock times of training steps, in us."""

    times_us: np.ndarray

    @property
    def median_us(self) -> float:
        return float(np.median(self.times_us))

    @property
    def min_us(self) -> float:
        return float(np.min(self.times_us))


def _cuda_devices(module: torch.nn.Module) -> list[torch.device]:
    found = {t.device for t in [*module.parameters(), *module.buffers()]}
    found |= {torch.device(d) for d in getattr(module, "devices", ())}
    return sorted((d for d in found if d.type == "cuda"), key=lambda d: d.index or 0)


def _what(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def time_step(module: torch.nn.Module, example_inputs: Any,
              loss_fn: Callable[[Any], torch.Tensor], steps: int = 10, *, warmup: int = 2,
              optimizer: torch.optim.Optimizer | None = None) -> StepTimes:
    """Time ``steps`` training steps of ``module`` after ``warmup`` untimed ones.

    A step: zero the gradients, ``loss_fn(module(*example_inputs)).backward()``, then
    ``optimizer.step()`` (default: SGD, lr 1e-3, over ``module.parameters()``). Every CUDA
    device the module uses is synchronised before each step's clock starts and stops.
    ``loss_fn`` gets the module's output, wherever it is, and returns a scalar tensor (e.g.
    ``lambda out: F.cross_entropy(out, y.to(out.device))``).
    """
    for what, value, least in (("steps", steps, 1), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise TravorderError(f"{what} must be an integer of at least {least}, not "
                                 f"{value!r}")
    if not isinstance(module, torch.nn.Module):
        raise TravorderError(f"time_step times a torch.nn.Module, not {_what(module)}")
    if not callable(loss_fn):
        raise TravorderError(f"loss_fn must be a function of the module's output, not "
                             f"{_what(loss_fn)}")
    inputs = as_inputs(example_inputs)
    if optimizer is None and not any(p.requires_grad for p in module.parameters()):
        raise TravorderError(f"{type(module).__name__} has no parameters to train: give "
                             f"an optimizer, or time a module that learns")
    opt = optimizer or torch.optim.SGD(module.parameters(), lr=1e-3)
    cuda = _cuda_devices(module)
    cuda += [t.device for t in tree_leaves(inputs)
             if isinstance(t, torch.Tensor) and t.is_cuda and t.device not in cuda]

    def sync() -> None:
        for d in cuda:
            torch.cuda.synchronize(d)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(module(*inputs))
        if not (isinstance(loss, torch.Tensor) and loss.numel() == 1):
            raise TravorderError(f"loss_fn must return a one-element tensor to call "
                                 f"backward on, got {_what(loss)}")
        loss.backward()
        opt.step()

    times = np.empty(steps)
    try:
        for _ in range(warmup):
            step()
        for i in range(steps):
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            times[i] = (time.perf_counter() - t0) * 1e6
    except TravorderError:
        raise
    except Exception as exc:  # the user's model or loss raised on the user's inputs
        raise TravorderError(f"a training step of {type(module).__name__} failed: "
                             f"{first_line(exc)}") from None
    return StepTimes(times)
