"""Library calls for training launchers: `recommend_order` and `place`.

>>> import travorder
>>> from travorder.datasets.onnx_examples import residual_cnn
>>> from travorder.graph.onnx_import import read_onnx
>>> rec = travorder.recommend_order(read_onnx(residual_cnn()), cluster="k80x3")
>>> rec.order in travorder.ORDERS
True
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from travorder.errors import TravorderError
from travorder.featurize import graph_features
from travorder.graph import GraphSource, OpGraph, load_graph, prepare_graph, training_graph
from travorder.placement.clusters import Cluster, load_cluster
from travorder.predictor.active import load_predictor
from travorder.predictor.dataset import feature_row
from travorder.predictor.model import softmax

if TYPE_CHECKING:
    from travorder.placement.placers import PlacementResult


@dataclass(frozen=True)
class Recommendation:
    """The recommended traversal order for a graph on a cluster.

    ``probability``: the predictor's probability that ``order`` is the best;
    ``runner_up_regret``: the step-time regret expected if ``runner_up`` were used instead
    (step time / best - 1; measured when both were checked by ``verify``);
    ``expected_regret`` per order (the predictor's); ``contributions``: with
    ``explain=True``, each feature's contribution to the predictor's top-ranked order,
    largest first;
    ``verified``: with ``verify=k``, the simulated step time (us) each order of the
    predictor's shortlist of ``k`` reached (``order`` is then the fastest of them).
    """

    order: str
    probability: float
    runner_up: str
    runner_up_probability: float
    runner_up_regret: float
    probabilities: dict[str, float]
    expected_regret: dict[str, float]
    graph: str
    n_nodes: int
    cluster: str
    model: str
    contributions: dict[str, float] | None = None
    verified: dict[str, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def as_graph(model: Any, example_inputs: Any = None) -> OpGraph:
    """An `OpGraph` from a path, an OpGraph, an ``onnx.ModelProto`` or a torch module with
    example inputs (captured with torch.fx, so that a placement of it can be applied to
    the module with `travorder.placement.launch.apply`)."""
    torch = sys.modules.get("torch")  # a torch module can only exist if torch is loaded
    if torch is not None and isinstance(model, torch.nn.Module):
        if example_inputs is None:
            raise TravorderError("a torch module needs example_inputs to be traced")
        from travorder.placement.capture import capture_graph

        return capture_graph(model, example_inputs)
    if type(model).__name__ == "ModelProto":
        from travorder.graph.onnx_import import read_onnx

        return read_onnx(model)
    if isinstance(model, OpGraph | str) or hasattr(model, "__fspath__"):
        return load_graph(model)
    raise TravorderError(f"cannot read a model from {type(model).__name__}; give a file "
                         "path, an OpGraph, an onnx.ModelProto or a torch module")


def recommend_order(model: GraphSource | Any, cluster: str | Cluster = "k80x3", *,
                    example_inputs: Any = None, predictor: str | None = None,
                    explain: bool = False, verify: int = 0, placer: str = "greedy",
                    seed: int = 0) -> Recommendation:
    """Recommend the traversal order for placing ``model`` on ``cluster``.

    ``model``: a file (ONNX, travorder ``.json.gz``, dnn-partitioning JSON), an `OpGraph`,
    an ``onnx.ModelProto``, or a torch module with ``example_inputs``. ``cluster``: a
    preset name, a cluster file or a `Cluster`. ``predictor``: a model directory (default:
    the active model, see `travorder.predictor.active`).

    ``verify=k`` checks the predictor's shortlist of ``k`` orders (the best fixed order of
    its training data, then the highest-ranked others; `OrderPredictor.shortlist`) by
    placing the graph (as the study prepared it) with ``placer`` and simulating it, and
    recommends the fastest: worth it when the placer is cheap (``greedy``: well under a
    second per order on 1000 nodes), costly for ``rl``.
    """
    g = as_graph(model, example_inputs)
    c = load_cluster(cluster)
    est, manifest, description = load_predictor(predictor)
    # Features of the graph as the study that trained the predictor placed it.
    prepared = prepare_graph(g, manifest.get("training", True),
                             manifest.get("coarsen_max_nodes", 0))
    row = feature_row(graph_features(prepared), c)
    scores = est.scores(row)[0]  # once: every tree of the model runs here
    proba = softmax(scores)
    regret = proba @ est.regret_table_  # as OrderPredictor.expected_regret
    names = est.classes_.tolist()
    ranked = np.argsort(-scores, kind="stable")
    verified = None
    if verify:
        shortlist = est.shortlist(row, verify)[0]
        ranked, verified = _verify(prepared, c, names, shortlist, ranked, placer, seed)
    best, second = int(ranked[0]), int(ranked[1])
    runner_up_regret = float(regret[second])
    if verified is not None and names[second] in verified:
        runner_up_regret = verified[names[second]] / verified[names[best]] - 1.0
    contributions = None
    if explain:
        contrib = est.explain(row)[0]
        top = np.argsort(-np.abs(contrib), kind="stable")
        contributions = {str(est.feature_names_in_[i]): float(contrib[i]) for i in top}
    return Recommendation(
        order=names[best], probability=float(proba[best]), runner_up=names[second],
        runner_up_probability=float(proba[second]), runner_up_regret=runner_up_regret,
        probabilities=dict(zip(names, proba.tolist(), strict=True)),
        expected_regret=dict(zip(names, regret.tolist(), strict=True)),
        graph=g.name, n_nodes=g.n_nodes, cluster=c.name, model=description,
        contributions=contributions, verified=verified)


def _verify(graph: OpGraph, cluster: Cluster, names: list[str], shortlist: np.ndarray,
            ranked: np.ndarray, placer: str, seed: int) -> tuple[np.ndarray, dict[str, float]]:
    """Place ``graph`` with the ``shortlist`` orders; return the ranking with the checked
    orders first, fastest (feasible) first, and each checked order's step time."""
    from travorder.placement.placers import place_graph

    results = {int(j): place_graph(graph, cluster, placer=placer, order=names[j], seed=seed)
               for j in shortlist}
    checked = sorted(results, key=lambda j: (not results[j].feasible, results[j].step_time_us))
    ranked = np.array([*checked, *(j for j in ranked if j not in results)])
    return ranked, {names[j]: float(results[j].step_time_us) for j in checked}


def place(model: GraphSource | Any, cluster: str | Cluster = "k80x3", order: str = "auto",
          placer: str = "greedy", *, seed: int = 0, example_inputs: Any = None,
          training: bool = True, predictor: str | None = None, verify: int = 0,
          **options: Any) -> PlacementResult:
    """Place ``model`` on ``cluster``; ``order="auto"`` uses the recommended order (checked
    by placement over a shortlist of ``verify`` orders, see `recommend_order`), and the
    result's ``recommendation`` says which order won, with what probability, and the step
    time of each order checked.

    The graph is expanded to a training-step graph unless ``training=False``; ``options``
    go to the placer (e.g. ``episodes=`` for ``rl``). A placement slower than putting
    everything on one device (or over memory where one device fits) is never returned:
    the single-device placement comes back instead, with ``result.fallback`` set.
    """
    from dataclasses import replace

    from travorder.placement.placers import place_graph

    g = as_graph(model, example_inputs)
    c = load_cluster(cluster)
    rec = None
    if order == "auto":
        rec = recommend_order(g, c, predictor=predictor, verify=verify, placer=placer,
                              seed=seed)
        order = rec.order
    result = place_graph(training_graph(g) if training else g, c, placer=placer, order=order,
                         seed=seed, floor=True, **options)
    return result if rec is None else replace(result, recommendation=rec)
