"""List the datasets by name, the built-in generators (with their options) and the file formats
gnndist reads; `--json` prints the datasets by name as JSON.

With DATA, load it and print its size instead, e.g. `gnndist datasets cora`; with `--write-shards
DIR`, write it as shard files (e.g. `gnndist datasets synthetic-temporal --num-events 100000000
--write-shards big/ --shards 64`).
"""
from __future__ import annotations

import argparse
import json
from typing import Union

from gnndist.datasets.catalog import catalog, catalog_text
from gnndist.datasets.registry import FORMATS, GENERATORS, DataSource, generator_options
from gnndist.datasets.shard_writer import ShardWriteConfig, write_data_shards
from gnndist.errors import GnndistError
from gnndist.graph import MASKS, Graph, TemporalGraph


def _generator_flags() -> dict[str, tuple[type, list[str]]]:
    """Every generator option but the seed: (type, the generators that take it)."""
    flags: dict[str, tuple[type, list[str]]] = {}
    for name in GENERATORS:
        for opt, default in generator_options(name).items():
            if opt != "seed":
                flags.setdefault(opt, (type(default), []))[1].append(name)
    return flags


def add_data_args(p: argparse.ArgumentParser, stores: bool = True, checkpoints: bool = False) -> None:
    """The positional DATA argument and the flags that choose its format or shape a generator
    (one flag per generator option; `--data-seed` is the generators' seed). `stores`,
    `checkpoints`: whether DATA may be a partition store, a checkpoint folder."""
    also = ["a partition store"] * stores + ["a checkpoint folder"] * checkpoints
    p.add_argument("data", metavar="DATA", help="a built-in dataset name (see `gnndist datasets`), a file or folder"
                   + "".join(f", or {a}" for a in also))
    p.add_argument("--format", default=None, help="file format, when the extension does not tell")
    _add_generator_args(p)


def _add_generator_args(p: argparse.ArgumentParser) -> None:
    """One flag per generator option, and `--data-seed`."""
    g = p.add_argument_group("built-in generators")
    for opt, (kind, names) in _generator_flags().items():
        g.add_argument(f"--{opt.replace('_', '-')}", type=kind, default=None, dest=opt,
                       help=f"{opt.replace('_', ' ')} ({', '.join(names)})")
    g.add_argument("--data-seed", type=int, default=None, help="generator seed (default: 0)")


def source_from_args(args: argparse.Namespace) -> DataSource:
    """The `DataSource` the flags of `add_data_args` describe (generator flags left unset keep
    the generator's defaults; they are refused for files by `load`)."""
    opts = {opt: getattr(args, opt) for opt in _generator_flags() if getattr(args, opt, None) is not None}
    if args.format is None and args.data in GENERATORS:
        opts["seed"] = 0 if args.data_seed is None else args.data_seed
    elif args.data_seed is not None:
        raise GnndistError(f"--data-seed is the built-in generators' seed ({', '.join(GENERATORS)}); {args.data} is "
                           f"not one of them: leave it out")
    return DataSource(args.data, args.format, opts)


def refuse_dataset_flags(args: argparse.Namespace, *others: tuple[str, object], what: str = "a partition store"
                         ) -> None:
    """For a DATA that is `what` (not a dataset): a one-line error naming the first of --format,
    the generator flags and `others` ((flag, value) pairs) that was given; they apply to datasets only."""
    given = [flag for flag, v in (("--format", args.format), *others) if v is not None]
    given += [f"--{opt.replace('_', '-')}" for opt in source_from_args(args).options if opt != "seed"]
    if given:
        raise GnndistError(f"{given[0]} applies to a dataset; {args.data} is {what}")


def configure(p: argparse.ArgumentParser) -> None:
    """The subcommand\'s flags."""
    p.add_argument("data", metavar="DATA", nargs="?", default=None,
                   help="a file, folder or built-in name to load and describe")
    p.add_argument("--format", default=None, help="file format, when the extension does not tell")
    p.add_argument("--json", action="store_true", help="print the datasets by name as a JSON list (name, kind, "
                   "files with url and sha256, size, source, licence, paper, folder)")
    _add_generator_args(p)
    g = p.add_argument_group("writing DATA as shard files")
    g.add_argument("--write-shards", metavar="DIR", default=None,
                   help="write DATA as shard files into the new folder DIR (synthetic-temporal: generated a shard "
                        "at a time, for graphs larger than memory)")
    g.add_argument("--shards", type=int, default=None, help="number of shard files (default: 4)")
    g.add_argument("--shard-format", default=None, help="parquet (default), csv or snap")


def describe(g: Union[Graph, TemporalGraph]) -> str:
    """One line with a graph's sizes."""
    if isinstance(g, TemporalGraph):
        span = float(g.t[-1] - g.t[0]) if g.num_events else 0.0
        return (f"temporal: {g.num_nodes} nodes, {g.num_events} events, edge_dim {g.edge_dim}, "
                f"time span {span:g}")
    masks = ", ".join(f"{m[:-5]} {int(getattr(g, m).sum())}" for m in MASKS
                      if getattr(g, m) is not None)
    return (f"static: {g.num_nodes} nodes, {g.num_edges} directed edges, {g.num_features} features, "
            f"{g.num_classes} classes" + (f", split {masks}" if masks else ""))


def run(args: argparse.Namespace) -> int:
    """Run the subcommand; the exit status."""
    if args.json:
        if args.data is not None:
            raise GnndistError("--json lists the datasets by name; leave DATA out")
        print(json.dumps(catalog(), indent=1))
        return 0
    given = {name: v for name, v in (("num_shards", args.shards), ("format", args.shard_format)) if v is not None}
    if args.write_shards is None and given:
        flag = "--shards" if "num_shards" in given else "--shard-format"
        raise GnndistError(f"{flag} applies with --write-shards DIR")
    if args.write_shards is not None:
        if args.data is None:
            raise GnndistError("--write-shards needs DATA: a built-in dataset name, a file or a folder")
        source = source_from_args(args)
        config = ShardWriteConfig(seed=source.options.get("seed", 0), **given)
        shards = write_data_shards(source.name, source.format, source.options, args.write_shards, config)
        print(f"wrote {len(shards.files)} {shards.format} shard files of {args.data} to {args.write_shards} "
              f"({sum(size for _, size in shards.files) / 2**20:.1f} MiB)")
        return 0
    if args.data is not None:
        print(f"{args.data}: {describe(source_from_args(args).load())}")
        return 0
    print(catalog_text() + "\n")
    print("built-in generators (gnndist train|partition NAME; scale with --num-nodes/--num-edges/--num-events, "
          "--data-seed):")
    for name, (_, text) in GENERATORS.items():
        opts = ", ".join(f"{k}={v}" for k, v in generator_options(name).items())
        print(f"  {name:<20} {text}\n  {'':<20} options: {opts}")
    print("\nfile formats (from the extension or content; or --format NAME):")
    for name, (_, text) in FORMATS.items():
        print(f"  {name:<20} {text}")
    return 0
