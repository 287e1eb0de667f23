"""Held-out regret on perturbed costs against the same graphs on the estimated costs.

Learns from ``--data`` (default: the 884 coarsened rows the shipped RL model learned
from), holds out the families in ``--folds`` groups as ``travorder evaluate --test-data``
does, and scores the held-out families' rows of

- ``perturbed``: the perturbed study (``--perturbed``, default the three parts of
  ``bundled:rl-perturbed``);
- ``roofline twins``: the same graphs, clusters and scenarios on the estimated costs
  (`travorder.study.export.unperturbed_twins`, taken from ``--data``),

so that the ratio compares the same graphs. Over all rows and per scenario: the learned
pick (regressor), the best fixed order chosen on the training folds, a random order (over
all rows only) and checking 3 orders by placement; then the learned pick per part of
``--perturbed`` (its rows' families, where each family lies in one part).

    python benchmarks/perturbed_regret.py [--data SRC...] [--perturbed SRC...]
        [--placer rl] [--structure order_stats] [--folds 10]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from importlib import resources
from pathlib import Path

import pandas as pd

from travorder.predictor.train import evaluate_sources
from travorder.study.export import BUNDLED_DATASETS, read_sources, unperturbed_twins

DATA = Path(str(resources.files("travorder.study").joinpath("data")))
#: The coarsened parts of the RL study, in the order the shipped RL model read them.
RL_ROWS = [DATA / p for p in BUNDLED_DATASETS["rl"] if not p.startswith("rl-full")]
RL_PERTURBED = [DATA / p for p in BUNDLED_DATASETS["rl-perturbed"]]
METHODS = {"learned": "regressor", "best fixed": "best-fixed", "random": "random",
           "checking 3": "regressor+verify3"}


def _by_scenario(evaluation, plain: dict[str, str]) -> dict[str, dict[str, float]]:
    """Mean regret per method over all rows and per scenario (named without the
    perturbation settings, so that both test sets line up)."""
    out = {"all": {k: float(evaluation.table.loc[m, "mean_regret"])
                   for k, m in METHODS.items()}}
    b = evaluation.breakdown.reset_index()
    b = b[b["cluster"] == "all"]
    for scenario, rows in b.groupby("scenario"):
        mean = rows.set_index("method")["mean_regret"]
        out[plain.get(scenario, scenario)] = {k: float(mean[m]) for k, m in METHODS.items()
                                              if m in mean.index}
    return out


def _by_part(evaluation, parts: dict[str, pd.DataFrame]) -> dict[str, float]:
    """The learned pick's mean regret over each part's rows (row-weighted family means)."""
    learned = evaluation.per_family.loc[METHODS["learned"]]
    return {name: float((rows["family"].value_counts() * learned).dropna().sum()
                        / len(rows)) for name, rows in parts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", nargs="+", default=[str(p) for p in RL_ROWS])
    parser.add_argument("--perturbed", nargs="+", default=[str(p) for p in RL_PERTURBED])
    parser.add_argument("--placer", default="rl")
    parser.add_argument("--structure", default="order_stats")
    parser.add_argument("--folds", type=int, default=10)
    args = parser.parse_args()
    structure = tuple(s for s in args.structure.split(",") if s)
    parts = {Path(p).stem: read_sources([p]) for p in args.perturbed}
    perturbed = pd.concat(parts.values(), ignore_index=True)
    twins = unperturbed_twins(perturbed, read_sources(args.data))
    plain = dict(zip(perturbed["scenario"], twins["scenario"], strict=True))
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        twin_file = Path(tmp) / "twins.parquet"
        twins.to_parquet(twin_file)
        for name, test in (("roofline twins", [str(twin_file)]),
                           ("perturbed", args.perturbed)):
            t0 = time.perf_counter()
            ev = evaluate_sources(args.data, test, placer=args.placer, kinds=("regressor",),
                                  structure=structure, folds=args.folds)
            results[name] = (_by_scenario(ev, plain), _by_part(ev, parts))
            fam = ev.families.loc[METHODS["learned"]]
            worse = ", ".join(f"{f} +{r.excess:.2%} (noise {r.noise:.2%})"
                              for f, r in fam[fam["worse"]].iterrows()) or "none"
            print(f"{name}: {len(perturbed)} rows, {time.perf_counter() - t0:.0f} s; "
                  f"families where the learned pick is worse than the best fixed order "
                  f"beyond noise: {worse}", flush=True)
    print(f"\n| scenario | rows | {' | '.join(f'{k}, twins / perturbed' for k in METHODS)} "
          f"| ratio (learned) |")
    print("| --- | --- |" + " --- |" * (len(METHODS) + 1))
    counts = twins["scenario"].value_counts()
    for scenario in results["perturbed"][0]:
        base, pert = results["roofline twins"][0][scenario], results["perturbed"][0][scenario]
        cells = " | ".join(f"{base[k]:.2%} / {pert[k]:.2%}" if k in base else "n/a"
                           for k in METHODS)
        rows = len(twins) if scenario == "all" else counts[scenario]
        print(f"| {scenario} | {rows} | {cells} | {pert['learned'] / base['learned']:.2f} |")
    print("\n| part | rows | learned, twins | learned, perturbed | ratio |")
    print("| --- | --- | --- | --- | --- |")
    for name, rows in parts.items():
        base, pert = results["roofline twins"][1][name], results["perturbed"][1][name]
        print(f"| {name} | {len(rows)} | {base:.2%} | {pert:.2%} | {pert / base:.2f} |")


if __name__ == "__main__":
    main()
