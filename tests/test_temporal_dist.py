"""Distributed temporal training on 2 and 3 local gloo ranks against one process (same global
batch, same seed): node state after every batch, parameters after every step, evaluation
figures, resume, and the partitioned state's rows.

One launch per world size runs every case; the single-process references run here, through
the same `temporal_trainer.run` with the plain `LinkTask` and `NodeState`.
"""
import json
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from gnndist.launch import launch
from gnndist import cli
from gnndist import dist as gdist
from gnndist.temporal.dist_state import pack, unpack
from gnndist.graph import TemporalGraph
from gnndist.partition import partition_graph
from gnndist.samplers import sample_temporal_neighbors
from gnndist.temporal.dist_trainer import DistLinkTask, Share, World, owner_of_nodes
from gnndist.launch import Outputs
from gnndist.temporal.config import LinkConfig
from gnndist.temporal.trainer import LinkTask, run

NUM_NEIGHBORS = LinkConfig().num_neighbors

BATCH = 35  # the last training batch has 2 events: some ranks get none
CASES = {2: [("tgn", "replicated", "owner"), ("tgn", "partitioned", "owner"), ("tgn", "partitioned", "slice"),
             ("tgn", "replicated", "slice"), ("apan", "partitioned", "owner")],
         3: [("tgn", "partitioned", "owner"), ("tgn", "replicated", "slice"), ("dyrep", "partitioned", "slice"),
             ("jodie", "replicated", "owner"), ("tgat", "replicated", "owner"), ("apan", "replicated", "slice"),
             ("apan", "partitioned", "slice")]}


