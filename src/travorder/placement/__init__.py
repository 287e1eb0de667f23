"""Placement: device clusters, the training-step simulator, traversal orders, placers."""

from travorder.placement.clusters import (
    LINK_MODELS,
    PRESETS,
    Cluster,
    Device,
    compute_times,
    load_cluster,
)
from travorder.placement.orders import (
    ORDERS,
    STUDY_ORDERS,
    TOPOLOGICAL_ORDERS,
    get_order,
    traversal_order,
)
from travorder.placement.placement_file import load_placement, save_placement
from travorder.placement.placers import (
    PLACERS,
    PlacementResult,
    get_placer,
    place,
    register_placer,
)
from travorder.placement.simulator import (
    BatchResult,
    SimResult,
    Simulator,
    check_placement,
    lower_bound,
    simulate,
    tie_rank,
)

__all__ = [
    "LINK_MODELS",
    "ORDERS",
    "PLACERS",
    "PRESETS",
    "STUDY_ORDERS",
    "TOPOLOGICAL_ORDERS",
    "BatchResult",
    "Cluster",
    "Device",
    "PlacementResult",
    "SimResult",
    "Simulator",
    "check_placement",
    "compute_times",
    "get_order",
    "get_placer",
    "load_cluster",
    "load_placement",
    "lower_bound",
    "place",
    "register_placer",
    "save_placement",
    "simulate",
    "tie_rank",
    "traversal_order",
]
