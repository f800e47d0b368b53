"""Which loader or generator a DATA argument means (`DataSource`), and loading it."""
from __future__ import annotations

import glob
import inspect
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Union

from gnndist.datasets import catalog
from gnndist.datasets.dgl import METADATA_JSON, META_YAML, dgl_csv_kind, dgl_format, load_dgl_csv
from gnndist.datasets.formats import load_csv, load_npz, load_signed, load_snap
from gnndist.datasets.generators import synthetic_static, synthetic_temporal
from gnndist.datasets.planetoid import PARTS, load_planetoid
from gnndist.datasets.shards import is_shards, open_shards, read_graph
from gnndist.datasets.tgb import is_tgb, load_tgb
from gnndist.datasets.text import check_regular, open_bytes
from gnndist.errors import GnndistError
from gnndist.graph import Graph, TemporalGraph
from gnndist.io import real_path
from gnndist.outputs import gnndist_output


def _read_chunked(path: str) -> Graph:
    """A DGL chunked graph folder's graph, read as its shard files."""
    if dgl_format(path) != "dgl-chunked":
        raise GnndistError(f"{path}: no {METADATA_JSON} (DGL's chunked graph format)")
    return read_graph(path)


# format name -> (loader(path) -> Graph | TemporalGraph, one-line description)
FORMATS: dict[str, tuple[Callable[[str], Union[Graph, TemporalGraph]], str]] = {
    "snap": (load_snap, "temporal: SNAP edge list, lines `src dst time`, whitespace separated, '#' comments "
                        "(.txt, .tsv, .edges; .gz ok)"),
    "csv": (load_csv, "temporal: CSV with a header naming the columns, JODIE "
                      "`user_id,item_id,timestamp,state_label,features...`, TGN `,u,i,ts,label,idx` or Bitcoin "
                      "`from,to,weight,time`; without a header the columns are src, dst, time, features (.csv; .gz ok)"),
    "signed": (load_signed, "temporal: SNAP's signed networks (soc-sign-bitcoinotc/alpha.csv), lines "
                            "`source,target,rating,time` without a header; the rating is the edge feature, its sign "
                            "the label"),
    "tgb": (load_tgb, "temporal: a TGB dataset's zip or folder (tgbl-wiki, -review, -coin, tgbn-trade, -genre and "
                      "others read the same way), with TGB's node ids and, for tgbn-*, node labels (.zip)"),
    "npz": (load_npz, "static: gnn-benchmark .npz (adj_*, attr_* CSR parts, labels, optional train/val/test_mask), "
                      "made undirected"),
    "planetoid": (load_planetoid, "static: Planetoid ind.NAME.{x,tx,allx,y,ty,ally,graph,test.index} "
                                  "(the folder or one file), with the public split"),
    "shards": (read_graph, "temporal or static: shard files of one graph (CSV, SNAP text, Parquet), a folder or a "
                           "glob: DIR/*.csv, DIR/events/*, or DIR/edges/* with node arrays DIR/nodes/*.npy"),
    "dgl-csv": (load_dgl_csv, "static or temporal: DGL's CSVDataset folder (meta.yaml naming one nodes CSV and one "
                              "edges CSV; node_id, feat, label, train/val/test_mask columns); a time column (t, ts, "
                              "time, timestamp) in the edges makes it temporal"),
    "dgl-chunked": (_read_chunked, "static: DGL's chunked graph folder, the input of DistDGL's partitioning "
                                   "(metadata.json; edge chunks in CSV or Parquet, node data in NumPy or Parquet); "
                                   "shard files that `partition --nproc` ranks read together"),
}
# generator name -> (generator(**options) -> Graph | TemporalGraph, one-line description)
GENERATORS: dict[str, tuple[Callable[..., Union[Graph, TemporalGraph]], str]] = {
    "synthetic-static": (synthetic_static, "node classification: power-law degrees, communities = classes, "
                                           "homophilous edges, features informative after neighbour averaging"),
    "synthetic-temporal": (synthetic_temporal, "link prediction: bursty sessions, repeated and drifting "
                                               "preferred partners within communities, edge features; with "
                                               "--session-labels N, state labels for --task node (1 from the "
                                               "Nth event of the source's session on)"),
}
# format or generator name -> the kind of graph it gives
KIND = {"snap": "temporal", "csv": "temporal", "signed": "temporal", "tgb": "temporal", "npz": "static",
        "planetoid": "static", "dgl-chunked": "static", "synthetic-static": "static",
        "synthetic-temporal": "temporal"}  # shards: either, by their layout; dgl-csv: by its edge columns
_EXTENSIONS = {".npz": "npz", ".zip": "tgb", ".csv": "csv", ".txt": "snap", ".tsv": "snap", ".edges": "snap"}


def generator_options(name: str) -> dict[str, Any]:
    """A generator's options and their defaults."""
    return {k: p.default for k, p in inspect.signature(GENERATORS[name][0]).parameters.items()}


def refuse_gnndist_output(path: str) -> None:
    """A one-line error where `path` is an output of gnndist's (a checkpoint, a metrics file, a
    plot) given as data, saying what it is."""
    written = gnndist_output(path)
    if written is not None:
        raise GnndistError(f"{path} is {written}, not a dataset")


