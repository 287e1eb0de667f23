"""The command line: each command's output, and one clear line with exit code 2 for bad input."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from travorder.cli import main
from travorder.datasets.onnx_examples import residual_cnn
from travorder.errors import TravorderError
from travorder.graph import OpGraph, load_graph, save_graph
from travorder.graph.native import graph_to_dict
from travorder.placement.clusters import load_cluster
from travorder.predictor.active import bundled_model_dir

from .models import save_dynamic_model


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("m") / "resnet.onnx"
    onnx.save(residual_cnn(), path)
    return str(path)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_info_json(capsys, model):
    code, out, _ = run(capsys, "info", model, "--json", "--features")
    info = json.loads(out)
    g = load_graph(model)
    assert code == 0
    assert info["nodes"] == g.n_nodes and info["edges"] == g.n_edges
    assert info["flops"] == pytest.approx(g.flops.sum())
    assert info["unknown_shape_ops"] == []
    assert info["features"]["n_nodes"] == g.n_nodes


def test_info_table(capsys, model):
    code, out, _ = run(capsys, "info", model)
    n = load_graph(model).n_nodes
    assert code == 0 and "nodes / edges" in out and "FLOPs (forward)" in out
    assert f"placed as a training step of {2 * n} nodes" in out
    assert "None" not in out and "unknown / " in out  # no family in an ONNX file


def test_info_of_a_training_graph_says_so(capsys, model, tmp_path):
    path = tmp_path / "t.json.gz"
    assert run(capsys, "convert", model, str(path), "--training")[0] == 0
    code, out, _ = run(capsys, "info", str(path))
    assert code == 0 and "training step (forward and backward ops)" in out
    assert "FLOPs (forward and backward)" in out
    code, out, _ = run(capsys, "info", str(path), "--json")
    assert json.loads(out)["training_step_nodes"] == json.loads(out)["nodes"]


def test_recommend_order_says_which_graph_it_counts(capsys, model):
    code, out, _ = _recommend(capsys, model)
    n = load_graph(model).n_nodes
    assert code == 0 and f"({n} forward ops, placed as a {2 * n}-node training step)" in out


def test_convert_round_trip(capsys, model, tmp_path):
    out_path = tmp_path / "g.json.gz"
    code, out, _ = run(capsys, "convert", model, str(out_path), "--training")
    g = load_graph(out_path)
    assert code == 0 and "wrote" in out
    assert g.is_backward.sum() == load_graph(model).n_nodes


def test_place_then_simulate_agree(capsys, model, tmp_path):
    out_path = tmp_path / "p.json"
    code, out, _ = run(capsys, "place", model, "--placer", "m_etf", "--cluster",
                       "v100x4-nvlink", "-o", str(out_path), "--json")
    placed = json.loads(out)
    assert code == 0 and placed["placer"] == "m_etf"
    doc = json.loads(out_path.read_text())
    assert doc["graph"]["n_nodes"] == 2 * load_graph(model).n_nodes  # training graph
    code, out, _ = run(capsys, "simulate", model, str(out_path), "--json")
    assert code == 0
    assert json.loads(out)["step_time_us"] == pytest.approx(placed["step_time_us"])


def test_placements_of_a_converted_training_step_simulate_again(capsys, model, tmp_path):
    step, placement = str(tmp_path / "t.json.gz"), str(tmp_path / "p.json")
    assert run(capsys, "convert", model, step, "--training")[0] == 0
    for how in ([], ["--forward-only"]):  # the file records the step's batch, and its kind
        code, out, _ = run(capsys, "place", step, *how, "-o", placement, "--json")
        assert code == 0 and json.loads(out)["graph"]["batch"] == 1
        code, sim, err = run(capsys, "simulate", step, placement, "--json")
        assert code == 0, err
        assert json.loads(sim)["step_time_us"] == pytest.approx(
            json.loads(out)["step_time_us"])


def test_placements_of_a_batch_and_micro_batches_simulate_again(capsys, model, tmp_path):
    from travorder.cli import recommend_main

    step = ["--batch", "4", "--micro-batches", "2", "--cluster", "v100x4-nvlink"]
    code, out, _ = run(capsys, "place", model, *step, "-o", str(tmp_path / "p.json"), "--json")
    placed = json.loads(out)
    assert code == 0 and placed["graph"]["n_nodes"] == 2 * 2 * load_graph(model).n_nodes
    assert (placed["graph"]["batch"], placed["graph"]["micro_batches"]) == (4, 2)
    assert recommend_main([model, *step, "--place", str(tmp_path / "r.json")]) == 0
    capsys.readouterr()
    for path, want in (("p.json", placed["step_time_us"]),
                       ("r.json", json.loads((tmp_path / "r.json").read_text())[
                           "step_time_us"])):
        code, out, _ = run(capsys, "simulate", model, str(tmp_path / path), "--json")
        assert code == 0 and json.loads(out)["step_time_us"] == pytest.approx(want)
    _one_line_error(capsys, ["simulate", model, str(tmp_path / "p.json"), "--micro-batches",
                             "1"], "or its step at another batch, micro-batch count")


@pytest.fixture(scope="module")
def dynamic_model(tmp_path_factory) -> str:
    """A two-op ONNX model whose batch dimension is symbolic."""
    return save_dynamic_model(tmp_path_factory.mktemp("dyn") / "dynamic.onnx")


def test_dim_binds_symbolic_dimensions_and_placement_files_keep_them(
        capsys, dynamic_model, model, tmp_path):
    from travorder.cli import recommend_main

    code, out, _ = run(capsys, "info", dynamic_model, "--json")
    assert code == 0 and json.loads(out)["unknown_shape_ops"] == ["mm", "relu"]
    assert json.loads(out)["symbolic_dims"] == ["batch"]
    code, out, _ = run(capsys, "info", dynamic_model)
    assert "bind them with --dim batch=N" in out and "unknown" in out
    code, out, _ = run(capsys, "info", dynamic_model, "--dim", "batch=8", "--json")
    assert code == 0 and json.loads(out)["unknown_shape_ops"] == []
    assert json.loads(out)["symbolic_dims"] == [] and json.loads(out)["batch_size"] == 8
    assert json.loads(out)["dims"] == {"batch": 8}
    assert "batch=8" in run(capsys, "info", dynamic_model, "--dim", "batch=8")[1]
    assert json.loads(out)["flops"] == 2 * 8 * 64 * 64 + 8 * 64
    assert recommend_main([dynamic_model, "--json"]) == 0
    assert "unknown shape" in json.loads(capsys.readouterr().out)["warnings"][0]
    assert recommend_main([dynamic_model, "--dim", "batch=8", "--json"]) == 0
    assert not any("unknown shape" in w
                   for w in json.loads(capsys.readouterr().out)["warnings"])
    placement = str(tmp_path / "p.json")
    code, out, _ = run(capsys, "place", dynamic_model, "--dim", "batch=8", "-o", placement,
                       "--json")
    assert code == 0 and json.loads(out)["graph"]["dims"] == {"batch": 8}
    code, sim, _ = run(capsys, "simulate", dynamic_model, placement, "--json")  # the file's
    assert code == 0
    assert json.loads(sim)["step_time_us"] == pytest.approx(json.loads(out)["step_time_us"])
    for other in (["--dim", "batch=16"], ["--batch", "16"]):  # another step: refused
        _one_line_error(capsys, ["simulate", dynamic_model, placement, *other],
                        "(batch 8, 1 micro-batch, dim batch=8), not ")
    scaled = str(tmp_path / "p16.json")  # bound at 8, placed at 16
    code, out, _ = run(capsys, "place", dynamic_model, "--dim", "batch=8", "--batch", "16",
                       "-o", scaled, "--json")
    doc = json.loads(Path(scaled).read_text())
    old = str(tmp_path / "old.json")  # a file written before placement files kept dims
    Path(old).write_text(json.dumps({**doc, "graph": {
        k: v for k, v in doc["graph"].items() if k not in ("dims", "training")}}))
    for file, same in ((scaled, []), (scaled, ["--dim", "batch=8"]), (old, ["--dim",
                                                                           "batch=8"])):
        code, sim, err = run(capsys, "simulate", dynamic_model, file, *same, "--json")
        assert code == 0, err  # the file's dims given again, or given for it: its batch holds
        assert json.loads(sim)["step_time_us"] == pytest.approx(
            json.loads(out)["step_time_us"])
    _one_line_error(capsys, ["simulate", model, placement],  # the file's --dim: not this model
                    "no symbolic input dimension named batch to bind (the model has: none); "
                    f"the dimensions are those of placement file {placement!r}: a placement "
                    "of another model?")
    _one_line_error(capsys, ["info", dynamic_model, "--dim", "seq=2"],
                    "no symbolic input dimension named seq to bind (the model has: batch)")
    native = str(tmp_path / "g.json.gz")  # bound for good when converted
    assert run(capsys, "convert", dynamic_model, native, "--dim", "batch=2")[0] == 0
    _one_line_error(capsys, ["place", native, "--dim", "batch=4"],
                    "not an ONNX model, so it has no symbolic dimensions to bind (its shapes "
                    "were fixed when it was made, with batch=2)")
    code, out, _ = run(capsys, "place", native, "--dim", "batch=2", "-o", placement, "--json")
    assert code == 0 and json.loads(out)["graph"]["dims"] == {"batch": 2}
    code, sim, _ = run(capsys, "simulate", native, placement, "--json")
    assert json.loads(sim)["step_time_us"] == pytest.approx(json.loads(out)["step_time_us"])


@pytest.mark.parametrize(("dim", "says"), [
    (["batch"], "expected NAME=N with N an integer >= 1, got 'batch'"),
    (["batch=0"], "got 'batch=0'"), (["batch=x"], "got 'batch=x'"), (["=2"], "got '=2'"),
    (["batch=2", "--dim", "batch=3"], "batch given twice")])
def test_bad_dim_gets_one_line(capsys, dynamic_model, dim, says):
    with pytest.raises(SystemExit) as info:
        main(["place", dynamic_model, "--dim", *dim])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and err.startswith("error: ")
    assert says in err


def test_orders_one_per_line(capsys, model):
    code, out, _ = run(capsys, "orders", model, "--order", "alpha")
    names = out.split()
    assert code == 0 and names == sorted(names) and len(names) == load_graph(model).n_nodes


def test_clusters(capsys):
    code, out, _ = run(capsys, "clusters", "k80x3", "--json")
    assert code == 0 and json.loads(out)["link_model"] == "bus"
    code, out, _ = run(capsys, "clusters")
    assert code == 0 and "v100x4-nvlink" in out
    code, out, _ = run(capsys, "clusters", "hetero-a100x2-v100x2")  # in full: links too
    assert code == 0 and "link model channel" in out
    assert "  links: 12.00 GB/s to 25.00 GB/s, latency 10.0 us, busy 0.0 us" in out
    assert out.rstrip().endswith("after each transfer (--json: every pair)")
    code, out, _ = run(capsys, "clusters", "k80x3")  # one figure: --json gives one too
    assert code == 0 and out.rstrip().endswith("busy 25.0 us after each transfer")


def test_clusters_of_one_unlimited_device(capsys, tmp_path):
    path = tmp_path / "one.toml"
    path.write_text('name = "one"\n[[devices]]\nname = "gpu"\npeak_flops = 1e12\n'
                    'mem_bw = 1e11\n')
    code, out, _ = run(capsys, "clusters", str(path))
    assert code == 0 and out.startswith("one: 1 device, link model")
    assert "memory unlimited" in out and "links" not in out
    path.write_text(path.read_text().replace("1e12", "0.5"))  # once shown as "0 FLOP/s"
    assert "gpu: 0.5 FLOP/s" in run(capsys, "clusters", str(path))[1]


def _cyclic_onnx() -> onnx.ModelProto:
    nodes = [helper.make_node("Add", ["x", "b"], ["a"], name="first"),
             helper.make_node("Relu", ["a"], ["b"], name="second")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 4])
    return helper.make_model(helper.make_graph(nodes, "cyclic", [x], [y]))


def _bad_files(tmp_path, model):
    onnx_bytes = Path(model).read_bytes()
    future = graph_to_dict(OpGraph.from_records([{"name": "a"}], []))
    future["format_version"] = 99
    dnn = {"nodes": [{"id": 1, "fpgaLatency": 0.5, "size": 4, "colorClass": 0,
                      "isBackwardNode": False}],
           "edges": [{"sourceId": 1, "destId": 7, "cost": 1, "size": 4}]}
    cyclic = tmp_path / "cyclic.onnx"
    onnx.save(_cyclic_onnx(), cyclic)
    files = {
        "empty.onnx": (b"", "empty file"),
        "truncated.onnx": (onnx_bytes[: len(onnx_bytes) // 2], "onnx"),
        "text.onnx": (b"this is a text file, not a model\n", "onnx"),
        "future.json.gz": (gzip.compress(json.dumps(future).encode()), "version 99"),
        "dangling.json": (json.dumps(dnn).encode(), "7"),
    }
    cases = {"missing.onnx": "no such file", "cyclic.onnx": "cycle"}
    for name, (content, message) in files.items():
        (tmp_path / name).write_bytes(content)
        cases[name] = message
    return cases


def test_bad_model_files_get_one_line_and_exit_2(capsys, model, tmp_path):
    for name, message in _bad_files(tmp_path, model).items():
        code, _out, err = run(capsys, "info", str(tmp_path / name))
        assert code == 2, name
        assert err.count("\n") == 1 and err.startswith("error: "), (name, err)
        assert message.lower() in err.lower(), (name, err)
        assert "Traceback" not in err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_pipe_or_a_device_is_refused_before_it_is_read(capsys, model, tmp_path):
    pipe = tmp_path / "pipe.toml"  # once read for ever (a pipe) or until memory ran out
    os.mkfifo(pipe)
    for argv, what in ((["info", str(pipe)], "model file"),
                       (["orders", "/dev/zero"], "model file"),
                       (["place", model, "--cluster", str(pipe)], "cluster file"),
                       (["simulate", model, str(pipe)], "placement file"),
                       (["study", "run", str(pipe), "--store", str(tmp_path / "s.sqlite")],
                        "study spec")):
        _one_line_error(capsys, argv, "is not a regular file (a device or a pipe): give a "
                                      f"{what}")
    assert not (tmp_path / "s.sqlite").exists()
    _one_line_error(capsys, ["study", "run", str(tmp_path), "--store", "s.sqlite"],
                    f"{str(tmp_path)!r} is a folder, not a study spec")


def _placement_cases(tmp_path, model, capsys):
    good = tmp_path / "good.json"
    assert run(capsys, "place", model, "-o", str(good), "--json")[0] == 0
    doc = json.loads(good.read_text())
    short = dict(doc, placement=dict(list(doc["placement"].items())[:-1]))
    far = dict(doc, placement={k: 7 for k in doc["placement"]})
    other = dict(doc, graph=dict(doc["graph"], graph_hash="0" * 64))
    neg = {"name": "bad", "link_model": "link",
           "devices": [{"name": "gpu", "count": 2, "peak_flops": 1e12, "mem_bw": 1e11}],
           "links": {"bandwidth": -5.0, "latency": 1.0}}
    nameless = {k: v for k, v in doc.items() if k != "cluster"}
    deviceless = dict(doc, cluster=dict(doc["cluster"], devices=[]))
    preset = dict(doc, cluster="k80x3")
    hashless = dict(doc, graph={k: v for k, v in doc["graph"].items() if k != "graph_hash"})
    devs = doc["devices"]  # once simulated by index whatever the names
    renamed, twice = dict(doc, devices=devs[::-1]), dict(doc, devices=[devs[0]] * len(devs))
    for name, d in [("renamed.json", renamed), ("twice.json", twice), ("short.json", short),
                    ("far.json", far), ("other.json", other), ("neg.json", neg),
                    ("nameless.json", nameless),
                    ("deviceless.json", deviceless), ("preset.json", preset),
                    ("hashless.json", hashless)]:
        (tmp_path / name).write_text(json.dumps(d))
    return [
        (["simulate", model, str(tmp_path / "nameless.json")], "give --cluster"),
        (["simulate", model, str(tmp_path / "preset.json")],
         "has a 'cluster' entry that is not a cluster table: give --cluster"),
        (["simulate", model, str(tmp_path / "hashless.json")], "lacks graph.graph_hash"),
        (["simulate", model, str(tmp_path / "renamed.json")],
         f"places on devices {doc['devices'][::-1]}, but its cluster 'k80x3' has "
         f"{doc['devices']} (an edited file?); give --cluster"),
        (["simulate", model, str(tmp_path / "twice.json")],
         "devices must be a non-empty list of distinct device names"),
        (["simulate", model, str(tmp_path / "deviceless.json")],
         f"placement file {str(tmp_path / 'deviceless.json')!r}: cluster"),
        (["convert", model, str(tmp_path / "out.onnx")], "ending in .json.gz"),
        (["simulate", model, str(good), "--trace", str(tmp_path / "t.json"), "--gantt",
          str(tmp_path / "no" / "g.png")], "no such directory"),
        (["simulate", model, str(tmp_path / "short.json")], "does not place node"),
        (["simulate", model, str(tmp_path / "far.json")], "on device"),
        (["simulate", model, str(tmp_path / "other.json")], "placement is for graph"),
        (["place", model, "--cluster", str(tmp_path / "neg.json")], "bandwidth"),
        (["place", model, "--cluster", "tpu-pod"], "unknown cluster"),
        (["place", model, "--order", "sideways"], "unknown order"),
        (["place", model, "--placer", "magic"], "unknown placer"),
        (["orders", model, "--order", "sideways"], "unknown order"),
    ]


def test_bad_placement_input_gets_one_line_and_exit_2(capsys, model, tmp_path):
    for argv, message in _placement_cases(tmp_path, model, capsys):
        code, _out, err = run(capsys, *argv)
        assert code == 2, argv
        assert err.count("\n") == 1 and message in err, (argv, err)
    assert not (tmp_path / "t.json").exists()  # the trace waits for the Gantt's folder


def test_failed_place_writes_nothing(capsys, model, tmp_path):
    out_path = tmp_path / "p.json"
    code, _, _ = run(capsys, "place", model, "--order", "sideways", "-o", str(out_path))
    assert code == 2 and not out_path.exists()


def test_place_takes_placer_options_and_coarsening(capsys, model, tmp_path):
    out_path = tmp_path / "rl.json"
    code, out, _ = run(capsys, "place", model, "--placer", "rl", "--order", "topo_lifo",
                       "--option", "preset=paper", "-O", "episodes=3", "-O", "network=torch",
                       "--coarsen", "12", "--json", "-o", str(out_path))
    placed = json.loads(out)
    assert code == 0 and placed["placer"] == "rl" and placed["feasible"]
    code, out, _ = run(capsys, "simulate", model, str(out_path), "--json")
    assert code == 0  # the placement covers every op of the full graph
    assert json.loads(out)["step_time_us"] == pytest.approx(placed["step_time_us"])
    code, out, _ = run(capsys, "place", model, "--placer", "greedy", "-O", "colocate=false",
                       "--json")
    assert code == 0 and json.loads(out)["placer"] == "greedy"


@pytest.mark.parametrize(("args", "message"), [
    (["-O", "episodes"], "KEY=VALUE"),
    (["-O", "=3"], "KEY=VALUE"),
    (["-O", "episodes=2", "-O", "episodes=3"], "given twice"),
    (["-O", "episodes=many"], "episodes must be int"),
    (["-O", "bogus=1"], "no option 'bogus'"),
    (["-O", "preset=huge"], "unknown rl preset"),
    (["-O", "network=jax"], "network must be one of numpy, torch"),
    (["--coarsen", "0"], "--coarsen"),
    (["--placer", "greedy", "-O", "colocate=maybe"], "colocate must be true or false"),
])
def test_bad_placer_options_get_one_line_and_exit_2(capsys, model, tmp_path, args, message):
    out_path = tmp_path / "p.json"
    code, _, err = run(capsys, "place", model, "--placer", "rl", *args, "-o", str(out_path))
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert not out_path.exists()


def test_console_script_exit_code(tmp_path):
    g = OpGraph.from_records([{"name": "a"}], [])
    save_graph(g, tmp_path / "g.json.gz")
    ok = subprocess.run([sys.executable, "-m", "travorder.cli", "info",
                         str(tmp_path / "g.json.gz"), "--json"], capture_output=True, text=True)
    bad = subprocess.run([sys.executable, "-m", "travorder.cli", "info",
                          str(tmp_path / "none.onnx")], capture_output=True, text=True)
    assert ok.returncode == 0 and json.loads(ok.stdout)["nodes"] == 1
    assert bad.returncode == 2 and bad.stderr.strip().endswith("no such file")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_output_to_a_full_disk_is_one_line(tmp_path):
    # once an OSError traceback, exit 1 (text and JSON, a short or a long output)
    for argv in (["clusters", "k80x3"], ["clusters", "k80x3", "--json"], ["zoo", "list"]):
        with open("/dev/full", "w") as full:
            done = subprocess.run([sys.executable, "-m", "travorder.cli", *argv], stdout=full,
                                  stderr=subprocess.PIPE, text=True)
        assert (done.returncode, done.stderr) == (
            2, "error: cannot write the output: No space left on device\n"), argv


SPEC = """
name = "tiny"
orders = ["topo", "dfs_preorder"]
seeds = [0]
clusters = ["k80x3"]

