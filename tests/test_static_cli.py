"""`gnndist train --task node` end to end: metrics JSON, partitioning on demand, user errors; the
flag checks of `NodeConfig` and what the trainer allocates against `gnndist.footprint`."""
import dataclasses
import json
import re

import pytest

from gnndist import footprint
from gnndist.cli import main
from gnndist.errors import GnndistError
from gnndist.static.config import MODEL_DEFAULTS
from gnndist.static.footprint import node_footprint
from gnndist.partition.stats import fmt_bytes
from gnndist.static import trainer as trainer_module
from gnndist.static.trainer import NodeConfig, NodeTrainer, WholeGraph
from test_static_models import small_graph  # tests/ is on sys.path under pytest

DATA = ["synthetic-static", "--num-nodes", "400", "--num-edges", "2000"]
KEYS = {"epoch", "loss", "time_s", "nodes_per_s", "val_acc", "cache_hit_rate", "remote_bytes"}


@pytest.fixture(autouse=True)
def env(monkeypatch, tmp_path):
    monkeypatch.setenv("GNNDIST_TIMEOUT", "60")
    monkeypatch.setenv("GNNDIST_CACHE", str(tmp_path / "cache"))


def train(tmp_path, *extra):
    out = tmp_path / "metrics.json"
    assert main(["train", *DATA, "--task", "node", "--epochs", "3", "--quiet", "--metrics-out", str(out), *extra]) == 0
    return json.loads(out.read_text())


def test_one_and_two_ranks_write_metrics(tmp_path, capsys):
    one = train(tmp_path, "--model", "sage")
    assert one["task"] == "node" and one["model"] == "sage" and one["world_size"] == 1
    assert [e["epoch"] for e in one["epochs"]] == [1, 2, 3] and all(KEYS <= set(e) for e in one["epochs"])
    assert one["epochs"][-1]["loss"] < one["epochs"][0]["loss"]
    assert one["test"]["acc"] > 0.4  # 8 classes: chance is 0.125
    assert one["epochs"][0]["cache_hit_rate"] is None and one["epochs"][0]["remote_bytes"] == 0

    two = train(tmp_path, "--model", "sage", "--nproc", "2", "--cache", "degree", "--cache-size", "0.2")
    assert two["world_size"] == 2 and two["test"]["acc"] > 0.4
    assert all(KEYS <= set(e) and e["remote_bytes"] > 0 and 0 < e["cache_hit_rate"] < 1 for e in two["epochs"])
    c = two["cache"]
    assert c["policy"] == "degree" and c["hits"] + c["misses"] == c["requests"] > 0
    assert c["bytes_fetched"] == sum(e["remote_bytes"] for e in two["epochs"])
    stores = list((tmp_path / "cache" / "partitions").iterdir())
    assert len(stores) == 1 and (stores[0] / "meta.json").is_file()
    assert f"at {stores[0]}" in capsys.readouterr().err

    # the store is a valid DATA argument of its own; the same run again gives the same metrics
    out = tmp_path / "again.json"
    assert main(["train", str(stores[0]), "--task", "node", "--epochs", "3", "--quiet", "--nproc", "2",
                 "--cache", "degree", "--cache-size", "0.2", "--metrics-out", str(out)]) == 0
    again = json.loads(out.read_text())
    assert [e["loss"] for e in again["epochs"]] == [e["loss"] for e in two["epochs"]]
    assert again["test"] == two["test"]

    # a store of 2 parts cannot run on 1 rank
    assert main(["train", str(stores[0]), "--task", "node", "--quiet"]) == 2
    assert "has 2 parts but 1 rank(s) run; use --nproc 2" in capsys.readouterr().err


def test_a_run_says_which_defaults_its_model_took(tmp_path):
    """A flag given wins over the model's default, and the metrics JSON's `defaults` leaves it out."""
    m = train(tmp_path, "--model", "gat", "--hidden", "16", "--epochs", "1")
    took = {k: v for k, v in MODEL_DEFAULTS["gat"].items() if k != "hidden"}
    assert m["defaults"] == took and all(m["config"][k] == v for k, v in took.items())
    assert m["config"]["hidden"] == 16 and took != {k: v for k, v in MODEL_DEFAULTS["sage"].items() if k != "hidden"}
    cfg = NodeConfig.for_model("gat", hidden=16)
    assert cfg.defaults == took and dataclasses.replace(cfg, seed=1).defaults == took  # as --seeds makes it
    assert "lr" not in dataclasses.replace(cfg, lr=0.1).defaults


@pytest.mark.parametrize("task, data", [("node", DATA), ("link", ["synthetic-temporal", "--num-nodes", "60",
                                                                  "--num-events", "600"])])
def test_quiet_leaves_out_the_epoch_lines(task, data, capsys):
    """`--quiet`: no progress bars or per-epoch lines, for both tasks (the help says so)."""
    for quiet in ([], ["--quiet"]):
        assert main(["train", *data, "--task", task, "--epochs", "2", *quiet]) == 0
        lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("epoch")]
        assert len(lines) == (0 if quiet else 2), lines


