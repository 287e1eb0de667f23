"""Hand-made model files shared by the tests."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper


def save_dynamic_model(path: Path) -> str:
    """Write a two-op ONNX model (MatMul by a 64x64 weight, then Relu) whose batch
    dimension is symbolic (``batch``) to ``path``; returns the path as a string."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [64, 64], [0.0] * 64 * 64)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
         helper.make_node("Relu", ["h"], ["y"], name="relu")], "dynamic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)
