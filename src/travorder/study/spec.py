"""Study specs: which graphs, clusters, orders, placer and seeds a study runs.

A spec is a TOML file (paths in it are relative to the file)::

    name = "greedy-corpus"            # required
    description = "..."               # optional
    orders = "all"                    # "all", "study" (the study's six) or a list of names
    seeds = [0]                       # a list of seeds, or n for 0..n-1
    clusters = ["k80x3", "my.toml"]   # preset names or cluster files

    [order_seeds]                     # optional: other seeds for some orders
    random = [0, 1, 2]

    [placer]
    name = "greedy"                   # a name in PLACERS
    options = {}                      # passed to the placer (its budget, e.g. episodes)

    [graphs]
    training = true                   # expand forward graphs to training-step graphs
    coarsen_max_nodes = 1000          # coarsen bigger graphs to this many nodes (0: never)
    corpus = {families = ["resnet"], max_nodes = 500}   # or true (all); keys: families,
                                      # sources, names, max_nodes, dir
    files = ["model.onnx", {path = "g.json.gz", family = "cnn"}]
    synthetic = [{family = "chain", seeds = [0, 1], params = {n_layers = 8}}]

    [[scenarios]]                     # optional, see travorder.study.scenarios; or one
    batch = "train"                   # [scenarios] table of lists for their product
    micro_batches = 4                 # also: memory, coarsen_max_nodes, name, and cost
    op_noise = 0.2                    # perturbation: op_noise, edge_noise, latency_us,
    latency_us = 5.0                  # perturb_seed

The jobs are the product graphs x scenarios x clusters x orders x seeds (an order's seeds
come from ``order_seeds`` when it is listed there). Every problem in a spec is one
:class:`~travorder.errors.TravorderError` naming the file and the setting.

>>> spec = StudySpec.from_dict({"name": "s", "clusters": ["k80x3"], "orders": ["topo"],
...     "placer": {"name": "greedy"},
...     "graphs": {"synthetic": [{"family": "chain", "seeds": [0, 1]}]}})
>>> [g.meta["seed"] for g in spec.select_graphs()], spec.seeds_for("topo")
([0, 1], (0,))
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import tomllib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from travorder.errors import FormatError, TravorderError, check_regular, read_text
from travorder.graph import OpGraph, load_graph
from travorder.placement import ORDERS, PLACERS, STUDY_ORDERS, Cluster, load_cluster
from travorder.placement.placers import canonical_options
from travorder.study.scenarios import (
    DEFAULT_SCENARIO,
    Scenario,
    is_stored_int,
    parse_scenarios,
)

_TOP_KEYS = ("name", "description", "orders", "seeds", "clusters", "order_seeds", "placer",
             "graphs", "scenarios")
_GRAPH_KEYS = ("training", "coarsen_max_nodes", "corpus", "files", "synthetic")
_CORPUS_KEYS = ("families", "sources", "names", "max_nodes", "dir")


@dataclass(frozen=True)
class SyntheticSelection:
    """Graphs from a synthetic family: ``family``'s generator with each of ``seeds`` and
    the keyword ``params``."""

    family: str
    seeds: tuple[int, ...]
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FileSelection:
    """A graph file; ``family`` overrides the family in the file's metadata."""

    path: Path
    family: str | None = None


