"""Link prediction on a temporal graph (`gnndist train DATA --task link`): the training loop,
evaluation protocol, checkpoints and CLI glue around the models of `gnndist.temporal.models`.

Chronological 70/15/15 split. Each epoch resets the node state, trains on the training events
in time order, then evaluates on the validation events while the memory keeps absorbing the
true events; after the last epoch the test events follow the same way. Validation and test
negatives are fixed per seed; training negatives are drawn per (seed, epoch, global batch).
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from gnndist import checkpoint
from gnndist.errors import GnndistError
from gnndist.graph import TemporalGraph
from gnndist.io import show_progress, write_json
from gnndist.temporal.linkpred import eval_negatives, link_metrics, train_negatives
from gnndist.launch import Outputs
from gnndist.temporal.config import LinkConfig
from gnndist.temporal.state import NodeState
from gnndist.samplers.temporal import sample_tcsr
from gnndist.temporal.models import SPECS, TGNN, Batch, Forward, SampleFn



def make_sampler(tg: TemporalGraph, strategy: str, seed: int) -> SampleFn:
    """Temporal neighbour sampling over the graph's T-CSR (strictly earlier than each query)."""
    tcsr = tg.tcsr()
    return lambda nodes, times, k, hop: sample_tcsr(*tcsr, nodes, times, k, strategy, seed, hop)


def batch_loss(fw: Forward, global_batch: int) -> torch.Tensor:
    """Binary cross-entropy summed over the positives and negatives, divided by the GLOBAL
    batch size, so that ranks holding parts of one batch add up to the whole batch's loss."""
    return (F.binary_cross_entropy_with_logits(fw.pos, torch.ones_like(fw.pos), reduction="sum")
            + F.binary_cross_entropy_with_logits(fw.neg, torch.zeros_like(fw.neg), reduction="sum")) / global_batch


@dataclass
class LinkTask:
    """Everything one training run works on."""

    tg: TemporalGraph
    model: TGNN
    state: Optional[NodeState]
    optimizer: torch.optim.Optimizer
    sample: SampleFn
    edge_feat: torch.Tensor
    train_end: int
    val_end: int
    batch_size: int
    seed: int
    device: torch.device
    progress: bool

    def batches(self, start: int, stop: int):
        for index, s in enumerate(range(start, stop, self.batch_size)):
            yield index, s, min(s + self.batch_size, stop)

    def _bar(self, total: int, desc: str) -> tqdm:
        return tqdm(total=total, desc=desc, unit="ev", leave=False, disable=not self.progress)

    # per-batch steps, replaced by the distributed task (gnndist.temporal.dist_trainer.DistLinkTask)
    def batch(self, index: int, start: int, stop: int, neg: np.ndarray) -> Batch:
        """The events of global batch `index` ([start, stop)) this process scores, with `neg`."""
        return Batch.from_graph(self.tg, start, stop, neg, self.device)

    def forward(self, batch: Batch) -> Forward:
        return self.model(self.state, batch, self.sample, self.edge_feat)

    def write(self, batch: Batch, fw: Forward) -> None:
        self.model.write(self.state, batch, fw, self.edge_feat)

    def sync_gradients(self) -> None:
        """Between backward and the optimizer step: nothing in one process (ranks sum theirs)."""

    def train_epoch(self, epoch: int) -> float:
        """One pass over the training events from a reset state; the mean loss per event."""
        self.model.train()
        if self.state is not None:
            self.state.reset()
        total = 0.0
        with self._bar(self.train_end, f"epoch {epoch}") as bar:
            for index, s, e in self.batches(0, self.train_end):
                neg = train_negatives(self.seed, epoch, index, self.tg.dst[s:e], self.tg.num_nodes)
                batch = self.batch(index, s, e, neg)
                fw = self.forward(batch)
                loss = batch_loss(fw, e - s)
                if not torch.isfinite(loss):
                    raise GnndistError(f"training loss became {loss.item()} at epoch {epoch}, batch {index}; "
                                       "try a smaller --lr")
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.sync_gradients()
                self.optimizer.step()
                self.write(batch, fw)
                total += loss.item() * (e - s)
                bar.update(e - s)
        return total / max(self.train_end, 1)

    @torch.no_grad()
    def evaluate(self, start: int, stop: int, negatives: np.ndarray, desc: str) -> tuple[np.ndarray, np.ndarray]:
        """Scores of the events [start, stop) and of their fixed negatives [E, n]; the node
        state absorbs the true events as it goes."""
        self.model.eval()
        pos, neg = [], []
        with self._bar(stop - start, desc) as bar:
            for index, s, e in self.batches(start, stop):
                batch = self.batch(index, s, e, negatives[s - start:e - start])
                fw = self.forward(batch)
                self.write(batch, fw)
                pos.append(fw.pos.cpu().numpy())
                neg.append(fw.neg.cpu().numpy())
                bar.update(e - s)
        n = negatives.shape[1]
        return (np.concatenate(pos) if pos else np.zeros(0, np.float32),
                np.concatenate(neg) if neg else np.zeros((0, n), np.float32))


def _config(cfg: LinkConfig, tg: TemporalGraph) -> dict[str, Any]:
    """The settings a resumed run must share with the run that wrote the checkpoint."""
    return {"model": cfg.model, "batch_size": cfg.batch_size, "lr": cfg.lr, "memory_dim": cfg.memory_dim,
            "time_dim": cfg.time_dim, "num_neighbors": cfg.num_neighbors, "neg": cfg.neg, "seed": cfg.seed,
            "num_nodes": tg.num_nodes, "num_events": tg.num_events, "edge_dim": tg.edge_dim}


