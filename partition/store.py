"""The on-disk partition store and its in-memory views.

Layout of a store folder (written atomically: temp folder, then one rename):

    meta.json              format version, method, parts, node_offsets, figures, sha256 per file
    orig_to_new.npy        int64 [num_nodes]: new id of every original node id
    part{p}/orig_ids.npy   int64 [n_local]: original id of new id node_offsets[p] + i
    static:   part{p}/indptr.npy, indices.npy (new ids), x.npy, y.npy, *_mask.npy,
              halo_ids.npy, halo_x.npy (with --halo 1)
    temporal: part{p}/eid.npy, src.npy, dst.npy (new ids), t.npy, edge_feat.npy,
              edge_label.npy, halo_ids.npy (with --halo 1)

Nodes are renumbered so that part p owns the new ids [node_offsets[p], node_offsets[p+1]);
within a part, nodes keep their original relative order. A temporal part holds every event
with an endpoint it owns or a replicated hub endpoint (`--replicate-hubs`: the hubs are still
owned by one part; other parts hold read-only copies of their events).
"""
from __future__ import annotations

import errno
import json
import reprlib
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import numpy as np
from tqdm import tqdm

import gnndist
from gnndist.errors import GnndistError
from gnndist.graph import Graph, TemporalGraph, indptr_of, owners, unique_ints
from gnndist.io import atomic_dir, sha256_file, write_json
from gnndist.partition import methods, stats

FORMAT_VERSION = 1
MEMORY_CHECK_EDGES = 1_000_000
_NODE_ARRAYS = ("x", "y", "train_mask", "val_mask", "test_mask")
_EVENT_ARRAYS = ("edge_feat", "edge_label")


@dataclass(eq=False)
class Partition:
    """One part of a partition store: its nodes (static: their CSR rows and data; temporal:
    every event touching them), with node ids in the store's new numbering."""

    part_id: int
    num_parts: int
    kind: str
    num_nodes: int
    node_offsets: np.ndarray
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
        return int(self.node_offsets[self.part_id])

    @property
    def stop(self) -> int:
        """One past the last new id this part owns."""
        return int(self.node_offsets[self.part_id + 1])

    @property
    def num_local(self) -> int:
        return self.stop - self.start

    def owner(self, ids: np.ndarray) -> np.ndarray:
        """Owning part of each new global id."""
        return owners(ids, self.node_offsets)

    @classmethod
    def from_arrays(cls, meta: dict, part_id: int, arrays: dict[str, np.ndarray]) -> "Partition":
        return cls(part_id=part_id, num_parts=int(meta["num_parts"]), kind=meta["kind"],
                   num_nodes=int(meta["num_nodes"]), node_offsets=np.asarray(meta["node_offsets"], dtype=np.int64),
                   meta=meta, num_events=int(meta.get("num_events", 0)),
                   hub_ids=np.asarray(meta.get("replicated_hubs", []), dtype=np.int64), **arrays)


