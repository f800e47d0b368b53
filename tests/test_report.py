"""After training: `gnndist plot`, `gnndist info STORE --plot`, `gnndist info DATA`.

Pictures are checked on the metrics JSON the trainers really write (link and node task, one
and two ranks): the PNG's pixel size, and the plotted data against the JSON. Dataset facts
are checked against the counts in ../shared/datasets/README.md, networkx and brute force;
the memory formulas against the arrays the loaders, partition stores and node state hold.
"""
from __future__ import annotations

import importlib.util
import json
import statistics
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from gnndist.cli import main
from gnndist.datasets import load
from gnndist.datasets.describe import (facts, random_cross_fraction, state_row_bytes, static_rank_bytes,
                                       temporal_rank_bytes, time_resolution, training_memory)
from gnndist.graph import TemporalGraph
from gnndist.partition import load_id_maps, load_partition, partition_graph, read_store_meta
from gnndist.partition.stats import graph_bytes
from gnndist.plots import partition_figure, run_figure, size_pixels

DATA = Path(__file__).resolve().parents[2] / "shared" / "datasets"
UCI = DATA / "uci_collegemsg" / "CollegeMsg.txt.gz"
BITCOIN = DATA / "bitcoin_otc" / "soc-sign-bitcoinotc.csv.gz"
needs_matplotlib = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                                      reason="the plot extra: pip install 'gnndist[plot]'")


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk, after checking the signature."""
    b = path.read_bytes()
    assert b[:8] == b"\x89PNG\r\n\x1a\n" and b[12:16] == b"IHDR"
    return struct.unpack(">II", b[16:24])


def one_line_error(argv: list[str], capsys) -> str:
    capsys.readouterr()
    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def runs(trained_runs) -> dict[str, Path]:
    """Metrics files the trainers wrote: link and node task, 1 and 2 ranks."""
    return {name: paths["metrics"] for name, paths in trained_runs.items()}


def panels(fig) -> dict:
    return {ax.get_title(): ax for ax in fig.axes}


def bar_heights(ax) -> list[float]:
    return [p.get_height() for p in ax.patches]


@needs_matplotlib
def test_run_figure_link_two_ranks_plots_the_json(runs, tmp_path, capsys):
    m = json.loads(runs["link2"].read_text())
    ep = m["epochs"]
    fig = run_figure(m, dataset="generated")
    ax = panels(fig)
    assert list(ax) == ["training loss", "validation", "time per epoch (s)", "bytes moved per epoch (MiB)"]
    title = fig.get_suptitle()
    assert title.startswith("generated: tgn, 2 ranks, partitioned memory") and f"test AP {m['test']['ap']:.4f}" in title
    assert list(ax["training loss"].lines[0].get_ydata()) == [e["loss"] for e in ep]
    val = {ln.get_label(): list(ln.get_ydata()) for ln in ax["validation"].lines if ln.get_label().startswith("val ")}
    assert val == {f"val {k}": [e[f"val_{k}"] for e in ep] for k in ("ap", "auc", "mrr")}
    assert any(ln.get_label() == f"selected epoch {m['selected_epoch']}" for ln in ax["validation"].lines)
    # stacked: the bars of each part in TIME_PARTS order, each resting on the ones before
    heights = np.array(bar_heights(ax["time per epoch (s)"])).reshape(4, len(ep))
    assert np.allclose(heights, [[e[k] for e in ep] for k in ("sample_s", "fetch_s", "compute_s", "sync_s")])
    bottoms = np.array([p.get_y() for p in ax["time per epoch (s)"].patches]).reshape(4, len(ep))
    assert np.allclose(bottoms, np.cumsum(heights, axis=0) - heights)
    assert np.allclose(bar_heights(ax["bytes moved per epoch (MiB)"]), [e["bytes"] / 2**20 for e in ep])
    out = tmp_path / "run.png"
    assert main(["plot", str(runs["link2"]), "-o", str(out)]) == 0
    assert png_size(out) == size_pixels(fig) == (960, 760)  # 2 x 2 panels of 4.8 x 3.4 in + 0.8 in title, 100 dpi
    assert out.stat().st_size < 200_000


@needs_matplotlib
def test_run_figure_node_two_ranks_marks_the_selected_epoch_and_cache(runs):
    m = json.loads(runs["node2"].read_text())
    ep, best = m["epochs"], m["test"]["best_epoch"]
    fig = run_figure(m)
    ax = panels(fig)
    assert list(ax) == ["training loss", "validation and training accuracy", "time per epoch (s)",
                        "bytes moved per epoch (MiB)", "cache hit rate per epoch"]
    assert size_pixels(fig) == (1440, 760)  # 3 x 2 panels
    assert "sage, 2 ranks" in fig.get_suptitle()
    for name in ("training loss", "validation and training accuracy"):
        marks = [ln for ln in ax[name].lines if ln.get_label() == f"selected epoch {best}"]
        assert len(marks) == 1 and list(marks[0].get_xdata()) == [best, best]
    star = [ln for ln in ax["validation and training accuracy"].lines if ln.get_marker() == "*"]
    assert [(s.get_xdata()[0], s.get_ydata()[0]) for s in star] == [(best, ep[best - 1]["val_acc"])]
    assert bar_heights(ax["time per epoch (s)"]) == [e["time_s"] for e in ep]
    assert np.allclose(bar_heights(ax["bytes moved per epoch (MiB)"]), [e["remote_bytes"] / 2**20 for e in ep])
    assert list(ax["cache hit rate per epoch"].lines[0].get_ydata()) == [e["cache_hit_rate"] for e in ep]


@needs_matplotlib
def test_run_figure_one_process_has_no_traffic_panels(runs):
    for name, scores in (("link1", "validation"), ("node1", "validation and training accuracy")):
        m = json.loads(runs[name].read_text())
        fig = run_figure(m)
        assert [ax.get_title() for ax in fig.axes] == ["training loss", scores, "time per epoch (s)"], name
        assert size_pixels(fig) == (1440, 420)  # one row of 3
        parts = ("sample_s", "fetch_s", "compute_s", "sync_s") if "sample_s" in m["epochs"][0] else ("time_s",)
        assert bar_heights(panels(fig)["time per epoch (s)"]) == [e[k] for k in parts for e in m["epochs"]]


@needs_matplotlib
def test_a_one_epoch_run_has_one_whole_epoch_tick():
    fig = run_figure({"task": "link", "model": "tgn", "world_size": 1, "epochs": [{"epoch": 1, "loss": 0.5}]})
    fig.canvas.draw()
    ticks = [t for t in fig.axes[0].get_xticks() if fig.axes[0].get_xlim()[0] <= t <= fig.axes[0].get_xlim()[1]]
    assert ticks == [1.0], ticks


@needs_matplotlib
def test_run_figure_tolerates_absent_and_coming_keys():
    """Epochs missing metrics, a recorded selected epoch and stop reason, an edge cache."""
    m = {"task": "link", "model": "jodie", "world_size": 3, "data": "UCI", "selected_epoch": 2,
         "stop_reason": "no validation gain for 2 epochs",
         "epochs": [{"epoch": 1, "loss": 0.9, "val_ap": 0.5, "edge_cache": {"hit_rate": 0.25}, "bytes": 2**20},
                    {"epoch": 2, "loss": 0.7, "val_ap": None, "edge_cache": {"hit_rate": 0.5}},
                    {"epoch": 3, "loss": None, "val_ap": 0.7, "edge_cache": {}, "sync_s": 1.5}]}
    fig = run_figure(m)
    ax = panels(fig)
    assert fig.get_suptitle() == "UCI: jodie, 3 ranks\nstopped: no validation gain for 2 epochs"
    assert np.array_equal(ax["training loss"].lines[0].get_ydata(), [0.9, 0.7, np.nan], equal_nan=True)
    assert np.array_equal(ax["cache hit rate per epoch"].lines[0].get_ydata(), [0.25, 0.5, np.nan], equal_nan=True)
    assert bar_heights(ax["time per epoch (s)"]) == [0, 0, 1.5]  # the only part present
    assert bar_heights(ax["bytes moved per epoch (MiB)"]) == [1, 0, 0]
    assert any(ln.get_label() == "selected epoch 2" for ln in ax["validation"].lines)


@needs_matplotlib
def test_plot_of_seeds_draws_each_run(tmp_path, capsys):
    """`gnndist train --seeds` metrics: each seed's loss and validation curve, its selected
    epoch starred, the summary in the title (the file was refused as holding no epochs)."""
    def run(seed, losses, accs, best):
        return {"task": "node", "model": "gcn", "world_size": 1, "selected_epoch": best,
                "epochs": [{"epoch": e + 1, "loss": lo, "val_acc": a} for e, (lo, a) in enumerate(zip(losses, accs))]}
    m = {"task": "node", "model": "gcn", "seeds": [3, 7], "summary": {"acc": {"mean": 0.75, "std": 0.05}},
         "runs": [run(3, [1.0, 0.5, 0.4], [0.6, 0.8, 0.7], 2), run(7, [0.9, 0.6, 0.3], [0.5, 0.6, 0.9], 3)]}
    src = tmp_path / "seeds.json"
    src.write_text(json.dumps({"gnndist": {"version": "x", "kind": "metrics"}, **m}))
    out = tmp_path / "seeds.png"
    assert main(["plot", str(src), "-o", str(out), "--dataset", "toy"]) == 0
    fig = run_figure(m, dataset="toy")
    assert png_size(out) == size_pixels(fig)
    assert fig.get_suptitle() == "toy: gcn, 1 rank, seeds 3, 7\ntest accuracy 0.7500 ± 0.0500"
    ax = panels(fig)
    assert list(ax) == ["training loss", "validation accuracy (selected epochs starred)"]
    assert {ln.get_label(): list(ln.get_ydata()) for ln in ax["training loss"].lines} == {
        "seed 3": [1.0, 0.5, 0.4], "seed 7": [0.9, 0.6, 0.3]}
    val = ax["validation accuracy (selected epochs starred)"].lines
    assert [list(ln.get_ydata()) for ln in val if ln.get_marker() == "o"] == [[0.6, 0.8, 0.7], [0.5, 0.6, 0.9]]
    assert [(ln.get_xdata()[0], ln.get_ydata()[0]) for ln in val if ln.get_marker() == "*"] == [(2, 0.8), (3, 0.9)]
    for change, message in (({"seeds": [3]}, "holds no runs of --seeds"), ({"runs": []}, "holds no runs of --seeds"),
                            ({"seeds": 5}, "holds no runs of --seeds"),
                            ({"runs": [m["runs"][0], {"model": "gcn"}]}, "(run 2) holds no per-epoch metrics")):
        src.write_text(json.dumps({"gnndist": {"version": "x", "kind": "metrics"}, **m, **change}))
        assert f"{src} {message}" in one_line_error(["plot", str(src), "-o", str(out)], capsys)


@needs_matplotlib
def test_plot_refuses_inputs_and_files_it_did_not_write(runs, tmp_path, capsys):
    src = runs["node1"]
    before = src.read_bytes()
    assert "is the input" in one_line_error(["plot", str(src), "-o", str(src)], capsys)
    assert src.read_bytes() == before
    foreign = tmp_path / "photo.png"  # a valid PNG from elsewhere, then a file that is no PNG
    raw = b"\x00\xff\x00\x00"
    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    chunk = lambda kind, data: (struct.pack(">I", len(data)) + kind + data  # noqa: E731
                                + struct.pack(">I", zlib.crc32(kind + data)))
    for content in (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw))
                    + chunk(b"IEND", b""), b"notes"):
        foreign.write_bytes(content)
        assert "not a PNG that gnndist wrote" in one_line_error(["plot", str(src), "-o", str(foreign)], capsys)
        assert foreign.read_bytes() == content
    assert "it exists and is a folder" in one_line_error(["plot", str(src), "-o", str(tmp_path)], capsys)
    assert "plots are written as PNG: give a .png path" in one_line_error(
        ["plot", str(src), "-o", str(tmp_path / "run.jpg")], capsys)
    assert not (tmp_path / "run.jpg").exists()
    out = tmp_path / "sub" / "run.png"
    assert main(["plot", str(src), "-o", str(out)]) == 0
    first = out.read_bytes()
    assert main(["plot", str(src), "-o", str(out), "--dataset", "other"]) == 0  # its own file: replaced
    assert out.read_bytes() != first and png_size(out) == (1440, 420)


def test_plot_bad_metrics_files_are_one_line_errors(tmp_path, capsys):
    out = tmp_path / "x.png"
    cases = {"missing.json": None, "bad.json": "{", "list.json": "[1, 2]", "none.json": '{"epochs": []}',
             "odd.json": '{"epochs": [1]}'}
    msgs = {"missing.json": "no such file", "bad.json": "not valid JSON", "list.json": "no per-epoch metrics",
            "none.json": "holds no epochs", "odd.json": "no per-epoch metrics"}
    for name, text in cases.items():
        if text is not None:
            (tmp_path / name).write_text(text)
        assert msgs[name] in one_line_error(["plot", str(tmp_path / name), "-o", str(out)], capsys)
    assert not out.exists()


def test_missing_matplotlib_is_a_one_line_error(runs, tmp_path, monkeypatch, capsys):
    for mod in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    out = tmp_path / "x.png"
    err = one_line_error(["plot", str(runs["node1"]), "-o", str(out)], capsys)
    assert "needs matplotlib: pip install 'gnndist[plot]'" in err and not out.exists()


# ------------------------------------------------------------------ info STORE --plot

@needs_matplotlib
@pytest.mark.parametrize("kind", ["temporal", "static"])
def test_partition_figure_shows_the_store_metrics(kind, tmp_path, capsys):
    store, png = tmp_path / "s", tmp_path / "parts.png"
    if kind == "temporal":
        data = ["synthetic-temporal", "--num-nodes", "200", "--num-events", "3000", "--replicate-hubs", "3"]
    else:
        data = ["synthetic-static", "--num-nodes", "400", "--num-edges", "2000", "--balance", "nodes,train"]
    assert main(["partition", *data, "--parts", "3", "--out", str(store), "--quiet"]) == 0
    assert main(["info", str(store), "--plot", str(png)]) == 0
    assert f"wrote {png}" in capsys.readouterr().out
    meta = read_store_meta(store)
    s = meta["stats"]
    fig = partition_figure(meta)
    assert png_size(png) == size_pixels(fig) == (1440, 760) and png.stat().st_size < 200_000
    ax = panels(fig)
    wanted = {"nodes": "nodes_per_part", "halo nodes": "halo_nodes_per_part"}
    wanted.update({"owned events": "events_per_part", "stored events": "stored_events_per_part"} if kind == "temporal"
                  else {"edges (CSR entries)": "edges_per_part", "training nodes": "train_nodes_per_part"})
    for what, key in wanted.items():
        (name,) = [t for t in ax if t.startswith(f"{what} per part")]
        assert bar_heights(ax[name]) == s[key], name
    imb = s["imbalance"]
    assert f"nodes per part (max/mean {imb['nodes']:.3f})" in ax
    title = fig.get_suptitle()
    assert all(f"{k.replace('_', ' ')} {v:.3f}" in title for k, v in imb.items()) and "3 parts" in title
    cross = ax["cross-partition fraction"]
    expect = ([s["cross_partition_event_fraction"], s["cross_partition_event_fraction_with_replicas"],
               s["edge_cut_fraction"]] if kind == "temporal" else [s["edge_cut_fraction"]])
    assert bar_heights(cross) == expect
    assert [ln.get_ydata()[0] for ln in cross.lines] == [1 - 1 / 3]
    meta_file = store / "meta.json"
    before = meta_file.read_bytes()
    one_line_error(["info", str(store), "--plot", str(meta_file)], capsys)
    assert meta_file.read_bytes() == before
    assert "it is inside the input folder" in one_line_error(["info", str(store), "--plot", str(store / "x.png")], capsys)
    assert not (store / "x.png").exists()


# ------------------------------------------------------------------ info DATA

def degree_reference(deg: list[int]) -> dict:
    """The degree statistics `facts` reports, from a plain list with the statistics module."""
    return {"min": min(deg), "median": statistics.median(deg), "mean": pytest.approx(statistics.mean(deg)),
            "max": max(deg), "zero": deg.count(0)}


README_COUNTS = {  # ../shared/datasets/README.md
    "cora": dict(kind="static", num_nodes=2708, num_edges=2 * 5278, node_features=1433, classes=7,
                 split={"train": 140, "val": 500, "test": 1000}),
    "citeseer": dict(kind="static", num_nodes=3327, num_edges=2 * 4552, node_features=3703, classes=6,
                     split={"train": 120, "val": 500, "test": 1000}),
}


@pytest.mark.parametrize("name", sorted(README_COUNTS))
def test_info_static_dataset_matches_the_readme(name, capsys):
    want = README_COUNTS[name]
    capsys.readouterr()
    assert main(["info", str(DATA / name), "--json", "--nproc", "3"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["format"] == "planetoid"
    assert {k: s[k] for k in ("kind", "num_nodes", "num_edges", "node_features", "split")} == \
        {k: want[k] for k in ("kind", "num_nodes", "num_edges", "node_features", "split")}
    assert s["labels"]["values"] == list(range(want["classes"])) and sum(s["labels"]["counts"]) == want["num_nodes"]
    g = load(str(DATA / name))
    deg = [d for _, d in g.to_networkx().in_degree()]  # a CSR row lists the node's in-neighbours
    assert s["degree"] == degree_reference(deg)
    (row,) = s["memory"]["training_per_rank"]
    assert row["world_size"] == 3


def test_info_temporal_datasets_match_the_readme(capsys):
    capsys.readouterr()
    assert main(["info", str(UCI), "--json"]) == 0
    uci = json.loads(capsys.readouterr().out)
    assert (uci["kind"], uci["num_events"], uci["num_nodes"], uci["edge_features"], uci["labels"]) == \
        ("temporal", 59835, 1899, 0, None)
    assert round(uci["time"]["span"] / 86400, 1) == 193.7
    assert main(["info", str(BITCOIN), "--json"]) == 0
    btc = json.loads(capsys.readouterr().out)
    assert (btc["num_events"], btc["num_nodes"], btc["edge_features"]) == (35592, 5881, 1)
    assert len(btc["labels"]["values"]) == 2  # the rating's sign
    for path, s in ((UCI, uci), (BITCOIN, btc)):
        tg = load(str(path))
        times = sorted(set(tg.t.tolist()))
        assert s["time"]["resolution"] == min(b - a for a, b in zip(times, times[1:]))  # brute force
        assert s["split"]["train"] + s["split"]["val"] + s["split"]["test"] == tg.num_events
    text_argv = ["info", str(UCI), "--nproc", "4"]
    assert main(text_argv) == 0
    out = capsys.readouterr().out
    assert "59,835 events" in out and "193.7 days" in out and "partitioned, c = 0.75" in out


def test_temporal_degree_and_time_facts_against_networkx():
    rng = np.random.default_rng(3)
    e = 400
    tg = TemporalGraph(rng.integers(0, 50, e), rng.integers(0, 50, e), np.sort(rng.integers(0, 300, e)) * 0.5,
                       num_nodes=60)
    f = facts(tg)
    deg = [d for _, d in tg.to_networkx().degree()]  # in + out events, a self-loop twice
    assert f["degree"] == degree_reference(deg)
    assert f["degree"]["zero"] >= 10  # nodes 50..59 have no events
    times = sorted(set(tg.t.tolist()))
    assert f["time"] == {"first": times[0], "last": times[-1], "span": times[-1] - times[0],
                         "resolution": min(b - a for a, b in zip(times, times[1:]))}
    assert time_resolution(np.array([5.0, 5.0])) is None


def test_temporal_memory_one_process_equals_what_the_trainer_holds():
    """W = 1: the loaded graph, its T-CSR and the TGN node state, byte for byte."""
    from gnndist.temporal.models import build_model

    tg = load("synthetic-temporal", num_nodes=300, num_events=4000)
    tg.edge_label = np.ones(tg.num_events, dtype=np.int64)
    (row,) = training_memory(tg, 1, memory_dim=16)
    assert row["events"] == graph_bytes(tg)
    assert row["tcsr"] == sum(a.nbytes for a in tg.tcsr())
    state = build_model("tgn", tg.edge_dim, memory_dim=16).new_state(tg.num_nodes)
    assert row["node_state"] == sum(t.nbytes for t in state.state_dict().values())
    assert state_row_bytes(16, tg.edge_dim) * tg.num_nodes == row["node_state"] and row["id_maps"] == 8 * tg.num_nodes


def test_info_estimates_at_the_link_trainers_default_memory_size():
    """`gnndist info` (which loads no trainer code) estimates at the memory size a link run uses by default."""
    from gnndist.datasets.describe import MEMORY_DIM
    from gnndist.temporal.config import LinkConfig

    assert MEMORY_DIM == LinkConfig().memory_dim


def test_temporal_memory_per_rank_equals_a_store_part_on_average(tmp_path):
    """W > 1, c = the store's cross fraction: the mean part holds exactly the estimated events,
    T-CSR entries of its own nodes and state rows; the id maps are two int64 arrays of N."""
    tg = load("synthetic-temporal", num_nodes=400, num_events=6000)
    w = 3
    partition_graph(tg, w, method="temporal", out=tmp_path / "s")
    meta = read_store_meta(tmp_path / "s")
    c = meta["stats"]["cross_partition_event_fraction"]
    est = temporal_rank_bytes(tg.num_nodes, tg.num_events, tg.edge_dim, 0, w, "partitioned", c, 16)
    events, tcsr, rows = [], [], []
    for p in range(w):
        part = load_partition(tmp_path / "s", p)
        events.append(sum(getattr(part, k).nbytes for k in ("eid", "src", "dst", "t", "edge_feat")))
        own = (part.num_local + 1) * 8 + 24 * sum(int(np.count_nonzero((a >= part.start) & (a < part.stop)))
                                                  for a in (part.src, part.dst))
        tcsr.append(own)
        rows.append(part.num_local)
    assert est["events"] == pytest.approx(np.mean(events), rel=1e-12)
    assert est["tcsr"] == pytest.approx(np.mean(tcsr), rel=1e-12)
    assert est["node_state"] == pytest.approx(np.mean(rows) * state_row_bytes(16, tg.edge_dim), rel=1e-12)
    assert est["id_maps"] == sum(a.nbytes for a in load_id_maps(tmp_path / "s"))
    replicated = temporal_rank_bytes(tg.num_nodes, tg.num_events, tg.edge_dim, 0, w, "replicated", c, 16)
    assert replicated["node_state"] == tg.num_nodes * state_row_bytes(16, tg.edge_dim)


def test_random_partition_crosses_about_one_minus_one_over_w():
    """On UCI one seed's fraction spreads by about 0.01 (events repeat on few pairs): the mean
    of 6 seeds is within about 3 standard errors of the expectation."""
    tg = load(str(UCI))
    for w in (2, 4):
        measured = np.mean([partition_graph(tg, w, method="random", seed=s).stats["cross_partition_event_fraction"]
                            for s in range(6)])
        assert abs(measured - random_cross_fraction(w)) < 0.015, (w, measured)


def test_static_memory_per_rank_equals_a_store_part_on_average(tmp_path):
    g = load(str(DATA / "cora"))
    (one,) = training_memory(g, 1)
    assert one["total"] == graph_bytes(g)  # one process holds the whole graph
    w = 4
    partition_graph(g, w, balance=["nodes", "train"], out=tmp_path / "s")
    held = [sum(a.nbytes for a in (p.indptr, p.indices, p.x, p.y, p.train_mask, p.val_mask, p.test_mask,
                                   p.orig_ids))
            for p in (load_partition(tmp_path / "s", i) for i in range(w))]
    (row,) = training_memory(g, w)
    assert row["total"] == pytest.approx(np.mean(held), rel=1e-12)
    assert static_rank_bytes(g.num_nodes, g.num_edges, g.num_features, 8, 3, w) == {k: row[k] for k in
                                                                                    ("csr", "node_data", "total")}


def test_info_errors_are_one_line(tmp_path, capsys):
    store = tmp_path / "s"
    assert main(["partition", "synthetic-static", "--num-nodes", "100", "--num-edges", "300", "--parts", "2",
                 "--out", str(store), "--quiet"]) == 0
    assert "--nproc applies to a dataset" in one_line_error(["info", str(store), "--nproc", "2"], capsys)
    assert "--plot applies to a partition store" in one_line_error(
        ["info", "synthetic-static", "--plot", str(tmp_path / "x.png")], capsys)
    assert not (tmp_path / "x.png").exists()
    assert "no such file" in one_line_error(["info", str(tmp_path / "nothing")], capsys)
    assert "is not a partition store" in one_line_error(["info", str(tmp_path)], capsys)
    for bad in ("0", "x"):
        with pytest.raises(SystemExit) as e:
            main(["info", "synthetic-static", "--nproc", bad])
        assert e.value.code == 2


def test_info_progress_bar_only_on_a_terminal(capsys, monkeypatch):
    argv = ["info", "synthetic-static", "--num-nodes", "200", "--num-edges", "800"]
    capsys.readouterr()
    assert main(argv) == 0
    assert capsys.readouterr().err == ""  # not a terminal: no bar
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(argv) == 0
    assert "3/3" in capsys.readouterr().err
    assert main(argv + ["--quiet"]) == 0
    assert capsys.readouterr().err == ""
