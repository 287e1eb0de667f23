"""Library calls for training launchers: `recommend_order` and `place`.

>>> import travorder
>>> from travorder.datasets.onnx_examples import residual_cnn
>>> from travorder.graph.onnx_import import read_onnx
>>> rec = travorder.recommend_order(read_onnx(residual_cnn()), cluster="k80x3")
>>> rec.order in travorder.ORDERS
True
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from numbers import Integral, Real
from typing import TYPE_CHECKING, Any

import numpy as np

from travorder.errors import TravorderError, check_flag, check_seed
from travorder.featurize import graph_features
from travorder.graph import GraphSource, OpGraph, load_graph
from travorder.graph.batch import bind_hint
from travorder.graph.load import describe_unrated
from travorder.graph.prepare import placed_graph
from travorder.placement.clusters import PRESETS, Cluster, ClusterSource, load_cluster
from travorder.placement.orders import ORDERS, identical_orders
from travorder.predictor.active import load_predictor
from travorder.predictor.dataset import feature_row
from travorder.predictor.model import softmax
from travorder.predictor.structure import structure_features
from travorder.study.scenarios import Scenario, features_of

if TYPE_CHECKING:
    from travorder.placement.placers import PlacementResult

#: Checked orders within this relative gap of the fastest are tied with it, as in the
#: study's datasets (`travorder.study.export.REL_TOL`).
TIE_REL_TOL = 0.01


@dataclass(frozen=True)
class Recommendation:
    """The recommended traversal order for a graph on a cluster.

    ``order``: the first of the orders tied within the predictor's noise with the lowest
    ``expected_regret`` (the predictor's, per order: step time / best - 1; see
    `OrderPredictor.ranking`), or, when orders were checked by placement, the fastest
    checked one; ``tied``: the orders that are as good within noise ("any of"), ``order``
    first, and ``tie_margin`` how far apart they are at most (relative); ``probability``:
    the predictor's probability that ``order`` is the best (NaN, ``null`` in JSON, for an
    order the model does not know, which ``budget=`` checks too); ``runner_up``: the next
    order outside the tied set (None, ``null`` in JSON, when every order is tied; its
    probability and regret are then NaN); ``runner_up_regret``: its regret (measured when
    both were checked);
    ``confidence``: ``"high"`` or ``"low"`` (a recommendation checked against no other
    placement whose probability is under one half or whose graph or cluster lies outside
    the training data); ``warnings``: the features outside the training data's range (on a
    cluster of one device only that every order ties there: its regrets are then 0, its
    probabilities uniform, every order of travorder's ``tied`` and none checked);
    ``contributions``: with ``explain=True``, each feature's contribution to the
    predictor's score of ``order``, largest first (None for an order the model does not
    know);
    ``verified``: the simulated step time (us) of each order checked by placement
    (``verify=k`` or ``budget=``), the placements that fit in memory fastest first, then
    the others (``budget=`` checks the model's orders best-ranked first, then those it does
    not know); ``over_memory``: the checked orders whose placement does not fit in memory;
    checked orders are tied, and a runner-up's regret measured, as `place` writes them:
    the single-device placement instead of any that is slower or does not fit where one
    device does (a runner-up that does not fit, after an order that fits, has regret
    ``inf``, ``null`` in JSON); ``single_device_us``: that placement's step time (None
    when nothing was checked, or when one device does not fit); ``floored``: the checked
    orders `place` writes it for; ``exact``: every traversal order travorder has was
    checked (all fitted in the budget), so ``order`` is the best of all for this placer
    and seed; ``check_s``: time spent checking; ``same_sequence``: the groups of orders
    that visit the placed graph in the same node sequence, and so place it alike: they
    share one prediction (their mean score), one probability of being the best (their
    total) and one check.
    ``placement``: the checked placement of ``order`` (of the training-step graph that
    `place` and ``--place`` write), not part of `to_dict`.
    """

    order: str
    probability: float
    runner_up: str | None
    runner_up_probability: float
    runner_up_regret: float
    probabilities: dict[str, float]
    expected_regret: dict[str, float]
    graph: str
    n_nodes: int
    cluster: str
    model: str
    tied: list[str] = field(default_factory=list)
    tie_margin: float = 0.0
    confidence: str = "high"
    warnings: list[str] = field(default_factory=list)
    contributions: dict[str, float] | None = None
    verified: dict[str, float] | None = None
    over_memory: list[str] = field(default_factory=list)
    exact: bool = False
    check_s: float | None = None
    single_device_us: float | None = None
    floored: list[str] = field(default_factory=list)
    same_sequence: list[list[str]] = field(default_factory=list)
    placement: PlacementResult | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "placement"}


def as_graph(model: Any, example_inputs: Any = None,
             dims: Mapping[str, int] | None = None) -> OpGraph:
    """An `OpGraph` from a path, an OpGraph, an ``onnx.ModelProto`` or a torch module with
    example inputs (captured with torch.fx, so that a placement of it can be applied to
    the module with `travorder.placement.launch.apply`). ``dims`` binds an ONNX model's
    symbolic input dimensions, e.g. ``{"batch": 32}``."""
    torch = sys.modules.get("torch")  # a torch module can only exist if torch is loaded
    if torch is not None and isinstance(model, torch.nn.Module):
        if example_inputs is None:
            raise TravorderError("a torch module needs example_inputs to be traced")
        if dims:
            raise TravorderError("dims bind an ONNX model's symbolic dimensions; a torch "
                                 "module takes its shapes from example_inputs")
        from travorder.placement.capture import capture_graph

        return capture_graph(model, example_inputs)
    if example_inputs is not None:
        what = "a model file" if isinstance(model, str) or hasattr(model, "__fspath__") \
            else f"an {type(model).__name__}"
        raise TravorderError(f"example_inputs are for tracing a torch module; {what} has "
                             "its shapes already (leave example_inputs out)")
    if type(model).__name__ == "ModelProto":
        from travorder.graph.onnx_import import read_onnx

        return read_onnx(model, dims=dims)
    if isinstance(model, OpGraph | str) or hasattr(model, "__fspath__"):
        return load_graph(model, dims=dims)
    raise TravorderError(f"cannot read a model from {type(model).__name__}; give a file "
                         "path, an OpGraph, an onnx.ModelProto or a torch module")


def recommend_order(model: GraphSource | Any, cluster: ClusterSource = "k80x3", *,
                    example_inputs: Any = None, predictor: str | os.PathLike[str] | None = None,
                    explain: bool = False, verify: int = 0, budget: float | None = None,
                    placer: str = "greedy", seed: int = 0, batch: int | None = None,
                    micro_batches: int = 1, dims: Mapping[str, int] | None = None
                    ) -> Recommendation:
    """Recommend the traversal order for placing ``model`` on ``cluster``.

    ``model``: a file (ONNX, travorder ``.json.gz``, dnn-partitioning JSON), an `OpGraph`,
    an ``onnx.ModelProto``, or a torch module with ``example_inputs``. ``cluster``: a
    preset name, a cluster file or a `Cluster`. ``predictor``: a model directory (default:
    the active model, see `travorder.predictor.active`). ``batch``: the training batch
    (default: the batch the model was exported at); ``micro_batches``: the training step
    pipelined over that many micro-batches (`travorder.graph.pipeline`). The scenario
    features (memory pressure, compute-to-transfer ratio, batch, micro-batches) come from
    the model as scaled and pipelined so, on ``cluster``. ``dims``: values of an ONNX
    model's symbolic input dimensions (``{"batch": 32}``; the warnings name any left
    unbound).

    Checking by placement: ``budget=SECONDS`` places the model's training-step graph with
    ``placer`` under the predictor's orders (`OrderPredictor.shortlist`: its pick, then
    the best fixed order of its training data, then the others from the best ranked
    down, then any order the model does not know): the pick always, and then as many as
    fit in the time budget (which starts once the pick is placed, so that loading the
    placer is not counted), simulates each and recommends the fastest; when every order
    fits the answer is ``exact``. ``verify=k`` checks the first ``k`` of those instead.
    Orders that visit the graph in one node sequence are placed once and reported under
    each name (``same_sequence``), shortlisted or not. The graph checked is the one `place` and
    ``recommend-order --place`` write a placement for (the training-step graph, never
    coarsened), so the step time reported for the recommended order is that of the
    placement they write, unless one device is faster still: they then write the
    single-device placement and say so (``fallback``).
    """
    g = as_graph(model, example_inputs, dims)
    return _recommend(g, True, load_cluster(cluster), predictor=predictor,
                      explain=explain, verify=verify, budget=budget, placer=placer, seed=seed,
                      batch=batch, micro_batches=micro_batches)


def user_scenario(batch: int | None, micro_batches: int, manifest: dict[str, Any]
                  ) -> Scenario:
    """The scenario of a user's model: their batch and micro-batches, coarsened as the
    predictor's training rows with the nearest number of micro-batches were."""
    scenario = Scenario(batch="export" if batch is None else int(batch),  # np.int64 too
                        micro_batches=int(micro_batches))
    seen = [Scenario.from_dict(d) for d in manifest.get("scenarios", [])]
    if not seen:
        return scenario
    near = min(seen, key=lambda s: (abs(s.micro_batches - micro_batches), s.name))
    return replace(scenario, name="", coarsen_max_nodes=near.coarsen_max_nodes)