def gather_rows(indptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
    indptr, pos = gather_rows(graph.indptr, new_to_orig)
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
    """A computed partition of a graph: renumbering, figures, and each part on demand
    (`part(p)`), written to disk with `save(dir)`."""

    def __init__(self, graph: Union[Graph, TemporalGraph], membership: np.ndarray, num_parts: int,
                 method: str, params: dict, figures: dict, hubs: np.ndarray) -> None:
        self.graph, self.num_parts, self.method, self.params = graph, num_parts, method, params
        self.kind = "static" if isinstance(graph, Graph) else "temporal"
        self.membership = membership
        self.new_to_orig = np.argsort(membership, kind="stable").astype(np.int64)
        self.orig_to_new = invert_permutation(self.new_to_orig)
        self.node_offsets = indptr_of(membership, num_parts)
        self.hubs = hubs  # original ids
        self.figures = figures

    @property
    def num_nodes(self) -> int:
        return int(self.graph.num_nodes)

    def meta(self) -> dict:
        """meta.json contents, less the file checksums."""
        g = self.graph
        size = {"num_edges": g.num_edges} if isinstance(g, Graph) else {"num_events": g.num_events}
        return {"format_version": FORMAT_VERSION, "gnndist_version": gnndist.__version__, "kind": self.kind,
                "method": self.method, "num_parts": self.num_parts, "num_nodes": self.num_nodes, **size,
                "node_offsets": self.node_offsets.tolist(), "params": self.params,
                "replicated_hubs": np.sort(self.orig_to_new[self.hubs]).tolist(),
                "stats": self.figures}

    def part_arrays(self, p: int) -> dict[str, np.ndarray]:
        """The arrays stored for part `p` (file name stem -> array)."""
        g, o2n = self.graph, self.orig_to_new
        rows = self.new_to_orig[self.node_offsets[p]:self.node_offsets[p + 1]]
        out: dict[str, np.ndarray] = {"orig_ids": rows}
        halo = bool(self.params["halo"])
        if isinstance(g, Graph):
            out["indptr"], pos = gather_rows(g.indptr, rows)
            out["indices"] = o2n[g.indices[pos]]
            del pos
            out.update({k: getattr(g, k)[rows] for k in _NODE_ARRAYS if getattr(g, k) is not None})
            if halo:
                idx = out["indices"]
                start, stop = self.node_offsets[p], self.node_offsets[p + 1]
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
        out = check_out(out)
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
            write_json(tmp / "meta.json", meta)
        return out


def check_out(out: Union[str, Path], data: Union[str, Path, None] = None) -> Path:
    """`out` as a Path, after checking that writing a store there loses nothing: it must not
    be or contain the input `data` path, and an existing folder must be empty or a partition
    store holding only the files its meta.json lists."""
    out = Path(out)
    if data is not None and Path(data).exists():
        d, o = Path(data).resolve(), out.resolve()
        if d == o or o in d.parents:
            raise GnndistError(f"refusing to write the store to {out}: it contains the input {data}, which replacing "
                               "it would delete; choose another --out")
    if not out.exists():
        return out
    if not out.is_dir():
        raise GnndistError(f"refusing to overwrite {out}: it exists and is not a partition store")
    found = sorted(f.relative_to(out).as_posix() for f in out.rglob("*") if f.is_symlink() or not f.is_dir())
    if not found:
        return out
    if "meta.json" not in found:
        raise GnndistError(f"refusing to overwrite {out}: it exists and is not a partition store")
    try:
        listed = set(read_store_meta(out)["files"]) | {"meta.json"}
    except GnndistError:
        raise GnndistError(f"refusing to replace {out}: its meta.json is unreadable, so the store's files cannot be "
                           "told from others; delete the folder yourself or choose another --out") from None
    foreign = [f for f in found if f not in listed]
    if foreign:
        raise GnndistError(f"refusing to replace partition store {out}: it holds {foreign[0]}, which the store did "
                           "not write; move it away or choose another --out")
    return out


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
                    balance: Sequence[str] = ("nodes",), imbalance_tol: float = 1.03, halo: int = 0,
                    replicate_hubs: int = 0, time_windows: int = 4, recency: float = 1.0, seed: int = 0,
                    force: bool = False, out: Union[str, Path, None] = None, progress: bool = False
                    ) -> PartitionStore:
    """Partition `graph` into `num_parts` parts; write the store to `out` when given.

    `method`: metis | random | temporal (default: metis for a static graph, temporal for a
    temporal one). `balance` (metis): vertex weights to balance, any of nodes, edges, train.
    `imbalance_tol`: allowed max/mean of each balanced weight (METIS ufactor). `halo`: 1 to
    store 1-hop halo ids (and features). Temporal only: `replicate_hubs` top-degree nodes
    replicated into every part, `time_windows` and `recency` of the temporal method.
    """
    temporal = isinstance(graph, TemporalGraph)
    method = method or ("temporal" if temporal else "metis")
    if method not in methods.METHODS:
        raise GnndistError(f"unknown method {method!r}; choose from {', '.join(methods.METHODS)}")
    if method == "temporal" and not temporal:
        raise GnndistError("--method temporal needs a temporal graph (timestamped events)")
    if not 1 <= num_parts <= max(graph.num_nodes, 1):
        raise GnndistError(f"--parts must be between 1 and the node count ({graph.num_nodes}), got {num_parts}")
    if temporal and graph.num_events == 0:
        raise GnndistError("the temporal graph has no events to partition")
    if halo not in (0, 1):
        raise GnndistError(f"--halo must be 0 or 1, got {halo}")
    if replicate_hubs and not temporal:
        raise GnndistError("--replicate-hubs applies to temporal graphs only")
    if not 0 <= replicate_hubs <= graph.num_nodes:
        raise GnndistError(f"--replicate-hubs must be between 0 and the node count, got {replicate_hubs}")
    balance = methods.check_balance(balance)
    imbalance_tol, seed = methods.check_imbalance_tol(imbalance_tol), methods.check_seed(seed)
    if temporal:
        methods.check_time_windows(graph.num_events, num_parts, time_windows)
    if out is not None:
        check_out(out)
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
    else:
        params.update(time_windows=time_windows, recency=recency)
        membership = methods.temporal_membership(graph, num_parts, time_windows, recency, imbalance_tol,
                                                    seed, hubs)
    if temporal:
        params["replicate_hubs"] = replicate_hubs
    bar.update()
    bar.set_postfix_str("figures")
    figures = stats.figures(graph, membership, num_parts, halo, hubs, time_windows if temporal else 1)
    figures["partition_time_s"] = time.perf_counter() - t0
    figures["peak_memory_bytes"] = stats.peak_memory_bytes()
    bar.update()
    bar.close()
    store = PartitionStore(graph, membership, num_parts, method, params, figures, hubs)
    if out is not None:
        store.save(out, progress)
    return store


# ---------------------------------------------------------------- reading

def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_count(v: Any) -> bool:
    return _is_int(v) and v >= 0


def _ints(n: int):
    """Check: a list of `n` integers >= 0."""
    return lambda v: isinstance(v, list) and len(v) == n and all(_is_count(x) for x in v)


