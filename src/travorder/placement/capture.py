"""Capture a ``torch.nn.Module`` into an `OpGraph` whose nodes are the module's torch.fx nodes.

The module is traced with ``torch.fx.symbolic_trace`` and run once on the example inputs
with fake tensors (shapes and dtypes only, no computation, so capturing a large model is
cheap), or for real if an op needs the data (``nonzero``, ``item``); either way without
gradients, and with its buffers and the random number generators restored afterwards.
What tracing would freeze into the graph (a buffer the forward changes itself, a random
draw of a fixed shape) is refused; forward parameters after the example inputs take their
defaults.
Every ``call_module``, ``call_function`` and ``call_method`` node is an op of the
`OpGraph`, under the fx node's name, so a placement of the graph maps back to the code
that runs (see :mod:`travorder.placement.launch`). Per op:

- ``op_type``: the module's class name (``Conv2d``), the function's name (``relu``) or the
  method's name (``view``);
- ``flops``: forward FLOPs counted by ``torch.utils.flop_counter.FlopCounterMode`` while
  the node runs (matrix products and convolutions; elementwise ops count 0);
- ``output_bytes``: bytes of the tensors in the node's output (0 for non-tensor values
  such as sizes);
- ``param_bytes``: bytes of the parameters this op is the *first user* of, in node order,
  so each parameter is counted once: a module's parameters belong to its first call, and
  a parameter read directly (an fx ``get_attr`` node) to the first op that consumes it.
  Buffers (e.g. BatchNorm statistics) are not counted.

``placeholder`` (inputs), ``get_attr`` (parameters, buffers, constants) and ``output``
nodes are not ops: an edge joins two ops when one consumes the other's output, carrying
the producer's ``output_bytes``; after an in-place op, the ops that read the tensor it
changed consume its output (`follow_in_place`).

>>> import torch
>>> cap = capture(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()),
...               (torch.ones(2, 4),))
>>> cap.graph.names.tolist(), cap.graph.flops.tolist(), cap.graph.param_bytes.tolist()
(['_0', '_1'], [48.0, 0.0], [60.0, 0.0])
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
    UnsupportedOperatorException,
)
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from travorder.errors import TravorderError, first_line
from travorder.graph.opgraph import OpGraph

#: fx node kinds that are ops of the captured graph.
OP_KINDS = ("call_module", "call_function", "call_method")


@dataclass(frozen=True)
class Capture:
    """A traced module and its `OpGraph`.

    ``module`` is the ``torch.fx.GraphModule`` (sharing the original's parameters);
    ``graph`` has one node per op of ``module.graph``, in the same order and under the
    same names; ``tensor_users`` maps each parameter, buffer and constant tensor the ops
    use (by its qualified name in ``module``) to the names of the ops using it, in node
    order: its first user owns it.
    """

    module: fx.GraphModule
    graph: OpGraph
    tensor_users: Mapping[str, tuple[str, ...]]


def as_inputs(example_inputs: Any) -> tuple[Any, ...]:
    """The positional arguments of a forward call: one tensor, or a tuple/list of them."""
    if isinstance(example_inputs, tuple | list):
        return tuple(example_inputs)
    return (example_inputs,)


def _concrete_args(module: torch.nn.Module, n_inputs: int) -> dict[str, Any]:
    """The forward's parameters after its first ``n_inputs`` (the positional inputs it is
    called with), each with its default: fx fixes them in the graph, where it would trace
    an optional ``mask=None`` as an input and take the wrong side of ``mask is None``.
    TravorderError if the forward takes fewer inputs, or needs one not given."""
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):  # a forward without a signature: fx finds out
        return {}
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return {}
    cls = type(module).__name__
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if n_inputs > len(positional):  # fx would drop the extra ones without a word
        takes = len(positional)
        raise TravorderError(f"{cls} failed on the example inputs: its forward takes "
                             f"{takes} input{'s' * (takes != 1)}, {n_inputs} were given")
    rest = [p for p in params[n_inputs:] if p.kind is not p.VAR_KEYWORD]
    needed = next((p.name for p in rest if p.default is p.empty), None)
    if needed is not None:
        raise TravorderError(f"{cls} failed on the example inputs: its forward needs "
                             f"{needed!r}, not given (the example inputs are the forward's "
                             f"positional arguments: a tensor, or a tuple of them)")
    return {p.name: p.default for p in rest}


def _rng_states(devices: Sequence[int]) -> list[torch.Tensor]:
    return [torch.random.get_rng_state(), *(torch.cuda.get_rng_state(d) for d in devices)]


def _cuda_indices(gm: torch.nn.Module, inputs: Sequence[Any] = ()) -> list[int]:
    return sorted({t.device.index or 0 for t in [*gm.parameters(), *gm.buffers(),
                                                 *tree_leaves(inputs)]
                   if isinstance(t, torch.Tensor) and t.device.type == "cuda"})


@contextlib.contextmanager
def _nothing_frozen(module: torch.nn.Module) -> Iterator[None]:
    """fx runs the forward's Python for real while tracing: what does not touch an input
    (a buffer changed in place, a random draw of a fixed shape) happens once, then, and
    the graph holds its result as a constant. TravorderError for either; run inside
    `_side_effect_free`, which puts the buffers' values and the RNG states back."""
    cls = type(module).__name__
    buffers = dict(module.named_buffers())
    before = {n: (t, t._version) for n, t in [*module.named_parameters(), *buffers.items()]}
    cuda = _cuda_indices(module)
    rng = _rng_states(cuda)
    yield
    drew = not all(map(torch.equal, rng, _rng_states(cuda)))
    after = dict([*module.named_parameters(), *module.named_buffers()])
    changed = next((n for n, (t, version) in before.items()
                    if after.get(n) is not t or t._version != version), None)
    if changed is not None:
        for n, t in buffers.items():  # one rebound (self.n = self.n + 1): the old one back
            owner, _, attr = n.rpartition(".")
            module.get_submodule(owner).register_buffer(attr, t)
        raise TravorderError(
            f"{cls}'s forward changes {changed!r} by code torch.fx does not record (on the "
            f"module's own tensor, not on an input): the placed module would never change "
            f"it; keep it out of forward, or move it into a submodule, whose call the graph "
            f"records")
    if drew:
        raise TravorderError(
            f"{cls}'s forward draws random numbers of a fixed shape (as torch.randn(4)): "
            f"torch.fx draws them once, when tracing, and the graph would repeat that draw; "
            f"draw them from an input's shape (torch.randn_like(x), torch.randn(x.shape))")