def _recommend(g: OpGraph, training: bool, c: Cluster, *,
               predictor: str | os.PathLike[str] | None,
               explain: bool = False, verify: int = 0, budget: float | None = None,
               placer: str = "greedy", seed: int = 0, batch: int | None = None,
               micro_batches: int = 1, options: Mapping[str, Any] | None = None
               ) -> Recommendation:
    """`recommend_order` for graph ``g``, whose placements are of its training step (or of
    ``g`` itself, if not ``training``) at ``batch`` over ``micro_batches``, checked (if
    at all) with the placer's ``options``."""
    check_seed(seed)
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, Real)
                               or not budget >= 0):
        raise TravorderError(f"the time budget must be a number of seconds >= 0, not "
                             f"{budget!r}")
    if isinstance(verify, bool) or not isinstance(verify, Integral):
        raise TravorderError(f"the shortlist size must be an integer, not {verify!r}")
    if budget is not None and verify:
        raise TravorderError("give a time budget or a shortlist size, not both")
    check_flag(explain, "explain")
    placed = placed_graph(g, training, batch, micro_batches)  # checks batch, micro-batches
    est, manifest, description = load_predictor(predictor, placer)
    scenario = user_scenario(batch, micro_batches, manifest)
    # Features of the graph as the study that trained the predictor placed it.
    prepared = scenario.prepare(g, manifest.get("training", True),
                                manifest.get("coarsen_max_nodes", 0))
    row = feature_row(graph_features(prepared), c, features_of(prepared, c, compiled=False))
    warnings = _outside_training_range(row, manifest.get("feature_ranges", {}))
    rules = {PRESETS[n].semantics for n in manifest.get("clusters", []) if n in PRESETS}
    if rules and c.semantics not in rules:  # no feature holds the rules: warn here
        warnings.insert(0, f"cluster {c.name!r} is simulated by {c.semantics}'s rules; "
                           f"the model learned under {', '.join(sorted(rules))}'s")
    if unrated := g.meta.get("unrated_op_types"):
        warnings.insert(0, f"{sum(unrated.values())} of {g.n_nodes} ops are of types without "
                           f"a FLOPs rule ({describe_unrated(unrated)}), costed at 1 FLOP per "
                           f"output element")
    if unknown := g.meta.get("n_unknown_shape_ops", 0):
        symbolic = g.meta.get("symbolic_dims") or []
        warnings.insert(0, f"{unknown} of {g.n_nodes} ops have tensors of unknown shape "
                           f"and are costed as no work" + (
                               f" (symbolic dimensions: {', '.join(symbolic)}; "
                               f"{bind_hint(symbolic)})" if symbolic else
                               " (ops shape inference does not know, or shapes computed "
                               "from data the model file does not hold)"))
    learned_from = manifest.get("placer", placer)
    if learned_from != placer:
        from travorder.placement.placers import get_placer  # numba: off the common path

        get_placer(placer)  # a name that is no placer is an error, not a warning
        warnings.insert(0, f"the model learned from {learned_from}'s placements, not "
                           f"{placer}'s: its orders are {learned_from}'s best")
    row |= structure_features(prepared, c, row, est, manifest)
    names = est.classes_.tolist()
    # Orders that visit the placed graph in one sequence place it alike: one outcome.
    same = identical_orders(placed, ORDERS, seed) if c.n_devices > 1 else []
    scores = _grouped(est.scores(row)[0], names, same, np.mean)  # every tree runs here
    proba = _grouped(softmax(scores), names, same, np.sum)
    regret = est.regret_from_scores(scores)
    ranked = est.rank(scores)
    if c.n_devices == 1:  # known, not predicted: every order places all on the one device
        proba, regret = np.full(len(names), 1 / len(names)), np.zeros(len(names))
        warnings = [f"cluster {c.name!r} has one device: every order gives the same "
                    f"placement"]  # and no other: nothing depends on the features
    probability = dict(zip(names, proba.tolist(), strict=True))
    expected = dict(zip(names, regret.tolist(), strict=True))
    verified = placement = check_s = single_device_us = None
    exact, floored, over_memory, n_placed = False, [], [], 0
    if (verify or budget is not None) and c.n_devices > 1:  # one device: nothing to check
        candidates = [names[j] for j in est.shortlist_from_scores(
            scores[None], verify or len(names))[0]]
        if budget is not None:  # any order: those the model does not know come last
            candidates += [o for o in ORDERS if o not in names]
        group_of = {o: group for group in same for o in group}
        first = {}  # per node sequence, the first candidate that visits it
        for o in candidates:
            first.setdefault(group_of.get(o, o), o)
        t0 = time.perf_counter()
        results = _check(placed, c, list(first.values()), placer, seed, budget,
                         options or {})
        check_s = time.perf_counter() - t0
        # Every order of a checked node sequence has its placement, shortlisted or not.
        results |= {o: replace(results[first[group]], order=o)
                    for group in same if first.get(group) in results
                    for o in group if o not in results}
        checked = sorted(results, key=lambda o: (not results[o].feasible,
                                                 results[o].step_time_us))
        ranked = [*checked, *(names[j] for j in ranked if names[j] not in results)]
        verified = {o: float(results[o].step_time_us) for o in checked}
        n_placed = len({group_of.get(o, o) for o in checked})
        over_memory = [o for o in checked if not results[o].feasible]
        placement = results[checked[0]]
        # Compared as `place` and --place write them: one device where it is faster.
        floored = [o for o in checked if _floored(results[o])]
        written = {o: (True, float(results[o].single_device_us)) if o in floored else
                   (bool(results[o].feasible), float(results[o].step_time_us))
                   for o in checked}
        fits, fastest = written[checked[0]]
        tied = [o for o in checked if written[o][0] == fits
                and written[o][1] <= fastest * (1 + TIE_REL_TOL)]
        margin = max(_slower_by(written[o][1], fastest) for o in tied)
        exact = set(ORDERS) <= set(verified)
        if placement.single_device_feasible:
            single_device_us = float(placement.single_device_us)
    else:
        ranked = [names[j] for j in ranked]
        tied = [o for o in ranked if expected[o] <= regret.min() + est.tie_tolerance_]
        margin = max(expected[o] for o in tied) - min(expected[o] for o in tied)
        if c.n_devices == 1:  # every order of travorder's, known to the model or not
            tied += [o for o in ORDERS if o not in tied]
    best = ranked[0]
    second = next((o for o in ranked if o not in tied), None)
    if second is None:  # every order tied: no runner-up
        runner_up_regret = math.nan
    elif verified is None or second not in verified:
        runner_up_regret = expected[second]
    elif not written[second][0] and written[best][0]:
        runner_up_regret = math.inf  # faster maybe, but it does not fit
    else:
        runner_up_regret = _slower_by(written[second][1], written[best][1])
    # One placement checked compares nothing: the predictor's confidence stands.
    low = c.n_devices > 1 and n_placed < 2 and (bool(warnings) or probability[best] < 0.5)
    contributions = None
    if explain and best in names:
        contrib = est.explain(row, orders=[names.index(best)])[0]
        top = np.argsort(-np.abs(contrib), kind="stable")
        contributions = {str(est.feature_names_in_[i]): float(contrib[i]) for i in top}
    return Recommendation(
        order=best, probability=probability.get(best, math.nan), runner_up=second,
        runner_up_probability=probability.get(second, math.nan),  # None: NaN
        runner_up_regret=runner_up_regret, probabilities=probability,
        expected_regret=expected, graph=g.name, n_nodes=placed.n_nodes, cluster=c.name,
        model=description, tied=tied, tie_margin=margin,
        confidence="low" if low else "high", warnings=warnings,
        contributions=contributions, verified=verified, over_memory=over_memory,
        exact=exact, check_s=check_s, single_device_us=single_device_us,
        floored=floored, same_sequence=[list(group) for group in same],
        placement=placement)


