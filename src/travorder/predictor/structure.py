"""What the predictor sees of a graph beyond its graph-level features.

Three blocks of extra feature columns, all computed with numpy on the graph as the study
placed it (`travorder.graph.prepare_graph`):

- ``order statistics`` (`order_statistics`, columns ``o_<order>_<stat>``): cheap numbers
  about each order's node sequence, `ORDER_STATS`;
- ``order splits`` (`order_splits`, columns ``p_<order>_<stat>`` and
  ``p_<order>_<stat>_rel``): each order's node sequence cut into one contiguous piece per
  device and costed on the cluster, `SPLIT_STATS`;
- ``graph network`` (`GraphNet`, columns ``g_emb<i>`` and ``g_<order>``): the pooled
  embedding and the per-order scores of a small graph neural network over the op graph,
  trained with PyTorch Geometric (`travorder.predictor.gnn`) and run here in numpy from its
  ``.npz`` weights, so that recommending never imports torch.

`node_features` gives the network's per-node inputs, `NODE_FEATURES`.
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from travorder.errors import FormatError, TravorderError
from travorder.featurize.optypes import OP_CATEGORIES, op_categories
from travorder.graph import OpGraph, colocation_groups
from travorder.placement.clusters import Cluster, compute_times

NODE_FEATURES = (
    *(f"op_{c}" for c in OP_CATEGORIES),
    "log_flops", "log_output_bytes", "log_param_bytes", "log_cost", "cost_share",
    "is_backward", "level", "top_level", "bottom_level", "log_in_degree", "log_out_degree",
    "log_in_bytes", "log_out_bytes",
)

#: The extra feature blocks a model can use.
BLOCKS = ("order_stats", "order_split", "gnn")

#: Statistics of one order's node sequence (see `order_statistics`).
ORDER_STATS = ("back_edges", "back_bytes", "bottom_level_corr", "critical_pos",
               "cost_pos", "level_jump", "adjacent", "open_span")

#: Statistics of one order's split into a contiguous piece per device (see `order_splits`).
SPLIT_STATS = ("load", "cut", "est")


def _path_levels(g: OpGraph, cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per node: the largest cost of a path ending at it and of a path starting at it
    (both include the node's own cost), level by level."""
    lev = g.levels
    order = np.argsort(lev, kind="stable")
    bounds = np.searchsorted(lev[order], np.arange(int(lev.max()) + 2))
    top = cost.astype(np.float64).copy()
    bottom = top.copy()
    e_by_dst = np.argsort(lev[g.dst], kind="stable")
    e_bounds = np.searchsorted(lev[g.dst][e_by_dst], np.arange(int(lev.max()) + 2))
    e_by_src = np.argsort(lev[g.src], kind="stable")
    s_bounds = np.searchsorted(lev[g.src][e_by_src], np.arange(int(lev.max()) + 2))
    depth = bounds.size - 1
    ready = np.zeros(g.n_nodes)
    for lv in range(1, depth):
        e = e_by_dst[e_bounds[lv]:e_bounds[lv + 1]]
        np.maximum.at(ready, g.dst[e], top[g.src[e]])
        nodes = order[bounds[lv]:bounds[lv + 1]]
        top[nodes] += ready[nodes]
    after = np.zeros(g.n_nodes)
    for lv in range(depth - 2, -1, -1):
        e = e_by_src[s_bounds[lv]:s_bounds[lv + 1]]
        np.maximum.at(after, g.src[e], bottom[g.dst[e]])
        nodes = order[bounds[lv]:bounds[lv + 1]]
        bottom[nodes] += after[nodes]
    return top, bottom


def node_features(g: OpGraph) -> np.ndarray:
    """Per-node inputs of the graph network, columns as `NODE_FEATURES` (``n x 23``)."""
    n = g.n_nodes
    onehot = np.zeros((n, len(OP_CATEGORIES)))
    onehot[np.arange(n), op_categories(g)] = 1.0
    cost = g.cost.astype(np.float64)
    top, bottom = _path_levels(g, cost)
    span = max(float(bottom.max()), 1e-12)
    lev = g.levels.astype(np.float64)
    in_bytes = np.bincount(g.dst, weights=g.edge_bytes, minlength=n)
    out_bytes = np.bincount(g.src, weights=g.edge_bytes, minlength=n)
    cols = [
        np.log1p(g.flops), np.log1p(g.output_bytes), np.log1p(g.param_bytes),
        np.log1p(cost), cost * n / max(float(cost.sum()), 1e-12),
        g.is_backward.astype(np.float64), lev / max(float(lev.max()), 1.0),
        (top - cost) / span, bottom / span, np.log1p(g.in_degree), np.log1p(g.out_degree),
        np.log1p(in_bytes), np.log1p(out_bytes),
    ]
    return np.hstack([onehot, np.column_stack(cols)])


