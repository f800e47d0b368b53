"""Memory-based temporal GNNs for link prediction: TGN, JODIE, DyRep, APAN, and TGAT (no memory).

All share one memory module and one batch procedure (`TGNN.forward`, then `TGNN.write` after
the optimizer step):

1. sample the queries' temporal neighbours (strictly earlier than each query's time);
2. read the state rows of every node involved, once each, and update their memory from the
   stored mails (GRU for TGN, RNN for JODIE/DyRep, attention over the mailbox for APAN); the
   gradient flows into the updater. A row at time t only sees mails older than t (GRU/RNN
   models keep the stored memory when the node's mail is not older; APAN masks newer mails
   out of its attention), so no event sees a mail of its own time;
3. embed (temporal attention over the neighbours' memories for TGN/TGAT, time projection for
   JODIE (no data statistics: the elapsed time enters as log(1 + dt)), the memory itself for
   DyRep/APAN) and score positives and negatives;
4. `write`: the batch's true endpoints get their updated memory (detached) and a new mail
   `[other endpoint's memory (DyRep: its attention embedding), edge features]` stamped with
   the event time; each node once, from its last event in the batch. (TGN's message also
   holds the node's own memory; here that is the GRU's hidden state, which is the same
   vector, so the mail leaves it out: a third less GRU input and half the mailbox.) APAN
   mails also hold the sending endpoint's memory and go to the endpoints and their sampled
   neighbours, whose mailboxes keep their latest by (time, global event order)
   (`NodeState.deliver`).

Events of one batch never see each other's state updates. A mail's time enters as the
encoding of `mail_time - last_update` when the mail is consumed.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Optional

import numpy as np
import torch
from torch import Tensor, nn

from gnndist.graph import TemporalGraph
from gnndist.temporal.state import NodeState
from gnndist.samplers.temporal import TemporalSample, multihop
from gnndist.temporal.modules import LinkPredictor, TemporalAttention, last_per_node, time_encoder

SampleFn = Callable[[np.ndarray, np.ndarray, int, int], TemporalSample]


@dataclass(frozen=True)
class ModelSpec:
    """What distinguishes one model: its memory updater, embedding, sampling and mail routing."""

    updater: Optional[str]  # "gru" | "rnn" | "mailbox" | None (no memory)
    embed: str  # "attention" | "time_projection" | "memory"
    hops: int  # sampled neighbour hops
    strategy: str  # "recent" | "uniform"
    mailbox: int = 1  # mails kept per node
    attention_mail: bool = False  # mails carry the other endpoint's attention embedding (DyRep)
    deliver_to_neighbors: bool = False  # mails also go to the endpoints' sampled neighbours (APAN)


SPECS: dict[str, ModelSpec] = {
    "tgn": ModelSpec("gru", "attention", 1, "recent"),
    "jodie": ModelSpec("rnn", "time_projection", 0, "recent"),
    "dyrep": ModelSpec("rnn", "memory", 1, "recent", attention_mail=True),
    "apan": ModelSpec("mailbox", "memory", 1, "recent", mailbox=10, deliver_to_neighbors=True),
    "tgat": ModelSpec(None, "attention", 2, "uniform"),
}


@dataclass
class Batch:
    """Events of one batch, in time order, with `neg` [B, n] negative destinations per event."""

    src: Tensor
    dst: Tensor
    t: Tensor  # float64
    eid: Tensor
    neg: Tensor

    @classmethod
    def from_graph(cls, tg: TemporalGraph, start: int, stop: int, neg: np.ndarray,
                   device: torch.device | str = "cpu") -> "Batch":
        """Events [start, stop) of a `TemporalGraph` with their negatives [stop - start, n]."""
        def tensor(a):
            return torch.as_tensor(np.ascontiguousarray(a), device=device)
        return cls(tensor(tg.src[start:stop]), tensor(tg.dst[start:stop]), tensor(tg.t[start:stop]),
                   torch.arange(start, stop, device=device), tensor(np.asarray(neg).reshape(stop - start, -1)))


@dataclass
class Forward:
    """Scores of a batch and what `TGNN.write` needs afterwards."""

    pos: Tensor  # [B] logits
    neg: Tensor  # [B, n] logits
    embed: Tensor  # [B * (2 + n), d] embeddings of src, dst, then negatives
    ids: Optional[Tensor] = None  # distinct node ids read
    inv: Optional[Tensor] = None  # row -> position in ids (queries, then hop-0 neighbours)
    memory: Optional[Tensor] = None  # read memory of ids
    last_update: Optional[Tensor] = None
    mail: Optional[Tensor] = None
    mail_time: Optional[Tensor] = None
    updated: Optional[Tensor] = None  # updated memory of ids (APAN: of the endpoints, without grad)
    updated_time: Optional[Tensor] = None
    endpoint_embed: Optional[Tensor] = None  # DyRep: attention embeddings of src then dst [2B, d]
    hop0: Optional[TemporalSample] = None


class TGNN(nn.Module):
    """One of `SPECS` over `num_nodes` nodes with `edge_dim` edge features."""

    def __init__(self, model: str, num_nodes: int, edge_dim: int = 0, memory_dim: int = 100, time_dim: int = 100,
                 num_neighbors: int = 10, heads: int = 2, dropout: float = 0.0,
                 mailbox: Optional[int] = None) -> None:
        super().__init__()
        if model not in SPECS:
            raise ValueError(f"unknown model {model!r}")
        self.name = model
        self.spec = SPECS[model] if mailbox is None else replace(SPECS[model], mailbox=mailbox)
        self.num_nodes, self.edge_dim, self.dim, self.k = num_nodes, edge_dim, memory_dim, num_neighbors
        spec = self.spec
        self.time_enc = time_encoder(time_dim)
        self.mail_dim = (2 if spec.deliver_to_neighbors else 1) * memory_dim + edge_dim
        if spec.updater in ("gru", "rnn"):
            cell = nn.GRUCell if spec.updater == "gru" else nn.RNNCell
            self.updater = cell(self.mail_dim + time_dim, memory_dim)
        elif spec.updater == "mailbox":
            self.updater = TemporalAttention(memory_dim, self.mail_dim, time_dim, memory_dim, heads, dropout)
            self.updater_norm = nn.LayerNorm(memory_dim)  # APAN: attention, then layer norm
        if spec.embed == "attention" or spec.attention_mail:
            self.layers = nn.ModuleList(
                TemporalAttention(memory_dim, memory_dim, edge_dim + time_dim, memory_dim, heads, dropout)
                for _ in range(spec.hops))
        if spec.embed == "time_projection":
            self.projection = nn.Linear(1, memory_dim)  # JODIE: memory * (1 + w * log(1 + dt))
            nn.init.normal_(self.projection.weight, std=0.1)
            nn.init.zeros_(self.projection.bias)
        self.predictor = LinkPredictor(memory_dim)

    @property
    def has_memory(self) -> bool:
        return self.spec.updater is not None

    def new_state(self, start_time: float = 0.0, device: torch.device | str = "cpu") -> Optional[NodeState]:
        """A fresh node state for this model (None for TGAT)."""
        if not self.has_memory:
            return None
        return NodeState(self.num_nodes, self.dim, self.mail_dim, self.spec.mailbox, start_time, device)

    def update_memory(self, memory: Tensor, last_update: Tensor, mail: Tensor, mail_time: Tensor
                      ) -> tuple[Tensor, Tensor, Tensor]:
        """Memory after folding in the stored mails: (memory, last_update, newest mail time)."""
        newest = mail_time.max(dim=1).values
        has = newest > float("-inf")
        if self.spec.updater == "mailbox":
            valid = mail_time > float("-inf")
            r, m = valid.shape
            age = torch.where(valid, newest.unsqueeze(1) - mail_time, 0).float()
            new = self.updater_norm(self.updater(memory, mail.reshape(r * m, -1), torch.arange(
                r * m, device=mail.device).view(r, m), self.time_enc(age.reshape(-1)).view(r, m, -1), valid))
        else:
            dt = torch.where(has, mail_time[:, -1] - last_update, 0).float()
            new = self.updater(torch.cat([mail[:, -1], self.time_enc(dt)], dim=1), memory)
        return (torch.where(has.unsqueeze(1), new, memory), torch.where(has, newest, last_update), newest)

    def _attend(self, levels: list[tuple[Tensor, Tensor]], hops: list[TemporalSample], edge_feat: Tensor) -> Tensor:
        """Stack the attention layers. `levels[l] = (table, index)`: the inputs of the hop-l rows
        are `table[index]` (level 0: the queries; hop l has `hops[l].mask.size` rows)."""
        dev = levels[0][0].device
        for layer in self.layers:
            out = []
            for lvl in range(len(levels) - 1):
                s = hops[lvl]
                r, k = s.mask.shape
                mask = torch.from_numpy(s.mask).to(dev)
                dt = self.time_enc(torch.from_numpy(s.dt).to(dev).reshape(-1)).view(r, k, -1)
                context = torch.cat([edge_feat.index_select(0, torch.from_numpy(s.eid).to(dev).reshape(-1)).view(
                    r, k, -1), dt], dim=2) if self.edge_dim else dt
                table, index = levels[lvl]
                keys, key_index = levels[lvl + 1]
                out.append(layer(table.index_select(0, index), keys, key_index.view(r, k), context, mask))
            levels = [(o, torch.arange(o.shape[0], device=dev)) for o in out]
        return levels[0][0]

    def _mailbox_memory(self, out: Forward, times: Tensor, b: int) -> Tensor:
        """APAN: each query row attends over its node's mails older than the row's time (with
        grad); the batch's endpoints also get their update over all their mails, to be written."""
        q = times.numel()
        rows = out.inv[:q]
        mt = out.mail_time[rows]
        h = self.update_memory(out.memory[rows], out.last_update[rows], out.mail[rows],
                               torch.where(mt < times.unsqueeze(1), mt, float("-inf")))[0]
        ends = torch.unique(out.inv[:2 * b])
        with torch.no_grad():
            upd, upd_time, _ = self.update_memory(out.memory[ends], out.last_update[ends], out.mail[ends],
                                                  out.mail_time[ends])
        out.updated = out.memory.index_copy(0, ends, upd)
        out.updated_time = out.last_update.index_copy(0, ends, upd_time)
        return h

    def forward(self, state: Optional[NodeState], batch: Batch, sample: SampleFn, edge_feat: Tensor) -> Forward:
        """Scores of the batch's positives and negatives (see the module docstring)."""
        spec, dev = self.spec, batch.src.device
        b, n = batch.neg.shape
        nodes = torch.cat([batch.src, batch.dst, batch.neg.reshape(-1)])
        times = torch.cat([batch.t, batch.t, batch.t.repeat_interleave(n)])
        q = nodes.numel()
        n_att = q if spec.embed == "attention" else 2 * b  # rows that need neighbours
        hops = multihop(sample, nodes[:n_att].cpu().numpy(), times[:n_att].cpu().numpy(),
                        [self.k] * spec.hops) if spec.hops else []
        out = Forward(pos=torch.empty(0), neg=torch.empty(0), embed=torch.empty(0), hop0=hops[0] if hops else None)
        if self.has_memory:
            rows, row_t = nodes, times
            if hops:
                rows = torch.cat([nodes, torch.from_numpy(hops[0].nbr).to(dev).reshape(-1)])
                row_t = torch.cat([times, times[:n_att].repeat_interleave(self.k)])
            out.ids, out.inv = torch.unique(rows, return_inverse=True)
            out.memory, out.last_update, out.mail, out.mail_time = state.read(out.ids)
            if spec.updater == "mailbox":
                h0 = self._mailbox_memory(out, times, b)
            else:
                out.updated, out.updated_time, newest = self.update_memory(
                    out.memory, out.last_update, out.mail, out.mail_time)
                # row inputs are rows of `table`: the updated memories, then the stored memory of
                # the few nodes with a row whose time is not after the node's mail
                stale = newest[out.inv] >= row_t
                keep = torch.unique(out.inv[stale])
                pick = torch.where(stale, out.ids.numel() + torch.searchsorted(keep, out.inv), out.inv)
                table = torch.cat([out.updated, out.memory.index_select(0, keep)])
                h0 = table.index_select(0, pick[:q])
                h_time = torch.cat([out.updated_time, out.last_update.index_select(0, keep)]).index_select(0, pick[:q])
                levels = [(table, pick[:n_att]), (table, pick[q:])]
        else:  # no memory, no node features: zero inputs
            zero = torch.zeros(1, self.dim, device=dev)
            levels = [(zero, torch.zeros(n, dtype=torch.long, device=dev)) for n in [q] + [s.mask.size for s in hops]]
        if spec.embed == "attention":
            z = self._attend(levels, hops, edge_feat)
        elif spec.embed == "time_projection":
            dt = torch.log1p((times - h_time).clamp(min=0)).float().unsqueeze(1)
            z = h0 * (1 + self.projection(dt))
        else:
            z = h0
        if spec.attention_mail:
            out.endpoint_embed = self._attend(levels, hops, edge_feat)
        out.embed = z
        logits = self.predictor(torch.cat([z[:b], z[:b].repeat_interleave(n, 0)]), z[b:])  # dst, then negatives
        out.pos, out.neg = logits[:b], logits[b:].view(b, n)
        return out

    def write(self, state: Optional[NodeState], batch: Batch, fw: Forward, edge_feat: Tensor) -> None:
        """Store the batch's new memories and mails (after the optimizer step)."""
        if state is None:
            return
        b = batch.src.numel()
        pos_src, pos_dst = fw.inv[:b], fw.inv[b:2 * b]
        upd = fw.updated.detach()
        if self.spec.attention_mail:
            other_src, other_dst = fw.endpoint_embed.detach()[b:], fw.endpoint_embed.detach()[:b]
        else:
            other_src, other_dst = upd[pos_dst], upd[pos_src]
        e = edge_feat.index_select(0, batch.eid)
        # interleaved per event: (src side, dst side), so list position = 2 * event + side
        ends = torch.stack([pos_src, pos_dst], 1).reshape(-1)
        if self.spec.deliver_to_neighbors:  # APAN mails reach other nodes: they name the sender too
            other_src, other_dst = torch.cat([upd[pos_src], other_src], 1), torch.cat([upd[pos_dst], other_dst], 1)
        mails = torch.stack([torch.cat([other_src, e], 1), torch.cat([other_dst, e], 1)], 1).reshape(2 * b, -1)
        times = batch.t.repeat_interleave(2)
        if not self.spec.deliver_to_neighbors:
            rows, last = last_per_node(ends, fw.ids.numel())
            state.write(fw.ids[rows], upd[rows], fw.updated_time[rows], mails[last].unsqueeze(1),
                        times[last].unsqueeze(1))
            return
        # APAN: endpoints and their sampled neighbours receive the mail (each (node, mail) once)
        k, dev = self.k, ends.device
        q = fw.inv.numel() - 2 * b * k
        mask = torch.from_numpy(fw.hop0.mask).to(dev).reshape(-1)
        nbr_rows = fw.inv[q:][mask]
        # hop-0 rows are the src queries then the dst queries: row -> 2 * event + side
        nbr_seq = torch.cat([2 * torch.arange(b, device=dev), 2 * torch.arange(b, device=dev) + 1])
        seq = torch.cat([torch.arange(2 * b, device=dev), nbr_seq.repeat_interleave(k)[mask]])
        recv = torch.cat([ends, nbr_rows])
        key = torch.unique(recv * (2 * b) + seq)
        recv, seq = key // (2 * b), key % (2 * b)
        rows = torch.unique(ends)  # only the endpoints' memories change
        state.deliver(fw.ids[rows], upd[rows], fw.updated_time[rows], fw.ids[recv], mails[seq], times[seq],
                      2 * batch.eid[seq // 2] + seq % 2)  # mails in global event order
