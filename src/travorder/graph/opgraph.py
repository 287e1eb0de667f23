"""`OpGraph`: the one in-memory operation graph of travorder.

An `OpGraph` is immutable and array-based: every per-node and per-edge attribute is a
read-only numpy array, so the simulator and the RL loop can index it cheaply.
networkx is used only at the edges, through :meth:`OpGraph.to_networkx` and
:meth:`OpGraph.from_networkx`.

>>> g = OpGraph.from_records(
...     [{"name": "a", "op_type": "Conv", "flops": 10.0, "output_bytes": 4},
...      {"name": "b", "op_type": "Relu", "flops": 1.0, "output_bytes": 4}],
...     [("a", "b")],
...     name="tiny",
... )
>>> g.n_nodes, g.n_edges, str(g.names[g.topo_order[0]])
(2, 1, 'a')
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from travorder.errors import GraphError, TravorderError, check_flag

if TYPE_CHECKING:  # networkx is imported where it is used: loading graphs needs none
    import networkx as nx

#: Graph-level metadata keys every graph carries (others may be added freely).
META_KEYS = ("name", "family", "source", "batch_size", "dtype")

#: The keys of a node record (`OpGraph.from_records`, `OpGraph.node_records`) and the
#: node columns of a saved graph.
NODE_KEYS = ("name", "op_type", "flops", "output_bytes", "param_bytes", "time_us",
             "colocation", "is_backward")
_NODE_FLOAT_FIELDS = ("flops", "output_bytes", "param_bytes")


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    a.flags.writeable = False
    return a


def _int_array(values: Any, what: str, each: str) -> np.ndarray:
    """``values`` as a flat int64 array; a value that is not a whole number (1.5, True, a
    string) is a GraphError naming ``what`` and the ``each`` it is for."""
    raw = np.asarray(values).reshape(-1)
    if raw.dtype.kind == "i" or (raw.dtype.kind == "u" and (
            raw.size == 0 or raw.max() < 2**63)):  # every graph travorder builds
        return raw.astype(np.int64, copy=False)
    for i, v in enumerate(raw.tolist()):  # 1.5 is not node 1, nor True, "1", None or NaN
        if (isinstance(v, bool) or not isinstance(v, int | float)
                or not (math.isfinite(v) and v == int(v))):
            raise GraphError(f"{what} must be integers, got {v!r} for {each} {i}")
        if not -2**63 <= v < 2**63:  # 1e20 would be cast to -2**63
            raise GraphError(f"{what} must be 64-bit integers, got {v!r} for {each} {i}")
    return raw.astype(np.int64)


def _strings(values: Any, what: str) -> list[str]:
    """``values`` as a list of str, each one text that a graph file can hold."""
    if isinstance(values, str | bytes):  # "abc" is not three names
        raise GraphError(f"{what} must be a sequence of strings, not one string {values!r}")
    out = list(values.tolist() if isinstance(values, np.ndarray) else values)
    if bad := [v for v in out if not isinstance(v, str)]:
        raise GraphError(f"{what} must be strings, got {bad[0]!r}")
    try:
        "".join(out).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no file (nor print) can hold it
        bad = next(v for v in out if not v.isascii() and _not_text(v))
        raise GraphError(f"{what} must be text, got {bad!r} (half of a UTF-16 pair)") from None
    return out


def _not_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _plain(value: Any) -> Any:
    """``value`` with numpy scalars as Python numbers, in lists and dicts too (metadata
    is written as JSON)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]  # as JSON writes it
    return value


