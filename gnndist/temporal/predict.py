"""Using a trained link-prediction model: the selected (best-validation) parameters of a
checkpoint on the temporal graph they were trained on (or one with the same nodes and more
events).

- `link_test`: the test metrics exactly as `gnndist train` printed them (the trainer's own
  `selected_test_metrics`: the training and validation events replayed through the memory
  from event 0, then the test events scored against their fixed negatives);
- `link_scores`: the score of candidate links (src, dst, t), each after replaying every event
  with a time before t;
- `link_embeddings`: every node's embedding at a time T, after replaying the events before T.

Replays run in the trained global batches: batch i is the events [iB, (i+1)B). A candidate
whose time falls inside batch i sees the batches before it and then, as one batch, the events
of batch i before its time (written provisionally: undone once it is scored), so that it sees
every earlier event, none at or after its time, and the same node state whatever the other
candidates are. Candidates with the same count of earlier events are scored together (each at
its own time), by the rank that owns their source node.

Candidate and embedding rows name nodes by the data's original ids (the ids in the file);
a partition store knows its graph's numbering only (0 .. N-1, ascending original id), and
a generated graph has no other. Everything runs on one process or on W ranks, each holding its
part of the events as in training, with the same metrics.
"""
from __future__ import annotations

import math
import numbers
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Iterator, Optional, Union

import numpy as np
import torch
from tqdm import tqdm

from gnndist.runtime import dist
from gnndist.datasets import DataSource
from gnndist.errors import GnndistError
from gnndist.graph import TemporalGraph, as_node_ids, as_numbers
from gnndist.io import show_progress
from gnndist.runtime.launch import Data, run_job
from gnndist.predict import Checkpoint, SavedModel, gather_rows, saved_model, source_of, to_positions
from gnndist.temporal.config import LinkConfig
from gnndist.temporal.events import RankEvents
from gnndist.runtime.device import to_device
from gnndist.temporal.events import BatchEvents
from gnndist.temporal.fit import SPLIT, rank_events, selected_test_metrics
from gnndist.temporal.protocol import Protocol, protocol_folder
from gnndist.temporal.trainer import LinkTrainer


def link_test(checkpoint: Checkpoint, data: Data, nproc: int = 1, device: str = "cpu", quiet: bool = False
              ) -> dict[str, Any]:
    """The test metrics of the checkpoint's selected parameters on `data` (the training data),
    as `gnndist train` printed them (rank 0 prints the same table); the keys of the metrics
    JSON's "test"."""
    saved = saved_model(checkpoint, "link")
    return run_saved(saved, source_of(data), nproc, _test_rank, device, quiet, protocol_folder(data),
                     same_events=True)


def link_scores(checkpoint: Checkpoint, data: Data, src: np.ndarray, dst: np.ndarray, t: np.ndarray,
                nproc: int = 1, device: str = "cpu", quiet: bool = False) -> np.ndarray:
    """Scores (logits, as the link metrics rank them) [n] of the candidate links (src[i],
    dst[i]) at times t[i] (original node ids), each after replaying every event of `data`
    with a time before t[i]."""
    saved = saved_model(checkpoint, "link")
    src, dst, t = as_node_ids("src", src), as_node_ids("dst", dst), as_numbers("t", t, np.float64)
    if not src.shape == dst.shape == t.shape:
        raise GnndistError("candidates need src, dst and t of one length each")
    if not np.isfinite(t).all():
        raise GnndistError("candidate times must be finite")
    source, known = _with_ids(source_of(data), nproc)
    n = int(saved.config["num_nodes"])
    pos = to_positions(src, known, n), to_positions(dst, known, n)
    return run_saved(saved, source, nproc, _scores_rank, device, quiet, *pos, t)


def link_embeddings(checkpoint: Checkpoint, data: Data, at: float, nproc: int = 1, device: str = "cpu",
                    quiet: bool = False) -> np.ndarray:
    """Every node's embedding [N, d] at time `at`, after replaying the events of `data` before
    `at`; row i is node i of the data's numbering (`node_ids` gives each row's original id)."""
    if not isinstance(at, numbers.Real) or isinstance(at, bool) or not math.isfinite(at):
        raise GnndistError(f"--embed-at must be a finite time, got {at!r}")
    saved = saved_model(checkpoint, "link")
    return run_saved(saved, source_of(data), nproc, _embed_rank, device, quiet, float(at))


