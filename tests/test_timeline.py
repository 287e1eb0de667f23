"""Timelines: the trace file, the critical path, the Gantt chart, and `simulate --trace`."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from travorder.cli import main
from travorder.datasets.onnx_examples import residual_cnn
from travorder.errors import TravorderError
from travorder.graph import OpGraph, load_graph, training_graph
from travorder.placement import (
    Simulator,
    Transfer,
    critical_path,
    load_cluster,
    place_graph,
    plot_gantt,
    simulate_timeline,
    trace_events,
    write_trace,
)


def diamond() -> OpGraph:
    # a -> b, a -> c, b -> d, c -> d with 76 kB edges: 10 us on k80x3's bus
    return OpGraph(["a", "b", "c", "d"], [0, 0, 1, 2], [1, 2, 3, 3],
                   time_us=[10.0, 30.0, 20.0, 5.0], edge_bytes=[76e3] * 4,
                   is_backward=[False, False, True, True])


@pytest.mark.parametrize("preset", ["k80x3", "k80x3-placeto", "pcie4x4", "v100x4-nvlink"])
def test_trace_has_every_op_once_with_its_times(tmp_path, preset):
    g = training_graph(OpGraph.from_records(
        [{"name": f"op{i}", "flops": 1e9 * (i + 1), "output_bytes": 4e5} for i in range(12)],
        [(f"op{i}", f"op{j}") for i in range(12) for j in (i + 1, i + 3) if j < 12]))
    c = load_cluster(preset)
    p = np.random.default_rng(0).integers(0, c.n_devices, g.n_nodes)
    tl = Simulator(g, c).timeline(p)
    path = tmp_path / "t.json"
    write_trace(tl, path)
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    ops = [e for e in events if e["ph"] == "X" and e["cat"] != "transfer"]
    assert sorted(e["args"]["node"] for e in ops) == list(range(g.n_nodes))
    for e in ops:
        v = e["args"]["node"]
        assert e["name"] == g.names[v] and e["tid"] == p[v] and e["pid"] == 0
        assert e["ts"] == tl.result.start_us[v]
        assert e["ts"] + e["dur"] == pytest.approx(tl.result.finish_us[v], abs=1e-9)
        assert e["cat"] == ("backward" if g.is_backward[v] else "forward")
    transfers = [e for e in events if e.get("cat") == "transfer"]
    per_transfer = 2 if c.link_model == "channel" else 1
    assert len(transfers) == per_transfer * tl.result.n_transfers
    assert sum(e["args"]["bytes"] for e in transfers) == pytest.approx(
        per_transfer * tl.result.bytes_moved)
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] in ("thread_name", "process_name")}
    assert {names[0, d] for d in range(c.n_devices)} == {d.name for d in c.devices}
    assert all((e["pid"], e["tid"]) in names for e in events if e["ph"] == "X")
    assert doc["otherData"]["step_time_us"] == tl.result.step_time_us
    assert trace_events(tl) == doc


def test_critical_path_of_a_diamond():
    # k80x3: a 0-15.7 on d0; b (d1) gets a's tensor 15.7-25.7, runs 25.7-61.4; c runs
    # on d0 15.7-41.4; d (d0) waits for b's tensor 61.4-71.4 and runs 71.4-82.1
    g = diamond()
    tl = simulate_timeline(g, [0, 1, 0, 0], load_cluster("k80x3"))
    assert tl.result.start_us.tolist() == [0.0, 25.7, 15.7, 71.4]
    path = critical_path(tl)
    assert [x if isinstance(x, int) else (x.node, x.src, x.dst) for x in path] == \
        [0, (0, 0, (1,)), 1, (1, 1, (0,)), 3]
    assert isinstance(path[1], Transfer) and path[1].start_us == 15.7


def test_critical_path_through_a_busy_device_and_a_busy_bus():
    # all on d0 but c: c waits for d0 to finish b
    g = diamond()
    tl = simulate_timeline(g, [0, 0, 0, 0], load_cluster("k80x3"))
    assert critical_path(tl) == [0, 1, 2, 3]
    # placeto: one transfer of a's tensor to d1 and d2 at once; the bus waits for nothing
    tl = simulate_timeline(g, [0, 1, 2, 0], load_cluster("k80x3-placeto"))
    path = critical_path(tl)
    assert path[0] == 0 and path[-1] == 3 and isinstance(path[1], Transfer)
    assert path[1].dst == (1, 2)


def test_critical_path_is_contiguous_in_time():
    g = training_graph(load_graph_small())
    c = load_cluster("k80x3")
    r = place_graph(g, c, placer="greedy", order="bfs", seed=0)
    tl = simulate_timeline(g, r.placement, c)
    path = critical_path(tl)
    assert path[-1] == int(np.argmax(tl.result.finish_us))
    start = [x.start_us if isinstance(x, Transfer) else tl.result.start_us[x] for x in path]
    end = [x.end_us if isinstance(x, Transfer) else tl.result.finish_us[x] for x in path]
    assert start[0] == 0.0
    assert all(a <= b for a, b in zip(end[:-1], start[1:], strict=True))


def load_graph_small() -> OpGraph:
    rng = np.random.default_rng(1)
    return OpGraph([f"n{i}" for i in range(30)], *zip(*[(i, j) for i in range(30)
                   for j in range(i + 1, min(30, i + 4)) if rng.random() < 0.5], strict=True),
                   flops=rng.uniform(1e8, 1e10, 30), output_bytes=rng.uniform(1e4, 1e6, 30))


def test_plot_gantt_writes_a_picture(tmp_path):
    pytest.importorskip("matplotlib")
    g = diamond()
    c = load_cluster("k80x3")
    tls = [simulate_timeline(g, p, c) for p in ([0, 1, 0, 0], [0, 0, 0, 0])]
    plot_gantt(tls, tmp_path / "g.png", titles=["split", "one device"])
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plot_gantt(tls[0], tmp_path / "g.svg")
    assert b"<svg" in (tmp_path / "g.svg").read_bytes()[:1000]
    with pytest.raises(TravorderError, match="png, svg, pdf"):
        plot_gantt(tls[0], tmp_path / "g.gif")
    with pytest.raises(TravorderError, match="cannot write Gantt chart"):
        plot_gantt(tls[0], tmp_path / "missing" / "g.png")
    with pytest.raises(TravorderError, match="1 titles for 2 timelines: give one each"):
        plot_gantt(tls, tmp_path / "g.pdf", titles=["split"])
    assert not (tmp_path / "g.gif").exists() and not (tmp_path / "g.pdf").exists()


def test_cli_simulate_trace_and_gantt(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    model = tmp_path / "m.onnx"
    onnx.save(residual_cnn(), model)
    placement = tmp_path / "p.json"
    assert main(["place", str(model), "--cluster", "k80x3-placeto", "-o", str(placement)]) == 0
    trace, gantt = tmp_path / "t.json", tmp_path / "g.png"
    code = main(["simulate", str(model), str(placement), "--trace", str(trace),
                 "--gantt", str(gantt)])
    out = capsys.readouterr().out
    assert code == 0 and f"wrote {trace}" in out and f"wrote {gantt}" in out
    g = training_graph(load_graph(model))
    ops = [e for e in json.loads(trace.read_text())["traceEvents"]
           if e["ph"] == "X" and e["cat"] != "transfer"]
    assert len(ops) == g.n_nodes and gantt.stat().st_size > 10_000


@pytest.mark.parametrize(("flag", "name", "message"), [
    ("--gantt", "g.gif", "--gantt writes png, svg, pdf"),
    ("--trace", "missing/t.json", "no such directory"),  # checked before simulating
])
def test_cli_simulate_bad_output(capsys, tmp_path, flag, name, message):
    model = tmp_path / "m.onnx"
    onnx.save(residual_cnn(), model)
    placement = tmp_path / "p.json"
    assert main(["place", str(model), "-o", str(placement)]) == 0
    capsys.readouterr()
    code = main(["simulate", str(model), str(placement), flag, str(tmp_path / name)])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / name).exists()


def test_study_report_shows_the_best_and_worst_order_per_family(tmp_path):
    pytest.importorskip("matplotlib")
    from travorder.study.report import write_report
    from travorder.study.runner import run_study
    from travorder.study.spec import StudySpec

    spec = StudySpec.from_dict({
        "name": "t", "clusters": ["k80x3"], "orders": ["topo", "bfs", "reversed_topo"],
        "placer": {"name": "greedy"}, "seeds": [0],
        "graphs": {"corpus": {"names": ["syn_enas_cnn_n91_s0", "alexnet"]},
                   "coarsen_max_nodes": 60},
        "scenarios": [{"batch": "train", "micro_batches": 2}]})
    run_study(spec, tmp_path / "s.sqlite", jobs=1, progress=False)
    files = write_report(tmp_path / "s.sqlite", tmp_path / "r")
    shots = sorted(p.name for p in files if p.name.startswith("timeline_"))
    assert shots == ["timeline_greedy_alexnet.png", "timeline_greedy_enas_cnn.png"]
    page = (tmp_path / "r" / "index.html").read_text()
    assert "Timelines of the best and the worst order" in page
    assert all(f'src="{name}"' in page for name in shots)


def test_a_result_or_a_file_name_is_not_a_timeline(tmp_path):
    g = diamond()
    result = Simulator(g, "k80x3").run([0, 1, 0, 0])
    tl = simulate_timeline(g, [0, 1, 0, 0], load_cluster("k80x3"))
    for call, caller in ((lambda: write_trace(result, tmp_path / "t.json"), "trace_events"),
                         (lambda: trace_events("t.json"), "trace_events"),
                         (lambda: critical_path(None), "critical_path"),
                         (lambda: plot_gantt([result]), "plot_gantt")):
        with pytest.raises(TravorderError, match=f"{caller} takes a Timeline"):
            call()  # once AttributeError: ... has no attribute 'graph'
    with pytest.raises(TravorderError, match="plot_gantt takes a Timeline or a list"):
        plot_gantt(None)
    with pytest.raises(TravorderError, match="titles must be a list of strings, not 'abc'"):
        plot_gantt([tl, tl, tl], titles="abc")  # once a title of one letter each
    assert not (tmp_path / "t.json").exists()
