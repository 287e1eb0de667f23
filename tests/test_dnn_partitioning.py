"""The dnn-partitioning JSON format: field mapping, units, and malformed documents."""

from __future__ import annotations

import json

import pytest

from travorder.errors import FormatError, GraphError
from travorder.graph import load_graph
from travorder.graph.dnn_partitioning import from_dnn_partitioning, is_dnn_partitioning
from travorder.graph.native import load_native, save_graph


def doc() -> dict:
    """Shaped like the benchmark's operator graphs: ids out of order, weights as nodes
    colocated with their op, a backward node, an edge without ``size``."""
    return {
        "maxSizePerFPGA": 17185374208.0, "maxFPGAs": 3, "maxCPUs": 1,
        "nodes": [
            {"name": "dense.weight", "id": 0, "supportedOnFpga": True, "cpuLatency": 0,
             "fpgaLatency": 0, "isBackwardNode": False, "colorClass": 16, "size": 1024.0},
            {"name": "MatMul2", "id": 81, "supportedOnFpga": True, "cpuLatency": 0.79,
             "fpgaLatency": 0.0344803921, "isBackwardNode": False, "colorClass": 16,
             "size": 1572864.0},
            {"name": "Gelu1", "id": 74, "supportedOnFpga": 1, "cpuLatency": 1.1,
             "fpgaLatency": 0.049, "isBackwardNode": 0, "size": 12288.0},
            {"name": "MatMul2_grad", "id": 90, "cpuLatency": 1.5, "fpgaLatency": 0.07,
             "isBackwardNode": 1, "colorClass": 16, "size": 1024.0},
        ],
        "edges": [
            {"sourceId": 0, "destId": 81, "cost": 0.0005, "size": 1024.0},
            {"sourceId": 81, "destId": 74, "cost": 0.732421875, "size": 1572864.0},
            {"sourceId": 74, "destId": 90, "cost": 0.0057},  # no size: the source's
        ],
    }


def test_fields_and_units():
    g = from_dnn_partitioning(doc())
    assert g.names.tolist() == ["dense.weight", "MatMul2", "Gelu1", "MatMul2_grad"]
    # fpgaLatency is in milliseconds
    assert g.time_us.tolist() == pytest.approx([0.0, 34.4803921, 49.0, 70.0])
    assert g.output_bytes.tolist() == [1024.0, 1572864.0, 12288.0, 1024.0]
    assert g.colocation.tolist() == [16, 16, -1, 16]
    assert g.is_backward.tolist() == [False, False, False, True]
    assert g.flops.tolist() == [0, 0, 0, 0]  # not in the format
    assert g.edge_bytes.tolist() == [1024.0, 1572864.0, 12288.0]
    assert [(g.names[s], g.names[d]) for s, d in zip(g.src, g.dst, strict=True)] == [
        ("dense.weight", "MatMul2"), ("MatMul2", "Gelu1"), ("Gelu1", "MatMul2_grad")]
    assert g.meta["dnn_partitioning"] == {"maxSizePerFPGA": 17185374208.0, "maxFPGAs": 3,
                                          "maxCPUs": 1}
    assert g.meta["importer"] == "dnn-partitioning" and g.meta["source"] == "memory"


def test_names_fall_back_to_ids_and_repeated_edges_merge():
    d = doc()
    for node in d["nodes"]:
        node["name"] = "same" if node["id"] in (74, 90) else node["name"]
    del d["nodes"][0]["name"]
    d["edges"].append({"sourceId": 81, "destId": 74, "cost": 0.1, "size": 10.0})
    g = from_dnn_partitioning(d)
    assert g.names.tolist() == ["0", "MatMul2", "74", "90"]
    assert g.n_edges == 3 and g.edge_bytes.tolist()[1] == 1572864.0  # largest kept
    d["nodes"][1]["name"] = "74"  # a name that is another node's id
    assert from_dnn_partitioning(d).names.tolist() == ["0", "74", "id74", "90"]
    d["nodes"][0]["name"], d["nodes"][3]["name"] = "same", "id74"  # the fallback's too:
    assert from_dnn_partitioning(d).names.tolist() == ["0", "74", "idid74", "id74"]  # was
    # "duplicate node name 'id74'"


