"""TGB's datasets in their own files (Huang et al., NeurIPS 2023): the zip TGB serves, or a folder
holding its files, read as TGB's loaders (`tgb/utils/pre_process.py`) read them. The graph's
`orig_ids` are TGB's node ids (`orig_ids[new_id] == TGB id`), which TGB's negatives and labels use.

Layouts (a header line first, columns by position):
- tgbl-wiki (also -subreddit, -uci, -enron, -lastfm): JODIE's `src, dst, ts, state_label,
  features...`; TGB ids: src, and dst + max(src) + 1 (items after users).
- tgbl-review, tgbl-coin: `ts, src, dst, w`; ids are strings, numbered 0.. in order of first
  appearance (line by line, src before dst); the edge feature is log2(w), a w of 0 read as 1.
- tgbn-trade: `ts, src, dst, w` (nations) numbered as above; the edge feature is w. Its
  `_node_labels` file: `ts, nation, nation, w`: at ts the first nation puts weight w on the
  class that is the second nation's id.
- tgbn-genre: `ts, user, genre, w`: genres numbered 0.. and users 513.. in order of first
  appearance; the edge feature is w. Its `_node_labels` file: `ts, user, genre, w`.

TGB's evaluation protocol (`write_protocol`, once, when a dataset by name is converted): its
split (`generate_splits`: training events up to the 0.70 quantile of the times, validation up to
the 0.85 quantile, test after) and, for a tgbl dataset, its fixed negatives of the validation
and test events (`NAME_val_ns*.pkl`, `NAME_test_ns*.pkl` in the zip: a pickled dict from
(src, dst, int(t)) in TGB's ids to the event's negative destinations, read by the restricted
unpickler), as arrays in event order that a rank reads only the rows of its own events of.
"""
from __future__ import annotations

import json
import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Optional

import numpy as np

from gnndist.datasets.formats import as_ints, renumbered
from gnndist.datasets.pickles import restricted_load
from gnndist.errors import GnndistError, first_line
from gnndist.graph import TemporalGraph

if TYPE_CHECKING:  # for the annotations: the readers import it where they use it
    import pyarrow

# dataset -> its layout: "jodie", "weighted" (log2 weight feature), "trade", "genre"
LAYOUTS = {**dict.fromkeys(("tgbl-wiki", "tgbl-subreddit", "tgbl-uci", "tgbl-enron", "tgbl-lastfm"), "jodie"),
           "tgbl-review": "weighted", "tgbl-coin": "weighted", "tgbn-trade": "trade", "tgbn-genre": "genre"}
GENRE_CLASSES = 513  # tgbn-genre's genre count: its users are numbered after it (TGB's DATA_NUM_CLASSES)
_FILE = re.compile(r"^(?P<name>tgb[ln]-[a-z]+)_(?P<part>edgelist|node_labels)(?:_v(?P<version>\d+))?\.csv$")
_NEGATIVES = re.compile(r"^(?P<name>tgbl-[a-z]+)_(?P<part>val|test)_ns(?:_v(?P<version>\d+))?\.pkl$")
SPLIT_FILE = "split.json"  # in a protocol folder: {"train_end", "val_end", "num_events"}
NEGATIVES_FILE = "{}_negatives.npy"  # in a protocol folder, per period (val, test): [events, K] int32, -1 padded
QUANTILES = (0.70, 0.85)  # TGB's generate_splits: val_ratio = test_ratio = 0.15


@dataclass(frozen=True)
class NodeLabels:
    """Node labels over time (TGB's node property prediction): at time `t[i]`, node `node[i]`
    (the graph's id) puts weight `weight[i]` on class `cls[i]`; a node's rows at one time are its
    label distribution."""

    t: np.ndarray  # float64
    node: np.ndarray  # int64
    cls: np.ndarray  # int64, in [0, num_classes)
    weight: np.ndarray  # float64
    num_classes: int


