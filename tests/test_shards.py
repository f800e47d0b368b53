"""Shard files: written graphs read back exactly, byte ranges that split a file give each row
once, which rank reads what, and one error line per bad input."""
import gzip
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gnndist.cli import main
from gnndist.datasets import load
from gnndist.datasets.generators import synthetic_static, synthetic_temporal, synthetic_temporal_windows
from gnndist.datasets.shard_writer import ShardWriteConfig, original_ids, write_shards
from gnndist.datasets.shards import (agree_columns, check_node_listings, open_nodes, open_shards, plan_shards,
                                     read_columns, read_graph, read_unit)
from gnndist.errors import GnndistError


def back(ids: np.ndarray, config: ShardWriteConfig, n: int) -> np.ndarray:
    """Node numbers of original ids, by brute force over the n nodes."""
    table = original_ids(np.arange(n), config)
    order = np.argsort(table)
    pos = np.searchsorted(table[order], ids)
    assert np.array_equal(table[order][pos], ids)
    return order[pos]


def rows_of(shards, units) -> dict:
    """Every chunk's columns of `units`, in (shard, piece, row) order."""
    chunks = sorted((c for u in units for c in read_unit(shards, u, chunk_bytes=64)),
                    key=lambda c: (c.shard, c.piece, c.row))
    return {k: np.concatenate([getattr(c, k) for c in chunks]) for k in ("src", "dst", "t")
            if chunks and getattr(chunks[0], k) is not None}


# ---------------------------------------------------------------- whole graphs

@pytest.fixture(scope="module")
def temporal():
    g = synthetic_temporal(num_nodes=150, num_events=2000, edge_dim=3, seed=7)
    g.edge_label = (np.arange(g.num_events) * 7 % 3).astype(np.int64)
    return g


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
@pytest.mark.parametrize("in_order", [True, False])
def test_temporal_shards_give_the_graph_back(temporal, fmt, in_order, tmp_path):
    g = temporal
    config = ShardWriteConfig(num_shards=3, format=fmt, out_of_time_order=not in_order, seed=3, row_group_rows=300)
    shards = write_shards(g, str(tmp_path / "g"), config)
    assert [n for n, _ in shards.files] == [f"part-0000{k}.{fmt}" for k in range(3)]
    h = read_graph(str(tmp_path / "g"))
    src, dst = back(h.orig_ids[h.src], config, g.num_nodes), back(h.orig_ids[h.dst], config, g.num_nodes)
    assert np.array_equal(h.orig_ids, np.unique(original_ids(np.unique(np.concatenate([g.src, g.dst])), config)))
    got = [src, dst, h.t, h.edge_label, *h.edge_feat.T]
    want = [g.src, g.dst, g.t, g.edge_label, *g.edge_feat.T]
    if not in_order:  # rows shuffled: the same events, as a set
        got = [a[np.lexsort(got[::-1])] for a in got]
        want = [a[np.lexsort(want[::-1])] for a in want]
    for a, b in zip(got, want):
        assert np.array_equal(a, b)
    assert h.edge_feat.dtype == np.float32 and h.orig_ids.min() < 0  # shuffled ids span negative integers


def test_events_are_ordered_by_time_shard_and_row(tmp_path):
    events = {"a.csv": "src,dst,t\n1,2,5\n3,4,1\n5,6,5\n", "b.csv": "src,dst,t\n7,8,5\n9,10,0\n",
              "c.csv": "", "d.csv": "src,dst,t\n"}  # empty shards agree with any header
    for name, text in events.items():
        (tmp_path / name).write_text(text)
    g = read_graph(str(tmp_path))
    assert g.orig_ids[g.src].tolist() == [9, 3, 1, 5, 7]  # ties at t=5: shard a before b, rows in order


