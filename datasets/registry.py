"""Which loader or generator a DATA argument means, and the CLI flags that go with it."""
from __future__ import annotations

import argparse
import os
from typing import Any, Callable, Optional, Union

from gnndist.errors import GnndistError
from gnndist.graph import Graph, TemporalGraph

# format name -> (loader(path) -> Graph | TemporalGraph, one-line description)
FORMATS: dict[str, tuple[Callable[[str], Union[Graph, TemporalGraph]], str]] = {}
# generator name -> (generator(**options) -> Graph | TemporalGraph, one-line description)
GENERATORS: dict[str, tuple[Callable[..., Union[Graph, TemporalGraph]], str]] = {}


def load(name_or_path: str, format: Optional[str] = None, **options: Any) -> Union[Graph, TemporalGraph]:
    """A built-in generator's graph (options scale it) or a file/folder read by its format."""
    raise NotImplementedError  # filled in with the loaders


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
    opts = {k: getattr(args, a) for k, a in (("num_nodes", "num_nodes"), ("num_edges", "num_edges"),
                                             ("num_events", "num_events"))
            if getattr(args, a, None) is not None}
    return load(args.data, format=args.format, seed=args.data_seed, **opts)