@pytest.mark.parametrize("argv, message", [
    (["synthetic-temporal", "--num-events", "200", "--task", "node"],
     "--task node on a temporal graph needs a label per event"),
    ([*DATA, "--task", "node", "--model", "tgn"], "--task node supports --model sage|gcn|gat"),
    ([*DATA, "--task", "node", "--fanouts", "5,5", "--eval-fanouts", "-1"], "--eval-fanouts needs 2 values"),
    ([*DATA, "--task", "node", "--model", "gat", "--hidden", "30"], "must be a multiple of heads 8"),
])
def test_user_errors_are_one_line(capsys, argv, message):
    assert main(["train", *argv, "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


# ---------------------------------------------------------------- flags and configs (gnndist.validate)

@pytest.mark.parametrize("flags, fields", [
    (["--seed", "-1"], dict(seed=-1)),
    (["--lr", "inf"], dict(lr=float("inf"))),
    (["--weight-decay", "nan"], dict(weight_decay=float("nan"))),
    (["--weight-decay=-1e-4"], dict(weight_decay=-1e-4)),
    (["--dropout", "1"], dict(dropout=1.0)),
    (["--dropout", "-0.1"], dict(dropout=-0.1)),
    (["--cache-size", "inf"], dict(cache_size=float("inf"))),
    (["--fanouts", "0"], dict(fanouts=[0])),
    (["--fanouts", str(2**63)], dict(fanouts=[2**63])),
    (["--fanouts", "5,5", "--eval-fanouts", "-1"], dict(fanouts=[5, 5], eval_fanouts=[-1])),
    (["--eval-fanouts=-2,3"], dict(eval_fanouts=[-2, 3])),
    (["--hidden", "0"], dict(hidden=0)),
    (["--epochs", "0"], dict(epochs=0)),
])
def test_a_node_config_built_in_python_fails_with_the_line_of_the_cli(flags, fields, capsys):
    with pytest.raises(GnndistError) as built:
        NodeConfig.for_model("sage", **fields)
    with pytest.raises(GnndistError) as replaced:
        dataclasses.replace(NodeConfig(), **fields)
    assert str(built.value) == str(replaced.value)
    capsys.readouterr()
    assert main(["train", *DATA, "--task", "node", "--quiet", *flags]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"gnndist train: error: {built.value}"]


def test_the_edges_of_each_node_range_are_accepted():
    cfg = NodeConfig.for_model("gcn", dropout=0.0, weight_decay=0.0, fanouts=[-1, 2**63 - 1], eval_fanouts=[1, -1],
                               seed=2**63 - 1, cache="degree", cache_size=0.0)
    assert dataclasses.replace(cfg, dropout=0.999).dropout == 0.999
    for bad in (dict(fanouts=[]), dict(fanouts=[2.0]), dict(prefetch=None), dict(row_norm="yes"), dict(hidden=8.0)):
        with pytest.raises(GnndistError):
            dataclasses.replace(cfg, **bad)


# ---------------------------------------------------------------- what a trainer allocates (gnndist.footprint)

@pytest.mark.parametrize("model", ["sage", "gcn", "gat"])
def test_the_footprint_is_what_a_node_trainer_allocates(model):
    g = small_graph()
    cfg = NodeConfig.for_model(model, hidden=16, epochs=1, quiet=True)
    fp = node_footprint(WholeGraph(g), cfg)
    tr = NodeTrainer(WholeGraph(g), cfg)
    tr.train_epoch(1)
    params = list(tr.model.parameters())
    held = params + [p.grad for p in params] + [t for s in tr.opt.state.values() for t in s.values() if t.dim() > 0]
    assert [(p.label, p.nbytes) for p in fp.parts if p.label != "a training step's tensors (at most)"] == [
        ("model with gradients and Adam state", sum(t.nbytes for t in held)), ("feature cache", 0)]
    # a step's tensors: bounded from above in tests/test_footprint.py


def test_a_node_setting_that_cannot_fit_is_refused_with_its_estimate(monkeypatch):
    g, cfg = small_graph(), NodeConfig.for_model("sage", hidden=16, quiet=True)
    fp = node_footprint(WholeGraph(g), cfg)
    need = sum(p.nbytes for p in fp.parts)
    monkeypatch.setattr(footprint, "available_memory_bytes", lambda: need)
    NodeTrainer(WholeGraph(g), cfg)
    monkeypatch.setattr(footprint, "available_memory_bytes", lambda: need - 1)
    with pytest.raises(GnndistError, match=re.escape(
            f"the sage trainer needs an estimated {fmt_bytes(need)} of memory per rank ({fp.summary()}) but "
            f"{fmt_bytes(need - 1)} is available; lower --hidden, --batch-size or --fanouts")):
        NodeTrainer(WholeGraph(g), cfg)


def test_a_failed_model_allocation_is_one_line(monkeypatch):
    def fail(*args, **kwargs):
        raise MemoryError("Unable to allocate 1.00 TiB")
    monkeypatch.setattr(trainer_module, "StaticGNN", fail)
    g, cfg = small_graph(), NodeConfig.for_model("sage", hidden=16, quiet=True)
    with pytest.raises(GnndistError, match=re.escape("not enough memory for the sage trainer (estimated model with "
                                                     "gradients and Adam state ") + ".*\\): Unable to allocate 1.00 TiB$"):
        NodeTrainer(WholeGraph(g), cfg)
