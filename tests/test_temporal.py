"""Memory-based temporal GNNs: no leakage, write-once state updates, monotone times, mailbox,
dedup and attention helpers against brute force, and every model learning."""
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from gnndist.datasets import load
from gnndist.graph import TemporalGraph
from gnndist.errors import GnndistError
from gnndist.temporal.config import LinkConfig
from gnndist.temporal.events import RankEvents
from gnndist.temporal.half_process import Placement
from gnndist.temporal.linkpred import EvalNegatives, train_negatives
import gnndist.runtime.device
from gnndist.temporal.models import MODELS, state_rows
from gnndist.temporal.attention import attend
from gnndist.temporal.modules import CellUpdater, LinkPredictor, TemporalAttention, last_per_node, update_memory
from gnndist.temporal.state import NodeState, merge_mailbox
from gnndist.temporal.time_encoding import time_encoder
from gnndist.temporal.timers import Timers
from gnndist.temporal import neighbours
from gnndist.temporal.split_step import batch_loss
from gnndist.temporal.trainer import LinkTrainer
from gnndist.runtime.threads import job_threads

MEMORY_MODELS = [m for m in MODELS if m != "tgat"]


def random_graph(seed=0, n=30, e=400, edge_dim=3, ties=True) -> TemporalGraph:
    rng = np.random.default_rng(seed)
    t = np.sort(rng.integers(0, e // 3, e) if ties else rng.random(e) * e).astype(float)
    return TemporalGraph(rng.integers(0, n, e), rng.integers(0, n, e), t,
                         rng.normal(size=(e, edge_dim)).astype(np.float32), num_nodes=n)


def trainer(name, tg, batch_size=40, lr=1e-2, **kw) -> LinkTrainer:
    """A one-process trainer with small dimensions, running each batch as one half (the tests
    of two halves set `halves` themselves)."""
    cfg = LinkConfig(model=name, memory_dim=16, time_dim=8, num_neighbors=4, batch_size=batch_size, lr=lr, **kw)
    tr = LinkTrainer(RankEvents.from_graph(tg), cfg)
    tr.halves = 1
    return tr


def run(name, tg, batch_size=40, train=True, state=None, tr=None, lr=1e-2, **kw):
    """Process ALL events in batches as the trainer does; the Forward of each batch."""
    tr = tr or trainer(name, tg, batch_size, lr, **kw)
    if state is not None:
        tr.set_state(state)
    outs = []
    tr.model.train(train)
    for index, s, e in tr.batches(0, tg.num_events):
        batch = tr.batch(s, e, lambda rows, src, dst: train_negatives(0, 1, index, e - s, rows, dst, tg.num_nodes))
        if train:
            fw = tr.step(batch, e - s)[1][0].fw  # one half
        else:
            with torch.no_grad():
                fw = tr.forward(batch)
            tr.model.write(tr.state, batch, fw)
        outs.append((s, e, fw))
    return outs


@pytest.mark.parametrize("name, cache", [("tgn", "none"), ("tgn", "presample"), ("tgat", "none"), ("dyrep", "none"),
                                         ("apan", "none")])
def test_an_epoch_sampled_ahead_trains_as_one_sampled_step_by_step(name, cache, monkeypatch):
    """`train_epoch` samples windows of 3 steps at once (`Neighbours.plan`; 7 steps: windows of
    3, 3, 1); the same steps sampled each when it runs give the same parameters and node state.
    With the cache the features are fetched through the feature store instead of coming with
    the samples; TGAT's second hop and DyRep's endpoint-only queries are split by step too."""
    monkeypatch.setattr(neighbours, "PLAN_STEPS", 3)
    tg = random_graph()
    planned, live = trainer(name, tg, cache=cache), trainer(name, tg, cache=cache)
    assert planned.steps_per_epoch == 7
    planned.train_epoch(1)
    live.model.train()
    with job_threads():  # on the threads `train_epoch` runs on
        for index, s, e in live.batches(0, live.train_end):
            live.step(live.batch(s, e, lambda rows, src, dst: train_negatives(0, 1, index, e - s, rows, dst,
                                                                                tg.num_nodes)), e - s)
    for (what, a), b in zip(planned.model.named_parameters(), live.model.parameters()):
        assert torch.equal(a, b), what
    if planned.state is not None:
        for what, a in planned.state.state_dict().items():
            assert torch.equal(a, live.state.state_dict()[what]), what


@pytest.mark.parametrize("name", MODELS)
def test_a_batch_run_as_halves_in_two_processes_trains_and_scores_as_the_whole_batch(name):
    """Each batch run as two halves of its events, the second in the half process
    (`gnndist.temporal.split_step`, `gnndist.temporal.half_process`), against the whole batch in
    one: at every step the same loss, summed gradient, parameters and node state, then the same
    validation scores, up to float summation order. Nodes recur
    within batches (30 nodes, 40 events a batch), so both halves read and write the same rows.
    Torch on one thread, as where a step runs as two halves (`threads.step_halves`)."""
    tg = random_graph(e=600)
    whole, split = trainer(name, tg, lr=1e-3), trainer(name, tg, lr=1e-3)
    whole.halves, split.halves = 1, 2
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _steps_and_scores_agree(tg, whole, split)
    finally:
        torch.set_num_threads(threads)


def _steps_and_scores_agree(tg, whole, split, exact=False):
    for index, s, e in whole.batches(0, whole.train_end):
        got = []
        for tr in (whole, split):
            tr.model.train()
            batch = tr.batch(s, e, lambda rows, src, dst: train_negatives(0, 1, index, e - s, rows, dst, tg.num_nodes))
            loss = tr.step(batch, e - s)[0]
            got.append((loss, torch.cat([torch.zeros(p.numel()) if p.grad is None else p.grad.reshape(-1)
                                         for p in tr.params]),
                        torch.cat([p.detach().reshape(-1) for p in tr.params]),
                        [] if tr.state is None else list(tr.state.state_dict().values())))
        (loss0, grad0, param0, state0), (loss1, grad1, param1, state1) = got
        assert grad0.abs().max() > 0, index
        if exact:
            assert loss0 == loss1 and torch.equal(grad0, grad1) and torch.equal(param0, param1), index
            assert all(torch.equal(a, b) for a, b in zip(state0, state1)), index
            continue
        assert abs(loss0 - loss1) < 1e-6, index
        torch.testing.assert_close(grad1, grad0, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(param1, param0, rtol=1e-4, atol=1e-4)  # Adam amplifies float noise
        for a, b in zip(state1, state0):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    scores = [tr.evaluate(tr.train_end, tr.val_end, "val") for tr in (whole, split)]
    for a, b in zip(*scores):
        if exact:
            assert np.array_equal(a, b)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


class Always(Placement):
    """A placement that runs every second half the one way."""

    def __init__(self, remote: bool) -> None:
        super().__init__()
        self.way = remote

    def remote(self) -> bool:
        return self.way


@pytest.mark.parametrize("name", MODELS)
def test_a_second_half_gives_the_same_bits_in_the_half_process_and_here(name):
    """Where a step's second half runs (`half_process.Placement`) changes no bit of the loss,
    gradients, parameters, node state or scores: both ways run the same operations on one thread."""
    tg = random_graph(e=600)
    there, here = trainer(name, tg, lr=1e-3), trainer(name, tg, lr=1e-3)
    there.halves = here.halves = 2
    there.split.placements = {True: Always(True), False: Always(True)}
    here.split.placements = {True: Always(False), False: Always(False)}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _steps_and_scores_agree(tg, there, here, exact=True)
    finally:
        torch.set_num_threads(threads)
    assert there.split.process is not None and here.split.process is None


class TwoInThree(Placement):
    """A placement that runs two second halves of three in the half process."""

    def remote(self) -> bool:
        self.steps += 1
        return self.steps % 3 != 0


@pytest.mark.parametrize("name", ["tgn", "tgat", "apan"])
def test_an_epoch_with_the_next_batch_staged_gives_the_same_bits_as_one_without(name, monkeypatch):
    """`train_epoch` and `evaluate` make each next batch, sampled ahead in windows of 3 steps,
    while the half process runs, and send its second half ahead where it runs there too
    (`run_batch`'s `ahead`): the same bits of parameters, node state and scores as steps that
    stage nothing, with second halves in the process and here in turn."""
    monkeypatch.setattr(neighbours, "PLAN_STEPS", 3)
    tg = random_graph(e=600)
    staged, ref = trainer(name, tg, lr=1e-3), trainer(name, tg, lr=1e-3)
    staged.halves = ref.halves = 2
    staged.split.placements = {True: TwoInThree(), False: TwoInThree()}
    ref.split.placements = {True: Always(False), False: Always(False)}  # never stages: nothing runs in the process
    sent, stage = [], staged.split._stage

    def counted(item, training):
        stage(item, training)
        sent.append(staged.split._staged is not None and staged.split._staged.second is not None)

    staged.split._stage = counted
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        scores = []
        for tr in (staged, ref):
            tr.train_epoch(1)
            scores.append(tr.evaluate(tr.train_end, tr.val_end, "val"))
    finally:
        torch.set_num_threads(threads)
    assert sum(sent) >= 4 and not all(sent)  # staged ahead to the process, and not
    assert all(torch.equal(a, b) for a, b in zip(staged.params, ref.params))
    if staged.state is not None:
        for what, a in staged.state.state_dict().items():
            assert torch.equal(a, ref.state.state_dict()[what]), what
    for a, b in zip(*scores):
        assert np.array_equal(a, b)


def test_a_step_whose_half_process_died_is_named_and_the_next_one_forks_another():
    """The half process killed between two steps: the next step raises naming it, having changed
    nothing, and run again (in a new half process) gives what it gives in a run where nothing
    happened."""
    tg = random_graph(e=600)
    runs = [trainer("tgn", tg, lr=1e-3) for _ in range(2)]
    for tr in runs:
        tr.halves = 2
        tr.split.placements = {True: Always(True), False: Always(True)}
    killed = None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for index, s, e in runs[0].batches(0, 6 * 40):
            for tr in runs:
                tr.model.train()
                batch = tr.batch(s, e, lambda rows, src, dst: train_negatives(0, 1, index, e - s, rows, dst, tg.num_nodes))
                if tr is runs[1] and index == 3:
                    killed = tr.split.process.pid
                    os.kill(killed, signal.SIGKILL)
                    with pytest.raises(GnndistError, match=rf"\(pid {killed}\) ended: killed by SIGKILL$"):
                        tr.step(batch, e - s)
                    assert tr.split.process is None
                tr.step(batch, e - s)
            assert all(torch.equal(a, b) for a, b in zip(runs[0].params, runs[1].params)), index
            assert all(torch.equal(a, b) for a, b in zip(runs[0].state.state_dict().values(),
                                                         runs[1].state.state_dict().values())), index
    finally:
        torch.set_num_threads(threads)
    assert killed is not None and runs[1].split.process.pid != killed


def _two_half_steps(tr, tg, batches, before_step=lambda index: None):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for index, s, e in list(tr.batches(0, tr.train_end))[:batches]:
            tr.model.train()
            batch = tr.batch(s, e, lambda rows, src, dst: train_negatives(0, 1, index, e - s, rows, dst, tg.num_nodes))
            before_step(index)
            tr.step(batch, e - s)
    finally:
        torch.set_num_threads(threads)


def test_a_step_interrupted_after_its_halves_ran_leaves_the_next_ones_in_step():
    """Ctrl-C in the optimizer step, after the half process was told to write: the next steps
    run on with the same process (it was not left with an unread reply)."""
    tg = random_graph(e=600)
    tr = trainer("tgn", tg, lr=1e-3)
    tr.halves = 2
    tr.split.placements = {True: Always(True), False: Always(True)}
    adam = tr.optimizer.step

    def interrupted(*args, **kwargs):
        tr.optimizer.step = adam
        raise KeyboardInterrupt

    def before(index):
        if index == 2:
            tr.optimizer.step = interrupted

    with pytest.raises(KeyboardInterrupt):
        _two_half_steps(tr, tg, 4, before)
    pid = tr.split.process.pid
    _two_half_steps(tr, tg, 4)
    assert tr.split.process.pid == pid


def test_where_no_process_can_be_forked_the_rank_runs_both_halves(monkeypatch, capfd):
    tg = random_graph(e=600)
    tr, ref = trainer("tgn", tg, lr=1e-3), trainer("tgn", tg, lr=1e-3)
    for t in (tr, ref):
        t.halves = 2
    ref.split.placements = {True: Always(False), False: Always(False)}

    def no_fork():
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    _two_half_steps(tr, tg, 4)
    _two_half_steps(ref, tg, 4)
    assert tr.split.process is None and signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert all(torch.equal(a, b) for a, b in zip(tr.params, ref.params))
    assert capfd.readouterr().err.count("this rank runs both halves") == 1


def test_placement_takes_the_faster_way_and_tries_the_other_every_probe():
    place, ways = Placement(), []
    for step in range(4 * Placement.PROBE):
        way = place.remote()
        ways.append(way)
        process_faster = step < 2 * Placement.PROBE
        place.took(way, 0.010 if way == process_faster else 0.016, 200)
    assert ways[:2] == [True, False]  # each way once
    probe = Placement.PROBE
    assert [step for step, w in enumerate(ways[:2 * probe], 1) if not w] == [2, probe, 2 * probe]
    # the process turned slower after step 2 * probe: its next probe here finds it out
    assert not any(ways[3 * probe:4 * probe - 1]) and ways[4 * probe - 1]


def test_a_probe_replaces_the_other_ways_time_though_the_next_way_was_chosen_first():
    """Where the next step's way is chosen while a step runs (its half staged), before the step's
    time is in: the process is the faster way until the other job ends after step 60, then the
    rank alone; the first probe after that (step 100) finds it out, and the steps after the
    next (chosen before step 100's time was in) run on the rank (a probe's time averaged in like
    the way in use's would not switch)."""
    place = Placement()
    way, ways = place.remote(), []
    for step in range(1, 3 * Placement.PROBE):
        ways.append(way)
        upcoming = place.remote()
        rank_faster = step > 60
        place.took(way, 0.004 if rank_faster and not way else 0.010 if way else 0.016, 200)
        way = upcoming
    assert [step for step, w in enumerate(ways[:2 * Placement.PROBE], 1) if not w] == [3, 4, Placement.PROBE,
                                                                                      2 * Placement.PROBE]
    assert ways[2 * Placement.PROBE] and not any(ways[2 * Placement.PROBE + 1:])


KERNELS = r"""
import json
from gnndist.datasets.generators import synthetic_temporal
from gnndist.samplers import kernels
from gnndist.temporal import attention, time_encoding
from gnndist.temporal.config import LinkConfig
from gnndist.temporal.events import RankEvents
from gnndist.temporal.trainer import LinkTrainer
every = {"attend": attention._attend, "attend_grad": attention._attend_grad, "cos": time_encoding._cos_encode,
         "tcsr_serial": kernels._tcsr_serial, "tcsr_parallel": kernels._tcsr_parallel}
count = lambda: {name: len(kernel.signatures) for name, kernel in every.items()}
tr = LinkTrainer(RankEvents.from_graph(synthetic_temporal(200, 8000, 4, seed=0)), LinkConfig(batch_size=100))
built = count()
tr.train_epoch(1)
tr.evaluate(tr.train_end, tr.val_end, "val")
print(json.dumps({"built": built, "trained": count()}))
"""


def test_a_trainer_has_every_kernel_its_steps_run_before_the_first_epoch():
    """In a fresh process, every numba kernel a TGN epoch and its validation run (the sampler's
    parallel one among them: windows of steps of 300 queries of 10 neighbours), and the
    sampler's serial one, is compiled or loaded from numba's cache when the trainer is built,
    for the types the steps use: no epoch's time holds it (on a cold cache, about 0.6 s of the
    benchmark's UCI epoch)."""
    p = subprocess.run([sys.executable, "-c", KERNELS], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["trained"] == got["built"] and min(got["built"].values()) == 1, got


def test_timers_leave_out_what_a_thread_runs_untimed():
    """Work a thread does beside the steps (a window's plan) is no phase of the step; the same
    phase in another thread meanwhile is."""
    timers = Timers()

    def spend(untimed):
        with timers.untimed() if untimed else contextlib.nullcontext():
            with timers.phase("sample"):
                time.sleep(0.05)

    beside = threading.Thread(target=spend, args=(True,))
    beside.start()
    spend(False)
    beside.join()
    timed = timers.seconds["sample"]
    assert 0.05 <= timed < 0.1
    spend(True)
    assert timers.seconds["sample"] == timed


def perturbed(tg: TemporalGraph, first: int, seed=1) -> TemporalGraph:
    """Same event times; other endpoints and features for events at positions >= first."""
    rng = np.random.default_rng(seed)
    src, dst, feat = tg.src.copy(), tg.dst.copy(), tg.edge_feat.copy()
    m = tg.num_events - first
    src[first:], dst[first:] = rng.integers(0, tg.num_nodes, m), rng.integers(0, tg.num_nodes, m)
    feat[first:] = rng.normal(size=(m, tg.edge_dim))
    return TemporalGraph(src, dst, tg.t, feat, num_nodes=tg.num_nodes)


def rows_of(fw, events):
    """Embedding rows (src, dst, negatives) of the batch-local event positions `events`."""
    b, n = fw.neg.shape
    neg = (2 * b + events[:, None] * n + np.arange(n)).reshape(-1)
    return np.concatenate([events, b + events, neg])


@pytest.mark.parametrize("name, sampling", [(m, "recent") for m in MODELS] + [("tgat", "uniform"), ("tgn", "uniform")])
def test_no_leakage_from_events_at_or_after_t(name, sampling):
    tg = random_graph(e=240)
    cut_time = tg.t[tg.num_events // 2 + 7]
    first = int(np.searchsorted(tg.t, cut_time))  # first event at or after cut_time
    assert first % 40 != 0  # a batch holds events on both sides of the cut
    tr = trainer(name, tg, sampling=sampling)
    assert tr.neighbours.strategy == sampling
    a, b = run(name, tg, tr=tr), run(name, perturbed(tg, first), sampling=sampling)
    differ = False
    for (s, e, fa), (_, _, fb) in zip(a, b):
        before = np.flatnonzero(tg.t[s:e] < cut_time)
        torch.testing.assert_close(fa.pos[before], fb.pos[before], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fa.neg[before], fb.neg[before], rtol=1e-5, atol=1e-5)
        rows = torch.from_numpy(rows_of(fa, before))
        torch.testing.assert_close(fa.embed[rows], fb.embed[rows], rtol=1e-5, atol=1e-5)
        differ |= e > first and not torch.allclose(fa.pos, fb.pos)
    assert differ  # the perturbation does change later scores


@pytest.mark.parametrize("name", MEMORY_MODELS)
def test_same_time_event_in_an_earlier_batch_is_not_seen(name):
    # events 0..29 at distinct times, then two at time 100 in separate batches
    tg = random_graph(seed=3, n=8, e=32, ties=False)
    t = np.sort(tg.t)
    t[30:32] = 100.0
    src, dst = tg.src.copy(), tg.dst.copy()
    src[30:32], dst[30:32] = 0, [1, 2]
    g1 = TemporalGraph(src, dst, t, tg.edge_feat, num_nodes=8)
    dst2, feat2 = dst.copy(), tg.edge_feat.copy()
    dst2[30], feat2[30] = 3, 5.0
    g2 = TemporalGraph(src, dst2, t, feat2, num_nodes=8)
    # a mailbox large enough that the newer mail evicts nothing (eviction would change APAN's input)
    a = run(name, g1, batch_size=1, train=False, mailbox=64)
    b = run(name, g2, batch_size=1, train=False, mailbox=64)
    fa, fb = a[31][2], b[31][2]  # the second event at time 100
    torch.testing.assert_close(fa.pos, fb.pos, rtol=1e-5, atol=1e-5)
    # APAN advances an endpoint's state at its event, so a negative that was the other endpoint
    # (1 or 3) differs by that fact; the same-time mail's content stays unseen everywhere
    rows = slice(0, 2) if name == "apan" else slice(None)
    torch.testing.assert_close(fa.embed[rows], fb.embed[rows], rtol=1e-5, atol=1e-5)
    if name != "apan":
        torch.testing.assert_close(fa.neg, fb.neg, rtol=1e-5, atol=1e-5)


class SpyState(NodeState):
    """A NodeState that records every write with the rows it replaced."""

    def __init__(self, *args):
        super().__init__(*args)
        self.writes = []

    def write(self, ids, memory, last_update, mail, mail_time, host_ids=None):
        before = (self.last_update[ids].clone(), self.mail_time[ids].clone(), self.memory[ids].clone())
        self.writes.append((ids.clone(), memory.clone(), last_update.clone(), mail.clone(), mail_time.clone(), before))
        super().write(ids, memory, last_update, mail, mail_time)

    def deliver(self, ids, memory, last_update, to, mail, mail_time, seq, host_ids=None, host_to=None):
        """Recorded as a write of every node it touched, with the rows it left."""
        assert torch.unique(ids).numel() == ids.numel()  # each memory row once
        rows = torch.unique(torch.cat([ids, to]))
        before = (self.last_update[rows].clone(), self.mail_time[rows].clone(), self.memory[rows].clone())
        super().deliver(ids, memory, last_update, to, mail, mail_time, seq)
        self.writes.append((rows, *(t[rows].clone() for t in (self.memory, self.last_update, self.mail,
                                                               self.mail_time)), before))


@pytest.mark.parametrize("name", MEMORY_MODELS)
def test_each_node_written_once_per_batch_from_its_last_event(name):
    tg = random_graph(seed=5)
    tr = trainer(name, tg)
    model = tr.model
    state = SpyState(tg.num_nodes, model.dim, model.memory.mail_dim, model.memory.mailbox, float(tg.t[0]))
    outs = run(name, tg, state=state, tr=tr)
    assert len(state.writes) == len(outs)  # one write per batch
    de = tg.edge_dim
    for (s, e, _), (ids, memory, last_update, mail, mail_time, (old_lu, old_mt, old_mem)) in zip(outs, state.writes):
        ids_np = ids.numpy()
        assert np.unique(ids_np).size == ids_np.size  # each node once
        ends = np.r_[tg.src[s:e], tg.dst[s:e]]
        assert set(np.unique(ends)) <= set(ids_np)
        for row, v in enumerate(ids_np):
            hits = np.flatnonzero((tg.src[s:e] == v) | (tg.dst[s:e] == v))
            if model.memory.to_neighbors:
                if hits.size:
                    assert mail_time[row, -1] >= tg.t[s + hits[-1]]
                else:  # a neighbour that only received mail keeps its memory
                    assert torch.equal(memory[row], old_mem[row])
                continue
            assert hits.size  # only endpoints are written
            last = s + hits[-1]
            assert mail_time[row, -1] == tg.t[last]
            torch.testing.assert_close(mail[row, -1, -de:], torch.from_numpy(tg.edge_feat[last]))
            other = tg.dst[last] if tg.src[last] == v else tg.src[last]
            if name in ("tgn", "jodie"):  # the mail holds the other endpoint's updated memory
                torch.testing.assert_close(mail[row, -1, :model.dim], memory[ids_np == other][0])
            else:  # DyRep's starts with the node's own (DyGLib's message), then the other's embedding
                torch.testing.assert_close(mail[row, -1, :model.dim], memory[row])
                assert not torch.equal(mail[row, -1, model.dim:2 * model.dim], memory[ids_np == other][0])
        # times never go backwards, and memory is never ahead of the newest mail
        assert (last_update >= old_lu).all()
        assert (mail_time[:, -1] >= old_mt[:, -1]).all()
        assert (last_update <= mail_time[:, -1]).all()


def test_merge_mailbox_matches_brute_force():
    rng = np.random.default_rng(0)
    r, m, dim, d = 6, 3, 2, 25
    mail = torch.from_numpy(rng.normal(size=(r, m, dim)).astype(np.float32))
    mail_time = torch.from_numpy(np.sort(rng.integers(0, 5, (r, m)), 1).astype(float))
    mail_time[0] = float("-inf")  # an empty mailbox
    mail_time[1, 0] = float("-inf")
    rows = torch.from_numpy(rng.integers(0, r, d))
    new_time = torch.from_numpy(rng.integers(4, 8, d).astype(float))
    new_mail = torch.from_numpy(rng.normal(size=(d, dim)).astype(np.float32))
    seq = torch.from_numpy(rng.permutation(d))
    box, box_time = merge_mailbox(mail, mail_time, rows, new_mail, new_time, seq)
    for i in range(r):
        entries = [(mail_time[i, j].item(), -10 + j, mail[i, j]) for j in range(m)]
        entries += [(new_time[x].item(), seq[x].item(), new_mail[x]) for x in range(d) if rows[x] == i]
        entries.sort(key=lambda z: (z[0], z[1]))
        keep = entries[-m:]
        assert box_time[i].tolist() == [z[0] for z in keep]
        assert torch.equal(box[i], torch.stack([z[2] for z in keep]))


def test_last_per_node_matches_brute_force():
    nodes = torch.tensor([3, 1, 3, 0, 1, 3, 5])
    rows, last = last_per_node(nodes, 7)
    assert rows.tolist() == [0, 1, 3, 5]
    assert last.tolist() == [3, 4, 5, 6]


def attention_brute_force(att, query, nodes, context, mask):
    """Every key projected one by one, a softmax per row and head over its valid keys (PyG's
    TransformerConv without key bias), a zero value for a row without keys, plus the skip."""
    r, k, _ = nodes.shape
    h, dh = att.heads, att.q.out_features // att.heads
    q = att.q(query).view(r, 1, h, dh)
    key = (att.k(nodes) + att.k_context(context)).view(r, k, h, dh)
    val = (att.v(nodes) + att.v_context(context)).view(r, k, h, dh)
    score = (q * key).sum(-1) / dh ** 0.5
    attn = torch.softmax(score.masked_fill(~mask.unsqueeze(-1), float("-inf")), dim=1).nan_to_num(0.0)
    return (attn.unsqueeze(-1) * val).sum(1).reshape(r, h * dh) + att.skip(query)


@pytest.mark.parametrize("kernels", [True, False], ids=["cpu-kernels", "device-path"])
@pytest.mark.parametrize("queries", ["per-row", "shared", "indexed"])
def test_temporal_attention_matches_projecting_every_key(queries, kernels, monkeypatch):
    """Against every key projected (brute force), forward and parameter gradients: a query input
    per row, one shared by all rows (TGAT's zero inputs, with a one-row table), or rows of a
    smaller query table by index (`query_inputs`' distinct rows)."""
    monkeypatch.setattr(gnndist.runtime.device, "CPU_PATHS", kernels)
    torch.manual_seed(0)
    r, k, dq, dc = 7, 5, 6, 4
    att = TemporalAttention(dq, dq, dc, 8, heads=2)
    table = torch.randn(1 if queries == "shared" else 11, dq)
    index = torch.randint(0, table.shape[0], (r, k))
    query = torch.randn({"per-row": r, "shared": 1, "indexed": 3}[queries], dq)
    query_index = torch.tensor([2, 0, 2, 1, 0, 0, 2]) if queries == "indexed" else None
    context = torch.randn(r, k, dc)
    mask = torch.rand(r, k) < 0.6
    mask[0] = False  # a row without keys
    got = att(query, table, index, context, mask, query_index)
    grads = torch.autograd.grad(got.square().sum(), list(att.parameters()), allow_unused=True)
    rows = query.expand(r, dq) if query_index is None else query[query_index]
    want = attention_brute_force(att, rows, table[index], context, mask)
    wants = torch.autograd.grad(want.square().sum(), list(att.parameters()), allow_unused=True)
    assert torch.allclose(got, want, atol=1e-5)
    for (name, _), g, w in zip(att.named_parameters(), grads, wants):
        assert torch.allclose(torch.zeros(()) if g is None else g, w, atol=1e-5), name


@pytest.mark.parametrize("kernels", [True, False], ids=["cpu-kernels", "device-path"])
@pytest.mark.parametrize("node", [True, False], ids=["table", "context-only"])
@pytest.mark.parametrize("rows", [9, 0])
def test_attend_and_its_gradients_equal_softmax_attention_over_the_gathered_keys(kernels, node, rows, monkeypatch):
    """`attend`'s weighted sums of both key parts and weight totals, and the gradients of all
    its inputs, against softmax attention written out over the gathered keys (float64): rows
    picked several times from the table, masked keys, a row without a valid key, keys without
    a node part."""
    monkeypatch.setattr(gnndist.runtime.device, "CPU_PATHS", kernels)
    torch.manual_seed(1)
    k, h, cc, ck, scale = 4, 3, 5, 6, 0.7
    u_c = torch.randn(h, rows, cc, dtype=torch.float64, requires_grad=True)
    context = torch.randn(rows, k, cc, dtype=torch.float64, requires_grad=True)
    u_k = torch.randn(h, rows, ck, dtype=torch.float64, requires_grad=True)
    table = torch.randn(6, ck, dtype=torch.float64, requires_grad=True)
    index = torch.randint(0, 6, (rows, k))
    mask = torch.rand(rows, k) < 0.7
    if rows:
        mask[0] = False
    agg_c, agg_k, weight = attend(u_c, context, *((u_k, table, index) if node else (None, None, None)), mask, scale,
                                  torch.nn.Dropout(0.0))
    score = torch.einsum("rjc,hrc->rjh", context, u_c)
    if node:
        score = score + torch.einsum("rjc,hrc->rjh", table[index], u_k)
    attn = torch.softmax((score * scale).masked_fill(~mask.unsqueeze(-1), float("-inf")), dim=1).nan_to_num(0.0)
    want = [torch.einsum("rjh,rjc->hrc", attn, context)] + ([torch.einsum("rjh,rjc->hrc", attn, table[index])]
                                                          if node else []) + [attn.sum(1).t()]
    got = [agg_c] + ([agg_k] if node else []) + [weight]
    assert (agg_k is None) != node
    for a, b in zip(got, want):
        assert a.shape == b.shape and torch.allclose(a, b)
    if rows == 0:
        return
    inputs = [u_c, context] + ([u_k, table] if node else [])
    g = [torch.randn_like(w) for w in want]
    grads = torch.autograd.grad(sum((a * b).sum() for a, b in zip(got, g)), inputs)
    wants = torch.autograd.grad(sum((a * b).sum() for a, b in zip(want, g)), inputs)
    for name, a, b in zip(("u_c", "context", "u_k", "table"), grads, wants):
        assert torch.allclose(a, b), name


@pytest.mark.parametrize("kernels", [True, False], ids=["cpu-kernels", "device-path"])
def test_attend_gives_no_gradient_to_what_moves_all_scores_of_a_row_alike(kernels, monkeypatch):
    """A key column equal for all keys of each row (a time encoding's dimension too slow to tell
    the keys apart; a row's keys all the same neighbour) shifts every score of a row alike,
    which softmax ignores: its part of u gets a zero gradient, exactly on the CPU path (float
    noise there would become Adam steps)."""
    monkeypatch.setattr(gnndist.runtime.device, "CPU_PATHS", kernels)
    torch.manual_seed(2)
    context, table = torch.randn(50, 10, 8), torch.randn(30, 6)
    context[:, :, 3] = 1.0
    index = torch.randint(0, 30, (50, 10))
    index[7] = 4
    u_c, u_k = torch.randn(2, 50, 8, requires_grad=True), torch.randn(2, 50, 6, requires_grad=True)
    mask = torch.rand(50, 10) < 0.8
    agg_c, agg_k, _ = attend(u_c, context, u_k, table, index, mask, 0.3, torch.nn.Dropout(0.0))
    g_c, g_k = torch.autograd.grad((agg_c * torch.randn_like(agg_c)).sum() + (agg_k * torch.randn_like(agg_k)).sum(),
                                   [u_c, u_k])
    assert g_c[:, :, [0, 1, 2, 4]].abs().min() > 0 and g_k[:, :7].abs().min() > 0
    if kernels:
        assert not g_c[:, :, 3].any() and not g_k[:, 7].any()
    else:
        assert g_c[:, :, 3].abs().max() < 1e-5 and g_k[:, 7].abs().max() < 1e-5


@pytest.mark.parametrize("kernels", [True, False], ids=["cpu-kernels", "device-path"])
def test_time_encoder_is_the_cosine_of_the_true_argument(kernels, monkeypatch):
    """cos(w t + b) against numpy's float64 cosine, for deltas up to 1e9 s (where a float32
    argument is off by tens of radians), in the input's shape; for small deltas, where float32
    arguments are exact enough, PyG's own encoder with the same parameters agrees."""
    monkeypatch.setattr(gnndist.runtime.device, "CPU_PATHS", kernels)
    enc = time_encoder(16)
    with torch.no_grad():
        enc.lin.bias.copy_(torch.linspace(-3, 3, 16))  # a phase too, not only the fixed zero
    t = torch.from_numpy(np.random.default_rng(0).exponential(1e6, (30, 7)).astype(np.float32))
    t[0, :3] = torch.tensor([0.0, 1e9, 3.0])
    w, b = enc.lin.weight.double().view(-1).numpy(), enc.lin.bias.double().numpy()
    want = np.cos(t.double().numpy()[..., None] * w + b)
    got = enc(t)
    assert got.shape == (30, 7, 16) and got.dtype == torch.float32
    assert np.abs(got.numpy() - want).max() < 1e-6
    small = torch.rand(50) * 100
    assert torch.allclose(enc(small), enc.lin(small.view(-1, 1)).cos(), atol=1e-5)
    # deltas beyond 2**52 s, whose phase float64 no longer holds: a cosine all the same, as torch's
    huge = torch.tensor([2.0**53, 1e18, 1e30, 3e38])
    assert bool(((enc(huge) >= -1) & (enc(huge) <= 1)).all())


@pytest.mark.parametrize("kernels", [True, False], ids=["cpu-paths", "device-path"])
def test_update_memory_folds_the_mail_of_rows_that_have_one(kernels, monkeypatch):
    """Each row with a mail gets the updater's output for that row alone (and its gradient),
    a row without one keeps its memory and time; on the CPU only the rows with a mail reach
    the updater."""
    monkeypatch.setattr(gnndist.runtime.device, "CPU_PATHS", kernels)
    torch.manual_seed(0)
    updater = CellUpdater(torch.nn.GRUCell, 5, time_encoder(4), 3)
    seen = []
    updater.register_forward_hook(lambda mod, args, out: seen.append(args[0].shape[0]))
    memory, last_update = torch.randn(6, 3), torch.arange(6.0, dtype=torch.float64)
    mail = torch.randn(6, 1, 5)
    mail_time = torch.tensor([[7.0], [-np.inf], [9.0], [-np.inf], [-np.inf], [8.0]], dtype=torch.float64)
    new, new_time, newest = update_memory(updater, memory, last_update, mail, mail_time)
    assert seen == [3 if kernels else 6]
    has = [0, 2, 5]
    for r in range(6):
        want = updater(memory[r:r + 1], last_update[r:r + 1], mail[r:r + 1], mail_time[r:r + 1])[0] if r in has \
            else memory[r]
        assert torch.allclose(new[r], want, atol=1e-6), r
    assert new_time.tolist() == [7.0, 1.0, 9.0, 3.0, 4.0, 8.0] and newest[1] == -np.inf
    got = torch.autograd.grad(new.square().sum(), list(updater.cell.parameters()))
    rows = [updater(memory[r:r + 1], last_update[r:r + 1], mail[r:r + 1], mail_time[r:r + 1]) for r in has]
    want = torch.autograd.grad(sum(x.square().sum() for x in rows), list(updater.cell.parameters()))
    assert all(torch.allclose(g, w, atol=1e-5) for g, w in zip(got, want))


def test_link_predictor_scores_every_candidate_as_the_mlp_of_the_pair():
    torch.manual_seed(0)
    pred = LinkPredictor(4)
    z_src, cand = torch.randn(5, 4), torch.randn(5, 3, 4)
    want = torch.stack([pred.mlp(torch.cat([z_src, cand[:, j]], 1)).squeeze(1) for j in range(3)], 1)
    assert torch.allclose(pred(z_src, cand), want, atol=1e-6)
    assert torch.allclose(pred(z_src, cand[:, 0]), want[:, 0], atol=1e-6)


def test_node_state_read_write_reset_roundtrip():
    s = NodeState(5, 3, 4, mailbox_size=2, start_time=7.0)
    ids = torch.tensor([4, 1])
    s.write(ids, torch.ones(2, 3), torch.tensor([8.0, 9.0], dtype=torch.float64), torch.ones(2, 2, 4),
            torch.tensor([[8.0, 9.0], [9.0, 10.0]], dtype=torch.float64))
    mem, lu, mail, mt = s.read(torch.tensor([1, 0]))
    assert mem[0].tolist() == [1, 1, 1] and mem[1].tolist() == [0, 0, 0]
    assert lu.tolist() == [9.0, 7.0] and mt[1].tolist() == [float("-inf")] * 2
    saved = {k: v.clone() for k, v in s.state_dict().items()}
    s.reset()
    assert s.memory.abs().sum() == 0 and (s.last_update == 7.0).all()
    s.load_state_dict(saved)
    assert torch.equal(s.read(ids)[0], torch.ones(2, 3))


@pytest.mark.parametrize("name", MODELS)
def test_every_model_improves_its_loss_in_one_epoch(name):
    tg = load("synthetic-temporal", num_nodes=100, num_events=2000, edge_dim=4, seed=0)
    # DyRep's RNN, fed by an attention module its loss does not train, needs a gentler step
    tr = trainer(name, tg, batch_size=50, lr=3e-3 if name == "dyrep" else 1e-2)
    negs = EvalNegatives(tg.src, tg.dst, np.arange(tg.num_events), tg.num_nodes, 0, tg.num_events)

    @torch.no_grad()
    def mean_loss():
        tr.model.eval()
        tr.reset_state()
        total = 0.0
        for index, s, e in tr.batches(0, tg.num_events):
            batch = tr.batch(s, e, lambda rows, src, dst: negs.batch(index, e - s, rows, src, dst))
            fw = tr.forward(batch)
            tr.model.write(tr.state, batch, fw)
            total += batch_loss(fw, 1).item()
        return total / tg.num_events

    before = mean_loss()
    tr.reset_state()
    run(name, tg, tr=tr)
    after = mean_loss()
    assert after < before - 0.005, (before, after)


def test_state_rows_are_numpys_distinct_rows_and_inverse():
    """Against np.unique: ids of narrow and wide ranges (collisions in the hash table), repeats,
    negative values, no rows, no neighbours."""
    rng = np.random.default_rng(0)
    for trial in range(300):
        n, k = rng.integers(0, 40), rng.integers(1, 12)
        high = int(10 ** rng.integers(1, 12))
        nodes = rng.integers(-2 if trial % 5 == 0 else 0, high, n)
        hop0 = rng.integers(0, high, (n, k)) if trial % 3 else None
        ids, inv = state_rows(nodes, hop0)
        want_ids, want_inv = np.unique(nodes if hop0 is None else np.concatenate([nodes, hop0.reshape(-1)]),
                                       return_inverse=True)
        assert np.array_equal(ids, want_ids) and np.array_equal(inv, want_inv.reshape(-1))
