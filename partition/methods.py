"""Partitioning methods: each returns `membership` (int64 [num_nodes], the part of every node).

- `metis`: METIS k-way (the METIS library that pymetis ships) on the symmetrized graph, with
  multi-constraint vertex weights (`balance`: any of nodes, edges, train).
- `random`: a seeded hash of the node id (the baseline).
- `temporal`: METIS on the recency-weighted undirected projection of the events, balancing
  the events each part owns in every time window (multi-constraint, one weight per window).
- `temporal-lp`, `metis-lp`: balanced label propagation over the same projection and balance
  (`gnndist.partition.propagation`), for a projection that no one rank's memory holds.

Event ownership, used everywhere in gnndist.partition: an event belongs to the part that
owns its source node.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from typing import Iterator, Optional, Sequence, Union

import numba
import numpy as np
import pymetis

from gnndist.errors import GnndistError
from gnndist.graph import Graph, TemporalGraph
from gnndist.validate import Int, Real, check

METHODS = ("metis", "random", "temporal", "metis-lp", "temporal-lp")
LP_METHODS = {"temporal": "temporal-lp", "metis": "metis-lp"}  # METIS's methods -> their label propagation


def check_method_options(method: str, temporal: bool, balance, imbalance_tol, recency, time_windows) -> str:
    """A one-line error where `method` is unknown, or is given an option it would ignore, for a
    `temporal` graph or a static one; else its base method (`base_method`)."""
    if method not in METHODS:
        raise GnndistError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    base = base_method(method)
    if base == "temporal" and not temporal:
        raise GnndistError(f"--method {method} needs a temporal graph (timestamped events)")
    if balance is not None and base != "metis":
        raise GnndistError(f"--balance applies to --method metis and metis-lp only; --method {method} "
                           + ("balances the events each part owns in every time window" if base == "temporal"
                              else "hashes node ids and balances nothing") + ": leave --balance out")
    if imbalance_tol is not None and method == "random":
        raise GnndistError("--imbalance-tol applies to --method metis and temporal; --method random hashes node ids "
                           "and balances nothing: leave it out")
    if recency is not None and base != "temporal":
        raise GnndistError(f"--recency applies to --method temporal only, not {method}: leave it out")
    if time_windows is not None and not temporal:
        raise GnndistError("--time-windows applies to temporal graphs only: leave it out")
    return base


def base_method(method: str) -> str:
    """The METIS method a label-propagation method stands in for (`temporal-lp` -> `temporal`),
    else `method` itself: what decides the options and balance it takes."""
    return {lp: m for m, lp in LP_METHODS.items()}.get(method, method)
BALANCE_KEYS = ("nodes", "edges", "train")
MAX_IMBALANCE_TOL = 10.0  # METIS ufactor 9000; beyond it balance means nothing
SEED_LIMIT = 2**32
IMBALANCE_TOL = 1.03  # the default max/mean METIS aims for
MAX_TIME_WINDOWS = 64
MAX_RECENCY = 1e6  # the heaviest event weighs at most this over the first: METIS's weight sums stay in int64
MIN_WINDOW_EVENTS_PER_PART = 10
TIME_WINDOWS = 4  # the default, where the events fill that many (`most_time_windows`)


# ---------------------------------------------------------------- parameter checks

def check_seed(seed: int) -> int:
    """The partitioner seed, checked: an integer in [0, 2**32)."""
    check("seed", seed, Int(0, SEED_LIMIT - 1))
    return int(seed)


def check_imbalance_tol(imbalance_tol: float) -> float:
    """The max/mean part-weight tolerance, checked: finite, from 1.001 to MAX_IMBALANCE_TOL."""
    if Real(high=MAX_IMBALANCE_TOL).problem(imbalance_tol) or not 1.001 <= imbalance_tol:
        raise GnndistError(f"--imbalance-tol must be from 1.001 to {MAX_IMBALANCE_TOL:g}, got {imbalance_tol!r}")
    return float(imbalance_tol)


def most_time_windows(num_events: int, num_parts: int) -> int:
    """The most time windows that still hold MIN_WINDOW_EVENTS_PER_PART events per part each (at
    least 1), and at most MAX_TIME_WINDOWS (each window is one METIS balance constraint: more make
    it slow and the balance meaningless)."""
    return min(MAX_TIME_WINDOWS, max(1, num_events // (MIN_WINDOW_EVENTS_PER_PART * num_parts)))


def check_time_windows(num_events: int, num_parts: int, num_windows: int) -> int:
    """The temporal time-window count, checked: from 1 to `most_time_windows`."""
    most = most_time_windows(num_events, num_parts)
    if not 1 <= num_windows <= most:
        raise GnndistError(f"--time-windows must be from 1 to {most} (at most {MAX_TIME_WINDOWS}, and each window "
                           f"needs {MIN_WINDOW_EVENTS_PER_PART} events per part: {num_events} events, {num_parts} "
                           f"parts), got {num_windows}")
    return num_windows


# ---------------------------------------------------------------- METIS call

_IDX = np.dtype(pymetis.zero_copy_dtype())


def metis_options(imbalance_tol: float, seed: int) -> pymetis.Options:
    """pymetis options for a max/mean part-weight tolerance `imbalance_tol` and a seed."""
    ufactor = int(round((check_imbalance_tol(imbalance_tol) - 1.0) * 1000))
    return pymetis.Options(ufactor=ufactor, seed=check_seed(seed))


@contextlib.contextmanager
def _c_stdout_dropped() -> Iterator[None]:
    """Drop what C code writes to file descriptor 1: METIS's messages ("***Cannot bisect a graph
    with 0 vertices!", five times over), which would mix into the command's output (`--json`) or
    add lines to its one-line error; what they warn of, parts left without nodes, is checked
    after the call (`balanced_kway`)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 1)
        yield
    finally:
        ctypes.CDLL(None).fflush(None)  # C stdio buffers what it printed: out before fd 1 is restored
        os.dup2(saved, 1)
        os.close(saved)


