"""Building blocks of the temporal GNNs: time encoding, batched temporal attention over padded
neighbour lists, the link scorer, and the vectorized mailbox operations."""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch_geometric.nn.models.tgn import TimeEncoder


def time_encoder(dim: int) -> TimeEncoder:
    """PyG's `cos(w * dt + b)` encoder with fixed frequencies 1 .. 1e-9 (one per dimension), so
    that deltas from seconds to decades are told apart (TGAT's initialisation, kept fixed as in
    GraphMixer: it needs no gradient through the per-neighbour encodings)."""
    enc = TimeEncoder(dim)
    with torch.no_grad():
        enc.lin.weight.copy_(torch.logspace(0, -9, dim).view(dim, 1))
        enc.lin.bias.zero_()
    return enc.requires_grad_(False)


class TemporalAttention(nn.Module):
    """Multi-head attention of each query row over its k padded keys, then a merge MLP of the
    attended value with the query (the TGAT/TGN layer). A key is a node part, given as rows of a
    `table` picked by `index`, and a context part (edge features, time encoding).

    The node part is projected once per table row, not once per key. The context part is not
    projected at all: its score term is (W_k^T q) . c and its value term W_v (sum_j a_j c_j),
    the same algebra with k times fewer multiplications. Rows with no valid key get a zero
    attended value.
    """

    def __init__(self, query_dim: int, key_dim: int, context_dim: int, out_dim: int, heads: int = 2,
                 dropout: float = 0.0) -> None:
        super().__init__()
        if out_dim % heads:
            raise ValueError(f"out_dim {out_dim} must be divisible by heads {heads}")
        self.heads = heads
        self.q = nn.Linear(query_dim, out_dim)
        self.kv = nn.Linear(key_dim, 2 * out_dim)
        self.context_k = nn.Linear(context_dim, out_dim, bias=False)
        self.context_v = nn.Linear(context_dim, out_dim, bias=False)
        self.drop = nn.Dropout(dropout)
        self.merge = nn.Sequential(nn.Linear(out_dim + query_dim, out_dim), nn.ReLU(), nn.Linear(out_dim, out_dim))

    def forward(self, query: Tensor, table: Tensor, index: Tensor, context: Tensor, mask: Tensor) -> Tensor:
        """query [R, Dq]; keys' node part table[index] with table [T, Dk], index [R, k]; context
        [R, k, Dc]; mask [R, k] (True = valid) -> [R, out]."""
        r, k = index.shape
        h = self.heads
        q = self.q(query).view(r, h, -1)
        dh = q.shape[-1]
        key, value = self.kv(table).index_select(0, index.reshape(-1)).view(r, k, 2, h, dh).unbind(2)
        wk = self.context_k.weight.view(h, dh, -1)
        wv = self.context_v.weight.view(h, dh, -1)
        score = (q.unsqueeze(1) * key).sum(-1) + torch.bmm(context, torch.einsum("rhd,hdc->rch", q, wk))
        m = mask.unsqueeze(-1)
        attn = self.drop(torch.softmax(score.masked_fill(~m, -1e30) / math.sqrt(dh), dim=1) * m)  # [R, k, H]
        out = (attn.unsqueeze(-1) * value).sum(1) + torch.einsum(
            "rhc,hdc->rhd", torch.bmm(attn.transpose(1, 2), context), wv)
        return self.merge(torch.cat([out.reshape(r, -1), query], dim=1))


class LinkPredictor(nn.Module):
    """Logit of an interaction from the two endpoint embeddings."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(2 * dim, dim), nn.ReLU(), nn.Linear(dim, 1))

    def forward(self, z_src: Tensor, z_dst: Tensor) -> Tensor:
        return self.mlp(torch.cat([z_src, z_dst], dim=1)).squeeze(-1)


def last_per_node(nodes: Tensor, num: int) -> tuple[Tensor, Tensor]:
    """For entries `nodes` (row ids in [0, num), listed in event order), the distinct rows and
    the position of each one's last entry."""
    order = torch.arange(nodes.numel(), device=nodes.device)
    best = torch.full((num,), -1, dtype=torch.long, device=nodes.device)
    best.scatter_reduce_(0, nodes, order, reduce="amax")
    rows = torch.nonzero(best >= 0).squeeze(1)
    return rows, best[rows]


def merge_mailbox(mail: Tensor, mail_time: Tensor, rows: Tensor, new_mail: Tensor, new_time: Tensor,
                  seq: Tensor) -> tuple[Tensor, Tensor]:
    """Mailboxes [R, M, m] / [R, M] after delivering new mails to `rows`: each keeps its M latest
    mails by (time, seq), oldest first; old mails go before new ones of the same time."""
    r, m_slots, dim = mail.shape
    dev = mail.device
    own = torch.arange(r, device=dev).repeat_interleave(m_slots)
    all_rows = torch.cat([own, rows])
    times = torch.cat([mail_time.reshape(-1), new_time])
    seqs = torch.cat([torch.arange(m_slots, device=dev).repeat(r) - m_slots - 1, seq.to(dev)])
    o = torch.argsort(seqs, stable=True)
    o = o[torch.argsort(times[o], stable=True)]
    o = o[torch.argsort(all_rows[o], stable=True)]
    sorted_rows = all_rows[o]
    end = torch.cumsum(torch.bincount(all_rows, minlength=r), 0)
    from_end = end[sorted_rows] - torch.arange(o.numel(), device=dev) - 1
    keep = from_end < m_slots
    slot = m_slots - 1 - from_end[keep]
    out_mail = torch.empty_like(mail)
    out_time = torch.empty_like(mail_time)
    kept, kept_rows = o[keep], sorted_rows[keep]
    out_mail[kept_rows, slot] = torch.cat([mail.reshape(-1, dim), new_mail])[kept]
    out_time[kept_rows, slot] = times[kept]
    return out_mail, out_time
