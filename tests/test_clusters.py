"""Clusters: presets, files, validation, and the op cost model."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from travorder.errors import FormatError, TravorderError, json_text
from travorder.graph import OpGraph
from travorder.placement import PRESETS, Cluster, Device, compute_times, load_cluster
from travorder.placement.clusters import save_cluster

TOML = """
name = "mine"
link_model = "channel"
busy_after_us = 1.5
param_copies = 1.0

[[devices]]
name = "big"
peak_flops = 2e12
mem_bw = 1e11
memory = 1e9
launch_us = 2.0

[[devices]]
name = "small"
count = 2
peak_flops = 1e12
mem_bw = 1e11

[links]
bandwidth = [[0, 100, 200], [100, 0, 300], [200, 300, 0]]
latency = 3.0
"""


def two_devices(**changes) -> Cluster:
    dev = Device("gpu", peak_flops=1e12, mem_bw=1e11, memory=1e9, launch_us=1.0)
    args = {"name": "two", "devices": (dev, dataclasses.replace(dev, name="gpu2")),
            "bandwidth": 100.0, "latency": 1.0, "link_model": "link"}
    return Cluster(**{**args, **changes})


def test_presets_named_in_the_design_exist():
    for name in ("k80x3", "v100x4-nvlink", "a100x8-nvlink", "h100x8-nvlink", "pcie4x4",
                 "hetero-a100x2-v100x2", "baechi-4"):
        assert load_cluster(name) is PRESETS[name]
    assert [PRESETS[n].n_devices for n in ("a100x8-nvlink", "h100x8-nvlink", "pcie4x4")] \
        == [8, 8, 4]


def test_k80x3_has_placetos_constants():
    c = load_cluster("k80x3")
    assert (c.n_devices, c.link_model, c.busy_after_us, c.param_copies) == (3, "bus", 25.0, 3.0)
    assert c.bandwidth.tolist() == [[0, 7600, 7600], [7600, 0, 7600], [7600, 7600, 0]]
    assert not c.latency.any()
    assert {d.launch_us for d in c.devices} == {5.7}
    assert {d.memory for d in c.devices} == {12 * 2**30}


def test_baechi_preset_reproduces_its_communication_cost():
    c = load_cluster("baechi-4")
    nbytes = 1e6
    cost = c.latency[0, 1] + nbytes / c.bandwidth[0, 1]
    assert c.link_model == "channel"
    assert cost == pytest.approx(0.0001754 * nbytes + 134, rel=1e-12)


def test_heterogeneous_preset_differs_in_devices_and_links():
    c = load_cluster("hetero-a100x2-v100x2")
    assert len({d.peak_flops for d in c.devices}) == 2
    assert c.bandwidth[0, 1] == 25_000 and c.bandwidth[0, 2] == 12_000


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_round_trip_through_dict_and_json(name):
    c = PRESETS[name]
    back = Cluster.from_dict(json.loads(json.dumps(c.to_dict())))
    assert back == c and hash(back) == hash(c)
    assert back.description == c.description


def test_toml_file_with_counts_and_matrix(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(TOML)
    c = load_cluster(str(path))
    assert [d.name for d in c.devices] == ["big", "small:0", "small:1"]
    assert c.devices[1].memory == math.inf and c.devices[1].launch_us == 0.0
    assert c.bandwidth[2, 1] == 300 and c.latency[0, 2] == 3.0 and c.latency[1, 1] == 0
    assert (c.link_model, c.busy_after_us, c.param_copies) == ("channel", 1.5, 1.0)


def test_one_device_needs_no_links(tmp_path):
    path = tmp_path / "one.toml"
    path.write_text('name = "one"\n[[devices]]\nname = "gpu"\npeak_flops = 1e12\n'
                    'mem_bw = 1e11\n')
    one = load_cluster(path)
    assert one.n_devices == 1 and Cluster.from_dict(json.loads(json_text(one.to_dict()))) == one
    path.write_text(path.read_text().replace("name = \"gpu\"", "name = \"gpu\"\ncount = 2"))
    with pytest.raises(TravorderError, match=r"missing 'links' \(the bandwidth and latency "
                                             r"between its 2 devices\)"):
        load_cluster(path)
    # links a one-device cluster does give are checked all the same
    for links, message in (("bandwidth = -5\nlatency = 1", "bandwidth must be positive "
                             r"\(B/us\), got -5.0"),
                            ("bandwidth = 5\nlatency = inf", "latency must be finite and "
                             r"non-negative \(us\), got inf")):
        path.write_text(f'name = "one"\n[[devices]]\nname = "gpu"\npeak_flops = 1e12\n'
                        f'mem_bw = 1e11\n[links]\n{links}\n')
        with pytest.raises(TravorderError, match=message):
            load_cluster(path)


def test_json_file(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(two_devices().to_dict()))
    assert load_cluster(path) == two_devices()


def test_equality_looks_at_values():
    assert two_devices() == two_devices()
    assert two_devices() != two_devices(latency=2.0)
    assert two_devices().bandwidth.flags.writeable is False


def test_unknown_preset_lists_the_presets():
    with pytest.raises(TravorderError, match=r"unknown cluster 'k80x4'.*k80x3.*pcie4x4"):
        load_cluster("k80x4")
    for bad in (3, None, ["k80x3"]):
        with pytest.raises(TravorderError, match="a cluster is a preset name, a cluster fi"):
            load_cluster(bad)


def test_missing_or_broken_files(tmp_path):
    with pytest.raises(FormatError, match="no such cluster file"):
        load_cluster(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = ")
    with pytest.raises(FormatError, match="not valid TOML"):
        load_cluster(bad)
    (tmp_path / "dir.toml").mkdir()
    with pytest.raises(FormatError, match=r"cannot read cluster file .*dir.toml.: Is a dir"):
        load_cluster(tmp_path / "dir.toml")
    latin = tmp_path / "latin.toml"
    latin.write_bytes(TOML.replace('"mine"', '"m\xefne"').encode("latin-1"))
    with pytest.raises(FormatError, match=r"latin.toml' is not UTF-8 text \(byte 10"):
        load_cluster(latin)


@pytest.mark.parametrize(("old", "new", "message"), [
    ("peak_flops = 2e12", "peak_flops = 2" + "0" * 400,
     r"device 'big': peak_flops is too large for a float: 2000+\.\.\.$"),
    ("memory = 1e9", "memory = 1" + "0" * 400, "device 'big': memory is too large"),
    ("count = 2", "count = 100_000_000",
     "device 'small': count 100000000 makes more than 1024 devices"),
    ("latency = 3.0", "latency = true", "latency must be a number, got True"),
    ("[0, 100, 200]", "[0, true, 200]", "bandwidth must be a number, got True"),
    ('name = "mine"', "name = 5", "cluster name must be a non-empty string, got 5"),
    ('name = "mine"', 'name = ""', "cluster name must be a non-empty string, got ''"),
])
def test_wrong_values_in_a_file(tmp_path, old, new, message):
    path = tmp_path / "c.toml"
    path.write_text(TOML.replace(old, new))
    with pytest.raises(TravorderError, match=message):
        load_cluster(path)


def test_json_nulls_and_strings(tmp_path):
    doc = json.loads(json_text(two_devices().to_dict()))
    path = tmp_path / "c.json"
    for links, message in (({"bandwidth": [[0, "5"], ["5", 0]], "latency": 1.0},
                            "bandwidth must be a number, got '5'"),
                           ({"bandwidth": 1.0, "latency": None},
                            "latency must be a number, got None")):
        path.write_text(json.dumps({**doc, "links": links}))
        with pytest.raises(TravorderError, match=message):
            load_cluster(path)
    path.write_text(json.dumps({**doc, "links": {"bandwidth": [[0, None], [None, 0]],
                                                 "latency": [[0, 1], [2, 0]]}}))
    c = load_cluster(path)
    assert c.bandwidth[0, 1] == math.inf and c.latency[1, 0] == 2.0


def test_negative_bandwidth_in_a_file(tmp_path):
    path = tmp_path / "neg.toml"
    path.write_text(TOML.replace("[0, 100, 200]", "[0, -100, 200]"))
    with pytest.raises(TravorderError, match=r"neg.toml.*bandwidth 0->1 must be positive"):
        load_cluster(path)


def test_misspelt_setting_in_a_file(tmp_path):
    path = tmp_path / "typo.toml"
    path.write_text(TOML.replace("busy_after_us", "busy_after"))
    with pytest.raises(TravorderError, match="unknown cluster setting 'busy_after'"):
        load_cluster(path)


@pytest.mark.parametrize(("changes", "message"), [
    ({"devices": ()}, "has no devices"),
    ({"devices": None}, "devices must be a list of Device objects, not None"),  # TypeError
    ({"devices": Device("d", 1e12, 1e11)}, "devices must be a list of Device objects, not "),
    ({"bandwidth": 0.0}, "bandwidth 0->1 must be positive"),
    ({"bandwidth": [[0, 1, 2]]}, r"2x2 matrix .* got shape \(1, 3\)"),
    ({"latency": -1.0}, "latency 0->1 must be finite and non-negative"),
    ({"latency": [[0.0, 1.0], [1.0, 0.0], [0.0, 0.0]]}, "latency must be a number or a 2x2"),
    ({"link_model": "mesh"}, "unknown link model 'mesh'"),
    ({"busy_after_us": -1.0}, "busy_after_us must be finite and non-negative"),
    ({"param_copies": "three"}, "param_copies must be a number"),
    ({"name": None}, "cluster name must be a non-empty string, got None"),
    ({"description": {"a": 1}}, "description must be a string, got {'a': 1}"),
    ({"bandwidth": "100"}, "bandwidth must be a number, got '100'"),
    ({"bandwidth": np.array([["1", "2"], ["3", "4"]])}, "got an array of <U1"),
    ({"devices": tuple(Device(f"d{i}", 1e12, 1e11) for i in range(1025))},
     "has 1025 devices; at most 1024"),
])
def test_invalid_clusters(changes, message):
    with pytest.raises(TravorderError, match=message):
        two_devices(**changes)


@pytest.mark.parametrize(("changes", "message"), [
    ({"peak_flops": 0.0}, "peak_flops must be positive"),
    ({"mem_bw": math.inf}, "mem_bw must be positive and finite"),
    ({"memory": -1.0}, "memory must be positive"),
    ({"launch_us": -0.5}, "launch_us must be finite and non-negative"),
])
def test_invalid_devices(changes, message):
    with pytest.raises(TravorderError, match=message):
        Device(**{"name": "d", "peak_flops": 1e12, "mem_bw": 1e11, **changes})


@pytest.mark.parametrize("name", [5, "", None])
def test_a_counted_device_needs_a_name_too(name):
    # a count made "5:0", "5:1" of a name that is not one
    entry = {"name": name, "count": 2, "peak_flops": 1e12, "mem_bw": 1e11}
    with pytest.raises(TravorderError, match="device name must be a non-empty string"):
        Cluster.from_dict({"name": "c", "devices": [entry],
                           "links": {"bandwidth": 1.0, "latency": 0.0}})


def test_duplicate_device_names():
    dev = Device("gpu", 1e12, 1e11)
    with pytest.raises(TravorderError, match="duplicate device name 'gpu'"):
        Cluster("dup", (dev, dev), 1.0, 0.0)


def test_a_list_of_numpy_rows_is_a_matrix():
    rows = list(np.full((2, 2), 100.0))
    assert two_devices(bandwidth=rows) == two_devices()


def test_infinite_bandwidth_is_allowed():
    assert two_devices(bandwidth=math.inf).bandwidth[0, 1] == math.inf


def test_compute_times_roofline_measured_and_gap():
    fast = Device("fast", peak_flops=2e12, mem_bw=1e11, launch_us=1.0)
    slow = Device("slow", peak_flops=1e12, mem_bw=1e11, launch_us=3.0)
    c = Cluster("het", (fast, slow), 1.0, 0.0)
    g = OpGraph(
        ["compute", "memory", "measured"], [0, 1], [1, 2],
        # compute: 2e7 FLOP; memory: 1e5 in + 2e5 out + 2e5 params = 5e5 B; measured 30 us
        flops=[2e7, 1e3, 0.0], output_bytes=[1e3, 2e5, 0.0], param_bytes=[0.0, 2e5, 0.0],
        edge_bytes=[1e5, 0.0], time_us=[math.nan, math.nan, 30.0],
    )
    t = compute_times(g, c)
    assert t.tolist() == [
        [10.0 + 1, 20.0 + 3],  # 2e7 / 2e12 s, 2e7 / 1e12 s (1e3 B in/out is less)
        [5.0 + 1, 5.0 + 3],  # 5e5 B / 1e11 B/s on both
        [30.0 + 1, 60.0 + 3],  # measured on the first device; the second is half as fast
    ]


def test_placeto_semantics_preset_file_and_hash(tmp_path):
    c = load_cluster("k80x3-placeto")
    k80 = load_cluster("k80x3")
    assert c.semantics == "placeto" and k80.semantics == "travorder"
    assert dataclasses.replace(c, name="k80x3", description=k80.description,
                               semantics="travorder") == k80
    assert c != dataclasses.replace(c, semantics="travorder")
    assert "semantics" not in k80.to_dict()  # the default leaves existing hashes alone
    from travorder.study.jobs import cluster_hash

    assert cluster_hash(c) != cluster_hash(dataclasses.replace(c, semantics="travorder"))
    path = tmp_path / "p.toml"
    path.write_text(TOML.replace('link_model = "channel"', 'link_model = "bus"\n'
                                 'semantics = "placeto"').replace(
        "[[0, 100, 200], [100, 0, 300], [200, 300, 0]]", "[[0, 100, 100], [200, 0, 200], "
        "[300, 300, 0]]"))
    mine = load_cluster(path)
    assert mine.semantics == "placeto"
    save_cluster(mine, tmp_path / "q.json")
    assert load_cluster(tmp_path / "q.json") == mine


def test_a_study_spec_chooses_placeto_semantics_by_preset():
    from travorder.study.spec import StudySpec

    spec = StudySpec.from_dict({"name": "s", "clusters": ["k80x3", "k80x3-placeto"],
                                "orders": ["topo"], "placer": {"name": "greedy"},
                                "graphs": {"synthetic": [{"family": "chain", "seeds": [0]}]}})
    assert [c.semantics for c in spec.clusters] == ["travorder", "placeto"]


@pytest.mark.parametrize(("changes", "message"), [
    ({"semantics": "tf"}, r"unknown semantics 'tf' \(expected one of travorder, placeto\)"),
    ({"semantics": "placeto"}, "semantics 'placeto' needs link_model 'bus', got 'link'"),
])
def test_invalid_semantics(changes, message):
    with pytest.raises(TravorderError, match=message):
        two_devices(**changes)


def test_placeto_needs_one_bus_speed_per_sender():
    # two devices: one link from each, so any speeds will do
    assert two_devices(semantics="placeto", link_model="bus",
                       bandwidth=[[0, 1], [2, 0]]).semantics == "placeto"
    c = load_cluster("k80x3-placeto")
    with pytest.raises(TravorderError, match="all latency from device 1 must be equal"):
        dataclasses.replace(c, latency=[[0, 1, 1], [0, 0, 1], [0, 0, 0]])


def test_compute_times_under_placeto_skip_the_gap_of_free_ops():
    g = OpGraph(["a", "b"], [], [], time_us=[0.0, 2.0])
    assert compute_times(g, load_cluster("k80x3-placeto")).tolist() == [[0.0] * 3, [7.7] * 3]
    assert compute_times(g, load_cluster("k80x3")).tolist() == [[5.7] * 3, [7.7] * 3]


def test_strict_json_of_an_unlimited_cluster_reads_back():
    from travorder.errors import json_text

    dev = dataclasses.replace(two_devices().devices[0], memory=math.inf)  # unlimited
    c = two_devices(devices=(dev, dataclasses.replace(dev, name="gpu2")))
    doc = json.loads(json_text(c.to_dict()))  # infinities are null in strict JSON
    assert doc["devices"][0]["memory"] is None and Cluster.from_dict(doc) == c
    wide = Cluster.from_dict({**doc, "links": {"bandwidth": None, "latency": 1.0}})
    assert wide.bandwidth[0, 1] == math.inf