[placer]
name = "greedy"

[[graphs.synthetic]]
family = "chain"
seeds = [0, 1]
params = {n_layers = 4}
"""


def test_study_commands_run_status_export_report(capsys, tmp_path):
    spec, store = tmp_path / "tiny.toml", tmp_path / "s.sqlite"
    spec.write_text(SPEC)
    code, out, err = run(capsys, "study", "run", str(spec), "--store", str(store),
                         "--no-progress")
    assert code == 0 and "4 jobs" in out and "ran 4" in out and "warning" not in err
    etf = tmp_path / "etf.toml"
    etf.write_text(SPEC.replace('"greedy"', '"m_etf"'))
    code, out, err = run(capsys, "study", "run", str(etf), "--store", str(tmp_path / "e.db"),
                         "--no-progress")
    assert code == 0 and err == ("warning: placer 'm_etf' fixes its own visiting order: "
                                 "every order gives it the same placement, so the study's "
                                 "2 orders will all tie\n")
    code, out, _ = run(capsys, "study", "run", str(spec), "--store", str(store))
    assert code == 0 and "ran 0" in out and out.count("\n") == 1  # progress: on stderr
    code, out, _ = run(capsys, "study", "status", "--store", str(store), "--json")
    assert code == 0 and json.loads(out)["done"] == 4
    code, out, _ = run(capsys, "study", "export", "--store", str(store), "--out",
                       str(tmp_path / "d.csv"))
    assert code == 0 and "2 rows" in out


def test_study_bad_input(capsys, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(SPEC.replace('"greedy"', '"nonsense"'))
    code, _, err = run(capsys, "study", "run", str(bad), "--store", str(tmp_path / "s.db"),
                       "--no-progress")
    assert code == 2 and "nonsense" in err and err.count("\n") == 1
    code, _, err = run(capsys, "study", "status", "--store", str(tmp_path / "none.sqlite"))
    assert code == 2 and err.count("\n") == 1


def test_zoo_list(capsys):
    code, out, _ = run(capsys, "zoo", "list", "--family", "rnn", "--json")
    entries = json.loads(out)
    assert code == 0 and entries and {e["family"] for e in entries} == {"rnn"}
    code, _, err = run(capsys, "zoo", "list", "--family", "no_such_family")
    assert code == 2 and "no_such_family" in err and err.count("\n") == 1


def _one_line_error(capsys, argv: list[str], message: str) -> None:
    code, _out, err = run(capsys, *argv)
    assert code == 2, argv
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, (argv, err)


def test_a_placement_files_batch_on_a_graph_without_one_names_the_file(capsys, model,
                                                                        tmp_path):
    placement = str(tmp_path / "p8.json")
    assert run(capsys, "place", model, "--batch", "8", "-o", placement, "--json")[0] == 0
    tiny = str(tmp_path / "tiny.json.gz")  # records no batch_size
    save_graph(OpGraph.from_records([{"name": "a", "flops": 1e9}, {"name": "b"}],
                                    [("a", "b")]), tiny)
    _one_line_error(capsys, ["simulate", tiny, placement],
                    "cannot be scaled to batch 8; the batch is that of placement file "
                    f"{placement!r}: a placement of another model?")
    _one_line_error(capsys, ["simulate", tiny, placement, "--batch", "4"],
                    "records no batch_size, so it cannot be scaled to batch 4")


def test_output_in_missing_folder_is_refused_before_any_work(capsys, model, tmp_path):
    missing = tmp_path / "no" / "dir"
    for argv in (["place", model, "-o", str(missing / "p.json")],
                 ["convert", model, str(missing / "g.json.gz")],
                 ["calibrate", "--devices", "cpu", "--out", str(missing / "c.toml")]):
        _one_line_error(capsys, argv, "no such directory")
    code, _out, err = _recommend(capsys, model, "--place", str(missing / "p.json"))
    assert code == 2 and err.count("\n") == 1 and "no such directory" in err
    assert not (tmp_path / "no").exists()


def test_output_that_is_an_input_is_refused_before_any_work(capsys, model, tmp_path):
    graph, placement = tmp_path / "g.json.gz", tmp_path / "p.json"
    assert run(capsys, "convert", model, str(graph))[0] == 0
    assert run(capsys, "place", str(graph), "-o", str(placement))[0] == 0
    (tmp_path / "link.json.gz").symlink_to(graph)
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps(load_cluster("k80x3").to_dict()))
    kept = graph.read_bytes(), placement.read_bytes()
    for argv, given in ((["place", str(graph), "--cluster", str(cluster), "-o", str(cluster)],
                         cluster),
                        (["convert", str(graph), str(tmp_path / "link.json.gz")], graph),
                        (["simulate", str(graph), str(placement), "--trace", str(placement)],
                         placement),
                        (["study", "export", "--store", str(placement), "--out",
                          str(placement)], placement)):
        _one_line_error(capsys, argv, f"is an input of the command ({str(given)!r}): "
                                      f"writing it would replace it")
    code, _out, err = _recommend(capsys, str(graph), "--cluster", str(cluster), "--place",
                                 str(cluster))
    assert code == 2 and err.count("\n") == 1 and "is an input of the command" in err
    code, _out, err = run(capsys, "simulate", str(graph), str(placement), "--trace",
                          str(tmp_path / "x.json"), "--gantt", str(tmp_path / "x.json"))
    assert code == 2 and "--trace and --gantt name the same file" in err
    store = tmp_path / "s.sqlite"  # once replaced by a placement, whatever its name
    store.write_bytes(b"SQLite format 3\0")
    for argv, what in ((["place", str(graph), "-o", str(graph)], "a placement"),
                       (["place", str(graph), "-o", str(store)], "a placement"),
                       (["simulate", str(graph), str(placement), "--trace", str(store)],
                        "a Chrome trace")):
        _one_line_error(capsys, argv, f"{str(argv[-1])!r}: {what} is written as JSON; give "
                                      f"a file name ending in .json")
    code, _out, err = _recommend(capsys, str(graph), "--place", str(store))
    assert code == 2 and "a placement is written as JSON" in err
    assert store.read_bytes() == b"SQLite format 3\0"
    mine = shutil.copytree(bundled_model_dir(), tmp_path / "model")  # its files too
    kept_model = (mine / "manifest.json").read_bytes()
    code, _out, err = _recommend(capsys, str(graph), "--predictor", str(mine), "--place",
                                 str(mine / "manifest.json"))
    assert code == 2 and err.count("\n") == 1 and "is an input of the command" in err
    assert (mine / "manifest.json").read_bytes() == kept_model
    for _ in range(2):  # another file in the model's folder is no input
        code, _out, err = _recommend(capsys, str(graph), "--predictor", str(mine), "--place",
                                     str(mine / "p.json"))
        assert code == 0, err
    assert (graph.read_bytes(), placement.read_bytes()) == kept


def _recommend(capsys, *argv: str) -> tuple[int, str, str]:
    from travorder.cli import recommend_main

    code = recommend_main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_negative_seed_gets_one_line(capsys, model):
    _one_line_error(capsys, ["orders", model, "--seed", "-1"], "non-negative")
    _one_line_error(capsys, ["place", model, "--placer", "random", "--seed", "-1"],
                    "non-negative")
    for check in (["--verify", "2"], []):  # checked or not, the seed is refused
        code, _out, err = _recommend(capsys, model, *check, "--seed", "-1")
        assert code == 2 and "non-negative" in err and err.count("\n") == 1


@pytest.mark.parametrize(("argv", "says"), [
    (["--budget", "abc"], "--budget"), (["--batch", "2.5"], "--batch"),
    (["--batch", "0"], "error: batch must be an integer from 1 to 2**63 - 1, got 0"),
    (["--batch", str(2**63)], "error: batch must be an integer from 1 to 2**63 - 1, got "),
    (["--micro-batches", "0"], "error: micro-batches must be an integer >= 1, got 0"),
    (["--verify", "2", "--budget", "1"], "not allowed with"),
    (["--explain", "--top", "0"], "--top"),
    (["--top", "3"], "error: --top sets how many features --explain shows: give --explain"),
    (["--micro-batches", "2"], "error: 2 micro-batches of a batch of 1: a micro-batch holds "
                               "one sample at least (give a batch of 2 or more)")])
def test_bad_recommend_arguments_get_one_line(capsys, model, argv, says):
    try:
        code, out, err = _recommend(capsys, model, *argv)
    except SystemExit as exc:  # argparse's own checks exit from the parser
        (out, err), code = capsys.readouterr(), exc.code
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("error: ")
    assert says in err


@pytest.mark.parametrize("argv", [
    ["recommend-order", "{model}", "--place", ""], ["recommend-order", ""],
    ["recommend-order", "{model}", "--predictor", ""], ["orders", "{model}", "--order", ""],
    ["clusters", ""], ["place", "{model}", "-O", ""], ["zoo", "list", "--family", "x", ""],
    ["place", "{model}", "--cluster", ""]])
def test_an_empty_argument_is_refused_not_taken_as_absent(capsys, model, argv):
    # `--place ""` placed nothing, `--order ""` printed every order, `clusters ""` listed all
    from travorder.cli import recommend_main

    command, *rest = [a.format(model=model) for a in argv]
    with pytest.raises(SystemExit) as info:
        recommend_main(rest) if command == "recommend-order" else main([command, *rest])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and "an empty value" in err, err


def test_unknown_command_and_placer_get_one_line(capsys):
    with pytest.raises(SystemExit) as info:
        main(["nosuch"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and "invalid choice" in err
    _one_line_error(capsys, ["model", "show", "--placer", "nope"], "unknown placer")
    _one_line_error(capsys, ["model", "reset", "--placer", "nope"], "unknown placer")
    with pytest.raises(SystemExit) as info:  # the command's own help, not the top one's
        main(["model", "show", "--bogus"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err == ("error: unrecognized arguments: --bogus "
                                            "(see travorder model show --help)\n")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_output_that_cannot_be_written_is_refused_before_any_work(capsys, model):
    out_path = "/proc/travorder-test.json"  # a folder where no file can be made, even by root
    _one_line_error(capsys, ["place", model, "-o", out_path], "cannot write")
    code, out, err = _recommend(capsys, model, "--place", out_path)
    assert code == 2 and out == "" and err.count("\n") == 1 and "cannot write" in err


def test_a_file_system_error_gets_one_line_and_leaves_no_file(capsys, model, tmp_path,
                                                               monkeypatch):
    def full(self, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", full)
    out_path = tmp_path / "g.json.gz"
    _one_line_error(capsys, ["convert", model, str(out_path)],
                    f"cannot write graph '{out_path}': No space left on device")
    assert list(tmp_path.iterdir()) == []  # neither the file nor its temporary twin
    monkeypatch.undo()
    from travorder.errors import TravorderError, write_file

    (tmp_path / "afile").write_text("")
    with pytest.raises(TravorderError, match=r"cannot write JSON .*: Not a directory"):
        write_file(tmp_path / "afile" / "x.json", "{}", "JSON")  # its cleanup fails too

    def refused(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "rename", refused)  # any other file error: one line too
    code, _, err = run(capsys, "study", "report", "bundled:rl", "--out", str(tmp_path / "r"))
    assert code == 2 and err.count("\n") == 1 and "Permission denied" in err

    def broken(self, *args, **kwargs):
        raise OSError(5, "Input/output error")  # no file named: a bug, with its traceback

    monkeypatch.setattr(Path, "rename", broken)
    with pytest.raises(OSError, match="Input/output error"):
        run(capsys, "study", "report", "bundled:rl", "--out", str(tmp_path / "r"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # no report half-made


def test_writing_through_a_link_keeps_the_link_and_the_permissions(tmp_path):
    from travorder.errors import write_file

    target, link = tmp_path / "cluster.json", tmp_path / "link.json"
    target.write_text("old")
    target.chmod(0o640)
    link.symlink_to(target)
    write_file(link, "new", "cluster")
    assert link.is_symlink() and target.read_text() == "new"
    assert target.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.json", "link.json"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_pipe_or_device_is_written_into_not_replaced(tmp_path, capsys, model):
    import threading

    pipe = tmp_path / "out.json"
    os.mkfifo(pipe)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(pipe.read_bytes()), daemon=True)
    reader.start()
    code, _, _ = run(capsys, "place", model, "-o", str(pipe))
    reader.join(timeout=30)
    assert code == 0 and pipe.is_fifo() and json.loads(received[0])["format"] == (
        "travorder.placement")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_files_written_in_place(tmp_path):
    from travorder.errors import writes_in_place

    (tmp_path / "f.json").write_text("")
    assert writes_in_place(os.devnull) and not writes_in_place(tmp_path / "f.json")
    assert not writes_in_place(tmp_path) and not writes_in_place(tmp_path / "missing")
    out = tmp_path / "out.txt"  # the file this process's output goes to: not cut off
    script = ("import sys; from travorder.errors import write_file; print('before', "
              "flush=True); write_file(sys.argv[1], 'DATA', 'x'); print('after', flush=True)")
    with out.open("w") as stdout:
        subprocess.run([sys.executable, "-c", script, str(out)], stdout=stdout, check=True)
    assert out.read_bytes().startswith(b"DATA") and b"after" in out.read_bytes()


def test_recommend_with_an_unknown_placer_gets_one_line(capsys, model):
    code, out, err = _recommend(capsys, model, "--placer", "magic")
    assert code == 2 and out == "" and err.count("\n") == 1 and "unknown placer" in err


def test_train_out_naming_a_file_is_refused(capsys, tmp_path):
    existing = tmp_path / "model"
    existing.write_text("not a directory")
    _one_line_error(capsys, ["train", "--out", str(existing)], "is a file")
    assert existing.read_text() == "not a directory"
    corpus = tmp_path / "corpus"  # once its manifest was replaced by the model's
    corpus.mkdir()
    (corpus / "manifest.json").write_text('{"format": "travorder.corpus"}')
    for reads in (["--corpus", str(corpus)], []):  # the corpus it reads, or any other
        _one_line_error(capsys, ["train", "--data", "bundled:rl", *reads, "--out", str(corpus)],
                        f"{str(corpus)!r} holds a manifest.json that is not an order "
                        f"predictor's (a graph corpus?)")
    assert (corpus / "manifest.json").read_text() == '{"format": "travorder.corpus"}'


def test_report_of_missing_store_writes_nothing(capsys, tmp_path):
    out = tmp_path / "report"
    _one_line_error(capsys, ["study", "report", str(tmp_path / "none.sqlite"),
                             "--out", str(out)], "no such result store")
    assert not out.exists()


def test_a_report_is_all_written_or_not_at_all(capsys, tmp_path, monkeypatch):
    from travorder.study import report
    from travorder.study.report import _umask

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "_curves", interrupted)  # after the figures, before the page
    with pytest.raises(KeyboardInterrupt):
        report.write_report("bundled:rl", tmp_path / "r")
    assert list(tmp_path.iterdir()) == []  # neither the report nor its temporary folder
    bad = tmp_path / "bad.csv"
    bundled = report.read_sources(["bundled:rl"]).head(3)
    bundled.astype({"time_bfs": object}).assign(time_bfs="abc").to_csv(bad, index=False)
    _one_line_error(capsys, ["study", "report", str(bad), "--out", str(tmp_path / "r")],
                    "column 'time_bfs' holds values that are not numbers")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv"]
    good = tmp_path / "good.csv"
    bundled.to_csv(good, index=False)
    monkeypatch.undo()
    for _ in range(2):  # made, then written again into the folder that is there
        files = report.write_report(good, tmp_path / "r")
        assert sorted(p.name for p in (tmp_path / "r").iterdir()) == sorted(
            f.name for f in files)  # no temporary folder left inside
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv", "good.csv", "r"]
    assert (tmp_path / "r").stat().st_mode & 0o777 == 0o777 & ~_umask()


@pytest.mark.parametrize("command", [["train", "--data", "bundled:rl"],
                                     ["study", "report", "bundled:rl", "--evaluate"]])
def test_output_folders_are_checked_before_any_work(capsys, tmp_path, monkeypatch, command):
    from travorder.predictor import train
    from travorder.study import export

    for module in (export, train):  # reading the data: a TypeError
        monkeypatch.setattr(module, "read_sources", None)
    (tmp_path / "afile").write_text("")
    for out, message in ((tmp_path / "no" / "m", "no such directory"),
                         (tmp_path / "afile", "is a file, not a folder"),
                         (tmp_path / "afile" / "m", "afile' is a file, not a folder, in"),
                         (Path("/proc/travorder-test"), "cannot write")):
        if str(out).startswith("/proc") and not Path("/proc/self").is_dir():
            continue
        _one_line_error(capsys, [*command, "--out", str(out)], message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_training_options_and_data_are_checked_first(capsys, tmp_path):
    out = str(tmp_path / "m")
    _one_line_error(capsys, ["train", "--data", "bundled:rl", "--out", out, "--force"],
                    "--force goes with --use-as-default")
    for command in (["train", "--out", out], ["evaluate"]):
        _one_line_error(capsys, [*command, "--data", "bundled:rl", "--placer", "nope"],
                        "unknown placer 'nope'")
    header = tmp_path / "empty.csv"
    header.write_text(",".join(["graph", "graph_hash", "family", "cluster", "best_order", "ties",
                                "placer", "time_topo", "time_bfs"]) + "\n")
    _one_line_error(capsys, ["evaluate", "--data", str(header)], "the dataset has no rows")
    _one_line_error(capsys, ["study", "report", "bundled:rl", "--study", "nope", "--out",
                             str(tmp_path / "r")], "no store is given")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.csv"]


def test_zoo_build_needs_a_corpus_or_into_bundled(capsys, tmp_path):
    _one_line_error(capsys, ["zoo", "build", "--name", "alexnet"], "--into-bundled")
    _one_line_error(capsys, ["zoo", "build", "--name", "alexnet", "--corpus", str(tmp_path),
                             "--into-bundled"], "--into-bundled")


def test_zoo_build_reports_failures_and_goes_on(capsys, monkeypatch, tmp_path):
    import functools

    from travorder.datasets import zoo
    from travorder.datasets.zoo import InputSpec, ZooModel

    # A builder that fails as a missing torchvision model would; in this process.
    fake = ZooModel("broken_net", "toy", "test", "fake", functools.partial(int, "x"),
                    InputSpec("image"))
    monkeypatch.setattr(zoo, "build_zoo", functools.partial(zoo.build_zoo, models=[fake],
                                                            timeout_s=None))
    code, out, err = run(capsys, "zoo", "build", "--corpus", str(tmp_path / "c"))
    assert code == 0 and err == ""
    assert "[1/1] broken_net: FAILED: build: ValueError: invalid literal" in out
    assert "built 0 graphs; 1 models failed" in out
    assert [r["name"] for r in zoo.read_failures(tmp_path / "c")] == ["broken_net"]


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, str]:
    """Two small study datasets (CSV, 5 families): in ``learnable`` the best order
    is a function of the features (bfs on parallel graphs, topo on the rest), in
    ``fixed`` topo always wins, so no predictor can beat always-topo."""
    import pandas as pd

    from travorder.datasets.synthetic import SYNTHETIC_FAMILIES
    from travorder.featurize import graph_features
    from travorder.graph import training_graph

    rows = []
    for fam in ("chain", "resnet", "inception", "rnn", "transformer"):
        for seed in range(4):
            g = training_graph(SYNTHETIC_FAMILIES[fam](seed=seed))
            f = graph_features(g)
            for cluster in ("k80x3", "v100x4-nvlink"):
                rows.append({"graph": g.name, "graph_hash": g.graph_hash, "family": fam,
                             "cluster": cluster,
                             "placer": "greedy", **{f"f_{k}": v for k, v in f.items()},
                             "wide": f["parallelism"] > 1.15})
    frame = pd.DataFrame(rows)
    out = tmp_path_factory.mktemp("data")
    paths = {}
    for name, topo, bfs in (("learnable", frame["wide"].map({True: 1.3, False: 1.0}),
                             frame["wide"].map({True: 1.0, False: 1.4})),
                            ("fixed", 1.0, 1.4)):
        data = frame.drop(columns="wide").assign(time_topo=topo, time_bfs=bfs,
                                                 time_dfs_preorder=2.0, ties="")
        data["best_order"] = data[["time_topo", "time_bfs"]].idxmin(axis=1).str[5:]
        paths[name] = str(out / f"{name}.csv")
        data.to_csv(paths[name], index=False)
    return paths


@pytest.fixture
def config_home(monkeypatch, tmp_path) -> Path:
    """A user config directory of the test's own, and no TRAVORDER_MODEL."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("TRAVORDER_MODEL", raising=False)
    return tmp_path / "config" / "travorder" / "model"


