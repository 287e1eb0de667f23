"""Pipelined training steps: a training-step graph unrolled over micro-batches.

`pipeline_graph(g, m)` turns the graph of one training step into the step of a GPipe-style
pipeline of ``m`` micro-batches:

- every op ``v`` gets ``m`` copies ``v/mb0 .. v/mb{m-1}`` (copy ``k`` of node ``i`` has
  index ``k * n + i``), each with ``1/m`` of its ``flops``, ``time_us``,
  ``output_bytes`` and ``param_bytes``, and every edge is repeated within each
  micro-batch with ``1/m`` of its bytes; so each copy costs exactly ``1/m`` of the op;
- parameters are counted once: the copies' ``param_bytes`` add up to the op's, and the
  copies share a device;
- the copies of an op share its colocation group (its weights live on one device; an op
  without a group gets one of its own), so a placer that keeps groups together decides
  once per op group, never per copy;
- weight-gradient ops (backward ops colocated with an op that holds parameters)
  accumulate across micro-batches: copy ``k`` has an edge to copy ``k + 1``, so the step
  ends after the last micro-batch's backward pass. The edge carries no bytes: the copies
  share a device and accumulate in place.

With ``m = 1`` the result equals ``g``. More micro-batches than the samples of the
graph's ``batch_size`` are refused: a micro-batch holds one sample at least; so is a
step of more than `MAX_PIPELINED_NODES` nodes. Traversal
orders of a pipelined graph are taken from micro-batch 0's graph (`micro_batch_graph`)
and expanded by `expand_order`: each op's copies follow one another in micro-batch order
(docs/study.md says why).

>>> from travorder.graph.opgraph import OpGraph
>>> from travorder.graph.training import training_graph
>>> g = training_graph(OpGraph.from_records(
...     [{"name": "fc", "flops": 8.0, "output_bytes": 4.0, "param_bytes": 16.0}], []))
>>> p = pipeline_graph(g, 2)
>>> p.names.tolist()
['fc/mb0', 'fc_grad/mb0', 'fc/mb1', 'fc_grad/mb1']
>>> p.flops.tolist(), p.param_bytes.tolist()
([4.0, 8.0, 4.0, 8.0], [8.0, 0.0, 8.0, 0.0])
>>> list(zip(p.src.tolist(), p.dst.tolist()))  # fc -> fc_grad per micro-batch, accumulation
[(0, 1), (1, 3), (2, 3)]
>>> expand_order([1, 0], 2, 2).tolist()
[1, 3, 0, 2]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from travorder.errors import GraphError
from travorder.graph.opgraph import OpGraph, check_graph, own_groups

#: Separator between an op's name and its micro-batch in a pipelined graph.
MICRO_BATCH_SEP = "/mb"
#: Most nodes a pipelined step may have: each costs ~1 kB in the graph and the placers,
#: and a micro-batch count past this is a slip (minutes and gigabytes before any answer).
MAX_PIPELINED_NODES = 2_000_000


def micro_batches(g: OpGraph) -> int:
    """The number of micro-batches ``g`` was unrolled over (1 for a plain graph)."""
    return int(g.meta.get("micro_batches", 1))


def unpipelined_meta(meta: dict[str, object]) -> dict[str, object]:
    """``meta`` without the micro-batch count: that of a graph derived from a pipelined
    one whose nodes no longer have the pipeline's layout (micro-batch 0, a coarsening)."""
    return {k: v for k, v in meta.items() if k != "micro_batches"}


def check_micro_batches(m: int, samples: float | None) -> None:
    """Refuse ``m`` micro-batches that are not an integer >= 1 or more than the
    ``samples`` of a batch (None: unknown, any ``m``).

    >>> check_micro_batches(4, 2)
    Traceback (most recent call last):
    ...
    travorder.errors.GraphError: 4 micro-batches of a batch of 2: a micro-batch holds one \
sample at least (give a batch of 4 or more)
    """
    if isinstance(m, bool) or not isinstance(m, int | np.integer) or m < 1:
        raise GraphError(f"micro-batches must be an integer >= 1, got {m!r}")
    if samples is not None and m > samples:
        raise GraphError(f"{m} micro-batches of a batch of {samples:g}: a micro-batch holds "
                         f"one sample at least (give a batch of {m} or more)")


