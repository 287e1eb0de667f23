"""Reading JSON through `travorder.errors.parse_json` against plain `json.loads`.

Side by side in one loop, on the decompressed text of the largest graphs of the bundled
corpus (what a study reads per graph); prints each one's median and the ratio.

    python benchmarks/parse_json.py [--graphs 3] [--runs 9]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import time

from travorder.datasets.corpus import bundled_corpus_dir
from travorder.errors import parse_json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", type=int, default=3)
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    files = sorted((bundled_corpus_dir() / "graphs").glob("*.json.gz"),
                   key=lambda p: -p.stat().st_size)[:args.graphs]
    for path in files:
        text = gzip.decompress(path.read_bytes())
        plain, ours = [], []
        for _ in range(args.runs):
            t = time.perf_counter()
            json.loads(text)
            plain.append(time.perf_counter() - t)
            t = time.perf_counter()
            parse_json(text)
            ours.append(time.perf_counter() - t)
        a, b = statistics.median(plain), statistics.median(ours)
        print(f"{path.name}: {len(text):,} B, json.loads {1e3 * a:.2f} ms, parse_json "
              f"{1e3 * b:.2f} ms, ratio {b / a:.2f}")


if __name__ == "__main__":
    main()
