"""Model selection: early stopping on a scripted validation curve stops at the right epoch, the
test metrics are the best-validation parameters', and the learning-rate schedule and gradient
clipping do what they say."""
import math

import numpy as np
import torch

from gnndist.datasets import load
from gnndist.static.trainer import NodeConfig, NodeTrainer, WholeGraph
from gnndist.temporal.config import LinkConfig
from gnndist.temporal.events import RankEvents
from gnndist.temporal.fit import fit
from gnndist.temporal.trainer import LinkTrainer

CURVE = [3, 1, 2, 2, 2, 1, 1]  # validation AP 1 / rank: best at epoch 2, no better one in 3, 4


def params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


class Scripted(LinkTrainer):
    """Validation scores that give AP = 1 / CURVE[epoch - 1] (one positive under that many - 1
    negatives); records the parameters after each epoch, those that score the test events, and
    the learning rate of each epoch."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.after, self.tested, self.lrs = {}, None, []

    def train_epoch(self, epoch):
        rec = super().train_epoch(epoch)
        self.after[epoch] = params(self.model)
        self.lrs.append(self.optimizer.param_groups[0]["lr"])
        return rec

    def evaluate(self, start, stop, desc, score=True):
        out = super().evaluate(start, stop, desc, score)
        if desc == "val":
            return np.zeros(1), np.ones((CURVE[len(self.after) - 1] - 1, 1)), np.zeros(1, np.int64)
        if desc == "test":
            self.tested = params(self.model)
        return out


def test_early_stopping_selects_the_best_validation_epoch():
    tg = load("synthetic-temporal", num_nodes=50, num_events=800, edge_dim=2)
    cfg = LinkConfig(model="jodie", epochs=7, patience=2, memory_dim=8, time_dim=8, batch_size=100, quiet=True)
    tr = Scripted(RankEvents.from_graph(tg), cfg)
    m = fit(tr)
    assert [e["epoch"] for e in m["epochs"]] == [1, 2, 3, 4]  # epochs 3 and 4 brought nothing better
    assert m["selected_epoch"] == 2 and m["stop_reason"] == "patience"
    assert [e["val_ap"] for e in m["epochs"]] == [1 / 3, 1.0, 0.5, 0.5]
    assert torch.equal(tr.tested, tr.after[2]) and not torch.equal(tr.after[2], tr.after[4])
    cfg = LinkConfig(model="jodie", epochs=3, memory_dim=8, time_dim=8, batch_size=100, quiet=True)
    m = fit(Scripted(RankEvents.from_graph(tg), cfg))
    assert m["stop_reason"] == "epochs" and len(m["epochs"]) == 3
    cfg = LinkConfig(model="jodie", epochs=4, patience=2, memory_dim=8, time_dim=8, batch_size=100, quiet=True)
    m = fit(Scripted(RankEvents.from_graph(tg), cfg))  # the patience runs out with the last epoch: it ran them all
    assert m["stop_reason"] == "epochs" and len(m["epochs"]) == 4


def test_cosine_schedule_and_clipping():
    tg = load("synthetic-temporal", num_nodes=50, num_events=800, edge_dim=2)
    cfg = LinkConfig(model="jodie", epochs=4, memory_dim=8, time_dim=8, batch_size=100, quiet=True,
                     lr=0.01, lr_schedule="cosine", clip_grad=1e-3)
    tr = Scripted(RankEvents.from_graph(tg), cfg)
    norms = []
    step = tr.step

    def clipped_step(batch, b, ahead=None):
        out = step(batch, b, ahead)
        norms.append(torch.norm(torch.stack([p.grad.norm() for p in tr.params if p.grad is not None])).item())
        return out
    tr.step = clipped_step
    fit(tr)
    assert np.allclose(tr.lrs, [0.01 * 0.5 * (1 + math.cos(math.pi * e / 4)) for e in range(4)])
    assert max(norms) <= 1e-3 * (1 + 1e-5)


class ScriptedNode(NodeTrainer):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.calls, self.after, self.tested = 0, {}, None

    def train_epoch(self, epoch, on_step=None):
        rec = super().train_epoch(epoch, on_step)
        self.after[epoch] = params(self.model)
        return rec

    def evaluate(self, ids, phase=0):
        if ids is self.graph.val_ids:
            self.calls += 1
            return 1 / CURVE[self.calls - 1]
        self.tested = params(self.model)
        return super().evaluate(ids, phase)


def test_node_early_stopping_selects_the_best_validation_epoch():
    g = load("synthetic-static", num_nodes=200, num_edges=800)
    cfg = NodeConfig.for_model("sage", epochs=7, patience=2, quiet=True)
    tr = ScriptedNode(WholeGraph(g), cfg)
    m = tr.fit(log=lambda s: None)
    assert [e["epoch"] for e in m["epochs"]] == [1, 2, 3, 4]
    assert m["selected_epoch"] == m["test"]["best_epoch"] == 2 and m["stop_reason"] == "patience"
    assert torch.equal(tr.tested, tr.after[2]) and not torch.equal(tr.after[2], tr.after[4])
    m = ScriptedNode(WholeGraph(g), NodeConfig.for_model("sage", epochs=4, patience=2, quiet=True)).fit(log=lambda s: None)
    assert m["stop_reason"] == "epochs" and len(m["epochs"]) == 4  # the patience ran out with the last epoch