def _floored(result: PlacementResult) -> bool:
    """Whether `place` writes the single-device placement instead of ``result`` (a
    checked placement): one device fits, and ``result`` does not or is slower."""
    from travorder.placement.placers import falls_back

    return bool(falls_back(result.step_time_us, result.feasible, result.single_device_us,
                           result.single_device_feasible))


def _grouped(values: np.ndarray, names: list[str], same: list[tuple[str, ...]],
             reduce: Any) -> np.ndarray:
    """``values`` (one per order of ``names``) with the members of each group of ``same``
    given ``reduce`` of theirs: one prediction (`np.mean` of the scores) and one
    probability of being the best (`np.sum`) for the one placement they share.

    >>> v, names = np.array([1.0, 3.0, 5.0]), ["a", "b", "c"]
    >>> _grouped(v, names, [("a", "c")], np.mean).tolist()
    [3.0, 3.0, 3.0]
    >>> _grouped(v, names, [("a", "c")], np.sum).tolist()
    [6.0, 3.0, 6.0]
    """
    out = values.copy()
    for group in same:
        idx = [names.index(o) for o in group if o in names]
        if idx:  # the model may know none of them
            out[idx] = reduce(values[idx])
    return out


def _slower_by(time_us: float, fastest_us: float) -> float:
    """How much slower ``time_us`` is than ``fastest_us``, relative (0 when both are 0).

    >>> _slower_by(150.0, 100.0), _slower_by(0.0, 0.0)
    (0.5, 0.0)
    """
    if fastest_us > 0:
        return time_us / fastest_us - 1.0
    return 0.0 if time_us <= fastest_us else math.inf


