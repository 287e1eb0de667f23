"""Cold-start time of `recommend-order` on an ONNX model of about 2,000 nodes.

Each run is a fresh process, as a user's would be. Side by side, in the same loop, the
bare interpreter start (`python -c pass`) as the reference, so a noisy machine shows in
both. Prints medians and the ratio; the target is at most 1.5 s wall per run. With
``--budget SECONDS`` it also times `recommend-order --budget SECONDS` in the same loop
(``0``: one order placed and simulated, what any use of a placement costs). With
``--reference SRC`` it also times, in the same loop, `recommend-order` run from another
checkout's ``src`` directory (``git worktree add /tmp/ref REV``, then ``--reference
/tmp/ref/src``), each with its own bundled model, and prints the ratio of the medians.

    python benchmarks/recommend.py [--runs 7] [--layers 61] [--budget 0] [--reference SRC]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx

from travorder.datasets.onnx_examples import transformer_stack
from travorder.graph import load_graph


def _timed(cmd: list[str], env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--layers", type=int, default=61,
                    help="transformer layers (61: 2,017 ONNX nodes)")
    ap.add_argument("--budget", type=float, default=None,
                    help="also time recommend-order --budget SECONDS")
    ap.add_argument("--reference", type=Path, default=None,
                    help="also time recommend-order from this src directory of another "
                         "checkout")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "transformer.onnx"
        onnx.save(transformer_stack(n_layers=args.layers), path)
        n = load_graph(path).n_nodes
        bin_dir = Path(sys.executable).parent
        recommend = [str(bin_dir / "recommend-order"), str(path), "--json"]
        bare = [sys.executable, "-c", "pass"]
        checked = None if args.budget is None else [*recommend, "--budget", str(args.budget)]
        # The other checkout's entry point (and its bundled model).
        other = [sys.executable, "-c", "import sys; from travorder.cli import recommend_main; "
                 f"sys.exit(recommend_main({[str(path), '--json']!r}))"]
        other_env = None if args.reference is None else {
            **os.environ, "PYTHONPATH": str(args.reference.resolve())}
        _timed(checked or recommend)  # warm the file cache and numba's on-disk cache
        if other_env:
            _timed(other, other_env)
        rec, ref, check, old = [], [], [], []
        for _ in range(args.runs):
            rec.append(_timed(recommend))
            ref.append(_timed(bare))
            if checked:
                check.append(_timed(checked))
            if other_env:
                old.append(_timed(other, other_env))
    med_rec, med_ref = statistics.median(rec), statistics.median(ref)
    print(f"model: transformer_stack(n_layers={args.layers}), {n} ONNX nodes; "
          f"{args.runs} runs each")
    print(f"recommend-order  median {med_rec:.3f} s  (min {min(rec):.3f} s)")
    print(f"python -c pass   median {med_ref:.3f} s  (min {min(ref):.3f} s)")
    if check:
        med = statistics.median(check)
        print(f"--budget {args.budget:g}      median {med:.3f} s  (min {min(check):.3f} s), "
              f"{med - med_rec:+.3f} s over recommend-order")
    if old:
        med = statistics.median(old)
        print(f"reference        median {med:.3f} s  (min {min(old):.3f} s); this one / "
              f"reference {med_rec / med:.2f}")
    print(f"ratio {med_rec / med_ref:.1f}x the bare interpreter; target <= 1.5 s: "
          f"{'met' if med_rec <= 1.5 else 'NOT met'}")


if __name__ == "__main__":
    main()