def _kway_fn():
    """`METIS_PartGraphKway` from the METIS library inside pymetis's extension module.

    pymetis.part_graph passes ncon=1 whatever the length of `vweights` (multi-constraint
    weights are silently cut to their first n entries), so multi-constraint balance calls
    METIS directly, with the same library and the same options object.
    """
    import pymetis._internal as ext

    fn = ctypes.CDLL(ext.__file__).METIS_PartGraphKway
    fn.restype = ctypes.c_int
    return fn


def metis_kway(xadj: np.ndarray, adjncy: np.ndarray, num_parts: int, vwgt: Optional[np.ndarray] = None,
               adjwgt: Optional[np.ndarray] = None, options: Optional[pymetis.Options] = None
               ) -> tuple[int, np.ndarray]:
    """METIS k-way partition of a symmetric graph: (edge cut, membership).

    `vwgt` is [n] or [n, ncon] non-negative integers; `adjwgt` positive integers per adjncy entry.
    """
    n = xadj.size - 1
    if num_parts == 1:
        return 0, np.zeros(n, dtype=np.int64)
    options = options or pymetis.Options()
    opt = np.array([options._get(i) for i in range(type(options)._len())], dtype=_IDX)
    ncon = 1 if vwgt is None or vwgt.ndim == 1 else vwgt.shape[1]
    arrays = [np.ascontiguousarray(a, dtype=_IDX) if a is not None else None
              for a in (xadj, adjncy, vwgt, adjwgt)]
    scalars = [np.array([v], dtype=_IDX) for v in (n, ncon, num_parts, 0)]
    part = np.empty(n, dtype=_IDX)

    def ptr(a):
        return None if a is None else a.ctypes.data_as(ctypes.c_void_p)

    with _c_stdout_dropped():
        status = _kway_fn()(ptr(scalars[0]), ptr(scalars[1]), ptr(arrays[0]), ptr(arrays[1]), ptr(arrays[2]),
                            None, ptr(arrays[3]), ptr(scalars[2]), None, None, ptr(opt), ptr(scalars[3]),
                            ptr(part))
    if status != 1:  # METIS_OK
        raise GnndistError(f"METIS failed with status {status} (input error or out of memory)")
    return int(scalars[3][0]), part.astype(np.int64, copy=False)


@numba.njit(cache=True)
def _fits(load, q, vwgt, v, caps):  # pragma: no cover - compiled
    """Whether part q stays within caps after receiving node v."""
    for c in range(caps.size):
        if load[q, c] + vwgt[v, c] > caps[c] + 1e-9:
            return False
    return True


