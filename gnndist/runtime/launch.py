"""Starting a job (training, prediction and, with `partition_data`, partitioning), the one path
both trainers share: what its ranks train on (the
graph itself in one process, else a partition store with one part per rank) and how they start
(in this process, on --nproc local ranks with torch's elastic launcher, or as one rank of the
world torchrun describes).

Given raw data and W > 1 ranks, the data is first split into a store in the cache folder
($GNNDIST_CACHE or ~/.cache/gnndist), keyed by the data's identity and the split; a later run
on the same data finds it there. Under torchrun the local rank 0 of every node partitions into
its host's cache while the node's other ranks wait, and before training every rank checks with
the others that they hold the same store and configuration and run the same versions.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import select
import signal
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

import numpy as np
import torch
from tqdm import tqdm

from gnndist import __version__, checkpoint
from gnndist.runtime import dist, threads
from gnndist.datasets import DataSource
from gnndist.datasets.shards import is_shards, reads_as_shards
from gnndist.errors import GnndistError, first_line
from gnndist.graph import MASKS, Graph, TemporalGraph
from gnndist.io import cache_root, show_progress
from gnndist.outputs import Outputs, report, write_metrics
from gnndist.partition import check_store_of, is_store, open_part, partition_graph, read_store_meta
from gnndist.partition.methods import LP_METHODS
from gnndist.partition.scale import partition_shards
from gnndist.validate import DEVICES, TASK_OF_KIND, Int, OneOf, check

ERRDIR = "GNNDIST_LAUNCH_ERRDIR"  # where the ranks `launch` starts (they inherit it) leave their error line
Data = Union[DataSource, Graph, TemporalGraph, str]  # a str names a partition store or a DataSource


@dataclass(frozen=True)
class Split:
    """How a trainer wants raw data split into one part per rank."""

    kind: str  # the graph kind the trainer takes: "static" | "temporal"
    method: str  # partition method
    balance: tuple[str, ...] = ()
    check: Optional[Callable[[Any], None]] = None  # raises GnndistError where a graph lacks what the trainer needs


def check_store(path: Union[str, os.PathLike], kind: str, world: int) -> str:
    """`path`, a store of a `kind` graph with `world` parts, as a string; GnndistError otherwise."""
    check_store_of(read_store_meta(path), path, kind, world)
    return str(path)


def _identity(data: Union[DataSource, Graph, TemporalGraph]) -> list[str]:
    """What tells the data apart: a source's identity, or a graph's content hash (every array it
    holds, features, labels and masks included: a store split from a graph holds them all)."""
    if isinstance(data, DataSource):
        return data.identity()
    names = (("indptr", "indices", "x", "y", *MASKS) if isinstance(data, Graph)
             else ("src", "dst", "t", "edge_feat", "edge_label"))
    h = hashlib.sha256(str(getattr(data, "num_nodes", "")).encode())
    for name in names:
        a = getattr(data, name)
        h.update(f"{name} {None if a is None else (a.dtype.str, a.shape)}".encode())
        if a is not None:
            h.update(np.ascontiguousarray(a).view(np.uint8))
    return [type(data).__name__, h.hexdigest()]


def store_dir(data: Union[DataSource, Graph, TemporalGraph], world: int, split: Split) -> Path:
    """The cache folder of `data` split into `world` parts as `split` says."""
    key = hashlib.sha256(json.dumps(_identity(data) + [world, split.method, list(split.balance)]).encode())
    name = Path(data.name).name if isinstance(data, DataSource) else type(data).__name__.lower()
    return cache_root() / "partitions" / f"{name or 'data'}-{world}parts-{split.method}-{key.hexdigest()[:12]}"


def _check_kind(data: Union[DataSource, Graph, TemporalGraph], split: Split) -> None:
    """A one-line error unless `data` is of the kind of graph the trainer takes (told without
    loading it)."""
    kind = kind_of(data)
    if kind != split.kind:
        raise GnndistError(f"DATA is a {kind} graph: use --task {TASK_OF_KIND[kind]} (--task {TASK_OF_KIND[split.kind]} needs a "
                           f"{split.kind} graph)")


def _sharded(data: Union[DataSource, Graph, TemporalGraph]) -> bool:
    """Whether `data` is a folder or glob of shard files (partitioned across the ranks, not
    loaded by one process)."""
    return isinstance(data, DataSource) and data.format in (None, "shards") and not data.options and \
        is_shards(data.name)


def _split_options(split: Split) -> dict:
    """`partition_shards`' options for `split`: its default method (METIS where the projection
    fits the memory budget, else label propagation) where `split` names the METIS one."""
    return {"method": None if split.method in LP_METHODS else split.method, "balance": list(split.balance) or None}


def _load(data: Union[DataSource, Graph, TemporalGraph], split: Split) -> Union[Graph, TemporalGraph]:
    """The graph of `data`, which must be of the kind the trainer takes (told before loading)."""
    _check_kind(data, split)
    graph = data.load() if isinstance(data, DataSource) else data
    if split.check is not None:
        split.check(graph)
    return graph


def kind_of(data: Data) -> str:
    """"static" or "temporal": the kind of graph `data` is or names, told without loading it (a
    store's from its meta.json)."""
    data = _normal(data)
    if isinstance(data, Path):
        return read_store_meta(data).get("kind")
    if isinstance(data, DataSource):
        return data.kind()
    return "static" if isinstance(data, Graph) else "temporal"


def _normal(data: Data) -> Union[DataSource, Graph, TemporalGraph, Path]:
    """`data` with a str resolved to a store folder (a Path) or a DataSource."""
    if isinstance(data, (str, os.PathLike)):
        return Path(data) if is_store(data) else DataSource(str(data))
    return data


def _readable(path: Path) -> bool:
    """Whether a cached store can be read by this gnndist (else it is made again)."""
    try:
        read_store_meta(path)
        return True
    except GnndistError:
        return False


def make_store(data: Data, world: int, split: Split, quiet: bool = False) -> str:
    """The store with `world` parts the ranks train on: DATA itself, or a split of DATA made now
    (or earlier, found in the cache)."""
    data = _normal(data)
    if isinstance(data, Path):
        return check_store(data, split.kind, world)
    out = store_dir(data, world, split)
    if is_store(out) and _readable(out):
        dist.say(f"using the partition store {out} ({world} parts, made earlier)")
        return str(out)
    if _sharded(data):  # partitioned by `world` ranks, as they will train
        _check_kind(data, split)
        dist.say(f"partitioning into {world} parts ({split.method}) at {out}, across {world} ranks")
        launch(world, _partition_rank, data.name, world, str(out), show_progress(quiet), _split_options(split))
        return str(out)
    graph = _load(data, split)
    if world > graph.num_nodes:
        raise GnndistError(f"--nproc {world} is more ranks than the data has nodes ({graph.num_nodes:,}): "
                           "each rank owns at least one node")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise GnndistError(f"cannot make the partition cache folder {out.parent} (GNNDIST_CACHE, default "
                           f"~/.cache/gnndist): {e.strerror or e}") from None
    dist.say(f"partitioning into {world} parts ({split.method}) at {out}")
    try:
        partition_graph(graph, world, method=split.method, balance=list(split.balance) or None, out=out,
                        progress=show_progress(quiet))
    except GnndistError as e:
        why = first_line(e).replace("--parts", "--nproc")  # the part count is the rank count here
        raise GnndistError(f"--nproc {world}: the data cannot be split into {world} parts: {why}") from None
    return str(out)


def _wait_for_store(path: Path) -> str:
    """`path` once this host's local rank 0 has written the store there (if it fails, torchrun
    stops this host's ranks)."""
    while not is_store(path):
        time.sleep(0.2)
    return str(path)


def rank_source(data: Data, world: int, split: Split, quiet: bool = False) -> Union[Graph, TemporalGraph, str]:
    """What one rank of `world` trains on: the graph (one rank, raw data) or a store folder.
    Under torchrun with raw data and W > 1, shard files are partitioned by all the ranks
    together, each host's ranks writing into their host's cache; other raw data is partitioned by
    the local rank 0 of every node (host) into its own cache while the node's other ranks wait:
    every host partitions the same data the same way, and the start-up check of `run_job`
    compares the stores' checksums."""
    data = _normal(data)
    if world == 1 and not isinstance(data, Path):
        return _load(data, split)
    if world == 1 or isinstance(data, Path) or not dist.in_torchrun():
        return make_store(data, world, split, quiet)
    if _sharded(data):  # every rank partitions its portion, into its host's cache
        _check_kind(data, split)
        out = store_dir(data, world, split)
        if dist.agree_max(int(not (is_store(out) and _readable(out)))):
            with dist.busy(f"partitioning into {world} parts"):
                partition_shards(data.name, world, out=out, progress=show_progress(quiet) and dist.rank() == 0,
                                 **_split_options(split))
        return str(out)
    if dist.first_on_host():
        with dist.busy(f"partitioning into {world} parts"):
            return make_store(data, world, split, quiet)
    return _wait_for_store(store_dir(data, world, split))


def _fingerprint(meta: dict, args: tuple) -> dict:
    """What every rank of a job must share: the versions, the store's file checksums and the
    job's settings (the dataclass arguments other than `Outputs`, less `quiet`; one with a
    `fingerprint()`, e.g. a saved model, gives that), and whether it writes and resumes a
    checkpoint (the paths may differ between hosts)."""
    files = meta["files"]
    config = {k: v for a in args if dataclasses.is_dataclass(a) and not isinstance(a, Outputs)
              for k, v in (a.fingerprint() if hasattr(a, "fingerprint") else dataclasses.asdict(a)).items()
              if k != "quiet"}
    for o in (a for a in args if isinstance(a, Outputs)):  # a restarted rank resumes as --resume does
        config.update({"--checkpoint": bool(o.checkpoint), "--resume": bool(o.resume) or dist.restart_count() > 0,
                       "--checkpoint-every": o.checkpoint_every, "--checkpoint-minutes": o.checkpoint_minutes})
    return {"gnndist": __version__, "torch": torch.__version__,
            "store": hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest(),
            "config": json.loads(json.dumps(config, default=str))}


def _difference(mine: dict, first: dict, r: int, hosts: Callable[[int], str]) -> str:
    """The one-line account of how rank `r`'s fingerprint `mine` differs from rank 0's `first`."""
    who, ref = f"rank {r} (host {hosts(r)})", f"rank 0 (host {hosts(0)})"
    for name in ("gnndist", "torch"):
        if mine[name] != first[name]:
            return f"{who} runs {name} {mine[name]} but {ref} runs {first[name]}: install the same version on every host"
    if mine["store"] != first["store"]:
        return (f"the partition store of {who} differs from that of {ref} (meta.json's file checksums): partition "
                "once with `gnndist partition` and copy the store to every host")
    key = next(k for k in sorted(set(mine["config"]) | set(first["config"]))
               if mine["config"].get(k) != first["config"].get(k))
    return (f"{who} was started with {key}={mine['config'].get(key)!r} but {ref} with "
            f"{key}={first['config'].get(key)!r}: give every host the same flags")


def check_same_job(meta: dict, args: tuple) -> None:
    """A start-up collective: every rank compares its `_fingerprint` (`meta`: its store's
    meta.json) with rank 0's; if one differs, every rank raises the same one-line error naming
    the first rank that differs."""
    w, me = dist.heartbeat(), dist.rank()
    mine = _fingerprint(meta, args)
    w.put("job", json.dumps(mine))
    dist.agree_max(0)  # every rank has posted
    first = json.loads(w.get("job", 0))
    bad = -dist.agree_max(-(me if mine != first else dist.world_size()))
    if bad < dist.world_size():
        other = mine if bad == me else json.loads(w.get("job", bad))
        raise GnndistError(_difference(other, first, bad, w.host_of))


def over_seeds(train: Callable[..., dict], data: Data, cfg: Any, seeds: list[int], nproc: int = 1,
               outputs: Outputs = Outputs()) -> dict:
    """`train(data, cfg with seed s, nproc)` for each seed; the runs' metrics and, for every test
    metric, its mean and (sample) standard deviation over the seeds. Rank 0 prints the summary
    and writes it to `outputs.metrics_out`."""
    import statistics

    if outputs.checkpoint or outputs.log_dir:
        raise GnndistError("--seeds runs several trainings; it takes no --checkpoint or --log-dir")
    outputs.check(data)
    runs = [train(data, replace(cfg, seed=s), nproc) for s in seeds]
    summary = {}
    for key, value in runs[0]["test"].items():
        values = [r["test"][key] for r in runs]
        if all(isinstance(v, (int, float)) and v == v for v in values):
            summary[key] = {"mean": statistics.fmean(values),
                            "std": statistics.stdev(values) if len(values) > 1 else 0.0}
    out = {"task": runs[0]["task"], "model": runs[0]["model"], "seeds": seeds, "summary": summary, "runs": runs}
    if dist.rank() == 0:
        print(f"over seeds {','.join(map(str, seeds))}: " + ", ".join(
            f"{k} {v['mean']:.4f} ± {v['std']:.4f}" for k, v in summary.items()
            if k in ("ap", "auc", "mrr", "acc", "f1", "ndcg")),
            flush=True)
        if outputs.metrics_out:
            write_metrics(outputs.metrics_out, out)
    return out


def run_job(data: Data, nproc: int, split: Split, rank_fn: Callable[..., Any], *args: Any, device: str = "cpu",
            quiet: bool = False, outputs: Optional[Outputs] = None, max_restarts: int = 0) -> Any:
    """`rank_fn(source, device, *args)` on every rank of the job, once the rank has joined the
    process group (on `device`), where `source` is what `rank_source` gives (a store's part
    opened: `partition.open_part`): in this process (nproc 1), on `nproc` local ranks, or on
    this rank of a torchrun world (which first checks, with every other rank, that they run the
    same job). Returns rank 0's result (this rank's under torchrun). Torch runs on
    `threads.job_threads` meanwhile. `outputs`: checked before any work; the process holding
    rank 0's metrics prints and writes them (`outputs.report`); each of W > 1 ranks writes its
    checkpoint to a folder of its own. `max_restarts`: how often `launch` restarts the `nproc`
    ranks after one fails (a run then resumes from its checkpoint: `gnndist.resume`)."""
    _refuse_rerun_script()
    dist.timeout_s()  # a bad GNNDIST_TIMEOUT is told before anything starts
    check("nproc", nproc, Int())
    check("device", device, OneOf(DEVICES))
    check("max_restarts", max_restarts, Int(0))
    if max_restarts and dist.in_torchrun():
        raise GnndistError("--max-restarts restarts the ranks that --nproc starts; under torchrun, give torchrun "
                           "--max-restarts")
    if max_restarts and nproc == 1:
        raise GnndistError("--max-restarts restarts the ranks that --nproc W > 1 starts; one process is not restarted")
    if not isinstance(data, (DataSource, Graph, TemporalGraph, str, os.PathLike)):
        raise GnndistError("the data must be a Graph, a TemporalGraph, a DataSource, a dataset name or a path, "
                           f"got {type(data).__name__}")
    world = int(os.environ["WORLD_SIZE"]) if dist.in_torchrun() else nproc
    if outputs is not None:
        outputs.check(data)
        if outputs.checkpoint:
            resume = True if dist.restart_count() > 0 else outputs.resume
            checkpoint.check_folder(outputs.checkpoint, world if world > 1 else 0, resume)
    with threads.job_threads():
        if dist.in_torchrun():
            result = _torchrun_rank(data, split, rank_fn, args, device, quiet)
        elif nproc == 1:
            result = _on_rank(rank_source(data, 1, split, quiet), split.kind, rank_fn, device, args)
        else:
            if device.startswith("cuda"):
                dist.rank_gpu(nproc - 1)  # told before the data is split and the ranks start
            result = launch(nproc, _on_rank, make_store(data, nproc, split, quiet), split.kind, rank_fn, device,
                            args, max_restarts=max_restarts)[0]
    if outputs is not None and dist.writes_outputs():
        report(result, outputs)
    return result


def rank_and_host() -> str:
    """This rank and its host, as a line names them: `rank 1 (host node2, 10.0.0.2)`."""
    host = dist.heartbeat().host if dist.heartbeat() else dist.this_host("127.0.0.1")
    return f"rank {dist.rank()} (host {host})"


def _on_rank(source: Union[Graph, TemporalGraph, str], kind: str, rank_fn: Callable[..., Any], device: str,
             args: tuple) -> Any:
    """`rank_fn` on this rank of a job started here (one process, or `launch`'s): joined to the
    process group, with its part of a store (of a `kind` graph) opened."""
    dev = dist.setup(device)
    try:
        if isinstance(source, str):
            source = open_part(source, dist.rank(), dist.world_size(), kind, rank_and_host())
        return rank_fn(source, dev, *args)
    finally:
        dist.teardown()


def _refuse_rerun_script() -> None:
    """In a rank that `launch` starts, torch imports the user's script again (it starts ranks by
    spawning); a job called from the script's top level would run again there, and its `nproc`
    ranks fail to start. Such a rank leaves one line saying so for `launch`, and exits."""
    main = sys.modules.get("__mp_main__")  # in the parent, another name of __main__
    errdir = os.environ.get(ERRDIR)  # set for the ranks `launch` starts only
    if main is None or main.__name__ != "__mp_main__" or not errdir:
        return
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is vars(main):
            # (the same for every rank, and torch sets RANK only after the script is imported)
            Path(errdir, f"own-rerun-{os.getpid()}.txt").write_text(
                "the script calling gnndist runs again in each rank gnndist starts: put its calls under "
                "`if __name__ == \"__main__\":`")
            raise SystemExit(2)
        frame = frame.f_back


def _torchrun_rank(data: Data, split: Split, rank_fn: Callable[..., Any], args: tuple, device: str,
                   quiet: bool) -> Any:
    """This rank of a torchrun world: join, open this rank's data, check that every rank runs the
    same job, run."""
    world = int(os.environ["WORLD_SIZE"])
    with _torchrun_errors():
        _refuse_shared_store_restarts()
        dev = dist.setup(device)
        source = rank_source(data, world, split, quiet)
        if isinstance(source, str):
            source = open_part(source, dist.rank(), world, split.kind, rank_and_host())
        if world > 1:
            check_same_job(source.meta, args)
            rank0_host = dist.heartbeat().host_of(0)
            dist.say(f"running on part {dist.rank()} of {source.path} ({world} ranks)")
        result = rank_fn(source, dev, *args)
    if world > 1 and not dist.writes_outputs():
        dist.say(f"done; rank 0 (host {rank0_host}) prints the results and writes the output files, if given there")
    return result


@contextlib.contextmanager
def _torchrun_errors() -> Iterator[None]:
    """A torchrun rank's block: its own error is left in the job's store for the others to name,
    and said with its rank and host; the process group is left at the end either way."""
    _thread_locks_only()
    try:
        yield
    except Exception as e:
        dist.post_failure(e)
        who = dist.line_prefix()
        dist.teardown()  # its groups' threads end before the interpreter does (as on success)
        own = isinstance(e, GnndistError) and not isinstance(e, dist.PeerFailure) and not str(e).startswith("rank ")
        if own and who:
            raise GnndistError(who + first_line(e)) from None  # its own error: which rank, on which host
        raise
    dist.teardown()


def partition_data(data: str, num_parts: int, out: Union[str, os.PathLike], nproc: int = 1, quiet: bool = False,
                   **options: Any) -> dict:
    """Partition DATA into a store at `out` (`options`: those of `partition.partition_graph`, and
    `memory_budget`): in this process (`partition_graph`, nproc 1), or across `nproc` local ranks,
    or the ranks of the torchrun world this process is one of, which read DATA's shard files and
    write one part each (`partition.scale.partition_shards`). Returns meta.json's contents."""
    check("nproc", nproc, Int())
    distributed = nproc > 1 or dist.in_torchrun()
    if not distributed:
        options.pop("memory_budget", None)
        partition_graph(DataSource(str(data)).load(), num_parts, out=out, progress=show_progress(quiet), **options)
        return read_store_meta(out)
    for flag, given in (("--halo", options.pop("halo", 0)), ("--replicate-hubs", options.pop("replicate_hubs", 0)),
                        ("--force", options.pop("force", False))):
        if given:
            raise GnndistError(f"{flag} applies to partitioning in one process; leave it out with --nproc (or torchrun)")
    if not reads_as_shards(str(data)):
        raise GnndistError(f"{data} is not shard files (a folder, a glob, or one CSV, SNAP or Parquet file): partitioning "
                           "across ranks reads shard files; leave --nproc out, or write the graph as shards first "
                           "(`gnndist datasets DATA --write-shards DIR`)")
    dist.timeout_s()
    if dist.in_torchrun():
        with _torchrun_errors():
            dist.setup("cpu")
            return partition_shards(str(data), num_parts, out=out, progress=show_progress(quiet), **options)
    return launch(nproc, _partition_rank, str(data), num_parts, str(out), show_progress(quiet), options)[0]


def _partition_rank(data: str, num_parts: int, out: str, progress: bool, options: dict) -> dict:
    """One local rank of `partition_data`."""
    dist.setup("cpu")
    try:
        return partition_shards(data, num_parts, out=out, progress=progress, **options)
    finally:
        dist.teardown()


def _refuse_shared_store_restarts() -> None:
    """Under torchrun --max-restarts, a restarted rank of this torch cannot join a store that the
    ranks share with torchrun (it reads the keys of the ranks before it, and waits): refused at
    the first start, not found out when a rank is lost."""
    if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) > 0 and \
            os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        raise GnndistError("torchrun --max-restarts: restarted ranks cannot join the store torchrun shares with "
                           "them (pytorch issue 135712); start torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "
                           "in its environment, and --rdzv-backend c10d or --standalone")


