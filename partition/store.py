"""The on-disk partition store and its in-memory views.

Layout of a store folder (written atomically: temp folder, then one rename):

    meta.json              format version, method, parts, node_offsets, metrics, dtype and
                           trailing shape of each per-part array, sha256 per file, and
                           meta_sha256: the sha256 of meta.json's own canonical contents
    orig_to_new.npy        int64 [num_nodes]: new id of every original node id
    part{p}/orig_ids.npy   int64 [n_local]: original id of new id node_offsets[p] + i
    static:   part{p}/indptr.npy, indices.npy (new ids), x.npy, y.npy, *_mask.npy,
              halo_ids.npy, halo_x.npy (with --halo 1)
    temporal: part{p}/eid.npy, src.npy, dst.npy (new ids), t.npy, edge_feat.npy,
              edge_label.npy, halo_ids.npy (with --halo 1)

Nodes are renumbered so that part p owns the new ids [node_offsets[p], node_offsets[p+1]);
within a part, nodes keep their original relative order (orig_ids ascending). A temporal part
holds every event with an endpoint it owns or a replicated hub endpoint (`--replicate-hubs`:
the hubs are still owned by one part; other parts hold read-only copies of their events).

Reading checks meta.json against its checksum and its keys and types, then each array against
its sha256 and against meta.json and the other arrays (lengths, id ranges, order), so that a
damaged or hand-edited store stops with one line saying what is wrong.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import reprlib
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import numpy as np
from tqdm import tqdm

import gnndist
from gnndist.errors import GnndistError, first_line
from gnndist.graph import MASKS, Graph, TemporalGraph, indptr_of, unique_ints
from gnndist.io import atomic_dir, sha256_file, write_json
from gnndist.outputs import check_output
from gnndist.validate import check_integer, is_int
from gnndist.partition import methods, stats
from gnndist.partition.book import PartitionBook

FORMAT_VERSION = 2  # 2: meta.json holds its own checksum and the per-part array specs
REWRITE = "rewrite the store with `gnndist partition`"
COPY_OR_REWRITE = f"copy it from the host that wrote the store, or {REWRITE}"
MEMORY_CHECK_EDGES = 1_000_000
_NODE_ARRAYS = ("x", "y", *MASKS)
_EVENT_ARRAYS = ("edge_feat", "edge_label")


@dataclass(eq=False)
class Partition:
    """One part of a partition store: its nodes (static: their CSR rows and data; temporal:
    every event touching them), with node ids in the store's new numbering."""

    part_id: int
    num_parts: int
    kind: str
    num_nodes: int
    book: PartitionBook
    orig_ids: np.ndarray
    meta: dict
    indptr: Optional[np.ndarray] = None
    indices: Optional[np.ndarray] = None
    x: Optional[np.ndarray] = None
    y: Optional[np.ndarray] = None
    train_mask: Optional[np.ndarray] = None
    val_mask: Optional[np.ndarray] = None
    test_mask: Optional[np.ndarray] = None
    halo_ids: Optional[np.ndarray] = None
    halo_x: Optional[np.ndarray] = None
    num_events: int = 0
    eid: Optional[np.ndarray] = None
    src: Optional[np.ndarray] = None
    dst: Optional[np.ndarray] = None
    t: Optional[np.ndarray] = None
    edge_feat: Optional[np.ndarray] = None
    edge_label: Optional[np.ndarray] = None
    hub_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def start(self) -> int:
        """First new id this part owns."""
        return self.book.range(self.part_id)[0]

    @property
    def stop(self) -> int:
        """One past the last new id this part owns."""
        return self.book.range(self.part_id)[1]

    @property
    def num_local(self) -> int:
        return self.stop - self.start

    def owner(self, ids: np.ndarray) -> np.ndarray:
        """Owning part of each new global id."""
        return self.book.owner(ids)

    @classmethod
    def from_arrays(cls, meta: dict, part_id: int, arrays: dict[str, np.ndarray]) -> "Partition":
        return cls(part_id=part_id, num_parts=int(meta["num_parts"]), kind=meta["kind"],
                   num_nodes=int(meta["num_nodes"]), book=PartitionBook(meta["node_offsets"]),
                   meta=meta, num_events=int(meta.get("num_events", 0)),
                   hub_ids=np.asarray(meta.get("replicated_hubs", []), dtype=np.int64), **arrays)


