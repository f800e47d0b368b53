"""`gnndist partition` and `gnndist info`: end to end, JSON keys scripts rely on, one-line errors."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gnndist.cli import main
from gnndist.errors import GnndistError
from gnndist.datasets import load
from gnndist.partition import load_partition, read_store_meta
from gnndist.partition.store import meta_checksum

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
    assert {k: s[k] for k in stored} == stored  # info prints the metrics kept in meta.json
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
    info = info_json(out, capsys)
    assert info.pop("parts_here") == [0, 1, 2, 3] and info == s


def test_a_partition_over_the_tolerance_says_so(tmp_path, capsys):
    """METIS aims for --imbalance-tol and may miss it (Cora in 7 parts, three weights: whole
    training nodes cannot split 140 into parts within 1.03 of 20 each): a note names each
    balanced weight above it, none where all are within."""
    cora = str(DATA / "cora")
    assert main(["partition", cora, "--parts", "7", "--balance", "nodes,edges,train", "--out", str(tmp_path / "a"),
                 "--json"]) == 0
    captured = capsys.readouterr()
    s = json.loads(captured.out)
    over = {k: v for k, v in s["imbalance"].items() if v > 1.03}
    assert over and set(over) <= {"nodes", "edges", "train"}
    assert captured.err.splitlines()[-1] == (
        f"note: METIS left {', '.join(f'{k} at {v:.3f}' for k, v in over.items())} over --imbalance-tol 1.03 (it "
        f"aims for the tolerance and does not always meet it; fewer parts or a looser tolerance help)")
    assert main(["partition", cora, "--parts", "7", "--balance", "nodes,edges,train", "--imbalance-tol", "1.2",
                 "--out", str(tmp_path / "b"), "--json"]) == 0
    assert "note:" not in capsys.readouterr().err


def test_info_says_which_parts_a_host_folder_holds(tmp_path, capsys):
    """A host's copy with only its own part (what a multi-host run needs) is described, not
    refused; the parts it lacks are named."""
    out = tmp_path / "s"
    assert main(["partition", "synthetic-static", "--num-nodes", "300", "--num-edges", "1500", "--parts", "3",
                 "--out", str(out), "--quiet"]) == 0
    for absent in ("part0", "part2"):
        for f in (out / absent).iterdir():
            f.unlink()
        (out / absent).rmdir()
    assert info_json(out, capsys)["parts_here"] == [1]
    assert main(["info", str(out)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("this folder holds part 1 of 3 (absent: 0, 2)")
    assert main(["info", str(out), "--verify"]) == 2  # --verify checks every file, so it refuses


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
    if importlib.util.find_spec("matplotlib") is not None:  # a failed check draws no plot
        assert run("info", str(out), "--verify", "--plot", str(tmp_path / "p.png")).returncode == 2
        assert not (tmp_path / "p.png").exists()


def write_events(path: Path, n: int = 40, e: int = 300, skew: float = 1.0) -> None:
    """A small temporal edge list (src dst t per line); `skew` > 1 gives low ids more events."""
    rng = np.random.default_rng(1)
    src = (n * rng.random(e) ** skew).astype(np.int64)
    rows = np.stack([src, rng.integers(0, n, e), np.arange(e) * 10], axis=1)
    path.write_text("".join(f"{a} {b} {t}\n" for a, b, t in rows.tolist()))


def assert_one_line_error(argv, msg, capsys) -> str:
    capsys.readouterr()
    assert main(argv) == 2, argv
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and msg in err, (argv, err)
    return err


def test_replacing_a_store_never_deletes_other_files(tmp_path, capsys):
    own = tmp_path / "own"
    data = tmp_path / "data.txt"
    write_events(data)
    argv = ["partition", str(data), "--parts", "2", "--quiet", "--out", str(own)]
    assert main(argv) == 0
    before = {f: f.read_bytes() for f in own.rglob("*") if f.is_file()}
    (own / "data.txt").write_bytes(data.read_bytes())
    (own / "NOTES.md").write_text("mine")
    for out, msg in ((own, "contains the input"), (own / "data.txt", "is the input")):  # --out holds, or is, it
        assert_one_line_error(["partition", str(own / "data.txt"), "--parts", "2", "--out", str(out)], msg, capsys)
    assert_one_line_error(argv, "holds NOTES.md, which the store did not write", capsys)
    (own / "NOTES.md").unlink()
    (own / "part1" / "extra.npy").write_bytes(b"x")
    assert_one_line_error(argv, "holds data.txt, which", capsys)  # the first foreign file, sorted
    (own / "data.txt").unlink()
    assert_one_line_error(argv, "holds part1/extra.npy, which", capsys)
    assert (own / "part1" / "extra.npy").read_bytes() == b"x"
    assert {f: f.read_bytes() for f in own.rglob("*") if f.is_file() and f.name != "extra.npy"} == before
    (own / "part1" / "extra.npy").unlink()
    (own / "meta.json").write_text("{}")
    assert_one_line_error(argv, "meta.json is unreadable", capsys)
    (own / "meta.json").unlink()
    assert_one_line_error(argv, "is not a partition store", capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.txt", "own"]  # no temp folders left
    for f in [*own.rglob("*")][::-1]:
        f.rmdir() if f.is_dir() else f.unlink()
    assert main(argv) == 0 and read_store_meta(own)["num_parts"] == 2  # an empty folder is fine


BAD_META = [
    (lambda m: m.pop("stats"), "missing key stats"),
    (lambda m: m.pop("params"), "missing key params"),
    (lambda m: m.pop("kind"), "kind must be"),
    (lambda m: m.pop("num_parts"), "num_parts must be"),
    (lambda m: m.pop("files"), "missing key files"),
    (lambda m: m["stats"].pop("nodes_per_part"), "missing key stats.nodes_per_part"),
    (lambda m: m.pop("node_offsets"), "missing key node_offsets"),
    (lambda m: m.update(stats=None), "bad stats: None"),
    (lambda m: m.update(num_parts="two"), "num_parts must be"),
    (lambda m: m.update(num_parts=3), "bad node_offsets"),
    (lambda m: m.update(files=[1, 2]), "bad files"),
    (lambda m: m["stats"].update(nodes_per_part=m["stats"]["nodes_per_part"][:1]), "bad stats.nodes_per_part"),
    (lambda m: m["stats"].update(nodes_per_part=m["stats"]["nodes_per_part"][::-1]), "disagrees with node_offsets"),
    (lambda m: m.update(node_offsets=[0, 500, 100]), "do not split num_nodes"),
    (lambda m: m["files"].pop("orig_to_new.npy"), "files does not list orig_to_new.npy"),
    (lambda m: m["stats"].update(imbalance=[1.0]), "bad stats.imbalance"),
    (lambda m: m.update(method="fancy"), "bad method: 'fancy'"),
    (lambda m: m["params"].update(halo=2), "bad params"),
    (lambda m: m.pop("arrays"), "missing key arrays"),
    (lambda m: m["arrays"].pop("indptr"), "arrays lacks indptr"),
    (lambda m: m["arrays"].update(src={"dtype": "<i8", "shape": []}), "arrays lists 'src', which a static store"),
    (lambda m: m["arrays"].update(indices={"dtype": "<f8", "shape": []}), "arrays.indices has dtype '<f8'"),
    (lambda m: m["arrays"]["x"].update(shape=[]), "arrays.x has 1 dimensions, expected 2"),
    (lambda m: m["arrays"].update(halo_ids={"dtype": "<i8", "shape": []}), "arrays lists halo_ids (params.halo = 0)"),
    (lambda m: m["files"].update({"part0/../../x.npy": "0" * 64}), "files lists 'part0/../../x.npy', which is not"),
    (lambda m: m["files"].update({"part1/x.npy": m["files"].pop("part0/x.npy")}), "files does not list part0/x.npy"),
    (lambda m: m["files"].update({"part2/x.npy": "0" * 64}), "files lists 'part2/x.npy'"),
    (lambda m: m["files"].update({"part0/x.npy": "abc"}), "files.part0/x.npy is not a sha256"),
    (lambda m: m.update(num_edges=m["num_edges"] + 2), "edges_per_part sums to"),
    (lambda m: m.update(replicated_hubs=[3]), "replicated_hubs [3] are not ascending node ids of a temporal graph"),
]


def stamp(meta: dict) -> dict:
    """`meta` with its checksum recomputed, as a hand-edit that also fixed the checksum would leave it."""
    meta["meta_sha256"] = meta_checksum(meta)
    return meta


def test_malformed_meta_json_is_one_line_error(tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["partition", "synthetic-static", "--num-nodes", "100", "--num-edges", "300", "--parts", "2",
                 "--method", "random", "--out", str(out), "--quiet"]) == 0
    good = read_store_meta(out)
    assert good["stats"]["nodes_per_part"][0] != good["stats"]["nodes_per_part"][1]  # the reversal is a change
    for spoil, msg in BAD_META:
        meta = json.loads(json.dumps(good))
        spoil(meta)
        (out / "meta.json").write_text(json.dumps(meta))  # the old checksum no longer matches
        assert_one_line_error(["info", str(out), "--verify"], "does not match its checksum (meta_sha256)", capsys)
        (out / "meta.json").write_text(json.dumps(stamp(meta)))
        for flags in ([], ["--json"], ["--verify"]):
            err = assert_one_line_error(["info", str(out), *flags], f"{out / 'meta.json'}: malformed (", capsys)
            assert msg in err and "rewrite the store with `gnndist partition`" in err, err
        with pytest.raises(GnndistError, match="rewrite the store with `gnndist partition`"):
            load_partition(out, 0)


def test_bad_flag_values_are_one_line_errors(tmp_path, capsys):
    base = ["partition", "synthetic-temporal", "--num-nodes", "60", "--num-events", "400", "--parts", "2",
            "--out", str(tmp_path / "a")]
    cases = [
        (["--seed", "-1", "--method", "random"], "--seed must be an integer from 0 to 4294967295"),
        (["--seed", str(2**32)], "--seed must be"),
        (["--imbalance-tol", "inf"], "--imbalance-tol must be from 1.001 to 10"),
        (["--imbalance-tol", "1e30"], "--imbalance-tol must be"),
        (["--imbalance-tol", "nan", "--method", "random"], "--imbalance-tol applies to --method metis and temporal"),
        (["--recency", "nan"], "--recency must be a finite number >= 0"),
        (["--recency", "inf"], "--recency must be"),
        (["--time-windows", "1000000000"], "--time-windows must be from 1 to 20 (at most 64, and each window needs "
                                           "10 events per part: 400 events, 2 parts), got 1000000000"),
        (["--time-windows", "21", "--method", "random"], "--time-windows must be from 1 to 20"),
        (["--time-windows", "0"], "--time-windows must be"),
    ]
    for extra, msg in cases:
        assert_one_line_error(base + extra, msg, capsys)
    assert not (tmp_path / "a").exists()
    assert main(base + ["--time-windows", "20", "--seed", str(2**32 - 1), "--imbalance-tol", "10", "--quiet"]) == 0


def test_too_many_parts_refused_and_json_stays_clean(tmp_path, capfd):
    data = tmp_path / "g.txt"
    write_events(data, n=120, e=400, skew=3.0)  # node 0 owns a fifth of the events
    owners = np.unique(np.loadtxt(data, dtype=np.int64)[:, 0]).size
    argv = ["partition", str(data), "--out", str(tmp_path / "o"), "--json", "--quiet", "--time-windows", "1",
            "--parts"]
    assert main(argv + [str(owners + 1)]) == 2
    out, err = capfd.readouterr()
    assert out == "" and f"at most the {owners} nodes that own events" in err
    assert main(argv + ["20"]) == 2
    out, err = capfd.readouterr()
    assert out == "" and "without nodes" in err and len(err.strip().splitlines()) == 1
    assert main(argv + ["4"]) == 0
    s = json.loads(capfd.readouterr().out)
    assert min(s["nodes_per_part"]) > 0 and min(s["events_per_part"]) > 0
