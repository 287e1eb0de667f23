"""The timeline of a simulated step, as a trace file or a picture.

`Simulator.timeline(placement)` (or `simulate_timeline(graph, placement, cluster)`) gives a
`Timeline`: the `SimResult` (start and finish of every op) and every transfer. From it:

- `critical_path` follows the ops and transfers that end the step back to its start;
- `trace_events` / `write_trace` give the Chrome trace event format, which Perfetto
  (ui.perfetto.dev) and chrome://tracing open: one track per device and one per transfer
  queue, ops and transfers as complete (``"X"``) events;
- `plot_gantt` draws one or more timelines with matplotlib (the ``report`` extra).

>>> from travorder.placement.clusters import load_cluster
>>> g = OpGraph(["a", "b"], [0], [1], time_us=[10.0, 20.0], edge_bytes=[76_000.0])
>>> tl = simulate_timeline(g, [0, 1], load_cluster("k80x3"))
>>> [(item if isinstance(item, int) else "transfer") for item in critical_path(tl)]
[0, 'transfer', 1]
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from travorder.errors import TravorderError, write_file
from travorder.graph import OpGraph
from travorder.placement.clusters import Cluster
from travorder.placement.simulator import SimResult, Simulator, Transfer

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: Trace process ids: one process for the devices, one for the transfer queues.
DEVICES_PID, QUEUES_PID = 0, 1


@dataclass(frozen=True, eq=False)
class Timeline:
    """A simulated step in full: ``result`` (start and finish of every op) and
    ``transfers`` (in the order they were granted) of ``graph`` placed by ``placement``
    on ``cluster``."""

    graph: OpGraph
    cluster: Cluster
    placement: np.ndarray
    result: SimResult
    transfers: tuple[Transfer, ...]

    def queues(self, transfer: Transfer) -> list[int]:
        """The transfer queues (trace track ids, see `queue_names`) ``transfer`` holds."""
        n = self.cluster.n_devices
        model = self.cluster.link_model
        if model == "bus":
            return [transfer.src]
        if model == "channel":
            return [transfer.src, transfer.dst[0]]
        return [transfer.src * n + transfer.dst[0]]

    def queue_names(self) -> dict[int, str]:
        """Names of the transfer queues this cluster has, by track id."""
        names = [d.name for d in self.cluster.devices]
        model = self.cluster.link_model
        if model in ("bus", "channel"):
            return {i: f"{model} of {name}" for i, name in enumerate(names)}
        n = len(names)
        return {i * n + j: f"link {a} -> {b}" for i, a in enumerate(names)
                for j, b in enumerate(names) if i != j}


def _check_timeline(tl: Any, caller: str) -> Timeline:
    """``tl`` if it is a `Timeline`, else a `TravorderError` saying where one comes from."""
    if not isinstance(tl, Timeline):
        raise TravorderError(f"{caller} takes a Timeline (Simulator.timeline or "
                             f"simulate_timeline), not {type(tl).__name__}")
    return tl


def simulate_timeline(graph: OpGraph, placement: Any, cluster: Cluster) -> Timeline:
    """The `Timeline` of one placement (`Simulator.timeline`)."""
    return Simulator(graph, cluster).timeline(placement)


def critical_path(tl: Timeline) -> list[int | Transfer]:
    """The chain of ops (node indices) and transfers that ends the step, in time order.

    From the op that finishes last, each step back goes to what made the current item
    start when it did: an op's latest input (the producer on the same device, or the
    transfer that brought it) if that arrived exactly at its start, else the op before it
    on its device; a transfer's producer if it started when the producer finished, else
    the transfer before it on its queue. It ends at an item that started at 0.
    """
    r, g = _check_timeline(tl, "critical_path").result, tl.graph
    n = g.n_nodes
    if n == 0:
        return []
    place = tl.placement
    start, finish = r.start_us, r.finish_us
    brought = {(t.node, x): t for t in tl.transfers for x in t.dst}
    by_device = [sorted(np.flatnonzero(place == d).tolist(), key=lambda v: start[v])
                 for d in range(tl.cluster.n_devices)]
    by_queue: dict[int, list[Transfer]] = {}
    for t in tl.transfers:
        for q in tl.queues(t):
            by_queue.setdefault(q, []).append(t)

    def before(items: list[Any], key: Any, at: float) -> Any:
        earlier = [x for x in items if key(x) < at]
        return max(earlier, key=key) if earlier else None

    path: list[int | Transfer] = []
    item: int | Transfer | None = int(np.argmax(finish))
    while item is not None:
        path.append(item)
        if isinstance(item, Transfer):
            if item.start_us == finish[item.node]:
                item = item.node
            else:
                item = before([t for q in tl.queues(item) for t in by_queue[q]],
                              lambda t: t.start_us, item.start_us)
            continue
        v = item
        if start[v] == 0.0:
            break
        arrivals = [(finish[u] if place[u] == place[v] else brought[u, place[v]].end_us, u)
                    for u in g.predecessors(v).tolist()]
        latest, u = max(arrivals, default=(-1.0, -1))
        if latest == start[v]:
            item = u if place[u] == place[v] else brought[u, place[v]]
        else:
            item = before(by_device[place[v]], lambda w: start[w], start[v])
    return path[::-1]


def trace_events(tl: Timeline) -> dict[str, Any]:
    """The step in the Chrome trace event format (a JSON-ready dict).

    Process ``DEVICES_PID`` has one thread per device; process ``QUEUES_PID`` one per
    transfer queue (`Timeline.queue_names`). Each op is a complete event (``"ph": "X"``,
    ``ts``/``dur`` in us, category ``forward`` or ``backward``) on its device's track with
    ``args`` node, op_type, output_bytes; each transfer one on each queue it holds, with
    ``args`` bytes, src, dst and the producer's name. Metadata events name the tracks.
    No event stands for a gap after an op or a bus busy after a transfer (``placeto``
    semantics), so ``otherData``'s step time can end after the last event.
    """
    g, r, c = _check_timeline(tl, "trace_events").graph, tl.result, tl.cluster
    names = g.names.tolist()
    devices = [d.name for d in c.devices]
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": DEVICES_PID, "args": {"name": "devices"}},
        {"ph": "M", "name": "process_name", "pid": QUEUES_PID,
         "args": {"name": f"transfers ({c.link_model})"}},
        {"ph": "M", "name": "process_sort_index", "pid": DEVICES_PID, "args": {"sort_index": 0}},
        {"ph": "M", "name": "process_sort_index", "pid": QUEUES_PID, "args": {"sort_index": 1}},
    ]
    queues = tl.queue_names()
    for pid, tracks in ((DEVICES_PID, dict(enumerate(devices))), (QUEUES_PID, queues)):
        for tid, name in tracks.items():
            events += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                        "args": {"name": name}},
                       {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                        "args": {"sort_index": tid}}]
    for v in range(g.n_nodes):
        events.append({
            "ph": "X", "name": names[v], "cat": "backward" if g.is_backward[v] else "forward",
            "pid": DEVICES_PID, "tid": int(tl.placement[v]), "ts": float(r.start_us[v]),
            "dur": float(r.finish_us[v] - r.start_us[v]),
            "args": {"node": v, "op_type": str(g.op_types[v]),
                     "output_bytes": float(g.output_bytes[v])}})
    for t in tl.transfers:
        for q in tl.queues(t):
            events.append({
                "ph": "X", "name": f"{names[t.node]} -> {', '.join(devices[x] for x in t.dst)}",
                "cat": "transfer", "pid": QUEUES_PID, "tid": q, "ts": t.start_us,
                "dur": t.end_us - t.start_us,
                "args": {"node": names[t.node], "bytes": t.bytes, "src": devices[t.src],
                         "dst": [devices[x] for x in t.dst]}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"graph": g.name, "cluster": c.name, "semantics": c.semantics,
                          "step_time_us": r.step_time_us, "lower_bound_us": r.lower_bound_us,
                          "n_transfers": r.n_transfers, "bytes_moved": r.bytes_moved}}


def write_trace(tl: Timeline, path: str | os.PathLike[str]) -> None:
    """Write `trace_events` as JSON to ``path`` (open it in ui.perfetto.dev)."""
    write_file(path, json.dumps(trace_events(tl)).encode(), "trace")


#: The picture formats `plot_gantt` writes, by file suffix.
GANTT_FORMATS = ("png", "svg", "pdf")


def plot_gantt(timelines: Timeline | list[Timeline], path: str | os.PathLike[str] | None = None,
               *, titles: list[str] | None = None) -> Figure:
    """Draw timelines as Gantt charts, one above the other on one time axis.

    Rows: the devices, then the transfer queues that carried something. Forward ops are
    blue, backward ops orange, transfers grey; a red strip marks the critical path
    (`critical_path`). Saved to ``path`` (PNG, SVG or PDF by its suffix) if given;
    returns the figure. Needs matplotlib (``pip install 'travorder[report]'``).
    """
    fmt = None if path is None else Path(path).suffix.lower().lstrip(".")
    if fmt is not None and fmt not in GANTT_FORMATS:
        raise TravorderError(f"a Gantt chart is written as {', '.join(GANTT_FORMATS)}: "
                             f"{str(path)!r} has another suffix")
    try:
        import matplotlib

        if path is not None:
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        raise TravorderError("plot_gantt needs matplotlib: pip install "
                             "'travorder[report]'") from None
    if not isinstance(timelines, Timeline | list | tuple):
        raise TravorderError(f"plot_gantt takes a Timeline or a list of them, not "
                             f"{type(timelines).__name__}")
    tls = [_check_timeline(tl, "plot_gantt") for tl in (
        [timelines] if isinstance(timelines, Timeline) else timelines)]
    if not tls:
        raise TravorderError("plot_gantt needs at least one timeline")
    if titles is not None and (isinstance(titles, str) or not all(
            isinstance(t, str) for t in titles)):  # "abc" is not three titles
        raise TravorderError(f"titles must be a list of strings, not {titles!r}")
    titles = titles or [f"{tl.graph.name} on {tl.cluster.name}" for tl in tls]
    if len(titles) != len(tls):
        raise TravorderError(f"{len(titles)} titles for {len(tls)} timelines: give one each")
    rows = [len(tl.cluster.devices) + len({q for t in tl.transfers for q in tl.queues(t)})
            for tl in tls]
    fig, axes = plt.subplots(len(tls), 1, sharex=True, squeeze=False,
                             figsize=(12, 1.3 + sum(0.42 * r + 0.9 for r in rows)),
                             gridspec_kw={"height_ratios": [r + 1.5 for r in rows]})
    for ax, tl, title in zip(axes[:, 0], tls, titles, strict=True):
        _draw(ax, tl, title)
    axes[-1, 0].set_xlabel("time (ms)")
    handles = [Patch(color=_FORWARD, label="forward op"),
               Patch(color=_BACKWARD, label="backward op"),
               Patch(color=_TRANSFER, label="transfer"),
               Patch(color=_CRITICAL, label="critical path")]
    fig.legend(handles=handles, loc="upper center", ncol=4, frameon=False,
               bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    if path is not None:
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, dpi=130)
        plt.close(fig)
        write_file(path, buf.getvalue(), "Gantt chart")
    return fig


_FORWARD, _BACKWARD, _TRANSFER, _CRITICAL = "#4C78A8", "#F58518", "#9D9D9D", "#D62728"


def _draw(ax: Any, tl: Timeline, title: str) -> None:
    r, g = tl.result, tl.graph
    ms = 1e-3
    devices = [d.name for d in tl.cluster.devices]
    queue_names = tl.queue_names()
    used = sorted({q for t in tl.transfers for q in tl.queues(t)})
    labels = devices + [queue_names[q] for q in used]
    row_of_queue = {q: len(devices) + i for i, q in enumerate(used)}
    path = critical_path(tl)

    for d in range(len(devices)):
        ops = np.flatnonzero(tl.placement == d)
        spans = [(r.start_us[v] * ms, (r.finish_us[v] - r.start_us[v]) * ms) for v in ops]
        colors = [_BACKWARD if g.is_backward[v] else _FORWARD for v in ops]
        ax.broken_barh(spans, (d - 0.35, 0.7), facecolors=colors, edgecolors="white",
                       linewidths=0.3)
    for t in tl.transfers:
        for q in tl.queues(t):
            ax.broken_barh([(t.start_us * ms, (t.end_us - t.start_us) * ms)],
                           (row_of_queue[q] - 0.3, 0.6), facecolors=_TRANSFER,
                           edgecolors="white", linewidths=0.2)
    # the critical path: a red strip over each of its items, joined where it changes row
    spans, last = [], None
    for item in path:
        if isinstance(item, Transfer):
            row, a, b = row_of_queue[tl.queues(item)[0]], item.start_us, item.end_us
        else:
            row, a, b = int(tl.placement[item]), r.start_us[item], r.finish_us[item]
        spans.append((row, a * ms, b * ms))
        if last is not None and last[0] != row:
            ax.plot([last[2], a * ms], [last[0] - 0.42, row - 0.42], color=_CRITICAL,
                    linewidth=0.8)
        last = spans[-1]
    for row in {s[0] for s in spans}:
        ax.broken_barh([(a, b - a) for rr, a, b in spans if rr == row], (row - 0.48, 0.12),
                       facecolors=_CRITICAL, edgecolors=_CRITICAL, linewidths=0.4)
    ax.set_yticks(range(len(labels)), labels)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.axvline(r.step_time_us * ms, color="k", linestyle=":", linewidth=1)
    ax.set_title(f"{title}: step {r.step_time_us * ms:.3f} ms, efficiency "
                 f"{r.efficiency:.2f}, {r.n_transfers} transfers", fontsize=10, loc="left")
    ax.grid(axis="x", alpha=0.3)
