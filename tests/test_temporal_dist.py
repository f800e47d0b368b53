"""Distributed temporal training on 2 and 3 local gloo ranks, each holding only its part of the
events, against one process (same global batch, same seed): node state after every training
step, the summed gradient of every step, parameters, evaluation metrics; resume; a rank built
from a copy of the store holding only its own part; edge features fetched behind a cache against
features sent with the samples; and no rank holding an array with one entry per event of the
whole graph.

One launch per world size runs every case; the one-process references run here, through the
same `LinkTrainer` on the whole graph.
"""
import dataclasses
import json
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from gnndist import cli
from gnndist.runtime import dist as gdist
from gnndist.errors import GnndistError
from gnndist.graph import TemporalGraph
from gnndist.outputs import Outputs
from gnndist.runtime.launch import launch
from gnndist.partition import PartitionBook, partition_graph
from gnndist.temporal.config import LinkConfig
from gnndist.temporal.dist_state import PartitionedNodeState
from gnndist.runtime.dist import pack, unpack
from gnndist.temporal.events import BatchEvents, RankEvents, _receivers, even_moves, even_out
from gnndist.temporal.models import MODELS
from gnndist.temporal.fit import fit, rank_events
from gnndist.temporal.trainer import LinkTrainer
from sites import off_device_sites, record_sites

BATCH = 35  # the last training batch has 2 events: some ranks get none
CASES = [(model, memory) for model in MODELS for memory in ("replicated", "partitioned")]
N_COMM, PER_COMM = 3, 15


EVEN_BOOK = PartitionBook([0, 10, 20, 30])  # 3 ranks of 10 nodes


def uneven_batches(rank):
    """Rank `rank`'s events of 6 global batches of random size (none, for some ranks in some
    batches): sources it owns, any destination, 2 negatives and 3 edge features each; event ids
    in order, unique across ranks."""
    rng = np.random.default_rng(7)
    out = []
    eid = 0
    for _ in range(6):
        counts = rng.integers(0, 12, 3)
        counts[rng.integers(0, 3)] = 0
        ids = np.split(eid + rng.permutation(40)[:counts.sum()], np.cumsum(counts)[:-1])
        for r, c in enumerate(counts):
            ev = BatchEvents(rng.integers(10 * r, 10 * r + 10, c), rng.integers(0, 30, c), rng.random(c),
                             rng.integers(0, 30, (c, 2)), np.sort(ids[r]), rng.normal(size=(c, 3)).astype(np.float32))
            if r == rank:
                out.append(ev)
        eid += 40
    return out


def even_out_worker():
    gdist.setup("cpu")
    from gnndist.samplers import sampler_group
    return even_out(uneven_batches(gdist.rank()), EVEN_BOOK, sampler_group())


def test_even_moves_leave_every_rank_an_even_share_moving_only_surpluses():
    """Brute force over random counts of 1-5 ranks: after the moves each rank has total // W (the
    first total % W one more); a rank only sends what it has above that, and only to ranks below."""
    rng = np.random.default_rng(0)
    for _ in range(500):
        w, k = rng.integers(1, 6), rng.integers(1, 5)
        counts = rng.integers(0, 20, (w, k))
        moves = even_moves(counts)
        for j in range(k):
            total, sent, got = counts[:, j].sum(), moves[j].sum(1), moves[j].sum(0)
            share = total // w + (np.arange(w) < total % w)
            assert np.array_equal(counts[:, j] - sent + got, share)
            assert np.array_equal(sent, np.maximum(counts[:, j] - share, 0))
            assert np.array_equal(got, np.maximum(share - counts[:, j], 0))


def test_the_events_sent_are_those_the_rule_picks_batch_by_batch():
    """Brute force, one batch and one receiver at a time (1-5 ranks, random counts and
    destinations): receiver q of a batch gets first the batch's events whose destination it owns,
    in event order, then, receivers in rank order, any not yet sent, from the end of the batch."""
    rng = np.random.default_rng(1)
    for _ in range(300):
        w, k = int(rng.integers(1, 6)), int(rng.integers(1, 6))
        counts = rng.integers(0, 15, (w, k))
        me = int(rng.integers(0, w))
        quota = even_moves(counts)[:, me]
        owner = [rng.integers(0, w, counts[me, j]) for j in range(k)]
        want = []
        for j in range(k):
            to = np.full(counts[me, j], -1)
            for q in np.flatnonzero(quota[j]):
                to[np.flatnonzero(owner[j] == q)[:quota[j, q]]] = q
            for q in np.flatnonzero(quota[j]):
                to[np.flatnonzero(to < 0)[::-1][:quota[j, q] - np.count_nonzero(to == q)]] = q
            want.append(to)
        batch = np.repeat(np.arange(k), counts[me])
        assert np.array_equal(_receivers(batch, np.concatenate(owner), quota), np.concatenate(want))


