"""gnndist's TGN step against one made of PyG's own TGN components (`TGNMemory` with
`IdentityMessage` and `LastAggregator`, `TimeEncoder`, `TransformerConv`, PyG's example link
predictor) holding the same weights, batch after batch on a generated graph with edge features.

The reference is a plain loop as PyG's examples/tgn.py: memory -> neighbours -> attention
embedding -> link predictor -> loss -> `update_state`. Where the two differ by design, they are
made to agree by configuration:

- Messages: gnndist's mail to an endpoint is [the other endpoint's memory at the event, the
  edge features]; PyG's message is [own memory, the other's memory, raw message, time encoding],
  both memories read when the message is consumed (the other's may have moved on since). The
  raw message given to `update_state` is [both endpoints' updated memories summed, edge
  features], the GRU's own-memory columns are minus gnndist's other-memory columns and its
  other-memory columns zero: -A m_own + A (m_src + m_dst) = A m_other, as a node's own memory is
  still the one written at its last event when its message is consumed.
- A node without a message: gnndist leaves its memory as it is; TGNMemory runs its GRU on a
  zero message. The reference asks TGNMemory for the nodes with a message only, and the GRU's
  candidate-gate biases are zero, so that the zero-message update `update_state` makes at a
  node's first event leaves it at zero too; the learning rate is zero so that they stay zero
  (each batch's gradients are compared, the parameters stay the ones copied). PyG's
  `scatter_argmax` without torch-scatter marks a group without entries with dim_size - 1 where
  torch-scatter marks it with the entry count, which `LastAggregator` checks for: such a node
  then gets another node's message. The test puts torch-scatter's convention back.
- Attention: gnndist projects a key's context (edge features, time encoding) apart for the
  score and for the value, and has no key bias; TransformerConv adds one edge projection to both
  and has one. The value's context projection is tied to the key's (so their gradients are
  compared as a sum) and the key bias is zero (its gradient is zero: softmax ignores it).
- Neighbours: gnndist attends, per scored row (node, time), over the 10 latest events strictly
  before that time, those earlier in the same batch included; PyG's `LastNeighborLoader` holds
  the events of earlier batches only, one neighbourhood per node. The reference finds each
  row's neighbours by brute force, and their times since the events (the example encodes the
  neighbour's last update minus the event's time).
- Times: TGNMemory keeps last updates as int64, and PyG's encoder forms `w * dt` in float32
  where gnndist's does it in float64: the events' times are their positions 0 .. E-1 (distinct
  integers, so that no two mails of a node tie either) and the time encoding is 8-dimensional:
  its first frequency is 1 (exact in float32), the others at most 0.052, so over the 250 events
  compared every argument off an integer stays under 13, where float32 rounds it by under 1e-6.
- Link predictor and loss: gnndist's first layer over [z_src, z_dst] is the example's
  `lin_src` and `lin_dst` (the latter without bias); gnndist's loss (the sums over positives
  and one negative each, over the batch size) is the example's two means.

Not covered: the parameter update (the learning rate is zero), gnndist's key and value context
projections apart from each other (only their tied sum), and the other endpoint's memory as PyG
reads it at consumption (by design gnndist's mail carries it from the event).
"""
from itertools import islice

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import TransformerConv
from torch_geometric.nn.models import tgn as pyg_tgn
from torch_geometric.nn.models.tgn import IdentityMessage, LastAggregator, TGNMemory

from gnndist.datasets import load
from gnndist.graph import TemporalGraph
from gnndist.temporal.config import LinkConfig
from gnndist.temporal.events import RankEvents
from gnndist.temporal.linkpred import train_negatives
from gnndist.temporal.trainer import LinkTrainer

DIM, TIME_DIM, K, BATCH, STEPS = 16, 8, 10, 50, 5
TOL = dict(rtol=1e-5, atol=1e-5)  # memories, embeddings and scores are of size about 1


def graph() -> TemporalGraph:
    """A generated graph with edge features, its events at times 0 .. E-1 (see the docstring)."""
    tg = load("synthetic-temporal", num_nodes=40, num_events=400, edge_dim=4, seed=3)
    return TemporalGraph(tg.src, tg.dst, np.arange(tg.num_events, dtype=np.float64), tg.edge_feat,
                         num_nodes=tg.num_nodes)


PYG_ARGMAX = pyg_tgn.scatter_argmax


def scatter_argmax(src, index, dim=0, dim_size=None):
    """PyG's, with torch-scatter's mark of a group without entries (the entry count)."""
    out = PYG_ARGMAX(src, index, dim, dim_size)
    filled = torch.zeros(out.numel(), dtype=torch.bool).index_fill_(0, index, True)
    return torch.where(filled, out, src.numel())