def _json_safe(metrics: dict[str, float]) -> dict[str, Optional[float]]:
    """NaN (an empty subset) as null, which JSON can hold."""
    return {k: (None if v != v else v) for k, v in metrics.items()}


def _table(rows: list[tuple[str, dict[str, float]]]) -> str:
    lines = [f"{'':<22}{'AP':>8}{'AUC':>8}{'MRR':>8}"]
    lines += [f"{name:<22}" + "".join(f"{m[k]:>8.4f}" for k in ("ap", "auc", "mrr")) for name, m in rows]
    return "\n".join(lines)


def run(cfg: LinkConfig, outputs: Outputs, tg: TemporalGraph, world: Optional[Any] = None) -> dict[str, Any]:
    """Train, evaluate, print the table, and write --metrics-out and --checkpoint; returns the
    metrics. With `world` (a `gnndist.temporal.dist_trainer.World`) this is one rank of a distributed run."""
    from gnndist import dist
    from gnndist.datasets import chronological_split, new_nodes_after

    train_end, val_end = chronological_split(tg)
    if train_end < 1 or val_end <= train_end or val_end >= tg.num_events:
        raise GnndistError(f"{tg.num_events} events are too few for a 70/15/15 split")
    device = dist.setup(cfg.device)
    torch.manual_seed(cfg.seed)
    spec = SPECS[cfg.model]
    model = TGNN(cfg.model, tg.num_nodes, tg.edge_dim, cfg.memory_dim, cfg.time_dim, cfg.num_neighbors).to(device)
    edge_feat = (torch.from_numpy(tg.edge_feat) if tg.edge_feat is not None
                 else torch.zeros(tg.num_events, 0)).to(device)
    lead = world is None or world.rank == 0  # prints and writes the metrics
    state = model.new_state(float(tg.t[0]), device) if world is None else world.new_state(model, float(tg.t[0]), device)
    task = (LinkTask if world is None else world.task)(
        tg, model, state, torch.optim.Adam(model.parameters(), lr=cfg.lr, fused=True), make_sampler(tg, spec.strategy, cfg.seed),
        edge_feat, train_end, val_end, cfg.batch_size, cfg.seed, device,
        progress=lead and show_progress(cfg.quiet))
    config = _config(cfg, tg) | ({} if world is None else world.summary())
    ckpt_dir = outputs.checkpoint if world is None or not outputs.checkpoint else world.checkpoint_dir(outputs.checkpoint)
    history: list[dict[str, Any]] = []
    first = 1
    if outputs.resume:
        ckpt = checkpoint.load(ckpt_dir)
        for key, value in config.items():
            if ckpt["config"].get(key) != value:
                raise GnndistError(f"checkpoint in {outputs.checkpoint} was written with {key}={ckpt['config'].get(key)}, "
                                   f"this run has {key}={value}")
        model.load_state_dict(ckpt["model"])
        task.optimizer.load_state_dict(ckpt["optimizer"])
        if task.state is not None:
            task.state.load_state_dict(ckpt["node_state"])
        checkpoint.set_rng_state(ckpt["rng"])
        history, first = list(ckpt["history"]), int(ckpt["epoch"]) + 1
        if world is not None:
            world.check_resume(first)

    val_neg = eval_negatives(tg, train_end, val_end, cfg.neg, cfg.eval_negatives, cfg.seed)
    test_neg = eval_negatives(tg, val_end, tg.num_events, cfg.neg, cfg.eval_negatives, cfg.seed)
    for epoch in range(first, cfg.epochs + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        loss = task.train_epoch(epoch)
        seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
        val = link_metrics(*task.evaluate(train_end, val_end, val_neg, "val"))
        history.append({"epoch": epoch, "loss": loss, "time_s": seconds, "cpu_s": cpu_seconds,
                        "events_per_s": train_end / seconds,
                        "val_ap": val["ap"], "val_auc": val["auc"], "val_mrr": val["mrr"],
                        **({} if world is None else task.figures())})
        if lead and not cfg.quiet:
            print(f"epoch {epoch}: loss {loss:.4f}, {train_end / seconds:,.0f} events/s, "
                  f"val AP {val['ap']:.4f} AUC {val['auc']:.4f} MRR {val['mrr']:.4f}", file=sys.stderr)
        if outputs.checkpoint:
            checkpoint.save(ckpt_dir, {
                "config": config, "epoch": epoch, "model": model.state_dict(),
                "optimizer": task.optimizer.state_dict(),
                "node_state": None if task.state is None else task.state.state_dict(),
                "rng": checkpoint.rng_state(), "history": history})
    if not history:
        raise GnndistError(f"the checkpoint already holds {first - 1} epochs; ask for more with --epochs")
    pos, neg = task.evaluate(val_end, tg.num_events, test_neg, "test")
    new = new_nodes_after(tg, train_end)
    inductive = np.isin(tg.src[val_end:], new) | np.isin(tg.dst[val_end:], new)
    test, test_new = link_metrics(pos, neg), link_metrics(pos[inductive], neg[inductive])
    last = history[-1]
    metrics = {"task": "link", "model": cfg.model, "world_size": 1, **({} if world is None else world.summary()),
               "neg": cfg.neg, "config": config, "epochs": history,
               "test": {**_json_safe(test), **{f"inductive_{k}": v for k, v in _json_safe(test_new).items()},
                        "inductive_events": int(inductive.sum())}}
    if lead:
        print(_table([("val", {"ap": last["val_ap"], "auc": last["val_auc"], "mrr": last["val_mrr"]}),
                      ("test", test), (f"test new nodes ({int(inductive.sum())})", test_new)]))
        if outputs.metrics_out:
            write_json(outputs.metrics_out, metrics)
    return metrics
