"""A whole temporal link-prediction run (`train_link`): the training loop with model selection,
checkpoints and resume, then the test of the selected parameters.

Chronological 70/15/15 split. Each epoch resets the node state, trains on the training events,
then validates while the memory keeps absorbing the true events. Training stops after `epochs`
or when validation AP has not improved for `patience` epochs; the best-validation parameters
are then restored, the training and validation events replayed through their memory, and the
test events scored.
"""
from __future__ import annotations

import copy
import os
import sys
from typing import Any, Optional, Union

import numpy as np
import torch

from gnndist import checkpoint, resume
from gnndist.errors import GnndistError
from gnndist.outputs import Outputs
from gnndist.partition import RankPart, open_part
from gnndist.runtime import dist
from gnndist.runtime.launch import Data, Split, run_job
from gnndist.samplers import sampler_group
from gnndist.samplers.distributed import Requests
from gnndist.temporal.config import LinkConfig
from gnndist.temporal.events import RankEvents
from gnndist.temporal.linkpred import link_metrics
from gnndist.temporal.protocol import Protocol, protocol_folder
from gnndist.temporal.trainer import LinkTrainer
from gnndist.graph import TemporalGraph
from gnndist.validate import check_type

SPLIT = Split("temporal", "temporal")
RESUMED = ("config", "model", "optimizer", "node_state", "rng", "history", "best")  # what a resume reads
# the settings a resumed run must share with its checkpoint (--resume auto: all of them, and the ranks)
SAME_ON_RESUME = ("model", "batch_size", "lr", "lr_schedule", "clip_grad", "memory_dim", "time_dim", "num_neighbors",
                  "sampling", "neg", "seed", "memory", "num_nodes", "num_events", "edge_dim")


def fit(trainer: LinkTrainer, outputs: Outputs = Outputs()) -> dict[str, Any]:
    """Train with model selection on validation AP, then test the selected parameters; write a
    checkpoint each epoch, and within epochs as `outputs` asks (`checkpoint.run`,
    `resume.Checkpointer`); resume where `outputs.resume` or a restart asks (`resume.find`).
    Returns the metrics (the same on every rank)."""
    ev, cfg = trainer.events, trainer.cfg
    config = {**cfg.to_dict(), "num_nodes": ev.num_nodes, "num_events": ev.num_events, "edge_dim": ev.edge_dim,
              "world_size": ev.num_parts, "partition": ev.partition_key()}
    found = resume.start(outputs, trainer.device, RESUMED, lambda saved, whole: differs(saved, config, whole))
    spe = trainer.steps_per_epoch
    with checkpoint.run(resume.folder(outputs), resume.keeps(outputs, found), restore=ev.num_parts == 1):
        history, best, at = [], None, checkpoint.Position(0)
        if found is not None:
            history, best, at = load(trainer, found)
        first, restarts, runlog = resume.begin(outputs, found, at, cfg.epochs, spe, trainer.device)
        trainer.on_loss = runlog.step

        def payload(epoch: int, step: Optional[int] = None) -> dict[str, Any]:
            return {"config": config, "epoch": epoch, "step": step, **trainer_state(trainer),
                    "rng": checkpoint.rng_state(), "history": history, "best": best, "restarts": restarts}

        with resume.Checkpointer(outputs, spe, trainer.device, found) as saver:
            for epoch in range(first, cfg.epochs + 1):
                if cfg.patience is not None and history and history[-1]["epoch"] - best["epoch"] >= cfg.patience:
                    break
                trainer.on_step = lambda step: saver.step(epoch, step, lambda: payload(epoch, step))
                rec = trainer.train_epoch(epoch)
                val = link_metrics(*trainer.evaluate(trainer.train_end, trainer.val_end, "val")[:2], across_ranks=True)
                rec.update(val_ap=val["ap"], val_auc=val["auc"], val_mrr=val["mrr"])
                history.append(rec)
                runlog.epoch(rec)
                if best is None or val["ap"] > best["val_ap"]:
                    best = {"epoch": epoch, "val_ap": val["ap"], "model": copy.deepcopy(trainer.model.state_dict())}
                if dist.rank() == 0 and not cfg.quiet:
                    print(f"epoch {epoch}: loss {rec['loss']:.4f}, {rec['events_per_s']:,.0f} events/s, "
                          f"val AP {val['ap']:.4f} AUC {val['auc']:.4f} MRR {val['mrr']:.4f}", file=sys.stderr)
                saver.save(payload(epoch))
        test = selected_test_metrics(trainer, best)
        runlog.test(test, best["epoch"])
    resume.finish(outputs, found)
    return {"task": "link", "model": cfg.model, "world_size": ev.num_parts, "memory": cfg.memory, "share": cfg.share,
            "neg": cfg.neg, "negatives": trainer.candidates.kind, "protocol": trainer.protocol.name,
            "config": config, "defaults": cfg.defaults, "epochs": history, "selected_epoch": best["epoch"],
            "stop_reason": "patience" if history[-1]["epoch"] < cfg.epochs else "epochs",
            "restarts": restarts, "ranks": trainer.rank_metrics(), "test": test}


