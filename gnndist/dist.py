"""The distributed runtime on torch.distributed: start-up, launch, batched exchanges.

Every collective runs under the process-group timeout (`GNNDIST_TIMEOUT`, seconds, default
300): a rank that dies or stalls makes the others fail with an error, never hang.
"""
from __future__ import annotations

import datetime
import os
import sys
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist

from gnndist.errors import GnndistError, first_line


def timeout_s() -> float:
    """Seconds every collective may take (GNNDIST_TIMEOUT, default 300)."""
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
    """Leave the process group (if joined)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def rank() -> int:
    """This process's rank (0 outside a process group)."""
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    """The number of ranks (1 outside a process group)."""
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


def log(msg: str) -> None:
    """Print on rank 0 only."""
    if rank() == 0:
        print(msg, file=sys.stderr, flush=True)


def sum_gradients(params: Sequence[torch.nn.Parameter], extra: Optional[torch.Tensor] = None
                  ) -> Optional[torch.Tensor]:
    """Replace each gradient by its sum over the ranks and return `extra` (e.g. the loss) summed
    with them, in one all-reduce. A parameter that no rank has a gradient for keeps none (as in
    one process, the optimizer then skips it)."""
    if world_size() == 1:
        return extra
    dev = params[0].device
    extra = torch.zeros(0, device=dev) if extra is None else extra.detach().reshape(-1).float().to(dev)
    flat = torch.cat([torch.zeros(p.numel(), device=dev) if p.grad is None else p.grad.reshape(-1) for p in params]
                     + [torch.tensor([p.grad is not None for p in params], dtype=torch.float32, device=dev), extra])
    all_reduce(flat)
    at = 0
    for p in params:
        p.grad = flat[at:at + p.numel()].view_as(p).clone()
        at += p.numel()
    has = flat[at:at + len(params)].tolist()
    for p, h in zip(params, has):
        if not h:
            p.grad = None
    return flat[at + len(params):]