class Reference(nn.Module):
    """PyG's TGN modules holding the weights of gnndist's TGN `model` (see the module docstring)."""

    def __init__(self, model, tg: TemporalGraph) -> None:
        super().__init__()
        d, e, t_dim = DIM, tg.edge_feat.shape[1], TIME_DIM
        self.src, self.dst = torch.from_numpy(tg.src), torch.from_numpy(tg.dst)
        self.t, self.feat = torch.from_numpy(tg.t).long(), torch.from_numpy(tg.edge_feat)
        self.memory = TGNMemory(tg.num_nodes, d + e, d, t_dim, IdentityMessage(d + e, d, t_dim), LastAggregator())
        att = model.embedding.layers[0]
        self.conv = TransformerConv((d, d), d // att.heads, heads=att.heads, edge_dim=e + t_dim)
        self.lin_src, self.lin_dst, self.lin_final = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, 1)
        cell, (first, _, last) = model.memory.updater.cell, model.predictor.mlp
        other, rest = cell.weight_ih[:, :d], cell.weight_ih[:, d:]
        with torch.no_grad():
            self.memory.time_enc.load_state_dict(model.memory.updater.time_enc.state_dict())
            self.memory.gru.weight_ih.copy_(torch.cat([-other, torch.zeros_like(other), other, rest], 1))
            for name in ("weight_hh", "bias_ih", "bias_hh"):
                getattr(self.memory.gru, name).copy_(getattr(cell, name))
            for mine, theirs in ((self.conv.lin_query, att.q), (self.conv.lin_value, att.v),
                                 (self.conv.lin_skip, att.skip), (self.lin_final, last)):
                mine.load_state_dict(theirs.state_dict())
            self.conv.lin_key.weight.copy_(att.k.weight)
            self.conv.lin_key.bias.zero_()
            self.conv.lin_edge.weight.copy_(att.k_context.weight)
            self.lin_src.weight.copy_(first.weight[:, :d])
            self.lin_src.bias.copy_(first.bias)
            self.lin_dst.weight.copy_(first.weight[:, d:])
            self.lin_dst.bias.zero_()
        self.memory.time_enc.requires_grad_(False)
        self.seen = torch.zeros(tg.num_nodes, dtype=torch.bool)  # nodes with a message

    def neighbours(self, nodes, times):
        """(row, neighbour, event) of each query row's K latest events strictly before its time."""
        out = []
        for row, (n, t) in enumerate(zip(nodes.tolist(), times.tolist())):
            ev = torch.nonzero(((self.src == n) | (self.dst == n)) & (self.t < t)).view(-1)[-K:]
            other = torch.where(self.src[ev] == n, self.dst[ev], self.src[ev])
            out.append(torch.stack([torch.full_like(ev, row), other, ev]))
        return torch.cat(out, 1)

    def step(self, lo: int, hi: int, neg):
        """Embeddings, scores, loss and its gradients of the events [lo, hi) with negatives `neg`
        [B, 1], then the memory's `update_state`."""
        src, dst, t, feat = self.src[lo:hi], self.dst[lo:hi], self.t[lo:hi], self.feat[lo:hi]
        nodes, times = torch.cat([src, dst, neg.view(-1)]), t.repeat(3)
        row, nbr, ev = self.neighbours(nodes, times)
        n_id = torch.cat([nodes, nbr]).unique()
        z = self.memory.memory[n_id].clone()
        has = self.seen[n_id]
        if has.any():
            z[has] = self.memory(n_id[has])[0]
        at = torch.empty(self.seen.numel(), dtype=torch.long)
        at[n_id] = torch.arange(n_id.numel())
        context = torch.cat([self.feat[ev], self.memory.time_enc((times[row] - self.t[ev]).float())], 1)
        embed = self.conv((z, z[at[nodes]]), torch.stack([at[nbr], row]), context)
        b = src.numel()
        h_src = self.lin_src(embed[:b])
        pos = self.lin_final(F.relu(h_src + self.lin_dst(embed[b:2 * b]))).view(-1)
        negs = self.lin_final(F.relu(h_src + self.lin_dst(embed[2 * b:]))).view(-1, 1)
        loss = (F.binary_cross_entropy_with_logits(pos, torch.ones_like(pos))
                + F.binary_cross_entropy_with_logits(negs, torch.zeros_like(negs)))
        params = {n: p for n, p in self.named_parameters() if p.requires_grad}
        got = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        grads = {n: torch.zeros_like(p) if g is None else g  # None: unused (no node had a message yet)
                 for (n, p), g in zip(params.items(), got)}
        mem = z.detach()
        self.memory.update_state(src, dst, t, torch.cat([mem[at[src]] + mem[at[dst]], feat], 1))
        self.memory.detach()
        self.seen[src] = self.seen[dst] = True
        return embed.detach(), pos.detach(), negs.detach(), loss.detach(), grads, row


