"""Import and featurize a big ONNX model: a deep transformer stack of over 2,000 nodes.

Builds ``transformer_stack`` (36 layers with run-time reshapes: 2,056 nodes by
default), saves it to a temporary ``.onnx`` file, then times ``read_onnx`` on the file
and ``graph_features`` on the graph, median over repeats. Target: import + features
under 2 s.

    python benchmarks/import_features.py [--layers 36] [--d-model 256] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import onnx

from travorder.datasets.onnx_examples import transformer_stack
from travorder.featurize import graph_features
from travorder.graph.onnx_import import read_onnx

TARGET_S = 2.0


def timed(fn: Callable[[], object], repeats: int) -> tuple[list[float], object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return times, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=36)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    model = transformer_stack(args.layers, seq=args.seq, d_model=args.d_model,
                              heads=max(1, args.d_model // 64), vocab=1000,
                              dynamic_reshape=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "transformer_stack.onnx"
        onnx.save(model, path)
        size_mb = path.stat().st_size / 1e6
        read_times, g = timed(lambda: read_onnx(path), args.repeats)
    feature_times, _ = timed(lambda: graph_features(g), args.repeats)

    read_s, feat_s = statistics.median(read_times), statistics.median(feature_times)
    print(f"transformer_stack: {args.layers} layers, {len(model.graph.node)} ONNX nodes "
          f"({g.n_nodes} ops, {g.n_edges} edges), {size_mb:.1f} MB file; "
          f"median of {args.repeats}")
    print(f"{'step':<18}{'median s':>10}{'min s':>10}")
    for label, times in (("read_onnx", read_times), ("graph_features", feature_times)):
        print(f"{label:<18}{statistics.median(times):>10.3f}{min(times):>10.3f}")
    total = read_s + feat_s
    verdict = "ok" if total < TARGET_S else "OVER TARGET"
    print(f"{'import + features':<18}{total:>10.3f}{'':>10}  target < {TARGET_S:.0f} s: {verdict}")


if __name__ == "__main__":
    main()
