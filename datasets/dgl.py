"""DGL's two on-disk graph formats, CSVDataset folders and chunked graphs, read without DGL.

(DGL's PyPI builds do not load with the torch gnndist runs on.)

**CSVDataset folder** (DGL user guide 4.6, "Loading data from CSV files"; read in DGL by
`dgl/data/csv_dataset_base.py`), `load_dgl_csv`: `meta.yaml` names one CSV of nodes and one of
edges:

    dataset_name: NAME
    separator: ','                 # optional, one character
    node_data:
    - file_name: nodes.csv         # node_id_field (default node_id), ntype: optional
    edge_data:
    - file_name: edges.csv         # src_id_field, dst_id_field (default src_id, dst_id), etype: optional

Nodes are numbered in order of their (integer) id, as DGL numbers them; node columns `feat`
(numbers, or a quoted list of them per row: "0.1, 0.2"), `label`, `train_mask`, `val_mask` and
`test_mask` become the graph's x, y and split (`NODE_KEYS`); other columns are not read. A graph
whose edges file has a time column (t, ts, time, timestamp) is temporal: its events carry the
edges' `feat` as edge features and `label` as labels. Else it is static, its edges made
undirected as every static input is. One graph only: several node or edge files (a
heterograph), `graph_data` or several graph ids are refused.

**Chunked graph** (DGL guide 7.1, "Chunked Graph Format": written by DGL's `tools/chunk_graph.py`,
read by DistDGL's `tools/distpartitioning/`), `read_chunked`: `metadata.json` names the chunk
files of a homogeneous graph (one node type, one edge type):

    {"node_type": ["_N"], "num_nodes_per_chunk": [[n0, n1, ...]], "edge_type": ["_N:_E:_N"],
     "edges": {"_N:_E:_N": {"format": {"name": "csv", "delimiter": " "}, "data": ["e0.txt", ...]}},
     "node_data": {"_N": {"feat": {"format": {"name": "numpy"}, "data": ["feat-0.npy", ...]}, ...}}}

Node ids are 0..N-1, N the sum of num_nodes_per_chunk. An edge chunk holds a (src, dst) pair of
node ids per row: CSV without a header (fields split by the delimiter: a space, as DGL writes and
reads them, a tab or a comma) or Parquet with two integer columns. Each node data key's chunks,
in the order listed, give one row per node: `.npy` arrays or Parquet tables as DGL's array writer
makes them (one column per feature; or one list column per row, Spark's vectors). Keys are read
as in CSVDataset (`NODE_KEYS`); edge_data is not read. Paths are relative to the folder, or
absolute. `gnndist.datasets.shards` reads it as shard files (its edge chunks) with node arrays
(its node data), so that several ranks partition it together.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import yaml

from gnndist.datasets.formats import TIME_NAMES
from gnndist.datasets.text import check_regular
from gnndist.errors import GnndistError, first_line
from gnndist.graph import MASKS, Graph, TemporalGraph

META_YAML, METADATA_JSON = "meta.yaml", "metadata.json"
# DGL's names of node (or edge) data -> what gnndist makes of them: node features x, classes y, the split
NODE_KEYS = {"feat": "x", "features": "x", "x": "x", "label": "y", "labels": "y", "y": "y", **{m: m for m in MASKS}}
ONE_GRAPH = "gnndist reads one homogeneous graph: one node_data and one edge_data entry, no graph_data"


def _data_roles(names: Sequence[str], where: str) -> dict[str, str]:
    """x, y and the masks -> the name among `names` that holds each (`NODE_KEYS`).

    GnndistError where two names would hold one."""
    out: dict[str, str] = {}
    for name in names:
        role = NODE_KEYS.get(name)
        if role in out:
            raise GnndistError(f"{where}: both '{out[role]}' and '{name}' would be {role}; keep one")
        if role is not None:
            out[role] = name
    return out


def dgl_format(path: str) -> Optional[str]:
    """"dgl-csv" for a folder holding a meta.yaml (DGL's CSVDataset), "dgl-chunked" for one holding
    a metadata.json (DGL's chunked graph), else None."""
    for name, fmt in ((META_YAML, "dgl-csv"), (METADATA_JSON, "dgl-chunked")):
        if os.path.isdir(path) and os.path.isfile(os.path.join(path, name)):
            return fmt
    return None


def _read_meta(folder: str, name: str) -> tuple[str, dict]:
    """(path, contents) of a folder's meta.yaml (YAML, read as DGL reads it: safe_load) or
    metadata.json, whose contents must be a mapping of keys."""
    path = os.path.join(folder, name)
    check_regular(path)
    language = "YAML" if name == META_YAML else "JSON"
    try:
        with open(path, "rb") as f:
            meta = yaml.safe_load(f) if language == "YAML" else json.load(f)
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise GnndistError(f"{path}: not readable {language} ({first_line(e)})") from None
    if not isinstance(meta, dict):
        raise GnndistError(f"{path}: expected a mapping of keys, got {type(meta).__name__}")
    return path, meta


# ---------------------------------------------------------------- CSVDataset

@dataclass(frozen=True)
class _CsvMeta:
    """What meta.yaml says: the separator, and each file with the names of its id columns."""

    separator: str
    nodes: str  # the nodes CSV's path
    node_id: str
    node_graph_id: str
    edges: str
    src_id: str
    dst_id: str
    edge_graph_id: str


def _field(entry: dict, key: str, default: str, where: str) -> str:
    value = entry.get(key, default)
    if not isinstance(value, str):
        raise GnndistError(f"{where}: {key} must be a column name, got {value!r}")
    return value


def _csv_meta(folder: str) -> _CsvMeta:
    """meta.yaml read and checked: one graph of one node type, its files and id columns."""
    path, meta = _read_meta(folder, META_YAML)
    for key in ("dataset_name", "node_data", "edge_data"):
        if key not in meta:
            raise GnndistError(f"{path}: no {key} (DGL's CSVDataset needs dataset_name, node_data and edge_data)")
    if str(meta.get("version", "1.0.0")) != "1.0.0":
        raise GnndistError(f"{path}: version {meta['version']}; DGL's CSVDataset format has version 1.0.0")
    if "graph_data" in meta:
        raise GnndistError(f"{path}: graph_data makes a dataset of several graphs; {ONE_GRAPH}")
    entries = {}
    for key in ("node_data", "edge_data"):
        value = meta[key]
        if not (isinstance(value, list) and value and all(isinstance(e, dict) and isinstance(e.get("file_name"), str)
                                                           for e in value)):
            raise GnndistError(f"{path}: {key} must be a list of entries, each with a file_name")
        entries[key] = value
    nodes, edges = entries["node_data"], entries["edge_data"]
    if len(nodes) > 1 or len(edges) > 1:
        raise GnndistError(f"{path}: node_data lists {len(nodes)} files and edge_data {len(edges)}: a heterograph; "
                           f"{ONE_GRAPH}")
    node, edge = nodes[0], edges[0]
    ntype, etype = node.get("ntype", "_V"), edge.get("etype", ["_V", "_E", "_V"])
    if not (isinstance(etype, list) and len(etype) == 3 and etype[0] == etype[2] == ntype):
        raise GnndistError(f"{path}: edge type {etype} does not join node type {ntype!r} to itself (a heterograph); "
                           f"{ONE_GRAPH}")
    sep = meta.get("separator", ",")
    if not (isinstance(sep, str) and len(sep) == 1):
        raise GnndistError(f"{path}: separator {sep!r}: gnndist reads a separator of one character")
    return _CsvMeta(sep, os.path.join(folder, node["file_name"]), _field(node, "node_id_field", "node_id", path),
                    _field(node, "graph_id_field", "graph_id", path), os.path.join(folder, edge["file_name"]),
                    _field(edge, "src_id_field", "src_id", path), _field(edge, "dst_id_field", "dst_id", path),
                    _field(edge, "graph_id_field", "graph_id", path))


def _read_csv(path: str, sep: str) -> pa.Table:
    check_regular(path)
    try:
        return pacsv.read_csv(path, parse_options=pacsv.ParseOptions(delimiter=sep),
                              convert_options=pacsv.ConvertOptions(null_values=[""], strings_can_be_null=True))
    except (OSError, pa.ArrowException) as e:
        raise GnndistError(f"{path}: cannot read as CSV ({first_line(e)})") from None


def _column(table: pa.Table, name: str, path: str) -> pa.ChunkedArray:
    """A column by name, checked to have a value in every row (line numbers count the header)."""
    if name not in table.column_names:
        raise GnndistError(f"{path}: no column {name} (columns: {', '.join(table.column_names)})")
    col = table.column(name)
    if col.null_count:
        r = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise GnndistError(f"{path}:{r + 2}: {name} is empty")
    return col


def _ids(table: pa.Table, name: str, path: str) -> np.ndarray:
    col = _column(table, name, path)
    if not pa.types.is_integer(col.type):
        raise GnndistError(f"{path}: column {name} holds {col.type}; gnndist reads integer node ids")
    return col.to_numpy().astype(np.int64)


def _numbers(table: pa.Table, name: str, path: str) -> np.ndarray:
    """A column of numbers (or booleans) [n], or of lists of numbers written as "0.1, 0.2" or
    "[0.1, 0.2]" (one quoted cell per row) [n, k]."""
    col = _column(table, name, path)
    if pa.types.is_boolean(col.type) or pa.types.is_integer(col.type) or pa.types.is_floating(col.type):
        return col.to_numpy()
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        raise GnndistError(f"{path}: column {name} holds {col.type}, expected numbers")
    parts = pc.split_pattern(pc.utf8_trim(col, characters="[]() "), ",")
    lengths = pc.list_value_length(parts).to_numpy(zero_copy_only=False)
    if lengths.size and np.any(lengths != lengths[0]):
        r = int(np.flatnonzero(lengths != lengths[0])[0])
        raise GnndistError(f"{path}:{r + 2}: {name} holds {lengths[r]} numbers, the first row {lengths[0]}")
    try:
        flat = pc.cast(pc.utf8_trim_whitespace(pc.list_flatten(parts)), pa.float64())
    except pa.ArrowInvalid as e:
        raise GnndistError(f"{path}: column {name} is not numbers, nor lists of them ({first_line(e)})") from None
    return flat.to_numpy().reshape(lengths.size, int(lengths[0]) if lengths.size else 0)


def _one_graph(table: pa.Table, field: str, path: str) -> None:
    if field in table.column_names and len(pc.unique(table.column(field))) > 1:
        raise GnndistError(f"{path}: column {field} names {len(pc.unique(table.column(field)))} graphs; {ONE_GRAPH}")


def _time_column(names: Sequence[str], path: str) -> Optional[str]:
    """The edges' time column, if there is one."""
    found = [n for n in names if n.lower() in TIME_NAMES]
    if len(found) > 1:
        raise GnndistError(f"{path}: columns {' and '.join(found)} would both be the time; keep one")
    return found[0] if found else None


def dgl_csv_kind(folder: str) -> str:
    """"temporal" or "static": whether a CSVDataset folder's edges have a time column.

    Told from meta.yaml and the edge file's header, without reading the rest."""
    m = _csv_meta(folder)
    check_regular(m.edges)
    try:
        with pacsv.open_csv(m.edges, parse_options=pacsv.ParseOptions(delimiter=m.separator)) as reader:
            names = reader.schema.names
    except (OSError, pa.ArrowException) as e:
        raise GnndistError(f"{m.edges}: cannot read as CSV ({first_line(e)})") from None
    return "static" if _time_column(names, m.edges) is None else "temporal"


def _classes(a: np.ndarray, name: str, path: str) -> np.ndarray:
    if a.dtype.kind == "b":
        return a.astype(np.int64)
    if a.size and (np.any(a != np.round(a)) or a.min() < 0):
        raise GnndistError(f"{path}: {name} must hold classes 0, 1, 2, ...")
    return a.astype(np.int64)


def load_dgl_csv(folder: str) -> Union[Graph, TemporalGraph]:
    """A CSVDataset folder's graph (see the module docstring), with the node ids kept as `orig_ids`."""
    m = _csv_meta(folder)
    nodes, edges = _read_csv(m.nodes, m.separator), _read_csv(m.edges, m.separator)
    _one_graph(nodes, m.node_graph_id, m.nodes)
    _one_graph(edges, m.edge_graph_id, m.edges)
    ids = _ids(nodes, m.node_id, m.nodes)
    order = np.argsort(ids, kind="stable")
    orig_ids = ids[order]
    dup = np.flatnonzero(orig_ids[1:] == orig_ids[:-1])
    if dup.size:
        raise GnndistError(f"{m.nodes}: node id {orig_ids[dup[0]]} is listed twice")
    ends = []
    for field in (m.src_id, m.dst_id):
        v = _ids(edges, field, m.edges)
        pos = np.minimum(np.searchsorted(orig_ids, v), max(orig_ids.size - 1, 0))
        missing = np.flatnonzero(orig_ids[pos] != v) if orig_ids.size else np.arange(v.size)
        if missing.size:
            raise GnndistError(f"{m.edges}:{missing[0] + 2}: node id {v[missing[0]]} is not in {m.nodes}")
        ends.append(pos)
    time = _time_column(edges.column_names, m.edges)
    if time is not None:
        roles = _data_roles([n for n in edges.column_names if n not in (m.src_id, m.dst_id)], m.edges)
        feat = _numbers(edges, roles["x"], m.edges).astype(np.float32) if "x" in roles else None
        label = _classes(_numbers(edges, roles["y"], m.edges), roles["y"], m.edges) if "y" in roles else None
        try:
            g = TemporalGraph(*ends, _numbers(edges, time, m.edges), feat, label, num_nodes=orig_ids.size, sort=True)
        except GnndistError as e:
            raise GnndistError(f"{m.edges}: {first_line(e)}") from None
    else:
        roles = _data_roles([n for n in nodes.column_names if n != m.node_id], m.nodes)
        arrays = {role: _numbers(nodes, name, m.nodes)[order] for role, name in roles.items()}
        if "x" in arrays:
            arrays["x"] = arrays["x"].reshape(orig_ids.size, -1).astype(np.float32)
        try:
            g = Graph.from_edges(*ends, num_nodes=orig_ids.size, undirected=True, dedup=True, **arrays)
        except GnndistError as e:
            raise GnndistError(f"{m.nodes}: {first_line(e)}") from None
    g.orig_ids = orig_ids
    return g


# ---------------------------------------------------------------- chunked graph

@dataclass(frozen=True)
class ChunkedGraph:
    """A homogeneous graph in DGL's chunked format, as its metadata.json describes it."""

    folder: str
    num_nodes: int  # the sum of num_nodes_per_chunk
    edge_format: str  # "csv" or "parquet"
    delimiter: str  # of the fields of CSV edge chunks
    edge_files: tuple[str, ...]  # as metadata.json names them (relative to `folder`, or absolute), in its order
    node_data: tuple[tuple[str, str, str, tuple[str, ...]], ...]  # (x, y or a mask; DGL's key; format; chunk files)

    def path(self, name: str) -> str:
        return os.path.join(self.folder, name)

    def node_files(self) -> tuple[str, ...]:
        return tuple(f for *_, files in self.node_data for f in files)


def _spec(spec, where: str, formats: tuple[str, ...], path: str) -> tuple[str, tuple[str, ...]]:
    """(format, chunk files) of a ChunkFileSpec `{"format": {"name": ...}, "data": [files]}`."""
    if not (isinstance(spec, dict) and isinstance(spec.get("format"), dict) and isinstance(spec.get("data"), list)
            and all(isinstance(f, str) for f in spec["data"])):
        raise GnndistError(f'{path}: {where} must be {{"format": {{"name": ...}}, "data": [chunk files]}}')
    name = spec["format"].get("name")
    if name not in formats:
        raise GnndistError(f"{path}: {where} has format {name!r}; DistDGL's pipeline reads these chunks as "
                           f"{' or '.join(formats)}")
    return name, tuple(spec["data"])


def read_chunked(folder: str) -> ChunkedGraph:
    """The metadata.json of a chunked graph folder, checked (see the module docstring)."""
    path, meta = _read_meta(folder, METADATA_JSON)
    for key, typ in (("node_type", list), ("num_nodes_per_chunk", list), ("edge_type", list), ("edges", dict)):
        if not isinstance(meta.get(key), typ):
            raise GnndistError(f"{path}: {key} is {'missing' if key not in meta else 'not a ' + typ.__name__}"
                               f" (DGL's chunked graph format needs node_type, num_nodes_per_chunk, edge_type, edges)")
    ntypes, etypes = meta["node_type"], meta["edge_type"]
    if len(ntypes) != 1 or len(etypes) != 1 or not isinstance(etypes[0], str) or \
            etypes[0].split(":")[::2] != [ntypes[0], ntypes[0]] or etypes[0].count(":") != 2:
        raise GnndistError(f"{path}: node types {ntypes}, edge types {etypes}: gnndist reads chunked graphs of one "
                           f"node type and one edge type that joins it to itself")
    counts = meta["num_nodes_per_chunk"]
    if not (len(counts) == 1 and isinstance(counts[0], list)
            and all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts[0])):
        raise GnndistError(f"{path}: num_nodes_per_chunk must be [[nodes in chunk 0, nodes in chunk 1, ...]]")
    (ntype,), (etype,) = ntypes, etypes
    if etype not in meta["edges"]:
        raise GnndistError(f"{path}: edges has no entry for the edge type {etype!r}")
    edge_format, edge_files = _spec(meta["edges"][etype], f"edges {etype}", ("csv", "parquet"), path)
    delimiter = meta["edges"][etype]["format"].get("delimiter", " ")
    if delimiter not in (" ", "\t", ","):
        raise GnndistError(f"{path}: edges {etype} has delimiter {delimiter!r}; gnndist reads ' ', '\\t' or ','")
    node_data = meta.get("node_data") or {}
    if not isinstance(node_data, dict) or set(node_data) - {ntype}:
        raise GnndistError(f"{path}: node_data must hold the data of node type {ntype!r} only")
    keys = node_data.get(ntype) or {}
    if not isinstance(keys, dict):
        raise GnndistError(f"{path}: node_data {ntype} must map each key to its chunk files")
    roles = _data_roles(list(keys), f"{path}: node_data {ntype}")
    data = tuple((role, key, *_spec(keys[key], f"node_data {key}", ("numpy", "parquet"), path))
                 for role, key in roles.items())
    return ChunkedGraph(folder, sum(counts[0]), edge_format, delimiter, edge_files, data)
