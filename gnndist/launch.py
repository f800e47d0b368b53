"""Starting ranks and what they train on: the elastic launcher for --nproc local ranks, and
partition stores as the trainers' input (checking one given as DATA, the cache folder of one
made on demand, and making it once under torchrun: rank 0 partitions, the others wait)."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable

from gnndist import dist
from gnndist.errors import GnndistError, first_line
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


def _run_rank(errdir: str, entrypoint: Callable[..., Any], *args: Any) -> Any:
    """Child side of `launch`: a user error leaves its one-line message in `errdir`."""
    try:
        return entrypoint(*args)
    except Exception as e:
        kind = "peer" if isinstance(e, dist.PeerFailure) else "own"
        r = os.environ.get("RANK", "0")
        line = first_line(e)
        with open(os.path.join(errdir, f"{kind}-{r}.txt"), "w") as f:
            f.write(line if kind == "peer" else f"rank {r}: {line}")
        if os.environ.get("GNNDIST_DEBUG") != "1":  # --debug: the rank's traceback too
            raise SystemExit(2) from None
        raise


def launch(nproc: int, entrypoint: Callable[..., Any], *args: Any) -> list[Any]:
    """Run `entrypoint(*args)` on `nproc` local ranks with torch's elastic launcher.

    Returns the per-rank return values in rank order. If a rank fails, raises `GnndistError`
    with the one-line reason of the rank that failed first (not of its peers' follow-up errors).
    """
    import logging
    import tempfile

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if os.environ.get("GNNDIST_DEBUG") != "1":
        for name in ("torch.distributed.elastic", "torch.multiprocessing"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id="gnndist",
                          rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", max_restarts=0,
                          monitor_interval=0.1, start_method="spawn")
    # as torchrun does: ranks share the cores, so each gets its part (unless the user chose)
    omp = os.environ.get("OMP_NUM_THREADS")
    if omp is None:
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
    with tempfile.TemporaryDirectory(prefix="gnndist-err-") as errdir:
        try:
            out = elastic_launch(config, _run_rank)(errdir, entrypoint, *args)
        except ChildFailedError as e:
            files = sorted(os.listdir(errdir), key=lambda f: (not f.startswith("own"), f))
            if files:
                with open(os.path.join(errdir, files[0])) as f:
                    raise GnndistError(f.read()) from None
            rank_, failure = e.get_first_failure()
            raise GnndistError(f"rank {rank_} exited with code {failure.exitcode}") from None
        finally:
            if omp is None:
                del os.environ["OMP_NUM_THREADS"]
    return [out[r] for r in sorted(out)]
