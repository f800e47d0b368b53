"""A one-process step run as two halves of its batch's events, the second in a process of its
own (`gnndist.temporal.half_process`): how a rank uses a second core without an OpenMP team,
whose every operation would wait for a thread that another job may hold (`gnndist.runtime.threads`).

Each half embeds and scores its events from the node state as the batch found it, with its
loss the sum over its events divided by the whole batch's size, and runs its own backward
pass. The halves' gradients are summed in half order and their state writes follow in time
order, so the step is the one the whole batch takes, up to float rounding: a node in two
halves gets the same updated memory from both, and its mail from its last event. The
neighbours of the whole batch, planned ahead, are cut into the halves' rows.

Where the second half runs, in the half process or here after the first, is `Placement`'s
choice, step by step (the same bits either way). While the half process runs the second half,
this rank writes the first half's state and makes the next batch's second half (`stage`),
which the process prepares while the rank ends the step.
"""
from __future__ import annotations

import math
import sys
import time
from typing import Callable, NamedTuple, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from gnndist.runtime.device import to_device
from gnndist.temporal.half_process import HalfProcess, Placement, in_shared_memory
from gnndist.temporal.models import Batch, Forward, Hop, TemporalGNN
from gnndist.temporal.state import NodeState

Peek = Callable[[], Optional[tuple[int, Batch]]]  # the next (global batch size, batch) of a run, None at the end
FIRST_HALF = 0.44  # of a batch's events, the first half's (see `bounds`; docs/benchmarks.md)


def bounds(events: int, halves: int) -> list[tuple[int, int]]:
    """[lo, hi) of each non-empty half of `events` events: one (`halves` 1), or two whose first
    has FIRST_HALF of them. The first is the rank's, which while the half process runs the
    second also makes the first's state writes and the next batch, so it takes less."""
    if halves < 1 or halves > 2:
        raise ValueError(f"a batch runs as 1 or 2 halves, not {halves}")
    if halves == 1 or events < 2:
        return [(0, events)] if events else []
    cut = min(max(round(events * FIRST_HALF), 1), events - 1)
    return [(0, cut), (cut, events)]


def query_positions(events: int, negatives: int, lo: int, hi: int) -> np.ndarray:
    """Where the query rows (src, dst, negatives) of events lo .. hi-1 are among the batch's."""
    e = np.arange(lo, hi)
    return np.concatenate([e, events + e, 2 * events + np.arange(lo * negatives, hi * negatives)])


def half_hops(hops: list[Hop], rows: np.ndarray, ks: list[int]) -> list[Hop]:
    """The hops of the hop-0 rows `rows` (hop h: their descendants, prod(ks[:h]) each)."""
    out = []
    for h, hop in enumerate(hops):
        m = math.prod(ks[:h])
        idx = (rows[:, None] * m + np.arange(m)).reshape(-1)
        t = to_device(idx, hop.nbr.device)
        out.append(Hop(*(a.index_select(0, t) for a in (hop.nbr, hop.eid, hop.ts, hop.dt, hop.mask, hop.feat)),
                       hop.host_nbr[idx], hop.host_mask[idx]))
    return out


def half_batch(model: TemporalGNN, batch: Batch, lo: int, hi: int) -> Batch:
    """The events lo .. hi-1 of `batch` (views), with their rows and their rows' neighbours."""
    b, n = batch.neg.shape
    mine = query_positions(b, n, lo, hi)
    with_neighbours, _, ks = model.neighbour_queries(mine, mine, 2 * (hi - lo))
    host = None if batch.host is None else tuple(a[lo:hi] for a in batch.host)
    return Batch(batch.src[lo:hi], batch.dst[lo:hi], batch.t[lo:hi], batch.eid[lo:hi], batch.feat[lo:hi],
                 batch.neg[lo:hi], host, rows=(batch.rows[0][mine], batch.rows[1][mine]),
                 hops=half_hops(batch.hops, with_neighbours, ks))


def to_wire(half: Batch) -> tuple[Tensor, ...]:
    """A half's events, rows and neighbours as one flat tuple of tensors, as the half process gets
    them: its channel pays per object it walks. The host arrays are views of the tensors on the
    CPU, the only place halves run (`from_wire`)."""
    return (half.src, half.dst, half.t, half.eid, half.feat, half.neg, *map(torch.from_numpy, half.rows),
            *(a for hop in half.hops for a in (hop.nbr, hop.eid, hop.ts, hop.dt, hop.mask, hop.feat)))


def from_wire(flat: tuple[Tensor, ...]) -> Batch:
    """The half from `to_wire`'s tuple (CPU tensors)."""
    src, dst, t, eid, feat, neg, nodes, times = flat[:8]
    hops = [Hop(*flat[i:i + 6], flat[i].numpy(), flat[i + 4].numpy()) for i in range(8, len(flat), 6)]
    return Batch(src, dst, t, eid, feat, neg, host=(src.numpy(), dst.numpy(), t.numpy(), neg.numpy()),
                 rows=(nodes.numpy(), times.numpy()), hops=hops)