def trace(module: torch.nn.Module, n_inputs: int) -> fx.GraphModule:
    """``torch.fx.symbolic_trace``, with a failure reported as a `TravorderError`, and the
    ops after an in-place op reading its result (`follow_in_place`).

    The forward's parameters after its first ``n_inputs`` (the example inputs) take their
    defaults (`_concrete_args`). TravorderError if tracing would freeze a buffer change or
    a random draw into the graph (`_nothing_frozen`).
    """
    if not isinstance(module, torch.nn.Module):
        raise TravorderError(f"expected a torch.nn.Module, got {type(module).__name__}")
    concrete = _concrete_args(module, n_inputs) or None
    try:
        with _side_effect_free(module, ()), _nothing_frozen(module):
            gm = fx.symbolic_trace(module, concrete_args=concrete)
    except TravorderError:
        raise
    except Exception as exc:  # fx raises TraceError, TypeError, NotImplementedError...
        msg = first_line(exc)
        raise TravorderError(f"cannot trace {type(module).__name__} with torch.fx: {msg}"
                             ) from None
    if concrete:
        _drop_fixed(gm, n_inputs, len(concrete))
    follow_in_place(gm)
    return gm


def _drop_fixed(gm: fx.GraphModule, n_inputs: int, n_fixed: int) -> None:
    """Remove the inputs fixed to their defaults, with the checks fx adds that each keeps
    its value: those checks are no ops, and without the input the placed module refuses
    one given (a TypeError) rather than assert on it."""
    fixed = [n for n in gm.graph.nodes if n.op == "placeholder"][n_inputs:n_inputs + n_fixed]
    doomed: set[fx.Node] = set()
    stack = list(fixed)
    while stack:
        node = stack.pop()
        if node not in doomed:
            doomed.add(node)
            stack.extend(node.users)
    for node in reversed(list(gm.graph.nodes)):  # users before what they use
        if node in doomed:
            gm.graph.erase_node(node)
    gm.recompile()


