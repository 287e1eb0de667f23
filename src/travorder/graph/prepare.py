"""The graph a placer sees: a training step, optionally coarsened."""

from __future__ import annotations

from travorder.graph.coarsen import coarsen
from travorder.graph.opgraph import OpGraph
from travorder.graph.training import training_graph


def prepare_graph(graph: OpGraph, training: bool = True, coarsen_max_nodes: int = 0
                  ) -> OpGraph:
    """The graph a study places: ``graph`` expanded by `training_graph` (if ``training``)
    and then coarsened to at most ``coarsen_max_nodes`` nodes (if positive). Both keep
    the graph's metadata (name, family, source)."""
    g = training_graph(graph) if training else graph
    if coarsen_max_nodes and g.n_nodes > coarsen_max_nodes:
        g = coarsen(g, coarsen_max_nodes).graph
    return g
