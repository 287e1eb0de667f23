"""What `recommend-order --budget SECONDS` checks on the examples, and how long it takes.

For each model and budget, fresh processes one after the other (as a user's would be),
after one untimed run that warms the file cache and numba's on-disk cache. Prints, per
row, the orders checked (and the placements that took: orders of one node sequence
share one), how many runs were exact, the time spent checking (`check_s`)
and the whole command, as ranges over the runs: the table in docs/predictor.md.

    python benchmarks/budget.py [--runs 3] [--budgets 0,0.1,0.5,2] [--cluster k80x3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx

from travorder.datasets.onnx_examples import transformer_stack
from travorder.graph import load_graph

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _span(values: list[float], fmt: str = "{:.2f}") -> str:
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else \
        f"{fmt.format(lo)}-{fmt.format(hi)}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--budgets", default="0,0.1,0.5,2")
    ap.add_argument("--cluster", default="k80x3")
    args = ap.parse_args()
    budgets = [float(b) for b in args.budgets.split(",")]
    recommend = str(Path(sys.executable).parent / "recommend-order")
    with tempfile.TemporaryDirectory() as tmp:
        stack = Path(tmp) / "transformer_stack61.onnx"
        onnx.save(transformer_stack(n_layers=61), stack)
        models = [EXAMPLES / "resnet_small.onnx", EXAMPLES / "transformer_small.onnx", stack]
        subprocess.run([recommend, str(models[0]), "--budget", "0"], check=True,
                       capture_output=True)
        print("| model | `--budget` | orders checked | placements | exact | check | "
              "whole command |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for model in models:
            ops = load_graph(model).n_nodes
            for budget in budgets:
                checked, placed, exact, check_s, whole = [], [], 0, [], []
                for _ in range(args.runs):
                    t0 = time.perf_counter()
                    out = subprocess.run([recommend, str(model), "--cluster", args.cluster,
                                          "--budget", f"{budget:g}", "--json"], check=True,
                                         capture_output=True, text=True).stdout
                    whole.append(time.perf_counter() - t0)
                    rec = json.loads(out)
                    checked.append(len(rec["verified"]))
                    group = {o: i for i, g in enumerate(rec["same_sequence"]) for o in g}
                    placed.append(len({group.get(o, o) for o in rec["verified"]}))
                    exact += rec["exact"]
                    check_s.append(rec["check_s"])
                print(f"| {model.name} ({ops} ONNX ops) | {budget:g} s | "
                      f"{_span(checked, '{:.0f}')} of 11 | {_span(placed, '{:.0f}')} | "
                      f"{exact} of {args.runs} | "
                      f"{_span(check_s)} s | {_span(whole, '{:.1f}')} s |", flush=True)


if __name__ == "__main__":
    main()