def test_an_install_that_cannot_be_made_is_refused_before_training(capsys, monkeypatch,
                                                                    tmp_path):
    (tmp_path / "config").write_text("a file where the config folder would be")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    _one_line_error(capsys, ["train", "--data", "bundled:rl", "--out", str(tmp_path / "m"),
                             "--use-as-default"],  # once said after the whole training
                    f"cannot install a model as the default "
                    f"({tmp_path / 'config' / 'travorder' / 'model'}): ")
    assert not (tmp_path / "m").exists()


def test_a_user_default_that_is_not_a_model_is_named_beside_the_bundled_one(capsys,
                                                                            config_home):
    config_home.parent.mkdir(parents=True)
    config_home.write_text("not a model")  # once skipped unsaid for the bundled model
    code, text, _ = run(capsys, "model", "show")
    assert code == 0 and (f"(bundled default; {config_home} is a file, not a model)"
                          in text)
    config_home.unlink()
    config_home.mkdir()
    code, text, _ = run(capsys, "model", "show")
    assert f"{config_home} is a folder without manifest.json, not a model" in text


def test_a_model_named_by_the_environment_is_named_so(capsys, config_home, monkeypatch,
                                                       tmp_path, model):
    monkeypatch.setenv("TRAVORDER_MODEL", str(tmp_path / "nodir"))
    code, _out, err = _recommend(capsys, model)
    assert code == 2 and err == (f"error: {tmp_path / 'nodir'}: no predictor here (no "
                                 f"manifest.json) (the model the environment variable "
                                 f"TRAVORDER_MODEL names)\n")  # once without the variable
    code, text, err = run(capsys, "model", "reset")  # once "now uses nodir", no more said
    assert code == 0 and f"now uses {tmp_path / 'nodir'} (TRAVORDER_MODEL)" in text
    assert err.startswith(f"warning: {str(tmp_path / 'nodir')!r} holds no model")


