"""The model-graph corpus: storage on disk, its manifest, and loaders.

A corpus is a directory holding one graph per file in travorder's own format
(:mod:`travorder.graph.native`, gzipped JSON) and a manifest::

    manifest.json          {"format": "travorder.corpus", "format_version": 1,
                            "graphs": [entry, ...]}   (entries sorted by name)
    graphs/<name>.json.gz  one graph per file (name made file-safe)

Each manifest entry describes one graph: ``name``, ``family``, ``source``, ``file``
(relative to the corpus directory), ``nodes``, ``edges``, ``depth`` (levels) and
``width`` (most nodes on one level) of the stored graph, ``flops`` (forward, total),
``param_bytes``,
``builder`` and ``builder_version`` (what made it), ``coarsened`` with
``original_nodes``/``original_edges`` (graphs above ``max_nodes`` ops are stored
coarsened by :func:`travorder.graph.coarsen`, which keeps FLOPs and parameters), and
``graph_hash`` of the stored graph, checked on every load.

Writing is deterministic: the same graphs give the same bytes (gzip without a
timestamp, sorted manifest), so regenerating the bundled corpus changes no file unless
a graph changed. Writers are not meant to run concurrently on one directory.

The package bundles a corpus (real architectures and synthetic families) in
``travorder/datasets/data/corpus``; every loader reads it unless given ``corpus_dir``.

>>> entries = read_manifest()
>>> sorted(entries[0])[:4]
['builder', 'builder_version', 'coarsened', 'depth']
>>> g = load_corpus(names=[entries[0]["name"]])[0]
>>> g.n_nodes == entries[0]["nodes"]
True
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from travorder.errors import FormatError, TravorderError, check_format, parse_json, write_file
from travorder.graph.coarsen import coarsen
from travorder.graph.native import load_native, save_graph
from travorder.graph.opgraph import OpGraph

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "travorder.corpus"
MANIFEST_VERSION = 1
#: Graphs with more ops than this are stored coarsened.
DEFAULT_MAX_NODES = 2000
#: Largest share of the corpus one family may have (grouped evaluation needs balance).
MAX_FAMILY_SHARE = 0.15

CorpusDir = str | os.PathLike[str] | None


def bundled_corpus_dir() -> Path:
    """The directory of the corpus shipped in the package."""
    return Path(str(resources.files("travorder.datasets").joinpath("data", "corpus")))


def _dir(corpus_dir: CorpusDir) -> Path:
    return bundled_corpus_dir() if corpus_dir is None else Path(corpus_dir)


def read_manifest(corpus_dir: CorpusDir = None) -> list[dict[str, Any]]:
    """The manifest entries of a corpus (the bundled one by default), sorted by name."""
    path = _dir(corpus_dir) / MANIFEST_NAME
    if path.parent.exists() and not path.parent.is_dir():
        raise FormatError(f"{path.parent}: a file, not a graph corpus (a folder with "
                          f"{MANIFEST_NAME})")
    try:
        doc = parse_json(path.read_text())
    except FileNotFoundError:
        raise FormatError(f"{path.parent}: not a graph corpus (no {MANIFEST_NAME})") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"{path}: broken corpus manifest ({exc})") from None
    check_format(doc, str(path), MANIFEST_FORMAT, MANIFEST_VERSION, "corpus manifest")
    graphs = doc.get("graphs", [])
    if not isinstance(graphs, list):
        raise FormatError(f"{path}: the corpus manifest's 'graphs' must be a list of entries")
    for i, entry in enumerate(graphs, 1):
        if problem := _entry_problem(entry):
            raise FormatError(f"{path}: graph entry {i} {problem}")
    return list(graphs)


#: The type of each entry of a corpus manifest's graph (written by `_entry`).
_ENTRY_TYPES: dict[str, type | tuple[type, ...]] = {
    **dict.fromkeys(("name", "family", "source", "file", "builder", "graph_hash"), str),
    **dict.fromkeys(("nodes", "edges", "original_nodes", "original_edges", "depth",
                     "width"), int),
    "flops": (int, float), "param_bytes": (int, float), "coarsened": bool}


def _entry_problem(entry: Any) -> str:
    """What is wrong with a manifest's graph entry (``""``: nothing)."""
    if not isinstance(entry, dict):
        return "is not an object"
    for key, kind in _ENTRY_TYPES.items():
        value = entry.get(key)
        if value is None:
            return f"has no {key!r}"
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return f"({entry.get('name')!r}) has a {key!r} of the wrong type: {value!r}"
    file = Path(entry["file"])
    if file.is_absolute() or ".." in file.parts:
        return f"({entry['name']!r}) has a file outside the corpus: {entry['file']!r}"
    return ""


