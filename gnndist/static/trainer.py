"""Node classification (GraphSAGE, GCN, GAT) on one rank or across the parts of a store.

One rank samples from the whole graph (`gnndist.samplers.sample_neighbors`). W ranks each own
one part of a partition store (a raw dataset is first split with METIS, balancing nodes and
training nodes, into a cached store), train on the training nodes they own, sample across
parts and read remote features through the feature cache. The global batch is split across
ranks; after each step one all-reduce sums the gradients, the loss and the seed count, and
every rank divides by the global count: the update is the single-process update of the mean
loss over the global batch, and the parameters stay identical on all ranks. Ranks with fewer
batches run empty steps that still join every collective.

Evaluation is distributed the same way (each rank classifies the val/test nodes it owns; the
counts are summed), over full neighbourhoods unless --eval-fanouts says otherwise. The test
accuracy is that of the parameters with the best validation accuracy. Cache metrics (hit
rate, remote bytes, counters) cover the remote feature rows of training steps. Features that
are never negative (bag-of-words) are row-normalised per batch unless --row-norm off.
"""
from __future__ import annotations

import abc
import copy
import math
import os
from typing import Any, Callable, Optional, Union

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from gnndist import checkpoint, resume
from gnndist.runtime import dist, threads
from gnndist.errors import GnndistError
from gnndist.footprint import memory_checked
from gnndist.static.footprint import node_footprint
from gnndist.graph import MASKS, Graph, TemporalGraph
from gnndist.io import show_progress
from gnndist.outputs import Outputs
from gnndist.partition import RankPart, open_part
from gnndist.samplers import (Blocks, DistNeighborSampler, DistFeatures, PrefetchLoader, degree_scores, hit_rate,
                              sample_neighbors, sampler_group, visit_scores)
from gnndist.static.config import NodeConfig
from gnndist.static.models import MiniBatch, StaticGNN
from gnndist.runtime.launch import Data, Split, run_job
from gnndist.validate import cache_capacity, check_type


def step_seed(*parts: int) -> int:
    """A 63-bit sampling seed from integers (run seed, epoch, step, phase)."""
    return int(np.random.SeedSequence([k & 0xFFFFFFFF for k in parts]).generate_state(2, np.uint64)[0] >> 1)


# ----------------------------------------------------------------------------------------------
# What one rank sees of the graph


class RankGraph(abc.ABC):
    """What one rank sees of the graph: the train/val/test nodes it owns (global ids), and
    sampling, features, degrees and labels by global id (`sample`, `features`, `min_feature`
    and `set_cache` are collectives where the graph is spread over ranks)."""

    num_features: int
    num_classes: int
    num_nodes: int  # of the whole graph, as are the next two (what a sample may reach)
    num_edges: int  # CSR entries
    max_degree: int
    train_ids: np.ndarray
    val_ids: np.ndarray
    test_ids: np.ndarray
    _deg: Optional[torch.Tensor]  # in-degree of every node (GCN only)

    @abc.abstractmethod
    def sample(self, seeds: np.ndarray, fanouts: list[int], seed: int) -> Blocks:
        """Blocks of a multi-hop neighbourhood sample around `seeds`."""

    @abc.abstractmethod
    def features(self, ids: np.ndarray) -> torch.Tensor:
        """Feature rows of `ids`."""

    @abc.abstractmethod
    def labels(self, ids: np.ndarray) -> np.ndarray:
        """Labels of `ids` (nodes this rank owns)."""

    @abc.abstractmethod
    def min_feature(self) -> float:
        """The smallest feature value over the whole graph."""

    @abc.abstractmethod
    def set_cache(self, policy: str, capacity: Optional[float], visits: Callable[[], list[np.ndarray]]) -> None:
        """Put a feature cache in front of remote rows; `visits()` runs one sampling epoch."""

    @abc.abstractmethod
    def original_ids(self, ids: np.ndarray) -> np.ndarray:
        """The data's own ids of `ids` (nodes this rank owns)."""

    def degrees(self, ids: np.ndarray) -> torch.Tensor:
        return self._deg[torch.from_numpy(ids)].float()

    def counters(self) -> dict[str, int]:
        """Feature-store counters since the last `reset_counters`."""
        return {}

    def reset_counters(self) -> None:
        pass