def order_statistics(g: OpGraph, orders: Mapping[str, np.ndarray]) -> dict[str, float]:
    """``o_<order>_<stat>`` for each order's node sequence (a permutation of ``g``'s nodes):

    - ``back_edges`` / ``back_bytes``: share of the edges (of the edge bytes) whose consumer
      is visited before its producer (0 for a topological order);
    - ``bottom_level_corr``: correlation of visit position with the node's bottom level (the
      longest cost path from it to a sink): negative when critical work comes first;
    - ``critical_pos``: mean visit position (0 first, 1 last) of the nodes on a critical path;
    - ``cost_pos``: cost-weighted mean visit position;
    - ``level_jump``: mean level change between consecutive visits, over the depth;
    - ``adjacent``: share of consecutive visits joined by an edge;
    - ``open_span``: mean number of steps from a node's visit to its last consumer's
      (0 when visited after it), over the node count.
    """
    n = g.n_nodes
    cost = g.cost.astype(np.float64)
    top, bottom = _path_levels(g, cost)
    critical = np.isclose(top + bottom - cost, bottom.max(), rtol=1e-9, atol=0.0)
    lev = g.levels.astype(np.float64)
    depth = max(float(lev.max()), 1.0)
    edge_key = set((g.src * n + g.dst).tolist())
    total_bytes = max(float(g.edge_bytes.sum()), 1e-12)
    scale = max(n - 1, 1)
    out: dict[str, float] = {}
    for name, perm in orders.items():
        perm = np.asarray(perm, dtype=np.int64)
        pos = np.empty(n, dtype=np.float64)
        pos[perm] = np.arange(n)
        back = pos[g.dst] < pos[g.src]
        last_use = np.full(n, -1.0)
        np.maximum.at(last_use, g.src, pos[g.dst])
        a, b = perm[:-1], perm[1:]
        pairs = (a * n + b).tolist() + (b * n + a).tolist()
        adjacent = sum(p in edge_key for p in pairs) / scale
        corr = np.corrcoef(pos, bottom)[0, 1] if n > 2 and bottom.std() > 0 else 0.0
        stats = (
            float(back.mean()) if back.size else 0.0,
            float(g.edge_bytes[back].sum() / total_bytes),
            float(np.nan_to_num(corr)),
            float(pos[critical].mean() / scale),
            float((pos * cost).sum() / max(float(cost.sum()), 1e-12) / scale),
            float(np.abs(np.diff(lev[perm])).mean() / depth) if n > 1 else 0.0,
            float(adjacent),
            float(np.clip(last_use - pos, 0, None).mean() / scale),
        )
        out.update({f"o_{name}_{s}": v for s, v in zip(ORDER_STATS, stats, strict=True)})
    return out


def group_walk(group: np.ndarray, perm: np.ndarray, n_groups: int) -> np.ndarray:
    """The groups (``group``: the group of each node, ``0 .. n_groups - 1``) in the order
    of their first visited member along the node sequence ``perm``.

    >>> group_walk(np.array([0, 1, 1, 2]), np.array([3, 2, 0, 1]), 3).tolist()
    [2, 1, 0]
    """
    pos = np.empty(group.size, dtype=np.int64)
    pos[np.asarray(perm, dtype=np.int64)] = np.arange(group.size)
    first = np.full(n_groups, group.size, dtype=np.int64)
    np.minimum.at(first, group, pos)
    return np.argsort(first, kind="stable")


def split_pieces(group: np.ndarray, work: np.ndarray, perm: np.ndarray, share: float,
                 n_pieces: int) -> np.ndarray:
    """The piece (0 to ``n_pieces - 1``) of each colocation group when the node sequence
    ``perm`` is cut into pieces of ``share`` work each: the groups come at their first
    visited member (``group``: the group of each node), with ``work`` each, and a group
    goes to the piece that holds its midpoint (the last piece takes the rest).

    >>> split_pieces(np.array([0, 1, 1, 2]), np.array([1.0, 2.0, 1.0]),
    ...              np.array([3, 0, 1, 2]), 2.0, 2).tolist()
    [0, 1, 0]
    """
    walk = group_walk(group, perm, work.size)
    mid = np.cumsum(work[walk]) - work[walk] / 2
    out = np.empty(work.size, dtype=np.int64)
    out[walk] = np.minimum((mid / share).astype(np.int64), n_pieces - 1)
    return out


