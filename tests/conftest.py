"""Fixtures several test modules share: trainings whose checkpoints, metrics and logs they read."""
from __future__ import annotations

from pathlib import Path

import pytest

from gnndist.cli import main

LINK_DATA = ["synthetic-temporal", "--num-nodes", "80", "--num-events", "1200"]
LINK = ["train", *LINK_DATA, "--task", "link", "--memory-dim", "16", "--batch-size", "100", "--epochs", "2",
        "--quiet"]
NODE_DATA = ["synthetic-static", "--num-nodes", "400", "--num-edges", "2000"]
NODE = ["train", *NODE_DATA, "--task", "node", "--epochs", "3", "--quiet"]


@pytest.fixture(scope="session")
def trained_runs(tmp_path_factory) -> dict[str, dict[str, Path]]:
    """Trainings with a checkpoint, metrics and TensorBoard logs: link and node, 1 and 2 ranks
    (the 2-rank ones: partitioned memory, a degree cache)."""
    d = tmp_path_factory.mktemp("runs")
    cases = {"link1": LINK, "link2": LINK + ["--nproc", "2", "--memory", "partitioned"],
             "node1": NODE, "node2": NODE + ["--nproc", "2", "--cache", "degree"]}
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GNNDIST_CACHE", str(d / "cache"))
        mp.setenv("GNNDIST_TIMEOUT", "120")
        for name, argv in cases.items():
            paths = {k: d / f"{name}-{k}" for k in ("ckpt", "logs")}
            paths["metrics"] = d / f"{name}.json"
            assert main(argv + ["--checkpoint", str(paths["ckpt"]), "--log-dir", str(paths["logs"]),
                                "--metrics-out", str(paths["metrics"])]) == 0, name
            out[name] = paths
    return out