class WholeGraph(RankGraph):
    """The whole graph in one process: local sampling, features read in place."""

    def __init__(self, graph: Graph) -> None:
        check_node_graph(graph)
        self.graph = graph
        self.x = torch.from_numpy(graph.x)
        self.num_features, self.num_classes = graph.num_features, graph.num_classes
        self.num_nodes, self.num_edges = graph.num_nodes, graph.num_edges
        self.max_degree = int(graph.degrees().max(initial=0))
        self.train_ids, self.val_ids, self.test_ids = (np.flatnonzero(m) for m in
                                                      (graph.train_mask, graph.val_mask, graph.test_mask))
        self._deg = torch.from_numpy(graph.degrees())

    def sample(self, seeds: np.ndarray, fanouts: list[int], seed: int) -> Blocks:
        return sample_neighbors(self.graph, seeds, fanouts, seed=seed)

    def features(self, ids: np.ndarray) -> torch.Tensor:
        return self.x[torch.from_numpy(ids)]

    def labels(self, ids: np.ndarray) -> np.ndarray:
        return self.graph.y[ids]

    def min_feature(self) -> float:
        return float(self.graph.x.min(initial=np.inf))

    def set_cache(self, policy: str, capacity: Optional[float], visits: Callable[[], list[np.ndarray]]) -> None:
        """No remote rows in one process: nothing to cache."""

    def original_ids(self, ids: np.ndarray) -> np.ndarray:
        return ids


class PartGraph(RankGraph):
    """One part of a store: distributed sampling, remote features through the cache."""

    def __init__(self, part, cfg: NodeConfig, device: torch.device = torch.device("cpu")) -> None:
        if part.kind != "static":
            raise GnndistError(f"partition store holds a {part.kind} graph; --task node needs a static one")
        if any(getattr(part, n) is None for n in ("x", "y", *MASKS)):
            raise GnndistError("partition store has no node features, labels or split masks; --task node needs them")
        self.part, self.offset, self.device = part, part.start, device
        self.sampler = DistNeighborSampler.from_partition(part)
        self.dist_features = DistFeatures.from_partition(part)
        self.num_features = int(part.x.shape[1])
        self.num_classes = dist.agree_max(int(part.y.max(initial=-1)) + 1, device)
        self.num_nodes, self.num_edges = part.num_nodes, int(part.meta["num_edges"])
        self.max_degree = dist.agree_max(int(np.diff(part.indptr).max(initial=0)), device)
        self.train_ids, self.val_ids, self.test_ids = (np.flatnonzero(m) + self.offset for m in
                                                      (part.train_mask, part.val_mask, part.test_mask))
        local_deg = torch.from_numpy(np.diff(part.indptr)).to(device)
        self._deg = torch.cat(dist.all_gather_varsize(local_deg)).cpu() if cfg.model == "gcn" else None

    def set_cache(self, policy: str, capacity: Optional[float], visits: Callable[[], list[np.ndarray]]) -> None:
        """Put the feature cache in front of remote rows; `visits()` runs one sampling epoch
        (only called for `presample`). A collective."""
        if policy == "none":
            return
        n = self.part.num_nodes
        scores = visit_scores(visits(), n) if policy == "presample" else degree_scores(self.part.indices, n)
        self.dist_features.set_cache(policy, capacity, scores)

    def sample(self, seeds: np.ndarray, fanouts: list[int], seed: int) -> Blocks:
        return self.sampler.sample(seeds, fanouts, seed=seed)

    def features(self, ids: np.ndarray) -> torch.Tensor:
        return self.dist_features.fetch(ids)

    def labels(self, ids: np.ndarray) -> np.ndarray:
        return self.part.y[ids - self.offset]

    def original_ids(self, ids: np.ndarray) -> np.ndarray:
        return self.part.orig_ids[ids - self.offset]

    def min_feature(self) -> float:
        local = torch.tensor([float(self.part.x.min(initial=np.inf))], device=self.device)
        return float(dist.all_reduce(local, "min"))

    def counters(self) -> dict[str, int]:
        return dict(self.dist_features.counters)

    def reset_counters(self) -> None:
        self.dist_features.reset_counters()


