"""Sample 2-hop neighbourhoods with gnndist and run a PyG GraphSAGE on them.

    python examples/sample_and_embed.py cora      # a dataset name or a file; none: built-in data
"""
import sys

import numpy as np
import torch
from torch_geometric.nn import SAGEConv

from gnndist.datasets import load
from gnndist.samplers import sample_neighbors

g = load(sys.argv[1] if len(sys.argv) > 1 else "synthetic-static")
seeds = np.flatnonzero(g.train_mask)[:64]
blocks = sample_neighbors(g, seeds, [15, 10], seed=0)
n_id, (ei1, ei2) = blocks.to_pyg()  # one edge_index per layer, the first layer's first
x = torch.from_numpy(g.x)[n_id]
conv1, conv2 = SAGEConv(g.num_features, 64), SAGEConv(64, g.num_classes)
logits = conv2(conv1(x, ei1).relu(), ei2)[: len(seeds)]
print(f"{len(seeds)} seeds, {len(n_id)} sampled nodes, {ei1.shape[1] + ei2.shape[1]} edges -> logits {tuple(logits.shape)}")