def test_snap_shards_and_a_glob(tmp_path):
    g = synthetic_temporal(num_nodes=50, num_events=300, edge_dim=1, seed=1)
    g.edge_feat = None
    config = ShardWriteConfig(num_shards=4, format="snap", shuffle_ids=False)
    write_shards(g, str(tmp_path / "g"), config)
    h = read_graph(str(tmp_path / "g" / "events" / "part-0000[12].txt"))  # shards 1 and 2 only
    assert np.array_equal(h.orig_ids[h.src], g.src[75:225]) and np.array_equal(h.t, g.t[75:225])


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_static_shards_give_the_graph_back(fmt, tmp_path):
    g = synthetic_static(num_nodes=300, num_edges=1200, num_features=5, num_classes=3, seed=2)
    config = ShardWriteConfig(num_shards=3, format=fmt, seed=5)
    write_shards(g, str(tmp_path / "s"), config)
    h = load(str(tmp_path / "s"))  # as every loader is reached
    assert h.num_nodes == g.num_nodes and h.num_edges == g.num_edges
    node = back(h.orig_ids, config, g.num_nodes)  # node[i]: the original node of node i
    src, dst = h.edges()
    assert set(zip(node[src].tolist(), node[dst].tolist())) == set(zip(*(a.tolist() for a in g.edges())))
    for name in ("x", "y", "train_mask", "val_mask", "test_mask"):
        assert np.array_equal(getattr(h, name), getattr(g, name)[node])
    nodes = open_nodes(open_shards(str(tmp_path / "s")))
    assert isinstance(nodes.arrays["x"], np.memmap) and isinstance(nodes.ids, np.memmap)


def test_the_streamed_generator_is_the_generator(tmp_path):
    g = synthetic_temporal(num_nodes=200, num_events=3000, edge_dim=2, seed=9)
    (one,) = synthetic_temporal_windows(200, 3000, 2, 9, windows=1)
    assert all(np.array_equal(a, b) for a, b in zip(one, (g.src, g.dst, g.t, g.edge_feat))) and one[4] is None
    windows = list(synthetic_temporal_windows(200, 3000, 2, 9, windows=5))
    t = np.concatenate([w[2] for w in windows])
    assert t.size == 3000 and np.all(np.diff(t) >= 0)
    assert main(["datasets", "synthetic-temporal", "--num-nodes", "200", "--num-events", "3000", "--edge-dim", "2",
                 "--data-seed", "9", "--write-shards", str(tmp_path / "w"), "--shards", "5"]) == 0
    h = read_graph(str(tmp_path / "w"))
    assert np.array_equal(h.t, t) and np.array_equal(h.edge_feat, np.concatenate([w[3] for w in windows]))
    assert len(open_shards(str(tmp_path / "w")).files) == 5


def test_session_labels_are_states_of_sources_deep_in_a_session(tmp_path):
    """`--session-labels N` labels an event 1 from the Nth event of its source's session on: such
    an event's source sent at least N - 1 events before it (brute force over the events); the
    events themselves are those without labels; the streamed generator and its shard files
    carry the same labels."""
    plain = synthetic_temporal(num_nodes=300, num_events=4000, edge_dim=2, seed=3)
    assert plain.edge_label is None
    for n in (1, 2, 4):
        g = synthetic_temporal(num_nodes=300, num_events=4000, edge_dim=2, seed=3, session_labels=n)
        assert all(np.array_equal(getattr(g, k), getattr(plain, k)) for k in ("src", "dst", "t", "edge_feat"))
        sent_before = np.zeros(g.num_events, np.int64)
        seen: dict[int, int] = {}
        for i, s in enumerate(g.src.tolist()):
            sent_before[i] = seen.get(s, 0)
            seen[s] = sent_before[i] + 1
        labelled = g.edge_label == 1
        assert np.all(sent_before[labelled] >= n - 1)
        assert labelled.all() if n == 1 else 0.2 < labelled.mean() < 0.9
    (one,) = synthetic_temporal_windows(300, 4000, 2, 3, windows=1, session_labels=4)
    assert np.array_equal(one[4], g.edge_label)
    windows = list(synthetic_temporal_windows(300, 4000, 2, 3, windows=4, session_labels=4))
    assert main(["datasets", "synthetic-temporal", "--num-nodes", "300", "--num-events", "4000", "--edge-dim", "2",
                 "--data-seed", "3", "--session-labels", "4", "--write-shards", str(tmp_path / "w"),
                 "--shards", "4"]) == 0
    assert np.array_equal(read_graph(str(tmp_path / "w")).edge_label, np.concatenate([w[4] for w in windows]))
    with pytest.raises(GnndistError, match=r"^session_labels \(--session-labels\) must be an integer >= 0"):
        synthetic_temporal(session_labels=-1)


