"""Temporal attention over keys (`attend`): each key has a context part, one row per key (time
encoding, edge features), and optionally a node part, a row of a table picked by an index (a
neighbour's memory row). Per row r and head h, its score is
`scale * (u_c[h, r] . context[r, j] + u_k[h, r] . table[index[r, j]])`, softmax over the row's
valid keys gives the weights a[r, j, h], and the outputs are the weighted sums of both parts and
of the weights. Per-head vectors (u, the sums) are head-major [H, R, C], the layout of the
batched per-head products around them, so none is copied into another.

On the CPU one numba kernel does all of it, and one more its backward pass: the keys' rows are
read straight from the table (the [R, k, C] gathered rows, 2.4 MB for a TGN batch of 200 events,
are never written out) and the table's gradient is added in place. In their place the scores
and the sums as kernels of their own, with torch's masking, softmax and sums between them
(about ten more operations forward and fifteen backward, each writing its output out), ran a
UCI TGN epoch slower (docs/benchmarks.md, "Measurements behind the code"). On other devices, or with
`gnndist.runtime.device.CPU_PATHS` off (as the host-sync tests do, to follow the GPU path on the CPU),
`attend` runs as torch operations on the gathered keys: batched products, softmax, batched
products.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from numba import njit
from torch import Tensor
from torch.autograd.function import once_differentiable

from gnndist.runtime.device import on_cpu_paths

MASKED = -1e30  # the score of a masked key, before scaling (the torch path's)


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def _attend(u_c, context, u_k, table, index, mask, scales, attn, agg_c, agg_k, weight):
    """attn[r, j, h]: the weights (0 for masked keys, and for all keys of a row without a valid
    one); agg_c[h, r] = sum_j attn context[r, j]; agg_k[h, r] = sum_j attn table[index[r, j]]
    (an empty table: no node part); weight[h, r] = sum_j attn. `scales`: the scale, as a
    1-element array of the rows' type (sums in that type)."""
    rows, k = mask.shape
    node, scale = table.shape[0] > 0, scales[0]
    agg_c[:] = 0
    agg_k[:] = 0
    weight[:] = 0
    for r in range(rows):
        for h in range(u_c.shape[0]):
            top = scale * np.float32(MASKED)  # of the rows' type
            for j in range(k):
                if mask[r, j]:
                    s = np.float32(0.0)
                    for c in range(context.shape[2]):
                        s += u_c[h, r, c] * context[r, j, c]
                    if node:
                        row = index[r, j]
                        for c in range(table.shape[1]):
                            s += u_k[h, r, c] * table[row, c]
                    s *= scale
                    attn[r, j, h] = s
                    top = max(top, s)
            total = np.float32(0.0)
            for j in range(k):
                if mask[r, j]:
                    e = np.exp(attn[r, j, h] - top)
                    attn[r, j, h] = e
                    total += e
                else:
                    attn[r, j, h] = 0
            for j in range(k):
                if mask[r, j]:
                    a = attn[r, j, h] / total
                    attn[r, j, h] = a
                    weight[h, r] += a
                    for c in range(context.shape[2]):
                        agg_c[h, r, c] += a * context[r, j, c]
                    if node:
                        row = index[r, j]
                        for c in range(table.shape[1]):
                            agg_k[h, r, c] += a * table[row, c]


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def _attend_grad(u_c, context, u_k, table, index, mask, scales, attn, g_c, g_k, g_w,
                 d_uc, d_context, d_uk, d_table):
    """The gradients of `_attend`'s inputs given those of its outputs (g_c, g_k, g_w): d_uc,
    d_uk [H, R, C] written, d_context [R, k, C] (if not empty) written, d_table [T, C] (if not
    empty) added to. Softmax backward: ds = a (da - sum_j a da). As the ds of a row sum to 0,
    d_u sums ds (key - the row's first valid key): what is the same in all keys of a row (a
    time encoding's dimension too slow to tell them apart, say) moves all its scores alike,
    which softmax ignores, and gets exactly no gradient, as in exact arithmetic, instead of
    float noise that Adam would make into steps."""
    rows, k = mask.shape
    node, scale = table.shape[0] > 0, scales[0]
    want_context, want_table = d_context.shape[0] > 0, d_table.shape[0] > 0
    da = np.empty(k, attn.dtype)
    d_uc[:] = 0
    d_uk[:] = 0
    d_context[:] = 0
    for r in range(rows):
        for h in range(u_c.shape[0]):
            dot, first = np.float32(0.0), -1
            for j in range(k):
                if mask[r, j]:
                    first = j if first < 0 else first
                    d = g_w[h, r]  # the key's dot with the outputs' gradient: written out, as the score's
                    for c in range(context.shape[2]):  # (through a shared function both ran at 60%)
                        d += g_c[h, r, c] * context[r, j, c]
                    if node:
                        row = index[r, j]
                        for c in range(table.shape[1]):
                            d += g_k[h, r, c] * table[row, c]
                    da[j] = d
                    dot += attn[r, j, h] * d
            for j in range(k):
                if mask[r, j]:
                    a = attn[r, j, h]
                    ds = a * (da[j] - dot) * scale
                    for c in range(context.shape[2]):
                        d_uc[h, r, c] += ds * (context[r, j, c] - context[r, first, c])
                    if want_context:
                        for c in range(context.shape[2]):
                            d_context[r, j, c] += ds * u_c[h, r, c] + a * g_c[h, r, c]
                    if node:
                        row, ref = index[r, j], index[r, first]
                        for c in range(table.shape[1]):
                            d_uk[h, r, c] += ds * (table[row, c] - table[ref, c])
                        if want_table:
                            for c in range(table.shape[1]):
                                d_table[row, c] += ds * u_k[h, r, c] + a * g_k[h, r, c]


