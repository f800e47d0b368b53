"""The memory check both trainers go through, before they allocate their tensors.

Each model family sizes its own tensors (gnndist/temporal/footprint.py,
gnndist/static/footprint.py), and this module imports neither.

A `Footprint` lists what one rank of a trainer allocates: `Part`s with their bytes and the flag
that sizes each. `memory_checked` wraps a trainer's `__init__`: it refuses, with the estimate, a
setting that cannot fit in the memory available (shared by the ranks on this host; the GPU's
free memory for CUDA tensors), and turns an allocation that fails anyway into one line naming
what was being built. `model_bytes` and `sizing` are the parts both estimates share: a model's
parameters with their training copies, counted on torch's `meta` device.
"""
from __future__ import annotations

import functools
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import torch

from gnndist.errors import GnndistError, allocating
from gnndist.partition.stats import available_memory_bytes, fmt_bytes

TRAINING_COPIES = 3  # of a trainable parameter, beside itself: its gradient and Adam's two moments


@dataclass(frozen=True)
class Part:
    """One thing a rank allocates: its bytes, the flag that sizes it, and whether it lives on
    the training device (else in host memory)."""

    label: str
    nbytes: int
    flag: str
    on_device: bool = True


@dataclass
class Footprint:
    """What one rank of a trainer allocates (see the module docstring)."""

    what: str  # e.g. "the tgn trainer"
    device: torch.device
    parts: list[Part] = field(default_factory=list)

    def summary(self, parts: Optional[list[Part]] = None) -> str:
        """The parts that take memory and their sizes, e.g. "model 1.0 GiB, node state 2.0 MiB"."""
        return ", ".join(f"{p.label} {fmt_bytes(p.nbytes)}" for p in (self.parts if parts is None else parts)
                         if p.nbytes)

    def check(self) -> None:
        """GnndistError with the estimate when the parts cannot fit in the memory available now."""
        gpu = self.device.type == "cuda"
        pools = [([p for p in self.parts if p.on_device], torch.cuda.mem_get_info(self.device)[0], 1,
                  f"free on {self.device}")] if gpu else []
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        pools.append(([p for p in self.parts if not (gpu and p.on_device)], available_memory_bytes(),
                      local_ranks, "available"))
        for parts, avail, ranks, where in pools:
            need = sum(p.nbytes for p in parts)
            if avail is None or need * ranks <= avail:
                continue
            host = f", {fmt_bytes(need * ranks)} for the {ranks} ranks on this host" if ranks > 1 else ""
            biggest = max(parts, key=lambda p: p.nbytes)
            raise GnndistError(f"{self.what} needs an estimated {fmt_bytes(need)} of memory per rank{host} "
                               f"({self.summary(parts)}) but {fmt_bytes(avail)} is {where}; lower {biggest.flag}")


def model_bytes(model: torch.nn.Module) -> int:
    """Parameters, and the gradients and Adam moments of the trainable ones."""
    return sum(p.numel() * p.element_size() * (1 + TRAINING_COPIES * p.requires_grad) for p in model.parameters())


@contextmanager
def sizing(what: str, flags: str) -> Iterator[None]:
    """Build on the meta device (shapes only); sizes beyond what torch can count are refused,
    naming `flags`."""
    try:
        with torch.device("meta"):
            yield
    except (RuntimeError, TypeError, OverflowError) as e:  # torch cannot count the elements
        if "overflow" not in str(e).lower():
            raise
        raise GnndistError(f"{what} is too large to allocate on any machine (its sizes overflow 64-bit counts); "
                           f"lower {flags}") from None


def memory_checked(footprint: Callable[..., Footprint]) -> Callable:
    """Decorate a trainer's `__init__(self, *args)`: before it runs, refuse with the estimate when
    `footprint(*args)` cannot fit; an allocation failing inside it becomes one line naming it."""
    def decorate(init: Callable) -> Callable:
        @functools.wraps(init)
        def checked(self, *args: Any, **kwargs: Any) -> None:
            fp = footprint(*args, **kwargs)
            fp.check()
            with allocating(f"{fp.what} (estimated {fp.summary()})"):
                init(self, *args, **kwargs)
        return checked
    return decorate
