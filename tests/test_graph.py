"""The data model: validation, CSR/T-CSR construction, conversions (networkx, PyG)."""
import networkx as nx
import numpy as np
import pytest
import torch

from gnndist import GnndistError, Graph, TemporalGraph


def random_graph(n=30, m=120, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, n, m), rng.integers(0, n, m)


def test_csr_holds_exactly_the_input_edges():
    src, dst = random_graph()
    g = Graph.from_edges(src, dst, num_nodes=30)
    assert g.num_nodes == 30 and g.num_edges == len(src)
    s, d = g.edges()
    assert sorted(zip(s.tolist(), d.tolist())) == sorted(zip(src.tolist(), dst.tolist()))
    for v in range(30):  # row v lists the sources of edges into v
        assert sorted(g.indices[g.indptr[v]:g.indptr[v + 1]].tolist()) == sorted(src[dst == v].tolist())


def test_undirected_dedup_matches_networkx():
    src, dst = random_graph()
    keep = src != dst
    g = Graph.from_edges(src[keep], dst[keep], num_nodes=30, undirected=True, dedup=True)
    ref = nx.Graph()
    ref.add_nodes_from(range(30))
    ref.add_edges_from(zip(src[keep].tolist(), dst[keep].tolist()))
    assert g.num_edges == 2 * ref.number_of_edges()
    assert nx.utils.graphs_equal(nx.Graph(g.to_networkx()), ref)
    back = Graph.from_networkx(ref)
    assert np.array_equal(back.indptr, g.indptr) and np.array_equal(back.indices, g.indices)


def test_pyg_round_trip_keeps_features_and_masks():
    src, dst = random_graph()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((30, 4)).astype(np.float32)
    y = rng.integers(0, 3, 30)
    mask = rng.random(30) < 0.5
    g = Graph.from_edges(src, dst, num_nodes=30, x=x, y=y, train_mask=mask)
    data = g.to_pyg()
    assert data.edge_index.shape == (2, len(src)) and torch.equal(data.x, torch.from_numpy(x))
    back = Graph.from_pyg(data)
    assert np.array_equal(back.indptr, g.indptr) and np.array_equal(back.indices, g.indices)
    assert np.array_equal(back.x, x) and np.array_equal(back.y, y) and np.array_equal(back.train_mask, mask)


@pytest.mark.parametrize("bad, match", [
    (dict(indptr=[0, 2], indices=[0]), "indices has 1"),
    (dict(indptr=[0, 1], indices=[5]), "num_nodes"),
    (dict(indptr=[0, 1], indices=[-1]), "negative"),
    (dict(indptr=[0, 1], indices=[0], x=np.array([[np.nan]])), "NaN"),
    (dict(indptr=[0, 1], indices=[0], y=[0, 1]), "rows"),
    (dict(indptr=[1, 1], indices=[]), "starting at 0"),
    (dict(indptr="abc", indices=[0]), "indptr must be an array of numbers"),
    (dict(indptr=[0, 1, 2], indices=[1, 0], x=np.ones(2)), r"x must be a 2-d array with at least one column, got shape \(2,\)"),
    (dict(indptr=[0, 1, 2], indices=[1, 0], x=np.ones((2, 0))), r"x must be a 2-d array .* got shape \(2, 0\)"),
    (dict(indptr=[0, 1, 2], indices=[1, 0], y=[-1, 0]), r"y must hold class ids 0, 1, 2, ... \(integers >= 0\), got -1"),
    (dict(indptr=[0, 1, 2], indices=[1, 0], y=[0.5, 1]), "y must hold class ids .* got 0.5"),
    (dict(indptr=[0, 1.5], indices=[0]), "indptr must hold integers"),
    (dict(indptr=[0, 1, 2], indices=[1, 0], x=[["1"], ["2"]]), "x must be an array of numbers, got <U1"),
    (dict(indptr=[0, 1, 2], indices=[1, 0], y=[[0], [1]]), r"y must be a 1-d array, got shape \(2, 1\)"),
    (dict(indptr=[0, 1, 2], indices=[1, 0], train_mask=["a", "b"]), "train_mask must be an array of numbers"),
    (dict(indptr=[0, 1, 2], indices=[1, 0], val_mask=[2, 0]), r"val_mask must hold True/False \(or 0/1\)"),
])
def test_graph_validation(bad, match):
    with pytest.raises(GnndistError, match=match):
        Graph(**bad)