def node_ids(data: Data) -> np.ndarray:
    """The original id of each node of `data` in its numbering (the rows of `link_embeddings`)."""
    source, known = _with_ids(source_of(data), 1)
    if known is not None:
        return known
    num = source.num_nodes if isinstance(source, TemporalGraph) else int(_store_nodes(source))
    return np.arange(num, dtype=np.int64)


# ------------------------------------------------------------------------------------------ setup

def _store_nodes(store: str) -> int:
    from gnndist.partition import read_store_meta

    return int(read_store_meta(store)["num_nodes"])


def _with_ids(source, nproc: int) -> tuple[Any, Optional[np.ndarray]]:
    """What the ranks read (raw data loaded here when one process reads it anyway) and the
    data's sorted original ids (None: a store or a graph without them, whose ids are 0..N-1)."""
    if isinstance(source, str):
        return source, None
    graph = source.load() if isinstance(source, DataSource) else source
    if not isinstance(graph, TemporalGraph):
        raise GnndistError("DATA is a static graph; a link model needs a temporal one")
    known = getattr(graph, "orig_ids", None)
    if known is not None and known.size > 1 and not np.all(np.diff(known) > 0):
        raise GnndistError("DATA numbers two kinds of nodes apart (users and items), so its original ids do not name "
                           "one node each; give DATA as a partition store of it (ids 0..N-1, users first)")
    return (graph if nproc == 1 else source), known


def run_saved(saved: SavedModel, source, nproc: int, rank_fn, device: str, quiet: bool, *args: Any,
              same_events: bool = False):
    """`rank_fn` on the ranks of a job over `source`, whose sizes are checked against the
    checkpoint's before raw data is split for them."""
    saved.check_kind(source)
    split = replace(SPLIT, check=lambda g: _check_sizes(saved, g, same_events))
    return run_job(source, nproc, split, rank_fn, saved, quiet, *args, device=device, quiet=quiet)


def _check_sizes(saved: SavedModel, data: Union[TemporalGraph, RankEvents], same_events: bool) -> None:
    """A one-line error unless `data` (a graph, or a rank's events) has the node count and edge
    feature width the model was trained with (and its event count, where `same_events`)."""
    sizes = {"num_nodes": data.num_nodes, "edge_dim": data.edge_dim}
    saved.check_sizes({**sizes, "num_events": data.num_events} if same_events else sizes)


def saved_trainer(source, saved: SavedModel, device: torch.device, quiet: bool, same_events: bool = False,
                  tgb: Optional[str] = None) -> LinkTrainer:
    """This rank's trainer with the saved settings and the selected parameters (`tgb`: the
    folder of TGB's protocol, if any)."""
    events = rank_events(source)
    _check_sizes(saved, events, same_events)
    # checkpoints from before the sampling setting: TGAT sampled uniformly, the others the most recent
    cfg = saved.settings(LinkConfig, {"sampling": "uniform" if saved.config.get("model") == "tgat" else "recent"},
                         device=device.type, quiet=quiet)
    trainer = LinkTrainer(events, cfg, device, Protocol.of(events.num_events, tgb))
    saved.load_params(trainer.model)
    trainer.model.eval()
    return trainer


# ------------------------------------------------------------------------------------------ on a rank

def _bar(trainer: LinkTrainer, total: int, desc: str, unit: str) -> tqdm:
    """A progress bar on rank 0 (on a terminal, without --quiet)."""
    return tqdm(total=total, desc=desc, unit=unit, leave=False,
                disable=dist.rank() != 0 or not show_progress(trainer.cfg.quiet))


