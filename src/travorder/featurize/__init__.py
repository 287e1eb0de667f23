"""Features for the order predictor: graph features with a versioned schema
(docs/features.md) and, in :mod:`travorder.featurize.cluster`, cluster features."""

from travorder.featurize.features import (
    FEATURE_NAMES,
    FEATURE_SCHEMA_VERSION,
    feature_vector,
    graph_features,
)
from travorder.featurize.optypes import OP_CATEGORIES, op_categories

__all__ = [
    "FEATURE_NAMES",
    "FEATURE_SCHEMA_VERSION",
    "OP_CATEGORIES",
    "feature_vector",
    "graph_features",
    "op_categories",
]