def test_each_batch_is_evened_out_over_the_ranks_and_no_event_is_lost_or_changed():
    """3 ranks: every batch's events, all ranks together, are exactly those given (every column);
    each rank holds total // 3 of them (the first total % 3 ranks one more), in event order; a
    rank keeps its own events up to its share, and a rank that sends events to another sends
    first those whose destination the receiver owns."""
    got = launch(3, even_out_worker)
    given = [uneven_batches(r) for r in range(3)]
    for j in range(6):
        cols = lambda evs: [np.concatenate([getattr(e, f) for e in evs]) for f in BatchEvents._fields]
        want, have = cols([given[r][j] for r in range(3)]), cols([got[r][j] for r in range(3)])
        o, p = np.argsort(want[4]), np.argsort(have[4])
        assert all(np.array_equal(a[o], b[p]) for a, b in zip(want, have)), j
        total = want[0].size
        for r in range(3):
            mine, before = got[r][j], given[r][j]
            assert mine.src.size == total // 3 + (r < total % 3), (j, r)
            assert np.all(np.diff(mine.eid) > 0)
            kept = np.isin(before.eid, mine.eid)
            assert kept.sum() == min(before.src.size, mine.src.size), (j, r)
            for q in range(3):  # what r sent to q: those with q's destinations first
                sent = np.isin(got[q][j].eid, before.eid) if q != r else np.zeros(0, bool)
                owned = (got[q][j].dst[sent] >= 10 * q) & (got[q][j].dst[sent] < 10 * q + 10)
                could = ((before.dst >= 10 * q) & (before.dst < 10 * q + 10)).sum()
                assert owned.sum() == min(sent.sum(), could), (j, r, q)


def graph():
    """45 nodes in 3 communities (events mostly inside one), 302 events with tied times and 3
    edge features; train events 0..211 (6 batches of 35, then 2); nodes 40..44 first appear in
    test events."""
    rng = np.random.default_rng(3)
    e = 302
    comm = rng.integers(0, N_COMM, e)
    src = comm * PER_COMM + rng.integers(0, PER_COMM - 2, e)
    dst = np.where(rng.random(e) < 0.9, comm * PER_COMM + rng.integers(0, PER_COMM - 2, e), rng.integers(0, 39, e))
    src[270::7] = 40 + np.arange(src[270::7].size) % 5
    return TemporalGraph(src, dst, np.sort(rng.integers(0, e // 3, e)).astype(float),
                         rng.normal(size=(e, 3)).astype(np.float32), num_nodes=45)


def config(model, memory="replicated", **kw):
    return LinkConfig(**{**dict(model=model, epochs=1, batch_size=BATCH, lr=1e-3, memory_dim=8, time_dim=8,
                                memory=memory, quiet=True), **kw})


SELECTION = dict(model="tgn", memory="partitioned", epochs=4, patience=2)  # stops after 3, selects 1


def full_state(tr):
    """The whole node state in original node ids (gathered from the owners when partitioned)."""
    if tr.state is None:
        return None
    st = tr.state.state
    local = getattr(st, "local", st)
    tensors = [local.memory, local.last_update, local.mail, local.mail_time]
    if local is not st:  # partitioned: every rank's rows, in new-id order
        layout = [(t.dtype, tuple(t.shape[1:])) for t in tensors]
        tensors = unpack(torch.cat(gdist.all_gather_varsize(pack(tensors))), layout)
    return [t.numpy()[tr.events.orig_to_new] for t in tensors]


class RecTrainer(LinkTrainer):
    """Records, after every training step, the global loss, the summed gradient, the parameters
    and the whole node state; which epochs it trained; and the RNG at the start of each."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.trace, self.epochs_run, self.rng, self.scores, self.planned_on = [], [], [], {}, set()
        self.reads = []  # partitioned: (training, collectives entered) of each read of the node state
        st = getattr(self.state, "state", None)
        if isinstance(st, PartitionedNodeState):
            read = st.read

            def counted(*args, **kwargs):
                k0 = gdist.collectives_entered()
                rows = read(*args, **kwargs)
                self.reads.append((self.model.training, gdist.collectives_entered() - k0))
                return rows
            st.read = counted
        plan = self.planner._plan

        def planned(events, window):
            if window:
                self.planned_on.add((threading.get_ident() == threading.main_thread().ident, os.sched_getscheduler(0)))
            return plan(events, window)
        self.planner._plan = planned

    def step(self, batch, global_batch, ahead=None):
        loss, runs = super().step(batch, global_batch, ahead)
        grad = torch.cat([torch.zeros(p.numel()) if p.grad is None else p.grad.reshape(-1) for p in self.params])
        params = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.trace.append((loss, grad.numpy().copy(), params.numpy().copy(), full_state(self)))
        return loss, runs

    def evaluate(self, start, stop, desc, score=True):
        out = super().evaluate(start, stop, desc, score)
        self.scores[desc] = out
        return out

    def train_epoch(self, epoch):
        self.epochs_run.append(epoch)
        self.rng.append(torch.get_rng_state().clone())
        return super().train_epoch(epoch)


def arrays_held(obj, seen=None, depth=0):
    """Every numpy array and tensor reachable from `obj` (attributes, containers)."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 8:
        return []
    seen.add(id(obj))
    if isinstance(obj, (np.ndarray, torch.Tensor)):
        return [obj]
    if isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple, set)):
        items = list(obj)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        items = list(vars(obj).values())
    else:
        return []
    return [a for x in items for a in arrays_held(x, seen, depth + 1)]


