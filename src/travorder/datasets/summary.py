"""A summary of the model-graph corpus: per-family table, feature projection, docs/corpus.md.

:func:`family_table` condenses a corpus manifest (:mod:`travorder.datasets.corpus`) into
one row per family and source kind (real architectures from the zoo, or synthetic
families); :func:`feature_projection` maps graphs to the first two principal components
of their standardised feature vectors (:func:`travorder.featurize.feature_vector` of the
graph as stored); :func:`write_corpus_doc` writes both, with the measured comparison of
synthetic and real costs from :mod:`travorder.datasets.synthetic`, as a Markdown page
and a PNG figure.

``python -m travorder.datasets.summary`` regenerates ``docs/corpus.md`` and
``docs/corpus_pca.png`` from the bundled corpus (run it from the repository root).

>>> rows = family_table([
...     {"name": "a", "family": "vit", "source": "timm:vit_tiny", "nodes": 90, "flops": 2e9,
...      "depth": 60, "width": 4, "coarsened": False, "original_nodes": 90},
...     {"name": "b", "family": "vit", "source": "torchvision:vit_b_16", "nodes": 120,
...      "flops": 3e10, "depth": 80, "width": 5, "coarsened": False, "original_nodes": 120}])
>>> rows[0]["kind"], rows[0]["count"], rows[0]["nodes"], rows[0]["depth"]
('real', 2, (90, 120), (60, 80))
"""

from __future__ import annotations

import argparse
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from travorder.datasets import synthetic
from travorder.datasets.corpus import (
    DEFAULT_MAX_NODES,
    MAX_FAMILY_SHARE,
    family_shares,
    load_corpus,
    read_manifest,
)
from travorder.errors import FormatError, TravorderError, write_file
from travorder.featurize import FEATURE_NAMES, feature_vector
from travorder.graph.opgraph import OpGraph

KINDS = ("real", "synthetic")
#: Manifest fields the table reads.
_TABLE_FIELDS = ("name", "family", "source", "nodes", "flops", "depth", "width", "coarsened",
                 "original_nodes")
#: Families of one kind drawn in their own colour in the figure (the largest ones); the
#: rest share one grey, so that every colour in a legend can be told apart.
MAX_COLOURED = 18


def source_kind(source: str) -> str:
    """``"synthetic"`` for a graph from the synthetic generators, else ``"real"``.

    >>> source_kind("synthetic:resnet"), source_kind("timm:resnet26d")
    ('synthetic', 'real')
    """
    return "synthetic" if source.split(":", 1)[0] == "synthetic" else "real"


