"""One rank of a temporal link-prediction run: `LinkTrainer` holds the model, optimizer, node state,
neighbours and edge features, and runs its steps, epochs and evaluations (`gnndist.temporal.fit`
runs the whole training).

Each rank holds only its part of the events (`RankEvents`: the events touching the nodes it
owns). Global batch i is the events [iB, (i+1)B) in time order; each rank scores the events of
it whose source node it owns, evened out over the ranks (`--share even`), with negatives drawn
per global batch by the owner of the source (`gnndist.temporal.planner`). Its loss is the sum
over its events divided by the global B, and the ranks' gradients are summed (one all-reduce
per step), so every rank takes the step one process takes on the whole batch. Every rank runs
every step, with or without events of its own.

Node state is replicated (all rows on every rank) or partitioned (rows at their owners, read in
one planned exchange per step); with partitioned memory, evaluation has the negatives embedded
by their nodes' owners (`owners_embed_negatives`). One process on several cores runs each batch
as two halves (`gnndist.temporal.split_step`).
"""
from __future__ import annotations

import functools
import math
import time
from typing import Any, Callable, Iterator, NamedTuple, Optional

import numpy as np
import torch
from tqdm import tqdm

from gnndist.resume import EpochClock
from gnndist.errors import GnndistError
from gnndist.footprint import memory_checked
from gnndist.temporal.footprint import link_footprint
from gnndist.io import show_progress
from gnndist.runtime import dist, threads
from gnndist.runtime.device import to_device
from gnndist.temporal import attention, models, time_encoding
from gnndist.temporal.config import LinkConfig
from gnndist.temporal.dist_state import PartitionedNodeState, ReplicatedNodeState
from gnndist.temporal.edge_cache import fill_edge_cache
from gnndist.temporal.events import RankEvents
from gnndist.temporal.linkpred import EvalNegatives, negative_candidates, train_negatives
from gnndist.temporal.models import Batch, Forward, build_model
from gnndist.temporal.neighbours import Neighbours
from gnndist.temporal.planner import Planner
from gnndist.temporal.protocol import Protocol
from gnndist.temporal.split_step import HalfRun, SplitStep, bounds, loss_and_grads
from gnndist.temporal.state import NodeState
from gnndist.temporal.timers import Timers
from gnndist.temporal.traffic import epoch_traffic, rank_metrics, reset_traffic


class Scores(NamedTuple):
    """A rank's scores of a period's events (`LinkTrainer.evaluate`): of the events [P] and of
    their negatives [P, n], with the events' global ids and endpoints (new ids)."""

    pos: np.ndarray
    neg: np.ndarray
    eid: np.ndarray
    src: np.ndarray
    dst: np.ndarray


def scores_of(steps: Iterator[list[HalfRun]]) -> Scores:
    """The `Scores` of a period's evaluated steps (`LinkTrainer.eval_runs`); a negative scores NaN
    where it is the event's destination (where a shorter list of fixed negatives ends)."""
    pos, neg, eid, ends = [], [], [], []
    for runs in steps:
        for r in runs:
            # copies: a half's results may be views of one buffer per step, which a view kept
            # here would keep whole (`HalfProcess`)
            src, dst, _, ids = r.half.on_host()
            pos.append(r.fw.pos.cpu().numpy().copy())
            neg.append(np.where(ids == dst[:, None], np.nan, r.fw.neg.cpu().numpy()))
            eid.append(r.half.eid.cpu().numpy().copy())
            ends.append((src.copy(), dst.copy()))
    src, dst = (np.concatenate(e) for e in zip(*ends))
    return Scores(np.concatenate(pos), np.concatenate(neg), np.concatenate(eid), src, dst)