def batch_loss(fw: Forward, global_batch: int) -> Tensor:
    """Binary cross-entropy summed over the positives and negatives, divided by the GLOBAL
    batch size, so that ranks holding parts of one batch add up to the whole batch's loss."""
    return (F.binary_cross_entropy_with_logits(fw.pos, torch.ones_like(fw.pos), reduction="sum")
            + F.binary_cross_entropy_with_logits(fw.neg, torch.zeros_like(fw.neg), reduction="sum")) / global_batch


def loss_and_grads(fw: Forward, global_batch: Optional[int], params: list[torch.nn.Parameter]
                   ) -> tuple[Optional[Tensor], Optional[tuple]]:
    """(loss, gradients of `params`, None where one has none) of a `Forward`, or (None, None)
    outside training (`global_batch` None)."""
    if global_batch is None:
        return None, None
    loss = batch_loss(fw, global_batch)
    return loss.detach(), torch.autograd.grad(loss, params, allow_unused=True)


class HalfRun(NamedTuple):
    """A half of a batch run: its events, its `Forward` (of a half run in the half process: the
    scores and query embeddings only) and, in training, its loss and gradients (None where a
    parameter has none)."""

    half: Batch
    fw: Forward
    loss: Optional[Tensor] = None
    grads: Optional[tuple[Optional[Tensor], ...]] = None


class _Work(NamedTuple):
    """What a half runs: its events, the global batch size (None outside training), the mode."""

    half: Batch
    global_batch: Optional[int]
    training: bool

    def wired(self) -> tuple:
        return to_wire(self.half), self.global_batch, self.training


class _Staged(NamedTuple):
    """The next batch, made during a step, and, where its second half is to run in the half
    process, that half's work (sent ahead: `HalfProcess.stage`)."""

    batch: Batch
    second: Optional[_Work]


