"""Static partitioning and the partition store: exact round trips, METIS vs pymetis, balance,
checksums, atomic writes."""
from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import networkx as nx
import numpy as np
import pymetis
import pytest

from gnndist import Graph, GnndistError, TemporalGraph
from gnndist.datasets import load
from gnndist.io import sha256_file
from gnndist.partition import (
    load_id_maps,
    load_partition,
    partition_graph,
    read_store_meta,
    relabel,
    verify_store,
)
from gnndist.partition import stats as pstats
from gnndist.partition import store as pstore
from gnndist.partition.methods import metis_kway, random_membership, symmetric_adjacency

DATA = Path(__file__).resolve().parents[2] / "shared" / "datasets"


@pytest.fixture(scope="module")
def graph() -> Graph:
    """A small generated graph with features, labels and masks, plus a directed extra edge,
    a self-loop and a duplicate edge so symmetrization has work to do."""
    g = load("synthetic-static", num_nodes=600, num_edges=2500, seed=3)
    src, dst = g.edges()
    src = np.concatenate([src, [5, 7, 7]])
    dst = np.concatenate([dst, [9, 7, 7]])
    return Graph.from_edges(src, dst, num_nodes=g.num_nodes, x=g.x, y=g.y, train_mask=g.train_mask,
                            val_mask=g.val_mask, test_mask=g.test_mask)


def edge_keys(src: np.ndarray, dst: np.ndarray, n: int) -> np.ndarray:
    return np.sort(src.astype(np.int64) * n + dst)


def brute_metis_adjacency(g: Graph) -> tuple[np.ndarray, np.ndarray]:
    """The simple undirected graph, built with networkx, rows sorted."""
    nxg = nx.Graph()
    nxg.add_nodes_from(range(g.num_nodes))
    src, dst = g.edges()
    nxg.add_edges_from((int(a), int(b)) for a, b in zip(src, dst) if a != b)
    rows = [sorted(nxg.neighbors(v)) for v in range(g.num_nodes)]
    xadj = np.cumsum([0] + [len(r) for r in rows])
    return xadj, np.array([u for r in rows for u in r], dtype=np.int64)


@pytest.mark.parametrize("method,halo", [("metis", 0), ("metis", 1), ("random", 1)])
def test_static_round_trip_is_exact(graph, tmp_path, method, halo):
    n = graph.num_nodes
    store = partition_graph(graph, 4, method=method, halo=halo, out=tmp_path / "s")
    meta = read_store_meta(tmp_path / "s")
    new_to_orig, orig_to_new = load_id_maps(tmp_path / "s")
    # id maps: inverse permutations
    assert np.array_equal(np.sort(new_to_orig), np.arange(n))
    assert np.array_equal(new_to_orig[orig_to_new], np.arange(n))
    assert np.array_equal(orig_to_new[new_to_orig], np.arange(n))
    parts = [load_partition(tmp_path / "s", p, world_size=4) for p in range(4)]
    # every node in exactly one part, contiguous new-id ranges in part order
    assert np.array_equal(np.concatenate([p.orig_ids for p in parts]), new_to_orig)
    assert np.array_equal(np.sort(np.concatenate([p.orig_ids for p in parts])), np.arange(n))
    assert meta["node_offsets"] == [0] + np.cumsum([p.num_local for p in parts]).tolist()
    # the union of the parts' rows is exactly the input edge multiset
    src_all, dst_all = [], []
    for p in parts:
        rows = np.repeat(np.arange(p.start, p.stop), np.diff(p.indptr))
        assert np.array_equal(p.owner(rows), np.full(rows.size, p.part_id))
        src_all.append(new_to_orig[p.indices])
        dst_all.append(new_to_orig[rows])
        for name in ("x", "y", "train_mask", "val_mask", "test_mask"):
            got, want = getattr(p, name), getattr(graph, name)[p.orig_ids]
            assert got.dtype == want.dtype and np.array_equal(got, want), name
            assert got.tobytes() == want.tobytes()
        if halo:
            nbrs = set(p.indices.tolist())
            expect = sorted(v for v in nbrs if not p.start <= v < p.stop)
            assert p.halo_ids.tolist() == expect
            assert np.array_equal(p.halo_x, graph.x[new_to_orig[p.halo_ids]])
        else:
            assert p.halo_ids is None and p.halo_x is None
        # the in-memory part equals the loaded one
        mem = store.part(p.part_id)
        assert np.array_equal(mem.indices, p.indices) and np.array_equal(mem.indptr, p.indptr)
    gs, gd = graph.edges()
    assert np.array_equal(edge_keys(np.concatenate(src_all), np.concatenate(dst_all), n), edge_keys(gs, gd, n))
    # within a row, neighbour order is the input's
    v = 11
    p = parts[parts[0].owner(np.array([orig_to_new[v]]))[0]]
    i = orig_to_new[v] - p.start
    assert np.array_equal(new_to_orig[p.indices[p.indptr[i]:p.indptr[i + 1]]],
                          graph.indices[graph.indptr[v]:graph.indptr[v + 1]])