@dataclass(frozen=True)
class StudySpec:
    """A parsed, validated study spec (see the module docstring for the format)."""

    name: str
    clusters: tuple[Cluster, ...]
    orders: tuple[str, ...]
    seeds: tuple[int, ...]
    placer: str
    placer_options: Mapping[str, Any] = field(default_factory=dict)
    order_seeds: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    training: bool = True
    coarsen_max_nodes: int = 0
    corpus: Mapping[str, Any] | None = None
    files: tuple[FileSelection, ...] = ()
    synthetic: tuple[SyntheticSelection, ...] = ()
    scenarios: tuple[Scenario, ...] = (DEFAULT_SCENARIO,)
    description: str = ""
    source: str = "spec"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], base_dir: str | os.PathLike[str] = ".",
                  source: str = "spec") -> StudySpec:
        """Validate a spec document; relative paths are taken from ``base_dir``."""
        return _parse(data, Path(base_dir), source)

    def seeds_for(self, order: str) -> tuple[int, ...]:
        """The seeds that `order` runs with."""
        return self.order_seeds.get(order, self.seeds)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready canonical form (clusters by their full definition)."""
        return {
            "name": self.name, "description": self.description,
            "clusters": [c.to_dict() for c in self.clusters], "orders": list(self.orders),
            "seeds": list(self.seeds),
            "order_seeds": {k: list(v) for k, v in sorted(self.order_seeds.items())},
            "placer": {"name": self.placer, "options": dict(self.placer_options)},
            "scenarios": [s.to_dict() for s in self.scenarios],
            "graphs": {
                "training": self.training, "coarsen_max_nodes": self.coarsen_max_nodes,
                "corpus": None if self.corpus is None else dict(self.corpus),
                "files": [{"path": str(f.path), "family": f.family} for f in self.files],
                "synthetic": [{"family": s.family, "seeds": list(s.seeds),
                               "params": dict(s.params)} for s in self.synthetic],
            },
        }

    @property
    def spec_hash(self) -> str:
        """SHA-256 (hex) of the canonical form: equal specs, equal hash."""
        return _hash(self.to_dict())

    def select_graphs(self) -> list[OpGraph]:
        """The spec's forward graphs as selected (before `prepare_graph`), corpus first,
        then files, then synthetic graphs. Two graphs with one name are an error."""
        graphs: list[OpGraph] = []
        if self.corpus is not None:
            from travorder.datasets.corpus import load_corpus

            filters = {k: v for k, v in self.corpus.items() if k != "dir"}
            with self._naming("graphs.corpus"):
                graphs += load_corpus(corpus_dir=self.corpus.get("dir"), **filters)
                if not graphs:
                    raise TravorderError(f"no graph of the corpus passes {filters}")
        for f in self.files:
            with self._naming("graphs.files"):
                g = load_graph(f.path)
            meta = {"name": g.name or f.path.name, "source": g.meta.get("source") or
                    str(f.path)}
            if f.family is not None:
                meta["family"] = f.family
            graphs.append(g.replace(meta={**g.meta, **meta}))
        if self.synthetic:
            from travorder.datasets.synthetic import SYNTHETIC_FAMILIES

            for s in self.synthetic:
                gen = SYNTHETIC_FAMILIES[s.family]
                with self._naming(f"graphs.synthetic family {s.family!r}"):
                    for seed in s.seeds:
                        try:
                            graphs.append(gen(seed=seed, **s.params))
                        except TypeError as exc:  # a parameter of the wrong type
                            raise TravorderError(str(exc)) from None
        seen: set[str] = set()
        for g in graphs:
            if g.name in seen:
                raise TravorderError(f"{self.source}: two selected graphs are named "
                                     f"{g.name!r}")
            seen.add(g.name)
        return graphs

    @contextmanager
    def _naming(self, setting: str) -> Iterator[None]:
        """Errors inside name this spec and ``setting``."""
        try:
            yield
        except TravorderError as exc:
            raise type(exc)(f"{self.source}: {setting}: {exc}") from None

    def prepare(self, graph: OpGraph, scenario: Scenario = DEFAULT_SCENARIO) -> OpGraph:
        """The graph placed in ``scenario``: `Scenario.prepare` with this spec's settings."""
        return scenario.prepare(graph, self.training, self.coarsen_max_nodes)


def load_spec(path: str | os.PathLike[str]) -> StudySpec:
    """Read and validate a TOML spec file."""
    p = Path(path)
    text = read_text(p, "study spec")
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        raise FormatError(f"study spec {str(p)!r} is not valid TOML: {exc}") from None
    return StudySpec.from_dict(data, p.parent, source=f"study spec {str(p)!r}")


