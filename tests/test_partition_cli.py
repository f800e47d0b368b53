"""`gnndist partition` and `gnndist info`: end to end, JSON keys scripts rely on, one-line errors."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from gnndist.cli import main
from gnndist.datasets import load
from gnndist.partition import load_partition, read_store_meta

DATA = Path(__file__).resolve().parents[2] / "shared" / "datasets"
REQUIRED = {"num_parts", "method", "nodes_per_part", "imbalance", "edge_cut_fraction", "halo_nodes_per_part",
            "replication_factor", "partition_time_s", "peak_memory_bytes"}


def info_json(store: Path, capsys) -> dict:
    capsys.readouterr()
    assert main(["info", str(store), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_partition_temporal_then_info(tmp_path, capsys):
    out = tmp_path / "t"
    argv = ["partition", "synthetic-temporal", "--num-nodes", "200", "--num-events", "3000", "--parts", "3",
            "--out", str(out), "--halo", "1", "--replicate-hubs", "4", "--quiet"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed and "cross-partition events" in printed and "replicated hubs" in printed
    s = info_json(out, capsys)
    assert REQUIRED | {"events_per_part", "cross_partition_event_fraction"} <= set(s)
    assert {"nodes", "events"} <= set(s["imbalance"])
    assert s["num_parts"] == 3 and s["method"] == "temporal" and s["replicated_hubs"] == 4
    assert sum(s["events_per_part"]) == 3000 and sum(s["nodes_per_part"]) == 200
    stored = read_store_meta(out)["stats"]
    assert {k: s[k] for k in stored} == stored  # info prints the figures kept in meta.json
    g = load("synthetic-temporal", num_nodes=200, num_events=3000)
    p = load_partition(out, 2)
    assert np.array_equal(p.t, g.t[p.eid])
    assert main(["info", str(out), "--verify"]) == 0
    assert "verified:" in capsys.readouterr().out


def test_partition_static_balance_train(tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["partition", "synthetic-static", "--num-nodes", "800", "--num-edges", "4000", "--parts", "4",
                 "--balance", "nodes,edges,train", "--imbalance-tol", "1.05", "--out", str(out), "--quiet",
                 "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert REQUIRED | {"edges_per_part"} <= set(s) and "cross_partition_event_fraction" not in s
    assert all(s["imbalance"][k] <= 1.05 + 1e-9 for k in ("nodes", "edges", "train"))
    assert s["params"]["balance"] == ["nodes", "edges", "train"]
    assert info_json(out, capsys) == s


def run(*argv):
    return subprocess.run([sys.executable, "-m", "gnndist", *argv], capture_output=True, text=True, timeout=120)


def test_errors_are_one_line_with_status_2(tmp_path, capsys):
    cases = [
        (["partition", "synthetic-static", "--num-nodes", "100", "--num-edges", "300", "--parts", "2",
          "--method", "temporal", "--out", str(tmp_path / "a")], "needs a temporal graph"),
        (["partition", "synthetic-static", "--num-nodes", "100", "--num-edges", "300", "--parts", "0",
          "--out", str(tmp_path / "a")], "--parts must be between 1"),
        (["partition", "synthetic-static", "--num-nodes", "100", "--num-edges", "300", "--parts", "2",
          "--balance", "nodes,colour", "--out", str(tmp_path / "a")], "unknown --balance key 'colour'"),
        (["info", str(tmp_path)], "is not a partition store"),
    ]
    for argv, msg in cases:
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and msg in err, err
    assert not (tmp_path / "a").exists()


def test_corrupted_store_is_reported_by_info_verify(tmp_path):
    out = tmp_path / "s"
    assert main(["partition", "synthetic-static", "--num-nodes", "100", "--num-edges", "300", "--parts", "2",
                 "--method", "random", "--out", str(out), "--quiet"]) == 0
    f = out / "part0" / "indptr.npy"
    f.write_bytes(f.read_bytes()[:-8])
    p = run("info", str(out), "--verify")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "sha256 mismatch" in p.stderr
