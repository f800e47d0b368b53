"""Node-classification models on sampled blocks, against full-graph PyG references."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch_geometric.nn.conv.gcn_conv import gcn_norm

from gnndist import GnndistError
from gnndist.graph import Graph, TemporalGraph
from gnndist.static.trainer import WholeGraph, NodeConfig, NodeTrainer, check_node_graph
from gnndist.static.config import MODEL_DEFAULTS


def small_graph(n: int = 60, m: int = 200, f: int = 8, c: int = 3, seed: int = 0) -> Graph:
    """A random undirected graph without self loops, with features, labels and masks."""
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    keep = src != dst
    split = rng.integers(0, 3, n)
    return Graph.from_edges(src[keep], dst[keep], n, undirected=True, dedup=True,
                            x=rng.normal(size=(n, f)).astype(np.float32), y=rng.integers(0, c, n),
                            train_mask=split == 0, val_mask=split == 1, test_mask=split == 2)


def full_graph_logits(model, graph: Graph) -> torch.Tensor:
    """The same layers run on the whole graph the PyG way (gcn_norm for GCN)."""
    h = torch.from_numpy(graph.x)
    ei = torch.from_numpy(np.stack(graph.edges()))
    for i, conv in enumerate(model.convs):
        if model.model == "gcn":
            e, w = gcn_norm(ei, num_nodes=graph.num_nodes, add_self_loops=True)
            h = conv(h, e, w)
        else:
            h = conv(h, ei)
        if i < len(model.convs) - 1:
            h = F.elu(h) if model.model == "gat" else F.relu(h)
    return h


@pytest.mark.parametrize("model", ["sage", "gcn", "gat"])
@pytest.mark.parametrize("layers", [1, 2, 3])
def test_full_fanout_blocks_equal_a_full_graph_forward(model, layers):
    g = small_graph()
    trainer = NodeTrainer(WholeGraph(g), NodeConfig.for_model(model, fanouts=[5] * layers, hidden=16))
    ref = full_graph_logits(trainer.model.eval(), g)
    seeds = np.random.default_rng(1).permutation(g.num_nodes)[:17]
    got = trainer.logits(seeds)
    assert got.shape == (17, g.num_classes)
    torch.testing.assert_close(got, ref[seeds], atol=1e-5, rtol=1e-4)


def test_row_normalisation_is_automatic_for_non_negative_features():
    g = small_graph()
    g.x = np.abs(g.x)
    auto = NodeTrainer(WholeGraph(g), NodeConfig.for_model("sage"))
    off = NodeTrainer(WholeGraph(g), NodeConfig.for_model("sage", row_norm="off"))
    assert auto.row_norm and not off.row_norm
    assert not NodeTrainer(WholeGraph(small_graph()), NodeConfig.for_model("sage")).row_norm
    ref = full_graph_logits(auto.model.eval(), g)
    g.x = g.x / g.x.sum(1, keepdims=True)
    torch.testing.assert_close(auto.logits(np.arange(g.num_nodes)), full_graph_logits(auto.model, g), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(off.logits(np.arange(g.num_nodes)), ref, atol=1e-5, rtol=1e-4)


def test_sampled_gcn_aggregation_is_unbiased():
    # one linear GCN layer: the mean over many neighbour samples approaches the full result
    g = small_graph(n=30, m=300)
    trainer = NodeTrainer(WholeGraph(g), NodeConfig.for_model("gcn", fanouts=[3], hidden=4))
    seeds = np.flatnonzero(g.degrees() >= 8)[:5]
    full = trainer.logits(seeds, [-1])
    draws = torch.stack([trainer.logits(seeds, [3], seed=s) for s in range(400)])
    stderr = draws.std(0) / 400 ** 0.5
    assert (draws[0] - full).abs().max() > 10 * stderr.max()  # one sample is off...
    assert ((draws.mean(0) - full).abs() <= 4 * stderr + 1e-5).all()  # ...their mean is not


def test_training_improves_loss_for_every_model():
    g = small_graph(n=120, m=500)
    for model in ("sage", "gcn", "gat"):
        # without dropout: with it, 5 epochs of this small graph end above the first epoch's loss for
        # 1-4 of 8 seeds per model, whichever batch order (with it off, 0 of 8)
        trainer = NodeTrainer(WholeGraph(g), NodeConfig.for_model(model, batch_size=20, hidden=16, quiet=True,
                                                                  dropout=0.0))
        first = trainer.train_epoch(1)["loss"]
        for e in range(2, 6):
            last = trainer.train_epoch(e)
        assert last["loss"] < first, model
        assert last["nodes_per_s"] > 0 and last["cache_hit_rate"] is None and last["remote_bytes"] == 0


def test_an_epoch_cuts_every_training_node_once_into_full_batches():
    g = small_graph(n=120, m=500)
    trainer = NodeTrainer(WholeGraph(g), NodeConfig.for_model("sage", batch_size=7, hidden=8, quiet=True))
    train = np.flatnonzero(g.train_mask)
    chunks = [trainer._epoch_chunks(e) for e in (1, 2)]
    for c in chunks:
        assert [s.size for s in c] == [7] * (train.size // 7) + ([train.size % 7] if train.size % 7 else [])
        assert np.array_equal(np.sort(np.concatenate(c)), train)
    assert not np.array_equal(np.concatenate(chunks[0]), np.concatenate(chunks[1]))  # a new order each epoch


def test_a_config_takes_its_models_defaults():
    """NodeConfig(model=M) is what `gnndist train --model M` runs: M's lr, hidden size and
    dropout (it took GraphSAGE's), each still given explicitly where wanted."""
    for model, defaults in MODEL_DEFAULTS.items():
        cfg = NodeConfig(model=model)
        assert (cfg.lr, cfg.hidden, cfg.dropout) == (defaults["lr"], defaults["hidden"], defaults["dropout"])
        assert cfg == NodeConfig.for_model(model)
    assert NodeConfig(model="gat").lr == 0.005 and NodeConfig(model="gat", lr=0.1, dropout=0.0).dropout == 0.0


def test_graphs_without_node_data_are_refused():
    with pytest.raises(GnndistError, match="temporal graph"):
        check_node_graph(TemporalGraph([0, 1], [1, 2], [1.0, 2.0]))
    g = small_graph()
    g.val_mask = None
    with pytest.raises(GnndistError, match="no val_mask"):
        WholeGraph(g)
    with pytest.raises(GnndistError, match="--model sage\\|gcn\\|gat"):
        NodeConfig.for_model("tgn")
    with pytest.raises(GnndistError, match="--eval-fanouts needs 2"):
        NodeConfig.for_model("sage", fanouts=[5, 5], eval_fanouts=[-1])
