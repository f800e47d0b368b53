"""Host data onto the compute device without making the host wait."""
from __future__ import annotations

import numpy as np
import torch


def to_device(a: np.ndarray | torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """Host array or tensor `a` on `device`: on CUDA through pinned memory, copied without
    blocking (the host goes on while the copy runs); on the CPU its own memory."""
    t = a if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a))
    if torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)