@numba.njit(cache=True)
def _rebalance(xadj, adjncy, adjwgt, vwgt, part, k, caps):  # pragma: no cover - compiled
    """Move nodes out of parts whose weight exceeds `caps` (per constraint) into parts that
    stay within caps, best cut gain first. Returns True when every part is within caps."""
    n, ncon = vwgt.shape
    load = np.zeros((k, ncon))
    for v in range(n):
        for c in range(ncon):
            load[part[v], c] += vwgt[v, c]
    conn = np.zeros(k)
    for _ in range(100 * k * ncon):
        wp, wc, worst = -1, -1, 1.0
        for p in range(k):
            for c in range(ncon):
                if load[p, c] > caps[c] * worst + 1e-9:
                    wp, wc, worst = p, c, load[p, c] / caps[c]
        if wp < 0:
            return True
        cand_v = np.empty(n, dtype=np.int64)
        cand_q = np.empty(n, dtype=np.int64)
        cand_gain = np.empty(n)
        m = 0
        for v in range(n):
            if part[v] != wp or vwgt[v, wc] == 0:
                continue
            conn[:] = 0.0
            for j in range(xadj[v], xadj[v + 1]):
                conn[part[adjncy[j]]] += adjwgt[j] if adjwgt.size else 1.0
            best_q, best_gain = -1, -np.inf
            for q in range(k):
                if q != wp and conn[q] > best_gain and _fits(load, q, vwgt, v, caps):
                    best_q, best_gain = q, conn[q]
            if best_q >= 0:
                cand_v[m], cand_q[m], cand_gain[m] = v, best_q, best_gain - conn[wp]
                m += 1
        if m == 0:
            return False
        moved = 0
        for i in np.argsort(-cand_gain[:m]):
            if load[wp, wc] <= caps[wc] + 1e-9:
                break
            v, q = cand_v[i], cand_q[i]
            if _fits(load, q, vwgt, v, caps):
                for c in range(ncon):
                    load[wp, c] -= vwgt[v, c]
                    load[q, c] += vwgt[v, c]
                part[v] = q
                moved += 1
        if moved == 0:
            return False
    return False


def balanced_kway(xadj: np.ndarray, adjncy: np.ndarray, num_parts: int, vwgt: Optional[np.ndarray],
                  adjwgt: Optional[np.ndarray], imbalance_tol: float, seed: int) -> np.ndarray:
    """METIS k-way, then greedy moves that bring any part METIS left above `imbalance_tol`
    (max/mean, per constraint) back within it where possible. Raises GnndistError when a part
    is left without nodes."""
    part = metis_kway(xadj, adjncy, num_parts, vwgt, adjwgt, metis_options(imbalance_tol, seed))[1]
    w = np.ones((xadj.size - 1, 1)) if vwgt is None else vwgt.reshape(xadj.size - 1, -1).astype(np.float64)
    caps = imbalance_tol * w.sum(axis=0) / num_parts
    if num_parts > 1 and caps.size and np.all(caps > 0):
        _rebalance(xadj, adjncy, np.zeros(0) if adjwgt is None else adjwgt.astype(np.float64), w, part,
                   num_parts, caps)
    empty = np.flatnonzero(np.bincount(part, minlength=num_parts) == 0)
    if empty.size:
        raise GnndistError(f"partitioning left {empty.size} of the {num_parts} parts without nodes: the graph is too "
                           "small or too skewed for that many parts; use fewer --parts")
    return part


# ---------------------------------------------------------------- graph for METIS

@numba.njit(cache=True)
def _pair_keys(src, dst, n):  # pragma: no cover - compiled
    """Key min*n+max of every edge that is not a self-loop."""
    keys = np.empty(src.size, dtype=np.int64)
    m = 0
    for i in range(src.size):
        a, b = src[i], dst[i]
        if a != b:
            keys[m] = min(a, b) * n + max(a, b)
            m += 1
    return keys[:m]


@numba.njit(cache=True)
def _csr_pair_keys(indptr, indices):  # pragma: no cover - compiled
    """`_pair_keys` of the CSR entries (row, indices[j])."""
    n = indptr.size - 1
    keys = np.empty(indices.size, dtype=np.int64)
    m = 0
    for r in range(n):
        for j in range(indptr[r], indptr[r + 1]):
            c = indices[j]
            if c != r:
                keys[m] = min(r, c) * n + max(r, c)
                m += 1
    return keys[:m]


