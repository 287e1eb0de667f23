"""Which predictor `recommend-order` uses: the user's own, or the bundled default.

Resolution order: an explicit path; the ``TRAVORDER_MODEL`` environment variable; the
model installed by ``travorder train --use-as-default`` in the user's config directory
(``$XDG_CONFIG_HOME/travorder/model``, else ``~/.config/travorder/model``); the default
model shipped inside the package. ``travorder model reset`` removes the user's model.
"""

from __future__ import annotations

import os
import shutil
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from travorder.errors import TravorderError
from travorder.featurize import FEATURE_SCHEMA_VERSION
from travorder.predictor.model import MANIFEST, OrderPredictor


def bundled_model_dir() -> Path:
    """The default model shipped in the package."""
    return Path(str(resources.files("travorder.predictor") / "default"))


def user_model_dir() -> Path:
    """Where ``travorder train --use-as-default`` installs a model."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "travorder" / "model"


def active_model_dir(path: str | os.PathLike[str] | None = None) -> tuple[Path, str]:
    """``(directory, why)``: the predictor to use and why it was chosen."""
    if path is not None:
        return Path(path), "given"
    env = os.environ.get("TRAVORDER_MODEL")
    if env:
        return Path(env), "TRAVORDER_MODEL"
    if (user_model_dir() / MANIFEST).exists():
        return user_model_dir(), "user default"
    return bundled_model_dir(), "bundled default"


@lru_cache(maxsize=4)
def _load(directory: str) -> tuple[OrderPredictor, dict[str, Any]]:
    predictor, manifest = OrderPredictor.load(directory)
    version = manifest.get("feature_schema_version")
    if version != FEATURE_SCHEMA_VERSION:
        raise TravorderError(
            f"{directory}: model was trained on feature schema {version!r}, this travorder "
            f"computes schema {FEATURE_SCHEMA_VERSION}; retrain it with `travorder train`")
    return predictor, manifest


def load_predictor(path: str | os.PathLike[str] | None = None
                   ) -> tuple[OrderPredictor, dict[str, Any], str]:
    """``(predictor, manifest, description)`` of the active (or given) model."""
    directory, why = active_model_dir(path)
    predictor, manifest = _load(str(directory))
    return predictor, manifest, f"{directory} ({why})"


def install_as_default(directory: str | os.PathLike[str]) -> Path:
    """Copy a saved model to the user's config directory, replacing any earlier one."""
    _load(str(directory))  # refuse to install a model that does not load
    target = user_model_dir()
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(directory, tmp)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target


def reset_default() -> Path | None:
    """Remove the model installed by `install_as_default`, so that the bundled model (or
    ``TRAVORDER_MODEL``) is used again; returns the directory removed, or None."""
    target = user_model_dir()
    if not target.exists():
        return None
    shutil.rmtree(target)
    _load.cache_clear()
    return target