def pipeline_graph(g: OpGraph, m: int) -> OpGraph:
    """``g`` (a training step) as a pipeline of ``m`` micro-batches (module docstring)."""
    check_graph(g, "pipeline_graph")
    if micro_batches(g) > 1:
        raise GraphError(f"graph {g.name!r} is already pipelined "
                         f"({micro_batches(g)} micro-batches)")
    check_micro_batches(m, g.meta.get("batch_size"))  # before building: m can be huge
    m, n = int(m), g.n_nodes
    if m > 1 and m * n > MAX_PIPELINED_NODES:
        raise GraphError(f"{m} micro-batches of the {n}-node step of {g.name!r} make "
                         f"{m * n:,} nodes, more than the {MAX_PIPELINED_NODES:,} a pipelined "
                         f"step may have (give at most {MAX_PIPELINED_NODES // n} "
                         "micro-batches)")
    coloc, names = g.colocation, g.names.tolist()
    if m > 1:  # an op without a group gets one, so that its copies share a device
        coloc = own_groups(coloc)
        width = len(str(m - 1))
        names = [f"{x}{MICRO_BATCH_SEP}{k:0{width}d}" for k in range(m) for x in names]
    offsets = np.repeat(np.arange(m, dtype=np.int64) * n, g.n_edges)

    grouped = coloc >= 0
    _, group = np.unique(coloc[grouped], return_inverse=True)  # any ids, however large
    in_group_with_params = np.zeros(n, dtype=bool)
    in_group_with_params[grouped] = np.bincount(group, weights=g.param_bytes[grouped])[
        group] > 0
    acc = np.flatnonzero(g.is_backward & in_group_with_params)
    acc_src = (np.arange(m - 1, dtype=np.int64)[:, None] * n + acc).ravel()

    meta = dict(g.meta)
    if m > 1:
        meta["micro_batches"] = m
    return g.replace(
        names=names,
        op_types=g.op_types.tolist() * m,
        flops=np.tile(g.flops / m, m),
        output_bytes=np.tile(g.output_bytes / m, m),
        param_bytes=np.tile(g.param_bytes / m, m),
        time_us=np.tile(g.time_us / m, m),
        colocation=np.tile(coloc, m),
        is_backward=np.tile(g.is_backward, m),
        src=np.concatenate([np.tile(g.src, m) + offsets, acc_src]),
        dst=np.concatenate([np.tile(g.dst, m) + offsets, acc_src + n]),
        edge_bytes=np.concatenate([np.tile(g.edge_bytes / m, m), np.zeros(acc_src.size)]),
        meta=meta,
    )


def micro_batch_graph(p: OpGraph) -> OpGraph:
    """Micro-batch 0 of pipelined graph ``p``: the training step it was unrolled from, with
    the original names and ``1/m`` of the costs (``p`` itself if it is not pipelined)."""
    m = micro_batches(p)
    if m == 1:
        return p
    n, rest = divmod(p.n_nodes, m)
    width = len(str(m - 1))
    cut = len(MICRO_BATCH_SEP) + width
    stems = np.array([x[:-cut] for x in p.names[:n].tolist()], dtype=str)
    first, last = p.names[:n], p.names[p.n_nodes - n:]
    if rest or not ((first == np.char.add(stems, f"{MICRO_BATCH_SEP}{0:0{width}d}")).all()
                    and (last == np.char.add(stems, f"{MICRO_BATCH_SEP}{m - 1:0{width}d}"))
                    .all()):
        raise GraphError(f"graph {p.name!r} says it is pipelined over {m} micro-batches, but "
                         f"its nodes are not laid out as pipeline_graph lays them out (copy "
                         f"k of node i at index k * n + i)")
    keep = (p.src < n) & (p.dst < n)
    return OpGraph(
        stems.tolist(), p.src[keep], p.dst[keep],
        op_types=p.op_types[:n], flops=p.flops[:n], output_bytes=p.output_bytes[:n],
        param_bytes=p.param_bytes[:n], time_us=p.time_us[:n], colocation=p.colocation[:n],
        is_backward=p.is_backward[:n], edge_bytes=p.edge_bytes[keep],
        meta=unpipelined_meta(p.meta),
    )


def expand_order(order: Sequence[int] | np.ndarray, n: int, m: int) -> np.ndarray:
    """An order of micro-batch 0's ``n`` nodes as an order of the ``m``-micro-batch graph:
    each node followed at once by its other copies, in micro-batch order."""
    base = np.asarray(order, dtype=np.int64)
    return (base[:, None] + np.arange(m, dtype=np.int64) * n).ravel()