def test_file_path_and_load_graph(tmp_path):
    path = tmp_path / "bert_l-3_training.json"
    path.write_text(json.dumps(doc()))
    g = from_dnn_partitioning(path)
    assert g.meta["name"] == "bert_l-3_training" and g.meta["source"] == str(path)
    assert load_graph(path) == g
    save_graph(g, tmp_path / "g.json.gz")
    assert load_native(tmp_path / "g.json.gz") == g


def test_is_dnn_partitioning():
    assert is_dnn_partitioning(doc())
    assert not is_dnn_partitioning({"nodes": [{"id": 0}], "edges": []})
    assert not is_dnn_partitioning({"nodes": [], "edges": []})
    assert not is_dnn_partitioning([doc()])
    assert not is_dnn_partitioning({"format": "travorder.opgraph"})


def _broken(change) -> dict:
    d = doc()
    change(d)
    return d


@pytest.mark.parametrize(("label", "document", "error", "message"), [
    ("dangling edge", _broken(lambda d: d["edges"].append(
        {"sourceId": 81, "destId": 7, "cost": 1.0})),
     FormatError, r"edge 3 \(81 -> 7\) has destId 7, which is not a node id"),
    ("duplicate id", _broken(lambda d: d["nodes"][2].update(id=81)),
     FormatError, "duplicate node id 81"),
    ("latency not a number", _broken(lambda d: d["nodes"][1].update(fpgaLatency="fast")),
     FormatError, "node 81 has fpgaLatency='fast', expected a number"),
    ("id not whole", _broken(lambda d: d["nodes"][1].update(id=1.5)),
     FormatError, "node 1 has id=1.5, expected a whole number"),
    ("edge without destId", _broken(lambda d: d["edges"][0].pop("destId")),
     FormatError, "edge 0 has no 'destId'"),
    ("node without size", _broken(lambda d: d["nodes"][0].pop("size")),
     FormatError, "node 0 has no 'size'"),
    ("not the format", {"nodes": [{"id": 1}], "edges": []},
     FormatError, "not a dnn-partitioning graph"),
    ("negative latency", _broken(lambda d: d["nodes"][1].update(fpgaLatency=-1)),
     FormatError, "node 81 has fpgaLatency=-1, expected a number >= 0"),
    ("latency too large", _broken(lambda d: d["nodes"][1].update(fpgaLatency=1e308)),
     FormatError, "node 81's fpgaLatency is too large"),
    ("latency beyond int64", _broken(lambda d: d["nodes"][1].update(fpgaLatency=10**40)),
     FormatError, "node 81 has fpgaLatency=10000000000000000000000000000000000000000, "
                  "expected a number"),  # once an OverflowError traceback
    ("latency a boolean", _broken(lambda d: d["nodes"][1].update(fpgaLatency=True)),
     FormatError, "node 81 has fpgaLatency=True, expected a number"),
    ("negative edge size", _broken(lambda d: d["edges"][0].update(size=-5)),
     FormatError, "edge 0 has size=-5, expected a number >= 0"),
    ("backward flag not 0 or 1", _broken(lambda d: d["nodes"][3].update(isBackwardNode=5)),
     FormatError, "node 90 has isBackwardNode=5, expected true, false, 0 or 1"),
    ("one node without latency", _broken(lambda d: d["nodes"][2].pop("fpgaLatency")),
     FormatError, "node 74 has no 'fpgaLatency'"),
    ("a node not an object", _broken(lambda d: d["nodes"].append(7)),
     FormatError, "node 4 is not an object"),
    ("cycle", _broken(lambda d: d["edges"].append({"sourceId": 90, "destId": 81, "cost": 0})),
     GraphError, "cycle"),
])
def test_bad_documents_give_one_clear_line(label, document, error, message):
    with pytest.raises(error, match=message) as info:
        from_dnn_partitioning(document, source="bad.json")
    assert "\n" not in str(info.value)


