"""Partition stores as the trainers' input: checking one given as DATA, the cache folder of one
made on demand, and making it once under torchrun (rank 0 partitions, the others wait)."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable

from gnndist import dist
from gnndist.errors import GnndistError
from gnndist.partition import read_store_meta

TASK_OF_KIND = {"static": "node", "temporal": "link"}


def is_store(path: str | os.PathLike) -> bool:
    """True when `path` is a partition store folder."""
    return (Path(path) / "meta.json").is_file()


def check_store(path: str | os.PathLike, kind: str, world: int) -> str:
    """`path`, a store of a `kind` graph with `world` parts, as a string; GnndistError otherwise."""
    meta = read_store_meta(path)
    if meta.get("kind") != kind:
        raise GnndistError(f"partition store {path} holds a {meta.get('kind')} graph; "
                           f"--task {TASK_OF_KIND[kind]} needs a {kind} one")
    if int(meta["num_parts"]) != world:
        raise GnndistError(f"partition store {path} has {meta['num_parts']} parts but {world} rank(s) run; "
                           f"use --nproc {meta['num_parts']}")
    return str(path)


def cache_root() -> Path:
    """Where partition stores made on demand live: $GNNDIST_CACHE or ~/.cache/gnndist."""
    return Path(os.environ.get("GNNDIST_CACHE") or Path.home() / ".cache" / "gnndist")


def auto_partition_dir(args: argparse.Namespace, parts: int) -> Path:
    """The store folder for DATA split into `parts` (keyed by the data's identity and options)."""
    path = Path(args.data)
    if path.exists():
        files = sorted(p for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file())
        ident = [str(path.resolve())] + [f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files]
    else:
        ident = [args.data] + [f"{k}={getattr(args, k, None)}" for k in ("num_nodes", "num_edges", "data_seed")]
    key = hashlib.sha256(json.dumps(ident + [args.format, parts, "metis", "nodes,train"]).encode()).hexdigest()[:12]
    return cache_root() / "partitions" / f"{path.name or 'data'}-{parts}parts-{key}"


def torchrun_source(args: argparse.Namespace, device: str, prepare: Callable[[argparse.Namespace, int], Any],
                    cache_dir: Callable[[argparse.Namespace, int], Path]) -> Any:
    """What this rank of a torchrun world trains on: `prepare(args, world)`. When DATA is not a
    store and several ranks run, rank 0 prepares (partitions into `cache_dir(args, world)`, or
    finds it there) while the others wait for it and take that folder."""
    world = int(os.environ["WORLD_SIZE"])
    if world == 1 or is_store(args.data):
        return prepare(args, world)
    dev = dist.setup(device)
    source = prepare(args, world) if dist.rank() == 0 else str(cache_dir(args, world))
    dist.agree_max(0, dev)
    return source
