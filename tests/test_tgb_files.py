"""TGB's files (and JODIE's CSV) read as TGB's and PyG's own loaders read them: generated files in
each layout, compared with py-tgb's `pre_process` functions and PyG's `JODIEDataset`."""
import zipfile
from pathlib import Path

import numpy as np
import pytest

from gnndist.datasets import load
from gnndist.datasets.formats import load_csv
from gnndist.datasets.tgb import GENRE_CLASSES, load_tgb
from gnndist.errors import GnndistError

pre_process = pytest.importorskip("tgb.utils.pre_process")


def jodie_csv(path: Path, users: int = 30, items: int = 12, events: int = 400, features: int = 172) -> np.ndarray:
    """A CSV in JODIE's layout (header, then `user,item,ts,state_label,features...`); its rows."""
    rng = np.random.default_rng(0)
    u = np.concatenate([np.arange(users), rng.integers(0, users, events - users)])
    i = np.concatenate([np.arange(items), rng.integers(0, items, events - items)])[:events]
    rows = np.column_stack([u, i, np.sort(rng.uniform(0, 1e5, events)).round(),  # whole seconds, as "36.0"
                            rng.random(events) < 0.05,
                            rng.normal(size=(events, features)).round(4)])
    with open(path, "w") as f:
        f.write("user_id,item_id,timestamp,state_label,comma_separated_list_of_features\n")
        for r in rows:
            f.write(f"{int(r[0])},{int(r[1])},{r[2]},{int(r[3])}," + ",".join(f"{x:g}" for x in r[4:]) + "\n")
    return rows


def string_events(path: Path, header: str, names: list[str], other: list[str], n: int, zero_weights: bool = False):
    """`ts,a,b,w` lines, sorted by time, a from `names`, b from `other`; returns (ts, a, b, w)."""
    rng = np.random.default_rng(1)
    ts = np.sort(rng.integers(1_600_000_000, 1_600_100_000, n))
    a, b = rng.choice(names, n), rng.choice(other, n)
    w = rng.integers(0 if zero_weights else 1, 50, n).astype(float) / 4
    with open(path, "w") as f:
        f.write(header + "\n")
        for row in zip(ts, a, b, w):
            f.write(",".join(map(str, row)) + "\n")
    return ts, a, b, w


def zipped(folder: Path, out: Path) -> str:
    with zipfile.ZipFile(out, "w") as z:
        for f in folder.iterdir():
            z.write(f, f.name)
    return str(out)


def same_graph(a, b) -> None:
    for k in ("src", "dst", "t", "edge_feat", "edge_label", "orig_ids"):
        x, y = getattr(a, k), getattr(b, k)
        assert (x is None) == (y is None) and (x is None or np.array_equal(x, y)), k


def test_jodie_csv_with_172_features_and_state_labels_reads_as_pyg_does(tmp_path):
    torch_geometric = pytest.importorskip("torch_geometric.datasets")
    raw = tmp_path / "pyg" / "wikipedia" / "raw"
    raw.mkdir(parents=True)
    rows = jodie_csv(raw / "wikipedia.csv")
    ref = torch_geometric.JODIEDataset(str(tmp_path / "pyg"), "wikipedia")[0]  # the raw file is there: no download
    g = load_csv(str(raw / "wikipedia.csv"))
    assert g.edge_dim == 172 and g.num_events == len(rows) and g.num_nodes == 30 + 12
    ids = g.orig_ids + np.where(np.arange(g.num_nodes) >= 30, 30, 0)  # PyG numbers items after the largest user
    assert np.array_equal(ids[g.src], ref.src.numpy()) and np.array_equal(ids[g.dst], ref.dst.numpy())
    assert np.array_equal(g.t, ref.t.numpy()) and np.array_equal(g.edge_label, ref.y.numpy())
    assert np.array_equal(g.edge_feat, ref.msg.numpy())
    assert g.edge_label.sum() == rows[:, 3].sum() > 0


def test_tgbl_wiki_reads_as_tgb_does(tmp_path):
    folder = tmp_path / "tgbl_wiki"
    folder.mkdir()
    jodie_csv(folder / "tgbl-wiki_edgelist_v2.csv")
    df, msg, _ = pre_process.load_edgelist_wiki(str(folder / "tgbl-wiki_edgelist_v2.csv"))
    g = load_tgb(str(folder))
    assert np.array_equal(g.orig_ids[g.src], df["u"].to_numpy()) and \
        np.array_equal(g.orig_ids[g.dst], df["i"].to_numpy())
    assert np.array_equal(g.t, df["ts"].to_numpy()) and np.array_equal(g.edge_feat, msg.astype(np.float32))
    same_graph(load_tgb(zipped(folder, tmp_path / "tgbl-wiki-v2.zip")), g)
    same_graph(load(str(tmp_path / "tgbl-wiki-v2.zip")), g)  # a .zip is read as TGB's