def is_tgb(path: str) -> bool:
    """Whether `path` is a TGB zip or folder: it holds a `tgbX-NAME_edgelist*.csv`."""
    try:
        return any(_FILE.match(n) and _FILE.match(n)["part"] == "edgelist" for n in _Files(path).names)
    except GnndistError:
        return False


class _Files:
    """The files of a TGB zip or folder, by base name."""

    def __init__(self, path: str):
        self.path = path
        if os.path.isdir(path):
            self.zip, members = None, os.listdir(path)
        else:
            try:
                self.zip = zipfile.ZipFile(path)
            except (OSError, zipfile.BadZipFile) as e:
                raise GnndistError(f"{path}: not a readable zip archive ({first_line(e)})") from None
            members = [m for m in self.zip.namelist() if not m.endswith("/")]
        self.names = {os.path.basename(m): m for m in members}

    def find(self, part: str, pattern: re.Pattern = _FILE) -> tuple[Optional[str], Optional[str]]:
        """(dataset name, file) of the `part` file ("edgelist" or "node_labels"; of `_NEGATIVES`:
        "val" or "test"), newest version first."""
        found = sorted(((int(m["version"] or 1), m["name"], n) for n in self.names if (m := pattern.match(n))
                        and m["part"] == part), reverse=True)
        return (found[0][1], found[0][2]) if found else (None, None)

    def open(self, name: str) -> IO[bytes]:
        """The file `name`, opened for reading bytes."""
        return self.zip.open(self.names[name]) if self.zip else open(os.path.join(self.path, name), "rb")

    def read(self, name: str, types: dict[int, "pyarrow.DataType"], ncols: int):
        """The CSV `name` as a pyarrow table of columns f0, f1, ... (its header line skipped),
        `types` forcing some; GnndistError if it is malformed or has fewer than `ncols` columns."""
        import pyarrow as pa
        import pyarrow.csv as pacsv

        where = f"{self.path}: {name}"
        try:
            with self.open(name) as f:
                table = pacsv.read_csv(f, read_options=pacsv.ReadOptions(skip_rows=1, autogenerate_column_names=True),
                                       convert_options=pacsv.ConvertOptions(
                                           column_types={f"f{j}": t for j, t in types.items()}))
        except (pa.ArrowException, OSError, zipfile.BadZipFile, EOFError) as e:
            raise GnndistError(f"{where}: cannot read: {first_line(e)}") from None
        if table.num_columns < ncols or table.num_rows == 0:
            raise GnndistError(f"{where}: expected lines of at least {ncols} fields after the header, got "
                               f"{table.num_rows} lines of {table.num_columns}")
        for j, col in enumerate(table.columns):
            if col.null_count:
                raise GnndistError(f"{where}: field {j + 1} is empty on {col.null_count} lines")
        return table


def _numbers(table, j: int, where: str, dtype=np.float64) -> np.ndarray:
    """Column j as numbers of `dtype` (integers: whole numbers only); GnndistError if it holds text."""
    import pyarrow as pa

    col = table.column(j)
    if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
        raise GnndistError(f"{where}: field {j + 1} must hold numbers, got {col.type}")
    a = col.to_numpy()
    return as_ints(a, f"{where}: field {j + 1}") if np.dtype(dtype).kind == "i" else a.astype(dtype)


