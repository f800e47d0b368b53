"""Columns of rows kept within a memory budget: `Table` (rows in the order they come, read back a
block at a time), `SortedRuns` (rows put in order of a key), and .npy files written a block of
rows at a time (`write_npy`).

`Table`: one-dimensional columns of equal length, appended a chunk at a time, held in memory
while they fit a quarter of the budget; beyond it they go to raw files (one per column) in a
folder, and every pass over them reads a block of rows at a time. In memory a pass is one block,
the whole columns.

`SortedRuns`: rows are added in any order, into a buffer made once: the rows to come where they
fit a quarter of the budget, else that quarter. When it is full its rows are sorted by the key
and spilled to disk as a run (an .npy file per column). `merged` yields every row in order of
the key, a block at a time, by a k-way merge of the runs: once one run is spilled the rows still
in memory follow it to disk; rows that always fitted are one run, sorted in memory and merged
through the same code. A run's files are removed once it is merged; `close` removes whatever is
left. Keys are int64; rows of equal keys come out in the order they were added.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from gnndist.errors import GnndistError

BLOCK_BYTES = 64 << 20  # rows a merge holds at most at once (all runs' blocks together)
MIN_BLOCK_ROWS = 16  # rows a run offers the merge at once at least, whatever the budget


def _row_bytes(columns: Sequence[np.ndarray]) -> int:
    return sum(c.dtype.itemsize * int(np.prod(c.shape[1:])) for c in columns)


def _spill_error(folder: Path, e: OSError) -> GnndistError:
    return GnndistError(f"cannot spill rows to {folder}: {e.strerror or e}")


class Table:
    """Named one-dimensional columns of equal length within `budget` bytes, in files in `folder`
    (made when first needed) beyond a quarter of it."""

    def __init__(self, budget: int, folder: Path):
        self.budget, self.folder = budget, folder
        # a pass holds a block's columns and its temporaries (some ten int64 arrays a block) at once
        self.block_rows = max(1024, budget // 1024)
        self.rows = 0
        self.columns: dict[str, np.ndarray] = {}  # in memory: the columns; in files: none
        self.pieces: dict[str, list[np.ndarray]] = {}  # while appending in memory
        self.dtypes: dict[str, np.dtype] = {}
        self.spilled = False
        self.spilled_bytes = 0  # the most bytes the files held at once

    def _file(self, name: str) -> Path:
        return self.folder / f"{name}.bin"

    def append(self, **cols: np.ndarray) -> None:
        """Rows, a column each (every column, every time)."""
        for name, c in cols.items():
            self.dtypes.setdefault(name, c.dtype)
            self.pieces.setdefault(name, []).append(np.asarray(c, self.dtypes[name]))
        self.rows += len(next(iter(cols.values())))
        if not self.spilled and self.rows * sum(d.itemsize for d in self.dtypes.values()) > self.budget // 4:
            self.spilled = True
        if self.spilled:
            self._flush()

    def _flush(self) -> None:
        """The appended pieces to the end of their files."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            for name, got in self.pieces.items():
                with open(self._file(name), "ab") as f:
                    for c in got:
                        c.tofile(f)
        except OSError as e:
            raise _spill_error(self.folder, e) from None
        self.pieces = {}
        self._note_files()

    def finish(self) -> None:
        """The end of the appends: in memory, each column joined into one array."""
        if not self.spilled:
            for name in list(self.pieces):  # a column at a time, its pieces freed as it is joined
                got = self.pieces.pop(name)
                self.columns[name] = got[0] if len(got) == 1 else np.concatenate(got)

    def spill(self) -> None:
        """The columns to their files now, if they are in memory (for a phase that needs the
        memory for something else); every later pass reads them from there."""
        if not self.spilled:
            self.pieces, self.columns = {name: [c] for name, c in self.columns.items()}, {}
            self.spilled = True
            self._flush()

    def read(self, name: str, a: int, b: int) -> np.ndarray:
        """Rows a..b-1 of a column (in memory: a view)."""
        if not self.spilled:
            return self.columns[name][a:b]
        d = self.dtypes[name]
        return np.fromfile(self._file(name), d, max(b - a, 0), offset=a * d.itemsize)

    def _step(self) -> int:
        """The rows of a block: in memory, all of them."""
        return self.block_rows if self.spilled else max(self.rows, 1)

    def blocks(self, *names: str) -> Iterator[tuple[int, list[np.ndarray]]]:
        """(first row, the columns `names`) of each block of rows in turn; in memory one block."""
        step = self._step()
        for a in range(0, self.rows, step):
            yield a, [self.read(name, a, min(a + step, self.rows)) for name in names]

    def passes(self) -> int:
        """The blocks a pass over the rows takes."""
        return -(-self.rows // self._step())

    def replace(self, name: str, blocks: Iterable[np.ndarray]) -> None:
        """Column `name` (new or replaced) from `blocks`: its rows, consecutive, in turn."""
        if not self.spilled:
            got = list(blocks)
            self.columns[name] = got[0] if len(got) == 1 else np.concatenate(got) if got else np.zeros(0)
            self.dtypes[name] = self.columns[name].dtype
            return
        new = self.folder / f"{name}.new"
        try:
            with open(new, "wb") as f:
                for b in blocks:
                    self.dtypes[name] = b.dtype
                    b.tofile(f)
            os.replace(new, self._file(name))
        except OSError as e:
            raise _spill_error(self.folder, e) from None
        self._note_files()

    def _note_files(self) -> None:
        self.spilled_bytes = max(self.spilled_bytes, self.rows * sum(d.itemsize for d in self.dtypes.values()))

    def close(self) -> None:
        """Let go of every column (and remove the folder)."""
        self.columns, self.pieces = {}, {}
        shutil.rmtree(self.folder, ignore_errors=True)

    def drop(self, *names: str) -> None:
        for name in names:
            self.columns.pop(name, None)
            self.dtypes.pop(name, None)
            self._file(name).unlink(missing_ok=True)


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
        # sorting the buffer holds it, its order and one column in order at once: within a quarter
        sorting = self.row_bytes + 8 + max(_row_bytes([c]) for c in self.like)
        fits = rows * sorting <= budget // 4
        self.buffer = [np.empty((max(rows if fits else budget // 4 // sorting, 1), *c.shape[1:]), c.dtype)
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
            raise _spill_error(self.folder, e) from None
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

    def added(self) -> None:
        """The end of the adds: once a run is spilled, the rows still in memory follow it to disk
        and the buffer is let go (the merge then holds the runs' blocks alone)."""
        if self.runs and self.held:
            self.spill()
        if self.runs:
            self.buffer = []

    def merged(self) -> Iterator[list[np.ndarray]]:
        """Every row in order of the key, in blocks of at most BLOCK_BYTES (and a quarter of the
        budget): each run offers a block; the rows up to the least of the last keys of the runs
        not yet exhausted are in order among all runs, and go out together."""
        self.added()
        runs = [self._file_run(files, rows) for files, rows in self.runs] or [self._memory_run()]
        # a block is held three times (the runs' heads, joined, in order): within a quarter
        per = max(MIN_BLOCK_ROWS, min(self.budget // 4, BLOCK_BYTES) // 3 // self.row_bytes // len(runs))
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
