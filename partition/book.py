"""Which part owns each node (`PartitionBook`, as DGL's GraphPartitionBook): a partition store
renumbers the nodes so that part p owns the contiguous new ids `offsets[p] .. offsets[p+1]-1`,
and finding a node's owner is one binary search."""
from __future__ import annotations

from typing import Sequence, Union

import numpy as np

from gnndist.errors import GnndistError


class PartitionBook:
    """The node ranges of the parts: part p owns the new ids `offsets[p] .. offsets[p+1]-1`."""

    def __init__(self, offsets: Union[Sequence[int], np.ndarray]) -> None:
        off = np.asarray(offsets, dtype=np.int64)
        if off.ndim != 1 or off.size < 2 or off[0] != 0 or np.any(np.diff(off) < 0):
            raise GnndistError(f"node offsets must be non-decreasing from 0, one more than the parts, got {offsets!r}")
        self.offsets = off

    @classmethod
    def whole(cls, num_nodes: int) -> "PartitionBook":
        """One part that owns every node."""
        return cls([0, num_nodes])

    @property
    def num_parts(self) -> int:
        return int(self.offsets.size - 1)

    @property
    def num_nodes(self) -> int:
        return int(self.offsets[-1])

    def owner(self, ids: np.ndarray) -> np.ndarray:
        """The part that owns each of the new ids `ids`."""
        return np.searchsorted(self.offsets, ids, side="right") - 1

    def range(self, part: int) -> tuple[int, int]:
        """(first, one past the last) new id part `part` owns."""
        return int(self.offsets[part]), int(self.offsets[part + 1])

    def sizes(self) -> np.ndarray:
        """The node count of every part."""
        return np.diff(self.offsets)

    def for_world(self, world: int) -> "PartitionBook":
        """This book, checked to have one part per rank of a `world`-rank job."""
        if self.num_parts != world:
            raise GnndistError(f"the partition has {self.num_parts} parts but {world} ranks run: one part per rank")
        return self

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PartitionBook) and np.array_equal(self.offsets, other.offsets)

    def __repr__(self) -> str:
        return f"PartitionBook({self.offsets.tolist()})"
