"""Dataset loaders, generators, splits and `gnndist datasets`, checked against independent readers."""
import argparse
import csv
import gzip
import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gnndist.datasets.text as text
from gnndist.cli import main
from gnndist.cli.datasets_cli import add_data_args, source_from_args
from gnndist.datasets import (FORMATS, GENERATORS, chronological_split, load,
                              new_nodes_after)
from gnndist.datasets.generators import synthetic_static, synthetic_temporal
from gnndist.datasets.registry import data_kind
from gnndist.errors import GnndistError
from gnndist.graph import Graph, TemporalGraph

DATA = Path(__file__).resolve().parents[2] / "shared" / "datasets"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="shared datasets not present")


def undirected_pairs(g: Graph) -> set:
    src, dst = g.edges()
    return set(zip(np.minimum(src, dst).tolist(), np.maximum(src, dst).tolist()))


def assert_symmetric_simple(g: Graph) -> None:
    src, dst = g.edges()
    pairs = list(zip(src.tolist(), dst.tolist()))
    assert len(set(pairs)) == len(pairs), "duplicate edges"
    assert set(pairs) == set(zip(dst.tolist(), src.tolist())), "not symmetric"


# ---------------------------------------------------------------- real files

@needs_data
@pytest.mark.parametrize("name,nodes,edges,feats,classes,split", [
    ("cora", 2708, 10556, 1433, 7, (140, 500, 1000)),
    ("citeseer", 3327, 9104, 3703, 6, (120, 500, 1000)),
])
def test_planetoid_counts_split_and_pyg_agreement(name, nodes, edges, feats, classes, split):
    g = load(str(DATA / name))
    assert (g.num_nodes, g.num_edges, g.num_features, g.num_classes) == (nodes, edges, feats, classes)
    assert tuple(int(getattr(g, m).sum()) for m in ("train_mask", "val_mask", "test_mask")) == split
    assert np.array_equal(np.flatnonzero(g.train_mask), np.arange(split[0]))
    assert np.array_equal(np.flatnonzero(g.val_mask), np.arange(split[0], split[0] + 500))
    test_index = np.loadtxt(DATA / name / f"ind.{name}.test.index", dtype=np.int64)
    assert np.array_equal(np.flatnonzero(g.test_mask), np.sort(test_index))
    # the same dataset through one of its files
    assert np.array_equal(load(str(DATA / name / f"ind.{name}.graph")).indices, g.indices)
    pytest.importorskip("scipy")  # PyG's reader unpickles scipy matrices
    from torch_geometric.io.planetoid import read_planetoid_data
    ref = read_planetoid_data(str(DATA / name), name)
    ref_edges = set(map(tuple, ref.edge_index.t().tolist()))
    src, dst = g.edges()
    assert set(zip(src.tolist(), dst.tolist())) == ref_edges and len(ref_edges) == g.num_edges
    assert np.array_equal(ref.x.numpy(), g.x) and np.array_equal(ref.y.numpy(), g.y)
    for m in ("train_mask", "val_mask", "test_mask"):
        assert np.array_equal(ref[m].numpy(), getattr(g, m))


