"""Capturing torch modules into OpGraphs: names, FLOPs, bytes, parameter ownership."""

from __future__ import annotations

import logging.handlers

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from travorder.datasets.torch_examples import make_cnn, make_rnn, make_transformer  # noqa: E402
from travorder.errors import TravorderError  # noqa: E402
from travorder.placement.capture import capture, capture_graph  # noqa: E402


def test_linear_relu_by_hand():
    net = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    g = capture_graph(net, (torch.ones(5, 4),))
    assert g.names.tolist() == ["_0", "_1", "_2"]
    assert g.op_types.tolist() == ["Linear", "ReLU", "Linear"]
    # 2 * batch * in * out for each Linear; ReLU counts none.
    assert g.flops.tolist() == [2 * 5 * 4 * 3, 0, 2 * 5 * 3 * 2]
    assert g.output_bytes.tolist() == [5 * 3 * 4, 5 * 3 * 4, 5 * 2 * 4]
    assert g.param_bytes.tolist() == [(12 + 3) * 4, 0, (6 + 2) * 4]
    assert list(zip(g.src.tolist(), g.dst.tolist(), g.edge_bytes.tolist(), strict=True)) == [
        (0, 1, 60.0), (1, 2, 60.0)]
    assert g.meta["source"] == "torch.fx"
    assert g.meta["batch_size"] == 5
    assert g.meta["dtype"] == "float32"
    assert g.name == "Sequential"


def test_cnn_names_are_fx_nodes_and_residual_edges():
    model, x, _ = make_cnn()
    cap = capture(model, x)
    g = cap.graph
    fx_ops = [n.name for n in cap.module.graph.nodes
              if n.op not in ("placeholder", "get_attr", "output")]
    assert g.names.tolist() == fx_ops
    # stem: 2 * batch * out_ch * H * W * in_ch * 3 * 3
    assert g.flops[g.index["stem"]] == 2 * 4 * 8 * 8 * 8 * 3 * 9
    assert g.op_types[g.index["blocks_0_bn1"]] == "BatchNorm2d"
    add = g.index["add"]
    assert sorted(g.names[g.predecessors(add)].tolist()) == ["blocks_0_bn2", "relu"]
    assert g.output_bytes[g.index["relu"]] == 4 * 8 * 8 * 8 * 4
    # BatchNorm: weight and bias only; its running statistics are buffers.
    assert g.param_bytes[g.index["blocks_0_bn1"]] == 2 * 8 * 4


def test_every_parameter_counted_once():
    for make in (make_cnn, make_transformer, make_rnn):
        model, x, _ = make()
        g = capture_graph(model, x)
        total = sum(p.numel() * p.element_size() for p in model.parameters())
        assert g.param_bytes.sum() == total


def test_shared_module_and_get_attr_belong_to_first_user():
    model, x, _ = make_rnn()
    cap = capture(model, x)
    g = cap.graph
    cell_bytes = sum(p.numel() * 4 for p in model.cell.parameters())
    assert g.param_bytes[g.index["cell"]] == cell_bytes
    assert [g.param_bytes[g.index[f"cell_{i}"]] for i in (1, 2, 3)] == [0, 0, 0]
    assert cap.tensor_users["cell.weight_ih"] == ("cell", "cell_1", "cell_2", "cell_3")
    # Each step's cell depends on the previous one: the unrolled chain.
    assert g.names[g.predecessors(g.index["cell_2"])].tolist().count("cell_1") == 1

    model, x, _ = make_transformer()
    cap = capture(model, x)
    assert cap.tensor_users["pos"] == ("add",)
    assert cap.graph.param_bytes[cap.graph.index["add"]] == 16 * 4


def test_non_tensor_ops_are_zero_cost():
    model, x, _ = make_transformer()
    g = capture_graph(model, x)
    for name in ("size", "pow_1"):
        i = g.index[name]
        assert (g.flops[i], g.output_bytes[i], g.param_bytes[i]) == (0, 0, 0)
    # q @ k^T: 2 * batch * heads * T * T * head_dim
    assert g.flops[g.index["matmul"]] == 2 * 2 * 2 * 6 * 6 * 8


def test_capture_leaves_buffers_and_rng_alone():
    model, x, _ = make_cnn()
    model.blocks.append(nn.Dropout(0.5))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.random.get_rng_state()
    capture(model, x)
    assert torch.equal(torch.random.get_rng_state(), rng)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_hash_follows_shapes():
    model, x, _ = make_cnn()
    h1 = capture_graph(model, x).graph_hash
    assert capture_graph(model, x).graph_hash == h1
    assert capture_graph(model, (torch.randn(2, 3, 8, 8),)).graph_hash != h1


class _Nonzero(nn.Module):
    def forward(self, x):
        return torch.nonzero(x > 0).float().sum()


def test_data_dependent_ops_run_for_real():
    g = capture_graph(_Nonzero(), torch.tensor([1.0, -1.0, 2.0]))
    assert g.names.tolist() == ["gt", "nonzero", "float_1", "sum_1"]
    # Two positive entries: a 2 x 1 int64 index tensor, known only from the data.
    assert g.output_bytes[g.index["nonzero"]] == 2 * 8


