"""Device clusters: devices, links, link models, presets and the op cost model.

Units throughout: FLOP/s for ``peak_flops``, B/s for ``mem_bw``, bytes for ``memory``,
microseconds (us) for every time, and **bytes per microsecond** for link bandwidth
(1 GB/s = 1,000 B/us). Presets live as TOML files next to this module and are described,
with their sources, in ``docs/simulator.md``.

>>> c = load_cluster("k80x3")
>>> c.n_devices, c.link_model, float(c.bandwidth[0, 1]), c.busy_after_us
(3, 'bus', 7600.0, 25.0)
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from travorder.errors import (
    FormatError,
    TravorderError,
    check_regular,
    json_text,
    parse_json,
    write_file,
)
from travorder.graph import OpGraph

#: The link models: one transfer queue per sending device (``bus``, Placeto), per device
#: shared by its sends and receives (``channel``, Baechi), or per ordered pair (``link``).
LINK_MODELS = ("bus", "channel", "link")

#: The simulator's rules: travorder's own (the default) or Placeto's simulator reproduced
#: exactly (``placeto``: bus links only); ``docs/simulator.md`` compares them.
SEMANTICS = ("travorder", "placeto")

_DEVICE_KEYS = ("name", "peak_flops", "mem_bw", "memory", "launch_us", "min_op_us")
_CLUSTER_KEYS = ("name", "description", "link_model", "busy_after_us", "param_copies",
                 "semantics", "devices", "links")
#: A one-device cluster's links, which nothing crosses.
_NO_LINKS = MappingProxyType({"bandwidth": math.inf, "latency": 0.0})


#: The most devices a cluster may have: the simulator's link matrices and per-device
#: tables grow with the square, and no placement study places across more.
MAX_DEVICES = 1024


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TravorderError(f"{what} must be a number, got {_short(value)}")
    try:
        return float(value)
    except OverflowError:
        raise TravorderError(f"{what} is too large for a float: {_short(value)}") from None


def _short(value: Any) -> str:
    """``repr(value)``, cut to 60 characters (a 400-digit number stays one short line)."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


@dataclass(frozen=True)
class Device:
    """One accelerator.

    ``peak_flops`` in FLOP/s, ``mem_bw`` in B/s, ``memory`` in bytes (``math.inf`` for
    unlimited), ``launch_us``: the gap after each op (launch overhead), in us;
    ``min_op_us``: the shortest time an op that does any work takes on it, in us (a
    kernel's floor, as measured kernels have; 0: none).
    """

    name: str
    peak_flops: float
    mem_bw: float
    memory: float = math.inf
    launch_us: float = 0.0
    min_op_us: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TravorderError(f"device name must be a non-empty string, got {self.name!r}")
        for key in _DEVICE_KEYS[1:]:
            object.__setattr__(self, key, _number(getattr(self, key), f"device "
                                                  f"{self.name!r}: {key}"))
        for key in ("peak_flops", "mem_bw"):
            v = getattr(self, key)
            if not (0 < v < math.inf):
                raise TravorderError(f"device {self.name!r}: {key} must be positive and "
                                     f"finite, got {v}")
        if not self.memory > 0:
            raise TravorderError(f"device {self.name!r}: memory must be positive (inf for "
                                 f"unlimited), got {self.memory}")
        for key in ("launch_us", "min_op_us"):
            v = getattr(self, key)
            if not (0 <= v < math.inf):
                raise TravorderError(f"device {self.name!r}: {key} must be finite and "
                                     f"non-negative, got {v}")


def _null_as_inf(value: Any) -> Any:
    """``value`` with each ``None`` (JSON ``null``) as ``math.inf``, in lists too."""
    if isinstance(value, list):
        return [_null_as_inf(v) for v in value]
    return math.inf if value is None else value


