"""Study scenarios: how a (graph, cluster) pair is transformed before placement.

A `Scenario` is a study axis beside graphs x clusters x orders x seeds:

- ``batch``: ``"export"`` (the batch the graph was exported at, its ``batch_size``),
  ``"train"`` (a realistic training batch for its family, `training_batch`) or a number;
  the forward graph is re-costed by `travorder.graph.batch.scale_batch`;
- ``micro_batches``: the training step pipelined over this many micro-batches
  (`travorder.graph.pipeline.pipeline_graph`; 1: the plain step);
- ``memory``: every device's memory set to this fraction of the step's single-device
  peak (1.0: it just fits; 0.5: at least two devices are needed); unset: the cluster's;
- ``coarsen_max_nodes``: overrides the spec's coarsening for this scenario (applied
  before pipelining, so a pipelined graph has up to ``m`` times as many nodes);
- ``op_noise``, ``edge_noise``, ``perturb_seed``: the estimated costs scattered as
  measured ones are (`travorder.graph.perturb.perturb_costs`): each op's FLOPs and each
  edge's bytes times a mean-1 log-normal factor of log-scale standard deviation
  ``op_noise`` / ``edge_noise`` (0.2: about 20%), drawn with ``perturb_seed``;
- ``latency_us``: every device's ``min_op_us``: no op that does any work takes less.

The order of the transformations: batch, training step, cost noise, coarsening,
pipelining, memory and latency floor. A scenario's ``name`` (derived when not given) goes
into the job key, the store and the dataset; the perturbation settings appear in the name
and the definition only when they are set, so every other scenario keeps its key.

>>> s = Scenario(batch="train", micro_batches=4)
>>> s.name
'batch=train,mb=4'
>>> from travorder.datasets.synthetic import chain
>>> g = s.prepare(chain(0, n_layers=3), training=True, coarsen_max_nodes=0)
>>> g.n_nodes, g.meta["micro_batches"], g.meta["batch_size"]
(64, 4, 64)
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from travorder.errors import TravorderError
from travorder.featurize.scenario import scenario_features
from travorder.graph import OpGraph, prepare_graph
from travorder.graph.batch import check_scalable, scale_batch
from travorder.graph.perturb import MAX_NOISE, perturb_costs
from travorder.graph.pipeline import check_micro_batches, pipeline_graph
from travorder.placement.clusters import Cluster, check_in_range, compute_times

#: The largest ``latency_us``: a second (a kernel's floor is some microseconds).
MAX_LATENCY_US = 1e6
#: The keys a scenario table may have.
SCENARIO_KEYS = ("name", "batch", "micro_batches", "memory", "coarsen_max_nodes",
                 "op_noise", "edge_noise", "latency_us", "perturb_seed")
#: The perturbation keys: left out of a scenario's definition where they are 0.
_PERTURB_KEYS = SCENARIO_KEYS[5:]

#: Training batch per family where it differs from the default of its kind (below).
FAMILY_TRAINING_BATCH: Mapping[str, int] = {
    "video_resnet": 8, "s3d": 8,                       # video clips
    "deeplab": 16, "fcn": 16, "segformer": 16,         # segmentation at full resolution
    "whisper": 8, "wav2vec2": 8,                       # audio
    "vit": 64, "clip": 32, "vision_encoder_decoder": 16,
}
#: Training batch of sequence models (text transformers, the synthetic rnn, seq2seq and
#: transformer families) and of everything else (image models).
SEQUENCE_TRAINING_BATCH, IMAGE_TRAINING_BATCH = 16, 64
_SEQUENCE_FAMILIES = frozenset({"rnn", "seq2seq", "transformer"})


def training_batch(graph: OpGraph) -> int:
    """A realistic training batch for ``graph``'s family (docs/study.md lists them):
    16 sequences for text models, 64 images for image models, less for video, audio and
    segmentation.

    >>> from travorder.datasets.synthetic import chain, rnn
    >>> training_batch(chain(0)), training_batch(rnn(0))
    (64, 16)
    """
    family = str(graph.meta.get("family") or "")
    if family in FAMILY_TRAINING_BATCH:
        return FAMILY_TRAINING_BATCH[family]
    source = str(graph.meta.get("source") or "")
    if source.startswith("transformers:") or family in _SEQUENCE_FAMILIES:
        return SEQUENCE_TRAINING_BATCH
    return IMAGE_TRAINING_BATCH


def is_stored_int(value: Any) -> bool:
    """Whether ``value`` is an integer in [0, 2**63), which a result store's SQLite integer
    columns hold (True is not one).

    >>> is_stored_int(7), is_stored_int(2**63), is_stored_int(True)
    (True, False, False)
    """
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _exactly(value: float) -> str:
    """``value`` as ``:g`` writes it where that reads back as ``value``, else exactly (so
    that two settings never share a derived name)."""
    short = f"{value:g}"
    return short if float(short) == value else repr(value)


@dataclass(frozen=True)
class Scenario:
    """One scenario (see the module docstring); validated on construction."""

    batch: str | int = "export"
    micro_batches: int = 1
    memory: float | None = None
    coarsen_max_nodes: int | None = None
    name: str = ""
    op_noise: float = 0.0
    edge_noise: float = 0.0
    latency_us: float = 0.0
    perturb_seed: int = 0

    def __post_init__(self) -> None:
        b = self.batch
        if not (b in ("export", "train") or (is_stored_int(b) and b >= 1)):
            raise TravorderError(f"scenario batch must be \"export\", \"train\" or an "
                                 f"integer from 1 to 2**63 - 1, got {b!r}")
        m = self.micro_batches
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise TravorderError(f"scenario micro_batches must be an integer >= 1, got {m!r}")
        if isinstance(b, int) and m > b:
            raise TravorderError(f"scenario micro_batches {m} exceed its batch {b}: a "
                                 f"micro-batch holds one sample at least")
        f = self.memory
        if f is not None and (isinstance(f, bool) or not isinstance(f, int | float)
                              or not 0 < f <= 1):
            raise TravorderError(f"scenario memory must be a fraction in (0, 1] of the "
                                 f"single-device peak, got {f!r}")
        c = self.coarsen_max_nodes
        if c is not None and not is_stored_int(c):
            raise TravorderError(f"scenario coarsen_max_nodes must be an integer in "
                                 f"[0, 2**63), got {c!r}")
        for key, top in (("op_noise", MAX_NOISE), ("edge_noise", MAX_NOISE),
                         ("latency_us", MAX_LATENCY_US)):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= top:
                raise TravorderError(f"scenario {key} must be a number in [0, {top:g}], "
                                     f"got {v!r}")
            object.__setattr__(self, key, float(v))  # 5 and 5.0: one definition
        if not is_stored_int(self.perturb_seed):
            raise TravorderError(f"scenario perturb_seed must be an integer in [0, 2**63), "
                                 f"got {self.perturb_seed!r}")
        if not isinstance(self.name, str):
            raise TravorderError(f"scenario name must be a string, got {self.name!r}")
        if not self.name:
            object.__setattr__(self, "name", self._derived_name())

    def _derived_name(self) -> str:
        parts = [f"batch={self.batch}"]
        if self.micro_batches > 1:
            parts.append(f"mb={self.micro_batches}")
        if self.memory is not None:
            parts.append(f"mem={_exactly(self.memory)}")
        if self.coarsen_max_nodes is not None:
            parts.append(f"coarsen={self.coarsen_max_nodes}")
        for key, short in (("op_noise", "opnoise"), ("edge_noise", "edgenoise"),
                           ("latency_us", "lat"), ("perturb_seed", "pseed")):
            if getattr(self, key):
                parts.append(f"{short}={_exactly(getattr(self, key))}")
        return ",".join(parts)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "scenario") -> Scenario:
        """A scenario from a spec table; unknown keys are an error."""
        if not isinstance(data, Mapping):
            raise TravorderError(f"{where} must be a table")
        bad = sorted(set(data) - set(SCENARIO_KEYS))
        if bad:
            raise TravorderError(f"{where}: unknown scenario key {bad[0]!r} (expected "
                                 f"{', '.join(SCENARIO_KEYS)})")
        if "name" in data and not (isinstance(data["name"], str) and data["name"].strip()):
            raise TravorderError(f"{where}: scenario name must be a non-empty string (leave "
                                 f"it out to name the scenario by its settings), got "
                                 f"{data['name']!r}")
        try:
            return cls(**data)
        except TravorderError as exc:
            raise TravorderError(f"{where}: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        """The definition (what the job's config hash covers); perturbation settings only
        where they are set, so that the scenarios before them keep their definition."""
        return {k: v for k, v in dataclasses.asdict(self).items()
                if k not in _PERTURB_KEYS or v}

    def changes_from(self, before: Scenario) -> str:
        """What differs from the definition ``before``, setting by setting.

        >>> Scenario(name="s", micro_batches=4).changes_from(Scenario(name="s"))
        'micro_batches 1, now 4'
        """
        old, new = before.to_dict(), self.to_dict()
        return ", ".join(f"{k} {old.get(k)!r}, now {new.get(k)!r}"
                         for k in sorted(old.keys() | new.keys()) if old.get(k) != new.get(k))

    def unperturbed(self) -> Scenario:
        """The same scenario on the estimated costs, named by its settings: the scenario of
        a perturbed row's twin.

        >>> Scenario(batch="train", op_noise=0.2, latency_us=5).unperturbed().name
        'batch=train'
        """
        return dataclasses.replace(self, op_noise=0.0, edge_noise=0.0, latency_us=0.0,
                                   perturb_seed=0, name="")

    def batch_for(self, graph: OpGraph) -> int | None:
        """The batch ``graph`` is costed at in this scenario (None: as exported)."""
        if self.batch == "export":
            return None
        return training_batch(graph) if self.batch == "train" else int(self.batch)

    def check_batch(self, graph: OpGraph) -> None:
        """Raise the GraphError that `prepare` would for a batch ``graph`` cannot be
        scaled to, or more micro-batches than it has samples at that batch, without
        preparing it."""
        batch = self.batch_for(graph)
        if batch is not None:
            check_scalable(graph, batch)
        check_micro_batches(self.micro_batches,
                            graph.meta.get("batch_size") if batch is None else batch)

    def prepare(self, graph: OpGraph, training: bool, coarsen_max_nodes: int) -> OpGraph:
        """The graph a placer sees: batch, training step, cost noise, coarsening,
        pipelining."""
        batch = self.batch_for(graph)
        g = graph if batch is None else scale_batch(graph, batch)
        coarsen = coarsen_max_nodes if self.coarsen_max_nodes is None \
            else self.coarsen_max_nodes
        if self.op_noise or self.edge_noise:  # on the step's own ops, then coarsened
            g = perturb_costs(prepare_graph(g, training), self.op_noise, self.edge_noise,
                              self.perturb_seed)
            training = False
        return pipeline_graph(prepare_graph(g, training, coarsen), self.micro_batches)

    def cluster_for(self, prepared: OpGraph, cluster: Cluster) -> Cluster:
        """``cluster`` with every device's ``min_op_us`` set to the scenario's
        ``latency_us`` and its memory to the scenario's fraction of ``prepared``'s
        single-device peak on it (``cluster`` itself when the scenario sets neither)."""
        if self.latency_us:
            cluster = dataclasses.replace(cluster, devices=tuple(
                dataclasses.replace(d, min_op_us=float(self.latency_us))
                for d in cluster.devices))
        if self.memory is None:
            return cluster
        capacity = self.memory * single_device_peak(prepared, cluster)
        return dataclasses.replace(
            cluster, devices=tuple(dataclasses.replace(d, memory=float(capacity))
                                   for d in cluster.devices))


#: The scenario of a spec without scenarios: the graph as exported, one training step.
DEFAULT_SCENARIO = Scenario()


def row_scenario(scenario_def: str | None) -> Scenario:
    """The scenario of an exported dataset row from its ``scenario_def`` (JSON), the
    default one for a row without it (a dataset exported before scenarios).

    >>> row_scenario('{"name": "m4", "micro_batches": 4}').micro_batches
    4
    >>> row_scenario(None) == DEFAULT_SCENARIO
    True
    """
    return Scenario.from_dict(json.loads(scenario_def)) if isinstance(scenario_def, str) \
        else DEFAULT_SCENARIO


def single_device_peak(graph: OpGraph, cluster: Cluster, compiled: bool = True) -> float:
    """Peak memory (bytes) of ``graph``'s step with every node on the device `single`
    picks. ``compiled=False`` computes it without loading the compiled simulator (for
    one-off calls such as a recommendation), as `_one_device_peak` describes."""
    # the device `travorder.placement.placers.heuristics.single` picks (that package
    # loads the compiled simulator, which a one-off call need not)
    times = compute_times(graph, cluster)
    device = int(np.argmin(times.sum(axis=0))) if graph.n_nodes else 0
    if not compiled and cluster.semantics == "travorder":
        return _one_device_peak(graph, times[:, device], cluster.param_copies)
    from travorder.placement.simulator import Simulator

    placement = np.full(graph.n_nodes, device, dtype=np.int64)
    return float(Simulator(graph, cluster).run(placement).peak_memory.max(initial=0.0))


def _one_device_peak(graph: OpGraph, cost: np.ndarray, param_copies: float) -> float:
    """The simulator's peak memory (travorder semantics, docs/simulator.md) of a step run
    on one device: ops one at a time, the ready op with the earliest ready time first
    (ties by `tie_rank`); parameters held throughout; an output held from its op's start
    until its last consumer finishes (a sink's until it finishes)."""
    import heapq

    n = graph.n_nodes
    order = np.lexsort((graph.names, graph.levels))  # `tie_rank`, without its module
    rank_a = np.empty(n, dtype=np.int64)
    rank_a[order] = np.arange(n)
    rank = rank_a.tolist()
    mem = float(np.sum((graph.param_bytes * param_copies)[order]))
    peak = mem
    out = graph.output_bytes.tolist()
    waiting = graph.in_degree.tolist()
    uses = graph.out_degree.tolist()
    (sptr, sidx), (pptr, pidx) = ((a.tolist(), b.tolist()) for a, b in
                                  (graph.succ_csr, graph.pred_csr))
    cost_l = cost.tolist()
    ready = [(0.0, rank[v], v) for v in range(n) if waiting[v] == 0]
    heapq.heapify(ready)
    now = 0.0
    while ready:
        t, _, v = heapq.heappop(ready)
        now = max(now, t)
        mem += out[v]
        peak = max(peak, mem)
        now += cost_l[v]
        for u in sorted(pidx[pptr[v]:pptr[v + 1]], key=rank.__getitem__):
            uses[u] -= 1
            if uses[u] == 0:
                mem -= out[u]
        if uses[v] == 0:
            mem -= out[v]
        for w in sidx[sptr[v]:sptr[v + 1]]:
            waiting[w] -= 1
            if waiting[w] == 0:
                heapq.heappush(ready, (now, rank[w], w))
    return peak


def features_of(graph: OpGraph, cluster: Cluster, compiled: bool = True) -> dict[str, float]:
    """`travorder.featurize.scenario.scenario_features` of a prepared graph on a cluster:
    compute times on the fastest device, the single-device peak from the simulator."""
    times = compute_times(graph, cluster)
    check_in_range(graph, cluster, times)  # an overflow is no feature (log10 of 0)
    fastest = int(np.argmin(times.sum(axis=0))) if graph.n_nodes else 0
    return scenario_features(graph, cluster, times[:, fastest] if graph.n_nodes else [],
                             single_device_peak(graph, cluster, compiled))


def scenario_definitions(connection: Any, store: str) -> dict[str, Scenario]:
    """The scenarios of every study recorded in a result store's connection, by name
    (``store``, the store's path, names it in errors)."""
    return {s["name"]: Scenario.from_dict(s, f"store {store!r}, study {name!r}")
            for name, spec in connection.execute("SELECT name, spec FROM studies")
            for s in json.loads(spec).get("scenarios", [])}


def parse_scenarios(value: Any, where: str) -> tuple[Scenario, ...]:
    """The ``scenarios`` of a spec: a list of tables (``[[scenarios]]``), each one
    scenario, or one table whose keys hold lists, for their product.

    >>> [s.name for s in parse_scenarios({"batch": ["export", "train"],
    ...                                   "micro_batches": [1, 4]}, "spec")]
    ['batch=export', 'batch=export,mb=4', 'batch=train', 'batch=train,mb=4']
    """
    if isinstance(value, list):
        if not value:
            raise TravorderError(f"{where}: scenarios is an empty list")
        out = [Scenario.from_dict(item, f"{where}: scenarios[{i}]")
               for i, item in enumerate(value)]
    elif isinstance(value, Mapping):
        bad = sorted(set(value) - set(SCENARIO_KEYS) - {"name"})
        if bad or "name" in value:
            key = (bad or ["name"])[0]
            raise TravorderError(f"{where}: unknown scenario key {key!r} in [scenarios] "
                                 f"(expected {', '.join(SCENARIO_KEYS[1:])}; name a "
                                 f"scenario in a [[scenarios]] list)")
        axes = {k: v if isinstance(v, list) else [v] for k, v in value.items()}
        for k, v in axes.items():
            if not v:
                raise TravorderError(f"{where}: scenarios.{k} is an empty list")
            # a bool is no number here (True == 1): its own check names it below
            keys = [(isinstance(x, bool), x) for x in v]
            if again := [x for i, x in enumerate(v) if keys[i] in keys[:i]]:
                raise TravorderError(f"{where}: scenarios.{k} gives {again[0]!r} twice")
        out = [Scenario()]
        for key, values in axes.items():
            out = [Scenario.from_dict({**_fields(s), key: v}, f"{where}: scenarios")
                   for s in out for v in values]
    else:
        raise TravorderError(f"{where}: scenarios must be a table or a list of tables")
    names = [s.name for s in out]
    dup = sorted({x for x in names if names.count(x) > 1})
    if dup:
        raise TravorderError(f"{where}: two scenarios are named {dup[0]!r}")
    return tuple(out)


def _fields(s: Scenario) -> dict[str, Any]:
    return {k: v for k, v in s.to_dict().items()
            if k != "name" and v != getattr(DEFAULT_SCENARIO, k)}
