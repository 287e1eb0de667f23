"""Calibrating a cluster file: the fit, the file round trip, the CPU stand-in for GPUs."""

from __future__ import annotations

import math
import os
import tomllib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from travorder.errors import TravorderError  # noqa: E402
from travorder.placement import calibrate as cal  # noqa: E402
from travorder.placement.clusters import (  # noqa: E402
    Cluster,
    Device,
    cluster_toml,
    load_cluster,
    save_cluster,
)

NO_GPU = not torch.cuda.is_available()
PHYS_MEM = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_calibrate_cpu_writes_a_loadable_file(tmp_path):
    path = tmp_path / "cpu.toml"
    lines = []
    c = cal.calibrate(["cpu", "cpu", "cpu"], sizes=cal.QUICK, out=path, log=lines.append)
    assert load_cluster(path) == c
    assert [d.name for d in c.devices] == ["cpu/0", "cpu/1", "cpu/2"]
    assert c.name == "calibrated-3xcpu" and c.link_model == "link"
    for d in c.devices:
        assert 0 < d.peak_flops < math.inf and 0 < d.mem_bw < math.inf
        assert 0 < d.launch_us < 1e5
        assert d.memory == PHYS_MEM / 3  # one machine's memory, shared by three entries
    off = ~np.eye(3, dtype=bool)
    assert np.all(c.bandwidth[off] > 0) and np.all(c.latency[off] >= 0)
    # One device measured once, and one copy within it.
    assert sum(line.startswith("cpu:") for line in lines) == 1
    assert sum("->" in line for line in lines) == 1

    json_path = tmp_path / "cpu.json"
    save_cluster(c, json_path)
    assert load_cluster(json_path) == c


def test_a_fixed_cost_per_op_is_not_counted_as_slowness(monkeypatch):
    # On a machine whose cores are busy every CPU op pays a fixed cost of milliseconds
    # (the intra-op threads wait for a time slice); on a GPU, the launch. Add 20 ms to
    # every timing: the rates must stay those of a real CPU, not work / 20 ms.
    timed = cal._best_us
    monkeypatch.setattr(cal, "_best_us", lambda *a, **k: timed(*a, **k) + 20_000.0)
    f = cal.measure_device(torch.device("cpu"), cal.QUICK)
    assert f["peak_flops"] > 1e9 and f["mem_bw"] > 1e9, f


def test_line_fit_recovers_bandwidth_and_latency():
    sizes = [1024, 4096, 16384, 65536]
    bw, lat = cal.fit_link(sizes, [12.0 + b / 2000.0 for b in sizes])  # 12 us, 2000 B/us
    assert bw == pytest.approx(2000.0) and lat == pytest.approx(12.0)
    # Flat (all latency) or negative-intercept sweeps still give a valid link.
    assert cal.fit_link([2000, 1000], [4.0, 5.0]) == (500.0, 6.0)  # 2000 B in 4 us
    bw, lat = cal.fit_link([1000, 3000], [0.5, 2.5])
    assert (bw, lat) == (1000.0, 0.0)


def test_toml_round_trip_of_presets_and_infinities():
    for name in ("v100x4-nvlink", "hetero-a100x2-v100x2", "k80x3"):
        c = load_cluster(name)
        assert Cluster.from_dict(tomllib.loads(cluster_toml(c))) == c
    odd = Cluster("odd \"one\"", (Device("a", 1e12, 1e11), Device("b", 2e12, 1e11, 8e9, 3.5)),
                  bandwidth=[[0, math.inf], [1000.0, 0]], latency=2.0, description="x\ny")
    text = cluster_toml(odd)
    assert "memory = inf" in text
    back = Cluster.from_dict(tomllib.loads(text))
    assert back == odd and back.description == "x\ny"


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")
def test_no_gpu_calibrates_cpu_and_says_so(tmp_path):
    lines = []
    c = cal.calibrate_command("cuda:0,cuda:1", tmp_path / "c.toml", quick=True,
                              echo=lines.append)
    note = "no GPU on this machine: calibrating 2 CPU devices instead of cuda:0,cuda:1"
    assert lines[0] == note
    assert lines[-1] == f"wrote {tmp_path / 'c.toml'}: cluster 'calibrated-2xcpu', 2 devices"
    assert note in c.description
    assert load_cluster(tmp_path / "c.toml") == c


def test_bad_input(tmp_path):
    with pytest.raises(TravorderError, match="unknown device 'tpu:0'"):
        cal.calibrate(["cpu", "tpu:0"], sizes=cal.QUICK)
    with pytest.raises(TravorderError, match="unknown link model 'mesh'"):
        cal.calibrate(["cpu"], link_model="mesh")
    with pytest.raises(TravorderError, match="no devices given"):
        cal.calibrate([], sizes=cal.QUICK)
    with pytest.raises(TravorderError, match=r"must end in \.toml or \.json"):
        save_cluster(load_cluster("k80x3"), tmp_path / "c.yaml")
    with pytest.raises(TravorderError, match="cannot write cluster file"):
        save_cluster(load_cluster("k80x3"), tmp_path / "missing" / "c.toml")
    with pytest.raises(TravorderError, match="unknown device 'cuda:-1'"):  # GPU or not
        cal.calibrate(["cuda:-1"], sizes=cal.QUICK)
    with pytest.raises(TravorderError, match="'meta' holds no data"):
        cal.calibrate(["meta"], sizes=cal.QUICK)


def test_a_bad_output_name_is_refused_before_measuring(tmp_path, monkeypatch):
    monkeypatch.setattr(cal, "measure_device", None)  # measuring would be a TypeError
    with pytest.raises(TravorderError, match=r"c\.txt' must end in \.toml or \.json"):
        cal.calibrate(["cpu"], sizes=cal.QUICK, out=tmp_path / "c.txt")
    # each once a bare error, or a failure after the measurements
    for kwargs, message in [
            (dict(devices="cpu"), r"devices is a list of device names, .* not the string "
                                  r"'cpu'"),  # once "unknown device 'c'"
            (dict(devices=["cpu"], sizes=(1, 2)), r"sizes must be a Sizes"),
            (dict(devices=["cpu"], name=5), "name must be a non-empty string, not 5"),
            (dict(devices=["cpu"], out=tmp_path / "no" / "c.toml"), "no such folder for"),
            (dict(devices=["cpu"], out=f"{tmp_path}/c.toml/"), "no such folder for")]:
        with pytest.raises(TravorderError, match=message):
            cal.calibrate(**kwargs)
    assert list(tmp_path.iterdir()) == []
    for args, message in [((0, 1, (1, 2), 1, 1), "sizes matmul_n must be an integer >= 1"),
                          ((1, 1, (1, 2), 0, 1), "sizes launch_ops must be an integer"),
                          ((1, 1, (1, 2), 1, 0), "sizes repeats must be an integer >= 1"),
                          ((1, 1, (4,), 1, 1), "copy_bytes must be a tuple of two or more")]:
        with pytest.raises(TravorderError, match=message):  # once ZeroDivisionError ...
            cal.Sizes(*args)