class Lookahead:
    """An iterator whose next item can be made early, while waiting for something else (`peek`)."""

    _NOT_YET = object()

    def __init__(self, items: Iterator) -> None:
        self._items, self._next = items, self._NOT_YET

    def peek(self) -> Any:
        """The next item (None at the end), made now if not yet, without moving past it."""
        if self._next is self._NOT_YET:
            self._next = next(self._items, None)
        return self._next

    def __iter__(self) -> "Lookahead":
        return self

    def __next__(self) -> Any:
        item, self._next = self.peek(), self._NOT_YET
        if item is None:
            raise StopIteration
        return item


class TimedState:
    """A node state whose reads count as fetch time and writes as sync time."""

    def __init__(self, state: NodeState, timers: Timers) -> None:
        self.state, self.timers = state, timers

    def read(self, *args, **kwargs):
        with self.timers.phase("fetch"):
            return self.state.read(*args, **kwargs)

    def plan(self, *args, **kwargs) -> Any:
        with self.timers.phase("sync"):
            return self.state.plan(*args, **kwargs)

    def write(self, *args, **kwargs) -> None:
        with self.timers.phase("sync"):
            self.state.write(*args, **kwargs)

    def deliver(self, *args, **kwargs) -> None:
        with self.timers.phase("sync"):
            self.state.deliver(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.state, name)


def summed_grads(halves: list[tuple[Optional[torch.Tensor], ...]]) -> list[Optional[torch.Tensor]]:
    """Each parameter's gradient summed over the halves (one or two), in half order, added into
    the first half's (its own backward pass made them: cheaper than new sums). None where no
    half has one."""
    if len(halves) == 1:
        return list(halves[0])
    first, second = halves
    both = [i for i, (a, b) in enumerate(zip(first, second)) if a is not None and b is not None]
    torch._foreach_add_([first[i] for i in both], [second[i] for i in both])
    return [b if a is None else a for a, b in zip(first, second)]


def new_state(model: torch.nn.Module, events: RankEvents, memory: str, start_time: float, device: torch.device):
    """The model's node state on this rank (None for a model without memory): all N rows (one
    process, or `replicated`) or the owned rows (`partitioned`)."""
    if not model.has_memory:
        return None
    args = (model.dim, model.memory.mail_dim, model.memory.mailbox, start_time, device)
    if events.num_parts == 1:
        return NodeState(events.num_nodes, *args)
    if memory == "replicated":
        return ReplicatedNodeState(events.num_nodes, *args)
    return PartitionedNodeState(events.book, *args)


