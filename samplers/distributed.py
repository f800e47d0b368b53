"""Sampling over partitions: each rank holds the CSR / T-CSR rows of the nodes it owns
(a contiguous global id range) and answers the others' requests.

Per hop, every rank sends the targets it does not own to their owners in one batched
exchange and gets the sampled neighbours back in one more. Random streams are keyed by
global node id, so a distributed sample equals the single-process one exactly (same seed).
Every method is a collective: all ranks call it the same number of times, with or without
seeds of their own.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from gnndist.runtime import dist as gdist
from gnndist.errors import GnndistError
from gnndist.graph import as_node_ids, tcsr_rows
from gnndist.partition.book import PartitionBook
from gnndist.samplers.kernels import load_tcsr_kernels
from gnndist.samplers.static import Blocks, build_blocks, check_fanouts, sample_rows
from gnndist.samplers.temporal import TemporalSample, check_query, multihop, sample_tcsr


def sampler_group() -> Any:
    """The gloo process group the samplers and feature stores exchange on (None in a 1-process
    world). Created on first use in each process group world, which is a collective: all
    ranks must get here in the same order. A separate group lets a prefetch thread exchange
    while the main thread runs its own collectives (gradient all-reduce) on the default
    group, and works under NCCL."""
    return gdist.host_group("samplers")


class Requests:
    """Keys sent to the ranks named by `owner`, in one exchange; `received` are the keys other
    ranks (this one included) sent here, in rank order. Answer with `reply` or `reply_var`."""

    def __init__(self, keys: np.ndarray, owner: np.ndarray, group: Any) -> None:
        self.group = group
        self.order = np.argsort(owner, kind="stable")
        self.send_sizes = np.bincount(owner, minlength=gdist.world_size()).tolist()
        parts = torch.from_numpy(np.ascontiguousarray(keys[self.order])).split(self.send_sizes)
        recv = gdist.exchange(parts, group)
        self.recv_sizes = [r.shape[0] for r in recv]
        self.received = gdist.joined(recv).numpy()

    def reply(self, rows: np.ndarray) -> np.ndarray:
        """Send one row per received key back; returns the rows for this rank's keys, in
        the order the keys were given."""
        back = gdist.exchange(torch.from_numpy(np.ascontiguousarray(rows)).split(self.recv_sizes), self.group,
                              recv_sizes=self.send_sizes)
        out = np.empty((self.order.size, *rows.shape[1:]), rows.dtype)
        out[self.order] = gdist.joined(back).numpy()
        return out

    def reply_var(self, counts: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Send a variable-length int64 list per received key back (`counts` per key, flat
        `values`); returns (counts, flat values) for this rank's keys, in their given order."""
        cut = np.cumsum(self.recv_sizes)[:-1]
        vcut = np.concatenate([[0], np.cumsum(counts)])[cut]
        send = [torch.from_numpy(np.concatenate([c, v])) for c, v in zip(np.split(counts, cut), np.split(values, vcut))]
        back = gdist.exchange(send, self.group)
        c_sorted = np.concatenate([b[:n].numpy() for b, n in zip(back, self.send_sizes)])
        v_sorted = np.concatenate([b[n:].numpy() for b, n in zip(back, self.send_sizes)])
        out_counts = np.empty_like(c_sorted)
        out_counts[self.order] = c_sorted
        off = np.zeros(out_counts.size + 1, np.int64)
        np.cumsum(out_counts, out=off[1:])
        src_off = np.cumsum(c_sorted) - c_sorted
        dst = np.repeat(off[:-1][self.order] - src_off, c_sorted) + np.arange(v_sorted.size)
        out = np.empty_like(v_sorted)
        out[dst] = v_sorted
        return out_counts, out


@dataclass
class StepRequests:
    """One step's part of `requests_per_step`: its keys in the order they were sent (`order`, by
    owner) and how many went to each rank (`send_sizes`); the keys other ranks sent here for the
    step (`received`, in rank order) and how many each sent (`recv_sizes`)."""

    order: np.ndarray
    send_sizes: list[int]
    received: np.ndarray
    recv_sizes: list[int]


def requests_per_step(keys: Sequence[np.ndarray], owner: Sequence[np.ndarray], group: Any) -> list[StepRequests]:
    """The int64 keys ([n] or [n, c] per step) of several steps sent to the ranks named by `owner`
    ([n] per step), in one exchange for all the steps (a collective), and split by step again on
    both sides (`received` [m, c], a column per key column)."""
    w = gdist.world_size()
    tagged = [np.column_stack([k, np.full(o.size, step)]) for step, (k, o) in enumerate(zip(keys, owner))]
    # stable by owner, so each owner gets step 0's keys, then step 1's, ... from each rank
    asked = Requests(np.concatenate(tagged), np.concatenate(owner), group)
    sender, step_of = np.repeat(np.arange(w), asked.recv_sizes), asked.received[:, -1]
    out = []
    for step, o in enumerate(owner):
        here = step_of == step
        out.append(StepRequests(np.argsort(o, kind="stable"), np.bincount(o, minlength=w).tolist(),
                                asked.received[here, :-1], np.bincount(sender[here], minlength=w).tolist()))
    return out


