"""Long runs survive their faults: checkpoints within an epoch, restarts by the launcher, resumes
on another number of ranks, and saves cut off mid-write.

References: the same run uninterrupted (the same operations in the same order: equal to 1e-6),
and the same checkpoint resumed on the ranks that wrote it (equal to 1e-5 on other ranks, the
W-rank equivalence carried through a resume).
"""
import io
import json
import os
import shutil
import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from gnndist import checkpoint
from gnndist.checkpoint import Position
from gnndist.datasets import load
from gnndist.errors import GnndistError
from gnndist.outputs import Outputs, checkpoint_name, write_metrics
from gnndist.partition import partition_graph
from gnndist.runtime import dist as gdist
from gnndist.runtime.launch import launch
from gnndist.static.config import NodeConfig
from gnndist.static.trainer import NodeTrainer, rank_graph
from gnndist.temporal.config import LinkConfig
from gnndist.temporal.events import RankEvents
from gnndist.temporal.fit import fit, rank_events
from gnndist.temporal.half_process import Placement
from gnndist.temporal.trainer import LinkTrainer

TEMPORAL = dict(num_nodes=80, num_events=1200)  # 840 training events: 17 steps of 50 per epoch
STATIC = dict(num_nodes=400, num_edges=2000)  # 113 training nodes: 8 steps of 16 per epoch
EVERY = 5  # steps between checkpoints: epoch 2 holds one at its step 3 (link) and 2 (node)


def link_config(memory="partitioned", **kw):
    return LinkConfig(**{**dict(memory_dim=16, time_dim=16, batch_size=50, epochs=2, quiet=True, memory=memory,
                                cache="adaptive"), **kw})


NODE = NodeConfig.for_model("sage", hidden=16, batch_size=16, epochs=2, quiet=True)
NODE_EXACT = replace(NODE, dropout=0.0)  # without dropout, whose masks each rank draws: equal on any ranks


def close(got, want, tol):
    """The test figures and every epoch's loss of two runs' metrics, equal to `tol`."""
    assert got["test"] == pytest.approx(want["test"], abs=tol, nan_ok=True)
    assert [e["loss"] for e in got["epochs"]] == pytest.approx([e["loss"] for e in want["epochs"]], abs=tol)


def stop_at(method, count, action):
    """`method` (a bound method), doing `action()` before its `count`-th call."""
    calls = []

    def wrapped(*a, **kw):
        calls.append(1)
        if len(calls) == count:
            action()
        return method(*a, **kw)
    return wrapped


def kill_me():
    os.kill(os.getpid(), signal.SIGKILL)


def kill_once_held(folders, at: Position):
    """kill_me, once every folder holds the complete checkpoint at `at` (written in the background,
    it can complete some steps after the step it was taken at)."""
    def action():
        while not all(at in checkpoint.positions(f) for f in folders):
            time.sleep(0.01)
        kill_me()
    return action


class Stop(Exception):
    pass


def stop():
    raise Stop


# ------------------------------------------------------------------------------------------ one job, restarted

