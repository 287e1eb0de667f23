"""The operation graph: `OpGraph`, file formats, training-graph expansion, coarsening."""

from travorder.graph.coarsen import Coarsening, coarsen
from travorder.graph.load import GraphSource, load_graph, save_graph, sniff_format
from travorder.graph.opgraph import OpGraph, colocation_groups
from travorder.graph.prepare import prepare_graph
from travorder.graph.training import training_graph

__all__ = [
    "Coarsening",
    "GraphSource",
    "OpGraph",
    "coarsen",
    "colocation_groups",
    "load_graph",
    "prepare_graph",
    "save_graph",
    "sniff_format",
    "training_graph",
]
