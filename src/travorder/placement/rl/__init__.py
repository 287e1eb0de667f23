"""The Placeto-style RL placer: environment, policy and REINFORCE trainer.

`rl_place` is the ``rl`` placer (``travorder place MODEL --placer rl``). Importing this
package loads neither torch nor gymnasium; they are imported when a run starts, from
the ``rl`` extra (``pip install 'travorder[rl]'``). See ``docs/rl.md``.

- :mod:`~travorder.placement.rl.env`: `PlacementEnv`, Placeto's MDP with the Gymnasium API
- :mod:`~travorder.placement.rl.policy`: `PlacementPolicy`, the graph network
- :mod:`~travorder.placement.rl.trainer`: `RLConfig`, `train`, `RLRun`
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from travorder.errors import TravorderError

_EXPORTS = {
    "PlacementEnv": "env",
    "PlacementPolicy": "policy",
    "PolicyGraph": "policy",
    "RLConfig": "trainer",
    "RLRun": "trainer",
    "train": "trainer",
}

__all__ = ["rl_options", "rl_place", *_EXPORTS]


def _load(module: str) -> Any:
    try:
        return importlib.import_module(f"travorder.placement.rl.{module}")
    except ModuleNotFoundError as exc:
        if exc.name in ("torch", "torch_geometric", "gymnasium"):
            raise TravorderError(f"the rl placer needs {exc.name}: install travorder's "
                                 f"'rl' extra (pip install 'travorder[rl]')") from None
        raise


def rl_place(graph: Any, cluster: Any, order: np.ndarray, seed: int = 0, *,
             preset: str = "default", **options: Any) -> tuple[np.ndarray, list[float]]:
    """The ``rl`` placer: train a Placeto policy on ``graph`` visiting nodes in ``order``.

    ``preset`` is ``"default"``, ``"paper"`` or ``"paper_long"`` (300 episodes);
    ``options`` override fields of :class:`~travorder.placement.rl.trainer.RLConfig`
    (``episodes=20``, ``encoder="sage"`` ...). Returns the best placement found and the
    learning curve (the step time of each episode's final placement, us).
    """
    return _load("trainer").rl_place(graph, cluster, order, seed, preset=preset, **options)


def rl_options(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` of the ``rl`` placer checked, each as `RLConfig` reads it (``gamma =
    1`` is ``1.0``): the options a run's configuration is known by."""
    options = dict(options)
    preset = options.pop("preset", None)
    config = _load("trainer").RLConfig.from_options(
        "default" if preset is None else preset, **options)
    return {**({} if preset is None else {"preset": preset}),
            **{key: getattr(config, key) for key in options}}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(_load(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