def differs(saved: dict[str, Any], config: dict[str, Any], whole: bool) -> Optional[str]:
    """Why a checkpoint's settings `saved` are not this run's `config` (None: they are): the
    settings a resume must share (`whole`: every one but `quiet`, and the rank count)."""
    if saved.get("world_size", 1) == config["world_size"] and saved.get("partition", config["partition"]) != \
            config["partition"]:  # checkpoints before the partition was recorded: not known
        return ("was written on another partition of the data (its ranks own other nodes): resume on the partition "
                "store it was trained on")
    return resume.changed(saved, config, SAME_ON_RESUME, whole)


def load(trainer: LinkTrainer, found: resume.Found) -> tuple[list, dict, checkpoint.Position]:
    """Load the checkpoint `found` into `trainer` (its node state re-cut for this run's ranks where
    it was written on another number of them): (history, best, position)."""
    saved, parts = found.payload, None
    if found.world != trainer.events.num_parts:  # every row from the ranks that held them
        every_row = found.world == 1 or saved["config"].get("memory") == "replicated"
        parts = [saved["node_state"]] + [checkpoint.load(f.parent, found.position, mmap=True)["node_state"]
                                         for f in ([] if every_row else found.files[1:])]
    checkpoint.load_params(trainer.model, saved["model"], found.files[0])
    trainer.optimizer.load_state_dict(saved["optimizer"])
    if trainer.state is not None:
        load_node_rows(trainer, [saved["node_state"]] if parts is None else parts)
    trainer.epoch_state = saved.get("epoch_state")
    checkpoint.set_rng_state(saved["rng"])
    return list(saved["history"]), saved["best"], found.position


def trainer_state(trainer: LinkTrainer) -> dict[str, Any]:
    """What a checkpoint holds of `trainer`: parameters, optimizer, node state (its rows keyed by
    the data's own node ids, `node_ids`, and those changed since the last call, `changed`) and,
    within an epoch, `epoch_state` (live tensors: copy them to keep them)."""
    epoch_state = None
    if trainer.epoch_state is not None:
        time_s, cpu_s = trainer.clock.elapsed()
        epoch_state = {**trainer.epoch_state, "time_s": time_s, "cpu_s": cpu_s}
    node_state = None
    if trainer.state is not None:
        st = trainer.state.state
        node_state = {"node_ids": trainer.held_orig, **st.state_dict(), "changed": checkpoint.Changed(*st.take_changed())}
    return {"model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict(),
            "node_state": node_state, "epoch_state": epoch_state}


def load_node_rows(trainer: LinkTrainer, parts: list[dict[str, Any]]) -> None:
    """The trainer's rows of the node states `parts` (each keyed by the data's node ids; of a
    checkpoint of format 1: by this store's ids, all rows or a `node_range` of them)."""
    st, ev = trainer.state.state, trainer.events
    held = st.held_ids().size
    got = 0
    for part in parts:
        if "node_ids" in part:
            ids = ev.orig_to_new[part["node_ids"].numpy()]
        else:
            ids = np.arange(*part["node_range"].tolist()) if "node_range" in part else np.arange(ev.num_nodes)
        got += st.load_rows(ids, {k: v for k, v in part.items() if k not in ("node_ids", "node_range")})
    if got != held:
        raise GnndistError(f"the checkpoint's node state holds {got:,} of the {held:,} rows of rank {ev.rank}")