@numba.njit(cache=True)
def _adjacency_from_keys(keys, w, n):  # pragma: no cover - compiled
    """Symmetric CSR from sorted pair keys (duplicates merged, weights `w` summed when given).
    Row a lists its lower neighbours, then its higher ones, each ascending: rows come out sorted."""
    deg = np.zeros(n, dtype=np.int64)
    low = np.zeros(n, dtype=np.int64)
    for i in range(keys.size):
        if i == 0 or keys[i] != keys[i - 1]:
            a, b = keys[i] // n, keys[i] % n
            deg[a] += 1
            deg[b] += 1
            low[b] += 1
    xadj = np.zeros(n + 1, dtype=np.int64)
    for r in range(n):
        xadj[r + 1] = xadj[r] + deg[r]
    adjncy = np.empty(xadj[n], dtype=np.int64)
    wsum = np.zeros(xadj[n] if w.size else 0)
    up = xadj[:-1] + low
    lo = xadj[:-1].copy()
    for i in range(keys.size):
        a, b = keys[i] // n, keys[i] % n
        if i == 0 or keys[i] != keys[i - 1]:
            adjncy[up[a]] = b
            adjncy[lo[b]] = a
            up[a] += 1
            lo[b] += 1
        if w.size:
            wsum[up[a] - 1] += w[i]
            wsum[lo[b] - 1] += w[i]
    return xadj, adjncy, wsum


def symmetric_adjacency(src: np.ndarray, dst: np.ndarray, num_nodes: int,
                        weights: Optional[np.ndarray] = None
                        ) -> tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """The simple undirected graph METIS needs: (xadj, adjncy, adjwgt), rows ascending.

    Self-loops are dropped and parallel or opposite edges merged; with `weights` (one per
    edge) the merged weight is their sum, rounded to an integer >= 1.
    """
    if weights is None:
        return pair_adjacency(_pair_keys(src, dst, np.int64(num_nodes)), None, num_nodes)
    keep = src != dst
    return pair_adjacency(pair_key(src[keep], dst[keep], num_nodes), weights[keep], num_nodes)


