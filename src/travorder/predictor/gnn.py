"""Training the predictor's graph network with PyTorch Geometric (the ``rl`` extra).

The network (`OrderGNN`) reads the op graph as the study placed it: per-node inputs from
`travorder.predictor.structure.node_features`, a few `DirectedConv` layers (separate
weights for the node itself, the mean over its predecessors and the mean over its
successors), mean and max pooling into a small embedding, and a head that takes the
embedding with the cluster's features and predicts each order's ``log(step time / best
step time)`` (clipped at `CLIP`), trained with a squared error.

`fit_gnn` trains one on a dataset's rows; `export_weights` writes it as ``.npz`` for
`travorder.predictor.structure.GraphNet`, the numpy forward pass that recommending uses.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import torch
from torch import nn
from torch_geometric.data import Batch, Data
from torch_geometric.nn import MessagePassing, global_max_pool, global_mean_pool

from travorder.graph import OpGraph
from travorder.predictor.structure import GraphNet, node_features

#: Targets are ``min(log(step time / best), CLIP)``: beyond 2x slower, how much does not matter.
CLIP = float(np.log(2.0))


@dataclass(frozen=True)
class GNNParams:
    """Size and training schedule of the graph network."""

    hidden: int = 32
    layers: int = 3
    embedding: int = 8
    head: int = 32
    epochs: int = 20
    batch_graphs: int = 16
    lr: float = 3e-3
    weight_decay: float = 1e-4
    seed: int = 0


class DirectedConv(MessagePassing):
    """``relu`` is applied by the caller; ``x W_self + b + mean_pred(x) W_in + mean_succ(x)
    W_out``, messages along the edges in both directions with separate weights."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__(aggr="mean")
        self.lin_self = nn.Linear(in_channels, out_channels)
        self.lin_in = nn.Linear(in_channels, out_channels, bias=False)
        self.lin_out = nn.Linear(in_channels, out_channels, bias=False)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        from_pred = self.propagate(edge_index, x=x)
        from_succ = self.propagate(edge_index.flip(0), x=x)
        return self.lin_self(x) + self.lin_in(from_pred) + self.lin_out(from_succ)


class OrderGNN(nn.Module):
    """Graph embedding and per-order scores; see the module docstring."""

    def __init__(self, n_node_features: int, n_cluster_features: int, n_orders: int,
                 p: GNNParams) -> None:
        super().__init__()
        dims = [n_node_features] + [p.hidden] * p.layers
        self.convs = nn.ModuleList(DirectedConv(a, b) for a, b in pairwise(dims))
        self.emb = nn.Linear(2 * p.hidden, p.embedding)
        self.hidden = nn.Linear(p.embedding + n_cluster_features, p.head)
        self.out = nn.Linear(p.head, n_orders)

    def embed(self, batch: Batch) -> torch.Tensor:
        h = batch.x
        for conv in self.convs:
            h = torch.relu(conv(h, batch.edge_index))
        pooled = torch.cat([global_mean_pool(h, batch.batch), global_max_pool(h, batch.batch)],
                           dim=1)
        return torch.tanh(self.emb(pooled))

    def head(self, emb: torch.Tensor, cluster: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(torch.cat([emb, cluster], dim=1))))


@dataclass
class TrainedGNN:
    """A trained network with the normalisation it was trained under."""

    model: OrderGNN
    orders: list[str]
    cluster_features: list[str]
    x_mean: np.ndarray
    x_std: np.ndarray
    c_mean: np.ndarray
    c_std: np.ndarray

    def weights(self) -> dict[str, np.ndarray]:
        """The arrays `GraphNet` reads."""
        w = {k: v.detach().cpu().numpy().astype(np.float64)
             for k, v in self.model.state_dict().items()}
        w = {k.replace("convs.", "conv"): v for k, v in w.items()}
        return w | {"n_layers": np.array(len(self.model.convs)), "orders": np.array(self.orders),
                    "cluster_features": np.array(self.cluster_features),
                    "x_mean": self.x_mean, "x_std": self.x_std,
                    "c_mean": self.c_mean, "c_std": self.c_std}

    def numpy(self) -> GraphNet:
        return GraphNet(self.weights())