def _float_array(values: Any, n: int, field: str, default: float = 0.0) -> np.ndarray:
    if values is None:
        return np.full(n, default, dtype=np.float64)
    try:
        raw = np.asarray(values)
        if isinstance(values, list | tuple):  # numpy reads [1.0, True] as [1.0, 1.0]
            bad = next((v for v in values if isinstance(v, bool | str | bytes)), None)
            if bad is not None:
                raise ValueError(f"got {bad!r}")
        if raw.dtype.kind in "bSU":  # True, "5": numbers in name only
            raise ValueError(f"got {raw.reshape(-1)[0].item()!r}" if raw.size else
                             f"got an array of {raw.dtype}")
        if raw.dtype.kind in "cmMV":  # complex, times and dates, records
            raise ValueError(f"got an array of {raw.dtype}")
        if raw.dtype.kind == "O":  # an object array of "5" or 3+4j: as a list of them
            bad = next((v for v in raw.reshape(-1).tolist() if isinstance(v, bool)
                        or not isinstance(v, int | float)), None)
            if bad is not None:
                raise ValueError(f"got {bad!r}")
        a = raw.astype(np.float64)
    except (TypeError, ValueError, OverflowError) as exc:  # OverflowError: a 400-digit int
        raise GraphError(f"{field} must be numbers: {exc}") from None
    if a.shape != (n,):
        raise GraphError(f"{field} has {a.size} values for {n} entries")
    return a