@needs_data
@pytest.mark.parametrize("name,nodes,undirected,loops", [("cora", 2708, 5278, 0), ("citeseer", 3312, 4536, 124)])
def test_npz_counts_and_brute_force_symmetrization(name, nodes, undirected, loops):
    path = DATA / name / f"{name}.npz"
    g = load(str(path))
    z = np.load(path, allow_pickle=False)
    ptr, idx = z["adj_indptr"], z["adj_indices"]
    ref = {(min(r, int(c)), max(r, int(c))) for r in range(nodes) for c in idx[ptr[r]:ptr[r + 1]]}
    assert g.num_nodes == nodes and undirected_pairs(g) == ref
    assert sum(u != v for u, v in ref) == undirected and sum(u == v for u, v in ref) == loops
    assert g.num_edges == 2 * undirected + loops
    assert_symmetric_simple(g)
    aptr, aidx, adata = z["attr_indptr"], z["attr_indices"], z["attr_data"]
    for r in (0, nodes // 2, nodes - 1):
        row = np.zeros(g.num_features, np.float32)
        row[aidx[aptr[r]:aptr[r + 1]]] = adata[aptr[r]:aptr[r + 1]]
        assert np.array_equal(g.x[r], row)
    assert np.array_equal(g.y, z["labels"].astype(np.int64))


@needs_data
def test_uci_snap_against_python_parse():
    g = load(str(DATA / "uci_collegemsg" / "CollegeMsg.txt.gz"))
    with gzip.open(DATA / "uci_collegemsg" / "CollegeMsg.txt.gz", "rt") as f:
        rows = [tuple(int(v) for v in line.split()) for line in f if line.strip()]
    assert isinstance(g, TemporalGraph) and g.num_events == len(rows) == 59835 and g.num_nodes == 1899
    src, dst, t = (np.array(c) for c in zip(*rows))
    order = np.argsort(t, kind="stable")
    assert np.array_equal(g.orig_ids, np.unique(np.concatenate([src, dst])))
    assert np.array_equal(g.orig_ids[g.src], src[order]) and np.array_equal(g.orig_ids[g.dst], dst[order])
    assert np.array_equal(g.t, t[order].astype(np.float64))
    assert round((g.t[-1] - g.t[0]) / 86400, 1) == 193.7


@needs_data
def test_bitcoin_csv_against_csv_module():
    path = DATA / "bitcoin_otc" / "soc-sign-bitcoinotc.csv.gz"
    g = load(str(path))
    with gzip.open(path, "rt") as f:
        rows = list(csv.reader(f))[1:]
    assert g.num_events == len(rows) == 35592 and g.num_nodes == 5881
    assert g.orig_ids.min() == 1 and g.orig_ids.max() == 6005
    ref = sorted((float(t), int(s), int(d), float(w)) for s, d, w, t in rows)
    got = sorted(zip(g.t.tolist(), g.orig_ids[g.src].tolist(), g.orig_ids[g.dst].tolist(), g.edge_feat[:, 0].tolist()))
    assert got == ref
    assert g.edge_dim == 1 and g.edge_feat.min() >= -10 and g.edge_feat.max() <= 10
    assert np.array_equal(g.edge_label, (g.edge_feat[:, 0] > 0).astype(np.int64))


# ---------------------------------------------------------------- text formats

def write(tmp_path, name, content) -> str:
    p = tmp_path / name
    data = content.encode() if isinstance(content, str) else content
    p.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return str(p)


def test_snap_relabels_sparse_ids_and_sorts(tmp_path):
    p = write(tmp_path, "g.txt", "# comment\n10 5 3.5\n\n7 10 1\n5 7 2 # trailing comment\n")
    g = load(p)
    assert g.num_nodes == 3 and g.orig_ids.tolist() == [5, 7, 10]
    assert g.orig_ids[g.src].tolist() == [7, 5, 10] and g.orig_ids[g.dst].tolist() == [10, 7, 5]
    assert g.t.tolist() == [1.0, 2.0, 3.5]
    sparse = load(write(tmp_path, "s.txt", "1000000000000 5 1\n5 7 2\n"))  # ids too sparse for a lookup table
    assert sparse.orig_ids.tolist() == [5, 7, 10**12] and sparse.src.tolist() == [2, 0]


def test_chunked_parse_equals_whole_parse_and_keeps_line_numbers(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    rows = np.column_stack([rng.integers(0, 50, 300), rng.integers(0, 50, 300), np.arange(300) * 1.25])
    lines = [f"{int(a)} {int(b)} {c}" for a, b, c in rows]
    lines[100:100] = ["# a comment in the middle", ""]
    good = write(tmp_path, "good.txt.gz", "\n".join(lines) + "\n")
    lines[250] = lines[250].rsplit(" ", 1)[0]  # truncated line, file line 251
    bad = write(tmp_path, "bad.txt", "\n".join(lines) + "\n")
    whole = load(good)
    monkeypatch.setattr(text, "CHUNK_BYTES", 64)
    chunked = load(good)
    assert np.array_equal(whole.src, chunked.src) and np.array_equal(whole.t, chunked.t)
    assert np.array_equal(chunked.orig_ids[chunked.src], rows[:, 0].astype(np.int64))
    with pytest.raises(GnndistError, match=r"bad\.txt:251: expected 3 fields"):
        load(bad)


MALFORMED = [
    ("trunc.txt", "1 2 3\n4 5\n", 2, "expected 3 fields"),
    ("extra.txt", "1 2 3\n4 5 6 7\n", 2, "expected 3 fields"),
    ("word.txt.gz", "# head\n1 2 3\n4 x 6\n", 3, "not a number: 'x'"),
    ("neg.txt", "1 2 3\n\n-4 5 6\n", 3, "node id -4 is negative"),
    ("frac.txt", "1.5 2 3\n", 1, "not an integer"),
    ("nan.txt", "1 2 3\n4 5 nan\n", 2, "time is nan"),
    ("inf.txt", "1 2 3\n4 5 inf\n", 2, "time is inf"),
    ("cols.csv", "from,to,feature,time\n1,2,3,4\n1,2,3\n", 3, "expected 4 fields"),
    ("empty_field.csv", "from,to,feature,time\n1,2,3,4\n1,2,,4\n", 3, "not a number: ''"),
    ("nanfeat.csv", "from,to,feature,time\n1,2,3,4\n1,2,nan,5\n", 3, "feature is nan"),
    ("negid.csv", "src,dst,t\n1,2,3\n1,-2,4\n", 3, "negative"),
    ("header.csv", "\na,b,c\n1,2,3\n", 2, "header needs exactly one src column"),
    ("short.csv", "user_id,item_id,timestamp,state_label\n1,2,3\n", 2, "expected 4 fields"),
    ("neglabel.csv", "src,dst,t,label\n1,2,3,0\n1,2,4,-1\n", 3, "label -1 is negative"),
    ("fraclabel.csv", ",u,i,ts,label,idx\n0,1,2,3,1,0\n1,1,2,4,2.7,1\n", 3, "label 2.7 is not an integer"),
    ("hugelabel.csv", "user_id,item_id,timestamp,state_label\n1,2,3,1e30\n", 2, "label 1e+30 is too large"),
    ("nanlabel.csv", "src,dst,t,label\n1,2,3,nan\n", 2, "label nan is not an integer"),
]


@pytest.mark.parametrize("name,content,line,message", MALFORMED)
def test_malformed_text_names_file_and_line(tmp_path, name, content, line, message):
    p = write(tmp_path, name, content)
    with pytest.raises(GnndistError) as e:
        load(p)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{p}:{line}: ") and message in msg


@pytest.mark.parametrize("name,content,message", [
    ("empty.txt", "", "empty file"),
    ("blank.txt", "\n  \n# only a comment\n", "empty file"),
    ("only_header.csv", "from,to,feature,time\n", "no data lines after the header"),
    ("cut.txt.gz", gzip.compress(b"1 2 3\n" * 1000)[:40], "cannot read"),
    ("empty.npz", b"", r"not a readable \.npz file \(EOFError"),
    ("garbage.npz", b"PK\x03\x04garbage", r"not a readable \.npz file \(BadZipFile"),
    ("text.npz", b"a,b,c\n1,2,3\n", r"not a readable \.npz file \(neither a zip archive nor a \.npy array: it starts "
                                  r"with b'a,b,c\\n'\)"),

])
def test_empty_or_corrupt_files(tmp_path, name, content, message):
    p = tmp_path / name
    p.write_bytes(content.encode() if isinstance(content, str) else content)
    with pytest.raises(GnndistError, match=message) as e:
        load(str(p))
    assert str(p) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("name,blank", [(n, b) for n in ("g.csv", "g.txt", "g.csv.gz")
                                         for b in ("\f", "\v", " \t ", "\f # comment", "\r")])
def test_whitespace_only_lines_are_blank(tmp_path, name, blank):
    """A line of only whitespace (form feed, vertical tab, carriage return...) is skipped like an
    empty one, in every format and chunk layout: the graph equals the one without that line."""
    sep = "," if ".csv" in name else " "
    rows = [sep.join(r) for r in (("1", "2", "3"), ("4", "1", "5"), ("2", "4", "6"))]
    head = "src,dst,t\n" if ".csv" in name else ""
    plain = load(write(tmp_path, name, head + "\n".join(rows) + "\n"))
    odd = write(tmp_path, "odd-" + name, head + f"\n{blank}\n".join(rows) + f"\n{blank}\n")
    g = load(odd)
    assert np.array_equal(g.src, plain.src) and np.array_equal(g.dst, plain.dst) and np.array_equal(g.t, plain.t)
    bad = write(tmp_path, "bad-" + name, head + f"{rows[0]}\n{blank}\n4{sep}x{sep}5\n")
    with pytest.raises(GnndistError, match=f":{3 + bool(head)}: field 2 is not a number: 'x'"):
        load(bad)


@pytest.mark.parametrize("content", ["src,dst,t\n\f\n", "src,dst,t\n \n\f\n", "\f\n"])
def test_csv_of_only_blank_lines_is_empty(tmp_path, content):
    p = write(tmp_path, "e.csv", content)
    with pytest.raises(GnndistError, match="no data lines|empty file") as e:
        load(p)
    assert str(e.value).startswith(p)


@pytest.mark.parametrize("name,content", [
    ("bom.csv", "src,dst,t,label\n1,2,3,1\n4,1,5,0\n"),
    ("bom.txt", "1 2 3\n4 1 5\n"),
    ("bom.csv.gz", "1,2,3\n4,1,5\n"),
])
def test_utf8_bom_is_accepted(tmp_path, name, content):
    plain, bom = load(write(tmp_path, name, content)), load(write(tmp_path, "b" + name, "\ufeff" + content))
    assert bom.orig_ids.tolist() == plain.orig_ids.tolist() == [1, 2, 4]
    assert np.array_equal(bom.src, plain.src) and np.array_equal(bom.t, plain.t)
    assert (bom.edge_label is None) == (plain.edge_label is None) == ("label" not in content)


def test_missing_path_unknown_format_and_file_options(tmp_path):
    with pytest.raises(GnndistError, match="no such file, folder or built-in dataset"):
        load(str(tmp_path / "nope.txt"))
    p = write(tmp_path, "g.txt", "1 2 3\n")
    with pytest.raises(GnndistError, match="unknown format 'xml'"):
        load(p, format="xml")
    with pytest.raises(GnndistError, match="options of the built-in generators only"):
        load(p, num_nodes=5)
    assert load(str(tmp_path)).num_events == 1  # a folder of shard files
    write(tmp_path, "notes.md", "about g.txt\n")
    with pytest.raises(GnndistError, match="cannot tell the format"):
        load(str(tmp_path))


def test_format_detection_by_content(tmp_path):
    assert load(write(tmp_path, "events", "0 1 1\n1 2 2\n")).num_events == 2
    g = load(write(tmp_path, "signed", "from,to,weight,time\n0,1,-3,1\n1,2,4,2\n"))
    assert g.edge_label.tolist() == [0, 1]
    forced = write(tmp_path, "events.dat", "0,1,1\n")
    assert load(forced).num_events == 1
    with pytest.raises(GnndistError, match=r"events\.dat:1: expected 3 fields"):
        load(forced, format="snap")


def test_jodie_csv_is_bipartite_with_features(tmp_path):
    p = write(tmp_path, "wiki.csv", "user_id,item_id,timestamp,state_label,comma_separated_list_of_features\n"
                                    "0,0,1.0,0,0.1,0.2\n1,0,2.0,1,0.3,0.4\n0,1,3.0,0,0.5,0.6\n")
    g = load(p)
    assert g.num_nodes == 4  # users 0,1 then items 0,1
    assert g.src.tolist() == [0, 1, 0] and g.dst.tolist() == [2, 2, 3]
    assert g.orig_ids.tolist() == [0, 1, 0, 1] and g.edge_label.tolist() == [0, 1, 0]
    assert np.allclose(g.edge_feat, [[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]])


def test_tgn_ml_csv_reads_edge_features_from_npy(tmp_path):
    p = write(tmp_path, "ml_toy.csv", ",u,i,ts,label,idx\n0,1,3,0.0,0,1\n1,2,3,5.0,1,2\n2,1,4,9.0,0,3\n")
    feats = np.arange(4 * 3, dtype=np.float64).reshape(4, 3)
    np.save(tmp_path / "ml_toy.npy", feats)
    g = load(p)
    assert g.num_nodes == 4 and g.orig_ids.tolist() == [1, 2, 3, 4]
    assert g.edge_label.tolist() == [0, 1, 0] and np.array_equal(g.edge_feat, feats[1:4].astype(np.float32))
    for bad, message in [(lambda f: np.save(f, np.array([1, 2], dtype=object), allow_pickle=True), "Object arrays"),
                         (lambda f: f.write_bytes(npz_bytes(tmp_path)[:100]), r"\(BadZipFile"),
                         (lambda f: np.save(f, np.array([["a", "b"]] * 4)), "2-d numeric array")]:
        bad(tmp_path / "ml_toy.npy")
        with pytest.raises(GnndistError, match=r"ml_toy\.npy: .*" + message) as e:
            load(p)
        assert "\n" not in str(e.value)


# ---------------------------------------------------------------- npz and planetoid errors

def test_npz_errors(tmp_path):
    np.savez(tmp_path / "noadj.npz", adj_shape=np.array([2, 2]), adj_indices=np.array([1]))
    with pytest.raises(GnndistError, match="missing array 'adj_indptr'"):
        load(str(tmp_path / "noadj.npz"))
    np.savez(tmp_path / "obj.npz", adj_shape=np.array([1, 1]), adj_indices=np.array([0]),
             adj_indptr=np.array([0, 1]), labels=np.array([None], dtype=object))
    with pytest.raises(GnndistError, match=r"array 'labels' cannot be read \(ValueError: Object arrays"):
        load(str(tmp_path / "obj.npz"))
    np.savez(tmp_path / "range.npz", adj_shape=np.array([2, 2]), adj_indices=np.array([5]),
             adj_indptr=np.array([0, 1, 1]))
    with pytest.raises(GnndistError, match="out of range"):
        load(str(tmp_path / "range.npz"))
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(GnndistError, match="junk.npz"):
        load(str(tmp_path / "junk.npz"))


def npz_arrays(**change) -> dict:
    """A 3-node path graph with 2 CSR features and labels, as gnn-benchmark arrays; `change` replaces
    arrays (None drops one)."""
    a = dict(adj_shape=np.array([3, 3]), adj_indices=np.array([1, 2, 0]), adj_indptr=np.array([0, 1, 2, 3]),
             attr_data=np.array([1.0, 2.0, 3.0]), attr_indices=np.array([0, 1, 1]), attr_indptr=np.array([0, 1, 2, 3]),
             attr_shape=np.array([3, 2]), labels=np.array([0, 1, 1]))
    a.update(change)
    return {k: v for k, v in a.items() if v is not None}


def npz_bytes(tmp_path, **change) -> bytes:
    np.savez(tmp_path / "_tmp.npz", **npz_arrays(**change))
    return (tmp_path / "_tmp.npz").read_bytes()


def test_npz_split_masks_are_read(tmp_path):
    """A .npz may carry the split a node run needs (train_mask, val_mask, test_mask)."""
    masks = dict(train_mask=np.array([True, False, False]), val_mask=np.array([0, 1, 0]),
                 test_mask=np.array([False, False, True]))
    np.savez(tmp_path / "s.npz", **npz_arrays(**masks))
    g = load(str(tmp_path / "s.npz"))
    assert [getattr(g, k).tolist() for k in masks] == [[True, False, False], [False, True, False], [False, False, True]]
    assert load(str(tmp_path / "s.npz")).val_mask.dtype == bool


def test_npz_reference_graph_and_integral_float_ids(tmp_path):
    np.savez(tmp_path / "g.npz", **npz_arrays())
    g = load(str(tmp_path / "g.npz"))
    assert undirected_pairs(g) == {(0, 1), (1, 2), (0, 2)} and g.y.tolist() == [0, 1, 1]
    assert g.x.tolist() == [[1, 0], [0, 2], [0, 3]]
    np.savez(tmp_path / "f.npz", **npz_arrays(adj_indices=np.array([1.0, 2.0, 0.0]), attr_matrix=g.x,
                                              attr_data=None))
    f = load(str(tmp_path / "f.npz"))
    assert np.array_equal(f.indices, g.indices) and np.array_equal(f.x, g.x)


NPZ_MALFORMED = [  # (arrays changed from npz_arrays, message)
    (dict(attr_shape=np.array([3, 2, 1])), r"attr: CSR shape must be 2 non-negative integers, got \[3, 2, 1\]"),
    (dict(attr_shape=np.array([3, 1e12])), r"attr: shape \(3, 1000000000000\) would make a dense matrix"),
    (dict(attr_shape=np.array([3, 2.5])), r"attr: CSR shape must hold integers, got float64 value 2\.5"),
    (dict(attr_data=np.array(["a", "b", "c"])), "attr: CSR data must be 3 numbers"),
    (dict(attr_data=None, attr_matrix=np.ones(3)), r"attr_matrix must be a 2-d numeric array, got float64 \(3,\)"),
    (dict(attr_data=None, attr_matrix=np.array([["a", "b"]] * 3)), "attr_matrix must be a 2-d numeric array"),
    (dict(attr_data=None, attr_matrix=np.ones((3, 2, 2))), r"2-d numeric array, got float64 \(3, 2, 2\)"),
    (dict(adj_indices=np.array([1.5, 2, 0])), r"adj: CSR indices must hold integers, got float64 value 1\.5"),
    (dict(adj_indptr=np.array([0, 1, np.nan, 3])), "adj: CSR indptr must hold integers, got float64 value nan"),
    (dict(labels=np.array([0, 1, 10**9])), "labels hold class 1000000000, more classes than the 3 nodes"),
    (dict(val_mask=np.array([True, False])), "val_mask has 2 rows, expected 3"),
    (dict(test_mask=np.array([0, 2, 1])), "test_mask must hold True/False"),
]


@pytest.mark.parametrize("change,message", NPZ_MALFORMED)
def test_malformed_npz_contents(tmp_path, change, message):
    p = tmp_path / "bad.npz"
    np.savez(p, **npz_arrays(**change))
    with pytest.raises(GnndistError, match=message) as e:
        load(str(p))
    assert str(e.value).startswith(f"{p}: ") and "\n" not in str(e.value)


@pytest.mark.parametrize("corrupt,message", [
    (lambda b: b[:len(b) // 2], "not a readable .npz file (BadZipFile"),
    (lambda b: b[:-10], "not a readable .npz file (BadZipFile"),
    (lambda b: b[:300] + b"\xff" * 40 + b[340:], "array 'adj_indices' cannot be read (BadZipFile: Bad CRC-32"),
    (lambda b: np.lib.format.magic(1, 0) + b[6:], "not a readable .npz file ("),
])
def test_corrupt_npz_file(tmp_path, corrupt, message):
    p = tmp_path / "c.npz"
    p.write_bytes(corrupt(npz_bytes(tmp_path)))
    with pytest.raises(GnndistError) as e:
        load(str(p))
    assert str(e.value).startswith(f"{p}: {message}") and "\n" not in str(e.value)


def test_npy_saved_as_npz_and_random_byte_damage(tmp_path):
    p = tmp_path / "arr.npz"
    with open(p, "wb") as f:
        np.save(f, np.arange(6).reshape(3, 2))
    with pytest.raises(GnndistError, match=r"arr\.npz: not a readable \.npz file \(it holds a single \.npy array\)"):
        load(str(p))
    good = npz_bytes(tmp_path)
    rng = np.random.default_rng(0)
    outcomes = set()
    for i in range(60):  # overwrite a random run of bytes: a one-line GnndistError or an unharmed load
        b = bytearray(good)
        at = int(rng.integers(0, len(b) - 8))
        b[at:at + 8] = rng.integers(0, 256, 8, dtype=np.uint8).tobytes()
        p.write_bytes(bytes(b))
        try:
            g = load(str(p))
        except GnndistError as e:
            assert str(e).startswith(f"{p}: ") and "\n" not in str(e)
            outcomes.add("refused")
        else:
            assert g.num_nodes == 3
            outcomes.add("loaded")
    assert "refused" in outcomes


@pytest.fixture
def no_hang():
    """Fail (instead of hanging) a test whose code blocks for more than 10 s."""
    def stop(*_):
        raise TimeoutError("blocked: the loader opened or read something it should have refused")
    old = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, 10)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)


def test_fifo_and_device_refused_without_opening(tmp_path, no_hang):
    fifo = tmp_path / "fifo.txt"
    os.mkfifo(fifo)
    paths = [str(fifo)] + ["/dev/zero"] * os.path.exists("/dev/zero")
    for path in paths:
        for call in (lambda: load(path), lambda: data_kind(path), lambda: load(path, format="npz")):
            with pytest.raises(GnndistError, match="not a regular file or folder") as e:
                call()
            assert str(e.value).startswith(f"{path}: ")
    write_planetoid(tmp_path / "pl")
    os.remove(tmp_path / "pl" / "ind.toy.ty")
    os.mkfifo(tmp_path / "pl" / "ind.toy.ty")
    with pytest.raises(GnndistError, match=r"ind\.toy\.ty: not a regular file"):
        load(str(tmp_path / "pl"))


def write_planetoid(folder: Path, **change) -> None:
    """A tiny Planetoid set `toy`: 2 train rows, 500 allx rows, 10 test rows (ids 500..509, given in
    reverse), one all-zero test label row; `change` replaces parts (arrays, dict, or test.index text)."""
    rng = np.random.default_rng(0)
    eye = np.eye(3, dtype=np.float32)
    ally = eye[rng.integers(0, 3, 500)]
    ty = eye[rng.integers(0, 3, 10)]
    ty[4] = 0
    parts = dict(x=rng.random((2, 4)), y=ally[:2], allx=rng.random((500, 4)), ally=ally,
                 tx=rng.random((10, 4)), ty=ty, graph={0: [1, 509], 1: [0], 509: [0, 509]},
                 **{"test.index": "".join(f"{i}\n" for i in range(509, 499, -1))})
    parts.update(change)
    folder.mkdir(exist_ok=True)
    for part, v in parts.items():
        f = folder / f"ind.toy.{part}"
        f.write_text(v) if isinstance(v, str) else f.write_bytes(pickle.dumps(v, protocol=3))


def test_planetoid_toy_against_reference(tmp_path):
    write_planetoid(tmp_path)
    g = load(str(tmp_path))
    ally = pickle.loads((tmp_path / "ind.toy.ally").read_bytes())
    ty = pickle.loads((tmp_path / "ind.toy.ty").read_bytes())
    tx = pickle.loads((tmp_path / "ind.toy.tx").read_bytes())
    assert g.num_nodes == 510 and g.y.tolist() == ally.argmax(1).tolist() + ty.argmax(1).tolist()[::-1]
    assert g.y[505] == 0 and np.allclose(g.x[509], tx[0]) and np.allclose(g.x[500], tx[9])
    assert undirected_pairs(g) == {(0, 1), (0, 509)}


PLANETOID_MALFORMED = [  # (part: replacement, message)
    (dict(ally=np.zeros((500, 0))), r"ind\.toy\.ally: expected one-hot label rows"),
    (dict(ty=np.zeros((10, 0))), r"ind\.toy\.ty: expected one-hot label rows"),
    (dict(y=np.zeros((2, 0))), r"ind\.toy\.y: expected one-hot label rows"),
    (dict(ally=np.full((500, 3), np.nan)), r"ind\.toy\.ally: expected one-hot label rows"),
    (dict(ally=np.full((500, 3), 0.5)), r"ind\.toy\.ally: expected one-hot label rows"),
    (dict(ty=np.ones((10, 3))), r"ind\.toy\.ty: expected one-hot label rows"),
    (dict(graph={0: [1.5], 1: [0]}), r"ind\.toy\.graph: graph dict holds a node id that is not a non-negative"),
    (dict(graph={0: ["1"]}), r"ind\.toy\.graph: graph dict holds a node id that is not a non-negative"),
    (dict(graph={0.5: [1]}), r"ind\.toy\.graph: graph dict holds a node id that is not a non-negative"),
    ({"test.index": "1000000000\n" + "".join(f"{i}\n" for i in range(501, 510))},
     r"ind\.toy\.test\.index: test id 1000000000 is beyond the 510 nodes"),
]


@pytest.mark.parametrize("change,message", PLANETOID_MALFORMED)
def test_malformed_planetoid(tmp_path, change, message):
    write_planetoid(tmp_path, **change)
    with pytest.raises(GnndistError, match=message) as e:
        load(str(tmp_path))
    assert "\n" not in str(e.value)


class _Evil:
    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@needs_data
@pytest.mark.parametrize("part", ["x", "graph"])
def test_planetoid_refuses_malicious_pickle(tmp_path, part):
    for f in (DATA / "cora").glob("ind.cora.*"):
        (tmp_path / f.name).write_bytes(f.read_bytes())
    evil = _Evil()
    evil.marker = tmp_path / "pwned"
    (tmp_path / f"ind.cora.{part}").write_bytes(pickle.dumps(evil, protocol=2))
    with pytest.raises(GnndistError, match=r"ind\.cora\.%s: not a valid Planetoid pickle: refusing" % part):
        load(str(tmp_path))
    assert not evil.marker.exists()
    (tmp_path / f"ind.cora.{part}").write_bytes(pickle.dumps(eval, protocol=2))
    with pytest.raises(GnndistError, match="refusing to load global '(__builtin__|builtins).eval'"):
        load(str(tmp_path))


class _Huge:
    """Pickles as a call that allocates `shape` bytes with allowed globals only."""

    def __init__(self, how, shape=(2**44,)):  # 16 TiB
        self.how, self.shape = how, shape

    def __reduce__(self):
        from gnndist.datasets.pickles import _reconstruct
        if self.how == "ndarray":
            return (np.ndarray, (self.shape, np.dtype("u1")))
        return (_reconstruct, (np.ndarray, self.shape, np.dtype("u1")))


@pytest.mark.parametrize("payload", [_Huge("ndarray"), _Huge("reconstruct"), _Huge("ndarray", (2**20,)),
                                     _Huge("reconstruct", (2**33,))])
def test_planetoid_pickle_cannot_allocate(tmp_path, payload):
    """Arrays come only from numpy's own pickle form (`_reconstruct` of shape (0,), then the
    file's bytes): a pickle that asks for a 16 TiB (or any) array up front is refused by name."""
    write_planetoid(tmp_path)
    (tmp_path / "ind.toy.allx").write_bytes(pickle.dumps(payload, protocol=4))
    with pytest.raises(GnndistError, match=r"ind\.toy\.allx: not a valid Planetoid pickle") as e:
        load(str(tmp_path))
    assert "\n" not in str(e.value)


def test_planetoid_pickle_with_a_huge_length_field(tmp_path):
    """A bytes length field of 2**62 makes the unpickler itself run out of memory."""
    write_planetoid(tmp_path)
    (tmp_path / "ind.toy.x").write_bytes(b"\x80\x04\x8e" + (2**62).to_bytes(8, "little") + b"x.")
    with pytest.raises(GnndistError, match=r"ind\.toy\.x: not a valid Planetoid pickle"):
        load(str(tmp_path))


@needs_data
def test_planetoid_missing_part_and_bad_test_index(tmp_path):
    for f in (DATA / "cora").glob("ind.cora.*"):
        if not f.name.endswith(".ty"):
            (tmp_path / f.name).write_bytes(f.read_bytes())
    with pytest.raises(GnndistError, match=r"ind\.cora\.ty: no such file"):
        load(str(tmp_path))
    (tmp_path / "ind.cora.ty").write_bytes((DATA / "cora" / "ind.cora.ty").read_bytes())
    lines = (tmp_path / "ind.cora.test.index").read_text().splitlines()
    lines[6] = "12x"
    (tmp_path / "ind.cora.test.index").write_text("\n".join(lines) + "\n")
    with pytest.raises(GnndistError, match=r"ind\.cora\.test\.index:7: field 1 is not a number"):
        load(str(tmp_path))


# ---------------------------------------------------------------- generators

def ncm_accuracy(x, y, train, test) -> float:
    """Nearest-class-mean classifier accuracy."""
    means = np.stack([x[train & (y == c)].mean(0) for c in range(y.max() + 1)])
    d = ((x[test][:, None, :] - means[None]) ** 2).sum(-1)
    return float((d.argmin(1) == y[test]).mean())


def test_synthetic_static_sizes_determinism_and_signal():
    g = synthetic_static(seed=3)
    assert (g.num_nodes, g.num_edges, g.num_features, g.num_classes) == (10_000, 200_000, 32, 8)
    assert_symmetric_simple(g)
    src, dst = g.edges()
    assert not np.any(src == dst) and np.isfinite(g.x).all()
    assert not np.any(g.train_mask & g.val_mask) and not np.any(g.train_mask & g.test_mask)
    assert not np.any(g.val_mask & g.test_mask) and g.train_mask.sum() > 2000
    assert (g.y[src] == g.y[dst]).mean() > 0.7
    deg = g.degrees()
    assert deg.max() > 20 * deg.mean()  # heavy-tailed degrees
    h = synthetic_static(seed=3)
    assert all(np.array_equal(getattr(g, a), getattr(h, a)) for a in ("indptr", "indices", "x", "y", "train_mask"))
    assert not np.array_equal(synthetic_static(seed=4).indices, g.indices)
    mean = np.zeros_like(g.x)
    np.add.at(mean, dst, g.x[src])
    mean /= np.maximum(deg, 1)[:, None]
    raw = ncm_accuracy(g.x, g.y, g.train_mask, g.test_mask)
    agg = ncm_accuracy(mean, g.y, g.train_mask, g.test_mask)
    assert 1 / 8 + 0.05 < raw < 0.6 and agg > raw + 0.25


def test_synthetic_temporal_sizes_repeats_and_bursts():
    g = synthetic_temporal(num_nodes=500, num_events=10_000, edge_dim=4, seed=1)
    assert (g.num_nodes, g.num_events, g.edge_dim) == (500, 10_000, 4)
    assert np.all(np.diff(g.t) >= 0) and np.isfinite(g.t).all() and np.isfinite(g.edge_feat).all()
    assert not np.any(g.src == g.dst) and g.src.max() < 500 and g.dst.max() < 500
    h = synthetic_temporal(num_nodes=500, num_events=10_000, edge_dim=4, seed=1)
    assert np.array_equal(g.src, h.src) and np.array_equal(g.dst, h.dst) and np.array_equal(g.t, h.t)
    assert np.array_equal(g.edge_feat, h.edge_feat)
    assert not np.array_equal(synthetic_temporal(num_nodes=500, num_events=10_000, seed=2).dst, g.dst)

    def repeat_share(src, dst):
        key = np.minimum(src, dst) * 500 + np.maximum(src, dst)
        return 1 - np.unique(key).size / key.size

    shuffled = np.random.default_rng(0).permutation(g.dst)
    assert repeat_share(g.src, g.dst) > 0.5 and repeat_share(g.src, g.dst) > 2 * repeat_share(g.src, shuffled)
    indptr, _, _, ts = g.tcsr()
    node = np.repeat(np.arange(g.num_nodes), np.diff(indptr))
    gaps = np.diff(ts)[node[1:] == node[:-1]]
    assert gaps.std() / gaps.mean() > 1.5  # bursty: far more irregular than a Poisson process (1.0)


@pytest.mark.parametrize("call,message", [
    (lambda: synthetic_static(num_nodes=0), r"num_nodes \(--num-nodes\) must be a positive integer below 2\*\*63, got 0"),
    (lambda: synthetic_static(num_nodes=10, num_edges=40), "at most a quarter"),
    (lambda: synthetic_temporal(num_nodes=2**64, num_events=10), r"num_nodes \(--num-nodes\) must be a positive "
                                                                 r"integer below 2\*\*63, got 18446744073709551616"),
    (lambda: synthetic_temporal(num_events=2.5), r"num_events \(--num-events\) must be a positive integer"),
    (lambda: synthetic_static(num_features=0), r"num_features \(--num-features\) must be a positive integer"),
    (lambda: load("synthetic-static", num_events=5), "synthetic-static has no option num_events"),
    (lambda: synthetic_static(num_nodes=50, num_edges=100, seed=-1), r"seed \(--data-seed\) must be an integer"),
    (lambda: synthetic_temporal(num_nodes=50, num_events=100, seed=-1), r"seed \(--data-seed\) must be"),
    (lambda: synthetic_temporal(num_nodes=50, num_events=100, seed=2**64), "from 0 to 18446744073709551615"),
    (lambda: synthetic_static(num_nodes=50, num_edges=100, seed=1.5), "got 1.5"),
    (lambda: synthetic_static(num_nodes=50, num_edges=100, seed=True), "got True"),
])
def test_generator_option_errors(call, message):
    with pytest.raises(GnndistError, match=message):
        call()


def test_load_from_args_scales_generators_and_rejects_file_options(tmp_path):
    p = argparse.ArgumentParser()
    add_data_args(p)
    g = source_from_args(p.parse_args(["synthetic-static", "--num-nodes", "300", "--num-edges", "900",
                                     "--data-seed", "5"])).load()
    assert g.num_nodes == 300 and g.num_edges == 1800
    assert np.array_equal(g.indices, synthetic_static(num_nodes=300, num_edges=900, seed=5).indices)
    t = source_from_args(p.parse_args(["synthetic-temporal", "--num-events", "777"])).load()
    assert t.num_events == 777
    f = write(tmp_path, "e.csv", "src,dst,t\n0,1,1\n")
    assert source_from_args(p.parse_args([f, "--format", "csv"])).load().num_events == 1
    with pytest.raises(GnndistError, match="options of the built-in generators only"):
        source_from_args(p.parse_args([f, "--num-nodes", "4"])).load()


# ---------------------------------------------------------------- splits

def test_chronological_split_and_new_nodes_against_brute_force():
    g = synthetic_temporal(num_nodes=300, num_events=1000, seed=0)
    assert chronological_split(g) == (700, 850)
    assert chronological_split(g, val=0.1, test=0.2) == (700, 800)
    with pytest.raises(GnndistError, match="split fractions"):
        chronological_split(g, val=0.5, test=0.5)
    for end in (0, 300, 700, 1000):
        before = set(g.src[:end].tolist()) | set(g.dst[:end].tolist())
        after = set(g.src[end:].tolist()) | set(g.dst[end:].tolist())
        assert new_nodes_after(g, end).tolist() == sorted(after - before)


# ---------------------------------------------------------------- CLI

def test_cli_lists_generators_and_formats(capsys):
    assert main(["datasets"]) == 0
    out = capsys.readouterr().out
    for name in (*GENERATORS, *FORMATS):
        assert name in out
    assert "num_events=20000" in out and "num_edges=100000" in out


def test_cli_subprocess_and_errors(tmp_path, capsys):
    p = subprocess.run([sys.executable, "-m", "gnndist", "datasets"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "synthetic-static" in p.stdout and "synthetic-temporal" in p.stdout
    bad = write(tmp_path, "bad.txt", "1 2 3\n4 5\n")
    assert main(["datasets", bad]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"gnndist datasets: error: {bad}:2: expected 3 fields (src dst time), got 2"
    good = write(tmp_path, "ok.txt", "1 2 3\n4 5 6\n")
    assert main(["datasets", good]) == 0
    assert "temporal: 4 nodes, 2 events" in capsys.readouterr().out