def test_tgbl_coin_numbers_string_ids_in_order_of_first_appearance(tmp_path):
    folder = tmp_path / "tgbl_coin"
    folder.mkdir()
    rng = np.random.default_rng(2)
    addresses = [f"0x{rng.integers(1 << 60):015x}" for _ in range(40)]
    string_events(folder / "tgbl-coin_edgelist_v2.csv", "day,src,dst,w", addresses, addresses, 500, zero_weights=True)
    df, _, node_ids = pre_process.csv_to_pd_data_sc(str(folder / "tgbl-coin_edgelist_v2.csv"))
    g = load_tgb(zipped(folder, tmp_path / "tgbl-coin-v2.zip"))
    assert np.array_equal(g.orig_ids[g.src], df["u"].to_numpy()) and \
        np.array_equal(g.orig_ids[g.dst], df["i"].to_numpy())
    assert np.array_equal(g.t, df["ts"].to_numpy())
    assert np.allclose(g.edge_feat[:, 0], df["w"].to_numpy()) and g.edge_dim == 1  # log2(w), a 0 read as 1
    assert np.array_equal(np.sort(g.orig_ids), np.arange(len(node_ids)))


def label_rows(label_dict: dict) -> set:
    """TGB's {ts: {node: weights}} as (ts, node, class, weight) rows of its non-zero weights."""
    return {(float(t), int(n), int(c), float(v[c])) for t, nodes in label_dict.items() for n, v in nodes.items()
            for c in np.flatnonzero(v)}


def our_label_rows(g) -> set:
    """The graph's `node_labels` as (ts, TGB node id, class, weight) rows."""
    lab = g.node_labels
    return {(float(t), int(g.orig_ids[n]), int(c), float(w)) for t, n, c, w in zip(lab.t, lab.node, lab.cls, lab.weight)}


def test_tgbn_trade_and_its_labels_read_as_tgb_does(tmp_path):
    folder = tmp_path / "tgbn_trade"
    folder.mkdir()
    nations = [f"Nation {k}" for k in range(15)]
    string_events(folder / "tgbn-trade_edgelist.csv", "year,nation,trading nation,weight", nations, nations, 300)
    string_events(folder / "tgbn-trade_node_labels.csv", "year,nation,trading nation,weight", nations[:10],
                  nations, 80)
    df, feat, node_ids = pre_process.load_edgelist_trade(str(folder / "tgbn-trade_edgelist.csv"))
    ref = pre_process.load_trade_label_dict(str(folder / "tgbn-trade_node_labels.csv"), node_ids)
    g = load_tgb(str(folder))
    assert np.array_equal(g.orig_ids[g.src], df["u"].to_numpy()) and \
        np.array_equal(g.orig_ids[g.dst], df["i"].to_numpy())
    assert np.array_equal(g.edge_feat, feat.astype(np.float32))
    lab = g.node_labels
    assert lab.num_classes == len(node_ids) == 15
    ours = our_label_rows(g)
    assert ours == label_rows(ref) and len(ours) == lab.t.size  # no (time, node, class) twice in these files


def test_tgbn_genre_and_its_labels_read_as_tgb_does(tmp_path):
    folder = tmp_path / "tgbn_genre"
    folder.mkdir()
    users, genres = [f"user_{k:06d}" for k in range(25)], ["rock", "jazz", "rock en español", "pop", "metal"]
    string_events(folder / "tgbn-genre_edgelist.csv", "ts,user_id,genre,weight", users, genres, 400)
    string_events(folder / "tgbn-genre_node_labels.csv", "ts,user_id,genre,weight", users[:20], genres, 60)
    df, feat, node_ids, label_ids = pre_process.load_edgelist_datetime(str(folder / "tgbn-genre_edgelist.csv"),
                                                                       label_size=GENRE_CLASSES)
    ref = pre_process.load_label_dict(str(folder / "tgbn-genre_node_labels.csv"), node_ids, label_ids)
    g = load_tgb(zipped(folder, tmp_path / "tgbn-genre.zip"))
    assert np.array_equal(g.orig_ids[g.src], df["u"].to_numpy()) and \
        np.array_equal(g.orig_ids[g.dst], df["i"].to_numpy())
    assert g.orig_ids.min() == 0 and g.orig_ids[g.src].min() == GENRE_CLASSES  # users after TGB's 513 genres
    lab = g.node_labels
    ours = our_label_rows(g)
    assert lab.num_classes == GENRE_CLASSES and ours == label_rows(ref)


