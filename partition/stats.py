"""Partition quality metrics, memory estimates and measurements.

All metrics are computed from `membership` (the part of every original node id). Static:
a part owns the CSR rows of its nodes, so `edges_per_part` counts CSR entries by row owner
and the edge cut is the fraction of CSR entries whose neighbour has another owner. Temporal:
an event is owned by the part of its source node; an event crosses parts when its endpoints
have different owners.
"""
from __future__ import annotations

import os
import resource
from typing import Optional, Union

import numba
import numpy as np

from gnndist.errors import GnndistError
from gnndist.graph import Graph, TemporalGraph, unique_ints


def imbalance(counts: np.ndarray) -> float:
    """max/mean of per-part counts (1.0 when all are zero)."""
    counts = np.asarray(counts, dtype=np.float64)
    mean = counts.mean() if counts.size else 0.0
    return float(counts.max() / mean) if mean > 0 else 1.0


def _replication_factor(membership: np.ndarray, num_parts: int, halo: np.ndarray, hubs: np.ndarray) -> float:
    """Node copies over all parts (owned + stored halo + hub replicas, a node counted once per
    part) divided by the node count."""
    n = membership.size
    if n == 0:
        return 1.0
    hub_keys = (np.arange(num_parts, dtype=np.int64)[:, None] * n + hubs[None, :]).ravel()
    hub_keys = hub_keys[membership[hub_keys % n] != hub_keys // n]
    return float((n + unique_ints(np.concatenate([halo, hub_keys])).size) / n)


@numba.njit(cache=True)
def _cut_and_halo(indptr, indices, membership, rows_by_part, node_offsets):  # pragma: no cover - compiled
    """(CSR entries whose neighbour has another owner, distinct such neighbours per part)."""
    k = node_offsets.size - 1
    stamp = np.full(membership.size, -1, dtype=np.int64)
    halo = np.zeros(k, dtype=np.int64)
    cut = 0
    for p in range(k):
        for i in range(node_offsets[p], node_offsets[p + 1]):
            r = rows_by_part[i]
            for j in range(indptr[r], indptr[r + 1]):
                c = indices[j]
                if membership[c] != p:
                    cut += 1
                    if stamp[c] != p:
                        stamp[c] = p
                        halo[p] += 1
    return cut, halo


def static_quality(graph: Graph, membership: np.ndarray, num_parts: int, halo: int) -> dict:
    """Nodes, edges and training nodes per part, imbalances, edge cut, halo, replication."""
    n = graph.num_nodes
    deg = graph.degrees()
    nodes = np.bincount(membership, minlength=num_parts)
    edges = np.bincount(membership, weights=deg, minlength=num_parts).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(nodes)])
    cut, halo_counts = _cut_and_halo(graph.indptr, graph.indices, membership,
                                     np.argsort(membership, kind="stable"), offsets)
    fig = {
        "nodes_per_part": nodes.tolist(),
        "edges_per_part": edges.tolist(),
        "imbalance": {"nodes": imbalance(nodes), "edges": imbalance(edges)},
        "edge_cut_fraction": cut / graph.num_edges if graph.num_edges else 0.0,
        "halo_nodes_per_part": halo_counts.tolist(),
        "replication_factor": float((n + halo * halo_counts.sum()) / n) if n else 1.0,
    }
    if graph.train_mask is not None:
        train = np.bincount(membership, weights=graph.train_mask, minlength=num_parts).astype(np.int64)
        fig["train_nodes_per_part"] = train.tolist()
        fig["imbalance"]["train"] = imbalance(train)
    return fig


