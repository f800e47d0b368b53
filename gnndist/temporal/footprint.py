"""What one link-prediction rank allocates (`link_footprint`), for `gnndist.footprint`'s check.

Besides the model, the node state and the edge-feature cache, a step's tensors, bounded from
above (`step_bytes`): the rows a step embeds (each event's source, destination and negatives),
the neighbours sampled for them, the distinct nodes whose state rows it reads, and on those
every module's tensors as it makes them (`attention_bytes` for the attention layers), all
counted as held at once; in training as much again in their gradients. The steps planned
ahead (`plan_bytes`: their events and neighbour samples) are host memory. A training step and an
evaluation step (more negatives, no gradients) never run at once: the larger of the two counts.
"""
from __future__ import annotations

from typing import Any

import torch

from gnndist.datasets import chronological_split
from gnndist.footprint import Footprint, Part, model_bytes, sizing
from gnndist.samplers.cache import capacity_rows
from gnndist.temporal.models import TemporalGNN, build_model
from gnndist.temporal.modules import GraphAttention, MailboxUpdater, TemporalAttention, TimeProjection
from gnndist.temporal.neighbours import sample_bytes, steps_ahead
from gnndist.temporal.state import NodeState

HOP_ENTRY_BYTES = 8 + 8 + 8 + 4 + 1  # a sampled neighbour: node, event id, time, time gap, mask
F = 4  # bytes of a float32


def attention_bytes(rows: int, keys: int, context: int, key_width: int, dim: int, heads: int,
                    gathered: bool) -> int:
    """`TemporalAttention` over `rows` rows of `keys` keys each (a key: a node part of `key_width`,
    a context part of `context`), out `dim`: the projected queries, their per-head products with
    the key weights (per query input, then per row), the weights, the weighted sums, the value
    and skip maps and their sum; `gathered`: the keys' node parts gathered, as the torch path
    does (the CPU kernel reads them in place)."""
    per_head = 3 * (context + key_width) + keys + 1 + 3 * dim // heads
    return F * rows * (heads * per_head + (keys * key_width if gathered else 0) + 6 * dim)


