"""Caches of remote feature rows, kept on each rank in front of the remote fetch path.

- `StaticCache` holds the top-capacity remote ids by a score fixed at fill time: node degree
  (policy `degree`, as PaGraph) or visit counts from one epoch of real sampling (policy
  `presample`, as GNNLab).
- `AdaptiveCache` (policy `adaptive`) starts like `degree` (or empty) and re-ranks at run
  time: every fetch adds to an exponentially decayed visit count of the requested ids (the
  fill scores enter as a calibrated prior), and rows that just missed replace cached rows
  with a lower count. Admission costs no traffic: the rows are already here from the miss.

What fills an event-feature cache: `degree_offers` (each holder offers the events it scores
highest) and `RequestCounts` (the requests of one sampling pass).
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from gnndist.errors import GnndistError
from gnndist.partition.book import PartitionBook
from gnndist.runtime import dist as gdist
from gnndist.validate import CACHE_POLICIES as POLICIES, cache_capacity


class SparseMap:
    """An id -> value table holding few ids of a huge id space (sorted keys; ids absent read as
    `default`, and setting `default` removes them): the caches' `slot` and `score` tables where a
    dense array with one entry per id would grow with the whole graph (event ids)."""

    def __init__(self, default: float, dtype: np.dtype) -> None:
        self.default, self.dtype = default, np.dtype(dtype)
        self.keys = np.zeros(0, np.int64)
        self.values = np.zeros(0, self.dtype)

    def __len__(self) -> int:
        return self.keys.size

    def _find(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pos = np.searchsorted(self.keys, ids)
        found = pos < self.keys.size
        found[found] = self.keys[pos[found]] == ids[found]
        return pos, found

    def __getitem__(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, np.int64)
        pos, found = self._find(ids)
        out = np.full(ids.shape, self.default, self.dtype)
        out[found] = self.values[pos[found]]
        return out

    def __setitem__(self, ids: np.ndarray, values) -> None:
        ids = np.asarray(ids, np.int64).reshape(-1)
        values = np.broadcast_to(np.asarray(values, self.dtype), ids.shape)
        pos, found = self._find(ids)
        self.values[pos[found]] = values[found]
        new = ~found & (values != self.default)
        if new.any():
            keys = np.concatenate([self.keys, ids[new]])
            order = np.argsort(keys, kind="stable")
            self.keys, self.values = keys[order], np.concatenate([self.values, values[new]])[order]
        gone = self.values == self.default
        if gone.any():
            self.keys, self.values = self.keys[~gone], self.values[~gone]

    def shrink(self, size: int, keep: np.ndarray) -> None:
        """Keep at most `size` entries besides the ids `keep`: those of largest value."""
        if self.keys.size <= size + keep.size:
            return
        protected = np.isin(self.keys, keep)
        others = np.flatnonzero(~protected)
        top = others[np.argpartition(-self.values[others], size - 1)[:size]] if size else others[:0]
        rows = np.sort(np.concatenate([np.flatnonzero(protected), top]))
        self.keys, self.values = self.keys[rows], self.values[rows]


def capacity_rows(capacity: Optional[float], num_remote: int, row_bytes: int) -> int:
    """Rows a capacity means: a fraction (<= 1) of the remote ids, or a byte budget (> 1) (None:
    `validate.CACHE_SIZE`)."""
    capacity = cache_capacity(capacity)
    if not capacity >= 0:
        raise GnndistError(f"cache capacity must be >= 0, got {capacity}")
    rows = int(capacity * num_remote) if capacity <= 1 else int(capacity // max(row_bytes, 1))
    return min(rows, num_remote)


class StaticCache:
    """Rows of up to `capacity` ids; `slot[id]` is its row or -1 (a dense array, or a
    `SparseMap` when `sparse`)."""

    def __init__(self, num_ids: int, capacity: int, dim: int, dtype: np.dtype, sparse: bool = False) -> None:
        self.capacity = int(capacity)
        self.slot = SparseMap(-1, np.int64) if sparse else np.full(num_ids, -1, np.int64)
        self.ids = np.empty(self.capacity, np.int64)
        self.rows = np.empty((self.capacity, dim), dtype)
        self.size = 0

    def choose(self, scores: np.ndarray, remote: np.ndarray) -> np.ndarray:
        """The ids to fill with: up to capacity of the `remote` ids (their `scores`, aligned)
        of highest positive score."""
        keep = scores > 0
        cand, score = remote[keep], scores[keep]
        if cand.size > self.capacity:
            cand = cand[np.argpartition(-score, self.capacity - 1)[: self.capacity]] if self.capacity else cand[:0]
        return np.sort(cand)

    def fill(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Replace the content with these ids and rows."""
        self.slot[self.ids[: self.size]] = -1
        self.size = ids.size
        self.ids[: self.size], self.rows[: self.size] = ids, rows
        self.slot[ids] = np.arange(ids.size)

    def observe(self, requested: np.ndarray, miss_ids: np.ndarray, miss_rows: np.ndarray) -> None:
        """Called after each fetch with the unique remote ids requested and the rows that missed."""


