"""Starting a training job, the one path both trainers share: what its ranks train on (the
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

import dataclasses
import hashlib
import json
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional, Union

import numpy as np
import torch
from tqdm import tqdm

from gnndist import __version__, checkpoint
from gnndist.runtime import dist, threads
from gnndist.datasets import DataSource
from gnndist.errors import GnndistError, first_line
from gnndist.graph import MASKS, Graph, TemporalGraph
from gnndist.io import cache_root, show_progress
from gnndist.outputs import check_output, write_metrics
from gnndist.partition import files_missing, is_store, partition_graph, read_store_meta
from gnndist.runlog import require_tensorboard
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


@dataclass(frozen=True)
class Outputs:
    """Where a run writes: the metrics JSON (rank 0), the checkpoint folder (each epoch), and the
    TensorBoard folder (rank 0; `gnndist.runlog`)."""

    metrics_out: Optional[str] = None
    checkpoint: Optional[str] = None
    resume: bool = False
    log_dir: Optional[str] = None

    def check(self, data: "Data", rank_folders: int = 0) -> None:
        """Refuse, before any work, outputs that would overwrite the input or files gnndist did
        not write (`gnndist.outputs.check_output`), and a checkpoint folder the run would mix
        with another run's (`gnndist.checkpoint.check_folder`; `rank_folders`: W where each of
        W ranks writes a folder of its own, else 0)."""
        if self.resume and not self.checkpoint:
            raise GnndistError("--resume needs --checkpoint DIR")
        given = [(f, Path(p).resolve()) for f, p in (("--metrics-out", self.metrics_out),
                                                     ("--checkpoint", self.checkpoint), ("--log-dir", self.log_dir)) if p]
        for i, (flag_a, a) in enumerate(given):
            for flag_b, b in given[i + 1:]:
                if a == b or a in b.parents or b in a.parents:
                    raise GnndistError(f"{flag_a} and {flag_b} are " + (f"the same path ({a})" if a == b else
                                       f"nested paths ({a}, {b})") + ": give each output a place of its own")
        name = data.name if isinstance(data, DataSource) else data if isinstance(data, (str, os.PathLike)) else None
        if self.metrics_out:
            check_output(self.metrics_out, "metrics", [name])
        if self.checkpoint:
            check_output(self.checkpoint, "checkpoint", [name])
            checkpoint.check_folder(self.checkpoint, rank_folders, self.resume)
        if self.log_dir:
            check_output(self.log_dir, "log_dir", [name])
            require_tensorboard()


def check_store(path: Union[str, os.PathLike], kind: str, world: int) -> str:
    """`path`, a store of a `kind` graph with `world` parts, as a string; GnndistError otherwise."""
    meta = read_store_meta(path)
    if meta.get("kind") != kind:
        raise GnndistError(f"partition store {path} holds a {meta.get('kind')} graph; "
                           f"--task {TASK_OF_KIND[kind]} needs a {kind} one")
    if int(meta["num_parts"]) != world:
        raise GnndistError(f"partition store {path} has {meta['num_parts']} parts but {world} rank(s) run; "
                           f"use --nproc {meta['num_parts']}")
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


def _load(data: Union[DataSource, Graph, TemporalGraph], split: Split) -> Union[Graph, TemporalGraph]:
    """The graph of `data`, which must be of the kind the trainer takes (told before loading)."""
    kind = kind_of(data)
    if kind != split.kind:
        raise GnndistError(f"DATA is a {kind} graph: use --task {TASK_OF_KIND[kind]} (--task {TASK_OF_KIND[split.kind]} needs a "
                           f"{split.kind} graph)")
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


def check_own_part(path: Union[str, os.PathLike], rank: int) -> None:
    """A one-line error naming the first file this rank needs that the store on this host lacks:
    meta.json's top-level files (the id maps) and the files of part `rank`."""
    meta = read_store_meta(path)
    missing = files_missing(path, meta) + files_missing(path, meta, rank)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        host = dist.heartbeat().host if dist.heartbeat() else socket.gethostname()
        raise GnndistError(f"rank {rank} (host {host}): the partition store "
                           f"{path} on this host lacks {missing[0]}{more}: copy meta.json, orig_to_new.npy and "
                           f"part{rank}/ there from the host that partitioned (a host needs the id maps and the "
                           "parts of its own ranks)")


def _wait_for_store(path: Path) -> str:
    """`path` once this host's local rank 0 has written the store there (if it fails, torchrun
    stops this host's ranks)."""
    while not is_store(path):
        time.sleep(0.2)
    return str(path)


