"""OpGraph construction, validation, conversions and travorder's own file format."""

from __future__ import annotations

import gzip
import json

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings

from travorder.errors import FormatError, GraphError, TravorderError
from travorder.featurize import graph_features, op_categories
from travorder.graph import OpGraph, coarsen, load_graph, prepare_graph, save_graph, training_graph
from travorder.graph.batch import scale_batch
from travorder.graph.native import FORMAT_VERSION, graph_to_dict
from travorder.graph.opgraph import colocation_groups
from travorder.graph.perturb import perturb_costs
from travorder.placement import Simulator, simulate
from travorder.placement.orders import traversal_order
from travorder.placement.placers import place_graph

from .strategies import random_dags


def diamond() -> OpGraph:
    return OpGraph.from_records(
        [
            {"name": "in", "op_type": "Conv", "flops": 100, "output_bytes": 8, "param_bytes": 4},
            {"name": "l", "op_type": "Relu", "flops": 2, "output_bytes": 8},
            {"name": "r", "op_type": "MatMul", "flops": 50, "output_bytes": 16, "time_us": 3.5},
            {"name": "out", "op_type": "Add", "flops": 1, "output_bytes": 8, "colocation": 1},
        ],
        [("in", "l"), ("in", "r"), ("l", "out"), ("r", "out", 12)],
        name="diamond", family="test", batch_size=2,
    )


def test_structure_of_a_diamond():
    g = diamond()
    assert (g.n_nodes, g.n_edges) == (4, 4)
    assert g.edge_bytes.tolist() == [8, 8, 8, 12]  # default: the producer's output
    assert g.topo_order.tolist() == [0, 1, 2, 3]
    assert g.levels.tolist() == [0, 1, 1, 2]
    assert sorted(g.successors(0).tolist()) == [1, 2]
    assert sorted(g.predecessors(3).tolist()) == [1, 2]
    assert g.in_degree.tolist() == [0, 1, 1, 2]
    assert np.isnan(g.time_us[0]) and g.time_us[2] == 3.5
    assert g.colocation.tolist() == [-1, -1, -1, 1]
    assert g.meta["name"] == "diamond" and g.meta["source"] is None
    assert g.index["out"] == 3


@pytest.mark.parametrize(("node", "error", "message"), [
    (4, IndexError, r"node 4 is not in this graph of 4 nodes \(0 to 3\)"),
    (-2, IndexError, "node -2 is not in this graph"),  # once the last node's neighbours
    (1.0, TypeError, "a node index is an integer, not float"),
    (True, TypeError, "not bool"),
])
def test_neighbours_of_a_node_not_in_the_graph(node, error, message):
    g = diamond()
    for neighbours in (g.successors, g.predecessors):
        with pytest.raises(error, match=message):
            neighbours(node)
    assert g.successors(np.int64(0)).tolist() == [1, 2]


def test_arrays_and_attributes_are_read_only():
    g = diamond()
    with pytest.raises(ValueError):
        g.flops[0] = 1.0
    with pytest.raises(AttributeError):
        g.flops = np.zeros(4)
    with pytest.raises(TypeError):
        g.meta["name"] = "x"  # type: ignore[index]