class OpGraph:
    """An immutable DAG of operations with costs.

    Nodes are indexed ``0..n_nodes-1``; per-node arrays are ``names``, ``op_types``,
    ``flops`` (forward FLOPs), ``output_bytes``, ``param_bytes``, ``time_us`` (measured
    latency, NaN where unknown), ``colocation`` (group id, -1 for none) and
    ``is_backward``. Edges are ``src``, ``dst`` and ``edge_bytes``. ``meta`` holds the
    graph metadata (``name``, ``family``, ``source``, ``batch_size``, ``dtype`` and any
    importer notes such as ``unknown_shape_ops``).

    Edges are stored sorted by ``(src, dst)``. Construction validates everything and
    raises :class:`~travorder.errors.GraphError` with one clear message on the first
    violation: duplicate or empty names, edges out of range, self-loops or duplicate
    edges, cycles, negative or non-finite costs.
    """

    names: np.ndarray
    op_types: np.ndarray
    flops: np.ndarray
    output_bytes: np.ndarray
    param_bytes: np.ndarray
    time_us: np.ndarray
    colocation: np.ndarray
    is_backward: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    edge_bytes: np.ndarray
    meta: Mapping[str, Any]

    def __init__(
        self,
        names: Sequence[str],
        src: Sequence[int] | np.ndarray,
        dst: Sequence[int] | np.ndarray,
        *,
        op_types: Sequence[str] | None = None,
        flops: Any = None,
        output_bytes: Any = None,
        param_bytes: Any = None,
        time_us: Any = None,
        colocation: Any = None,
        is_backward: Any = None,
        edge_bytes: Any = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        names_list = _strings(names, "node names")
        n = len(names_list)
        if any(not x for x in names_list):
            raise GraphError("node names must be non-empty strings")
        # numpy's str arrays drop trailing NULs: "a" and "a\0" would become one name
        if any("\0" in x for x in names_list):
            raise GraphError("node names must not contain NUL characters")
        if len(set(names_list)) != n:
            seen: set[str] = set()
            dup = next(x for x in names_list if x in seen or seen.add(x))
            raise GraphError(f"duplicate node name {dup!r}")
        ops = [""] * n if op_types is None else _strings(op_types, "op types")
        if len(ops) != n:
            raise GraphError(f"op_types has {len(ops)} values for {n} nodes")

        src_a, dst_a = (_int_array(x, "edge endpoints (node indices)", "edge")
                        for x in (src, dst))
        if src_a.shape != dst_a.shape:
            raise GraphError("src and dst must have the same length")
        m = src_a.size
        if m and (min(src_a.min(), dst_a.min()) < 0 or max(src_a.max(), dst_a.max()) >= n):
            bad = int(np.flatnonzero((src_a < 0) | (src_a >= n) | (dst_a < 0) | (dst_a >= n))[0])
            raise GraphError(
                f"edge {bad} ({src_a[bad]} -> {dst_a[bad]}) points outside the {n} nodes"
            )
        if np.any(src_a == dst_a):
            i = int(src_a[np.flatnonzero(src_a == dst_a)[0]])
            raise GraphError(f"self-loop on node {names_list[i]!r}")
        if m and np.unique(src_a * n + dst_a).size != m:
            key = src_a * n + dst_a
            _, first, counts = np.unique(key, return_index=True, return_counts=True)
            e = int(first[np.flatnonzero(counts > 1)[0]])
            raise GraphError(
                f"duplicate edge {names_list[src_a[e]]!r} -> {names_list[dst_a[e]]!r}"
            )

        # Edges are kept sorted by (src, dst): equal graphs have equal arrays.
        edge_order = np.lexsort((dst_a, src_a))
        src_a, dst_a = src_a[edge_order], dst_a[edge_order]
        arrays = {f: _float_array(v, n, f) for f, v in zip(
            _NODE_FLOAT_FIELDS, (flops, output_bytes, param_bytes), strict=True)}
        t = _float_array(time_us, n, "time_us", default=np.nan)
        eb = _float_array(edge_bytes, m, "edge_bytes")[edge_order]
        for field, a in [*arrays.items(), ("edge_bytes", eb)]:
            bad = ~(np.isfinite(a) & (a >= 0))
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                where = (f"edge {names_list[src_a[i]]!r} -> {names_list[dst_a[i]]!r}"
                         if field == "edge_bytes" else f"node {names_list[i]!r}")
                raise GraphError(f"{field} must be finite and non-negative, got {a[i]:g} "
                                 f"on {where}")
        bad = (t < 0) | np.isinf(t)  # NaN is an unknown time
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise GraphError(f"time_us must be finite and non-negative (NaN for unknown), "
                             f"got {t[i]:g} on node {names_list[i]!r}")
        with np.errstate(over="ignore"):  # a sum past a float: every total is infinite
            totals = {f: float(np.nansum(a)) for f, a in
                      [*arrays.items(), ("time_us", t), ("edge_bytes", eb)]}
        if over := [f for f, total in totals.items() if not np.isfinite(total)]:
            raise GraphError(f"the {over[0]} of the graph's "
                             f"{'edges' if over[0] == 'edge_bytes' else 'nodes'} add up to "
                             f"more than a float holds")
        coloc = (np.full(n, -1, dtype=np.int64) if colocation is None
                 else _int_array(colocation, "colocation groups", "node"))
        back = np.zeros(n, dtype=bool) if is_backward is None else np.asarray(is_backward)
        if back.dtype.kind != "b":  # "no" would read as True; 0 and 1 are fine
            bad = [x for x in back.reshape(-1).tolist()
                   if isinstance(x, bool) or not isinstance(x, int) or x not in (0, 1)]
            if bad:  # None too (once taken for "nothing bad")
                raise GraphError(f"is_backward must be true/false per node, got {bad[0]!r}")
            back = back.astype(bool)
        if coloc.shape != (n,) or back.shape != (n,):
            raise GraphError("colocation and is_backward need one value per node")

        fields = {
            "names": np.array(names_list, dtype=str), "op_types": np.array(ops, dtype=str),
            "flops": arrays["flops"], "output_bytes": arrays["output_bytes"],
            "param_bytes": arrays["param_bytes"], "time_us": t, "colocation": coloc,
            "is_backward": back, "src": src_a, "dst": dst_a, "edge_bytes": eb,
        }
        for field, a in fields.items():
            object.__setattr__(self, field, _frozen(a))
        if meta is not None and not isinstance(meta, Mapping):
            raise GraphError(f"meta must be a mapping, not {type(meta).__name__}")
        meta_d = {k: None for k in META_KEYS}
        meta_d.update(_plain(dict(meta or {})))
        batch = meta_d["batch_size"]
        if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int | float)
                                  or not 0 < batch < math.inf):
            raise GraphError(f"meta batch_size must be a positive number (None: not "
                             f"recorded), got {batch!r}")
        m = meta_d.get("micro_batches", 1)
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:  # a pipeline's count
            raise GraphError(f"meta micro_batches must be an integer >= 1, got {m!r}")
        object.__setattr__(self, "meta", MappingProxyType(meta_d))
        _ = self.topo_order  # raises GraphError on a cycle

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("OpGraph is immutable; use replace() to make a changed copy")

    # ------------------------------------------------------------------ building
    @classmethod
    def from_records(
        cls,
        nodes: Iterable[Mapping[str, Any]],
        edges: Iterable[tuple[str, str] | tuple[str, str, float] | Mapping[str, Any]],
        **meta: Any,
    ) -> OpGraph:
        """Build from node dicts (keys as the constructor's arrays, singular) and edges.

        An edge is ``(src_name, dst_name)``, ``(src_name, dst_name, bytes)`` or a dict with
        ``src``, ``dst`` and optional ``bytes``; without bytes it carries the source's
        ``output_bytes``. A node key outside `NODE_KEYS` is refused.
        """
        nodes = list(nodes)
        for i, nd in enumerate(nodes):
            if not isinstance(nd, Mapping) or "name" not in nd:
                raise GraphError(f"node record {i} must be a mapping with a 'name', got "
                                 f"{nd!r:.80}")
            unknown = [k for k in nd if k not in NODE_KEYS]
            if unknown:  # a misspelt "flop" would leave the op free
                raise GraphError(f"node {nd['name']!r} has unknown key {unknown[0]!r} "
                                 f"(expected {', '.join(NODE_KEYS)})")
        names = _strings([nd["name"] for nd in nodes], "node names")
        index = {name: i for i, name in enumerate(names)}
        src, dst, eb = [], [], []
        for e in edges:
            if isinstance(e, Mapping) and {"src", "dst"} <= set(e):
                if unknown := [k for k in e if k not in ("src", "dst", "bytes")]:
                    raise GraphError(f"edge {e['src']!r} -> {e['dst']!r} has unknown key "
                                     f"{unknown[0]!r} (expected src, dst, bytes)")
                s, d, b = e["src"], e["dst"], e.get("bytes")
            elif isinstance(e, list | tuple | np.ndarray) and len(e) in (2, 3):
                s, d, b = (*e, None) if len(e) == 2 else e
            else:
                raise GraphError(f"an edge is (src, dst), (src, dst, bytes) or a mapping "
                                 f"with 'src' and 'dst', got {e!r:.80}")
            for end in (s, d):
                if not isinstance(end, str) or end not in index:
                    raise GraphError(f"edge {s!r} -> {d!r} names unknown node {end!r}")
            src.append(index[s])
            dst.append(index[d])
            eb.append(b)
        out = _float_array([nd.get("output_bytes", 0.0) for nd in nodes], len(nodes),
                           "output_bytes").tolist()
        eb = [out[s] if b is None else b for s, b in zip(src, eb, strict=True)]
        t = [nd.get("time_us") for nd in nodes]
        return cls(
            names, src, dst,
            op_types=[nd.get("op_type", "") for nd in nodes],
            flops=[nd.get("flops", 0.0) for nd in nodes],
            output_bytes=out,
            param_bytes=[nd.get("param_bytes", 0.0) for nd in nodes],
            time_us=[np.nan if x is None else x for x in t],
            colocation=[nd.get("colocation", -1) for nd in nodes],
            is_backward=[nd.get("is_backward", False) for nd in nodes],
            edge_bytes=eb,
            meta=meta,
        )

    @classmethod
    def from_networkx(cls, g: nx.DiGraph) -> OpGraph:
        """Build from a ``networkx.DiGraph`` whose node keys are the names.

        Node attributes as in :meth:`from_records` (others are refused); edge attribute
        ``bytes``; graph attributes become ``meta``.
        """
        if not g.is_directed():
            raise GraphError("an undirected graph does not say which op feeds which: give a "
                             "networkx.DiGraph")
        nodes = [{**attrs, "name": str(name)} for name, attrs in g.nodes(data=True)]
        edges = [(str(u), str(v), d.get("bytes")) for u, v, d in g.edges(data=True)]
        return cls.from_records(nodes, edges, **dict(g.graph))

    def to_networkx(self) -> nx.DiGraph:
        """A ``networkx.DiGraph`` with node keys = names and all attributes copied."""
        import networkx as nx

        g = nx.DiGraph(**dict(self.meta))
        for rec in self.node_records():
            g.add_node(rec.pop("name"), **rec)
        names = self.names.tolist()
        g.add_edges_from(
            (names[s], names[d], {"bytes": float(b)})
            for s, d, b in zip(self.src.tolist(), self.dst.tolist(), self.edge_bytes.tolist(),
                               strict=True)
        )
        return g

    def node_records(self) -> list[dict[str, Any]]:
        """One dict per node with every attribute (``time_us`` is None where unknown)."""
        return [
            {
                "name": name, "op_type": op, "flops": f, "output_bytes": ob,
                "param_bytes": pb, "time_us": None if t != t else t,
                "colocation": c, "is_backward": b,
            }
            for name, op, f, ob, pb, t, c, b in zip(
                self.names.tolist(), self.op_types.tolist(), self.flops.tolist(),
                self.output_bytes.tolist(), self.param_bytes.tolist(),
                self.time_us.tolist(), self.colocation.tolist(),
                self.is_backward.tolist(), strict=True)
        ]

    def _arguments(self) -> dict[str, Any]:
        return {
            "names": self.names, "src": self.src, "dst": self.dst,
            "op_types": self.op_types, "flops": self.flops,
            "output_bytes": self.output_bytes, "param_bytes": self.param_bytes,
            "time_us": self.time_us, "colocation": self.colocation,
            "is_backward": self.is_backward, "edge_bytes": self.edge_bytes,
            "meta": dict(self.meta),
        }

    def replace(self, **changes: Any) -> OpGraph:
        """A copy with some constructor arguments changed; ``meta`` entries are merged."""
        args = self._arguments()
        meta = changes.pop("meta", {})
        if not isinstance(meta, Mapping):
            raise GraphError(f"meta must be a mapping, not {type(meta).__name__}")
        args["meta"].update(meta)
        args.update(changes)
        return OpGraph(**args)

    def __reduce__(self) -> tuple[Any, ...]:  # pickling (joblib, Ray) goes through __init__
        return (_rebuild, (self._arguments(),))

    def permute(self, perm: Sequence[int]) -> OpGraph:
        """The same graph with node ``perm[i]`` as the new node ``i`` (edges follow)."""
        perm = _int_array(perm, "perm", "position")
        if np.sort(perm).tolist() != list(range(self.n_nodes)):
            raise GraphError("perm must be a permutation of the node indices")
        inv = np.empty_like(perm)
        inv[perm] = np.arange(perm.size)
        return self.replace(
            names=self.names[perm], op_types=self.op_types[perm], flops=self.flops[perm],
            output_bytes=self.output_bytes[perm], param_bytes=self.param_bytes[perm],
            time_us=self.time_us[perm], colocation=self.colocation[perm],
            is_backward=self.is_backward[perm], src=inv[self.src], dst=inv[self.dst],
        )

    # ------------------------------------------------------------------ structure
    @property
    def n_nodes(self) -> int:
        return int(self.names.size)

    @property
    def n_edges(self) -> int:
        return int(self.src.size)

    @property
    def name(self) -> str:
        return str(self.meta.get("name") or "")

    def __len__(self) -> int:
        return self.n_nodes

    def __repr__(self) -> str:
        return f"OpGraph({self.name!r}, nodes={self.n_nodes}, edges={self.n_edges})"

    @cached_property
    def index(self) -> Mapping[str, int]:
        """Node name -> node index."""
        return MappingProxyType({name: i for i, name in enumerate(self.names.tolist())})

    def _csr(self, key: np.ndarray, val: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        order = np.argsort(key, kind="stable")
        ptr = np.zeros(self.n_nodes + 1, dtype=np.int64)
        np.cumsum(np.bincount(key, minlength=self.n_nodes), out=ptr[1:])
        return _frozen(ptr), _frozen(val[order])

    @cached_property
    def succ_csr(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ptr, idx)``: successors of ``i`` are ``idx[ptr[i]:ptr[i+1]]`` (edge order)."""
        return self._csr(self.src, self.dst)

    @cached_property
    def pred_csr(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ptr, idx)``: predecessors of ``i`` are ``idx[ptr[i]:ptr[i+1]]``."""
        return self._csr(self.dst, self.src)

    @cached_property
    def out_edges_csr(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ptr, edge_ids)``: the ids of the edges leaving node ``i``."""
        return self._csr(self.src, np.arange(self.n_edges, dtype=np.int64))

    @cached_property
    def in_edges_csr(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ptr, edge_ids)``: the ids of the edges entering node ``i``."""
        return self._csr(self.dst, np.arange(self.n_edges, dtype=np.int64))

    def successors(self, i: int) -> np.ndarray:
        """Indices of the nodes that ``i`` has an edge to."""
        ptr, idx = self.succ_csr
        i = self._node_index(i)
        return idx[ptr[i]:ptr[i + 1]]

    def predecessors(self, i: int) -> np.ndarray:
        """Indices of the nodes that have an edge to ``i``."""
        ptr, idx = self.pred_csr
        i = self._node_index(i)
        return idx[ptr[i]:ptr[i + 1]]

    def _node_index(self, i: int) -> int:
        # a negative index would slice the CSR arrays into another node's neighbours
        if isinstance(i, bool) or not isinstance(i, int | np.integer):
            raise TypeError(f"a node index is an integer, not {type(i).__name__}")
        if not 0 <= i < self.n_nodes:
            raise IndexError(f"node {i} is not in this graph of {self.n_nodes} nodes "
                             f"(0 to {self.n_nodes - 1})")
        return int(i)

    @cached_property
    def in_degree(self) -> np.ndarray:
        return _frozen(np.bincount(self.dst, minlength=self.n_nodes))

    @cached_property
    def out_degree(self) -> np.ndarray:
        return _frozen(np.bincount(self.src, minlength=self.n_nodes))

    @cached_property
    def largest_out_edge_bytes(self) -> np.ndarray:
        """Bytes of each node's largest outgoing edge (0 for a sink): the size of its
        tensor under Placeto's semantics, where a tensor has one size."""
        largest = np.zeros(self.n_nodes)
        np.maximum.at(largest, self.src, self.edge_bytes)
        return _frozen(largest)

    @cached_property
    def topo_order(self) -> np.ndarray:
        """Kahn's topological order, FIFO queue, ties by node index.

        Raises :class:`GraphError` naming a node on a cycle if the graph is cyclic.
        """
        order, indeg = kahn_order(self)
        if len(order) != self.n_nodes:
            stuck = int(np.flatnonzero(indeg > 0)[0])
            raise GraphError(f"graph has a cycle through node {str(self.names[stuck])!r}")
        return _frozen(order)

    @cached_property
    def levels(self) -> np.ndarray:
        """Level of each node: the longest path (in edges) from any source."""
        lev = np.zeros(self.n_nodes, dtype=np.int64)
        ptr, idx = self.pred_csr
        for v in self.topo_order.tolist():
            preds = idx[ptr[v]:ptr[v + 1]]
            if preds.size:
                lev[v] = lev[preds].max() + 1
        return _frozen(lev)

    @cached_property
    def cost(self) -> np.ndarray:
        """Per-node compute cost for orders and features: the measured ``time_us`` if every
        node has one, else ``flops``."""
        return _frozen(self.flops if np.isnan(self.time_us).any() else self.time_us)

    @cached_property
    def graph_hash(self) -> str:
        """A SHA-256 over names, attributes and edges (hex); equal graphs, equal hash."""
        h = hashlib.sha256()
        h.update(json.dumps([self.names.tolist(), self.op_types.tolist()]).encode())
        for a in (self.flops, self.output_bytes, self.param_bytes, self.time_us,
                  self.colocation, self.is_backward, self.src, self.dst, self.edge_bytes):
            h.update(a.tobytes())
        return h.hexdigest()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OpGraph):
            return NotImplemented
        return self.graph_hash == other.graph_hash and dict(self.meta) == dict(other.meta)

    __hash__ = None  # type: ignore[assignment]


