"""Training memory-based TGNNs on W ranks with the semantics of one process.

The events, in time order, are cut into global batches of B. Each rank processes its share of
every batch: `owner` (the events whose source node it owns) or `slice` (a contiguous slice of
the batch). Its loss is the sum over its events divided by the global B and the ranks' gradients
are summed (one all-reduce per step), so every rank takes the step one process would take on the
whole batch. Negatives are drawn per global batch and sliced; neighbours are sampled from the
same events with random streams keyed by node and time, so they equal one process's. Node state
is replicated or partitioned (`gnndist.temporal.dist_state`); node ownership comes from a temporal
partition store.

Every rank holds the event stream (src, dst, t, edge features) in the dataset's own node ids and
samples locally: node state, not the event list, is what outgrows one machine (d = 100 memory
plus 2d mails is about 1.2 KB a node, against 24 bytes an event).
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import MISSING, dataclass, fields, replace
from pathlib import Path
from typing import Iterator, Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor, nn

from gnndist import dist as gdist
from gnndist.temporal.dist_state import PartitionedNodeState, ReplicatedNodeState, pack, unpack
from gnndist.errors import GnndistError
from gnndist.graph import TemporalGraph
from gnndist.partition import load_id_maps, load_partition, read_store_meta
from gnndist.graph import owners
from gnndist.launch import Data, Outputs, Split, run_job
from gnndist.temporal.config import LinkConfig
from gnndist.temporal.trainer import LinkTask, run
from gnndist.temporal.models import Batch, Forward


SPLIT = Split("temporal", "temporal")


def load_store_events(path: str | Path) -> tuple[TemporalGraph, np.ndarray, np.ndarray]:
    """(the whole event stream in the original node ids, node_offsets, orig_to_new) of a temporal
    partition store: each event is read from a part that holds it."""
    meta = read_store_meta(path)
    if meta["kind"] != "temporal":
        raise GnndistError(f"{path} is a partition store of a static graph; --task link needs a temporal one")
    new_to_orig, orig_to_new = load_id_maps(path)
    e = int(meta["num_events"])
    src, dst, t = np.zeros(e, np.int64), np.zeros(e, np.int64), np.zeros(e, np.float64)
    feat = label = None
    seen = np.zeros(e, bool)
    for p in range(int(meta["num_parts"])):
        part = load_partition(path, p)
        src[part.eid], dst[part.eid], t[part.eid] = new_to_orig[part.src], new_to_orig[part.dst], part.t
        if part.edge_feat is not None:
            feat = np.zeros((e, *part.edge_feat.shape[1:]), np.float32) if feat is None else feat
            feat[part.eid] = part.edge_feat
        if part.edge_label is not None:
            label = np.zeros(e, part.edge_label.dtype) if label is None else label
            label[part.eid] = part.edge_label
        seen[part.eid] = True
    if not seen.all():
        raise GnndistError(f"partition store {path} misses {int((~seen).sum())} events: re-run `gnndist partition`")
    tg = TemporalGraph(src, dst, t, feat, label, num_nodes=int(meta["num_nodes"]))
    return tg, np.asarray(meta["node_offsets"], np.int64), orig_to_new


@dataclass
class Share:
    """Which events of a global batch this rank processes."""

    mode: str
    rank: int
    world: int
    owner: np.ndarray  # owning rank of each node id

    def positions(self, src: np.ndarray, start: int) -> np.ndarray:
        """Global event ids of this rank's share of the batch of events `start, start + len(src)`."""
        b = src.size
        if self.mode == "slice":
            return np.arange(start + b * self.rank // self.world, start + b * (self.rank + 1) // self.world)
        return start + np.flatnonzero(self.owner[src] == self.rank)


def owner_of_nodes(node_offsets: np.ndarray, orig_to_new: np.ndarray) -> np.ndarray:
    """Owning rank of every original node id."""
    return owners(orig_to_new, node_offsets).astype(np.int32)


def new_state(model: nn.Module, memory: str, node_offsets: np.ndarray, orig_to_new: np.ndarray,
              start_time: float, device: torch.device):
    """The node state of `model` held across ranks (None for a model without memory)."""
    if not model.has_memory:
        return None
    args = (model.dim, model.mail_dim, model.spec.mailbox)
    if memory == "replicated":
        return ReplicatedNodeState(model.num_nodes, *args, start_time, device)
    return PartitionedNodeState(node_offsets, *args, start_time, device, renumber=torch.from_numpy(orig_to_new))


def sum_gradients(params: Sequence[nn.Parameter]) -> None:
    """Replace each gradient by its sum over the ranks, in one all-reduce. A parameter that no
    rank has a gradient for keeps none (as in one process, the optimizer then skips it)."""
    if gdist.world_size() == 1:
        return
    flat = torch.cat([torch.zeros(p.numel(), device=p.device) if p.grad is None else p.grad.reshape(-1)
                      for p in params] + [torch.tensor([p.grad is not None for p in params],
                                                       dtype=torch.float32, device=params[0].device)])
    gdist.all_reduce(flat)
    at = 0
    for p in params:
        p.grad = flat[at:at + p.numel()].view_as(p).clone()
        at += p.numel()
    for p, has in zip(params, flat[at:].tolist()):
        if not has:
            p.grad = None


PHASES = ("sample", "fetch", "compute", "sync")


class Timers:
    """Seconds per phase: sample, fetch (state reads), sync (gradient all-reduce, state writes);
    compute is the rest of the epoch."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - t0


class TimedState:
    """A node state whose reads count as fetch time and writes as sync time."""

    def __init__(self, state, timers: Timers) -> None:
        self.state, self.timers = state, timers

    def read(self, ids: Tensor):
        with self.timers.phase("fetch"):
            return self.state.read(ids)

    def write(self, *rows: Tensor) -> None:
        with self.timers.phase("sync"):
            self.state.write(*rows)

    def deliver(self, *rows: Tensor) -> None:
        with self.timers.phase("sync"):
            self.state.deliver(*rows)

    def __getattr__(self, name: str):
        return getattr(self.state, name)


def gather_scores(eid: np.ndarray, pos: np.ndarray, neg: np.ndarray, device: torch.device
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Positive [E] and negative [E, n] scores of every rank's events, in global event order
    (gathered through `device`, which the process group's backend must handle)."""
    rows = torch.from_numpy(np.concatenate([eid[:, None].astype(np.float64), pos[:, None].astype(np.float64),
                                            neg.astype(np.float64)], 1)).to(device)
    rows = torch.cat(gdist.all_gather_varsize(rows)).cpu().numpy()
    rows = rows[np.argsort(rows[:, 0], kind="stable")]
    return rows[:, 1].astype(pos.dtype), rows[:, 2:].astype(neg.dtype)


@dataclass
class DistLinkTask(LinkTask):
    """`LinkTask` on one rank of W: its share of every global batch, gradients summed over the
    ranks, scores gathered in event order, and per-epoch traffic and time figures."""

    share: Optional[Share] = None
    memory: str = "replicated"

    def __post_init__(self) -> None:
        self.timers = Timers()
        sample = self.sample

        def timed_sample(*a):
            with self.timers.phase("sample"):
                return sample(*a)
        self.sample = timed_sample
        if self.state is not None:
            self.state = TimedState(self.state, self.timers)
        self.params = list(self.model.parameters())
        self._served: Optional[tuple] = None
        self.embed_bytes = 0
        self._figures: dict[str, float] = {}

    def batch(self, index: int, start: int, stop: int, neg: np.ndarray) -> Batch:
        pos = self.share.positions(self.tg.src[start:stop], start)
        rows = pos - start

        def tensor(a):
            return torch.as_tensor(np.ascontiguousarray(a), device=self.device)
        b = Batch(tensor(self.tg.src[pos]), tensor(self.tg.dst[pos]), tensor(self.tg.t[pos]), tensor(pos),
                  tensor(np.asarray(neg).reshape(stop - start, -1)[rows]))
        if self.state is not None:
            self.state.begin_batch(b.src, b.dst, b.eid)
        return b

    def forward(self, batch: Batch) -> Forward:
        """Scores of this rank's events. With partitioned memory the negatives are embedded by
        their nodes' owners, where their rows and most of their neighbours' rows live: only the
        queries, the embeddings and (in `sync_gradients`) their gradients travel, not the ~k+1
        state rows each negative would need."""
        if self.memory != "partitioned" or self.state is None:
            return self._forward_here(batch)
        b, n = batch.neg.shape
        fw = self._forward_here(replace(batch, neg=batch.neg[:, :0]))
        z_neg = self._embed_at_owners(batch.neg.reshape(-1), batch.t.repeat_interleave(n))
        if b:
            fw.neg = self.model.predictor(fw.embed[:b].repeat_interleave(n, 0), z_neg).view(b, n)
        else:
            fw.neg = torch.zeros((0, n), device=self.device, requires_grad=True)
        return fw

    def _forward_here(self, batch: Batch) -> Forward:
        if batch.src.numel():
            return super().forward(batch)
        # no events here: take part in the state's read collective, score nothing
        fw = Forward(**{f.name: torch.zeros(0, device=self.device) for f in fields(Forward)
                        if f.default is MISSING and f.default_factory is MISSING})
        fw.pos = torch.zeros(0, device=self.device, requires_grad=True)
        fw.neg = torch.zeros(batch.neg.shape, device=self.device, requires_grad=True)
        fw.embed = torch.zeros(0, self.model.dim, device=self.device)
        if self.state is not None:
            fw.ids = batch.src
            fw.memory, fw.last_update, fw.mail, fw.mail_time = self.state.read(fw.ids)
        return fw

    def _embed_at_owners(self, nodes: Tensor, times: Tensor) -> Tensor:
        """Embeddings [Q, d] of the queries (nodes, times), each computed by the node's owner (a
        collective). While training, the served embeddings keep their graphs until the
        requesters send the gradients back."""
        owner = torch.as_tensor(self.share.owner[nodes.cpu().numpy()], dtype=torch.long, device=self.device)
        order = torch.argsort(owner, stable=True)
        sizes = torch.bincount(owner, minlength=self.share.world).tolist()
        asked = gdist.exchange(pack([nodes[order], times[order]]).split(sizes))
        served_sizes = [a.shape[0] for a in asked]
        qn, qt = unpack(torch.cat(asked), [(torch.int64, ()), (torch.float64, ())])
        zero = torch.zeros(qn.numel(), 0, dtype=torch.long, device=self.device)
        served = self._forward_here(Batch(qn, qn, qt, torch.zeros_like(qn), zero)).embed[:qn.numel()]
        back = gdist.exchange(served.detach().split(served_sizes))
        z = torch.empty((nodes.numel(), self.model.dim), device=self.device)
        z[order] = torch.cat(back)
        me, row = self.share.rank, self.model.dim * z.element_size()
        self.embed_bytes += 16 * (sum(sizes) - sizes[me]) + row * (sum(served_sizes) - served_sizes[me])
        if torch.is_grad_enabled():
            z.requires_grad_()
            self._served = (z, order, sizes, served, served_sizes)
        return z

    def _backward_served(self) -> None:
        """Send the gradients of the embeddings this rank asked for back to their owners, which
        backpropagate them through the embeddings they served (a collective)."""
        z, order, sizes, served, served_sizes = self._served
        self._served = None
        grad = torch.zeros_like(z) if z.grad is None else z.grad
        got = torch.cat(gdist.exchange(grad[order].split(sizes)))
        self.embed_bytes += z.shape[1] * z.element_size() * (sum(served_sizes) - served_sizes[self.share.rank])
        if served.requires_grad and served.numel():
            torch.autograd.backward(served, got)

    def write(self, batch: Batch, fw: Forward) -> None:
        if batch.src.numel():
            super().write(batch, fw)
        elif self.model.spec.deliver_to_neighbors:  # no events here: take part in the collective
            none = fw.ids[:0]
            self.state.deliver(none, fw.memory, fw.last_update, none, fw.mail[:, 0], fw.mail_time[:, 0], none)
        elif self.state is not None:
            self.state.write(fw.ids, fw.memory, fw.last_update, fw.mail, fw.mail_time)

    def sync_gradients(self) -> None:
        with self.timers.phase("sync"):
            if self._served is not None:
                self._backward_served()
            sum_gradients(self.params)

    def train_epoch(self, epoch: int) -> float:
        self.timers.reset()
        self.embed_bytes = 0
        if self.state is not None:
            self.state.reset_traffic()
        t0 = time.perf_counter()
        loss = super().train_epoch(epoch)
        seconds = time.perf_counter() - t0
        spent = self.timers.seconds
        spent["compute"] = seconds - spent["sample"] - spent["fetch"] - spent["sync"]
        rows = (self.state.rows_fetched, self.state.bytes_sent) if self.state is not None else (0, 0)
        total = gdist.all_reduce(torch.tensor([loss, *rows, self.embed_bytes, *(spent[p] for p in PHASES)],
                                              dtype=torch.float64, device=self.device)).cpu()
        w, steps = self.share.world, len(range(0, self.train_end, self.batch_size))
        self._figures = {"remote_rows": int(total[1]), "state_bytes": int(total[2]), "embed_bytes": int(total[3]),
                         "bytes": int(total[2] + total[3]),
                         "grad_bytes": w * steps * sum(p.numel() * p.element_size() for p in self.params),
                         **{f"{p}_s": float(total[4 + i]) / w for i, p in enumerate(PHASES)}}
        return float(total[0])

    def figures(self) -> dict[str, float]:
        """Of the last training epoch, all ranks together: node-state rows fetched from other
        ranks, bytes of state rows and of served embeddings (queries, embeddings, gradients)
        sent to other ranks and their sum `bytes`, the gradients' all-reduce payload; and
        seconds per phase (mean over ranks)."""
        return self._figures

    def evaluate(self, start: int, stop: int, negatives: np.ndarray, desc: str) -> tuple[np.ndarray, np.ndarray]:
        pos, neg = super().evaluate(start, stop, negatives, desc)
        eid = [self.share.positions(self.tg.src[s:e], s) for _, s, e in self.batches(start, stop)]
        return gather_scores(np.concatenate(eid) if eid else np.zeros(0, np.int64), pos, neg, self.device)


@dataclass
class World:
    """What makes `temporal_trainer.run` one rank of a distributed run."""

    memory: str
    share: Share
    node_offsets: np.ndarray
    orig_to_new: np.ndarray
    device: torch.device = torch.device("cpu")

    @property
    def rank(self) -> int:
        return self.share.rank

    def new_state(self, model: nn.Module, start_time: float, device: torch.device):
        return new_state(model, self.memory, self.node_offsets, self.orig_to_new, start_time, device)

    def task(self, *args, **kwargs) -> DistLinkTask:
        return DistLinkTask(*args, **kwargs, share=self.share, memory=self.memory)

    def summary(self) -> dict[str, object]:
        return {"world_size": self.share.world, "memory": self.memory, "share": self.share.mode}

    def checkpoint_dir(self, directory: str) -> Path:
        """Each rank keeps its own checkpoint (its node state rows differ)."""
        return Path(directory) / f"rank{self.rank}"

    def check_resume(self, first_epoch: int) -> None:
        """All ranks must resume from the same epoch."""
        if -gdist.agree_max(-first_epoch, self.device) != gdist.agree_max(first_epoch, self.device):
            raise GnndistError("the ranks' checkpoints are of different epochs (a run stopped while writing "
                               "them); resume from an earlier copy or start afresh")


def link_rank(source: Union[TemporalGraph, str], cfg: LinkConfig, outputs: Outputs = Outputs()) -> dict:
    """One rank: the whole graph (one process) or its part of a store; train and evaluate."""
    device = gdist.setup(cfg.device)
    try:
        if isinstance(source, TemporalGraph):
            return run(cfg, outputs, source)
        tg, offsets, orig_to_new = load_store_events(source)
        world = World(cfg.memory, Share(cfg.share, gdist.rank(), gdist.world_size(),
                                        owner_of_nodes(offsets, orig_to_new)), offsets, orig_to_new, device)
        return run(cfg, outputs, tg, world)
    finally:
        gdist.teardown()


def train_link(data: Data, cfg: Optional[LinkConfig] = None, nproc: int = 1, outputs: Outputs = Outputs()) -> dict:
    """Link prediction on `data` (a `TemporalGraph`, a dataset name or path, a `DataSource`, or
    a temporal partition store) with `nproc` local ranks, or as this rank of a torchrun world.
    Returns the metrics (of rank 0, or of this rank under torchrun)."""
    cfg = cfg or LinkConfig()
    return run_job(data, nproc, SPLIT, link_rank, cfg, outputs, device=cfg.device, quiet=cfg.quiet)
