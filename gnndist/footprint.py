"""Whether a trainer's tensors fit in memory, told before they are allocated.

A `Footprint` lists what one rank of a trainer allocates as it starts: the model with its
gradients and Adam state (counted exactly, by building the model on torch's `meta` device),
the node state of memory-based temporal models (likewise), a lower bound on one batch's
neighbour tensors, and the feature cache. `memory_checked` wraps a trainer's `__init__`: it
refuses, with the estimate, a setting that cannot fit in the memory available (shared by the
ranks on this host; the GPU's free memory for CUDA tensors), and turns an allocation that
fails anyway into one line naming what was being built.
"""
from __future__ import annotations

import functools
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import torch

from gnndist.errors import GnndistError, allocating
from gnndist.partition.stats import available_memory_bytes, fmt_bytes
from gnndist.samplers.cache import capacity_rows
from gnndist.static.models import StaticGNN
from gnndist.temporal.models import build_model
from gnndist.temporal.modules import GraphAttention
from gnndist.temporal.state import NodeState

TRAINING_COPIES = 3  # of a trainable parameter, beside itself: its gradient and Adam's two moments
HOP_ENTRY_BYTES = 8 + 8 + 8 + 4 + 1  # a sampled neighbour: node, event id, time, time gap, mask


@dataclass(frozen=True)
class Part:
    """One thing a rank allocates: its bytes, the flag that sizes it, and whether it lives on
    the training device (else in host memory)."""

    label: str
    nbytes: int
    flag: str
    on_device: bool = True


@dataclass
class Footprint:
    """What one rank of a trainer allocates as it starts (see the module docstring)."""

    what: str  # e.g. "the tgn trainer"
    device: torch.device
    parts: list[Part] = field(default_factory=list)

    def summary(self, parts: Optional[list[Part]] = None) -> str:
        """The parts that take memory and their sizes, e.g. "model 1.0 GiB, node state 2.0 MiB"."""
        return ", ".join(f"{p.label} {fmt_bytes(p.nbytes)}" for p in (self.parts if parts is None else parts)
                         if p.nbytes)

    def check(self) -> None:
        """GnndistError with the estimate when the parts cannot fit in the memory available now."""
        gpu = self.device.type == "cuda"
        pools = [([p for p in self.parts if p.on_device], torch.cuda.mem_get_info(self.device)[0], 1,
                  f"free on {self.device}")] if gpu else []
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        pools.append(([p for p in self.parts if not (gpu and p.on_device)], available_memory_bytes(),
                      local_ranks, "available"))
        for parts, avail, ranks, where in pools:
            need = sum(p.nbytes for p in parts)
            if avail is None or need * ranks <= avail:
                continue
            host = f", {fmt_bytes(need * ranks)} for the {ranks} ranks on this host" if ranks > 1 else ""
            biggest = max(parts, key=lambda p: p.nbytes)
            raise GnndistError(f"{self.what} needs an estimated {fmt_bytes(need)} of memory per rank{host} "
                               f"({self.summary(parts)}) but {fmt_bytes(avail)} is {where}; lower {biggest.flag}")


def _model_bytes(model: torch.nn.Module) -> int:
    """Parameters, and the gradients and Adam moments of the trainable ones."""
    return sum(p.numel() * p.element_size() * (1 + TRAINING_COPIES * p.requires_grad) for p in model.parameters())


@contextmanager
def _sizing(what: str, flags: str) -> Iterator[None]:
    """Build on the meta device (shapes only); sizes beyond what torch can count are refused."""
    try:
        with torch.device("meta"):
            yield
    except (RuntimeError, TypeError, OverflowError) as e:  # torch cannot count the elements
        if "overflow" not in str(e).lower():
            raise
        raise GnndistError(f"{what} is too large to allocate on any machine (its sizes overflow 64-bit counts); "
                           f"lower {flags}") from None


def link_footprint(events: Any, cfg: Any, device: torch.device = torch.device("cpu")) -> Footprint:
    """What one link-prediction rank allocates for its `RankEvents` and `LinkConfig`."""
    what = f"the {cfg.model} trainer"
    with _sizing(what, "--memory-dim"):
        model = build_model(cfg.model, events.edge_dim, cfg.memory_dim, cfg.time_dim, cfg.num_neighbors,
                            mailbox=cfg.mailbox)
        state, partitioned = 0, events.num_parts > 1 and cfg.memory == "partitioned"
        if model.has_memory:
            rows = int(events.book.sizes().max()) if partitioned else events.num_nodes
            s = NodeState(rows, model.dim, model.memory.mail_dim, model.memory.mailbox, device="meta")
            state = sum(t.numel() * t.element_size() for t in (s.memory, s.last_update, s.mail, s.mail_time))
    # at least: this rank's portion of an evaluation batch, its queries (src, dst and, where the
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
        Part("model with gradients and Adam state", _model_bytes(model), "--memory-dim"),
        Part("node state", state, state_flag),
        Part("a batch's neighbour tensors (at least)", batch, "--batch-size"),
        Part("edge-feature cache", cache, "--cache-size", on_device=False)])


def node_footprint(graph: Any, cfg: Any, device: torch.device = torch.device("cpu")) -> Footprint:
    """What one node-classification rank allocates for its `RankGraph` and `NodeConfig`."""
    what = f"the {cfg.model} trainer"
    with _sizing(what, "--hidden"):
        model = StaticGNN(cfg.model, graph.num_features, cfg.hidden, graph.num_classes,
                          num_layers=len(cfg.fanouts), dropout=cfg.dropout)
    store = getattr(graph, "store", None)  # the remote features of a part (none in one process)
    cache = 0
    if store is not None and cfg.cache != "none":
        cache = capacity_rows(cfg.cache_size, store.num_remote, store.row_bytes) * store.row_bytes
    return Footprint(what, torch.device(device), [
        Part("model with gradients and Adam state", _model_bytes(model), "--hidden"),
        Part("feature cache", cache, "--cache-size", on_device=False)])


def memory_checked(footprint: Callable[..., Footprint]) -> Callable:
    """Decorate a trainer's `__init__(self, *args)`: before it runs, refuse with the estimate when
    `footprint(*args)` cannot fit; an allocation failing inside it becomes one line naming it."""
    def decorate(init: Callable) -> Callable:
        @functools.wraps(init)
        def checked(self, *args: Any, **kwargs: Any) -> None:
            fp = footprint(*args, **kwargs)
            fp.check()
            with allocating(f"{fp.what} (estimated {fp.summary()})"):
                init(self, *args, **kwargs)
        return checked
    return decorate
