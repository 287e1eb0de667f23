"""Applying placements to torch models: same numbers as the original, parameters where the
placement says, transfers where edges cross devices, clear errors for bad input."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from torch.utils._pytree import tree_map_only  # noqa: E402

from travorder.datasets.torch_examples import MODELS, loss_for  # noqa: E402
from travorder.errors import TravorderError  # noqa: E402
from travorder.graph import training_graph  # noqa: E402
from travorder.graph.prepare import placed_graph  # noqa: E402
from travorder.placement.capture import capture_graph  # noqa: E402
from travorder.placement.clusters import load_cluster  # noqa: E402
from travorder.placement.launch import (  # noqa: E402
    apply,
    call_on_device,
    check_device,
    placement_slots,
    time_step,
    to_device,
)
from travorder.placement.placement_file import save_placement  # noqa: E402
from travorder.placement.placers import place_graph  # noqa: E402

CPUS = ["cpu", "cpu", "cpu"]


def _placements(n: int) -> dict[str, list[int]]:
    rng = np.random.default_rng(7)
    return {
        "alternating": [i % 3 for i in range(n)],
        "halves": [0] * (n // 2) + [2] * (n - n // 2),
        "random": rng.integers(0, 3, n).tolist(),
    }


def _calls(placed, fn) -> list[str]:
    return [n.name for n in placed.graph.nodes if n.op == "call_function" and n.target is fn]


@pytest.mark.parametrize("model_name", list(MODELS))
def test_outputs_gradients_and_sgd_step_equal_the_original(model_name):
    model, x, y = MODELS[model_name]()
    n = capture_graph(model, x).n_nodes
    loss = loss_for(model_name)
    for label, placement in _placements(n).items():
        ref = copy.deepcopy(model)
        mine = copy.deepcopy(model)
        placed = apply(mine, x, placement, CPUS)
        out_ref, out = ref(*x), placed(*x)
        assert torch.equal(out, out_ref), label
        opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
        opt = torch.optim.SGD(placed.parameters(), lr=0.1)
        loss(out_ref, y).backward()
        loss(out, y).backward()
        ref_params = dict(ref.named_parameters())
        for name, p in placed.named_parameters():
            assert torch.equal(p.grad, ref_params[name].grad), (label, name)
        opt_ref.step()
        opt.step()
        for name, p in placed.named_parameters():
            assert torch.equal(p, ref_params[name]), (label, name)
        ref_buffers = dict(ref.named_buffers())
        for name, b in placed.named_buffers():  # BatchNorm statistics updated alike
            assert torch.equal(b, ref_buffers[name]), (label, name)


@settings(max_examples=5, deadline=None)
@given(st.lists(st.integers(0, 2), min_size=11, max_size=11))
def test_any_placement_of_the_shared_cell_trains_alike(placement):
    model, x, y = MODELS["rnn"]()
    ref = copy.deepcopy(model)
    placed = apply(model, x, placement, CPUS)
    F.cross_entropy(placed(*x), y).backward()
    F.cross_entropy(ref(*x), y).backward()
    for (name, p), q in zip(placed.named_parameters(), ref.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad), name


def halve_(x):  # named like an in-place op, and not one
    return x / 2


torch.fx.wrap("halve_")


class _NotInPlace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.relu = nn.Linear(8, 8), nn.ReLU(inplace=True)

    def forward(self, x):
        h = self.a(x)
        y = halve_(h)
        w = h + 1  # h itself, which halve_ left alone
        self.relu(input=h)  # in place, its input given by keyword
        return w * y * h  # h changed by relu


def test_only_torchs_in_place_ops_are_followed(monkeypatch):
    monkeypatch.setattr("travorder.placement.launch.to_device", lambda v, d: tree_map_only(
        torch.Tensor, lambda t: t.to(d, copy=True), v))  # as between two GPUs
    model, x = _NotInPlace(), (torch.randn(4, 8),)
    g = capture_graph(model, x)
    edges = set(zip(g.names[g.src].tolist(), g.names[g.dst].tolist(), strict=True))
    assert {("a", "halve_"), ("a", "add"), ("a", "relu"), ("relu", "mul_1")} <= edges
    assert not {("halve_", "add"), ("a", "mul_1")} & edges
    for placement in _placements(g.n_nodes).values():
        placed = apply(copy.deepcopy(model), x, placement, CPUS)
        assert torch.allclose(placed(*x), copy.deepcopy(model)(*x))


class _InPlace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.relu = nn.Linear(8, 8), nn.Linear(8, 8), nn.ReLU(inplace=True)

    def forward(self, x):  # every in-place change one that autograd allows
        h = self.a(x)
        y = torch.sigmoid(h)  # reads h before it changes
        h.mul_(2)
        self.relu(h)
        g = self.b(h)
        g.add_(1)
        F.relu(g, inplace=True)
        z = y * 3
        torch.sigmoid_(z)
        u = h - 1
        F.leaky_relu_(u, 0.1)  # torch._C._nn's, through torch.nn.functional
        return g * h + z + u


@pytest.mark.parametrize("placement", ["alternating", "halves", "random"])
def test_in_place_ops_on_separate_devices_change_what_follows(monkeypatch, placement):
    # Copies that are new tensors, as between two GPUs (a copy to the same device is not).
    monkeypatch.setattr("travorder.placement.launch.to_device", lambda v, d: tree_map_only(
        torch.Tensor, lambda t: t.to(d, copy=True), v))
    model, x = _InPlace(), (torch.randn(4, 8),)
    g = capture_graph(model, x)
    edges = set(zip(g.names[g.src].tolist(), g.names[g.dst].tolist(), strict=True))
    assert {("mul_", "relu"), ("relu", "b"), ("add_", "relu_1"), ("relu", "mul_1"),
            ("relu_1", "mul_1"), ("sigmoid_", "add"),
            ("leaky_relu_", "add_1")} <= edges
    assert not {("a", "relu"), ("b", "relu_1"), ("mul", "add")} & edges
    ref = copy.deepcopy(model)
    placed = apply(model, x, _placements(g.n_nodes)[placement], CPUS)
    out, want = placed(*x), ref(*x)
    assert torch.allclose(out, want)
    out.sum().backward()
    want.sum().backward()
    for (name, p), q in zip(placed.named_parameters(), ref.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad), name


def test_parameters_live_with_their_first_user():
    model, x, _ = MODELS["rnn"]()
    g = capture_graph(model, x)
    placement = [i % 3 for i in range(g.n_nodes)]
    placed = apply(model, x, placement, CPUS)
    slot = dict(zip(g.names.tolist(), placement, strict=True))
    assert placed.op_devices == slot
    assert placed.op_graph.graph_hash == g.graph_hash
    assert placed.devices == ("cpu", "cpu", "cpu")
    for name in ("cell.weight_ih", "cell.weight_hh", "cell.bias_ih", "cell.bias_hh"):
        assert placed.tensor_devices[name] == slot["cell"]
    assert placed.tensor_devices["head.weight"] == slot["head"]
    for name, p in placed.named_parameters():
        assert p.device == torch.device(placed.devices[placed.tensor_devices[name]])
    # The cell runs at 4 nodes; those off its home slot run on copies.
    off_home = [f"cell_{i}" for i in (1, 2, 3) if slot[f"cell_{i}"] != slot["cell"]]
    assert sorted(_calls(placed, call_on_device)) == off_home
    # apply moves the module's own parameters, like Module.to.
    assert placed.cell.weight_ih is model.cell.weight_ih


def test_get_attr_parameter_home_and_names_kept():
    model, x, _ = MODELS["transformer"]()
    g = capture_graph(model, x)
    placement = [1] + [0] * (g.n_nodes - 1)  # `add` (first user of pos) on slot 1
    placed = apply(model, x, placement, CPUS)
    assert placed.tensor_devices["pos"] == 1
    assert placed.tensor_devices["qkv.weight"] == 0
    names = {n.name for n in placed.graph.nodes}
    assert set(g.names.tolist()) <= names
    # add's output goes once to slot 0 however many ops there use it (norm1 and add_1).
    assert _calls(placed, to_device).count("add_to_0") == 1
    assert placed(*x).shape == (2, 6, 16)


def test_one_copy_per_tensor_and_device():
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    x = torch.randn(3, 4)
    ref = copy.deepcopy(net)
    placed = apply(net, x, [0, 1, 0], ["cpu", "cpu"])
    # input -> slot 0, _0 -> slot 1, _1 -> slot 0: three copies, nothing else.
    assert _calls(placed, to_device) == ["input_1_to_0", "_0_to_1", "_1_to_0"]
    assert _calls(placed, call_on_device) == []
    assert torch.equal(placed(x), ref(x))

    placed = apply(copy.deepcopy(ref), x, [0, 0, 0], ["cpu"])
    assert _calls(placed, to_device) == ["input_1_to_0"]


def test_output_device():
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    placed = apply(net, torch.ones(1, 4), [0, 1], ["cpu", "cpu"], output_device="cpu")
    assert "output_to_cpu" not in _calls(placed, to_device)
    assert _calls(placed, to_device)[-1] == "_1_to_cpu"


def test_placement_forms(tmp_path):
    model, x, _ = MODELS["cnn"]()
    g = capture_graph(model, x)
    tg = training_graph(g)
    result = place_graph(tg, "k80x3", placer="greedy", order="topo")
    expect = result.placement[:g.n_nodes]
    assert placement_slots(g, result, 3).tolist() == expect.tolist()
    assert placement_slots(g, result.placement.tolist(), 3).tolist() == expect.tolist()
    by_name = dict(zip(tg.names.tolist(), result.placement.tolist(), strict=True))
    assert placement_slots(g, by_name, 3).tolist() == expect.tolist()
    path = tmp_path / "cnn.placement.json"
    save_placement(result, tg, load_cluster("k80x3"), path)
    placed = apply(model, x, path, CPUS)
    assert list(placed.op_devices.values()) == expect.tolist()

    fwd = place_graph(g, "k80x3", placer="round_robin", order="bfs")
    save_placement(fwd, g, load_cluster("k80x3"), path)
    assert placement_slots(g, path, 3).tolist() == fwd.placement.tolist()
    with pytest.raises(TravorderError, match="training must be True or False, not 'no'"):
        placement_slots(g, path, 3, training="no")  # once read as True


def test_placements_at_another_batch_or_over_micro_batches(tmp_path):
    from travorder.api import place

    model, x, _ = MODELS["cnn"]()
    g = capture_graph(model, x)
    step = placed_graph(g, True, 64, 4)
    devices = (np.arange(step.n_nodes) % training_graph(g).n_nodes) % 3  # copies alike
    stamped = SimpleNamespace(placement=devices, graph_hash=step.graph_hash)
    path = tmp_path / "p.json"
    by_file = place_graph(step, "k80x3", placer="round_robin")
    save_placement(by_file, step, load_cluster("k80x3"), path)
    for placement, want in ((stamped, devices), (devices, devices), (path, by_file.placement)):
        placed = apply(copy.deepcopy(model), x, placement, CPUS, batch=64, micro_batches=4)
        assert list(placed.op_devices.values()) == want[:g.n_nodes].tolist()  # micro-batch 0
        assert torch.equal(placed(*x), model(*x))
    assert len(set(by_file.placement[:g.n_nodes].tolist())) > 1  # round robin: several
    assert json.loads(path.read_text())["graph"]["batch"] == 64
    placed = apply(copy.deepcopy(model), x, path, CPUS)  # the file says its step
    assert list(placed.op_devices.values()) == by_file.placement[:g.n_nodes].tolist()
    with pytest.raises(TravorderError, match=r"\(batch 64, 2 micro-batches, training=, "
                                             r"batch= as the placement file records\): "):
        apply(model, x, path, CPUS, micro_batches=np.int64(2))  # what is given wins
    forward = place(g, "k80x3", order="topo", placer="round_robin", training=False, batch=64,
                    micro_batches=2)  # a forward-only placement, as place makes it
    placed = apply(copy.deepcopy(model), x, forward, CPUS, training=False, batch=64,
                   micro_batches=2)
    assert list(placed.op_devices.values()) == forward.placement[:g.n_nodes].tolist()
    with pytest.raises(TravorderError, match=rf"\({g.name!r}\): the model or its input shapes "
                                             r"changed since placing, or it was placed "
                                             r"forward only, at another batch"):
        apply(model, x, stamped, CPUS)
    with pytest.raises(TravorderError, match=r"\(batch 64, 2 micro-batches\): "):
        apply(model, x, stamped, CPUS, batch=64, micro_batches=2)
    with pytest.raises(TravorderError, match=r"\(forward only, batch 64, 4 micro-batches\)"):
        apply(model, x, stamped, CPUS, training=False, batch=64, micro_batches=4)
    with pytest.raises(TravorderError, match=rf"placement has {step.n_nodes} devices .* "
                                             rf"training step\): .*give the same training=, "
                                             rf"batch= and micro_batches="):
        apply(model, x, devices, CPUS)


def test_bad_placements(tmp_path):
    model, x, _ = MODELS["rnn"]()
    g = capture_graph(model, x)
    other_model, other_x, _ = MODELS["rnn"](scale=2)
    other = capture_graph(other_model, other_x)
    path = tmp_path / "other.json"
    save_placement(place_graph(other, "k80x3", placer="single"), other, load_cluster("k80x3"), path)
    with pytest.raises(TravorderError, match=f"placement is for graph {other.graph_hash[:12]}"
                                             f", not {g.graph_hash[:12]}"):
        apply(model, x, path, CPUS)
    stamped = SimpleNamespace(placement=[0] * 11, graph_hash=other.graph_hash)
    with pytest.raises(TravorderError, match="placement is for graph"):
        apply(model, x, stamped, CPUS)
    with pytest.raises(TravorderError, match="placement has 5 devices for the 11 ops"):
        apply(model, x, [0] * 5, CPUS)
    with pytest.raises(TravorderError, match="op 'head' on device 3, but 3 devices were given"):
        apply(model, x, [0] * 10 + [3], CPUS)
    with pytest.raises(TravorderError, match="no device for op 'size'"):
        apply(model, x, {"cell": 0}, CPUS)
    with pytest.raises(TravorderError, match="must give each op an integer device index"):
        apply(model, x, [0.5] * 11, CPUS)
    with pytest.raises(TravorderError, match="no devices given"):
        apply(model, x, [0] * 11, [])


def test_placement_needs_as_many_devices_as_its_cluster(tmp_path):
    model, x, _ = MODELS["rnn"]()
    g = capture_graph(model, x)
    on_first = place_graph(g, "k80x3", placer="single")  # uses device 0 of 3 only
    path = tmp_path / "single.json"
    save_placement(on_first, g, load_cluster("k80x3"), path)
    for placement in (on_first, path):
        for devices in (["cpu"], ["cpu"] * 4):
            with pytest.raises(TravorderError, match=f"cluster of 3 devices, but "
                                                     f"{len(devices)} devices? w(as|ere) given$"):
                apply(model, x, placement, devices)
    assert placement_slots(g, on_first, 3).tolist() == [0] * g.n_nodes


def test_bad_devices():
    model, x, _ = MODELS["rnn"]()
    with pytest.raises(TravorderError, match="unknown device 'tpu:0'"):
        apply(model, x, [0] * 11, ["cpu", "tpu:0"])
    if torch.cuda.device_count() < 100:
        with pytest.raises(TravorderError, match="device 'cuda:99' is not available"):
            apply(model, x, [0] * 11, ["cuda:99"])
    assert check_device(torch.device("cpu")) == "cpu"
    with pytest.raises(TravorderError, match=r"a list of device names, .* not one name"):
        apply(model, x, [0] * 11, "cpu")  # not "unknown device 'c'"
    with pytest.raises(TravorderError, match=r"'head\.weight' is on the meta device: it "
                                             r"holds no data to place"):
        model.head.to_empty(device="meta")
        apply(model, x, [0] * 11, ["cpu"])


class _DropoutByMode(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return F.dropout(self.lin(x), 0.5, training=self.training)  # read when traced


def test_a_forward_reading_its_mode_keeps_the_mode_it_was_placed_in():
    model, x = _DropoutByMode(), torch.ones(4, 8)
    placed = apply(model, x, [0, 1], CPUS[:2])
    placed.train()  # the mode it has: fine
    with pytest.raises(TravorderError, match=r"Placed_DropoutByMode was placed in train "
                                             r"mode and its forward reads self\.training"):
        placed.eval()  # once: still dropping out after eval()
    assert placed.training
    evaluating = apply(model.eval(), x, [0, 1], CPUS[:2])
    assert torch.equal(evaluating(x), model(x))  # no dropout
    assert evaluating.lin is placed.lin  # the two share parameters
    plain = apply(nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)), x, [0, 1], CPUS[:2])
    plain.eval()  # a dropout module reads its mode when it runs: switches as ever
    assert not plain.training and torch.equal(plain(x), plain(x))


def test_long_library_errors_are_cut_to_their_first_sentence():
    from travorder.errors import first_line

    long = RuntimeError("Could not run 'aten::empty' on 'MPS'. " + "Because. " * 400)
    assert first_line(long) == "Could not run 'aten::empty' on 'MPS'"
    assert first_line(ValueError("short. two.\nthree")) == "short. two."
    assert first_line(KeyError()) == "KeyError"


def test_time_step_trains_and_times():
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    ref = copy.deepcopy(net)
    x, y = torch.randn(5, 4), torch.randint(0, 2, (5,))
    placed = apply(net, x, [0, 1, 0], ["cpu", "cpu"])
    times = time_step(placed, x, lambda out: F.cross_entropy(out, y), steps=3, warmup=1)
    assert times.times_us.shape == (3,)
    assert 0 < times.min_us <= times.median_us
    # Four SGD steps (lr 1e-3) taken, as on the original.
    opt = torch.optim.SGD(ref.parameters(), lr=1e-3)
    for _ in range(4):
        opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        opt.step()
    assert torch.equal(placed.get_submodule("2").weight, ref[2].weight)
    with pytest.raises(TravorderError, match="steps must be an integer of at least 1, not 0"):
        time_step(placed, x, lambda out: out.sum(), steps=0)
    for kwargs, message in [  # each once a TypeError, ValueError or RuntimeError of torch's
            (dict(steps="2"), "steps must be an integer of at least 1, not '2'"),
            (dict(warmup=-1), "warmup must be an integer of at least 0, not -1"),
            (dict(loss_fn=None), "loss_fn must be a function of the module's output"),
            (dict(inputs=torch.randn(5, 3)), "a training step of PlacedSequential failed: "
                                             "mat1 and mat2 shapes cannot be multiplied"),
            (dict(module=nn.ReLU()), "ReLU has no parameters to train: give an optimizer")]:
        args = {"module": placed, "inputs": x, "loss_fn": lambda out: out.sum(), **kwargs}
        with pytest.raises(TravorderError, match=message):
            time_step(args.pop("module"), args.pop("inputs"), args.pop("loss_fn"), **args)
    with pytest.raises(TravorderError, match=r"loss_fn must return a one-element tensor to "
                                             r"call backward on, got a tensor of shape \("):
        time_step(placed, x, lambda out: out, steps=1, warmup=0)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_on_two_gpus():
    for name, make in MODELS.items():
        model, x, y = make()
        ref = copy.deepcopy(model)
        n = capture_graph(model, x).n_nodes
        placed = apply(model, x, [i % 2 for i in range(n)], ["cuda:0", "cuda:1"],
                       output_device="cpu")
        for pname, p in placed.named_parameters():
            assert p.device == torch.device(f"cuda:{placed.tensor_devices[pname]}")
        out, out_ref = placed(*x), ref(*x)
        torch.testing.assert_close(out, out_ref, rtol=1e-4, atol=1e-4)
        loss_for(name)(out, y).backward()
        loss_for(name)(out_ref, y).backward()
        ref_params = dict(ref.named_parameters())
        for pname, p in placed.named_parameters():
            torch.testing.assert_close(p.grad.cpu(), ref_params[pname].grad,
                                       rtol=1e-3, atol=1e-4)