def _mutated(gm: fx.GraphModule, node: fx.Node) -> fx.Node | None:
    """The node whose tensor ``node`` changes in place and returns, if it does: the input
    of a tensor method named with a trailing underscore (``h.relu_()``), of a torch
    function so named (``torch.sigmoid_``, ``F.leaky_relu_``), of a torch function given
    ``inplace=True`` (``F.relu(h, inplace=True)``) or of a ``torch.nn`` module whose
    ``inplace`` is set (``nn.ReLU(inplace=True)``). Functions of other names or libraries
    are not assumed to return what they change (``clip_grad_norm_`` returns a norm)."""
    if node.op == "call_method":
        name = str(node.target)
        in_place = name.endswith("_") and not name.startswith("_") \
            and hasattr(torch.Tensor, name)
    elif node.op == "call_function":
        name = getattr(node.target, "__name__", "")
        in_place = (name.endswith("_") and node.target in (
            getattr(torch, name, None), getattr(torch.nn.functional, name, None))) or (
            node.kwargs.get("inplace") is True
            and getattr(node.target, "__module__", "").startswith("torch"))
    elif node.op == "call_module":
        module = gm.get_submodule(node.target)
        in_place = getattr(module, "inplace", False) is True \
            and type(module).__module__.startswith("torch.nn")
    else:
        return None
    first = node.args[0] if node.args else node.kwargs.get("input",
                                                           node.kwargs.get("self"))
    return first if in_place and isinstance(first, fx.Node) else None


def follow_in_place(gm: fx.GraphModule) -> None:
    """Make every node after an in-place op on a tensor read that op's result instead of
    the tensor (the same tensor, which the op returns), so that the graph's edges carry
    the change: an op placed on another device gets a copy made after it, not before.
    Views are not followed: neither a change made through a view (``x.view(-1).add_(1)``)
    nor one seen through a view taken before it (``v = h[0]; h.mul_(2)``).

    >>> import torch
    >>> class M(torch.nn.Module):
    ...     def forward(self, x):
    ...         x.relu_()
    ...         return x + 1
    >>> gm = fx.symbolic_trace(M())
    >>> follow_in_place(gm)
    >>> [n.args for n in gm.graph.nodes if n.name == "add"]
    [(relu_, 1)]
    """
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    for node in gm.graph.nodes:
        tensor = _mutated(gm, node)
        if tensor is None:
            continue
        for user in list(tensor.users):
            if position[user] > position[node]:
                user.replace_input_with(tensor, node)
    gm.recompile()


def _op_type(gm: fx.GraphModule, node: fx.Node) -> str:
    if node.op == "call_module":
        return type(gm.get_submodule(node.target)).__name__
    if node.op == "call_method":
        return str(node.target)
    return getattr(node.target, "__name__", str(node.target))


def _nbytes(value: Any) -> int:
    return sum(x.numel() * x.element_size() for x in tree_leaves(value)
               if isinstance(x, torch.Tensor))


def node_tensors(gm: fx.GraphModule) -> dict[str, dict[str, torch.Tensor]]:
    """For each ``call_module`` and ``get_attr`` node: the module tensors it touches.

    Tensors are keyed by their qualified name in ``gm`` (a tied tensor by its first name);
    a ``get_attr`` of a plain tensor attribute (an fx constant) by its target.
    """
    names = {id(t): n for n, t in [*gm.named_parameters(), *gm.named_buffers()]}
    out: dict[str, dict[str, torch.Tensor]] = {}
    for node in gm.graph.nodes:
        if node.op == "call_module":
            sub = gm.get_submodule(node.target)
            out[node.name] = {names[id(t)]: t
                              for t in [*sub.parameters(), *sub.buffers()]}
        elif node.op == "get_attr":
            value = _get_attr(gm, node.target)
            if isinstance(value, torch.Tensor):
                out[node.name] = {names.get(id(value), node.target): value}
    return out


def _get_attr(gm: fx.GraphModule, target: str) -> Any:
    owner, _, attr = target.rpartition(".")
    return getattr(gm.get_submodule(owner), attr)


def tensor_users(gm: fx.GraphModule) -> dict[str, tuple[str, ...]]:
    """Module tensor name -> the op nodes using it, in node order (see `Capture`)."""
    per_node = node_tensors(gm)
    users: dict[str, list[str]] = {}
    for node in gm.graph.nodes:
        if node.op == "call_module":
            for name in per_node[node.name]:
                users.setdefault(name, []).append(node.name)
        elif node.name in per_node:  # a get_attr: its consumers use the tensor
            (name,) = per_node[node.name]
            ops = [u.name for u in node.users if u.op in OP_KINDS]
            users.setdefault(name, []).extend(ops)
    order = {node.name: i for i, node in enumerate(gm.graph.nodes)}
    return {k: tuple(sorted(dict.fromkeys(v), key=order.__getitem__))
            for k, v in users.items() if v}


@contextlib.contextmanager
def _side_effect_free(module: torch.nn.Module, inputs: Sequence[Any]) -> Iterator[None]:
    """Restore buffers (BatchNorm statistics) and the RNG states after a forward run or a
    trace."""
    cuda = _cuda_indices(module, inputs)
    saved = [(b, b.clone()) for b in module.buffers()]
    with torch.random.fork_rng(devices=cuda):
        try:
            yield
        finally:
            with torch.no_grad():
                for b, v in saved:
                    b.copy_(v)


