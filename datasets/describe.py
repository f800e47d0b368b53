"""Facts about a dataset before it is partitioned or trained on, and what that will take in memory.

`facts(graph)`: kind, sizes, time span and resolution, feature dims, labels, split sizes and
degree statistics. `memory(graph, world)`: peak memory of partitioning (each method) and the
memory each of `world` training ranks holds, by the formulas of `MEMORY_FORMULA`.
"""
from __future__ import annotations

from typing import Any, Optional, Union

import numpy as np

from gnndist.datasets.split import chronological_split, new_nodes_after
from gnndist.errors import GnndistError
from gnndist.graph import Graph, TemporalGraph
from gnndist.partition.stats import estimate_extra_bytes, fmt_bytes, graph_bytes
from gnndist.validate import MEMORY_MODES

MEMORY_DIM = 100  # the link trainer's default --memory-dim
MEMORY_FORMULA = """Per-rank training memory in bytes, N nodes, E events (or CSR entries), W ranks:
  link (TGN's state; memory size d = --memory-dim, D edge features, L label bytes):
    W = 1: E (24 + 4D + L) graph (src, dst, t, features, label)
           + 2E * 24 + 8 (N + 1) T-CSR (neighbour, event id, time; row pointers) + N * state
           + 8 N id map
    W > 1: E/W (1 + c) (32 + 4D + L) events touching the rank's nodes (+ event id)
           + 2E/W * 24 + 8 (N/W + 1) T-CSR of its own nodes + 16 N id maps
           + R * state, R = N/W (partitioned memory) or N (replicated);
           c = share of events whose endpoints have different owners, shown at 0 (best)
           and 1 - 1/W (a random partition)
    state = 4d memory + 8 last update + 4 (d + D) mail + 8 mail time, a node (TGN, JODIE,
            DyRep; APAN keeps 10 mails of 2d + D floats, TGAT no state)
  node: n = N/W owned rows: 8 (n + 1) + 8 E/W CSR + n (4F features + 8 label + 1 a split
        mask + 8 original id when W > 1); the feature cache adds up to --cache-size of the
        remote rows, 4F bytes each.
"""
_METHODS = {"static": ("metis", "random"), "temporal": ("temporal", "metis", "random")}


def _degree_stats(counts: np.ndarray) -> dict[str, float]:
    """min / median / mean / max of per-node counts, and how many nodes have none."""
    if counts.size == 0:
        return {"min": 0, "median": 0.0, "mean": 0.0, "max": 0, "zero": 0}
    return {"min": int(counts.min()), "median": float(np.median(counts)), "mean": float(counts.mean()),
            "max": int(counts.max()), "zero": int(np.count_nonzero(counts == 0))}


def _labels(y: Optional[np.ndarray]) -> Optional[dict[str, Any]]:
    """Distinct label values and how often each occurs (None without labels)."""
    if y is None:
        return None
    values, counts = np.unique(y, return_counts=True)
    return {"values": values.tolist(), "counts": counts.tolist()}


def time_resolution(t: np.ndarray) -> Optional[float]:
    """The smallest positive gap between distinct times of sorted `t` (None with fewer than two)."""
    gaps = np.diff(t)
    gaps = gaps[gaps > 0]
    return float(gaps.min()) if gaps.size else None


def facts(graph: Union[Graph, TemporalGraph]) -> dict[str, Any]:
    """What a dataset holds: kind, nodes, edges (CSR entries) or events, features, labels,
    split sizes, degree statistics (temporal: events per node, an event counting for both
    endpoints), and for temporal graphs the time span and resolution."""
    if isinstance(graph, Graph):
        masks = [getattr(graph, f"{s}_mask") for s in ("train", "val", "test")]
        return {"kind": "static", "num_nodes": graph.num_nodes, "num_edges": graph.num_edges,
                "node_features": graph.num_features, "labels": _labels(graph.y),
                "split": None if any(m is None for m in masks) else
                dict(zip(("train", "val", "test"), (int(m.sum()) for m in masks))),
                "degree": _degree_stats(graph.degrees())}
    e = graph.num_events
    train_end, val_end = chronological_split(graph)
    per_node = np.bincount(graph.src, minlength=graph.num_nodes) + np.bincount(graph.dst, minlength=graph.num_nodes)
    return {"kind": "temporal", "num_nodes": graph.num_nodes, "num_events": e, "edge_features": graph.edge_dim,
            "labels": _labels(graph.edge_label),
            "time": {"first": float(graph.t[0]) if e else None, "last": float(graph.t[-1]) if e else None,
                     "span": float(graph.t[-1] - graph.t[0]) if e else 0.0, "resolution": time_resolution(graph.t)},
            "split": {"train": train_end, "val": val_end - train_end, "test": e - val_end,
                      "new_nodes_after_train": int(new_nodes_after(graph, train_end).size)},
            "degree": _degree_stats(per_node)}


