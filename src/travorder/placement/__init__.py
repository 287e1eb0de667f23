"""Placement: device clusters, the training-step simulator, traversal orders, placers."""

from travorder._lazy import lazy_exports

_EXPORTS = {
    "LINK_MODELS": "travorder.placement.clusters",
    "PRESETS": "travorder.placement.clusters",
    "SEMANTICS": "travorder.placement.clusters",
    "Cluster": "travorder.placement.clusters",
    "Device": "travorder.placement.clusters",
    "compute_times": "travorder.placement.clusters",
    "load_cluster": "travorder.placement.clusters",
    "work_times": "travorder.placement.clusters",
    "ORDERS": "travorder.placement.orders",
    "STUDY_ORDERS": "travorder.placement.orders",
    "TOPOLOGICAL_ORDERS": "travorder.placement.orders",
    "get_order": "travorder.placement.orders",
    "traversal_order": "travorder.placement.orders",
    "load_placement": "travorder.placement.placement_file",
    "save_placement": "travorder.placement.placement_file",
    "PLACERS": "travorder.placement.placers",
    "PlacementResult": "travorder.placement.placers",
    "get_placer": "travorder.placement.placers",
    "place_graph": "travorder.placement.placers",
    "register_placer": "travorder.placement.placers",
    "BatchResult": "travorder.placement.simulator",
    "SimResult": "travorder.placement.simulator",
    "Simulator": "travorder.placement.simulator",
    "check_placement": "travorder.placement.simulator",
    "lower_bound": "travorder.placement.simulator",
    "simulate": "travorder.placement.simulator",
    "tie_rank": "travorder.placement.simulator",
    "Transfer": "travorder.placement.simulator",
    "Timeline": "travorder.placement.timeline",
    "critical_path": "travorder.placement.timeline",
    "plot_gantt": "travorder.placement.timeline",
    "simulate_timeline": "travorder.placement.timeline",
    "trace_events": "travorder.placement.timeline",
    "write_trace": "travorder.placement.timeline",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
