"""Rows put in order of a key within a memory budget (`SortedRuns`), and .npy files written a
block of rows at a time (`write_npy`).

Rows are added in any order, into a buffer made once: the rows to come where they fit a quarter
of the budget, else that quarter. When it is full its rows are sorted by the key and spilled to
disk as a run (an .npy file per column). `merged`
yields every row in order of the key, a block at a time, by a k-way merge of the runs: once one
run is spilled the rows still in memory follow it to disk; rows that always fitted are one run,
sorted in memory and merged through the same code. A run's files are removed once it is merged;
`close` removes whatever is left. Keys are int64 and distinct.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from gnndist.errors import GnndistError

BLOCK_BYTES = 64 << 20  # rows a merge holds at most at once (all runs' blocks together)
MIN_BLOCK_ROWS = 16  # rows a run offers the merge at once at least, whatever the budget


def _row_bytes(columns: Sequence[np.ndarray]) -> int:
    return sum(c.dtype.itemsize * int(np.prod(c.shape[1:])) for c in columns)


@dataclass
class _Run:
    """A sorted run: `rows` rows, `read(a, b)` its rows a..b-1 (a column each), `drop()` once read."""

    rows: int
    read: Callable[[int, int], list[np.ndarray]]
    drop: Callable[[], None]


class SortedRuns:
    """`rows` rows (as many as will be added) of the named columns `like` (empty arrays: dtype and
    trailing shape; the first column is the key), kept within `budget` bytes, spilled to `folder`
    (made when first needed) beyond it."""

    def __init__(self, like: dict[str, np.ndarray], rows: int, budget: int, folder: Path):
        self.names = list(like)
        self.like = [np.empty((0, *c.shape[1:]), c.dtype) for c in like.values()]
        self.row_bytes = max(_row_bytes(self.like), 1)
        self.budget = budget
        self.folder = folder
        fits = rows * self.row_bytes <= budget // 4
        self.buffer = [np.empty((max(rows if fits else budget // 4 // self.row_bytes, 1), *c.shape[1:]), c.dtype)
                       for c in self.like]
        self.held = 0  # rows in the buffer
        self.runs: list[tuple[list[Path], int]] = []  # the spilled runs: their files (a column each), rows
        self.rows = 0
        self.spilled_bytes = 0
        self.heads: list[list[np.ndarray]] = []  # during `merged`: each run's block at hand

    def add(self, columns: Sequence[np.ndarray]) -> None:
        """Rows (one array per column, of equal length), spilling a run whenever the buffer is full."""
        room = self.buffer[0].shape[0]
        for a in range(0, len(columns[0]), room):
            piece = [c[a:a + room] for c in columns]
            n = len(piece[0])
            if self.held + n > room:
                self.spill()
            for b, c in zip(self.buffer, piece):
                b[self.held:self.held + n] = c
            self.held += n
            self.rows += n

    def _sorted(self) -> tuple[list[np.ndarray], np.ndarray]:
        """The rows in the buffer (a view per column), and the order that sorts them by key."""
        cols = [b[:self.held] for b in self.buffer]
        return cols, np.argsort(cols[0], kind="stable")

    def spill(self) -> None:
        """The rows in the buffer, sorted by key, as a run on disk."""
        cols, order = self._sorted()
        files = [self.folder / f"run{len(self.runs)}-{j}.npy" for j in range(len(cols))]
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            for path, c in zip(files, cols):
                np.save(path, c[order])
        except OSError as e:
            raise GnndistError(f"cannot spill sorted rows to {self.folder}: {e.strerror or e}") from None
        self.runs.append((files, order.size))
        self.spilled_bytes += order.size * self.row_bytes
        self.held = 0

    def _file_run(self, files: list[Path], rows: int) -> _Run:
        """A spilled run, read a block at a time (through reads, not a memory map, so that what it
        has read does not stay resident)."""
        where = [(f, f.stat().st_size - rows * _row_bytes([like]), like) for f, like in zip(files, self.like)]

        def read(a: int, b: int) -> list[np.ndarray]:
            out = []
            for path, offset, like in where:
                width = int(np.prod(like.shape[1:]))
                with open(path, "rb") as f:
                    f.seek(offset + a * width * like.dtype.itemsize)
                    out.append(np.fromfile(f, like.dtype, (b - a) * width).reshape(b - a, *like.shape[1:]))
            return out

        def drop() -> None:
            for f in files:
                f.unlink(missing_ok=True)

        return _Run(rows, read, drop)

    def _memory_run(self) -> _Run:
        cols, order = self._sorted()
        return _Run(order.size, lambda a, b: [c[order[a:b]] for c in cols], lambda: None)

    def merged(self) -> Iterator[list[np.ndarray]]:
        """Every row in order of the key, in blocks of at most BLOCK_BYTES (and a quarter of the
        budget): each run offers a block; the rows up to the least of the last keys of the runs
        not yet exhausted are in order among all runs, and go out together."""
        if self.runs and self.held:
            self.spill()  # the rest joins the runs on disk: the merge then holds their blocks alone
        if self.runs:
            self.buffer = []
        runs = [self._file_run(files, rows) for files, rows in self.runs] or [self._memory_run()]
        per = max(MIN_BLOCK_ROWS, min(self.budget // 4, BLOCK_BYTES) // self.row_bytes // len(runs))
        at = [0] * len(runs)
        self.heads = [[like for like in self.like] for _ in runs]
        while True:
            for i, run in enumerate(runs):
                if not self.heads[i][0].size and at[i] < run.rows:
                    self.heads[i] = run.read(at[i], min(at[i] + per, run.rows))
                    at[i] += self.heads[i][0].size
                    if at[i] == run.rows:
                        run.drop()
            if not any(h[0].size for h in self.heads):
                self.heads = []
                return
            bound = min((h[0][-1] for h, a, r in zip(self.heads, at, runs) if a < r.rows), default=None)
            taken = []
            for i, h in enumerate(self.heads):
                cut = h[0].size if bound is None else int(np.searchsorted(h[0], bound, side="right"))
                taken.append([c[:cut] for c in h])
                self.heads[i] = [c[cut:] for c in h]
            cols = [np.concatenate(c) for c in zip(*taken)]
            del taken
            order = np.argsort(cols[0], kind="stable")
            yield [c[order] for c in cols]

    def close(self) -> None:
        """Remove the spill folder and everything in it."""
        shutil.rmtree(self.folder, ignore_errors=True)


def write_npy(paths: Sequence[Path], like: Sequence[np.ndarray], rows: int,
              blocks: Iterator[list[np.ndarray]]) -> None:
    """.npy files of `rows` rows, one per column shaped and typed as `like`, written from
    `blocks` (a column each of consecutive rows) in turn: the bytes `np.save` writes for each
    whole column."""
    files = [open(path, "wb") for path in paths]
    try:
        for f, c in zip(files, like):
            header = np.lib.format.header_data_from_array_1_0(c[:0])
            header["shape"] = (rows, *c.shape[1:])
            np.lib.format.write_array_header_1_0(f, header)
        for block in blocks:
            for f, c, b in zip(files, like, block):
                np.ascontiguousarray(b, c.dtype).tofile(f)
    finally:
        for f in files:
            f.close()