def _write_manifest(corpus_dir: Path, entries: Iterable[Mapping[str, Any]]) -> None:
    rows = sorted(entries, key=lambda e: e["name"])
    lines = ",\n".join(json.dumps(dict(e), sort_keys=True) for e in rows)  # a line per graph
    text = (f'{{"format": "{MANIFEST_FORMAT}", "format_version": {MANIFEST_VERSION}, '
            f'"graphs": [\n{lines}\n]}}\n')
    write_file(corpus_dir / MANIFEST_NAME, text, "corpus manifest")


def _file_name(name: str) -> str:
    return "graphs/" + re.sub(r"[^A-Za-z0-9._-]+", "_", name) + ".json.gz"


def _entry(stored: OpGraph, original: OpGraph) -> dict[str, Any]:
    """The manifest entry for ``original`` stored as ``stored`` (itself or its coarsening)."""
    levels = stored.levels
    missing = [k for k in ("name", "family", "source", "builder") if not original.meta.get(k)]
    if missing:
        raise TravorderError(f"graph {original.name or '(unnamed)'!r} has no "
                             f"{', '.join(missing)} in its meta; the corpus needs them")
    meta = original.meta
    return {
        "name": str(meta["name"]), "family": str(meta["family"]),
        "source": str(meta["source"]), "file": _file_name(str(meta["name"])),
        "nodes": stored.n_nodes, "edges": stored.n_edges,
        "depth": int(levels.max()) + 1 if levels.size else 0,
        "width": int(np.bincount(levels).max()) if levels.size else 0,
        "flops": float(original.flops.sum()), "param_bytes": float(original.param_bytes.sum()),
        "builder": str(meta["builder"]), "builder_version": meta.get("builder_version"),
        "coarsened": stored.n_nodes != original.n_nodes,
        "original_nodes": original.n_nodes, "original_edges": original.n_edges,
        "graph_hash": stored.graph_hash,
    }


def add_to_corpus(graphs: Iterable[OpGraph], corpus_dir: str | os.PathLike[str], *,
                  max_nodes: int = DEFAULT_MAX_NODES) -> list[dict[str, Any]]:
    """Store ``graphs`` in the corpus at ``corpus_dir`` (created if needed) and list them
    in its manifest; a graph with the name of one already there replaces it.

    Each graph's meta must carry ``name``, ``family``, ``source`` and ``builder`` (and
    should carry ``builder_version``). Graphs with more than ``max_nodes`` ops are stored
    coarsened to ``max_nodes``. Returns the new manifest entries.
    """
    if not isinstance(max_nodes, (int, np.integer)) or max_nodes < 1:
        raise TravorderError(f"max_nodes must be a positive integer, got {max_nodes!r}")
    root = Path(corpus_dir)
    entries = {e["name"]: e for e in read_manifest(root)} if (root / MANIFEST_NAME).exists() \
        else {}
    new: dict[str, tuple[dict[str, Any], OpGraph]] = {}
    for g in graphs:  # check everything before writing anything
        stored = coarsen(g, max_nodes).graph if g.n_nodes > max_nodes else g
        entry = _entry(stored, g)
        if entry["name"] in new:
            raise TravorderError(f"two graphs named {entry['name']!r}")
        clash = next((e["name"] for e in [*entries.values(), *(e for e, _ in new.values())]
                      if e["file"] == entry["file"] and e["name"] != entry["name"]), None)
        if clash is not None:
            raise TravorderError(f"graph names {clash!r} and {entry['name']!r} map to the "
                                 f"same file {entry['file']}")
        new[entry["name"]] = (entry, stored)
    try:
        (root / "graphs").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TravorderError(f"cannot make the corpus folder {str(root)!r}: "
                             f"{exc.strerror}") from None
    for entry, stored in new.values():
        save_graph(stored, root / entry["file"])
    entries.update((name, entry) for name, (entry, _) in new.items())
    _write_manifest(root, entries.values())
    return [entry for entry, _ in new.values()]


def remove_from_corpus(corpus_dir: str | os.PathLike[str], *,
                       families: Iterable[str] | str | None = None,
                       sources: Iterable[str] | str | None = None,
                       names: Iterable[str] | str | None = None) -> list[str]:
    """Delete the graphs that match every given filter (as in :func:`select_entries`)
    from the corpus and return their names. No filter at all, or a filter value that no
    graph has, removes nothing."""
    root = Path(corpus_dir)
    entries = read_manifest(root)
    if families is None and sources is None and names is None:
        return []
    gone = select_entries(entries, families=families, sources=sources, names=names,
                          strict=False)
    gone_names = {e["name"] for e in gone}
    _write_manifest(root, [e for e in entries if e["name"] not in gone_names])
    for e in gone:
        (root / e["file"]).unlink(missing_ok=True)
    return sorted(gone_names)


