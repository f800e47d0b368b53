"""Uniform multi-hop neighbour sampling over CSR, returning PyG-ready blocks.

Neighbours of a target v are the CSR entries `indices[indptr[v]:indptr[v+1]]` (messages flow
from them to v). The draws for v at hop h depend only on (seed, h, v), so the result is the
same for any thread count, batch composition or rank layout (see `DistNeighborSampler`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from gnndist.errors import GnndistError
from gnndist.graph import Graph, _as_ids
from gnndist.samplers.kernels import as_seed, hop_counts, hop_fill, map_ids

if TYPE_CHECKING:  # pragma: no cover
    import torch


def sample_rows(indptr: np.ndarray, indices: np.ndarray, rows: np.ndarray, ids: np.ndarray, fanout: int,
                replace: bool, seed: int, salt: int) -> tuple[np.ndarray, np.ndarray]:
    """(counts, flat neighbours) for the given CSR rows, streams keyed by `ids`."""
    counts = hop_counts(indptr, rows, fanout, replace)
    offsets = np.zeros(rows.size + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    out = np.empty(int(offsets[-1]), np.int64)
    hop_fill(indptr, indices, rows, ids, offsets, fanout, replace, as_seed(seed), salt, out)
    return counts, out


class Relabeler:
    """Global ids -> consecutive local ids in first-seen order (a growing hash table)."""

    def __init__(self, capacity: int = 1024) -> None:
        self.n = 0
        self.nodes = np.empty(max(capacity, 16), np.int64)
        self._alloc(max(capacity, 16))

    def _alloc(self, capacity: int) -> None:
        size = 1 << int(2 * capacity - 1).bit_length()
        self.shift = 65 - size.bit_length()
        self.keys = np.full(size, -1, np.int64)
        self.vals = np.empty(size, np.int64)

    def add(self, ids: np.ndarray) -> np.ndarray:
        """Local ids of `ids`; new ones are appended."""
        need = self.n + ids.size
        if need > self.nodes.size:
            self.nodes = np.concatenate([self.nodes[: self.n], np.empty(max(need, 2 * self.nodes.size) - self.n, np.int64)])
        if 2 * need > self.keys.size:
            self._alloc(need)
            map_ids(self.keys, self.vals, self.nodes.copy(), 0, self.nodes[: self.n], np.empty(self.n, np.int64), self.shift)
        local = np.empty(ids.size, np.int64)
        self.n = map_ids(self.keys, self.vals, self.nodes, self.n, ids, local, self.shift)
        return local


@dataclass(eq=False)
class Blocks:
    """A sampled multi-hop neighbourhood.

    `node_ids`: global ids; the seeds first (in order), then the nodes new at hop 1, hop 2, ...
    `num_nodes_per_hop`: [len(seeds), new at hop 1, ...].
    `edge_index[h]`: int64 [2, E_h] over local ids (positions in `node_ids`); row 0 is the
    sampled neighbour (message source), row 1 the target it was sampled for. Hop 0 targets
    are the seeds; hop h targets are the nodes new at hop h.
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

    def to_pyg(self) -> tuple["torch.Tensor", "torch.Tensor"]:
        """(n_id, edge_index) as torch tensors, all hops concatenated: run L PyG layers on
        x[n_id] with this edge_index and read the first `num_seeds` output rows."""
        import torch

        ei = np.concatenate(self.edge_index, axis=1) if self.edge_index else np.empty((2, 0), np.int64)
        return torch.from_numpy(self.node_ids), torch.from_numpy(ei)


HopFn = Callable[[np.ndarray, int, int], tuple[np.ndarray, np.ndarray]]


def check_fanouts(fanouts: Sequence[int]) -> list[int]:
    out = [int(f) for f in fanouts]
    if any(f == 0 or f < -1 for f in out):
        raise GnndistError(f"each fanout must be a positive integer or -1 (all), got {list(fanouts)}")
    return out


def build_blocks(seeds: np.ndarray, fanouts: Sequence[int], hop: HopFn) -> Blocks:
    """Run `hop(targets, fanout, h) -> (counts, flat neighbours)` once per hop and relabel.
    Every hop runs even with no targets (distributed hops are collectives)."""
    rel = Relabeler(seeds.size * 4)
    rel.add(seeds)
    if rel.n != seeds.size:
        raise GnndistError("seeds must be unique node ids")
    sizes, edges, start = [seeds.size], [], 0
    for h, fanout in enumerate(fanouts):
        targets = np.arange(start, start + sizes[-1], dtype=np.int64)
        counts, nbrs = hop(rel.nodes[start: start + sizes[-1]], fanout, h)
        start += sizes[-1]
        edges.append(np.stack([rel.add(nbrs), np.repeat(targets, counts)]))
        sizes.append(rel.n - start)
    return Blocks(rel.nodes[: rel.n].copy(), sizes, edges)


def sample_neighbors(graph: Graph, seeds, fanouts: Sequence[int], replace: bool = False, seed: int = 0) -> Blocks:
    """Uniform multi-hop neighbour sampling from `seeds` with per-hop `fanouts` (-1: all)."""
    seeds = _as_ids("seeds", seeds, graph.num_nodes)
    fanouts = check_fanouts(fanouts)

    def hop(targets: np.ndarray, fanout: int, h: int) -> tuple[np.ndarray, np.ndarray]:
        return sample_rows(graph.indptr, graph.indices, targets, targets, fanout, replace, seed, h)

    return build_blocks(seeds, fanouts, hop)