@pytest.mark.parametrize(
    ("nodes", "edges", "message"),
    [
        ([{"name": "a"}, {"name": "a"}], [], "duplicate node name 'a'"),
        ([{"name": ""}], [], "non-empty"),
        ([{"name": "a"}, {"name": "b"}], [("a", "c")], "unknown node 'c'"),
        ([{"name": "a"}], [("a", "a")], "self-loop on node 'a'"),
        ([{"name": "a"}, {"name": "b"}], [("a", "b"), ("a", "b")], "duplicate edge 'a' -> 'b'"),
        ([{"name": "a"}, {"name": "b"}], [("a", "b"), ("b", "a")], "cycle"),
        ([{"name": "a", "flops": -1}], [], "flops must be finite and non-negative, got -1 "
                                            "on node 'a'"),
        ([{"name": "a"}, {"name": "b", "output_bytes": float("inf")}], [],
         "output_bytes must be finite and non-negative, got inf on node 'b'"),
        ([{"name": "a", "time_us": -2.0}], [], r"time_us must be finite .*, got -2 on node 'a'"),
        ([{"name": "a"}, {"name": "b"}, {"name": "c"}], [("b", "c", 1), ("a", "c", -5)],
         "edge_bytes must be finite and non-negative, got -5 on edge 'a' -> 'c'"),
        # each finite, their sum not (once an "unlimited" activation total with a warning)
        ([{"name": "a", "output_bytes": 1e308}, {"name": "b", "output_bytes": 1e308}], [],
         "the output_bytes of the graph's nodes add up to more than a float holds"),
        ([{"name": "a", "time_us": 1e308}, {"name": "b", "time_us": 1e308},
          {"name": "c"}], [], "the time_us of the graph's nodes add up to more than"),
        ([{"name": "a"}, {"name": "b"}, {"name": "c"}], [("a", "b", 1e308), ("b", "c", 1e308)],
         "the edge_bytes of the graph's edges add up to more than a float holds"),
        (["a"], [], "node record 0 must be a mapping with a 'name', got 'a'"),
        ([{"nam": "a"}], [], "node record 0 must be a mapping with a 'name'"),
        ([{"name": "a"}, {"name": "b"}], [("a",)], r"an edge is \(src, dst\), "),
        ([{"name": "a"}, {"name": "b"}], [{"from": "a", "to": "b"}], "mapping with 'src'"),
        ([{"name": "a"}, {"name": "b"}], [("a", "b", "big")], "edge_bytes must be numbers"),
        ([{"name": "a", "output_bytes": "x"}], [], "output_bytes must be numbers"),
        ([{"name": "a", "flops": "1e3"}], [], "flops must be numbers: got '1e3'"),
        ([{"name": "a", "flops": True}], [], "flops must be numbers: got True"),
        ([{"name": "a"}, {"name": "b", "flops": True}], [], "flops must be numbers: got True"),
        ([{"name": "a", "flops": 1.0}, {"name": "b", "flops": "x"}], [],
         "flops must be numbers: got 'x'"),
        ([{"name": "a", "flops": 10**400}], [], "flops must be numbers: int too large"),
        ([{"name": "a", "colocation": 1.5}], [], "colocation groups must be integers, got 1.5"),
        ([{"name": "a", "is_backward": "no"}], [], "is_backward must be true/false"),
        # each once accepted as something else
        ([{"name": "a", "is_backward": None}], [], "is_backward must be true/false per node, "
                                                   "got None"),
        ([{"name": "a", "colocation": 1e20}, {"name": "b", "colocation": 1e20}], [],
         r"colocation groups must be 64-bit integers, got 1e\+20 for node 0"),  # no group
        ([{"name": "a", "colocation": float("nan")}], [],  # once a bare ValueError
         "colocation groups must be integers, got nan for node 0"),
        ([{"name": None}], [], "node names must be strings, got None"),
        ([{"name": "a", "op_type": None}], [], "op types must be strings, got None"),
        ([{"name": "\ud800"}], [], r"node names must be text, got '\\ud800' \(half of a "),
        ([{"name": "a", "flops": 3 + 4j}], [], "flops must be numbers: got an array of complex128"),
        ([{"name": "a"}, {"name": "b"}], [{"src": "a", "dst": "b", "byte": 99}],
         "edge 'a' -> 'b' has unknown key 'byte' .expected src, dst, bytes."),
        ([{"name": ["a"]}], [], r"node names must be strings, got \['a'\]"),  # TypeError
        ([{"name": "a"}, {"name": "b"}], [5], "an edge is .src, dst., .src, dst, bytes. or"),
        ([{"name": "a"}, {"name": "b"}], [{"a", "b"}], "an edge is"),  # once either way
        ([{"name": "a"}, {"name": "b"}], [(["a"], "b")], r"names unknown node \['a'\]"),
        ([{"name": "a", "flop": 1e9}], [], "node 'a' has unknown key 'flop' .expected name, "
                                           "op_type, flops,"),
    ],
)
def test_invalid_graphs_raise_one_clear_error(nodes, edges, message):
    with pytest.raises(GraphError, match=message):
        OpGraph.from_records(nodes, edges)


def test_meta_is_plain_and_checked(tmp_path):
    g = OpGraph(["a"], [], [], meta={"batch_size": np.int64(8), "dims": {"b": np.int32(2)}})
    assert type(g.meta["batch_size"]) is int and type(g.meta["dims"]["b"]) is int
    save_graph(g, tmp_path / "g.json.gz")  # JSON: no numpy scalars left
    assert load_graph(tmp_path / "g.json.gz") == g
    with pytest.raises(GraphError, match="meta must be a mapping, not list"):
        OpGraph(["a"], [], [], meta=[1])
    doc = graph_to_dict(g)
    doc["meta"]["batch_size"] = -1
    path = tmp_path / "bad.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    with pytest.raises(GraphError, match=r"bad\.json\.gz: meta batch_size must be a positive"):
        load_graph(path)


