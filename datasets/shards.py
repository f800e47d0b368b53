"""One graph given as shard files, read in bounded memory: where the files are (`open_shards`),
which rank reads what (`plan_shards`, a pure function of every rank's listing), and a reader of
chunks (`read_unit`).

DATA is one of:
- a folder of event shard files, a glob of them (`DIR/part-*.csv`), or one file: a temporal graph;
- a folder holding `events/` (event shard files): a temporal graph;
- a folder holding `edges/` (edge shard files) and optionally `nodes/`: a static graph. `nodes/`
  holds `ids.npy` (one distinct integer id per node) and any of `x.npy` [N, F], `y.npy` [N] and
  the split `train_mask.npy`, `val_mask.npy`, `test_mask.npy` [N]; row i of each is node ids[i].
- a folder in DGL's chunked graph format (`metadata.json`, see `gnndist.datasets.dgl`): a static
  graph whose edge chunks are the shard files (CSV or Parquet, read as metadata.json says) and
  whose node data chunks are the node arrays, node ids 0..N-1 in chunk order.

Shard files are CSV (`.csv`), SNAP text (`.txt`, `.tsv`, `.edges`: `src dst t`, or `src dst` for
edges, separated by spaces or tabs, '#' comments), either of them gzipped (`.gz`), or Parquet
(`.parquet`). The files of one graph share a format and their columns. CSV and Parquet columns
are found by name as `gnndist.datasets.formats` finds them (src, dst, t; optional label; other
columns are edge features); edge shards have src and dst only. Node ids are any int64 integers.
Names starting with '.' or '_' are not shards (checksums, Spark's `_SUCCESS`).

Text is parsed by pyarrow's CSV reader a block of lines at a time; a block it rejects (comments,
runs of blanks, ids written as floats, a bad line) is parsed again after its lines are tidied,
and a line no reading accepts is named in the error.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import os
import re
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from gnndist.datasets.dgl import METADATA_JSON, ChunkedGraph, dgl_format, read_chunked
from gnndist.datasets.formats import Columns, csv_columns, header_problem, renumbered
from gnndist.datasets.text import check_regular, data_lines, is_number, raise_bad_line
from gnndist.errors import GnndistError, first_line
from gnndist.graph import MASKS, Graph, TemporalGraph
from gnndist.io import open_npy

SHARD_FORMATS = {".csv": "csv", ".txt": "snap", ".tsv": "snap", ".edges": "snap", ".parquet": "parquet"}
NODE_ARRAYS = ("ids", "x", "y", *MASKS)  # the files of nodes/, each NAME.npy
Listing = tuple[tuple[str, int], ...]  # (file name, size in bytes), sorted by name
CHUNK_BYTES = 4 << 20  # text read (or Parquet columns decoded) per chunk; parsing one peaks at several times this


@dataclass(frozen=True)
class Shards:
    """The shard files of one graph as this host sees them."""

    data: str  # DATA as given
    folder: str  # the folder the shard files are in
    kind: str  # "temporal" or "static"
    format: Optional[str]  # "csv", "snap" or "parquet" (None: no shard files here)
    files: Listing  # the shard files here
    nodes: Optional[str] = None  # the folder of node arrays (static), if there is one
    node_files: Listing = ()  # the node arrays there
    chunked: Optional[ChunkedGraph] = None  # DGL's chunked graph format: its metadata.json

    def path(self, name: str) -> str:
        return os.path.join(self.folder, name)


def _listing(folder: str, names: Sequence[str]) -> Listing:
    """(name, size) of the regular files among `names` in `folder`, sorted by name."""
    out = []
    for name in sorted(names):
        path = os.path.join(folder, name)
        if os.path.isfile(path) and not name.startswith((".", "_")):
            out.append((name, os.path.getsize(path)))
    return tuple(out)


def _shard_format(name: str) -> Optional[str]:
    """The format a file name's extension tells (None: not a shard file's name)."""
    stem = name[:-3] if name.endswith(".gz") else name
    fmt = SHARD_FORMATS.get(os.path.splitext(stem)[1].lower())
    return None if fmt == "parquet" and stem != name else fmt


def _format_of(shards: Listing, folder: str, format: Optional[str]) -> Optional[str]:
    """The one format of the shard files, told by their extensions or given."""
    if format is not None:
        if format not in ("csv", "snap", "parquet"):
            raise GnndistError(f"unknown shard format '{format}' (known: csv, snap, parquet)")
        return format
    found: dict[str, str] = {}
    for name, _ in shards:
        fmt = _shard_format(name)
        if fmt is None:
            raise GnndistError(f"{os.path.join(folder, name)}: not a shard file (known: .csv, .txt, .tsv, .edges, "
                               f".parquet; .gz for text)")
        found.setdefault(fmt, name)
    if len(found) > 1:
        (a, fa), (b, fb) = list(found.items())[:2]
        raise GnndistError(f"{os.path.join(folder, fa)} and {fb}: the shard files of one graph share one format "
                           f"(found {a} and {b})")
    return next(iter(found), None)


def open_shards(data: str, format: Optional[str] = None) -> Shards:
    """The shard files DATA names on this host (see the module docstring); `format` reads every
    file as that format whatever its extension. A host may hold none of them."""
    if dgl_format(data) == "dgl-chunked":
        return _chunked_shards(data, format)
    base = os.path.basename(data)
    nodes = None
    if any(c in base for c in "*?["):
        folder = os.path.dirname(data) or "."
        if any(c in folder for c in "*?["):
            raise GnndistError(f"{data}: glob characters (* ? [) only in the file name, not in its folder")
        if not os.path.isdir(folder):
            raise GnndistError(f"{folder}: no such folder")
        names, kind = fnmatch.filter(os.listdir(folder), base), "temporal"
    elif os.path.isdir(data):
        if os.path.isdir(os.path.join(data, "edges")) and os.path.isdir(os.path.join(data, "events")):
            raise GnndistError(f"{data}: holds both edges/ (a static graph) and events/ (a temporal graph)")
        kind = "static" if os.path.isdir(os.path.join(data, "edges")) else "temporal"
        folder = os.path.join(data, "edges" if kind == "static" else "events")
        folder = folder if os.path.isdir(folder) else data
        names = os.listdir(folder)
        if kind == "static" and os.path.isdir(os.path.join(data, "nodes")):
            nodes = os.path.join(data, "nodes")
    else:
        check_regular(data)
        folder, names, kind = os.path.dirname(data) or ".", [base], "temporal"
    files = ((base, os.path.getsize(data)),) if os.path.isfile(data) else _listing(folder, names)
    node_files = () if nodes is None else _listing(nodes, os.listdir(nodes))
    return Shards(data, folder, kind, _format_of(files, folder, format), files, nodes, node_files)


def _chunked_shards(data: str, format: Optional[str]) -> Shards:
    """A DGL chunked graph's shard files (its edge chunks) and node arrays (its node data chunks),
    every one that metadata.json lists present here."""
    if format is not None:
        raise GnndistError(f"{data}: a DGL chunked graph, whose metadata.json tells the format of its files "
                           f"(leave the format out)")
    g = read_chunked(data)

    def listing(names: Sequence[str]) -> Listing:
        for name in names:
            if not os.path.isfile(g.path(name)):
                raise GnndistError(f"{g.path(name)}: no such file ({os.path.join(data, METADATA_JSON)} lists it)")
        return tuple(sorted((name, os.path.getsize(g.path(name))) for name in set(names)))

    fmt = "parquet" if g.edge_format == "parquet" else "csv" if g.delimiter == "," else "snap"
    return Shards(data, data, "static", fmt, listing(g.edge_files), data, listing(g.node_files()), g)


def is_shards(path: str) -> bool:
    """Whether `path` names shard files by its shape alone: a glob, or a folder holding events/ or
    edges/, or DGL's chunked graph (metadata.json), or only files with a shard extension (at
    least one)."""
    if any(c in os.path.basename(path) for c in "*?["):
        return True
    if not os.path.isdir(path):
        return False
    if dgl_format(path) == "dgl-chunked":
        return True
    names = [n for n in os.listdir(path) if not n.startswith((".", "_"))]
    return "events" in names or "edges" in names or bool(names) and all(_shard_format(n) for n in names)


def reads_as_shards(path: str) -> bool:
    """Whether ranks can read `path` as shard files: `is_shards`, or one file with a shard
    extension (CSV, SNAP text, Parquet; .gz read whole by one rank)."""
    return is_shards(path) or os.path.isfile(path) and _shard_format(os.path.basename(path)) is not None


# ---------------------------------------------------------------- node arrays

@dataclass(frozen=True)
class NodeArrays:
    """The node arrays of a static graph, memory-mapped or `ChunkedArray`s: row i is node `ids[i]`."""

    ids: np.ndarray
    arrays: dict[str, np.ndarray]  # those of x, y, train_mask, val_mask, test_mask that there are


def open_nodes(shards: Shards) -> Optional[NodeArrays]:
    """The node arrays of a static graph (None when DATA has no nodes/ folder), checked for their
    shapes and types, the ids for being distinct, the masks for holding 0/1. A DGL chunked
    graph's are its node data, ids 0..N-1, read a chunk at a time (`ChunkedArray`), their
    values checked where they are used."""
    if shards.chunked is not None:
        return NodeArrays(np.arange(shards.chunked.num_nodes, dtype=np.int64), _chunked_nodes(shards.chunked))
    if shards.nodes is None:
        return None
    arrays = {}
    for name, _ in shards.node_files:
        path = os.path.join(shards.nodes, name)
        if not name.endswith(".npy") or name[:-4] not in NODE_ARRAYS:
            raise GnndistError(f"{path}: not a node array (known: {', '.join(a + '.npy' for a in NODE_ARRAYS)})")
        arrays[name[:-4]] = open_npy(path)
    where = {k: os.path.join(shards.nodes, k + ".npy") for k in NODE_ARRAYS}
    if "ids" not in arrays:
        if arrays:
            raise GnndistError(f"{where['ids']}: no such file (the node arrays need the id of each row)")
        return None
    n = arrays["ids"].shape[0] if arrays["ids"].ndim else 0
    for k, a in arrays.items():
        kinds, want = (("biuf", "a 2-d numeric array") if k == "x" else
                       ("iu", "a 1-d integer array") if k in ("ids", "y") else ("biu", "a 1-d boolean array"))
        if a.ndim != (2 if k == "x" else 1) or a.dtype.kind not in kinds or a.shape[0] != n:
            raise GnndistError(f"{where[k]}: expected {want} of {n} rows (one per id), got {a.dtype} {a.shape}")
        if k in MASKS and a.dtype != bool and a.size and not np.all((a == 0) | (a == 1)):
            raise GnndistError(f"{where[k]}: a mask holds True/False (or 0/1)")
    ids = arrays["ids"]
    if ids.dtype == np.uint64 and n and ids.max() >= 1 << 63:
        raise GnndistError(f"{where['ids']}: node id {ids.max()} is beyond int64")
    s = np.sort(ids)
    dup = np.flatnonzero(s[1:] == s[:-1])
    if dup.size:
        raise GnndistError(f"{where['ids']}: node id {s[dup[0]]} is listed twice")
    return NodeArrays(arrays.pop("ids"), arrays)


def _numeric(dtype: np.dtype, where: str) -> np.dtype:
    if dtype.kind not in "biuf":
        raise GnndistError(f"{where}: holds {dtype}, expected numbers")
    return dtype


def _is_list(typ: pa.DataType) -> bool:
    return pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ)


class ChunkedArray:
    """One key of a DGL chunked graph's node data, read from its chunk files a chunk at a time.

    The chunks are NumPy or Parquet files; `a[rows]` (an integer array) reads the chunks that
    hold those rows, `np.asarray(a)` all of them. `features`: rows of numbers [N, F] (a 1-d
    array is one feature); else one value per row [N]."""

    def __init__(self, paths: Sequence[str], format: str, features: bool, where: str):
        self.paths, self.format, self.features = list(paths), format, features
        heads = [self._head(p) for p in self.paths]  # (rows, values per row, dtype)
        widths = [(w, p) for (n, w, _), p in zip(heads, self.paths) if n]
        for w, p in widths:
            if w != widths[0][0] or (not features and w != 1):
                want = f"{widths[0][0]} as in {widths[0][1]}" if features else "one"
                raise GnndistError(f"{where}: {p} has {w} values per row, expected {want}")
        self.width = widths[0][0] if widths else 1
        self.offsets = np.cumsum([0] + [n for n, _, _ in heads])
        self.dtype = np.result_type(*[d for _, _, d in heads]) if heads else np.dtype(np.float32)
        self.shape = (int(self.offsets[-1]), self.width) if features else (int(self.offsets[-1]),)
        self.ndim = len(self.shape)

    def _head(self, path: str) -> tuple[int, int, np.dtype]:
        """A chunk's rows, values per row and dtype, from its header (NumPy) or schema (Parquet)."""
        if self.format == "numpy":
            a = open_npy(path)
            if a.ndim not in (1, 2):
                raise GnndistError(f"{path}: a {a.ndim}-d array, expected 1-d or 2-d")
            return a.shape[0], a.shape[1] if a.ndim == 2 else 1, _numeric(a.dtype, path)
        pf = _parquet(path)
        types, rows = pf.schema_arrow.types, pf.metadata.num_rows
        if len(types) == 1 and _is_list(types[0]):  # Spark's vectors: one list of numbers per row
            first = next(pf.iter_batches(batch_size=1), None) if rows else None
            width = len(first.column(0)[0].values) if first is not None and first.num_rows else 0
            return rows, width, _numeric(np.dtype(types[0].value_type.to_pandas_dtype()), path)
        try:
            dtype = np.result_type(*[np.dtype(t.to_pandas_dtype()) for t in types]) if types else np.dtype(np.float32)
        except (TypeError, NotImplementedError):
            dtype = np.dtype(object)
        return rows, len(types), _numeric(dtype, path)

    def _chunk(self, i: int) -> np.ndarray:
        """Chunk i's rows: [n, width] (features) or [n]."""
        path = self.paths[i]
        n = int(self.offsets[i + 1] - self.offsets[i])
        if self.format == "numpy":
            a = open_npy(path)
        else:
            try:
                table = pq.read_table(path)
            except (OSError, pa.ArrowException) as e:
                raise GnndistError(f"{path}: cannot read: {first_line(e)}") from None
            if any(c.null_count for c in table.columns):
                raise GnndistError(f"{path}: holds an empty (null) value")
            if table.num_columns == 1 and _is_list(table.schema.types[0]):
                col = table.column(0).combine_chunks()
                if np.any(pc.list_value_length(col).to_numpy(zero_copy_only=False) != self.width):
                    raise GnndistError(f"{path}: rows of different lengths (expected {self.width} values each)")
                a = col.flatten().to_numpy(zero_copy_only=False)
            else:
                a = np.stack([c.to_numpy() for c in table.columns], axis=1) if table.num_columns else np.empty((n, 0))
        return a.reshape((n, self.width) if self.features else (n,))

    def __getitem__(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((rows.size, *self.shape[1:]), self.dtype)
        which = np.searchsorted(self.offsets, rows, side="right") - 1
        for i in np.unique(which):
            sel = which == i
            out[sel] = self._chunk(int(i))[rows[sel] - self.offsets[i]]
        return out

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        a = self[np.arange(self.shape[0])]
        return a if dtype is None else a.astype(dtype)

    def __len__(self) -> int:
        return self.shape[0]


def _chunked_nodes(g: ChunkedGraph) -> dict[str, ChunkedArray]:
    """x, y and the masks a chunked graph's node_data holds, each checked to have one row per node."""
    out = {}
    for role, key, fmt, files in g.node_data:
        where = f"{g.path(METADATA_JSON)}: node_data {key}"
        a = ChunkedArray([g.path(f) for f in files], fmt, role == "x", where)
        if a.shape[0] != g.num_nodes:
            raise GnndistError(f"{where}: its chunks hold {a.shape[0]} rows, the graph has {g.num_nodes} nodes "
                               f"(num_nodes_per_chunk)")
        out[role] = a
    return out


def check_node_listings(listings: Sequence[Listing]) -> None:
    """Every rank lists the same node arrays (each host holds all of nodes/); GnndistError naming
    the first that differs."""
    for r, listing in enumerate(listings):
        if listing != listings[0]:
            a, b = dict(listings[0]), dict(listing)
            name = next(k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))
            said = lambda d: "none" if name not in d else f"{d[name]} bytes"  # noqa: E731
            raise GnndistError(f"nodes/{name}: {said(a)} on rank 0's host, {said(b)} on rank {r}'s "
                               f"(every host holds the same node arrays)")