def test_each_placer_has_its_own_default_model(capsys, datasets, config_home, tmp_path):
    import pandas as pd

    rl_data = tmp_path / "rl.csv"
    pd.read_csv(datasets["learnable"]).assign(placer="rl").to_csv(rl_data, index=False)
    code, text, err = run(capsys, "train", "--data", str(rl_data), "--placer", "rl",
                          "--out", str(tmp_path / "m"), "--kinds", "classifier",
                          "--use-as-default")
    rl_home = config_home.with_name("model-rl")
    assert code == 0 and f"installed as the default model: {rl_home}" in text, err
    code, text, _ = run(capsys, "model", "show", "--placer", "rl")
    assert f"active model: {rl_home} (user default)" in text and "placer: rl" in text
    code, text, _ = run(capsys, "model", "show")  # greedy's default is untouched
    assert "(bundled default)" in text and "placer: greedy" in text
    code, text, _ = run(capsys, "model", "reset", "--placer", "rl")
    assert code == 0 and f"removed the user default model {rl_home}" in text
    assert not rl_home.exists()


def test_train_model_show_evaluate_and_reset(capsys, datasets, config_home, tmp_path):
    import pandas as pd

    n = len(pd.read_csv(datasets["learnable"]).drop_duplicates(["graph_hash", "cluster"]))
    out = tmp_path / "model"
    code, text, err = run(capsys, "train", "--data", datasets["learnable"], "--out", str(out),
                          "--kinds", "classifier", "--use-as-default")
    assert code == 0 and f"trained classifier on {n} rows" in text, err
    # progress: every fold of every kind, then the final fit
    assert [line for line in err.splitlines() if "fold" in line] == [
        f"classifier: fold {i}/5 (holding out {fam})" for i, fam in
        enumerate(["chain", "inception", "resnet", "rnn", "transformer"], 1)]
    assert f"fitting classifier on all {n} rows" in err and "warning" not in err
    assert f"installed as the default model: {config_home}" in text
    # the comparison: the fixed order chosen on the training folds, per scenario and family
    assert "against the best fixed order chosen on the training folds" in text
    assert "mean regret per scenario and cluster" in text
    assert "families worse than best-fixed beyond noise" in text

    code, text, _ = run(capsys, "model", "show")
    assert code == 0 and f"active model: {config_home} (user default)" in text
    assert "kind: classifier" in text and f"n_rows: {n}" in text
    code, text, _ = run(capsys, "model", "show", "--json")
    assert json.loads(text)["manifest"]["kind"] == "classifier"

    code, text, err = run(capsys, "evaluate", "--data", datasets["learnable"], "--kinds",
                          "classifier", "--json")
    result = json.loads(text)
    methods = {r["method"]: r for r in result["table"]}
    assert code == 0 and result["best_fixed"] in methods and "classifier: fold 5/5" in err
    assert methods["classifier"]["mean_regret"] < methods[result["best_fixed"]]["mean_regret"]
    code, text, _ = run(capsys, "evaluate", "--data", datasets["learnable"], "--kinds",
                        "classifier")
    assert code == 0 and "mean regret per held-out family" in text

    code, text, _ = run(capsys, "model", "reset")
    assert code == 0 and f"removed the user default model {config_home}" in text
    assert "(bundled default)" in text and not config_home.exists()
    code, text, _ = run(capsys, "model", "show")
    assert "(bundled default)" in text
    code, text, _ = run(capsys, "model", "reset")
    assert code == 0 and "no user default model was installed" in text


