"""Small torch models for the launcher's tests and benchmark (needs torch): a residual CNN, a
transformer block and an unrolled RNN whose cell is shared by every time step.

Each ``make_*`` returns ``(model, example_inputs, target)`` built from ``seed``; ``scale``
widens the model (the benchmark uses larger ones than the tests).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(y)))


class ResidualCNN(nn.Module):
    def __init__(self, channels: int = 8, blocks: int = 2, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.blocks = nn.Sequential(*(ResidualBlock(channels) for _ in range(blocks)))
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(F.relu(self.stem(x)))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class TransformerBlock(nn.Module):
    """Pre-norm self-attention and MLP, attention written out op by op."""

    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.pos = nn.Parameter(torch.zeros(1, 1, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.pos
        q, k, v = self.qkv(self.norm1(x)).unflatten(-1, (3, self.heads, -1)).unbind(2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        att = torch.softmax(q @ k.transpose(-2, -1) * q.size(-1) ** -0.5, dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).flatten(2))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class UnrolledRNN(nn.Module):
    """A GRU cell applied at every time step: one module called from many graph nodes."""

    def __init__(self, features: int = 8, hidden: int = 16, steps: int = 4,
                 classes: int = 10) -> None:
        super().__init__()
        self.steps = steps
        self.hidden = hidden
        self.cell = nn.GRUCell(features, hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.new_zeros(x.size(0), self.hidden)
        for t in range(self.steps):
            h = self.cell(x[:, t], h)
        return self.head(h)


def make_cnn(seed: int = 0, scale: int = 1, batch: int = 4):
    torch.manual_seed(seed)
    model = ResidualCNN(channels=8 * scale, blocks=2)
    x = torch.randn(batch, 3, 8 * scale, 8 * scale)
    return model, (x,), torch.randint(0, 10, (batch,))


def make_transformer(seed: int = 0, scale: int = 1, batch: int = 2):
    torch.manual_seed(seed)
    model = TransformerBlock(dim=16 * scale, heads=2 * scale)
    x = torch.randn(batch, 6 * scale, 16 * scale)
    return model, (x,), torch.randn(batch, 6 * scale, 16 * scale)


def make_rnn(seed: int = 0, scale: int = 1, batch: int = 4):
    torch.manual_seed(seed)
    model = UnrolledRNN(features=8 * scale, hidden=16 * scale, steps=4 * scale)
    x = torch.randn(batch, 4 * scale, 8 * scale)
    return model, (x,), torch.randint(0, 10, (batch,))


def loss_for(name: str):
    """The training loss of model ``name`` as ``loss(output, target)``."""
    return F.mse_loss if name == "transformer" else F.cross_entropy


MODELS = {"cnn": make_cnn, "transformer": make_transformer, "rnn": make_rnn}