def export_weights(trained: TrainedGNN, path: str | os.PathLike[str]) -> None:
    """Write the weights as ``.npz`` (plain arrays, loadable with ``allow_pickle=False``)."""
    with open(path, "wb") as f:
        np.savez(f, **trained.weights())


def _standardise(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = a.mean(axis=0)
    std = a.std(axis=0)
    return mean, np.where(std > 1e-9, std, 1.0)


def graph_data(g: OpGraph, x_mean: np.ndarray, x_std: np.ndarray) -> Data:
    """A PyG ``Data`` of ``g`` with standardised node features."""
    x = (node_features(g) - x_mean) / x_std
    return Data(x=torch.tensor(x, dtype=torch.float32),
                edge_index=torch.tensor(np.vstack([g.src, g.dst]), dtype=torch.long),
                num_nodes=g.n_nodes)


def fit_gnn(graphs: Sequence[OpGraph], graph_of_row: np.ndarray, cluster_X: np.ndarray,
            log_ratio: np.ndarray, orders: Sequence[str], cluster_features: Sequence[str],
            params: GNNParams | None = None) -> TrainedGNN:
    """Train on rows ``i`` = (``graphs[graph_of_row[i]]``, cluster features
    ``cluster_X[i]``) with targets ``log_ratio[i, j]`` = ``log(step time / best)`` of
    order ``j``. Adam over mini-batches of ``batch_graphs`` graphs with their rows."""
    p = params or GNNParams()
    torch.manual_seed(p.seed)
    rng = np.random.default_rng(p.seed)
    used = np.unique(graph_of_row)
    feats = [node_features(graphs[i]) for i in used]
    x_mean, x_std = _standardise(np.vstack(feats))
    c_mean, c_std = _standardise(cluster_X)
    data = [graph_data(graphs[i], x_mean, x_std) for i in used]
    where = np.searchsorted(used, graph_of_row)
    c = torch.tensor((cluster_X - c_mean) / c_std, dtype=torch.float32)
    y = torch.tensor(np.minimum(log_ratio, CLIP), dtype=torch.float32)
    model = OrderGNN(feats[0].shape[1], cluster_X.shape[1], len(orders), p)
    opt = torch.optim.Adam(model.parameters(), lr=p.lr, weight_decay=p.weight_decay)
    with torch.enable_grad():
        for _ in range(p.epochs):
            perm = rng.permutation(used.size)
            for chunk in np.array_split(perm, max(1, used.size // p.batch_graphs)):
                chunk = np.sort(chunk)
                rows = np.flatnonzero(np.isin(where, chunk))
                local = torch.tensor(np.searchsorted(chunk, where[rows]), dtype=torch.long)
                batch = Batch.from_data_list([data[i] for i in chunk])
                opt.zero_grad()
                pred = model.head(model.embed(batch)[local], c[rows])
                loss = ((pred - y[rows]) ** 2).mean()
                loss.backward()
                opt.step()
    model.eval()
    return TrainedGNN(model, list(orders), list(cluster_features), x_mean, x_std,
                      c_mean, c_std)


def predict_torch(trained: TrainedGNN, g: OpGraph, cluster_X: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The torch forward pass for one graph: ``(embedding, per-order scores per cluster row)``
    (the reference the numpy `GraphNet` is tested against)."""
    batch = Batch.from_data_list([graph_data(g, trained.x_mean, trained.x_std)])
    c = torch.tensor((np.atleast_2d(cluster_X) - trained.c_mean) / trained.c_std,
                     dtype=torch.float32)
    with torch.no_grad():
        emb = trained.model.embed(batch)
        scores = trained.model.head(emb.expand(c.shape[0], -1), c)
    return emb[0].numpy().astype(np.float64), scores.numpy().astype(np.float64)