class SplitStep:
    """Runs one process's batches as two halves (see the module docstring): `run`, then `settle`
    before the node state is read again."""

    def __init__(self, model: TemporalGNN, state: Optional[NodeState], params: list[torch.nn.Parameter],
                 write: Callable[[Batch, Forward], None]) -> None:
        self.model, self.state, self.params, self.write = model, state, params, write
        self.process: Optional[HalfProcess] = None  # forked by the first step that runs a half there
        self.placements = {True: Placement(), False: Placement()}  # where second halves run, training and not
        self._writing = False  # whether the half process is making state writes
        self._fork_failed = False  # then this rank runs both halves of each step
        self._dropped_cpu = 0.0  # CPU time of half processes dropped after an error
        self._kept: Optional[tuple[Batch, Forward]] = None  # in the half process: the half it ran last
        self._staged: Optional[_Staged] = None  # of the next batch
        self._second_grads: list[Tensor] = []  # the half process's gradients, in shared memory

    def run(self, batch: Batch, global_batch: Optional[int], peek: Optional[Peek] = None) -> list[HalfRun]:
        """Forward pass of the batch's two halves in time order and, given the global batch size,
        their losses and gradients, with both halves' state writes made (the half process's left
        under way: `settle`). `peek`: the next (global batch size, batch), None at the end, made
        early while the half process runs."""
        self.settle()  # a step that raised after its run may have left the half process writing
        staged, self._staged = self._staged, None
        staged = staged if staged is not None and staged.batch is batch else None
        (lo, cut), (_, hi) = bounds(batch.src.numel(), 2)
        place, start, ahead_s = self.placements[global_batch is not None], time.perf_counter(), 0.0
        if staged is not None and staged.second is not None:
            remote, second = True, staged.second
        else:  # where staged, the placement had it run here
            remote = staged is None and place.remote() and not self._fork_failed
            second = _Work(half_batch(self.model, batch, cut, hi), global_batch, self.model.training)
        forked = remote and self.process is None
        try:
            remote = remote and self._half_process() is not None
            if remote and staged is not None and self.process.staged:  # not if forked anew since
                self.process.start_staged()
            elif remote:  # sent before the first half is cut: it starts sooner
                self.process.start(second.wired())
            first = _Work(half_batch(self.model, batch, lo, cut), global_batch, self.model.training)
            runs = [HalfRun(first.half, *self._run(first))]
            if not remote:
                runs.append(HalfRun(second.half, *self._run(second)))
                for r in runs:
                    self.write(r.half, r.fw)
            else:
                runs.append(self._second_there(second, runs[0], peek))
                ahead_s = self._ahead_s
        except BaseException:
            self._drop_half_process()
            raise
        if not forked:
            place.took(remote, time.perf_counter() - start - ahead_s, batch.src.numel())
        return runs

    def _second_there(self, second: _Work, first: HalfRun, peek: Optional[Peek]) -> HalfRun:
        """The second half's run in the half process, which reads its state rows while this rank
        writes the first half's, then makes its own writes; meanwhile this rank stages the next
        batch (the time that takes, `_ahead_s`, is not this step's)."""
        self.process.wait_ready()  # its state rows are read: the first half's may be written
        self.write(first.half, first.fw)
        self.process.start_write()
        self._writing, self._ahead_s = True, 0.0
        if peek is not None:
            t0 = time.perf_counter()
            self._stage(peek(), second.global_batch is not None)
            self._ahead_s = time.perf_counter() - t0
        (pos, neg, embed), loss, present = self.process.result()
        grads = None if present is None else tuple(  # never p.grad itself: the next step rewrites it
            None if not has else g if mine is not None else g.clone()
            for g, has, mine in zip(self._second_grads, present, first.grads))
        return HalfRun(second.half, Forward(pos=pos, neg=neg, embed=embed), loss, grads)

    def _stage(self, item: Optional[tuple[int, Batch]], training: bool) -> None:
        """While the half process runs: the next batch, and, where its second half is to run there
        too, that half sent ahead."""
        if item is None or len(cuts := bounds(item[1].src.numel(), 2)) <= 1:
            return
        size, batch = item
        second = None
        if self.placements[training].remote():
            second = _Work(half_batch(self.model, batch, *cuts[1]), size if training else None, self.model.training)
            self.process.stage(second.wired())
        self._staged = _Staged(batch, second)

    def _run(self, work: _Work, ready: Optional[Callable[[], None]] = None, read: Optional[Forward] = None
             ) -> tuple:
        """A half's (Forward, loss, gradients). In the half process (given `ready`, called at once:
        the work comes with what it reads, `_read`), the scores and query embeddings only, the
        gradients written to `_second_grads` (the result says which parameters have one), and the
        half kept for its state writes (`_write_kept`)."""
        if ready is not None:
            ready()
        if self.model.training != work.training:  # setting it walks every module
            self.model.train(work.training)
        with torch.set_grad_enabled(work.global_batch is not None):
            fw = self.model(self.state, work.half, read)
            loss, grads = loss_and_grads(fw, work.global_batch, self.params)
        if ready is None:
            return fw, loss, grads
        self._kept = (work.half, fw)
        present = None
        if grads is not None:
            present = tuple(g is not None for g in grads)
            for to, g in zip(self._second_grads, grads):
                if g is not None:
                    to.copy_(g)
        return (fw.pos.detach(), fw.neg.detach(), fw.embed.detach()), loss, present

    def _read(self, wired: tuple) -> tuple:
        """In the half process: the work sent (`_Work.wired`) and what its forward pass reads
        before it uses a parameter (`TemporalGNN.read_batch`), read when the process gets the
        work: staged work, while the rank ends the step before (after this process's state
        writes of it; the rank's came first)."""
        flat, global_batch, training = wired
        work = _Work(from_wire(flat), global_batch, training)
        with torch.no_grad():
            return work, self.model.read_batch(self.state, work.half)

    def _run_there(self, prepared: tuple, ready: Callable[[], None]) -> tuple:
        """In the half process: the prepared work's run (`_run`)."""
        work, read = prepared
        return self._run(work, ready, read)

    def _write_kept(self) -> None:
        """In the half process: the state writes of the half it ran last."""
        half, fw = self._kept
        self._kept = None
        self.model.write(self.state, half, fw)

    def _half_process(self) -> Optional[HalfProcess]:
        """The half process, forked now if not yet, with the parameters and the node state moved
        to shared memory first; None where it cannot be forked (this rank then runs both halves)."""
        if self.process is None and not self._fork_failed:
            for p in self.model.parameters():
                p.data = in_shared_memory(p.data)
            self._second_grads = [in_shared_memory(torch.zeros_like(p)) for p in self.params]
            if self.state is not None:
                self.state.move_to_shared_memory()
            try:
                self.process = HalfProcess(self._run_there, self._write_kept, self._read)
            except OSError as e:  # e.g. a container's limit on processes
                self._fork_failed, self._second_grads = True, []
                print(f"gnndist: no process for a step's second half ({e}): this rank runs both halves",
                      file=sys.stderr)
        return self.process

    def _drop_half_process(self) -> None:
        """End the half process (after an error, whatever it was doing: the next step that needs
        one forks a new one)."""
        if self.process is not None:
            self._dropped_cpu += self.process.cpu_seconds
            self.process.close()
        self.process, self._writing = None, False

    def settle(self) -> None:
        """Wait for the state writes under way in the half process (`run`)."""
        if self._writing:
            self._writing = False
            try:
                self.process.wait_written()
            except BaseException:
                self._drop_half_process()
                raise

    @property
    def cpu_seconds(self) -> float:
        """CPU time of the half processes (the current one and those dropped)."""
        return self._dropped_cpu + (0.0 if self.process is None else self.process.cpu_seconds)
