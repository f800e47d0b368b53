"""What a temporal run moves and holds, all ranks together: an epoch's traffic and time split
(`epoch_traffic`), and what each rank holds (`rank_metrics`), as the metrics JSON reports them."""
from __future__ import annotations

import resource
from typing import Any, Optional

import torch

from gnndist.runtime import dist
from gnndist.samplers import hit_rate
from gnndist.temporal.events import RankEvents
from gnndist.temporal.neighbours import Neighbours
from gnndist.temporal.timers import PHASES, Timers


def peak_rss_bytes() -> int:
    """This process's peak resident memory."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def reset_traffic(timers: Timers, neighbours: Neighbours, state: Any) -> None:
    """Start counting an epoch's traffic and time from zero."""
    timers.reset()
    neighbours.remote_queries = neighbours.carried_bytes = 0
    neighbours.features.reset_counters()
    if state is not None and hasattr(state, "reset_traffic"):
        state.reset_traffic()


def epoch_traffic(timers: Timers, neighbours: Neighbours, state: Any, seconds: float, grad_bytes: int,
                  num_neighbors: int, device: torch.device) -> dict[str, Any]:
    """The epoch's traffic and time split, summed over the ranks (phase seconds: their mean; a
    collective). `state`: the node state (None without memory); `grad_bytes`: the gradients
    all ranks sent in the epoch; `num_neighbors`: the sampled neighbours per query."""
    spent = dict(timers.seconds)
    spent["compute"] = seconds - spent["sample"] - spent["fetch"] - spent["sync"]
    c = neighbours.features.counters
    k = num_neighbors
    local = [getattr(state, "rows_fetched", 0), getattr(state, "bytes_sent", 0),
             neighbours.remote_queries * (16 + 8 * (1 + 3 * k)), c["requests"], c["hits"],
             c["bytes_fetched"] + neighbours.carried_bytes, c["bytes_saved"], *(spent[p] for p in PHASES)]
    total = dist.all_reduce(torch.tensor(local, dtype=torch.float64, device=device)).cpu().tolist()
    out = {"remote_rows": int(total[0]), "state_bytes": int(total[1]), "sample_bytes": int(total[2]),
           "edge_feature_bytes": int(total[5]), "edge_cache_hit_rate": hit_rate(total[4], total[3]),
           "edge_cache_bytes_saved": int(total[6]), "grad_bytes": grad_bytes}
    out["bytes"] = out["state_bytes"] + out["sample_bytes"] + out["edge_feature_bytes"]
    out.update({f"{p}_s": total[7 + i] / dist.world_size() for i, p in enumerate(PHASES)})
    return out


def rank_metrics(events: RankEvents, state: Any, neighbours: Neighbours, cache_counters: dict[str, int],
                 device: torch.device) -> list[dict[str, Any]]:
    """What each rank holds (gathered): events, T-CSR entries, edge-feature rows, node-state rows,
    bytes by category, its peak resident memory (and on a GPU its peak of allocated GPU memory),
    and `cache_counters`, its edge-cache counters of the last training epoch."""
    ev = events
    indptr, nbr, eid, ts = ev.tcsr()
    cache = neighbours.features.cache
    state_tensors = [] if state is None else list(state.state_dict().values())
    c = cache_counters
    mine = [ev.rank, ev.num_held, int(nbr.size), ev.num_held if ev.edge_feat is not None else 0,
            0 if state is None else int(state_tensors[0].shape[0]),
            sum(a.nbytes for a in (ev.eid, ev.src, ev.dst, ev.t)) + (0 if ev.edge_label is None
                                                                   else ev.edge_label.nbytes),
            indptr.nbytes + nbr.nbytes + eid.nbytes + ts.nbytes,
            0 if ev.edge_feat is None else ev.edge_feat.nbytes,
            sum(t.numel() * t.element_size() for t in state_tensors),
            0 if cache is None else cache.rows.nbytes,
            sum(a.nbytes for a in {id(a): a for a in (ev.orig_to_new, ev.new_to_orig)}.values()),
            peak_rss_bytes(), c.get("requests", 0), c.get("hits", 0), c.get("bytes_fetched", 0),
            torch.cuda.max_memory_allocated(device) if device.type == "cuda" else -1]
    rows = torch.cat(dist.all_gather_varsize(torch.tensor([mine], dtype=torch.int64, device=device)))
    return [_rank_record(r) for r in rows.cpu().tolist()]


def _rank_record(r: list[int]) -> dict[str, Any]:
    """One rank's entry of the metrics JSON's `ranks` from `rank_metrics`' row."""
    peak_gpu: Optional[int] = r[15] if r[15] >= 0 else None
    return {"rank": r[0], "events_held": r[1], "tcsr_entries": r[2], "edge_feature_rows": r[3],
            "node_state_rows": r[4],
            "bytes": dict(zip(("events", "tcsr", "edge_features", "node_state", "cache", "id_maps"), r[5:11])),
            "peak_rss_bytes": r[11], "peak_gpu_bytes": peak_gpu,
            "edge_cache": {"requests": r[12], "hits": r[13], "hit_rate": hit_rate(r[13], r[12]),
                           "bytes_fetched": r[14]}}