def load_kernels() -> None:
    """Compile (the first time on a machine) or load from numba's cache the kernels, for float32
    rows and int64 indices: what a first training step would otherwise pay."""
    f1, f2, f3 = np.zeros((1, 1), np.float32), np.zeros((1, 1, 1), np.float32), np.zeros((1, 1), np.int64)
    mask, scale = np.ones((1, 1), np.bool_), np.ones(1, np.float32)
    _attend(f2, f2, f2, f1, f3, mask, scale, f2.copy(), f2.copy(), f2.copy(), f1.copy())
    _attend_grad(f2, f2, f2, f1, f3, mask, scale, f2, f2, f2, f1, f2.copy(), f2.copy(), f2.copy(), f1.copy())


def _host(t: Tensor) -> np.ndarray:
    return t.detach().contiguous().numpy()


class _Attend(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u_c: Tensor, context: Tensor, u_k: Tensor, table: Tensor, index: Tensor, mask: Tensor,
                scale: float) -> tuple[Tensor, Tensor, Tensor]:
        h, r = u_c.shape[:2]
        attn = u_c.new_empty((*mask.shape, h))
        agg_c, agg_k, weight = u_c.new_empty(u_c.shape), u_c.new_empty((h, r, table.shape[1])), u_c.new_empty((h, r))
        ctx.scales = np.full(1, scale, attn.numpy().dtype)
        _attend(_host(u_c), _host(context), _host(u_k), _host(table), _host(index), _host(mask), ctx.scales,
                attn.numpy(), agg_c.numpy(), agg_k.numpy(), weight.numpy())
        ctx.save_for_backward(u_c, context, u_k, table, index, mask, attn)
        return agg_c, agg_k, weight

    @staticmethod
    @once_differentiable  # a second derivative raises instead of coming out as zero
    def backward(ctx, g_c: Tensor, g_k: Tensor, g_w: Tensor):
        u_c, context, u_k, table, index, mask, attn = ctx.saved_tensors
        want_context, want_table = ctx.needs_input_grad[1], ctx.needs_input_grad[3]
        d_uc, d_uk = u_c.new_empty(u_c.shape), u_k.new_empty(u_k.shape)
        d_context = context.new_empty(context.shape if want_context else (0, 1, 1))
        d_table = table.new_zeros(table.shape if want_table else (0, 1))  # contiguous: one kernel signature
        _attend_grad(_host(u_c), _host(context), _host(u_k), _host(table), _host(index), _host(mask), ctx.scales,
                     attn.numpy(), _host(g_c), _host(g_k), _host(g_w), d_uc.numpy(), d_context.numpy(), d_uk.numpy(),
                     d_table.numpy())
        return (d_uc, d_context if want_context else None, d_uk if ctx.needs_input_grad[2] else None,
                d_table if want_table else None, None, None, None)


def _gathered(table: Tensor, index: Tensor) -> Tensor:
    """The node parts of the keys [R, k, C] as one tensor (the device path)."""
    return table.index_select(0, index.reshape(-1)).view(*index.shape, table.shape[1])


def attend(u_c: Tensor, context: Tensor, u_k: Optional[Tensor], table: Optional[Tensor], index: Optional[Tensor],
           mask: Tensor, scale: float, drop: torch.nn.Module) -> tuple[Tensor, Optional[Tensor], Tensor]:
    """(agg_c [H, R, Cc], agg_k [H, R, Ck] or None, weight [H, R]): the attention of each row r
    over its k keys (see the module docstring), with u_c [H, R, Cc] against context [R, k, Cc]
    and u_k [H, R, Ck] against table [T, Ck] by index [R, k] (None: keys without a node part),
    mask [R, k] (True = valid), the weights through `drop` (dropout, or none)."""
    if on_cpu_paths(u_c, context) and not (drop.training and drop.p > 0):
        node = table is not None
        if not node:
            u_k, table = u_c.new_zeros((*u_c.shape[:2], 0)), u_c.new_zeros((0, 0))
            index = torch.zeros_like(mask, dtype=torch.long)
        agg_c, agg_k, weight = _Attend.apply(u_c, context, u_k, table, index, mask, scale)
        return agg_c, (agg_k if node else None), weight
    score = torch.bmm(context, u_c.permute(1, 2, 0))  # [R, k, H]
    if table is not None:
        score = score + torch.bmm(_gathered(table, index), u_k.permute(1, 2, 0))
    m = mask.unsqueeze(-1)
    attn = drop(torch.softmax(score.masked_fill(~m, MASKED) * scale, dim=1) * m)  # [R, k, H]
    agg_c = torch.bmm(attn.transpose(1, 2), context).transpose(0, 1)
    agg_k = None if table is None else torch.bmm(attn.transpose(1, 2), _gathered(table, index)).transpose(0, 1)
    return agg_c, agg_k, attn.sum(1).t()