def test_evaluate_as_placed_scores_the_single_device_floor(capsys, datasets, tmp_path):
    import pandas as pd

    floored = tmp_path / "floored.csv"
    pd.read_csv(datasets["learnable"]).assign(
        single_device_us=1.2, single_device_feasible=True).to_csv(floored, index=False)
    base = ["evaluate", "--data", str(floored), "--kinds", "classifier", "--folds", "5",
            "--json"]
    code, text, err = run(capsys, *base)
    assert code == 0, err
    raw = {r["method"]: r for r in json.loads(text)["table"]}
    code, text, err = run(capsys, *base, "--as-placed")
    assert code == 0, err
    placed = {r["method"]: r for r in json.loads(text)["table"]}
    # dfs_preorder's placement (2.0) is twice the best (1.0); one device takes 1.2
    assert raw["always-dfs_preorder"]["mean_regret"] == pytest.approx(1.0)
    assert placed["always-dfs_preorder"]["mean_regret"] == pytest.approx(0.2)
    assert json.loads(text)["as_placed"] and not json.loads(run(capsys, *base)[1])["as_placed"]
    # with --test-data, the test rows are the ones floored
    fixed = tmp_path / "fixed.csv"
    pd.read_csv(datasets["fixed"]).assign(
        single_device_us=1.1, single_device_feasible=True).to_csv(fixed, index=False)
    code, text, err = run(capsys, "evaluate", "--data", datasets["learnable"], "--kinds",
                          "classifier", "--folds", "5", "--test-data", str(fixed),
                          "--as-placed", "--json")
    assert code == 0, err
    tested = {r["method"]: r for r in json.loads(text)["table"]}
    assert tested["always-dfs_preorder"]["mean_regret"] == pytest.approx(0.1)
    assert tested["always-topo"]["mean_regret"] == 0
    code, text, _ = run(capsys, *base[:-1], "--as-placed")
    assert code == 0 and "as placed" in text
    for pooled in ([], ["bundled:greedy"]):  # pooled: its rows, not the others, lack it
        code, _, err = run(capsys, "evaluate", "--data", *pooled, datasets["learnable"],
                           "--as-placed")
        assert code == 2 and err.strip().count("\n") == 0
        assert (f"{datasets['learnable']!r}: no column single_device_us, "
                f"single_device_feasible (a dataset of an older travorder") in err
    code, _, err = run(capsys, "evaluate", "--data", str(fixed), "--test-data",
                       datasets["learnable"], "--as-placed")
    assert code == 2 and "learnable" in err and "no column single_device_us" in err