def test_temporal_validation_and_sort():
    with pytest.raises(GnndistError, match="NaN"):
        TemporalGraph([0], [1], [np.nan])
    with pytest.raises(GnndistError, match="equal lengths"):
        TemporalGraph([0, 1], [1], [0.0, 1.0])
    with pytest.raises(GnndistError, match="negative"):
        TemporalGraph([0, -1], [1, 1], [0.0, 1.0])
    with pytest.raises(GnndistError, match="not sorted"):
        TemporalGraph([0, 1], [1, 2], [2.0, 1.0])
    with pytest.raises(GnndistError, match="num_nodes"):
        TemporalGraph([0, 1], [1, 2], [1.0, 2.0], num_nodes=2)
    for kw, message in ((dict(num_nodes="x"), "num_nodes must be an integer >= 0, got 'x'"),
                        (dict(edge_feat=[["a"], ["b"]]), "edge_feat must be an array of numbers"),
                        (dict(edge_feat=np.ones((2, 2, 2))), "edge_feat must be a 1-d or 2-d array")):
        with pytest.raises(GnndistError, match=message):
            TemporalGraph([0, 1], [1, 2], [1.0, 2.0], **kw)
    with pytest.raises(GnndistError, match="src must be an array of numbers"):
        TemporalGraph(["a"], ["b"], [0.0])
    with pytest.raises(GnndistError, match="t must be an array of numbers"):
        TemporalGraph([0], [1], ["a"])
    with pytest.raises(GnndistError, match="num_nodes must be an integer >= 0, got 2.5"):
        Graph.from_edges([0], [1], num_nodes=2.5)
    tg = TemporalGraph([0, 1, 2], [1, 2, 0], [3.0, 1.0, 1.0], edge_feat=[1.0, 2.0, 3.0], sort=True)
    assert tg.t.tolist() == [1.0, 1.0, 3.0] and tg.src.tolist() == [1, 2, 0]  # stable
    assert tg.edge_feat[:, 0].tolist() == [2.0, 3.0, 1.0] and tg.num_events == 3 and tg.edge_dim == 1


def test_tcsr_lists_each_event_at_both_endpoints_in_time_order():
    rng = np.random.default_rng(2)
    src, dst = rng.integers(0, 20, 200), rng.integers(0, 20, 200)
    t = np.sort(rng.integers(0, 50, 200)).astype(float)
    tg = TemporalGraph(src, dst, t)
    indptr, nbr, eid, ts = tg.tcsr()
    for v in range(20):
        sl = slice(indptr[v], indptr[v + 1])
        want = [(e, int(dst[e]) if src[e] == v else int(src[e])) for e in range(200) if v in (src[e], dst[e])]
        want += [(e, v) for e in range(200) if src[e] == v == dst[e]]  # self-loop: listed twice
        assert sorted(want) == list(zip(eid[sl].tolist(), nbr[sl].tolist()))
        assert np.all(np.diff(ts[sl]) >= 0) and np.array_equal(ts[sl], t[eid[sl]])


def test_temporal_conversions_round_trip():
    rng = np.random.default_rng(3)
    tg = TemporalGraph(rng.integers(0, 10, 50), rng.integers(0, 10, 50), np.arange(50.0),
                       edge_feat=rng.standard_normal((50, 3)), edge_label=rng.integers(0, 2, 50), num_nodes=12)
    back = TemporalGraph.from_pyg(tg.to_pyg(), num_nodes=12)
    for name in ("src", "dst", "t", "edge_feat", "edge_label"):
        assert np.array_equal(getattr(back, name), getattr(tg, name))
    nxg = tg.to_networkx()
    assert nxg.number_of_edges() == 50 and nxg.number_of_nodes() == 12
    back = TemporalGraph.from_networkx(nxg)
    order = np.lexsort((back.dst, back.src, back.t))
    ref = np.lexsort((tg.dst, tg.src, tg.t))
    assert np.array_equal(back.src[order], tg.src[ref]) and np.array_equal(back.t[order], tg.t[ref])


def test_atomic_writes_replace_whole_or_not_at_all(tmp_path):
    import os
    from gnndist.io import atomic_dir, atomic_file, write_json

    out = tmp_path / "store"
    with atomic_dir(out) as d:
        (d / "a.txt").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_dir(out) as d:
            (d / "a.txt").write_text("new")
            raise RuntimeError("crash mid-write")
    assert (out / "a.txt").read_text() == "old" and sorted(os.listdir(tmp_path)) == ["store"]
    with pytest.raises(RuntimeError):
        with atomic_file(tmp_path / "m.json", "w") as f:
            f.write("{half")
            raise RuntimeError
    assert not (tmp_path / "m.json").exists()
    write_json(tmp_path / "m.json", {"a": 1})
    mask = os.umask(0)
    os.umask(mask)
    assert (out.stat().st_mode & 0o777) == 0o777 & ~mask
    assert ((tmp_path / "m.json").stat().st_mode & 0o777) == 0o666 & ~mask
