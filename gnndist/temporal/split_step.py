"""A one-process batch run as contiguous halves of its events, the second in a process of its
own (`gnndist.temporal.half_process`): how a rank uses a second core without an OpenMP team,
whose every operation would wait for a thread that another job may hold (`gnndist.runtime.threads`).

Each half embeds and scores its events from the node state as the batch found it, with its
loss the sum over its events divided by the whole batch's size, and runs its own backward
pass. The halves' gradients are summed in half order and their state writes follow in time
order, so the step is the one the whole batch takes, up to float rounding: a node in two
halves gets the same updated memory from both, and its mail from its last event. The
neighbours of the whole batch, planned ahead, are cut into the halves' rows.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from gnndist.runtime.device import to_device
from gnndist.temporal.models import Batch, Hop


FIRST_HALF = 0.44  # of a batch's events, the first half's (see `bounds`)


def bounds(events: int, halves: int) -> list[tuple[int, int]]:
    """[lo, hi) of each non-empty half of `events` events: one half (`halves` 1), or two
    whose first has FIRST_HALF of them. The first is the rank's, which while the half
    process runs the second also makes the first's state writes and the next batch: on UCI
    TGN, 30,744 events/s against 29,980 with even halves (median of 5 alternated runs each;
    0.40 was slower than 0.44), 2026-12-05."""
    if halves < 1 or halves > 2:
        raise ValueError(f"a batch runs as 1 or 2 halves, not {halves}")
    if halves == 1 or events < 2:
        return [(0, events)] if events else []
    cut = min(max(round(events * FIRST_HALF), 1), events - 1)
    return [(0, cut), (cut, events)]


def half_batch(batch: Batch, lo: int, hi: int) -> Batch:
    """The events lo .. hi-1 of `batch` (views)."""
    host = None if batch.host is None else tuple(a[lo:hi] for a in batch.host)
    return Batch(batch.src[lo:hi], batch.dst[lo:hi], batch.t[lo:hi], batch.eid[lo:hi], batch.feat[lo:hi],
                 batch.neg[lo:hi], host)


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


def to_wire(events: Batch, hops: list[Hop]) -> tuple[torch.Tensor, ...]:
    """A half's events and neighbours as one flat tuple of tensors, as the half process gets them.
    Its channel pays per object it walks (a step's work as dataclasses took 205 us of the rank's
    CPU time to send, as this tuple 152, UCI TGN 2026-12-05); the host arrays are views of the
    tensors on the CPU, the only place halves run (`from_wire`)."""
    return (events.src, events.dst, events.t, events.eid, events.feat, events.neg,
            *(a for hop in hops for a in (hop.nbr, hop.eid, hop.ts, hop.dt, hop.mask, hop.feat)))


def from_wire(flat: tuple[torch.Tensor, ...]) -> tuple[Batch, list[Hop]]:
    """The half's events and neighbours from `to_wire`'s tuple (CPU tensors)."""
    src, dst, t, eid, feat, neg = flat[:6]
    events = Batch(src, dst, t, eid, feat, neg, host=(src.numpy(), dst.numpy(), t.numpy(), neg.numpy()))
    hops = [Hop(*flat[i:i + 6], flat[i].numpy(), flat[i + 4].numpy()) for i in range(6, len(flat), 6)]
    return events, hops