def test_evaluate_with_test_data_breaks_the_result_down(capsys, datasets, tmp_path):
    import pandas as pd

    # Train on "learnable", test on "fixed" (topo always wins there), its scenario renamed.
    test = pd.read_csv(datasets["fixed"]).assign(scenario="perturbed")
    test_path = tmp_path / "test.parquet"
    test.to_parquet(test_path)
    base = ["evaluate", "--data", datasets["learnable"], "--kinds", "classifier"]
    code, text, err = run(capsys, *base, "--test-data", str(test_path), "--folds", "5",
                          "--json")
    assert code == 0, err
    result = json.loads(text)
    methods = {r["method"]: r for r in result["table"]}
    assert methods["always-topo"]["mean_regret"] == 0  # scored on the test rows
    assert methods["classifier"]["mean_regret"] > 0  # it learned bfs on parallel graphs
    groups = {(r["scenario"], r["cluster"], r["method"]) for r in result["breakdown"]}
    assert ("perturbed", "all", "classifier") in groups
    assert ("perturbed", "k80x3", "best-fixed") in groups
    fams = [r for r in result["families"] if r["method"] == "classifier"]
    assert len(fams) == 5 and all(r["noise"] == pytest.approx(0.01) for r in fams)
    code, text, _ = run(capsys, *base, "--test-data", str(test_path))
    assert code == 0 and "mean regret per scenario and cluster" in text
    assert "families worse than best-fixed beyond noise" in text

    missing = tmp_path / "none.parquet"
    no_bfs = tmp_path / "no_bfs.csv"
    test.drop(columns="time_bfs").to_csv(no_bfs, index=False)
    other_placer = tmp_path / "rl.csv"
    test.assign(placer="rl").to_csv(other_placer, index=False)
    for extra, message in (
            (["--test-data", str(missing)], "none.parquet"),
            (["--test-data", str(no_bfs)], "no step times for order 'bfs'"),
            (["--test-data", str(other_placer)], "no rows for placer 'greedy' (the test "
                                                 "data has rl)"),
            (["--test-data", str(test_path), "--structure", "gnn"], "--test-data takes"),
            (["--structure", "bogus"], "unknown feature block 'bogus'"),
            (["--structure", " , "], "--structure takes feature block names separated by "
                                     "commas, got ' , '"),
            (["--folds", "1"], "--folds must be at least 2")):
        code, text, err = run(capsys, *base, *extra)
        assert code == 2 and text == "" and len(err.strip().splitlines()) == 1, (extra, err)
        assert message in err, (extra, err)