def state_row_bytes(memory_dim: int, edge_dim: int) -> int:
    """Bytes of one node's state: memory, last update, one mail of memory + edge features, its time."""
    return 4 * memory_dim + 8 + 4 * (memory_dim + edge_dim) + 8


def temporal_rank_bytes(num_nodes: int, num_events: int, edge_dim: int, label_bytes: int, world: int,
                        memory: str = "partitioned", cross: float = 0.0, memory_dim: int = MEMORY_DIM
                        ) -> dict[str, float]:
    """The memory one of `world` link-prediction ranks holds, by part (see the module docstring);
    `cross` is the fraction of events whose endpoints have different owners."""
    if memory not in MEMORY_MODES:
        raise GnndistError(f"memory must be one of {', '.join(MEMORY_MODES)}, got {memory!r}")
    if world < 1 or not 0 <= cross <= 1:
        raise GnndistError(f"need world >= 1 and 0 <= cross <= 1, got world={world}, cross={cross}")
    n, e, w = num_nodes, num_events, world
    per_event = 4 * edge_dim + label_bytes + (24 if w == 1 else 32)
    rows = n if memory == "replicated" else n / w
    out = {"events": e / w * (1 + cross) * per_event, "tcsr": 2 * e / w * 24 + 8 * (n / w + 1),
           "id_maps": 8 * n if w == 1 else 16 * n, "node_state": rows * state_row_bytes(memory_dim, edge_dim)}
    out["total"] = sum(out.values())
    return out


def static_rank_bytes(num_nodes: int, num_edges: int, num_features: int, label_bytes: int, num_masks: int,
                      world: int) -> dict[str, float]:
    """The memory one of `world` node-classification ranks holds: the CSR rows of the nodes it
    owns and their features, labels, split masks (and original ids when `world` > 1)."""
    if world < 1:
        raise GnndistError(f"need world >= 1, got {world}")
    n = num_nodes / world
    out = {"csr": 8 * (n + 1) + 8 * num_edges / world,
           "node_data": n * (4 * num_features + label_bytes + num_masks + (8 if world > 1 else 0))}
    out["total"] = sum(out.values())
    return out


def random_cross_fraction(world: int) -> float:
    """The expected fraction of events (or edges) whose endpoints a uniform random partition into
    `world` parts gives different owners."""
    return 1 - 1 / world


def training_memory(graph: Union[Graph, TemporalGraph], world: int = 1,
                    memory_dim: int = MEMORY_DIM) -> list[dict[str, Any]]:
    """Per-rank training memory at `world` ranks, one row per setting: static, one row;
    temporal, each memory mode at the best (c = 0) and random-partition cross fraction
    (one row at `world` = 1)."""
    if isinstance(graph, Graph):
        masks = sum(getattr(graph, f"{s}_mask") is not None for s in ("train", "val", "test"))
        label = 0 if graph.y is None else graph.y.itemsize
        return [{"world_size": world, **static_rank_bytes(graph.num_nodes, graph.num_edges, graph.num_features,
                                                          label, masks, world)}]
    label = 0 if graph.edge_label is None else graph.edge_label.itemsize
    # one process holds the whole graph and every node's state: no memory mode, no crossing events
    settings = [(None, 0.0)] if world == 1 else \
        [(m, c) for m in MEMORY_MODES for c in (0.0, random_cross_fraction(world))]
    return [{"world_size": world, "memory": mode, "cross": c, "memory_dim": memory_dim,
             **temporal_rank_bytes(graph.num_nodes, graph.num_events, graph.edge_dim, label, world,
                                   mode or "partitioned", c, memory_dim)}
            for mode, c in settings]


