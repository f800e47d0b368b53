"""Node-classification GNNs (GraphSAGE mean, GCN, GAT) on sampled, hop-ordered blocks.

A mini-batch is the sampler's output: node ids ordered by hop (the seeds first, then the
nodes first reached at hop 1, hop 2, ...) and one edge list per hop whose targets are all the
nodes reached before it. Layer l of an L-layer model computes the nodes of hops 0..L-1-l from
those of hops 0..L-l over hop L-1-l's edges, so no work is spent on rows that cannot reach a
seed, and a seed's output does not depend on the other seeds of its batch. With fanout -1 (all
neighbours) the seeds' outputs equal a full-graph forward pass of the same layers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import GATConv, GCNConv, SAGEConv

from gnndist.runtime.device import to_device
from gnndist.errors import GnndistError
from gnndist.static.config import MODELS


@dataclass
class MiniBatch:
    """Model input for one batch of seeds.

    `x` [n, F] holds the features of all sampled nodes in hop order; `hop_nodes[h]` is the
    number of nodes first reached at hop h (hop 0: the seeds); `edge_index[h]` [2, E_h]
    (local ids; row 0 source, row 1 target) are the edges sampled at hop h for every node reached
    before it (`samplers.Blocks`), which layer L-1-h aggregates; `deg` [n] the nodes' true
    in-degrees in the whole graph (GCN only).
    """

    x: Tensor
    hop_nodes: list[int]
    edge_index: list[Tensor]
    deg: Optional[Tensor] = None

    @property
    def num_seeds(self) -> int:
        return self.hop_nodes[0]

    def to(self, device: torch.device) -> "MiniBatch":
        return MiniBatch(to_device(self.x, device), self.hop_nodes, [to_device(e, device) for e in self.edge_index],
                         None if self.deg is None else to_device(self.deg, device))


def gcn_edge_weights(edge_index: Tensor, deg: Tensor, num_targets: int) -> tuple[Tensor, Tensor]:
    """Edges with one self loop per target and GCN weights for sampled neighbourhoods.

    Edge u -> v weighs (d_v / s_v) / sqrt((d_u + 1)(d_v + 1)), where d are true in-degrees
    and s_v the number of neighbours sampled for v (an unbiased estimate of the full sum); a
    self loop weighs 1 / (d_v + 1). With all neighbours sampled (s_v = d_v) these are Kipf &
    Welling's symmetric weights, as `torch_geometric`'s `gcn_norm` computes them.
    """
    src, dst = edge_index
    sampled = torch.bincount(dst, minlength=num_targets).to(deg.dtype)
    norm = (deg + 1).rsqrt()
    scale = deg[:num_targets] / sampled.clamp(min=1)
    w = norm[src] * norm[dst] * scale[dst]
    loops = torch.arange(num_targets, device=edge_index.device)
    return (torch.cat([edge_index, torch.stack([loops, loops])], 1),
            torch.cat([w, norm[:num_targets].square()]))


class StaticGNN(nn.Module):
    """An L-layer GraphSAGE (mean), GCN or GAT classifier over `MiniBatch`es.

    GAT uses `heads` attention heads on the hidden layers (concatenated) and one on the
    output layer, with dropout on the attention weights as in Velickovic et al.
    """

    def __init__(self, model: str, in_dim: int, hidden: int, num_classes: int, num_layers: int = 2,
                 dropout: float = 0.5, heads: int = 8) -> None:
        super().__init__()
        if model not in MODELS:
            raise GnndistError(f"unknown model {model!r}; choose from {', '.join(MODELS)}")
        self.model, self.dropout = model, dropout
        self.convs = nn.ModuleList()
        in_dims = [in_dim] + [hidden] * (num_layers - 1)
        if model == "gat" and num_layers > 1 and hidden % heads:
            raise GnndistError(f"GAT hidden size {hidden} must be a multiple of heads {heads}")
        for layer, i in enumerate(in_dims):
            last = layer == num_layers - 1
            o = num_classes if last else hidden
            if model == "sage":
                conv = SAGEConv(i, o, aggr="mean")
            elif model == "gcn":
                conv = GCNConv(i, o, normalize=False, add_self_loops=False)
            elif last:
                conv = GATConv(i, o, heads=1, dropout=dropout)
            else:
                conv = GATConv(i, o // heads, heads=heads, dropout=dropout)
            self.convs.append(conv)

    @property
    def num_layers(self) -> int:
        return len(self.convs)

    def forward(self, batch: MiniBatch) -> Tensor:
        """Logits [num_seeds, num_classes] of the batch's seeds."""
        L = self.num_layers
        if len(batch.hop_nodes) != L + 1 or len(batch.edge_index) != L:
            raise ValueError(f"a {L}-layer model needs {L} hops of blocks, got {len(batch.edge_index)}")
        cum_nodes = torch.tensor(batch.hop_nodes).cumsum(0).tolist()
        h = batch.x
        for layer, conv in enumerate(self.convs):
            n_src, n_dst = cum_nodes[L - layer], cum_nodes[L - 1 - layer]
            h = F.dropout(h[:n_src], self.dropout, self.training)
            ei = batch.edge_index[L - 1 - layer]
            if self.model == "gcn":
                ei, w = gcn_edge_weights(ei, batch.deg[:n_src].to(h.dtype), n_dst)
                h = conv(h, ei, w)[:n_dst]
            else:
                h = conv((h, h[:n_dst]), ei)
            if layer < L - 1:
                h = F.elu(h) if self.model == "gat" else F.relu(h)
        return h
