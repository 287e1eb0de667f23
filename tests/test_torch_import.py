"""Importing a torch.nn.Module through an in-memory ONNX export."""

from __future__ import annotations

import pytest

from travorder.errors import TravorderError

torch = pytest.importorskip("torch")
from travorder.graph.torch_import import from_torch  # noqa: E402


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 3)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


def check_mlp(g, batch: int) -> None:
    by_op = {}
    for op, f, p in zip(g.op_types.tolist(), g.flops.tolist(), g.param_bytes.tolist(),
                        strict=True):
        by_op.setdefault(op, []).append((f, p))
    # Linear = Gemm: 2*M*N*K + M*N for the bias; parameters (N*K + N) float32
    assert by_op["Gemm"] == [(2 * batch * 8 * 4 + batch * 8, (8 * 4 + 8) * 4),
                             (2 * batch * 3 * 8 + batch * 3, (3 * 8 + 3) * 4)]
    assert by_op["Relu"] == [(batch * 8, 0)]
    assert "Dropout" not in by_op or by_op["Dropout"][0][0] == 0  # eval mode
    assert g.meta["n_unknown_shape_ops"] == 0
    assert g.meta["batch_size"] == batch and g.meta["dtype"] == "float32"
    assert g.meta["importer"] == "torch" and g.meta["source"] == "torch:Mlp"
    assert g.name == "Mlp"


def test_torchscript_exporter():
    model = Mlp().train()
    g = from_torch(model, torch.randn(5, 4), exporter="torchscript")
    check_mlp(g, batch=5)
    assert model.training  # mode restored


@pytest.mark.slow  # the dynamo exporter takes ~10 s to start
def test_dynamo_exporter():
    g = from_torch(Mlp(), (torch.randn(2, 4),), name="mlp")
    check_mlp(g.replace(meta={"name": "Mlp"}), batch=2)
    assert g.name == "mlp"


def test_meta_tensors_are_refused():
    with pytest.raises(TravorderError, match="needs real tensors"):
        from_torch(Mlp(), torch.empty(2, 4, device="meta"))
    with torch.device("meta"):
        model = Mlp()
    with pytest.raises(TravorderError, match="needs real tensors"):
        from_torch(model, torch.randn(2, 4))


def test_bad_arguments():
    with pytest.raises(TravorderError, match=r"expected a torch\.nn\.Module, got str"):
        from_torch("model", torch.randn(2, 4))
    with pytest.raises(TravorderError, match=r"unknown exporter 'jit'"):
        from_torch(Mlp(), torch.randn(2, 4), exporter="jit")
    with pytest.raises(TravorderError, match=r"torch\.onnx export failed"):
        from_torch(Mlp(), torch.randn(2, 5), exporter="torchscript")  # wrong width