def _attempt_dir() -> Path:
    """This rank's folder in $GNNDIST_LAUNCH_ERRDIR: one per start of the ranks (the first, then
    each restart)."""
    d = Path(os.environ[ERRDIR], str(dist.restart_count()))
    d.mkdir(exist_ok=True)
    return d


def lost_rank() -> Optional[int]:
    """The rank whose failure made `launch` restart the ranks this time (None at a first start,
    under torchrun, or where it was not seen)."""
    errdir, count = os.environ.get(ERRDIR), dist.restart_count()
    if not errdir or count == 0:
        return None
    try:
        return int(Path(errdir, str(count - 1), "lost").read_text())
    except (OSError, ValueError):
        return None


def _thread_locks_only() -> None:
    """A rank draws its progress bars under a thread lock: tqdm's default, a multiprocessing lock,
    would make the launcher warn of a leaked semaphore when a rank is killed."""
    tqdm.set_lock(threading.RLock())


def _run_rank(cores: list[int], entrypoint: Callable[..., Any], *args: Any) -> Any:
    """Child side of `launch`: on its slice of the launcher's `cores` (`threads.rank_cores`), a
    user error leaves its one-line message in this start's folder of $GNNDIST_LAUNCH_ERRDIR (and
    this rank's pid, so that `launch` can end a rank that does not stop, and tell which one
    failed)."""
    mine = threads.rank_cores(cores, int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"]))
    if mine is not None:
        threads.pin(mine)
    errdir, r = _attempt_dir(), os.environ.get("RANK", "0")
    Path(errdir, f"pid-{r}").write_text(str(os.getpid()))
    _thread_locks_only()
    signal.signal(signal.SIGINT, _interrupt_once)
    try:
        return entrypoint(*args)  # an interrupt's note reaches `launch` from `_interrupt_once`
    except Exception as e:
        dist.post_failure(e)
        kind = "peer" if isinstance(e, dist.PeerFailure) else "own"
        line = first_line(e)
        with open(os.path.join(errdir, f"{kind}-{r}.txt"), "w") as f:
            f.write(line if kind == "peer" else f"rank {r}: {line}")
        if os.environ.get("GNNDIST_DEBUG") != "1":  # --debug: the rank's traceback too
            raise SystemExit(2) from None
        raise


def _interrupt_once(signum: int, frame: Any) -> None:
    """Ctrl-C reaches a rank twice (from the terminal, then forwarded by torch's launcher): the
    first interrupts it, the second would interrupt what it does about the first. Where the
    run's checkpoint replaced one, the note saying where it is kept is left for `launch` at
    once (the launcher may stop the rank before its interrupt has unwound)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    note = checkpoint.interrupt_note()
    if note:
        Path(_attempt_dir(), f"interrupted-{os.environ.get('RANK', '0')}.note").write_text(note)
    raise KeyboardInterrupt


def _newest_attempt(errdir: str) -> Optional[Path]:
    """The folder of the latest start of the ranks in `errdir` (None before the first)."""
    found = [int(f.name) for f in Path(errdir).iterdir() if f.name.isdigit() and f.is_dir()]
    return Path(errdir, str(max(found))) if found else None


def _ended_well(pid: int) -> bool:
    """Whether the ended child process `pid` is seen to have exited with status 0 (not where
    torch's launcher has collected it already: then how is not known). It stays for that
    launcher to collect."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return info is not None and info.si_code == os.CLD_EXITED and info.si_status == 0


def _watch_ranks(errdir: str, done: threading.Event, grace: float = 2.0) -> None:
    """Over each start of the ranks: note the rank whose process ends first, unless it ends well
    (its start's "lost" file, which the restarted ranks read: `lost_rank`; torch's launcher then
    stops the others); once a rank has left an error line, give the others `grace` seconds to
    leave theirs, then kill the ranks still running (torch's launcher would wait 30 s for a
    stuck or stopped one). A process's end is seen at once (a pidfd per rank)."""
    watched: dict[int, tuple[Path, str, int]] = {}  # pidfd -> (start folder, rank, pid)
    noted, ended, error_at = set(), set(), None
    poller = select.poll()
    try:
        while not done.is_set():
            attempt = _newest_attempt(errdir)
            for f in attempt.iterdir() if attempt is not None else ():
                if f.name.startswith("pid-") and (attempt, f.name) not in noted:
                    try:
                        pid = int(f.read_text())
                        fd = os.pidfd_open(pid)
                    except (ValueError, ProcessLookupError):  # being written, or gone already
                        continue
                    noted.add((attempt, f.name))
                    watched[fd] = (attempt, f.name[4:], pid)
                    poller.register(fd, select.POLLIN)
            for fd, _ in poller.poll(20):
                where, rank, pid = watched.pop(fd)
                poller.unregister(fd)
                os.close(fd)
                if not (where / "lost").exists() and not _ended_well(pid):
                    (where / "lost").write_text(rank)
            if attempt is None or attempt in ended or not any(f.suffix == ".txt" for f in attempt.iterdir()):
                continue
            error_at = error_at or time.monotonic()
            if time.monotonic() - error_at >= grace:
                for where, _, pid in watched.values():
                    if where == attempt:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                ended.add(attempt)
                error_at = None
    finally:
        for fd in watched:
            os.close(fd)


def launch(nproc: int, entrypoint: Callable[..., Any], *args: Any, max_restarts: int = 0) -> list[Any]:
    """Run `entrypoint(*args)` on `nproc` local ranks with torch's elastic launcher, each
    pinned to its slice of this process's cores (`threads.rank_cores`); where a rank fails, all
    are started again, up to `max_restarts` times (each restarted rank runs `entrypoint` again,
    with $TORCHELASTIC_RESTART_COUNT above 0).

    Returns the per-rank return values in rank order. If the ranks fail for good, raises
    `GnndistError` with the one-line reason of the rank that failed first (not of its peers'
    follow-up errors), within a few seconds of the ranks' own exits.
    """
    import logging
    import tempfile

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if os.environ.get("GNNDIST_DEBUG") != "1":  # torch's modules set their loggers' levels themselves
        for name in list(logging.root.manager.loggerDict):
            if name.startswith(("torch.distributed.elastic", "torch.multiprocessing")):
                logging.getLogger(name).setLevel(logging.CRITICAL)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id="gnndist",
                          rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", max_restarts=max_restarts,
                          monitor_interval=0.1, start_method="spawn")
    # as torchrun does: the ranks run on the same cores, so each gets its part (unless the user chose)
    cores = sorted(os.sched_getaffinity(0))  # each rank is pinned to its slice of them
    # restarted ranks join a store of their own (`_refuse_shared_store_restarts`)
    env = {"OMP_NUM_THREADS": str(max(1, len(cores) // nproc))} | (
        {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"} if max_restarts else {})
    env = {k: v for k, v in env.items() if k not in os.environ}
    with tempfile.TemporaryDirectory(prefix="gnndist-err-") as errdir:
        os.environ.update({ERRDIR: errdir, **env})
        done = threading.Event()
        watcher = threading.Thread(target=_watch_ranks, args=(errdir, done), daemon=True)
        watcher.start()
        try:
            out = elastic_launch(config, _run_rank)(cores, entrypoint, *args)
        except ChildFailedError as e:
            attempt = _newest_attempt(errdir)
            files = sorted((f for d in (Path(errdir), attempt) if d is not None for f in d.iterdir()
                            if f.suffix == ".txt"), key=lambda f: (not f.name.startswith("own"), f.name))
            if files:
                raise GnndistError(files[0].read_text()) from None
            rank_, failure = e.get_first_failure()
            host = dist.this_host("127.0.0.1")
            raise GnndistError(f"rank {rank_} (host {host}) {_exit_cause(failure.exitcode)}") from None
        except SignalException as e:  # Ctrl-C: torch's agent has stopped the ranks
            if e.sigval != signal.SIGINT:
                raise
            attempt = _newest_attempt(errdir)
            notes = sorted(f for f in attempt.iterdir() if f.suffix == ".note") if attempt else []
            note = notes[0].read_text() if notes else ""
            raise KeyboardInterrupt(note + (", and the other ranks' in theirs" if len(notes) > 1 else "")) from None
        finally:
            for k in (ERRDIR, *env):
                del os.environ[k]
            done.set()
            watcher.join()
    return [out[r] for r in sorted(out)]


def _exit_cause(code: int) -> str:
    """How a rank process ended, from its exit code (negative: the signal that killed it)."""
    if code < 0:
        try:
            return f"is gone: killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"is gone: killed by signal {-code}"
    return f"exited with code {code}"
