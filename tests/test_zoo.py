"""The model zoo: its registry, and the build loop's error capture (no torchvision needed)."""

from __future__ import annotations

import functools
import re
import time
from collections import Counter

import pytest

from travorder.datasets.corpus import read_manifest
from travorder.datasets.zoo import (
    EXPORTERS,
    ZOO_MODELS,
    InputSpec,
    ZooExportError,
    ZooModel,
    build_zoo,
    export_graph,
    read_failures,
    select_models,
)
from travorder.errors import TravorderError


def _fake(name: str, builder, kind: str = "image", size: int = 8) -> ZooModel:
    return ZooModel(name, "toy", "test", "fake", builder, InputSpec(kind, image_size=size))


def _linear() -> object:
    import torch

    return torch.nn.Linear(8, 4)


# ------------------------------------------------------------------ registry
def test_registry_is_large_and_diverse():
    families = Counter(m.family for m in ZOO_MODELS)
    assert len(ZOO_MODELS) >= 120
    assert len(families) >= 25
    assert {m.source for m in ZOO_MODELS} == {"torchvision", "timm", "transformers"}
    # leave-family-out needs no dominant family: even alone the zoo stays under 15 %
    assert max(families.values()) / len(ZOO_MODELS) < 0.15


def test_registry_entries_are_well_formed():
    names = [m.name for m in ZOO_MODELS]
    assert len(set(names)) == len(names)
    for m in ZOO_MODELS:
        assert re.fullmatch(r"[a-z0-9_]+", m.name), m.name
        assert re.fullmatch(r"[a-z0-9_]+", m.family), m.family
        assert m.arch and callable(m.builder)
        assert m.exporters and set(m.exporters) <= set(EXPORTERS)
    # every transformers model needs the dynamo exporter (tracing breaks on its masks)
    assert all(m.exporters == ("dynamo",) for m in ZOO_MODELS if m.source == "transformers")


def test_registry_covers_the_main_kinds_of_model():
    kinds = {m.inputs.kind for m in ZOO_MODELS}
    assert {"image", "video", "tokens", "seq2seq", "audio", "speech_seq2seq",
            "image_text"} <= kinds
    fams = {m.family for m in ZOO_MODELS}
    assert {"resnet", "vit", "mlp_mixer", "bert", "gpt", "t5", "whisper", "clip"} <= fams


def test_select_models_by_name_and_family():
    assert [m.name for m in select_models(names=["vgg16", "gpt2"])] == ["vgg16", "gpt2"]
    shuffle = select_models(families=["shufflenet"])
    assert [m.name for m in shuffle] == ["shufflenet_v2_x0_5", "shufflenet_v2_x1_0",
                                         "shufflenet_v2_x1_5", "shufflenet_v2_x2_0"]
    both = select_models(names=["alexnet"], families=["squeezenet"])
    assert [m.name for m in both] == ["alexnet", "squeezenet1_0", "squeezenet1_1"]
    assert len(select_models()) == len(ZOO_MODELS)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"names": ["resnet5O"]}, "no zoo model named 'resnet5O'"),
    ({"families": ["transformer"]}, "no zoo family named 'transformer'"),
])
def test_select_models_rejects_unknown(kwargs, message):
    with pytest.raises(TravorderError, match=re.escape(message)):
        select_models(**kwargs)


def test_input_spec_rejects_unknown_kind():
    with pytest.raises(TravorderError, match="unknown input kind 'picture'"):
        InputSpec("picture")


# ------------------------------------------------------------------ build loop
def test_build_captures_a_failing_builder(tmp_path):
    def boom() -> object:
        raise RuntimeError("no such layer\nsecond line")

    seen = []
    bad = _fake("bad", boom)
    graphs, failures = build_zoo(tmp_path, models=[bad], timeout_s=None,
                                 progress=lambda *a: seen.append(a))
    assert graphs == []
    assert [(f.name, f.family, f.source) for f in failures] == [("bad", "toy", "test")]
    assert failures[0].reason == "build: RuntimeError: no such layer second line"
    assert seen == [(1, 1, bad, failures[0])]
    assert read_failures(tmp_path) == [failures[0].to_dict()]


