"""The corpus summary: family table, feature projection, docs/corpus.md writer."""

from __future__ import annotations

import doctest
from pathlib import Path

import numpy as np
import pytest

from travorder.datasets import summary
from travorder.datasets.corpus import add_to_corpus
from travorder.datasets.summary import (
    family_table,
    feature_projection,
    source_kind,
    write_corpus_doc,
)
from travorder.datasets.synthetic import chain, enas_cnn, random_dag, resnet, transformer
from travorder.errors import FormatError, TravorderError
from travorder.featurize import feature_vector
from travorder.graph.opgraph import OpGraph


def entry(name: str, family: str, source: str, nodes: int, flops: float, depth: int,
          width: int, original_nodes: int | None = None) -> dict[str, object]:
    return {"name": name, "family": family, "source": source, "nodes": nodes,
            "flops": flops, "depth": depth, "width": width,
            "coarsened": original_nodes is not None,
            "original_nodes": original_nodes or nodes}


MANIFEST = [
    entry("vit_b", "vit", "torchvision:vit_b_16", 2000, 3e10, 80, 5, original_nodes=5000),
    entry("deit", "vit", "timm:deit_tiny", 90, 2e9, 60, 4),
    entry("syn_resnet_a", "resnet", "synthetic:resnet", 23, 5e8, 21, 2),
    entry("resnet18", "resnet", "torchvision:resnet18", 100, 3.6e9, 90, 2),
    entry("syn_resnet_b", "resnet", "synthetic:resnet", 515, 2.3e10, 507, 3),
]


def test_source_kind() -> None:
    assert [source_kind(s) for s in ("synthetic:chain", "synthetic", "timm:vit",
                                     "hf:bert", "synthetic_like:x")] == \
        ["synthetic", "synthetic", "real", "real", "real"]


def test_family_table_groups_by_kind_and_family() -> None:
    rows = family_table(MANIFEST)
    assert [(r["kind"], r["family"]) for r in rows] == \
        [("real", "resnet"), ("real", "vit"), ("synthetic", "resnet")]
    real_resnet, vit, syn_resnet = rows
    assert real_resnet == {"kind": "real", "family": "resnet", "count": 1, "coarsened": 0,
                           "nodes": (100, 100), "original_nodes": (100, 100),
                           "flops": (3.6e9, 3.6e9), "depth": (90, 90), "width": (2, 2)}
    assert vit == {"kind": "real", "family": "vit", "count": 2, "coarsened": 1,
                   "nodes": (90, 2000), "original_nodes": (90, 5000),
                   "flops": (2e9, 3e10), "depth": (60, 80), "width": (4, 5)}
    assert syn_resnet["count"] == 2 and syn_resnet["nodes"] == (23, 515)
    assert syn_resnet["flops"] == (5e8, 2.3e10) and syn_resnet["width"] == (2, 3)
    assert family_table([]) == []


def test_family_table_names_a_missing_field() -> None:
    broken = {k: v for k, v in MANIFEST[1].items() if k not in ("depth", "width")}
    with pytest.raises(FormatError, match=r"^corpus manifest entry 'deit' has no depth, "
                                          r"width$"):
        family_table([MANIFEST[0], broken])


def as_real(g: OpGraph, name: str, family: str) -> OpGraph:
    return g.replace(meta={"name": name, "family": family, "source": f"torchvision:{name}",
                           "builder": "test"})


def small_graphs() -> list[OpGraph]:
    return [chain(0, n_layers=4), chain(1, n_layers=9), resnet(0, blocks=(1, 1)),
            transformer(0, n_layers=1), random_dag(0, n_nodes=30),
            as_real(enas_cnn(0, n_cells=2), "toy_net", "toynet")]


