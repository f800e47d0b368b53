"""Write a graph as shard files in the layout `gnndist.datasets.shards` reads: a temporal graph
as DIR/events/part-NNNNN.{parquet,csv,txt}, a static one as DIR/edges/part-NNNNN.* plus the
node arrays DIR/nodes/{ids,x,y,train_mask,val_mask,test_mask}.npy.

`write_synthetic_temporal` generates and writes one shard at a time, for graphs larger than memory.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Iterator, Optional, Union

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from gnndist.datasets.generators import synthetic_temporal_windows
from gnndist.datasets.registry import load
from gnndist.datasets.shards import Shards, open_shards
from gnndist.errors import GnndistError
from gnndist.graph import MASKS, Graph, TemporalGraph
from gnndist.validate import INT_MAX, is_int

EXTENSION = {"parquet": ".parquet", "csv": ".csv", "snap": ".txt"}
ID_BITS = 40  # shuffled ids lie in [-2**39, 2**39)
_ID_MULTIPLIER = 0x9E3779B97F  # odd: multiplying by it permutes the integers modulo 2**ID_BITS


@dataclass(frozen=True)
class ShardWriteConfig:
    """How `write_shards` lays a graph out in files."""

    num_shards: int = 4
    format: str = "parquet"  # "parquet", "csv" or "snap" (src dst t only)
    shuffle_ids: bool = True  # node v's id in the files: a seeded permutation of v over [-2**39, 2**39)
    out_of_time_order: bool = False  # events: shard files in no time order, rows in each shuffled
    seed: int = 0  # of the id permutation and of the shuffles
    row_group_rows: int = 1 << 18  # Parquet rows per row group (a reader decodes one group at a time)

    def __post_init__(self) -> None:
        if not is_int(self.num_shards) or not 1 <= self.num_shards <= 1 << 20:
            raise GnndistError(f"num_shards (--shards) must be an integer from 1 to {1 << 20}, got {self.num_shards!r}")
        if self.format not in EXTENSION:
            raise GnndistError(f"unknown shard format '{self.format}' (known: {', '.join(EXTENSION)})")
        if not is_int(self.seed) or not 0 <= self.seed <= INT_MAX:
            raise GnndistError(f"seed must be an integer from 0 to 2**63-1, got {self.seed!r}")
        if not is_int(self.row_group_rows) or self.row_group_rows < 1:
            raise GnndistError(f"row_group_rows must be a positive integer, got {self.row_group_rows!r}")


def original_ids(nodes: np.ndarray, config: ShardWriteConfig) -> np.ndarray:
    """The id node `nodes` has in the files: itself, or with `shuffle_ids` its image under a
    seeded permutation of [0, 2**40) shifted to [-2**39, 2**39) (non-contiguous, unordered)."""
    nodes = np.asarray(nodes, dtype=np.int64)
    if not config.shuffle_ids:
        return nodes
    if nodes.size and nodes.max() >= 1 << ID_BITS:
        raise GnndistError(f"shuffle_ids numbers at most 2**{ID_BITS} nodes")
    mask = np.uint64((1 << ID_BITS) - 1)
    key = np.uint64((config.seed * 0xBF58476D1CE4E5B9) & ((1 << ID_BITS) - 1))
    with np.errstate(over="ignore"):
        v = (nodes.astype(np.uint64) * np.uint64(_ID_MULTIPLIER) + key) & mask
    return v.astype(np.int64) - (1 << (ID_BITS - 1))


def _table(columns: dict[str, np.ndarray]) -> pa.Table:
    return pa.table({k: pa.array(v) for k, v in columns.items()})


def _write_file(path: str, columns: dict[str, np.ndarray], config: ShardWriteConfig) -> None:
    table = _table(columns)
    if config.format == "parquet":
        pq.write_table(table, path, row_group_size=config.row_group_rows)
    else:
        snap = config.format == "snap"
        pacsv.write_csv(table, path, pacsv.WriteOptions(include_header=not snap, delimiter=" " if snap else ",",
                                                        quoting_style="none"))


class _Folder:
    """Writes into a fresh folder beside `folder` and renames it into place when complete, so an
    existing folder is never touched and a failure leaves nothing."""

    def __init__(self, folder: str):
        self.folder = os.path.normpath(folder)
        if os.path.exists(self.folder) and (not os.path.isdir(self.folder) or os.listdir(self.folder)):
            raise GnndistError(f"{folder}: exists and is not an empty folder (shards are written into a new folder)")
        parent = os.path.dirname(os.path.abspath(self.folder))
        if not os.path.isdir(parent):
            raise GnndistError(f"{parent}: no such folder")
        self.tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(self.folder)}.", dir=parent)

    def __enter__(self) -> str:
        return self.tmp

    def __exit__(self, kind, value, tb) -> None:
        if kind is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        if os.path.isdir(self.folder):
            os.rmdir(self.folder)  # empty, checked above
        os.rename(self.tmp, self.folder)


def _write_windows(folder: str, sub: str, windows: Iterator[dict[str, np.ndarray]], config: ShardWriteConfig,
                   nodes: Optional[dict[str, np.ndarray]] = None) -> Shards:
    """Write the k-th of `num_shards` windows of rows (each a dict of columns) as one file of
    `folder/sub/`: file k in name order, or with `out_of_time_order` a seeded permutation of the
    names, its rows shuffled; and `nodes` as `folder/nodes/NAME.npy`."""
    rng = np.random.default_rng(config.seed)
    names = rng.permutation(config.num_shards) if config.out_of_time_order else np.arange(config.num_shards)
    with _Folder(folder) as tmp:
        os.makedirs(os.path.join(tmp, sub))
        for k, columns in enumerate(windows):
            if config.out_of_time_order:
                order = rng.permutation(next(iter(columns.values())).size)
                columns = {name: v[order] for name, v in columns.items()}
            _write_file(os.path.join(tmp, sub, f"part-{names[k]:05d}{EXTENSION[config.format]}"), columns, config)
        if nodes is not None:
            os.makedirs(os.path.join(tmp, "nodes"))
            for name, a in nodes.items():
                np.save(os.path.join(tmp, "nodes", f"{name}.npy"), a)
    return open_shards(folder)


def _event_columns(src: np.ndarray, dst: np.ndarray, t: np.ndarray, feat: Optional[np.ndarray],
                   label: Optional[np.ndarray], config: ShardWriteConfig) -> dict[str, np.ndarray]:
    """Columns of events for a file: src, dst (original ids), t, label, f0, f1, ..."""
    if config.format == "snap" and (feat is not None or label is not None):
        raise GnndistError("format snap holds src dst t only; this graph has edge features or labels: "
                           "write csv or parquet")
    out = {"src": original_ids(src, config), "dst": original_ids(dst, config), "t": t}
    if label is not None:
        out["label"] = np.asarray(label, dtype=np.int64)
    for j in range(0 if feat is None else feat.shape[1]):
        out[f"f{j}"] = np.ascontiguousarray(feat[:, j])
    return out


def write_shards(graph: Union[TemporalGraph, Graph], folder: str,
                 config: ShardWriteConfig = ShardWriteConfig()) -> Shards:
    """Write `graph` as shard files in the new folder `folder`: a temporal graph's events in
    `num_shards` consecutive time slices; a static graph's edges (each undirected pair once) in
    `num_shards` slices, and its node arrays. Returns the shards as `open_shards` sees them."""
    k = config.num_shards
    if isinstance(graph, TemporalGraph):
        e = graph.num_events
        bounds = [e * i // k for i in range(k + 1)]
        part = lambda a, i: None if a is None else a[bounds[i]:bounds[i + 1]]  # noqa: E731
        windows = (_event_columns(*(part(a, i) for a in (graph.src, graph.dst, graph.t, graph.edge_feat,
                                                          graph.edge_label)), config) for i in range(k))
        return _write_windows(folder, "events", windows, config)
    src, dst = graph.edges()
    lo, hi = np.minimum(src, dst), np.maximum(src, dst)
    keys = np.unique(lo * graph.num_nodes + hi)
    lo, hi = keys // max(graph.num_nodes, 1), keys % max(graph.num_nodes, 1)
    bounds = [keys.size * i // k for i in range(k + 1)]
    windows = ({"src": original_ids(lo[bounds[i]:bounds[i + 1]], config),
                "dst": original_ids(hi[bounds[i]:bounds[i + 1]], config)} for i in range(k))
    if config.format == "snap":
        windows = ({"src": w["src"], "dst": w["dst"]} for w in windows)
    nodes = {"ids": original_ids(np.arange(graph.num_nodes), config)}
    nodes.update({name: getattr(graph, name) for name in ("x", "y", *MASKS) if getattr(graph, name) is not None})
    return _write_windows(folder, "edges", windows, config, nodes)


def write_synthetic_temporal(folder: str, num_nodes: int = 1_000, num_events: int = 20_000, edge_dim: int = 8,
                             seed: int = 0, session_labels: int = 0, config: ShardWriteConfig = ShardWriteConfig()
                             ) -> Shards:
    """`synthetic_temporal`'s model written as `num_shards` time windows, generated and written
    one at a time (see `synthetic_temporal_windows`: one shard holds exactly `synthetic_temporal`'s
    graph). Holds the generator's node-level state and one window's events at a time."""
    windows = (_event_columns(src, dst, t, feat, label, config)
               for src, dst, t, feat, label in synthetic_temporal_windows(num_nodes, num_events, edge_dim, seed,
                                                                          config.num_shards, session_labels))
    return _write_windows(folder, "events", windows, config)


def write_data_shards(name: str, format: Optional[str], options: dict, folder: str,
                      config: ShardWriteConfig = ShardWriteConfig()) -> Shards:
    """Write what `load(name, format, **options)` gives as shard files in the new folder `folder`:
    synthetic-temporal generated a shard at a time (`write_synthetic_temporal`), anything else
    loaded whole and then written (`write_shards`)."""
    if format is None and name == "synthetic-temporal":
        return write_synthetic_temporal(folder, **options, config=config)
    return write_shards(load(name, format, **options), folder, config)