class LinkTrainer:
    """Model, optimizer, node state, neighbours and edge features of one rank, and the synchronous
    steps, epochs and evaluations (all ranks call every method together)."""

    @memory_checked(link_footprint)
    def __init__(self, events: RankEvents, cfg: LinkConfig, device: torch.device = torch.device("cpu"),
                 protocol: Optional[Protocol] = None) -> None:
        if events.num_parts != dist.world_size():
            raise GnndistError(f"the events are of a {events.num_parts}-part store but {dist.world_size()} ranks run")
        self.events, self.cfg, self.device = events, cfg, device
        self.protocol = Protocol.of(events.num_events) if protocol is None else protocol  # split, fixed negatives
        self.train_end, self.val_end = self.protocol.train_end, self.protocol.val_end
        if self.train_end < 1 or self.val_end <= self.train_end or self.val_end >= events.num_events:
            raise GnndistError(f"{events.num_events} events are too few for a 70/15/15 split")
        torch.manual_seed(cfg.seed)  # identical initial parameters on every rank
        self.model = build_model(cfg.model, events.edge_dim, cfg.memory_dim, cfg.time_dim, cfg.num_neighbors,
                                 mailbox=cfg.mailbox, sampling=cfg.sampling).to(device)
        self.params = [p for p in self.model.parameters() if p.requires_grad]  # the fixed time encoders have none
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr, fused=True)
        self.timers = Timers(device)
        self.progress = dist.rank() == 0 and show_progress(cfg.quiet)
        self.neighbours = Neighbours(events, self.model.sampling.strategy, cfg.seed, self.timers, device,
                                     self.progress, cfg.cache)
        self._load_kernels()
        start = -float(dist.all_reduce(torch.tensor([-float(events.t.min(initial=np.inf))], dtype=torch.float64,
                                                    device=device), "max"))
        state = new_state(self.model, events, cfg.memory, start, device)
        self.partitioned = cfg.memory == "partitioned" and state is not None and events.num_parts > 1
        self.planner = Planner(events, self.model, cfg, self.neighbours, None, self.timers, self.partitioned,
                               self.owners_embed_negatives)
        self.halves = threads.step_halves() if device.type == "cpu" and events.num_parts == 1 else 1
        self.split = SplitStep(self.model, None, self.params, lambda half, fw: self.model.write(self.state, half, fw))
        self.set_state(state)
        self.cache_counters: dict[str, int] = {}
        self.on_loss: Optional[Callable[[float], None]] = None  # called with each training step's global loss
        self.on_step: Optional[Callable[[int], None]] = None  # called after each training step: its epoch's steps done
        # of the epoch in progress: epoch, steps done, their loss summed over events (resumed from
        # a checkpoint by `train_epoch`), and its clock
        self.epoch_state: Optional[dict[str, Any]] = None
        self.clock = EpochClock(self.cpu_seconds)
        self.candidates = negative_candidates(events, self.train_end)  # of random negatives: all nodes or destinations
        fill_edge_cache(cfg, self.planner, self.train_end, self.candidates.train)

    def set_state(self, state: Optional[NodeState]) -> None:
        """Train and evaluate on `state` (the node state `new_state` makes, or one of its kind)."""
        self.state = None if state is None else TimedState(state, self.timers)
        self.planner.state, self.split.state = self.state, state
        # the data's own ids of its rows (what a checkpoint keys them by)
        self.held_orig = None if state is None else torch.from_numpy(self.events.new_to_orig[state.held_ids()])

    def _load_kernels(self) -> None:
        """The numba kernels a step runs, compiled (first run on a machine) or loaded now, not in
        the first epoch."""
        self.neighbours.sampler.load_kernels()
        models.load_kernel()
        if self.device.type == "cpu":
            attention.load_kernels()
            time_encoding.load_kernel()

    @property
    def steps_per_epoch(self) -> int:
        """Training steps (global batches) in one epoch."""
        return len(range(0, self.train_end, self.cfg.batch_size))

    def batches(self, start: int, stop: int) -> Iterator[tuple[int, int, int]]:
        """(index, first, last + 1) of the global batches over the events [start, stop)."""
        return self.planner.batches(start, stop)

    def batch(self, start: int, stop: int, negatives: Optional[Callable] = None) -> Batch:
        """This rank's batch [start, stop), sampled now (`Planner.batch`; a collective)."""
        return self.planner.batch(start, stop, negatives)

    # ------------------------------------------------------------------------------ one step

    def owners_embed_negatives(self) -> bool:
        """Whether `forward` has the negatives embedded by their nodes' owners: with partitioned
        memory, outside training. A training step embeds its negatives itself: their state rows
        and their neighbours' rows come in the step's one read, planned ahead, while embeddings
        made elsewhere and their gradients depend on the parameters and would cost two more
        round trips per step. Evaluation draws 10 negatives per event and has no gradients:
        there one round trip moves an embedding per negative instead of the state rows of the
        negative and its neighbours."""
        return self.partitioned and not torch.is_grad_enabled()

    def forward(self, batch: Batch) -> Forward:
        """Scores of this rank's events of the batch (a collective). Negatives routed to their
        owners (`batch.route`) are embedded there, where their rows and most of their
        neighbours' rows live, in the same pass as the owners' own events: only the queries and
        the embeddings travel."""
        r = batch.route
        if r is None:
            return self.model(self.state, batch)
        b, n = batch.neg.shape
        rows = batch.rows
        fw = self.model.embed(self.state, to_device(rows[0], self.device), to_device(rows[1], self.device), 2 * b,
                              batch.hops, rows)
        with self.timers.phase("sync"):
            back = dist.exchange(fw.embed[2 * b:].detach().split(r.recv_sizes), recv_sizes=r.send_sizes)
        z_neg = dist.joined(back).index_select(0, to_device(np.argsort(r.order), self.device))  # in the negatives' order
        fw.pos, fw.neg = self.model.score(fw.embed[:b], fw.embed[b:2 * b], z_neg, n)
        return fw

    def run_batch(self, batch: Batch, global_batch: Optional[int] = None, ahead: Optional[Lookahead] = None
                  ) -> list[HalfRun]:
        """Forward pass of the batch and, given the global batch size, its loss and gradients: as
        one half, whose state writes are left to `write`, or as two (`SplitStep.run`, which
        writes both). Within a `provisional` block of the node state, one half: the block undoes
        the writes made here only. `ahead`: the coming (size, batch) items."""
        if (self.halves == 1 or batch.route is not None or len(bounds(batch.src.numel(), 2)) < 2
                or (self.state is not None and self.state.provisional_open)):
            self.split.settle()
            fw = self.forward(batch)
            return [HalfRun(batch, fw, *loss_and_grads(fw, global_batch, self.params))]
        return self.split.run(batch, global_batch, None if ahead is None else ahead.peek)

    def write(self, runs: list[HalfRun]) -> None:
        """The state writes of a batch run as one half (`run_batch` makes those of two)."""
        if len(runs) == 1:
            self.model.write(self.state, runs[0].half, runs[0].fw)

    def step(self, batch: Batch, global_batch: int, ahead: Optional[Lookahead] = None
             ) -> tuple[float, list[HalfRun]]:
        """Forward and backward, state writes, summed gradients, optimizer step: the global loss,
        and this rank's runs of the batch's halves (`ahead`: as `run_batch`'s)."""
        runs = self.run_batch(batch, global_batch, ahead)
        for p, g in zip(self.params, summed_grads([r.grads for r in runs])):
            p.grad = g
        summed = dist.GradientSum(self.params, functools.reduce(torch.add, [r.loss for r in runs]).reshape(1))
        with dist.carrying(summed):  # the state writes need no parameters: they go first, with the sum
            self.write(runs)
        with self.timers.phase("sync"):
            total = float(summed.result()[0])
        if not math.isfinite(total):
            self.split.settle()
            raise GnndistError(f"the training loss became {total}; try a smaller --lr, or scale the data "
                               f"(this rank's: {self.events.scale()})")
        if self.cfg.clip_grad is not None:  # the summed gradient: the same on every rank
            torch.nn.utils.clip_grad_norm_(self.params, self.cfg.clip_grad)
        self.optimizer.step()
        self.split.settle()
        return total, runs

    # ------------------------------------------------------------------------------ epochs

    def reset_state(self) -> None:
        if self.state is not None:
            self.state.reset()

    def cpu_seconds(self) -> float:
        """CPU time of this rank's process and its half processes."""
        return time.process_time() + self.split.cpu_seconds

    def _bar(self, total: int, desc: str) -> tqdm:
        return tqdm(total=total, desc=desc, unit="ev", leave=False, disable=not self.progress)

    @threads.job_threads()
    def train_epoch(self, epoch: int) -> dict[str, Any]:
        """One pass over the training events from a reset state (or, where `epoch_state` is of this
        epoch, from the step it resumes at, the node state as loaded); the epoch's metrics (all
        ranks)."""
        cfg = self.cfg
        self.model.train()
        at = self.epoch_state if self.epoch_state is not None and self.epoch_state["epoch"] == epoch else None
        if at is None:
            self.reset_state()
        reset_traffic(self.timers, self.neighbours, None if self.state is None else self.state.state)
        lr = cfg.lr if cfg.lr_schedule == "constant" else cfg.lr * 0.5 * (1 + math.cos(math.pi * (epoch - 1) / cfg.epochs))
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        first, total = (0, 0.0) if at is None else (at["step"], at["loss_sum"])
        self.clock.start(at)
        k0 = dist.collectives_entered()
        n = self.events.num_nodes
        try:  # an epoch left on an error is not continued: the next starts from a reset state
            with self._bar(self.train_end, f"epoch {epoch}") as bar:
                bar.update(min(first * cfg.batch_size, self.train_end))
                ahead = Lookahead(self.planner.steps(0, self.train_end, lambda index, size, rows, src, dst:
                                                     train_negatives(cfg.seed, epoch, index, size, rows, dst, n,
                                                                     self.candidates.train),
                                                     per_event=1, first=first))
                for step, (size, batch) in enumerate(ahead, first + 1):
                    loss = self.step(batch, size, ahead)[0]
                    total += loss * size
                    self.epoch_state = {"epoch": epoch, "step": step, "loss_sum": total}
                    if self.on_loss is not None:
                        self.on_loss(loss)
                    bar.update(size)
                    if self.on_step is not None:
                        self.on_step(step)
            self.timers.wait()
            seconds, cpu = self.clock.elapsed()
        finally:
            self.epoch_state = None
        self.cache_counters = dict(self.neighbours.features.counters)
        grads = self.events.num_parts * self.steps_per_epoch * sum(p.numel() * p.element_size() for p in self.params)
        return {"epoch": epoch, "loss": total / self.train_end, "lr": lr, "time_s": seconds,
                "cpu_s": cpu, "events_per_s": self.train_end / seconds,
                "collectives_per_step": (dist.collectives_entered() - k0) / max(self.steps_per_epoch - first, 1),
                **epoch_traffic(self.timers, self.neighbours, None if self.state is None else self.state.state,
                                seconds, grads if self.events.num_parts > 1 else 0, self.cfg.num_neighbors,
                                self.device)}

    @threads.job_threads()
    @torch.no_grad()
    def evaluate(self, start: int, stop: int, desc: str, score: bool = True) -> Scores:
        """`Scores` of the events in [start, stop) this rank scored; the node state absorbs the
        true events as it goes. `score=False` replays the events through the memory without
        negatives ([P, 0] of them). Negatives: the protocol's fixed ones of the period (TGB's),
        else drawn (`EvalNegatives`); a negative score is NaN where a shorter list of fixed ones
        ends (MRR counts only the others)."""
        ev, cfg = self.events, self.cfg
        negatives, n = None, 0
        if score:
            negatives = self.protocol.fixed_negatives(start, stop, cfg.batch_size) or EvalNegatives(
                ev.new_to_orig[ev.src[ev.scored]], ev.new_to_orig[ev.dst[ev.scored]], ev.scored_eid, ev.num_nodes,
                start, stop, cfg.neg, cfg.eval_negatives, cfg.seed, self.candidates.eval)
            n = negatives.n
        return scores_of(self.eval_runs(start, stop, desc, None if negatives is None else negatives.batch, n))

    def eval_runs(self, start: int, stop: int, desc: str, negatives: Optional[Callable[..., np.ndarray]] = None,
                  n: int = 0) -> Iterator[list[HalfRun]]:
        """This rank's runs of each global batch of the events [start, stop) in evaluation mode
        (`Planner.steps`' `negatives`, `n` per event), once the node state has absorbed the
        batch (a collective; call under `torch.no_grad`)."""
        self.model.eval()
        with self._bar(stop - start, desc) as bar:
            ahead = Lookahead(self.planner.steps(start, stop, negatives, n))
            for size, batch in ahead:
                runs = self.run_batch(batch, ahead=ahead)
                self.write(runs)
                self.split.settle()
                yield runs
                bar.update(size)

    def rank_metrics(self) -> list[dict[str, Any]]:
        """What each rank holds (`traffic.rank_metrics`; a collective)."""
        return rank_metrics(self.events, None if self.state is None else self.state.state, self.neighbours,
                            self.cache_counters, self.device)
