"""The graph corpus: storage, manifest, loaders, and the corpus bundled in the package."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest

from travorder.datasets.corpus import (
    DEFAULT_MAX_NODES,
    MANIFEST_NAME,
    MAX_FAMILY_SHARE,
    add_to_corpus,
    bundled_corpus_dir,
    corpus_families,
    family_shares,
    load_corpus,
    read_manifest,
    remove_from_corpus,
    select_entries,
)
from travorder.datasets.synthetic import (
    SYNTHETIC_FAMILIES,
    SYNTHETIC_SET,
    build_synthetic_corpus,
    chain,
    rnn,
)
from travorder.errors import FormatError, TravorderError
from travorder.graph.opgraph import OpGraph


def diamond(name: str = "diamond", family: str = "toy", source: str = "test:diamond",
            **meta: object) -> OpGraph:
    return OpGraph.from_records(
        [{"name": "a", "op_type": "Conv", "flops": 100, "output_bytes": 8, "param_bytes": 40},
         {"name": "b", "op_type": "Relu", "flops": 2, "output_bytes": 8},
         {"name": "c", "op_type": "Relu", "flops": 3, "output_bytes": 8},
         {"name": "d", "op_type": "Add", "flops": 5, "output_bytes": 8}],
        [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")],
        **{"name": name, "family": family, "source": source, "builder": "test",
           "builder_version": 2, **meta},
    )


# ---------------------------------------------------------------- storage
def test_round_trip_and_manifest_entry(tmp_path: Path) -> None:
    g = diamond()
    (entry,) = add_to_corpus([g], tmp_path)
    assert entry == {
        "name": "diamond", "family": "toy", "source": "test:diamond",
        "file": "graphs/diamond.json.gz", "nodes": 4, "edges": 4, "depth": 3, "width": 2,
        "flops": 110.0, "param_bytes": 40.0, "builder": "test", "builder_version": 2,
        "coarsened": False, "original_nodes": 4, "original_edges": 4,
        "graph_hash": g.graph_hash,
    }
    assert read_manifest(tmp_path) == [entry]
    (back,) = load_corpus(corpus_dir=tmp_path)
    assert back == g and dict(back.meta) == dict(g.meta)


def test_large_graphs_are_stored_coarsened(tmp_path: Path) -> None:
    g = rnn(0, timesteps=3, cell_nodes=3)
    assert g.n_nodes > 40
    (entry,) = add_to_corpus([g], tmp_path, max_nodes=40)
    assert entry["coarsened"] is True
    assert (entry["original_nodes"], entry["original_edges"]) == (g.n_nodes, g.n_edges)
    (stored,) = load_corpus(corpus_dir=tmp_path)
    assert stored.n_nodes == entry["nodes"] <= 40
    assert stored.meta["family"] == "rnn" and stored.meta["coarsened_from_nodes"] == g.n_nodes
    assert entry["flops"] == pytest.approx(stored.flops.sum()) == pytest.approx(g.flops.sum())
    assert entry["param_bytes"] == pytest.approx(stored.param_bytes.sum())


def test_writing_is_reproducible(tmp_path: Path) -> None:
    graphs = [diamond(), chain(1, n_layers=3), rnn(0, timesteps=3, cell_nodes=3)]
    for d in ("one", "two"):
        add_to_corpus(graphs, tmp_path / d, max_nodes=40)
    files = sorted(p.relative_to(tmp_path / "one") for p in (tmp_path / "one").rglob("*")
                   if p.is_file())
    assert len(files) == 4
    for f in files:
        assert (tmp_path / "one" / f).read_bytes() == (tmp_path / "two" / f).read_bytes()


def test_add_replaces_by_name_and_keeps_others(tmp_path: Path) -> None:
    add_to_corpus([diamond(), diamond("other")], tmp_path)
    add_to_corpus([diamond(family="toy2")], tmp_path)
    assert [(e["name"], e["family"]) for e in read_manifest(tmp_path)] == [
        ("diamond", "toy2"), ("other", "toy")]


def test_remove(tmp_path: Path) -> None:
    add_to_corpus([diamond("a1", source="synthetic:x"), diamond("a2", source="synthetic:y"),
                   diamond("z", source="synthetic_other")], tmp_path)
    assert remove_from_corpus(tmp_path) == []
    assert remove_from_corpus(tmp_path, sources="nothing") == []
    assert remove_from_corpus(tmp_path, sources="synthetic") == ["a1", "a2"]
    assert [e["name"] for e in read_manifest(tmp_path)] == ["z"]
    assert sorted(p.name for p in (tmp_path / "graphs").iterdir()) == ["z.json.gz"]


@pytest.mark.parametrize(("graphs", "message"), [
    ([diamond(), diamond()], "two graphs named 'diamond'"),
    ([diamond("a b"), diamond("a/b")], "'a b' and 'a/b' map to the same file"),
    ([diamond(family=None)], "has no family in its meta"),
    ([diamond(builder="")], "has no builder in its meta"),
])
def test_add_refuses(tmp_path: Path, graphs: list[OpGraph], message: str) -> None:
    with pytest.raises(TravorderError, match=message):
        add_to_corpus(graphs, tmp_path)
    assert not (tmp_path / "graphs").exists()  # nothing half-written, not even a folder


def test_bad_max_nodes(tmp_path: Path) -> None:
    with pytest.raises(TravorderError, match="max_nodes must be a positive integer"):
        add_to_corpus([diamond()], tmp_path, max_nodes=0)


def test_unreadable_corpora(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="not a graph corpus"):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(FormatError, match="broken corpus manifest"):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text('{"format": "travorder.corpus", "format_version": 9}')
    with pytest.raises(FormatError, match="version 9 is not supported"):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text('{"format": "something"}')
    with pytest.raises(FormatError, match="not a travorder corpus manifest"):
        read_manifest(tmp_path)


def test_a_changed_graph_file_is_detected(tmp_path: Path) -> None:
    add_to_corpus([diamond()], tmp_path)
    path = tmp_path / "graphs" / "diamond.json.gz"
    doc = json.loads(gzip.decompress(path.read_bytes()))
    doc["nodes"]["flops"][0] = 1.0
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    with pytest.raises(FormatError, match="does not match the corpus manifest"):
        load_corpus(corpus_dir=tmp_path)


# ---------------------------------------------------------------- selection
@pytest.fixture
def small_corpus(tmp_path: Path) -> Path:
    add_to_corpus([diamond("d1", family="f1", source="synthetic:f1"),
                   diamond("d2", family="f2", source="timm:vit"),
                   chain(0, n_layers=4, kind="mlp", name="c1")], tmp_path)
    return tmp_path


@pytest.mark.parametrize(("graphs", "message"), [
    ("abc", "'graphs' must be a list of entries"),
    ([5], "graph entry 1 is not an object"),
    ([{"name": "x"}], "graph entry 1 has no 'family'"),
    ({"nodes": "9"}, "graph entry 2 ('d1') has a 'nodes' of the wrong type: '9'"),
    ({"coarsened": 1}, "has a 'coarsened' of the wrong type"),
    ({"file": "../../elsewhere.json.gz"}, "has a file outside the corpus"),
])
def test_malformed_manifest_entries(small_corpus: Path, graphs: object, message: str
                                    ) -> None:
    doc = json.loads((small_corpus / MANIFEST_NAME).read_text())
    if isinstance(graphs, dict):  # a change to d1's entry, after c1's
        graphs = [doc["graphs"][0], doc["graphs"][1] | graphs]
    (small_corpus / MANIFEST_NAME).write_text(json.dumps(doc | {"graphs": graphs}))
    with pytest.raises(FormatError, match=re.escape(message)):
        read_manifest(small_corpus)


@pytest.mark.parametrize(("filters", "names"), [
    ({}, ["c1", "d1", "d2"]),
    ({"families": ["f1", "chain"]}, ["c1", "d1"]),
    ({"families": "f2"}, ["d2"]),
    ({"sources": "synthetic"}, ["c1", "d1"]),
    ({"sources": ["timm:vit"]}, ["d2"]),
    ({"max_nodes": 4}, ["d1", "d2"]),
    ({"names": ["d2", "c1"]}, ["c1", "d2"]),
    ({"families": "f1", "sources": "timm"}, []),
])
def test_filters(small_corpus: Path, filters: dict, names: list[str]) -> None:
    assert [g.name for g in load_corpus(corpus_dir=small_corpus, **filters)] == names


@pytest.mark.parametrize(("filters", "message"), [
    ({"families": ["f1", "resnt"]}, "no graph in the corpus has family 'resnt'"),
    ({"sources": "synth"}, "no graph in the corpus has source 'synth'"),
    ({"names": "c2"}, "no graph in the corpus has name 'c2'"),
    ({"max_nodes": 0}, "max_nodes must be a positive integer"),
])
def test_filters_refuse_unknown_values(small_corpus: Path, filters: dict, message: str) -> None:
    with pytest.raises(TravorderError, match=message):
        load_corpus(corpus_dir=small_corpus, **filters)


def test_corpus_families(small_corpus: Path) -> None:
    assert corpus_families(small_corpus) == ["chain", "f1", "f2"]


def test_select_entries_without_strictness() -> None:
    rows = [{"name": "a", "family": "f", "source": "s", "nodes": 1}]
    assert select_entries(rows, families="g", strict=False) == []


def test_family_shares() -> None:
    rows = [{"family": f} for f in "aabaca"]
    assert family_shares(rows) == {"a": 4 / 6, "b": 1 / 6, "c": 1 / 6}
    balanced = [{"family": f"f{i % 8}"} for i in range(80)]
    assert max(family_shares(balanced).values()) == 0.125 <= MAX_FAMILY_SHARE
    assert max(family_shares([*balanced, *[{"family": "f0"}] * 5]).values()) > MAX_FAMILY_SHARE


# ---------------------------------------------------------------- the bundled corpus
def test_bundled_corpus_loads_and_matches_its_manifest() -> None:
    root = bundled_corpus_dir()
    entries = read_manifest()
    graphs = load_corpus()  # validates every graph and checks its hash
    assert [g.name for g in graphs] == [e["name"] for e in entries]
    for g, e in zip(graphs, entries, strict=True):
        assert (g.meta["family"], g.meta["source"]) == (e["family"], e["source"])
        assert (g.n_nodes, g.n_edges) == (e["nodes"], e["edges"])
        assert g.n_nodes <= DEFAULT_MAX_NODES
        assert e["coarsened"] == (e["original_nodes"] > e["nodes"])
        assert e["flops"] == pytest.approx(g.flops.sum())
        assert (e["depth"], e["width"]) == (g.levels.max() + 1, np.bincount(g.levels).max())
    stored = {p.relative_to(root).as_posix() for p in (root / "graphs").iterdir()}
    assert stored == {e["file"] for e in entries}  # no file left out, none left over


def test_bundled_corpus_is_balanced_and_small() -> None:
    entries = read_manifest()
    assert max(family_shares(entries).values()) <= MAX_FAMILY_SHARE
    root = bundled_corpus_dir()
    assert sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) < 30e6


def test_bundled_synthetic_part() -> None:
    entries = select_entries(read_manifest(), sources="synthetic")
    counts = {f: sum(e["family"] == f for e in entries) for f in SYNTHETIC_FAMILIES}
    assert counts == {f: len(specs) for f, specs in SYNTHETIC_SET.items()}
    sizes = [e["original_nodes"] for e in entries]
    assert min(sizes) <= 30 and max(sizes) >= DEFAULT_MAX_NODES
    assert any(e["coarsened"] for e in entries)


def test_bundled_synthetic_part_regenerates_byte_for_byte(tmp_path: Path) -> None:
    build_synthetic_corpus(tmp_path)
    root = bundled_corpus_dir()
    bundled = select_entries(read_manifest(), sources="synthetic")
    assert read_manifest(tmp_path) == bundled
    for e in bundled:
        assert (tmp_path / e["file"]).read_bytes() == (root / e["file"]).read_bytes()