def _first_seen(*cols) -> tuple[list[np.ndarray], "pyarrow.Array", np.ndarray]:
    """Number the strings of `cols` 0.. in order of first appearance, line by line, left to right
    (as TGB does): (each column's ids, the distinct strings, each string's id)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    enc = pc.dictionary_encode(pa.chunked_array([c for col in cols for c in col.chunks], type=pa.string()))
    enc = enc.combine_chunks() if isinstance(enc, pa.ChunkedArray) else enc
    codes = enc.indices.to_numpy().astype(np.int64).reshape(len(cols), -1)
    line_order = codes.T.ravel()
    first = np.full(len(enc.dictionary), line_order.size, dtype=np.int64)
    np.minimum.at(first, line_order, np.arange(line_order.size))
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    return [rank[c] for c in codes], enc.dictionary, rank


def _ids_of(col, strings, rank: np.ndarray, where: str, what: str) -> np.ndarray:
    """The ids (`rank` of the position in `strings`) of the strings in `col`; all must be known."""
    import pyarrow.compute as pc

    pos = pc.index_in(col, value_set=strings)
    if pos.null_count:
        missing = col.filter(pc.is_null(pos))[0].as_py()
        raise GnndistError(f"{where}: {what} {missing!r} does not occur in the edge list")
    return rank[pos.to_numpy().astype(np.int64)]


def load_tgb(path: str) -> TemporalGraph:
    """A TGB dataset from its zip or folder (see the module's docstring for the layouts); a tgbn
    dataset's labels come as the graph attribute `node_labels` (`NodeLabels`)."""
    import pyarrow as pa

    files = _Files(path)
    name, edges = files.find("edgelist")
    if name is None:
        raise GnndistError(f"{path}: no TGB edge list in it (a file tgbl-NAME_edgelist.csv or tgbn-NAME_edgelist.csv)")
    layout = LAYOUTS.get(name)
    if layout is None:
        raise GnndistError(f"{path}: {name} is not a TGB dataset gnndist reads (it reads {', '.join(LAYOUTS)})")
    where = f"{path}: {edges}"
    string = pa.string()
    if layout == "jodie":
        table = files.read(edges, {}, 4)
        src, dst = (_numbers(table, j, where, np.int64) for j in (0, 1))
        dst = dst + int(src.max()) + 1
        t, label = _numbers(table, 2, where), _numbers(table, 3, where, np.int64)
        feat = np.stack([_numbers(table, j, where, np.float32) for j in range(4, table.num_columns)], axis=1) \
            if table.num_columns > 4 else None
        if src.min() < 0 or label.min() < 0:
            raise GnndistError(f"{where}: node ids and state labels must be >= 0")
        return renumbered(src, dst, t, feat, label)
    table = files.read(edges, {1: string, 2: string}, 4)
    t, w = _numbers(table, 0, where), _numbers(table, 3, where)
    if layout == "genre":
        (users,), user_strings, user_rank = _first_seen(table.column(1))
        (genres,), genre_strings, genre_rank = _first_seen(table.column(2))
        if len(genre_strings) > GENRE_CLASSES:
            raise GnndistError(f"{where}: {len(genre_strings)} genres, more than the {GENRE_CLASSES} TGB numbers "
                               f"before the users")
        src, dst, num_classes = users + GENRE_CLASSES, genres, GENRE_CLASSES
    else:
        (src, dst), strings, rank = _first_seen(table.column(1), table.column(2))
        num_classes = len(strings)
    feat = np.log2(np.where(w == 0, 1.0, w)) if layout == "weighted" else w
    g = renumbered(src, dst, t, feat.astype(np.float32))
    if layout in ("trade", "genre"):
        _, label_file = files.find("node_labels")
        if label_file is None:
            raise GnndistError(f"{path}: no {name}_node_labels.csv beside the edge list")
        lw = f"{path}: {label_file}"
        lt = files.read(label_file, {1: string, 2: string}, 4)
        if layout == "genre":
            node = _ids_of(lt.column(1), user_strings, user_rank, lw, "user") + GENRE_CLASSES
            cls = _ids_of(lt.column(2), genre_strings, genre_rank, lw, "genre")
        else:
            node, cls = (_ids_of(lt.column(j), strings, rank, lw, "node") for j in (1, 2))
        g.node_labels = NodeLabels(_numbers(lt, 0, lw), np.searchsorted(g.orig_ids, node), cls, _numbers(lt, 3, lw),
                                   num_classes)
    return g


def tgb_split(t: np.ndarray) -> tuple[int, int]:
    """(first validation event, first test event) of events at the sorted times `t`, as TGB's
    `generate_splits` draws the line: at the 0.70 and 0.85 quantiles of the times, each time
    at a quantile on the earlier side."""
    val_time, test_time = np.quantile(t, QUANTILES)
    return int(np.searchsorted(t, val_time, "right")), int(np.searchsorted(t, test_time, "right"))


def write_protocol(path: str, graph: TemporalGraph, out: Path) -> None:
    """TGB's protocol for the graph read from the TGB zip or folder `path` into the (new) folder
    `out`: `split.json` and, for a tgbl dataset, the negatives of its validation and test events
    (see the module's docstring)."""
    files = _Files(path)
    name, _ = files.find("edgelist")
    train_end, val_end = tgb_split(graph.t)
    out.mkdir(parents=True, exist_ok=True)
    if name is not None and name.startswith("tgbl-"):
        for period, lo, hi in (("val", train_end, val_end), ("test", val_end, graph.num_events)):
            np.save(out / NEGATIVES_FILE.format(period), _negatives(files, name, period, graph, lo, hi))
    (out / SPLIT_FILE).write_text(json.dumps({"train_end": train_end, "val_end": val_end,
                                              "num_events": graph.num_events}) + "\n")


def _negatives(files: _Files, name: str, period: str, graph: TemporalGraph, lo: int, hi: int) -> np.ndarray:
    """[hi - lo, K] the negatives (the graph's ids, -1 after a shorter list's end) of the events
    lo .. hi-1, from TGB's pickle of the period; a negative equal to its event's destination
    (TGB's lists hold none) is left out."""
    _, member = files.find(period, _NEGATIVES)
    if member is None:
        raise GnndistError(f"{files.path}: no {name}_{period}_ns.pkl (TGB's {period} negatives) in it")
    where = f"{files.path}: {member}"
    with files.open(member) as f:
        lists = restricted_load(f, where, "pickle of TGB's negatives")
    if not isinstance(lists, dict):
        raise GnndistError(f"{where}: expected a dict of negatives per event, got {type(lists).__name__}")
    ids = graph.orig_ids
    keys = zip(ids[graph.src[lo:hi]].tolist(), ids[graph.dst[lo:hi]].tolist(),
               np.trunc(graph.t[lo:hi]).astype(np.int64).tolist())  # TGB's times are integers (torch long)
    rows = []
    for key in keys:
        got = lists.get(key)
        if got is None:
            raise GnndistError(f"{where}: no negatives for the {period} event (src, dst, t) = {key}: not the "
                               f"negatives of this edge list")
        rows.append(np.asarray(got).ravel())
    counts = np.array([r.size for r in rows], np.int64)
    flat = np.concatenate(rows) if rows else np.zeros(0)
    if flat.dtype.kind not in "biuf" or not np.array_equal(flat, np.round(flat)):
        raise GnndistError(f"{where}: negatives must be node ids (integers), got {flat.dtype} values")
    flat = flat.astype(np.int64)
    at = np.minimum(np.searchsorted(ids, flat), ids.size - 1)
    if flat.size and not np.array_equal(ids[at], flat):
        raise GnndistError(f"{where}: negative {flat[ids[at] != flat][0]} is no node of the edge list")
    row = np.repeat(np.arange(hi - lo), counts)
    keep = at != graph.dst[lo:hi][row]
    row, at = row[keep], at[keep]
    counts = np.bincount(row, minlength=hi - lo)
    if counts.size and counts.min() == 0:
        raise GnndistError(f"{where}: the {period} event {int(np.argmin(counts)) + lo} has no negatives")
    out = np.full((hi - lo, int(counts.max(initial=0))), -1, np.int32)
    out[row, np.arange(row.size) - np.repeat(np.cumsum(counts) - counts, counts)] = at
    return out