def cut_at(at: Position):
    """torch.save, writing half the file of the checkpoint at `at` and then killing its process;
    slowly (2 s first): time for the other rank to write its next checkpoint, were it not held
    until this one is complete."""
    real = torch.save

    def save(obj, f, *a, **kw):
        if isinstance(obj, dict) and Position(obj.get("epoch", -1), obj.get("step")) == at:
            time.sleep(2)
            buf = io.BytesIO()
            real(obj, buf)
            f.write(buf.getvalue()[:len(buf.getvalue()) // 2])
            f.flush()
            kill_me()
        return real(obj, f, *a, **kw)
    return save


def restarted_worker(tstore, sstore, root):
    """Each phase once over the job's starts (a phase done leaves its metrics), on 2 ranks:
    - link-ref, node-ref: the link (partitioned memory) and node runs, uninterrupted;
    - link: with checkpoints, one kept (`--keep-checkpoints 1`), rank 1 killed while its
      checkpoint of step 8 of epoch 2 is half written (first start); restarted, rank 0 first
      copies the checkpoint folder as it is;
    - replicated: the link run with replicated memory, stopped before step 6 of epoch 2, its
      checkpoint folder copied, then resumed from it;
    - node: with checkpoints, rank 1 killed before step 6 of epoch 2, once both ranks hold their
      checkpoint of its step 2 (second start);
    - static: the node run without dropout, stopped before step 6 of epoch 2, its checkpoint
      folder copied, then resumed from it."""
    gdist.setup("cpu")
    root = Path(root)
    for phase in ("link-ref", "link", "replicated", "node-ref", "node", "static"):
        out, ck = root / f"{phase}.json", root / phase
        if out.exists():
            continue
        outputs = Outputs() if phase.endswith("-ref") else Outputs(checkpoint=str(ck), checkpoint_every=EVERY,
                                                                   keep_checkpoints=1 if phase == "link" else 2)
        killed = gdist.rank() == 1 and gdist.restart_count() == {"link": 0, "node": 1}.get(phase)
        if phase == "link" and gdist.restart_count() > 0 and gdist.rank() == 0:
            shutil.copytree(ck, root / "link-copy")
        if phase == "static":
            tr = NodeTrainer(rank_graph(sstore, NODE_EXACT, torch.device("cpu")), NODE_EXACT)
            tr.opt.step = stop_at(tr.opt.step, 8 + 6, stop)
            with pytest.raises(Stop):
                tr.fit(outputs=outputs)
            copy_checkpoint(ck, root / "static-copy")
            tr = NodeTrainer(rank_graph(sstore, NODE_EXACT, torch.device("cpu")), NODE_EXACT)
            m = tr.fit(outputs=replace(outputs, resume=True))
        elif phase.startswith("node"):
            tr = NodeTrainer(rank_graph(sstore, NODE, torch.device("cpu")), NODE)
            if killed:
                tr.opt.step = stop_at(tr.opt.step, 8 + 6, kill_once_held([ck / "rank0", ck / "rank1"], Position(2, 2)))
            m = tr.fit(outputs=outputs)
        elif phase == "replicated":
            tr = LinkTrainer(rank_events(tstore), link_config("replicated"))
            tr.step = stop_at(tr.step, 17 + 6, stop)
            with pytest.raises(Stop):
                fit(tr, outputs)
            copy_checkpoint(ck, root / "replicated-copy")
            m = fit(LinkTrainer(rank_events(tstore), link_config("replicated")), replace(outputs, resume=True))
        else:
            if killed:
                torch.save = cut_at(Position(2, 8))
            m = fit(LinkTrainer(rank_events(tstore), link_config()), outputs)
        if gdist.rank() == 0:
            write_metrics(out, m)
    gdist.teardown()


def copy_checkpoint(ck, to):
    """Rank 0 copies the checkpoint folder `ck` to `to` once every rank's last write has ended."""
    gdist.agree_max(0)
    if gdist.rank() == 0:
        shutil.copytree(ck, to)
    gdist.agree_max(0)


@pytest.fixture(scope="module")
def graphs():
    return load("synthetic-temporal", **TEMPORAL), load("synthetic-static", **STATIC)


@pytest.fixture(scope="module")
def stores(graphs, tmp_path_factory):
    root = tmp_path_factory.mktemp("stores")
    tg, g = graphs
    out = {w: root / f"temporal{w}" for w in (2, 3)}
    for w, path in out.items():
        partition_graph(tg, w, method="temporal", out=path)
    for w in (2, 3):
        partition_graph(g, w, method="metis", balance=["nodes", "train"], out=root / f"static{w}")
    out["static"], out["static3"] = root / "static2", root / "static3"
    return out


@pytest.fixture(scope="module")
def restarted(stores, tmp_path_factory):
    root = tmp_path_factory.mktemp("restarts")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GNNDIST_TIMEOUT", "60")
        launch(2, restarted_worker, str(stores[2]), str(stores["static"]), str(root), max_restarts=2)
    return root, {p.stem: json.loads(p.read_text()) for p in root.glob("*.json")}


def test_a_rank_killed_within_an_epoch_is_restarted_and_the_link_run_ends_as_uninterrupted(restarted):
    """Rank 1 of 2 killed (SIGKILL) while it writes its checkpoint of step 8 of epoch 2 (partitioned
    memory, an adaptive edge cache, one checkpoint kept): the launcher starts both again, they
    resume by themselves from the checkpoint both completed (step 3 of epoch 2: of the run's 20th
    step), which rank 0 kept beside its newest, and end with the uninterrupted run's figures; the
    metrics name the restart. The cut-off file is left beside rank 1's complete checkpoints (and
    deleted by its next save)."""
    root, m = restarted
    close(m["link"], m["link-ref"], 1e-6)
    assert m["link-ref"]["restarts"] == []
    (r,) = m["link"]["restarts"]
    assert (r["restart"], r["rank_lost"], r["epoch"], r["step"]) == (1, 1, 2, 3)
    assert r["steps_lost"] >= 8 - 3  # rank 0 ran on while rank 1 wrote
    assert checkpoint.positions(root / "link-copy" / "rank0") == [Position(2, 3), Position(2, 8)]
    held = sorted(f.name for f in (root / "link-copy" / "rank1").iterdir())
    assert [f for f in held if f.startswith("epoch")] == [checkpoint_name(1), Position(2, 3).name]
    assert [f.split(".tmp-")[0] for f in held if ".tmp-" in f] == [f".{Position(2, 8).name}"]
    assert not any(".tmp-" in f.name for f in (root / "link" / "rank1").iterdir())


def test_a_rank_killed_within_an_epoch_is_restarted_and_the_node_run_ends_as_uninterrupted(restarted):
    """Rank 1 of 2 killed before the optimizer step of step 6 of epoch 2 (the job's second
    restart): resumed from step 2 of epoch 2 (the run's step 10), it ends as uninterrupted."""
    _, m = restarted
    close(m["node"], m["node-ref"], 1e-6)
    (r,) = m["node"]["restarts"]
    assert (r["restart"], r["rank_lost"], r["epoch"], r["step"]) == (2, 1, 2, 2)
    assert r["steps_lost"] == 6 - 2  # rank 1 died after step 6's gradient sum: rank 0 ended it


# ------------------------------------------------------------------------------------------ other ranks

COPIES = {"partitioned": "link-copy", "replicated": "replicated-copy", "static": "static-copy"}


def resume_each(tstore, sstore, root):
    """This world's resume of each copied 2-rank checkpoint (link runs with partitioned and with
    replicated memory, a node run), from a copy of its own; a store path or the whole graph."""
    out = {}
    for run, ck in COPIES.items():
        copy = Path(root) / f"{ck}-on{gdist.world_size()}"
        copy_checkpoint(Path(root) / ck, copy)
        outputs = Outputs(checkpoint=str(copy), resume=True)
        if run == "static":
            out[run] = NodeTrainer(rank_graph(sstore, NODE_EXACT, torch.device("cpu")), NODE_EXACT).fit(outputs=outputs)
        else:
            out[run] = fit(LinkTrainer(rank_events(tstore), link_config(run)), outputs)
    return out


def resume_worker(tstore, sstore, root):
    gdist.setup("cpu")
    out = resume_each(tstore, sstore, root)
    gdist.teardown()
    return out


@pytest.fixture(scope="module")
def recut(graphs, stores, restarted):
    root, m = restarted
    on = {2: {"partitioned": m["link"], "replicated": m["replicated"], "static": m["static"]}}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GNNDIST_TIMEOUT", "60")
        on[3] = launch(3, resume_worker, str(stores[3]), str(stores["static3"]), str(root))[0]
    on[1] = resume_each(graphs[0], graphs[1], root)
    return root, on


@pytest.mark.parametrize("run", ["replicated", "partitioned", "static"])
@pytest.mark.parametrize("world", [1, 3])
def test_a_checkpoint_of_2_ranks_resumed_on_1_or_3_ends_as_on_2(recut, run, world):
    """The checkpoint of 2 ranks at step 3 of epoch 2 of a link run (node state re-cut by the
    data's node ids for the new ranks' parts), and at step 2 of epoch 2 of a node run without
    dropout, resumes on 1 and on 3 ranks to the figures it reaches on 2; the resumed run's
    checkpoint is in its own ranks' layout, the other one's files deleted."""
    root, on = recut
    got, want = on[world][run], on[2][run]
    close(got, want, 1e-5)
    assert [(r["epoch"], r["step"]) for r in got["restarts"]] == [(2, 2 if run == "static" else 3)]
    copy = root / f"{COPIES[run]}-on{world}"
    folders = sorted(f.name for f in copy.iterdir() if f.is_dir())
    assert folders == ([] if world == 1 else [f"rank{r}" for r in range(world)])
    assert checkpoint.epochs(checkpoint.model_folder(copy)) == [2]


# ------------------------------------------------------------------------------------------ one process

def test_checkpoints_by_the_minute_and_resume_auto(graphs, tmp_path, capsys):
    """--checkpoint-minutes: a checkpoint once the time is up (the ranks agree every 10 steps);
    --resume auto continues a checkpoint of this same run to the uninterrupted figures (APAN:
    mails delivered to neighbours, a mailbox of 10), and starts anew beside one of other
    settings, saying why."""
    def trainer(**kw):
        return LinkTrainer(RankEvents.from_graph(graphs[0]), link_config("replicated", model="apan", **kw))
    want = fit(trainer())
    ck = str(tmp_path / "ck")
    tr = trainer()
    tr.step = stop_at(tr.step, 17 + 15, stop)
    with pytest.raises(Stop):
        fit(tr, Outputs(checkpoint=ck, checkpoint_minutes=1e-9))
    # due at once, taken at the run's steps 10, 20, 30 (and the end of epoch 1): the newest 2 kept
    assert checkpoint.positions(ck) == [Position(2, 3), Position(2, 13)]
    got = fit(trainer(), Outputs(checkpoint=ck, resume="auto"))
    close(got, want, 1e-6)
    assert "resuming from epoch 2, step 13 of 17" in capsys.readouterr().err
    fit(trainer(lr=0.01), Outputs(checkpoint=ck, resume="auto"))
    assert capsys.readouterr().err.startswith(f"starting anew: the checkpoint in {ck} was written with lr=0.001, "
                                              f"this run has lr=0.01\n")


class InProcess(Placement):
    """Every second half of a step in the half process."""

    def remote(self) -> bool:
        return True


def test_a_checkpoint_holds_the_node_rows_changed_since_the_one_before(tmp_path, monkeypatch):
    """Within an epoch a checkpoint writes only the node-state rows changed since the one before
    (the first of an epoch: since the reset): every row that differs (brute force, bit for bit,
    against the state the run held at the one before) and none but the endpoints of the events
    trained in between; `checkpoint.load` puts together exactly the state the run held, from a
    chain of such files; with --keep-checkpoints 2 the folder keeps the newest two and the files
    they build on, nothing else; and a run resumed from the newest that builds on another ends as
    uninterrupted."""
    tg = load("synthetic-temporal", num_nodes=1000, num_events=1200)  # 50 events a step touch few of 1000 nodes
    held = {}
    real = checkpoint.Writer.save

    def save(self, payload):  # the whole state the run holds at each checkpoint, bit for bit
        held[Position(payload["epoch"], payload["step"])] = {
            k: v.clone() for k, v in payload["node_state"].items() if isinstance(v, torch.Tensor)}
        return real(self, payload)
    monkeypatch.setattr(checkpoint.Writer, "save", save)
    ck = tmp_path / "ck"

    def trainer():  # every second half in the half process, whose writes a delta must hold too
        tr = LinkTrainer(RankEvents.from_graph(tg), link_config("replicated"))
        tr.halves, tr.split.placements = 2, {True: InProcess(), False: InProcess()}
        return tr
    want = fit(trainer())
    tr = trainer()
    got = fit(tr, Outputs(checkpoint=str(ck), checkpoint_every=2))
    assert tr.split.process is not None
    close(got, want, 1e-6)
    raw = {p: torch.load(ck / p.name, weights_only=True)["node_state"] for p in checkpoint.positions(ck)}
    builds_on = {p: n.get("base") for p, n in raw.items()}
    newest = sorted(raw)[-2:]
    chains, p = set(newest), newest[0]
    while builds_on[p] not in (None, checkpoint.RESET):
        p = Position.from_code(builds_on[p])
        chains.add(p)
    assert set(raw) == chains and len(chains) > 3
    deltas = 0
    for p, node in raw.items():
        whole = checkpoint.load(ck, p)["node_state"]
        assert all(torch.equal(whole[k], v) for k, v in held[p].items())
        if node.get("base") in (None, checkpoint.RESET) or p.step is None:
            continue
        base = Position.from_code(node["base"])
        assert base.epoch == p.epoch
        differ = torch.zeros(1000, dtype=torch.bool)
        for k, v in held[p].items():
            if k != "node_ids":
                b = v.view(v.shape[0], -1).view(torch.int8) != held[base][k].view(v.shape[0], -1).view(torch.int8)
                differ |= b.any(1)
        rows = set(node["rows"].tolist())
        assert set(differ.nonzero().squeeze(1).tolist()) <= rows
        first, last = 50 * (base.step or 0), 50 * p.step
        assert {int(node["node_ids"][r]) for r in rows} <= set(tg.src[first:last]) | set(tg.dst[first:last])
        assert 0 < len(rows) < 1000
        deltas += 1
    assert deltas >= 2
    at = max(p for p, n in raw.items() if n.get("base") not in (None, checkpoint.RESET) and p.step is not None)
    for p in raw:
        if p > at:
            (ck / p.name).unlink()
    again = fit(trainer(), Outputs(checkpoint=str(ck), resume=True))
    close(again, want, 1e-6)
    assert [(r["epoch"], r["step"]) for r in again["restarts"]] == [(at.epoch, at.step)]


def test_checkpoint_files_are_checked_and_predict_reads_format_1(tmp_path):
    """A checkpoint of a newer format, or not gnndist's, is one line; `gnndist predict` reads the
    end-of-epoch checkpoints of format 1 (before checkpoints within an epoch), and says so of a
    folder whose newest checkpoint is from before the first validation."""
    from gnndist.predict import SavedModel

    checkpoint.save(tmp_path / "early", {"epoch": 1, "step": 4, "config": {"model": "tgn"}, "best": None})
    with pytest.raises(GnndistError, match="holds no trained model yet: its newest checkpoint is of epoch 1, "
                                           "step 4, before the first validation$"):
        SavedModel.load(tmp_path / "early")

    model = {"w": torch.ones(2)}
    torch.save({"format": 1, "epoch": 3, "config": {"model": "tgn"}, "model": model, "history": [],
                "best": {"epoch": 2, "val_ap": 0.5, "model": model}}, tmp_path / checkpoint_name(3))
    saved = SavedModel.load(tmp_path)
    assert (saved.task, saved.epoch, saved.selected_epoch) == ("link", 3, 2)
    assert torch.equal(saved.params["w"], model["w"])
    torch.save({"format": 4, "epoch": 4}, tmp_path / checkpoint_name(4))
    with pytest.raises(GnndistError, match="epoch-0004.pt is of checkpoint format 4, written by a newer gnndist "
                                           "\\(this one reads formats 1, 2, 3\\): upgrade gnndist$"):
        checkpoint.load(tmp_path)
    torch.save([1, 2], tmp_path / checkpoint_name(4))
    with pytest.raises(GnndistError, match="epoch-0004.pt is not a gnndist checkpoint of epoch 4 \\(format 3\\); "
                                           "epoch 3 is complete: move epoch-0004.pt away to resume from it$"):
        checkpoint.load(tmp_path)


def test_flags_of_long_runs_refused_before_any_work(tmp_path, capsys, monkeypatch):
    from gnndist.cli import main
    from gnndist.runtime import launch as glaunch

    base = ["train", "synthetic-temporal", "--num-nodes", "50", "--num-events", "500", "--quiet"]
    for argv, line in (
            (["--checkpoint-every", "5"], "--checkpoint-every needs --checkpoint DIR"),
            (["--resume", "auto"], "--resume needs --checkpoint DIR"),
            (["--checkpoint", str(tmp_path / "ck"), "--keep-checkpoints", "0"],
             "--keep-checkpoints must be an integer from 1"),
            (["--max-restarts", "2"], "--max-restarts restarts the ranks that --nproc W > 1 starts")):
        assert main(base + argv) == 2
        err = capsys.readouterr().err
        assert line in err and err.count("\n") == 1, err
    assert not (tmp_path / "ck").exists()
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    with pytest.raises(GnndistError, match="start torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"):
        glaunch._refuse_shared_store_restarts()