def check_graph(g: Any, caller: str) -> OpGraph:
    """``g``, which ``caller`` takes, if it is an `OpGraph`; else a `TravorderError` that
    says what to do with a file name.

    >>> check_graph("model.onnx", "coarsen")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    travorder.errors.TravorderError: coarsen takes an OpGraph, not str 'model.onnx': ...
    """
    if isinstance(g, OpGraph):
        return g
    hint = (f" {str(g)!r}: read a file with travorder.load_graph"
            if isinstance(g, str) or hasattr(g, "__fspath__") else "")
    raise TravorderError(f"{caller} takes an OpGraph, not {type(g).__name__}{hint}")


def colocation_groups(graph: OpGraph, colocate: bool = True) -> np.ndarray:
    """The group (0, 1, ...) of each node: one per colocation id, and every other node
    (every node, if not ``colocate``) a group of its own.

    >>> g = OpGraph(["a", "b", "c"], [], [], colocation=[5, -1, 5])
    >>> colocation_groups(g).tolist(), colocation_groups(g, colocate=False).tolist()
    ([0, 1, 0], [0, 1, 2])
    """
    check_graph(graph, "colocation_groups")
    if not check_flag(colocate, "colocate"):
        return np.arange(graph.n_nodes)
    return np.unique(own_groups(graph.colocation), return_inverse=True)[1]