def order_splits(g: OpGraph, cluster: Cluster, orders: Mapping[str, np.ndarray],
                 reference: str) -> dict[str, float]:
    """``p_<order>_<stat>`` and ``p_<order>_<stat>_rel`` (``p`` for pieces) for each order's
    node sequence cut into one contiguous piece per device of ``cluster``, costed there.

    Along the order, each colocation group comes at its first visited member (the placers
    keep a group together where that member goes), with its members' compute (each op's
    fastest time over the devices, `compute_times`); the running total is cut into as
    many even shares of the single-device step time ``T1 / devices`` as the cluster has
    devices, a group in the share that holds its midpoint. Then:

    - ``load``: log of the largest piece's compute over the even share;
    - ``cut``: log(1 + the time to send each tensor once to every other piece that reads
      it, over the even share); a transfer takes the mean over the ordered device pairs
      of the latency and of the time per byte (so a fast link does not hide slow ones),
      and the links' busy time after a transfer;
    - ``est``: log((largest piece + cut time / devices) / ``T1``), a crude step time of
      the split relative to one device;
    - ``_rel``: the statistic minus the ``reference`` order's (one of ``orders``: the
      predictor's fallback, its training data's best fixed order).

    It is not a placement: no schedule, no memory, no device told from another; it says
    how each order lays the graph's work and tensors out along the sequence a placer
    walks, for this cluster's device count, speed and links.

    >>> from travorder.placement.clusters import load_cluster
    >>> g = OpGraph(["a", "b", "c", "d"], [0, 0, 1, 2], [1, 2, 3, 3],
    ...             time_us=[1.0, 50.0, 50.0, 1.0], edge_bytes=[4e6] * 4)
    >>> f = order_splits(g, load_cluster("k80x3"), {"x": np.arange(4)}, "x")
    >>> round(f["p_x_load"], 3), round(f["p_x_cut"], 3), f["p_x_est_rel"]
    (0.405, 3.314, 0.0)
    """
    if reference not in orders:
        raise TravorderError(f"the order splits are relative to {reference!r}, which is not "
                             f"among the orders ({', '.join(orders)})")
    t = compute_times(g, cluster)
    n_dev = t.shape[1]
    fastest = t.min(axis=1)
    share = max(float(t.sum(axis=0).min()) / n_dev, 1e-300)
    off = ~np.eye(n_dev, dtype=bool)
    per_byte = float((1.0 / np.asarray(cluster.bandwidth)[off]).mean()) if n_dev > 1 else 0.0
    latency = float(np.asarray(cluster.latency)[off].mean()) + cluster.busy_after_us \
        if n_dev > 1 else 0.0
    group = colocation_groups(g)
    n_groups = int(group.max()) + 1
    work = np.bincount(group, weights=fastest, minlength=n_groups)
    out: dict[str, float] = {}
    for name, perm in orders.items():
        group_piece = split_pieces(group, work, perm, share, n_dev)
        piece = group_piece[group]
        load = float(np.bincount(group_piece, weights=work, minlength=n_dev).max())
        cut = piece[g.src] != piece[g.dst]
        key, at = np.unique(g.src[cut] * n_dev + piece[g.dst[cut]], return_inverse=True)
        sent = np.zeros(key.size)
        np.maximum.at(sent, at, g.edge_bytes[cut])
        cut_time = float((latency + sent * per_byte).sum())
        out |= {f"p_{name}_load": float(np.log(max(load, 1e-300) / share)),
                f"p_{name}_cut": float(np.log1p(cut_time / share)),
                f"p_{name}_est": float(np.log(max(load + cut_time / n_dev, 1e-300)
                                              / (share * n_dev)))}
    for stat in SPLIT_STATS:
        base = out[f"p_{reference}_{stat}"]
        out |= {f"p_{o}_{stat}_rel": out[f"p_{o}_{stat}"] - base for o in orders}
    return out