class Replay:
    """The events replayed through a trainer's node state from a reset, in the global batches
    [iB, (i+1)B) (a collective: all ranks replay together)."""

    def __init__(self, trainer: LinkTrainer, stop: int) -> None:
        self.trainer, self.done = trainer, 0
        trainer.progress = False  # one bar here, not one per replayed stretch
        self.bar = _bar(trainer, stop, "replay", "ev")
        trainer.reset_state()

    @contextmanager
    def at(self, stop: int) -> Iterator[None]:
        """The block sees the state after the events [0, stop): the whole batches before `stop`
        (kept), then the events of the batch `stop` falls in, up to `stop`, as one batch (undone
        after the block). `stop` never decreases from one call to the next."""
        tr = self.trainer
        grid = stop // tr.cfg.batch_size * tr.cfg.batch_size
        if tr.state is not None and grid > self.done:  # a model without memory has nothing to replay
            tr.evaluate(self.done, grid, "replay", score=False)
        self.done = max(self.done, grid)
        self.bar.update(max(stop - self.bar.n, 0))
        if tr.state is None or stop == grid:
            yield
            return
        with tr.state.provisional():
            tr.evaluate(grid, stop, "replay", score=False)
            yield


def events_before(trainer: LinkTrainer, times: np.ndarray) -> np.ndarray:
    """For each time, how many events of the whole graph come before it (a collective: each
    rank counts the events it scores, which are every event once)."""
    ev = trainer.events
    mine = np.searchsorted(ev.t[ev.scored], times, side="left").astype(np.int64)
    return dist.all_reduce(torch.from_numpy(mine).to(trainer.device)).cpu().numpy()


def _test_rank(source, dev: torch.device, saved: SavedModel, quiet: bool, tgb: Optional[str]) -> dict[str, Any]:
    trainer = saved_trainer(source, saved, dev, quiet, same_events=True, tgb=tgb)
    return selected_test_metrics(trainer, {"epoch": saved.selected_epoch, "model": saved.params})


@torch.no_grad()
def _scores_rank(source, dev: torch.device, saved: SavedModel, quiet: bool, src: np.ndarray, dst: np.ndarray,
                 t: np.ndarray) -> np.ndarray:
    trainer = saved_trainer(source, saved, dev, quiet)
    ev, b = trainer.events, trainer.cfg.batch_size
    src, dst = ev.orig_to_new[src], ev.orig_to_new[dst]
    before = events_before(trainer, t)
    order = np.argsort(before, kind="stable")
    cuts, starts = np.unique(before[order], return_index=True)
    mine = ev.book.owner(src) == ev.rank
    replay = Replay(trainer, int(cuts[-1]) if cuts.size else 0)
    bar = _bar(trainer, t.size, "score", "link")
    rows_done, scores = [np.zeros(0, np.int64)], [torch.zeros(0)]
    for cut, rows in zip(cuts, np.split(order, starts[1:])):
        bar.update(rows.size)
        rows = rows[mine[rows]]
        with replay.at(int(cut)):
            for k in range(dist.agree_max(math.ceil(rows.size / b), dev)):
                r = rows[k * b:(k + 1) * b]
                candidates = BatchEvents(src[r], dst[r], t[r], np.zeros((r.size, 0), np.int64),
                                         np.full(r.size, -1, np.int64), np.zeros((r.size, ev.edge_dim), np.float32))
                scores.append(trainer.forward(trainer.planner.ready(candidates)).pos.cpu())
                rows_done.append(r)
    replay.bar.close()
    bar.close()
    return gather_rows(np.concatenate(rows_done), torch.cat(scores), t.size, dev)


@torch.no_grad()
def _embed_rank(source, dev: torch.device, saved: SavedModel, quiet: bool, at: float) -> np.ndarray:
    trainer = saved_trainer(source, saved, dev, quiet)
    ev, b, model = trainer.events, trainer.cfg.batch_size, trainer.model
    cut = int(events_before(trainer, np.array([at]))[0])
    replay = Replay(trainer, cut)
    own = np.arange(ev.lo, ev.hi, dtype=np.int64)
    out = [torch.zeros((0, model.dim))]
    steps = dist.agree_max(math.ceil(own.size / b), dev)
    with replay.at(cut), _bar(trainer, steps, "embed", "step") as bar:
        replay.bar.close()
        for k in range(steps):
            nodes = own[k * b:(k + 1) * b]
            times = np.full(nodes.size, at)
            hops = trainer.neighbours.sample_now(*model.neighbour_queries(nodes, times, 0))
            out.append(model.embed(trainer.state, to_device(nodes, dev), to_device(times, dev), 0, hops,
                                   (nodes, times)).embed.cpu())
            bar.update()
    return gather_rows(ev.new_to_orig[own], torch.cat(out), ev.num_nodes, dev)
