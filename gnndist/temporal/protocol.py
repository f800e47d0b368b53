"""How a temporal run splits its events and evaluates them: gnndist's own protocol, or TGB's
with a TGB dataset by name (Huang et al. 2023; `gnndist.datasets.tgb.write_protocol` keeps it
when the dataset is converted).

- gnndist: the events' 70/15/15 chronological split; validation and test negatives drawn as
  `gnndist.temporal.linkpred` says (`--neg`, `--eval-negatives`).
- tgb: TGB's split (by the 0.70 and 0.85 quantiles of the times) and, for a tgbl dataset, TGB's
  fixed negatives of each validation and test event, one-vs-many: MRR ranks the event among all
  of its negatives (AP and AUC take its first). They are memory-mapped arrays in event order,
  of which a rank reads only the rows of the events it scores.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from gnndist.datasets import DataSource, chronological_split
from gnndist.datasets.tgb import NEGATIVES_FILE, SPLIT_FILE
from gnndist.errors import GnndistError


@dataclass(frozen=True)
class Protocol:
    """A run's split of its events (train [0, train_end), validation [train_end, val_end), test
    [val_end, E)) and where fixed evaluation negatives come from (`folder`: TGB's, or None)."""

    name: str  # "gnndist" | "tgb"
    train_end: int
    val_end: int
    num_events: int
    folder: Optional[str] = None

    @classmethod
    def of(cls, num_events: int, folder: Optional[str] = None) -> "Protocol":
        """gnndist's own protocol for `num_events` events, or TGB's kept in `folder`."""
        if folder is None:
            return cls("gnndist", *chronological_split(num_events), num_events)
        where = Path(folder) / SPLIT_FILE
        try:
            split = json.loads(where.read_text())
            train_end, val_end, total = (int(split[k]) for k in ("train_end", "val_end", "num_events"))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise GnndistError(f"{where}: cannot read TGB's split ({e}); delete {Path(folder).parent} to convert "
                               "the dataset again") from None
        if total != num_events:
            raise GnndistError(f"{where}: TGB's split is of {total:,} events, the data has {num_events:,}")
        return cls("tgb", train_end, val_end, num_events, str(folder))

    def fixed_negatives(self, start: int, stop: int, batch_size: int) -> Optional["FixedNegatives"]:
        """TGB's negatives of the events [start, stop) when they are its validation or test
        period and it has negatives (a tgbl dataset); else None."""
        period = {(self.train_end, self.val_end): "val", (self.val_end, self.num_events): "test"}.get((start, stop))
        if self.folder is None or period is None:
            return None
        path = Path(self.folder) / NEGATIVES_FILE.format(period)
        if not path.is_file():
            return None
        table = np.load(path, mmap_mode="r", allow_pickle=False)
        if table.ndim != 2 or table.shape[0] != stop - start:
            raise GnndistError(f"{path}: expected TGB's negatives of {stop - start:,} events, got an array of "
                               f"shape {table.shape}")
        return FixedNegatives(table, batch_size)


class FixedNegatives:
    """The fixed negatives [B, n] of a period's events, read a batch at a time from `table` (one
    row per event of the period, -1 after a list's end; memory-mapped): the `EvalNegatives.batch`
    of TGB's protocol. A list shorter than n is filled up with the event's own destination, which
    `LinkTrainer.evaluate` leaves out of its scores."""

    def __init__(self, table: np.ndarray, batch_size: int) -> None:
        self.table, self.batch_size, self.n = table, batch_size, int(table.shape[1])

    def batch(self, index: int, size: int, rows: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Negatives (original ids) of the events at positions `rows`, with original destinations
        `dst`, of the period's batch `index`."""
        got = np.asarray(self.table[index * self.batch_size + rows], np.int64)
        return np.where(got < 0, np.asarray(dst, np.int64)[:, None], got)


def protocol_folder(data) -> Optional[str]:
    """Where TGB's protocol of `data` is kept (converted now if not yet): for a TGB dataset by
    name; None for any other data (gnndist's own protocol)."""
    from gnndist.datasets.catalog import tgb_protocol
    from gnndist.partition import is_store

    if isinstance(data, (str, os.PathLike)) and not is_store(data):
        data = DataSource(str(data))
    if not isinstance(data, DataSource) or data.format is not None or data.options:
        return None
    folder = tgb_protocol(data.name)
    return None if folder is None else str(folder)
