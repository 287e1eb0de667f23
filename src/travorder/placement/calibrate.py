"""Calibrate a cluster file from the devices of this machine.

For each device: peak FLOP/s from square float32 matrix products (``2 n^3`` FLOPs) of
sides ``n/4``, ``n/2`` and ``n``, memory bandwidth from on-device copies (bytes read +
written) of a quarter, half and all of ``stream_bytes``, and the launch gap from a chain of tiny
differentiable ops run forward and backward (the time per op, with the dispatch and
autograd overhead that eager training pays on every op). Peak FLOP/s and bandwidth are
the slopes of ``time = fixed + work / rate`` fitted to the three sizes (`fit_link`):
the fixed cost that every op pays whatever its size is the launch gap's part of the cost
model, not slowness. On a CPU whose cores are busy that fixed cost is large (waking torch's
intra-op threads took 15-30 ms per op on a loaded 2-core machine): timing one small op
and dividing its work by its time measured that fixed cost, and so the first quick sizes
(a 64x64 product, a 64 KB copy) reported rates about 500 times too low. The sizes must
also be large enough for the work to show above that cost, which is why even `QUICK`
multiplies 1024x1024 matrices. For each
ordered pair of devices: copies of a sweep of sizes into a buffer on the destination, and
a line ``time = latency + bytes / bandwidth`` fitted to them (bandwidth in B/us, latency
in us, as in :mod:`travorder.placement.clusters`).
Each timing is the best of ``repeats`` (the least disturbed by other work on the
machine), CUDA devices synchronised around each.

Device memory is the device's total (CUDA) or the machine's physical memory (CPU), split
evenly among the entries that name the same device. A device named twice is measured
once; a pair of entries naming the same device is measured as a copy within it.

On a machine without GPUs, a request for CUDA devices calibrates as many CPU entries
instead, and says so (through ``log`` and in the cluster's description), so that the
simulator and the launcher can be exercised anywhere.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from travorder.errors import TravorderError
from travorder.placement.clusters import (
    LINK_MODELS,
    Cluster,
    Device,
    cluster_file_format,
    save_cluster,
)
from travorder.placement.launch import check_device, parse_device


@dataclass(frozen=True)
class Sizes:
    """How much work each measurement does.

    ``matmul_n``: side of the square matrices; ``stream_bytes``: size of the on-device
    copy; ``copy_bytes``: the device-to-device sizes swept; ``launch_ops``: length of the
    chain of tiny ops timed for the launch gap; ``repeats``: timings per figure (the best is kept).
    """

    matmul_n: int
    stream_bytes: int
    copy_bytes: tuple[int, ...]
    launch_ops: int
    repeats: int

    def __post_init__(self) -> None:
        counts = {"matmul_n": self.matmul_n, "stream_bytes": self.stream_bytes,
                  "launch_ops": self.launch_ops, "repeats": self.repeats}
        for key, value in counts.items():  # 0 divided by zero, or made a singular fit
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TravorderError(f"sizes {key} must be an integer >= 1, got {value!r}")
        copies = self.copy_bytes
        if (not isinstance(copies, tuple) or len(set(copies)) < 2 or not all(
                isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in copies)):
            raise TravorderError(f"sizes copy_bytes must be a tuple of two or more distinct "
                                 f"integers >= 1 (a line is fitted through them), got "
                                 f"{copies!r}")

    @classmethod
    def default(cls, cuda: bool) -> Sizes:
        """Sizes for GPUs (``cuda``) or CPUs: a few seconds per device and pair."""
        if cuda:
            return cls(4096, 1 << 28, tuple(1 << k for k in range(12, 28, 2)), 1000, 10)
        return cls(1024, 1 << 27, tuple(1 << k for k in range(14, 26, 2)), 200, 5)


#: A fast check: the CPU sizes for the rates (smaller ones time the fixed per-op cost,
#: not the device), few copy sizes and repeats; rough figures.
QUICK = Sizes(1024, 1 << 27, (1 << 10, 1 << 12, 1 << 14), 20, 3)


def _sync(devices: Sequence[torch.device]) -> None:
    for d in devices:
        if d.type == "cuda":
            torch.cuda.synchronize(d)


def _best_us(fn: Callable[[], Any], devices: Sequence[torch.device], repeats: int,
             inner: int = 1) -> float:
    """Best wall time of ``inner`` calls of ``fn``, divided by ``inner``, in us."""
    fn()  # warm up (allocations, kernel selection)
    times = []
    for _ in range(repeats):
        _sync(devices)
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        _sync(devices)
        times.append((time.perf_counter() - t0) * 1e6 / inner)
    return min(times)


def _memory_bytes(device: torch.device) -> float:
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def measure_device(device: torch.device, sizes: Sizes) -> dict[str, float]:
    """``peak_flops`` (FLOP/s), ``mem_bw`` (B/s) and ``launch_us`` of one device."""
    sides = (sizes.matmul_n // 4, sizes.matmul_n // 2, sizes.matmul_n)
    t_mm = []
    for n in sides:
        a = torch.randn(n, n, device=device)
        b = torch.randn(n, n, device=device)
        out = torch.empty(n, n, device=device)
        t_mm.append(_best_us(lambda a=a, b=b, out=out: torch.mm(a, b, out=out), [device],
                             sizes.repeats))
    streams = (sizes.stream_bytes // 4, sizes.stream_bytes // 2, sizes.stream_bytes)
    t_copy = []
    for nbytes in streams:
        src = torch.empty(nbytes, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        t_copy.append(_best_us(lambda src=src, dst=dst: dst.copy_(src), [device],
                               sizes.repeats))
    tiny = torch.ones(1, device=device, requires_grad=True)

    def chain() -> None:  # launch_ops forward ops and as many backward ops
        y = tiny
        for _ in range(sizes.launch_ops):
            y = y * 1.0
        y.backward()

    t_op = _best_us(chain, [device], sizes.repeats) / (2 * sizes.launch_ops)
    # fit_link's line: the rates per us without the fixed per-op cost
    flops_per_us, _ = fit_link([2.0 * n**3 for n in sides], t_mm)
    bytes_per_us, _ = fit_link([2.0 * b for b in streams], t_copy)
    return {"peak_flops": flops_per_us * 1e6, "mem_bw": bytes_per_us * 1e6,
            "launch_us": t_op}


def fit_link(nbytes: Sequence[float], times_us: Sequence[float]) -> tuple[float, float]:
    """``(bandwidth B/us, latency us)`` of the line ``time = latency + bytes / bandwidth``
    fitted by least squares on relative errors (so the small copies, which fix the
    latency, weigh as much as the large ones); a non-positive slope (a sweep too small to
    see the bandwidth) gives the largest copy's rate, a negative intercept latency 0.

    >>> fit_link([1000, 3000], [12.5, 13.5])
    (2000.0, 12.0)
    """
    x, y = np.asarray(nbytes, dtype=np.float64), np.asarray(times_us, dtype=np.float64)
    slope, intercept = np.polyfit(x, y, 1, w=1.0 / y)
    big = int(np.argmax(x))
    bandwidth = 1.0 / slope if slope > 0 else x[big] / y[big]
    return round(float(bandwidth), 9), round(float(max(intercept, 0.0)), 9)


def measure_link(src: torch.device, dst: torch.device, sizes: Sizes
                 ) -> tuple[float, float]:
    """``(bandwidth B/us, latency us)`` of copies from ``src`` to ``dst``: `fit_link` over
    the time of a copy of each size in ``sizes.copy_bytes``."""
    times = []
    for size in sizes.copy_bytes:
        a = torch.empty(size, dtype=torch.uint8, device=src)
        b = torch.empty(size, dtype=torch.uint8, device=dst)
        times.append(_best_us(lambda a=a, b=b: b.copy_(a), [src, dst], sizes.repeats,
                              inner=10))
    return fit_link(sizes.copy_bytes, times)


def resolve_devices(devices: Sequence[str]) -> tuple[list[str], str | None]:
    """Canonical device names, and a note when CPU entries stand in for missing GPUs.

    With no GPU on this machine, CUDA entries become ``cpu``; anything else torch does
    not know or this machine lacks raises `TravorderError`.
    """
    if isinstance(devices, str):  # "cpu" is not the devices c, p and u
        raise TravorderError(f"devices is a list of device names, e.g. ['cuda:0', "
                             f"'cuda:1'], not the string {devices!r}")
    if not devices:
        raise TravorderError("no devices given")
    wanted = [str(d).strip() for d in devices]
    for d in wanted:  # a name torch does not know is refused, GPU or not
        parse_device(d)
    if not torch.cuda.is_available() and any(d.startswith("cuda") for d in wanted):
        note = (f"no GPU on this machine: calibrating {len(wanted)} CPU device"
                f"{'s' if len(wanted) != 1 else ''} instead of {','.join(wanted)}")
        wanted = ["cpu" if d.startswith("cuda") else d for d in wanted]
        return [check_device(d) for d in wanted], note
    return [check_device(d) for d in wanted], None


def calibrate(devices: Sequence[str], *, sizes: Sizes | None = None, name: str | None = None,
              link_model: str = "link", out: str | os.PathLike[str] | None = None,
              log: Callable[[str], None] | None = None) -> Cluster:
    """Measure ``devices`` (torch device names, one per cluster device) into a `Cluster`.

    ``sizes``: the measurement sizes (default `Sizes.default` for the kind of device;
    `QUICK` for a fast check). ``link_model``: how transfers share links (see
    `Cluster`). ``out``: also write the cluster there (``.toml`` or ``.json``, see
    `save_cluster`). ``log`` receives a line per measurement and the no-GPU note.

    >>> c = calibrate(["cpu", "cpu"], sizes=QUICK)
    >>> c.n_devices, [d.name for d in c.devices], bool(c.bandwidth[0, 1] > 0)
    (2, ['cpu/0', 'cpu/1'], True)
    """
    if link_model not in LINK_MODELS:  # before minutes of measuring, not after
        raise TravorderError(f"unknown link model {link_model!r} (expected one of "
                             f"{', '.join(LINK_MODELS)})")
    if sizes is not None and not isinstance(sizes, Sizes):
        raise TravorderError(f"sizes must be a Sizes (QUICK, or Sizes(...)), not {sizes!r}")
    if name is not None and not (isinstance(name, str) and name):
        raise TravorderError(f"name must be a non-empty string, not {name!r}")
    if out is not None:
        cluster_file_format(out)
        if str(out).endswith(("/", os.sep)) or not Path(out).parent.is_dir():
            raise TravorderError(f"no such folder for the cluster file {str(out)!r}")
    say = log or (lambda _: None)
    names, note = resolve_devices(devices)
    if note:
        say(note)
    torch_devs = [torch.device(d) for d in names]
    distinct = list(dict.fromkeys(torch_devs))
    cuda = any(d.type == "cuda" for d in distinct)
    sizes = sizes or Sizes.default(cuda)

    figures = {}
    for d in distinct:
        figures[d] = measure_device(d, sizes)
        f = figures[d]
        say(f"{d}: {f['peak_flops'] / 1e12:.3g} TFLOP/s, {f['mem_bw'] / 1e9:.3g} GB/s, "
            f"{f['launch_us']:.3g} us per op")
    links = {}
    for s in distinct:
        for t in distinct:
            if len(distinct) > 1 and s == t:
                continue  # only a pair of entries naming one device copies within it
            links[s, t] = measure_link(s, t, sizes)
            say(f"{s} -> {t}: {links[s, t][0] / 1e3:.3g} GB/s, {links[s, t][1]:.3g} us")

    labels = names if len(set(names)) == len(names) else [
        f"{d}/{i}" for i, d in enumerate(names)]
    shares = {d: torch_devs.count(d) for d in distinct}
    cluster_devices = tuple(
        Device(label, figures[d]["peak_flops"], figures[d]["mem_bw"],
               _memory_bytes(d) / shares[d], figures[d]["launch_us"])
        for label, d in zip(labels, torch_devs, strict=True))
    n = len(names)
    bandwidth, latency = np.zeros((n, n)), np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            if i != j:
                bandwidth[i, j], latency[i, j] = links[torch_devs[i], torch_devs[j]]
    description = (f"calibrated on {platform.node() or 'this machine'} with torch "
                   f"{torch.__version__}" + (f"; {note}" if note else ""))
    cluster = Cluster(name=name or f"calibrated-{n}x{distinct[0].type}",
                      devices=cluster_devices, bandwidth=bandwidth, latency=latency,
                      link_model=link_model, description=description)
    if out is not None:
        save_cluster(cluster, out)
    return cluster


def default_devices() -> list[str]:
    """Every CUDA device of this machine, or ``["cpu"]`` without one."""
    n = torch.cuda.device_count()
    return [f"cuda:{i}" for i in range(n)] if n else ["cpu"]


def calibrate_command(devices: str | Sequence[str] | None, out: str | os.PathLike[str], *,
                      quick: bool = False, link_model: str = "link",
                      echo: Callable[[str], None] = print) -> Cluster:
    """What ``travorder calibrate --devices cuda:0,cuda:1 --out cluster.toml`` does.

    ``devices``: comma-separated or a list; None for `default_devices`. ``quick``: use
    `QUICK` sizes. Reports each measurement, the no-GPU note and the file written through
    ``echo``; returns the cluster.
    """
    if isinstance(devices, str):
        devices = [d for d in devices.split(",") if d.strip()]
    devices = list(devices) if devices is not None else default_devices()
    cluster = calibrate(devices, sizes=QUICK if quick else None, link_model=link_model,
                        out=out, log=echo)
    n = cluster.n_devices
    echo(f"wrote {out}: cluster {cluster.name!r}, {n} device{'s' * (n != 1)}")
    return cluster