def csr_rows(indptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR of the given rows: (indptr of the sub-CSR, positions of its entries in the input)."""
    starts = indptr[rows]
    lens = indptr[rows + 1] - starts
    sub = np.zeros(rows.size + 1, dtype=np.int64)
    np.cumsum(lens, out=sub[1:])
    pos = np.arange(sub[-1], dtype=np.int64) + np.repeat(starts - sub[:-1], lens)
    return sub, pos


def invert_permutation(perm: np.ndarray) -> np.ndarray:
    """The inverse of the permutation `perm` (new_to_orig from orig_to_new, or back)."""
    inv = np.empty_like(perm)
    inv[perm] = np.arange(perm.size, dtype=np.int64)
    return inv


def relabel(graph: Union[Graph, TemporalGraph], orig_to_new: np.ndarray) -> Union[Graph, TemporalGraph]:
    """The same graph with node v renamed `orig_to_new[v]` (static rows reordered to match)."""
    if isinstance(graph, TemporalGraph):
        return TemporalGraph(orig_to_new[graph.src], orig_to_new[graph.dst], graph.t, graph.edge_feat,
                             graph.edge_label, num_nodes=graph.num_nodes)
    new_to_orig = invert_permutation(orig_to_new)
    indptr, pos = csr_rows(graph.indptr, new_to_orig)
    data = {k: getattr(graph, k)[new_to_orig] for k in _NODE_ARRAYS if getattr(graph, k) is not None}
    return Graph(indptr, orig_to_new[graph.indices[pos]], **data)


def _save_array(path: Path, a: np.ndarray, store: Path) -> None:
    """`np.save` of `a` to `path` inside the folder being written for `store`; a write that
    fails for want of space (ENOSPC, or numpy's short write with less free than the array
    needs) raises GnndistError saying so."""
    try:
        np.save(path, a)
    except OSError as e:
        free = shutil.disk_usage(path.parent).free
        if e.errno == errno.ENOSPC or free < a.nbytes:
            raise GnndistError(f"no space left on device writing the partition store {store} ({path.name} needs "
                               f"{stats.fmt_bytes(a.nbytes)}, {stats.fmt_bytes(free)} free)") from None
        raise


class PartitionStore:
    """A computed partition of a graph: renumbering, metrics, and each part on demand
    (`part(p)`), written to disk with `save(dir)`."""

    def __init__(self, graph: Union[Graph, TemporalGraph], membership: np.ndarray, num_parts: int,
                 method: str, params: dict, stats: dict, hubs: np.ndarray) -> None:
        self.graph, self.num_parts, self.method, self.params = graph, num_parts, method, params
        self.kind = "static" if isinstance(graph, Graph) else "temporal"
        self.membership = membership
        self.new_to_orig = np.argsort(membership, kind="stable").astype(np.int64)
        self.orig_to_new = invert_permutation(self.new_to_orig)
        self.book = PartitionBook(indptr_of(membership, num_parts))
        self.hubs = hubs  # original ids
        self.stats = stats

    @property
    def num_nodes(self) -> int:
        return int(self.graph.num_nodes)

    def meta(self) -> dict:
        """meta.json contents, less the file checksums."""
        g = self.graph
        size = {"num_edges": g.num_edges} if isinstance(g, Graph) else {"num_events": g.num_events}
        return {"format_version": FORMAT_VERSION, "gnndist_version": gnndist.__version__, "kind": self.kind,
                "method": self.method, "num_parts": self.num_parts, "num_nodes": self.num_nodes, **size,
                "node_offsets": self.book.offsets.tolist(), "params": self.params,
                "replicated_hubs": np.sort(self.orig_to_new[self.hubs]).tolist(),
                "arrays": self.array_specs(), "stats": self.stats}

    def array_specs(self) -> dict[str, dict]:
        """dtype and trailing shape (all but the row count) of each array that every part stores."""
        g = self.graph
        static = isinstance(g, Graph)
        ids = np.zeros(0, dtype=np.int64)
        data = {"orig_ids": ids, **dict.fromkeys(("indptr", "indices") if static else ("eid", "src", "dst"), ids)}
        data.update({k: getattr(g, k) for k in (_NODE_ARRAYS if static else ("t", *_EVENT_ARRAYS))
                     if getattr(g, k) is not None})
        if self.params["halo"]:
            data["halo_ids"] = ids
            if static and g.x is not None:
                data["halo_x"] = g.x
        return {k: {"dtype": a.dtype.str, "shape": list(a.shape[1:])} for k, a in data.items()}

    def part_arrays(self, p: int) -> dict[str, np.ndarray]:
        """The arrays stored for part `p` (file name stem -> array)."""
        g, o2n = self.graph, self.orig_to_new
        start, stop = self.book.range(p)
        rows = self.new_to_orig[start:stop]
        out: dict[str, np.ndarray] = {"orig_ids": rows}
        halo = bool(self.params["halo"])
        if isinstance(g, Graph):
            out["indptr"], pos = csr_rows(g.indptr, rows)
            out["indices"] = o2n[g.indices[pos]]
            del pos
            out.update({k: getattr(g, k)[rows] for k in _NODE_ARRAYS if getattr(g, k) is not None})
            if halo:
                idx = out["indices"]
                out["halo_ids"] = unique_ints(idx[(idx < start) | (idx >= stop)])
                if g.x is not None:
                    out["halo_x"] = g.x[self.new_to_orig[out["halo_ids"]]]
            return out
        ps, pd = self.membership[g.src], self.membership[g.dst]
        mine = (ps == p) | (pd == p)
        stored = mine.copy()
        if self.hubs.size:
            is_hub = np.zeros(g.num_nodes, dtype=bool)
            is_hub[self.hubs] = True
            stored |= is_hub[g.src] | is_hub[g.dst]
        eid = np.flatnonzero(stored)
        out.update(eid=eid, src=o2n[g.src[eid]], dst=o2n[g.dst[eid]], t=g.t[eid])
        out.update({k: getattr(g, k)[eid] for k in _EVENT_ARRAYS if getattr(g, k) is not None})
        if halo:
            ends = np.concatenate([g.src[mine], g.dst[mine]])
            out["halo_ids"] = unique_ints(o2n[ends[self.membership[ends] != p]])
        return out

    def part(self, p: int) -> Partition:
        """Part `p` in memory, exactly as `load_partition` would read it back."""
        if not 0 <= p < self.num_parts:
            raise GnndistError(f"part {p} out of range: the store has {self.num_parts} parts")
        return Partition.from_arrays(self.meta(), p, self.part_arrays(p))

    def save(self, out: Union[str, Path], progress: bool = False) -> Path:
        """Write the store to folder `out` atomically; an existing store there is replaced."""
        out = check_output(out, "store")
        t0 = time.perf_counter()
        files: dict[str, str] = {}
        with atomic_dir(out) as tmp:
            _save_array(tmp / "orig_to_new.npy", self.orig_to_new, out)
            files["orig_to_new.npy"] = sha256_file(tmp / "orig_to_new.npy")
            for p in tqdm(range(self.num_parts), desc="writing parts", unit="part", disable=not progress):
                (tmp / f"part{p}").mkdir()
                for name, a in self.part_arrays(p).items():
                    rel = f"part{p}/{name}.npy"
                    _save_array(tmp / rel, np.ascontiguousarray(a), out)
                    files[rel] = sha256_file(tmp / rel)
            meta = self.meta()
            meta["stats"] = {**meta["stats"], "write_time_s": time.perf_counter() - t0,
                             "peak_memory_bytes": stats.peak_memory_bytes()}
            meta["files"] = files
            meta["meta_sha256"] = meta_checksum(meta)
            write_json(tmp / "meta.json", meta)
        return out


def meta_checksum(meta: dict) -> str:
    """sha256 of meta.json's contents other than its `meta_sha256` key, as canonical JSON (sorted
    keys, no spaces), so that it does not depend on how the file is laid out."""
    body = {k: v for k, v in meta.items() if k != "meta_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def check_memory(graph: Union[Graph, TemporalGraph], method: str, force: bool = False) -> Optional[int]:
    """For a graph above 1M edges or events: the estimated memory partitioning needs beyond
    the loaded graph, in bytes. Raises GnndistError when it exceeds the available memory,
    unless `force`."""
    size = graph.num_edges if isinstance(graph, Graph) else graph.num_events
    if size <= MEMORY_CHECK_EDGES:
        return None
    need = stats.estimate_extra_bytes(graph, method)
    avail = stats.available_memory_bytes()
    if avail is not None and need > avail and not force:
        raise GnndistError(f"partitioning needs an estimated {stats.fmt_bytes(need)} of memory beyond the loaded "
                           f"graph but only {stats.fmt_bytes(avail)} is available; pass --force to try anyway")
    return need


def hub_nodes(graph: TemporalGraph, k: int) -> np.ndarray:
    """The `k` nodes with the most events (ties: lower id first), ascending."""
    count = np.bincount(graph.src, minlength=graph.num_nodes) + np.bincount(graph.dst, minlength=graph.num_nodes)
    return np.sort(np.argsort(-count, kind="stable")[:k]).astype(np.int64)


def partition_graph(graph: Union[Graph, TemporalGraph], num_parts: int, method: Optional[str] = None,
                    balance: Optional[Sequence[str]] = None, imbalance_tol: Optional[float] = None, halo: int = 0,
                    replicate_hubs: int = 0, time_windows: Optional[int] = None, recency: Optional[float] = None,
                    seed: int = 0, force: bool = False, out: Union[str, Path, None] = None, progress: bool = False
                    ) -> PartitionStore:
    """Partition `graph` into `num_parts` parts; write the store to `out` when given.

    `method`: metis | random | temporal (default: metis for a static graph, temporal for a
    temporal one). `balance` (metis only): vertex weights to balance, any of nodes, edges,
    train (default: nodes). `imbalance_tol` (metis and temporal): the max/mean of each balanced
    weight METIS aims for (its ufactor; default 1.03). `halo`: 1 to store 1-hop halo ids (and features). Temporal graphs only:
    `replicate_hubs` top-degree nodes replicated into every part, `time_windows` (default 4, or
    as many as the events fill, `methods.most_time_windows`; the temporal method balances each,
    the metrics of any method count events in each) and `recency` (temporal method only, default
    1). An option the method would ignore is refused.
    """
    if not isinstance(graph, (Graph, TemporalGraph)):
        raise GnndistError(f"partition_graph takes a Graph or a TemporalGraph (gnndist.load), got {type(graph).__name__}")
    check_integer("parts", num_parts)
    check_integer("replicate_hubs", replicate_hubs)
    check_integer("time_windows", time_windows, optional=True)
    if out is not None and not isinstance(out, (str, os.PathLike)):
        raise GnndistError(f"--out must be a path, got {out!r}")
    temporal = isinstance(graph, TemporalGraph)
    method = method or ("temporal" if temporal else "metis")
    base = methods.check_method_options(method, temporal, balance, imbalance_tol, recency, time_windows)
    recency = 1.0 if recency is None else recency
    if not 1 <= num_parts <= max(graph.num_nodes, 1):
        raise GnndistError(f"--parts must be between 1 and the node count ({graph.num_nodes}), got {num_parts}")
    if temporal and graph.num_events == 0:
        raise GnndistError("the temporal graph has no events to partition")
    if temporal and time_windows is None:
        time_windows = min(methods.TIME_WINDOWS, methods.most_time_windows(graph.num_events, num_parts))
    if halo not in (0, 1):
        raise GnndistError(f"--halo must be 0 or 1, got {halo!r}")
    if replicate_hubs and not temporal:
        raise GnndistError("--replicate-hubs applies to temporal graphs only")
    if not 0 <= replicate_hubs <= graph.num_nodes:
        raise GnndistError(f"--replicate-hubs must be between 0 and the node count, got {replicate_hubs}")
    balance = methods.check_balance(balance)
    imbalance_tol = methods.check_imbalance_tol(methods.IMBALANCE_TOL if imbalance_tol is None else imbalance_tol)
    seed = methods.check_seed(seed)
    if temporal:
        methods.check_time_windows(graph.num_events, num_parts, time_windows)
    if out is not None:
        check_output(out, "store")
    check_memory(graph, method, force)

    t0 = time.perf_counter()
    bar = tqdm(total=2, desc=f"{method} partitioning", unit="phase", disable=not progress)
    hubs = hub_nodes(graph, replicate_hubs) if temporal else np.zeros(0, dtype=np.int64)
    params: dict[str, Any] = {"imbalance_tol": imbalance_tol, "halo": halo, "seed": seed}
    if method == "random":
        membership = methods.random_membership(graph.num_nodes, num_parts, seed)
    elif method == "metis":
        params["balance"] = balance
        membership = methods.metis_membership(graph, num_parts, balance, imbalance_tol, seed)
    elif method == "temporal":
        params.update(time_windows=time_windows, recency=recency)
        membership = methods.temporal_membership(graph, num_parts, time_windows, recency, imbalance_tol,
                                                    seed, hubs)
    else:
        if hubs.size:
            raise GnndistError(f"--replicate-hubs applies to --method temporal, metis and random, not {method}")
        params.update({"balance": balance} if base == "metis" else {"time_windows": time_windows, "recency": recency})
        from gnndist.partition.propagation import lp_membership  # torch: only where label propagation runs

        membership = lp_membership(graph, num_parts, method, balance, time_windows, recency,
                                               imbalance_tol, seed)
    if temporal:
        params["replicate_hubs"] = replicate_hubs
    bar.update()
    bar.set_postfix_str("metrics")
    metrics = stats.quality(graph, membership, num_parts, halo, hubs, time_windows if temporal else 1)
    metrics["partition_time_s"] = time.perf_counter() - t0
    metrics["peak_memory_bytes"] = stats.peak_memory_bytes()
    bar.update()
    bar.close()
    store = PartitionStore(graph, membership, num_parts, method, params, metrics, hubs)
    if out is not None:
        store.save(out, progress)
    return store


# ---------------------------------------------------------------- reading

_I8, _F4, _F8, _B1 = (np.dtype(t).str for t in (np.int64, np.float32, np.float64, np.bool_))
# per-part array -> (kinds of store that hold it, its dtype (None: any number or bool), its ndim (None: any))
_ARRAY_RULES: dict[str, tuple[tuple[str, ...], Optional[str], Optional[int]]] = {
    "orig_ids": (("static", "temporal"), _I8, 1), "halo_ids": (("static", "temporal"), _I8, 1),
    "indptr": (("static",), _I8, 1), "indices": (("static",), _I8, 1), "x": (("static",), _F4, 2),
    "y": (("static",), _I8, 1), "train_mask": (("static",), _B1, 1), "val_mask": (("static",), _B1, 1),
    "test_mask": (("static",), _B1, 1), "halo_x": (("static",), _F4, 2),
    "eid": (("temporal",), _I8, 1), "src": (("temporal",), _I8, 1), "dst": (("temporal",), _I8, 1),
    "t": (("temporal",), _F8, 1), "edge_feat": (("temporal",), _F4, 2), "edge_label": (("temporal",), None, None),
}
_REQUIRED_ARRAYS = {"static": ("orig_ids", "indptr", "indices"), "temporal": ("orig_ids", "eid", "src", "dst", "t")}
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_count(v: Any) -> bool:
    return is_int(v) and v >= 0


def _ints(n: int):
    """Check: a list of `n` integers >= 0."""
    return lambda v: isinstance(v, list) and len(v) == n and all(_is_count(x) for x in v)


def _spec_problem(kind: str, name: str, spec: Any) -> Optional[str]:
    """What is wrong with meta.json's description of per-part array `name`, or None."""
    if name not in _ARRAY_RULES or kind not in _ARRAY_RULES[name][0]:
        return f"arrays lists {reprlib.repr(name)}, which a {kind} store does not hold"
    _, dtype, ndim = _ARRAY_RULES[name]
    if not (isinstance(spec, dict) and isinstance(spec.get("dtype"), str) and isinstance(spec.get("shape"), list)
            and all(_is_count(d) for d in spec["shape"])):
        return f"bad arrays.{name}: {reprlib.repr(spec)}"
    allowed = {dtype} if dtype else {np.dtype(c).str for c in "?bhilqBHILQefd"}  # any bool, int or float
    if spec["dtype"] not in allowed:
        return f"arrays.{name} has dtype {reprlib.repr(spec['dtype'])}, expected {dtype or 'a number type'}"
    if ndim is not None and len(spec["shape"]) != ndim - 1:
        return f"arrays.{name} has {len(spec['shape']) + 1} dimensions, expected {ndim}"
    return None