# ---------------------------------------------------------------- byte ranges

LINES = ["# a comment", "src,dst,t", "1,2,0.5", "", "3,4,1.5  # note", "  5 , 6 , 2.5", "# another",
         "7,8,3.5", "9,10,4.5"]


def expected_rows(lines):
    return [(int(r[0]), int(r[1]), float(r[2])) for r in
            (ln.split("#")[0].split(",") for ln in lines[2:]) if len(r) == 3]


@pytest.mark.parametrize("newline,final", [("\n", True), ("\n", False), ("\r\n", True), ("\r\n", False)])
def test_every_cut_of_a_file_gives_each_row_once(tmp_path, newline, final):
    path = tmp_path / "e.csv"
    path.write_bytes((newline.join(LINES) + (newline if final else "")).encode())
    shards = open_shards(str(path))
    name, size = shards.files[0]
    want = expected_rows(LINES)
    for readers in (1, 2, 3):
        plan = plan_shards([shards.files] * readers)
        got = rows_of(shards, [u for units in plan.units for u in units])
        assert list(zip(got["src"].tolist(), got["dst"].tolist(), got["t"].tolist())) == want
    for cut in range(size + 1):  # every byte as the boundary of two ranges, mid-line ones included
        first = plan_shards([shards.files] * 2).units[0][0]
        units = [first.__class__(0, name, 0, 0, cut), first.__class__(0, name, 1, cut, size)]
        got = rows_of(shards, units)
        assert got["src"].tolist() == [r[0] for r in want], cut


def test_parquet_row_groups_are_read_once_over_three_readers(tmp_path):
    n = 1000
    pq.write_table(pa.table({"src": np.arange(n), "dst": np.arange(n) + 1, "t": np.arange(n, dtype=float)}),
                   tmp_path / "e.parquet", row_group_size=70)
    shards = open_shards(str(tmp_path / "e.parquet"))
    plan = plan_shards([shards.files] * 3)
    per_rank = [rows_of(shards, units).get("src", np.empty(0, int)) for units in plan.units]
    assert all(r.size for r in per_rank)
    assert np.array_equal(np.sort(np.concatenate(per_rank)), np.arange(n))
    md = pq.ParquetFile(tmp_path / "e.parquet").metadata
    chunks = [md.row_group(i).column(0) for i in range(md.num_row_groups)]
    starts = [c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset for c in chunks]
    unit = plan.units[0][0]
    for cut in {c + d for c in starts for d in (0, 1)}:  # cuts at and just after where each group starts
        units = [unit.__class__(0, unit.name, 0, 0, cut), unit.__class__(0, unit.name, 1, cut, shards.files[0][1])]
        assert np.array_equal(rows_of(shards, units)["src"], np.arange(n)), cut


# ---------------------------------------------------------------- who reads what

def test_identical_listings_mean_a_shared_file_system():
    files = [(f"p{k}.csv", 100 + k) for k in range(7)]
    plan = plan_shards([list(reversed(files))] * 3)
    assert plan.shared and [n for n, _ in plan.shards] == [n for n, _ in files]
    for r in range(3):
        assert [(u.shard, u.name, u.start, u.stop) for u in plan.units[r]] == [
            (k, files[k][0], 0, files[k][1]) for k in range(r, 7, 3)]


