"""What one node-classification rank allocates (`node_footprint`), for `gnndist.footprint`'s check.

Besides the model and the feature cache, a step's tensors, bounded from above: the sampled
nodes and edges of each hop are at most what the fanouts, the largest degree and the graph's
own node and edge counts allow (fanout -1, evaluation's full neighbourhoods: every neighbour);
on those, each layer's tensors as its convolution makes them (`layer_bytes`). A training step
holds every layer's tensors until its backward pass and as much again in their gradients;
an evaluation batch (no gradients) holds one layer's at a time. The larger of the two counts.
"""
from __future__ import annotations

from typing import Any

import torch

from gnndist.footprint import Footprint, Part, model_bytes, sizing
from gnndist.runtime import dist
from gnndist.samplers.cache import capacity_rows
from gnndist.static.models import StaticGNN

GAT_HEADS = 8  # StaticGNN's default, on the hidden layers (one on the output layer)


def hop_sizes(seeds: int, fanouts: list[int], num_nodes: int, num_edges: int, max_degree: int
              ) -> tuple[list[int], list[int]]:
    """At most how many nodes are new at each hop (hop 0: the seeds) and how many edges are
    sampled at each hop, around `seeds` seeds: hop h draws for every node reached before it, so
    each hop takes at most every CSR entry, and all hops together reach every node once."""
    nodes, edges = [seeds], []
    for f in fanouts:
        per = max_degree if f < 0 else min(f, max_degree)
        edges.append(min(sum(nodes) * per, num_edges))
        nodes.append(min(edges[-1], num_nodes - sum(nodes)))
    return nodes, edges


def layer_bytes(model: str, sources: int, targets: int, edges: int, width_in: int, width_out: int,
                heads: int, training: bool) -> int:
    """The tensors one layer makes: from `sources` input rows of `width_in` floats, over `edges`
    sampled edges, `targets` output rows of `width_out` (as PyG's SAGEConv, GCNConv and GATConv
    compute them: gathered rows per edge, scatter sums, the linear maps, the activation), and
    in training its dropout (output and mask); `heads`: GAT's attention heads."""
    f, i = 4, 8  # bytes of a float32 and of an int64
    drop = sources * width_in * (f + 1) if training else 0
    if model == "sage":  # x_j per edge, the mean (sum, count, quotient), lin_l, lin_r, their sum, act
        return drop + edges * (width_in * f + f) + 2 * targets * width_in * f + 4 * targets * width_out * f
    loops = edges + targets  # gcn_edge_weights and GATConv each add a self loop per target
    if model == "gcn":  # lin over all sources, x_j and x_j * w per edge, the scatter and the bias (over
        # all sources: one-sided GCNConv), the act; the weighted edge list
        return drop + 3 * sources * width_out * f + 2 * loops * width_out * f + targets * width_out * f \
            + loops * (2 * i + 4 * f)
    # lin of sources and targets and their attention products, x_j and x_j * alpha per edge, the
    # edge scores (sums, leaky relu, softmax, dropout), the scatter, bias and act; the edge lists
    return (drop + 2 * (sources + targets) * width_out * f + 2 * loops * width_out * f
            + 8 * loops * heads * f + 3 * targets * width_out * f + 3 * loops * 2 * i)


def batch_bytes(cfg: Any, graph: Any, seeds: int, fanouts: list[int], training: bool, widths: list[int]) -> int:
    """A batch of `seeds` seeds on this rank: the sampled blocks and the features of their
    nodes (twice: the sampler's and the loader's copies), and the layers' tensors: all of them
    and their gradients in training, one layer at a time in evaluation."""
    nodes, edges = hop_sizes(seeds, fanouts, graph.num_nodes, graph.num_edges, graph.max_degree)
    layers = len(fanouts)
    inputs = 2 * (8 * sum(nodes) + 16 * sum(edges) + 4 * sum(nodes) * (graph.num_features + 1))
    inputs *= 2 if cfg.prefetch else 1  # the next batch is made while this one runs
    per_layer = [layer_bytes(cfg.model, sum(nodes[:layers - l + 1]), sum(nodes[:layers - l]),
                             edges[layers - 1 - l], widths[l], widths[l + 1],
                             GAT_HEADS if l < layers - 1 else 1, training)
                 for l in range(layers)]  # layer l aggregates hop L-1-l's edges
    edge_list = 16 * sum(edges)  # the hops' edges
    if training:
        return inputs + edge_list + 2 * sum(per_layer)
    return inputs + edge_list + max(per_layer)


def node_footprint(graph: Any, cfg: Any, device: torch.device = torch.device("cpu")) -> Footprint:
    """What one node-classification rank allocates for its `RankGraph` and `NodeConfig`."""
    what = f"the {cfg.model} trainer"
    layers = len(cfg.fanouts)
    with sizing(what, "--hidden"):
        model = StaticGNN(cfg.model, graph.num_features, cfg.hidden, graph.num_classes,
                          num_layers=layers, dropout=cfg.dropout)
    widths = [graph.num_features] + [cfg.hidden] * (layers - 1) + [graph.num_classes]
    device = torch.device(device)
    params = [p.numel() * p.element_size() for p in model.parameters()]
    # beside the batch: the best-validation copy of the parameters, the gradient sum over ranks
    # (sent and received) and Adam's temporaries (on the CPU one parameter at a time, elsewhere
    # all at once): three of a parameter's size
    step = sum(params) + (2 * sum(params) if dist.world_size() > 1 else 0) + 3 * (
        max(params) if device.type == "cpu" else sum(params))
    train = step + batch_bytes(cfg, graph, min(cfg.batch_size, graph.train_ids.size), cfg.fanouts, True, widths)
    eval_seeds = min(-(-cfg.eval_batch_size // dist.world_size()), max(graph.val_ids.size, graph.test_ids.size))
    evaluate = batch_bytes(cfg, graph, eval_seeds, cfg.eval_fanouts or [-1] * layers, False, widths)
    if train >= evaluate:
        batch = Part("a training step's tensors (at most)", train, "--hidden, --batch-size or --fanouts")
    else:
        batch = Part(f"an evaluation batch's tensors (at most, over "
                     f"{'--eval-fanouts' if cfg.eval_fanouts else 'full neighbourhoods'})", evaluate,
                     "--hidden, --eval-batch-size or --eval-fanouts")
    store = getattr(graph, "dist_features", None)  # the remote features of a part (none in one process)
    cache = 0
    if store is not None and cfg.cache != "none":
        cache = capacity_rows(cfg.cache_size, store.num_remote, store.row_bytes) * store.row_bytes
    return Footprint(what, device, [
        Part("model with gradients and Adam state", model_bytes(model), "--hidden"), batch,
        Part("feature cache", cache, "--cache-size", on_device=False)])
