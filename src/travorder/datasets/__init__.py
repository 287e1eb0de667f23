"""Model graphs to study: synthetic families, the real-architecture zoo, the bundled corpus,
and small ONNX example builders."""

from travorder.datasets.corpus import (
    add_to_corpus,
    corpus_families,
    load_corpus,
    read_manifest,
    remove_from_corpus,
)
from travorder.datasets.synthetic import SYNTHETIC_FAMILIES, build_synthetic_corpus

__all__ = [
    "SYNTHETIC_FAMILIES",
    "add_to_corpus",
    "build_synthetic_corpus",
    "corpus_families",
    "load_corpus",
    "read_manifest",
    "remove_from_corpus",
]