def test_arrays_that_are_not_what_they_stand_for_are_refused(tmp_path):
    g = OpGraph(list("ab"), [0], [1])
    for bad, message in [
            (dict(names="ab"), "node names must be a sequence of strings, not one string"),
            (dict(names=list("ab"), op_types="Co"), "op types must be a sequence of strings"),
            (dict(names=list("ab"), flops=np.array(["5", 1.0], dtype=object)),
             "flops must be numbers: got '5'"),
            (dict(names=list("ab"), flops=np.array(["2020-01-01"] * 2, dtype="datetime64[D]")),
             r"flops must be numbers: got an array of datetime64\[D\]"),
            (dict(names=list("ab"), colocation=np.array([2**63] * 2, dtype=np.uint64)),
             "colocation groups must be 64-bit integers"),
            (dict(names=list("ab"), meta={"micro_batches": "x"}),
             "meta micro_batches must be an integer >= 1, got 'x'")]:
        names = bad.pop("names")
        with pytest.raises(GraphError, match=message):
            OpGraph(names, [0] if len(names) == 2 else [], [1] if len(names) == 2 else [],
                    **bad)
    with pytest.raises(GraphError, match="meta must be a mapping, not list"):
        g.replace(meta=[1])
    with pytest.raises(TravorderError, match="colocate must be True or False, not 'no'"):
        colocation_groups(g, colocate="no")
    with pytest.raises(GraphError, match="training must be True or False, not 'no'"):
        prepare_graph(g, training="no")  # once a training step
    with pytest.raises(GraphError, match="coarsen_max_nodes must be an integer >= 0"):
        prepare_graph(g, coarsen_max_nodes="2")  # once a TypeError of '>'
    for call in (lambda: perturb_costs("m.onnx", 0.2, 0.1), lambda: op_categories("m.onnx")):
        with pytest.raises(TravorderError, match=r"takes an OpGraph, not str 'm\.onnx'"):
            call()  # once AttributeError
    for perm in ([1.5, 0], ["1", "0"], [True, False]):
        with pytest.raises(GraphError, match="perm must be integers"):
            g.permute(perm)
    assert g.permute([1, 0]).names.tolist() == ["b", "a"]
    for meta in ({"note": float("nan")}, {"note": object()}):  # once a bare TypeError, or
        with pytest.raises(GraphError, match="its meta holds a value JSON cannot hold"):
            save_graph(g.replace(meta=meta), tmp_path / "g.json.gz")  # NaN read as unequal
    assert not (tmp_path / "g.json.gz").exists()


def test_numpy_rows_and_object_arrays_of_integers_are_taken():
    g = OpGraph(list("abc"), np.array([0, 1], dtype=object), np.array([1, 2], dtype=object))
    assert g.n_edges == 2
    rows = OpGraph.from_records([{"name": x} for x in "abc"], np.array([["a", "b"], ["b", "c"]]))
    assert rows == OpGraph.from_records([{"name": x} for x in "abc"], [("a", "b"), ("b", "c")])
    with pytest.raises(GraphError, match="colocation groups must be integers, got None for "
                                         "node 0"):
        OpGraph(["a", "b"], [0], [1], colocation=[None, 1])


def test_an_empty_array_of_strings_is_no_numbers():
    with pytest.raises(GraphError, match="flops must be numbers: got an array of <U1"):
        OpGraph([], [], [], flops=np.array([], dtype=str))


def test_an_undirected_or_misspelt_networkx_graph_is_refused():
    with pytest.raises(GraphError, match="an undirected graph does not say which op feeds"):
        OpGraph.from_networkx(nx.path_graph(3))
    typo = nx.DiGraph()
    typo.add_node("a", flops=1e9, param_byte=4.0)
    with pytest.raises(GraphError, match="node 'a' has unknown key 'param_byte'"):
        OpGraph.from_networkx(typo)


def test_edge_indices_out_of_range():
    with pytest.raises(GraphError, match="outside the 2 nodes"):
        OpGraph(["a", "b"], [0], [2])


@pytest.mark.parametrize(("src", "dst"), [([0], [1.5]), ([True], [1]), ([0.5], [1])])
def test_edge_indices_that_are_not_integers(src, dst):
    with pytest.raises(GraphError, match=r"edge endpoints \(node indices\) must be integers, got"):
        OpGraph(["a", "b"], src, dst)  # 1.5 is no node, not node 1
    assert OpGraph(["a", "b"], [0.0], [1.0]).n_edges == 1  # a whole number is one


