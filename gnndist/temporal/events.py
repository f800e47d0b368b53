"""The events one rank holds, and which of them it scores in each global batch.

A rank holds its part of a temporal partition store: every event with an endpoint it owns (node
ids renumbered so that it owns the contiguous range lo .. hi-1), with global event ids in time
order, their times, edge features and labels, plus the id maps (per node, not per event). Global
batch i is the events [iB, (i+1)B); the events of it whose source node a rank owns (each event
has exactly one such rank) are found by a binary search in its own sorted event ids. With
`share="even"` (`even_out`) the ranks then even out their counts per batch, a rank above an even
portion sending its surplus (with their negatives and edge features) to ranks below it: a
temporal partition's batches crowd into one part or another (docs/benchmarks.md, "Measurements
behind the code"), and every step waits for the busiest rank. One process is the same with one part: the whole graph, ids
unchanged.

No array here has one entry per event of the whole graph: `eid`, `src`, `dst`, `t`,
`edge_feat`, `edge_label` have one per held event, the T-CSR one per (held event, owned
endpoint), and the id maps one per node.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

import numpy as np
import torch

from gnndist.runtime import dist
from gnndist.graph import TemporalGraph, tcsr_rows
from gnndist.partition import Partition, PartitionBook


@dataclass(eq=False)
class RankEvents:
    """What one rank holds of a temporal graph (see the module docstring)."""

    rank: int
    num_parts: int
    num_nodes: int  # of the whole graph
    num_events: int  # of the whole graph
    book: PartitionBook  # which rank owns each node
    orig_to_new: np.ndarray  # [N] new id of every original node id
    new_to_orig: np.ndarray  # [N]
    eid: np.ndarray  # held events: global ids, increasing
    src: np.ndarray  # new ids
    dst: np.ndarray
    t: np.ndarray
    edge_feat: Optional[np.ndarray] = None
    edge_label: Optional[np.ndarray] = None

    def __post_init__(self) -> None:
        self.lo, self.hi = self.book.range(self.rank)
        self.scored = np.flatnonzero((self.src >= self.lo) & (self.src < self.hi))  # positions of own events
        self.scored_eid = self.eid[self.scored]  # their global ids, increasing
        self._tcsr: Optional[tuple] = None

    def partition_key(self) -> Optional[str]:
        """What tells this store's partition from another of the same graph (a digest of which
        rank owns each node), or None in one process: a checkpoint's node state is per owner."""
        if self.num_parts == 1:
            return None
        digest = hashlib.sha256(np.ascontiguousarray(self.orig_to_new, np.int64).tobytes())
        digest.update(self.book.offsets.tobytes())
        return digest.hexdigest()[:16]

    @classmethod
    def from_graph(cls, tg: TemporalGraph) -> "RankEvents":
        """The whole graph on one rank (ids unchanged; the arrays are the graph's, not copies)."""
        ids = np.arange(tg.num_nodes, dtype=np.int64)
        return cls(0, 1, tg.num_nodes, tg.num_events, PartitionBook.whole(tg.num_nodes), ids, ids,
                   np.arange(tg.num_events, dtype=np.int64), tg.src, tg.dst, tg.t, tg.edge_feat, tg.edge_label)

    @classmethod
    def from_partition(cls, part: Partition, new_to_orig: np.ndarray, orig_to_new: np.ndarray) -> "RankEvents":
        """Part `part.part_id` of a temporal store, with the store's id maps (`load_id_maps`)."""
        return cls(part.part_id, part.num_parts, part.num_nodes, part.num_events, part.book, orig_to_new,
                   new_to_orig, part.eid, part.src, part.dst, part.t, part.edge_feat,
                   part.edge_label)

    def scale(self) -> str:
        """The size of this rank's times and edge features, in words (for a loss that became NaN)."""
        span = float(self.t.max() - self.t.min()) if self.t.size else 0.0
        feat = f", edge features up to {float(np.abs(self.edge_feat).max()):.3g} in size" \
            if self.edge_feat is not None and self.edge_feat.size else ""
        return f"times spanning {span:.3g}{feat}"

    @property
    def edge_dim(self) -> int:
        return 0 if self.edge_feat is None else int(self.edge_feat.shape[1])

    @property
    def num_held(self) -> int:
        return int(self.eid.size)

    @property
    def orig_ids(self) -> np.ndarray:
        """Original id of every owned node (what random streams are keyed by)."""
        return self.new_to_orig[self.lo:self.hi]

    def owns(self, nodes: np.ndarray) -> np.ndarray:
        return (nodes >= self.lo) & (nodes < self.hi)

    def tcsr(self, progress: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """T-CSR `(indptr, nbr, eid, ts)` of the owned nodes (rows lo .. hi-1), built once
        (`progress`: a bar while it is built)."""
        if self._tcsr is None:
            self._tcsr = tcsr_rows(self.src, self.dst, self.t, self.eid, self.lo, self.hi, progress)
        return self._tcsr

    def scored_in(self, start: int, stop: int) -> np.ndarray:
        """Positions (in the held arrays) of the events this rank scores among the global events
        [start, stop), in event order."""
        own = self.scored_eid
        return self.scored[np.searchsorted(own, start):np.searchsorted(own, stop)]

    def first_seen(self) -> np.ndarray:
        """[hi - lo] the first event id of each owned node (num_events where it has none)."""
        first = np.full(self.hi - self.lo, self.num_events, np.int64)
        for ends in (self.src, self.dst):
            own = self.owns(ends)
            np.minimum.at(first, ends[own] - self.lo, self.eid[own])
        return first


class BatchEvents(NamedTuple):
    """A rank's events of one global batch, as host arrays: endpoints, times, negatives [B, n],
    global event ids, edge features [B, D]."""

    src: np.ndarray
    dst: np.ndarray
    t: np.ndarray
    neg: np.ndarray
    eid: np.ndarray
    feat: np.ndarray


def even_moves(counts: np.ndarray) -> np.ndarray:
    """[k, W, W]: how many events rank r sends rank q in each of k global batches, given each
    rank's count of them ([W, k]), so that every rank ends with an even portion (the first
    `total % W` ranks one more): the surpluses of the ranks above their portion, laid end to end
    in rank order, fill the shortfalls of those below it, laid out the same way."""
    w = counts.shape[0]
    total = counts.sum(0)
    diff = (counts - (total // w + (np.arange(w)[:, None] < total % w))).T  # [k, W]
    give, take = np.maximum(diff, 0), np.maximum(-diff, 0)
    a, b = np.cumsum(give, 1), np.cumsum(take, 1)  # each surplus and shortfall ends at a, b
    return np.maximum(np.minimum(a[:, :, None], b[:, None, :])
                      - np.maximum((a - give)[:, :, None], (b - take)[:, None, :]), 0)


def even_out(batches: list[BatchEvents], book: PartitionBook, group: Any) -> list[BatchEvents]:
    """This rank's events of each global batch once the ranks have evened out their counts (a
    collective: one gather of the counts, one exchange of the events moved): a rank above an
    even portion sends its surplus, those whose destination the receiver owns first, the rest
    from the end of the batch. Each batch's events stay in event order. The window's batches
    are handled together, as one array per column (a loop per batch cost the planning of a
    window much of its CPU time)."""
    w, me, k = dist.world_size(), dist.rank(), len(batches)
    sizes = np.array([b.src.size for b in batches], np.int64)
    counts = torch.stack(dist.all_gather_varsize(torch.from_numpy(sizes), group, [k] * w)).numpy()
    moves = even_moves(counts)  # [k, W, W]
    window = BatchEvents(*(np.concatenate(c) for c in zip(*batches)))  # batch after batch
    batch = np.repeat(np.arange(k), sizes)
    to = _receivers(batch, book.owner(window.dst), moves[:, me])
    like = [(torch.from_numpy(c).dtype, c.shape[1:]) for c in window]
    got = dist.exchange([dist.pack([torch.from_numpy(c[at]) for c in window])
                         for at in (np.flatnonzero(to == q) for q in range(w))], group,
                        recv_sizes=[int(moves[:, r, me].sum()) for r in range(w)])
    kept = to < 0
    came = [[c.numpy() for c in dist.unpack(g, like)] for g in got]
    held = BatchEvents(*(np.concatenate([c[kept], *(r[i] for r in came)]) for i, c in enumerate(window)))
    held_batch = np.concatenate([batch[kept], *(np.repeat(np.arange(k), moves[:, r, me]) for r in range(w))])
    o = np.lexsort((held.eid, held_batch))  # by batch, then event id
    cuts = np.cumsum(np.bincount(held_batch, minlength=k))[:-1]
    return [BatchEvents(*parts) for parts in zip(*(np.split(c[o], cuts) for c in held))]


def _place_in_run(sorted_keys: np.ndarray) -> np.ndarray:
    """Each entry's position among the equal entries of `sorted_keys` (0: the first of its run)."""
    return np.arange(sorted_keys.size) - np.searchsorted(sorted_keys, sorted_keys)


def _receivers(batch: np.ndarray, dst_owner: np.ndarray, quota: np.ndarray) -> np.ndarray:
    """The rank each event goes to (-1: kept), given each event's batch and destination's owner,
    and how many events of each batch go to each rank (`quota`, [k, W]): per batch and receiver q
    (in rank order), first the events whose destination q owns, then any not yet sent, from the
    end of the batch."""
    w, to = quota.shape[1], np.full(batch.size, -1)
    key = batch * w + dst_owner
    o = np.argsort(key, kind="stable")
    grouped = key[o]  # by batch, then destination owner
    sent = o[_place_in_run(grouped) < quota[batch[o], dst_owner[o]]]
    to[sent] = dst_owner[sent]
    short = quota - np.bincount(key[sent], minlength=quota.size).reshape(quota.shape)
    rest = np.flatnonzero(to < 0)[::-1]  # from the end of each batch (batches last to first)
    pos = _place_in_run(-batch[rest])  # 0: the batch's last event not yet sent
    q = (np.cumsum(short, 1)[batch[rest]] <= pos[:, None]).sum(1)
    to[rest[q < w]] = q[q < w]
    return to
