"""`torchrun ... -m gnndist train` joins the world torchrun describes: on raw data rank 0
partitions once (the others wait and take its store), and the run ends with the metrics of the
same training started by `--nproc`. (Node classification under torchrun is in
tests/test_multihost.py: one rank per host, on a store and on raw data.)"""
import json
import os
import subprocess
import sys

import pytest

from gnndist.cli import main

LINK = ["synthetic-temporal", "--num-nodes", "60", "--num-events", "900", "--task", "link", "--model", "tgn",
        "--memory-dim", "8", "--batch-size", "100", "--memory", "partitioned"]


def test_torchrun_equals_nproc(tmp_path, monkeypatch):
    env = {**os.environ, "GNNDIST_CACHE": str(tmp_path / "torchrun-cache"), "GNNDIST_TIMEOUT": "60",
           "OMP_NUM_THREADS": "1"}
    argv = [*LINK, "--epochs", "1", "--quiet"]
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        "-m", "gnndist", "train", *argv, "--metrics-out", str(tmp_path / "torchrun.json"),
                        "--checkpoint", str(tmp_path / "ck")],
                       env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stderr.count("partitioning") == 1, p.stderr  # rank 0 alone, and said where
    stores = list((tmp_path / "torchrun-cache" / "partitions").iterdir())
    assert len(stores) == 1 and (stores[0] / "meta.json").is_file()

    monkeypatch.setenv("GNNDIST_CACHE", str(tmp_path / "nproc-cache"))
    monkeypatch.setenv("GNNDIST_TIMEOUT", "60")
    assert main(["train", *argv, "--nproc", "2", "--metrics-out", str(tmp_path / "nproc.json")]) == 0
    got, want = (json.loads((tmp_path / f).read_text()) for f in ("torchrun.json", "nproc.json"))
    assert got["world_size"] == want["world_size"] == 2
    assert got["test"] == pytest.approx(want["test"], abs=1e-6)
    assert got["epochs"][0]["loss"] == pytest.approx(want["epochs"][0]["loss"], abs=1e-6)

    # predict under torchrun from the per-rank checkpoint (each rank's history has its own
    # timings: the same model): the test metrics of training, written by rank 0 alone
    store = str(stores[0])
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        "-m", "gnndist", "predict", str(tmp_path / "ck"), store, "--split", "test", "-o",
                        str(tmp_path / "t.json"), "--quiet"], env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.count("wrote ") == 1, p.stdout
    assert json.loads((tmp_path / "t.json").read_text())["test"] == pytest.approx(got["test"], abs=1e-9)
