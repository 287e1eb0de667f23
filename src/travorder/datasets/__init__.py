"""Model graphs to study: synthetic families, the real-architecture zoo, the bundled corpus,
and small ONNX example builders."""

from travorder._lazy import lazy_exports

_EXPORTS = {
    "SYNTHETIC_FAMILIES": "travorder.datasets.synthetic",
    "add_to_corpus": "travorder.datasets.corpus",
    "build_synthetic_corpus": "travorder.datasets.synthetic",
    "corpus_families": "travorder.datasets.corpus",
    "load_corpus": "travorder.datasets.corpus",
    "read_manifest": "travorder.datasets.corpus",
    "remove_from_corpus": "travorder.datasets.corpus",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
