"""All numba kernels of the samplers, in one module so that numba's on-disk cache (keyed
on this file) is invalidated whenever any of them, or the helpers they inline, change.

Random numbers are counter-based: a draw is a hash of (seed, salt, key, draw index), so a
sample depends only on what is sampled, never on thread count, query order or which rank
computes it.
"""
from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from gnndist.runtime.threads import numba_parallel

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_MASK64 = (1 << 64) - 1


def as_seed(seed: int) -> np.uint64:
    """Any Python int as the uint64 the kernels take."""
    return np.uint64(int(seed) & _MASK64)


@njit(inline="always", cache=True)
def mix64(x):
    """splitmix64 finaliser: a bijective, well-mixed hash of a uint64."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


@njit(inline="always", cache=True)
def stream_key(seed, salt, key, extra):
    """The random stream of one sampled item: `key` (a node id) and `extra` (e.g. time bits)."""
    s = mix64(seed + np.uint64(salt) * _GOLDEN)
    return mix64(s ^ mix64(np.uint64(key) * _GOLDEN ^ np.uint64(extra)))


@njit(inline="always", cache=True)
def draw_below(stream, j, n):
    """Draw `j` of `stream`: a uniform integer in [0, n), n < 2**32."""
    h = mix64(stream + np.uint64(j + 1) * _GOLDEN)
    return np.int64(((h >> np.uint64(32)) * np.uint64(n)) >> np.uint64(32))


@njit(inline="always", cache=True)
def floyd_choose(stream, c, d, out, o):
    """Write `c` distinct positions in [0, d) to out[o:o+c] (Floyd's algorithm)."""
    for j in range(c):
        m = d - c + j
        t = draw_below(stream, j, m + 1)
        taken = False
        for q in range(j):  # no early exit: a fixed trip count has no branch to mispredict
            taken |= out[o + q] == t
        out[o + j] = m if taken else t


# below this many output items a kernel runs on one thread: a parallel launch costs more
PARALLEL_MIN = 1 << 15


@njit(inline="always", cache=True)
def _fill_row(i, indices, starts, degs, ids, offsets, replace, all_, seed, salt, out):
    start, d = starts[i], degs[i]
    o = offsets[i]
    c = offsets[i + 1] - o
    if all_ or (not replace and c == d):
        for j in range(c):
            out[o + j] = indices[start + j]
    elif replace:
        s = stream_key(seed, salt, ids[i], 0)
        for j in range(c):
            out[o + j] = indices[start + draw_below(s, j, d)]
    else:
        floyd_choose(stream_key(seed, salt, ids[i], 0), c, d, out, o)
        for j in range(c):
            out[o + j] = indices[start + out[o + j]]


@njit(cache=True)
def _hop_fill_serial(indices, starts, degs, ids, offsets, replace, all_, seed, salt, out):
    for i in range(ids.size):
        _fill_row(i, indices, starts, degs, ids, offsets, replace, all_, seed, salt, out)


@njit(parallel=True, cache=True)
def _hop_fill_parallel(indices, starts, degs, ids, offsets, replace, all_, seed, salt, out):
    for i in prange(ids.size):
        _fill_row(i, indices, starts, degs, ids, offsets, replace, all_, seed, salt, out)


def hop_fill(indices, starts, degs, ids, offsets, replace, all_, seed, salt, out) -> None:
    """Sample offsets[i+1]-offsets[i] of the degs[i] neighbours indices[starts[i]:][:degs[i]]
    of row i (all of them if `all_`) into out[offsets[i]:offsets[i+1]]; random streams are
    keyed by the global ids `ids`. Row starts come in an array (gathered beforehand in one
    vectorized pass) so no memory load waits on another."""
    args = (indices, starts, degs, ids, offsets, replace, all_, seed, salt, out)
    if out.size >= PARALLEL_MIN:
        with numba_parallel():
            _hop_fill_parallel(*args)
    else:
        _hop_fill_serial(*args)


@njit(cache=True)
def fill_targets(out, counts, start):
    """out = repeat(start + arange(counts.size), counts)."""
    o = 0
    for i in range(counts.size):
        for j in range(counts[i]):
            out[o + j] = start + i
        o += counts[i]


@njit(cache=True)
def map_ids(mark, nodes, n, ids, local):
    """Map global `ids` to local ids through the dense table `mark` (global id -> local id, -1
    if unseen), appending unseen ids to `nodes[n:]` in first-seen order; returns the new
    node count. `local` may be `ids` itself."""
    for i in range(ids.size):
        v = ids[i]
        m = mark[v]
        if m < 0:
            m = n
            mark[v] = n
            nodes[n] = v
            n += 1
        local[i] = m
    return n


# Temporal sampling is bound by memory latency: every query reads its T-CSR row pointer, a
# binary search in the row's times and the neighbours before the position found, each most
# likely a cache miss. The kernel runs in two pipelined passes over a range of queries that
# prefetch, PREFETCH_AHEAD queries ahead, what a later query will read, so that many misses
# are in flight at once instead of one after the other.
PREFETCH_AHEAD = 16


@intrinsic
def prefetch(typingctx, arr, i):
    """Ask the CPU to bring arr[i] into cache (a hint: any index is safe, nothing is read)."""
    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            "llvm.prefetch.p0")
        # read access, keep in all cache levels, data cache
        builder.call(fn, [builder.bitcast(builder.gep(ary.data, [args[1]]), i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return types.void(arr, types.intp), codegen


@njit(inline="always", cache=True)
def _first_at_or_after(ts, lo, hi, t):
    """The first position in the sorted ts[lo:hi] whose time is >= t (hi if none)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if ts[mid] < t:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(inline="always", cache=True)
def _tcsr_stage(q, e, indptr, nbr, eid, ts, rows, ids, tbits, k, uniform, seed, salt, out_eid, draws):
    """Choose the events of query q (earlier events end at T-CSR position e) and prefetch them.
    Uniform draws of a query with more than k earlier events are staged in out_eid[q] as
    T-CSR positions, most recent first."""
    s = indptr[rows[q]]
    if uniform and e - s > k:
        floyd_choose(stream_key(seed, salt, ids[q], tbits[q]), k, e - s, draws, 0)
        for i in range(k):  # the draws are distinct: draw i goes to its rank, descending
            rank = 0
            for j in range(k):
                rank += draws[j] > draws[i]
            p = s + draws[i]
            out_eid[q, rank] = p
            prefetch(nbr, p)
            prefetch(eid, p)
            prefetch(ts, p)
    else:
        prefetch(nbr, e - 1)
        prefetch(nbr, e - k)
        prefetch(eid, e - 1)
        prefetch(eid, e - k)
        prefetch(ts, e - k)


@njit(inline="always", cache=True)
def _tcsr_write(q, e, indptr, nbr, eid, ts, rows, times, k, uniform, out_nbr, out_eid, out_ts, out_dt, out_mask):
    """Write query q's row of every output, padding included."""
    s = indptr[rows[q]]
    t = times[q]
    c = min(e - s, k)
    staged = uniform and e - s > k
    for j in range(c):
        p = out_eid[q, j] if staged else e - 1 - j
        x = ts[p]
        out_nbr[q, j] = nbr[p]
        out_eid[q, j] = eid[p]
        out_ts[q, j] = x
        out_dt[q, j] = np.float32(t - x)
        out_mask[q, j] = True
    for j in range(c, k):
        out_nbr[q, j] = 0
        out_eid[q, j] = 0
        out_ts[q, j] = 0.0
        out_dt[q, j] = 0.0
        out_mask[q, j] = False


@njit(inline="always", cache=True)
def _tcsr_range(a, b, indptr, nbr, eid, ts, rows, ids, times, k, uniform, seed, salt,
                out_nbr, out_eid, out_ts, out_dt, out_mask):
    """Queries [a, b): pass 1 finds where each query's earlier events end, pass 2 writes them."""
    d = PREFETCH_AHEAD
    ends = np.empty(b - a, np.int64)
    for q in range(a, b):
        if q + 2 * d < b:
            prefetch(indptr, rows[q + 2 * d])
        if q + d < b:
            r = rows[q + d]
            lo, hi = indptr[r], indptr[r + 1]
            prefetch(ts, lo)
            prefetch(ts, (lo + hi) >> 1)
            prefetch(ts, hi - 1)
        r = rows[q]
        ends[q - a] = _first_at_or_after(ts, indptr[r], indptr[r + 1], times[q])
    tbits = times.view(np.int64)
    draws = np.empty(k, np.int64)
    for q in range(a, min(a + d, b)):
        _tcsr_stage(q, ends[q - a], indptr, nbr, eid, ts, rows, ids, tbits, k, uniform, seed, salt, out_eid, draws)
    for q in range(a, b):
        if q + d < b:
            _tcsr_stage(q + d, ends[q + d - a], indptr, nbr, eid, ts, rows, ids, tbits, k, uniform, seed, salt,
                        out_eid, draws)
        _tcsr_write(q, ends[q - a], indptr, nbr, eid, ts, rows, times, k, uniform, out_nbr, out_eid, out_ts, out_dt,
                    out_mask)


@njit(cache=True)
def _tcsr_serial(indptr, nbr, eid, ts, rows, ids, times, k, uniform, seed, salt,
                 out_nbr, out_eid, out_ts, out_dt, out_mask):
    _tcsr_range(0, rows.size, indptr, nbr, eid, ts, rows, ids, times, k, uniform, seed, salt,
                out_nbr, out_eid, out_ts, out_dt, out_mask)


@njit(parallel=True, cache=True)
def _tcsr_parallel(indptr, nbr, eid, ts, rows, ids, times, k, uniform, seed, salt,
                   out_nbr, out_eid, out_ts, out_dt, out_mask, chunks):
    n = rows.size
    for c in prange(chunks):
        _tcsr_range(n * c // chunks, n * (c + 1) // chunks, indptr, nbr, eid, ts, rows, ids, times, k, uniform,
                    seed, salt, out_nbr, out_eid, out_ts, out_dt, out_mask)


def _tcsr_run(args: tuple, parallel: bool) -> None:
    """The serial or the parallel T-CSR kernel on `tcsr_sample`'s arguments."""
    if parallel:
        with numba_parallel():
            _tcsr_parallel(*args, numba.get_num_threads())
    else:
        _tcsr_serial(*args)


def load_tcsr_kernels(indptr, nbr, eid, ts) -> None:
    """Compile (the first time on a machine) or load from numba's cache both T-CSR sampling
    kernels for these T-CSR arrays (their types), and start numba's threads, by sampling no
    queries: what a first sampling call would otherwise pay (in a timed epoch, say)."""
    none = np.zeros(0, np.int64)
    args = (indptr, nbr, eid, ts, none, none, np.zeros(0), 1, False, as_seed(0), 0, np.zeros((0, 1), np.int64),
            np.zeros((0, 1), np.int64), np.zeros((0, 1)), np.zeros((0, 1), np.float32), np.zeros((0, 1), np.bool_))
    for parallel in (False, True):
        _tcsr_run(args, parallel)


def tcsr_sample(indptr, nbr, eid, ts, rows, ids, times, k, uniform, seed, salt,
                out_nbr, out_eid, out_ts, out_dt, out_mask) -> None:
    """Fill every entry of the [Q, k] outputs for query q = (T-CSR row rows[q], global id
    ids[q], time times[q]): its events strictly earlier than times[q], most recent first, then
    padding (0, False). Each row's list must be sorted by time."""
    args = (indptr, nbr, eid, ts, rows, ids, times, k, uniform, seed, salt, out_nbr, out_eid, out_ts, out_dt, out_mask)
    _tcsr_run(args, rows.size * k >= PARALLEL_MIN)
