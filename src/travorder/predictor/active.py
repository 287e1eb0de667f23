"""Which predictor `recommend-order` uses: the user's own, or the bundled default.

A predictor learns from one placer's study results, so each placer has its own default.
Resolution order: an explicit path; the ``TRAVORDER_MODEL`` environment variable; the
model installed for the placer by ``travorder train --use-as-default`` in the user's
config directory (``$XDG_CONFIG_HOME/travorder/model`` for ``greedy``,
``.../model-<placer>`` for the others; ``~/.config`` without ``XDG_CONFIG_HOME``); the
placer's model shipped inside the package (``default`` for ``greedy``, ``default_rl`` for
``rl``), else the greedy one. ``travorder model reset`` removes the user's model.
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
from travorder.study.scenarios import Scenario

#: The placer whose model is the fallback for placers without one of their own.
DEFAULT_PLACER = "greedy"


def _suffix(placer: str, sep: str) -> str:
    return "" if placer == DEFAULT_PLACER else f"{sep}{placer}"


def bundled_model_dir(placer: str = DEFAULT_PLACER) -> Path:
    """The default model for ``placer`` shipped in the package (the greedy one for a
    placer without a model of its own)."""
    base = resources.files("travorder.predictor")
    own = Path(str(base / f"default{_suffix(placer, '_')}"))
    return own if (own / MANIFEST).exists() else Path(str(base / "default"))


def user_model_dir(placer: str = DEFAULT_PLACER) -> Path:
    """Where ``travorder train --use-as-default`` installs a model of ``placer``."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "travorder" / f"model{_suffix(placer, '-')}"


def active_model_dir(path: str | os.PathLike[str] | None = None,
                     placer: str = DEFAULT_PLACER) -> tuple[Path, str]:
    """``(directory, why)``: the predictor to use for ``placer`` and why it was chosen."""
    if path is not None:
        if not isinstance(path, str | os.PathLike):
            raise TravorderError(f"a predictor is a model directory, not {path!r}")
        return Path(path), "given"
    env = os.environ.get("TRAVORDER_MODEL")
    if env:
        return Path(env), "TRAVORDER_MODEL"
    user = user_model_dir(placer)
    if (user / MANIFEST).exists():
        return user, "user default"
    if user.exists():  # said, so that a model copied there by hand is not missed unseen
        what = "a folder without manifest.json" if user.is_dir() else "a file"
        return bundled_model_dir(placer), f"bundled default; {user} is {what}, not a model"
    return bundled_model_dir(placer), "bundled default"


@lru_cache(maxsize=4)
def _load(directory: str) -> tuple[OrderPredictor, dict[str, Any]]:
    predictor, manifest = OrderPredictor.load(directory)
    version = manifest.get("feature_schema_version")
    if version != FEATURE_SCHEMA_VERSION:
        raise TravorderError(
            f"{directory}: model was trained on feature schema {version!r}, this travorder "
            f"computes schema {FEATURE_SCHEMA_VERSION}; retrain it with `travorder train`")
    for i, scenario in enumerate(manifest.get("scenarios", []), 1):
        Scenario.from_dict(scenario, f"{Path(directory) / MANIFEST}: scenario {i}")
    return predictor, manifest


def load_predictor(path: str | os.PathLike[str] | None = None,
                   placer: str = DEFAULT_PLACER) -> tuple[OrderPredictor, dict[str, Any], str]:
    """``(predictor, manifest, description)`` of the active (or given) model for
    ``placer``."""
    directory, why = active_model_dir(path, placer)
    try:
        predictor, manifest = _load(str(directory))
    except TravorderError as exc:
        if why != "TRAVORDER_MODEL":
            raise
        raise type(exc)(f"{exc} (the model the environment variable TRAVORDER_MODEL "
                        f"names)") from None
    return predictor, manifest, f"{directory} ({why})"


def install_as_default(directory: str | os.PathLike[str]) -> Path:
    """Copy a saved model to the user's config directory as the default for the placer it
    learned from, replacing any earlier one."""
    _, manifest = _load(str(directory))  # refuse to install a model that does not load
    target = user_model_dir(manifest.get("placer", DEFAULT_PLACER))
    _check_installed_dir(target)
    tmp = target.with_name(target.name + ".tmp")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(directory, tmp)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    except OSError as exc:  # e.g. ~/.config a file, or read-only
        raise TravorderError(f"cannot install the model of {str(directory)!r} as the "
                             f"default ({target}): {exc.strerror or exc}") from None
    _load.cache_clear()
    return target


def reset_default(placer: str = DEFAULT_PLACER) -> Path | None:
    """Remove the model of ``placer`` installed by `install_as_default`, so that the
    bundled model (or ``TRAVORDER_MODEL``) is used again; returns the directory removed,
    or None."""
    target = user_model_dir(placer)
    if not target.exists():
        return None
    _check_installed_dir(target)
    try:
        shutil.rmtree(target)
    except OSError as exc:
        raise TravorderError(f"cannot remove {str(target)!r}: {exc.strerror or exc}") from None
    _load.cache_clear()
    return target


def _check_installed_dir(target: Path) -> None:
    if target.exists() and not target.is_dir():  # not one travorder made: not removed
        raise TravorderError(f"{str(target)!r} is a file, not a model folder travorder "
                             "installed; move it away first")


def check_installable(placer: str = DEFAULT_PLACER) -> None:
    """Refuse, before a model is trained, a config directory where `install_as_default`
    could not install a model of ``placer``: a file in the way, or a folder that cannot
    be written."""
    import tempfile

    target = user_model_dir(placer)
    _check_installed_dir(target)
    folder = next(p for p in target.parents if p.exists())
    try:
        if not folder.is_dir():
            raise NotADirectoryError(f"{folder} is a file")
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise TravorderError(f"cannot install a model as the default ({target}): "
                             f"{exc.strerror or exc}") from None
