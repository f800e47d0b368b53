"""After training: TensorBoard logs (`--log-dir`), node-task checkpoints, and `gnndist predict`.

References: the metrics JSON and the per-event test scores of the training run itself (read
back from TensorBoard's own event reader; recorded from the trainer's evaluation), the data's
labels and test mask, a plain replay loop written here from the definition (global batches of B
from event 0, cut at each candidate's count of earlier events), and one process against two
ranks.
"""
from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gnndist import checkpoint
from gnndist.cli import main
from gnndist.datasets import load
from gnndist.errors import GnndistError
from gnndist.graph import TemporalGraph
from gnndist.outputs import Outputs
from gnndist.runtime.launch import launch
from gnndist.predict import SavedModel, read_candidates
from gnndist.temporal.config import LinkConfig
from gnndist.temporal.events import BatchEvents, RankEvents
from gnndist.temporal.models import MODELS
from gnndist.temporal.predict import events_before, link_embeddings, link_scores
from gnndist.temporal.fit import fit
from gnndist.temporal.trainer import LinkTrainer
from conftest import LINK, LINK_DATA, NODE, NODE_DATA  # tests/ is on sys.path under pytest
from test_report import one_line_error

EventAccumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator").EventAccumulator


@pytest.fixture(scope="module")
def runs(trained_runs):
    return trained_runs


@pytest.fixture
def cache(runs, monkeypatch):
    """The cache holding the stores the 2-rank trainings made (predict --nproc 2 finds them)."""
    root = next(iter(runs.values()))["metrics"].parent / "cache"
    monkeypatch.setenv("GNNDIST_CACHE", str(root))
    monkeypatch.setenv("GNNDIST_TIMEOUT", "120")
    return root


def metrics(run: dict[str, Path]) -> dict:
    return json.loads(run["metrics"].read_text())