# ---------------------------------------------------------------- who reads what

@dataclass(frozen=True)
class Unit:
    """What one rank reads of one shard file: the rows whose line (Parquet: row group) starts in
    bytes [start, stop) of it."""

    shard: int  # the file's position in the global order of shard files (by name)
    name: str
    piece: int  # the range's position among the ranges of this file (0 for a whole file)
    start: int
    stop: int


@dataclass(frozen=True)
class Plan:
    """Which rank reads what."""

    shards: Listing  # every shard file of the graph, in the global order (by name)
    units: tuple[tuple[Unit, ...], ...]  # per rank, what it reads
    shared: bool  # every rank listed the same files (a shared file system)


def plan_shards(listings: Sequence[Sequence[tuple[str, int]]]) -> Plan:
    """Who reads what, from every rank's listing of the shard files it can see.

    Ranks with identical listings form a group (one group: a shared file system); each file is
    read by the first group (by rank) that lists it, its ranks taking the group's files in turn
    (rank r of a group of R reads files r, r + R, ...). A group with fewer files than ranks splits
    each file but gzipped ones into R byte ranges, so that every rank reads a part. A name listed
    with two different sizes is refused.
    """
    listings = [tuple(sorted((str(n), int(s)) for n, s in listing)) for listing in listings]
    size: dict[str, tuple[int, int]] = {}  # name -> (size, first rank listing it)
    for r, listing in enumerate(listings):
        for name, s in listing:
            if size.setdefault(name, (s, r))[0] != s:
                raise GnndistError(f"{name}: {size[name][0]} bytes on rank {size[name][1]}'s host but {s} bytes on "
                                   f"rank {r}'s (a shard file listed on two hosts must be the same file)")
    if not size:
        raise GnndistError("no shard files on any host")
    shards = tuple((name, size[name][0]) for name in sorted(size))
    index = {name: i for i, (name, _) in enumerate(shards)}
    groups: dict[tuple, list[int]] = {}
    for r, listing in enumerate(listings):
        groups.setdefault(listing, []).append(r)
    units: list[list[Unit]] = [[] for _ in listings]
    taken: set[str] = set()
    for listing, ranks in groups.items():
        files = [(name, s) for name, s in listing if name not in taken]
        taken.update(name for name, _ in files)
        split = len(files) < len(ranks)
        pieces = []
        for name, s in files:
            k = len(ranks) if split and not name.endswith(".gz") else 1
            pieces += [Unit(index[name], name, j, s * j // k, s * (j + 1) // k) for j in range(k)]
        for i, unit in enumerate(pieces):
            units[ranks[i % len(ranks)]].append(unit)
    return Plan(shards, tuple(tuple(u) for u in units), len(groups) == 1)


# ---------------------------------------------------------------- columns

@dataclass(frozen=True)
class _Layout:
    """A shard file's columns and where its data lines start."""

    columns: Optional[Columns]  # None: a text file without any line of data or header
    data_start: int  # byte (of the decompressed text) where the first line after any header starts
    delimiter: str  # of the text's fields as written: ",", " " or "\t"


def _open(path: str) -> pa.NativeFile:
    """An arrow stream of the file's bytes, gunzipped for .gz (so its memory is arrow's own)."""
    check_regular(path)
    try:
        f = pa.OSFile(path)
        return pa.CompressedInputStream(f, "gzip") if path.endswith(".gz") else f
    except (OSError, pa.ArrowException) as e:
        raise GnndistError(f"{path}: cannot open: {first_line(e)}") from None


def _read(path: str, f: pa.NativeFile, n: int) -> pa.Buffer:
    try:
        return f.read_buffer(n)
    except (OSError, pa.ArrowException, EOFError) as e:
        raise GnndistError(f"{path}: cannot read: {first_line(e)}") from None


def _head(path: str) -> tuple[bytes, bool]:
    """The file's first bytes (decompressed), enough for two whole lines holding more than a
    comment; and whether that is the whole file."""
    n = 1 << 16
    while True:
        with _open(path) as f:
            head = _read(path, f, n).to_pybytes()
        whole = len(head) < n
        if whole or sum(bool(ln.split(b"#", 1)[0].strip()) for ln in head.split(b"\n")[:-1]) >= 2:
            return head, whole
        n *= 4


def _layout(path: str, kind: str, format: str) -> _Layout:
    """The columns of a text shard file from its first lines: a CSV's header (if its first line
    is not all numbers) and its first data line; SNAP text's fields by kind, and its separator."""
    static = kind == "static"
    head, whole = _head(path)
    pos = 3 if head.startswith(b"\xef\xbb\xbf") else 0  # a UTF-8 byte order mark
    meaningful = []  # (line number, byte offset, text) of lines that hold something
    for number, line in enumerate(head[pos:].split(b"\n"), start=1):
        if len(meaningful) == 2 or (not whole and pos + len(line) >= len(head)):
            break  # enough, or a line cut off by the end of the head
        text = line.decode("utf-8", "replace").split("#", 1)[0]
        if text.strip():
            meaningful.append((number, pos, text))
        pos += len(line) + 1
    if not meaningful:
        return _Layout(None, 0, ",")
    number, start, text = meaningful[0]
    if format == "snap":
        return _Layout(csv_columns(None, 2 if static else 3, static), start, "\t" if "\t" in text.strip() else " ")
    fields = [n.strip().strip('"').strip() for n in text.split(",")]
    if all(is_number(f) for f in fields):  # no header: the line is data
        return _Layout(csv_columns(None, 2 if static else len(fields), static), start, ",")
    problem = header_problem(fields, static)
    if problem:
        raise GnndistError(f"{path}:{number}: {problem}")
    after = start + len(head[start:].split(b"\n", 1)[0]) + 1
    ncols = len(meaningful[1][2].split(",")) if len(meaningful) > 1 else len(fields)
    if ncols < len(fields):
        raise GnndistError(f"{path}:{meaningful[1][0]}: expected {len(fields)} fields (one per header name), "
                           f"got {ncols}")
    return _Layout(csv_columns(fields, ncols, static), after, ",")


def _parquet(path: str) -> pq.ParquetFile:
    check_regular(path)
    try:
        return pq.ParquetFile(path, pre_buffer=False)
    except (OSError, pa.ArrowException) as e:
        raise GnndistError(f"{path}: not a readable Parquet file ({first_line(e)})") from None


def _parquet_columns(path: str, pf: pq.ParquetFile, kind: str, positional: bool = False) -> Columns:
    """The columns of a Parquet shard file, from its schema, checked for their types;
    `positional`: a DGL edge chunk's two integer columns, src and dst whatever their names."""
    schema = pf.schema_arrow
    names = list(schema.names)
    if positional:
        if len(names) != 2 or not all(pa.types.is_integer(t) for t in schema.types):
            raise GnndistError(f"{path}: expected two integer columns (src, dst), got "
                               f"{', '.join(f'{n} ({t})' for n, t in zip(names, schema.types)) or 'none'}")
        return Columns(tuple(names), 2, 0, 1, None, None, None, (), (), False)
    problem = header_problem(names, kind == "static")
    if problem:
        raise GnndistError(f"{path}: {problem}")
    c = csv_columns(names, len(names), kind == "static")
    for j in (c.src, c.dst, c.label, c.t, *c.features):
        if j is None:
            continue
        typ = schema.field(j).type
        ints = j in (c.src, c.dst, c.label)
        if not (pa.types.is_integer(typ) or (not ints and pa.types.is_floating(typ))):
            raise GnndistError(f"{path}: column {names[j]} holds {typ}, expected {'integers' if ints else 'numbers'}")
    return c


def read_columns(shards: Shards, name: str) -> Optional[Columns]:
    """The columns of one shard file (None: a text file with nothing in it)."""
    path = shards.path(name)
    if shards.format == "parquet":
        return _parquet_columns(path, _parquet(path), shards.kind, shards.chunked is not None)
    return _layout(path, shards.kind, shards.format).columns


def _describe(c: Columns) -> str:
    extra = c.ncols - len(c.names)
    return f"'{','.join(c.names)}'" + (f" and {extra} more field{'s' * (extra > 1)}" if extra else "")


def agree_columns(found: Sequence[tuple[str, Optional[Columns]]]) -> Optional[Columns]:
    """The columns every shard file has, from (file, its columns) of each (None: an empty file,
    which agrees with any); GnndistError naming two files whose headers differ."""
    first: Optional[tuple[str, Columns]] = None
    for path, c in found:
        if c is None:
            continue
        if first is None:
            first = (path, c)
        elif c != first[1]:
            raise GnndistError(f"{path}: header {_describe(c)} differs from {first[0]}'s {_describe(first[1])} "
                               f"(the shard files of one graph have the same columns)")
    return None if first is None else first[1]


# ---------------------------------------------------------------- reading

@dataclass
class Chunk:
    """Consecutive rows of one shard file. (shard, piece, row) orders the rows as they stand in
    the files; `row` is the row number within the file when `piece` is 0."""

    shard: int
    piece: int
    row: int  # of the chunk's first row, counted from the start of its piece (0-based)
    src: np.ndarray  # int64 original ids
    dst: np.ndarray
    t: Optional[np.ndarray]  # float64 (None for a static graph's edges)
    edge_feat: Optional[np.ndarray]  # float32 [n, d], or None
    edge_label: Optional[np.ndarray]  # int64, or None

    def __len__(self) -> int:
        return int(self.src.size)


def _last_newline(buf: pa.Buffer) -> int:
    """Index of the last b'\\n' in `buf`, -1 if none."""
    view = memoryview(buf)
    hi = len(view)
    while hi > 0:
        lo = max(0, hi - (1 << 16))
        i = bytes(view[lo:hi]).rfind(b"\n")
        if i >= 0:
            return lo + i
        hi = lo
    return -1


def _newline_at_or_after(path: str, f: pa.NativeFile, pos: int, size: int) -> int:
    """The byte just past the first b'\\n' at or after `pos` (`size` if none)."""
    while pos < size:
        block = f.read_at(min(1 << 16, size - pos), pos)
        i = block.find(b"\n")
        if i >= 0:
            return pos + i + 1
        pos += len(block)
    return size


def _blocks(path: str, f: pa.NativeFile, pos: int, end: Optional[int], block: int
            ) -> Iterator[tuple[int, pa.Buffer]]:
    """(offset, bytes) of whole lines from `pos` (where `f` stands) to `end` (None: the end of the
    stream) in pieces of about `block` bytes; a line longer than that is one piece."""
    rest = None
    while True:
        held = 0 if rest is None else rest.size
        want = block if end is None else min(block, end - pos - held)
        new = _read(path, f, want) if want > 0 else pa.allocate_buffer(0)
        done = new.size == 0 or (end is not None and pos + held + new.size >= end)
        if held:
            out = pa.BufferOutputStream()
            out.write(rest)
            out.write(new)
            new = out.getvalue()
        if new.size == 0:
            return
        cut = new.size if done else _last_newline(new) + 1
        if cut:
            yield pos, new.slice(0, cut)
            pos += cut
        if done:
            return
        rest = new.slice(cut)


def _line_number(path: str, offset: int) -> int:
    """The 1-based number of the line that starts at byte `offset` (of the decompressed text)."""
    count, pos = 1, 0
    with _open(path) as f:
        while pos < offset:
            block = _read(path, f, min(1 << 24, offset - pos)).to_pybytes()
            if not block:
                break
            count += block.count(b"\n")
            pos += len(block)
    return count


_COMMENT = re.compile(rb"#[^\n]*")
_BLANK_TO_SPACE = bytes.maketrans(b"\t\r\f\v", b"    ")


def _tidy(data: bytes) -> bytes:
    """Lines without comments, blanks at their ends or runs of blanks (tabs, CR and the like
    made spaces); the line count kept. (Bytes methods, not a regex: a regex is several times
    slower on a file with a run of blanks between every two fields.)"""
    if b"#" in data:
        data = _COMMENT.sub(b"", data)
    data = data.translate(_BLANK_TO_SPACE)
    while b"  " in data:
        data = data.replace(b"  ", b" ")
    return data.replace(b"\n ", b"\n").replace(b" \n", b"\n").strip(b" ")


class _TextReader:
    """Parses blocks of a text shard file's lines into columns; falls back to tidied lines and
    to ids written as floats when pyarrow rejects a block."""

    MODES = ((False, False), (True, False), (False, True), (True, True))  # (tidy lines, ids as floats) in turn

    def __init__(self, path: str, layout: _Layout, format: str):
        self.path, self.c, self.delimiter = path, layout.columns, layout.delimiter
        self.whitespace = format == "snap"
        self.float_ids = False
        self.names = [str(j) for j in range(self.c.ncols)]

    def _convert(self, float_ids: bool) -> pacsv.ConvertOptions:
        c = self.c
        ints = pa.float64() if float_ids else pa.int64()
        types = {str(j): pa.float64() for j in range(c.ncols)}
        types.update({str(j): ints for j in (c.src, c.dst, c.label) if j is not None})
        return pacsv.ConvertOptions(column_types=types, null_values=[], strings_can_be_null=False,
                                    quoted_strings_can_be_null=False)

    def _try(self, data: pa.Buffer, tidy: bool, float_ids: bool) -> Optional[pa.Table]:
        if tidy:
            out = pa.BufferOutputStream()  # arrow's memory: Python bytes in its threaded reader made exits abort
            out.write(_tidy(data.to_pybytes()))
            data = out.getvalue()
        delimiter = " " if tidy and self.whitespace else self.delimiter
        try:
            return pacsv.read_csv(pa.BufferReader(data), pacsv.ReadOptions(column_names=self.names),
                                  pacsv.ParseOptions(delimiter=delimiter, quote_char=False),
                                  self._convert(float_ids))
        except pa.ArrowInvalid:
            return None

    def parse(self, offset: int, data: pa.Buffer) -> pa.Table:
        """The block's rows, or GnndistError naming its first bad line."""
        for tidy, float_ids in self.MODES:
            if self.float_ids and not float_ids:
                continue  # ids written as floats once are so throughout (TGN's 0.0 labels)
            table = self._try(data, tidy, float_ids)
            if table is not None:
                self.float_ids = float_ids
                return table
        text = data.to_pybytes()
        c, want = self.c, (f" ({' '.join(self.c.names)})" if self.whitespace else "")
        raise_bad_line(self.path, text, _line_number(self.path, offset), "whitespace" if self.whitespace else ",",
                       c.ncols, want)
        raise AssertionError("unreachable")  # raise_bad_line raises

    def line_of(self, offset: int, data: pa.Buffer, row: int) -> str:
        """'path:line' of the block's `row`-th row."""
        lines = data_lines(data.to_pybytes(), "whitespace" if self.whitespace else ",")
        i = next(i for k, (i, _) in enumerate(lines) if k == row)
        return f"{self.path}:{_line_number(self.path, offset) + i}"


def _ints(a: np.ndarray, name: str, where) -> np.ndarray:
    """Integer ids (or labels) from int64 or float64 values, exactly; GnndistError naming the row."""
    if a.dtype.kind in "iu":
        return a.astype(np.int64, copy=False)
    bad = ~((a == np.floor(a)) & (np.abs(a) < 2.0 ** 53))
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        why = "is too large" if np.isfinite(a[r]) and a[r] == np.floor(a[r]) else "is not an integer"
        raise GnndistError(f"{where(r)}: {name} {a[r]:g} {why}")
    return a.astype(np.int64)


def _chunk(shard: int, piece: int, row: int, cols: dict, c: Columns, where) -> Chunk:
    """A Chunk from named numpy columns (index -> values), checked: finite times and features,
    integer ids, labels 0, 1, ... (`where(row)` names a row in errors)."""
    src, dst = _ints(cols[c.src], "node id", where), _ints(cols[c.dst], "node id", where)
    t = feat = label = None
    if c.t is not None:
        t = cols[c.t].astype(np.float64, copy=False)
        _finite(t, c.names[c.t], where)
    if c.features:
        feat = np.empty((src.size, len(c.features)), dtype=np.float32)
        for k, j in enumerate(c.features):
            v = cols[j].astype(np.float64, copy=False)
            _finite(v, c.names[j] if j < len(c.names) else f"field {j + 1}", where)
            feat[:, k] = v
    if c.label is not None:
        label = _ints(cols[c.label], "label", where)
        if label.size and label.min() < 0:
            r = int(np.flatnonzero(label < 0)[0])
            raise GnndistError(f"{where(r)}: label {label[r]} is negative")
    elif c.weight is not None:
        label = (cols[c.weight] > 0).astype(np.int64)
    return Chunk(shard, piece, row, src, dst, t, feat, label)


def _finite(v: np.ndarray, name: str, where) -> None:
    bad = ~np.isfinite(v)
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        raise GnndistError(f"{where(r)}: {name} is {v[r]:g}")


def _read_text(shards: Shards, unit: Unit, chunk_bytes: int) -> Iterator[Chunk]:
    path = shards.path(unit.name)
    layout = _layout(path, shards.kind, shards.format)
    if layout.columns is None:
        return
    reader = _TextReader(path, layout, shards.format)
    with _open(path) as f:
        if path.endswith(".gz"):  # read whole (a unit of a .gz file is always the whole file)
            _read(path, f, layout.data_start)
            start, end = layout.data_start, None
        else:
            size = f.size()
            start = (layout.data_start if unit.start <= layout.data_start
                     else _newline_at_or_after(path, f, unit.start - 1, size))
            if start >= min(unit.stop, size):
                return
            end = _newline_at_or_after(path, f, unit.stop - 1, size)
            f.seek(start)
        row = 0
        for offset, data in _blocks(path, f, start, end, chunk_bytes):
            table = reader.parse(offset, data)
            if table.num_rows == 0:
                continue
            cols = {j: table.column(j).to_numpy() for j in range(layout.columns.ncols)}
            yield _chunk(unit.shard, unit.piece, row, cols, layout.columns,
                         lambda r, o=offset, d=data: reader.line_of(o, d, r))
            row += table.num_rows


def _group_start(md: pq.FileMetaData, i: int) -> int:
    """The first byte of row group `i`: where its first column chunk starts."""
    rg = md.row_group(i)
    return min(c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset
               for c in (rg.column(j) for j in range(rg.num_columns)))


def _read_parquet(shards: Shards, unit: Unit, chunk_bytes: int, ends_only: bool) -> Iterator[Chunk]:
    path = shards.path(unit.name)
    pf = _parquet(path)
    c = _parquet_columns(path, pf, shards.kind, shards.chunked is not None)
    if ends_only:
        c = dataclasses.replace(c, label=None, weight=None, features=())
    md = pf.metadata
    groups = [i for i in range(md.num_row_groups) if unit.start <= _group_start(md, i) < unit.stop]
    if not groups:
        return
    first = sum(md.row_group(i).num_rows for i in range(groups[0]))  # rows of the file before this unit's
    used = sorted({j for j in (c.src, c.dst, c.t, c.label, *c.features) if j is not None})
    row = 0
    try:
        for batch in pf.iter_batches(batch_size=max(1, chunk_bytes // (8 * len(used))), row_groups=groups,
                                     columns=[c.names[j] for j in used], use_threads=False):
            where = lambda r, base=first + row: f"{path}: row {base + r + 1}"  # noqa: E731
            cols = {}
            for j in used:
                col = batch.column(c.names[j])
                if col.null_count:
                    r = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
                    raise GnndistError(f"{where(r)}: {c.names[j]} is empty (null)")
                cols[j] = col.to_numpy()
            yield _chunk(unit.shard, unit.piece, row, cols, c, where)
            row += batch.num_rows
    except (OSError, pa.ArrowException) as e:
        raise GnndistError(f"{path}: cannot read: {first_line(e)}") from None


def read_unit(shards: Shards, unit: Unit, chunk_bytes: int = CHUNK_BYTES, ends_only: bool = False
              ) -> Iterator[Chunk]:
    """The rows of `unit` in chunks of about `chunk_bytes` (of text read, or of Parquet columns
    decoded; Parquet is read a row group at a time, in this thread), in file order, checked:
    GnndistError naming the file and the line (Parquet: the row) of the first bad row.
    `ends_only`: Parquet's endpoint and time columns alone are read (the chunks' features and
    labels are then absent)."""
    if shards.format == "parquet":
        chunks = _read_parquet(shards, unit, chunk_bytes, ends_only)
    else:
        chunks = _read_text(shards, unit, chunk_bytes)
    return chunks if shards.chunked is None else _among_nodes(shards, unit, chunks)


def _among_nodes(shards: Shards, unit: Unit, chunks: Iterator[Chunk]) -> Iterator[Chunk]:
    """A chunked graph's edge rows, checked to join node ids 0..N-1."""
    n = shards.chunked.num_nodes
    for ch in chunks:
        for ids in (ch.src, ch.dst):
            bad = np.flatnonzero((ids < 0) | (ids >= n))
            if bad.size:
                row = f": row {ch.row + bad[0] + 1}" if ch.piece == 0 else ""
                raise GnndistError(f"{shards.path(unit.name)}{row}: node id {ids[bad[0]]} is not one of the graph's "
                                   f"{n} nodes (0..{n - 1}, num_nodes_per_chunk in {METADATA_JSON})")
        yield ch


# ---------------------------------------------------------------- one process

def read_graph(data: str, format: Optional[str] = None, chunk_bytes: int = CHUNK_BYTES
               ) -> Union[TemporalGraph, Graph]:
    """The whole graph of DATA's shard files in this process: events in order of (time, shard,
    row); nodes numbered in order of original id (kept as `orig_ids`); a static graph's edges
    made undirected without duplicates, as `load` makes a .npz graph."""
    shards = open_shards(data, format)
    if not shards.files:
        raise GnndistError(f"{data}: no shard files")
    columns = agree_columns([(shards.path(n), read_columns(shards, n)) for n, _ in shards.files])
    nodes = open_nodes(shards) if shards.kind == "static" else None
    (units,) = plan_shards([shards.files]).units
    chunks = [ch for u in units for ch in read_unit(shards, u, chunk_bytes)]

    def cat(name: str, empty: Optional[np.ndarray]) -> Optional[np.ndarray]:
        """A column of every chunk in read order; `empty` where no chunk was read (None: no such column)."""
        return np.concatenate([getattr(ch, name) for ch in chunks]) if chunks and empty is not None else empty

    src, dst = cat("src", np.empty(0, np.int64)), cat("dst", np.empty(0, np.int64))
    if shards.kind == "temporal":
        c = columns
        feat = np.empty((0, len(c.features)), np.float32) if c is not None and c.features else None
        label = np.empty(0, np.int64) if c is not None and (c.label is not None or c.weight is not None) else None
        return renumbered(src, dst, cat("t", np.empty(0)), cat("edge_feat", feat), cat("edge_label", label),
                          c is not None and c.bipartite)
    if nodes is None:
        orig_ids, inverse = np.unique(np.concatenate([src, dst]), return_inverse=True)
        g = Graph.from_edges(inverse[:src.size], inverse[src.size:], num_nodes=orig_ids.size, undirected=True,
                             dedup=True)
    else:
        order = np.argsort(nodes.ids, kind="stable")
        orig_ids = np.asarray(nodes.ids[order], dtype=np.int64)
        ends = np.concatenate([src, dst])
        pos = np.minimum(np.searchsorted(orig_ids, ends), max(orig_ids.size - 1, 0))
        missing = np.flatnonzero((orig_ids[pos] != ends) if orig_ids.size else np.ones(ends.size, bool))
        if missing.size:
            raise GnndistError(f"{data}: node id {ends[missing[0]]} of the edges has no row in "
                               f"{os.path.join(shards.nodes, 'ids.npy')}")
        arrays = {k: np.asarray(a[order]) for k, a in nodes.arrays.items()}
        if "x" in arrays:
            arrays["x"] = arrays["x"].astype(np.float32)
        try:
            g = Graph.from_edges(pos[:src.size], pos[src.size:], num_nodes=orig_ids.size, undirected=True, dedup=True,
                                 **arrays)
        except GnndistError as e:  # a node array's own check (e.g. x holds NaN) does not know the folder
            raise GnndistError(f"{shards.nodes}: {first_line(e)}") from None
    g.orig_ids = orig_ids.astype(np.int64)
    return g
