"""Cost perturbation: a graph's estimated costs with the scatter of measured ones.

`perturb_costs(g, op_noise, edge_noise, seed)` multiplies

- every op's ``flops`` and measured ``time_us`` by one factor per op, and
- every edge's bytes by one factor per edge,

each factor drawn independently from a mean-preserving log-normal distribution:
``exp(sigma * z - sigma**2 / 2)`` with ``z`` standard normal, so its mean is 1 and its
relative standard deviation ``sqrt(exp(sigma**2) - 1)`` (0.20 for ``sigma = 0.2``,
0.53 for ``sigma = 0.5``): ``op_noise`` and ``edge_noise`` are the ``sigma`` of the op and
edge factors, at most `MAX_NOISE` (3: a relative standard deviation of 90, where measured
kernels scatter by tens of percent; at a sigma of some tens the draws underflow to 0 and
lose their mean). A noise of 0 leaves those costs exactly as they were; the structure,
names, output and parameter bytes never change. Edge noise scatters the bytes each
transfer moves, and the simulator counts a received copy at its edge's bytes
(docs/simulator.md), so it moves the memory of received copies too.

The draws come from a generator seeded with ``seed`` and the graph's hash, so the same
graph and seed always give the same costs and two graphs do not share one pattern of
noise. Apply it to the training step, before coarsening: each kernel (forward and
backward op) is off the estimate on its own, and a coarsened group sums its members'.

Op noise reaches an op's roofline time through its FLOPs: it moves compute-bound ops;
a memory-bound op moves with the bytes of its input edges. The other feature of measured
kernels, a shortest time below which no kernel runs, is a device's: see
``Device.min_op_us`` in `travorder.placement.clusters` (a study scenario's
``latency_us`` sets it).

>>> from travorder.graph.opgraph import OpGraph
>>> g = OpGraph.from_records([{"name": "a", "flops": 100.0}, {"name": "b", "flops": 10.0}],
...                          [("a", "b", 8.0)])
>>> perturb_costs(g, 0.0, 0.0, seed=0) == g
True
>>> p = perturb_costs(g, 0.2, 0.2, seed=0)
>>> p == perturb_costs(g, 0.2, 0.2, seed=0), bool((p.flops != g.flops).all())
(True, True)
"""

from __future__ import annotations

import numpy as np

from travorder.errors import GraphError
from travorder.graph.opgraph import OpGraph, check_graph

#: The largest ``op_noise`` and ``edge_noise`` (module docstring).
MAX_NOISE = 3.0


def lognormal_factors(rng: np.random.Generator, sigma: float, n: int) -> np.ndarray:
    """``n`` mean-1 log-normal factors of log-scale standard deviation ``sigma`` (all
    exactly 1.0 for ``sigma = 0``)."""
    return np.exp(sigma * rng.standard_normal(n) - sigma * sigma / 2)


def perturb_costs(g: OpGraph, op_noise: float, edge_noise: float, seed: int = 0) -> OpGraph:
    """``g`` with noisy op and edge costs (module docstring)."""
    check_graph(g, "perturb_costs")
    for what, v in (("op_noise", op_noise), ("edge_noise", edge_noise)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= MAX_NOISE:
            raise GraphError(f"{what} must be a number in [0, {MAX_NOISE:g}], got {v!r}")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise GraphError(f"seed must be an integer >= 0, got {seed!r}")
    if not op_noise and not edge_noise:
        return g
    rng = np.random.default_rng([int(seed), int(g.graph_hash[:16], 16)])
    op = lognormal_factors(rng, float(op_noise), g.n_nodes)
    edge = lognormal_factors(rng, float(edge_noise), g.n_edges)
    return g.replace(flops=g.flops * op, time_us=g.time_us * op,
                     edge_bytes=g.edge_bytes * edge)
