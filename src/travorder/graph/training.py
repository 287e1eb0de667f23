"""Training-step graphs: a forward graph expanded with its backward pass.

`training_graph` turns a forward (inference) graph into the graph of one training step:

- every forward op ``f`` gets a backward op ``f + suffix`` (suffix ``_grad``, or
  ``_grad1``, ``_grad2``... if some node name already ends up clashing), with the same
  ``op_type``, ``flops`` and ``time_us`` multiplied by ``backward_flops_factor``,
  ``is_backward`` set and no parameters (``param_bytes`` stay on the forward op; the
  simulator counts gradients and optimizer state from them);
- every forward edge ``u -> v`` gives a backward edge ``v' -> u'`` carrying the gradient
  of the same tensor (same bytes);
- every ``f`` gets an edge ``f -> f'`` for its saved activations (``f``'s
  ``output_bytes``), and ``f'`` shares ``f``'s colocation group (a new group id is made
  for ``f`` if it had none);
- ``f'`` outputs the gradients of ``f``'s inputs: its ``output_bytes`` is the sum of the
  bytes on ``f``'s forward in-edges, or ``f``'s ``param_bytes`` (the weight gradients)
  for a source op, which has no input op.

Backward nodes come after the forward ones: ``f'`` has index ``n + f``.
Graphs that already contain backward ops (profiled training graphs) come back unchanged.

>>> from travorder.graph.opgraph import OpGraph
>>> g = OpGraph.from_records(
...     [{"name": "a", "flops": 10, "output_bytes": 4, "param_bytes": 8},
...      {"name": "b", "flops": 1, "output_bytes": 4}], [("a", "b")])
>>> t = training_graph(g)
>>> t.names.tolist(), t.flops.tolist(), t.output_bytes.tolist()
(['a', 'b', 'a_grad', 'b_grad'], [10.0, 1.0, 20.0, 2.0], [4.0, 4.0, 8.0, 4.0])
>>> training_graph(t) is t
True
"""

from __future__ import annotations

import math

import numpy as np

from travorder.errors import GraphError
from travorder.graph.opgraph import OpGraph, check_graph, own_groups
from travorder.graph.pipeline import micro_batches

#: Suffix of a backward op's name (a number is appended if it would clash).
GRAD_SUFFIX = "_grad"


def _grad_suffix(names: list[str]) -> str:
    taken = set(names)
    suffix, k = GRAD_SUFFIX, 0
    while any(x + suffix in taken for x in names):
        k += 1
        suffix = f"{GRAD_SUFFIX}{k}"
    return suffix


def training_graph(g: OpGraph, *, backward_flops_factor: float = 2.0) -> OpGraph:
    """The training-step graph of forward graph ``g`` (see the module docstring).

    ``backward_flops_factor`` scales each backward op's ``flops`` and measured
    ``time_us`` relative to its forward op. Returns ``g`` itself if it already has
    backward ops. The result's ``meta`` has ``training: True``.
    """
    check_graph(g, "training_graph")
    if isinstance(backward_flops_factor, bool) or not isinstance(
            backward_flops_factor, int | float | np.integer | np.floating) or not (
            backward_flops_factor < 1e300 and math.isfinite(backward_flops_factor)
            and backward_flops_factor >= 0):  # Fraction(1, 3), 10**400: no float
        raise GraphError(
            f"backward_flops_factor must be a finite number >= 0, not "
            f"{backward_flops_factor!r}"
        )
    if g.is_backward.any():
        return g
    if micro_batches(g) > 1:
        raise GraphError(f"graph {g.name!r} is a pipelined forward graph: expand the "
                         f"training step first, then pipeline it")
    n = g.n_nodes
    names = g.names.tolist()
    with np.errstate(over="ignore"):
        backward_flops = backward_flops_factor * g.flops
        backward_time = backward_flops_factor * g.time_us
    for what, scaled, own in (("flops", backward_flops, g.flops),
                              ("time_us", backward_time, g.time_us)):
        if np.isinf(scaled).any():  # named by the forward op the user wrote (nan: unmeasured)
            i = int(np.argmax(np.isinf(scaled)))
            raise GraphError(f"op {names[i]!r} of {g.name!r}: its {what} ({own[i]:g}) "
                             f"times {backward_flops_factor:g} for its backward op is more "
                             f"than a float holds")
    suffix = _grad_suffix(names)
    nodes = np.arange(n, dtype=np.int64)

    coloc = own_groups(g.colocation)
    grad_out = np.bincount(g.dst, weights=g.edge_bytes, minlength=n)
    grad_out = np.where(g.in_degree == 0, g.param_bytes, grad_out)

    return g.replace(
        names=names + [x + suffix for x in names],
        op_types=g.op_types.tolist() * 2,
        flops=np.concatenate([g.flops, backward_flops]),
        output_bytes=np.concatenate([g.output_bytes, grad_out]),
        param_bytes=np.concatenate([g.param_bytes, np.zeros(n)]),
        time_us=np.concatenate([g.time_us, backward_time]),
        colocation=np.concatenate([coloc, coloc]),
        is_backward=np.repeat([False, True], n),
        src=np.concatenate([g.src, g.dst + n, nodes]),
        dst=np.concatenate([g.dst, g.src + n, nodes + n]),
        edge_bytes=np.concatenate([g.edge_bytes, g.edge_bytes, g.output_bytes]),
        meta={"training": True},
    )
