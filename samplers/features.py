"""A distributed feature store: rows of a node (or edge) feature matrix by global id.

Rows held by this rank are read in place; the others are fetched from their owners per
call, in one batched exchange of ids and one of rows, behind an optional cache
(`none`, `degree`, `presample`, `adaptive`; see `gnndist.samplers.cache`).

Counters count UNIQUE REMOTE ids per `fetch` call; rows held locally are counted apart
(`local`) and never in requests/hits/misses, so hits + misses == requests.
`bytes_fetched` / `bytes_saved` are feature payload bytes of misses / hits. `stats()` adds
`fill_bytes`: what filling the cache cost (once per `set_cache`, not per epoch).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import torch

from gnndist import dist as gdist
from gnndist.errors import GnndistError
from gnndist.samplers.cache import capacity_rows, make_cache
from gnndist.graph import owners
from gnndist.samplers.distributed import Requests, check_offsets, sampler_group

COUNTERS = ("requests", "hits", "misses", "local", "bytes_fetched", "bytes_saved")


class _RangeBook:
    """Ownership by contiguous id ranges: rank r holds ids offsets[r] .. offsets[r+1]-1."""

    def __init__(self, offsets: np.ndarray, rank: int) -> None:
        self.offsets, self.rank = offsets, rank
        self.lo, self.hi = int(offsets[rank]), int(offsets[rank + 1])
        self.num_ids = int(offsets[-1])

    def owner(self, ids: np.ndarray) -> np.ndarray:
        return owners(ids, self.offsets)

    def position(self, ids: np.ndarray) -> np.ndarray:
        """Local row of each id, -1 where not held here."""
        return np.where((ids >= self.lo) & (ids < self.hi), ids - self.lo, -1)


class _ExplicitBook:
    """Ownership by a table: ids may be held by several ranks; the lowest holder serves them."""

    def __init__(self, local_ids: np.ndarray) -> None:
        self.rank = gdist.rank()
        self.num_ids = gdist.agree_max(int(local_ids.max(initial=-1)) + 1)
        held = gdist.all_gather_varsize(torch.from_numpy(local_ids))
        self.owners = np.full(self.num_ids, -1, np.int32)
        for r in reversed(range(len(held))):
            self.owners[held[r].numpy()] = r
        self.pos = np.full(self.num_ids, -1, np.int64)
        self.pos[local_ids] = np.arange(local_ids.size)

    def owner(self, ids: np.ndarray) -> np.ndarray:
        return self.owners[ids].astype(np.int64)

    def position(self, ids: np.ndarray) -> np.ndarray:
        return self.pos[ids]


class FeatureStore:
    """Rows of a `[num_ids, F]` matrix spread over ranks; `fetch(ids)` returns any rows.

    `local_rows` are the rows of the ids this rank owns: node_offsets[r] .. node_offsets[r+1]-1.
    `fetch` and `set_cache` are collectives: every rank calls them the same number of times.
    """

    def __init__(self, local_rows: np.ndarray, node_offsets: Optional[Sequence[int]] = None, group: Any = None,
                 _book: Any = None) -> None:
        self.group = sampler_group() if group is None else group
        self.local_rows = np.asarray(local_rows)
        if self.local_rows.ndim != 2:
            raise GnndistError(f"feature rows must be 2-d, got shape {self.local_rows.shape}")
        self.book = _book if _book is not None else _RangeBook(check_offsets(node_offsets), gdist.rank())
        if _book is None and self.book.hi - self.book.lo != self.local_rows.shape[0]:
            raise GnndistError(f"rank {self.book.rank}: {self.local_rows.shape[0]} feature rows, "
                               f"its id range has {self.book.hi - self.book.lo}")
        self.row_bytes = int(self.local_rows.shape[1] * self.local_rows.itemsize)
        self.policy, self.cache, self.fill_bytes = "none", None, 0
        self.reset_counters()

    @classmethod
    def for_ids(cls, local_rows: np.ndarray, local_ids: np.ndarray, group: Any = None) -> "FeatureStore":
        """A store whose ranks hold arbitrary, possibly overlapping id sets (edge features of
        the events touching a partition). Builds an owner table of all ids: a collective."""
        local_ids = np.asarray(local_ids, dtype=np.int64)
        if local_ids.size != np.asarray(local_rows).shape[0]:
            raise GnndistError(f"{local_ids.size} ids for {np.asarray(local_rows).shape[0]} feature rows")
        return cls(local_rows, group=group, _book=_ExplicitBook(local_ids))

    @classmethod
    def from_partition(cls, part: Any, group: Any = None) -> "FeatureStore":
        """Node features (`part.x`) of a static partition."""
        return cls(part.x, part.node_offsets, group)

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
        c["hit_rate"] = c["hits"] / c["requests"] if c["requests"] else 0.0
        c["policy"] = self.policy
        c["cached_rows"] = 0 if self.cache is None else self.cache.size
        c["fill_bytes"] = self.fill_bytes
        return c

    def _remote(self, ids: np.ndarray) -> np.ndarray:
        """Rows of `ids` from their owners (one exchange of ids, one of rows)."""
        req = Requests(ids, self.book.owner(ids), self.group)
        return req.reply(self.local_rows[self.book.position(req.received)])

    def fetch(self, ids) -> torch.Tensor:
        """Rows of `ids` (global ids, any order, repeats allowed) as a CPU tensor; a collective."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_ids):
            raise GnndistError(f"feature ids must lie in [0, {self.num_ids})")
        out = np.empty((ids.size, self.dim), self.local_rows.dtype)
        pos = self.book.position(ids)
        here = pos >= 0
        out[here] = self.local_rows[pos[here]]
        uniq, inv = np.unique(ids[~here], return_inverse=True)
        slot = self.cache.slot[uniq] if self.cache is not None else np.full(uniq.size, -1)
        hit = slot >= 0
        miss_ids = uniq[~hit]
        miss_rows = self._remote(miss_ids)
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

    def remote_ids(self) -> np.ndarray:
        """The ids not held by this rank."""
        all_ids = np.arange(self.num_ids, dtype=np.int64)
        return all_ids[self.book.position(all_ids) < 0]

    def set_cache(self, policy: str, capacity: float = 0.1, scores: Optional[np.ndarray] = None) -> None:
        """Put a cache in front of the remote path; a collective (it fetches the first rows).

        `capacity`: a fraction (<= 1) of the remote ids, or bytes (> 1). `scores` [num_ids]:
        what ranks ids for `degree` (degrees, see `degree_scores`) and `presample` (visit
        counts, see `visit_scores`); required for them, optional first fill for `adaptive`.
        """
        remote = self.remote_ids()
        cache = make_cache(policy, self.num_ids, capacity_rows(capacity, remote.size, self.row_bytes),
                           self.dim, self.local_rows.dtype)
        if policy in ("degree", "presample") and scores is None:
            raise GnndistError(f"cache policy {policy} needs scores")
        fill = np.empty(0, np.int64)
        if cache is not None and scores is not None:
            scores = np.asarray(scores)
            if scores.shape != (self.num_ids,):
                raise GnndistError(f"cache scores must have one entry per id ({self.num_ids}), got {scores.shape}")
            fill = cache.choose(scores, remote)
        rows = self._remote(fill)
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
