"""Import a ``torch.nn.Module`` as an :class:`~travorder.graph.OpGraph` (needs the
``torch`` extra: ``pip install travorder[torch]``).

The module is exported to ONNX in memory, with static shapes taken from the example
inputs, and the ONNX model is read by :func:`~travorder.graph.onnx_import.read_onnx`.
Two exporters: ``"dynamo"`` (default), torch's ``torch.export``-based exporter, and
``"torchscript"``, the older tracing exporter: deprecated by torch, but it starts in a
fraction of the time and traces some models the other cannot.
The export runs in eval mode (the forward graph; :func:`travorder.graph.training_graph`
adds the backward pass) and restores the module's mode afterwards. The exporter's
optimiser folds constants, so e.g. an eval-mode BatchNorm after a Conv merges into it.
"""

from __future__ import annotations

import io
import logging
import warnings
from collections.abc import Sequence
from typing import Any

from travorder.errors import TravorderError
from travorder.graph.onnx_import import read_onnx
from travorder.graph.opgraph import OpGraph

EXPORTERS = ("dynamo", "torchscript")


def from_torch(module: Any, example_inputs: Any | Sequence[Any], *,
               name: str | None = None, exporter: str = "dynamo") -> OpGraph:
    """Trace ``module`` on ``example_inputs`` (a tensor or a tuple of tensors, real, not
    on the ``meta`` device) and return its forward graph.

    ``name`` defaults to the module's class name; ``exporter`` is one of
    :data:`EXPORTERS`. Raises :class:`TravorderError` when torch is missing, the inputs
    are not real tensors, or the export fails.
    """
    if exporter not in EXPORTERS:
        raise TravorderError(f"unknown exporter {exporter!r}; use one of {', '.join(EXPORTERS)}")
    try:
        import torch
    except ImportError:
        raise TravorderError(
            "importing a torch module needs torch: install travorder[torch]") from None
    if not isinstance(module, torch.nn.Module):
        raise TravorderError(f"expected a torch.nn.Module, got {type(module).__name__}")
    args = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(
        example_inputs)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    tensors += list(module.parameters()) + list(module.buffers())
    if any(t.is_meta for t in tensors):
        raise TravorderError("from_torch needs real tensors: the module or the example "
                             "inputs are on the meta device")
    name = name or type(module).__name__
    was_training = module.training
    module.eval()
    # The exporter logs progress and warnings for optional dependencies; keep it quiet.
    exporter_log = logging.getLogger("torch.onnx")
    level = exporter_log.level
    exporter_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            if exporter == "dynamo":
                model: Any = torch.onnx.export(module, args, dynamo=True, verbose=False,
                                               report=False).model_proto
            else:
                buffer = io.BytesIO()
                torch.onnx.export(module, args, buffer, dynamo=False)
                model = buffer.getvalue()
    except Exception as exc:  # the exporter raises many types; report them as one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise TravorderError(f"{name}: torch.onnx export failed ({first})") from exc
    finally:
        module.train(was_training)
        exporter_log.setLevel(level)
    g = read_onnx(model, name=name)
    return g.replace(meta={"source": f"torch:{type(module).__qualname__}",
                           "importer": "torch"})


__all__ = ["EXPORTERS", "from_torch"]