def family_table(entries: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (source kind, family) of the manifest ``entries``, real before
    synthetic, families in name order.

    A row has ``kind``, ``family``, ``count``, ``coarsened`` (how many graphs are stored
    coarsened) and ``(min, max)`` pairs ``nodes`` (as stored), ``original_nodes``,
    ``flops`` (forward, of the original graph), ``depth`` and ``width`` (levels and most
    nodes on one level, of the stored graph).

    Raises :class:`~travorder.errors.FormatError` if an entry lacks a field.
    """
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for e in entries:
        missing = [k for k in _TABLE_FIELDS if k not in e]
        if missing:
            raise FormatError(f"corpus manifest entry {e.get('name', '(unnamed)')!r} has "
                              f"no {', '.join(missing)}")
        groups.setdefault((source_kind(e["source"]), e["family"]), []).append(e)
    rows = []
    for (kind, family), group in sorted(groups.items(),
                                        key=lambda kv: (KINDS.index(kv[0][0]), kv[0][1])):
        row: dict[str, Any] = {"kind": kind, "family": family, "count": len(group),
                               "coarsened": sum(bool(e["coarsened"]) for e in group)}
        for key in ("nodes", "original_nodes", "flops", "depth", "width"):
            values = [e[key] for e in group]
            row[key] = (min(values), max(values))
        rows.append(row)
    return rows


class Projection(NamedTuple):
    """Graphs in the plane of the first two principal components of their features."""

    coords: np.ndarray        #: (n_graphs, 2)
    families: list[str]
    is_real: np.ndarray       #: bool, (n_graphs,)
    explained: np.ndarray     #: share of the feature variance on each axis
    loadings: np.ndarray      #: (2, n_features), the axes in standardised feature units


def feature_projection(graphs: Sequence[OpGraph]) -> Projection:
    """PCA (two components) of the standardised feature vectors of ``graphs``, with each
    graph's family and whether it is a real architecture (its ``meta`` ``family`` and
    ``source``). A feature constant over ``graphs`` contributes nothing.

    Raises :class:`~travorder.errors.TravorderError` for fewer than three graphs or a
    graph without ``family`` or ``source`` in its meta.
    """
    from sklearn.decomposition import PCA
    from sklearn.preprocessing import StandardScaler

    if len(graphs) < 3:
        raise TravorderError(f"a feature projection needs at least 3 graphs, got "
                             f"{len(graphs)}")
    for g in graphs:
        if not (g.meta.get("family") and g.meta.get("source")):
            raise TravorderError(f"graph {g.name or '(unnamed)'!r} has no family or source "
                                 f"in its meta")
    x = StandardScaler().fit_transform(np.array([feature_vector(g) for g in graphs]))
    pca = PCA(n_components=2, svd_solver="full").fit(x)
    return Projection(pca.transform(x), [str(g.meta["family"]) for g in graphs],
                      np.array([source_kind(str(g.meta["source"])) == "real" for g in graphs]),
                      pca.explained_variance_ratio_, pca.components_)


# ------------------------------------------------------------------ figure
def _plot(proj: Projection) -> bytes:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = np.asarray(proj.families)
    markers = {"real": "o", "synthetic": "^"}
    # tab10's dark shades, then tab20's light ones; no greys (grey means "other")
    tab20 = plt.get_cmap("tab20").colors
    palette = [tab20[i] for i in [*range(0, 20, 2), *range(1, 20, 2)] if i not in (14, 15)]
    fig, axes = plt.subplots(1, 2, figsize=(15, 7.2), sharex=True, sharey=True)
    for ax, kind in zip(axes, KINDS, strict=True):
        mine = proj.is_real == (kind == "real")
        if not mine.all():
            other_kind = KINDS[1 - KINDS.index(kind)]
            ax.scatter(*proj.coords[~mine].T, s=14, c="0.82", marker=markers[other_kind],
                       label=f"{other_kind} graphs ({int((~mine).sum())})", zorder=1)
        counts = Counter(families[mine].tolist())
        coloured = sorted(counts, key=lambda f: (-counts[f], f))[:MAX_COLOURED]
        rest = mine & ~np.isin(families, coloured)
        if rest.any():
            ax.scatter(*proj.coords[rest].T, s=28, c="0.45", marker=markers[kind],
                       label=f"{len(counts) - len(coloured)} smaller families "
                             f"({int(rest.sum())})", zorder=2)
        for colour, f in zip(palette, coloured, strict=False):
            ax.scatter(*proj.coords[mine & (families == f)].T, s=40, color=colour,
                       marker=markers[kind], edgecolors="k", linewidths=0.4,
                       label=f"{f} ({counts[f]})", zorder=3)
        ax.set_title(f"{kind} graphs ({int(mine.sum())}) by family", fontsize=12)
        ax.set_xlabel(f"PC1 ({100 * proj.explained[0]:.0f} % of the feature variance)")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0, -0.1), ncol=3,
                  frameon=False)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"PC2 ({100 * proj.explained[1]:.0f} % of the feature variance)")
    fig.suptitle("Corpus graphs on the first two principal components of their "
                 "standardised features", fontsize=13)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


# ------------------------------------------------------------------ document
def _si(x: float) -> str:
    """``x`` with an SI prefix, three significant digits.

    >>> _si(31127725032.0), _si(950.0), _si(1.5e12)
    ('31.1 G', '950', '1.50 T')
    """
    x = float(f"{x:.3g}")  # so that 999.7e6 reads 1.00 G
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}" if x / scale >= 100 else \
                f"{x / scale:#.3g} {prefix}"
    return f"{x:.3g}"


def _span(pair: tuple[Any, Any], fmt: Any = "{:,}".format) -> str:
    lo, hi = fmt(pair[0]), fmt(pair[1])
    return lo if lo == hi else f"{lo} – {hi}"


def _table_md(rows: Sequence[Mapping[str, Any]]) -> str:
    lines = ["| family | graphs | nodes | FLOPs (forward) | depth | width | coarsened |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        coarse = (f"{r['coarsened']} (from up to {r['original_nodes'][1]:,} nodes)"
                  if r["coarsened"] else "")
        lines.append(f"| {r['family']} | {r['count']} | {_span(r['nodes'])} | "
                     f"{_span(r['flops'], _si)} | {_span(r['depth'])} | "
                     f"{_span(r['width'])} | {coarse} |")
    return "\n".join(lines)


def _rst_to_md(text: str) -> str:
    """Markdown from the reStructuredText of a docstring section: roles and literals
    become code spans, simple tables become Markdown tables."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text).replace("``", "`")
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if not re.fullmatch(r"=+( +=+)+", lines[i]):
            out.append(lines[i])
            i += 1
            continue
        cols = [(m.start(), m.end()) for m in re.finditer(r"=+", lines[i])]
        cols[-1] = (cols[-1][0], None)  # the last column runs to the end of the line
        end = lines.index(lines[i], i + 1)  # the rule under the header
        stop = lines.index(lines[i], end + 1)  # the closing rule
        cells = [[line[a:b].strip() for a, b in cols] for line in lines[i + 1:end]
                 + lines[end + 1:stop]]
        out += [f"| {' | '.join(cells[0])} |", "|" + " --- |" * len(cols)]
        out += [f"| {' | '.join(row)} |" for row in cells[1:]]
        i = stop + 1
    return "\n".join(out).strip()


def _synthetic_comparison() -> str:
    """The measured comparison of synthetic and real costs from the synthetic module."""
    doc = synthetic.__doc__ or ""
    match = re.search(r"How the costs compare with real graphs\n-+\n(.*?)(?:\n>>>|\Z)", doc,
                      re.S)
    if match is None:
        raise TravorderError("travorder.datasets.synthetic documents no cost comparison")
    return _rst_to_md(match.group(1))


_TEMPLATE = """\
# The model-graph corpus

<!-- Generated by `python -m travorder.datasets.summary`; edit the template in
src/travorder/datasets/summary.py, not this file. -->

travorder learns which traversal order suits a network from the graphs of its corpus,
so the corpus has to span the shapes a user may bring: deep chains and wide
multi-branch modules, residual and dense connectivity, attention stacks and unrolled
recurrent cells, from a few dozen to thousands of ops. It mixes two kinds of graphs:

- **real** architectures from torchvision, timm and HuggingFace transformers, exported to
  ONNX and imported (forward graph, training mode, batch size 1; see
  [zoo.md](zoo.md) for how they are built and rebuilt, and which models failed);
- **synthetic** families from seeded generators (`travorder.datasets.synthetic`) that
  mimic those shapes and the study's ENAS families (cifar10 cells, ptb RNN cells, nmt
  seq2seq), with costs drawn to match the real graphs (last section).

Graphs above {max_nodes:,} ops are stored coarsened (`travorder.graph.coarsen`), with
the original size in the manifest. Load them with
`travorder.datasets.load_corpus(families=..., sources=..., max_nodes=...)`
(`sources="synthetic"`, `"timm"`, `"torchvision:resnet50"`...); `travorder zoo list`
prints the manifest.

- **{n_graphs} graphs in {n_families} families**
- real architectures: {n_real} graphs in {n_real_families} families
- synthetic: {n_synthetic} graphs in {n_synthetic_families} families
- largest family: `{top_family}`, {top_share:.1f} % of the graphs (grouped evaluation
  needs at most {max_share:.0f} %)

## Families

Ranges over each family's graphs. *nodes*, *depth* (levels: nodes on a longest path)
and *width* (most nodes on one level) are of the graph as stored, after coarsening;
*FLOPs* are the forward FLOPs of the whole model at its batch size (1, or 2 for the few
real models that cannot run training-mode batch norm on one sample) and are kept by
coarsening. A family name shared by real and synthetic graphs (e.g. `resnet`) is one
family for grouped evaluation.

### Real architectures

{real_table}

### Synthetic families

{synthetic_table}

## How the corpus covers the feature space

![Corpus graphs on the first two principal components of their features]({png})

Every graph's feature vector (the {n_features} features of
[features.md](features.md), of the graph as stored), standardised over the corpus and
projected on its first two principal components, which carry {explained:.0f} % of the
variance. Both panels show the same points: on the left the real graphs coloured by
family (the {n_coloured} largest, ties by name; the others in dark grey) over the synthetic
graphs in light grey, on the right the synthetic families over the real graphs.
The features with the largest loadings (sign in brackets):

- PC1: {pc1}
- PC2: {pc2}

## How synthetic costs compare with real graphs

This comparison is measured and kept in the docstring of `travorder.datasets.synthetic`.

{comparison}
"""


def _top_loadings(axis: np.ndarray, k: int = 4) -> str:
    top = np.argsort(-np.abs(axis), kind="stable")[:k]
    return ", ".join(f"`{FEATURE_NAMES[i]}` ({'+' if axis[i] > 0 else '−'})" for i in top)


def write_corpus_doc(out_md: str | os.PathLike[str], out_png: str | os.PathLike[str],
                     corpus_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """Write the corpus page ``out_md`` (Markdown) and its figure ``out_png`` for the
    corpus at ``corpus_dir`` (the bundled one by default); returns the two paths."""
    md, png = Path(out_md), Path(out_png)
    for path, suffix in ((md, ".md"), (png, ".png")):
        if path.suffix.lower() != suffix:
            raise TravorderError(f"{str(path)!r}: the file must end in {suffix}")
    entries = read_manifest(corpus_dir)
    rows = family_table(entries)
    proj = feature_projection(load_corpus(corpus_dir=corpus_dir))
    figure = _plot(proj)
    shares = family_shares(entries)
    top = next(iter(shares))
    by_kind = {k: [r for r in rows if r["kind"] == k] for k in KINDS}
    n_real_families = len(by_kind["real"])
    text = _TEMPLATE.format(
        max_nodes=DEFAULT_MAX_NODES,
        n_graphs=len(entries), n_families=len(shares),
        n_real=sum(r["count"] for r in by_kind["real"]), n_real_families=n_real_families,
        n_synthetic=sum(r["count"] for r in by_kind["synthetic"]),
        n_synthetic_families=len(by_kind["synthetic"]),
        top_family=top, top_share=100 * shares[top], max_share=100 * MAX_FAMILY_SHARE,
        real_table=_table_md(by_kind["real"]) if by_kind["real"] else "(none yet)",
        synthetic_table=_table_md(by_kind["synthetic"]) if by_kind["synthetic"] else "(none)",
        png=os.path.relpath(png, md.parent).replace(os.sep, "/"),
        n_features=len(FEATURE_NAMES), explained=100 * proj.explained.sum(),
        n_coloured=min(MAX_COLOURED, n_real_families),
        pc1=_top_loadings(proj.loadings[0]), pc2=_top_loadings(proj.loadings[1]),
        comparison=_synthetic_comparison())
    for path in (md, png):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TravorderError(f"cannot make the folder of {str(path)!r}: "
                                 f"{exc.strerror}") from None
    write_file(png, figure, "figure")
    write_file(md, text, "corpus page")
    return [md, png]


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m travorder.datasets.summary``: regenerate the corpus page and figure."""
    parser = argparse.ArgumentParser(prog="python -m travorder.datasets.summary",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--md", default="docs/corpus.md", help="Markdown page to write")
    parser.add_argument("--png", default="docs/corpus_pca.png", help="figure to write")
    parser.add_argument("--corpus", default=None,
                        help="corpus directory (default: the bundled corpus)")
    args = parser.parse_args(argv)
    try:
        paths = write_corpus_doc(args.md, args.png, args.corpus)
    except TravorderError as exc:
        parser.exit(2, f"error: {exc}\n")
    print(*paths, sep="\n")


if __name__ == "__main__":
    main()