def _files_problem(meta: dict) -> Optional[str]:
    """What is wrong with meta.json's per-part arrays and file list, or None: the files must be
    exactly orig_to_new.npy and part{p}/{name}.npy for every part and listed array."""
    kind, arrays, params = meta["kind"], meta["arrays"], meta["params"]
    for name, spec in arrays.items():
        problem = _spec_problem(kind, name, spec)
        if problem:
            return problem
    want = {*_REQUIRED_ARRAYS[kind], *(("halo_ids",) if params["halo"] else ())}
    if params["halo"] and kind == "static" and "x" in arrays:
        want.add("halo_x")
    missing, extra = sorted(want - set(arrays)), sorted({"halo_ids", "halo_x"} & set(arrays) - want)
    if missing or extra:
        return f"arrays {'lacks ' + missing[0] if missing else 'lists ' + extra[0]} (params.halo = {params['halo']})"
    files = meta["files"]
    expected = {"orig_to_new.npy", *(f"part{p}/{name}.npy" for p in range(meta["num_parts"]) for name in arrays)}
    unknown, absent = sorted(set(files) - expected), sorted(expected - set(files))
    if unknown:
        return f"files lists {reprlib.repr(unknown[0])}, which is not a file of this store"
    if absent:
        return f"files does not list {absent[0]}"
    bad = next((k for k, v in files.items() if not _SHA256.fullmatch(v)), None)
    return None if bad is None else f"files.{bad} is not a sha256: {reprlib.repr(files[bad])}"


