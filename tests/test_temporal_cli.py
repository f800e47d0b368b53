"""`gnndist train --task link` end to end: metrics JSON, checkpoints and resume, user errors."""
import json

import pytest
import torch

from gnndist import checkpoint
from gnndist.cli import main

DATA = ["synthetic-temporal", "--num-nodes", "80", "--num-events", "1200", "--memory-dim", "16", "--epochs", "3",
        "--batch-size", "100", "--lr", "0.003", "--quiet"]


def train(tmp_path, name, *extra):
    out = tmp_path / f"{name}.json"
    assert main(["train", *DATA, "--task", "link", "--metrics-out", str(out), *extra]) == 0
    return json.loads(out.read_text())


def test_metrics_json_has_the_documented_keys(tmp_path, capsys):
    m = train(tmp_path, "m", "--model", "tgn", "--epochs", "2", "--neg", "historical")
    assert m["task"] == "link" and m["model"] == "tgn" and m["world_size"] == 1
    assert [e["epoch"] for e in m["epochs"]] == [1, 2]
    for e in m["epochs"]:
        assert {"epoch", "loss", "time_s", "events_per_s", "val_ap", "val_auc", "val_mrr"} <= set(e)
        assert e["events_per_s"] > 0 and 0 <= e["val_ap"] <= 1
    assert {"ap", "auc", "mrr", "inductive_ap", "inductive_auc", "inductive_mrr"} <= set(m["test"])
    assert m["epochs"][1]["loss"] < m["epochs"][0]["loss"]
    table = capsys.readouterr().out
    assert "AP" in table and "MRR" in table and "test" in table


def test_resume_ends_with_the_same_figures(tmp_path):
    full = train(tmp_path, "full", "--model", "dyrep", "--epochs", "2", "--checkpoint", str(tmp_path / "a"))
    train(tmp_path, "half", "--model", "dyrep", "--epochs", "1", "--checkpoint", str(tmp_path / "b"))
    resumed = train(tmp_path, "resumed", "--model", "dyrep", "--epochs", "2", "--checkpoint", str(tmp_path / "b"),
                    "--resume")
    assert resumed["test"] == full["test"]
    def same(e):  # all but times
        return {k: v for k, v in e.items() if not k.endswith("_s") and k != "events_per_s"}
    assert [same(e) for e in resumed["epochs"]] == [same(e) for e in full["epochs"]]
    ckpt = checkpoint.load(tmp_path / "b")  # weights_only load of what the run wrote
    assert ckpt["epoch"] == 2 and set(ckpt["node_state"]) == {"memory", "last_update", "mail", "mail_time"}


def test_resume_refuses_a_different_configuration(tmp_path, capsys):
    train(tmp_path, "a", "--model", "jodie", "--epochs", "1", "--checkpoint", str(tmp_path / "c"))
    rc = main(["train", *DATA, "--model", "tgn", "--epochs", "2", "--checkpoint", str(tmp_path / "c"), "--resume"])
    assert rc == 2 and "model=jodie" in capsys.readouterr().err


def test_checkpoint_rejects_pickled_objects(tmp_path):
    path = tmp_path / "x"
    path.mkdir()
    torch.save({"format": 1, "evil": object()}, path / checkpoint.checkpoint_name(1))
    with pytest.raises(Exception, match="cannot read checkpoint"):
        checkpoint.load(path)


def test_link_task_on_static_data_suggests_node(capsys):
    rc = main(["train", "synthetic-static", "--task", "link", "--num-nodes", "50", "--num-edges", "200", "--quiet"])
    assert rc == 2 and "--task node" in capsys.readouterr().err


def test_demo_trains_and_prints_the_table(capsys):
    assert main(["demo", "--num-nodes", "60", "--num-events", "1000", "--epochs", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "test" in out and "AP" in out