#: What fake tensors cannot run: ops whose output shape or value depends on the data,
#: and ops without a shape function. Those models are run for real.
_NEEDS_DATA = (DataDependentOutputException, DynamicOutputShapeException,
               UnsupportedOperatorException)


def _sdpa_flops(query_shape: Any, key_shape: Any, value_shape: Any, *args: Any,
                out_shape: Any = None, **kwargs: Any) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


#: Kernels FlopCounterMode has no rule for: attention on the CPU (its CUDA kernels have one).
_FLOP_RULES = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_flops}


class _Profiler(fx.Interpreter):
    """Runs the graph, recording each node's FLOPs and output bytes."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.counter = FlopCounterMode(display=False, custom_mapping=_FLOP_RULES)
        self.flops: dict[str, int] = {}
        self.nbytes: dict[str, int] = {}

    def run_node(self, n: fx.Node) -> Any:
        before = self.counter.get_total_flops()
        out = super().run_node(n)
        self.flops[n.name] = self.counter.get_total_flops() - before
        self.nbytes[n.name] = _nbytes(out)
        return out

    def profile(self, inputs: Sequence[Any], fake: bool) -> None:
        mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
        with _side_effect_free(self.module, inputs), torch.no_grad(), _quiet_fake_tensors(), \
                mode, self.counter:
            self.run(*inputs)


@contextlib.contextmanager
def _quiet_fake_tensors() -> Iterator[None]:
    """Fake tensors log the traceback of an op that fails (a wrong input shape) before
    raising; the caller turns the error into one line, so the log is noise."""
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def capture(module: torch.nn.Module, example_inputs: Any, *, name: str | None = None
            ) -> Capture:
    """Trace ``module`` and measure it on ``example_inputs`` (see the module docstring).

    ``example_inputs``: the forward call's positional arguments (a tensor or a tuple).
    ``name`` becomes the graph's ``meta["name"]`` (default: the module's class name).
    Raises `TravorderError` if the module cannot be traced or fails on the inputs.
    """
    inputs = as_inputs(example_inputs)
    first = next((t for t in tree_leaves(inputs) if isinstance(t, torch.Tensor)), None)
    if first is not None and first.dim() and first.shape[0] == 0:  # the batch it records
        raise TravorderError(f"the example inputs hold a batch of 0 samples (the first "
                             f"dimension of the first input, {tuple(first.shape)}): give "
                             f"one or more")
    gm = trace(module, len(inputs))
    profiler = _Profiler(gm)
    try:
        try:
            profiler.profile(inputs, fake=True)
        except _NEEDS_DATA:
            profiler = _Profiler(gm)
            profiler.profile(inputs, fake=False)
    except Exception as exc:  # the user's model raised on the user's inputs
        msg = first_line(exc)
        raise TravorderError(f"{type(module).__name__} failed on the example inputs: {msg}"
                             ) from None

    users = tensor_users(gm)
    params = {n: p for n, p in gm.named_parameters()}
    owned: dict[str, int] = {}
    for tname, ops in users.items():
        if tname in params:
            owned[ops[0]] = owned.get(ops[0], 0) + _nbytes(params[tname])
    ops = [n for n in gm.graph.nodes if n.op in OP_KINDS]
    op_names = {n.name for n in ops}
    nodes = [{"name": n.name, "op_type": _op_type(gm, n), "flops": profiler.flops[n.name],
              "output_bytes": profiler.nbytes[n.name], "param_bytes": owned.get(n.name, 0)}
             for n in ops]
    edges = [(p.name, n.name) for n in ops for p in n.all_input_nodes if p.name in op_names]
    tensors = [t for t in tree_leaves(inputs) if isinstance(t, torch.Tensor)]
    dtypes = [p.dtype for p in gm.parameters()] or [t.dtype for t in tensors]
    graph = OpGraph.from_records(
        nodes, edges,
        name=name or type(module).__name__, source="torch.fx",
        batch_size=int(tensors[0].shape[0]) if tensors and tensors[0].dim() else None,
        dtype=str(dtypes[0]).removeprefix("torch.") if dtypes else None,
    )
    return Capture(module=gm, graph=graph, tensor_users=users)


def capture_graph(module: torch.nn.Module, example_inputs: Any, *, name: str | None = None
                  ) -> OpGraph:
    """The `OpGraph` of :func:`capture`: what a placer places for the launcher."""
    return capture(module, example_inputs, name=name).graph