def rank_source(data: Data, world: int, split: Split, quiet: bool = False) -> Union[Graph, TemporalGraph, str]:
    """What one rank of `world` trains on: the graph (one rank, raw data) or a store folder.
    Under torchrun with raw data and W > 1, the local rank 0 of every node (host) makes the store
    in its own cache while the node's other ranks wait: every host partitions the same data the
    same way, and the start-up check of `run_job` compares the stores' checksums."""
    data = _normal(data)
    if world == 1 and not isinstance(data, Path):
        return _load(data, split)
    if world == 1 or isinstance(data, Path) or not dist.in_torchrun():
        return make_store(data, world, split, quiet)
    if dist.first_on_host():
        with dist.busy(f"partitioning into {world} parts"):
            return make_store(data, world, split, quiet)
    return _wait_for_store(store_dir(data, world, split))


def _fingerprint(store: str, args: tuple) -> dict:
    """What every rank of a job must share: the versions, the store's file checksums and the
    job's settings (the dataclass arguments other than `Outputs`, less `quiet`; one with a
    `fingerprint()`, e.g. a saved model, gives that), and whether it writes and resumes a
    checkpoint (the paths may differ between hosts)."""
    files = read_store_meta(store)["files"]
    config = {k: v for a in args if dataclasses.is_dataclass(a) and not isinstance(a, Outputs)
              for k, v in (a.fingerprint() if hasattr(a, "fingerprint") else dataclasses.asdict(a)).items()
              if k != "quiet"}
    config.update({flag: bool(getattr(o, flag[2:])) for o in args if isinstance(o, Outputs)
                   for flag in ("--checkpoint", "--resume")})
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


def check_same_job(store: str, args: tuple) -> None:
    """A start-up collective: every rank compares its `_fingerprint` with rank 0's; if one
    differs, every rank raises the same one-line error naming the first rank that differs."""
    w, me = dist.heartbeat(), dist.rank()
    mine = _fingerprint(store, args)
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
            f"{k} {v['mean']:.4f} ± {v['std']:.4f}" for k, v in summary.items() if k in ("ap", "auc", "mrr", "acc")),
            flush=True)
        if outputs.metrics_out:
            write_metrics(outputs.metrics_out, out)
    return out


def run_job(data: Data, nproc: int, split: Split, rank_fn: Callable[..., dict], *args: Any,
            device: str = "cpu", quiet: bool = False, rank_checkpoints: bool = False) -> dict:
    """`rank_fn(source, *args)` on every rank of the job, where `source` is what `rank_source`
    gives: in this process (nproc 1), on `nproc` local ranks, or on this rank of a torchrun world
    (which first checks, with every other rank, that they run the same job). Returns rank 0's
    result (this rank's under torchrun). Torch runs on `threads.job_threads` meanwhile.
    `rank_checkpoints`: each of W > 1 ranks writes its checkpoint to a folder of its own."""
    _refuse_rerun_script()
    dist.timeout_s()  # a bad GNNDIST_TIMEOUT is told before anything starts
    check("nproc", nproc, Int())
    check("device", device, OneOf(DEVICES))
    if not isinstance(data, (DataSource, Graph, TemporalGraph, str, os.PathLike)):
        raise GnndistError("the data must be a Graph, a TemporalGraph, a DataSource, a dataset name or a path, "
                           f"got {type(data).__name__}")
    outputs = next((a for a in args if isinstance(a, Outputs)), None)
    if outputs is not None:
        world = int(os.environ["WORLD_SIZE"]) if dist.in_torchrun() else nproc
        outputs.check(data, world if rank_checkpoints and world > 1 else 0)
    with threads.job_threads():
        if dist.in_torchrun():
            return _torchrun_rank(data, split, rank_fn, args, device, quiet)
        if nproc == 1:
            return rank_fn(rank_source(data, 1, split, quiet), *args)
        if device.startswith("cuda"):
            dist.rank_gpu(nproc - 1)  # told before the data is split and the ranks start
        return launch(nproc, rank_fn, make_store(data, nproc, split, quiet), *args)[0]


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


def _torchrun_rank(data: Data, split: Split, rank_fn: Callable[..., dict], args: tuple, device: str,
                   quiet: bool) -> dict:
    """This rank of a torchrun world: join, find this rank's data, check that every rank runs the
    same job, train; an error of its own is left in the job's store for the others to name."""
    world = int(os.environ["WORLD_SIZE"])
    _thread_locks_only()
    try:
        dist.setup(device)
        source = rank_source(data, world, split, quiet)
        if isinstance(source, str):
            check_own_part(source, dist.rank())
        if world > 1:
            check_same_job(source, args)
            rank0_host = dist.heartbeat().host_of(0)
            dist.say(f"running on part {dist.rank()} of {source} ({world} ranks)")
        result = rank_fn(source, *args)
    except Exception as e:
        dist.post_failure(e)
        who = dist.line_prefix()
        dist.teardown()  # its groups' threads end before the interpreter does (as on success)
        own = isinstance(e, GnndistError) and not isinstance(e, dist.PeerFailure) and not str(e).startswith("rank ")
        if own and who:
            raise GnndistError(who + first_line(e)) from None  # its own error: which rank, on which host
        raise
    if world > 1 and not dist.writes_outputs():
        dist.say(f"done; rank 0 (host {rank0_host}) prints the results and writes the output files, if given there")
    return result