class AdaptiveCache(StaticCache):
    """A cache that re-ranks by exponentially decayed visit counts at run time (half-life in
    fetches). The fill scores act as a prior: at the first fetch they are turned into expected
    visit probabilities 1 - exp(-lam * score), lam fitted so that they add up to the number
    of ids that fetch requested, and enter the counts as what such a node would have
    accumulated. Evidence then takes over at the pace of the decay, without flushing a good
    first fill on the noise of the first few batches. A missed id replaces the weakest cached
    one only if it wins even without the visit that just brought it."""

    def __init__(self, num_ids: int, capacity: int, dim: int, dtype: np.dtype, sparse: bool = False,
                 half_life: float = 300.0) -> None:
        super().__init__(num_ids, capacity, dim, dtype, sparse)
        self.score = SparseMap(0.0, np.float64) if sparse else np.zeros(num_ids, np.float64)
        self.growth = 2.0 ** (1.0 / half_life)
        self.weight = 1.0
        self.prior: Optional[tuple[np.ndarray, np.ndarray]] = None

    def choose(self, scores: np.ndarray, remote: np.ndarray) -> np.ndarray:
        self.prior = (remote, np.asarray(scores, dtype=np.float64))
        return super().choose(scores, remote)

    def _apply_prior(self, n_requested: int) -> None:
        ids, s = self.prior
        self.prior = None
        keep = s > 0
        ids, s = ids[keep], s[keep]
        if s.size == 0:
            return
        lo, hi = np.log(1e-12 / s.mean()), np.log(1e12 / s.mean())
        for _ in range(60):  # bisection on log(lam): expected requests are increasing in lam
            mid = (lo + hi) / 2
            if -np.expm1(-np.exp(mid) * s).sum() < n_requested:
                lo = mid
            else:
                hi = mid
        p = -np.expm1(-np.exp(lo) * s)
        self.score[ids] += p / (1.0 - 1.0 / self.growth) * self.weight  # steady-state decayed count

    def observe(self, requested: np.ndarray, miss_ids: np.ndarray, miss_rows: np.ndarray) -> None:
        # decay is applied by growing the weight of new visits; rescale before overflow
        self.weight *= self.growth
        if self.weight > 1e200:
            if isinstance(self.score, SparseMap):
                self.score.values /= self.weight
            else:
                self.score /= self.weight
            self.weight = 1.0
        if self.prior is not None and requested.size:
            self._apply_prior(requested.size)
        self.score[requested] += self.weight
        if isinstance(self.score, SparseMap):  # bounded: the cached ids and the best 3x capacity others
            self.score.shrink(3 * self.capacity + requested.size, self.ids[: self.size])
        if self.capacity == 0 or miss_ids.size == 0:
            return
        cand_score = self.score[miss_ids]
        order = np.argsort(-cand_score, kind="stable")
        free = self.capacity - self.size
        if free > 0:  # fill free slots with the most visited misses
            take = order[:free]
            new = np.arange(self.size, self.size + take.size)
            self.ids[new], self.rows[new] = miss_ids[take], miss_rows[take]
            self.slot[miss_ids[take]] = new
            self.size += take.size
            order = order[free:]
        m = min(order.size, self.size)
        if m == 0:
            return
        cand = order[:m]  # best candidates, descending score
        held = self.score[self.ids[: self.size]]
        low = np.argpartition(held, m - 1)[:m] if m < self.size else np.arange(self.size)
        low = low[np.argsort(held[low], kind="stable")]  # weakest cached, ascending score
        # pairwise greedy gives the top of the union; a candidate must win even without the
        # visit that just brought it, so one lucky visit never evicts anything
        swap = cand_score[cand] - self.weight > held[low]
        slots, cand = low[swap], cand[swap]
        self.slot[self.ids[slots]] = -1
        self.ids[slots], self.rows[slots] = miss_ids[cand], miss_rows[cand]
        self.slot[miss_ids[cand]] = slots


