"""List the built-in generators (with their options) and the file formats gnndist reads.

With DATA, load it and print its size instead, e.g. `gnndist datasets ../shared/datasets/cora`.
"""
from __future__ import annotations

import argparse
from typing import Union

from gnndist.datasets.registry import FORMATS, GENERATORS, generator_options, load
from gnndist.graph import Graph, TemporalGraph


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("data", metavar="DATA", nargs="?", default=None,
                   help="a file, folder or built-in name to load and describe")
    p.add_argument("--format", default=None, help="file format, when the extension does not tell")


def describe(g: Union[Graph, TemporalGraph]) -> str:
    """One line with a graph's sizes."""
    if isinstance(g, TemporalGraph):
        span = float(g.t[-1] - g.t[0]) if g.num_events else 0.0
        return (f"temporal: {g.num_nodes} nodes, {g.num_events} events, edge_dim {g.edge_dim}, "
                f"time span {span:g}")
    masks = ", ".join(f"{m[:-5]} {int(getattr(g, m).sum())}" for m in ("train_mask", "val_mask", "test_mask")
                      if getattr(g, m) is not None)
    return (f"static: {g.num_nodes} nodes, {g.num_edges} directed edges, {g.num_features} features, "
            f"{g.num_classes} classes" + (f", split {masks}" if masks else ""))


def run(args: argparse.Namespace) -> int:
    if args.data is not None:
        print(f"{args.data}: {describe(load(args.data, format=args.format))}")
        return 0
    print("built-in generators (gnndist train|partition NAME; scale with --num-nodes/--num-edges/--num-events, "
          "--data-seed):")
    for name, (_, text) in GENERATORS.items():
        opts = ", ".join(f"{k}={v}" for k, v in generator_options(name).items())
        print(f"  {name:<20} {text}\n  {'':<20} options: {opts}")
    print("\nfile formats (from the extension or content; or --format NAME):")
    for name, (_, text) in FORMATS.items():
        print(f"  {name:<20} {text}")
    return 0