def test_each_host_reads_its_own_files_once():
    a = [("a.csv", 10), ("c.csv", 30), ("e.csv", 50)]
    b = [("b.csv", 20), ("c.csv", 30), ("d.csv", 40)]
    plan = plan_shards([a, a, b, b])  # ranks 0, 1 on one host, 2, 3 on the other; c.csv on both
    assert not plan.shared and [n for n, _ in plan.shards] == ["a.csv", "b.csv", "c.csv", "d.csv", "e.csv"]
    read = {r: [(u.shard, u.name) for u in units] for r, units in enumerate(plan.units)}
    assert read == {0: [(0, "a.csv"), (4, "e.csv")], 1: [(2, "c.csv")], 2: [(1, "b.csv")], 3: [(3, "d.csv")]}


def test_fewer_files_than_ranks_are_split_but_gzip():
    plan = plan_shards([[("big.txt", 1000), ("z.txt.gz", 99)]] * 3)
    ranges = [[(u.name, u.piece, u.start, u.stop) for u in units] for units in plan.units]
    assert ranges == [[("big.txt", 0, 0, 333), ("z.txt.gz", 0, 0, 99)], [("big.txt", 1, 333, 666)],
                      [("big.txt", 2, 666, 1000)]]


def test_a_file_listed_with_two_sizes_or_none_at_all_is_refused():
    with pytest.raises(GnndistError, match=r"^c\.csv: 30 bytes on rank 0's host but 31 bytes on rank 2's"):
        plan_shards([[("c.csv", 30)], [("c.csv", 30)], [("c.csv", 31)]])
    with pytest.raises(GnndistError, match="no shard files on any host"):
        plan_shards([[], []])
    check_node_listings([(("ids.npy", 80),)] * 2)
    with pytest.raises(GnndistError, match=r"nodes/x\.npy: none on rank 0's host, 96 bytes on rank 1's"):
        check_node_listings([(("ids.npy", 80),), (("ids.npy", 80), ("x.npy", 96))])


# ---------------------------------------------------------------- bad input

def write_events(folder, bad: str, shard: int = 3, header: str = "src,dst,t,label"):
    os.makedirs(folder, exist_ok=True)
    for k in range(4):
        rows = [f"{k * 10 + i},{i},{i}.5,1" for i in range(5)]
        if k == shard:
            rows[3] = bad
        with open(os.path.join(folder, f"part-{k}.csv"), "w") as f:
            f.write("\n".join([header if k == shard else "src,dst,t,label", *rows]) + "\n")
    return os.path.join(folder, f"part-{shard}.csv")


@pytest.mark.parametrize("bad,expect", [
    ("1,2,3", "expected 4 fields, got 3"),
    ("1,2,3,4,5", "expected 4 fields, got 5"),
    ("1,x,3,0", "field 2 is not a number: 'x'"),
    ("1,2,nan,0", "t is nan"),
    ("1,2,-inf,0", "t is -inf"),
    ("1.5,2,3,0", "node id 1.5 is not an integer"),
    ("1,2,3,-1", "label -1 is negative"),
])
def test_a_bad_row_is_one_line_naming_file_and_line(tmp_path, bad, expect):
    path = write_events(str(tmp_path / "d"), bad)
    with pytest.raises(GnndistError) as e:
        read_graph(str(tmp_path / "d"))
    assert str(e.value) == f"{path}:5: {expect}"
    shards = open_shards(str(tmp_path / "d"))
    with pytest.raises(GnndistError, match=f"^{path}:5: "):  # a range that starts past the bad line's start
        for units in plan_shards([shards.files[3:]] * 2).units:
            for u in units:
                list(read_unit(shards, u, chunk_bytes=16))


