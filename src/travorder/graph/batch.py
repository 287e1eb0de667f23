"""Batch scaling: a graph exported at one batch size, re-costed for another.

`scale_batch(g, batch)` multiplies by ``batch / g.meta["batch_size"]`` every op's
``flops``, ``output_bytes`` and measured ``time_us`` and every edge's bytes; parameters do
not change (``g`` itself comes back when it is at ``batch`` already). Apply it to a
forward graph, before `training_graph`: the backward pass then follows (weight gradients
are parameter-sized and do not scale).

Ops whose cost does not scale with the batch: the constant and shape ops in
`BATCH_INVARIANT_OP_TYPES` (their outputs describe shapes, not data). Everything else
scales linearly, which is exact for the data-parallel FLOPs of convolutions, matrix
products, normalisations and elementwise ops, over-counts the rare op that reads only
weights (a weight transpose), and takes measured latencies as linear in the batch (short
kernels are in truth sub-linear until the device is saturated).

>>> from travorder.graph.opgraph import OpGraph
>>> g = OpGraph.from_records(
...     [{"name": "fc", "flops": 8.0, "output_bytes": 4.0, "param_bytes": 16.0},
...      {"name": "shape", "op_type": "Shape", "output_bytes": 8.0}],
...     [("fc", "shape", 4.0)], batch_size=2)
>>> s = scale_batch(g, 8)
>>> s.flops.tolist(), s.output_bytes.tolist(), s.param_bytes.tolist(), s.meta["batch_size"]
([32.0, 0.0], [16.0, 8.0], [16.0, 0.0], 8)
"""

from __future__ import annotations

import numpy as np

from travorder.errors import BatchError, GraphError
from travorder.graph.opgraph import OpGraph, check_graph

#: Op types whose cost and output do not depend on the batch size.
BATCH_INVARIANT_OP_TYPES = frozenset({"Constant", "ConstantOfShape", "Shape", "Size", "Range"})


def bind_hint(symbolic: list[str]) -> str:
    """How to bind an ONNX model's symbolic input dimensions ``symbolic``, for messages.

    >>> bind_hint(["batch", "seq"])
    "bind them with --dim batch=N --dim seq=N (dims={'batch': N, 'seq': N} in Python)"
    """
    return (f"bind them with {' '.join(f'--dim {d}=N' for d in symbolic)} "
            f"(dims={{{', '.join(f'{d!r}: N' for d in symbolic)}}} in Python)")


def check_scalable(g: OpGraph, batch: int) -> None:
    """Raise the GraphError that `scale_batch` would for ``g`` at ``batch``, without
    re-costing it."""
    if isinstance(batch, bool) or not isinstance(batch, int | np.integer) or not (
            1 <= batch < 2**63):  # as a bound symbolic dimension (--dim batch=N)
        raise GraphError(f"batch must be an integer from 1 to 2**63 - 1, got {batch!r}")
    if g.meta.get("batch_size") == batch:  # already at that batch, training step or not
        return
    if g.is_backward.any():  # which backward outputs are weight gradients is not known
        raise BatchError(f"graph {g.name!r} is a training step (it has backward ops), "
                         f"whose weight gradients do not scale: scale its forward graph to "
                         f"batch {batch} instead")
    if g.meta.get("batch_size") is None:
        symbolic = g.meta.get("symbolic_dims") or []
        raise BatchError(f"graph {g.name!r} records no batch_size, so it cannot be scaled "
                         f"to batch {batch}" + (
                             f" (its inputs have symbolic dimensions {', '.join(symbolic)}: "
                             f"{bind_hint(symbolic)})" if symbolic else ""))


def scale_batch(g: OpGraph, batch: int) -> OpGraph:
    """``g`` re-costed from its recorded ``batch_size`` to ``batch`` (module docstring)."""
    check_graph(g, "scale_batch")
    check_scalable(g, batch)
    exported = g.meta.get("batch_size")  # a positive number (OpGraph checks)
    if exported == batch:
        return g
    factor = int(batch) / float(exported)
    per_node = np.where(np.isin(g.op_types, list(BATCH_INVARIANT_OP_TYPES)), 1.0, factor)
    with np.errstate(over="ignore"):  # past a float: said below, with the batch
        costs = {"flops": g.flops * per_node, "output_bytes": g.output_bytes * per_node,
                 "time_us": g.time_us * per_node,
                 "edge_bytes": g.edge_bytes * per_node[g.src]}
    if over := [k for k, a in costs.items() if np.isinf(a).any()]:
        raise GraphError(f"graph {g.name!r} at batch {batch} (exported at {exported:g}): "
                         f"its {over[0]} grow past what a float holds")
    return g.replace(**costs, meta={**g.meta, "batch_size": int(batch)})