class _Branchy(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x
        return -x


def test_bad_input():
    with pytest.raises(TravorderError, match=r"cannot trace _Branchy with torch\.fx"):
        capture(_Branchy(), torch.ones(2))
    logged = logging.handlers.BufferingHandler(100)
    logging.getLogger("torch._subclasses.fake_tensor").addHandler(logged)
    try:
        with pytest.raises(TravorderError, match="Linear failed on the example inputs"):
            capture(nn.Linear(4, 3), torch.ones(2, 5))
    finally:
        logging.getLogger("torch._subclasses.fake_tensor").removeHandler(logged)
    assert logged.buffer == []  # no traceback logged by fake tensors before the one line
    with pytest.raises(TravorderError, match=r"expected a torch\.nn\.Module, got function"):
        capture(lambda x: x, torch.ones(2))
    with pytest.raises(TravorderError, match="Linear failed on the example inputs: its "
                                             "forward takes 1 input, 2 were given"):
        capture(nn.Linear(4, 3), (torch.ones(2, 4), torch.ones(2, 4)))  # fx drops one
    with pytest.raises(TravorderError, match=r"the example inputs hold a batch of 0 samples "
                                             r"\(the first dimension of the first input, "
                                             r"\(0, 4\)\)"):  # once "meta batch_size must"
        capture(nn.Linear(4, 3), torch.ones(0, 4))


def test_a_forward_of_any_number_of_inputs_takes_them_all():
    class Sum(nn.Module):
        def forward(self, *xs):
            return xs[0] + xs[1] + xs[2]

    assert capture(Sum(), (torch.ones(2),) * 3).graph.n_nodes > 0


class _Counting(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls.add_(1)  # on a real tensor: run once by fx's trace, then gone
        return self.lin(x)


class _FixedNoise(nn.Module):
    def __init__(self, like_input: bool = False):
        super().__init__()
        self.lin, self.like_input = nn.Linear(4, 4), like_input

    def forward(self, x):
        h = self.lin(x)
        return h + (torch.randn_like(h) if self.like_input else torch.randn(4))


def test_what_tracing_would_freeze_is_refused_and_undone():
    model, noisy, like = _Counting(), _FixedNoise(), _FixedNoise(like_input=True)
    rng = torch.random.get_rng_state()
    with pytest.raises(TravorderError, match=r"_Counting's forward changes 'calls' by code "
                                             r"torch\.fx does not record"):
        capture(model, torch.ones(2, 4))
    assert model.calls.item() == 0  # as it was (once 1, and the placed module never added)
    with pytest.raises(TravorderError, match=r"_FixedNoise's forward draws random numbers "
                                             r"of a fixed shape"):
        capture(noisy, torch.ones(2, 4))  # once frozen into a constant
    assert torch.equal(torch.random.get_rng_state(), rng)  # once one draw consumed
    g = capture_graph(like, torch.ones(2, 4))
    assert "randn_like" in g.names.tolist()
    assert torch.equal(torch.random.get_rng_state(), rng)


def test_attention_flops_on_the_cpu():
    class Attend(nn.Module):
        def forward(self, q, k, v):
            return nn.functional.scaled_dot_product_attention(q, k, v)

    q, k = torch.ones(2, 4, 16, 8), torch.ones(2, 4, 32, 8)
    # Q K^T, then scores V: 2 * (2*4) * 16 * 32 * 8 each (once 0: the CPU's flash kernel)
    assert capture_graph(Attend(), (q, k, k)).flops.tolist() == [2 * 2 * 8 * 16 * 32 * 8]
    v = torch.ones(2, 4, 32, 6)  # another head size for V: the math kernel, as ever
    assert capture_graph(Attend(), (q, k, v)).flops.tolist() == [
        2 * 8 * 16 * 32 * 8 + 2 * 8 * 16 * 32 * 6]


class _Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, mask=None, *, scale=2.0, shift=False):
        h = self.lin(x) * scale
        if shift:  # a Python branch on a default: fine once the default is fixed
            h = h + 1
        return h if mask is None else h * mask


def test_inputs_not_given_take_their_defaults():
    model, x = _Masked(), torch.ones(3, 4)
    cap = capture(model, x)  # once a FakeTensor TypeError: mask traced as an input
    assert cap.graph.names.tolist() == ["lin", "mul"]  # no fx checks of the defaults
    assert torch.equal(cap.module(x), model(x))
    with pytest.raises(TypeError):  # a mask given to the captured code is refused
        cap.module(x, torch.zeros(3, 4))
    masked = capture(model, (x, torch.zeros(3, 4)))
    assert masked.graph.names.tolist() == ["lin", "mul", "mul_1"]
    with pytest.raises(TravorderError, match=r"_Masked failed on the example inputs: its "
                                             r"forward takes 2 inputs, 3 were given"):
        capture(model, (x, x, x))

    class Pair(nn.Module):
        def forward(self, x, y):
            return x + y

    with pytest.raises(TravorderError, match=r"Pair failed on the example inputs: its "
                                             r"forward needs 'y', not given"):
        capture(Pair(), x)
