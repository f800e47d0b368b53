"""Link prediction on a temporal graph (`gnndist train DATA --task link`) on one rank or W: the
training loop, model selection, distributed evaluation, checkpoints.

Each rank holds only its part of the events (`RankEvents`: the events touching the nodes it
owns). Global batch i is the events [iB, (i+1)B) in time order; each rank scores the events of
it whose source node it owns, evened out over the ranks (`share`, `even_out`), with negatives
drawn per global batch by the owner of the source. Its loss is the sum over
its events divided by the global B, and the ranks' gradients are summed (one all-reduce per
step), so every rank takes the step one process takes on the whole batch. Every rank runs every
step, with or without events of its own.

A node's temporal neighbours are sampled by its owner (`Neighbours`), which sends the sampled
events' features with them; with an edge cache they come from `DistFeatures` instead (read in
place for held events, else fetched from the owner that sampled them, behind the cache). The
samples of a window of steps are taken at once, ahead of them: one exchange per hop per window.
Node state is replicated (all rows on every rank) or partitioned (rows at their owners, read in
one planned exchange per step); with partitioned memory, evaluation has the negatives embedded
by their nodes' owners (`owners_embed_negatives`).

Chronological 70/15/15 split. Each epoch resets the node state, trains on the training events,
then validates while the memory keeps absorbing the true events. Training stops after `epochs`
or when validation AP has not improved for `patience` epochs; the best-validation parameters
are then restored, the training and validation events replayed through their memory, and the
test events scored.
"""
from __future__ import annotations

import copy
import functools
import math
import resource
import sys
import time
from collections import deque
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple, Optional, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

from gnndist import checkpoint
from gnndist.runtime import dist, threads
from gnndist.datasets import chronological_split
from gnndist.runtime.device import to_device
from gnndist.errors import GnndistError
from gnndist.footprint import memory_checked
from gnndist.temporal.footprint import link_footprint
from gnndist.graph import TemporalGraph
from gnndist.io import show_progress
from gnndist.outputs import write_metrics
from gnndist.runtime.launch import Data, Outputs, Split, run_job
from gnndist.validate import check_type
from gnndist.partition import load_id_maps, load_partition
from gnndist.runlog import RunLog
from gnndist.samplers import PrefetchLoader, hit_rate, sampler_group
from gnndist.samplers.distributed import Requests
from gnndist.samplers.distributed import StepRequests
from gnndist.temporal import attention, models, time_encoding
from gnndist.temporal.config import LinkConfig
from gnndist.temporal.dist_state import PartitionedNodeState, ReplicatedNodeState
from gnndist.temporal.events import BatchEvents, RankEvents, even_out
from gnndist.temporal.linkpred import EvalNegatives, link_metrics, train_negatives
from gnndist.temporal.models import Batch, Forward, Hop, build_model, query_rows, state_rows
from gnndist.temporal.neighbours import Neighbours
from gnndist.temporal.remote_negatives import embedded_rows, route_negatives
from gnndist.temporal.half_process import Placement, HalfProcess, in_shared_memory
from gnndist.temporal.split_step import bounds, from_wire, query_positions, half_batch, half_hops, to_wire
from gnndist.temporal.state import NodeState
from gnndist.temporal.timers import PHASES, Timers

SPLIT = Split("temporal", "temporal")


def batch_loss(fw: Forward, global_batch: int) -> Tensor:
    """Binary cross-entropy summed over the positives and negatives, divided by the GLOBAL
    batch size, so that ranks holding parts of one batch add up to the whole batch's loss."""
    return (F.binary_cross_entropy_with_logits(fw.pos, torch.ones_like(fw.pos), reduction="sum")
            + F.binary_cross_entropy_with_logits(fw.neg, torch.zeros_like(fw.neg), reduction="sum")) / global_batch


class Scores(NamedTuple):
    """A rank's scores of a period's events (`LinkTrainer.evaluate`): of the events [P] and of
    their negatives [P, n], with the events' global ids and endpoints (new ids)."""

    pos: np.ndarray
    neg: np.ndarray
    eid: np.ndarray
    src: np.ndarray
    dst: np.ndarray


class HalfRun(NamedTuple):
    """A half of a batch run (`LinkTrainer.run_batch`): its events, its `Forward` (of a half
    run in its own process: the scores and query embeddings only) and, in training, its loss and
    gradients (None where a parameter has none; after `LinkTrainer.step`, the first half's are
    the step's summed gradients, the parameters' `grad`)."""

    share: Batch
    fw: Forward
    loss: Optional[Tensor] = None
    grads: Optional[tuple[Optional[Tensor], ...]] = None


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


class Staged(NamedTuple):
    """The next batch and its neighbours, made during a step (`LinkTrainer.run_batch`), and, where
    its second half is to run in the half process, that share's work (else None; sent ahead to
    the process running then, which says whether it still holds it: `HalfProcess.staged`)."""
    batch: Batch
    hops: list[Hop]
    second: Optional[tuple]


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


def summed_grads(shares: list[tuple[Optional[Tensor], ...]]) -> list[Optional[Tensor]]:
    """Each parameter's gradient summed over the halves (one or two), in half order, added into
    the first half's (its own backward pass made them: 23 us for UCI TGN's against 54 for new
    sums). The same sum every run; the pairs in one call; None where no share has one."""
    if len(shares) == 1:
        return list(shares[0])
    first, second = shares
    both = [i for i, (a, b) in enumerate(zip(first, second)) if a is not None and b is not None]
    torch._foreach_add_([first[i] for i in both], [second[i] for i in both])
    return [b if a is None else a for a, b in zip(first, second)]


def _wired(work: tuple) -> tuple:
    """A half's work (`LinkTrainer._half_work`) as the half process is sent it (`to_wire`)."""
    (share, hops), global_batch, training = work
    return to_wire(share, hops), global_batch, training


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


