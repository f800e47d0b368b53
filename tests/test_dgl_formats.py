"""DGL's on-disk formats read without DGL: CSVDataset folders (meta.yaml) and chunked graphs
(metadata.json), written here as DGL's user guide (4.6) and its chunk writers
(tools/chunk_graph.py, tools/distpartitioning/array_readwriter) lay them out, give back the graph
they were written from; bad folders are one line; a chunked graph partitioned by two ranks
gives the store of one process."""
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from gnndist.cli import main
from gnndist.datasets import load
from gnndist.datasets.registry import data_kind, detect_format
from gnndist.datasets.shards import open_nodes, open_shards
from gnndist.graph import MASKS, Graph, TemporalGraph


def static_graph(n: int = 120, e: int = 500, seed: int = 0) -> Graph:
    """An undirected graph (duplicates and self-loops drawn too) with features, labels and a split."""
    rng = np.random.default_rng(seed)
    split = rng.integers(0, 3, n)
    return Graph.from_edges(rng.integers(0, n, e), rng.integers(0, n, e), num_nodes=n, undirected=True, dedup=True,
                            x=rng.normal(size=(n, 5)).astype(np.float32), y=rng.integers(0, 4, n),
                            train_mask=split == 0, val_mask=split == 1, test_mask=split == 2)


def same_graph(got: Graph, want: Graph) -> None:
    for name in ("indptr", "indices", "x", "y", *MASKS):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name


# ---------------------------------------------------------------- CSVDataset

def numbers(row: np.ndarray) -> str:
    """A row of features as DGL's guide writes them: a quoted, comma-separated list."""
    return '"' + ", ".join(repr(float(v)) for v in row) + '"'


def write_dgl_csv(folder: Path, meta: str, nodes: list[str], edges: list[str]) -> Path:
    folder.mkdir()
    (folder / "meta.yaml").write_text(meta)
    (folder / "nodes.csv").write_text("\n".join(nodes) + "\n")
    (folder / "edges.csv").write_text("\n".join(edges) + "\n")
    return folder


META = "dataset_name: {name}\nedge_data:\n- file_name: edges.csv\nnode_data:\n- file_name: nodes.csv\n"


def test_a_csv_dataset_folder_gives_the_static_graph_with_features_labels_and_split(tmp_path):
    g = static_graph()
    rng = np.random.default_rng(1)
    ids = rng.permutation(g.num_nodes) * 7 - 30  # any distinct integers, listed in no order
    rows = rng.permutation(g.num_nodes)
    nodes = ["node_id,label,train_mask,val_mask,test_mask,feat"] + [
        f"{ids[v]},{g.y[v]},{g.train_mask[v]},{g.val_mask[v]},{g.test_mask[v]},{numbers(g.x[v])}" for v in rows]
    src, dst = g.edges()
    one_way = src <= dst  # DGL's edges are directed; gnndist makes a static graph's edges undirected
    edges = ["src_id,dst_id,weight"] + [f"{ids[a]},{ids[b]},0.5" for a, b in zip(src[one_way], dst[one_way])]
    folder = write_dgl_csv(tmp_path / "d", META.format(name="mini"), nodes, edges)
    assert detect_format(str(folder)) == "dgl-csv" and data_kind(str(folder)) == "static"
    got = load(str(folder))
    order = np.argsort(ids)  # nodes are numbered in order of their id, as DGL numbers them
    want = Graph.from_edges(np.argsort(order)[src], np.argsort(order)[dst], num_nodes=g.num_nodes, undirected=True,
                            dedup=True, x=g.x[order], y=g.y[order], **{m: getattr(g, m)[order] for m in MASKS})
    same_graph(got, want)
    assert np.array_equal(got.orig_ids, ids[order])


def test_a_csv_dataset_whose_edges_have_a_time_column_is_temporal(tmp_path):
    rng = np.random.default_rng(2)
    n, e = 30, 200
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    t, label, feat = rng.integers(0, 50, e).astype(float), rng.integers(0, 2, e), rng.normal(size=(e, 3))
    edges = ["src,dst,timestamp,label,feat"] + [
        f"{a},{b},{ts},{y},{numbers(f)}" for a, b, ts, y, f in zip(src + 100, dst + 100, t, label, feat)]
    meta = ("version: 1.0.0\ndataset_name: events\nseparator: ','\nedge_data:\n- file_name: edges.csv\n"
            "  etype: [user, message, user]\n  src_id_field: src\n  dst_id_field: dst\n"
            "node_data:\n- file_name: nodes.csv\n  ntype: user\n")
    folder = write_dgl_csv(tmp_path / "d", meta, ["node_id"] + [str(v + 100) for v in range(n)], edges)
    assert data_kind(str(folder)) == "temporal"
    got = load(str(folder))
    want = TemporalGraph(src, dst, t, feat.astype(np.float32), label, num_nodes=n, sort=True)
    for name in ("src", "dst", "t", "edge_feat", "edge_label"):
        assert np.array_equal(getattr(got, name), getattr(want, name)), name
    assert got.num_nodes == n and np.array_equal(got.orig_ids, np.arange(n) + 100)