def test_static_figures_match_brute_force(graph):
    store = partition_graph(graph, 3, method="metis", halo=1, balance=["nodes", "edges", "train"])
    f, m = store.stats, store.membership
    src, dst = graph.edges()
    assert f["nodes_per_part"] == [int((m == p).sum()) for p in range(3)]
    assert f["edges_per_part"] == [int((m[dst] == p).sum()) for p in range(3)]
    assert f["train_nodes_per_part"] == [int(graph.train_mask[m == p].sum()) for p in range(3)]
    assert f["edge_cut_fraction"] == pytest.approx(np.mean(m[src] != m[dst]))
    halo = [{int(s) for s, d in zip(src, dst) if m[d] == p and m[s] != p} for p in range(3)]
    assert f["halo_nodes_per_part"] == [len(h) for h in halo]
    assert f["replication_factor"] == pytest.approx((graph.num_nodes + sum(map(len, halo))) / graph.num_nodes)
    counts = np.array(f["edges_per_part"])
    assert f["imbalance"]["edges"] == pytest.approx(counts.max() / counts.mean())


def test_symmetric_adjacency_matches_networkx(graph):
    xadj, adjncy = brute_metis_adjacency(graph)
    src, dst = graph.edges()
    got_x, got_a, _ = symmetric_adjacency(src, dst, graph.num_nodes)
    assert np.array_equal(got_x, xadj) and np.array_equal(got_a, adjncy)


@pytest.mark.parametrize("k,tol,seed", [(2, 1.03, 0), (4, 1.05, 7), (5, 1.03, 1)])
def test_metis_equals_pymetis(graph, k, tol, seed):
    xadj, adjncy = brute_metis_adjacency(graph)
    opts = pymetis.Options(ufactor=int(round((tol - 1) * 1000)), seed=seed)
    ref = pymetis.part_graph(k, pymetis.CSRAdjacency(xadj, adjncy), options=opts, recursive=False)
    store = partition_graph(graph, k, method="metis", imbalance_tol=tol, seed=seed)
    assert np.array_equal(store.membership, np.asarray(ref.vertex_part))
    m = store.membership
    cut_pairs = sum(m[u] != m[v] for u in range(graph.num_nodes) for v in adjncy[xadj[u]:xadj[u + 1]] if u < v)
    assert cut_pairs == ref.edge_cuts


def test_metis_kway_weighted_equals_pymetis(graph):
    """The direct METIS call with vertex and edge weights (one constraint) equals pymetis."""
    rng = np.random.default_rng(0)
    src, dst = graph.edges()
    xadj, adjncy, adjwgt = symmetric_adjacency(src, dst, graph.num_nodes, weights=rng.uniform(1, 9, src.size))
    vw = rng.integers(0, 5, graph.num_nodes)
    opts = pymetis.Options(ufactor=50, seed=2)
    ref = pymetis.part_graph(3, pymetis.CSRAdjacency(xadj, adjncy), vweights=vw, eweights=adjwgt, options=opts,
                             recursive=False)
    cut, part = metis_kway(xadj, adjncy, 3, vw, adjwgt, pymetis.Options(ufactor=50, seed=2))
    assert cut == ref.edge_cuts and np.array_equal(part, np.asarray(ref.vertex_part))