def test_what_tgb_files_cannot_be(tmp_path):
    folder = tmp_path / "x"
    folder.mkdir()
    (folder / "tgbl-flight_edgelist_v2.csv").write_text("ts,src,dst,callsign,typecode\n1,a,b,c,d\n")
    with pytest.raises(GnndistError, match="tgbl-flight is not a TGB dataset gnndist reads"):
        load_tgb(str(folder))
    (folder / "tgbl-flight_edgelist_v2.csv").unlink()
    (folder / "tgbn-trade_edgelist.csv").write_text("year,a,b,w\n2000,A,B,1\n")
    with pytest.raises(GnndistError, match="no tgbn-trade_node_labels.csv beside the edge list"):
        load_tgb(str(folder))
    (folder / "tgbn-trade_node_labels.csv").write_text("year,a,b,w\n2000,A,C,1\n")
    with pytest.raises(GnndistError, match="tgbn-trade_node_labels.csv: node 'C' does not occur in the edge list"):
        load_tgb(str(folder))
    (folder / "tgbn-trade_edgelist.csv").write_text("year,a,b,w\n2000,A,B,heavy\n")
    with pytest.raises(GnndistError, match="tgbn-trade_edgelist.csv: field 4 must hold numbers, got string"):
        load_tgb(str(folder))
    (folder / "tgbn-trade_edgelist.csv").unlink()
    (folder / "tgbl-wiki_edgelist_v2.csv").write_text("u,i,ts,label,f\n1.5,2,3,0,0.1\n")
    with pytest.raises(GnndistError, match=r"tgbl-wiki_edgelist_v2.csv: field 1 must hold integers, got float64 "
                                           r"value 1.5"):
        load_tgb(str(folder))
    (tmp_path / "bad.zip").write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(GnndistError, match="bad.zip: not a readable zip archive"):
        load_tgb(str(tmp_path / "bad.zip"))


def test_a_tgb_dataset_by_name_keeps_its_labels_in_the_converted_form(tmp_path, monkeypatch):
    """tgbn-trade by name, from a mirror that is a folder (file://): read twice, the second time
    from the converted arrays, labels included."""
    from gnndist.datasets.catalog import CATALOG, CONVERTED

    folder = tmp_path / "tgbn_trade"
    folder.mkdir()
    nations = [f"Nation {k}" for k in range(15)]
    string_events(folder / "tgbn-trade_edgelist.csv", "year,nation,trading nation,weight", nations, nations, 300)
    string_events(folder / "tgbn-trade_node_labels.csv", "year,nation,trading nation,weight", nations, nations, 80)
    url = CATALOG["tgbn-trade"].files[0].url
    served = tmp_path / "mirror" / url.split("://", 1)[1]
    served.parent.mkdir(parents=True)
    zipped(folder, served)
    monkeypatch.setenv("GNNDIST_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("GNNDIST_DATA_MIRROR", (tmp_path / "mirror").as_uri())
    first, again = load("tgbn-trade"), load("tgbn-trade")
    assert (tmp_path / "data" / "tgbn-trade" / CONVERTED / "node_labels.cls.npy").is_file()
    ref = load_tgb(str(served))
    for g in (first, again):
        same_graph(g, ref)
        for k in ("t", "node", "cls", "weight"):
            assert np.array_equal(getattr(g.node_labels, k), getattr(ref.node_labels, k)), k
        assert g.node_labels.num_classes == ref.node_labels.num_classes == 15


def test_first_appearance_numbering_across_arrow_chunks():
    """Large files reach the numbering in several chunks; ids still follow TGB's line-by-line order."""
    import pyarrow as pa

    from gnndist.datasets.tgb import _first_seen

    a = pa.chunked_array([["x", "y", "z"], ["y", "w", "x"], ["q"]])
    b = pa.chunked_array([["y"], ["w", "x", "v", "q", "q", "a"]])
    (src, dst), _, _ = _first_seen(a, b)
    ids: dict = {}
    for u, v in zip(a.to_pylist(), b.to_pylist()):
        ids.setdefault(u, len(ids))
        ids.setdefault(v, len(ids))
    assert src.tolist() == [ids[u] for u in a.to_pylist()] and dst.tolist() == [ids[v] for v in b.to_pylist()]
