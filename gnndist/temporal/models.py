"""Memory-based temporal GNNs for link prediction: TGN, JODIE, DyRep, APAN, and TGAT (no memory),
each a short composition of the parts in `gnndist.temporal.modules` (`MODELS` builds them).

One batch procedure serves all (`TemporalGNN.forward`, then `TemporalGNN.write` after the
optimizer step):

1. take the queries' temporal neighbours (strictly earlier than each query's time), sampled
   ahead by the trainer's planner with the sampled events' features (`Batch.hops`);
2. read the state rows of every node involved, once each, and update their memory from the
   stored mails (the gradient flows into the updater). A row at time t only sees mails older
   than t (cell updaters keep the stored memory when the node's mail is not older; APAN masks
   newer mails out of its attention), so no event sees a mail of its own time;
3. embed (graph attention over the neighbours' memories for TGN/TGAT, time projection for
   JODIE (no data statistics: the elapsed time enters as log(1 + dt)), the memory itself for
   DyRep/APAN) and score positives and negatives with the link predictor;
4. `write`: the batch's endpoints get their updated memory (detached) and a new mail stamped
   with the event time, each node once, from its last event in the batch. The mail is the
   message function's output: [other endpoint's memory, edge features] (TGN, JODIE; the own
   memory is the cell's hidden state already, so it is left out), [own memory, other endpoint's
   attention embedding, edge features] (DyRep, as DyGLib forms it: the own memory also enters the
   RNN through weights of its own, with which DyRep trains better at its small learning rate),
   [own memory, other's memory, edge features] (APAN, whose mails also go to the endpoints'
   sampled neighbours; mailboxes keep their latest by (time, global event order),
   `NodeState.deliver`).

Events of one batch never see each other's state updates. A mail's time enters as the
encoding of `mail_time - last_update` when the mail is consumed. Every step also runs on a rank
with no events of the batch (empty tensors), so that all ranks join the same collectives.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch
from numba import njit
from torch import Tensor, nn

from gnndist.runtime.device import to_device
from gnndist.temporal.config import MODELS
from gnndist.temporal.modules import (CellUpdater, GraphAttention, LinkPredictor, MailboxUpdater, TimeProjection,
                                      last_per_node, update_memory)
from gnndist.temporal.state import NodeState
from gnndist.temporal.time_encoding import time_encoder


@dataclass
class Hop:
    """Sampled neighbours of R queries as tensors: `nbr`, `eid` [R, k] int64, `ts` [R, k] float64
    (event times), `dt` [R, k] float32 (query time - ts), `mask` [R, k] (valid entries first,
    most recent first), `feat` [R, k, D] (the sampled events' features; zero where masked);
    `host_nbr`, `host_mask`: the same ids and mask as host arrays."""

    nbr: Tensor
    eid: Tensor
    ts: Tensor
    dt: Tensor
    mask: Tensor
    feat: Tensor
    host_nbr: np.ndarray
    host_mask: np.ndarray


@dataclass
class Batch:
    """Events of one batch this rank scores, in time order: endpoints, times, global event ids,
    their edge features [B, D], and `neg` [B, n] negative destinations per event; with the rows
    this rank embeds for it (`rows`, host arrays (nodes, times): `query_rows`, or where owners
    embed the negatives `remote_negatives.embedded_rows`) and their sampled neighbours (`hops`),
    as the trainer's planner made them."""

    src: Tensor
    dst: Tensor
    t: Tensor  # float64
    eid: Tensor
    feat: Tensor
    neg: Tensor
    host: Optional[tuple[np.ndarray, ...]] = None  # (src, dst, t, neg) as host arrays, if built from them
    rows: Optional[tuple[np.ndarray, np.ndarray]] = None
    hops: list[Hop] = field(default_factory=list)
    route: Any = None  # where owners embed the negatives: their route (`remote_negatives.route_negatives`)

    def on_host(self) -> tuple[np.ndarray, ...]:
        """(src, dst, t, neg) as host arrays: `host`, or else read back from the device."""
        return self.host if self.host is not None else tuple(x.cpu().numpy() for x in
                                                             (self.src, self.dst, self.t, self.neg))

    def queries(self) -> tuple[Tensor, Tensor]:
        """The rows to embed (`query_rows`) on the device."""
        n = self.neg.shape[1]
        return (torch.cat([self.src, self.dst, self.neg.reshape(-1)]),
                torch.cat([self.t, self.t, self.t.repeat_interleave(n)]))


def query_rows(src: np.ndarray, dst: np.ndarray, t: np.ndarray, neg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows a batch embeds, as host arrays (nodes, times): src, dst, then each event's
    negatives [B, n], all at their event's time."""
    return np.concatenate([src, dst, neg.reshape(-1)]), np.concatenate([t, t, np.repeat(t, neg.shape[1])])


def state_rows(nodes: np.ndarray, hop0: Optional[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The distinct nodes whose state `embed` reads for the rows `nodes` and their first hop's
    neighbours `hop0` ([R, k] ids, or None), sorted, and where each row's node is among them
    (host arrays). Found through a hash table, then only the distinct ones sorted: a batch's
    rows repeat few nodes, and torch.unique or numpy's would sort every row."""
    hop0 = np.zeros(0, np.int64) if hop0 is None else hop0.reshape(-1)
    return _distinct(np.ascontiguousarray(nodes, np.int64), np.ascontiguousarray(hop0, np.int64))


@njit(cache=True, nogil=True)
def _distinct(first, second):
    """The distinct values of `first` then `second`, sorted, and the position of each entry's
    among them, through an open-addressing hash table of over twice the entries."""
    total = first.size + second.size
    size = 16
    while size < 2 * total:
        size *= 2
    slots, mask = np.full(size, -1, np.int32), size - 1
    ids, inv, n = np.empty(total, np.int64), np.empty(total, np.int64), 0
    for i in range(total):
        v = first[i] if i < first.size else second[i - first.size]
        h = (v * 2654435761) & mask  # Knuth's multiplicative hash
        while slots[h] >= 0 and ids[slots[h]] != v:
            h = (h + 1) & mask
        if slots[h] < 0:
            slots[h] = n
            ids[n] = v
            n += 1
        inv[i] = slots[h]
    order = np.argsort(ids[:n])
    rank = np.empty(n, np.int64)
    for i in range(n):
        rank[order[i]] = i
    for i in range(total):
        inv[i] = rank[inv[i]]
    return ids[:n][order], inv


def load_kernel() -> None:
    """Compile (the first time on a machine) or load from numba's cache `state_rows`' kernel."""
    state_rows(np.zeros(1, np.int64), None)


@dataclass
class Forward:
    """Scores of a batch, what `TemporalGNN.write` needs afterwards, and what the embedding read
    before it used a parameter (`TemporalGNN.read`: the hops, their contexts, the state rows)."""

    pos: Tensor  # [B] logits
    neg: Tensor  # [B, n] logits
    embed: Tensor  # [Q, d] embeddings of the query rows (src, dst, then negatives)
    ids: Optional[Tensor] = None  # distinct node ids read
    inv: Optional[Tensor] = None  # row -> position in ids (queries, then hop-0 neighbours)
    host_ids: Optional[np.ndarray] = None  # ids and inv as host arrays
    host_inv: Optional[np.ndarray] = None
    memory: Optional[Tensor] = None  # read memory of ids
    last_update: Optional[Tensor] = None
    mail: Optional[Tensor] = None
    mail_time: Optional[Tensor] = None
    updated: Optional[Tensor] = None  # updated memory of ids (APAN: of the endpoints, without grad)
    updated_time: Optional[Tensor] = None
    endpoint_embed: Optional[Tensor] = None  # DyRep: attention embeddings of src then dst [2B, d]
    hops: list[Hop] = field(default_factory=list)  # the sampled neighbours, by hop (after `embed`: hop 0)
    contexts: list[Tensor] = field(default_factory=list)  # of each hop's keys (`GraphAttention.contexts`;
    # after `embed`: none)


@dataclass(frozen=True)
class Sampling:
    """Which rows a model samples neighbours for, how, and how many hops."""

    strategy: str  # "recent" | "uniform"
    hops: int
    rows: str = "queries"  # "queries" (every scored row) | "endpoints" (the batch's src and dst only)


class Memory(nn.Module):
    """What a model keeps per node: the updater, the message function (`message`: what a mail
    carries of the other endpoint, "memory" or "embedding" (its attention embedding); `own`: the
    mail starts with the sender's own memory), mails kept per node, and whether mails also reach
    the endpoints' sampled neighbours."""

    def __init__(self, updater: nn.Module, message: str, dim: int, edge_dim: int, own: bool = False,
                 mailbox: int = 1, to_neighbors: bool = False) -> None:
        super().__init__()
        self.updater, self.message, self.own = updater, message, own
        self.mailbox, self.to_neighbors = mailbox, to_neighbors
        self.mail_dim = self.mail_size(dim, edge_dim, own)

    @staticmethod
    def mail_size(dim: int, edge_dim: int, own: bool) -> int:
        """The width of a mail (without the encoded time, which the updater adds)."""
        return (2 if own else 1) * dim + edge_dim

    @property
    def attends_mailbox(self) -> bool:
        return isinstance(self.updater, MailboxUpdater)


class TemporalGNN(nn.Module):
    """A memory (or none), an embedding module (graph attention, time projection, or none: the
    memory itself), DyRep's message attention, the sampling it needs and a link predictor."""

    def __init__(self, name: str, dim: int, edge_dim: int, num_neighbors: int, sampling: Sampling,
                 memory: Optional[Memory], embedding: Optional[nn.Module],
                 message_attention: Optional[GraphAttention] = None) -> None:
        super().__init__()
        self.name, self.dim, self.edge_dim, self.k, self.sampling = name, dim, edge_dim, num_neighbors, sampling
        self.memory, self.embedding, self.message_attention = memory, embedding, message_attention
        self.predictor = LinkPredictor(dim)

    @property
    def has_memory(self) -> bool:
        return self.memory is not None

    def new_state(self, num_nodes: int, start_time: float = 0.0, device: torch.device | str = "cpu"
                  ) -> Optional[NodeState]:
        """A fresh one-process node state for this model (None without memory)."""
        if self.memory is None:
            return None
        return NodeState(num_nodes, self.dim, self.memory.mail_dim, self.memory.mailbox, start_time, device)

    def forward(self, state: Optional[NodeState], batch: Batch, read: Optional[Forward] = None) -> Forward:
        """Scores of the batch's positives and negatives (see the module docstring); `read`: what
        `read_batch` read of the batch before (else read now)."""
        b, n = batch.neg.shape
        out = self.embed(state, *batch.queries(), 2 * b, batch.hops, batch.rows, read)
        z = out.embed
        out.pos, out.neg = self.score(z[:b], z[b:2 * b], z[2 * b:], n)
        return out

    def read_batch(self, state: Optional[NodeState], batch: Batch) -> Forward:
        """What `forward` reads of the batch before it uses a parameter (`read`)."""
        return self.read(state, *batch.queries(), 2 * batch.neg.shape[0], batch.hops, batch.rows)

    def score(self, z_src: Tensor, z_dst: Tensor, z_neg: Tensor, n: int) -> tuple[Tensor, Tensor]:
        """Logits [B] of (src, dst) and [B, n] of (src, each of its n negatives) from embeddings."""
        b = z_src.shape[0]
        logits = self.predictor(z_src, torch.cat([z_dst.unsqueeze(1), z_neg.view(b, n, z_dst.shape[1])], 1))
        return logits[:, 0], logits[:, 1:]

    def neighbour_queries(self, nodes: np.ndarray, times: np.ndarray, num_endpoints: int
                          ) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """Of the rows `embed` is given (host arrays; the first `num_endpoints` the batch's
        endpoints), the ones it samples neighbours for, and the neighbours per hop ([]: none)."""
        n = nodes.size if self.sampling.rows == "queries" else num_endpoints
        return nodes[:n], times[:n], [self.k] * self.sampling.hops

    def read(self, state: Optional[NodeState], nodes: Tensor, times: Tensor, num_endpoints: int,
             hops: list[Hop], host: Optional[tuple[np.ndarray, np.ndarray]] = None) -> Forward:
        """What `embed` (same arguments) reads before it uses a parameter, in a `Forward`: the
        sampled neighbours' attention contexts and the distinct nodes' state rows. A state's
        later writes do not reach it: read it after those that the embedding is to see."""
        dev = nodes.device
        host_nodes = host[0] if host is not None else nodes.cpu().numpy()
        if len(hops) != self.sampling.hops:
            raise RuntimeError(f"{self.name} embeds over {self.sampling.hops} hop(s) of neighbours, given {len(hops)}")
        out = Forward(pos=torch.empty(0), neg=torch.empty(0), embed=torch.empty(0))
        out.hops = list(hops)
        attention = self.embedding if isinstance(self.embedding, GraphAttention) else self.message_attention
        if attention is not None and not any(p.requires_grad for p in attention.time_enc.parameters()):
            out.contexts = attention.contexts(out.hops)
        if self.memory is not None:
            out.host_ids, out.host_inv = state_rows(host_nodes, out.hops[0].host_nbr if out.hops else None)
            out.ids, out.inv = (to_device(a, dev) for a in (out.host_ids, out.host_inv))
            out.memory, out.last_update, out.mail, out.mail_time = state.read(out.ids, out.host_ids)
        return out

    def embed(self, state: Optional[NodeState], nodes: Tensor, times: Tensor, num_endpoints: int,
              hops: list[Hop], host: Optional[tuple[np.ndarray, np.ndarray]] = None,
              read: Optional[Forward] = None) -> Forward:
        """Embeddings [Q, d] of the queries (nodes, times) in `Forward.embed`; the first
        `num_endpoints` rows are the batch's endpoints (src, then dst), whose updates `write` stores.
        `hops`: the sampled neighbours of the rows `neighbour_queries` names. `host`: the nodes
        and times as host arrays (read back from the device if not given): the bookkeeping of
        rows runs on the host, so the device is never waited for. `read`: what `read` gave for
        the same arguments (else read now)."""
        out = read if read is not None else self.read(state, nodes, times, num_endpoints, hops, host)
        out.embed = self._embed_read(out, times, num_endpoints)
        out.contexts, out.hops = [], out.hops[:1]  # used up; `write` needs hop 0 only
        return out

    def _embed_read(self, out: Forward, times: Tensor, num_endpoints: int) -> Tensor:
        """`embed`'s embeddings from what it read (`out`, which also takes the updated memory)."""
        q, dev, hops = times.numel(), times.device, out.hops
        n_att = hops[0].mask.shape[0] if hops else 0  # rows that have neighbours
        if self.memory is None:  # no memory, no node features: zero inputs
            zero = torch.zeros(1, self.dim, device=dev)
            levels = [(zero, torch.zeros(r, dtype=torch.long, device=dev)) for r in [q] + [h.mask.numel() for h in hops]]
            return self.embedding(levels, hops, out.contexts or None)
        row_t = torch.cat([times, times[:n_att].repeat_interleave(self.k)]) if hops else times
        if self.memory.attends_mailbox:
            return self._mailbox_memory(out, times, num_endpoints)
        out.updated, out.updated_time, newest = update_memory(self.memory.updater, out.memory, out.last_update,
                                                              out.mail, out.mail_time)
        # row inputs are rows of `table`: the updated memories, then the stored ones, taken by the
        # rows whose time is not after their node's mail
        stale = newest[out.inv] >= row_t
        pick = torch.where(stale, out.ids.numel() + out.inv, out.inv)
        table = torch.cat([out.updated, out.memory])
        h0 = table.index_select(0, pick[:q])
        levels = [(table, pick[:n_att]), (table, pick[q:])]
        if isinstance(self.embedding, GraphAttention):
            embed = self.embedding(levels, hops, out.contexts or None)
        elif isinstance(self.embedding, TimeProjection):
            h_time = torch.cat([out.updated_time, out.last_update]).index_select(0, pick[:q])
            embed = self.embedding(h0, times - h_time)
        else:
            embed = h0
        if self.message_attention is not None:
            out.endpoint_embed = self.message_attention(levels, hops, out.contexts or None)
        return embed

    def _mailbox_memory(self, out: Forward, times: Tensor, num_endpoints: int) -> Tensor:
        """APAN: each query row attends over its node's mails older than the row's time (with
        grad); the endpoints also get their update over all their mails, to be written."""
        updater = self.memory.updater
        rows = out.inv[:times.numel()]
        mt = out.mail_time[rows]
        h = update_memory(updater, out.memory[rows], out.last_update[rows], out.mail[rows],
                          torch.where(mt < times.unsqueeze(1), mt, float("-inf")))[0]
        ends = to_device(np.unique(out.host_inv[:num_endpoints]), out.inv.device)
        with torch.no_grad():
            upd, upd_time, _ = update_memory(updater, out.memory[ends], out.last_update[ends], out.mail[ends],
                                             out.mail_time[ends])
        out.updated = out.memory.index_copy(0, ends, upd)
        out.updated_time = out.last_update.index_copy(0, ends, upd_time)
        return h

    def write(self, state: Optional[NodeState], batch: Batch, fw: Forward) -> None:
        """Store the batch's new memories and mails (after the backward pass)."""
        if state is None:
            return
        b = batch.src.numel()
        pos_src, pos_dst = fw.inv[:b], fw.inv[b:2 * b]
        upd = fw.updated.detach()
        if self.memory.message == "embedding":
            other_src, other_dst = fw.endpoint_embed.detach()[b:], fw.endpoint_embed.detach()[:b]
        else:
            other_src, other_dst = upd[pos_dst], upd[pos_src]
        if self.memory.own:
            other_src, other_dst = torch.cat([upd[pos_src], other_src], 1), torch.cat([upd[pos_dst], other_dst], 1)
        # interleaved per event: (src side, dst side), so list position = 2 * event + side; which
        # rows take which mail is worked out on the host (from `host_inv`), the rows moved on the device
        inv, dev = fw.host_inv, upd.device
        ends = np.stack([inv[:b], inv[b:2 * b]], 1).reshape(-1)
        mails = torch.stack([torch.cat([other_src, batch.feat], 1), torch.cat([other_dst, batch.feat], 1)],
                            1).reshape(2 * b, self.memory.mail_dim)
        times = batch.t.repeat_interleave(2)
        if not self.memory.to_neighbors:
            host_rows, host_last = last_per_node(ends, fw.host_ids.size)
            rows, last = to_device(host_rows, dev), to_device(host_last, dev)
            state.write(fw.ids[rows], upd[rows], fw.updated_time[rows], mails[last].unsqueeze(1),
                        times[last].unsqueeze(1), host_ids=fw.host_ids[host_rows])
            return
        # APAN: endpoints and their sampled neighbours receive the mail (each (node, mail) once)
        k = self.k
        q = inv.size - 2 * b * k
        mask = fw.hops[0].host_mask.reshape(-1)
        # hop-0 rows are the src queries then the dst queries: row -> 2 * event + side
        nbr_seq = np.concatenate([2 * np.arange(b), 2 * np.arange(b) + 1])
        seq = np.concatenate([np.arange(2 * b), np.repeat(nbr_seq, k)[mask]])
        recv = np.concatenate([ends, inv[q:][mask]])
        key = np.unique(recv * (2 * b) + seq)
        host_recv, host_seq = key // max(2 * b, 1), key % max(2 * b, 1)
        recv, seq = to_device(host_recv, dev), to_device(host_seq, dev)
        host_rows = np.unique(ends)  # only the endpoints' memories change
        rows = to_device(host_rows, dev)
        state.deliver(fw.ids[rows], upd[rows], fw.updated_time[rows], fw.ids[recv], mails[seq], times[seq],
                      2 * batch.eid[seq // 2] + seq % 2,  # mails in global event order
                      host_ids=fw.host_ids[host_rows], host_to=fw.host_ids[host_recv])


def build_model(name: str, edge_dim: int = 0, memory_dim: int = 100, time_dim: int = 100, num_neighbors: int = 10,
                heads: int = 2, dropout: float = 0.0, mailbox: int = 10, sampling: str = "recent") -> TemporalGNN:
    """One of `MODELS` for events with `edge_dim` features (`mailbox`: APAN's mails per node;
    `sampling`: "recent" or "uniform" temporal neighbours)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    d, enc = memory_dim, time_encoder(time_dim)
    mail, own_mail = Memory.mail_size(d, edge_dim, False), Memory.mail_size(d, edge_dim, True)
    if name == "tgn":
        return TemporalGNN(name, d, edge_dim, num_neighbors, Sampling(sampling, 1),
                           Memory(CellUpdater(nn.GRUCell, mail, enc, d), "memory", d, edge_dim),
                           GraphAttention(d, edge_dim, enc, 1, heads, dropout))
    if name == "jodie":
        return TemporalGNN(name, d, edge_dim, num_neighbors, Sampling(sampling, 0),
                           Memory(CellUpdater(nn.RNNCell, mail, enc, d), "memory", d, edge_dim), TimeProjection(d))
    if name == "dyrep":
        return TemporalGNN(name, d, edge_dim, num_neighbors, Sampling(sampling, 1, rows="endpoints"),
                           Memory(CellUpdater(nn.RNNCell, own_mail, enc, d), "embedding", d, edge_dim, own=True), None,
                           message_attention=GraphAttention(d, edge_dim, enc, 1, heads, dropout))
    if name == "apan":
        return TemporalGNN(name, d, edge_dim, num_neighbors, Sampling(sampling, 1, rows="endpoints"),
                           Memory(MailboxUpdater(d, own_mail, enc, heads, dropout), "memory", d, edge_dim, own=True,
                                  mailbox=mailbox, to_neighbors=True), None)
    return TemporalGNN(name, d, edge_dim, num_neighbors, Sampling(sampling, 2), None,
                       GraphAttention(d, edge_dim, enc, 2, heads, dropout))
