"""Counter-based random numbers for the numba kernels.

A draw is a hash of (seed, salt, key, draw index), so a sample depends only on what is
sampled, never on thread count, query order or which rank computes it.
"""
from __future__ import annotations

import numpy as np
from numba import njit

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