def _meta_problem(meta: dict) -> Optional[str]:
    """What is wrong with meta.json's contents (a key, type or count the code relies on), or None."""
    kind, k = meta.get("kind"), meta.get("num_parts")
    if kind not in ("static", "temporal"):
        return f"kind must be 'static' or 'temporal', got {reprlib.repr(kind)}"
    if not (is_int(k) and k >= 1):
        return f"num_parts must be an integer >= 1, got {reprlib.repr(k)}"
    temporal = kind == "temporal"
    size = "num_events" if temporal else "num_edges"
    top = {"method": lambda v: v in methods.METHODS, "num_nodes": _is_count, size: _is_count,
           "node_offsets": _ints(k + 1),
           "params": lambda v: isinstance(v, dict) and v.get("halo") in (0, 1) and is_int(v.get("halo")),
           "arrays": lambda v: isinstance(v, dict),
           "files": lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in [*v, *v.values()]),
           "replicated_hubs": lambda v: isinstance(v, list) and all(is_int(x) for x in v),
           "stats": lambda v: isinstance(v, dict)}
    per_part = ("nodes_per_part", "halo_nodes_per_part", "train_nodes_per_part",
                *(("events_per_part", "stored_events_per_part") if temporal else ("edges_per_part",)))
    numbers = ("edge_cut_fraction", "replication_factor", "partition_time_s", "peak_memory_bytes", "write_time_s",
               *(("cross_partition_event_fraction", "cross_partition_event_fraction_with_replicas")
                 if temporal else ()))
    stats = {**{key: _ints(k) for key in per_part}, **{key: _is_number for key in numbers},
             "imbalance": lambda v: isinstance(v, dict) and all(_is_number(x) for x in v.values())}
    optional = {"replicated_hubs", "train_nodes_per_part", "write_time_s"}
    for where, d, checks in (("", meta, top), ("stats.", meta.get("stats"), stats)):
        for key, ok in checks.items():
            if key not in d:
                if key in optional:
                    continue
                return f"missing key {where}{key}"
            if not ok(d[key]):
                return f"bad {where}{key}: {reprlib.repr(d[key])}"
    n, offsets, st = meta["num_nodes"], meta["node_offsets"], meta["stats"]
    if offsets[0] != 0 or offsets[-1] != n or any(a > b for a, b in zip(offsets, offsets[1:])):
        return f"node_offsets {reprlib.repr(offsets)} do not split num_nodes = {n} into parts"
    if st["nodes_per_part"] != np.diff(offsets).tolist():
        return "stats.nodes_per_part disagrees with node_offsets"
    owned = st["events_per_part" if temporal else "edges_per_part"]
    if sum(owned) != meta[size]:
        return f"stats.{'events' if temporal else 'edges'}_per_part sums to {sum(owned)}, not {size} = {meta[size]}"
    if temporal and any(a > b for a, b in zip(owned, st["stored_events_per_part"])):
        return "stats.stored_events_per_part holds fewer events than a part owns"
    hubs = meta.get("replicated_hubs", [])
    if hubs and (not temporal or hubs[0] < 0 or hubs[-1] >= n or any(a >= b for a, b in zip(hubs, hubs[1:]))):
        return f"replicated_hubs {reprlib.repr(hubs)} are not ascending node ids of a temporal graph"
    return _files_problem(meta)