def make_cache(policy: str, num_ids: int, capacity: int, dim: int, dtype: np.dtype, sparse: bool = False
               ) -> Optional[StaticCache]:
    """The cache object of a policy (None for `none`); `sparse` keeps its tables sized by the
    capacity instead of `num_ids`."""
    if policy not in POLICIES:
        raise GnndistError(f"cache policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    if policy == "none":
        return None
    cls = AdaptiveCache if policy == "adaptive" else StaticCache
    return cls(num_ids, capacity, dim, dtype, sparse)


# ----------------------------------------------------------------------------------------------
# What fills an event-feature cache (`--cache degree` and `presample` of temporal training)


def degree_offers(ids: np.ndarray, src: np.ndarray, dst: np.ndarray, score: np.ndarray, book: PartitionBook,
                  capacities: list[int], group: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The `degree` policy's candidates (a collective): each rank offers every other rank its
    items `ids` (events, with endpoints `src`, `dst` and `score`, e.g. their endpoints' event
    counts) touching none of that rank's nodes in `book`, the highest scores first, up to that
    rank's cache rows in `capacities`. Returns what was offered here: (ids, scores, holders)."""
    me, sends = gdist.rank(), []
    for r, cap in enumerate(capacities):
        lo, hi = book.range(r)
        far = np.flatnonzero(~(((src >= lo) & (src < hi)) | ((dst >= lo) & (dst < hi))))
        if r == me or far.size == 0 or cap == 0:
            far = far[:0]
        elif far.size > cap:
            far = far[np.argpartition(-score[far], cap - 1)[:cap]]
        sends.append(torch.from_numpy(np.stack([ids[far].astype(np.float64), score[far]], 1)))
    got = gdist.exchange(sends, group)
    holders = np.concatenate([np.full(g.shape[0], r, np.int64) for r, g in enumerate(got)])
    rows = gdist.joined(got).numpy()
    return rows[:, 0].astype(np.int64), rows[:, 1], holders


class RequestCounts:
    """How often each remote id was requested, and which rank holds it (the `presample` policy's
    candidates): a table kept bounded near `capacity` rows (the least requested dropped), so that
    it never grows with the whole graph."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(capacity, 1)
        self.ids, self.counts, self.holders = np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64)

    def add(self, ids: np.ndarray, holders: np.ndarray) -> None:
        """Count one request of each of `ids` (repeats count), held by `holders`."""
        eid = np.concatenate([ids, self.ids])
        weight = np.concatenate([np.ones(ids.size), self.counts])
        held_by = np.concatenate([holders, self.holders])
        self.ids, first, inv = np.unique(eid, return_index=True, return_inverse=True)
        self.counts, self.holders = np.bincount(inv, weights=weight), held_by[first]
        if self.ids.size > 8 * self.capacity:
            top = np.sort(np.argpartition(-self.counts, 4 * self.capacity)[:4 * self.capacity])
            self.ids, self.counts, self.holders = self.ids[top], self.counts[top], self.holders[top]

    def candidates(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids, request counts, holders)."""
        return self.ids, self.counts, self.holders
