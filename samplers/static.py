"""Uniform multi-hop neighbour sampling over CSR, returning PyG-ready blocks.

Neighbours of a target v are the CSR entries `indices[indptr[v]:indptr[v+1]]` (messages flow
from them to v). As DGL's message flow graphs: hop h draws neighbours for every node reached so
far (not only those new at hop h), and layer L-1-h of an L-layer model aggregates over those
draws. The draws for v at hop h depend only on (seed, h, v), so what a model computes for a seed
is the same for any thread count, batch composition or rank layout (see `DistNeighborSampler`):
the other seeds of its batch, and the rank that samples it, change nothing.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from gnndist.errors import GnndistError
from gnndist.graph import Graph, as_node_ids
from gnndist.samplers.kernels import as_seed, fill_targets, hop_fill, map_ids

if TYPE_CHECKING:  # pragma: no cover
    import torch


def sample_rows(indptr: np.ndarray, indices: np.ndarray, rows: np.ndarray, ids: np.ndarray, fanout: int,
                replace: bool, seed: int, salt: int) -> tuple[np.ndarray, np.ndarray]:
    """(counts, edges) for the given CSR rows, streams keyed by `ids`: edges is int64 [2, E]
    with the sampled neighbours in row 0 (row 1 is left for the caller). Each row gets all its
    neighbours (fanout -1), min(degree, fanout), or fanout with replacement (0 if isolated)."""
    starts = indptr[rows]
    degs = indptr[rows + 1] - starts
    counts = degs
    if fanout >= 0:
        counts = np.where(degs > 0, fanout, 0) if replace else np.minimum(degs, fanout)
    offsets = np.zeros(rows.size + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    edges = np.empty((2, int(offsets[-1])), np.int64)
    hop_fill(indices, starts, degs, ids, offsets, replace, fanout < 0, as_seed(seed), salt, edges[0])
    return counts, edges


_marks = threading.local()


class Relabeler:
    """Global ids -> consecutive local ids in first-seen order, through a dense int32 table of
    all ids kept per thread (reset after each use, so a batch costs time in its own size)."""

    def __init__(self, num_nodes: int) -> None:
        mark, nodes = getattr(_marks, "buffers", None) or (np.empty(0, np.int32), np.empty(1024, np.int64))
        if mark.size < num_nodes:
            mark = np.full(num_nodes, -1, np.int32)
        _marks.buffers = None  # held by this relabeler until release()
        self.mark, self.nodes, self.n = mark, nodes, 0

    def add(self, ids: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Local ids of `ids` (written to `out`, which may be `ids` itself); new ones are appended."""
        need = self.n + ids.size
        if need > self.nodes.size:
            self.nodes = np.concatenate([self.nodes[: self.n], np.empty(max(need, 2 * self.nodes.size) - self.n, np.int64)])
        out = np.empty(ids.size, np.int64) if out is None else out
        self.n = map_ids(self.mark, self.nodes, self.n, ids, out)
        return out

    def release(self) -> np.ndarray:
        """The node ids seen, in order; resets the table and hands the buffers back to this thread."""
        self.mark[self.nodes[: self.n]] = -1
        _marks.buffers = (self.mark, self.nodes)
        return self.nodes[: self.n].copy()


@dataclass(eq=False)
class Blocks:
    """A sampled multi-hop neighbourhood.

    `node_ids`: global ids; the seeds first (in order), then the nodes new at hop 1, hop 2, ...
    `num_nodes_per_hop`: [len(seeds), new at hop 1, ...].
    `edge_index[h]`: int64 [2, E_h] over local ids (positions in `node_ids`); row 0 is the
    sampled neighbour (message source), row 1 the target it was sampled for. Hop h targets are
    all the nodes reached before it: the first sum(num_nodes_per_hop[:h + 1]).
    """

    node_ids: np.ndarray
    num_nodes_per_hop: list[int]
    edge_index: list[np.ndarray]

    @property
    def num_seeds(self) -> int:
        return self.num_nodes_per_hop[0]

    @property
    def num_sampled(self) -> int:
        """Sampled edges over all hops."""
        return int(sum(e.shape[1] for e in self.edge_index))

    def to_pyg(self) -> tuple["torch.Tensor", list["torch.Tensor"]]:
        """(n_id, one edge_index per layer) as torch tensors, the first layer's first (the last
        hop's): run PyG layer l on the previous one's output (x[n_id] first) with the l-th edge_index,
        and read the first `num_seeds` rows of the last one."""
        import torch

        return torch.from_numpy(self.node_ids), [torch.from_numpy(e) for e in reversed(self.edge_index)]


# hop(targets, fanout, h) -> (counts per target, int64 [2, E] edges with neighbours in row 0)
HopFn = Callable[[np.ndarray, int, int], tuple[np.ndarray, np.ndarray]]


def check_fanouts(fanouts: Sequence[int]) -> list[int]:
    """`fanouts` as ints, each positive or -1 (all neighbours)."""
    out = [int(f) for f in fanouts]
    if any(f == 0 or f < -1 for f in out):
        raise GnndistError(f"each fanout must be a positive integer or -1 (all), got {list(fanouts)}")
    return out


def build_blocks(seeds: np.ndarray, fanouts: Sequence[int], hop: HopFn, num_nodes: int) -> Blocks:
    """Run `hop` once per hop over every node reached so far and relabel the edges in place.
    Every hop runs even with no targets (distributed hops are collectives)."""
    rel = Relabeler(num_nodes)
    try:
        rel.add(seeds)
        if rel.n != seeds.size:
            raise GnndistError("seeds must be unique node ids")
        sizes, edges = [seeds.size], []
        for h, fanout in enumerate(fanouts):
            reached = rel.n
            counts, ei = hop(rel.nodes[:reached], fanout, h)
            rel.add(ei[0], out=ei[0])
            fill_targets(ei[1], counts, 0)
            edges.append(ei)
            sizes.append(rel.n - reached)
    finally:
        node_ids = rel.release()
    return Blocks(node_ids, sizes, edges)


def sample_neighbors(graph: Graph, seeds, fanouts: Sequence[int], replace: bool = False, seed: int = 0) -> Blocks:
    """Uniform multi-hop neighbour sampling from `seeds` with per-hop `fanouts` (-1: all)."""
    seeds = as_node_ids("seeds", seeds, graph.num_nodes)
    fanouts = check_fanouts(fanouts)

    def hop(targets: np.ndarray, fanout: int, h: int) -> tuple[np.ndarray, np.ndarray]:
        return sample_rows(graph.indptr, graph.indices, targets, targets, fanout, replace, seed, h)

    return build_blocks(seeds, fanouts, hop, graph.num_nodes)