def worker(store, own_copies, tg, ckpt_root):
    gdist.setup("cpu")
    out = {"sites": record_sites()}
    events = rank_events(store)
    out["owns"] = (events.lo, events.hi)
    for model, memory in CASES:
        tr = RecTrainer(events, config(model, memory))
        metrics = fit(tr)
        recorded = {id(v) for v in (tr.trace, tr.rng, tr.scores)}
        held = {"lengths": max(len(a) for k, v in vars(tr).items() if id(v) not in recorded
                               for a in arrays_held(v) if a.ndim), "events_held": events.num_held,
                "tcsr": int(events.tcsr()[1].size)}
        if (model, memory) == ("tgn", "partitioned"):
            st = tr.state.state  # only its own rows: no float tensor besides them
            held["own_rows"] = [t.shape[0] for t in (st.local.memory, st.local.mail)] == [st.hi - st.lo] * 2
            held["no_foreign"] = not any(isinstance(v, torch.Tensor) and v.is_floating_point() for v in vars(st).values())
        out[model, memory] = (tr.trace, metrics, held, tr.scores)
        out["planned_on", model, memory], out["reads", model, memory] = tr.planned_on, tr.reads
    out["interrupted"] = interrupted(LinkTrainer(events, config("tgn", "partitioned")))
    # a rank built from a copy of the store that holds only its own part
    out["own_copy"] = fit(LinkTrainer(rank_events(own_copies[gdist.rank()]), config("tgn", "partitioned")))
    out["selection"] = fit(LinkTrainer(events, config(**SELECTION)))
    owner = RecTrainer(events, config("tgn", "partitioned", share="owner"))
    out["owner"] = (owner.trace, fit(owner), None, owner.scores)
    # features fetched behind an edge cache, against features sent with the samples (no cache)
    out["cached"] = fit(LinkTrainer(events, config("tgn", "partitioned", cache="presample", cache_size=0.5)))
    # resume: 1 epoch, then resumed to 2, against 2 epochs straight
    cfg = config("tgn", "partitioned", epochs=2)
    straight = RecTrainer(events, cfg)
    m_straight = fit(straight)
    fit(RecTrainer(events, config("tgn", "partitioned", epochs=1)), Outputs(checkpoint=ckpt_root))
    resumed = RecTrainer(events, cfg)
    m_resumed = fit(resumed, Outputs(checkpoint=ckpt_root, resume=True))
    out["resume"] = (m_straight, m_resumed, straight.epochs_run, resumed.epochs_run, straight.rng[1], resumed.rng[0])
    other = dataclasses.replace(events, orig_to_new=events.orig_to_new[::-1].copy())  # nodes owned by other ranks
    try:
        fit(RecTrainer(other, cfg), Outputs(checkpoint=ckpt_root, resume=True))
        out["other_partition"] = None
    except GnndistError as e:
        out["other_partition"] = str(e)
    gdist.teardown()
    return out