@pytest.mark.parametrize("tol", [1.02, 1.05, 1.10])
def test_multi_constraint_balance_within_tolerance(tol):
    g = load("synthetic-static", num_nodes=3000, num_edges=15000, seed=1)
    store = partition_graph(g, 4, method="metis", balance=["nodes", "edges", "train"], imbalance_tol=tol)
    imb = store.stats["imbalance"]
    for key in ("nodes", "edges", "train"):
        assert imb[key] <= tol + 1e-9, (key, imb)
    assert store.stats["edge_cut_fraction"] < 0.5  # random would cut ~3/4


def test_single_constraint_leaves_other_weights_unbalanced():
    """Shows the constraints are real: balancing nodes only does not balance training nodes."""
    g = load("synthetic-static", num_nodes=3000, num_edges=15000, seed=1)
    store = partition_graph(g, 4, method="metis", balance=["nodes"], imbalance_tol=1.02)
    assert store.stats["imbalance"]["nodes"] <= 1.02 + 1e-9
    assert store.stats["imbalance"]["train"] > 1.02


@pytest.mark.skipif(not (DATA / "cora").exists(), reason="shared datasets absent")
def test_cora_round_trip_and_balance(tmp_path):
    g = load(str(DATA / "cora"))
    store = partition_graph(g, 4, method="metis", balance=["nodes", "train"], imbalance_tol=1.05, halo=1,
                            out=tmp_path / "c")
    assert store.stats["imbalance"]["nodes"] <= 1.05 + 1e-9
    assert store.stats["imbalance"]["train"] <= 1.05 + 1e-9
    assert store.stats["edge_cut_fraction"] < 0.2
    parts = [load_partition(tmp_path / "c", p) for p in range(4)]
    x = np.concatenate([p.x for p in parts])
    assert x.tobytes() == g.x[np.concatenate([p.orig_ids for p in parts])].tobytes()
    new_g = relabel(g, store.orig_to_new)
    for p in parts:  # the parts are slices of the relabelled graph
        a, b = new_g.indptr[p.start], new_g.indptr[p.stop]
        assert np.array_equal(p.indices, new_g.indices[a:b])
        assert np.array_equal(p.indptr, new_g.indptr[p.start:p.stop + 1] - a)


def test_random_method_hashes_ids():
    m = random_membership(10_000, 4, seed=0)
    assert np.array_equal(m, random_membership(10_000, 4, seed=0))
    assert not np.array_equal(m, random_membership(10_000, 4, seed=1))
    assert pstats.imbalance(np.bincount(m)) < 1.05
    assert np.array_equal(random_membership(20_000, 4, seed=0)[:10_000], m)  # a function of the id only


