"""`gnndist train --task node` end to end: metrics JSON, partitioning on demand, user errors."""
import json

import pytest

from gnndist.cli import main

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

    # the store is a valid DATA argument of its own; the same run again gives the same figures
    out = tmp_path / "again.json"
    assert main(["train", str(stores[0]), "--task", "node", "--epochs", "3", "--quiet", "--nproc", "2",
                 "--cache", "degree", "--cache-size", "0.2", "--metrics-out", str(out)]) == 0
    again = json.loads(out.read_text())
    assert [e["loss"] for e in again["epochs"]] == [e["loss"] for e in two["epochs"]]
    assert again["test"] == two["test"]

    # a store of 2 parts cannot run on 1 rank
    assert main(["train", str(stores[0]), "--task", "node", "--quiet"]) == 2
    assert "has 2 parts but 1 rank(s) run; use --nproc 2" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["synthetic-temporal", "--num-events", "200", "--task", "node"], "DATA is a temporal graph"),
    ([*DATA, "--task", "node", "--model", "tgn"], "--task node supports --model sage|gcn|gat"),
    ([*DATA, "--task", "node", "--fanouts", "5,5", "--eval-fanouts", "-1"], "--eval-fanouts needs 2 values"),
    ([*DATA, "--task", "node", "--model", "gat", "--hidden", "30"], "must be a multiple of heads 8"),
])
def test_user_errors_are_one_line(capsys, argv, message):
    assert main(["train", *argv, "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