def _own_streams(streams: Optional[np.ndarray], lo: int, n_own: int, rank: int) -> np.ndarray:
    """The random stream ids of a rank's `n_own` nodes from `lo` on (default: their ids)."""
    out = np.arange(lo, lo + n_own, dtype=np.int64) if streams is None else np.asarray(streams, np.int64)
    if out.size != n_own:
        raise GnndistError(f"rank {rank}: {out.size} random streams, its id range has {n_own}")
    return out


class DistNeighborSampler:
    """Uniform multi-hop sampling over a static partition.

    `indptr`, `indices`: CSR rows of the nodes this rank owns (`book.range(r)`), neighbours as
    global ids. Random streams are keyed by `streams[v - lo]`
    for owned node v (default: v itself; a partition store's original ids make a sample
    independent of the renumbering). Results equal `sample_neighbors` with the same seed on the
    whole graph numbered by the stream ids (with a store's original ids: the original graph, its
    neighbours renumbered).
    """

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, book: PartitionBook,
                 streams: Optional[np.ndarray] = None, group: Any = None) -> None:
        self.group = sampler_group() if group is None else group
        self.rank = gdist.rank()
        self.book = book.for_world(gdist.world_size())
        self.lo, hi = self.book.range(self.rank)
        self.indptr = np.asarray(indptr, dtype=np.int64)
        self.indices = np.asarray(indices, dtype=np.int64)
        n_own = hi - self.lo
        if self.indptr.size != n_own + 1 or self.indptr[-1] != self.indices.size:
            raise GnndistError(f"rank {self.rank}: CSR has {self.indptr.size - 1} rows, its id range has {n_own}")
        self.streams = _own_streams(streams, self.lo, n_own, self.rank)

    @classmethod
    def from_partition(cls, part: Any, group: Any = None) -> "DistNeighborSampler":
        """From a static `gnndist.partition.Partition` of this rank (streams keyed by the
        original node ids)."""
        return cls(part.indptr, part.indices, part.book, part.orig_ids, group)

    @property
    def num_nodes(self) -> int:
        return self.book.num_nodes

    def _hop(self, targets: np.ndarray, fanout: int, h: int, replace: bool, seed: int) -> tuple[np.ndarray, np.ndarray]:
        req = Requests(targets, self.book.owner(targets), self.group)
        rows = req.received - self.lo
        counts, edges = sample_rows(self.indptr, self.indices, rows, self.streams[rows], fanout, replace, seed, h)
        counts, nbrs = req.reply_var(counts, edges[0])
        edges = np.empty((2, nbrs.size), np.int64)
        edges[0] = nbrs
        return counts, edges

    def sample(self, seeds, fanouts: Sequence[int], replace: bool = False, seed: int = 0) -> Blocks:
        """Blocks for `seeds` (global ids, owned by any rank); a collective."""
        seeds = as_node_ids("seeds", seeds, self.num_nodes)
        return build_blocks(seeds, check_fanouts(fanouts), lambda t, f, h: self._hop(t, f, h, replace, seed),
                            self.num_nodes)