def test_permute_relabels_edges():
    g = diamond()
    p = g.permute([3, 2, 1, 0])
    assert p.names.tolist() == ["out", "r", "l", "in"]
    edges = {(p.names[s], p.names[d]) for s, d in zip(p.src, p.dst, strict=True)}
    assert edges == {("in", "l"), ("in", "r"), ("l", "out"), ("r", "out")}
    with pytest.raises(GraphError, match="permutation"):
        g.permute([0, 0, 1, 2])


def test_replace_merges_meta():
    g = diamond().replace(meta={"family": "other"}, flops=[1, 2, 3, 4])
    assert g.meta["family"] == "other" and g.meta["name"] == "diamond"
    assert g.flops.tolist() == [1, 2, 3, 4]


def test_native_file_round_trip(tmp_path):
    g = diamond()
    path = tmp_path / "d.json.gz"
    save_graph(g, path)
    back = load_graph(path)
    assert back == g
    assert back.node_records() == g.node_records()
    save_graph(g, tmp_path / "again.json.gz")  # deterministic bytes
    assert path.read_bytes() == (tmp_path / "again.json.gz").read_bytes()


def test_save_graph_refuses_what_it_could_not_read_back(tmp_path):
    with pytest.raises(TravorderError, match=r"give a file name ending in \.json\.gz, not "):
        save_graph(diamond(), tmp_path / "d.onnx")  # would not be ONNX
    with pytest.raises(GraphError, match="a graph of no nodes cannot be saved"):
        save_graph(OpGraph([], [], []), tmp_path / "empty.json.gz")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("call", [
    lambda x: save_graph(x, "g.json.gz"), training_graph, lambda x: coarsen(x, 4),
    graph_features, lambda x: simulate(x, [0], "k80x3"), lambda x: Simulator(x, "k80x3"),
    lambda x: traversal_order(x, "topo"), lambda x: place_graph(x, "k80x3"),
    lambda x: scale_batch(x, 4),
])
def test_functions_of_a_graph_name_what_they_take(call, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TravorderError, match=r"takes an OpGraph, not str 'm.onnx': read a "
                                             r"file with travorder.load_graph$"):
        call("m.onnx")
    with pytest.raises(TravorderError, match=r"takes an OpGraph, not NoneType$"):
        call(None)
    assert not list(tmp_path.iterdir())


def test_training_graph_refuses_a_factor_that_is_no_number():
    from fractions import Fraction

    for bad in ("2", True, float("nan"), -1.0, Fraction(1, 3), 10**400):  # the last two
        with pytest.raises(GraphError, match="backward_flops_factor must be a finite number"):
            training_graph(diamond(), backward_flops_factor=bad)  # once TypeError, Overflow
    huge = OpGraph(["a"], [], [], flops=[1e300], meta={"batch_size": 1, "name": "huge"})
    with pytest.raises(GraphError, match=r"graph 'huge' at batch 4611686018427387904 \(exported "
                                         r"at 1\): its flops grow past what a float holds"):
        scale_batch(huge, 2**62)  # once a numpy overflow warning first


def test_native_file_with_other_version_is_refused(tmp_path):
    doc = graph_to_dict(diamond())
    doc["format_version"] = FORMAT_VERSION + 1
    path = tmp_path / "future.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    with pytest.raises(FormatError, match="format version 2 is not supported"):
        load_graph(path)
    for version, message in (("1", "format version '1' is not a whole number"),
                             (None, "graph has no format version")):
        doc["format_version"] = version
        path.write_bytes(gzip.compress(json.dumps(doc).encode()))
        with pytest.raises(FormatError, match=message):
            load_graph(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"", "empty file"), (b"\x1f\x8b\x08\x00garbage", "broken travorder graph file"),
     (b'{"nodes": 3}', "neither a travorder graph nor a dnn-partitioning graph"),
     (b"{not json", "not valid JSON")],
)
def test_bad_files(tmp_path, content, message):
    path = tmp_path / "bad.json.gz"
    path.write_bytes(content)
    with pytest.raises(FormatError, match=message):
        load_graph(path)