def _thread_locks_only() -> None:
    """A rank draws its progress bars under a thread lock: tqdm's default, a multiprocessing lock,
    would make the launcher warn of a leaked semaphore when a rank is killed."""
    tqdm.set_lock(threading.RLock())


def _run_rank(cores: list[int], entrypoint: Callable[..., Any], *args: Any) -> Any:
    """Child side of `launch`: on its slice of the launcher's `cores` (`threads.rank_cores`), a
    user error leaves its one-line message in the folder $GNNDIST_LAUNCH_ERRDIR (and this rank's
    pid, so that `launch` can end a rank that does not stop)."""
    mine = threads.rank_cores(cores, int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"]))
    if mine is not None:
        threads.pin(mine)
    errdir, r = os.environ[ERRDIR], os.environ.get("RANK", "0")
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
        Path(os.environ[ERRDIR], f"interrupted-{os.environ.get('RANK', '0')}.note").write_text(note)
    raise KeyboardInterrupt


def _end_stragglers(errdir: str, done: threading.Event, grace: float = 2.0) -> None:
    """Once a rank has left an error line, give the others `grace` seconds to leave theirs, then
    kill the ranks still running: torch's launcher would wait 30 s for a stuck or stopped one."""
    while not done.wait(0.1):
        if any(f.endswith(".txt") for f in os.listdir(errdir)):
            if done.wait(grace):
                return
            for f in os.listdir(errdir):
                if f.startswith("pid-"):
                    try:
                        os.kill(int(Path(errdir, f).read_text()), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
            return


def launch(nproc: int, entrypoint: Callable[..., Any], *args: Any) -> list[Any]:
    """Run `entrypoint(*args)` on `nproc` local ranks with torch's elastic launcher, each
    pinned to its slice of this process's cores (`threads.rank_cores`).

    Returns the per-rank return values in rank order. If a rank fails, raises `GnndistError`
    with the one-line reason of the rank that failed first (not of its peers' follow-up errors),
    within a few seconds of the ranks' own exits.
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
                          rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", max_restarts=0,
                          monitor_interval=0.1, start_method="spawn")
    # as torchrun does: the ranks run on the same cores, so each gets its part (unless the user chose)
    cores = sorted(os.sched_getaffinity(0))  # each rank is pinned to its slice of them
    omp = os.environ.get("OMP_NUM_THREADS")
    if omp is None:
        os.environ["OMP_NUM_THREADS"] = str(max(1, len(cores) // nproc))
    with tempfile.TemporaryDirectory(prefix="gnndist-err-") as errdir:
        os.environ[ERRDIR] = errdir
        done = threading.Event()
        reaper = threading.Thread(target=_end_stragglers, args=(errdir, done), daemon=True)
        reaper.start()
        try:
            out = elastic_launch(config, _run_rank)(cores, entrypoint, *args)
        except ChildFailedError as e:
            files = sorted((f for f in os.listdir(errdir) if f.endswith(".txt")),
                           key=lambda f: (not f.startswith("own"), f))
            if files:
                with open(os.path.join(errdir, files[0])) as f:
                    raise GnndistError(f.read()) from None
            rank_, failure = e.get_first_failure()
            host = dist.this_host("127.0.0.1")
            raise GnndistError(f"rank {rank_} (host {host}) {_exit_cause(failure.exitcode)}") from None
        except SignalException as e:  # Ctrl-C: torch's agent has stopped the ranks
            if e.sigval != signal.SIGINT:
                raise
            notes = sorted(f for f in os.listdir(errdir) if f.endswith(".note"))
            note = Path(errdir, notes[0]).read_text() if notes else ""
            raise KeyboardInterrupt(note + (", and the other ranks' in theirs" if len(notes) > 1 else "")) from None
        finally:
            del os.environ[ERRDIR]
            done.set()
            reaper.join()
            if omp is None:
                del os.environ["OMP_NUM_THREADS"]
    return [out[r] for r in sorted(out)]


def _exit_cause(code: int) -> str:
    """How a rank process ended, from its exit code (negative: the signal that killed it)."""
    if code < 0:
        try:
            return f"is gone: killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"is gone: killed by signal {-code}"
    return f"exited with code {code}"
