"""A partition store's metrics as `gnndist info STORE` shows them: `summary(meta)` (the JSON
object: num_parts, method, nodes_per_part, edges_per_part or events_per_part, imbalance,
edge_cut_fraction, cross_partition_event_fraction (temporal), halo_nodes_per_part,
replication_factor, partition_time_s, peak_memory_bytes, ...) and `format_summary` (text)."""
from __future__ import annotations

from gnndist.partition.stats import fmt_bytes


def summary(meta: dict) -> dict:
    """The metrics `info --json` prints: store description, parameters, and stats."""
    keys = ("kind", "method", "num_parts", "num_nodes", "num_edges", "num_events", "format_version")
    out = {k: meta[k] for k in keys if k in meta}
    out.update(meta["stats"])
    out["params"] = meta["params"]
    out["replicated_hubs"] = len(meta.get("replicated_hubs", []))
    return out


def format_summary(s: dict) -> str:
    """A readable multi-line report of `summary(meta)`."""
    temporal = s["kind"] == "temporal"
    size = f"{s['num_events']:,} events" if temporal else f"{s['num_edges']:,} edges"
    lines = [f"{s['kind']} graph, {s['num_nodes']:,} nodes, {size}; method {s['method']}, {s['num_parts']} parts"]
    cols = [("nodes", s["nodes_per_part"])]
    cols.append(("events", s["events_per_part"]) if temporal else ("edges", s["edges_per_part"]))
    if temporal:
        cols.append(("stored events", s["stored_events_per_part"]))
    elif "train_nodes_per_part" in s:
        cols.append(("train", s["train_nodes_per_part"]))
    cols.append(("halo", s["halo_nodes_per_part"]))
    lines.append("part " + "".join(f"{name:>15}" for name, _ in cols))
    for p in range(s["num_parts"]):
        lines.append(f"{p:>4} " + "".join(f"{vals[p]:>15,}" for _, vals in cols))
    imb = ", ".join(f"{k.replace('_', ' ')} {v:.3f}" for k, v in s["imbalance"].items())
    lines.append(f"imbalance (max/mean): {imb}")
    if temporal:
        lines.append(f"cross-partition events: {100 * s['cross_partition_event_fraction']:.1f}%"
                     + (f" ({100 * s['cross_partition_event_fraction_with_replicas']:.1f}% not touching "
                        f"one of the {s['replicated_hubs']} replicated hubs)" if s["replicated_hubs"] else ""))
        lines.append(f"edge cut: {100 * s['edge_cut_fraction']:.1f}% of interacting node pairs cross parts")
    else:
        lines.append(f"edge cut: {100 * s['edge_cut_fraction']:.1f}% of edges cross parts")
    lines.append(f"replication factor: {s['replication_factor']:.3f}")
    lines.append(f"partition time {s['partition_time_s']:.2f} s" +
                 (f", write time {s['write_time_s']:.2f} s" if "write_time_s" in s else "") +
                 f", peak memory {fmt_bytes(s['peak_memory_bytes'])}")
    return "\n".join(lines)
