"""Model graphs: ONNX example builders, synthetic families, zoo builders, bundled corpus."""
