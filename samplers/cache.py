"""Caches of remote feature rows, kept on each rank in front of the remote fetch path.

- `StaticCache` holds the top-capacity remote ids by a score fixed at fill time: node degree
  (policy `degree`, as PaGraph) or visit counts from one epoch of real sampling (policy
  `presample`, as GNNLab).
- `AdaptiveCache` (policy `adaptive`) starts like `degree` (or empty) and re-ranks at run
  time: every fetch adds to an exponentially decayed visit count of the requested ids (the
  fill scores enter as a calibrated prior), and rows that just missed replace cached rows
  with a lower count. Admission costs no traffic: the rows are already here from the miss.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from gnndist.errors import GnndistError

POLICIES = ("none", "degree", "presample", "adaptive")


def capacity_rows(capacity: float, num_remote: int, row_bytes: int) -> int:
    """Rows a capacity means: a fraction (<= 1) of the remote ids, or a byte budget (> 1)."""
    if not capacity >= 0:
        raise GnndistError(f"cache capacity must be >= 0, got {capacity}")
    rows = int(capacity * num_remote) if capacity <= 1 else int(capacity // max(row_bytes, 1))
    return min(rows, num_remote)


class StaticCache:
    """Rows of up to `capacity` ids; `slot[id]` is its row or -1."""

    def __init__(self, num_ids: int, capacity: int, dim: int, dtype: np.dtype) -> None:
        self.capacity = int(capacity)
        self.slot = np.full(num_ids, -1, np.int64)
        self.ids = np.empty(self.capacity, np.int64)
        self.rows = np.empty((self.capacity, dim), dtype)
        self.size = 0

    def choose(self, scores: np.ndarray, remote: np.ndarray) -> np.ndarray:
        """The ids to fill with: up to capacity remote ids of highest positive score."""
        cand = remote[scores[remote] > 0]
        if cand.size > self.capacity:
            cand = cand[np.argpartition(-scores[cand], self.capacity - 1)[: self.capacity]]
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

    def __init__(self, num_ids: int, capacity: int, dim: int, dtype: np.dtype, half_life: float = 300.0) -> None:
        super().__init__(num_ids, capacity, dim, dtype)
        self.score = np.zeros(num_ids, np.float64)
        self.growth = 2.0 ** (1.0 / half_life)
        self.weight = 1.0
        self.prior: Optional[tuple[np.ndarray, np.ndarray]] = None

    def choose(self, scores: np.ndarray, remote: np.ndarray) -> np.ndarray:
        self.prior = (remote, np.asarray(scores[remote], dtype=np.float64))
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
            self.score /= self.weight
            self.weight = 1.0
        if self.prior is not None and requested.size:
            self._apply_prior(requested.size)
        self.score[requested] += self.weight
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


def make_cache(policy: str, num_ids: int, capacity: int, dim: int, dtype: np.dtype) -> Optional[StaticCache]:
    """The cache object of a policy (None for `none`)."""
    if policy not in POLICIES:
        raise GnndistError(f"cache policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    if policy == "none":
        return None
    cls = AdaptiveCache if policy == "adaptive" else StaticCache
    return cls(num_ids, capacity, dim, dtype)