class Interrupt(Exception):
    pass


def interrupted(tr):
    """The validation scores of `tr` after an epoch that every rank left after 3 of its 7 steps
    (each rank's owners had sent the rows of the fourth step's read, which never came)."""
    losses = []

    def stop(loss):
        losses.append(loss)
        if len(losses) == 3:
            raise Interrupt
    tr.on_loss = stop
    with pytest.raises(Interrupt):
        tr.train_epoch(1)
    tr.on_loss = None
    return tr.evaluate(tr.train_end, tr.val_end, "val")


_refs = {}


def reference_trainer(model, memory="replicated", cls=LinkTrainer):
    """A one-process trainer of the whole graph that runs each batch in one pass, as each rank
    runs its own share."""
    tr = cls(RankEvents.from_graph(graph()), config(model, memory))
    tr.halves = 1
    return tr


def reference(model, memory):
    if model not in _refs:
        tr = reference_trainer(model, memory, RecTrainer)
        _refs[model] = (tr.trace, fit(tr), tr.scores)
    return _refs[model][:2]


def own_part_copy(store: Path, part: int, root: Path) -> str:
    """A store folder holding only meta.json, the id maps and part `part` (as on a host of its own)."""
    out = root / f"host{part}"
    out.mkdir()
    shutil.copy(store / "meta.json", out / "meta.json")
    shutil.copy(store / "orig_to_new.npy", out / "orig_to_new.npy")
    shutil.copytree(store / f"part{part}", out / f"part{part}")
    return str(out)