def test_bad_files(tmp_path):
    with pytest.raises(FormatError, match="no such file"):
        from_dnn_partitioning(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(FormatError, match="not valid JSON"):
        from_dnn_partitioning(tmp_path / "bad.json")
    (tmp_path / "dangling.json").write_text(json.dumps(_broken(lambda d: d["edges"].append(
        {"sourceId": 5, "destId": 0, "cost": 1.0}))))
    with pytest.raises(FormatError, match=r"dangling.json: edge 3 \(5 -> 0\) has sourceId 5"):
        load_graph(tmp_path / "dangling.json")


def _chain_training_doc(layout: str) -> dict:
    """A three-op chain ``a -> b -> c`` and its backward ops, in one of the two training
    layouts of the benchmark's files (see the importer's docstring)."""
    names = ["a", "b", "c"]
    nodes = [{"name": x, "id": k, "fpgaLatency": 1.0 + k, "size": 10.0 * (k + 1),
              "isBackwardNode": 0, "colorClass": k} for k, x in enumerate(names)]
    nodes += [{"name": f"{x}_grad", "id": 10 + k, "fpgaLatency": 2.0, "size": 5.0,
               "isBackwardNode": 1, "colorClass": k} for k, x in enumerate(names)]
    forward = [(0, 1), (1, 2)]
    if layout == "mirrored":  # backward edges point forward; nothing joins the halves
        edges = forward + [(10 + u, 10 + v) for u, v in forward]
    else:
        edges = forward + [(10 + v, 10 + u) for u, v in forward] + [(k, 10 + k)
                                                                    for k in range(3)]
    return {"nodes": nodes, "edges": [{"sourceId": u, "destId": v, "cost": 0.1}
                                      for u, v in edges]}


def _edges(g) -> set[tuple[str, str]]:
    return {(str(g.names[u]), str(g.names[v])) for u, v in zip(g.src, g.dst, strict=True)}


@pytest.mark.parametrize("layout", ["mirrored", "connected"])
def test_both_training_layouts_import_as_the_training_step(layout, tmp_path):
    from travorder.graph import training_graph

    path = tmp_path / f"{layout}.json"
    path.write_text(json.dumps(_chain_training_doc(layout)))
    g = load_graph(path)
    assert g.meta["dnn_partitioning_layout"] == layout
    expected = training_graph(from_dnn_partitioning(
        {"nodes": _chain_training_doc(layout)["nodes"][:3],
         "edges": _chain_training_doc(layout)["edges"][:2]}))
    assert _edges(g) == _edges(expected)
    # every backward op runs after its forward op: one chain a b c c' b' a'
    assert g.names[g.topo_order].tolist() == ["a", "b", "c", "c_grad", "b_grad", "a_grad"]
    bytes_of = {(str(g.names[u]), str(g.names[v])): float(b)
                for u, v, b in zip(g.src, g.dst, g.edge_bytes, strict=True)}
    if layout == "mirrored":  # f -> f' carries the saved activations: f's output
        assert [bytes_of[x, f"{x}_grad"] for x in "abc"] == [10.0, 20.0, 30.0]


def test_a_forward_graph_keeps_its_layout_name():
    d = _chain_training_doc("connected")
    g = from_dnn_partitioning({"nodes": d["nodes"][:3], "edges": d["edges"][:2]})
    assert g.meta["dnn_partitioning_layout"] == "forward"


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d["nodes"][2].update(colorClass=1), "backward node 11 has 2 forward partn"),
    (lambda d: d["nodes"][5].update(colorClass=-1), "0 forward partners"),
    (lambda d: d["edges"].__setitem__(3, {"sourceId": 12, "destId": 11, "cost": 0}),
     "do not mirror"),
])
def test_separate_halves_that_cannot_be_joined_are_refused(change, message):
    d = _chain_training_doc("mirrored")
    change(d)
    with pytest.raises(FormatError, match=message) as info:
        from_dnn_partitioning(d, source="halves.json")
    assert "no edge joins the backward nodes" in str(info.value)