def test_train_will_not_install_a_model_that_loses_to_a_fixed_order(capsys, datasets,
                                                                    config_home, tmp_path):
    out = tmp_path / "model"
    argv = ["train", "--data", datasets["fixed"], "--out", str(out), "--kinds", "classifier"]
    code, _, err = run(capsys, *argv, "--use-as-default")
    last = err.splitlines()[-1]
    assert code == 2 and last.startswith("error: not installed as the default model: "
                                         "classifier does not beat the best fixed order"), err
    assert "--force" in last and "Traceback" not in err
    assert (out / "manifest.json").exists() and not config_home.exists()
    code, _, err = run(capsys, *argv)  # not installing: a warning only
    assert code == 0 and "warning: classifier does not beat the best fixed order" in err
    code, _, err = run(capsys, *argv, "--use-as-default", "--force")
    assert code == 0 and "warning:" in err and (config_home / "manifest.json").exists()
    shutil.rmtree(config_home)
    read, write = os.pipe()
    os.close(read)  # `| head` gone before the tables: installed all the same
    forced = [*argv, "--use-as-default", "--force"]
    code = f"import sys; from travorder.cli import main; sys.exit(main({forced!r}))"
    done = subprocess.run([sys.executable, "-c", code], stdout=write, stderr=subprocess.PIPE)
    os.close(write)
    assert done.returncode == 0 and (config_home / "manifest.json").exists()


def test_calibrate_writes_a_cluster_file(capsys, tmp_path):
    pytest.importorskip("torch")
    from travorder.placement.clusters import load_cluster

    path = tmp_path / "cpu.toml"
    code, out, _ = run(capsys, "calibrate", "--devices", "cpu,cpu", "--quick", "--out",
                       str(path))
    assert code == 0 and f"wrote {path}: cluster 'calibrated-2xcpu', 2 devices" in out
    assert "TFLOP/s" in out and load_cluster(path).n_devices == 2
    _one_line_error(capsys, ["calibrate", "--devices", "tpu:0", "--quick", "--out",
                             str(tmp_path / "x.toml")], "unknown device 'tpu:0'")


def test_tables_are_not_cut_when_stdout_is_not_a_terminal(capsys):
    from travorder.datasets.corpus import read_manifest

    code, out, _ = run(capsys, "zoo", "list")
    assert code == 0 and "…" not in out
    for entry in read_manifest(None):
        assert f" {entry['name']} " in out and f" {entry['source']} " in out


