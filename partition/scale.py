"""Partitioning shard files across the ranks of a process group (`partition_shards`): the first
step of the pipeline, as distributed as training. Rank r of W writes part r; no rank holds an
array with one entry per event or edge of the whole graph, only arrays sized by the node count
and by its own portion of events, edges or node pairs.

The phases (`PHASES`), all collectives on the ranks' gloo group:
- read: every rank lists DATA's shard files; the listings decide who reads what
  (`datasets.shards.plan_shards`); each rank reads its units in bounded chunks.
- ids: node ids are compacted globally, as one process numbers them (sorted original ids; a
  bipartite file's destinations after its sources): every rank ends with the sorted ids.
- sort (temporal): the events are numbered by (time, shard, row) as one process numbers them,
  through a sample sort of their keys alone; each rank learns its own events' ids.
- projection: the weighted node pairs (temporal: unique pairs, summed recency weights; static:
  the symmetrized edges) are summed at the rank that a hash of the pair names.
- partition: `random` hashes node ids; `temporal` and `metis` gather the projection to rank 0
  when it fits its memory budget and run METIS there exactly as one process does, which makes
  the store identical to one process's (rank 0's own events wait in files meanwhile, so that
  it holds METIS's graph alone beside the node-sized arrays); else `temporal-lp` / `metis-lp`
  run balanced label propagation over the distributed projection (`partition.propagation`).
- route: events (to the parts of both endpoints) or adjacency entries (to the part of their
  row) travel to the rank that writes their part, in all-to-all rounds of bounded size. A rank
  keeps the events that come within its memory budget (`runs.SortedRuns`): beyond it, sorted by
  event id, they are spilled in runs to a folder beside DIR (out of core).
- write: rank r writes part r into a folder beside DIR (events merged from the runs, a block at
  a time, into the bytes the in-memory path writes); the first rank of each host writes
  meta.json (the same bytes on every host) and the id maps; only once every rank has written,
  each host renames its folder into place, so a failure leaves every host's earlier store.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import numpy as np
import torch
from tqdm import tqdm

import gnndist
from gnndist.datasets.formats import Columns
from gnndist.datasets.shards import (Shards, agree_columns, check_node_listings, open_nodes, open_shards, plan_shards,
                                     read_columns, read_unit)
from gnndist.errors import GnndistError, first_line
from gnndist.graph import MASKS, _check_rows, _labels, _mask, indptr_of, unique_ints
from gnndist.io import sha256_file, write_json
from gnndist.outputs import check_output
from gnndist.partition import methods, stats
from gnndist.partition.book import PartitionBook
from gnndist.partition.propagation import propagate
from gnndist.partition.runs import SortedRuns, Table, write_npy
from gnndist.partition.store import FORMAT_VERSION, invert_permutation, meta_checksum
from gnndist.runtime import dist

PHASES = ("read", "ids", "sort", "projection", "partition", "route", "write")
ROUND_BYTES = 64 << 20  # what a rank sends in one all-to-all round of the route phase, at most
MIN_ROUND_ROWS = 128  # events a rank sends in a round of the route phase at least, whatever its budget
SAMPLES = 256  # keys each rank offers for the sample sort's splitters, per round
KEY_BYTES = 64  # what the sort holds for each key it ranks (time, place, origin, order, id, the exchange's copies)
# bytes METIS and the adjacency take per node pair and per node on the rank that runs it (its
# graph, weights and coarsening levels), for the fit of the projection against the budget
METIS_PAIR_BYTES, METIS_NODE_BYTES = 160, 200
# bytes label propagation holds for each node pair of a rank's at once: its pairs, and a round's
# weights by node and part on their way and summed
LP_PAIR_BYTES = 256


@dataclass
class Job:
    """One rank's partitioning run: its inputs, what it holds, and its run metrics."""

    data: str
    num_parts: int
    method: str
    params: dict
    budget: int
    out: Optional[Path]
    progress: bool
    group: Any = None
    kind: str = "temporal"
    shards: Optional[Shards] = None
    columns: Optional[Columns] = None
    # what this rank read of the events or edges (`runs.Table`; events beyond the budget in files):
    # endpoints "src", "dst" (ids compacted, int64), and for events "t" and "place" (the file
    # order: (shard << 47) | (piece << 37) | row) until the projection is made, and once sorted
    # "eid", their global ids (features and labels are read again when routed)
    portion: Optional[Table] = None
    ids: Optional[np.ndarray] = None  # [N] the sorted original ids (a bipartite graph: sources', then others')
    num_events: int = 0
    pairs: tuple = ()  # this rank's projection: (a, b, weight), a < b, summed
    entries: tuple = ()  # static: this rank's unique adjacency entries (rows, columns, pair keys)
    windows: Optional[int] = None  # temporal: the time windows of the balance and the metrics
    part: dict = field(default_factory=dict)  # the arrays of the part this rank writes
    units: tuple = ()  # what this rank reads of the shard files (read again to route the events)
    runs: Optional[SortedRuns] = None  # temporal: the rows of the part this rank writes, by event id
    halo: int = 0  # temporal: the halo nodes of the part this rank writes
    sort_rounds: int = 1  # temporal: the rounds in which the events' keys were ranked
    token: str = ""  # the run's name, the same on every rank: of the folders beside the output
    vwgt: Optional[np.ndarray] = None
    membership: Optional[np.ndarray] = None
    seconds: dict = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    peaks: dict = field(default_factory=dict)  # the peak resident memory so far at each phase's end
    resident_at_start: int = 0  # what the process held before the run (its libraries, its process group)
    bytes_read: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0

    def spill_folder(self) -> Path:
        """Where this rank spills what is over its budget (its portion, the sort's ids, the part
        it writes): a folder beside the output (or in the temporary folder, where nothing is
        written)."""
        name = f"runs-{self.token}-{dist.rank()}"
        return (Path(tempfile.gettempdir()) / f"gnndist-{name}" if self.out is None
                else self.out.parent / f".{self.out.name}.{name}")

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time a phase (on rank 0, a line of progress) and call `held` at its end."""
        t0 = time.perf_counter()
        bar = tqdm(total=1, desc=name, unit="phase", leave=False, disable=not self.progress)
        yield
        bar.update()
        bar.close()
        self.seconds[name] += time.perf_counter() - t0
        self.peaks[name] = stats.peak_memory_bytes()
        held(self, name)

    def exchange(self, columns: Sequence[np.ndarray], dest: np.ndarray, rows: Optional[np.ndarray] = None
                 ) -> list[np.ndarray]:
        """Rows of `columns` (those `rows` names, default all), row i going to rank `dest[i]`; the
        rows every rank sent here, in no particular order, in arrays made once. They travel in
        rounds of at most ROUND_BYTES sent per rank, which every rank runs alike."""
        w = dist.world_size()
        counts = np.array(self.gather(np.bincount(dest, minlength=w)))  # [from, to]
        out = self.receiving(columns, int(counts[:, dist.rank()].sum()))
        order = np.argsort(dest, kind="stable")
        per_round = max(1, ROUND_BYTES // max(_row_bytes(columns), 1))
        at = 0
        for k in range(max(-(-int(n) // per_round) for n in counts.sum(axis=1))):
            take = order[k * per_round:(k + 1) * per_round]
            got = self.send_round(columns, dest[take], take if rows is None else rows[take])
            for o, g in zip(out, got):
                o[at:at + g.shape[0]] = g
            at += got[0].shape[0]
        return out

    @staticmethod
    def receiving(columns: Sequence[np.ndarray], rows: int) -> list[np.ndarray]:
        """Arrays for `rows` received rows of `columns`."""
        return [np.empty((rows, *c.shape[1:]), c.dtype) for c in columns]

    def send_round(self, columns: Sequence[np.ndarray], dest: np.ndarray, rows: np.ndarray) -> list[np.ndarray]:
        """One all-to-all: rows `rows` of `columns` to the ranks `dest` (sorted); the rows that
        came, a column each."""
        w, me = dist.world_size(), dist.rank()
        buf = dist.pack([torch.from_numpy(np.ascontiguousarray(c[rows])) for c in columns])
        sizes = np.bincount(dest, minlength=w).tolist()
        back = dist.joined(dist.exchange(list(buf.split(sizes)), self.group))
        own = sizes[me] * _row_bytes(columns)  # the rows this rank keeps travel nowhere
        self.bytes_sent += buf.numel() - own
        self.bytes_received += back.numel() - own
        out = self.receiving(columns, back.shape[0])
        dist.unpack_into(back, [torch.from_numpy(o) for o in out])
        return out

    def gather(self, obj: Any) -> list[Any]:
        return dist.gather_objects(obj, self.group)

    def all_sum(self, a: np.ndarray) -> np.ndarray:
        """The element-wise sum over the ranks of an integer or float array."""
        if dist.world_size() == 1:
            return a
        return dist.all_reduce(torch.from_numpy(np.ascontiguousarray(a)), group=self.group).numpy()


def _row_bytes(columns: Sequence[np.ndarray]) -> int:
    return sum(c.dtype.itemsize * int(np.prod(c.shape[1:])) for c in columns)


def held(job: Job, phase: str) -> None:
    """Called at the end of each phase with what the rank holds (a hook for the tests that
    walk a rank's arrays)."""


def agreed(job: Job, fn: Callable[[], Any]) -> Any:
    """`fn()` on every rank; where it raises a GnndistError on any rank, every rank raises the
    first such error (by rank) as its own one line."""
    try:
        out, err = fn(), None
    except GnndistError as e:
        out, err = None, first_line(e)
    errors = [e for e in job.gather(err) if e is not None]
    if errors:
        raise GnndistError(errors[0])
    return out


# ---------------------------------------------------------------------------------------- read

def read_portion(job: Job) -> None:
    """List, plan and read this rank's units of DATA's shard files (and agree on their columns)."""
    job.shards = agreed(job, lambda: open_shards(job.data))
    lists = job.gather((job.shards.kind, job.shards.files, job.shards.node_files))
    kinds = {k for k, _, _ in lists}
    agreed(job, lambda: _same_kind(kinds, job.data))
    job.kind = lists[0][0]
    plan = agreed(job, lambda: plan_shards([f for _, f, _ in lists]))
    if job.kind == "static":
        agreed(job, lambda: check_node_listings([n for _, _, n in lists]))
    units = plan.units[dist.rank()]
    names = sorted({u.name for u in units})
    job.columns = agreed(job, lambda: agree_columns(
        [c for found in job.gather([(job.shards.path(n), read_columns(job.shards, n)) for n in names])
         for c in found]))
    job.units = units
    # the events beyond the budget go to files; a static graph's edges are held in memory
    job.portion = Table(job.budget if job.kind == "temporal" else sys.maxsize, job.spill_folder() / "portion")
    agreed(job, lambda: _read_columns(job, units))
    job.bytes_read = sum(u.stop - u.start for u in units)


def _read_columns(job: Job, units) -> None:
    """The endpoints (and for events times and places in the file order) of the rows of this
    rank's units into `job.portion` (edge features and labels are read again, to be routed)."""
    p, temporal = job.portion, job.kind == "temporal"
    for u in units:
        for ch in read_unit(job.shards, u, ends_only=True):
            cols = {"src": np.asarray(ch.src, np.int64), "dst": np.asarray(ch.dst, np.int64)}
            if temporal:
                cols["t"] = np.asarray(ch.t, np.float64)
                cols["place"] = np.int64(ch.shard) << 47 | np.int64(ch.piece) << 37 | (ch.row + np.arange(len(ch)))
            p.append(**cols)
    if not p.rows:
        p.append(**{name: np.zeros(0, np.float64 if name == "t" else np.int64)
                    for name in ("src", "dst", *(("t", "place") if temporal else ()))})
    p.finish()


def _blocks(job: Job, p: Table, *names: str) -> Iterator[tuple[int, list[np.ndarray]]]:
    """`p`'s blocks of columns `names` (`Table.blocks`), then empty ones until this rank has had
    as many as every other: for passes with a collective in each block."""
    got = p.blocks(*names)
    for _ in range(dist.agree_max(p.passes())):
        yield next(got, (p.rows, [np.zeros(0, p.dtypes[name]) for name in names]))


def _same_kind(kinds: set, data: str) -> None:
    if len(kinds) > 1:
        raise GnndistError(f"{data}: the hosts' shard files are of different kinds ({', '.join(sorted(kinds))})")


# ---------------------------------------------------------------------------------------- ids

def compact_ids(job: Job) -> None:
    """Number the nodes 0..N-1 in order of original id, as one process does: every rank gets
    the sorted original ids (`job.ids`) and its portion's ids replaced by their positions."""
    p = job.portion
    bipartite = job.kind == "temporal" and job.columns is not None and job.columns.bipartite
    if job.kind == "static" and job.shards.nodes is not None:
        nodes = agreed(job, lambda: open_nodes(job.shards))
        job.ids = np.sort(np.asarray(nodes.ids, dtype=np.int64))
        ends = np.concatenate([p.read("src", 0, p.rows), p.read("dst", 0, p.rows)])
        pos = np.minimum(np.searchsorted(job.ids, ends), max(job.ids.size - 1, 0))
        bad = np.flatnonzero(job.ids[pos] != ends) if job.ids.size else np.arange(ends.size)
        agreed(job, lambda: _no_missing(ends, bad, job.shards))
        p.replace("src", [pos[:p.rows]])
        p.replace("dst", [pos[p.rows:]])
        return
    if bipartite:
        users, items = _global_unique(job, _local_unique(p, "src")), _global_unique(job, _local_unique(p, "dst"))
        job.ids = np.concatenate([users, items])
        p.replace("src", (np.searchsorted(users, src) for _, (src,) in p.blocks("src")))
        p.replace("dst", (users.size + np.searchsorted(items, dst) for _, (dst,) in p.blocks("dst")))
        return
    job.ids = _global_unique(job, _local_unique(p, "src", "dst"))
    for name in ("src", "dst"):
        p.replace(name, (np.searchsorted(job.ids, ids) for _, (ids,) in p.blocks(name)))


def _local_unique(p: Table, *names: str) -> np.ndarray:
    """The sorted distinct values of the portion's columns `names`."""
    out = np.zeros(0, np.int64)
    for _, cols in p.blocks(*names):
        out = unique_ints(np.concatenate([out, *cols]))
    return out


def _no_missing(ends: np.ndarray, bad: np.ndarray, shards: Shards) -> None:
    if bad.size:
        raise GnndistError(f"{shards.data}: node id {ends[bad[0]]} of the edges has no row in "
                           f"{os.path.join(shards.nodes, 'ids.npy')}")


def _global_unique(job: Job, mine: np.ndarray) -> np.ndarray:
    """The sorted distinct values of every rank's distinct values `mine`: each rank uniques the
    ids that hash to it, then all gather the (disjoint) results."""
    w = dist.world_size()
    (got,) = job.exchange([mine], np.mod(mine, w))
    bucket = torch.from_numpy(unique_ints(got))
    return np.sort(torch.cat(dist.all_gather_varsize(bucket, job.group)).numpy()) if w > 1 else bucket.numpy()


# ---------------------------------------------------------------------------------------- sort

def number_events(job: Job) -> None:
    """Global event ids by (time, shard, row), through a sample sort of the keys: each rank sends
    its events' keys to the rank whose key range holds them, learns their ranks there, and gets
    them back. Where the keys a rank would rank at once exceed a quarter of its budget, the key
    ranges are cut finer and ranked in rounds (rank r ranks range j * W + r in round j): each rank
    first deals its keys into a `Table` per round, in one pass, and the ids coming back are kept
    in `SortedRuns` by event until the last round."""
    p, w, me = job.portion, dist.world_size(), dist.rank()
    n = p.rows
    job.num_events = int(job.all_sum(np.array([n], np.int64))[0])
    rounds = job.sort_rounds = dist.agree_max(max(1, -(-job.num_events * KEY_BYTES // w // max(job.budget // 4, 1))))
    if w == 1 and rounds == 1:
        p.replace("eid", [invert_permutation(np.lexsort((p.read("place", 0, n), p.read("t", 0, n))))])
        return
    ranges = w * rounds
    picked = np.sort(np.random.default_rng(me).choice(n, min(SAMPLES * rounds, n), replace=False))
    pooled = np.sort(np.concatenate(job.gather(_keys(*_rows_at(p, ("t", "place"), picked)))))
    splitters = pooled[(np.arange(1, ranges) * pooled.size) // ranges] if pooled.size else pooled
    ids = SortedRuns({"index": np.zeros(0, np.int64), "eid": np.zeros(0, np.int64)}, n, job.budget,
                     job.spill_folder() / "eid")
    dealt = _deal(job, splitters, rounds)
    before = 0  # the keys of the earlier rounds' ranges
    for j in range(rounds):
        got = []
        for _, (t, place, index, dest) in _blocks(job, dealt[j], "t", "place", "index", "dest"):
            tag = np.int64(me) << 40 | index  # where each key came from
            got.append(job.exchange([t, place, tag], dest))
            del tag
        t, place, tag = (np.concatenate(c) for c in zip(*got))
        del got
        order = np.lexsort((place, t))
        del t, place
        sizes = np.array([int(x[0]) for x in job.gather(np.array([order.size]))])
        eid = np.empty(order.size, np.int64)
        eid[order] = before + int(sizes[:me].sum()) + np.arange(order.size, dtype=np.int64)
        before += int(sizes.sum())
        del order
        ids.add(job.exchange([tag & ((1 << 40) - 1), eid], tag >> 40))
        del tag, eid
        dealt[j].close()
    p.replace("eid", (block[1] for block in ids.merged()))
    ids.close()


def _deal(job: Job, splitters: np.ndarray, rounds: int) -> list[Table]:
    """Each round's keys of this rank's events (time, place, row "index", destination rank
    "dest"), in a `Table` per round (within a share of the budget each), from one pass over the
    portion; one round's is the portion itself."""
    p, w = job.portion, dist.world_size()
    if rounds == 1:
        t, place = p.read("t", 0, p.rows), p.read("place", 0, p.rows)
        one = Table(sys.maxsize, job.spill_folder() / "keys")
        dest = np.searchsorted(splitters, _keys(t, place), side="right")
        one.append(t=t, place=place, index=np.arange(p.rows), dest=dest)
        one.finish()
        return [one]
    dealt = [Table(job.budget // rounds, job.spill_folder() / f"keys{j}") for j in range(rounds)]
    for a, (t, place) in p.blocks("t", "place"):
        dest = np.searchsorted(splitters, _keys(t, place), side="right")
        order = np.argsort(dest // w, kind="stable")
        ends = np.searchsorted(dest[order] // w, np.arange(rounds + 1))
        for j, table in enumerate(dealt):
            rows = order[ends[j]:ends[j + 1]]
            table.append(t=t[rows], place=place[rows], index=a + rows, dest=dest[rows] % w)
    for table in dealt:
        if not table.rows:
            table.append(t=np.zeros(0), place=np.zeros(0, np.int64), index=np.zeros(0, np.int64),
                         dest=np.zeros(0, np.int64))
        table.finish()
    return dealt


def _rows_at(p: Table, names: Sequence[str], at: np.ndarray) -> list[np.ndarray]:
    """Rows `at` (ascending) of the portion's columns `names`."""
    out: list[list[np.ndarray]] = [[] for _ in names]
    for a, cols in p.blocks(*names):
        lo, hi = np.searchsorted(at, [a, a + cols[0].size])
        for o, c in zip(out, cols):
            o.append(c[at[lo:hi] - a])
    return [np.concatenate(o) if o else np.zeros(0, p.dtypes[name]) for o, name in zip(out, names)]


def _keys(t: np.ndarray, place: np.ndarray) -> np.ndarray:
    """(time, place) pairs as one structured array, which sorts and searches by time, then place."""
    key = np.empty(t.size, dtype=[("t", "<f8"), ("place", "<i8")])
    key["t"], key["place"] = t, place
    return key


# ---------------------------------------------------------------------------------------- projection

def project(job: Job) -> None:
    """This rank's part of the temporal projection: the unique node pairs (a < b) of every rank's
    events that hash here, their `methods.event_weights` summed (the recency weights of
    `temporal`; else 1 a pair)."""
    n, w = job.ids.size, dist.world_size()
    weighted = job.method.startswith("temporal")
    lo, hi = _t_range(job) if weighted else (0.0, 0.0)
    keys, sums = np.zeros(0, np.int64), np.zeros(0, np.int64)
    for _, (src, dst, t) in _blocks(job, job.portion, "src", "dst", "t"):
        keep = src != dst
        key = methods.pair_key(src[keep], dst[keep], n)
        weight = (methods.event_weights(t[keep], lo, hi - lo, job.params["recency"]) if weighted
                  else np.ones(key.size, np.int64))
        key, weight = job.exchange([key, weight], _pair_rank(key, w))
        keys, inv = np.unique(np.concatenate([keys, key]), return_inverse=True)
        sums = np.bincount(inv, weights=np.concatenate([sums, weight])).astype(np.int64)  # integers: exact
        del key, weight, inv
    job.pairs = (keys // n, keys % n, sums if weighted else np.ones(keys.size, np.int64))


def _t_range(job: Job) -> tuple[float, float]:
    """(first, last) event time over all ranks."""
    lo, hi = np.inf, -np.inf
    for _, (t,) in job.portion.blocks("t"):
        lo, hi = min(lo, t.min(initial=np.inf)), max(hi, t.max(initial=-np.inf))
    got = dist.all_reduce(torch.tensor([-lo, hi], dtype=torch.float64), "max", job.group)
    return -float(got[0]), float(got[1])


def _pair_rank(key: np.ndarray, world: int) -> np.ndarray:
    """The rank that sums a pair: a hash of its key."""
    with np.errstate(over="ignore"):
        z = key.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        return ((z ^ (z >> np.uint64(29))) % np.uint64(world)).astype(np.int64)


def vertex_weights(job: Job) -> Optional[np.ndarray]:
    """The balance constraints ([N, ncon], the same on every rank) of the method, as one process
    makes them (`methods.temporal_membership`, `methods._vertex_weights`)."""
    p, n, prm = job.portion, job.ids.size, job.params
    if job.method in ("temporal", "temporal-lp"):
        nw = prm["time_windows"]
        counts = np.zeros(n * nw, np.int64)
        for _, (src, eid) in p.blocks("src", "eid"):
            counts += np.bincount(src * nw + (eid * nw) // max(job.num_events, 1), minlength=n * nw)
        counts = job.all_sum(counts).reshape(n, nw)
        return counts[:, counts.sum(axis=0) > 0]
    balance = prm["balance"]
    if list(balance) == ["nodes"]:
        return None if job.method == "metis" else np.ones((n, 1), np.int64)
    cols = []
    for key in balance:
        if key == "nodes":
            cols.append(np.ones(n, np.int64))
        elif key == "edges":
            cols.append(_edge_counts(job))
        else:
            cols.append(_train_mask(job))
    return np.stack(cols, axis=1)


def _edge_counts(job: Job) -> np.ndarray:
    """Per node: the events it owns (temporal), or its CSR row length (static: its unique
    neighbours, itself included where it has a self-loop)."""
    if job.kind == "temporal":
        return _owned_counts(job)
    a, b, _ = job.entries
    return job.all_sum(np.bincount(a, minlength=job.ids.size))


def _owned_counts(job: Job) -> np.ndarray:
    """Per node, the events it owns (is the source of), over all ranks."""
    counts = np.zeros(job.ids.size, np.int64)
    for _, (src,) in job.portion.blocks("src"):
        counts += np.bincount(src, minlength=job.ids.size)
    return job.all_sum(counts)


def _train_mask(job: Job) -> np.ndarray:
    """The training nodes (static, from the node arrays)."""
    nodes = open_nodes(job.shards)
    if nodes is None or "train_mask" not in nodes.arrays or not np.asarray(nodes.arrays["train_mask"]).any():
        raise GnndistError("--balance train needs a graph with training nodes (a train mask)")
    order = np.argsort(np.asarray(nodes.ids), kind="stable")
    return np.asarray(nodes.arrays["train_mask"])[order].astype(np.int64)


# ---------------------------------------------------------------------------------------- partition

def choose_method(job: Job, explicit: bool) -> None:
    """Run METIS on rank 0 when the projection fits its budget; else the `-lp` method (refused
    where `--method temporal` or `metis` was named), where the largest rank's share of the
    projection fits its budget; else refuse, naming how many ranks would hold it."""
    if job.method == "random":
        return
    held = np.array(job.gather(job.pairs[0].size), np.int64)
    num_pairs, budget = int(held.sum()), stats.fmt_bytes(job.budget)
    lp_fits = int(held.max()) * LP_PAIR_BYTES <= job.budget
    if job.method in methods.LP_METHODS:
        need = num_pairs * METIS_PAIR_BYTES + job.ids.size * METIS_NODE_BYTES
        if need <= job.budget:
            return
        lp = methods.LP_METHODS[job.method]
        if explicit:
            raise GnndistError(f"--method {job.method} runs METIS on one rank, which needs an estimated "
                               f"{stats.fmt_bytes(need)} for this projection ({num_pairs:,} node pairs) but "
                               f"--memory-budget is {budget}: use --method {lp}, or a larger budget")
        if lp_fits and dist.rank() == 0:
            dist.log(f"partition: {lp}, since METIS on one rank would need an estimated {stats.fmt_bytes(need)} "
                     f"for {num_pairs:,} node pairs, over the {budget} memory budget")
        job.method = lp
    if not lp_fits:
        ranks = -(-num_pairs * LP_PAIR_BYTES // job.budget)
        raise GnndistError(f"--method {job.method} holds the projection's {num_pairs:,} node pairs across the ranks, "
                           f"an estimated {stats.fmt_bytes(int(held.max()) * LP_PAIR_BYTES)} on the largest share of "
                           f"{held.size} rank(s), but --memory-budget is {budget}: {ranks:,} ranks would hold it "
                           "(or use --method random)")


def membership(job: Job) -> None:
    """The part of every node (the same on every rank)."""
    n, k, prm = job.ids.size, job.num_parts, job.params
    if job.method == "random":
        job.membership = methods.random_membership(n, k, prm["seed"])
        return
    a, b, w = job.pairs
    if job.method.endswith("-lp"):
        job.membership = propagate(a, b, w, job.vwgt, k, prm["imbalance_tol"], prm["seed"], job.group)
        return
    if dist.rank() == 0:  # METIS's estimate alone must fit the budget: its events wait in files
        job.portion.spill()
    weighted = job.method == "temporal"  # metis: the symmetrized graph, unweighted
    got = job.exchange([a * np.int64(n) + b] + ([w] if weighted else []), np.zeros(a.size, np.int64))
    part = np.zeros(n, np.int64)
    if dist.rank() == 0:
        xadj, adjncy, adjwgt = methods.pair_adjacency(got[0], got[1] if weighted else None, n)
        del got  # METIS runs beside its graph only
        part = agreed_on_zero(lambda: methods.balanced_kway(xadj, adjncy, k, job.vwgt, adjwgt,
                                                             prm["imbalance_tol"], prm["seed"]))
    else:
        agreed_on_zero(None)
    job.membership = _broadcast(job, part)


_ZERO_ERROR: list = []


def agreed_on_zero(fn: Optional[Callable[[], Any]]) -> Any:
    """`fn()` on rank 0 (None elsewhere), its GnndistError raised on every rank (`_broadcast`
    carries it)."""
    _ZERO_ERROR.clear()
    if fn is None:
        return None
    try:
        return fn()
    except GnndistError as e:
        _ZERO_ERROR.append(first_line(e))
        return None


def _broadcast(job: Job, part: Optional[np.ndarray]) -> np.ndarray:
    """Rank 0's membership on every rank (or rank 0's error, raised on every rank)."""
    got = job.gather(_ZERO_ERROR[0] if _ZERO_ERROR else None)
    if got[0] is not None:
        raise GnndistError(got[0])
    if dist.world_size() == 1:
        return part
    t = torch.from_numpy(part if dist.rank() == 0 else np.zeros(job.ids.size, np.int64))
    dist.all_reduce(t, "max", job.group)  # rank 0's values, others zero (parts are >= 0)
    return t.numpy()


# ---------------------------------------------------------------------------------------- route and write

@dataclass
class Numbering:
    """The store's new ids: part p owns new ids book.range(p), in order of original id."""

    book: PartitionBook
    new_to_orig: np.ndarray
    orig_to_new: np.ndarray

    @classmethod
    def of(cls, part: np.ndarray, num_parts: int) -> "Numbering":
        new_to_orig = np.argsort(part, kind="stable").astype(np.int64)
        return cls(PartitionBook(indptr_of(part, num_parts)), new_to_orig, invert_permutation(new_to_orig))


def route_events(job: Job, num: Numbering) -> dict[str, np.ndarray]:
    """This rank's part of a temporal store: every event touching a node it owns, by event id.
    Each rank reads its units again, a chunk at a time, and sends each chunk's events (with their
    edge features and labels, which it did not keep) to the parts of both their endpoints. What
    comes is kept in `job.runs`, spilled to disk in sorted runs beyond the memory budget and
    merged as the part is written; the part returned holds the node-sized arrays (its nodes'
    original ids). Counts the part's halo nodes on the way (`job.halo`)."""
    c = job.columns
    names = ["eid", "src", "dst", "t"]
    like = [np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)]
    if c is not None and c.features:
        names.append("edge_feat")
        like.append(np.zeros((0, len(c.features)), np.float32))
    if c is not None and (c.label is not None or c.weight is not None):
        names.append("edge_label")
        like.append(np.zeros(0, np.int64))
    job.runs = SortedRuns(dict(zip(names, like)), _part_rows(job), job.budget, job.spill_folder() / "part")
    lo, hi = num.book.range(dist.rank())
    halo = np.zeros(job.ids.size, bool)
    # what a rank receives in a round (from every rank), held three times (as sent, as received,
    # unpacked), is at most a quarter of its budget
    per_round = max(MIN_ROUND_ROWS, min(ROUND_BYTES, job.budget // 12 // dist.world_size()) // job.runs.row_bytes)
    pieces = _pieces(job, num, names, per_round)
    nothing = (like, np.zeros(0, np.int64), np.zeros(0, np.int64))
    while True:
        piece = next(pieces, None)
        if not dist.agree_max(int(piece is not None)):
            break
        cols, ps, pd = piece or nothing
        two = np.flatnonzero(ps != pd)
        dest = np.concatenate([ps, pd[two]])
        rows = np.concatenate([np.arange(ps.size), two])
        order = np.argsort(dest, kind="stable")
        got = job.send_round(cols, dest[order], rows[order])
        src, dst = got[1], got[2]
        own_s, own_d = (src >= lo) & (src < hi), (dst >= lo) & (dst < hi)
        halo[dst[own_s & ~own_d]] = halo[src[own_d & ~own_s]] = True
        job.runs.add(got)
    job.runs.added()  # the buffer let go before the figures and the write
    job.halo = int(halo.sum())
    return {"orig_ids": num.new_to_orig[lo:hi]}


def _part_rows(job: Job) -> int:
    """The events the part this rank writes holds: every rank's events with an endpoint among its
    nodes (a collective)."""
    part, w = job.membership, dist.world_size()
    counts = np.zeros(w, np.int64)
    for _, (src, dst) in job.portion.blocks("src", "dst"):
        for a in range(0, src.size, 1 << 20):
            ps, pd = part[src[a:a + (1 << 20)]], part[dst[a:a + (1 << 20)]]
            counts += np.bincount(ps, minlength=w) + np.bincount(pd[ps != pd], minlength=w)
    return int(np.array(job.gather(counts))[:, dist.rank()].sum())


def _pieces(job: Job, num: Numbering, names: list[str], rows: int) -> Iterator[tuple]:
    """This rank's events in file order, read again a chunk at a time, in pieces of at most `rows`:
    (their columns `names` with endpoints in the store's ids, the parts of their sources, of
    their destinations)."""
    p, part = job.portion, job.membership
    start = 0
    for ch in (ch for u in job.units for ch in read_unit(job.shards, u)):
        for a in range(0, len(ch), rows):
            b = min(a + rows, len(ch))
            src, dst = p.read("src", start + a, start + b), p.read("dst", start + a, start + b)
            cols = [p.read("eid", start + a, start + b), num.orig_to_new[src], num.orig_to_new[dst], ch.t[a:b]]
            cols += [np.asarray(getattr(ch, name))[a:b] for name in names[4:]]
            yield cols, part[src], part[dst]
        start += len(ch)


def static_entries(job: Job) -> None:
    """The symmetrized graph's unique entries (row, column), each at the rank a hash of its
    undirected pair names: `job.entries` = (rows, columns, pair keys of the rank's pairs)."""
    p, n, w = job.portion, job.ids.size, dist.world_size()
    key = unique_ints(methods.pair_key(p.read("src", 0, p.rows), p.read("dst", 0, p.rows), n))
    (key,) = job.exchange([key], _pair_rank(key, w))
    key = unique_ints(key)
    a, b = key // n, key % n
    loop = a == b
    job.entries = (np.concatenate([a, b[~loop]]), np.concatenate([b, a[~loop]]), key)
    job.pairs = (a[~loop], b[~loop], np.ones(int((~loop).sum()), np.int64))


def route_rows(job: Job, num: Numbering) -> dict[str, np.ndarray]:
    """This rank's part of a static store: the CSR rows of its nodes (neighbours ascending by
    original id, as one process's graph has them) and their node arrays."""
    rows, cols, _ = job.entries
    r, c = job.exchange([rows, cols], job.membership[rows])
    order = np.lexsort((c, r))
    r, c = r[order], c[order]
    lo, hi = num.book.range(dist.rank())
    owned = num.new_to_orig[lo:hi]
    out = {"orig_ids": owned, "indptr": np.concatenate([[0], np.cumsum(np.bincount(num.orig_to_new[r] - lo,
                                                                                    minlength=hi - lo))]),
           "indices": num.orig_to_new[c]}
    out.update(_node_rows(job, owned))
    return out


def _node_rows(job: Job, owned: np.ndarray) -> dict[str, np.ndarray]:
    """The node arrays (x, y, masks) of the nodes `owned` (positions in `job.ids`), read from the
    memory-mapped node files and checked as one process's graph checks them."""
    nodes = open_nodes(job.shards) if job.shards.nodes is not None else None
    if nodes is None:
        return {}
    at = np.argsort(np.asarray(nodes.ids), kind="stable")[owned]
    rows = {name: np.asarray(nodes.arrays[name][at]) for name in ("x", "y", *MASKS) if name in nodes.arrays}
    try:
        out = {"x": _check_rows("x", rows.get("x"), owned.size, np.float32, ndims=(2,)), "y": _labels(rows.get("y"), owned.size),
               **{m: _mask(m, rows.get(m), owned.size) for m in MASKS}}
    except GnndistError as e:
        raise GnndistError(f"{job.shards.nodes}: {first_line(e)}") from None
    return {k: v for k, v in out.items() if v is not None}


# ---------------------------------------------------------------------------------------- metrics

def temporal_stats(job: Job) -> dict:
    """`stats.temporal_quality` of the partition, from every rank's counts (no halo, no hubs)."""
    m, k, e = job.membership, job.num_parts, job.num_events
    nw = job.windows
    counts = np.zeros(2 * k + nw * k + 1, np.int64)
    for _, (src, dst, eid) in job.portion.blocks("src", "dst", "eid"):
        ps, pd = m[src], m[dst]
        cross = ps != pd
        win = (eid * nw) // max(e, 1)
        counts += np.concatenate([np.bincount(ps, minlength=k), np.bincount(pd[cross], minlength=k),
                                  np.bincount(win * k + ps, minlength=nw * k), [int(cross.sum())]])
    counts = job.all_sum(counts)
    events, also, per_window, n_cross = counts[:k], counts[k:2 * k], counts[2 * k:-1].reshape(nw, k), int(counts[-1])
    if job.pairs:
        a, b, _ = job.pairs
        pairs = [a.size, int(np.count_nonzero(m[a] != m[b]))]
    else:
        pairs = _distinct_pairs(job)
    pair_counts = job.all_sum(np.array([pairs[0] + _loop_pairs(job), pairs[1]], np.int64))
    halos = [int(x) for x in job.gather(job.halo)]
    nodes = np.bincount(m, minlength=k)
    return {
        "nodes_per_part": nodes.tolist(),
        "events_per_part": events.tolist(),
        "stored_events_per_part": (events + also).tolist(),
        "events_per_window_per_part": per_window.tolist(),
        "imbalance": {"nodes": stats.imbalance(nodes), "events": stats.imbalance(events),
                      "events_worst_window": max((stats.imbalance(r) for r in per_window), default=1.0)},
        "cross_partition_event_fraction": n_cross / e if e else 0.0,
        "cross_partition_event_fraction_with_replicas": n_cross / e if e else 0.0,
        "edge_cut_fraction": float(pair_counts[1] / pair_counts[0]) if pair_counts[0] else 0.0,
        "halo_nodes_per_part": halos,
        "replication_factor": 1.0,
    }


def _distinct_pairs(job: Job) -> list[int]:
    """For a partition that made no projection: [the distinct node pairs a < b of the events that
    hash to this rank, of them cut], counted in order of key through `SortedRuns` (within the
    budget)."""
    n, w, m = job.ids.size, dist.world_size(), job.membership

    def keys(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        keep = src != dst
        return unique_ints(methods.pair_key(src[keep], dst[keep], n))
    sent = np.zeros(w, np.int64)
    for _, (src, dst) in job.portion.blocks("src", "dst"):
        sent += np.bincount(_pair_rank(keys(src, dst), w), minlength=w)
    coming = int(np.array(job.gather(sent))[:, dist.rank()].sum())
    runs = SortedRuns({"key": np.zeros(0, np.int64)}, coming, job.budget, job.spill_folder() / "pairs")
    for _, (src, dst) in _blocks(job, job.portion, "src", "dst"):
        key = keys(src, dst)
        runs.add(job.exchange([key], _pair_rank(key, w)))
    distinct, cut, last = 0, 0, -1
    for (key,) in runs.merged():
        fresh = np.ones(key.size, bool)
        fresh[1:] = key[1:] != key[:-1]
        if key.size:
            fresh[0], last = key[0] != last, key[-1]
        key = key[fresh]
        distinct += key.size
        cut += int(np.count_nonzero(m[key // n] != m[key % n]))
    runs.close()
    return [distinct, cut]


def _loop_pairs(job: Job) -> int:
    """How many distinct self-loop pairs (v, v) of the events hash to this rank (the projection
    leaves them out, the edge cut counts them: never cut)."""
    loops = np.zeros(0, np.int64)
    for _, (src, dst) in job.portion.blocks("src", "dst"):
        loops = unique_ints(np.concatenate([loops, src[src == dst]]))
    (got,) = job.exchange([loops], np.mod(loops, dist.world_size()))
    return unique_ints(got).size


def static_stats(job: Job, num: Numbering, part: dict[str, np.ndarray]) -> dict:
    """`stats.static_quality` of the partition, from every rank's own rows."""
    k = job.num_parts
    lo, hi = num.book.range(dist.rank())
    idx = part["indices"]
    outside = (idx < lo) | (idx >= hi)
    train = int(part["train_mask"].sum()) if "train_mask" in part else 0
    mine = [idx.size, int(outside.sum()), unique_ints(idx[outside]).size, train]
    per = np.array(job.gather(mine), np.int64)
    nodes = np.bincount(job.membership, minlength=k)
    edges, cut, halo = per[:, 0], int(per[:, 1].sum()), per[:, 2]
    total = int(edges.sum())
    out = {"nodes_per_part": nodes.tolist(), "edges_per_part": edges.tolist(),
           "imbalance": {"nodes": stats.imbalance(nodes), "edges": stats.imbalance(edges)},
           "edge_cut_fraction": cut / total if total else 0.0, "halo_nodes_per_part": halo.tolist(),
           "replication_factor": 1.0}
    if "train_mask" in part:
        out["train_nodes_per_part"] = per[:, 3].tolist()
        out["imbalance"]["train"] = stats.imbalance(per[:, 3])
    return out


# ---------------------------------------------------------------------------------------- write

def write_store(job: Job, num: Numbering, part: dict[str, np.ndarray], quality: dict, t0: float) -> dict:
    """Write part r here, meta.json and the id maps on the first rank of each host, then, once
    every rank has written, rename each host's folder into place (see the module docstring).
    On a file system every host shares, rank 0 alone renames (it finds its mark there)."""
    out, me, token = job.out, dist.rank(), job.token
    tmp = out.parent / f".{out.name}.partial-{token}"
    first_here = int(os.environ.get("LOCAL_RANK", "0")) == 0
    try:
        agreed(job, lambda: tmp.mkdir(parents=True, exist_ok=True))
        files = agreed(job, lambda: _write_part(job, tmp, part))
        ids_file = agreed(job, lambda: _write_array(tmp, "orig_to_new.npy", num.orig_to_new, out) if first_here
                          else None)
        meta = _meta(job, num, part, quality, t0, files, ids_file)
        agreed(job, lambda: write_json(tmp / "meta.json", meta) if first_here else None)
        mark = tmp / f".rank0-{token}"
        if me == 0:
            mark.touch()
        dist.agree_max(0)  # every rank has written, and rank 0's mark is there
        shared = me != 0 and mark.exists()
        dist.agree_max(0)  # every rank has looked for it
        agreed(job, lambda: _into_place(tmp, out, mark) if first_here and not shared else None)
    except BaseException:
        if first_here:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta


def _meta(job: Job, num: Numbering, part: dict[str, np.ndarray], quality: dict, t0: float, files: dict,
          ids_file: Optional[str]) -> dict:
    """meta.json's contents (as `PartitionStore.meta`), the run metrics of every rank in
    `stats.ranks`; the same on every rank (a collective)."""
    every, ids, run = job.gather(files), job.gather(ids_file), job.gather(_run_metrics(job))
    meta = {"format_version": FORMAT_VERSION, "gnndist_version": gnndist.__version__, "kind": job.kind,
            "method": job.method, "num_parts": job.num_parts, "num_nodes": int(job.ids.size),
            **({"num_events": job.num_events} if job.kind == "temporal" else
               {"num_edges": int(sum(quality["edges_per_part"]))}),
            "node_offsets": num.book.offsets.tolist(), "params": job.params, "replicated_hubs": [],
            "arrays": _array_specs(job, part),
            "stats": {**quality, "partition_time_s": time.perf_counter() - t0,
                      "peak_memory_bytes": max(r["peak_memory_bytes"] for r in run),
                      "write_time_s": max(r["seconds"]["write"] for r in run), "ranks": run}}
    meta["files"] = {"orig_to_new.npy": next(f for f in ids if f), **{k: v for f in every for k, v in f.items()}}
    meta["meta_sha256"] = meta_checksum(meta)
    return meta


def _into_place(tmp: Path, out: Path, marker: Path) -> None:
    """The written folder `tmp` as `out` (an earlier store there moved aside, then removed)."""
    if marker.exists():
        marker.unlink()
    os.chmod(tmp, 0o755)
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.rename(out, old)
        os.rename(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, out)


def _write_array(folder: Path, rel: str, a: np.ndarray, store: Path) -> str:
    """Save `a` as `folder/rel`; its sha256."""
    path = folder / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        np.save(path, np.ascontiguousarray(a))
    except OSError as e:
        raise GnndistError(f"cannot write the partition store {store} ({rel}): {e.strerror or e}") from None
    return sha256_file(path)


def _write_part(job: Job, tmp: Path, part: dict[str, np.ndarray]) -> dict[str, str]:
    """Part r's arrays into `tmp`, those of `job.runs` (temporal) merged from its runs a block at
    a time; {file: sha256}."""
    me, runs = dist.rank(), job.runs
    files = {f"part{me}/{name}.npy": _write_array(tmp, f"part{me}/{name}.npy", a, job.out) for name, a in part.items()}
    if runs is None:
        return files
    rel = [f"part{me}/{name}.npy" for name in runs.names]

    def blocks() -> Iterator[list[np.ndarray]]:
        for block in runs.merged():
            yield block
            held(job, "write")
    try:
        write_npy([tmp / r for r in rel], runs.like, runs.rows, blocks())
    except OSError as e:
        raise GnndistError(f"cannot write the partition store {job.out} (part{me}): {e.strerror or e}") from None
    return {**files, **{r: sha256_file(tmp / r) for r in rel}}


def _array_specs(job: Job, part: dict[str, np.ndarray]) -> dict[str, dict]:
    """dtype and trailing shape of each per-part array (as `PartitionStore.array_specs`)."""
    names = (["orig_ids", "indptr", "indices", "x", "y", *MASKS] if job.kind == "static"
             else ["orig_ids", "eid", "src", "dst", "t", "edge_feat", "edge_label"])
    like = {**part, **(dict(zip(job.runs.names, job.runs.like)) if job.runs is not None else {})}
    return {k: {"dtype": like[k].dtype.str, "shape": list(like[k].shape[1:])} for k in names if k in like}


def _run_metrics(job: Job) -> dict:
    return {"rank": dist.rank(), "peak_memory_bytes": stats.peak_memory_bytes(),
            "resident_at_start_bytes": job.resident_at_start, "bytes_read": job.bytes_read,
            "bytes_sent": job.bytes_sent, "bytes_received": job.bytes_received,
            "portion_bytes_spilled": job.portion.spilled_bytes if job.portion is not None else 0,
            "sort_rounds": job.sort_rounds, "runs_spilled": len(job.runs.runs) if job.runs is not None else 0,
            "bytes_spilled": job.runs.spilled_bytes if job.runs is not None else 0, "seconds": dict(job.seconds),
            "peak_memory_bytes_by_phase": dict(job.peaks)}


# ---------------------------------------------------------------------------------------- the run

def partition_shards(data: str, num_parts: int, method: Optional[str] = None,
                     balance: Optional[Sequence[str]] = None, imbalance_tol: Optional[float] = None,
                     time_windows: Optional[int] = None, recency: Optional[float] = None, seed: int = 0,
                     memory_budget: Optional[int] = None, out: Union[str, Path, None] = None,
                     progress: bool = False) -> dict:
    """Partition the shard files DATA into one part per rank of the process group (a collective:
    every rank calls it; `num_parts` must be the world size) and write the store to `out` (every
    host's copy of it holds meta.json, the id maps and the parts of the host's ranks). Options as
    `partition_graph`'s (no halo or hub replicas), plus `temporal-lp` and `metis-lp`, and
    `memory_budget` (bytes each rank plans against; default: `stats.default_budget`): the default
    method runs METIS where the projection fits it, else label propagation; a rank keeps the part
    it writes (temporal) within it, spilling sorted runs beside `out` beyond it. Returns meta.json's
    contents."""
    t0 = time.perf_counter()
    world = dist.world_size()
    if num_parts != world:
        raise GnndistError(f"--parts {num_parts} with {world} rank(s): partitioning across ranks writes one part per "
                           f"rank (give --nproc {num_parts})")
    if method is not None and method not in methods.METHODS:
        raise GnndistError(f"unknown method {method!r}; choose from {', '.join(methods.METHODS)}")
    job = Job(str(data), num_parts, method or "", {}, memory_budget or stats.default_budget(),
              None if out is None else Path(out), progress and dist.rank() == 0, dist.host_group("samplers"))
    job.budget = -dist.agree_max(-job.budget)  # the least of the ranks': every rank plans alike
    job.resident_at_start = stats.resident_memory_bytes()
    if job.out is not None:
        agreed(job, lambda: check_output(job.out, "store"))
    job.token = job.gather(os.urandom(8).hex() if dist.rank() == 0 else None)[0]
    try:
        return _phases(job, method, balance, imbalance_tol, time_windows, recency, seed, t0)
    finally:
        shutil.rmtree(job.spill_folder(), ignore_errors=True)


def _phases(job: Job, method: Optional[str], balance, imbalance_tol, time_windows, recency, seed, t0: float) -> dict:
    """`partition_shards`'s phases in turn."""
    with job.phase("read"):
        read_portion(job)
    _check_options(job, method, balance, imbalance_tol, time_windows, recency, seed)
    with job.phase("ids"):
        compact_ids(job)
    temporal = job.kind == "temporal"
    if temporal:
        with job.phase("sort"):
            number_events(job)
        agreed(job, lambda: _enough_events(job))
    with job.phase("projection"):
        if not temporal:
            static_entries(job)
        elif job.method != "random":
            project(job)
        if job.method != "random":
            job.vwgt = vertex_weights(job)
        agreed(job, lambda: choose_method(job, explicit=method is not None))
        if temporal:
            job.portion.drop("t", "place")  # the routing reads them again
    with job.phase("partition"):
        membership(job)
        if int(np.bincount(job.membership, minlength=job.num_parts).min()) == 0:
            raise GnndistError(f"partitioning left a part without nodes: the graph is too small for {job.num_parts} "
                               "parts; use fewer --parts")
    num = Numbering.of(job.membership, job.num_parts)
    with job.phase("route"):
        part = job.part = route_events(job, num) if temporal else agreed(job, lambda: route_rows(job, num))
    quality = temporal_stats(job) if temporal else static_stats(job, num, part)
    with job.phase("write"):
        if job.out is None:
            return {"num_parts": job.num_parts, "stats": quality}
        return write_store(job, num, part, quality, t0)


def _check_options(job: Job, method: Optional[str], balance, imbalance_tol, time_windows, recency, seed) -> None:
    """`partition_graph`'s checks of the options, for the kind of graph read; fills `job.params`."""
    temporal = job.kind == "temporal"
    chosen = method or ("temporal" if temporal else "metis")
    base = methods.check_method_options(chosen, temporal, balance, imbalance_tol, recency, time_windows)
    job.method = chosen
    prm: dict[str, Any] = {"imbalance_tol": methods.check_imbalance_tol(methods.IMBALANCE_TOL if imbalance_tol is None
                                                                        else imbalance_tol),
                           "halo": 0, "seed": methods.check_seed(seed)}
    if base == "metis":
        prm["balance"] = methods.check_balance(balance)
    job.windows = time_windows
    if base == "temporal":
        prm.update(time_windows=time_windows, recency=1.0 if recency is None else recency)
    if temporal:
        prm["replicate_hubs"] = 0
    job.params = prm


def _enough_events(job: Job) -> None:
    """The event count's checks (`partition_graph`'s), and the time windows it allows."""
    e, k = job.num_events, job.num_parts
    if e == 0:
        raise GnndistError("the temporal graph has no events to partition")
    if not 1 <= k <= job.ids.size:
        raise GnndistError(f"--parts must be between 1 and the node count ({job.ids.size}), got {k}")
    nw = job.windows if job.windows is not None else min(methods.TIME_WINDOWS, methods.most_time_windows(e, k))
    methods.check_time_windows(e, k, nw)
    job.windows = nw
    if "time_windows" in job.params:
        job.params["time_windows"] = nw
        methods.check_time_windows(e, k, nw)
        owners = int((_owned_counts(job) > 0).sum())
        if k > owners:
            raise GnndistError(f"--method temporal balances the events each part owns, so --parts must be at most the "
                               f"{owners} nodes that own events (are an event source), got {k}")