def _looks_typed(text: str) -> str:
    """``"number"`` or ``"boolean"`` if TOML would read ``text`` unquoted as one, else
    ``""``.

    >>> _looks_typed("5"), _looks_typed("1e-3"), _looks_typed("true"), _looks_typed("gcn")
    ('number', 'number', 'boolean', '')
    """
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return ""
    return {bool: "boolean", int: "number", float: "number"}.get(type(value), "")


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def _unknown(data: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    bad = sorted(set(data) - set(allowed))
    if bad:
        raise TravorderError(f"{where}: unknown setting {bad[0]!r} (expected "
                             f"{', '.join(allowed)})")


def _table(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TravorderError(f"{where} must be a table")
    return value


def _seeds(value: Any, where: str) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        if not 1 <= value <= 10_000:  # 10**9 seeds would be built before anything ran
            raise TravorderError(f"{where} must be a positive count (at most 10000) or a "
                                 f"list of seeds, got {value}")
        return tuple(range(value))
    if (not isinstance(value, list) or not value
            or not all(is_stored_int(s) for s in value)):
        raise TravorderError(f"{where} must be a positive count or a non-empty list of "
                             f"integers in [0, 2**63), got {value!r}")
    if len(set(value)) != len(value):
        raise TravorderError(f"{where} lists a seed twice: {value!r}")
    return tuple(value)


def _names(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise TravorderError(f"{where} must be a non-empty list of names, got {value!r}")
    if len(set(value)) != len(value):
        raise TravorderError(f"{where} lists a name twice: {value!r}")
    return value


def _orders(value: Any, where: str) -> tuple[str, ...]:
    if value == "all":
        return tuple(ORDERS)
    if value == "study":
        return tuple(STUDY_ORDERS)
    names = _names(value, f"{where}: orders (or \"all\" / \"study\")")
    for name in names:
        if name not in ORDERS:
            raise TravorderError(f"{where}: unknown order {name!r} (valid: "
                                 f"{', '.join(ORDERS)})")
    return tuple(names)


def _clusters(value: Any, base: Path, where: str) -> tuple[Cluster, ...]:
    out: list[Cluster] = []
    for item in _names(value, f"{where}: clusters"):
        path = base / item
        try:
            c = load_cluster(item if path.suffix.lower() not in (".toml", ".json")
                             else path)
        except TravorderError as exc:
            raise type(exc)(f"{where}: {exc}") from None
        if any(o.name == c.name for o in out):
            raise TravorderError(f"{where}: two clusters are named {c.name!r}")
        out.append(c)
    return tuple(out)


def _corpus(value: Any, base: Path, where: str) -> Mapping[str, Any] | None:
    if value is False:
        return None
    if value is True:
        return {}
    table = dict(_table(value, f"{where}: graphs.corpus (or true)"))
    _unknown(table, _CORPUS_KEYS, f"{where}: graphs.corpus")
    for key in ("families", "sources", "names"):
        if key in table:
            table[key] = _names(table[key], f"{where}: graphs.corpus.{key}")
    if "max_nodes" in table:
        m = table["max_nodes"]
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise TravorderError(f"{where}: graphs.corpus.max_nodes must be a positive "
                                 f"integer, got {m!r}")
    if "dir" in table:
        if not isinstance(table["dir"], str):
            raise TravorderError(f"{where}: graphs.corpus.dir must be a path")
        table["dir"] = str(base / table["dir"])
    return table


def _files(value: Any, base: Path, where: str) -> tuple[FileSelection, ...]:
    if not isinstance(value, list):
        raise TravorderError(f"{where}: graphs.files must be a list")
    out = []
    for item in value:
        if isinstance(item, str):
            item = {"path": item}
        item = _table(item, f"{where}: a graphs.files entry (a path or {{path, family}})")
        _unknown(item, ("path", "family"), f"{where}: graphs.files entry")
        if not isinstance(item.get("path"), str):
            raise TravorderError(f"{where}: a graphs.files entry has no path")
        family = item.get("family")
        if family is not None and not (isinstance(family, str) and family.strip()):
            raise TravorderError(f"{where}: graphs.files family must be a non-empty string "
                                 f"(leave it out for the graph's own), got {family!r}")
        path = base / item["path"]
        if path.is_dir():
            raise FormatError(f"{where}: {str(path)!r} is a folder, not a graph file")
        if not path.is_file():
            check_regular(path, "graph file")
            raise FormatError(f"{where}: no such graph file {str(path)!r}")
        out.append(FileSelection(path, family))
    return tuple(out)


def _synthetic(value: Any, where: str) -> tuple[SyntheticSelection, ...]:
    from travorder.datasets.synthetic import SYNTHETIC_FAMILIES

    if not isinstance(value, list):
        raise TravorderError(f"{where}: graphs.synthetic must be a list of tables")
    out = []
    for item in value:
        item = _table(item, f"{where}: a graphs.synthetic entry")
        _unknown(item, ("family", "seeds", "params"), f"{where}: graphs.synthetic entry")
        family = item.get("family")
        if family is None:
            raise TravorderError(f"{where}: a graphs.synthetic entry lacks its family (one "
                                 f"of {', '.join(SYNTHETIC_FAMILIES)})")
        if not isinstance(family, str) or family not in SYNTHETIC_FAMILIES:
            raise TravorderError(f"{where}: unknown synthetic family {family!r} (valid: "
                                 f"{', '.join(SYNTHETIC_FAMILIES)})")
        seeds = _seeds(item.get("seeds", [0]), f"{where}: graphs.synthetic {family} seeds")
        params = _table(item.get("params", {}), f"{where}: graphs.synthetic {family} params")
        takes = tuple(p for p in inspect.signature(SYNTHETIC_FAMILIES[family]).parameters
                      if p != "seed")
        _unknown(params, takes, f"{where}: graphs.synthetic {family} params")
        out.append(SyntheticSelection(family, seeds, dict(params)))
    return tuple(out)


def _parse(data: Mapping[str, Any], base: Path, where: str) -> StudySpec:
    data = _table(data, where)
    _unknown(data, _TOP_KEYS, where)
    for key in ("name", "clusters", "orders", "placer", "graphs"):
        if key not in data:
            raise TravorderError(f"{where}: missing setting {key!r}")
    name = data["name"]
    if not isinstance(name, str) or not name:
        raise TravorderError(f"{where}: name must be a non-empty string")
    orders = _orders(data["orders"], where)
    seeds = _seeds(data.get("seeds", [0]), f"{where}: seeds")
    order_seeds = {}
    for order, value in _table(data.get("order_seeds", {}), f"{where}: order_seeds").items():
        if order not in orders:
            raise TravorderError(f"{where}: order_seeds names {order!r}, which is not in "
                                 f"the study's orders")
        order_seeds[order] = _seeds(value, f"{where}: order_seeds.{order}")

    placer = _table(data["placer"], f"{where}: placer")
    _unknown(placer, ("name", "options"), f"{where}: placer")
    if not isinstance(placer.get("name"), str) or placer["name"] not in PLACERS:
        raise TravorderError(f"{where}: unknown placer {placer.get('name')!r} (valid: "
                             f"{', '.join(sorted(PLACERS))})")
    options = dict(_table(placer.get("options", {}), f"{where}: placer.options"))

    def quoted(kinds: Callable[[str, Any], str]) -> None:
        for key, value in options.items():
            if isinstance(value, str) and (kind := kinds(key, value)):
                raise TravorderError(f"{where}: placer.options.{key} is the string "
                                     f"{value!r}: write it as a {kind}, without quotes")

    quoted(lambda _, value: _looks_typed(value))  # before the placer reads "false" as text
    try:
        canonical = canonical_options(placer["name"], options)
    except TravorderError as exc:
        raise TravorderError(f"{where}: placer.options: {exc}") from None
    # and what the command line's -O reads from text, as rl's "yes" for true
    quoted(lambda key, _: "" if isinstance(canonical[key], str) else
           "boolean (true or false)" if isinstance(canonical[key], bool) else "number")
    options = canonical

    graphs = _table(data["graphs"], f"{where}: graphs")
    _unknown(graphs, _GRAPH_KEYS, f"{where}: graphs")
    training = graphs.get("training", True)
    if not isinstance(training, bool):
        raise TravorderError(f"{where}: graphs.training must be true or false")
    max_nodes = graphs.get("coarsen_max_nodes", 0)
    if not is_stored_int(max_nodes):
        raise TravorderError(f"{where}: graphs.coarsen_max_nodes must be an integer in "
                             f"[0, 2**63) (0: never coarsen), got {max_nodes!r}")
    corpus = _corpus(graphs.get("corpus", False), base, where)
    files = _files(graphs.get("files", []), base, where)
    synthetic = _synthetic(graphs.get("synthetic", []), where)
    if corpus is None and not files and not synthetic:
        raise TravorderError(f"{where}: graphs selects nothing (give corpus, files or "
                             f"synthetic)")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise TravorderError(f"{where}: description must be a string")
    scenarios = (parse_scenarios(data["scenarios"], where) if "scenarios" in data
                 else (DEFAULT_SCENARIO,))
    return StudySpec(
        name=name, clusters=_clusters(data["clusters"], base, where), orders=orders,
        seeds=seeds, placer=placer["name"], placer_options=options, order_seeds=order_seeds,
        training=training, coarsen_max_nodes=max_nodes, corpus=corpus, files=files,
        synthetic=synthetic, scenarios=scenarios, description=description, source=where,
    )
