"""Regenerate the example models in this folder: ``python examples/make_examples.py``."""

from pathlib import Path

import onnx

from travorder.datasets.onnx_examples import residual_cnn, transformer_stack

HERE = Path(__file__).parent

if __name__ == "__main__":
    onnx.save(residual_cnn(), HERE / "resnet_small.onnx")
    onnx.save(transformer_stack(n_layers=4), HERE / "transformer_small.onnx")
    print(f"wrote {HERE / 'resnet_small.onnx'} and {HERE / 'transformer_small.onnx'}")
