"""Building blocks of the temporal GNNs, one concept each (as PyG's `nn/models/tgn.py`): batched
temporal attention over padded neighbour lists, memory updaters (a recurrent
cell over the last mail, or attention over the mailbox), embedding modules (graph attention,
JODIE's time projection), the link predictor, and `last_per_node`."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gnndist.runtime.device import on_cpu_paths
from gnndist.temporal.attention import attend


class TemporalAttention(nn.Module):
    """Multi-head attention of each query row over its k padded keys, plus a linear skip of the
    query (as PyG's TransformerConv, which PyG's TGN uses). A key is a node part, given as rows
    of a `table` picked by `index`, and a context part (edge features, time encoding).

    Keys are never projected one by one: a head's score is (W_k^T q) . key and its value
    W_v (sum_j a_j key_j) + b_v, the same algebra as projecting every key first, with k times
    fewer multiplications; the scores, their softmax and the weighted sums are one step
    (`gnndist.temporal.attention.attend`), which reads the keys' node part from the table by index.
    (A key bias would add the same amount to all of a query's
    scores, which softmax ignores, so there is none.) Rows with no valid key get a zero
    attended value.
    """

    def __init__(self, query_dim: int, key_dim: int, context_dim: int, out_dim: int, heads: int = 2,
                 dropout: float = 0.0) -> None:
        super().__init__()
        if out_dim % heads:
            raise ValueError(f"out_dim {out_dim} must be divisible by heads {heads}")
        self.heads = heads
        self.q = nn.Linear(query_dim, out_dim)
        self.k = nn.Linear(key_dim, out_dim, bias=False)
        self.k_context = nn.Linear(context_dim, out_dim, bias=False)
        self.v = nn.Linear(key_dim, out_dim)
        self.v_context = nn.Linear(context_dim, out_dim, bias=False)
        self.skip = nn.Linear(query_dim, out_dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, query: Tensor, table: Tensor, index: Tensor, context: Tensor, mask: Tensor,
                query_index: Optional[Tensor] = None) -> Tensor:
        """query [R, Dq], or [1, Dq] for one query input shared by all rows, or with
        `query_index` [R] the query inputs of the rows as rows of `query` (what is computed from a
        query input then is computed once per distinct input); keys' node part table[index] with
        table [T, Dk], index [R, k]; context [R, k, Dc]; mask [R, k] (True = valid) -> [R, out].
        A one-row table (every key's node part the same, as TGAT's zero inputs) adds the same
        score to all keys of a row, which softmax ignores, so only the context is attended."""
        r, h = index.shape[0], self.heads
        dh = self.q.out_features // h
        q = self.q(query).view(-1, h, dh).transpose(0, 1).contiguous()  # head-major [H, rows of query, dh]

        def through(w: Tensor) -> Tensor:  # W^T q per head: [H, R, D]
            u = torch.bmm(q, w.view(h, dh, -1))
            return u.expand(-1, r, -1) if u.shape[1] == 1 else u if query_index is None else u.index_select(1, query_index)

        def per_head(w: Tensor) -> Tensor:  # W per head, to multiply [H, R, D] from the right: [H, D, dh]
            return w.view(h, dh, -1).transpose(1, 2)

        shared_key = table.shape[0] == 1
        node = (None, None, None) if shared_key else (through(self.k.weight), table, index)
        agg_c, agg_k, weight = attend(through(self.k_context.weight), context, *node, mask, dh ** -0.5, self.drop)
        # W agg per head, plus the value bias (and a shared key's value) by weight: [H, R, dh]
        bias = self.v(table).view(h, 1, dh) if shared_key else self.v.bias.view(h, 1, dh)
        out = torch.baddbmm(weight.unsqueeze(-1) * bias, agg_c, per_head(self.v_context.weight))
        if not shared_key:
            out = torch.baddbmm(out, agg_k, per_head(self.v.weight))
        skip = self.skip(query)
        return out.transpose(0, 1).reshape(r, h * dh) + (skip if query_index is None else skip.index_select(0, query_index))


class CellUpdater(nn.Module):
    """New memory from the last stored mail and the time since the last update, through a GRU
    (TGN) or RNN (JODIE, DyRep) cell whose hidden state is the memory."""

    def __init__(self, cell: type, mail_dim: int, time_enc: nn.Module, memory_dim: int) -> None:
        super().__init__()
        self.time_enc = time_enc
        self.cell = cell(mail_dim + time_enc.out_channels, memory_dim)

    def forward(self, memory: Tensor, last_update: Tensor, mail: Tensor, mail_time: Tensor) -> Tensor:
        """memory [R, d], last_update [R], mail [R, M, m], mail_time [R, M] (newest mail last)."""
        last = mail_time[:, -1]
        dt = torch.where(last > float("-inf"), last - last_update, 0).float()
        return self.cell(torch.cat([mail[:, -1], self.time_enc(dt)], dim=1), memory)


class MailboxUpdater(nn.Module):
    """APAN's update: the memory attends over the node's mailbox (the age of each mail encoded),
    then a layer norm."""

    def __init__(self, memory_dim: int, mail_dim: int, time_enc: nn.Module, heads: int, dropout: float) -> None:
        super().__init__()
        self.time_enc = time_enc
        self.attention = TemporalAttention(memory_dim, mail_dim, time_enc.out_channels, memory_dim, heads, dropout)
        self.norm = nn.LayerNorm(memory_dim)

    def forward(self, memory: Tensor, last_update: Tensor, mail: Tensor, mail_time: Tensor) -> Tensor:
        valid = mail_time > float("-inf")
        r, m = valid.shape
        newest = mail_time.max(dim=1).values
        age = torch.where(valid, newest.unsqueeze(1) - mail_time, 0).float()
        keys = torch.arange(r * m, device=mail.device).view(r, m)
        return self.norm(self.attention(memory, mail.reshape(r * m, mail.shape[2]), keys,
                                        self.time_enc(age.reshape(-1)).view(r, m, self.time_enc.out_channels), valid))


def update_memory(updater: nn.Module, memory: Tensor, last_update: Tensor, mail: Tensor, mail_time: Tensor
                  ) -> tuple[Tensor, Tensor, Tensor]:
    """Memory after folding in the stored mails: (memory, last_update, newest mail time); rows
    without a mail keep their memory and time. On the CPU the updater runs on the rows with a
    mail only; on a device on all rows (picking them would wait for the device)."""
    newest = mail_time.max(dim=1).values
    has = newest > float("-inf")
    if on_cpu_paths(memory):
        rows = has.nonzero().squeeze(1)
        new = memory.index_copy(0, rows, updater(memory[rows], last_update[rows], mail[rows], mail_time[rows]))
    else:
        new = torch.where(has.unsqueeze(1), updater(memory, last_update, mail, mail_time), memory)
    return new, torch.where(has, newest, last_update), newest


class GraphAttention(nn.Module):
    """L layers of temporal attention over sampled neighbourhoods (TGN: 1, TGAT: 2). A key's
    context is its event's features and the encoded time since it."""

    def __init__(self, dim: int, edge_dim: int, time_enc: nn.Module, layers: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.time_enc, self.edge_dim = time_enc, edge_dim
        self.layers = nn.ModuleList(TemporalAttention(dim, dim, edge_dim + time_enc.out_channels, dim, heads, dropout)
                                    for _ in range(layers))

    def contexts(self, hops: list) -> list[Tensor]:
        """The context of each key of each `Hop` [R, k, edge_dim + time_dim]: its event's
        features and the encoded time since it (no parameter is used: the encoder is fixed)."""
        out = []
        for hop in hops:
            r, k = hop.mask.shape
            context = self.time_enc(hop.dt.reshape(-1)).view(r, k, self.time_enc.out_channels)
            out.append(torch.cat([hop.feat, context], dim=2) if self.edge_dim else context)
        return out

    def forward(self, levels: list[tuple[Tensor, Tensor]], hops: list, contexts: Optional[list[Tensor]] = None
                ) -> Tensor:
        """`levels[l] = (table, index)`: the inputs of the hop-l rows are `table[index]` (level 0:
        the queries); `hops[l]` is the `Hop` of level l's rows (hop l has `hops[l].mask.size` rows);
        `contexts`: theirs (`contexts`), if made before."""
        dev = levels[0][0].device
        contexts = self.contexts(hops[:len(levels) - 1]) if contexts is None else contexts
        for i, layer in enumerate(self.layers):
            out = []
            for lvl, context in enumerate(contexts[:len(levels) - 1]):
                table, index = levels[lvl]
                keys, key_index = levels[lvl + 1]
                query, query_index = query_inputs(table, index) if i == 0 else (table, None)  # then: one row each
                out.append(layer(query, keys, key_index.view(context.shape[:2]), context, hops[lvl].mask, query_index))
            levels = [(o, torch.arange(o.shape[0], device=dev)) for o in out]
        return levels[0][0]


def query_inputs(table: Tensor, index: Tensor) -> tuple[Tensor, Optional[Tensor]]:
    """The query inputs `table[index]` for `TemporalAttention`: the table itself where it has one
    row; on the CPU each distinct row once, with where each query's row is (TGN's queries repeat
    half their rows on UCI: a node's endpoints and negatives at several events of a batch); on
    other devices the rows themselves (finding the distinct ones would wait for the device)."""
    if table.shape[0] == 1:
        return table, None
    if on_cpu_paths(table):
        rows, inv = torch.unique(index, return_inverse=True)
        return table.index_select(0, rows), inv
    return table.index_select(0, index), None


class TimeProjection(nn.Module):
    """JODIE's embedding: memory * (1 + w * log(1 + time since the memory's last update))."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.lin = nn.Linear(1, dim)
        nn.init.normal_(self.lin.weight, std=0.1)
        nn.init.zeros_(self.lin.bias)

    def forward(self, memory: Tensor, elapsed: Tensor) -> Tensor:
        return memory * (1 + self.lin(torch.log1p(elapsed.clamp(min=0)).float().unsqueeze(1)))


class LinkPredictor(nn.Module):
    """Logit of an interaction from the two endpoint embeddings: an MLP over [z_src, z_dst]."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(2 * dim, dim), nn.ReLU(), nn.Linear(dim, 1))

    def forward(self, z_src: Tensor, z_dst: Tensor) -> Tensor:
        """Logits of z_src [B, d] with z_dst [B, d] -> [B], or with each of z_dst [B, m, d] ->
        [B, m]. The first layer is applied to each half apart, so a source row's half is
        computed once for all its m candidates."""
        first, act, last = self.mlp
        d = z_src.shape[-1]
        h_src = F.linear(z_src, first.weight[:, :d], first.bias)
        h = (h_src.unsqueeze(1) if z_dst.dim() == 3 else h_src) + F.linear(z_dst, first.weight[:, d:])
        return last(act(h)).squeeze(-1)


def last_per_node(nodes: np.ndarray, num: int) -> tuple[np.ndarray, np.ndarray]:
    """For entries `nodes` (row ids in [0, num), listed in event order; host arrays), the
    distinct rows and the position of each one's last entry."""
    best = np.full(num, -1, np.int64)
    best[nodes] = np.arange(len(nodes))  # numpy keeps the last of repeated indices
    rows = np.flatnonzero(best >= 0)
    return rows, best[rows]