def test_feature_projection_is_pca_of_standardised_features() -> None:
    graphs = small_graphs()
    proj = feature_projection(graphs)
    assert proj.coords.shape == (6, 2) and proj.loadings.shape[0] == 2
    assert proj.families == ["chain", "chain", "resnet", "transformer", "random_dag",
                             "toynet"]
    assert proj.is_real.tolist() == [False] * 5 + [True]
    # the same projection from an SVD of the standardised features (signs are arbitrary)
    x = np.array([feature_vector(g) for g in graphs])
    std = x.std(axis=0)
    z = (x - x.mean(axis=0)) / np.where(std > 0, std, 1.0)
    u, s, _ = np.linalg.svd(z, full_matrices=False)
    np.testing.assert_allclose(np.abs(proj.coords), np.abs(u[:, :2] * s[:2]), atol=1e-9)
    np.testing.assert_allclose(proj.explained, s[:2] ** 2 / (s ** 2).sum())
    assert proj.explained[0] >= proj.explained[1] > 0


def test_feature_projection_ignores_names_and_node_numbering() -> None:
    g = chain(1, n_layers=9)
    shuffled = g.permute(np.random.default_rng(0).permutation(g.n_nodes))
    proj = feature_projection([chain(0, n_layers=4), g, shuffled, resnet(0, blocks=(1, 1))])
    np.testing.assert_allclose(proj.coords[1], proj.coords[2], atol=1e-12)


def test_feature_projection_bad_input() -> None:
    with pytest.raises(TravorderError, match=r"^a feature projection needs at least 3 "
                                             r"graphs, got 2$"):
        feature_projection(small_graphs()[:2])
    bare = OpGraph.from_records([{"name": "a", "op_type": "Relu", "flops": 1}], [],
                                name="bare")
    with pytest.raises(TravorderError, match=r"^graph 'bare' has no family or source"):
        feature_projection([*small_graphs()[:2], bare])


def test_rst_tables_and_roles_become_markdown() -> None:
    rst = ("Costs of :data:`SYNTHETIC_SET` by :func:`~travorder.x.y`, ``batch_size``:\n\n"
           "===== ====== ===========\n"
           "group nodes  FLOPs\n"
           "===== ====== ===========\n"
           "real   1330  3.97  5.30\n"
           "syn   13843  4.09  5.29\n"
           "===== ====== ===========\n\n"
           "After.")
    assert summary._rst_to_md(rst) == (
        "Costs of `SYNTHETIC_SET` by `travorder.x.y`, `batch_size`:\n\n"
        "| group | nodes | FLOPs |\n| --- | --- | --- |\n"
        "| real | 1330 | 3.97  5.30 |\n| syn | 13843 | 4.09  5.29 |\n\nAfter.")


def test_docstring_examples() -> None:
    assert doctest.testmod(summary).failed == 0


def test_write_corpus_doc(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    add_to_corpus(small_graphs(), corpus)
    md, png = tmp_path / "docs" / "corpus.md", tmp_path / "docs" / "img" / "pca.png"
    assert write_corpus_doc(md, png, corpus) == [md, png]
    text = md.read_text()
    assert ("- **6 graphs in 5 families**\n- real architectures: 1 graphs in 1 families\n"
            "- synthetic: 5 graphs in 4 families\n"
            "- largest family: `chain`, 33.3 % of the graphs") in text
    real, synthetic = text.split("### Real architectures")[1].split("### Synthetic families")
    assert "| toynet | 1 |" in real and "| chain |" not in real
    # chain(0, n_layers=4) has 10 nodes, chain(1, n_layers=9) 35
    assert "| chain | 2 | 10 – 35 |" in synthetic and "| toynet |" not in synthetic
    assert "(img/pca.png)" in text and "[zoo.md](zoo.md)" in text
    comparison = text.split("## How synthetic costs compare with real graphs")[1]
    assert "| group | nodes | FLOPs / node |" in comparison
    assert "``" not in text and "=====" not in text and ":func:" not in text
    import matplotlib.image

    image = matplotlib.image.imread(png)
    assert image.shape[1] > 1000 and image.shape[0] > 500


@pytest.mark.parametrize(("argv", "message"), [
    (["--png", "pca.bmp"], "'pca.bmp': the file must end in .png"),
    (["--md", "corpus.txt"], "'corpus.txt': the file must end in .md"),
    (["--corpus", "no_corpus"], "no_corpus: not a graph corpus (no manifest.json)"),
])
def test_main_refuses_bad_input_in_one_line(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        summary.main(argv)
    assert info.value.code == 2 and capsys.readouterr().err == f"error: {message}\n"
    assert not any(tmp_path.iterdir())  # nothing written
