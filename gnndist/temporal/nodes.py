"""Node tasks on temporal graphs, on the node embeddings of a trained link model, as TGN's paper
and TGL (`train_node.py`) run them: the same run first trains the link model (`fit`, with its
checkpoints and model selection), then a decoder (`Decoder`, an MLP) on the selected link
model's frozen embeddings.

- `node` (dynamic node classification): every event with a label (`edge_label`; JODIE's
  `state_label`: the state of the event's source, e.g. a Wikipedia user banned after the edit)
  asks for its source's class. The source is embedded as the link model embeds it when it
  scores the event (memory of the batches before, neighbours before the event's time), in one
  pass over the events, as TGN's `train_supervised.py` does. Two classes: AUC (and AP); more:
  accuracy and macro F1. The split is the link model's (the events' 70/15/15).
- `node-property` (TGB's node property prediction, tgbn-*): at each label time t, a node's label
  is a distribution over the classes (its interactions in the coming period: `NodeLabels`). The
  node is embedded at t after every event before t (`Replay`), the decoder scores the classes,
  and the scores are ranked: NDCG@10 of the nodes labelled at a time (sklearn's `ndcg_score`,
  which py-tgb's Evaluator calls), averaged over the label times, as TGB's examples average
  it. A label belongs to the period of the first event at or after its time (TGB's split with a
  TGB dataset); a label after the last event is left out (TGB's examples never ask for it).

With W ranks each rank embeds the rows of its own events or nodes, a decoder minibatch holds the
same rows as in one process (a row's batch, and its dropout mask, come from a hash of the seed,
the epoch and the row's key), and the decoder's gradients are summed over the ranks as the link
model's are: W ranks train the decoder one process trains, up to float rounding.
"""
from __future__ import annotations

import copy
import math
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple, Optional, Union

import numpy as np
import torch
import torch.nn.functional as F

from gnndist import checkpoint, resume
from gnndist.datasets import DataSource
from gnndist.datasets.tgb import NodeLabels
from gnndist.errors import GnndistError
from gnndist.graph import TemporalGraph
from gnndist.outputs import Outputs
from gnndist.partition import RankPart, is_store
from gnndist.predict import Checkpoint, SavedModel, gather_rows, saved_model, source_of
from gnndist.runtime import dist, threads
from gnndist.runtime.device import to_device
from gnndist.runtime.launch import Data, run_job
from gnndist.samplers import sampler_group
from gnndist.samplers.distributed import Requests
from gnndist.temporal.config import NODE_TASKS, DecoderConfig, LinkConfig
from gnndist.temporal.fit import SPLIT, _json_safe, fit, rank_events
from gnndist.temporal.linkpred import ranking_metrics
from gnndist.temporal.predict import Replay, events_before, run_saved, saved_trainer
from gnndist.temporal.protocol import Protocol, protocol_folder
from gnndist.temporal.trainer import LinkTrainer
from gnndist.validate import check_type

PERIODS = ("train", "val", "test")
NDCG_K = 10  # TGB's NDCG@10
_GOLDEN = 0x9E3779B97F4A7C15


# ------------------------------------------------------------------------------------------ labelled rows

