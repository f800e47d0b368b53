"""Temporal attention's two products with its keys, where each key is a row of a table picked by
an index (a neighbour's memory row), or one row per key (its context: time encoding, edge
features): the scores `table[index[r, j]] . u[h, r]` and the weighted sums
`sum_j w[r, j, h] table[index[r, j]]`. Per-head vectors (u, the sums) are head-major [H, R, C],
the layout of the batched per-head products around them, so none is copied into another.

On the CPU, numba kernels read the rows straight from the table and add the gradients straight
into the table's gradient, so the [R, k, C] gathered rows (2.4 MB for a TGN batch of 200
events: 600 rows of 10 keys of 100 values) and their gradients are never written out. That
memory traffic, more than the arithmetic, is what these products cost as an index_select and
batched matmuls of [k, C] x [C, H] matrices: a TGN epoch on UCI runs 11-19% more events/s
(README). On other devices, or with `gnndist.device.CPU_PATHS` off (as the host-sync tests do,
to follow the GPU path on the CPU), they run as exactly those torch operations.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from numba import njit
from torch import Tensor

from gnndist.device import on_cpu_paths


@njit(fastmath=True, cache=True, nogil=True)
def _scores(table, index, u, out):
    """out[r, j, h] = table[index[r, j]] . u[h, r], summed in float32 as the device path's
    batched products are: 88 us against 162 for float64 sums of a TGN batch's 6,000 keys of 100
    values (2026-12-05); the multi-rank runs of tests/test_temporal_dist.py stay within their
    bounds of one process (float64 sums had once been needed there)."""
    rows, k = index.shape
    for r in range(rows):
        for j in range(k):
            row = index[r, j]
            for h in range(u.shape[0]):
                acc = np.float32(0.0)
                for c in range(table.shape[1]):
                    acc += table[row, c] * u[h, r, c]
                out[r, j, h] = acc


@njit(fastmath=True, cache=True, nogil=True)
def _sums(w, table, index, out):
    """out[h, r] = sum_j w[r, j, h] table[index[r, j]] (zero weights skipped: masked keys)"""
    rows, k = index.shape
    out[:] = 0
    for r in range(rows):
        for j in range(k):
            row = index[r, j]
            for h in range(w.shape[2]):
                a = w[r, j, h]
                if a != 0:
                    for c in range(table.shape[1]):
                        out[h, r, c] += a * table[row, c]


@njit(fastmath=True, cache=True, nogil=True)
def _add_outer(w, u, index, out):
    """out[index[r, j]] += sum_h w[r, j, h] u[h, r]"""
    rows, k = index.shape
    for r in range(rows):
        for j in range(k):
            row = index[r, j]
            for h in range(w.shape[2]):
                a = w[r, j, h]
                if a != 0:
                    for c in range(u.shape[2]):
                        out[row, c] += a * u[h, r, c]


def load_kernels() -> None:
    """Compile (the first time on a machine) or load from numba's cache the kernels, for float32
    rows and int64 indices: what a first training step would otherwise pay."""
    table, index, w = np.zeros((1, 1), np.float32), np.zeros((1, 1), np.int64), np.zeros((1, 1, 1), np.float32)
    _scores(table, index, w, np.zeros((1, 1, 1), np.float32))
    _sums(w, table, index, np.zeros((1, 1, 1), np.float32))
    _add_outer(w, w, index, np.zeros((1, 1), np.float32))


def _host(t: Tensor) -> np.ndarray:
    return t.detach().contiguous().numpy()


def _run_scores(table: Tensor, index: Tensor, u: Tensor) -> Tensor:
    out = table.new_empty((*index.shape, u.shape[0]))
    _scores(_host(table), _host(index), _host(u), out.numpy())
    return out


def _run_sums(w: Tensor, table: Tensor, index: Tensor) -> Tensor:
    out = table.new_empty((w.shape[2], index.shape[0], table.shape[1]))
    _sums(_host(w), _host(table), _host(index), out.numpy())
    return out


def _table_grad(table: Tensor, w: Tensor, u: Tensor, index: Tensor) -> Tensor:
    grad = torch.zeros_like(table)
    _add_outer(_host(w), _host(u), _host(index), grad.numpy())
    return grad


class _Scores(torch.autograd.Function):
    @staticmethod
    def forward(ctx, table: Tensor, index: Tensor, u: Tensor) -> Tensor:
        ctx.save_for_backward(table, index, u)
        return _run_scores(table, index, u)

    @staticmethod
    def backward(ctx, grad: Tensor):
        table, index, u = ctx.saved_tensors
        return (_table_grad(table, grad, u, index) if ctx.needs_input_grad[0] else None, None,
                _run_sums(grad, table, index) if ctx.needs_input_grad[2] else None)


class _Sums(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w: Tensor, table: Tensor, index: Tensor) -> Tensor:
        ctx.save_for_backward(w, table, index)
        return _run_sums(w, table, index)

    @staticmethod
    def backward(ctx, grad: Tensor):
        w, table, index = ctx.saved_tensors
        return (_run_scores(table, index, grad) if ctx.needs_input_grad[0] else None,
                _table_grad(table, w, grad, index) if ctx.needs_input_grad[1] else None, None)


def _keys(table: Tensor, index: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """(table, index) with per-row keys [R, k, C] (index None) seen as a table of R * k rows."""
    if index is not None:
        return table, index
    r, k, c = table.shape
    return table.reshape(r * k, c), torch.arange(r * k, device=table.device).view(r, k)


def _gathered(table: Tensor, index: Optional[Tensor]) -> Tensor:
    """The keys [R, k, C] as one tensor (the device path)."""
    return table if index is None else table.index_select(0, index.reshape(-1)).view(*index.shape, table.shape[1])


def key_scores(table: Tensor, index: Optional[Tensor], u: Tensor) -> Tensor:
    """[R, k, H] scores of keys `table[index]` (table [T, C], index [R, k]; or index None and
    table [R, k, C], the keys themselves) against u [H, R, C]."""
    if on_cpu_paths(table, u):
        return _Scores.apply(*_keys(table, index), u)
    return torch.bmm(_gathered(table, index), u.permute(1, 2, 0))


def key_sums(w: Tensor, table: Tensor, index: Optional[Tensor]) -> Tensor:
    """[H, R, C] sums over each row's keys (as in `key_scores`) weighted by w [R, k, H]."""
    if on_cpu_paths(w, table):
        return _Sums.apply(w, *_keys(table, index))
    return torch.bmm(w.transpose(1, 2), _gathered(table, index)).transpose(0, 1)
