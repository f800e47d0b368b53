"""What one link-prediction rank allocates (`link_footprint`), for `gnndist.footprint`'s check."""
from __future__ import annotations

from typing import Any

import torch

from gnndist.footprint import Footprint, Part, model_bytes, sizing
from gnndist.samplers.cache import capacity_rows
from gnndist.temporal.models import build_model
from gnndist.temporal.modules import GraphAttention
from gnndist.temporal.state import NodeState

HOP_ENTRY_BYTES = 8 + 8 + 8 + 4 + 1  # a sampled neighbour: node, event id, time, time gap, mask


def link_footprint(events: Any, cfg: Any, device: torch.device = torch.device("cpu")) -> Footprint:
    """What one link-prediction rank allocates for its `RankEvents` and `LinkConfig`."""
    what = f"the {cfg.model} trainer"
    with sizing(what, "--memory-dim"):
        model = build_model(cfg.model, events.edge_dim, cfg.memory_dim, cfg.time_dim, cfg.num_neighbors,
                            mailbox=cfg.mailbox)
        state, partitioned = 0, events.num_parts > 1 and cfg.memory == "partitioned"
        if model.has_memory:
            rows = int(events.book.sizes().max()) if partitioned else events.num_nodes
            s = NodeState(rows, model.dim, model.memory.mail_dim, model.memory.mailbox, device="meta")
            state = sum(t.numel() * t.element_size() for t in (s.memory, s.last_update, s.mail, s.mail_time))
    # at least: this rank's share of an evaluation batch, its queries (src, dst and, where the
    # model samples for all queries, the negatives) with k^h sampled neighbours at hop h: the
    # sampled `Hop` (29 bytes an entry and its event's features) and, in attention models, each
    # entry's key (memory row), event features and time encoding as attention inputs (float32)
    share = -(-min(cfg.batch_size, events.num_events) // events.num_parts)
    queries = share * (2 + cfg.eval_negatives if model.sampling.rows == "queries" else 2)
    entries = queries * sum(cfg.num_neighbors ** h for h in range(1, model.sampling.hops + 1))
    attends = isinstance(model.embedding, GraphAttention) or model.message_attention is not None
    batch = entries * (HOP_ENTRY_BYTES + 4 * events.edge_dim
                       + (4 * (cfg.memory_dim + events.edge_dim + cfg.time_dim) if attends else 0))
    cache = 0
    if cfg.cache != "none" and events.num_parts > 1 and events.edge_dim:
        row = events.edge_dim * events.edge_feat.itemsize
        cache = capacity_rows(cfg.cache_size, events.num_events - events.num_held, row) * row
    state_flag = "--memory-dim" if events.num_parts == 1 or partitioned else "--memory-dim or use --memory partitioned"
    return Footprint(what, torch.device(device), [
        Part("model with gradients and Adam state", model_bytes(model), "--memory-dim"),
        Part("node state", state, state_flag),
        Part("a batch's neighbour tensors (at least)", batch, "--batch-size"),
        Part("edge-feature cache", cache, "--cache-size", on_device=False)])