def peak_rss_bytes() -> int:
    """This process's peak resident memory."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class LinkTrainer:
    """Model, optimizer, node state, sampler and edge features of one rank, and the synchronous
    training and evaluation loops (all ranks call every method together)."""

    @memory_checked(link_footprint)
    def __init__(self, events: RankEvents, cfg: LinkConfig, device: torch.device = torch.device("cpu")) -> None:
        if events.num_parts != dist.world_size():
            raise GnndistError(f"the events are of a {events.num_parts}-part store but {dist.world_size()} ranks run")
        self.events, self.cfg, self.device = events, cfg, device
        self.train_end, self.val_end = chronological_split(events.num_events)
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
        # the numba kernels a step runs, compiled (first run on a machine) or loaded now, not in the first epoch
        self.neighbours.sampler.load_kernels()
        models.load_kernel()
        if device.type == "cpu":
            attention.load_kernels()
            time_encoding.load_kernel()
        start = float(events.t.min(initial=np.inf))
        start = -float(dist.all_reduce(torch.tensor([-start], dtype=torch.float64, device=device), "max"))
        state = new_state(self.model, events, cfg.memory, start, device)
        self.state = None if state is None else TimedState(state, self.timers)
        self.partitioned = cfg.memory == "partitioned" and state is not None and events.num_parts > 1
        self.halves = threads.step_halves() if device.type == "cpu" and events.num_parts == 1 else 1
        self.half_process: Optional[HalfProcess] = None  # forked by the first step run as two halves
        self._writing = False  # whether the half process is making state writes
        self._fork_failed = False  # then this rank runs both halves of each step
        self._dropped_cpu = 0.0  # CPU time of share processes dropped after an error
        self.placements = {True: Placement(), False: Placement()}  # where second halves run, training and not
        self._kept: Optional[tuple[Batch, Forward]] = None  # in the half process: the share it ran last
        self._staged: Optional[Staged] = None  # of the next batch
        self._second_grads: list[Tensor] = []  # the half process's gradients, in shared memory
        self._routes: deque[StepRequests] = deque()  # of the coming evaluation steps' served negatives
        self.cache_counters: dict[str, int] = {}
        self.on_loss: Optional[Callable[[float], None]] = None  # called with each training step's global loss
        self._set_cache()

    # ------------------------------------------------------------------------------ batches

    @property
    def steps_per_epoch(self) -> int:
        """Training steps (global batches) in one epoch."""
        return len(range(0, self.train_end, self.cfg.batch_size))

    def batches(self, start: int, stop: int) -> Iterator[tuple[int, int, int]]:
        """(index, first, last + 1) of the global batches over the events [start, stop)."""
        b = self.cfg.batch_size
        for index, s in enumerate(range(start, stop, b)):
            yield index, s, min(s + b, stop)

    def events_of(self, start: int, stop: int, negatives: Optional[Callable] = None) -> BatchEvents:
        """This rank's events of the global batch [start, stop) as host arrays, with
        `negatives(rows, src, dst)` [B, n] of them (positions in the global batch and endpoints,
        all in original ids; None: no negatives)."""
        ev = self.events
        pos = ev.scored_in(start, stop)
        if negatives is None:
            neg = np.zeros((pos.size, 0), np.int64)
        else:
            neg = ev.orig_to_new[negatives(ev.eid[pos] - start, ev.new_to_orig[ev.src[pos]], ev.new_to_orig[ev.dst[pos]])]
        feat = ev.edge_feat[pos] if ev.edge_feat is not None else np.zeros((pos.size, 0), np.float32)
        return BatchEvents(ev.src[pos], ev.dst[pos], ev.t[pos], neg, ev.eid[pos], feat)

    def on_device(self, events: BatchEvents) -> Batch:
        """`events` as a `Batch` on the device; the node state learns which events it scores."""
        batch = Batch(*(to_device(a, self.device) for a in (events.src, events.dst, events.t, events.eid, events.feat,
                                                            events.neg)), host=(events.src, events.dst, events.t, events.neg))
        if self.state is not None:
            self.state.begin_batch(events.src, events.dst, events.eid)
        return batch

    def batch(self, start: int, stop: int, negatives: Optional[Callable] = None) -> Batch:
        """This rank's events of the global batch [start, stop) on the device (`events_of`)."""
        return self.on_device(self.events_of(start, stop, negatives))

    def steps(self, start: int, stop: int, negatives: Optional[Callable] = None, per_event: int = 0
              ) -> Iterator[tuple[int, Batch]]:
        """(size, this rank's batch) of each global batch over the events [start, stop), in order;
        `negatives(index, size, rows, src, dst)` gives the `per_event` negatives of each event of
        batch `index` (see `events_of`). What depends on the events only is exchanged for a
        window of batches at once, ahead of them (`_plan_window`): the neighbours
        (`Neighbours.plan`, one exchange per hop), the state rows' counts and routes (`plan` of
        the node state) and, where `forward` serves negatives, where each is embedded
        (`served.route`). With several ranks a thread plans the coming windows while the steps
        run, on the samplers' group, at the lowest priority (`PrefetchLoader`'s `idle`): it runs
        while the step waits for the other ranks, and the step waits for it (timed as `sample`,
        or as `sync` without neighbours to sample) only where it is not done in time."""
        model, todo = self.model, list(self.batches(start, stop))
        ks = [model.k] * model.sampling.hops
        # sized for the queries of a full batch (every rank sizes it alike): 3 per event in training
        # (32 steps a window at batch 200, k = 10, 8 edge features), 12 in an evaluation with 10
        # negatives (11 steps)
        window = self.neighbours.steps_ahead(self.cfg.batch_size * (2 + per_event), ks)
        chunks = [todo[w:w + window] for w in range(0, len(todo), window)]
        threaded, serve = dist.world_size() > 1, self.owners_embed_negatives()  # one process plans inline

        def plan(chunk: list[tuple[int, int, int]]) -> tuple:
            with self.timers.untimed() if threaded else nullcontext():
                return self._plan_window(chunk, negatives, ks, serve)

        windows = iter(PrefetchLoader(chunks, plan, enabled=threaded, idle=True))
        try:
            while True:
                # the wait for the plan: for the samples, else for the exchanges of the state's plan
                with self.timers.phase("sample" if ks else "sync") if threaded else nullcontext():
                    window = next(windows, None)
                if window is None:
                    return
                chunk, events, routes, neighbours, state = window
                self._routes = routes
                self.neighbours.use(neighbours)
                if self.state is not None:
                    self.state.use(state)
                for (_, s, e), ev in zip(chunk, events):
                    yield e - s, self.on_device(ev)
        finally:
            windows.close()

    def _plan_window(self, chunk: list[tuple[int, int, int]], negatives: Optional[Callable], ks: list[int],
                     serve: bool) -> tuple:
        """The events of a window of global batches and what depends on them only, exchanged for
        all of them at once (collectives on the samplers' group): (chunk, events, routes of
        served negatives, `Neighbours.plan`, the node state's plan)."""
        model = self.model
        events = [self.events_of(s, e, None if negatives is None else partial(negatives, index, e - s))
                  for index, s, e in chunk]
        if self.cfg.share == "even" and dist.world_size() > 1:
            events = even_out(events, self.events.book, sampler_group())
        rows = [query_rows(ev.src, ev.dst, ev.t, ev.neg) for ev in events]
        routes = deque()
        if serve:
            routes = deque(self._route([(ev.neg, ev.t) for ev in events]))
            rows = [embedded_rows(ev.src, ev.dst, ev.t, r) for ev, r in zip(events, routes)]
        planned, hops = deque(), [[]] * len(events)
        if ks:
            planned = self.neighbours.plan([model.neighbour_queries(*r, 2 * ev.src.size)[:2]
                                            for r, ev in zip(rows, events)], ks)
            hops = [h for _, h in planned]
        state = None
        if self.state is not None:
            reads = ([state_rows(r[0], h[0][0].nbr if h else None)[0] for r, h in zip(rows, hops)]
                     if self.partitioned else None)  # only partitioned reads travel
            state = self.state.plan([np.unique(np.concatenate([ev.src, ev.dst])) for ev in events], reads)
        return chunk, events, routes, planned, state

    def _route(self, negatives: list[tuple[np.ndarray, np.ndarray]]) -> list[StepRequests]:
        """Where the negatives of steps are embedded (`served.route`; a collective)."""
        with self.timers.phase("sync"):
            return route_negatives(negatives, self.events.book, sampler_group())

    # ------------------------------------------------------------------------------ one step

    def owners_embed_negatives(self) -> bool:
        """Whether `forward` has the negatives embedded by their nodes' owners: with partitioned
        memory, outside training. A training step embeds its negatives itself: their state rows
        and their neighbours' rows come in the step's one read, planned ahead, while served
        embeddings and their gradients depend on the parameters and would cost two more round
        trips per step. Evaluation draws 10 negatives per event and has no gradients: serving
        them costs one round trip and moves an embedding per negative instead of the state rows
        of the negative and its neighbours."""
        return self.partitioned and not torch.is_grad_enabled()

    def forward(self, batch: Batch) -> Forward:
        """Scores of this rank's events of the batch (a collective). Served negatives
        (`owners_embed_negatives`) are embedded by their nodes' owners, where their rows and most of
        their neighbours' rows live, in the same pass as the owners' own events: only the
        queries and the embeddings travel."""
        if not self.owners_embed_negatives():
            return self.model(self.state, batch, self.neighbours)
        b, n = batch.neg.shape
        src, dst, t, neg = batch.on_host()  # the queries travel as host data, on the gloo group
        r = self._routes.popleft() if self._routes else self._route([(neg, t)])[0]  # routed ahead by `steps`
        if r.order.size != neg.size:
            raise RuntimeError("the batch's negatives are not the ones routed for it")
        host = embedded_rows(src, dst, t, r)
        fw = self.model.embed(self.state, to_device(host[0], self.device), to_device(host[1], self.device), 2 * b,
                              self.neighbours, host)
        served = fw.embed[2 * b:]
        with self.timers.phase("sync"):
            back = dist.exchange(served.detach().split(r.recv_sizes), recv_sizes=r.send_sizes)
        z_neg = dist.joined(back).index_select(0, to_device(np.argsort(r.order), self.device))  # in the negatives' order
        fw.pos, fw.neg = self.model.score(fw.embed[:b], fw.embed[b:2 * b], z_neg, n)
        return fw

    def run_batch(self, batch: Batch, global_batch: Optional[int] = None, ahead: Optional[Lookahead] = None
                  ) -> list[HalfRun]:
        """Forward pass of the batch and, given the size of the global batch, the loss and its
        gradients, as the batch's halves (`gnndist.temporal.split_step`) in time order. Run as one
        share, its state writes are left to `write`. Run as two, the second half runs in the
        half process (`gnndist.temporal.half_process`) or after the first, as `placements` has
        it, and both halves' state writes are made (in the half process's case, its own left
        under way: `settle` waits for it). Within a `provisional` block of the node state, one
        share: the block undoes the writes made here only. Given `ahead` (the coming (size,
        batch) items, run the same way), the next batch is made while the half process runs,
        with its neighbours, and its second half is sent (`stage`) if it runs there too."""
        self.settle()  # a step that raised after its run may have left the half process writing
        staged, self._staged = self._staged, None
        staged = staged if staged is not None and staged.batch is batch else None
        b, n = batch.neg.shape
        provisional = self.halves > 1 and self.state is not None and self.state.provisional_open
        cuts = bounds(b, 1 if provisional else self.halves)
        if len(cuts) <= 1:  # also where negatives are served: those ranks run one half
            fw = self.forward(batch)
            return [HalfRun(batch, fw, *self._gradients(fw, global_batch))]
        hops = self._hops(batch) if staged is None else staged.hops
        start, ahead_s, place = time.perf_counter(), 0.0, self.placements[global_batch is not None]
        if staged is not None and staged.second is not None:
            remote, second = True, staged.second
        else:  # where staged, the placement had it run here
            remote = staged is None and place.remote() and not self._fork_failed
            second = self._half_work(batch, hops, cuts[1], global_batch)
        forked = remote and self.half_process is None
        try:
            remote = remote and self._half_process() is not None
            if remote and staged is not None and self.half_process.staged:  # not if forked anew since
                self.half_process.start_staged()
            elif remote:  # sent before the first half is cut: it starts sooner
                self.half_process.start(_wired(second))
            first = self._half_work(batch, hops, cuts[0], global_batch)
            runs = [HalfRun(first[0][0], *self._run_half(first))]
            if remote:
                self.half_process.wait_ready()  # its state rows are read: the first half's may be written
                self.model.write(self.state, runs[0].share, runs[0].fw)
                self.half_process.start_write()
                self._writing = True
                if ahead is not None:  # not this step's time: the step run here makes the next batch after it
                    ahead_s = time.perf_counter()
                    self._stage(ahead.peek(), global_batch is not None)
                    ahead_s = time.perf_counter() - ahead_s
                (pos, neg, embed), loss, present = self.half_process.result()
                grads = None if present is None else tuple(  # never p.grad itself: the next step rewrites it
                    None if not has else g if mine is not None else g.clone()
                    for g, has, mine in zip(self._second_grads, present, runs[0].grads))
                runs.append(HalfRun(second[0][0], Forward(pos=pos, neg=neg, embed=embed), loss, grads))
            else:
                runs.append(HalfRun(second[0][0], *self._run_half(second)))
                for r in runs:
                    self.model.write(self.state, r.share, r.fw)
        except BaseException:
            self._drop_half_process()
            raise
        if not forked:
            place.took(remote, time.perf_counter() - start - ahead_s, b)
        return runs

    def _hops(self, batch: Batch) -> list[Hop]:
        """The sampled neighbours of the batch's query rows (planned ahead by `steps`)."""
        nodes, times, ks = self.model.neighbour_queries(*query_rows(*batch.on_host()), 2 * batch.src.numel())
        return self.neighbours(nodes, times, ks) if ks else []

    def _half_work(self, batch: Batch, hops: list[Hop], cut: tuple[int, int], global_batch: Optional[int]
                    ) -> tuple:
        """The work of a half (`_run_half`): the events lo .. hi-1 of the batch (`cut`) and their
        neighbours, the global batch size (None outside training), the training mode."""
        (lo, hi), (b, n) = cut, batch.neg.shape
        mine = query_positions(b, n, lo, hi)
        rows, _, ks = self.model.neighbour_queries(mine, mine, 2 * (hi - lo))  # the half's rows that have neighbours
        return (half_batch(batch, lo, hi), half_hops(hops, rows, ks)), global_batch, self.model.training

    def _stage(self, item: Optional[tuple[int, Batch]], training: bool) -> None:
        """While the half process runs: the next batch's neighbours, if it runs as two halves,
        and, where its second half is to run there too, that share sent ahead."""
        if item is None or len(cuts := bounds(item[1].src.numel(), self.halves)) <= 1:
            return
        size, batch = item
        hops, second = self._hops(batch), None
        if self.placements[training].remote():
            second = self._half_work(batch, hops, cuts[1], size if training else None)
            self.half_process.stage(_wired(second))
        self._staged = Staged(batch, hops, second)

    def _gradients(self, fw: Forward, global_batch: Optional[int]) -> tuple[Optional[Tensor], Optional[tuple]]:
        """(loss, gradients of the parameters) of a half's `Forward`, or (None, None) outside training."""
        if global_batch is None:
            return None, None
        loss = batch_loss(fw, global_batch)
        return loss.detach(), torch.autograd.grad(loss, self.params, allow_unused=True)

    def _run_half(self, work: tuple, ready: Optional[Callable[[], None]] = None
                   ) -> tuple[Forward, Optional[Tensor], Optional[tuple]]:
        """A half's (Forward, loss, gradients); `work` = ((events, neighbours), global batch size or
        None, training mode). In the half process (given `ready`, called at once: the work comes
        with what it reads, `_read_half`), the scores and query embeddings (tensors) only, the gradients
        are written to `_second_grads` (the result says which parameters have one), and the share
        is kept for its state writes (`_write_half`)."""
        read = None
        if ready is not None:
            work, read = work
            ready()
        (share, hops), global_batch, training = work
        if self.model.training != training:  # setting it walks every module: 60 us
            self.model.train(training)
        with torch.set_grad_enabled(global_batch is not None):
            fw = self.model(self._node_state, share, lambda *_: hops, read)
            loss, grads = self._gradients(fw, global_batch)
        if ready is None:
            return fw, loss, grads
        self._kept = (share, fw)
        present = None
        if grads is not None:
            present = tuple(g is not None for g in grads)
            for to, g in zip(self._second_grads, grads):
                if g is not None:
                    to.copy_(g)
        return (fw.pos.detach(), fw.neg.detach(), fw.embed.detach()), loss, present

    def _read_half(self, work: tuple) -> tuple:
        """In the half process: the work sent (`_wired`) as `_run_half` takes it, and what its
        forward pass reads before it uses a parameter (`TemporalGNN.read_batch`), read when the
        process gets the work: staged work, while the rank ends the step before (after this
        process's state writes of it; the rank's came first)."""
        flat, global_batch, training = work
        share, hops = from_wire(flat)
        with torch.no_grad():
            return ((share, hops), global_batch, training), self.model.read_batch(self._node_state, share,
                                                                                  lambda *_: hops)

    @property
    def _node_state(self) -> Optional[NodeState]:
        """The node state the halves read and write themselves (not timed: `TimedState`)."""
        return None if self.state is None else self.state.state

    def _write_half(self) -> None:
        """In the half process: the state writes of the share it ran last."""
        share, fw = self._kept
        self._kept = None
        self.model.write(self._node_state, share, fw)

    def _half_process(self) -> Optional[HalfProcess]:
        """The half process, forked now if not yet, with the parameters and the node state moved
        to shared memory first; None where it cannot be forked (the rank then runs both halves)."""
        if self.half_process is None and not self._fork_failed:
            for p in self.model.parameters():
                p.data = in_shared_memory(p.data)
            self._second_grads = [in_shared_memory(torch.zeros_like(p)) for p in self.params]
            if self.state is not None:
                self.state.state.move_to_shared_memory()
            try:
                self.half_process = HalfProcess(self._run_half, self._write_half, self._read_half)
            except OSError as e:  # e.g. a container's limit on processes
                self._fork_failed, self._second_grads = True, []
                print(f"gnndist: no process for a step's second half ({e}): this rank runs both halves",
                      file=sys.stderr)
        return self.half_process

    def _drop_half_process(self) -> None:
        """End the half process (after an error, whatever it was doing: the next step that needs
        one forks a new one)."""
        if self.half_process is not None:
            self._dropped_cpu += self.half_process.cpu_seconds
            self.half_process.close()
        self.half_process, self._writing = None, False

    def write(self, runs: list[HalfRun]) -> None:
        """The state writes of a batch run as one half (`run_batch` makes those of two)."""
        if len(runs) == 1:
            self.model.write(self.state, runs[0].share, runs[0].fw)

    def cpu_seconds(self) -> float:
        """CPU time of this rank's process and its half processes."""
        return (time.process_time() + self._dropped_cpu
                + (0.0 if self.half_process is None else self.half_process.cpu_seconds))

    def settle(self) -> None:
        """Wait for the state writes under way in the half process (`run_batch`)."""
        if self._writing:
            self._writing = False
            try:
                self.half_process.wait_written()
            except BaseException:
                self._drop_half_process()
                raise

    def step(self, batch: Batch, global_batch: int, ahead: Optional[Lookahead] = None
             ) -> tuple[float, list[HalfRun]]:
        """Forward and backward of each half, state writes, summed gradients, optimizer step:
        the global loss, and this rank's runs of the batch's halves, each with its `Forward`
        (`ahead`: as `run_batch`'s)."""
        runs = self.run_batch(batch, global_batch, ahead)
        for p, g in zip(self.params, summed_grads([r.grads for r in runs])):
            p.grad = g
        loss = functools.reduce(torch.add, [r.loss for r in runs])
        summed = dist.GradientSum(self.params, loss.reshape(1))
        with dist.carrying(summed):  # the state writes need no parameters: they go first, with the sum
            self.write(runs)
        with self.timers.phase("sync"):
            total = float(summed.result()[0])
        if not math.isfinite(total):
            self.settle()
            raise GnndistError(f"the training loss became {total}; try a smaller --lr, or scale the data "
                               f"(this rank's: {self.events.scale()})")
        if self.cfg.clip_grad is not None:  # the summed gradient: the same on every rank
            torch.nn.utils.clip_grad_norm_(self.params, self.cfg.clip_grad)
        self.optimizer.step()
        self.settle()
        return total, runs

    # ------------------------------------------------------------------------------ epochs

    def _bar(self, total: int, desc: str) -> tqdm:
        return tqdm(total=total, desc=desc, unit="ev", leave=False, disable=not self.progress)

    def reset_state(self) -> None:
        if self.state is not None:
            self.state.reset()

    @threads.job_threads()
    def train_epoch(self, epoch: int) -> dict[str, Any]:
        """One pass over the training events from a reset state; the epoch's metrics (all ranks)."""
        self.model.train()
        self.reset_state()
        self._reset_traffic()
        cfg = self.cfg
        lr = cfg.lr if cfg.lr_schedule == "constant" else cfg.lr * 0.5 * (1 + math.cos(math.pi * (epoch - 1) / cfg.epochs))
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        total, t0, c0, k0 = 0.0, time.perf_counter(), self.cpu_seconds(), dist.collectives_entered()
        n = self.events.num_nodes
        with self._bar(self.train_end, f"epoch {epoch}") as bar:
            ahead = Lookahead(self.steps(0, self.train_end, lambda index, size, rows, src, dst: train_negatives(
                cfg.seed, epoch, index, size, rows, dst, n), per_event=1))
            for size, batch in ahead:
                loss = self.step(batch, size, ahead)[0]
                total += loss * size
                if self.on_loss is not None:
                    self.on_loss(loss)
                bar.update(size)
        self.timers.wait()
        seconds, cpu = time.perf_counter() - t0, self.cpu_seconds() - c0
        return {"epoch": epoch, "loss": total / self.train_end, "lr": lr, "time_s": seconds, "cpu_s": cpu,
                "events_per_s": self.train_end / seconds,
                "collectives_per_step": (dist.collectives_entered() - k0) / self.steps_per_epoch,
                **self._traffic(seconds)}

    @threads.job_threads()
    @torch.no_grad()
    def evaluate(self, start: int, stop: int, desc: str, score: bool = True) -> Scores:
        """`Scores` of the events in [start, stop) this rank scored; the node state absorbs the
        true events as it goes. `score=False` replays the events through the memory without
        negatives ([P, 0] of them)."""
        self.model.eval()
        ev, cfg = self.events, self.cfg
        negatives = EvalNegatives(ev.new_to_orig[ev.src[ev.scored]], ev.new_to_orig[ev.dst[ev.scored]],
                                  ev.scored_eid, ev.num_nodes, start, stop, cfg.neg, cfg.eval_negatives,
                                  cfg.seed) if score else None
        pos, neg, eid, ends = [], [], [], []
        with self._bar(stop - start, desc) as bar:
            ahead = Lookahead(self.steps(start, stop, negatives.batch if score else None,
                                         cfg.eval_negatives if score else 0))
            for size, batch in ahead:
                runs = self.run_batch(batch, ahead=ahead)
                self.write(runs)
                self.settle()
                for r in runs:
                    pos.append(r.fw.pos.cpu().numpy())
                    neg.append(r.fw.neg.cpu().numpy())
                    eid.append(r.share.eid.cpu().numpy())
                    ends.append(r.share.on_host()[:2])
                bar.update(size)
        src, dst = (np.concatenate(e) for e in zip(*ends))
        return Scores(np.concatenate(pos), np.concatenate(neg), np.concatenate(eid), src, dst)

    def are_new(self, nodes: np.ndarray) -> np.ndarray:
        """Whether each of `nodes` (new ids, a host array) has its first event after training,
        as their owners know (one request and one reply on the gloo group; a collective)."""
        ev = self.events
        first = ev.first_seen()
        mine = (first >= self.train_end) & (first < ev.num_events)
        asked = Requests(nodes, ev.book.owner(nodes), sampler_group())
        return asked.reply(mine[asked.received - ev.lo])

    # ------------------------------------------------------------------------------ metrics

    def _reset_traffic(self) -> None:
        self.timers.reset()
        self.neighbours.remote_queries = self.neighbours.carried_bytes = 0
        self.neighbours.features.reset_counters()
        if self.state is not None and hasattr(self.state.state, "reset_traffic"):
            self.state.reset_traffic()

    def _traffic(self, seconds: float) -> dict[str, Any]:
        """The last epoch's traffic and time split, all ranks together (seconds: mean over ranks)."""
        spent = dict(self.timers.seconds)
        spent["compute"] = seconds - spent["sample"] - spent["fetch"] - spent["sync"]
        st = self.state.state if self.state is not None else None
        c = self.cache_counters = dict(self.neighbours.features.counters)
        k = self.cfg.num_neighbors
        local = [getattr(st, "rows_fetched", 0), getattr(st, "bytes_sent", 0),
                 self.neighbours.remote_queries * (16 + 8 * (1 + 3 * k)), c["requests"], c["hits"],
                 c["bytes_fetched"] + self.neighbours.carried_bytes, c["bytes_saved"], *(spent[p] for p in PHASES)]
        total = dist.all_reduce(torch.tensor(local, dtype=torch.float64, device=self.device)).cpu().tolist()
        w = self.events.num_parts
        out = {"remote_rows": int(total[0]), "state_bytes": int(total[1]), "sample_bytes": int(total[2]),
               "edge_feature_bytes": int(total[5]), "edge_cache_hit_rate": hit_rate(total[4], total[3]),
               "edge_cache_bytes_saved": int(total[6]),
               "grad_bytes": (w * self.steps_per_epoch * sum(p.numel() * p.element_size() for p in self.params))
               if w > 1 else 0}
        out["bytes"] = out["state_bytes"] + out["sample_bytes"] + out["edge_feature_bytes"]
        out.update({f"{p}_s": total[7 + i] / w for i, p in enumerate(PHASES)})
        return out

    def rank_metrics(self) -> list[dict[str, Any]]:
        """What each rank holds (gathered): events, T-CSR entries, edge-feature rows, node-state
        rows, bytes by category, its peak resident memory (and on a GPU its peak of allocated GPU
        memory), and its edge-cache counters of the last training epoch."""
        ev, st = self.events, (self.state.state if self.state is not None else None)
        indptr, nbr, eid, ts = ev.tcsr()
        cache = self.neighbours.features.cache
        state_tensors = [] if st is None else [t for k, t in st.state_dict().items() if k != "node_range"]
        c = self.cache_counters
        mine = [ev.rank, ev.num_held, int(nbr.size), ev.num_held if ev.edge_feat is not None else 0,
                0 if st is None else int(state_tensors[0].shape[0]),
                sum(a.nbytes for a in (ev.eid, ev.src, ev.dst, ev.t)) + (0 if ev.edge_label is None
                                                                       else ev.edge_label.nbytes),
                indptr.nbytes + nbr.nbytes + eid.nbytes + ts.nbytes,
                0 if ev.edge_feat is None else ev.edge_feat.nbytes,
                sum(t.numel() * t.element_size() for t in state_tensors),
                0 if cache is None else cache.rows.nbytes,
                sum(a.nbytes for a in {id(a): a for a in (ev.orig_to_new, ev.new_to_orig)}.values()),
                peak_rss_bytes(), c.get("requests", 0), c.get("hits", 0), c.get("bytes_fetched", 0),
                torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else -1]
        rows = torch.cat(dist.all_gather_varsize(torch.tensor([mine], dtype=torch.int64, device=self.device)))
        out = []
        for r in rows.cpu().tolist():
            out.append({"rank": r[0], "events_held": r[1], "tcsr_entries": r[2], "edge_feature_rows": r[3],
                        "node_state_rows": r[4],
                        "bytes": dict(zip(("events", "tcsr", "edge_features", "node_state", "cache", "id_maps"),
                                          r[5:11])),
                        "peak_rss_bytes": r[11], "peak_gpu_bytes": r[15] if r[15] >= 0 else None,
                        "edge_cache": {"requests": r[12], "hits": r[13], "hit_rate": hit_rate(r[13], r[12]),
                                       "bytes_fetched": r[14]}})
        return out

    # ------------------------------------------------------------------------------ the cache

    def _set_cache(self) -> None:
        """The edge-feature cache of `cfg.cache` (a collective): `degree` fills it with the remote
        events of most active endpoints, offered by their holders; `presample` with the events
        one sampling pass over the training batches requests most; `adaptive` starts empty."""
        policy, features = self.cfg.cache, self.neighbours.features
        if policy == "none" or self.events.num_parts == 1 or self.events.edge_dim == 0:
            return
        candidates = None
        if policy == "degree":
            candidates = self._degree_candidates()
        elif policy == "presample":
            candidates = self._presample_candidates()
        features.set_cache(policy, self.cfg.cache_size, candidates=candidates)

    def _capacities(self) -> list[int]:
        """Cache rows of every rank."""
        from gnndist.samplers.cache import capacity_rows

        features = self.neighbours.features
        mine = capacity_rows(self.cfg.cache_size, features.num_remote, features.row_bytes)
        return [int(c) for c in torch.cat(dist.all_gather_varsize(torch.tensor([mine]), features.group)).tolist()]

    def _degree_candidates(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each holder offers every other rank its events (whose source it owns) touching none of
        that rank's nodes, scored by their endpoints' event counts, up to that rank's capacity."""
        ev = self.events
        indptr = ev.tcsr()[0]
        group = self.neighbours.features.group  # host-side exchanges: the gloo group
        degree = torch.cat(dist.all_gather_varsize(torch.from_numpy(np.diff(indptr)), group)).numpy()
        own = ev.scored
        score = (degree[ev.src[own]] + degree[ev.dst[own]]).astype(np.float64)
        sends = []
        for r, cap in enumerate(self._capacities()):
            lo, hi = ev.book.range(r)
            far = np.flatnonzero(~(((ev.src[own] >= lo) & (ev.src[own] < hi)) | ((ev.dst[own] >= lo) & (ev.dst[own] < hi))))
            if r == ev.rank or far.size == 0 or cap == 0:
                far = far[:0]
            elif far.size > cap:
                far = far[np.argpartition(-score[far], cap - 1)[:cap]]
            sends.append(torch.from_numpy(np.stack([ev.scored_eid[far].astype(np.float64), score[far]], 1)))
        got = dist.exchange(sends, group)
        holders = np.concatenate([np.full(g.shape[0], r, np.int64) for r, g in enumerate(got)])
        rows = dist.joined(got).numpy()
        return rows[:, 0].astype(np.int64), rows[:, 1], holders

    def _presample_candidates(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The remote events one pass of this rank's training-batch sampling requests, with
        their request counts (the `presample` policy; the count table stays bounded)."""
        ev, model = self.events, self.model
        features, cap = self.neighbours.features, max(self._capacities()[ev.rank], 1)
        ids, counts, holders = np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64)
        if model.sampling.hops == 0:
            return ids, counts, holders
        for index, s, e in self.batches(0, self.train_end):
            pos = ev.scored_in(s, e)
            nodes, times = [ev.src[pos], ev.dst[pos]], [ev.t[pos], ev.t[pos]]
            if model.sampling.rows == "queries":
                neg = train_negatives(self.cfg.seed, 1, index, e - s, ev.eid[pos] - s, ev.new_to_orig[ev.dst[pos]],
                                      ev.num_nodes)
                nodes.append(ev.orig_to_new[neg[:, 0]])
                times.append(ev.t[pos])
            hops, owner = self.neighbours.sample(np.concatenate(nodes), np.concatenate(times),
                                                 [model.k] * model.sampling.hops)
            eid = np.concatenate([h.eid[h.mask] for h in hops])
            held_by = np.concatenate([np.repeat(o, h.mask.sum(1)) for o, h in zip(owner, hops)])
            remote = features.book.position(eid) < 0
            eid = np.concatenate([eid[remote], ids])
            weight = np.concatenate([np.ones(int(remote.sum())), counts])
            held_by = np.concatenate([held_by[remote], holders])
            ids, first, inv = np.unique(eid, return_index=True, return_inverse=True)
            counts, holders = np.bincount(inv, weights=weight), held_by[first]
            if ids.size > 8 * cap:
                top = np.sort(np.argpartition(-counts, 4 * cap)[:4 * cap])
                ids, counts, holders = ids[top], counts[top], holders[top]
        return ids, counts, holders

    # ------------------------------------------------------------------------------ state I/O

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "node_state": None if self.state is None else self.state.state_dict()}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        self.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        if self.state is not None:
            self.state.load_state_dict(saved["node_state"])


def common_epoch(epochs: list[int], device: torch.device) -> int:
    """The newest checkpointed epoch every rank holds (a collective): after a crash between two
    ranks' writes, the older complete one."""
    held = torch.cat(dist.all_gather_varsize(torch.tensor(sorted(epochs), dtype=torch.int64, device=device)))
    counts = torch.bincount(held.cpu(), minlength=1) if held.numel() else torch.zeros(1, dtype=torch.int64)
    common = torch.nonzero(counts == dist.world_size()).flatten()
    if common.numel() == 0:
        raise GnndistError("no checkpointed epoch is complete on every rank; start afresh without --resume")
    return int(common.max())


def _json_safe(metrics: dict[str, float]) -> dict[str, Optional[float]]:
    """NaN (an empty subset) as null, which JSON can hold."""
    return {k: (None if v != v else v) for k, v in metrics.items()}


def _table(rows: list[tuple[str, dict[str, float]]]) -> str:
    """AP, AUC and MRR of each named row; '-' where a figure has no events to come from."""
    def cell(v: Optional[float]) -> str:
        return f"{v:>8.4f}" if v is not None and math.isfinite(v) else f"{'-':>8}"

    lines = [f"{'':<30}{'AP':>8}{'AUC':>8}{'MRR':>8}"]
    lines += [f"{name:<30}" + "".join(cell(m[k]) for k in ("ap", "auc", "mrr")) for name, m in rows]
    return "\n".join(lines)


RESUMED = ("config", "model", "optimizer", "node_state", "rng", "history", "best")  # what a resume reads


def fit(trainer: LinkTrainer, outputs: Outputs = Outputs()) -> dict[str, Any]:
    """Train with model selection on validation AP, then test the selected parameters; write
    checkpoints each epoch (`checkpoint.run`) and, on rank 0, the metrics. Returns the metrics
    (the same on every rank)."""
    ckpt_dir = None
    if outputs.checkpoint:
        ev = trainer.events
        ckpt_dir = Path(outputs.checkpoint) / f"rank{ev.rank}" if ev.num_parts > 1 else Path(outputs.checkpoint)
    with checkpoint.run(ckpt_dir, outputs.resume, restore=trainer.events.num_parts == 1):
        return _fit(trainer, outputs, ckpt_dir)


def _fit(trainer: LinkTrainer, outputs: Outputs, ckpt_dir: Optional[Path]) -> dict[str, Any]:
    cfg, ev, lead = trainer.cfg, trainer.events, dist.rank() == 0
    config = {**cfg.to_dict(), "num_nodes": ev.num_nodes, "num_events": ev.num_events, "edge_dim": ev.edge_dim,
              "world_size": ev.num_parts, "partition": ev.partition_key()}
    resumed_config = ("model", "batch_size", "lr", "lr_schedule", "clip_grad", "memory_dim", "time_dim", "num_neighbors",
                   "sampling", "neg", "seed", "memory", "num_nodes", "num_events", "edge_dim", "world_size")
    history: list[dict[str, Any]] = []
    best: Optional[dict[str, Any]] = None  # epoch, val_ap, parameters
    first = 1
    if outputs.resume:
        held = checkpoint.epochs(ckpt_dir)
        if not held:
            checkpoint.load(ckpt_dir)  # says what is wrong with what is there
        saved = checkpoint.load(ckpt_dir, common_epoch(held, trainer.device), needs=RESUMED)
        if saved["config"].get("partition", config["partition"]) != config["partition"]:  # older ones: not kept
            raise GnndistError(f"checkpoint in {outputs.checkpoint} was written on another partition of the data "
                               f"(its ranks own other nodes): resume on the partition store it was trained on")
        for key in resumed_config:
            if saved["config"].get(key) != config[key]:
                raise GnndistError(f"checkpoint in {outputs.checkpoint} was written with {key}="
                                   f"{saved['config'].get(key)}, this run has {key}={config[key]}")
        trainer.load_state_dict(saved)
        checkpoint.set_rng_state(saved["rng"])
        history, best, first = list(saved["history"]), saved["best"], int(saved["epoch"]) + 1
    runlog = RunLog(outputs.log_dir if lead else None, first_step=(first - 1) * trainer.steps_per_epoch)
    trainer.on_loss = runlog.step

    def stopped() -> bool:
        return cfg.patience is not None and bool(history) and history[-1]["epoch"] - best["epoch"] >= cfg.patience

    for epoch in range(first, cfg.epochs + 1):
        if stopped():
            break
        rec = trainer.train_epoch(epoch)
        val = link_metrics(*trainer.evaluate(trainer.train_end, trainer.val_end, "val")[:2], across_ranks=True)
        rec.update(val_ap=val["ap"], val_auc=val["auc"], val_mrr=val["mrr"])
        history.append(rec)
        runlog.epoch(rec)
        if best is None or val["ap"] > best["val_ap"]:
            best = {"epoch": epoch, "val_ap": val["ap"], "model": copy.deepcopy(trainer.model.state_dict())}
        if lead and not cfg.quiet:
            print(f"epoch {epoch}: loss {rec['loss']:.4f}, {rec['events_per_s']:,.0f} events/s, "
                  f"val AP {val['ap']:.4f} AUC {val['auc']:.4f} MRR {val['mrr']:.4f}", file=sys.stderr)
        if ckpt_dir is not None:
            checkpoint.save(ckpt_dir, {"config": config, "epoch": epoch, **trainer.state_dict(),
                                       "rng": checkpoint.rng_state(), "history": history, "best": best})
    if first > cfg.epochs:
        raise GnndistError(f"the checkpoint already holds {first - 1} epochs; ask for more with --epochs")
    stop_reason = "patience" if history[-1]["epoch"] < cfg.epochs else "epochs"  # stopped before --epochs, or not
    test = selected_test_metrics(trainer, best, history)
    runlog.test(test, best["epoch"])
    metrics = {"task": "link", "model": cfg.model, "world_size": ev.num_parts, "memory": cfg.memory,
               "share": cfg.share, "neg": cfg.neg, "config": config, "epochs": history,
               "selected_epoch": best["epoch"], "stop_reason": stop_reason, "ranks": trainer.rank_metrics(),
               "test": test}
    if lead and outputs.metrics_out:
        write_metrics(outputs.metrics_out, metrics)
    return metrics


def selected_test_metrics(trainer: LinkTrainer, best: dict[str, Any], history: list[dict[str, Any]]
                          ) -> dict[str, Any]:
    """Test the selected parameters `best["model"]` over the node state they build on the
    training and validation events (replayed from event 0); rank 0 prints the table (validation
    at the selected epoch `best["epoch"]` of `history`, test, test on new nodes). Returns the test
    metrics of the metrics JSON (a collective)."""
    ev = trainer.events
    trainer.model.load_state_dict(best["model"])
    trainer.reset_state()
    trainer.evaluate(0, trainer.val_end, "replay", score=False)
    pos, neg, _, src, dst = trainer.evaluate(trainer.val_end, ev.num_events, "test")
    new = trainer.are_new(np.concatenate([src, dst]))
    inductive = new[:src.size] | new[src.size:]
    test = link_metrics(pos, neg, across_ranks=True)
    test_new = link_metrics(pos[inductive], neg[inductive], across_ranks=True)
    n_inductive = int(dist.all_reduce(torch.tensor([int(inductive.sum())], device=trainer.device)).item())
    if dist.rank() == 0:
        sel = next(h for h in history if h["epoch"] == best["epoch"])
        print(_table([(f"val (epoch {best['epoch']})", {"ap": sel["val_ap"], "auc": sel["val_auc"],
                                                        "mrr": sel["val_mrr"]}),
                      ("test", test), (f"test new nodes ({n_inductive:,} events)", test_new)]), flush=True)
    return {**_json_safe(test), **{f"inductive_{k}": v for k, v in _json_safe(test_new).items()},
            "inductive_events": n_inductive}


def rank_events(source: Union[TemporalGraph, str]) -> RankEvents:
    """This rank's events: the whole graph (one process) or its part of a temporal store (only
    meta.json, the id maps and its own part are read)."""
    if isinstance(source, TemporalGraph):
        return RankEvents.from_graph(source)
    part = load_partition(source, dist.rank(), dist.world_size())
    if part.kind != "temporal":
        raise GnndistError(f"partition store {source} holds a {part.kind} graph; --task link needs a temporal one")
    return RankEvents.from_partition(part, *load_id_maps(source))


def link_rank(source: Union[TemporalGraph, str], cfg: LinkConfig, outputs: Outputs = Outputs()) -> dict:
    """One rank of a run: its events, then `fit`."""
    device = dist.setup(cfg.device)
    try:
        return fit(LinkTrainer(rank_events(source), cfg, device), outputs)
    finally:
        dist.teardown()


def train_link(data: Data, cfg: Optional[LinkConfig] = None, nproc: int = 1, outputs: Outputs = Outputs()) -> dict:
    """Link prediction on `data` (a `TemporalGraph`, a dataset name or path, a `DataSource`, or
    a temporal partition store) on `nproc` local ranks, or as this rank of a torchrun world.
    Returns the metrics (of rank 0, or of this rank under torchrun). Local ranks import the
    calling script again: call from under `if __name__ == "__main__":`."""
    cfg = LinkConfig() if cfg is None else cfg
    check_type("cfg", cfg, LinkConfig)
    check_type("outputs", outputs, Outputs)
    return run_job(data, nproc, SPLIT, link_rank, cfg, outputs, device=cfg.device, quiet=cfg.quiet,
                   rank_checkpoints=True)
