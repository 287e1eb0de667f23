"""The order predictor: `OrderPredictor`, its leave-family-out evaluation, training from
study results, and the active (user or bundled) model. See docs/predictor.md."""

from travorder._lazy import lazy_exports

_EXPORTS = {
    "OrderPredictor": "travorder.predictor.model",
    "KINDS": "travorder.predictor.model",
    "evaluate": "travorder.predictor.evaluate",
    "Evaluation": "travorder.predictor.evaluate",
    "design_matrix": "travorder.predictor.dataset",
    "train_predictor": "travorder.predictor.train",
    "load_predictor": "travorder.predictor.active",
    "install_as_default": "travorder.predictor.active",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