def is_store(path: Union[str, os.PathLike]) -> bool:
    """True when `path` is a partition store folder."""
    return (Path(path) / "meta.json").is_file()


def read_store_meta(path: Union[str, Path]) -> dict:
    """meta.json of the store at `path`, checked for the format version this gnndist reads, for
    its own checksum, and for every key, type and count the code reads from it."""
    f = Path(path) / "meta.json"
    if not f.is_file():
        raise GnndistError(f"{path} is not a partition store (no meta.json)")
    try:
        meta = json.loads(f.read_bytes())
        digest = meta_checksum(meta) if isinstance(meta, dict) else None
    except RecursionError:
        raise GnndistError(f"{f} is corrupted (nested too deeply to be a store's meta.json): {REWRITE}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise GnndistError(f"{f} is corrupted (not valid JSON: {e}): {REWRITE}") from None
    if not isinstance(meta, dict) or "format_version" not in meta:
        raise GnndistError(f"{f} is not a gnndist partition store meta file")
    if meta["format_version"] != FORMAT_VERSION:
        raise GnndistError(f"{path} was written in partition store format {reprlib.repr(meta['format_version'])}; "
                           f"this gnndist reads format {FORMAT_VERSION}: {REWRITE}")
    if meta.get("meta_sha256") != digest:
        raise GnndistError(f"{f} does not match its checksum (meta_sha256): it was edited or damaged; {REWRITE}")
    problem = _meta_problem(meta)
    if problem:
        raise GnndistError(f"{f}: malformed ({problem}): {REWRITE}")
    return meta


def _store_file(root: Path, rel: str, digest: str) -> Path:
    """Path of store file `rel`, after checking that it is there and matches its sha256; a
    missing part is named, with where to get it (a multi-host user holds only its own part)."""
    f = root / rel
    if not f.is_file():
        folder, _, name = rel.rpartition("/")
        what = f"{folder}/ (the files of part {folder[4:]})" if folder and not (root / folder).is_dir() else rel
        there = " is not a regular file" if os.path.lexists(f) else ""
        raise GnndistError(f"partition store {root} is missing {what}{there}: {COPY_OR_REWRITE}")
    if sha256_file(f) != digest:
        raise GnndistError(f"partition store file {f} is corrupted (sha256 mismatch): {COPY_OR_REWRITE}")
    return f


def _load_checked(root: Path, rel: str, digest: str) -> np.ndarray:
    f = _store_file(root, rel, digest)
    try:
        return np.load(f, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise GnndistError(f"cannot read {f}: {first_line(e)}: {REWRITE}") from None


def _outside(a: np.ndarray, lo: int, hi: int) -> Optional[int]:
    """The first value of `a` outside [lo, hi), or None."""
    bad = np.flatnonzero((a < lo) | (a >= hi))
    return int(a[bad[0]]) if bad.size else None


def _ids_problem(name: str, a: np.ndarray, lo: int, hi: int, ascending: bool = False) -> Optional[str]:
    """What is wrong with id array `a` (values in [lo, hi), strictly ascending if `ascending`), or None."""
    v = _outside(a, lo, hi)
    if v is not None:
        return f"{name}.npy holds {v}, outside [{lo}, {hi})"
    if ascending and a.size > 1 and not np.all(a[1:] > a[:-1]):
        return f"{name}.npy is not strictly ascending"
    return None


def _halo_problem(meta: dict, p: int, a: dict[str, np.ndarray], *neighbours: np.ndarray) -> Optional[str]:
    """What is wrong with the part's halo ids, given the endpoints of its own edges or events."""
    halo = a["halo_ids"]
    start, stop = meta["node_offsets"][p], meta["node_offsets"][p + 1]
    problem = _ids_problem("halo_ids", halo, 0, meta["num_nodes"], ascending=True)
    if problem:
        return problem
    if np.any((halo >= start) & (halo < stop)):
        return "halo_ids.npy holds a node the part owns"
    counted = meta["stats"]["halo_nodes_per_part"][p]
    if halo.size != counted:
        return f"halo_ids.npy holds {halo.size} nodes, stats.halo_nodes_per_part says {counted}"
    known = _node_set(meta["num_nodes"], halo)
    known[start:stop] = True
    if not all(known[ids].all() for ids in neighbours):
        return "halo_ids.npy lacks a neighbour the part's edges or events reach"
    return None


def _node_set(n: int, ids: np.ndarray) -> np.ndarray:
    """Membership table (bool [n]) of node ids `ids`: one O(n + len) pass, no sort or search."""
    table = np.zeros(n, dtype=bool)
    table[ids] = True
    return table


def _part_problem(meta: dict, p: int, a: dict[str, np.ndarray]) -> Optional[str]:
    """What is wrong with part `p`'s arrays `a`, checked against meta.json and each other
    (dtypes, lengths, id ranges and order, counts in the stats), or None. Vectorized, O(part size)."""
    for name, arr in a.items():
        spec = meta["arrays"][name]
        if arr.dtype.str != spec["dtype"] or list(arr.shape[1:]) != spec["shape"]:
            return (f"{name}.npy is {arr.dtype.str} of shape {arr.shape}, meta.json says {spec['dtype']} "
                    f"of shape (rows, {', '.join(map(str, spec['shape']))})".replace(", )", ")"))
    n = meta["num_nodes"]
    start, stop = meta["node_offsets"][p], meta["node_offsets"][p + 1]
    local = stop - start
    rows = dict.fromkeys(("orig_ids", *_NODE_ARRAYS), (local, f"node the part owns ({local})"))
    if meta["kind"] == "static":
        rows.update(indptr=(local + 1, f"node the part owns ({local}), plus one"))
    else:
        rows.update(dict.fromkeys(("src", "dst", "t", *_EVENT_ARRAYS), (a["eid"].size, "event in eid.npy")))
    if "halo_ids" in a:
        rows["halo_x"] = (a["halo_ids"].size, "node in halo_ids.npy")
    for name, (want, what) in rows.items():
        if name in a and a[name].shape[0] != want:
            return f"{name}.npy has {a[name].shape[0]} rows, expected {want}: one per {what}"
    problem = _ids_problem("orig_ids", a["orig_ids"], 0, n, ascending=True)
    if problem:
        return problem
    bad_float = next((k for k in ("x", "halo_x", "t", "edge_feat") if k in a and not np.isfinite(a[k]).all()), None)
    if bad_float:
        return f"{bad_float}.npy holds NaN or inf"
    if meta["kind"] == "static":
        return _static_problem(meta, p, a)
    return _temporal_problem(meta, p, a)


def _static_problem(meta: dict, p: int, a: dict[str, np.ndarray]) -> Optional[str]:
    """`_part_problem`'s checks of a static part's CSR, labels and halo."""
    st, indptr, indices = meta["stats"], a["indptr"], a["indices"]
    if indptr[0] != 0 or np.any(indptr[1:] < indptr[:-1]) or indptr[-1] != indices.size:
        return f"indptr.npy is not a CSR row pointer over the {indices.size} entries of indices.npy"
    if indices.size != st["edges_per_part"][p]:
        return f"indices.npy holds {indices.size} edges, stats.edges_per_part says {st['edges_per_part'][p]}"
    problem = _ids_problem("indices", indices, 0, meta["num_nodes"])
    if problem:
        return problem
    if "y" in a and a["y"].size and a["y"].min() < 0:
        return "y.npy holds a negative class"
    if "train_mask" in a and "train_nodes_per_part" in st and a["train_mask"].sum() != st["train_nodes_per_part"][p]:
        return "train_mask.npy disagrees with stats.train_nodes_per_part"
    return _halo_problem(meta, p, a, indices) if "halo_ids" in a else None


def _temporal_problem(meta: dict, p: int, a: dict[str, np.ndarray]) -> Optional[str]:
    """`_part_problem`'s checks of a temporal part's events: ids, order, ownership, halo."""
    st, eid, src, dst, t = meta["stats"], a["eid"], a["src"], a["dst"], a["t"]
    start, stop = meta["node_offsets"][p], meta["node_offsets"][p + 1]
    if eid.size != st["stored_events_per_part"][p]:
        return f"eid.npy holds {eid.size} events, stats.stored_events_per_part says {st['stored_events_per_part'][p]}"
    problem = (_ids_problem("eid", eid, 0, meta["num_events"], ascending=True)
               or _ids_problem("src", src, 0, meta["num_nodes"]) or _ids_problem("dst", dst, 0, meta["num_nodes"]))
    if problem:
        return problem
    if t.size > 1 and np.any(t[1:] < t[:-1]):
        return "t.npy is not in time order"
    own_src, own_dst = (src >= start) & (src < stop), (dst >= start) & (dst < stop)
    hub = _node_set(meta["num_nodes"], np.asarray(meta.get("replicated_hubs", []), dtype=np.int64))
    touches = own_src | own_dst | hub[src] | hub[dst]
    if not touches.all():
        return f"event {int(eid[~touches][0])} touches no node of the part and no replicated hub"
    if own_src.sum() != st["events_per_part"][p]:
        return f"the part owns {int(own_src.sum())} events, stats.events_per_part says {st['events_per_part'][p]}"
    mine = own_src | own_dst
    return _halo_problem(meta, p, a, src[mine], dst[mine]) if "halo_ids" in a else None


def load_partition(path: Union[str, Path], part_id: int, world_size: Optional[int] = None) -> Partition:
    """Part `part_id` of the store at `path`, every file checked against its sha256 and every
    array against meta.json and the others.

    With `world_size`, the store must have exactly that many parts.
    """
    root = Path(path)
    meta = read_store_meta(root)
    k = int(meta["num_parts"])
    if world_size is not None and world_size != k:
        raise GnndistError(f"{path} has {k} parts but the world size is {world_size}; "
                           f"partition again with --parts {world_size}")
    return _load_part(root, meta, part_id)


def _load_part(root: Path, meta: dict, part_id: int) -> Partition:
    """Part `part_id` of the store at `root` whose meta.json is `meta` (see `load_partition`)."""
    k = int(meta["num_parts"])
    if not 0 <= part_id < k:
        raise GnndistError(f"part {part_id} out of range: {root} has {k} parts")
    arrays = {name: _load_checked(root, f"part{part_id}/{name}.npy", meta["files"][f"part{part_id}/{name}.npy"])
              for name in meta["arrays"]}
    problem = _part_problem(meta, part_id, arrays)
    if problem:
        raise GnndistError(f"partition store {root}, part {part_id}: {problem}; {REWRITE}")
    return Partition.from_arrays(meta, part_id, arrays)


def load_id_maps(path: Union[str, Path]) -> tuple[np.ndarray, np.ndarray]:
    """(new_to_orig, orig_to_new) of the store at `path`: inverse permutations of the node ids."""
    root = Path(path)
    return _load_id_maps(root, read_store_meta(root))


def _load_id_maps(root: Path, meta: dict) -> tuple[np.ndarray, np.ndarray]:
    orig_to_new = _load_checked(root, "orig_to_new.npy", meta["files"]["orig_to_new.npy"])
    n = meta["num_nodes"]
    if (orig_to_new.dtype.str != _I8 or orig_to_new.shape != (n,) or _outside(orig_to_new, 0, n) is not None
            or np.any(np.bincount(orig_to_new, minlength=n) != 1)):
        raise GnndistError(f"partition store {root}: orig_to_new.npy is not a permutation of the {n} node ids "
                           f"({orig_to_new.dtype.str} of shape {orig_to_new.shape}); {REWRITE}")
    return invert_permutation(orig_to_new), orig_to_new


@dataclass(eq=False)
class RankPart:
    """What a rank of a job reads of a partition store: meta.json, its own part and the id maps."""

    path: Path
    meta: dict
    part: Partition
    new_to_orig: np.ndarray
    orig_to_new: np.ndarray


def open_part(path: Union[str, Path], part_id: int, world: int, kind: str, who: str = "") -> RankPart:
    """Part `part_id` of the store at `path` with its id maps, for a rank of a `world`-rank job
    on a `kind` graph: meta.json read once, then the kind, the part count and the files this rank
    needs checked (`who`, e.g. "rank 1 (host node2, 10.0.0.2)", starts the line naming a missing
    file), then the arrays loaded and checked."""
    root = Path(path)
    meta = read_store_meta(root)
    check_store_of(meta, root, kind, world)
    missing = files_missing(root, meta) + files_missing(root, meta, part_id)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise GnndistError(f"{who or f'rank {part_id}'}: the partition store {path} on this host lacks {missing[0]}"
                           f"{more}: copy meta.json, orig_to_new.npy and part{part_id}/ there from the host that "
                           "partitioned (a host needs the id maps and the parts of its own ranks)")
    return RankPart(root, meta, _load_part(root, meta, part_id), *_load_id_maps(root, meta))


def check_store_of(meta: dict, path: Union[str, Path], kind: str, world: int) -> None:
    """A one-line error unless the store at `path` (meta.json `meta`) holds a `kind` graph in
    `world` parts."""
    if meta["kind"] != kind:
        task = "link" if kind == "temporal" else "node"
        raise GnndistError(f"partition store {path} holds a {meta['kind']} graph; --task {task} needs a {kind} one")
    if int(meta["num_parts"]) != world:
        raise GnndistError(f"partition store {path} has {meta['num_parts']} parts but {world} rank(s) run; "
                           f"use --nproc {meta['num_parts']}")


def files_missing(path: Union[str, Path], meta: dict, part: Optional[int] = None) -> list[str]:
    """The files of meta.json's list that the store folder `path` lacks: its top-level files (the
    id maps) when `part` is None, else the files of part `part`."""
    prefix = None if part is None else f"part{part}/"
    return [f for f in meta["files"] if ("/" not in f if prefix is None else f.startswith(prefix))
            and not (Path(path) / f).is_file()]


def verify_store(path: Union[str, Path]) -> int:
    """Check every file of the store against its sha256, every part as `load_partition` does,
    and the id maps against each part's nodes; returns the number of files checked."""
    root = Path(path)
    meta = read_store_meta(root)
    _, orig_to_new = load_id_maps(root)
    for p in range(meta["num_parts"]):
        part = load_partition(root, p)
        if not np.array_equal(orig_to_new[part.orig_ids], np.arange(part.start, part.stop)):
            raise GnndistError(f"partition store {root}, part {p}: orig_ids.npy disagrees with orig_to_new.npy; "
                               f"{REWRITE}")
    return len(meta["files"])