def scalars(logs: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of a TensorBoard folder, as (step, value) per tag, read by tensorboard."""
    files = list(logs.iterdir())
    assert len(files) == 1 and files[0].name.startswith("events.out.tfevents."), files
    acc = EventAccumulator(str(logs), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def numeric(record: dict) -> dict[str, float]:
    return {k: v for k, v in record.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and k != "epoch"}


# ------------------------------------------------------------------------------------------ TensorBoard

@pytest.mark.parametrize("name", ["link1", "node2"])
def test_tensorboard_holds_every_epoch_figure_of_the_metrics_json(runs, name):
    m, got = metrics(runs[name]), scalars(runs[name]["logs"])
    for rec in m["epochs"]:
        for key, value in numeric(rec).items():
            assert (rec["epoch"], np.float32(value)) in got[f"epoch/{key}"], key
    epoch_tags = {t[len("epoch/"):] for t in got if t.startswith("epoch/")}
    assert epoch_tags == set().union(*(numeric(r) for r in m["epochs"]))
    assert all(len(got[f"epoch/{k}"]) == len(m["epochs"]) for k in epoch_tags if k != "cache_hit_rate")
    assert {t[len("test/"):]: v for t, v in got.items() if t.startswith("test/")} == {
        k: [(m["selected_epoch"], np.float32(v))] for k, v in numeric(m["test"]).items()}


def test_tensorboard_step_losses_average_to_the_epoch_loss(runs):
    """link: each epoch's loss is the event-weighted mean of its steps' global losses."""
    m, got = metrics(runs["link1"]), scalars(runs["link1"]["logs"])
    train_end = m["config"]["num_events"] - 2 * round(0.15 * m["config"]["num_events"])
    sizes = np.diff(np.r_[np.arange(0, train_end, 100), train_end])
    steps = got["train/loss"]
    assert [s for s, _ in steps] == list(range(len(sizes) * len(m["epochs"])))
    losses = np.array([v for _, v in steps], np.float64).reshape(len(m["epochs"]), len(sizes))
    assert np.allclose(losses @ sizes / sizes.sum(), [e["loss"] for e in m["epochs"]], rtol=1e-6)


def test_tensorboard_node_steps_average_to_the_epoch_loss(runs):
    """node, one process: the seed-weighted mean of each epoch's step losses is its loss."""
    m, got = metrics(runs["node1"]), scalars(runs["node1"]["logs"])
    g = load(NODE_DATA[0], num_nodes=400, num_edges=2000)
    train = int(g.train_mask.sum())
    sizes = np.diff(np.r_[np.arange(0, train, 32), train])
    losses = np.array([v for _, v in got["train/loss"]], np.float64).reshape(len(m["epochs"]), len(sizes))
    assert np.allclose(losses @ sizes / sizes.sum(), [e["loss"] for e in m["epochs"]], rtol=1e-6)


def test_a_resumed_run_continues_the_step_curve(tmp_path):
    logs, ck = tmp_path / "logs", tmp_path / "ck"
    assert main([*LINK[:-3], "--epochs", "1", "--quiet", "--checkpoint", str(ck), "--log-dir", str(logs)]) == 0
    assert main([*LINK, "--checkpoint", str(ck), "--resume", "--log-dir", str(logs)]) == 0
    acc = EventAccumulator(str(logs), size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == list(range(2 * 9))  # 9 training batches an epoch
    assert [e.step for e in acc.Scalars("epoch/loss")] == [1, 2]


def test_log_dir_errors_are_one_line_and_write_nothing(tmp_path, capsys, monkeypatch):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    err = one_line_error([*LINK, "--log-dir", str(foreign)], capsys)
    assert "it holds notes.txt, which is not a TensorBoard event file; choose another --log-dir" in err
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if tensorboard were not installed
    err = one_line_error([*NODE, "--log-dir", str(tmp_path / "tb"), "--metrics-out", str(tmp_path / "m.json")],
                         capsys)
    assert "--log-dir needs the tensorboard package: pip install 'gnndist[plot]'" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]
    err = one_line_error([*LINK, "--seeds", "0,1", "--log-dir", str(tmp_path / "tb")], capsys)
    assert "--seeds runs several trainings; it takes no --checkpoint or --log-dir" in err


# ------------------------------------------------------------------------------------------ node checkpoints

def test_node_checkpoint_holds_the_selected_parameters_in_a_folder_per_rank(runs, capsys):
    for name in ("node1", "node2"):
        m, ck = metrics(runs[name]), runs[name]["ckpt"]
        ranks = [f"rank{r}" for r in range(m["world_size"])] if m["world_size"] > 1 else []
        assert sorted(p.name for p in ck.iterdir() if p.is_dir()) == ranks
        for folder in [ck / r for r in ranks] or [ck]:
            assert sorted(p.name for p in folder.iterdir()) == [".progress", "epoch-0002.pt", "epoch-0003.pt"]
        saved = checkpoint.load(checkpoint.model_folder(ck))
        assert saved["epoch"] == 3 and saved["history"] == m["epochs"]
        assert saved["config"]["task"] == "node" and saved["config"]["world_size"] == m["world_size"]
        assert saved["best"]["epoch"] == m["selected_epoch"] and saved["best"]["val_acc"] == m["test"]["best_val_acc"]
        assert set(saved["optimizer"]) == {"state", "param_groups"} and saved["model"].keys() == saved["best"]["model"].keys()
    err = one_line_error([*NODE, "--checkpoint", str(runs["node1"]["ckpt"]), "--resume"], capsys)
    assert "the checkpoint already holds 3 epochs; ask for more with --epochs" in err


# ------------------------------------------------------------------------------------------ predict: link

def predict(*argv) -> None:
    assert main(["predict", *map(str, argv), "--quiet"]) == 0, argv


def test_predict_split_test_prints_and_writes_the_trained_metrics(runs, cache, tmp_path, capfd):
    for name, nproc in (("link1", 1), ("link2", 2)):
        capfd.readouterr()
        predict(runs[name]["ckpt"], *LINK_DATA, "--split", "test", "-o", tmp_path / f"{name}.json", "--nproc", nproc)
        out = capfd.readouterr().out  # the ranks print it
        trained = metrics(runs[name])["test"]
        assert json.loads((tmp_path / f"{name}.json").read_text())["test"] == trained
        assert f"test{'':26}{trained['ap']:>8.4f}{trained['auc']:>8.4f}{trained['mrr']:>8.4f}" in out
    # one process on the 2-rank checkpoint: the same metrics up to float summation order
    got = json.loads(_run_json(runs["link2"]["ckpt"], tmp_path / "one.json"))
    assert all(abs(got["test"][k] - metrics(runs["link2"])["test"][k]) < 2e-3 for k in ("ap", "auc", "mrr"))


def _run_json(ckpt: Path, out: Path) -> str:
    predict(ckpt, *LINK_DATA, "--split", "test", "-o", out)
    return out.read_text()


def tied_graph() -> TemporalGraph:
    """The generated events with times in groups of 4 (0,0,0,0,1,...): the first test event
    (1020 of 1200) opens a group, so 4 test events share a time after the last validation one."""
    g = load("synthetic-temporal", num_nodes=60, num_events=1200)
    return TemporalGraph(g.src, g.dst, (np.arange(1200) // 4).astype(float), g.edge_feat, num_nodes=60)


class Recorder(LinkTrainer):
    """Keeps the scores its evaluation returns, by phase."""

    def evaluate(self, start, stop, desc, score=True):
        out = super().evaluate(start, stop, desc, score)
        self.scores = getattr(self, "scores", {})
        self.scores[desc] = out
        return out


def reference_scores(trainer: LinkTrainer, params, src, dst, t) -> np.ndarray:
    """The definition, one candidate at a time, each from a reset state: replay the global
    batches [iB, (i+1)B) before the candidate's count of earlier events, then the rest of those
    events as one batch, then score the candidate."""
    trainer.model.load_state_dict(params)
    before = np.searchsorted(trainer.events.t, t, side="left")
    b = trainer.cfg.batch_size
    out = np.zeros(t.size, np.float32)
    for i in range(t.size):
        trainer.reset_state()
        grid = before[i] // b * b
        for lo in range(0, grid, b):
            trainer.evaluate(lo, lo + b, "replay", score=False)
        if before[i] > grid:
            trainer.evaluate(grid, before[i], "replay", score=False)
        candidate = BatchEvents(np.array([src[i]]), np.array([dst[i]]), np.array([t[i]]), np.zeros((1, 0), np.int64),
                                np.array([-1]), np.zeros((1, trainer.events.edge_dim), np.float32))
        with torch.no_grad():
            out[i] = trainer.forward(trainer.planner.ready(candidate)).pos[0]
    return out


@pytest.mark.parametrize("model", MODELS)
def test_candidates_score_what_train_scored_and_follow_the_replay_definition(model, tmp_path):
    g = tied_graph()
    cfg = LinkConfig(model=model, epochs=1, batch_size=70, memory_dim=12, time_dim=8, quiet=True)
    trainer = Recorder(RankEvents.from_graph(g), cfg)
    fit(trainer, Outputs(checkpoint=str(tmp_path / "ck")))
    first = np.arange(1020, 1024)
    assert g.t[1019] < g.t[1020] == g.t[1023] < g.t[1024]
    got = link_scores(tmp_path / "ck", g, g.src[first], g.dst[first], g.t[first], quiet=True)
    pos, _, eid = trainer.scores["test"][:3]
    assert np.array_equal(eid[:4], first)
    np.testing.assert_allclose(got, pos[:4], rtol=0, atol=2e-6)
    # candidates at times cutting batches anywhere (and before and after every event)
    rng = np.random.default_rng(1)
    t = np.r_[rng.choice(g.t, 9) + rng.choice([0.0, 0.5], 9), -1.0, 400.0]
    src, dst = rng.integers(0, 60, t.size), rng.integers(0, 60, t.size)
    got = link_scores(tmp_path / "ck", g, src, dst, t, quiet=True)
    saved = SavedModel.load(tmp_path / "ck")
    np.testing.assert_allclose(got, reference_scores(trainer, saved.params, src, dst, t), rtol=0, atol=2e-6)
    # a candidate's score does not depend on the others (the earlier ones cut batches before it)
    last = [int(np.argmax(t))]
    alone = link_scores(tmp_path / "ck", g, src[last], dst[last], t[last], quiet=True)
    np.testing.assert_allclose(alone, got[last], rtol=0, atol=2e-6)
    # embeddings at T: the link predictor on them gives the candidates' scores at T
    at = float(g.t[1020])
    emb = torch.from_numpy(link_embeddings(tmp_path / "ck", g, at, quiet=True))
    ends = np.array([[3, 7], [10, 2], [59, 0]])
    score = link_scores(tmp_path / "ck", g, ends[:, 0], ends[:, 1], np.full(3, at), quiet=True)
    with torch.no_grad():
        direct = trainer.model.predictor(emb[ends[:, 0]], emb[ends[:, 1]]).numpy()
    np.testing.assert_allclose(score, direct, rtol=0, atol=2e-6)
    assert events_before(trainer, np.array([at, -5.0, 1e9])).tolist() == [1020, 0, 1200]


def test_a_tgat_checkpoint_from_before_the_sampling_setting_samples_uniformly(tmp_path):
    g = tied_graph()
    cfg = LinkConfig(model="tgat", sampling="uniform", epochs=1, batch_size=70, memory_dim=12, time_dim=8, quiet=True)
    fit(LinkTrainer(RankEvents.from_graph(g), cfg), Outputs(checkpoint=str(tmp_path / "ck")))
    src, dst, t = g.src[1020:1040], g.dst[1020:1040], g.t[1020:1040]
    want = link_scores(tmp_path / "ck", g, src, dst, t, quiet=True)
    (path,) = (tmp_path / "ck").glob("epoch-*.pt")
    payload = torch.load(path, weights_only=True)
    del payload["config"]["sampling"]  # as written before the setting existed
    payload["config"]["cache_size"] = 0.1  # as written before a size was a cache's only
    torch.save(payload, path)
    np.testing.assert_array_equal(link_scores(tmp_path / "ck", g, src, dst, t, quiet=True), want)


def two_rank_scores(ckpt: str, store: str, src, dst, t):
    """On a rank of a 2-rank launch: candidate scores on the 2-part store."""
    return link_scores(ckpt, store, src, dst, t, quiet=True)


def two_rank_embeddings(ckpt: str, store: str, at: float):
    """On a rank of a 2-rank launch: every node's embedding at `at` on the 2-part store."""
    return link_embeddings(ckpt, store, at, quiet=True)


def test_candidates_and_embeddings_are_the_same_on_two_ranks(runs, cache, tmp_path):
    g = load(LINK_DATA[0], num_nodes=80, num_events=1200)
    rows = np.r_[1020:1030, 300:305]
    (tmp_path / "c.csv").write_text("t,src,dst\n" + "".join(f"{float(g.t[i])!r},{g.src[i]},{g.dst[i]}\n"
                                                           for i in rows))
    at = float(g.t[700])
    ckpt = runs["link2"]["ckpt"]
    predict(ckpt, *LINK_DATA, "--candidates", tmp_path / "c.csv", "-o", tmp_path / "s.csv")
    predict(ckpt, *LINK_DATA, "--embed-at", at, "-o", tmp_path / "e.npy")
    one = np.loadtxt(tmp_path / "s.csv", delimiter=",", skiprows=1)
    assert np.array_equal(one[:, :3], np.stack([g.src[rows], g.dst[rows], g.t[rows]], 1))
    np.testing.assert_allclose(one[:, 4], 1 / (1 + np.exp(-one[:, 3])), rtol=1e-6)
    store = next(p for p in (cache / "partitions").iterdir() if p.name.startswith("synthetic-temporal-2parts"))
    # one launch a call: a rank process joins its process group once (torch's gloo cannot rejoin reliably)
    scores = launch(2, two_rank_scores, str(ckpt), str(store), *read_candidates(tmp_path / "c.csv"))[0]
    emb = launch(2, two_rank_embeddings, str(ckpt), str(store), at)[0]
    np.testing.assert_allclose(scores, one[:, 3], atol=1e-5)
    e1 = np.load(tmp_path / "e.npy")
    assert e1.shape == (80, 16) and np.isfinite(e1).all()
    np.testing.assert_allclose(emb, e1, atol=1e-5)


def test_candidate_ids_are_the_files_original_ids(tmp_path):
    """A SNAP file whose ids start at 101: candidates name nodes by the file's ids."""
    rng = np.random.default_rng(0)
    e = 600
    src, dst = rng.integers(0, 30, e) + 101, rng.integers(0, 30, e) + 101
    path = tmp_path / "g.txt"
    path.write_text("".join(f"{s} {d} {i}\n" for i, (s, d) in enumerate(zip(src, dst))))
    ck = tmp_path / "ck"
    assert main(["train", str(path), "--task", "link", "--model", "jodie", "--epochs", "1", "--memory-dim", "8",
                 "--quiet", "--checkpoint", str(ck)]) == 0
    g = load(str(path))
    at = np.array([550.0, 550.0])
    by_file = link_scores(ck, str(path), np.array([101, 130]), np.array([102, 101]), at, quiet=True)
    by_graph = link_scores(ck, TemporalGraph(g.src, g.dst, g.t, num_nodes=g.num_nodes), np.array([0, 29]),
                           np.array([1, 0]), at, quiet=True)
    assert np.array_equal(by_file, by_graph)


# ------------------------------------------------------------------------------------------ predict: node

def test_node_probabilities_give_the_trained_test_accuracy(runs, cache, tmp_path):
    g = load(NODE_DATA[0], num_nodes=400, num_edges=2000)
    for name, nproc in (("node1", 1), ("node2", 2)):
        out = tmp_path / f"{name}.npy"
        predict(runs[name]["ckpt"], *NODE_DATA, "-o", out, "--nproc", nproc)
        p = np.load(out)
        assert p.shape == (400, g.num_classes) and np.allclose(p.sum(1), 1, atol=1e-5)
        acc = float((p.argmax(1) == g.y)[g.test_mask].mean())
        assert acc == pytest.approx(metrics(runs[name])["test"]["acc"], abs=1e-12), name
    ids = np.array([17, 3, 399, 3])
    (tmp_path / "ids.txt").write_text("# some nodes\n" + "\n".join(map(str, ids)) + "\n")
    predict(runs["node2"]["ckpt"], *NODE_DATA, "--ids", tmp_path / "ids.txt", "-o", tmp_path / "some.csv")
    table = np.loadtxt(tmp_path / "some.csv", delimiter=",", skiprows=1)
    assert np.array_equal(table[:, 0], ids)
    np.testing.assert_allclose(table[:, 1:], np.load(tmp_path / "node2.npy")[ids], atol=1e-6)
    header = (tmp_path / "some.csv").read_text().splitlines()[0]
    assert header == "node," + ",".join(f"p{c}" for c in range(g.num_classes))


def test_predict_progress_bars_only_on_a_terminal(runs, tmp_path, capsys, monkeypatch):
    (tmp_path / "c.csv").write_text("src,dst,t\n1,2,900.5\n3,4,100.0\n")
    base = ["predict", str(runs["link1"]["ckpt"]), *LINK_DATA]
    link = base + ["--candidates", str(tmp_path / "c.csv")]
    node = ["predict", str(runs["node1"]["ckpt"]), *NODE_DATA]
    capsys.readouterr()
    assert main(link + ["-o", str(tmp_path / "a.csv")]) == 0
    assert capsys.readouterr().err == ""  # not a terminal: no bar
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    for argv, bars in ((link + ["-o", str(tmp_path / "b.csv")], ("T-CSR:", "replay:", "score:", "/2 ")),
                       (node + ["-o", str(tmp_path / "b.npy")], ("evaluate",)),
                       (base + ["--embed-at", "500", "-o", str(tmp_path / "e.npy")], ("replay:", "embed:"))):
        assert main(argv) == 0
        err = capsys.readouterr().err
        assert all(b in err for b in bars), (bars, err)
    assert main(node + ["-o", str(tmp_path / "q.npy"), "--quiet"]) == 0
    assert capsys.readouterr().err == ""


# ------------------------------------------------------------------------------------------ predict: errors

@pytest.mark.parametrize("args, message", [
    (["{node1}", *NODE_DATA, "--split", "test", "-o", "{tmp}/x.npy"], "--split is for link models"),
    (["{node1}", *NODE_DATA], "give -o FILE (.npy or .csv)"),
    (["{node1}", *NODE_DATA, "-o", "{tmp}/x.txt"], "predictions are written as .npy or .csv"),
    (["{node1}", *LINK_DATA, "-o", "{tmp}/x.npy"], "holds a node model, which needs a static graph; DATA is temporal"),
    (["{node1}", "synthetic-static", "--num-nodes", "400", "--num-edges", "2000", "--num-features", "8", "-o", "{tmp}/x.npy"],
     "was trained on data with num features 32, DATA has 8"),
    (["{link1}", *LINK_DATA], "a link model needs one of --split, --candidates, --embed-at"),
    (["{link1}", *NODE_DATA, "-o", "{tmp}/x.npy"], "holds a link model, which needs a temporal graph; DATA is static"),
    (["{link1}", *LINK_DATA, "--split", "test", "--embed-at", "3", "-o", "{tmp}/x.npy"],
     "not --split and --embed-at together"),
    (["{link1}", *LINK_DATA, "--ids", "{tmp}/ids.txt", "--split", "test"], "--ids is for node models"),
    (["{link1}", *LINK_DATA, "--embed-at", "5"], "--embed-at needs -o FILE"),
    (["{link1}", *LINK_DATA, "--embed-at", "nan", "-o", "{tmp}/x.npy"], "--embed-at must be a finite time"),
    (["{link1}", *LINK_DATA, "--embed-at", "5", "-o", "{tmp}/exists.npy"],
     "refusing to write the predictions to {tmp}/exists.npy: it exists"),
    (["{link1}", *LINK_DATA, "--candidates", "{tmp}/bad.csv", "-o", "{tmp}/x.csv"], "node id 80 is not a node of DATA"),
    (["{link1}", *LINK_DATA, "--split", "test", "-o", "{tmp}/x.npy"],
     "--split writes its metrics as JSON: give -o a .json path, not {tmp}/x.npy"),
    (["{link1}", *LINK_DATA, "--candidates", "{tmp}/nope.csv", "-o", "{tmp}/x.csv"], "{tmp}/nope.csv: no such file or directory"),
    (["{link1}", *LINK_DATA, "--candidates", "{tmp}/wide.csv", "-o", "{tmp}/x.csv"],
     "wide.csv:2: expected 3 fields (one per header name), got 4"),
    (["{link1}", *LINK_DATA, "--candidates", "{tmp}/nohead.csv", "-o", "{tmp}/x.csv"],
     "the header needs one column each named src, dst and t (missing or repeated: t)"),
    (["{link1}", "synthetic-temporal", "--num-nodes", "90", "--num-events", "1200", "--split", "test"],
     "was trained on data with num nodes 80, DATA has 90"),
    (["{link1}", "synthetic-temporal", "--num-nodes", "90", "--num-events", "1200", "--split", "test", "--nproc", "2"],
     "was trained on data with num nodes 80, DATA has 90"),  # told before the data is split: one line
    (["{node1}", "synthetic-static", "--num-nodes", "400", "--num-edges", "2000", "--num-features", "8", "-o",
      "{tmp}/x.npy", "--nproc", "2"], "was trained on data with num features 32, DATA has 8"),
    (["{link1}", "synthetic-temporal", "--num-nodes", "80", "--num-events", "1300", "--split", "test"],
     "was trained on data with num events 1200, DATA has 1300"),
    (["{tmp}/nothing", *LINK_DATA, "--split", "test"], "is not a checkpoint folder"),
    (["{tmp}", *LINK_DATA, "--split", "test"], "no checkpoint"),
    (["{link2}", "{store}", "--split", "test"], "has 2 parts but 1 rank(s) run; use --nproc 2"),
    (["{link1}", *LINK_DATA, "--split", "test", "-o", "{link1}/t.json"], "it is inside the input folder"),
    (["{link1}", *LINK_DATA, "--split", "test", "-o", "{tmp}/exists.json"],
     "refusing to write the test metrics to {tmp}/exists.json: it exists and is not a metrics file gnndist wrote"),
    (["{link1}", *LINK_DATA, "--split", "test", "-o", "{tmp}/exists.json"], "; choose another -o"),
])
def test_predict_errors_are_one_line(runs, cache, tmp_path, capsys, args, message):
    (tmp_path / "exists.npy").write_bytes(b"precious")
    (tmp_path / "exists.json").write_bytes(b"precious")
    (tmp_path / "bad.csv").write_text("src,dst,t\n1,2,3.5\n80,1,4\n")
    (tmp_path / "nohead.csv").write_text("src,dst,time\n1,2,3\n")
    (tmp_path / "wide.csv").write_text("src,dst,t\n1,2,3,4\n")
    (tmp_path / "ids.txt").write_text("1\n")
    store = next(p for p in (cache / "partitions").iterdir() if p.name.startswith("synthetic-temporal"))
    names = {"tmp": tmp_path, "store": store, **{k: v["ckpt"] for k, v in runs.items()}}
    before = sorted(tmp_path.rglob("*"))
    err = one_line_error(["predict", *(a.format(**names) for a in args), "--quiet"], capsys)
    assert message.format(**names) in err, err
    assert sorted(tmp_path.rglob("*")) == before and (tmp_path / "exists.npy").read_bytes() == b"precious"
    assert (tmp_path / "exists.json").read_bytes() == b"precious"


def test_predict_test_figures_replace_no_training_metrics(runs, tmp_path, capsys):
    """`--split test -o` refuses a training run's metrics file (its per-epoch metrics would be
    lost), and replaces test metrics it wrote before."""
    trained = tmp_path / "run.json"
    trained.write_bytes(runs["link1"]["metrics"].read_bytes())
    err = one_line_error(["predict", str(runs["link1"]["ckpt"]), *LINK_DATA, "--split", "test", "-o", str(trained),
                          "--quiet"], capsys)
    assert err.strip() == (f"gnndist predict: error: refusing to write the test metrics to {trained}: it holds a "
                           f"training run's metrics (per-epoch metrics), which the test metrics would replace; "
                           f"choose another -o")
    assert trained.read_bytes() == runs["link1"]["metrics"].read_bytes()
    out = tmp_path / "test.json"
    for _ in range(2):
        assert main(["predict", str(runs["link1"]["ckpt"]), *LINK_DATA, "--split", "test", "-o", str(out),
                     "--quiet"]) == 0
    assert json.loads(out.read_text())["test"] == metrics(runs["link1"])["test"]


@pytest.mark.parametrize("name", ["link2", "node1"])
def test_info_describes_a_checkpoint_as_its_run_recorded_it(runs, name, capsys, tmp_path):
    """`gnndist info CHECKPOINT`: the task, model, ranks, epochs and selected epoch's validation
    metrics are those of the run's metrics JSON; the settings, its checkpoint's config."""
    m, ck = metrics(runs[name]), runs[name]["ckpt"]
    assert main(["info", str(ck), "--json"]) == 0
    c = json.loads(capsys.readouterr().out)
    sel = m["epochs"][m["selected_epoch"] - 1]
    assert (c["task"], c["model"], c["world_size"], c["selected_epoch"]) == (m["task"], m["model"], m["world_size"],
                                                                              m["selected_epoch"])
    assert c["rank_folders"] == ([0, 1] if name == "link2" else []) and c["epochs_run"] == len(m["epochs"])
    assert c["epochs_kept"] == [e["epoch"] for e in m["epochs"]][-2:]
    assert c["selected_val"] == {k[4:]: v for k, v in sel.items() if k.startswith("val_")}
    assert c["config"] == SavedModel.load(ck).config
    assert main(["info", str(ck)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (f"{ck}: checkpoint of a {m['task']} run, {m['model']} on " +
                        ("2 ranks (folders here: rank0/, rank1/)" if name == "link2" else "1 process"))
    assert lines[-1].startswith(f"use: gnndist predict {ck} DATA ")
    assert "--nproc applies to a dataset; " in one_line_error(["info", str(ck), "--nproc", "2"], capsys)
    if name == "link2":  # a host of a multi-host run holds its own rank's folder only: the same model
        host1 = tmp_path / "host1"
        shutil.copytree(ck / "rank1", host1 / "rank1")
        assert main(["info", str(host1), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["rank_folders"] == [1]
        one, full = SavedModel.load(host1), SavedModel.load(ck)
        assert one.params.keys() == full.params.keys() and all(torch.equal(one.params[k], full.params[k])
                                                               for k in full.params)


def test_library_predictions_refuse_ids_that_are_not_node_ids(runs, cache):
    """Node ids of 0.5 or [[0]] and a device that is none of gnndist's are refused, not read as
    node 0 (they were truncated or flattened)."""
    from gnndist.static.predict import node_probabilities
    from gnndist.temporal.predict import link_test
    g = load(LINK_DATA[0], num_nodes=int(LINK_DATA[2]), num_events=int(LINK_DATA[4]))
    nodes = load(NODE_DATA[0], num_nodes=int(NODE_DATA[2]), num_edges=int(NODE_DATA[4]))
    with pytest.raises(GnndistError, match="src must hold integer node ids"):
        link_scores(runs["link1"]["ckpt"], g, np.array([0.5]), np.array([1]), np.array([5.0]), quiet=True)
    with pytest.raises(GnndistError, match=r"ids must be a 1-d array, got shape \(1, 1\)"):
        node_probabilities(runs["node1"]["ckpt"], nodes, ids=np.array([[0]]), quiet=True)
    with pytest.raises(GnndistError, match="--device must be one of cpu, cuda, got 'tpu'"):
        link_test(runs["link1"]["ckpt"], g, device="tpu", quiet=True)
    with pytest.raises(GnndistError, match="--embed-at must be a finite time, got 'x'"):
        link_embeddings(runs["link1"]["ckpt"], g, "x", quiet=True)


@pytest.mark.parametrize("name", ["link1", "node1"])
def test_parameters_that_do_not_fit_the_model_are_one_line(runs, name, tmp_path, capsys):
    """A checkpoint whose parameters a gnndist that built the model otherwise saved (here one
    weight a column narrower): predict and a resume each say so in one line; it is kept as it was."""
    ckpt = tmp_path / "ck"
    shutil.copytree(runs[name]["ckpt"], ckpt)
    for f in ckpt.glob("epoch-*.pt"):
        saved = torch.load(f, weights_only=True)
        for params in (saved["model"], saved["best"]["model"]):
            key = next(k for k, v in params.items() if v.dim() == 2)
            params[key] = params[key][:, 1:].clone()
        torch.save(saved, f)
    files = {p: p.read_bytes() for p in ckpt.rglob("*") if p.is_file()}
    data, train, out = (LINK_DATA, LINK, ["--split", "test", "-o", str(tmp_path / "t.json")]) if name == "link1" \
        else (NODE_DATA, NODE, ["-o", str(tmp_path / "t.npy")])
    for argv in (["predict", str(ckpt), *data, *out, "--quiet"],
                 [*train, "--checkpoint", str(ckpt), "--resume", "--epochs", "4"]):
        err = one_line_error(argv, capsys)
        assert str(ckpt) in err and "size mismatch for" in err, err
        assert "its parameters do not fit this gnndist's" in err, err
    assert {p: p.read_bytes() for p in ckpt.rglob("*") if p.is_file()} == files
    assert not (tmp_path / "t.json").exists() and not (tmp_path / "t.npy").exists()