def selected_test_metrics(trainer: LinkTrainer, best: dict[str, Any]) -> dict[str, Any]:
    """Test the selected parameters `best["model"]` over the node state they build on the
    training and validation events (replayed from event 0): the test metrics of the metrics JSON,
    also over the events of nodes new after training (a collective)."""
    ev = trainer.events
    trainer.model.load_state_dict(best["model"])
    trainer.reset_state()
    trainer.evaluate(0, trainer.val_end, "replay", score=False)
    pos, neg, _, src, dst = trainer.evaluate(trainer.val_end, ev.num_events, "test")
    new = new_nodes(trainer, np.concatenate([src, dst]))
    inductive = new[:src.size] | new[src.size:]
    test = link_metrics(pos, neg, across_ranks=True)
    test_new = link_metrics(pos[inductive], neg[inductive], across_ranks=True)
    n_inductive = int(dist.all_reduce(torch.tensor([int(inductive.sum())], device=trainer.device)).item())
    return {**_json_safe(test), **{f"inductive_{k}": v for k, v in _json_safe(test_new).items()},
            "inductive_events": n_inductive}


def new_nodes(trainer: LinkTrainer, nodes: np.ndarray) -> np.ndarray:
    """Whether each of `nodes` (new ids, a host array) has its first event after training, as
    their owners know (one request and one reply on the gloo group; a collective)."""
    ev = trainer.events
    first = ev.first_seen()
    mine = (first >= trainer.train_end) & (first < ev.num_events)
    asked = Requests(nodes, ev.book.owner(nodes), sampler_group())
    return asked.reply(mine[asked.received - ev.lo])


def _json_safe(metrics: dict[str, float]) -> dict[str, Optional[float]]:
    """NaN (an empty subset) as null, which JSON can hold."""
    return {k: (None if v != v else v) for k, v in metrics.items()}


def rank_events(source: Union[TemporalGraph, RankPart, str, os.PathLike]) -> RankEvents:
    """This rank's events: the whole graph (one process) or its part of a temporal store (opened
    already, or a path: then opened now, as this rank of the process group)."""
    if isinstance(source, TemporalGraph):
        return RankEvents.from_graph(source)
    if isinstance(source, (str, os.PathLike)):
        source = open_part(source, dist.rank(), dist.world_size(), "temporal")
    return RankEvents.from_partition(source.part, source.new_to_orig, source.orig_to_new)


def link_rank(source: Union[TemporalGraph, RankPart], device: torch.device, cfg: LinkConfig,
              outputs: Outputs = Outputs(), tgb: Optional[str] = None) -> dict:
    """One rank of a run: its events, then `fit` (`tgb`: the folder of TGB's protocol, if any)."""
    events = rank_events(source)
    return fit(LinkTrainer(events, cfg, device, Protocol.of(events.num_events, tgb)), outputs)


def train_link(data: Data, cfg: Optional[LinkConfig] = None, nproc: int = 1, outputs: Outputs = Outputs(),
               max_restarts: int = 0) -> dict:
    """Link prediction on `data` (a `TemporalGraph`, a dataset name or path, a `DataSource`, or
    a temporal partition store) on `nproc` local ranks (started again, resuming from the
    checkpoint, up to `max_restarts` times after a rank fails), or as this rank of a torchrun
    world.
    Returns the metrics (of rank 0, or of this rank under torchrun); rank 0 prints the results
    and writes `outputs`. Local ranks import the calling script again: call from under
    `if __name__ == "__main__":`."""
    cfg = LinkConfig() if cfg is None else cfg
    check_type("cfg", cfg, LinkConfig)
    check_type("outputs", outputs, Outputs)
    return run_job(data, nproc, SPLIT, link_rank, cfg, outputs, protocol_folder(data), device=cfg.device,
                   quiet=cfg.quiet, outputs=outputs, max_restarts=max_restarts)
