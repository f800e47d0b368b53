"""The distributed runtime on torch.distributed: start-up, launch, batched exchanges.

Every collective runs under the process-group timeout (`GNNDIST_TIMEOUT`, seconds, default
300): a rank that dies or stalls makes the others fail with an error, never hang.
"""
from __future__ import annotations

import datetime
import os
import sys
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from gnndist.errors import GnndistError, first_line


def timeout_s() -> float:
    return float(os.environ.get("GNNDIST_TIMEOUT", "300"))


def in_torchrun() -> bool:
    """True when started by torchrun or the elastic launcher (the env names a world)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def setup(device: str = "cpu") -> torch.device:
    """Join the process group described by the environment (gloo on CPU, NCCL on CUDA).

    Outside torchrun this is a no-op and the world is one process. Returns the device this
    rank computes on.
    """
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise GnndistError("--device cuda given but CUDA is not available")
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    else:
        dev = torch.device("cpu")
    if in_torchrun() and not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s()),
                                **({"device_id": dev} if dev.type == "cuda" else {}))
    return dev


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _check(op: str, fn: Callable[[], Any]) -> Any:
    """Run a collective; turn a timeout or a dead peer into one clear error naming the op."""
    try:
        return fn()
    except (RuntimeError, dist.DistBackendError) as e:  # gloo/nccl report peers' failures so
        first = first_line(e)
        raise PeerFailure(f"rank {rank()}: collective {op} failed (a peer rank died or stalled "
                           f"past {timeout_s():.0f}s): {first}") from e


def all_reduce(t: torch.Tensor, op: str = "sum", group: Any = None) -> torch.Tensor:
    """In-place all-reduce (`sum` or `max`) over `group` (default: the world); identity in a
    1-process world."""
    if world_size() > 1:
        red = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]
        _check(f"all_reduce({op})", lambda: dist.all_reduce(t, op=red, group=group))
    return t


def agree_max(n: int, device: torch.device | str = "cpu") -> int:
    """The largest `n` over all ranks (e.g. the step count every rank must run)."""
    return int(all_reduce(torch.tensor([n], dtype=torch.int64, device=device), "max").item())


def all_gather_varsize(t: torch.Tensor) -> list[torch.Tensor]:
    """Gather a tensor whose first dimension differs between ranks; list indexed by rank."""
    w = world_size()
    if w == 1:
        return [t]
    n = torch.tensor([t.shape[0]], dtype=torch.int64, device=t.device)
    sizes = [torch.zeros_like(n) for _ in range(w)]
    _check("all_gather(sizes)", lambda: dist.all_gather(sizes, n))
    sizes = [int(s.item()) for s in sizes]
    m = max(sizes)
    pad = torch.zeros((m, *t.shape[1:]), dtype=t.dtype, device=t.device)
    pad[: t.shape[0]] = t
    out = [torch.empty_like(pad) for _ in range(w)]
    _check("all_gather", lambda: dist.all_gather(out, pad.contiguous()))
    return [o[:s] for o, s in zip(out, sizes)]


def exchange(send: Sequence[torch.Tensor], group: Any = None) -> list[torch.Tensor]:
    """Send `send[r]` to rank r and return what each rank sent here, in one batched
    `all_to_all_single` (row counts exchanged first). Tensors share dtype and trailing shape.
    `group`: a process group spanning all ranks (default: the default group)."""
    w = world_size()
    if len(send) != w:
        raise ValueError(f"exchange needs one tensor per rank ({w}), got {len(send)}")
    if w == 1:
        return [send[0]]
    ref = send[0]
    in_sizes = torch.tensor([s.shape[0] for s in send], dtype=torch.int64, device=ref.device)
    out_sizes = torch.empty_like(in_sizes)
    _check("all_to_all(sizes)", lambda: dist.all_to_all_single(out_sizes, in_sizes, group=group))
    in_split, out_split = in_sizes.tolist(), out_sizes.tolist()
    flat_in = torch.cat([s.reshape(s.shape[0], *ref.shape[1:]) for s in send]).contiguous()
    flat_out = torch.empty((sum(out_split), *ref.shape[1:]), dtype=ref.dtype, device=ref.device)
    _check("all_to_all", lambda: dist.all_to_all_single(flat_out, flat_in, out_split, in_split, group=group))
    return list(flat_out.split(out_split))


class PeerFailure(GnndistError):
    """A collective failed because another rank died or stalled."""


def _run_rank(errdir: str, entrypoint: Callable[..., Any], *args: Any) -> Any:
    """Child side of `launch`: a user error leaves its one-line message in `errdir`."""
    try:
        return entrypoint(*args)
    except Exception as e:
        kind = "peer" if isinstance(e, PeerFailure) else "own"
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


def log(msg: str) -> None:
    """Print on rank 0 only."""
    if rank() == 0:
        print(msg, file=sys.stderr, flush=True)