def memory(graph: Union[Graph, TemporalGraph], world: int = 1, memory_dim: int = MEMORY_DIM) -> dict[str, Any]:
    """Estimated peak memory of partitioning `graph` (the loaded graph plus each method's
    working memory, as `gnndist partition` estimates it) and per-rank training memory."""
    kind = "static" if isinstance(graph, Graph) else "temporal"
    loaded = graph_bytes(graph)
    return {"loaded_bytes": loaded,
            "partition_peak_bytes": {m: loaded + estimate_extra_bytes(graph, m) for m in _METHODS[kind]},
            "training_per_rank": training_memory(graph, world, memory_dim)}


def _time(v: float) -> str:
    """A time or gap: whole numbers with thousands separators, others to 6 significant digits."""
    return f"{int(v):,}" if float(v).is_integer() else f"{v:.6g}" if abs(v) < 1e6 else f"{v:,.3f}"


def _span(seconds: float) -> str:
    """A time span, with its length in days or hours when the times are unix seconds."""
    days = seconds / 86400
    return _time(seconds) + (f" ({days:,.1f} days if in seconds)" if days >= 1 else
                                 f" ({seconds / 3600:,.1f} hours if in seconds)" if seconds >= 3600 else "")


def _rank_table(rows: list[dict[str, Any]]) -> list[str]:
    """The per-rank memory rows as text lines, one column per part."""
    parts = [k for k in rows[0] if k not in ("world_size", "memory", "cross", "memory_dim", "total")]
    names = {"events": "events", "tcsr": "T-CSR", "id_maps": "id maps", "node_state": "state", "csr": "CSR",
             "node_data": "node data"}
    out = [f"{'':<24}" + "".join(f"{names[k]:>12}" for k in parts) + f"{'total':>12}"]
    for r in rows:
        label = ("one process" if r["world_size"] == 1 else "per rank") if r.get("memory") is None else \
            f"{r['memory']}, c = {r['cross']:.2f}"
        out.append(f"{label:<24}" + "".join(f"{fmt_bytes(r[k]):>12}" for k in parts) + f"{fmt_bytes(r['total']):>12}")
    return out


def format_facts(s: dict[str, Any]) -> str:
    """A readable report of `gnndist info DATA`'s summary (`facts` + `memory`, with `data`, `format`)."""
    temporal = s["kind"] == "temporal"
    size = f"{s['num_events']:,} events" if temporal else f"{s['num_edges']:,} edges (CSR entries)"
    lines = [f"{s['data']}: {s['kind']} graph ({s['format']}), {s['num_nodes']:,} nodes, {size}"]
    if temporal:
        t = s["time"]
        res = "-" if t["resolution"] is None else _time(t["resolution"])
        lines.append(f"time {_time(t['first'])} .. {_time(t['last'])}: span {_span(t['span'])}, resolution {res}"
                     if t["first"] is not None else "time: no events")
        lines.append(f"features: {s['edge_features']} per event")
    else:
        lines.append(f"features: {s['node_features']} per node")
    lab = s["labels"]
    lines.append("labels: none" if lab is None else f"labels: {len(lab['values'])} values (" + ", ".join(
        f"{v}: {c:,}" for v, c in zip(lab["values"][:10], lab["counts"][:10])) + (", ..." if len(lab["values"]) > 10
                                                                                 else "") + ")")
    sp = s["split"]
    if temporal:
        lines.append(f"split (chronological 70/15/15, as `gnndist train`): train {sp['train']:,}, val {sp['val']:,}, "
                     f"test {sp['test']:,} events; {sp['new_nodes_after_train']:,} nodes first seen after training")
    else:
        lines.append("split: none" if sp is None else f"split: train {sp['train']:,}, val {sp['val']:,}, "
                     f"test {sp['test']:,} nodes")
    d = s["degree"]
    lines.append(f"{'events per node' if temporal else 'degree (CSR row length)'}: min {d['min']:,}, "
                 f"median {d['median']:,.1f}, mean {d['mean']:,.2f}, max {d['max']:,}; "
                 f"{d['zero']:,} nodes with none")
    m = s["memory"]
    peaks = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in m["partition_peak_bytes"].items())
    lines.append(f"memory: loaded graph {fmt_bytes(m['loaded_bytes'])}; `gnndist partition` peak about {peaks}")
    rows = m["training_per_rank"]
    w = rows[0]["world_size"]
    model = f", TGN state, memory {rows[0]['memory_dim']}" if temporal else ""
    lines.append(f"training, per rank at --nproc {w}{model} (formula: gnndist info --help):")
    lines += ["  " + line for line in _rank_table(rows)]
    return "\n".join(lines)