def temporal_quality(graph: TemporalGraph, membership: np.ndarray, num_parts: int, halo: int,
                     hubs: np.ndarray, num_windows: int) -> dict:
    """Events per part (owned by source), imbalances overall and per time window, cross-part
    event fraction (with and without hub replicas), pair cut, halo, replication."""
    n, e = graph.num_nodes, graph.num_events
    ps, pd = membership[graph.src], membership[graph.dst]
    nodes = np.bincount(membership, minlength=num_parts)
    events = np.bincount(ps, minlength=num_parts)
    cross = ps != pd
    is_hub = np.zeros(n, dtype=bool)
    is_hub[hubs] = True
    touches_hub = is_hub[graph.src] | is_hub[graph.dst]
    win = (np.arange(e, dtype=np.int64) * num_windows) // max(e, 1)
    per_window = np.bincount(win * num_parts + ps, minlength=num_windows * num_parts).reshape(num_windows, num_parts)
    lo, hi = np.minimum(graph.src, graph.dst), np.maximum(graph.src, graph.dst)
    pairs = unique_ints(lo * np.int64(n) + hi)
    pair_cross = membership[pairs // n] != membership[pairs % n] if pairs.size else np.zeros(0, bool)
    halo_keys = unique_ints(np.concatenate([ps[cross] * np.int64(n) + graph.dst[cross],
                                          pd[cross] * np.int64(n) + graph.src[cross]]))
    stored = [int(np.count_nonzero((ps == p) | (pd == p) | touches_hub)) for p in range(num_parts)]
    return {
        "nodes_per_part": nodes.tolist(),
        "events_per_part": events.tolist(),
        "stored_events_per_part": stored,
        "events_per_window_per_part": per_window.tolist(),
        "imbalance": {"nodes": imbalance(nodes), "events": imbalance(events),
                      "events_worst_window": max((imbalance(r) for r in per_window), default=1.0)},
        "cross_partition_event_fraction": float(cross.mean()) if e else 0.0,
        "cross_partition_event_fraction_with_replicas": float((cross & ~touches_hub).mean()) if e else 0.0,
        "edge_cut_fraction": float(pair_cross.mean()) if pairs.size else 0.0,
        "halo_nodes_per_part": np.bincount(halo_keys // max(n, 1), minlength=num_parts).tolist(),
        "replication_factor": _replication_factor(
            membership, num_parts, halo_keys if halo else np.zeros(0, np.int64), hubs),
    }


def quality(graph: Union[Graph, TemporalGraph], membership: np.ndarray, num_parts: int, halo: int = 0,
            hubs: Optional[np.ndarray] = None, num_windows: int = 1) -> dict:
    """The quality metrics of a partition of `graph` (see the module docstring)."""
    if isinstance(graph, Graph):
        return static_quality(graph, membership, num_parts, halo)
    return temporal_quality(graph, membership, num_parts, halo,
                            np.zeros(0, np.int64) if hubs is None else hubs, num_windows)


def _proc_bytes(path: str, key: str) -> Optional[int]:
    """The `key:` figure (in kB) of a /proc file, in bytes; None where it cannot be read."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def peak_memory_bytes() -> int:
    """This process's peak resident set size so far, in bytes: VmHWM from /proc/self/status
    (ru_maxrss where that is absent; it also counts the parent's memory at fork)."""
    peak = _proc_bytes("/proc/self/status", "VmHWM")
    return peak if peak is not None else int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def resident_memory_bytes() -> int:
    """This process's resident set size now, in bytes (VmRSS; 0 where it cannot be read)."""
    return _proc_bytes("/proc/self/status", "VmRSS") or 0


def available_memory_bytes() -> Optional[int]:
    """MemAvailable from /proc/meminfo, or None where it cannot be read."""
    return _proc_bytes("/proc/meminfo", "MemAvailable")


def graph_bytes(graph: Union[Graph, TemporalGraph]) -> int:
    """Bytes held by the graph's arrays."""
    return sum(a.nbytes for a in vars(graph).values() if isinstance(a, np.ndarray))


# bytes per (edge or event, node) beyond the loaded graph, measured with VmHWM on generated
# graphs (1M nodes / 20M CSR entries, 0.2-1M nodes / 4M entries, 0.1-1M nodes / 5M events), rounded up
_PER_ITEM = {("static", "metis"): (140, 64), ("static", "random"): (16, 48),
             ("temporal", "temporal"): (64, 240), ("temporal", "metis"): (64, 180), ("temporal", "random"): (64, 32)}
_FIXED = 128 << 20  # numba/LLVM and METIS start-up


def estimate_extra_bytes(graph: Union[Graph, TemporalGraph], method: str) -> int:
    """Estimated peak memory of partitioning `graph` with `method` and writing the store,
    beyond the loaded graph: METIS's graph and coarsening levels, sort keys, metrics, and one
    part's copies while it is written."""
    kind = "static" if isinstance(graph, Graph) else "temporal"
    per_edge, per_node = _PER_ITEM[kind, method.removesuffix("-lp")]
    items = graph.num_edges if kind == "static" else graph.num_events
    return _FIXED + items * per_edge + graph.num_nodes * per_node + graph_bytes(graph) // 2


def parse_size(text: Union[str, int, float]) -> int:
    """A byte count: a number, or a number with a unit (KiB, MiB, GiB, TiB; KB, MB, GB, TB)."""
    units = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
             "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    s = str(text).strip().lower().replace(" ", "")
    num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    try:
        value = float(num) * units[s[len(num):]]
    except (ValueError, KeyError):
        raise GnndistError(f"--memory-budget must be bytes or a size such as 2GiB, got {text!r}") from None
    if not value >= 1:
        raise GnndistError(f"--memory-budget must be at least 1 byte, got {text!r}")
    return int(value)


def default_budget() -> int:
    """This host's available memory divided among its ranks."""
    avail = available_memory_bytes() or 2**32
    return int(avail // max(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), 1))


def fmt_bytes(n: float) -> str:
    """Human-readable byte count."""
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}"