def pair_key(a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
    """The undirected pair (a, b) of nodes among n as one int64, min * n + max (the keys
    `pair_adjacency` takes)."""
    return np.minimum(a, b) * np.int64(n) + np.maximum(a, b)


def pair_adjacency(keys: np.ndarray, weights: Optional[np.ndarray], num_nodes: int
                   ) -> tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """`symmetric_adjacency` of node pairs given as keys min * n + max in any order, `weights`
    one per key (None: unweighted). Sorts `keys` and `weights` in place, so that a caller who
    lets go of them holds nothing but the graph while METIS runs."""
    if weights is None:
        keys.sort()
        return _adjacency_from_keys(keys, np.zeros(0), num_nodes)[:2] + (None,)
    order = np.argsort(keys, kind="stable")
    keys[:] = keys[order]
    weights[:] = weights[order]
    del order
    xadj, adjncy, wsum = _adjacency_from_keys(keys, weights, num_nodes)
    np.rint(wsum, out=wsum)
    np.maximum(wsum, 1, out=wsum)
    return xadj, adjncy, wsum.astype(_IDX)


def csr_symmetric_adjacency(graph: Graph) -> tuple[np.ndarray, np.ndarray]:
    """`symmetric_adjacency` of a static graph's edges, straight from its CSR."""
    keys = _csr_pair_keys(graph.indptr, graph.indices)
    keys.sort()
    return _adjacency_from_keys(keys, np.zeros(0), graph.num_nodes)[:2]


# ---------------------------------------------------------------- methods

def random_membership(num_nodes: int, num_parts: int, seed: int = 0) -> np.ndarray:
    """Part = a seeded 64-bit mix (splitmix64) of the node id, modulo `num_parts`."""
    seed = check_seed(seed)
    with np.errstate(over="ignore"):
        z = np.arange(num_nodes, dtype=np.uint64) + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return (z % np.uint64(num_parts)).astype(np.int64)


def event_owner_counts(graph: TemporalGraph, num_windows: int = 1) -> np.ndarray:
    """Events each node owns (as source) per time window: int [num_nodes, num_windows].

    Windows split the time-ordered events into `num_windows` runs of equal event counts.
    """
    e = graph.num_events
    win = (np.arange(e, dtype=np.int64) * num_windows) // max(e, 1)
    counts = np.bincount(graph.src * num_windows + win, minlength=graph.num_nodes * num_windows)
    return counts.reshape(graph.num_nodes, num_windows)


def _vertex_weights(graph: Union[Graph, TemporalGraph], balance: Sequence[str]) -> Optional[np.ndarray]:
    """Vertex weight columns for `balance`, or None for nodes only. nodes: 1 each; edges: the
    CSR row length (static) or the events the node owns (temporal); train: training nodes."""
    if list(balance) == ["nodes"]:
        return None
    cols = []
    for key in balance:
        if key == "nodes":
            cols.append(np.ones(graph.num_nodes, dtype=np.int64))
        elif key == "edges":
            cols.append(graph.degrees() if isinstance(graph, Graph) else event_owner_counts(graph)[:, 0])
        elif isinstance(graph, TemporalGraph):
            raise GnndistError(f"--balance {key} applies to static graphs only")
        elif graph.train_mask is None or not graph.train_mask.any():
            raise GnndistError("--balance train needs a graph with training nodes (a train mask)")
        else:
            cols.append(graph.train_mask.astype(np.int64))
    return np.stack(cols, axis=1)


def check_balance(balance: Optional[Sequence[str]]) -> list[str]:
    """Validated, de-duplicated balance keys (default, None: nodes)."""
    if balance is not None and not list(balance):
        raise GnndistError(f"--balance needs one or more of {', '.join(BALANCE_KEYS)}")
    keys = list(dict.fromkeys(balance or ["nodes"]))
    bad = [k for k in keys if k not in BALANCE_KEYS]
    if bad:
        raise GnndistError(f"unknown --balance key {bad[0]!r}; choose from {', '.join(BALANCE_KEYS)}")
    return keys


def metis_membership(graph: Union[Graph, TemporalGraph], num_parts: int, balance: Sequence[str] = ("nodes",),
                     imbalance_tol: float = IMBALANCE_TOL, seed: int = 0) -> np.ndarray:
    """METIS k-way on the symmetrized graph (a temporal graph: its unweighted projection)."""
    vwgt = _vertex_weights(graph, check_balance(balance))
    if isinstance(graph, Graph):
        xadj, adjncy = csr_symmetric_adjacency(graph)
    else:
        xadj, adjncy, _ = symmetric_adjacency(graph.src, graph.dst, graph.num_nodes)
    return balanced_kway(xadj, adjncy, num_parts, vwgt, None, imbalance_tol, seed)


def event_weights(t: np.ndarray, t_first: float, span: float, recency: float) -> np.ndarray:
    """Each event's weight in the temporal projection: `16 * (1 + recency * (t - t_first) / span)`
    rounded to an integer (int64), so that a pair's weight is an exact sum, the same in any order
    of summation (the events of a pair may be summed on several ranks)."""
    frac = (t - t_first) / span if span > 0 else np.zeros_like(t)
    return np.rint(16.0 * (1.0 + recency * frac)).astype(np.int64)


def temporal_membership(graph: TemporalGraph, num_parts: int, num_windows: int = 4, recency: float = 1.0,
                        imbalance_tol: float = IMBALANCE_TOL, seed: int = 0, hubs: Optional[np.ndarray] = None
                        ) -> np.ndarray:
    """The temporal partitioner: METIS on the recency-weighted event projection.

    Pair weight = sum over its events of `event_weights` (so the latest events count `1 + recency`
    times the first). Vertex
    weights = events the node owns in each of `num_windows` time windows of equal event counts
    (consecutive in time order), so every part gets its share of events in every window. Events touching a replicated hub
    (`hubs`) are left out of the pair weights: they are local reads in every part.
    """
    check_time_windows(graph.num_events, num_parts, num_windows)
    check("recency", recency, Real(high=MAX_RECENCY))
    owners = np.unique(graph.src).size
    if num_parts > owners:
        raise GnndistError(f"--method temporal balances the events each part owns, so --parts must be at most the "
                           f"{owners} nodes that own events (are an event source), got {num_parts}")
    t = graph.t
    w = event_weights(t, float(t[0]), float(t[-1] - t[0]) if graph.num_events else 0.0, recency)
    src, dst = graph.src, graph.dst
    if hubs is not None and hubs.size:
        is_hub = np.zeros(graph.num_nodes, dtype=bool)
        is_hub[hubs] = True
        keep = ~(is_hub[src] | is_hub[dst])
        src, dst, w = src[keep], dst[keep], w[keep]
    xadj, adjncy, adjwgt = symmetric_adjacency(src, dst, graph.num_nodes, weights=w)
    del src, dst, w
    vwgt = event_owner_counts(graph, num_windows)
    vwgt = vwgt[:, vwgt.sum(axis=0) > 0]
    return balanced_kway(xadj, adjncy, num_parts, vwgt if vwgt.shape[1] else None, adjwgt, imbalance_tol, seed)