def check_node_graph(graph) -> None:
    """A clear error unless `graph` is a static graph with features, labels and split masks."""
    if isinstance(graph, TemporalGraph):
        raise GnndistError("DATA is a temporal graph; --task node needs a static graph with node features "
                           "and labels (use --task link)")
    missing = [n for n in ("x", "y", *MASKS) if getattr(graph, n) is None]
    if missing:
        split = (" (a split comes with the data: a Planetoid folder has one; a .npz takes train_mask, val_mask and "
                 "test_mask arrays)" if set(missing) & set(MASKS) else "")
        raise GnndistError(f"--task node needs node features, labels and split masks; DATA has no "
                           f"{', '.join(missing)}{split}")


def check_split_sizes(sizes: list[int]) -> None:
    """A clear error unless the training, validation and test node counts are all above 0."""
    empty = [m for m, c in zip(MASKS, sizes) if c == 0]
    if empty:
        raise GnndistError(f"--task node needs training, validation and test nodes; DATA's {empty[0]} selects none")


def check_training_graph(graph) -> None:
    """`check_node_graph`, and nodes in each of the three splits (what training needs; a graph
    to predict on needs no split)."""
    check_node_graph(graph)
    check_split_sizes([int(m.sum()) for m in (graph.train_mask, graph.val_mask, graph.test_mask)])


# ----------------------------------------------------------------------------------------------
# The trainer

COUNTERS = ("requests", "hits", "misses", "bytes_fetched", "bytes_saved")
RESUMED = ("config", "model", "optimizer", "rng", "history", "best")  # what a resume reads
# the settings a resumed run must share with its checkpoint (--resume auto: all settings, and the rank count)
SAME_ON_RESUME = ("model", "batch_size", "fanouts", "lr", "weight_decay", "hidden", "dropout", "row_norm", "seed",
                  "num_features", "num_classes")


def shuffle_values(ids: np.ndarray, salt: int) -> np.ndarray:
    """A 62-bit hash of each id with `salt` (splitmix64): the epoch's order of the training nodes."""
    x = ids.astype(np.uint64) ^ np.uint64(salt)
    for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        x = (x ^ (x >> np.uint64(shift))) * np.uint64(mult)
    return ((x ^ (x >> np.uint64(31))) >> np.uint64(2)).astype(np.int64)


