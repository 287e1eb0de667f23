"""travorder: which traversal order should a sequential device placer use for this network?

The public API is loaded lazily, so ``import travorder`` is cheap and never imports
torch or numba until a function that needs them is called.

>>> import travorder
>>> travorder.OpGraph.__name__
'OpGraph'
"""

from __future__ import annotations

from travorder._lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "OpGraph": "travorder.graph",
    "load_graph": "travorder.graph",
    "save_graph": "travorder.graph",
    "training_graph": "travorder.graph",
    "coarsen": "travorder.graph",
    "graph_features": "travorder.featurize",
    "ORDERS": "travorder.placement",
    "PLACERS": "travorder.placement",
    "PRESETS": "travorder.placement",
    "Cluster": "travorder.placement",
    "load_cluster": "travorder.placement",
    "simulate": "travorder.placement",
    "Simulator": "travorder.placement",
    "recommend_order": "travorder.api",
    "place": "travorder.api",
    "Recommendation": "travorder.api",
    "TravorderError": "travorder.errors",
}

__all__ = ["__version__", *_EXPORTS]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
