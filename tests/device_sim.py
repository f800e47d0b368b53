"""A CPU stand-in for a GPU, to count what a training step would make the host wait for
under CUDA. `SimulatedDevice` is a torch function mode that tracks which tensors live "on the
device": the model's parameters and gradients, the node state, whatever is created with
`device=` or moved with `.to(device)`, and every result computed from them. Host data
(numpy, tensors made without a device) stays apart. It counts the operations that synchronize
the host with a CUDA device when applied to a device tensor: reading values back (`item`,
`tolist`, `cpu`, `numpy`, `bool`/`int`/`float`, `to("cpu")`), and the ones whose output size
depends on the data (`unique`, `nonzero`, boolean-mask indexing, `bincount`, `repeat_interleave`
with tensor repeats, `masked_select`, `equal`)."""
from __future__ import annotations

import sys
import weakref
from collections import Counter
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

import gnndist.runtime.device

READS = {"item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "equal", "allclose"}
DATA_SIZED = {"unique", "unique_consecutive", "nonzero", "argwhere", "masked_select", "bincount"}
ROOT = Path(__file__).resolve().parent.parent


class SimulatedDevice(TorchFunctionMode):
    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = torch.device(device)
        self._on: dict[int, weakref.ref] = {}
        self.syncs: Counter = Counter()  # "file:line op" -> count
        self.counting = False

    # ------------------------------------------------------------------ which tensors are where
    def put(self, *tensors: torch.Tensor) -> None:
        """Declare tensors to live on the device."""
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self._on[id(t)] = weakref.ref(t)

    def on_device(self, t) -> bool:
        ref = self._on.get(id(t)) if isinstance(t, torch.Tensor) else None
        return ref is not None and ref() is t

    def put_module(self, module: torch.nn.Module) -> None:
        """Parameters and buffers, and each gradient as autograd writes it."""
        for p in module.parameters():
            self.put(p)
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(lambda q: self.put(q.grad))
        self.put(*module.buffers())

    # ------------------------------------------------------------------ the mode
    def __enter__(self):
        """The library takes its device path: no CPU-only code paths (see `gnndist.runtime.device.on_cpu_paths`)."""
        self._kernels, gnndist.runtime.device.CPU_PATHS = gnndist.runtime.device.CPU_PATHS, False
        return super().__enter__()

    def __exit__(self, *exc):
        gnndist.runtime.device.CPU_PATHS = self._kernels
        return super().__exit__(*exc)

    def _site(self) -> str:
        frame = sys._getframe(2)
        while frame is not None:
            path = Path(frame.f_code.co_filename)
            if ROOT in path.parents and path.parts[len(ROOT.parts)] not in ("tests", ".venv"):
                return f"{path.relative_to(ROOT)}:{frame.f_lineno}"
            frame = frame.f_back
        return "?"

    def _syncs(self, name: str, args: tuple, kwargs: dict) -> bool:
        first = args[0] if args else None
        if name in READS or name in DATA_SIZED:
            return self.on_device(first)
        if name in ("__getitem__", "__setitem__", "index_put", "index_put_"):
            index = args[1] if len(args) > 1 else None
            flat = tree_flatten(index)[0]
            return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool and self.on_device(i) for i in flat)
        if name == "repeat_interleave":
            repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
            return self.on_device(repeats) and kwargs.get("output_size") is None
        if name == "to":
            target = [a for a in list(args[1:]) + list(kwargs.values()) if isinstance(a, (str, torch.device))]
            return self.on_device(first) and any(torch.device(a).type == "cpu" and self.device.type != "cpu"
                                                 for a in target)
        return False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if self.counting and self._syncs(name, args, kwargs):
            self.syncs[f"{self._site()} {name}"] += 1
        out = func(*args, **kwargs)
        if name == "cpu" and out is args[0]:  # a copy on the host, as from a real device
            out = out.clone()
        inputs = tree_flatten((args, kwargs))[0]
        made_here = kwargs.get("device") is not None and torch.device(kwargs["device"]) == self.device
        moved = name == "to" and any(isinstance(a, (str, torch.device)) and torch.device(a) == self.device
                                     for a in list(args[1:]) + list(kwargs.values()))
        if made_here or moved or (name not in READS and any(self.on_device(t) for t in inputs)):
            self.put(*tree_flatten(out)[0])
        return out