# ---------------------------------------------------------------- chunked graph

def chunk_sizes(total: int, chunks: int) -> list[int]:
    """As DGL's chunk_graph.py splits: the first total % chunks chunks one larger."""
    return [total // chunks + (i < total % chunks) for i in range(chunks)]


def write_array(path: Path, a: np.ndarray, fmt: str, delimiter: str = " ", vector_rows: bool = False) -> None:
    """One chunk as DGL's array writers write it (tools/distpartitioning/array_readwriter)."""
    if fmt == "numpy":
        np.save(path, a)
    elif fmt == "csv":
        table = pa.table({str(j): a[:, j] for j in range(a.shape[1])})
        pacsv.write_csv(table, path, pacsv.WriteOptions(include_header=False, delimiter=delimiter))
    elif vector_rows:
        pq.write_table(pa.table([pa.array(a.tolist())], names=["vector"]), path)
    else:
        cols = a.reshape(len(a), -1)
        table = pa.table({str(j): cols[:, j] for j in range(cols.shape[1])})
        pq.write_table(table.replace_schema_metadata({"shape": str(a.shape)}), path)


def write_chunked(folder: Path, g: Graph, edges: str = "csv", delimiter: str = " ", nodes: str = "numpy",
                  vector_rows: bool = False, absolute: bool = False, edge_chunks: int = 3, node_chunks: int = 2
                  ) -> Path:
    """g in DGL's chunked graph format: every CSR entry an edge (both directions), the edge
    chunks named .txt whatever their format (as DGL's test writer names them)."""
    folder.mkdir()
    (folder / "edge_index").mkdir()
    (folder / "node_data").mkdir()
    src, dst = g.edges()
    pairs = np.stack([src, dst], axis=1)
    name = (lambda p: str(folder / p)) if absolute else str
    files, at = [], 0
    for i, k in enumerate(chunk_sizes(len(pairs), edge_chunks)):
        files.append(f"edge_index/_N:_E:_N{i}.txt")
        write_array(folder / files[-1], pairs[at:at + k], edges, delimiter)
        at += k
    fmt = {"name": edges, **({"delimiter": delimiter} if edges == "csv" else {})}
    node_data = {}
    for key, a in (("feat", g.x), ("label", g.y), *((m, getattr(g, m)) for m in MASKS), ("year", g.y * 0 + 2000)):
        chunks, at = [], 0
        for i, k in enumerate(chunk_sizes(g.num_nodes, node_chunks)):
            chunks.append(f"node_data/{key}-{i}.{'npy' if nodes == 'numpy' else 'parquet'}")
            write_array(folder / chunks[-1], a[at:at + k], nodes, vector_rows=vector_rows and key == "feat")
            at += k
        node_data[key] = {"format": {"name": nodes}, "data": [name(c) for c in chunks]}
    meta = {"graph_name": "g", "node_type": ["_N"], "num_nodes_per_chunk": [chunk_sizes(g.num_nodes, node_chunks)],
            "edge_type": ["_N:_E:_N"], "num_edges_per_chunk": [chunk_sizes(len(pairs), edge_chunks)],
            "edges": {"_N:_E:_N": {"format": fmt, "data": [name(f) for f in files]}},
            "node_data": {"_N": node_data}, "edge_data": {}}
    (folder / "metadata.json").write_text(json.dumps(meta, indent=4))
    return folder


CHUNKED = {"csv-numpy": {}, "parquet-parquet": {"edges": "parquet", "nodes": "parquet"},
           "comma-vectors-absolute": {"delimiter": ",", "nodes": "parquet", "vector_rows": True, "absolute": True},
           "tab-one-chunk": {"delimiter": "\t", "edge_chunks": 1, "node_chunks": 1}}


@pytest.mark.parametrize("case", CHUNKED)
def test_a_chunked_graph_gives_the_graph_it_was_written_from(tmp_path, case):
    g = static_graph()
    folder = write_chunked(tmp_path / "c", g, **CHUNKED[case])
    assert detect_format(str(folder)) == "dgl-chunked" and data_kind(str(folder)) == "static"
    got = load(str(folder))
    same_graph(got, g)
    assert np.array_equal(got.orig_ids, np.arange(g.num_nodes))


def test_chunked_node_data_reads_the_rows_asked_for(tmp_path):
    g = static_graph()
    nodes = open_nodes(open_shards(str(write_chunked(tmp_path / "c", g, nodes="parquet", node_chunks=4))))
    rows = np.array([119, 0, 31, 30, 64, 0])  # across chunks, out of order, repeated
    assert np.array_equal(nodes.arrays["x"][rows], g.x[rows]) and np.array_equal(nodes.arrays["y"][rows], g.y[rows])
    assert np.array_equal(np.asarray(nodes.arrays["test_mask"]), g.test_mask)


def test_a_chunked_graph_partitioned_by_two_ranks_is_one_process_s_store(tmp_path):
    folder = write_chunked(tmp_path / "c", static_graph(n=300, e=1500), edges="parquet", edge_chunks=4)
    stores = {}
    for nproc in ("1", "2"):
        stores[nproc] = tmp_path / f"store{nproc}"
        assert main(["partition", str(folder), "--parts", "2", "--out", str(stores[nproc]), "--nproc", nproc,
                     "--quiet"]) == 0
    one, two = (json.loads((stores[k] / "meta.json").read_text()) for k in ("1", "2"))
    assert one["files"] == two["files"] and one["num_nodes"] == 300


# ---------------------------------------------------------------- bad folders

def _edit(folder: Path, name: str, fn) -> None:
    path = folder / name
    if name.endswith(".json"):
        path.write_text(json.dumps(fn(json.loads(path.read_text()))))
    else:
        path.write_text(fn(path.read_text()))


def _hetero_nodes(meta: dict) -> dict:
    meta["node_type"] = ["paper", "author"]
    meta["num_nodes_per_chunk"].append([1, 1])
    return meta


def _missing_chunk(meta: dict) -> dict:
    meta["edges"]["_N:_E:_N"]["data"].append("edge_index/gone.txt")
    return meta


BAD = {
    "no edge_data": ("csv", "meta.yaml", lambda s: "dataset_name: x\nnode_data:\n- file_name: nodes.csv\n",
                     "meta.yaml: no edge_data"),
    "two node files": ("csv", "meta.yaml", lambda s: s + "- file_name: nodes.csv\n  ntype: item\n",
                       "node_data lists 2 files and edge_data 1: a heterograph"),
    "graph_data": ("csv", "meta.yaml", lambda s: s + "graph_data:\n  file_name: graphs.csv\n",
                   "graph_data makes a dataset of several graphs"),
    "unknown node id": ("csv", "edges.csv", lambda s: s + "0,99\n", "edges.csv:3: node id 99 is not in"),
    "feature lists of two lengths": ("csv", "nodes.csv", lambda s: s + '2,"1.0, 2.0, 3.0"\n',
                                     "nodes.csv:4: feat holds 3 numbers, the first row 2"),
    "a missing chunk": ("chunked", "metadata.json", _missing_chunk,
                        "gone.txt: no such file (" ),
    "two node types": ("chunked", "metadata.json", _hetero_nodes, "gnndist reads chunked graphs of one node type"),
    "no edges key": ("chunked", "metadata.json", lambda m: {k: v for k, v in m.items() if k != "edges"},
                     "metadata.json: edges is missing"),
    "numpy edges": ("chunked", "metadata.json",
                    lambda m: {**m, "edges": {"_N:_E:_N": {**m["edges"]["_N:_E:_N"], "format": {"name": "numpy"}}}},
                    "has format 'numpy'; DistDGL's pipeline reads these chunks as csv or parquet"),
    "an edge beyond the nodes": ("chunked", "edge_index/_N:_E:_N1.txt", lambda s: s + "3 120\n",
                                 "_N:_E:_N1.txt: row "),
    "too few feature rows": ("chunked", "metadata.json",
                             lambda m: {**m, "num_nodes_per_chunk": [[60, 61]]}, "node_data feat: its chunks hold 120"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_folder_is_one_line(tmp_path, capsys, case):
    kind, name, edit, expect = BAD[case]
    if kind == "csv":
        folder = write_dgl_csv(tmp_path / "d", META.format(name="bad"), ["node_id,feat", '0,"1.0, 2.0"',
                                                                          '1,"3.0, 4.0"'], ["src_id,dst_id", "0,1"])
    else:
        folder = write_chunked(tmp_path / "d", static_graph())
    _edit(folder, name, edit)
    assert main(["datasets", str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gnndist datasets: error: ") and expect in err[0], err
