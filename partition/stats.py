"""Partition quality figures, memory estimates and measurements.

All figures are computed from `membership` (the part of every original node id). Static:
a part owns the CSR rows of its nodes, so `edges_per_part` counts CSR entries by row owner
and the edge cut is the fraction of CSR entries whose neighbour has another owner. Temporal:
an event is owned by the part of its source node; an event crosses parts when its endpoints
have different owners.
"""
from __future__ import annotations

import resource
from typing import Optional, Union

import numpy as np

from gnndist.graph import Graph, TemporalGraph


def unique_ints(a: np.ndarray) -> np.ndarray:
    """Sorted distinct values of an integer array (sort + mask: np.unique is ~50x slower on
    large int64 arrays in numpy 2.4)."""
    s = np.sort(a)
    if s.size > 1:
        keep = np.empty(s.size, dtype=bool)
        keep[0] = True
        np.not_equal(s[1:], s[:-1], out=keep[1:])
        s = s[keep]
    return s


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


def static_figures(graph: Graph, membership: np.ndarray, num_parts: int, halo: int) -> dict:
    """Nodes, edges and training nodes per part, imbalances, edge cut, halo, replication."""
    n = graph.num_nodes
    deg = graph.degrees()
    row_part = np.repeat(membership, deg)
    nbr_part = membership[graph.indices]
    nodes = np.bincount(membership, minlength=num_parts)
    edges = np.bincount(membership, weights=deg, minlength=num_parts).astype(np.int64)
    cross = row_part != nbr_part
    halo_keys = unique_ints(row_part[cross] * np.int64(n) + graph.indices[cross])
    del row_part, nbr_part
    halo_counts = np.bincount(halo_keys // n, minlength=num_parts) if n else np.zeros(num_parts, np.int64)
    fig = {
        "nodes_per_part": nodes.tolist(),
        "edges_per_part": edges.tolist(),
        "imbalance": {"nodes": imbalance(nodes), "edges": imbalance(edges)},
        "edge_cut_fraction": float(cross.mean()) if cross.size else 0.0,
        "halo_nodes_per_part": halo_counts.tolist(),
        "replication_factor": _replication_factor(
            membership, num_parts, halo_keys if halo else np.zeros(0, np.int64), np.zeros(0, np.int64)),
    }
    if graph.train_mask is not None:
        train = np.bincount(membership, weights=graph.train_mask, minlength=num_parts).astype(np.int64)
        fig["train_nodes_per_part"] = train.tolist()
        fig["imbalance"]["train"] = imbalance(train)
    return fig


def temporal_figures(graph: TemporalGraph, membership: np.ndarray, num_parts: int, halo: int,
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


def figures(graph: Union[Graph, TemporalGraph], membership: np.ndarray, num_parts: int, halo: int = 0,
            hubs: Optional[np.ndarray] = None, num_windows: int = 1) -> dict:
    """The quality figures of a partition of `graph` (see the module docstring)."""
    if isinstance(graph, Graph):
        return static_figures(graph, membership, num_parts, halo)
    return temporal_figures(graph, membership, num_parts, halo,
                            np.zeros(0, np.int64) if hubs is None else hubs, num_windows)


def peak_memory_bytes() -> int:
    """This process's peak resident set size so far, in bytes: VmHWM from /proc/self/status
    (ru_maxrss where that is absent; it also counts the parent's memory at fork)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def available_memory_bytes() -> Optional[int]:
    """MemAvailable from /proc/meminfo, or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def graph_bytes(graph: Union[Graph, TemporalGraph]) -> int:
    """Bytes held by the graph's arrays."""
    return sum(a.nbytes for a in vars(graph).values() if isinstance(a, np.ndarray))


def estimate_peak_bytes(graph: Union[Graph, TemporalGraph], method: str) -> int:
    """Estimated extra peak memory of partitioning `graph` with `method` (beyond the graph).

    Per edge (CSR entry or event): the symmetrized METIS graph and its sort keys and METIS's
    own coarsening levels; per node: membership, id maps and METIS vertex arrays. Calibrated
    on measured runs (see benchmarks/partition.py), rounded up.
    """
    if isinstance(graph, Graph):
        e, per_edge = graph.num_edges, 40 if method == "metis" else 24
    else:
        e, per_edge = graph.num_events, 64 if method != "random" else 32
    return int(e * per_edge + graph.num_nodes * 160 + graph_bytes(graph) // 2)


def fmt_bytes(n: float) -> str:
    """Human-readable byte count."""
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}"