def graph():
    """40 nodes, 302 events with tied times and 2 edge features; train events 0..211 (6 batches
    of 35, then 2); nodes 40..44 first appear in test events."""
    rng = np.random.default_rng(3)
    e = 302
    src = rng.integers(0, 40, e)
    src[270::7] = 40 + np.arange(src[270::7].size) % 5
    return TemporalGraph(src, rng.integers(0, 40, e), np.sort(rng.integers(0, e // 3, e)).astype(float),
                         rng.normal(size=(e, 2)).astype(np.float32), num_nodes=45)


def link_args(model, memory="replicated", share="owner", checkpoint=None, resume=False, **kw):
    cfg = LinkConfig(**{**dict(model=model, epochs=1, batch_size=BATCH, lr=1e-3, memory_dim=8, quiet=True,
                                memory=memory, share=share), **kw})
    return cfg, Outputs(checkpoint=checkpoint, resume=resume)


def params_of(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


def rows_of(state):
    return [t.numpy().copy() for t in (state.memory, state.last_update, state.mail, state.mail_time)]


@dataclass
class RefTask(LinkTask):
    """One process; records the node state after every batch and the parameters after every step."""

    trace: list = field(default_factory=list)

    def write(self, batch, fw):
        super().write(batch, fw)
        self.trace.append((rows_of(self.state) if self.state is not None else None, params_of(self.model)))

    def figures(self):
        return {}


class RefWorld:
    """A one-process stand-in for `World` that makes `run` use `RefTask`."""

    rank = 0

    def __init__(self):
        self.task_ = None

    def new_state(self, model, start_time, device):
        return model.new_state(start_time, device)

    def task(self, *a, **kw):
        self.task_ = RefTask(*a, **kw)
        return self.task_

    def summary(self):
        return {}

    def checkpoint_dir(self, d):
        return d


@dataclass
class RecTask(DistLinkTask):
    """A rank's task that also records the whole node state (gathered) after every batch, its
    parameters, and whether a partitioned state held exactly the rows it should."""

    trace: list = field(default_factory=list)
    held_ok: list = field(default_factory=list)
    forwards: list = field(default_factory=list)
    orig_to_new: np.ndarray = None

    def _forward_here(self, batch):
        self.forwards.append(batch)
        return super()._forward_here(batch)

    def forward(self, batch):
        self.forwards = []  # this rank's events; with partitioned memory also the queries it serves
        fw = super().forward(batch)
        st = self.state.state if self.state is not None else None
        if self.memory == "partitioned" and self.model.name == "tgn":
            # rows these forwards need: their nodes and the nodes' recent neighbours (brute force)
            need = []
            for f in self.forwards:
                nodes = torch.cat([f.src, f.dst, f.neg.reshape(-1)]).numpy()
                times = np.concatenate([f.t.numpy()] * 2 + [np.repeat(f.t.numpy(), f.neg.shape[1])])
                s = sample_temporal_neighbors(self.tg, nodes, times, NUM_NEIGHBORS)
                need += [nodes, s.nbr[s.mask]]
            need = np.unique(np.concatenate(need))
            remote = need[self.share.owner[need] != self.share.rank]
            own = [t.shape[0] for t in rows_of(st.local)]
            fetched = set(st.fetched.tolist())  # the model also reads padded neighbour slots as node 0
            self.held_ok.append(set(remote) <= fetched <= set(remote) | {0}
                                and own == [st.hi - st.lo] * 4
                                and not any(isinstance(v, torch.Tensor) and v.is_floating_point()
                                            for v in vars(st).values()))
        return fw

    def write(self, batch, fw):
        super().write(batch, fw)
        st = self.state.state if self.state is not None else None
        if st is None:
            rows = None
        elif self.memory == "replicated":
            rows = rows_of(st)
        else:  # gather every rank's rows (new-id order), then index by original id
            local = st.local
            full = torch.cat(gdist.all_gather_varsize(pack([local.memory, local.last_update, local.mail,
                                                            local.mail_time])))
            rows = [t.numpy()[self.orig_to_new] for t in unpack(full, [(t.dtype, tuple(t.shape[1:])) for t in
                                                                         (local.memory, local.last_update,
                                                                          local.mail, local.mail_time)])]
        self.trace.append((rows, params_of(self.model)))


class RecWorld(World):
    def task(self, *a, **kw):
        self.task_ = RecTask(*a, **kw, share=self.share, memory=self.memory, orig_to_new=self.orig_to_new)
        return self.task_


def worker(tg, offsets, orig_to_new, ckpt_root):
    gdist.setup("cpu")
    r, w = gdist.rank(), gdist.world_size()
    owner = owner_of_nodes(offsets, orig_to_new)
    out = {}
    for model, memory, share in CASES[w]:
        world = RecWorld(memory, Share(share, r, w, owner), offsets, orig_to_new)
        metrics = run(*link_args(model, memory, share), tg, world)
        out[model, memory, share] = (world.task_.trace, world.task_.held_ok, metrics)
    # resume: 1 epoch + 1 resumed epoch against 2 epochs straight, partitioned
    mk = dict(memory="partitioned", share="owner")
    straight = run(*link_args("tgn", **mk, epochs=2), tg, World(mk["memory"], Share("owner", r, w, owner),
                                                                 offsets, orig_to_new))
    world = World(mk["memory"], Share("owner", r, w, owner), offsets, orig_to_new)
    run(*link_args("tgn", **mk, epochs=1, checkpoint=ckpt_root), tg, world)
    resumed = run(*link_args("tgn", **mk, epochs=2, checkpoint=ckpt_root, resume=True), tg, world)
    out["resume"] = (straight, resumed)
    gdist.teardown()
    return out


_refs = {}


def reference(model):
    if model not in _refs:
        world = RefWorld()
        metrics = run(*link_args(model), graph(), world)
        _refs[model] = (world.task_.trace, metrics)
    return _refs[model]


@pytest.fixture(scope="module", params=[2, 3])
def launched(request, tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("GNNDIST_TIMEOUT", "60")
    tg = graph()
    store = partition_graph(tg, request.param, method="temporal")
    try:
        yield request.param, launch(request.param, worker, tg, store.node_offsets, store.orig_to_new,
                                          str(tmp_path_factory.mktemp("ckpt")))
    finally:
        mp.undo()


def close(a, b, tol=1e-4):
    """Equal up to float summation order (Adam divides by small gradient magnitudes, so
    parameters drift ~1e-5 apart over a few steps)."""
    return np.allclose(a, b, rtol=tol, atol=tol)


def test_state_after_every_batch_equals_one_process(launched):
    w, results = launched
    for case in CASES[w]:
        ref_trace, _ = reference(case[0])
        for r, out in enumerate(results):
            trace = out[case][0]
            assert len(trace) == len(ref_trace), (case, r)
            for i, ((rows, _), (ref_rows, _)) in enumerate(zip(trace, ref_trace)):
                if ref_rows is None:
                    assert rows is None
                    continue
                for name, a, b in zip(("memory", "last_update", "mail", "mail_time"), rows, ref_rows):
                    assert a.shape == b.shape and close(a, b), (case, r, i, name, np.abs(a - b).max())


def test_parameters_identical_across_ranks_and_equal_one_process(launched):
    w, results = launched
    for case in CASES[w]:
        ref_trace, _ = reference(case[0])
        traces = [out[case][0] for out in results]
        for i in range(len(ref_trace)):
            for r in range(1, w):
                assert np.array_equal(traces[r][i][1], traces[0][i][1]), (case, r, i)
        assert close(traces[0][-1][1], ref_trace[-1][1]), (case, np.abs(traces[0][-1][1] - ref_trace[-1][1]).max())
        assert not np.array_equal(ref_trace[0][1], ref_trace[-1][1])  # training moved them


def test_evaluation_and_loss_equal_one_process(launched):
    w, results = launched
    for case in CASES[w]:
        _, ref = reference(case[0])
        for out in results:
            m = out[case][2]
            assert m["world_size"] == w and m["memory"] == case[1] and m["share"] == case[2]
            e, re = m["epochs"][0], ref["epochs"][0]
            assert abs(e["loss"] - re["loss"]) < 1e-5, case
            for k in ("val_ap", "val_auc", "val_mrr"):
                assert abs(e[k] - re[k]) < 1e-6, (case, k)
            for k in ("ap", "auc", "mrr", "inductive_ap"):
                assert abs(m["test"][k] - ref["test"][k]) < 1e-6, (case, k)
            assert e["compute_s"] > 0 and e["sync_s"] > 0 and (e["sample_s"] > 0) == (case[0] != "jodie"), case
            assert (e["fetch_s"] > 0) == (case[0] != "tgat") and e["state_bytes"] >= 0, case


def test_partitioned_state_holds_only_own_rows_and_this_batch_fetch(launched):
    w, results = launched
    for case in CASES[w]:
        if case[:2] == ("tgn", "partitioned"):
            for out in results:
                held = out[case][1]
                assert held and all(held), case
                e = out[case][2]["epochs"][0]
                assert e["remote_rows"] > 0 and e["embed_bytes"] > 0 and e["bytes"] > e["state_bytes"] > 0


def test_resume_on_ranks_ends_with_the_same_figures(launched):
    w, results = launched
    for out in results:
        straight, resumed = out["resume"]
        assert [e["epoch"] for e in resumed["epochs"]] == [1, 2]
        assert resumed["test"] == straight["test"]
        assert resumed["epochs"][1]["val_ap"] == straight["epochs"][1]["val_ap"]


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
