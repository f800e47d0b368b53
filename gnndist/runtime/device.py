"""Host data onto the compute device without making the host wait, and which tensors take the
CPU-only code paths."""
from __future__ import annotations

import numpy as np
import torch

CPU_PATHS = True  # False: CPU tensors take the device path too (as the host-sync tests do)


def on_cpu_paths(*tensors: torch.Tensor) -> bool:
    """Whether these tensors take the CPU-only code paths: numba kernels that read them as
    numpy arrays, and selections whose size depends on the data (a wait for the host on a
    device). True when all are on the CPU and `CPU_PATHS` is on."""
    return CPU_PATHS and all(t.device.type == "cpu" for t in tensors)


def to_device(a: np.ndarray | torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """Host array or tensor `a` on `device`: on CUDA through pinned memory, copied without
    blocking (the host goes on while the copy runs); on the CPU its own memory."""
    t = a if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a))
    if torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)
