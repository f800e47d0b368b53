"""All numba kernels of the samplers, in one module so that numba's on-disk cache (keyed
on this file) is invalidated whenever any of them, or the helpers they inline, change.

Random numbers are counter-based: a draw is a hash of (seed, salt, key, draw index), so a
sample depends only on what is sampled, never on thread count, query order or which rank
computes it.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

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
        for q in range(j):
            if out[o + q] == t:
                t = m
                break
        out[o + j] = t


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
    fn = _hop_fill_parallel if out.size >= PARALLEL_MIN else _hop_fill_serial
    fn(indices, starts, degs, ids, offsets, replace, all_, seed, salt, out)


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


@njit(inline="always", cache=True)
def _tcsr_row(q, indptr, nbr, eid, ts, rows, ids, times, tbits, k, uniform, seed, salt,
              out_nbr, out_eid, out_ts, out_cnt):
    s = indptr[rows[q]]
    lo, hi = s, indptr[rows[q] + 1]
    t = times[q]
    while lo < hi:  # first entry with ts >= t
        mid = (lo + hi) >> 1
        if ts[mid] < t:
            lo = mid + 1
        else:
            hi = mid
    p = lo - s
    c = min(p, k)
    out_cnt[q] = c
    if uniform and p > k:
        pos = np.empty(c, np.int64)
        floyd_choose(stream_key(seed, salt, ids[q], tbits[q]), c, p, pos, 0)
        pos.sort()
        for j in range(c):
            e = s + pos[c - 1 - j]
            out_nbr[q, j] = nbr[e]
            out_eid[q, j] = eid[e]
            out_ts[q, j] = ts[e]
    else:
        for j in range(c):
            e = lo - 1 - j
            out_nbr[q, j] = nbr[e]
            out_eid[q, j] = eid[e]
            out_ts[q, j] = ts[e]


@njit(cache=True)
def _tcsr_serial(indptr, nbr, eid, ts, rows, ids, times, k, uniform, seed, salt, out_nbr, out_eid, out_ts, out_cnt):
    tbits = times.view(np.int64)
    for q in range(rows.size):
        _tcsr_row(q, indptr, nbr, eid, ts, rows, ids, times, tbits, k, uniform, seed, salt,
                  out_nbr, out_eid, out_ts, out_cnt)


@njit(parallel=True, cache=True)
def _tcsr_parallel(indptr, nbr, eid, ts, rows, ids, times, k, uniform, seed, salt, out_nbr, out_eid, out_ts, out_cnt):
    tbits = times.view(np.int64)
    for q in prange(rows.size):
        _tcsr_row(q, indptr, nbr, eid, ts, rows, ids, times, tbits, k, uniform, seed, salt,
                  out_nbr, out_eid, out_ts, out_cnt)


def tcsr_sample(indptr, nbr, eid, ts, rows, ids, times, k, uniform, seed, salt,
                out_nbr, out_eid, out_ts, out_cnt) -> None:
    """Fill out_*[q, :out_cnt[q]] for query q = (T-CSR row rows[q], global id ids[q], times[q]),
    most recent first. Each row's list must be sorted by time. Padding is left untouched."""
    fn = _tcsr_parallel if rows.size * k >= PARALLEL_MIN else _tcsr_serial
    fn(indptr, nbr, eid, ts, rows, ids, times, k, uniform, seed, salt, out_nbr, out_eid, out_ts, out_cnt)
