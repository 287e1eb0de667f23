"""The graph a placer sees: a training step, optionally coarsened; the graph a user's
placement is for: a training step at a batch, pipelined."""

from __future__ import annotations

import numpy as np

from travorder.errors import GraphError, check_flag
from travorder.graph.batch import scale_batch
from travorder.graph.coarsen import coarsen
from travorder.graph.opgraph import OpGraph
from travorder.graph.pipeline import check_micro_batches, pipeline_graph
from travorder.graph.training import training_graph


def prepare_graph(graph: OpGraph, training: bool = True, coarsen_max_nodes: int = 0
                  ) -> OpGraph:
    """The graph a study places: ``graph`` expanded by `training_graph` (if ``training``)
    and then coarsened to at most ``coarsen_max_nodes`` nodes (if positive). Both keep
    the graph's metadata (name, family, source)."""
    if isinstance(coarsen_max_nodes, bool) or not isinstance(coarsen_max_nodes, int | np.integer) \
            or coarsen_max_nodes < 0:
        raise GraphError(f"coarsen_max_nodes must be an integer >= 0 (0: never), not "
                         f"{coarsen_max_nodes!r}")
    g = training_graph(graph) if check_flag(training, "training", GraphError) else graph
    if coarsen_max_nodes and g.n_nodes > coarsen_max_nodes:
        g = coarsen(g, coarsen_max_nodes).graph
    return g


def placed_graph(graph: OpGraph, training: bool = True, batch: int | None = None,
                 micro_batches: int = 1) -> OpGraph:
    """The graph a placement of ``graph`` is for: its training step (unless not
    ``training``) at ``batch`` (default: as exported), pipelined over ``micro_batches``,
    never coarsened (what ``travorder.place`` places)."""
    check_flag(training, "training", GraphError)
    g = graph if batch is None else scale_batch(graph, batch)
    check_micro_batches(micro_batches, g.meta.get("batch_size"))  # before the step is built
    return pipeline_graph(prepare_graph(g, training), micro_batches)