@pytest.mark.parametrize("command", [["evaluate"], ["train"], ["study", "report"]])
def test_data_help_names_every_bundled_dataset(capsys, monkeypatch, command):
    from travorder.study.export import BUNDLED_DATASETS

    monkeypatch.setenv("COLUMNS", "300")  # no line break inside a name
    with pytest.raises(SystemExit) as info:
        main([*command, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert info.value.code == 0 and "bundled:NAME" in out
    assert all(f" {name}" in out for name in BUNDLED_DATASETS), out


def test_place_help_lists_placers_orders_and_defaults(capsys):
    from travorder.placement.orders import ORDERS
    from travorder.placement.placers import PLACERS

    with pytest.raises(SystemExit) as info:
        main(["place", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # unwrapped
    assert info.value.code == 0
    assert all(f" {p}," in out or f" {p} " in out for p in PLACERS), out
    assert all(f" {o}" in out for o in ORDERS)
    assert "(default: k80x3)" in out and "--seed SEED seed (a non-negative integer)" in out


def test_json_output_is_strict_json():
    import numpy as np

    from travorder.errors import json_text

    doc = {"a": np.float64("nan"), "b": [np.int64(2), float("inf")], "c": np.arange(2)}
    assert json_text(doc) == '{"a": null, "b": [2, null], "c": [0, 1]}'


def test_both_commands_say_their_version(capsys):
    from travorder import __version__
    from travorder.cli import recommend_main

    for entry in (main, recommend_main):
        with pytest.raises(SystemExit) as info:
            entry(["--version"])
        assert info.value.code == 0 and capsys.readouterr().out == f"travorder {__version__}\n"


def test_sigterm_runs_the_clean_ups_and_exits_143(capsys):
    import signal
    import time

    from travorder.cli import _run

    cleaned: list[bool] = []

    def killed(args):
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # as `kill` or a scheduler would
            time.sleep(30)
        finally:
            cleaned.append(True)

    before = signal.getsignal(signal.SIGTERM)
    assert _run(killed, None) == 143 and cleaned == [True]
    assert capsys.readouterr().err == "terminated\n" and signal.getsignal(signal.SIGTERM) == before


def test_a_second_sigterm_right_after_the_first_does_not_break_the_clean_up(capsys,
                                                                           monkeypatch):
    import signal

    import travorder.cli
    from travorder.cli import _run

    cleaned = []

    def killed_twice(args):  # `timeout` signals the process, then its group: two SIGTERMs
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)
            sum(range(1000))  # where the second one lands
            cleaned.append(True)

    assert _run(killed_twice, None) == 143 and cleaned == [True]
    assert capsys.readouterr().err == "terminated\n"
    cleaned.clear()
    monkeypatch.setattr(travorder.cli, "_SAME_STOP_S", 0.0)  # a later one stops it again
    assert _run(killed_twice, None) == 143 and cleaned == []
    assert capsys.readouterr().err == "terminated\n"


def test_a_signal_while_a_command_handles_its_own_interrupt_stops_it(capsys):
    import signal

    from travorder.cli import _run

    def interrupted_by_itself(args):  # no signal recorded before this one
        try:
            raise KeyboardInterrupt
        finally:
            os.kill(os.getpid(), signal.SIGINT)
            sum(range(1000))

    assert _run(interrupted_by_itself, None) == 130  # once an IndexError in the handler
    assert capsys.readouterr().err == "interrupted\n"


def test_a_second_signal_after_one_lost_in_a_callback_stops_the_command(capsys):
    import signal
    import weakref

    from travorder.cli import _run

    class Thing:
        pass

    steps = []

    def lost_then_signalled_again(args):
        thing = Thing()
        ref = weakref.ref(thing, lambda _: os.kill(os.getpid(), signal.SIGTERM) or
                          [sum(range(1000)) for _ in range(100)])
        del thing  # the first SIGTERM is lost in the callback
        assert ref() is None
        os.kill(os.getpid(), signal.SIGTERM)  # `timeout`'s second, at once: it stops here
        for i in range(20):
            time.sleep(0.05)
            steps.append(i)
        return 0

    assert _run(lost_then_signalled_again, None) == 143 and steps == []
    assert capsys.readouterr().err == "terminated\n"


def test_an_interrupt_lost_in_a_callback_still_stops_the_command(capsys):
    import signal
    import weakref

    from travorder.cli import _run

    class Thing:
        pass

    def interrupted_in_a_callback(args):
        thing = Thing()
        # Ctrl-C arriving while Python runs a weakref callback: the KeyboardInterrupt is
        # lost there (once "Exception ignored ... KeyboardInterrupt", exit 0)
        ref = weakref.ref(thing, lambda _: os.kill(os.getpid(), signal.SIGINT) or
                          [sum(range(1000)) for _ in range(100)])
        del thing
        assert ref() is None
        return 0

    before = signal.getsignal(signal.SIGINT)
    assert _run(interrupted_in_a_callback, None) == 130
    assert capsys.readouterr().err == "interrupted\n" and signal.getsignal(signal.SIGINT) == before


@pytest.mark.parametrize("argv", [["zoo", "list"], ["clusters", "k80x3"]])
def test_a_reader_gone_before_the_output_stops_quietly(argv):
    # `travorder ... | head` whose reader has gone: rich's tables exited 1, prints 0.
    read, write = os.pipe()
    os.close(read)
    code = f"import sys; from travorder.cli import main; sys.exit(main({argv!r}))"
    done = subprocess.run([sys.executable, "-c", code], stdout=write, stderr=subprocess.PIPE)
    os.close(write)
    assert (done.returncode, done.stderr) == (0, b"")


def test_a_predictor_kind_given_twice_is_fitted_once():
    from travorder.cli import _kinds

    assert _kinds("ranker, ranker,classifier") == ["ranker", "classifier"]


def test_a_file_nested_too_deeply_gets_one_line(capsys, model, tmp_path, monkeypatch):
    # json and tomllib raise RecursionError, not their decode errors, past ~1,000 levels.
    monkeypatch.chdir(tmp_path)
    deep = "[" * 100_000 + "]" * 100_000
    for name in ("c.json", "p.json", "g.json", "pred/manifest.json", "corpus/manifest.json"):
        Path(name).parent.mkdir(exist_ok=True)
        Path(name).write_text(deep)
    for name in ("c.toml", "spec.toml"):
        Path(name).write_text(f"a = {deep}\n")
    Path("g.json.gz").write_bytes(gzip.compress(deep.encode()))
    for argv, says in [(["clusters", "c.json"], "not valid JSON"),
                       (["clusters", "c.toml"], "not valid TOML"),
                       (["simulate", model, "p.json"], "not a placement file"),
                       (["info", "g.json"], "not valid JSON"),
                       (["info", "g.json.gz"], "broken travorder graph file"),
                       (["model", "show", "--predictor", "pred"], "broken predictor manifest"),
                       (["zoo", "list", "--corpus", "corpus"], "broken corpus manifest"),
                       (["study", "run", "spec.toml", "--store", "s.sqlite"], "not valid TOML")]:
        _one_line_error(capsys, argv, says)
    assert not Path("s.sqlite").exists()


def test_a_lone_surrogate_in_a_json_file_gets_one_line(capsys, model, tmp_path):
    # json reads "\ud800" into a str that cannot be printed or written.
    cluster = json.loads(run(capsys, "clusters", "--json", "k80x3")[1])
    pair, lone = tmp_path / "pair.json", tmp_path / "lone.json"
    pair.write_text(json.dumps({**cluster, "name": "k80 \U0001f600"}))  # a pair: text
    lone.write_text(json.dumps({**cluster, "name": "k80 \ud800"}))
    code, out, _ = run(capsys, "clusters", str(pair))
    assert code == 0 and "\U0001f600" in out
    _one_line_error(capsys, ["clusters", str(lone)], r"\ud800 alone, half of a UTF-16 pair")
    graph = tmp_path / "g.json"
    doc = graph_to_dict(load_graph(model))
    doc["meta"]["name"] = "\udc00"
    graph.write_text(json.dumps(doc))
    _one_line_error(capsys, ["info", str(graph)], r"\udc00 alone")


def test_a_file_where_the_installed_model_goes_is_left_alone(capsys, config_home, tmp_path):
    from travorder.predictor.active import install_as_default

    config_home.parent.mkdir(parents=True)
    config_home.write_text("mine")
    _one_line_error(capsys, ["model", "reset"], "is a file, not a model folder travorder "
                                                "installed; move it away first")
    with pytest.raises(TravorderError, match="is a file, not a model folder"):
        install_as_default(bundled_model_dir())
    assert config_home.read_text() == "mine"
    config_home.unlink()
    config_home.parent.rmdir()
    config_home.parent.write_text("")  # travorder's config folder a file: cannot install
    with pytest.raises(TravorderError, match=r"cannot install the model of .* as the "
                                             r"default .*: Not a directory"):
        install_as_default(bundled_model_dir())


def test_a_file_given_as_a_corpus_gets_one_line(capsys, tmp_path):
    (tmp_path / "f.txt").write_text("x")
    _one_line_error(capsys, ["zoo", "list", "--corpus", str(tmp_path / "f.txt")],
                    "a file, not a graph corpus (a folder with manifest.json)")