def test_a_bad_time_in_parquet_names_the_row(tmp_path):
    pq.write_table(pa.table({"src": [1, 2, 3], "dst": [2, 3, 4], "t": [0.0, np.inf, 1.0]}), tmp_path / "e.parquet")
    with pytest.raises(GnndistError, match=r"e\.parquet: row 2: t is inf$"):
        read_graph(str(tmp_path / "e.parquet"))
    pq.write_table(pa.table({"src": [1.0], "dst": [2], "t": [0.0]}), tmp_path / "f.parquet")
    with pytest.raises(GnndistError, match=r"f\.parquet: column src holds double, expected integers"):
        read_graph(str(tmp_path / "f.parquet"))


def test_a_header_that_differs_names_both_files(tmp_path):
    path = write_events(str(tmp_path / "d"), "1,2,3,0", header="src,dst,time,label")
    shards = open_shards(str(tmp_path / "d"))
    with pytest.raises(GnndistError) as e:
        read_graph(str(tmp_path / "d"))
    assert str(e.value) == (f"{path}: header 'src,dst,time,label' differs from {shards.path('part-0.csv')}'s "
                            f"'src,dst,t,label' (the shard files of one graph have the same columns)")
    found = [(n, read_columns(shards, n)) for n, _ in shards.files]
    with pytest.raises(GnndistError, match="^part-3.csv: header"):
        agree_columns(found)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(GnndistError, match=r"nope: no such file"):
        open_shards(str(tmp_path / "nope"))
    write_events(str(tmp_path / "d"), "1,2,3,0")
    shards = open_shards(str(tmp_path / "d"))
    os.remove(shards.path("part-2.csv"))  # gone between listing and reading
    unit = plan_shards([shards.files]).units[0][2]
    with pytest.raises(GnndistError, match=r"part-2\.csv: no such file$"):
        list(read_unit(shards, unit))


def test_tidied_blocks_gzip_and_float_ids_read_as_plain_ones(tmp_path):
    plain = "1 2 0.5\n3 4 1.5\n5 6 2.5\n"
    odd = "# SNAP header\n1\t2  0.5\n 3 4 1.5 \n\n5.0 6 2.5 # last\n"
    (tmp_path / "plain.txt").write_text(plain)
    (tmp_path / "tabs.tsv").write_text(plain.replace(" ", "\t"))
    with gzip.open(tmp_path / "odd.txt.gz", "wt") as f:
        f.write(odd)
    a = read_graph(str(tmp_path / "plain.txt"))
    for other in ("tabs.tsv", "odd.txt.gz"):
        b = read_graph(str(tmp_path / other))
        assert np.array_equal(a.orig_ids[a.src], b.orig_ids[b.src]) and np.array_equal(a.t, b.t)


def test_writing_into_a_folder_that_holds_something_is_refused(tmp_path, capsys):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "keep.txt").write_text("mine")
    assert main(["datasets", "synthetic-temporal", "--num-events", "100", "--write-shards", str(tmp_path / "d")]) == 2
    assert capsys.readouterr().err.strip().endswith("exists and is not an empty folder (shards are written into a "
                                                    "new folder)")
    assert os.listdir(tmp_path / "d") == ["keep.txt"] and os.listdir(tmp_path) == ["d"]


def test_a_process_that_reads_shards_and_imported_torch_exits_cleanly(tmp_path):
    """Python bytes handed to pyarrow's threaded CSV reader made such a process abort at exit now
    and then ("terminate called without an active exception"): three runs at once, all clean."""
    (tmp_path / "e.txt").write_text("".join(f"{i} {i + 1} {i}.5\n" for i in range(20000)) + "# end\n")
    code = ("import torch, sys; from gnndist.datasets.shards import read_graph; "
            "print(read_graph(sys.argv[1]).num_events)")
    runs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "e.txt")], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(3)]
    for p in runs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and out.strip() == "20000", err