class DistTemporalSampler:
    """Temporal sampling over a temporal partition: `indptr, nbr, eid, ts` is the T-CSR of the
    nodes this rank owns (rows in id order; nbr and eid global). Random streams are keyed by
    `streams[v - lo]` for owned node v (default: v itself; a partition store's original ids make a
    sample independent of the renumbering). Results equal `sample_temporal_neighbors` on the
    whole graph with the same seed (and stream ids)."""

    def __init__(self, indptr: np.ndarray, nbr: np.ndarray, eid: np.ndarray, ts: np.ndarray,
                 book: PartitionBook, streams: Optional[np.ndarray] = None, group: Any = None) -> None:
        self.group = sampler_group() if group is None else group
        self.rank = gdist.rank()
        self.book = book.for_world(gdist.world_size())
        self.lo, hi = self.book.range(self.rank)
        self.tcsr = (np.asarray(indptr, np.int64), np.asarray(nbr, np.int64), np.asarray(eid, np.int64),
                     np.asarray(ts, np.float64))
        n_own = hi - self.lo
        if self.tcsr[0].size != n_own + 1:
            raise GnndistError(f"rank {self.rank}: T-CSR has {self.tcsr[0].size - 1} rows, its id range has {n_own}")
        self.streams = _own_streams(streams, self.lo, n_own, self.rank)

    @classmethod
    def from_events(cls, src, dst, t, eid, book: PartitionBook, streams: Optional[np.ndarray] = None,
                    group: Any = None) -> "DistTemporalSampler":
        """From the events touching this rank's nodes (global node and event ids; event ids
        number events in time order)."""
        book = book.for_world(gdist.world_size())
        lo, hi = book.range(gdist.rank())
        eid = np.asarray(eid, np.int64)
        order = np.argsort(eid, kind="stable")
        tcsr = tcsr_rows(np.asarray(src, np.int64)[order], np.asarray(dst, np.int64)[order],
                         np.asarray(t, np.float64)[order], eid[order], lo, hi)
        return cls(*tcsr, book, streams, group)

    @classmethod
    def from_partition(cls, part: Any, group: Any = None) -> "DistTemporalSampler":
        """From a temporal `gnndist.partition.Partition` of this rank (streams keyed by the
        original node ids)."""
        return cls.from_events(part.src, part.dst, part.t, part.eid, part.book, part.orig_ids, group)

    @property
    def num_nodes(self) -> int:
        return self.book.num_nodes

    def load_kernels(self) -> None:
        """Compile or load the sampling kernels for this rank's T-CSR (`load_tcsr_kernels`)."""
        load_tcsr_kernels(*self.tcsr)

    def sample_hop(self, nodes: np.ndarray, times: np.ndarray, k: int, hop: int, strategy: str, seed: int,
                   features: Optional[Callable[[np.ndarray], np.ndarray]] = None) -> TemporalSample:
        """Hop `hop` of a multi-hop sample for checked queries (a collective; `sample` checks).
        Queries for nodes of other ranks go to their owners, except those at time -inf (padding
        of an earlier hop), which stay empty; this rank's own queries are sampled in the same
        kernel call as the ones it was sent, and only the others' samples are packed into rows
        for the reply (packing all of them took three quarters of the sampling time on UCI).
        `features(eid)`: the feature rows [len(eid), D] of events this rank holds; given, the
        sampling rank sends the sampled events' rows with the sample (`feat`), which holds every
        event touching the node it sampled."""
        if gdist.world_size() == 1:
            return self._sample_held(nodes, times, k, hop, strategy, seed, features)
        owner = self.book.owner(nodes)
        held = owner == self.rank
        here, away = np.flatnonzero(held), np.flatnonzero(~held & (times > -np.inf))
        req = Requests(np.stack([nodes[away], times[away].view(np.int64)], axis=1), owner[away], self.group)
        asked = req.received
        s = self._sample_held(np.concatenate([nodes[here], asked[:, 0]]),
                              np.concatenate([times[here], np.ascontiguousarray(asked[:, 1]).view(np.float64)]),
                              k, hop, strategy, seed, features)
        mine, theirs = s.rows(0, here.size), s.rows(here.size, s.nbr.shape[0])
        cols = [theirs.counts[:, None], theirs.nbr, theirs.eid, theirs.ts.view(np.int64)]
        if features is not None:
            dtype, width = s.feat.dtype, s.feat.shape[2]  # also unpack the reply below
            cols.append(theirs.feat.reshape(asked.shape[0], k * width))
        back = req.reply(np.concatenate([c.view(np.uint8) for c in cols], axis=1))
        ints = np.ascontiguousarray(back[:, :8 * (1 + 3 * k)]).view(np.int64)
        feat = (None if features is None else
                np.ascontiguousarray(back[:, 8 * (1 + 3 * k):]).view(dtype).reshape(away.size, k, width))
        came = TemporalSample.finish(ints[:, 1:1 + k], ints[:, 1 + k:1 + 2 * k],
                                     np.ascontiguousarray(ints[:, 1 + 2 * k:]).view(np.float64), ints[:, 0],
                                     times[away], feat)
        cols = {}
        for name in (f.name for f in fields(s)):  # each query's row from where it was sampled; padding stays zero
            if (like := getattr(s, name)) is not None:
                col = cols[name] = np.zeros((nodes.size, *like.shape[1:]), like.dtype)
                col[here], col[away] = getattr(mine, name), getattr(came, name)
        return TemporalSample(**cols)

    def _sample_held(self, ids: np.ndarray, times: np.ndarray, k: int, hop: int, strategy: str, seed: int,
                     features: Optional[Callable[[np.ndarray], np.ndarray]]) -> TemporalSample:
        """The sample of queries for nodes this rank owns (`ids`, global), with the sampled
        events' feature rows (`feat`, zero in padding) where `features` is given."""
        s = sample_tcsr(*self.tcsr, self.streams[ids - self.lo], times, k, strategy, seed, hop, rows=ids - self.lo)
        if features is not None:
            held = features(s.eid[s.mask])
            s.feat = np.zeros((ids.size, k, held.shape[1]), held.dtype)
            s.feat[s.mask] = held
        return s

    def sample(self, nodes, times, k: int, strategy: str = "recent", seed: int = 0) -> TemporalSample:
        """Like `sample_temporal_neighbors`, for any nodes; a collective."""
        nodes, times = check_query(nodes, times, k, strategy, self.num_nodes)
        return self.sample_hop(nodes, times, int(k), 0, strategy, seed)

    def sample_multihop(self, nodes, times, ks: Sequence[int], strategy: str = "recent",
                        seed: int = 0) -> list[TemporalSample]:
        """Like `sample_temporal_multihop`; a collective (one round per hop)."""
        nodes, times = check_query(nodes, times, min(ks, default=1), strategy, self.num_nodes)
        return multihop(lambda n, t, k, h: self.sample_hop(n, t, k, h, strategy, seed), nodes, times, ks)