def _meta_problem(meta: dict) -> Optional[str]:
    """What is wrong with meta.json's contents (a key or type the code relies on), or None."""
    kind, k = meta.get("kind"), meta.get("num_parts")
    if kind not in ("static", "temporal"):
        return f"kind must be 'static' or 'temporal', got {reprlib.repr(kind)}"
    if not (_is_int(k) and k >= 1):
        return f"num_parts must be an integer >= 1, got {reprlib.repr(k)}"
    temporal = kind == "temporal"
    top = {"method": lambda v: isinstance(v, str), "num_nodes": _is_count,
           ("num_events" if temporal else "num_edges"): _is_count, "node_offsets": _ints(k + 1),
           "params": lambda v: isinstance(v, dict),
           "files": lambda v: isinstance(v, dict) and "orig_to_new.npy" in v
           and all(isinstance(x, str) for x in [*v, *v.values()]),
           "replicated_hubs": lambda v: isinstance(v, list) and all(_is_int(x) for x in v),
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
    offsets = meta["node_offsets"]
    if offsets[0] != 0 or offsets[-1] != meta["num_nodes"] or any(a > b for a, b in zip(offsets, offsets[1:])):
        return f"node_offsets {reprlib.repr(offsets)} do not split num_nodes = {meta['num_nodes']} into parts"
    if meta["stats"]["nodes_per_part"] != np.diff(offsets).tolist():
        return "stats.nodes_per_part disagrees with node_offsets"
    return None


def read_store_meta(path: Union[str, Path]) -> dict:
    """meta.json of the store at `path`, checked for the format version this gnndist reads and
    for every key and type the code reads from it."""
    f = Path(path) / "meta.json"
    if not f.is_file():
        raise GnndistError(f"{path} is not a partition store (no meta.json)")
    try:
        meta = json.loads(f.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise GnndistError(f"{f} is corrupted (not valid JSON: {e})") from None
    if not isinstance(meta, dict) or "format_version" not in meta:
        raise GnndistError(f"{f} is not a gnndist partition store meta file")
    if meta["format_version"] != FORMAT_VERSION:
        raise GnndistError(f"{path} was written in partition store format {meta['format_version']}; this gnndist "
                           f"reads format {FORMAT_VERSION}: re-run `gnndist partition`")
    problem = _meta_problem(meta)
    if problem:
        raise GnndistError(f"{f}: malformed ({problem}): re-run `gnndist partition`")
    return meta


def _checked(root: Path, rel: str, digest: str) -> Path:
    """Path of store file `rel`, after checking it exists and matches its sha256."""
    f = root / rel
    if not f.is_file():
        raise GnndistError(f"partition store {root} is missing {rel}: re-run `gnndist partition`")
    if sha256_file(f) != digest:
        raise GnndistError(f"partition store file {f} is corrupted (sha256 mismatch): re-run `gnndist partition`")
    return f


def _load_checked(root: Path, rel: str, digest: str) -> np.ndarray:
    f = _checked(root, rel, digest)
    try:
        return np.load(f, allow_pickle=False)
    except (ValueError, OSError) as e:
        raise GnndistError(f"cannot read {f}: {e}") from None


def load_partition(path: Union[str, Path], part_id: int, world_size: Optional[int] = None) -> Partition:
    """Part `part_id` of the store at `path`, every file checked against its sha256.

    With `world_size`, the store must have exactly that many parts.
    """
    root = Path(path)
    meta = read_store_meta(root)
    k = int(meta["num_parts"])
    if world_size is not None and world_size != k:
        raise GnndistError(f"{path} has {k} parts but the world size is {world_size}; "
                           f"partition again with --parts {world_size}")
    if not 0 <= part_id < k:
        raise GnndistError(f"part {part_id} out of range: {path} has {k} parts")
    prefix = f"part{part_id}/"
    arrays = {rel[len(prefix):-4]: _load_checked(root, rel, digest)
              for rel, digest in meta["files"].items() if rel.startswith(prefix)}
    if "orig_ids" not in arrays:
        raise GnndistError(f"partition store {root} lists no files for part {part_id}: re-run `gnndist partition`")
    part = Partition.from_arrays(meta, part_id, arrays)
    if part.orig_ids.size != part.num_local:
        raise GnndistError(f"partition store {root} part {part_id} holds {part.orig_ids.size} nodes, "
                           f"meta.json says {part.num_local}")
    return part


def load_id_maps(path: Union[str, Path]) -> tuple[np.ndarray, np.ndarray]:
    """(new_to_orig, orig_to_new) of the store at `path`: inverse permutations of the node ids."""
    root = Path(path)
    meta = read_store_meta(root)
    orig_to_new = _load_checked(root, "orig_to_new.npy", meta["files"]["orig_to_new.npy"])
    return invert_permutation(orig_to_new), orig_to_new


def verify_store(path: Union[str, Path]) -> int:
    """Check every file of the store against its sha256; returns the number of files checked."""
    root = Path(path)
    meta = read_store_meta(root)
    for rel, digest in meta["files"].items():
        _checked(root, rel, digest)
    return len(meta["files"])
