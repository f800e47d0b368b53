"""The time encoder of every temporal model: `cos(w * dt + b)` per dimension, with fixed
frequencies (TGAT's initialisation, kept fixed as in GraphMixer).

The argument is formed and reduced to [-pi, pi] in float64 before the cosine is taken in
float32. Unix-second deltas reach 1e7 and more, where a float32 product `w * dt` is off by a
radian: PyG's float32 encoder gives noise in its fastest dimensions, this one the cosine of the
true argument (within 1e-6). On the CPU a numba kernel does it (the cosine an even polynomial
on [-pi, pi], vectorized): faster than torch's cosine of a TGN batch's arguments, which takes
its slow path for large ones (docs/benchmarks.md, "Measurements behind the code"). Elsewhere, or with
`gnndist.runtime.device.CPU_PATHS` off, torch operations compute the same.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit
from torch import Tensor, nn

from gnndist.runtime import device

# cos(y) = sum_n (-1)^n y^(2n) / (2n)!, highest term first: within 4e-9 on [-pi, pi]
_COS_TERMS = np.array([(-1) ** n / math.factorial(2 * n) for n in range(9, -1, -1)], np.float32)


@njit(fastmath=True, cache=True, nogil=True)
def _cos_encode(t, w, b, out):
    """out[i, j] = cos(t[i] w[j] + b[j]) (w, b float64)"""
    for i in range(t.shape[0]):
        ti = np.float64(t[i])
        for j in range(w.shape[0]):
            x = ti * w[j] + b[j]
            r = x - np.floor(x / (2 * np.pi) + 0.5) * (2 * np.pi)  # off [-pi, pi] only where |x| > 2**52
            out[i, j] = np.float32(min(max(r, -np.pi), np.pi))  # where the phase is lost anyway, as in torch
        for j in range(w.shape[0]):  # a loop of its own: the float32 polynomial vectorizes
            y2 = out[i, j] * out[i, j]
            p = _COS_TERMS[0]
            for c in range(1, _COS_TERMS.size):
                p = p * y2 + _COS_TERMS[c]
            out[i, j] = p


def load_kernel() -> None:
    """Compile (the first time on a machine) or load from numba's cache the CPU kernel, for
    float32 times: what a first training step would otherwise pay."""
    _cos_encode(np.zeros(1, np.float32), np.zeros(1), np.zeros(1), np.zeros((1, 1), np.float32))


class FixedTimeEncoder(nn.Module):
    """PyG's `TimeEncoder` (`cos(lin(dt))`, the same parameters and state dict), computed with
    the argument reduced in float64 (see the module docstring). A class of its own rather than a
    subclass, so that a temporal rank never imports torch_geometric, whose import would add to
    every rank's start time and resident memory for nothing else it uses."""

    def __init__(self, out_channels: int):
        super().__init__()
        self.out_channels = out_channels
        self.lin = nn.Linear(1, out_channels)

    def forward(self, t: Tensor) -> Tensor:
        w, b = self.lin.weight.view(-1), self.lin.bias
        if not t.requires_grad and not w.requires_grad and device.on_cpu_paths(t, w):
            out = torch.empty((t.numel(), w.numel()))
            _cos_encode(t.detach().reshape(-1).contiguous().numpy(), w.double().numpy(), b.double().numpy(),
                        out.numpy())
            return out.view(*t.shape, w.numel())
        x = torch.addcmul(b.double(), t.double().unsqueeze(-1), w.double())
        return torch.remainder(x, 2 * math.pi).float().cos()


def time_encoder(dim: int) -> FixedTimeEncoder:
    """The `cos(w * dt + b)` encoder with fixed frequencies 1 .. 1e-9 (one per dimension), so
    that deltas from seconds to decades are told apart."""
    enc = FixedTimeEncoder(dim)
    with torch.no_grad():
        enc.lin.weight.copy_(torch.logspace(0, -9, dim).view(dim, 1))
        enc.lin.bias.zero_()
    return enc.requires_grad_(False)
