"""Training the order predictor from study results: merge, evaluate, choose, fit, save.

`train_predictor` reads any mix of result stores (``.sqlite``) and exported datasets
(``.parquet``, ``.csv``), keeps one placer's rows, drops duplicates (the same graph,
cluster and placer configuration: the last source wins), evaluates every predictor kind
leave-family-out, fits the kind with the lowest mean regret on all rows and saves it with
a manifest that records why it was chosen.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lightgbm as lgb
import numpy as np
import pandas as pd

from travorder import __version__
from travorder.errors import TravorderError
from travorder.featurize import FEATURE_SCHEMA_VERSION
from travorder.placement.clusters import load_cluster
from travorder.placement.orders import traversal_order
from travorder.predictor.dataset import TrainingData, data_hash, design_matrix, prepared_graphs
from travorder.predictor.evaluate import Evaluation, evaluate, family_folds
from travorder.predictor.model import (
    DEFAULT_TOLERANCE,
    KINDS,
    OrderPredictor,
    _sha256,
    check_model_dir,
    regrets,
    tie_ranking,
)
from travorder.predictor.structure import BLOCKS, order_splits, order_statistics
from travorder.study.export import FLOOR_COLUMNS, as_placed, dataset_orders, read_sources

if TYPE_CHECKING:  # torch and torch-geometric are imported only to train the network
    from travorder.predictor.gnn import TrainedGNN

@dataclass(frozen=True)
class TrainResult:
    """The fitted predictor, the chosen method (kind and feature blocks), the evaluation,
    the training rows and a line comparing the chosen method with the best fixed order."""

    predictor: OrderPredictor
    kind: str
    evaluation: Evaluation
    frame: pd.DataFrame
    method: str = ""
    comparison: str = ""

    @property
    def beats_fixed(self) -> bool:
        """Whether the chosen method's held-out mean regret is below the best fixed
        order's (chosen on the training folds): if not, always using that order does at
        least as well."""
        table = self.evaluation.table
        return bool(table.loc[self.method or self.kind, "mean_regret"]
                    < table.loc["best-fixed", "mean_regret"])


def _placer_rows(frame: pd.DataFrame, placer: str | None, what: str = "data"
                 ) -> pd.DataFrame:
    """The rows of ``placer`` (default: the only placer in ``frame``)."""
    placers = sorted(frame["placer"].unique()) if "placer" in frame.columns else []
    if not placers:
        raise TravorderError(f"the {what} has no placer column; is it a study export?")
    if placer is None:
        if len(placers) > 1:
            raise TravorderError(f"the {what} holds several placers ({', '.join(placers)}); "
                                 "choose one with --placer")
        placer = placers[0]
    if placer not in placers:
        raise TravorderError(f"no rows for placer {placer!r} (the {what} has "
                             f"{', '.join(placers)})")
    return frame[frame["placer"] == placer].reset_index(drop=True)


def _check_corpus(corpus_dir: str | os.PathLike[str] | None) -> None:
    if corpus_dir is not None and not Path(corpus_dir).is_dir():
        raise TravorderError(f"corpus {str(corpus_dir)!r}: no such folder (`travorder zoo "
                             f"build` makes one)")


def _design_matrix(frame: pd.DataFrame, progress: Callable[[str], None] | None,
                   folds: int | None = None) -> TrainingData:
    """`design_matrix` of a dataset to learn from, held out by family: at least two
    families; ``progress`` hears of the orders left out because some rows lack them (a
    mix of studies that ran other orders), of rows of several placer configurations, and
    of more ``folds`` asked for than there are families (given: the user's, not a
    default)."""
    data = design_matrix(frame)
    families = len(np.unique(data.family))
    if families < 2:
        raise TravorderError("leave-family-out evaluation needs at least two families")
    if progress and folds is not None and folds > families:
        progress(f"note: {folds} folds, but {families} families: one family per fold")
    if progress and "placer_options" in frame.columns and (
            configs := frame["placer_options"].value_counts()).size > 1:
        progress(f"note: the rows mix {configs.size} placer configurations: " + "; ".join(
            f"{options} ({n} rows)" for options, n in configs.items()))
    left_out = [o for o in dataset_orders(frame) if o not in data.orders]
    if left_out and progress:
        n = len(left_out)
        progress(f"note: {n} order{'s' * (n != 1)} left out, which not every row has: "
                 f"{', '.join(left_out)}; learning the {len(data.orders)} every row has")
    return data


def evaluate_sources(sources: Sequence[str | os.PathLike[str]],
                     test_sources: Sequence[str | os.PathLike[str]] | None = None, *,
                     placer: str | None = None, kinds: Sequence[str] = KINDS,
                     params: dict[str, Any] | None = None, structure: Sequence[str] = (),
                     folds: int | None = None, corpus_dir: str | None = None,
                     progress: Callable[[str], None] | None = None,
                     placed: bool = False) -> Evaluation:
    """`evaluate` the ``kinds`` on ``sources`` (read as `train_predictor` reads them) with
    the ``structure`` feature blocks, leave-family-out; with ``test_sources``, scored on
    their rows of the held-out families (`evaluate`'s ``test``: train on one study, test
    on another, e.g. the same graphs under perturbed step-time costs). ``placed``: score
    the step times as `travorder.place` hands them back, with the single-device floor
    (`travorder.study.export.as_placed`); the models still learn from the placer's own
    placements."""
    if folds is not None and folds < 2:
        raise TravorderError(f"--folds must be at least 2, got {folds}")
    _check_corpus(corpus_dir)
    floor = FLOOR_COLUMNS if placed else ()  # of the rows scored: a pooled source lacks it
    frame = _placer_rows(read_sources(sources, required=() if test_sources else floor),
                         placer)
    data = _design_matrix(frame, progress, folds)
    test = None
    if test_sources:
        if "gnn" in structure:
            raise TravorderError("--test-data takes the order statistics and splits, not the "
                                 "graph network (its columns are held out within one "
                                 "dataset)")
        test = design_matrix(_placer_rows(read_sources(test_sources, required=floor),
                                          str(frame["placer"].iloc[0]), "test data"),
                             data.orders)
    extra = structure_columns(data, structure, folds, corpus_dir,
                              tie_tolerance=_fixed_tolerance(params), progress=progress)
    if extra.missing:
        raise TravorderError(extra.missing)
    data = replace(data, X=pd.concat([data.X, *extra.columns.values()], axis=1))
    rankings = None if extra.gnn_ranking is None else {"graph_net": extra.gnn_ranking}
    if test is not None:
        more = structure_columns(test, structure, folds, corpus_dir, progress=progress,
                                 reference=fallback_order(data.times))
        if more.missing:
            raise TravorderError(f"test data: {more.missing}")
        test = replace(test, X=pd.concat([test.X, *more.columns.values()], axis=1))
    if placed:
        scored = data if test is None else test
        test = replace(design_matrix(as_placed(scored.frame), data.orders), X=scored.X)
    return evaluate(data, kinds, params, folds=folds, rankings=rankings, progress=progress,
                    test=test)


def fallback_order(times: pd.DataFrame) -> str:
    """The order with the lowest mean regret over the rows of ``times`` (step times, one
    column per order): where a predictor fitted on them falls back to (its
    ``mean_regret_``'s lowest)."""
    return str(times.columns[regrets(times.to_numpy()).mean(axis=0).argmin()])


def _one_value(frame: pd.DataFrame, column: str, default: Any) -> Any:
    if column not in frame.columns:
        return default
    values = frame[column].unique()
    if len(values) > 1:
        raise TravorderError(f"training rows mix several {column} settings "
                             f"({', '.join(map(str, values))}); use one study setting")
    return values[0].item() if isinstance(values[0], np.generic) else values[0]


@dataclass
class Structure:
    """Extra feature columns per block (the graph network's held out: each fold's rows
    scored by a network trained without them), the graph network trained on every row
    and its held-out rankings, or why there are none."""

    columns: dict[str, pd.DataFrame]
    net: TrainedGNN | None = None
    gnn_ranking: np.ndarray | None = None
    missing: str = ""


def structure_columns(data: TrainingData, blocks: Sequence[str], folds: int | None,
                      corpus_dir: str | None = None, gnn_params: Any = None,
                      tie_tolerance: float = 0.02,
                      progress: Callable[[str], None] | None = None,
                      reference: str | None = None) -> Structure:
    """The `travorder.predictor.structure` blocks ``blocks`` for the rows of ``data``;
    ``progress`` gets a line before each block and each of the graph network's fits;
    ``reference``: the order the order splits are relative to (default: ``data``'s
    `fallback_order`, as a model fitted on it falls back to)."""
    say = progress or (lambda _: None)
    if not blocks:
        return Structure({})
    try:
        graphs, graph_of_row = prepared_graphs(data.frame, corpus_dir)
    except TravorderError as exc:
        return Structure({}, missing=str(exc))
    out = Structure({})
    if "order_stats" in blocks or "order_split" in blocks:
        say(f"the orders of {len(graphs)} prepared graphs")
        perms = [{o: traversal_order(g, o) for o in data.orders} for g in graphs]
    if "order_stats" in blocks:
        say(f"order statistics of {len(graphs)} prepared graphs")
        stats = [order_statistics(g, p) for g, p in zip(graphs, perms, strict=True)]
        out.columns["order_stats"] = pd.DataFrame([stats[i] for i in graph_of_row])
    if "order_split" in blocks:
        try:  # the rows' clusters by name: presets, or cluster files where the study ran
            clusters = {c: load_cluster(c) for c in data.frame["cluster"].unique()}
        except TravorderError as exc:
            out.missing = f"no order splits: {exc}"
        else:
            say(f"order splits of {len(data.frame)} rows (graph and cluster)")
            reference = reference or fallback_order(data.times)
            out.columns["order_split"] = pd.DataFrame([
                order_splits(graphs[i], clusters[c], perms[i], reference)
                for i, c in zip(graph_of_row, data.frame["cluster"], strict=True)])
    if "gnn" in blocks:
        from travorder.predictor.gnn import fit_gnn

        T = data.times.to_numpy()
        log_ratio = np.log(T / T.min(axis=1, keepdims=True))
        cnames = [c for c in data.X.columns if c.startswith("c_")]
        C = data.X[cnames].to_numpy()
        fold = family_folds(data.family, folds)

        def fit(rows: np.ndarray) -> TrainedGNN:
            return fit_gnn(graphs, graph_of_row[rows], C[rows], log_ratio[rows], data.orders,
                           cnames, gnn_params)

        held_out: list[dict[str, float]] = [{}] * len(T)
        fold_ids = np.unique(fold)
        for i, f in enumerate(fold_ids, 1):
            say(f"graph network: fold {i}/{fold_ids.size} "
                f"(training on {int((fold != f).sum())} rows)")
            net = fit(fold != f).numpy()
            for gi in np.unique(graph_of_row[fold == f]):
                rows = np.flatnonzero((fold == f) & (graph_of_row == gi))
                feats = net.features(graphs[gi], [data.X.iloc[r][cnames] for r in rows])
                for r, x in zip(rows, feats, strict=True):
                    held_out[r] = x
        cols = pd.DataFrame(held_out)
        out.columns["gnn"] = cols
        # The network alone, ranked as `OrderPredictor` ranks (its scores are log-ratios).
        regret = np.expm1(np.maximum(cols[[f"g_{o}" for o in data.orders]].to_numpy(), 0))
        safety = np.zeros_like(regret)
        for f in fold_ids:
            safety[fold == f] = (np.exp(log_ratio[fold != f]) - 1).mean(axis=0)
        out.gnn_ranking = tie_ranking(regret, safety, tie_tolerance)
        say(f"graph network: all {len(T)} rows")
        out.net = fit(np.ones(len(T), dtype=bool))
    return out


def _fixed_tolerance(params: dict[str, Any] | None) -> float:
    """The tie tolerance of ``params``, or `DEFAULT_TOLERANCE` where it is chosen by
    cross-validation (the graph network's own ranking uses a fixed one)."""
    tolerance = OrderPredictor(**dict(params or {})).tie_tolerance
    return DEFAULT_TOLERANCE if tolerance is None else tolerance


def _variants(blocks: Sequence[str]) -> list[tuple[str, ...]]:
    """Feature-block combinations to compare: none, each alone, all together."""
    combos = [(), *((b,) for b in blocks)]
    return [*combos, tuple(blocks)] if len(blocks) > 1 else combos


def train_predictor(sources: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str],
                    *, placer: str | None = None, kinds: Sequence[str] = KINDS,
                    params: dict[str, Any] | None = None,
                    structure: Sequence[str] = BLOCKS, folds: int | None = 10,
                    corpus_dir: str | None = None, gnn_params: Any = None,
                    progress: Callable[[str], None] | None = None) -> TrainResult:
    """Merge ``sources``, evaluate ``kinds`` with and without the ``structure`` feature
    blocks (`travorder.predictor.structure`: order statistics, order splits, the graph
    network), fit the method with the lowest held-out mean regret on everything, save to
    ``out``.

    ``placer``: whose results to learn from (default: the only placer in the data).
    ``folds``: family-grouped folds of the evaluation (None: one family per fold).
    The structure blocks need the graphs the study placed: found by ``graph_hash`` in the
    corpus (``corpus_dir``, default the bundled one), and the order splits its clusters by
    name; without them the blocks are skipped and the manifest says why. ``progress``:
    gets a line per structure block and graph network fit, per fold of each kind and
    feature set evaluated, and before the final fit.
    """
    check_model_dir(out)
    _check_corpus(corpus_dir)
    frame = _placer_rows(read_sources(sources), placer)
    placer = str(frame["placer"].iloc[0])
    # one study setting, checked before the long evaluation
    training = bool(_one_value(frame, "training", True))
    coarsen_max_nodes = int(_one_value(frame, "coarsen_max_nodes", 0))
    data = _design_matrix(frame, progress)
    params = dict(params or {})
    extra = structure_columns(data, structure, folds, corpus_dir, gnn_params,
                              _fixed_tolerance(params), progress)
    blocks = [b for b in structure if b in extra.columns]
    parts: list[Evaluation] = []
    for combo in _variants(blocks):
        X = pd.concat([data.X, *(extra.columns[b] for b in combo)], axis=1)
        rankings = {"graph_net": extra.gnn_ranking} \
            if not combo and extra.gnn_ranking is not None else None
        if progress is not None:
            progress(f"features: graph{''.join(' + ' + b for b in combo)}")
        ev = evaluate(replace(data, X=X), kinds, params, folds=folds, rankings=rankings,
                      progress=progress)
        parts.append(_renamed(ev, combo, kinds) if combo else ev)
    ev = Evaluation(*(pd.concat([getattr(p, f) for p in parts])
                      for f in ("table", "per_family")), ev.best_fixed,
                    *(pd.concat([getattr(p, f) for p in parts])
                      for f in ("breakdown", "families")))
    candidates = {_method(k, combo): (k, combo) for combo in _variants(blocks) for k in kinds}
    method = str(ev.table.loc[list(candidates), "mean_regret"].idxmin())
    kind, combo = candidates[method]
    X = pd.concat([data.X, *(extra.columns[b] for b in combo)], axis=1)
    if progress is not None:
        progress(f"fitting {method} on all {len(frame)} rows")
    model = OrderPredictor(kind, **params).fit(X, data.times, groups=data.family)
    t = ev.table
    best_fixed = float(t.loc[ev.best_fixed, "mean_regret"])
    chosen = float(t.loc[method, "mean_regret"])
    fixed = float(t.loc["best-fixed", "mean_regret"])
    comparison = (f"held-out mean regret: {method} {100 * chosen:.2f}% against the best fixed "
                  f"order chosen on the training folds {100 * fixed:.2f}% (over all rows: "
                  f"{ev.best_fixed.removeprefix('always-')} {100 * best_fixed:.2f}%); "
                  + ("better" if chosen < fixed else "NOT better")
                  + (f", ratio {chosen / fixed:.2f}" if fixed > 0 else "")
                  + f"; worst family {100 * t.loc[method, 'worst_family_excess']:+.1f} points "
                  f"against it, {int(t.loc[method, 'families_worse'])} of "
                  f"{len(np.unique(data.family))} families worse beyond noise")
    why = ("lowest held-out mean regret: " + ", ".join(
        f"{m} {t.loc[m, 'mean_regret']:.4f}" for m in candidates)
        + f"; best fixed order {ev.best_fixed} {best_fixed:.4f}")
    if extra.missing:
        why += f"; no structure features ({extra.missing})"
    manifest: dict[str, Any] = {}
    if "gnn" in combo:
        from travorder.predictor.gnn import export_weights

        Path(out).mkdir(parents=True, exist_ok=True)
        export_weights(extra.net, Path(out) / GNN_FILE)
        manifest["graph_net"] = {"file": GNN_FILE, "sha256": _sha256(Path(out) / GNN_FILE)}
    model.save(
        out, feature_schema_version=FEATURE_SCHEMA_VERSION, placer=placer,
        training=training, coarsen_max_nodes=coarsen_max_nodes,
        orders=data.orders, clusters=sorted(frame["cluster"].unique()),
        families=sorted(np.unique(data.family)), n_rows=len(frame),
        data_hash=data_hash(frame), method=method, structure=list(combo),
        chosen_because=why, comparison=comparison,
        vs_best_fixed={"method": method, "mean_regret": chosen,
                       "best_fixed": ev.best_fixed, "best_fixed_mean_regret": best_fixed,
                       "best_fixed_training_folds_mean_regret": fixed,
                       "worst_family_excess": float(t.loc[method, "worst_family_excess"]),
                       "families_worse": int(t.loc[method, "families_worse"])},
        evaluation_folds=min(folds, len(np.unique(data.family))) if folds else None,
        scenarios=sorted((json.loads(d) for d in frame["scenario_def"].unique()),
                         key=lambda d: d["name"]) if "scenario_def" in frame.columns else [],
        feature_ranges={c: [float(data.X[c].min()), float(data.X[c].max())]
                        for c in data.X.columns},
        evaluation=ev.summary(), travorder_version=__version__,
        lightgbm_version=lgb.__version__, **manifest)
    return TrainResult(model, kind, ev, frame, method, comparison)


GNN_FILE = "graph_net.npz"


def _renamed(ev: Evaluation, combo: tuple[str, ...], kinds: Sequence[str]) -> Evaluation:
    """The learned methods of ``ev`` alone, named with their feature blocks (`_method`)."""
    rename = {m: _method(m, combo) for m in ev.table.index if _learned(m, kinds)}
    keep = list(rename.values())

    def learned(frame: pd.DataFrame) -> pd.DataFrame:
        frame = frame.rename(index=rename, level="method")
        return frame[frame.index.get_level_values("method").isin(keep)]

    return Evaluation(ev.table.rename(index=rename).loc[keep],
                      ev.per_family.rename(index=rename).loc[keep], ev.best_fixed,
                      learned(ev.breakdown), learned(ev.families))


def _learned(method: str, kinds: Sequence[str]) -> bool:
    return method.split("+")[0] in kinds


def _method(method: str, combo: tuple[str, ...]) -> str:
    """``regressor+verify3`` with blocks ``gnn`` -> ``regressor(gnn)+verify3``."""
    if not combo:
        return method
    kind, _, rest = method.partition("+")
    return f"{kind}({'+'.join(combo)})" + (f"+{rest}" if rest else "")
