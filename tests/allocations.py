"""The most memory a block of code holds at once on the CPU, beyond what it was given: torch
tensors (every storage an operator makes, from when it is made until nothing holds it) plus the
host memory that tracemalloc sees (numpy arrays, Python objects), each counted from zero when
the block starts. Exact for the tensors, whatever the allocator or the process's resident size,
so that a memory estimate can be checked against it on small settings (tests/test_footprint.py)."""
from __future__ import annotations

import tracemalloc

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class TensorPeak(TorchDispatchMode):
    """The peak bytes of the tensor storages that operators make inside the block and that are
    alive at once (`peak`); storages an operator only writes or views (in place, `out=`, a
    slice of its input) were made before and do not count. Tensors made in other threads do
    not count either: run the block in one thread."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.now = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        given = {StorageWeakRef(t.untyped_storage()).cdata for t in tree_leaves((args, kwargs))
                 if isinstance(t, torch.Tensor) and t.device.type != "meta"}
        out = func(*args, **kwargs)
        for key in [k for k, (ref, _) in self.live.items() if ref.expired()]:
            self.now -= self.live.pop(key)[1]
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            ref = StorageWeakRef(storage)
            if ref.cdata not in given and ref.cdata not in self.live:
                self.live[ref.cdata] = (ref, storage.nbytes())
                self.now += storage.nbytes()
        self.peak = max(self.peak, self.now)
        return out


class PeakMemory:
    """`with PeakMemory() as m: ...`, then `m.tensors`, `m.host` (tracemalloc's peak) and
    `m.total`, their sum (an upper bound on what was held at once: the two peaks may fall at
    different times)."""

    def __enter__(self) -> "PeakMemory":
        self._mode = TensorPeak()
        tracemalloc.start()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        self.host = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        self.tensors = self._mode.peak
        self.total = self.tensors + self.host