_KIND_OF_COLUMN = {"f_": "graph", "c_": "cluster", "s_": "scenario"}


def _outside_training_range(row: dict[str, float], ranges: dict[str, list[float]]
                            ) -> list[str]:
    """One line per feature of ``row`` outside the ``[min, max]`` of the training data,
    the farthest out (relative to the range) first."""
    out = []
    for name, (lo, hi) in ranges.items():
        x = row.get(name)
        if x is None or lo <= x <= hi:
            continue
        out.append((max(lo - x, x - hi) / max(hi - lo, 1e-12),
                    f"{_KIND_OF_COLUMN.get(name[:2], 'a')} feature "
                    f"{name[2:]} = {x:.4g} is outside the training data's range "
                    f"[{lo:.4g}, {hi:.4g}]"))
    return [text for _, text in sorted(out, key=lambda t: -t[0])]


def _check(graph: OpGraph, cluster: Cluster, candidates: list[str], placer: str, seed: int,
           budget: float | None, options: Mapping[str, Any]) -> dict[str, PlacementResult]:
    """Place ``graph`` with the ``candidates`` orders in turn (``placer`` with
    ``options``): all of them, or with a
    ``budget`` (seconds) as many as fit. The first always runs, and the budget starts
    after it: it also loads (after installing, compiles) the placer's and the simulator's
    kernels, which is not checking. The next one then runs unless the budget is already
    spent, and after that an order runs if the time the last one took still fits."""
    from travorder.placement.placers import place_graph

    first, *rest = candidates
    results = {first: place_graph(graph, cluster, placer=placer, order=first, seed=seed,
                                  **options)}
    t0 = last = time.perf_counter()
    for order in rest:
        now = time.perf_counter()
        if budget is not None and (now - t0 >= budget or (
                len(results) > 1 and 2 * now - last - t0 > budget)):
            break
        last = now
        results[order] = place_graph(graph, cluster, placer=placer, order=order, seed=seed,
                                     **options)
    return results