def _as_set(values: Iterable[str] | str | None) -> set[str] | None:
    if values is None:
        return None
    return {values} if isinstance(values, str) else {str(v) for v in values}


def _source_matches(source: str, wanted: set[str]) -> bool:
    return any(source == w or source.startswith(w + ":") for w in wanted)


def select_entries(entries: Iterable[Mapping[str, Any]], *,
                   families: Iterable[str] | str | None = None,
                   sources: Iterable[str] | str | None = None,
                   max_nodes: int | None = None,
                   names: Iterable[str] | str | None = None,
                   strict: bool = True) -> list[dict[str, Any]]:
    """The entries matching every given filter: ``family`` in ``families``, ``source``
    equal to or under one of ``sources`` (``"synthetic"`` matches
    ``"synthetic:resnet"``), stored ``nodes <= max_nodes``, ``name`` in ``names``.

    With ``strict``, a family, source or name that matches no entry at all is an error
    (a typo would otherwise select nothing silently).

    >>> rows = [{"name": "a", "family": "resnet", "source": "synthetic:resnet", "nodes": 9},
    ...         {"name": "b", "family": "vit", "source": "timm:vit_tiny", "nodes": 90}]
    >>> [e["name"] for e in select_entries(rows, sources="timm")]
    ['b']
    >>> [e["name"] for e in select_entries(rows, max_nodes=50)]
    ['a']
    """
    rows = [dict(e) for e in entries]
    fams, srcs, wanted = _as_set(families), _as_set(sources), _as_set(names)
    if strict:
        _check_known(rows, fams, srcs, wanted)
    if max_nodes is not None and (not isinstance(max_nodes, (int, np.integer))
                                  or max_nodes < 1):
        raise TravorderError(f"max_nodes must be a positive integer, got {max_nodes!r}")
    return [e for e in rows
            if (fams is None or e["family"] in fams)
            and (srcs is None or _source_matches(e["source"], srcs))
            and (max_nodes is None or e["nodes"] <= max_nodes)
            and (wanted is None or e["name"] in wanted)]


def _check_known(rows: list[dict[str, Any]], fams: set[str] | None, srcs: set[str] | None,
                 wanted: set[str] | None) -> None:
    for label, chosen, have in (("family", fams, {e["family"] for e in rows}),
                                ("name", wanted, {e["name"] for e in rows})):
        unknown = sorted((chosen or set()) - have)
        if unknown:
            raise TravorderError(f"no graph in the corpus has {label} {unknown[0]!r}")
    for s in sorted(srcs or ()):
        if not any(_source_matches(e["source"], {s}) for e in rows):
            raise TravorderError(f"no graph in the corpus has source {s!r}")


def load_corpus(families: Iterable[str] | str | None = None,
                sources: Iterable[str] | str | None = None,
                max_nodes: int | None = None,
                names: Iterable[str] | str | None = None,
                corpus_dir: CorpusDir = None) -> list[OpGraph]:
    """Load the corpus graphs matching the filters of :func:`select_entries`, in name
    order, from the bundled corpus or ``corpus_dir``. ``max_nodes`` selects graphs by
    their stored size; it does not coarsen.

    Raises :class:`~travorder.errors.FormatError` if a stored graph does not match its
    manifest entry.
    """
    root = _dir(corpus_dir)
    graphs = []
    for e in select_entries(read_manifest(root), families=families, sources=sources,
                            max_nodes=max_nodes, names=names):
        g = load_native(root / e["file"])
        if g.graph_hash != e["graph_hash"]:
            raise FormatError(f"{root / e['file']}: graph does not match the corpus manifest")
        graphs.append(g)
    return graphs


def corpus_families(corpus_dir: CorpusDir = None) -> list[str]:
    """The families in a corpus (the bundled one by default), sorted."""
    return sorted({e["family"] for e in read_manifest(corpus_dir)})


def family_shares(entries: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Each family's share of the graphs, largest first.

    >>> family_shares([{"family": "a"}, {"family": "b"}, {"family": "a"}, {"family": "c"}])
    {'a': 0.5, 'b': 0.25, 'c': 0.25}
    """
    counts = Counter(e["family"] for e in entries)
    total = sum(counts.values())
    return {f: n / total for f, n in counts.most_common()}