def step_bytes(model: TemporalGNN, events: Any, cfg: Any, device: torch.device, training: bool,
               served: bool = False) -> int:
    """A step of this rank: its events with `n` negatives each (one in training), the rows they
    embed and sample for, their state rows, the modules' tensors (twice in training: the
    gradients) and the state writes; `served`: it also embeds negatives of other ranks' events."""
    d, dim_e, t, k = model.dim, events.edge_dim, cfg.time_dim, model.k
    parts, n = events.num_parts, 1 if training else cfg.eval_negatives
    batch = min(cfg.batch_size, events.num_events)
    mine = batch if cfg.share == "owner" or parts == 1 else -(-batch // parts)
    queries = mine * (2 + n) + (batch * n if served else 0)
    sampled = queries if model.sampling.rows == "queries" else 2 * mine
    hops = [sampled * k ** h for h in range(1, model.sampling.hops + 1)]  # entries of each hop
    heads = next((m.heads for m in model.modules() if isinstance(m, TemporalAttention)), 1)
    inputs = mine * (4 * 8 + F * dim_e + 8 * n) + queries * 2 * (8 + 8)  # the batch, the rows' nodes and times
    inputs += sum(hops) * (2 * HOP_ENTRY_BYTES + F * dim_e)  # the hops (and their host arrays)
    if parts == 1 and device.type == "cpu":  # the next batch is made while the half process runs
        inputs *= 2
    work = 0
    attention = model.embedding if isinstance(model.embedding, GraphAttention) else model.message_attention
    if attention is not None:
        work += sum(hops) * (3 * F * t + F * (dim_e + t))  # contexts: time encodings, with the features
        layers = len(attention.layers)
        for layer in range(layers):  # layer l embeds levels 0 .. L-1-l: rows `sampled`, then hop entries
            rows = sampled + sum(hops[:layers - 1 - layer])
            keys = d if model.has_memory or layer else 0  # TGAT's inputs: one zero row, no node part
            work += attention_bytes(rows, k, dim_e + t, keys, d, heads, device.type != "cpu")
    if model.has_memory:
        m, box = model.memory.mail_dim, model.memory.mailbox
        rows = min(events.num_nodes, queries + (hops[0] if hops else 0))  # distinct nodes read
        row = F * d + 8 + box * (F * m + 8)
        work += rows * row * (2 if parts > 1 else 1)  # read (where remote: sent and received)
        if isinstance(model.memory.updater, MailboxUpdater):  # each query row attends over its mailbox:
            # its state row gathered twice, its mails' ages (float64, masked) and their time encodings
            work += queries * (2 * row + box * (5 * 8 + 3 * F * t) + 2 * F * d)
            work += attention_bytes(queries + 2 * mine, box, t, m, d, heads, device.type != "cpu")
        else:  # the cell's input (the mail and the time since), its gates, the updated rows
            work += rows * (F * (m + 3 * t) + 16 * F * d)
        work += 2 * rows * F * d + queries * (F * d + 3 * 8)  # both tables of memory rows, the rows picked
        receivers = 2 * mine * (k + 1 if model.memory.to_neighbors else 1)
        write = receivers * (3 * F * m + 8 * 3) + 2 * mine * 3 * F * d  # mails and memories written
        work += write * (2 * parts if parts > 1 else 1)  # where several ranks: every rank's writes, both ways
    if isinstance(model.embedding, TimeProjection):
        work += 3 * queries * F * d
    work += 5 * mine * (1 + n) * F * d  # the link predictor: both halves' maps, their sum, the activation
    return inputs + work * (2 if training else 1)


def plan_bytes(model: TemporalGNN, events: Any, cfg: Any) -> int:
    """Host memory of the steps planned ahead: `steps_ahead` steps (sized for each step's
    queries), at most those of the split being run (training, or the larger of validation and
    test), each with its events, negatives and query rows, and the samples of the rows the model
    samples for (the sampler's arrays, the features and each step's slices: three times them)."""
    ks = [model.k] * model.sampling.hops
    train_end, val_end = chronological_split(events.num_events)
    most = 0
    for per_event, span in ((1, train_end), (cfg.eval_negatives, max(val_end - train_end, events.num_events - val_end))):
        queries = cfg.batch_size * (2 + per_event)
        sampled = queries if model.sampling.rows == "queries" else 2 * cfg.batch_size
        steps = min(steps_ahead(queries, ks, events.edge_dim), -(-span // cfg.batch_size))
        step = cfg.batch_size * (4 * 8 + 8 * per_event + F * events.edge_dim) + queries * 2 * (8 + 8)
        most = max(most, steps * (step + 3 * sample_bytes(sampled, ks, events.edge_dim)))
    return 2 * most if events.num_parts > 1 else most  # several ranks: the next plan is made meanwhile


def link_footprint(events: Any, cfg: Any, device: torch.device = torch.device("cpu"), *_: Any) -> Footprint:
    """What one link-prediction rank allocates for its `RankEvents` and `LinkConfig` (the
    trainer's further arguments allocate nothing sized)."""
    what = f"the {cfg.model} trainer"
    with sizing(what, "--memory-dim"):
        model = build_model(cfg.model, events.edge_dim, cfg.memory_dim, cfg.time_dim, cfg.num_neighbors,
                            mailbox=cfg.mailbox)
        state, partitioned = 0, events.num_parts > 1 and cfg.memory == "partitioned"
        if model.has_memory:
            rows = int(events.book.sizes().max()) if partitioned else events.num_nodes
            s = NodeState(rows, model.dim, model.memory.mail_dim, model.memory.mailbox, device="meta")
            state = sum(t.numel() * t.element_size() for t in (s.memory, s.last_update, s.mail, s.mail_time, s.changed))
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    # beside the step: the best-validation copy of the parameters, and the gradient sum over ranks
    # (sent and received) or, where one process runs a step as two halves, the second half's
    # gradients in shared memory
    extra = params + (2 * params if events.num_parts > 1 else params)
    device = torch.device(device)
    train = extra + step_bytes(model, events, cfg, device, training=True)
    evaluate = step_bytes(model, events, cfg, device, training=False, served=partitioned)
    if train >= evaluate:
        step = Part("a training step's tensors (at most)", train, "--batch-size or --memory-dim")
    else:
        step = Part("an evaluation step's tensors (at most)", evaluate,
                    "--batch-size, --eval-negatives or --memory-dim")
    cache = 0
    if cfg.cache != "none" and events.num_parts > 1 and events.edge_dim:
        row = events.edge_dim * events.edge_feat.itemsize
        cache = capacity_rows(cfg.cache_size, events.num_events - events.num_held, row) * row
    state_flag = "--memory-dim" if events.num_parts == 1 or partitioned else "--memory-dim or use --memory partitioned"
    return Footprint(what, device, [
        Part("model with gradients and Adam state", model_bytes(model), "--memory-dim"),
        Part("node state", state, state_flag), step,
        Part("steps planned ahead", plan_bytes(model, events, cfg), "--batch-size", on_device=False),
        Part("edge-feature cache", cache, "--cache-size", on_device=False)])