class GraphNet:
    """The numpy forward pass of the graph network of `travorder.predictor.gnn`.

    Per layer ``h' = relu(h W_self + mean_pred(h) W_in + mean_succ(h) W_out + b)``; the
    graph's embedding is ``tanh([mean(h), max(h)] W_emb + b_emb)``; with the standardised
    cluster features ``c`` the per-order scores are
    ``relu([emb, c] W_1 + b_1) W_2 + b_2`` (a predicted ``log(step time / best)`` per
    order). ``weights`` holds the arrays of the ``.npz`` file (names as
    `travorder.predictor.gnn.export_weights` writes them).
    """

    def __init__(self, weights: Mapping[str, np.ndarray]) -> None:
        self.w = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()
                  if k not in ("orders", "cluster_features")}
        self.n_layers = int(self.w["n_layers"])
        self.orders = [str(o) for o in np.asarray(weights["orders"])]
        self.cluster_features = [str(c) for c in np.asarray(weights["cluster_features"])]

    @classmethod
    def load(cls, path: str | os.PathLike[str], sha256: str | None = None) -> GraphNet:
        """Read the weights (``.npz``, no pickles); check the file's SHA-256 if given."""
        p = Path(path)
        try:
            data = p.read_bytes()
        except OSError as exc:
            raise FormatError(f"{p}: cannot read graph network ({exc.strerror})") from None
        if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
            raise FormatError(f"{p}: broken graph network (its checksum differs from the "
                              "manifest's: truncated or edited)")
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                return cls({k: z[k] for k in z.files})
        except (ValueError, KeyError, OSError, zipfile.BadZipFile) as exc:
            raise FormatError(f"{p}: broken graph network ({exc})") from None

    @property
    def embedding_size(self) -> int:
        return self.w["emb.weight"].shape[0]

    def embed(self, g: OpGraph) -> np.ndarray:
        """The graph's embedding (``embedding_size`` values)."""
        x = (node_features(g) - self.w["x_mean"]) / self.w["x_std"]
        n = g.n_nodes
        indeg = np.maximum(g.in_degree, 1)[:, None]
        outdeg = np.maximum(g.out_degree, 1)[:, None]
        h = x
        for i in range(self.n_layers):
            agg_in = np.zeros((n, h.shape[1]))
            np.add.at(agg_in, g.dst, h[g.src])
            agg_out = np.zeros((n, h.shape[1]))
            np.add.at(agg_out, g.src, h[g.dst])
            h = (h @ self.w[f"conv{i}.lin_self.weight"].T + self.w[f"conv{i}.lin_self.bias"]
                 + (agg_in / indeg) @ self.w[f"conv{i}.lin_in.weight"].T
                 + (agg_out / outdeg) @ self.w[f"conv{i}.lin_out.weight"].T)
            h = np.maximum(h, 0.0)
        pooled = np.concatenate([h.mean(axis=0), h.max(axis=0)])
        return np.tanh(pooled @ self.w["emb.weight"].T + self.w["emb.bias"])

    def head(self, emb: np.ndarray, cluster: Mapping[str, float]) -> np.ndarray:
        """Per-order scores (predicted log step-time ratios to the best) from an embedding
        and the cluster's ``c_`` features."""
        c = np.array([cluster[name] for name in self.cluster_features], dtype=np.float64)
        c = (c - self.w["c_mean"]) / self.w["c_std"]
        z = np.concatenate([emb, c])
        z = np.maximum(z @ self.w["hidden.weight"].T + self.w["hidden.bias"], 0.0)
        return z @ self.w["out.weight"].T + self.w["out.bias"]

    def features(self, g: OpGraph, clusters: Sequence[Mapping[str, float]]
                 ) -> list[dict[str, float]]:
        """Per cluster, the ``g_emb<i>`` and ``g_<order>`` feature columns of ``g``."""
        emb = self.embed(g)
        base = {f"g_emb{i}": float(v) for i, v in enumerate(emb)}
        return [base | {f"g_{o}": float(v) for o, v in
                        zip(self.orders, self.head(emb, c), strict=True)} for c in clusters]


def check_blocks(blocks: Sequence[str]) -> None:
    """Refuse a feature block name that is not one of `BLOCKS`."""
    unknown = sorted(set(blocks) - set(BLOCKS))
    if unknown:
        raise FormatError(f"unknown feature block {unknown[0]!r} (this travorder knows "
                          f"{', '.join(BLOCKS)})")


def extra_features(g: OpGraph, cluster: Cluster, row: Mapping[str, float],
                   blocks: Sequence[str], net: GraphNet | None = None,
                   orders: Sequence[str] = (), reference: str = "") -> dict[str, Any]:
    """The extra feature columns of `BLOCKS` ``blocks`` for graph ``g`` (as the study
    prepared it) on ``cluster``, whose ``c_`` columns are in ``row``; ``orders``: the
    predictor's; ``reference``: the order the order splits are relative to (its
    fallback)."""
    check_blocks(blocks)
    out: dict[str, Any] = {}
    if "order_stats" in blocks or "order_split" in blocks:
        from travorder.placement.orders import traversal_order

        perms = {o: traversal_order(g, o) for o in orders}
        if "order_stats" in blocks:
            out |= order_statistics(g, perms)
        if "order_split" in blocks:
            out |= order_splits(g, cluster, perms, reference)
    if "gnn" in blocks:
        if net is None:
            raise FormatError("this model uses a graph network but has none")
        out |= net.features(g, [row])[0]
    return out


def structure_features(g: OpGraph, cluster: Cluster, row: Mapping[str, float],
                       predictor: Any, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The extra columns the predictor of ``manifest`` uses, for graph ``g`` (as the study
    prepared it) on ``cluster``, and a feature ``row`` holding the cluster's ``c_``
    columns."""
    blocks = manifest.get("structure", [])
    if not blocks:
        return {}
    classes = [str(o) for o in predictor.classes_]
    return extra_features(g, cluster, row, blocks, getattr(predictor, "graph_net_", None),
                          classes, classes[int(np.argmin(predictor.mean_regret_))])