def own_groups(colocation: np.ndarray) -> np.ndarray:
    """``colocation`` with each node outside a group (-1) in a new group of its own, after
    the ids in use, which are kept (so that copies of a graph's ops can share one).

    >>> own_groups(np.array([5, -1, 5, -1])).tolist()
    [5, 6, 5, 7]
    """
    group = np.array(colocation, dtype=np.int64)
    free = group < 0
    group[free] = group.max(initial=-1) + 1 + np.arange(int(free.sum()))
    return group


def kahn_order(g: OpGraph, lifo: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Kahn's algorithm: sources queue in index order, each visited node releases its
    successors in edge order; ``lifo`` pops the most recently released node (a stack), else
    the oldest (a FIFO queue). Returns the order and the in-degrees left (non-zero only on
    a cycle, where the order is short)."""
    ptr, idx = (a.tolist() for a in g.succ_csr)
    indeg = g.in_degree.copy()
    pending = deque(np.flatnonzero(indeg == 0).tolist())
    pop = pending.pop if lifo else pending.popleft
    order = []
    while pending:
        u = pop()
        order.append(u)
        for v in idx[ptr[u]:ptr[u + 1]]:
            indeg[v] -= 1
            if indeg[v] == 0:
                pending.append(v)
    return np.array(order, dtype=np.int64), indeg


def _rebuild(arguments: dict[str, Any]) -> OpGraph:
    return OpGraph(**arguments)