@pytest.mark.slow  # imports torch: seconds
def test_build_goes_on_after_a_failure_and_clears_it_when_fixed(tmp_path):
    pytest.importorskip("torch")
    build_zoo(tmp_path, models=[_fake("toy_linear", functools.partial(int, "x"))],
              timeout_s=None)
    assert [r["name"] for r in read_failures(tmp_path)] == ["toy_linear"]
    models = [_fake("broken", functools.partial(int, "x")), _fake("toy_linear", _linear)]
    graphs, failures = build_zoo(tmp_path, models=models, timeout_s=None)
    assert [g.name for g in graphs] == ["toy_linear"]
    assert [f.name for f in failures] == ["broken"]
    assert "ValueError: invalid literal for int()" in failures[0].reason
    assert [r["name"] for r in read_failures(tmp_path)] == ["broken"]
    (entry,) = read_manifest(tmp_path)
    assert (entry["name"], entry["family"], entry["source"]) == ("toy_linear", "toy",
                                                                 "test:fake")
    assert entry["builder"] == "travorder.datasets.zoo"


@pytest.mark.slow  # imports torch: seconds
def test_export_graph_costs_a_linear_layer():
    pytest.importorskip("torch")
    g = export_graph(_fake("toy_linear", _linear, size=8), batch_size=2)
    # x: (2, 3, 8, 8) @ W^T (8 -> 4): a MatMul of 2 * numel(Y) * K FLOPs plus the bias Add
    y = 2 * 3 * 8 * 4
    assert sorted(g.op_types.tolist()) == ["Add", "MatMul"]
    assert g.flops.sum() == 2 * y * 8 + y
    assert g.param_bytes.sum() == (8 * 4 + 4) * 4
    assert g.meta["family"] == "toy" and g.meta["source"] == "test:fake"
    assert g.meta["batch_size"] == 2 and g.meta["exporter"] == "torchscript"
    assert g.meta["input_shapes"] == {"pixel_values": [2, 3, 8, 8]}
    assert g.meta["mode"] == "train" and g.meta["n_unknown_shape_ops"] == 0


@pytest.mark.slow  # imports torch: seconds
def test_export_graph_reports_the_exporter_error():
    pytest.importorskip("torch")
    model = ZooModel("toy", "toy", "test", "fake", _linear, InputSpec("image", image_size=5),
                     exporters=("torchscript",))  # Linear(8, 4) on 5 features: fails
    with pytest.raises(ZooExportError, match=r"^torchscript: RuntimeError: .*5.*8"):
        export_graph(model)


def test_isolated_build_captures_errors_and_times_out():
    bad = _fake("bad", functools.partial(int, "x"))
    graphs, failures = build_zoo(None, models=[bad], timeout_s=120)
    assert graphs == []
    assert failures[0].reason.startswith("build: ValueError: invalid literal for int()")
    sleepy = _fake("sleepy", functools.partial(time.sleep, 600))
    start = time.monotonic()
    _, failures = build_zoo(None, models=[sleepy], timeout_s=1)
    assert time.monotonic() - start < 60
    assert [(f.name, f.reason) for f in failures] == [("sleepy", "timed out after 1 s")]


def test_build_rejects_bad_sizes():
    with pytest.raises(TravorderError, match="batch_size and seq_len must be positive"):
        build_zoo(None, models=[], batch_size=0)


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf")])
def test_build_rejects_bad_timeouts(timeout):
    with pytest.raises(TravorderError, match="timeout must be a positive number of seconds"):
        build_zoo(None, models=[], timeout_s=timeout)


def test_build_checks_the_corpus_folder_and_the_libraries_first(tmp_path, monkeypatch):
    toy = _fake("toy", _linear)
    with pytest.raises(TravorderError, match=r"cannot make corpus folder .* No such file"):
        build_zoo(tmp_path / "typo" / "corpus", models=[toy])
    (tmp_path / "afile").write_text("")
    with pytest.raises(TravorderError, match=r"corpus .*afile' is not a folder"):
        build_zoo(tmp_path / "afile", models=[toy])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]
    real = select_models(names=["resnet18"])
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name: None if name == "torchvision" else find_spec(name))
    with pytest.raises(TravorderError, match="needs torch, torchvision; not installed here: "
                                             "torchvision"):
        build_zoo(tmp_path / "corpus", models=real)
    assert not (tmp_path / "corpus").exists()
