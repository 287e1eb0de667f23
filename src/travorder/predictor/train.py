"""Training the order predictor from study results: merge, evaluate, choose, fit, save.

`train_predictor` reads any mix of result stores (``.sqlite``) and exported datasets
(``.parquet``, ``.csv``), keeps one placer's rows, drops duplicates (the same graph,
cluster and placer configuration: the last source wins), evaluates every predictor kind
leave-family-out, fits the kind with the lowest mean regret on all rows and saves it with
a manifest that records why it was chosen.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightgbm as lgb
import numpy as np
import pandas as pd

from travorder import __version__
from travorder.errors import TravorderError
from travorder.featurize import FEATURE_SCHEMA_VERSION
from travorder.predictor.dataset import data_hash, design_matrix
from travorder.predictor.evaluate import Evaluation, evaluate
from travorder.predictor.model import KINDS, OrderPredictor
from travorder.study.export import bundled_dataset, dataset_frame, load_dataset

_KEY = ["graph_hash", "cluster", "placer", "config_hash"]


def read_sources(sources: Sequence[str | os.PathLike[str]]) -> pd.DataFrame:
    """Concatenate the datasets of result stores, dataset files and bundled datasets
    (``bundled:greedy``, ``bundled:rl``); de-duplicate rows."""
    if not sources:
        raise TravorderError("no training data given")
    frames = []
    for src in sources:
        p = Path(src)
        if str(src).startswith("bundled:"):
            frames.append(bundled_dataset(str(src).split(":", 1)[1]))
        elif p.suffix.lower() in (".sqlite", ".sqlite3", ".db"):
            frames.append(dataset_frame(p))
        else:
            frames.append(load_dataset(p))
    return deduplicate(pd.concat(frames, ignore_index=True))


def deduplicate(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per graph content, cluster and placer configuration (the last one wins):
    two graphs with one structure under two names count once."""
    key = [k for k in _KEY if k in frame.columns]
    return frame.drop_duplicates(subset=key, keep="last").reset_index(drop=True)


@dataclass(frozen=True)
class TrainResult:
    """The fitted predictor, the chosen kind, the evaluation and the training rows."""

    predictor: OrderPredictor
    kind: str
    evaluation: Evaluation
    frame: pd.DataFrame

    @property
    def beats_fixed(self) -> bool:
        """Whether the chosen kind's leave-family-out mean regret is below the best fixed
        order's: if not, always using that order does at least as well."""
        table = self.evaluation.table
        return bool(table.loc[self.kind, "mean_regret"]
                    < table.loc[self.evaluation.best_fixed, "mean_regret"])


def _one_value(frame: pd.DataFrame, column: str, default: Any) -> Any:
    if column not in frame.columns:
        return default
    values = frame[column].unique()
    if len(values) > 1:
        raise TravorderError(f"training rows mix several {column} settings "
                             f"({', '.join(map(str, values))}); use one study setting")
    return values[0].item() if isinstance(values[0], np.generic) else values[0]


def train_predictor(sources: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str],
                    *, placer: str | None = None, kinds: Sequence[str] = KINDS,
                    params: dict[str, Any] | None = None,
                    progress: Callable[[str], None] | None = None) -> TrainResult:
    """Merge ``sources``, evaluate ``kinds``, fit the best on everything, save to ``out``.

    ``placer``: whose results to learn from (default: the only placer in the data).
    ``progress``: gets a line per fold of each kind evaluated, and before the final fit.
    """
    if Path(out).exists() and not Path(out).is_dir():
        raise TravorderError(f"{str(out)!r} is a file; --out names the model's directory")
    frame = read_sources(sources)
    placers = sorted(frame["placer"].unique())
    if placer is None:
        if len(placers) > 1:
            raise TravorderError(f"the data holds several placers ({', '.join(placers)}); "
                                 "choose one with --placer")
        placer = placers[0]
    if placer not in placers:
        raise TravorderError(f"no rows for placer {placer!r} (the data has "
                             f"{', '.join(placers)})")
    frame = frame[frame["placer"] == placer].reset_index(drop=True)
    data = design_matrix(frame)
    if len(np.unique(data.family)) < 2:
        raise TravorderError("leave-family-out evaluation needs at least two families")
    params = dict(params or {})
    ev = evaluate(data, kinds, params, progress=progress)
    kind = str(ev.table.loc[list(kinds), "mean_regret"].idxmin())
    if progress is not None:
        progress(f"fitting the {kind} on all {len(frame)} rows")
    model = OrderPredictor(kind, **params).fit(data.X, data.times)
    why = ("lowest leave-family-out mean regret: " + ", ".join(
        f"{k} {ev.table.loc[k, 'mean_regret']:.4f}" for k in kinds)
        + f"; best fixed order {ev.best_fixed} {ev.table.loc[ev.best_fixed, 'mean_regret']:.4f}")
    model.save(
        out, feature_schema_version=FEATURE_SCHEMA_VERSION, placer=placer,
        training=bool(_one_value(frame, "training", True)),
        coarsen_max_nodes=int(_one_value(frame, "coarsen_max_nodes", 0)),
        orders=data.orders, clusters=sorted(frame["cluster"].unique()),
        families=sorted(np.unique(data.family)), n_rows=len(frame),
        data_hash=data_hash(frame), chosen_because=why, evaluation=ev.summary(),
        travorder_version=__version__, lightgbm_version=lgb.__version__)
    return TrainResult(model, kind, ev, frame)
