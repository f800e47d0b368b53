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
n_id, edge_index = blocks.to_pyg()
x = torch.from_numpy(g.x)[n_id]
conv1, conv2 = SAGEConv(g.num_features, 64), SAGEConv(64, g.num_classes)
logits = conv2(conv1(x, edge_index).relu(), edge_index)[: len(seeds)]
print(f"{len(seeds)} seeds, {len(n_id)} sampled nodes, {edge_index.shape[1]} edges -> logits {tuple(logits.shape)}")