class Rows(NamedTuple):
    """A rank's labelled rows: embeddings [R, d], each row's key (the same in any world size),
    period (0 train, 1 val, 2 test) and target (a class [R]; or, for node properties, a
    distribution [R, C] held sparse: `cls`/`weight` of row r at `ptr[r]:ptr[r+1]`), and, for node
    properties, the label time (its index among all ranks' label times) of each row."""

    emb: torch.Tensor
    key: np.ndarray
    period: np.ndarray
    y: Optional[np.ndarray] = None
    ptr: Optional[np.ndarray] = None
    cls: Optional[np.ndarray] = None
    weight: Optional[np.ndarray] = None
    time: Optional[np.ndarray] = None

    def target(self, idx: np.ndarray, num_classes: int, device: torch.device) -> torch.Tensor:
        """The targets of rows `idx`: classes, or the distributions made dense [len, C]."""
        if self.y is not None:
            return to_device(self.y[idx], device)
        counts = self.ptr[idx + 1] - self.ptr[idx]
        at = np.repeat(self.ptr[idx] - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
        dense = np.zeros((idx.size, num_classes), np.float32)
        np.add.at(dense, (np.repeat(np.arange(idx.size), counts), self.cls[at]), self.weight[at])
        total = dense.sum(1, keepdims=True)
        return to_device(np.divide(dense, total, out=np.zeros_like(dense), where=total > 0), device)


def _periods(first_event: np.ndarray, trainer: LinkTrainer) -> np.ndarray:
    """The period of rows given the first event at or after them: 0 train, 1 val, 2 test, 3 none."""
    return np.searchsorted([trainer.train_end, trainer.val_end, trainer.events.num_events], first_event,
                           side="right").astype(np.int8)


@torch.no_grad()
@threads.job_threads()
def event_rows(trainer: LinkTrainer, labels: bool = True) -> Rows:
    """The rows of dynamic node classification on this rank: the source embedding of every event
    it scores in one pass over all events (the node state reset first), with the event's label
    from the rank that holds it (`labels=False`: none, for predictions). A collective."""
    ev = trainer.events
    trainer.reset_state()
    emb, eid, src = [torch.zeros((0, trainer.model.dim))], [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for runs in trainer.eval_runs(0, ev.num_events, "embed"):
        for r in runs:
            b = r.half.src.shape[0]
            # copies, as `LinkTrainer.evaluate` keeps them
            emb.append(r.fw.embed[:b].float().cpu().clone())
            eid.append(r.half.eid.cpu().numpy().copy())
            src.append(r.half.on_host()[0].copy())
    eid, src = np.concatenate(eid), np.concatenate(src)
    y = None
    if labels:
        asked = Requests(eid, ev.book.owner(src), sampler_group())  # the owner of the source holds the event
        y = asked.reply(ev.edge_label[np.searchsorted(ev.eid, asked.received)].astype(np.int64))
    return Rows(torch.cat(emb), eid, _periods(eid, trainer), y)


class LabelSource:
    """Where a rank reads the node labels of a node-property task: the converted arrays of a
    dataset by name (`folder`, memory-mapped: a rank keeps the rows of its own nodes), or the
    `NodeLabels` of a graph in memory."""

    def __init__(self, folder: Optional[str] = None, labels: Optional[NodeLabels] = None) -> None:
        self.folder, self.labels = folder, labels

    def owned(self, ev) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
        """(t, node (new ids), class, weight) of the label rows of the nodes `ev` owns, and the
        class count."""
        if self.labels is not None:
            a, num_classes = [self.labels.t, self.labels.node, self.labels.cls, self.labels.weight], \
                self.labels.num_classes
        else:
            import json

            folder = Path(self.folder)
            a = [np.load(folder / f"node_labels.{k}.npy", mmap_mode="r") for k in ("t", "node", "cls", "weight")]
            num_classes = int(json.loads((folder / "meta.json").read_text())["num_classes"])
        step = 1 << 20
        mine = np.concatenate([np.flatnonzero(ev.owns(ev.orig_to_new[np.asarray(a[1][i:i + step])])) + i
                               for i in range(0, len(a[1]), step)] or [np.zeros(0, np.int64)])
        t, node, cls, weight = (np.asarray(x[mine]) for x in a)
        return t.astype(np.float64), ev.orig_to_new[node.astype(np.int64)], cls.astype(np.int64), \
            weight.astype(np.float32), num_classes


def label_source(data: Data) -> LabelSource:
    """The node labels of `data` (a TGB node-property dataset: by name, a zip or folder, or a graph
    with `node_labels`), for the ranks to read; a one-line error where it has none."""
    from gnndist.datasets.catalog import CONVERTED, is_named, load_named
    from gnndist.datasets.fetch import data_root

    if isinstance(data, (str, os.PathLike)) and not is_store(data):
        data = DataSource(str(data))
    if isinstance(data, DataSource) and data.format is None and is_named(data.name):
        graph = load_named(data.name)  # converted (and kept) now if not yet
        if getattr(graph, "node_labels", None) is not None:
            return LabelSource(folder=str(data_root() / data.name / CONVERTED))
    else:
        graph = data.load() if isinstance(data, DataSource) else data
    labels = getattr(graph, "node_labels", None)
    if not isinstance(graph, TemporalGraph) or labels is None:
        raise GnndistError("--task node-property needs node labels over time: a TGB node-property dataset "
                           "(tgbn-trade, tgbn-genre: by name, or its zip), not a partition store or other data")
    return LabelSource(labels=labels)


@torch.no_grad()
@threads.job_threads()
def label_time_rows(trainer: LinkTrainer, source: LabelSource) -> tuple[Rows, int]:
    """The rows of node property prediction on this rank, and the class count: one per (label
    time, owned node), the node embedded at the label time after every event before it (a
    collective: the ranks replay the events together, up to each label time of any rank)."""
    ev, model, b, dev = trainer.events, trainer.model, trainer.cfg.batch_size, trainer.device
    t, node, cls, weight, num_classes = source.owned(ev)
    group = sampler_group()
    times = np.unique(torch.cat(dist.all_gather_varsize(torch.from_numpy(np.unique(t)), group)).numpy())
    cuts = events_before(trainer, times)  # of every label time: how many events come before it
    # one row per (time, node), in that order; its classes and weights in cls/weight[ptr[r]:ptr[r+1]]
    tidx = np.searchsorted(times, t)
    order = np.lexsort((node, tidx))
    tidx, node, cls, weight = tidx[order], node[order], cls[order], weight[order]
    first = np.r_[True, (np.diff(tidx) != 0) | (np.diff(node) != 0)] if tidx.size else np.zeros(0, bool)
    ptr = np.r_[np.flatnonzero(first), tidx.size]
    row_t, row_node = tidx[first], node[first]
    keep = cuts[row_t] < ev.num_events  # a label after the last event is never asked for
    emb = torch.zeros((row_t.size, model.dim))
    replay = Replay(trainer, int(cuts[-1]) if cuts.size else 0)
    for k, cut in enumerate(cuts):
        if cut >= ev.num_events:
            break
        rows = np.flatnonzero(row_t == k)
        with replay.at(int(cut)):
            for j in range(dist.agree_max(math.ceil(rows.size / b), dev)):
                r = rows[j * b:(j + 1) * b]
                nodes, at = row_node[r], np.full(r.size, times[k])
                hops = trainer.neighbours.sample_now(*model.neighbour_queries(nodes, at, 0))
                emb[r] = model.embed(trainer.state, to_device(nodes, dev), to_device(at, dev), 0, hops,
                                     (nodes, at)).embed.float().cpu()
    replay.bar.close()
    key = row_t * ev.num_nodes + ev.new_to_orig[row_node]
    starts, ends = ptr[:-1][keep], ptr[1:][keep]
    counts = ends - starts
    flat = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
    return Rows(emb[torch.from_numpy(keep)], key[keep], _periods(cuts[row_t[keep]], trainer), None,
                np.r_[0, np.cumsum(counts)], cls[flat], weight[flat], row_t[keep]), num_classes


# ------------------------------------------------------------------------------------------ the decoder

def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a well-spread uint64 hash of each uint64."""
    x = np.asarray(x, np.uint64) + np.uint64(_GOLDEN)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _keyed(seed: int, epoch: int, salt: int, key: np.ndarray) -> np.ndarray:
    """A hash of (seed, epoch, salt, key) per key: the same on any rank."""
    base = _mix(np.array([seed * 1_000_003 + epoch * 7 + salt], np.uint64))
    return _mix(np.asarray(key).astype(np.uint64) ^ base)


class Decoder(torch.nn.Module):
    """An MLP: Linear(d, hidden), ReLU, dropout, Linear(hidden, out). Its dropout masks are given
    per row (`masks`), so that a row gets the same mask whichever rank holds it."""

    def __init__(self, dim: int, hidden: int, out: int) -> None:
        super().__init__()
        self.hidden, self.out = torch.nn.Linear(dim, hidden), torch.nn.Linear(hidden, out)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        h = F.relu(self.hidden(x))
        return self.out(h if mask is None else h * mask)


def _dropout_mask(seed: int, epoch: int, key: np.ndarray, hidden: int, p: float, device: torch.device
                  ) -> Optional[torch.Tensor]:
    """Inverted-dropout masks [len(key), hidden] from a hash of (seed, epoch, row key, unit)."""
    if p == 0:
        return None
    h = _mix(_keyed(seed, epoch, 1, key)[:, None] + np.arange(hidden, dtype=np.uint64)[None])
    keep = (h >> np.uint64(11)).astype(np.float64) * 2.0 ** -53 >= p
    return to_device((keep / (1 - p)).astype(np.float32), device)


class NodeTask(NamedTuple):
    """What the decoder predicts: `labels` "binary" (one logit), "classes" (C logits) or
    "distribution" (C scores, ranked)."""

    labels: str
    num_classes: int

    @property
    def outputs(self) -> int:
        return 1 if self.labels == "binary" else self.num_classes

    @property
    def metric(self) -> str:
        """The validation metric that selects the decoder."""
        return {"binary": "auc", "classes": "acc", "distribution": "ndcg"}[self.labels]

    def loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The summed loss of a batch's rows."""
        if self.labels == "binary":
            return F.binary_cross_entropy_with_logits(out[:, 0], target.float(), reduction="sum")
        if self.labels == "classes":
            return F.cross_entropy(out, target, reduction="sum")
        return -(target * F.log_softmax(out, 1)).sum()


def _all_sum(a: np.ndarray) -> np.ndarray:
    """`a` (float64) summed over the ranks (host side)."""
    return dist.all_reduce(torch.from_numpy(np.ascontiguousarray(a, np.float64)), group=sampler_group()).numpy()


@torch.no_grad()
def _scores(decoder: Decoder, rows: Rows, idx: np.ndarray, device: torch.device, chunk: int = 1 << 14
            ) -> np.ndarray:
    """The decoder's outputs [len(idx), out] of rows `idx` (evaluation mode)."""
    decoder.eval()
    out = [decoder(rows.emb[torch.from_numpy(idx[i:i + chunk])].to(device)).float().cpu().numpy()
           for i in range(0, idx.size, chunk)]
    return np.concatenate(out) if out else np.zeros((0, decoder.out.out_features), np.float32)


def node_metrics(decoder: Decoder, rows: Rows, period: int, task: NodeTask, device: torch.device,
                 num_times: int = 0) -> dict[str, Optional[float]]:
    """The metrics of the rows of `period` over all ranks (a collective): "auc" and "ap" (binary),
    "acc" and "f1" (macro; classes), "ndcg" (NDCG@10 per label time, averaged over the label
    times that have rows; `num_times` label times in all). NaN where there is nothing to measure."""
    idx = np.flatnonzero(rows.period == period)
    out = _scores(decoder, rows, idx, device)
    if task.labels == "binary":
        y = rows.y[idx]
        ap, auc = ranking_metrics(out[y == 1, 0], out[y != 1, 0], across_ranks=True)
        return {"auc": auc, "ap": ap}
    if task.labels == "classes":
        c = task.num_classes
        y, pred = rows.y[idx], out.argmax(1) if out.size else np.zeros(0, np.int64)
        counts = _all_sum(np.concatenate([np.bincount(y[pred == y], minlength=c), np.bincount(pred, minlength=c),
                                          np.bincount(y, minlength=c)]))
        tp, predicted, true = counts[:c], counts[c:2 * c], counts[2 * c:]
        seen = (predicted + true) > 0
        f1 = 2 * tp[seen] / (predicted[seen] + true[seen])
        return {"acc": tp.sum() / true.sum() if true.sum() else math.nan,
                "f1": float(f1.mean()) if f1.size else math.nan}
    target = rows.target(idx, task.num_classes, torch.device("cpu")).numpy()
    per_time = _all_sum(np.concatenate([np.bincount(rows.time[idx], ndcg_at_k(target, out), num_times),
                                        np.bincount(rows.time[idx], minlength=num_times)]))
    sums, counts = per_time[:num_times], per_time[num_times:]
    return {"ndcg": float(np.mean(sums[counts > 0] / counts[counts > 0])) if (counts > 0).any() else math.nan}


def ndcg_at_k(y_true: np.ndarray, y_score: np.ndarray, k: int = NDCG_K) -> np.ndarray:
    """NDCG@k of each row, as sklearn's `ndcg_score` (linear gains, tied scores sharing their
    discounts, a row without gains scoring 0) computes it before averaging the rows."""
    y_true, y_score = np.asarray(y_true, np.float64), np.asarray(y_score, np.float64)
    n, c = y_true.shape
    if n == 0:
        return np.zeros(0)
    discount = 1 / np.log2(np.arange(c) + 2)
    discount[k:] = 0
    order = np.argsort(-y_score, axis=1, kind="stable")
    ranked = np.take_along_axis(y_true, order, 1)
    dcg = ranked @ discount
    s = np.take_along_axis(y_score, order, 1)
    tied = (s[:, :-1] == s[:, 1:])[:, :k].any(1) if c > 1 else np.zeros(n, bool)
    cum = np.cumsum(discount)
    for r in np.flatnonzero(tied):  # tied scores share the discounts of the places they take
        _, inv, counts = np.unique(-y_score[r], return_inverse=True, return_counts=True)
        gains = np.bincount(inv, y_true[r], counts.size) / counts
        dcg[r] = gains @ np.diff(np.r_[0.0, cum[np.cumsum(counts) - 1]])
    ideal = -np.sort(-y_true, axis=1) @ discount
    return np.divide(dcg, ideal, out=np.zeros(n), where=ideal > 0)


def train_decoder(rows: Rows, task: NodeTask, dcfg: DecoderConfig, seed: int, device: torch.device,
                  quiet: bool = True, num_times: int = 0) -> tuple[Decoder, list[dict[str, Any]], dict[str, Any]]:
    """The decoder trained on the training rows of all ranks (a collective), selected on the
    validation metric: (decoder with the selected parameters, per-epoch history, the selected
    {"epoch", "val", "model"})."""
    torch.manual_seed(seed)  # the same initial parameters on every rank
    decoder = Decoder(rows.emb.shape[1], dcfg.hidden, task.outputs).to(device)
    params = list(decoder.parameters())
    optimizer = torch.optim.Adam(params, lr=dcfg.lr, weight_decay=dcfg.weight_decay)
    train = np.flatnonzero(rows.period == 0)
    total = int(_all_sum(np.array([train.size]))[0])
    if total == 0:
        raise GnndistError("no labelled rows in the training period: nothing to train the decoder on")
    nb = math.ceil(total / dcfg.batch_size)
    history, best = [], None
    for epoch in range(1, dcfg.epochs + 1):
        if dcfg.patience is not None and best is not None and epoch - best["epoch"] > dcfg.patience:
            break
        decoder.train()
        which = (_keyed(seed, epoch, 0, rows.key[train]) % np.uint64(nb)).astype(np.int64)
        counts = _all_sum(np.bincount(which, minlength=nb))
        order = np.argsort(which, kind="stable")
        cuts = np.r_[0, np.cumsum(np.bincount(which, minlength=nb))]
        loss_sum = 0.0
        for i in np.flatnonzero(counts):  # a batch no rank has rows of is no step
            idx = train[order[cuts[i]:cuts[i + 1]]]
            optimizer.zero_grad(set_to_none=True)
            loss = torch.zeros(1, device=device)
            if idx.size:
                mask = _dropout_mask(seed, epoch, rows.key[idx], dcfg.hidden, dcfg.dropout, device)
                loss = task.loss(decoder(rows.emb[torch.from_numpy(idx)].to(device), mask),
                                 rows.target(idx, task.num_classes, device)) / float(counts[i])
                loss.backward()
                loss = loss.detach().reshape(1)
            loss_sum += float(dist.sum_gradients(params, loss)[0]) * counts[i]
            optimizer.step()
        val = node_metrics(decoder, rows, 1, task, device, num_times)
        rec = {"epoch": epoch, "loss": loss_sum / total, **{f"val_{k}": v for k, v in val.items()}}
        history.append(rec)
        score = val[task.metric]
        if best is None or (score == score and not best["val"] >= score):
            best = {"epoch": epoch, "val": score, "model": copy.deepcopy(decoder.state_dict())}
        if dist.rank() == 0 and not quiet:
            print(f"decoder epoch {epoch}: loss {rec['loss']:.4f}, val {task.metric} {score:.4f}", file=sys.stderr)
    decoder.load_state_dict(best["model"])
    return decoder, history, best


# ------------------------------------------------------------------------------------------ a run

def node_rank(source: Union[TemporalGraph, RankPart], device: torch.device, cfg: LinkConfig, dcfg: DecoderConfig,
              task_name: str, outputs: Outputs = Outputs(), tgb: Optional[str] = None,
              labels: Optional[LabelSource] = None) -> dict[str, Any]:
    """One rank of a node run: the link model (`fit`), the labelled rows' embeddings, the decoder
    and its test metrics; the decoder saved beside the link model's checkpoint."""
    events = rank_events(source)
    if task_name == "node":
        needs_event_labels(events)
    trainer = LinkTrainer(events, cfg, device, Protocol.of(events.num_events, tgb))
    link = fit(trainer, outputs)
    num_times = 0
    if task_name == "node":
        rows = event_rows(trainer)
        classes = int(dist.agree_max(int(rows.y.max(initial=0)), device)) + 1
        if int(dist.agree_max(int(-rows.y.min(initial=0)), device)) > 0:
            raise GnndistError("event labels must be classes 0, 1, ...; found a negative one")
        task = NodeTask("binary" if classes <= 2 else "classes", classes)
    else:
        if labels is None:
            raise GnndistError("--task node-property needs the node labels (`label_source` of the data)")
        rows, classes = label_time_rows(trainer, labels)
        num_times = int(dist.agree_max(int(rows.time.max(initial=-1)) + 1, device))
        task = NodeTask("distribution", classes)
    decoder, history, best = train_decoder(rows, task, dcfg, cfg.seed, device, cfg.quiet, num_times)
    test = node_metrics(decoder, rows, 2, task, device, num_times)
    counts = _all_sum(np.bincount(rows.period, minlength=4)[:3])
    saved = {"task": task_name, "labels": task.labels, "num_classes": task.num_classes, "config": dcfg.to_dict(),
             "selected_epoch": best["epoch"], "model": best["model"]}
    folder = resume.folder(outputs)
    if folder is not None:  # beside the link model, in its newest checkpoint
        checkpoint.save(folder, {**checkpoint.load(folder), "decoder": saved}, keep=outputs.keep_checkpoints)
    return {"task": task_name, "graph": "temporal", "model": cfg.model, "world_size": events.num_parts,
            "labels": task.labels, "num_classes": task.num_classes,
            "rows": dict(zip(PERIODS, map(int, counts))), "decoder": dcfg.to_dict(), "epochs": history,
            "selected_epoch": best["epoch"], "link": link,
            "test": _json_safe({**test, f"best_val_{task.metric}": best["val"]})}


def needs_event_labels(graph: Union[TemporalGraph, Any]) -> None:
    """A one-line error unless the graph (or a rank's events) has a label per event."""
    if graph.edge_label is None:
        raise GnndistError("--task node on a temporal graph needs a label per event (a state_label or label "
                           "column, as JODIE's CSVs have); TGB's node labels over time: --task node-property")


def train_temporal_node(data: Data, cfg: Optional[LinkConfig] = None, decoder: Optional[DecoderConfig] = None,
                        task: str = "node", nproc: int = 1, outputs: Outputs = Outputs(),
                        max_restarts: int = 0) -> dict[str, Any]:
    """A node task on the temporal graph `data` (see the module docstring; `task` "node" or
    "node-property"): the link model trained with `cfg`, then the decoder with `decoder`, on
    `nproc` local ranks (started again, resuming from the checkpoint, up to `max_restarts` times
    after a rank fails) or as this rank of a torchrun world. Returns the metrics (rank 0's); rank
    0 prints the results and writes `outputs`. Call from under `if __name__ == "__main__":`."""
    cfg = LinkConfig() if cfg is None else cfg
    decoder = DecoderConfig() if decoder is None else decoder
    check_type("cfg", cfg, LinkConfig)
    check_type("decoder", decoder, DecoderConfig)
    check_type("outputs", outputs, Outputs)
    if task not in NODE_TASKS:
        raise GnndistError(f"task must be one of {', '.join(NODE_TASKS)}, got {task!r}")
    labels = label_source(data) if task == "node-property" else None
    split = replace(SPLIT, check=needs_event_labels) if task == "node" else SPLIT  # told before data is split
    return run_job(data, nproc, split, node_rank, cfg, decoder, task, outputs, protocol_folder(data), labels,
                   device=cfg.device, quiet=cfg.quiet, outputs=outputs, max_restarts=max_restarts)


# ------------------------------------------------------------------------------------------ predictions

def saved_decoder(saved: SavedModel) -> tuple[Decoder, NodeTask]:
    """The decoder a node run saved beside its link model; a one-line error where there is none."""
    d = saved.decoder
    if d is None or d.get("task") != "node":
        raise GnndistError(f"{saved.path} holds no decoder of dynamic node classification (one written by "
                           "gnndist train --task node --checkpoint DIR on a temporal graph)")
    task = NodeTask(d["labels"], int(d["num_classes"]))
    model = d["model"]
    decoder = Decoder(model["hidden.weight"].shape[1], int(d["config"]["hidden"]), task.outputs)
    checkpoint.load_params(decoder, model, saved.path)
    return decoder, task


def event_probabilities(checkpoint_: Checkpoint, data: Data, nproc: int = 1, device: str = "cpu",
                        quiet: bool = False) -> np.ndarray:
    """Per event of `data` (the training data), the decoder's class probabilities of its source,
    embedded as in training: [E] P(class 1) for two classes, else [E, C]."""
    saved = saved_model(checkpoint_, "link")
    saved_decoder(saved)  # there is one
    return run_saved(saved, source_of(data), nproc, _probabilities_rank, device, quiet, same_events=True)


def _probabilities_rank(source, dev: torch.device, saved: SavedModel, quiet: bool) -> np.ndarray:
    trainer = saved_trainer(source, saved, dev, quiet, same_events=True)
    decoder, task = saved_decoder(saved)
    decoder = decoder.to(dev)
    rows = event_rows(trainer, labels=False)
    out = torch.from_numpy(_scores(decoder, rows, np.arange(rows.key.size), dev))
    probs = torch.sigmoid(out[:, 0]) if task.labels == "binary" else torch.softmax(out, 1)
    return gather_rows(rows.key, probs, trainer.events.num_events, dev)