def _numbers(value: Any, what: str) -> Any:
    """``value``, a number or nested lists (or numpy arrays) of them, with every entry
    checked to be a number: not true, "5" or None."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "iuf":
            raise TravorderError(f"{what} must be numbers, got an array of {value.dtype}")
        return value
    if isinstance(value, list | tuple):
        return [_numbers(x, what) for x in value]
    return _number(value, what)


def _pair_matrix(value: Any, n: int, what: str) -> np.ndarray:
    checked = _numbers(value, what)
    try:
        a = np.asarray(checked, dtype=np.float64)  # ragged rows do not make a matrix
    except (TypeError, ValueError):
        raise TravorderError(f"{what} must be a number or a {n}x{n} matrix of numbers"
                             ) from None
    if a.ndim == 0:
        a = np.full((n, n), float(a))
    if a.shape != (n, n):
        raise TravorderError(f"{what} must be a number or a {n}x{n} matrix for {n} devices, "
                             f"got shape {a.shape}")
    a = a.copy()
    np.fill_diagonal(a, 0.0)  # a device does not send to itself
    a.flags.writeable = False
    return a


@dataclass(frozen=True, eq=False)
class Cluster:
    """Devices, the links between them and how transfers share those links.

    ``bandwidth[i, j]`` (B/us, may be ``inf``) and ``latency[i, j]`` (us) describe sending
    from device ``i`` to ``j``; either may be given as one number for every pair; the
    diagonal is unused and stored as 0. A transfer of ``b`` bytes takes
    ``latency + b / bandwidth`` us on its queue (see ``link_model``), which then stays busy
    ``busy_after_us`` more (Placeto's bus: 25 us). ``param_copies`` multiplies each op's
    ``param_bytes`` in device memory: 3 for training (weights, gradients, optimizer
    state), 1 for inference. ``semantics`` picks the simulator's rules (`SEMANTICS`):
    ``placeto`` needs the ``bus`` link model with one bandwidth and latency per sender.
    """

    name: str
    devices: tuple[Device, ...]
    bandwidth: np.ndarray
    latency: np.ndarray
    link_model: str = "link"
    busy_after_us: float = 0.0
    param_copies: float = 3.0
    description: str = ""
    semantics: str = "travorder"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TravorderError(f"cluster name must be a non-empty string, got "
                                 f"{_short(self.name)}")
        where = f"cluster {self.name!r}"
        if not isinstance(self.description, str):
            raise TravorderError(f"{where}: description must be a string, got "
                                 f"{_short(self.description)}")
        if not isinstance(self.devices, list | tuple):  # one Device, or None
            raise TravorderError(f"{where}: devices must be a list of Device objects, not "
                                 f"{_short(self.devices)}")
        devices = tuple(self.devices)
        if not devices:
            raise TravorderError(f"{where} has no devices")
        if len(devices) > MAX_DEVICES:
            raise TravorderError(f"{where} has {len(devices)} devices; at most "
                                 f"{MAX_DEVICES} are supported")
        if not all(isinstance(d, Device) for d in devices):
            raise TravorderError(f"{where}: devices must be Device objects")
        names = [d.name for d in devices]
        if len(set(names)) != len(names):
            dup = next(x for x in names if names.count(x) > 1)
            raise TravorderError(f"{where}: duplicate device name {dup!r}")
        n = len(devices)
        bw = _pair_matrix(self.bandwidth, n, f"{where}: bandwidth")
        lat = _pair_matrix(self.latency, n, f"{where}: latency")
        off = ~np.eye(n, dtype=bool)
        if n == 1:  # no pair holds a number given for every pair: check the number
            for what, v, ok, rule in (
                    ("bandwidth", self.bandwidth, lambda x: x > 0, "positive (B/us)"),
                    ("latency", self.latency, lambda x: 0 <= x < math.inf,
                     "finite and non-negative (us)")):
                if np.ndim(v) == 0 and not ok(float(v)):
                    raise TravorderError(f"{where}: {what} must be {rule}, got {float(v)}")
        if not np.all(bw[off] > 0):  # also catches NaN
            i, j = np.argwhere(off & ~(bw > 0))[0]
            raise TravorderError(f"{where}: bandwidth {i}->{j} must be positive (B/us), "
                                 f"got {bw[i, j]}")
        if not np.all((lat >= 0) & np.isfinite(lat)):
            i, j = np.argwhere(~((lat >= 0) & np.isfinite(lat)))[0]
            raise TravorderError(f"{where}: latency {i}->{j} must be finite and "
                                 f"non-negative (us), got {lat[i, j]}")
        if self.link_model not in LINK_MODELS:
            raise TravorderError(f"{where}: unknown link model {self.link_model!r} "
                                 f"(expected one of {', '.join(LINK_MODELS)})")
        if self.semantics not in SEMANTICS:
            raise TravorderError(f"{where}: unknown semantics {self.semantics!r} (expected "
                                 f"one of {', '.join(SEMANTICS)})")
        if self.semantics == "placeto":
            if self.link_model != "bus":
                raise TravorderError(f"{where}: semantics 'placeto' needs link_model 'bus', "
                                     f"got {self.link_model!r}")
            for what, a in (("bandwidth", bw), ("latency", lat)):
                rows = [a[i][off[i]] for i in range(n)]
                bad = [i for i, r in enumerate(rows) if r.size and np.any(r != r[0])]
                if bad:
                    raise TravorderError(f"{where}: semantics 'placeto' sends each tensor "
                                         f"once on its device's bus, so all {what} from "
                                         f"device {bad[0]} must be equal")
        for key in ("busy_after_us", "param_copies"):
            v = _number(getattr(self, key), f"{where}: {key}")
            if not (0 <= v < math.inf):
                raise TravorderError(f"{where}: {key} must be finite and non-negative, "
                                     f"got {v}")
            object.__setattr__(self, key, v)
        object.__setattr__(self, "devices", devices)
        object.__setattr__(self, "bandwidth", bw)
        object.__setattr__(self, "latency", lat)

    @property
    def n_devices(self) -> int:
        return len(self.devices)

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (JSON/TOML shaped) that :meth:`from_dict` reads back."""

        def pairs(a: np.ndarray) -> float | list[list[float]]:
            off = a[~np.eye(self.n_devices, dtype=bool)]
            return float(off[0]) if off.size and np.all(off == off[0]) else a.tolist()

        return {
            "name": self.name,
            "description": self.description,
            "link_model": self.link_model,
            "busy_after_us": self.busy_after_us,
            "param_copies": self.param_copies,
            # only when not the default, so existing clusters keep their definition hash
            **({"semantics": self.semantics} if self.semantics != "travorder" else {}),
            # min_op_us likewise
            "devices": [{k: getattr(d, k) for k in _DEVICE_KEYS
                         if k != "min_op_us" or d.min_op_us} for d in self.devices],
            "links": {"bandwidth": pairs(self.bandwidth), "latency": pairs(self.latency)},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Cluster:
        """Build from a dict as written by :meth:`to_dict` or read from a cluster file.

        A device entry may carry ``count = k`` to stand for ``k`` identical devices named
        ``name:0 .. name:k-1``; ``memory`` may be omitted (unlimited). A ``null`` memory
        or bandwidth is unlimited too: strict JSON (travorder's ``--json``) writes
        infinities so.
        """
        if not isinstance(data, Mapping):
            raise TravorderError("a cluster must be a table/object of settings")
        unknown = sorted(set(data) - set(_CLUSTER_KEYS))
        if unknown:
            raise TravorderError(f"unknown cluster setting {unknown[0]!r} (expected "
                                 f"{', '.join(_CLUSTER_KEYS)})")
        for key in ("name", "devices"):
            if key not in data:
                raise TravorderError(f"cluster is missing {key!r}")
        links = data.get("links", _NO_LINKS)
        if not isinstance(links, Mapping) or set(links) != {"bandwidth", "latency"}:
            raise TravorderError("cluster 'links' must set exactly 'bandwidth' and 'latency'")
        if not isinstance(data["devices"], list):
            raise TravorderError("cluster 'devices' must be a list of device tables")
        devices = []
        for entry in data["devices"]:
            if not isinstance(entry, Mapping):
                raise TravorderError(f"a device must be a table of settings, got {entry!r}")
            bad = sorted(set(entry) - {*_DEVICE_KEYS, "count"})
            if bad:
                raise TravorderError(f"unknown device setting {bad[0]!r} (expected "
                                     f"{', '.join(_DEVICE_KEYS)}, count)")
            missing = [k for k in ("name", "peak_flops", "mem_bw") if k not in entry]
            if missing:
                raise TravorderError(f"device {entry.get('name', '?')!r} is missing "
                                     f"{missing[0]!r}")
            spec = {k: _null_as_inf(v) if k == "memory" else v for k, v in entry.items()
                    if k != "count"}
            count = entry.get("count")
            if count is None:
                devices.append(Device(**spec))
                continue
            if not isinstance(entry["name"], str) or not entry["name"]:  # before ":i"
                raise TravorderError(f"device name must be a non-empty string, got "
                                     f"{_short(entry['name'])}")
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise TravorderError(f"device {entry['name']!r}: count must be a positive "
                                     f"integer, got {_short(count)}")
            if len(devices) + count > MAX_DEVICES:
                raise TravorderError(f"device {entry['name']!r}: count {_short(count)} "
                                     f"makes more than {MAX_DEVICES} devices, the most "
                                     f"supported")
            devices.extend(Device(**{**spec, "name": f"{entry['name']}:{i}"})
                           for i in range(count))
        if links is _NO_LINKS and len(devices) > 1:
            raise TravorderError(f"cluster is missing 'links' (the bandwidth and latency "
                                 f"between its {len(devices)} devices)")
        return cls(
            name=data["name"], devices=tuple(devices),
            bandwidth=_null_as_inf(links["bandwidth"]), latency=links["latency"],
            link_model=data.get("link_model", "link"),
            busy_after_us=data.get("busy_after_us", 0.0),
            param_copies=data.get("param_copies", 3.0),
            description=data.get("description", ""),
            semantics=data.get("semantics", "travorder"),
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Cluster):
            return NotImplemented
        a, b = self.to_dict(), other.to_dict()
        a.pop("description")
        b.pop("description")
        return a == b

    def __hash__(self) -> int:
        d = self.to_dict()
        d.pop("description")
        return hash(json.dumps(d, sort_keys=True))


def _read_cluster_file(path: Path) -> Cluster:
    check_regular(path, "cluster file")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise FormatError(f"cannot read cluster file {str(path)!r}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise FormatError(f"cluster file {str(path)!r} is not UTF-8 text (byte "
                          f"{exc.start}: {exc.object[exc.start:exc.start + 1]!r})") from None
    try:
        data = tomllib.loads(text) if path.suffix.lower() == ".toml" else parse_json(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, RecursionError) as exc:
        kind = "TOML" if path.suffix.lower() == ".toml" else "JSON"
        raise FormatError(f"cluster file {str(path)!r} is not valid {kind}: {exc}") from None
    try:
        return Cluster.from_dict(data)
    except TravorderError as exc:
        raise TravorderError(f"cluster file {str(path)!r}: {exc}") from None


def _load_presets() -> Mapping[str, Cluster]:
    folder = resources.files("travorder.placement") / "presets"
    presets = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".toml"):
            c = Cluster.from_dict(tomllib.loads(entry.read_text(encoding="utf-8")))
            presets[c.name] = c
    return MappingProxyType(presets)


#: Cluster presets by name; see ``docs/simulator.md`` for their figures and sources.
PRESETS: Mapping[str, Cluster] = _load_presets()


#: What takes the place of a `Cluster` in travorder's calls: a preset name or a file.
ClusterSource = str | os.PathLike[str] | Cluster


def load_cluster(name_or_path: ClusterSource) -> Cluster:
    """A preset by name, or a cluster from a ``.toml`` or ``.json`` file.

    >>> load_cluster("v100x4-nvlink").n_devices
    4
    """
    if isinstance(name_or_path, Cluster):
        return name_or_path
    if not isinstance(name_or_path, str | os.PathLike):
        raise TravorderError(f"a cluster is a preset name, a cluster file or a Cluster, not "
                             f"{name_or_path!r}")
    if isinstance(name_or_path, str) and name_or_path in PRESETS:
        return PRESETS[name_or_path]
    path = Path(name_or_path)
    if path.suffix.lower() in (".toml", ".json"):
        if not path.exists():
            raise FormatError(f"no such cluster file {str(path)!r}")
        return _read_cluster_file(path)
    raise TravorderError(f"unknown cluster {str(name_or_path)!r}: not a preset "
                         f"({', '.join(PRESETS)}) nor a .toml/.json file")


def _toml_value(v: Any) -> str:
    if isinstance(v, str):
        return json.dumps(v)  # TOML basic strings take JSON's escapes
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return str(v)


def cluster_toml(cluster: Cluster) -> str:
    """The TOML text of a cluster file for ``cluster`` (what `load_cluster` reads)."""
    doc = cluster.to_dict()
    lines = [f"{k} = {_toml_value(v)}" for k, v in doc.items()
             if k not in ("devices", "links")]
    for dev in doc["devices"]:
        lines += ["", "[[devices]]", *(f"{k} = {_toml_value(v)}" for k, v in dev.items())]
    lines += ["", "[links]", *(f"{k} = {_toml_value(v)}" for k, v in doc["links"].items())]
    return "\n".join(lines) + "\n"


def cluster_file_format(path: str | os.PathLike[str]) -> str:
    """``"toml"`` or ``"json"``, as ``path`` ends; else a `TravorderError`."""
    suffix = Path(path).suffix.lower()
    if suffix not in (".toml", ".json"):
        raise TravorderError(f"cluster file {str(path)!r} must end in .toml or .json")
    return suffix[1:]


def save_cluster(cluster: Cluster, path: str | os.PathLike[str]) -> None:
    """Write ``cluster`` as a ``.toml`` or ``.json`` cluster file."""
    text = (cluster_toml(cluster) if cluster_file_format(path) == "toml"
            else json_text(cluster.to_dict(), indent=2) + "\n")
    write_file(path, text, "cluster file")


def compute_times(graph: OpGraph, cluster: Cluster) -> np.ndarray:
    """Time of every op on every device, in us: an ``(n_nodes, n_devices)`` array.

    An op with a measured ``time_us`` takes that time, taken as measured on the cluster's
    first device and scaled by ``peak_flops[0] / peak_flops[d]`` on device ``d`` (so
    unchanged on a homogeneous cluster). Otherwise a roofline estimate
    ``max(flops / peak_flops, bytes / mem_bw)`` with ``bytes`` = input edge bytes +
    ``output_bytes`` + ``param_bytes``. Either is raised to the device's ``min_op_us``
    where it is not 0. The device's ``launch_us`` gap is added to both
    (under ``placeto`` semantics only to ops whose time is not 0, as in Placeto).

    >>> g = OpGraph(["a"], [], [], flops=[4.37e6])
    >>> compute_times(g, load_cluster("k80x3")).round(3).tolist()
    [[6.7, 6.7, 6.7]]
    """
    work = work_times(graph, cluster)
    gap = np.array([d.launch_us for d in cluster.devices])
    if cluster.semantics == "placeto":
        gap = np.where(work != 0.0, gap, 0.0)
    t = work + gap
    t.flags.writeable = False
    return t


def check_in_range(graph: OpGraph, cluster: Cluster, times: np.ndarray) -> None:
    """TravorderError unless every op on every device and every transfer over the slowest
    link fit, one after another, in a float: a step is shorter, so none overflows (the
    sum over all devices is a looser bound than each op's slowest, and 60x cheaper)."""
    off = ~np.eye(cluster.n_devices, dtype=bool)
    with np.errstate(over="ignore"):
        total = float(times.sum())
        if off.any():
            total += (graph.edge_bytes.sum() / cluster.bandwidth[off].min()
                      + graph.n_edges * (cluster.latency[off].max() + cluster.busy_after_us))
    if not total < np.inf:
        raise TravorderError(
            f"graph {graph.name!r} on cluster {cluster.name!r}: its op and transfer times "
            f"add up to more than a float holds; check the graph's costs and the "
            f"cluster's peak_flops, mem_bw, bandwidth and latency")


def work_times(graph: OpGraph, cluster: Cluster) -> np.ndarray:
    """`compute_times` without the launch gap (the op's own time on each device)."""
    peak = np.array([d.peak_flops for d in cluster.devices])
    mem_bw = np.array([d.mem_bw for d in cluster.devices])
    # Sum each node's input bytes in a fixed (sorted) order, so that the result does
    # not depend on the edge order or on how nodes are numbered.
    order = np.lexsort((graph.edge_bytes, graph.dst))
    in_bytes = np.bincount(graph.dst[order], weights=graph.edge_bytes[order],
                           minlength=graph.n_nodes)
    with np.errstate(over="ignore"):  # an overflow is check_in_range's error to report
        moved = in_bytes + graph.output_bytes + graph.param_bytes
        roofline = np.maximum(graph.flops[:, None] / peak, moved[:, None] / mem_bw) * 1e6
    measured = graph.time_us[:, None] * (peak[0] / peak)
    t = np.where(np.isnan(graph.time_us)[:, None], roofline, measured)
    floor = np.array([d.min_op_us for d in cluster.devices])
    if floor.any():  # an op that does no work (a constant, a shape op) runs no kernel
        t = np.where(t > 0, np.maximum(t, floor), t)
    t.flags.writeable = False
    return t
