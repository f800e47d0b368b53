"""Which loader or generator a DATA argument means, and the CLI flags that go with it."""
from __future__ import annotations

import argparse
import inspect
import os
from typing import Any, Callable, Optional, Union

from gnndist.datasets.formats import load_csv, load_npz, load_snap
from gnndist.datasets.generators import synthetic_static, synthetic_temporal
from gnndist.datasets.planetoid import PARTS, load_planetoid
from gnndist.datasets.text import check_regular, open_bytes
from gnndist.errors import GnndistError
from gnndist.graph import Graph, TemporalGraph

# format name -> (loader(path) -> Graph | TemporalGraph, one-line description)
FORMATS: dict[str, tuple[Callable[[str], Union[Graph, TemporalGraph]], str]] = {
    "snap": (load_snap, "temporal: SNAP edge list, lines `src dst time`, whitespace separated, '#' comments "
                        "(.txt, .tsv, .edges; .gz ok)"),
    "csv": (load_csv, "temporal: CSV with a header, JODIE `user_id,item_id,timestamp,state_label,features...`, "
                      "TGN `,u,i,ts,label,idx` or Bitcoin `from,to,weight,time` (.csv; .gz ok)"),
    "npz": (load_npz, "static: gnn-benchmark .npz (adj_*, attr_* CSR parts, labels), made undirected"),
    "planetoid": (load_planetoid, "static: Planetoid ind.NAME.{x,tx,allx,y,ty,ally,graph,test.index} "
                                  "(the folder or one file), with the public split"),
}
# generator name -> (generator(**options) -> Graph | TemporalGraph, one-line description)
GENERATORS: dict[str, tuple[Callable[..., Union[Graph, TemporalGraph]], str]] = {
    "synthetic-static": (synthetic_static, "node classification: power-law degrees, communities = classes, "
                                           "homophilous edges, features informative after neighbour averaging"),
    "synthetic-temporal": (synthetic_temporal, "link prediction: bursty sessions, repeated and drifting "
                                               "preferred partners within communities, edge features"),
}
# format or generator name -> the kind of graph it gives
KIND = {"snap": "temporal", "csv": "temporal", "npz": "static", "planetoid": "static",
        "synthetic-static": "static", "synthetic-temporal": "temporal"}
_EXTENSIONS = {".npz": "npz", ".csv": "csv", ".txt": "snap", ".tsv": "snap", ".edges": "snap"}


def generator_options(name: str) -> dict[str, Any]:
    """A generator's options and their defaults."""
    return {k: p.default for k, p in inspect.signature(GENERATORS[name][0]).parameters.items()}


def detect_format(path: str) -> str:
    """The format of a file or folder, from its name, else from its first bytes."""
    base = os.path.basename(os.path.normpath(path))
    if os.path.isdir(path):
        if any(f.startswith("ind.") for f in os.listdir(path)):
            return "planetoid"
        raise GnndistError(f"{path}: cannot tell the format of this folder (give --format: {', '.join(FORMATS)})")
    if base.startswith("ind.") and base.split(".", 2)[-1] in PARTS:
        return "planetoid"
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
    """A built-in generator's graph (options scale it) or a file/folder read by its format."""
    if format is None and name_or_path in GENERATORS:
        known = generator_options(name_or_path)
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise GnndistError(f"{name_or_path} has no option {', '.join(unknown)} (options: {', '.join(known)})")
        return GENERATORS[name_or_path][0](**options)
    if options:
        raise GnndistError(f"{', '.join(sorted(options))}: options of the built-in generators only "
                           f"({', '.join(GENERATORS)}), not of files")
    return FORMATS[_file_format(name_or_path, format)][0](name_or_path)


def data_kind(name_or_path: str, format: Optional[str] = None) -> str:
    """"static" or "temporal": what `load` would return, told without loading it (a partition
    store's kind comes from its meta.json)."""
    if format is None and name_or_path in GENERATORS:
        return KIND[name_or_path]
    if os.path.isfile(os.path.join(name_or_path, "meta.json")):
        from gnndist.partition import read_store_meta

        return read_store_meta(name_or_path)["kind"]
    return KIND[_file_format(name_or_path, format)]


def _file_format(path: str, format: Optional[str]) -> str:
    """The format to read `path` with: `format` if given (checked), else detected."""
    if format is not None and format not in FORMATS:
        raise GnndistError(f"unknown format '{format}' (known: {', '.join(FORMATS)})")
    if not os.path.exists(path):
        raise GnndistError(f"{path}: no such file, folder or built-in dataset "
                           f"(built-ins: {', '.join(GENERATORS)})")
    check_regular(path, folder_ok=True)
    return format or detect_format(path)


def add_data_args(p: argparse.ArgumentParser) -> None:
    """The positional DATA argument and the flags that choose its format or scale a generator."""
    p.add_argument("data", metavar="DATA", help="a built-in dataset name (see `gnndist datasets`), "
                   "a file or folder, or (for train) a partition store")
    p.add_argument("--format", default=None, help="file format, when the extension does not tell")
    g = p.add_argument_group("built-in generators")
    g.add_argument("--num-nodes", type=int, default=None, help="nodes to generate")
    g.add_argument("--num-edges", type=int, default=None, help="edges to generate (synthetic-static)")
    g.add_argument("--num-events", type=int, default=None, help="events to generate (synthetic-temporal)")
    g.add_argument("--data-seed", type=int, default=0, help="generator seed")


def load_from_args(args: argparse.Namespace) -> Union[Graph, TemporalGraph]:
    """`load` with the options `add_data_args` parsed."""
    opts = {k: getattr(args, k) for k in ("num_nodes", "num_edges", "num_events") if getattr(args, k, None) is not None}
    if args.format is None and args.data in GENERATORS:
        opts["seed"] = args.data_seed
    return load(args.data, format=args.format, **opts)