def expected_grads(g: dict) -> dict:
    """The reference's gradients by gnndist's parameter names (see the module docstring)."""
    d = DIM
    gru = g["memory.gru.weight_ih"]
    return {"memory.updater.cell.weight_ih": torch.cat([gru[:, 2 * d:3 * d] - gru[:, :d], gru[:, 3 * d:]], 1),
            **{f"memory.updater.cell.{n}": g[f"memory.gru.{n}"] for n in ("weight_hh", "bias_ih", "bias_hh")},
            **{f"embedding.layers.0.{mine}.{p}": g[f"conv.lin_{theirs}.{p}"]
               for mine, theirs in (("q", "query"), ("v", "value"), ("skip", "skip")) for p in ("weight", "bias")},
            "embedding.layers.0.k.weight": g["conv.lin_key.weight"],
            "embedding.layers.0.k_context.weight+v_context.weight": g["conv.lin_edge.weight"],
            "predictor.mlp.0.weight": torch.cat([g["lin_src.weight"], g["lin_dst.weight"]], 1),
            "predictor.mlp.0.bias": g["lin_src.bias"],
            "predictor.mlp.2.weight": g["lin_final.weight"], "predictor.mlp.2.bias": g["lin_final.bias"]}


def test_tgn_steps_match_pyg_tgn_components(monkeypatch):
    """Per batch: the query rows' embeddings, the scores, the loss, every parameter's gradient,
    then every node's memory and last update, over consecutive batches."""
    monkeypatch.setattr(pyg_tgn, "scatter_argmax", scatter_argmax)
    tg = graph()
    tr = LinkTrainer(RankEvents.from_graph(tg), LinkConfig(memory_dim=DIM, time_dim=TIME_DIM, num_neighbors=K,
                                                           batch_size=BATCH, quiet=True))
    tr.halves = 1  # the whole batch in this process
    for group in tr.optimizer.param_groups:
        group["lr"] = 0.0
    model = tr.model
    d = DIM
    with torch.no_grad():
        for bias in (model.memory.updater.cell.bias_ih, model.memory.updater.cell.bias_hh):
            bias[2 * d:].zero_()  # the candidate gate's
        att = model.embedding.layers[0]
        att.v_context.weight.copy_(att.k_context.weight)
    ref = Reference(model, tg)
    model.train()
    full_rows = 0
    for index, lo, hi in islice(tr.batches(0, tr.train_end), STEPS):
        neg = train_negatives(0, 1, index, hi - lo, np.arange(hi - lo), tg.dst[lo:hi], tg.num_nodes)
        loss, runs = tr.step(tr.batch(lo, hi, lambda rows, src, dst: neg[rows]), hi - lo)
        fw = runs[0].fw
        embed, pos, negs, ref_loss, ref_grads, row = ref.step(lo, hi, torch.from_numpy(neg))
        full_rows += int((torch.bincount(row) == K).sum())
        torch.testing.assert_close(fw.embed, embed, **TOL, msg=lambda m: f"batch {index} embeddings: {m}")
        torch.testing.assert_close(fw.pos, pos, **TOL, msg=lambda m: f"batch {index} positive scores: {m}")
        torch.testing.assert_close(fw.neg, negs, **TOL, msg=lambda m: f"batch {index} negative scores: {m}")
        assert loss == pytest.approx(float(ref_loss), rel=1e-5, abs=1e-5), f"batch {index} loss"
        grads = {n: torch.zeros_like(p) if p.grad is None else p.grad for n, p in model.named_parameters()
                 if p.requires_grad}
        grads["embedding.layers.0.k_context.weight+v_context.weight"] = (
            grads.pop("embedding.layers.0.k_context.weight") + grads.pop("embedding.layers.0.v_context.weight"))
        want = expected_grads(ref_grads)
        assert grads.keys() == want.keys()
        tol = dict(rtol=1e-5, atol=1e-5 * max(float(g.abs().max()) for g in want.values()))  # to the largest
        for name, g in grads.items():
            torch.testing.assert_close(g, want[name], **tol, msg=lambda m: f"batch {index} gradient of {name}: {m}")
        torch.testing.assert_close(ref_grads["conv.lin_key.bias"], torch.zeros(d), **tol)
        state = tr.state.state
        torch.testing.assert_close(state.memory, ref.memory.memory, **TOL,
                                   msg=lambda m: f"memory after batch {index}: {m}")
        torch.testing.assert_close(state.last_update, ref.memory.last_update.double(), rtol=0, atol=0,
                                   msg=lambda m: f"last update after batch {index}: {m}")
    assert full_rows > 0  # rows with a full window of K neighbours were compared