@pytest.fixture(scope="module", params=[2, 3])
def launched(request, tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("GNNDIST_TIMEOUT", "60")
    w, tg = request.param, graph()
    root = tmp_path_factory.mktemp(f"w{w}")
    partition_graph(tg, w, method="temporal", out=root / "store")
    copies = [own_part_copy(root / "store", p, root) for p in range(w)]
    try:
        yield w, tg, launch(w, worker, str(root / "store"), copies, tg, str(root / "ckpt"))
    finally:
        mp.undo()


def close(a, b, tol=1e-5):
    """Equal up to float summation order."""
    return np.allclose(a, b, rtol=tol, atol=tol)


def test_state_after_every_step_equals_one_process(launched):
    w, _, results = launched
    for case in CASES:
        ref_trace, _ = reference(*case)
        for r, out in enumerate(results):
            trace = out[case][0]
            assert len(trace) == len(ref_trace), (case, r)
            for i, (got, ref) in enumerate(zip(trace, ref_trace)):
                if ref[3] is None:
                    assert got[3] is None
                    continue
                for name, a, b in zip(("memory", "last_update", "mail", "mail_time"), got[3], ref[3]):
                    assert a.shape == b.shape and close(a, b), (case, r, i, name, np.abs(a - b).max())


def test_summed_gradient_and_loss_of_every_step_equal_one_process(launched):
    """Gradients, not only parameters: Adam would hide a gradient scale error."""
    w, _, results = launched
    for case in CASES:
        ref_trace, _ = reference(*case)
        for r, out in enumerate(results):
            for i, (got, ref) in enumerate(zip(out[case][0], ref_trace)):
                assert abs(got[0] - ref[0]) < 1e-5, (case, r, i)
                assert np.abs(ref[1]).max() > 0
                assert np.allclose(got[1], ref[1], rtol=1e-4, atol=1e-6), (case, r, i, np.abs(got[1] - ref[1]).max())


def test_owner_share_scores_the_events_of_owned_sources_and_equals_one_process(launched):
    """`share="owner"`: no event travels, each rank scores those whose source it owns; the steps
    equal one process's as with the default (evened out) share, which moves some events."""
    w, _, results = launched
    ref_trace, ref = reference("tgn", "partitioned")
    for r, out in enumerate(results):
        trace, metrics, _, scores = out["owner"]
        for got, want in zip(trace, ref_trace):
            assert abs(got[0] - want[0]) < 1e-5 and np.allclose(got[1], want[1], rtol=1e-4, atol=1e-6)
            assert close(got[2], want[2], 1e-4)
        assert abs(metrics["test"]["ap"] - ref["test"]["ap"]) < 1e-6
    def foreign(out, scores):  # the events scored on a rank whose source it does not own
        lo, hi = out["owns"]
        return [int(((s.src < lo) | (s.src >= hi)).sum()) for s in scores.values()]
    assert all(n == 0 for out in results for n in foreign(out, out["owner"][3]))
    assert any(n > 0 for out in results for n in foreign(out, out["tgn", "partitioned"][3]))


def test_parameters_identical_across_ranks_and_equal_one_process(launched):
    w, _, results = launched
    for case in CASES:
        ref_trace, _ = reference(*case)
        traces = [out[case][0] for out in results]
        for i in range(len(ref_trace)):
            for r in range(1, w):
                assert np.array_equal(traces[r][i][2], traces[0][i][2]), (case, r, i)
            assert close(traces[0][i][2], ref_trace[i][2], 1e-4), (case, i)


def test_evaluation_scores_and_figures_equal_one_process(launched):
    """Every event's scores equal one process's up to float noise, and so do the metrics; where
    the reference has exactly tied scores, which float noise of another batch layout can break,
    AP, AUC and MRR may move by at most the tied share of the positives."""
    w, _, results = launched
    for case in CASES:
        _, ref = reference(*case)
        ref_scores = _refs[case[0]][2]
        for phase, prefix in (("val", "val_"), ("test", "")):
            pos, neg, eid = ref_scores[phase][:3]
            got_pos, got_neg = np.zeros_like(pos), np.zeros_like(neg)
            at = {e: i for i, e in enumerate(eid.tolist())}
            seen = 0
            for out in results:
                p, n, e = out[case][3][phase][:3]
                rows = [at[x] for x in e.tolist()]
                got_pos[rows], got_neg[rows] = p, n
                seen += e.size
            assert seen == eid.size, (case, phase)
            assert np.allclose(got_pos, pos, atol=1e-5) and np.allclose(got_neg, neg, atol=1e-5), (case, phase)
            values = np.concatenate([pos, neg.reshape(-1)])
            tied = values.size - np.unique(values).size
            for out in results:
                m = out[case][1]
                metrics = m["epochs"][0] if phase == "val" else m["test"]
                reference_metrics = ref["epochs"][0] if phase == "val" else ref["test"]
                for k in ("ap", "auc", "mrr"):
                    delta = abs(metrics[prefix + k] - reference_metrics[prefix + k])
                    assert delta < 1e-6 + 2 * tied / pos.size, (case, phase, k, delta, tied)
    for out in results:  # most cases have no ties: then the metrics agree to 1e-6
        m, ref = out["tgn", "partitioned"][1], reference("tgn", "partitioned")[1]
        assert all(abs(m["test"][k] - ref["test"][k]) < 1e-6 for k in ("ap", "auc", "mrr", "inductive_ap"))


def test_loss_time_split_and_inductive_counts(launched):
    w, tg, results = launched
    n = tg.num_events  # brute force: test events with an endpoint that has no event before the validation period
    train_end = n - 2 * round(0.15 * n)
    seen = np.zeros(tg.num_nodes, bool)
    seen[tg.src[:train_end]] = seen[tg.dst[:train_end]] = True
    test = slice(n - round(0.15 * n), n)
    brute = int((~seen[tg.src[test]] | ~seen[tg.dst[test]]).sum())
    for case in CASES:
        _, ref = reference(*case)
        assert ref["test"]["inductive_events"] == brute > 0
        for out in results:
            m = out[case][1]
            assert m["world_size"] == w and m["memory"] == case[1]
            e, re = m["epochs"][0], ref["epochs"][0]
            assert abs(e["loss"] - re["loss"]) < 1e-5, case
            assert m["test"]["inductive_events"] == ref["test"]["inductive_events"] > 0
            assert e["compute_s"] > 0 and e["sync_s"] > 0 and (e["sample_s"] > 0) == (case[0] != "jodie"), case


def test_no_rank_holds_an_array_per_event_of_the_whole_graph(launched):
    """Every array a rank's trainer holds is bounded by its part (held events, T-CSR entries of
    its nodes) or the node count; with 3 ranks on 3 communities each part is well under the
    whole graph, so an array with one entry per event of the whole graph would show."""
    w, tg, results = launched
    for case in CASES:
        for r, out in enumerate(results):
            held, m = out[case][2], out[case][1]
            assert held["lengths"] <= max(held["events_held"], held["tcsr"], tg.num_nodes), (case, r, held)
            if w == 3:
                assert held["lengths"] < tg.num_events, (case, r, held)
            fig = m["ranks"][r]
            assert fig["events_held"] == held["events_held"] and fig["tcsr_entries"] == held["tcsr"]
            assert fig["edge_feature_rows"] == held["events_held"] and fig["peak_rss_bytes"] > 0
            assert fig["peak_gpu_bytes"] is None  # on the CPU
    for out in results:
        held = out["tgn", "partitioned"][2]
        assert held["own_rows"] and held["no_foreign"]


def test_a_rank_with_only_its_own_part_trains_to_the_same_metrics(launched):
    w, _, results = launched
    for out in results:
        assert out["own_copy"]["test"] == out["tgn", "partitioned"][1]["test"]


def test_features_fetched_behind_a_cache_train_as_features_sent_with_the_samples(launched):
    """Two independent ways to the sampled events' features: fetched afterwards from their
    holders through `DistFeatures` (with a cache), or sent by the sampling rank with the sample."""
    w, _, results = launched
    for out in results:
        cached, sent = out["cached"], out["tgn", "partitioned"][1]
        assert cached["epochs"][0]["edge_cache_hit_rate"] > 0
        assert abs(cached["epochs"][0]["loss"] - sent["epochs"][0]["loss"]) < 1e-6
        assert all(abs(cached["test"][k] - sent["test"][k]) < 1e-6 for k in ("ap", "auc", "mrr"))


def test_model_selection_under_w_ranks_equals_one_process(launched):
    """Early stopping picks the same epoch, stops for the same reason and reports the same
    test metrics (from the replayed best model) under W ranks as in one process."""
    ref = fit(LinkTrainer(RankEvents.from_graph(graph()), config(**SELECTION)))
    assert ref["selected_epoch"] < len(ref["epochs"])  # the best model is not the last one: replayed
    w, _, results = launched
    for out in results:
        m = out["selection"]
        assert (m["selected_epoch"], m["stop_reason"]) == (ref["selected_epoch"], ref["stop_reason"])
        assert [e["val_ap"] for e in m["epochs"]] == pytest.approx([e["val_ap"] for e in ref["epochs"]], abs=1e-6)
        for k in ("ap", "auc", "mrr"):
            assert abs(m["test"][k] - ref["test"][k]) < 1e-6


def test_partitioned_state_fetches_only_what_the_batch_needs(launched):
    w, tg, results = launched
    for out in results:
        e = out["tgn", "partitioned"][1]["epochs"][0]
        assert e["remote_rows"] > 0 and e["state_bytes"] > 0 and e["sample_bytes"] > 0
        assert e["bytes"] >= e["state_bytes"] + e["sample_bytes"]
    # every rank enters the same collectives; one process none
    assert len({out["tgn", "partitioned"][1]["epochs"][0]["collectives_per_step"] for out in results}) == 1
    assert e["collectives_per_step"] > 0 and reference("tgn", "partitioned")[1]["epochs"][0]["collectives_per_step"] == 0


def test_what_depends_on_the_events_only_is_exchanged_ahead_of_the_steps(launched):
    """Before the epoch's 7 steps, in one window: the events each rank scores, evened out (the
    counts, the events moved), their neighbours (the queries' counts, the queries, the samples)
    and the counts of the state rows each rank writes in each step (one collective); partitioned, also which state rows each step reads from each owner (counts and
    ids). A replicated TGN step then enters 2
    collectives (the gradient sum, the written rows), a partitioned one 3 (the rows read, the
    gradient sum, the written rows): a training step embeds its negatives itself. Two gloo
    ranks sum by a swap, which the written rows' exchange carries: one collective fewer."""
    w, _, results = launched
    carried = 1 if w == 2 else 0
    for out in results:
        assert out["tgn", "replicated"][1]["epochs"][0]["collectives_per_step"] == pytest.approx(
            ((2 - carried) * 7 + 6) / 7)
        assert out["own_copy"]["epochs"][0]["collectives_per_step"] == pytest.approx(
            ((3 - carried) * 7 + 8) / 7)  # no recorder


def test_a_planned_read_is_answered_after_the_write_before_it(launched):
    """Partitioned, the owners send the rows a step reads as soon as the step before has written
    (`PartitionedNodeState._send_next_reply`): they travel while that step ends and the next
    begins, and only the first read of a window (one window per epoch here) waits for a
    collective of its own."""
    for out in launched[2]:
        for model, memory in CASES:
            if memory == "partitioned" and model != "tgat":
                assert [k for training, k in out["reads", model, memory] if training] == [1] + [0] * 6, model


def test_rows_sent_ahead_of_a_read_that_never_came_are_not_read_later(launched):
    """An epoch left mid-window leaves the reply to the next read under way; the evaluation after
    it reads the state as one process does."""
    ref = interrupted(reference_trainer("tgn"))
    for out in launched[2]:
        got = out["interrupted"]
        at = {e: i for i, e in enumerate(ref.eid.tolist())}
        rows = [at[e] for e in got.eid.tolist()]
        assert np.allclose(got.pos, ref.pos[rows], atol=1e-5) and np.allclose(got.neg, ref.neg[rows], atol=1e-5)


def test_windows_are_planned_by_a_thread_at_the_lowest_priority(launched):
    """Every window's plan (training and evaluation) is made off the main thread, under
    SCHED_IDLE: it runs while the steps wait for the other ranks (the metrics above equal one
    process's all the same)."""
    _, _, results = launched
    for out in results:
        for case in CASES:
            assert out["planned_on", case[0], case[1]] == {(False, os.SCHED_IDLE)}, case


def test_resume_runs_only_the_remaining_epochs_from_the_saved_state(launched):
    w, _, results = launched
    for out in results:
        straight, resumed, ran_straight, ran_resumed, rng_straight, rng_resumed = out["resume"]
        assert ran_straight == [1, 2] and ran_resumed == [2]
        assert torch.equal(rng_straight, rng_resumed)
        assert [e["epoch"] for e in resumed["epochs"]] == [1, 2]
        assert resumed["test"] == straight["test"]
        assert resumed["epochs"][1]["val_ap"] == straight["epochs"][1]["val_ap"]
        assert out["other_partition"].endswith("/ckpt was written on another partition of the data (its ranks own "
                                               "other nodes): resume on the partition store it was trained on")


def test_cli_nproc_from_a_partition_store_equals_one_process(tmp_path, monkeypatch, capsys):
    """`gnndist train STORE --nproc 2 --memory partitioned` end to end, against one process
    on the same events."""
    monkeypatch.setenv("GNNDIST_TIMEOUT", "60")
    tg = graph()
    np.savetxt(tmp_path / "g.txt", np.stack([tg.src, tg.dst, tg.t], 1), fmt="%d")
    common = ["--task", "link", "--epochs", "1", "--batch-size", "50", "--memory-dim", "8", "--quiet"]
    assert cli.main(["partition", str(tmp_path / "g.txt"), "--parts", "2", "--method", "temporal",
                     "--out", str(tmp_path / "store"), "--quiet"]) == 0
    assert cli.main(["train", str(tmp_path / "store"), *common, "--nproc", "2", "--memory", "partitioned",
                     "--metrics-out", str(tmp_path / "w2.json")]) == 0
    assert cli.main(["train", str(tmp_path / "g.txt"), *common, "--metrics-out", str(tmp_path / "w1.json")]) == 0
    m2, m1 = (json.loads((tmp_path / f).read_text()) for f in ("w2.json", "w1.json"))
    assert m2["world_size"] == 2 and m2["memory"] == "partitioned" and m1["world_size"] == 1
    for k in ("ap", "auc", "mrr"):
        assert abs(m2["test"][k] - m1["test"][k]) < 1e-6
    capsys.readouterr()
    assert cli.main(["train", str(tmp_path / "store"), *common, "--nproc", "3"]) == 2
    assert "has 2 parts but 3 rank(s) run" in capsys.readouterr().err


def test_host_side_exchanges_go_on_the_gloo_group(launched):
    """What stays on the default group (NCCL under --device cuda) is only device tensors: every
    collective there comes from a place that exchanges them (tests/sites.py)."""
    for out in launched[2]:
        assert not off_device_sites(out["sites"])
        assert any(site.startswith("samplers/") and not default for site, default in out["sites"])