def detect_format(path: str) -> str:
    """The format of a file or folder, from its name, else from its first bytes; an output of
    gnndist's (a checkpoint, a metrics file) is said to be one."""
    refuse_gnndist_output(path)
    base = os.path.basename(os.path.normpath(path))
    if os.path.isdir(path) or not os.path.exists(path):
        if os.path.isdir(path) and any(f.startswith("ind.") for f in os.listdir(path)):
            return "planetoid"
        if dgl_format(path) is not None:
            return dgl_format(path)
        if is_tgb(path):
            return "tgb"
        if is_shards(path):
            return "shards"
        raise GnndistError(f"{path}: cannot tell the format of this folder (give --format: {', '.join(FORMATS)})")
    if base.startswith("ind.") and base.split(".", 2)[-1] in PARTS:
        return "planetoid"
    if base in (META_YAML, METADATA_JSON):
        raise GnndistError(f"{path}: give the folder that holds it ({os.path.dirname(path) or '.'}), which is DGL's "
                           f"{'CSVDataset' if base == META_YAML else 'chunked graph'}")
    stem = base[:-3] if base.endswith(".gz") else base
    ext = os.path.splitext(stem)[1].lower()
    if ext in _EXTENSIONS:
        return _EXTENSIONS[ext]
    with open_bytes(path) as f:
        try:
            head = f.read(1 << 16)
        except (OSError, EOFError) as e:
            raise GnndistError(f"{path}: cannot read: {e}") from None
    if head.startswith(b"PK"):
        return "npz"
    first = next((ln for ln in head.splitlines() if ln.strip() and not ln.lstrip().startswith(b"#")), b"")
    return "csv" if b"," in first else "snap"


def load(name_or_path: str, format: Optional[str] = None, **options: Any) -> Union[Graph, TemporalGraph]:
    """A built-in generator's graph (options scale it), a dataset by name (fetched on first use,
    see `gnndist datasets`) or a file/folder read by its format."""
    if format is None and name_or_path in GENERATORS:
        known = generator_options(name_or_path)
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise GnndistError(f"{name_or_path} has no option {', '.join(unknown)} (options: {', '.join(known)})")
        return GENERATORS[name_or_path][0](**options)
    if options:
        raise GnndistError(f"{', '.join(sorted(options))}: options of the built-in generators only "
                           f"({', '.join(GENERATORS)}), not of files")
    if format is None and catalog.is_named(name_or_path):
        return catalog.load_named(name_or_path)
    reader = FORMATS[_file_format(name_or_path, format)][0]
    try:
        return reader(name_or_path)
    except GnndistError as e:  # the graph's own checks (e.g. "x holds NaN or inf") do not know the file
        if str(e).startswith(str(name_or_path)):
            raise
        raise GnndistError(f"{name_or_path}: {e}") from None


def data_kind(name_or_path: str, format: Optional[str] = None) -> str:
    """"static" or "temporal": what `load` would return, told without loading it (a partition
    store's kind comes from its meta.json)."""
    if format is None and name_or_path in GENERATORS:
        return KIND[name_or_path]
    if format is None and catalog.is_named(name_or_path):
        return catalog.CATALOG[name_or_path].kind
    from gnndist.partition import is_store, read_store_meta

    if is_store(name_or_path):
        return read_store_meta(name_or_path)["kind"]
    found = _file_format(name_or_path, format)
    if found == "dgl-csv":
        return dgl_csv_kind(name_or_path)
    return open_shards(name_or_path, None if format == "shards" else format).kind if found == "shards" else KIND[found]


def format_name(name_or_path: str, format: Optional[str] = None) -> str:
    """How DATA is read: `format` if given, "generator", a named dataset's format, or the detected one."""
    if format is not None:
        return format
    if name_or_path in GENERATORS:
        return "generator"
    return catalog.format_of(name_or_path) if catalog.is_named(name_or_path) else detect_format(name_or_path)


def _file_format(path: str, format: Optional[str]) -> str:
    """The format to read `path` with: `format` if given (checked), else detected."""
    if format is not None and format not in FORMATS:
        raise GnndistError(f"unknown format '{format}' (known: {', '.join(FORMATS)})")
    real_path(path)
    if not os.path.exists(path) and (path in GENERATORS or catalog.is_named(path)):
        what = "a built-in dataset" if path in GENERATORS else "a dataset by name"
        raise GnndistError(f"--format {format} is for files; {path} is {what} (leave --format out)")
    if not os.path.exists(path) and is_shards(path):  # a glob
        return "shards"
    if not os.path.exists(path):
        raise GnndistError(f"{path}: no such file, folder or built-in dataset "
                           f"(built-ins: {', '.join(GENERATORS)}; datasets by name: {', '.join(catalog.CATALOG)})")
    check_regular(path, folder_ok=True)
    return format or detect_format(path)


@dataclass(frozen=True)
class DataSource:
    """What a DATA argument names: a built-in generator with its options, a dataset by name, or
    a file or folder read by `format` (None: told by the name and content)."""

    name: str
    format: Optional[str] = None
    options: dict[str, Any] = field(default_factory=dict)  # generator options, e.g. num_events, seed

    def load(self) -> Union[Graph, TemporalGraph]:
        return load(self.name, self.format, **self.options)

    def kind(self) -> str:
        """"static" or "temporal", told without loading (see `data_kind`)."""
        return data_kind(self.name, self.format)

    def identity(self) -> list[str]:
        """What tells this data apart from any other, for cache keys: the file's resolved path,
        sizes and modification times, the generator's name and options, or a named dataset's files."""
        path = Path(self.name)
        if self.format is None and self.name in GENERATORS:
            return [self.name] + [f"{k}={v}" for k, v in sorted(self.options.items())]
        if self.format is None and catalog.is_named(self.name):
            return catalog.identity(self.name)
        found = map(Path, glob.glob(self.name)) if not path.exists() else [path] if path.is_file() else path.rglob("*")
        files = sorted(p for p in found if p.is_file())
        return ([str(real_path(path)), str(self.format)]
                + [f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files])
