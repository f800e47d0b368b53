"""Temporal neighbour sampling over T-CSR: for (node, time) queries, neighbours whose event
time is strictly earlier than the query time.

Output is PADDED: `[Q, k]` arrays with a mask, valid entries first and ordered most recent
first (descending event time, ties by descending event id), for both strategies.
`recent` takes the k latest earlier events; `uniform` takes k distinct ones uniformly (all of
them when there are at most k). Uniform draws depend only on (seed, hop, node, query time).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from gnndist.errors import GnndistError
from gnndist.graph import TemporalGraph, as_node_ids
from gnndist.samplers.kernels import as_seed, tcsr_sample

STRATEGIES = ("recent", "uniform")


@dataclass(eq=False)
class TemporalSample:
    """Padded temporal neighbours of Q queries: `nbr`, `eid` int64 [Q, k], `ts` float64 [Q, k]
    (event times), `dt` float32 [Q, k] (query time - ts), `mask` bool [Q, k], and where the
    sampler was asked for them the sampled events' features `feat` [Q, k, D]. Valid entries
    come first, most recent first; padding holds 0 everywhere."""

    nbr: np.ndarray
    eid: np.ndarray
    ts: np.ndarray
    dt: np.ndarray
    mask: np.ndarray
    feat: Optional[np.ndarray] = None

    @property
    def counts(self) -> np.ndarray:
        """Valid neighbours per query."""
        return self.mask.sum(axis=1)

    def rows(self, lo: int, hi: int) -> "TemporalSample":
        """The samples of queries lo .. hi-1 (views)."""
        return TemporalSample(self.nbr[lo:hi], self.eid[lo:hi], self.ts[lo:hi], self.dt[lo:hi], self.mask[lo:hi],
                              None if self.feat is None else self.feat[lo:hi])

    @classmethod
    def finish(cls, nbr: np.ndarray, eid: np.ndarray, ts: np.ndarray, counts: np.ndarray,
               times: np.ndarray, feat: Optional[np.ndarray] = None) -> "TemporalSample":
        """From zero-padded kernel outputs and the query times."""
        mask = np.arange(nbr.shape[1]) < counts[:, None]
        dt = np.where(mask, times[:, None] - ts, 0.0).astype(np.float32)
        return cls(nbr, eid, ts, dt, mask, feat)


def check_query(nodes, times, k: int, strategy: str, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Validated (nodes int64, times float64) of a query batch."""
    if strategy not in STRATEGIES:
        raise GnndistError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if int(k) < 1:
        raise GnndistError(f"k must be >= 1, got {k}")
    nodes = as_node_ids("nodes", nodes, num_nodes)
    times = np.ascontiguousarray(times, dtype=np.float64)
    if times.shape != nodes.shape:
        raise GnndistError(f"nodes and times must have equal lengths, got {nodes.size} and {times.size}")
    if np.isnan(times).any():
        raise GnndistError("query times hold NaN")
    return nodes, times


def sample_tcsr(indptr: np.ndarray, nbr: np.ndarray, eid: np.ndarray, ts: np.ndarray, nodes: np.ndarray,
                times: np.ndarray, k: int, strategy: str = "recent", seed: int = 0, hop: int = 0,
                rows: np.ndarray | None = None) -> TemporalSample:
    """The kernel on raw T-CSR arrays (as `TemporalGraph.tcsr()` gives): no input checks.
    `rows` are the T-CSR rows of `nodes` when the T-CSR holds only some nodes (default: nodes)."""
    q = nodes.size
    times = np.ascontiguousarray(times, dtype=np.float64)
    out = (np.empty((q, k), np.int64), np.empty((q, k), np.int64), np.empty((q, k), np.float64),
           np.empty((q, k), np.float32), np.empty((q, k), np.bool_))
    tcsr_sample(indptr, nbr, eid, ts, nodes if rows is None else rows, nodes, times, k, strategy == "uniform",
                as_seed(seed), hop, *out)
    return TemporalSample(*out)


def sample_temporal_neighbors(tgraph: TemporalGraph, nodes, times, k: int, strategy: str = "recent",
                              seed: int = 0) -> TemporalSample:
    """For each query (nodes[i], times[i]), up to `k` neighbours from events strictly earlier
    than times[i] (padded `[Q, k]` form, see `TemporalSample`)."""
    nodes, times = check_query(nodes, times, k, strategy, tgraph.num_nodes)
    return sample_tcsr(*tgraph.tcsr(), nodes, times, int(k), strategy, seed)


SampleFn = Callable[[np.ndarray, np.ndarray, int, int], TemporalSample]


def multihop(sample: SampleFn, nodes: np.ndarray, times: np.ndarray, ks: Sequence[int]) -> list[TemporalSample]:
    """Hop h+1 queries every hop-h slot: its neighbour at its event time (TGAT). Padded slots
    query time -inf and so stay empty; hop h has Q * k_0 * ... * k_{h-1} rows."""
    out = []
    for h, k in enumerate(ks):
        s = sample(nodes, times, int(k), h)
        out.append(s)
        nodes, times = s.nbr.reshape(-1), np.where(s.mask, s.ts, -np.inf).reshape(-1)
    return out


def sample_temporal_multihop(tgraph: TemporalGraph, nodes, times, ks: Sequence[int], strategy: str = "recent",
                             seed: int = 0) -> list[TemporalSample]:
    """Multi-hop temporal sampling, one `TemporalSample` per hop (see `multihop`)."""
    nodes, times = check_query(nodes, times, min(ks, default=0), strategy, tgraph.num_nodes)
    tcsr = tgraph.tcsr()
    return multihop(lambda n, t, k, h: sample_tcsr(*tcsr, n, t, k, strategy, seed, h), nodes, times, ks)