def place(model: GraphSource | Any, cluster: ClusterSource = "k80x3", order: str = "auto",
          placer: str = "greedy", *, seed: int = 0, example_inputs: Any = None,
          training: bool = True, predictor: str | os.PathLike[str] | None = None, verify: int = 0,
          budget: float | None = None, batch: int | None = None, micro_batches: int = 1,
          dims: Mapping[str, int] | None = None, **options: Any) -> PlacementResult:
    """Place ``model`` on ``cluster``; ``order="auto"`` uses the recommended order (checked
    by placement over a shortlist of ``verify`` orders or for ``budget`` seconds, see
    `recommend_order`; the checked placement is returned as it was measured), and the
    result's ``recommendation`` says which order won, with what probability, and the step
    time of each order checked.

    The graph is expanded to a training-step graph unless ``training=False``, at
    ``batch``, pipelined over ``micro_batches``, with ``dims`` bound (see
    `recommend_order`); ``options`` go to
    the placer (e.g. ``episodes=`` for ``rl``), in checking orders too. ``verify`` and
    ``budget`` need ``order="auto"``. A placement slower than putting
    everything on one device (or over memory where one device fits) is never returned:
    the single-device placement comes back instead, with ``result.fallback`` set.
    """
    from travorder.placement.placers import canonical_options, place_graph, with_floor

    options = canonical_options(placer, options)  # not place_graph's own: floor=, graph=
    g = as_graph(model, example_inputs, dims)
    c = load_cluster(cluster)
    placed = placed_graph(g, training, batch, micro_batches)
    rec = None
    if order != "auto" and (verify or budget is not None):
        raise TravorderError(f"verify= and budget= check the recommended order "
                             f"(order='auto'); order={order!r} is placed as given")
    if order == "auto":
        rec = _recommend(g, training, c, predictor=predictor, verify=verify, budget=budget,
                         placer=placer, seed=seed, batch=batch, micro_batches=micro_batches,
                         options=options)
        if rec.placement is not None:  # checked with the same options: the same placement
            return replace(with_floor(rec.placement, placed, c), recommendation=rec)
        order = rec.order
    result = place_graph(placed, c, placer=placer, order=order, seed=seed, floor=True,
                         **options)
    return result if rec is None else replace(result, recommendation=rec)