def global_quantiles(keys: np.ndarray, ranks: np.ndarray, bits: int = 8) -> np.ndarray:
    """For each r of `ranks`, the smallest key with r keys below it over all ranks' sorted `keys`
    (62-bit): a search of the key range that splits each interval into 2**bits per round, with
    one all-reduce of the counts below the split points a round (a collective)."""
    lo, hi = np.zeros(ranks.size, np.int64), np.full(ranks.size, 1 << 62, np.int64)
    parts, rows = 1 << bits, np.arange(ranks.size)
    while np.any(hi - lo > 1):  # r keys lie below hi, fewer below lo
        width = -(-(hi - lo) // parts)  # the last part may be shorter; `hi` stays a bound
        points = np.minimum(lo[:, None] + width[:, None] * np.arange(1, parts), hi[:, None])
        below = torch.from_numpy(np.searchsorted(keys, points).astype(np.int64))
        below = dist.all_reduce(below, group=sampler_group()).numpy()  # host data: the gloo group
        few = (below < ranks[:, None]).sum(1)  # the points with fewer than r keys below come first
        lo = np.where(few > 0, points[rows, np.maximum(few - 1, 0)], lo)
        hi = np.where(few < parts - 1, points[rows, np.minimum(few, parts - 2)], hi)
    return hi


def local_portion(total: int) -> int:
    """This rank's part of a global batch of `total` seeds."""
    w, r = dist.world_size(), dist.rank()
    return total // w + (r < total % w)


class NodeTrainer:
    """Model, optimizer and the synchronous training / evaluation loops of one rank.

    Batches are sampled and their features fetched one step ahead in a background thread
    (`PrefetchLoader`; the samplers exchange on their own process group).
    """

    @memory_checked(node_footprint)
    def __init__(self, graph: RankGraph, cfg: NodeConfig,
                 device: torch.device = torch.device("cpu")) -> None:
        self.graph, self.cfg, self.device = graph, cfg, device
        torch.manual_seed(cfg.seed)  # identical initial parameters on every rank
        self.model = StaticGNN(cfg.model, graph.num_features, cfg.hidden, graph.num_classes,
                               num_layers=len(cfg.fanouts), dropout=cfg.dropout).to(device)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        torch.manual_seed(cfg.seed + 1 + dist.rank())  # dropout masks differ between ranks
        self.counter_totals = dict.fromkeys(COUNTERS, 0)
        self.on_loss: Optional[Callable[[float], None]] = None  # called with each training step's global loss
        # of the epoch in progress: epoch, steps done, their [loss sum, correct, count] and time
        # (resumed from a checkpoint by `train_epoch`)
        self.epoch_state: Optional[dict[str, Any]] = None
        self.clock = resume.EpochClock()
        self.row_norm = cfg.row_norm == "on" or (cfg.row_norm == "auto" and graph.min_feature() >= 0)
        # the three splits' node counts over the ranks (a store's parts: no rank sees whole masks)
        self.split_sizes = dist.all_reduce(torch.tensor([graph.train_ids.size, graph.val_ids.size,
                                                         graph.test_ids.size], device=device)).tolist()
        graph.set_cache(cfg.cache, cfg.cache_size, self._presample)

    def batch(self, seeds: np.ndarray, fanouts: list[int], seed: int) -> MiniBatch:
        """Sample around `seeds` and gather the sampled nodes' features (collectives)."""
        blocks = self.graph.sample(seeds, fanouts, seed)
        deg = self.graph.degrees(blocks.node_ids) if self.cfg.model == "gcn" else None
        x = self.graph.features(blocks.node_ids)
        if self.row_norm:  # as torch_geometric.transforms.NormalizeFeatures
            x = x / x.sum(1, keepdim=True).clamp(min=1)
        mb = MiniBatch(x, list(blocks.num_nodes_per_hop),
                       [torch.from_numpy(e) for e in blocks.edge_index], deg)
        return mb.to(self.device)

    def _batches(self, chunks: list[np.ndarray], fanouts: Optional[list[int]], key: tuple[int, ...],
                 sample_only: bool = False, first: int = 0) -> tuple[int, PrefetchLoader]:
        """The globally agreed step count over this rank's seeds of each step (`chunks`; empty
        ones once they run out), and a prefetching loader of (seeds, batch) per step from step
        `first` on."""
        steps = dist.agree_max(len(chunks), self.device)
        fanouts = fanouts or [-1] * self.model.num_layers

        def make(step: int):
            seeds = chunks[step] if step < len(chunks) else np.zeros(0, np.int64)
            seed = step_seed(self.cfg.seed, *key, step)
            if sample_only:
                return seeds, self.graph.sample(seeds, fanouts, seed).node_ids
            return seeds, self.batch(seeds, fanouts, seed)

        return steps, PrefetchLoader(range(first, steps), make, enabled=self.cfg.prefetch)

    def _epoch_chunks(self, epoch: int) -> list[np.ndarray]:
        """This rank's seeds of each step of an epoch (a collective). The global batches are the
        training nodes in the order of a seeded hash of (epoch, original id), `batch_size` at a
        time, whatever the ranks: each rank takes the ones it owns, and no rank holds more ids
        than its own."""
        ids = self.graph.train_ids
        values = shuffle_values(self.graph.original_ids(ids), step_seed(self.cfg.seed, epoch, 3))
        order = np.argsort(values, kind="stable")
        steps = -(-self.split_sizes[0] // self.cfg.batch_size)
        firsts = global_quantiles(values[order], np.arange(1, steps) * self.cfg.batch_size)
        return np.split(ids[order], np.searchsorted(values[order], firsts))

    def _presample(self) -> list[np.ndarray]:
        """The node ids one training epoch samples on this rank (the `presample` cache's visits)."""
        return [ids for _, ids in self._batches(self._epoch_chunks(0), self.cfg.fanouts, (0, 1), sample_only=True)[1]]

    def logits(self, seeds: np.ndarray, fanouts: Optional[list[int]] = None, seed: int = 0) -> torch.Tensor:
        """Logits of `seeds` (nodes this rank owns) in eval mode, full neighbourhoods unless
        `fanouts` says otherwise; all ranks must call it together."""
        self.model.eval()
        with torch.no_grad():
            return self.model(self.batch(seeds, fanouts or [-1] * self.model.num_layers, seed))

    def compute_grads(self, seeds: np.ndarray, batch: MiniBatch) -> torch.Tensor:
        """Set every parameter's .grad to the gradient of the mean loss over the global batch
        (the union of all ranks' `seeds`); returns the global [loss sum, correct, count]."""
        self.model.train()
        out = self.model(batch)
        y = torch.from_numpy(self.graph.labels(seeds)).to(self.device)
        loss = F.cross_entropy(out, y, reduction="sum")
        self.opt.zero_grad(set_to_none=False)
        loss.backward()
        stats = torch.stack([loss.detach(), (out.argmax(1) == y).sum().to(loss.dtype),
                             torch.tensor(float(len(seeds)), device=self.device)])
        stats = dist.sum_gradients(list(self.model.parameters()), stats)
        count = stats[2].clamp(min=1)
        for p in self.model.parameters():
            if p.grad is not None:
                p.grad /= count
        return stats

    @property
    def steps_per_epoch(self) -> int:
        """Training steps (global batches) in one epoch."""
        return -(-self.split_sizes[0] // self.cfg.batch_size)

    @threads.job_threads()
    def train_epoch(self, epoch: int, on_step: Optional[Callable[[int, np.ndarray], None]] = None) -> dict:
        """One epoch: this rank's portion of each global batch (epochs count from 1; where `epoch_state`
        is of this epoch, from the step it resumes at); returns the epoch's global metrics.
        `on_step(step, seeds)` runs after each optimizer step (`step` from 0)."""
        self.graph.reset_counters()
        at = self.epoch_state if self.epoch_state is not None and self.epoch_state["epoch"] == epoch else None
        first = 0 if at is None else at["step"]
        totals = torch.tensor([0.0] * 3 if at is None else at["totals"], dtype=torch.float64)
        self.clock.start(at)
        steps, batches = self._batches(self._epoch_chunks(epoch), self.cfg.fanouts, (epoch, 1), first=first)
        try:  # an epoch left on an error is not continued: the next starts from its first step
            for step, (seeds, batch) in enumerate(tqdm(batches, total=steps, initial=first, desc=f"epoch {epoch}",
                                                       unit="step", leave=False, disable=self._quiet()), first):
                stats = self.compute_grads(seeds, batch).double().cpu()
                if not math.isfinite(float(stats[0])):  # the global loss: every rank stops here
                    raise GnndistError(f"the training loss became {float(stats[0])} at epoch {epoch}, step {step}; "
                                       "try a smaller --lr")
                totals += stats
                if self.on_loss is not None:
                    self.on_loss(float(stats[0]) / max(float(stats[2]), 1.0))
                self.opt.step()
                self.epoch_state = {"epoch": epoch, "step": step + 1, "totals": totals.tolist()}
                if on_step is not None:
                    on_step(step, seeds)
            elapsed = self.clock.elapsed()[0]
        finally:
            self.epoch_state = None
        loss, correct, count = totals.tolist()
        counters = self._global_counters()
        for k in COUNTERS:
            self.counter_totals[k] += counters[k]
        return {"epoch": epoch, "loss": loss / max(count, 1), "train_acc": correct / max(count, 1),
                "time_s": elapsed, "nodes_per_s": count / elapsed if elapsed > 0 else 0.0,
                "cache_hit_rate": hit_rate(counters["hits"], counters["requests"]), "remote_bytes": counters["bytes_fetched"]}

    def state_dict(self) -> dict[str, Any]:
        """Parameters, optimizer, the run's cache counters and, within an epoch, its `epoch_state`:
        what a checkpoint holds of the trainer (live tensors: copy them to keep them)."""
        epoch_state = None if self.epoch_state is None else {**self.epoch_state, "time_s": self.clock.elapsed()[0]}
        return {"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                "cache_counters": dict(self.counter_totals), "epoch_state": epoch_state}

    def load_state_dict(self, saved: dict[str, Any], source: Union[str, os.PathLike]) -> None:
        """Take what `state_dict` gave (read from `source`)."""
        checkpoint.load_params(self.model, saved["model"], source)
        self.opt.load_state_dict(saved["optimizer"])
        self.counter_totals.update(saved.get("cache_counters", {}))
        self.epoch_state = saved.get("epoch_state")

    def eval_logits(self, ids: np.ndarray, phase: int = 0) -> torch.Tensor:
        """Logits [len(ids), C] of `ids` (nodes this rank owns) in eval mode, in steps of the global
        eval batch, over full neighbourhoods unless --eval-fanouts (sampled with `phase`); a
        collective."""
        self.model.eval()
        out = [torch.zeros((0, self.graph.num_classes), device=self.device)]
        with torch.no_grad():
            b = max(local_portion(self.cfg.eval_batch_size), 1)
            steps, batches = self._batches([ids[i:i + b] for i in range(0, ids.size, b)], self.cfg.eval_fanouts,
                                           (phase, 2))
            for _, batch in tqdm(batches, total=steps, desc="evaluate", unit="step", leave=False,
                                 disable=self._quiet()):
                out.append(self.model(batch))
        return torch.cat(out)

    @threads.job_threads()
    def evaluate(self, ids: np.ndarray, phase: int = 0) -> float:
        """Global accuracy over the union of all ranks' `ids` (nodes each rank owns)."""
        pred = self.eval_logits(ids, phase).argmax(1).cpu().numpy()
        correct = torch.tensor([(pred == self.graph.labels(ids)).sum(), ids.size], dtype=torch.float64)
        correct = dist.all_reduce(correct.to(self.device)).cpu()
        return float(correct[0] / correct[1]) if correct[1] > 0 else float("nan")

    def fit(self, log: Callable[[str], None] = dist.log, outputs: Outputs = Outputs()) -> dict:
        """Train `cfg.epochs` epochs, validating after each; test the best-validation parameters.
        Rank 0 logs to `outputs.log_dir`; each rank writes its checkpoint to `outputs.checkpoint`
        each epoch, and within epochs as `outputs` asks (`resume.Checkpointer`), and resumes where
        `outputs.resume` or a restart asks (`resume.find`; on this or another number of ranks: a
        checkpoint holds no per-rank state but the RNGs, which dropout alone draws from). Returns
        the metrics dict (the same on every rank)."""
        cfg = self.cfg
        check_split_sizes(self.split_sizes)  # a store's parts (raw data: `check_training_graph`, earlier)
        config = {**cfg.to_dict(), "task": "node", "num_features": self.graph.num_features,
                  "num_classes": self.graph.num_classes, "world_size": dist.world_size()}
        found = resume.start(outputs, self.device, RESUMED,
                             lambda saved, whole: resume.changed(saved, config, SAME_ON_RESUME, whole))
        spe = self.steps_per_epoch
        with checkpoint.run(resume.folder(outputs), resume.keeps(outputs, found), restore=dist.world_size() == 1):
            epochs, best, best_state, best_epoch, at = [], -1.0, None, 0, checkpoint.Position(0)
            if found is not None:
                saved = found.payload
                self.load_state_dict(saved, found.files[0])
                checkpoint.set_rng_state(saved["rng"])
                epochs, at = list(saved["history"]), found.position
                best, best_epoch, best_state = saved["best"]["val_acc"], saved["best"]["epoch"], saved["best"]["model"]
            first, restarts, runlog = resume.begin(outputs, found, at, cfg.epochs, spe, self.device)
            self.on_loss = runlog.step
            stop_reason = "epochs"

            def payload(epoch: int, step: Optional[int] = None) -> dict[str, Any]:
                return {"config": config, "epoch": epoch, "step": step, **self.state_dict(),
                        "rng": checkpoint.rng_state(), "history": epochs, "restarts": restarts,
                        "best": {"epoch": best_epoch, "val_acc": best, "model": best_state}}

            with resume.Checkpointer(outputs, spe, self.device, found) as saver:
                for epoch in range(first, cfg.epochs + 1):
                    if cfg.patience is not None and epochs and epoch - 1 - best_epoch >= cfg.patience:
                        stop_reason = "patience"
                        break
                    rec = self.train_epoch(epoch, lambda step, seeds: saver.step(epoch, step + 1,
                                                                                lambda: payload(epoch, step + 1)))
                    rec["val_acc"] = self.evaluate(self.graph.val_ids, phase=epoch)
                    epochs.append(rec)
                    if rec["val_acc"] > best:
                        best, best_epoch, best_state = rec["val_acc"], epoch, copy.deepcopy(self.model.state_dict())
                    if not cfg.quiet:
                        log(f"epoch {epoch:3d}  loss {rec['loss']:.4f}  val_acc {rec['val_acc']:.4f}  "
                            f"{rec['nodes_per_s']:,.0f} nodes/s" + cache_note(rec))
                    runlog.epoch(rec)
                    saver.save(payload(epoch))
            if best_state is not None:
                self.model.load_state_dict(best_state)
            test_acc = self.evaluate(self.graph.test_ids, phase=cfg.epochs + 1)
            c = self.counter_totals
            test = {"acc": test_acc, "best_epoch": best_epoch, "best_val_acc": best}
            runlog.test(test, best_epoch)
        resume.finish(outputs, found)
        return {"task": "node", "model": cfg.model, "world_size": dist.world_size(),
                "config": cfg.to_dict(), "defaults": cfg.defaults, "epochs": epochs, "selected_epoch": best_epoch,
                "stop_reason": stop_reason, "restarts": restarts, "test": test,
                "cache": {"policy": cfg.cache, "capacity": cache_capacity(cfg.cache_size), **c,
                          "hit_rate": hit_rate(c["hits"], c["requests"])}}

    def _global_counters(self) -> dict[str, int]:
        """This epoch's feature-store counters summed over ranks."""
        local = self.graph.counters()
        t = torch.tensor([int(local.get(k, 0)) for k in COUNTERS], dtype=torch.int64, device=self.device)
        return dict(zip(COUNTERS, dist.all_reduce(t).cpu().tolist()))

    def _quiet(self) -> bool:
        return not show_progress(self.cfg.quiet) or dist.rank() != 0


def cache_note(rec: dict) -> str:
    """The cache part of an epoch's log line ('' without remote rows)."""
    if rec["cache_hit_rate"] is None and not rec["remote_bytes"]:
        return ""
    rate = "-" if rec["cache_hit_rate"] is None else f"{rec['cache_hit_rate']:.3f}"
    return f"  cache hits {rate}  remote {rec['remote_bytes'] / 2**20:,.1f} MiB"


# ----------------------------------------------------------------------------------------------
# Running it

SPLIT = Split("static", "metis", ("nodes", "train"), check_training_graph)


def rank_graph(source: Union[Graph, RankPart, str, os.PathLike], cfg: NodeConfig, device: torch.device) -> RankGraph:
    """What this rank sees: the whole graph (one rank) or its part of a static store (opened
    already, or a path: then opened now, as this rank of the process group)."""
    if isinstance(source, Graph):
        return WholeGraph(source)
    if isinstance(source, (str, os.PathLike)):
        source = open_part(source, dist.rank(), dist.world_size(), "static")
    return PartGraph(source.part, cfg, device)


def node_rank(source: Union[Graph, RankPart], device: torch.device, cfg: NodeConfig,
              outputs: Outputs = Outputs()) -> dict:
    """Train on this rank: `source` is the whole graph (one rank) or its part of a partition
    store (one part per rank); the metrics (`NodeTrainer.fit`)."""
    return NodeTrainer(rank_graph(source, cfg, device), cfg, device).fit(outputs=outputs)


def train_node(data: Data, cfg: NodeConfig = NodeConfig(), nproc: int = 1, outputs: Outputs = Outputs(),
               max_restarts: int = 0) -> dict:
    """Node classification on `data` (a `Graph`, a dataset name or path, a `DataSource`, or a
    static partition store) with `nproc` local ranks (started again, resuming from the
    checkpoint, up to `max_restarts` times after a rank fails), or as this rank of a torchrun
    world. Returns the metrics (of rank 0, or of this rank under torchrun); rank 0 prints the
    results and writes `outputs`. Local ranks import the calling script again: call from under
    `if __name__ == "__main__":`."""
    check_type("cfg", cfg, NodeConfig)
    check_type("outputs", outputs, Outputs)
    return run_job(data, nproc, SPLIT, node_rank, cfg, outputs, device=cfg.device, quiet=cfg.quiet, outputs=outputs,
                   max_restarts=max_restarts)