@pytest.mark.parametrize(("change", "message"), [
    (("nodes", "colocation", ["x", "y", "z", "w"]), "'nodes.colocation' must be a list of "
                                                    "integers"),
    (("nodes", "colocation", [None, -1, -1, -1]), "'nodes.colocation' must be a list of int"),
    (("nodes", "is_backward", ["no"] * 4), "'nodes.is_backward' must be a list of true or"),
    (("nodes", "flops", ["1", "x", 1, 1]), "'nodes.flops' must be a list of numbers"),
    (("nodes", "flops", ["5", 1, 1, 1]), "'nodes.flops' must be a list of numbers"),
    (("nodes", "time_us", [True, 1, 1, 1]), "'nodes.time_us' must be a list of numbers"),
    (("nodes", "name", [1, 2, 3, 4]), "'nodes.name' must be a list of strings"),
    (("edges", "src", [0.5, 0, 1, 2]), "'edges.src' must be a list of integers"),
    (("nodes", "flops", [10**400, 1, 1, 1]), "'nodes.flops' must be a list of numbers"),
    (("edges", "src", [10**400, 0, 1, 2]), "'edges.src' must be a list of integers"),
    (("nodes", "flops", None), "'nodes.flops' must be a list of numbers"),
    ((None, "nodes", [1, 2]), "missing field 'nodes.name'"),
    ((None, "meta", "abc"), "field 'meta' is not an object"),
    ((None, "nodes", {c: [] for c in ("name", "op_type", "flops", "output_bytes",
                                      "param_bytes", "time_us", "colocation",
                                      "is_backward")}), "graph has no nodes"),
    (("nodes", "flops", [-1.0, 1.0, 1.0, 1.0]), r"bad\.json\.gz: .*flops"),
])
def test_bad_fields_of_a_native_graph_get_one_line_naming_them(tmp_path, capsys, change,
                                                               message):
    doc = graph_to_dict(diamond())
    table, key, value = change
    (doc if table is None else doc[table])[key] = value
    path = tmp_path / "bad.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    with pytest.raises(TravorderError, match=message):
        load_graph(path)
    from travorder.cli import main

    assert main(["info", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_misnamed_files_are_read_by_their_content(tmp_path):
    from travorder.datasets.onnx_examples import residual_cnn

    onnx_named_json = tmp_path / "model.json"  # onnx would parse it as JSON protobuf
    onnx_named_json.write_bytes(residual_cnn().SerializeToString())
    assert load_graph(onnx_named_json).n_nodes == len(residual_cnn().graph.node)
    for name in ("hello.json", "hello.textproto", "hello.onnxtxt"):
        (tmp_path / name).write_text("hello")
        with pytest.raises(FormatError, match="not an ONNX model"):
            load_graph(tmp_path / name)
    with_bom = tmp_path / "bom.json"  # as some Windows editors save JSON
    with_bom.write_bytes(b"\xef\xbb\xbf" + json.dumps(graph_to_dict(diamond())).encode())
    assert load_graph(with_bom) == diamond()


def test_missing_file(tmp_path):
    with pytest.raises(FormatError, match="no such file"):
        load_graph(tmp_path / "nope.onnx")
    with pytest.raises(FormatError, match="empty path"):  # once "'.': is a directory"
        load_graph("")


@settings(max_examples=60, deadline=None)
@given(random_dags())
def test_round_trips_lose_nothing(g):
    assert OpGraph.from_networkx(g.to_networkx()) == g
    assert OpGraph.from_records(g.node_records(), [
        (g.names[s], g.names[d], b) for s, d, b in zip(g.src, g.dst, g.edge_bytes, strict=True)
    ], **g.meta) == g


@settings(max_examples=60, deadline=None)
@given(random_dags())
def test_topological_order_and_levels_agree_with_networkx(g):
    nxg = g.to_networkx()
    order = [g.names[i] for i in g.topo_order]
    pos = {v: i for i, v in enumerate(order)}
    assert all(pos[u] < pos[v] for u, v in nxg.edges)
    assert g.levels.max(initial=0) == nx.dag_longest_path_length(nxg)


def test_pickle_round_trip():
    import pickle

    g = diamond()
    back = pickle.loads(pickle.dumps(g))
    assert back == g and back.meta["family"] == "test"


def test_random_dags_shrink_to_the_smallest_failing_graph():
    # The strategy draws the graph from hypothesis itself, not a numpy seed: a property
    # that fails on any graph with two edges shrinks to a small graph with exactly two
    # edges and the smallest costs (a shrunk seed would give another random graph).
    from hypothesis import find

    g = find(random_dags(max_nodes=5), lambda g: g.n_edges >= 2,
             settings=settings(database=None, max_examples=200, derandomize=True))
    assert g.n_edges == 2 and g.n_nodes <= 4
    assert set(g.flops.tolist()) == {1.0} and set(g.param_bytes.tolist()) == {0.0}


def test_names_with_nul_characters_are_refused():
    with pytest.raises(GraphError, match="NUL"):
        OpGraph(["a", "a\x00"], [0], [1])