def test_corruption_truncation_and_missing_files_are_detected(graph, tmp_path):
    out = tmp_path / "s"
    partition_graph(graph, 2, method="metis", out=out)
    assert verify_store(out) == len(read_store_meta(out)["files"])
    f = out / "part1" / "indices.npy"
    good = f.read_bytes()
    flipped = bytearray(good)
    flipped[-3] ^= 0x01
    f.write_bytes(bytes(flipped))
    with pytest.raises(GnndistError, match="sha256"):
        load_partition(out, 1)
    with pytest.raises(GnndistError, match="sha256"):
        verify_store(out)
    load_partition(out, 0)  # the other part is intact
    f.write_bytes(good[: len(good) // 2])
    with pytest.raises(GnndistError, match="corrupted"):
        load_partition(out, 1)
    f.unlink()
    with pytest.raises(GnndistError, match="missing part1/indices.npy"):
        load_partition(out, 1)


def test_store_meta_errors(graph, tmp_path):
    out = tmp_path / "s"
    partition_graph(graph, 2, method="random", out=out)
    with pytest.raises(GnndistError, match="world size is 3"):
        load_partition(out, 0, world_size=3)
    with pytest.raises(GnndistError, match="out of range"):
        load_partition(out, 2)
    meta = json.loads((out / "meta.json").read_text())
    meta["format_version"] = 999
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(GnndistError, match="format 999"):
        load_partition(out, 0)
    (out / "meta.json").write_text("{not json")
    with pytest.raises(GnndistError, match="not valid JSON"):
        read_store_meta(out)
    with pytest.raises(GnndistError, match="no meta.json"):
        load_partition(tmp_path, 0)


def test_writes_are_atomic(graph, tmp_path, monkeypatch):
    out = tmp_path / "s"
    partition_graph(graph, 2, method="random", out=out)
    before = read_store_meta(out)
    calls = {"n": 0}
    real_save = np.save

    def failing_save(path, arr):
        calls["n"] += 1
        if calls["n"] == 5:
            raise OSError("disk full")
        real_save(path, arr)

    monkeypatch.setattr(pstore.np, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        partition_graph(graph, 3, method="metis", out=out)
    monkeypatch.undo()
    assert read_store_meta(out) == before and verify_store(out) > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]  # no temp folders left
    other = tmp_path / "notastore"
    other.mkdir()
    (other / "precious.txt").write_text("keep me")
    with pytest.raises(GnndistError, match="not a partition store"):
        partition_graph(graph, 2, method="random", out=other)
    assert (other / "precious.txt").read_text() == "keep me"


def test_memory_estimate_refuses_cleanly(monkeypatch):
    n, e = 50_000, 1_200_000
    rng = np.random.default_rng(0)
    indptr = np.zeros(n + 1, dtype=np.int64)
    indptr[1:] = np.cumsum(np.bincount(rng.integers(0, n, e), minlength=n))
    g = Graph(indptr, rng.integers(0, n, e))
    need = pstore.check_memory(g, "random")
    assert pstore.check_memory(Graph(np.zeros(3, np.int64), np.zeros(0, np.int64)), "metis") is None
    monkeypatch.setattr(pstats, "available_memory_bytes", lambda: need - 1)
    with pytest.raises(GnndistError, match=r"needs an estimated .* beyond the loaded graph but only .* available; "
                       r"pass --force"):
        partition_graph(g, 2, method="random")
    assert partition_graph(g, 2, method="random", force=True).stats["nodes_per_part"][0] > 0


def test_bad_arguments(graph):
    with pytest.raises(GnndistError, match="--parts"):
        partition_graph(graph, graph.num_nodes + 1)
    with pytest.raises(GnndistError, match="temporal graph"):
        partition_graph(graph, 2, method="temporal")
    with pytest.raises(GnndistError, match="unknown --balance"):
        partition_graph(graph, 2, balance=["weird"])
    with pytest.raises(GnndistError, match="temporal graphs only"):
        partition_graph(graph, 2, replicate_hubs=3)
    with pytest.raises(GnndistError, match="imbalance-tol"):
        partition_graph(graph, 2, imbalance_tol=0.9)
    no_train = Graph(graph.indptr, graph.indices)
    with pytest.raises(GnndistError, match="training nodes"):
        partition_graph(no_train, 2, balance=["train"])


def test_single_part(graph):
    store = partition_graph(graph, 1, method="metis")
    assert store.stats["nodes_per_part"] == [graph.num_nodes] and store.stats["edge_cut_fraction"] == 0.0


def test_seed_and_tolerance_bounds(graph):
    for bad in (-1, 2**32, 1.5, True):
        with pytest.raises(GnndistError, match=r"--seed must be an integer from 0 to 4294967295"):
            partition_graph(graph, 2, method="random", seed=bad)
    with pytest.raises(GnndistError, match="--seed"):
        random_membership(10, 2, -1)
    for bad in (float("inf"), float("nan"), 1e30, 10.5, 1.0):
        with pytest.raises(GnndistError, match=r"--imbalance-tol must be from 1.001 to 10"):
            partition_graph(graph, 2, method="metis", imbalance_tol=bad)
    top = partition_graph(graph, 2, method="metis", imbalance_tol=10.0, seed=2**32 - 1)
    assert top.params["seed"] == 2**32 - 1 and sum(top.stats["nodes_per_part"]) == graph.num_nodes
    same = random_membership(graph.num_nodes, 3, 2**32 - 1)
    assert np.array_equal(same, random_membership(graph.num_nodes, 3, 2**32 - 1))
    assert not np.array_equal(same, random_membership(graph.num_nodes, 3, 0))


def test_metis_messages_are_dropped(capfd):
    """METIS prints to C stdout when asked for too many parts: neither the command's output nor
    its one-line error may show it (what it warns of is checked after the call)."""
    g = load("synthetic-temporal", num_nodes=100, num_events=300)
    xadj, adjncy, _ = symmetric_adjacency(g.src, g.dst, g.num_nodes)
    vwgt = np.bincount(g.src, minlength=g.num_nodes)[:, None]
    print("before", flush=True)
    metis_kway(xadj, adjncy, 90, vwgt)
    print("after")
    out, err = capfd.readouterr()
    assert out == "before\nafter\n" and err == ""


def test_out_of_space_is_named(graph, tmp_path, monkeypatch):
    out = tmp_path / "s"
    partition_graph(graph, 2, method="random", out=out)
    before = read_store_meta(out)
    real_save = np.save

    def full_disk(path, arr):
        if Path(path).name == "indices.npy":
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(path, arr)

    def short_write(path, arr):  # numpy's own message for a short write
        if Path(path).name == "indices.npy":
            raise OSError(f"{arr.nbytes} requested and 0 written")
        real_save(path, arr)

    monkeypatch.setattr(pstore.np, "save", full_disk)
    with pytest.raises(GnndistError, match=f"no space left on device writing the partition store {out} "
                       r"\(indices.npy needs"):
        partition_graph(graph, 3, method="metis", out=out)
    monkeypatch.setattr(pstore.np, "save", short_write)
    monkeypatch.setattr(pstore.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9, 0))
    with pytest.raises(GnndistError, match="no space left on device"):
        partition_graph(graph, 3, method="metis", out=out)
    monkeypatch.undo()
    assert read_store_meta(out) == before and verify_store(out) > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


# ---------------------------------------------------------------- stores that prove themselves

def test_options_the_method_ignores_are_refused(graph):
    tg = load("synthetic-temporal", num_nodes=80, num_events=800)
    for g, kw, msg in [(tg, dict(method="temporal", balance=["train"]), "--balance applies to --method metis and metis-lp only"),
                       (tg, dict(method="random", balance=["nodes"]), "--method random hashes node ids"),
                       (graph, dict(method="random", balance=["nodes"]), "--balance applies to --method metis and metis-lp only"),
                       (tg, dict(method="metis", recency=0.5), "--recency applies to --method temporal only"),
                       (graph, dict(time_windows=2), "--time-windows applies to temporal graphs only")]:
        with pytest.raises(GnndistError, match=msg):
            partition_graph(g, 2, **kw)
    assert partition_graph(tg, 2, method="random", time_windows=2).params["seed"] == 0  # the metrics use windows
    assert partition_graph(graph, 2, method="metis", balance=["nodes", "train"]).params["balance"] == ["nodes", "train"]


@pytest.fixture(scope="module")
def stores(graph, tmp_path_factory) -> dict[str, Path]:
    """A static store (metis, 2 parts, halo, features, labels, masks) and a temporal one (3
    parts, halo, 3 replicated hubs, edge features and labels), written once."""
    root = tmp_path_factory.mktemp("stores")
    g = load("synthetic-temporal", num_nodes=300, num_events=4000, seed=5)
    tg = TemporalGraph(g.src, g.dst, g.t, g.edge_feat, np.arange(g.num_events) % 2, num_nodes=g.num_nodes)
    partition_graph(graph, 2, method="metis", halo=1, out=root / "static")
    partition_graph(tg, 3, method="temporal", halo=1, replicate_hubs=3, out=root / "temporal")
    return {"static": root / "static", "temporal": root / "temporal"}


def rewrite(store: Path, arrays: dict[str, np.ndarray] = {}, meta_edit=None) -> None:
    """Replace store files (relative name -> array) and edit meta.json, then fix every checksum,
    as a careful hand-edit would: what is left to catch them is the check against the arrays."""
    meta = json.loads((store / "meta.json").read_text())
    for rel, a in arrays.items():
        np.save(store / rel, a)
        meta["files"][rel] = sha256_file(store / rel)
    if meta_edit:
        meta_edit(meta)
    meta["meta_sha256"] = pstore.meta_checksum(meta)
    (store / "meta.json").write_text(json.dumps(meta))


def _foreign_non_hub(a, c):
    """Events whose source the part owns and whose destination is neither owned nor a hub."""
    own = (a["src"] >= c["start"]) & (a["src"] < c["stop"])
    far = ((a["dst"] < c["start"]) | (a["dst"] >= c["stop"])) & ~np.isin(a["dst"], c["hubs"])
    return np.flatnonzero(own & far)


def _event_touching_nothing(a, c):
    j = _foreign_non_hub(a, c)[0]
    src = a["src"].copy()
    src[j] = a["dst"][j]
    return {"src": src}


def _halo_missing_a_neighbour(a, c):
    """The same number of halo ids, one of them swapped for a node no edge of the part reaches."""
    halo, reached = a["halo_ids"], set(a["halo_ids"].tolist())
    spare = next(v for v in range(c["n"]) if v not in reached and not c["start"] <= v < c["stop"])
    return {"halo_ids": np.sort(np.r_[halo[1:], spare])}


def _with(name, i, value):
    def edit(a, c):
        b = a[name].copy()
        b[i] = value(c) if callable(value) else value
        return {name: b}
    return edit


STATIC_TAMPER = [  # (edit of part 1's arrays, or of meta.json, -> the message)
    (lambda a, c: {"indptr": a["indptr"][:-1]}, "indptr.npy has"),
    (lambda a, c: {"indptr": a["indptr"] + (np.arange(a["indptr"].size) == a["indptr"].size - 1)},
     "indptr.npy is not a CSR row pointer over the"),
    (lambda a, c: {"indptr": a["indptr"][[0, 2, 1, *range(3, a["indptr"].size)]]}, "not a CSR row pointer"),
    (_with("indices", 0, lambda c: c["n"]), "indices.npy holds 600, outside [0, 600)"),
    (_with("indices", 0, -1), "indices.npy holds -1, outside [0, 600)"),
    (lambda a, c: {"indices": a["indices"].astype(np.int32)}, "indices.npy is <i4 of shape"),
    (_with("x", (3, 2), np.nan), "x.npy holds NaN or inf"),
    (lambda a, c: {"x": a["x"][:, :-1]}, ", 31), meta.json says <f4 of shape (rows, 32)"),
    (lambda a, c: {"x": a["x"][:-1]}, "x.npy has"),
    (_with("y", 0, -1), "y.npy holds a negative class"),
    (lambda a, c: {"y": a["y"].astype(np.float64)}, "y.npy is <f8"),
    (lambda a, c: {"train_mask": ~a["train_mask"]}, "train_mask.npy disagrees with stats.train_nodes_per_part"),
    (_with("orig_ids", 1, lambda c: c["orig_ids"][0]), "orig_ids.npy is not strictly ascending"),
    (_with("orig_ids", -1, 600), "orig_ids.npy holds 600, outside [0, 600)"),
    (lambda a, c: {"orig_ids": a["orig_ids"][:-1]}, "rows, expected"),
    (lambda a, c: {"orig_ids": np.array([object()] * a["orig_ids"].size)}, "Object arrays cannot be loaded"),
    (_with("halo_ids", -1, lambda c: c["start"]), "halo_ids.npy holds a node the part owns"),
    (lambda a, c: {"halo_ids": a["halo_ids"][::-1]}, "halo_ids.npy is not strictly ascending"),
    (lambda a, c: {"halo_ids": a["halo_ids"][1:]}, "halo_x.npy has"),
    (_halo_missing_a_neighbour, "halo_ids.npy lacks a neighbour the part's edges or events reach"),
    (lambda a, c: {"halo_x": a["halo_x"][1:]}, "halo_x.npy has"),
    ("stats.edges_per_part", "indices.npy holds"),
    ("stats.halo_nodes_per_part", "stats.halo_nodes_per_part says"),
]
TEMPORAL_TAMPER = [
    (lambda a, c: {"eid": a["eid"][[1, 0, *range(2, a["eid"].size)]]}, "eid.npy is not strictly ascending"),
    (_with("eid", -1, 4000), "eid.npy holds 4000, outside [0, 4000)"),
    (_with("src", 0, 300), "src.npy holds 300, outside [0, 300)"),
    (_with("dst", 0, -5), "dst.npy holds -5, outside [0, 300)"),
    (lambda a, c: {"src": a["src"][:-1]}, "src.npy has"),
    (lambda a, c: {"edge_label": a["edge_label"][:-1]}, "edge_label.npy has"),
    (_with("t", 5, np.nan), "t.npy holds NaN or inf"),
    (lambda a, c: {"t": a["t"][::-1].copy()}, "t.npy is not in time order"),
    (_with("edge_feat", (0, 0), np.inf), "edge_feat.npy holds NaN or inf"),
    (lambda a, c: {"edge_label": a["edge_label"].astype(np.float32)}, "edge_label.npy is <f4"),
    (_event_touching_nothing, "touches no node of the part and no replicated hub"),
    (lambda a, c: {"halo_ids": np.setdiff1d(a["halo_ids"], a["dst"][_foreign_non_hub(a, c)[:1]])},
     "halo_ids.npy holds"),
    ("stats.events_per_part", "the part owns"),
    ("stats.stored_events_per_part", "eid.npy holds"),
]


def _spoil_stats(key):
    """Move one unit of stats[key] from part 0 to part 1 (sums unchanged)."""
    def edit(meta):
        meta["stats"][key][0] += 1
        meta["stats"][key][1] -= 1
    return edit


@pytest.mark.parametrize("kind,edit,msg", [("static", *c) for c in STATIC_TAMPER]
                         + [("temporal", *c) for c in TEMPORAL_TAMPER])
def test_tampered_arrays_are_named_on_load(stores, tmp_path, kind, edit, msg):
    """A store whose arrays, or whose meta.json counts, were changed with every checksum fixed up
    is refused on load and by --verify, with one line naming the part, the file and the problem."""
    store = tmp_path / "s"
    shutil.copytree(stores[kind], store)
    intact = load_partition(store, 1)
    if isinstance(edit, str):
        rewrite(store, meta_edit=_spoil_stats(edit.split(".")[1]))
    else:
        arrays = {k: getattr(intact, k) for k in read_store_meta(store)["arrays"]}
        context = {"n": intact.num_nodes, "start": intact.start, "stop": intact.stop, "hubs": intact.hub_ids,
                   "orig_ids": intact.orig_ids}
        rewrite(store, {f"part1/{k}.npy": v for k, v in edit(arrays, context).items()})
    for call, part in ((lambda: load_partition(store, 1), "part 1"), (lambda: verify_store(store), "part")):
        with pytest.raises(GnndistError) as e:
            call()  # verify meets a stats edit in part 0 first
        text = str(e.value)
        assert msg in text and "\n" not in text and (part in text or "part1/" in text), text
        assert text.endswith("rewrite the store with `gnndist partition`"), text


def test_id_maps_are_checked(stores, tmp_path):
    store = tmp_path / "s"
    shutil.copytree(stores["temporal"], store)
    good = np.load(store / "orig_to_new.npy")
    start = read_store_meta(store)["node_offsets"][1]
    swapped = good.copy()
    a, b = int(np.flatnonzero(good == 0)[0]), int(np.flatnonzero(good == start)[0])  # nodes of parts 0 and 1
    swapped[[a, b]] = swapped[[b, a]]
    rewrite(store, {"orig_to_new.npy": swapped})
    assert np.array_equal(load_id_maps(store)[1], swapped)  # still a permutation: only --verify can tell
    with pytest.raises(GnndistError, match=r"part 0: orig_ids\.npy disagrees with orig_to_new\.npy"):
        verify_store(store)
    for bad in (np.r_[good[1:], good[:1]][:-1], np.where(good == 1, 0, good), good.astype(np.int32)):
        rewrite(store, {"orig_to_new.npy": bad})
        with pytest.raises(GnndistError, match=r"orig_to_new\.npy is not a permutation of the 300 node ids"):
            load_id_maps(store)


def test_missing_parts_say_to_copy_them(stores, tmp_path):
    """A host of a multi-host run holds meta.json, the id maps and its own part only."""
    store = tmp_path / "s"
    shutil.copytree(stores["temporal"], store)
    shutil.rmtree(store / "part2")
    assert load_partition(store, 0).part_id == 0 and load_id_maps(store)[0].size == 300
    for call in (lambda: load_partition(store, 2), lambda: verify_store(store)):
        with pytest.raises(GnndistError, match=r"is missing part2/ \(the files of part 2\): copy it from the host "
                           r"that wrote the store, or rewrite the store with `gnndist partition`"):
            call()
    (store / "part1" / "t.npy").unlink()
    (store / "part1" / "t.npy").mkdir()
    with pytest.raises(GnndistError, match=r"is missing part1/t\.npy is not a regular file: copy it from the host"):
        load_partition(store, 1)
    (store / "orig_to_new.npy").unlink()
    with pytest.raises(GnndistError, match=r"is missing orig_to_new\.npy: copy it from the host"):
        load_id_maps(store)


def test_meta_json_proves_itself(stores, tmp_path):
    store = tmp_path / "s"
    shutil.copytree(stores["static"], store)
    meta = json.loads((store / "meta.json").read_text())
    assert meta["meta_sha256"] == pstore.meta_checksum(meta) and meta["format_version"] == 2
    (store / "meta.json").write_text(json.dumps(meta, indent=None, sort_keys=True))  # layout is not content
    assert verify_store(store) == len(meta["files"]) == 1 + 2 * len(meta["arrays"])
    for edit in (lambda m: m.update(num_nodes=m["num_nodes"] - 1), lambda m: m["stats"].update(edge_cut_fraction=0.0),
                 lambda m: m.pop("meta_sha256"), lambda m: m["files"].update({"part0/x.npy": "0" * 64})):
        m = json.loads(json.dumps(meta))
        edit(m)
        (store / "meta.json").write_text(json.dumps(m))
        with pytest.raises(GnndistError, match="meta.json does not match its checksum"):
            read_store_meta(store)
    old = {k: v for k, v in meta.items() if k not in ("meta_sha256", "arrays")} | {"format_version": 1}
    (store / "meta.json").write_text(json.dumps(old))  # a store written before meta.json had a checksum
    with pytest.raises(GnndistError, match=f"{store} was written in partition store format 1; this gnndist reads "
                       "format 2: rewrite the store with `gnndist partition`"):
        load_partition(store, 0)
    partition_graph(load("synthetic-static", num_nodes=100, num_edges=300), 2, out=store)  # and that replaces it
    assert read_store_meta(store)["num_nodes"] == 100
    for nested in ("[" * 100_000 + "]" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000):
        (store / "meta.json").write_text(nested)
        with pytest.raises(GnndistError, match="nested too deeply to be a store's meta.json"):
            read_store_meta(store)


def test_default_time_windows_are_as_many_as_the_events_fill():
    """Without --time-windows a temporal split takes 4 windows, or fewer where 4 would hold under
    10 events per part each (150 events, 4 parts: 3); a count given is checked as before."""
    g = load("synthetic-temporal", num_nodes=100, num_events=150)
    assert partition_graph(g, 4).params["time_windows"] == 150 // (10 * 4) == 3
    assert partition_graph(g, 2).params["time_windows"] == 4
    with pytest.raises(GnndistError, match="--time-windows must be from 1 to 3 .* got 4"):
        partition_graph(g, 4, time_windows=4)


def test_the_cache_of_a_graph_split_for_training_tells_apart_every_array_it_holds():
    """`launch.store_dir` of an in-memory graph: a store holds features, labels, masks and edge
    features, so a graph that differs in any of them gets a store of its own (a store made
    from the same structure with other labels used to be reused)."""
    import dataclasses
    from gnndist.runtime.launch import Split, store_dir
    g, tg = load("synthetic-static", num_nodes=100, num_edges=300), load("synthetic-temporal", num_nodes=50, num_events=300)
    split = Split("static", "metis")
    same = dataclasses.replace(g)
    assert store_dir(same, 2, split) == store_dir(g, 2, split)
    for change in (dict(y=(g.y + 1) % (g.y.max() + 1)), dict(x=g.x * 2), dict(train_mask=~g.train_mask),
                   dict(test_mask=None)):
        assert store_dir(dataclasses.replace(g, **change), 2, split) != store_dir(g, 2, split), change
    assert store_dir(dataclasses.replace(tg, edge_feat=tg.edge_feat + 1), 2, split) != store_dir(tg, 2, split)
    assert store_dir(dataclasses.replace(tg, num_nodes=60), 2, split) != store_dir(tg, 2, split)
