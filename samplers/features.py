"""Distributed features: rows of a node (or edge) feature matrix by global id.

Rows held by this rank are read in place; the others are fetched from their owners per
call, in one batched exchange of ids and one of rows, behind an optional cache
(`none`, `degree`, `presample`, `adaptive`; see `gnndist.samplers.cache`).

Counters count UNIQUE REMOTE ids per `fetch` call; rows held locally are counted apart
(`local`) and never in requests/hits/misses, so hits + misses == requests.
`bytes_fetched` / `bytes_saved` are feature payload bytes of misses / hits. `stats()` adds
`fill_bytes`: what filling the cache cost (once per `set_cache`, not per epoch).
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from gnndist.runtime import dist as gdist
from gnndist.errors import GnndistError
from gnndist.samplers.cache import capacity_rows, make_cache
from gnndist.partition.book import PartitionBook
from gnndist.samplers.distributed import Requests, sampler_group

COUNTERS = ("requests", "hits", "misses", "local", "bytes_fetched", "bytes_saved")


def hit_rate(hits: float, requests: float) -> Optional[float]:
    """Cache hits over remote row requests; None when there were none."""
    return hits / requests if requests else None


class _OwnedRows:
    """The rows of the ids rank `rank` owns in `book`."""

    def __init__(self, book: PartitionBook, rank: int) -> None:
        self.book, self.rank = book, rank
        self.lo, self.hi = book.range(rank)
        self.num_ids = book.num_nodes

    def owner(self, ids: np.ndarray) -> np.ndarray:
        return self.book.owner(ids)

    def position(self, ids: np.ndarray) -> np.ndarray:
        """Local row of each id, -1 where not held here."""
        return np.where((ids >= self.lo) & (ids < self.hi), ids - self.lo, -1)


class _HeldBook:
    """Rows of a sorted set of ids held here (`held`); a request names, per id, a rank holding it."""

    def __init__(self, held: np.ndarray, num_ids: int) -> None:
        self.held, self.num_ids = held, int(num_ids)

    def owner(self, ids: np.ndarray) -> np.ndarray:
        raise GnndistError("rows of held ids are fetched with the ranks that hold them named (`holders`)")

    def position(self, ids: np.ndarray) -> np.ndarray:
        """Local row of each id, -1 where not held here."""
        pos = np.searchsorted(self.held, ids)
        ok = pos < self.held.size
        ok[ok] = self.held[pos[ok]] == ids[ok]
        return np.where(ok, pos, -1)


class DistFeatures:
    """Rows of a `[num_ids, F]` matrix spread over ranks; `fetch(ids)` returns any rows.

    `local_rows` are the rows of the ids this rank owns in `book`
    (node features), or of any sorted id set (`for_events`: the events a rank holds, where
    `fetch` is told which rank holds each id). `fetch` and `set_cache` are collectives: every
    rank calls them the same number of times.
    """

    def __init__(self, local_rows: np.ndarray, book: Optional[PartitionBook] = None, group: Any = None,
                 _book: Any = None) -> None:
        self.group = sampler_group() if group is None else group
        self.local_rows = np.asarray(local_rows)
        if self.local_rows.ndim != 2:
            raise GnndistError(f"feature rows must be 2-d, got shape {self.local_rows.shape}")
        self.book = _book if _book is not None else _OwnedRows(book.for_world(gdist.world_size()), gdist.rank())
        if _book is None and self.book.hi - self.book.lo != self.local_rows.shape[0]:
            raise GnndistError(f"rank {self.book.rank}: {self.local_rows.shape[0]} feature rows, "
                               f"its id range has {self.book.hi - self.book.lo}")
        self.row_bytes = int(self.local_rows.shape[1] * self.local_rows.itemsize)
        self.policy, self.cache, self.fill_bytes = "none", None, 0
        self.reset_counters()

    @classmethod
    def for_events(cls, local_rows: np.ndarray, eid: np.ndarray, num_events: int, group: Any = None
                   ) -> "DistFeatures":
        """Edge features of the events this rank holds (`eid`, increasing global event ids, one
        row each) out of `num_events`: no table over all events is built."""
        eid = np.asarray(eid, dtype=np.int64)
        if eid.size != np.asarray(local_rows).shape[0]:
            raise GnndistError(f"{eid.size} event ids for {np.asarray(local_rows).shape[0]} feature rows")
        if eid.size > 1 and np.any(np.diff(eid) <= 0):
            raise GnndistError("event ids of feature rows must be increasing")
        return cls(local_rows, group=group, _book=_HeldBook(eid, num_events))

    @classmethod
    def from_partition(cls, part: Any, group: Any = None) -> "DistFeatures":
        """Node features (`part.x`) of a static partition."""
        return cls(part.x, part.book, group)

    @property
    def num_ids(self) -> int:
        return self.book.num_ids

    @property
    def dim(self) -> int:
        return int(self.local_rows.shape[1])

    def reset_counters(self) -> None:
        """Zero the counters (e.g. at the start of an epoch)."""
        self.counters = dict.fromkeys(COUNTERS, 0)

    def stats(self) -> dict:
        """Counters plus hit rate and cache occupancy."""
        c = dict(self.counters)
        c["hit_rate"] = hit_rate(c["hits"], c["requests"])
        c["policy"] = self.policy
        c["cached_rows"] = 0 if self.cache is None else self.cache.size
        c["fill_bytes"] = self.fill_bytes
        return c

    def _remote(self, ids: np.ndarray, holders: np.ndarray) -> np.ndarray:
        """Rows of `ids` from the ranks `holders` (one exchange of ids, one of rows)."""
        req = Requests(ids, holders, self.group)
        pos = self.book.position(req.received)
        if np.any(pos < 0):
            raise RuntimeError(f"rank {gdist.rank()} was asked for feature rows it does not hold")
        return req.reply(self.local_rows[pos])

    def fetch(self, ids, holders: Optional[np.ndarray] = None) -> torch.Tensor:
        """Rows of `ids` (global ids, any order, repeats allowed) as a CPU tensor; a collective.
        `holders`: a rank holding each id (required for `for_events` stores, else the owner)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_ids):
            raise GnndistError(f"feature ids must lie in [0, {self.num_ids})")
        out = np.empty((ids.size, self.dim), self.local_rows.dtype)
        pos = self.book.position(ids)
        here = pos >= 0
        out[here] = self.local_rows[pos[here]]
        uniq, first, inv = np.unique(ids[~here], return_index=True, return_inverse=True)
        slot = self.cache.slot[uniq] if self.cache is not None else np.full(uniq.size, -1)
        hit = slot >= 0
        miss_ids = uniq[~hit]
        owner = (self.book.owner(miss_ids) if holders is None
                 else np.asarray(holders, np.int64).reshape(-1)[~here][first[~hit]])
        miss_rows = self._remote(miss_ids, owner)
        rows = np.empty((uniq.size, self.dim), self.local_rows.dtype)
        rows[~hit] = miss_rows
        if self.cache is not None:
            rows[hit] = self.cache.rows[slot[hit]]
        out[~here] = rows[inv]
        if self.cache is not None:
            self.cache.observe(uniq, miss_ids, miss_rows)
        n_hit = int(hit.sum())
        c = self.counters
        c["requests"] += uniq.size
        c["hits"] += n_hit
        c["misses"] += miss_ids.size
        c["local"] += int(here.sum())
        c["bytes_fetched"] += miss_ids.size * self.row_bytes
        c["bytes_saved"] += n_hit * self.row_bytes
        return torch.from_numpy(out)

    def capacities(self, capacity: Optional[float]) -> list[int]:
        """The cache rows of every rank for a cache of `capacity` (see `set_cache`; a collective)."""
        mine = capacity_rows(capacity, self.num_remote, self.row_bytes)
        return [int(c) for c in torch.cat(gdist.all_gather_varsize(torch.tensor([mine]), self.group)).tolist()]

    @property
    def num_remote(self) -> int:
        """How many ids this rank does not hold."""
        return self.num_ids - self.local_rows.shape[0]

    def set_cache(self, policy: str, capacity: Optional[float] = None, scores: Optional[np.ndarray] = None,
                  candidates: Optional[tuple[np.ndarray, np.ndarray, np.ndarray]] = None) -> None:
        """Put a cache in front of the remote path; a collective (it fetches the first rows).

        `capacity`: a fraction (<= 1) of the remote ids, or bytes (> 1) (None: `validate.CACHE_SIZE`). What ranks ids for
        `degree` and `presample` (required for them, an optional first fill for `adaptive`):
        `scores` [num_ids] of a node store (degrees, see `degree_scores`; visit counts, see
        `visit_scores`), or `candidates` = (ids, scores, holders) of remote ids of an event store.
        """
        sparse = isinstance(self.book, _HeldBook)
        cache = make_cache(policy, self.num_ids, capacity_rows(capacity, self.num_remote, self.row_bytes),
                           self.dim, self.local_rows.dtype, sparse)
        if policy in ("degree", "presample") and scores is None and candidates is None:
            raise GnndistError(f"cache policy {policy} needs scores")
        fill = holders = np.empty(0, np.int64)
        if cache is not None and scores is not None:
            scores = np.asarray(scores)
            if scores.shape != (self.num_ids,):
                raise GnndistError(f"cache scores must have one entry per id ({self.num_ids}), got {scores.shape}")
            all_ids = np.arange(self.num_ids, dtype=np.int64)
            remote = all_ids[self.book.position(all_ids) < 0]
            fill = cache.choose(scores[remote], remote)
            holders = self.book.owner(fill)
        elif cache is not None and candidates is not None:
            ids, score, held_by = (np.asarray(a) for a in candidates)
            fill = cache.choose(score, ids)
            order = np.argsort(ids, kind="stable")
            holders = held_by[order][np.searchsorted(ids[order], fill)]
        rows = self._remote(fill, holders)
        if cache is not None:
            cache.fill(fill, rows)
        self.policy, self.cache = policy, cache
        self.fill_bytes = fill.size * self.row_bytes


def degree_scores(indices: np.ndarray, num_nodes: int) -> np.ndarray:
    """How many CSR rows, over all ranks, list each node (how often it can be sampled: its
    out-degree in message direction); a collective (one all-reduce on the samplers' CPU group,
    so it also works when the trainers' backend is NCCL)."""
    counts = torch.from_numpy(np.bincount(np.asarray(indices, dtype=np.int64), minlength=num_nodes))
    return gdist.all_reduce(counts, group=sampler_group()).numpy()


def visit_scores(node_id_batches, num_nodes: int) -> np.ndarray:
    """How often each node appears in sampled batches (arrays of global ids, e.g. the
    `node_ids` of one epoch of `Blocks`): the `presample` policy's scores."""
    counts = np.zeros(num_nodes, np.int64)
    for ids in node_id_batches:
        np.add.at(counts, np.asarray(ids, dtype=np.int64), 1)
    return counts
