"""Loaders for temporal edge lists (SNAP text, CSV) and gnn-benchmark .npz graphs.

Temporal loaders renumber the node ids that occur to 0..N-1 in order of original id and keep
the original ids as the graph attribute `orig_ids` (`orig_ids[new_id] == original id`).
"""
from __future__ import annotations

import os
import zipfile
import zlib
from dataclasses import dataclass
from typing import Optional, Union

import numpy as np
from numpy.lib.npyio import NpzFile

from gnndist.datasets.text import check_finite, check_ids, read_table
from gnndist.errors import GnndistError, first_line
from gnndist.graph import MASKS, Graph, TemporalGraph

# CSV header names (lower case) -> column role
_ROLES = {
    "src": ("src", "source", "from", "u", "user", "user_id", "sender"),
    "dst": ("dst", "destination", "target", "to", "i", "item", "item_id", "receiver"),
    "t": ("t", "ts", "time", "timestamp", "unix_time"),
    "label": ("label", "state_label", "y"),
    "weight": ("weight", "rating", "feature", "w"),
    "skip": ("", "idx", "index", "unnamed: 0"),  # row numbers (TGN's idx: a row of ml_NAME.npy)
}
TIME_NAMES = _ROLES["t"]  # header names of a time column


def _renumber(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct ids, each id's position among them), as np.unique(return_inverse=True),
    through a lookup table when the ids are not much sparser than their count (the common case)."""
    top = int(ids.max(initial=-1)) + 1
    if top > 4 * ids.size + (1 << 20) or ids.min(initial=0) < 0:
        return np.unique(ids, return_inverse=True)
    present = np.zeros(top, dtype=bool)
    present[ids] = True
    position = np.cumsum(present) - 1
    return np.flatnonzero(present), position[ids]


def renumbered(src: np.ndarray, dst: np.ndarray, t: np.ndarray, edge_feat: Optional[np.ndarray] = None,
               edge_label: Optional[np.ndarray] = None, bipartite: bool = False) -> TemporalGraph:
    """A TemporalGraph (sorted by time, stably) of events given by original node ids, numbered
    0..N-1 in order of original id (`bipartite`: src and dst are separate id spaces, dst numbered
    after src); the original ids are kept as `orig_ids`."""
    if bipartite:
        (users, su), (items, di) = _renumber(src), _renumber(dst)
        src, dst, orig_ids = su, di + users.size, np.concatenate([users, items])
    else:
        orig_ids, inverse = _renumber(np.concatenate([src, dst]))
        src, dst = inverse[:src.size], inverse[src.size:]
    g = TemporalGraph(src, dst, t, edge_feat, edge_label, num_nodes=orig_ids.size, sort=True)
    g.orig_ids = orig_ids.astype(np.int64)
    return g


def load_snap(path: str) -> TemporalGraph:
    """SNAP temporal edge list: lines `src dst time`, whitespace separated, '#' comments."""
    names = ["src", "dst", "time"]
    check = lambda v, _: check_ids(v, (0, 1)) or check_finite(v, names)  # noqa: E731
    _, a = read_table(path, ncols=3, check=check, what=" ".join(names))
    return renumbered(a[:, 0].astype(np.int64), a[:, 1].astype(np.int64), a[:, 2])


def load_signed(path: str) -> TemporalGraph:
    """SNAP's signed trust networks (soc-sign-bitcoinotc/alpha.csv): lines `source,target,rating,time`
    without a header (one is skipped if there); the rating becomes a 1-d edge feature, its sign the
    label, as `load_csv` reads Bitcoin's headed `from,to,weight,time`."""
    names = ["source", "target", "rating", "time"]
    check = lambda v, _: check_ids(v, (0, 1)) or check_finite(v, names)  # noqa: E731
    _, a = read_table(path, sep=",", header=True, ncols=4, check=check, what=",".join(names))
    return renumbered(a[:, 0].astype(np.int64), a[:, 1].astype(np.int64), a[:, 3], a[:, 2:3].astype(np.float32),
                      (a[:, 2] > 0).astype(np.int64))


def header_problem(names: list[str], static: bool = False) -> Optional[str]:
    """What is wrong with the header of a CSV of events (`static`: of a static graph's edges,
    which has src and dst columns and no others but row numbers), if anything."""
    for role, keys in _ROLES.items():
        found = sum(n.lower() in keys for n in names)
        if (role in ("src", "dst") or role == "t" and not static) and found != 1:
            return f"header needs exactly one {role} column (one of {', '.join(keys)}), found {found}"
        if role in ("label", "weight") and found > 1:
            return f"header names more than one {role} column"
    edge_roles = _ROLES["src"] + _ROLES["dst"] + _ROLES["skip"]
    other = [n for n in names if n.lower() not in edge_roles]
    if static and other:
        return f"the edges of a static graph have src and dst columns only, found {other[0]!r}"
    return None


_NO_HEADER = ["src", "dst", "t"]  # columns of a CSV without header; further columns are features


@dataclass(frozen=True)
class Columns:
    """Which column of a table of events (or of a static graph's edges) holds what, found from its
    header names (`_ROLES`)."""

    names: tuple[str, ...]  # the header's names (of a table without header: src, dst, t)
    ncols: int  # fields per row: the names, and any unnamed feature fields past them
    src: int
    dst: int
    t: Optional[int]  # None: the edges of a static graph
    label: Optional[int]  # event labels (classes 0, 1, ...)
    weight: Optional[int]  # Bitcoin's weight: the first feature, and its sign the label when no label column
    features: tuple[int, ...]  # edge feature columns in order: the weight, then columns of no known role
    skip: tuple[int, ...]  # row-number columns (TGN's idx)
    bipartite: bool  # JODIE's user_id/item_id: separate id spaces, items numbered after users


def csv_columns(names: Optional[list[str]], ncols: int, static: bool = False) -> Columns:
    """The `Columns` of a table of `ncols` fields with header `names` (None: no header, so src,
    dst, t, features; `static`: src, dst). Fields past the header's names (JODIE) are features."""
    names = names or _NO_HEADER[:2 if static else 3]
    skip = tuple(j for j, n in enumerate(names) if n.lower() in _ROLES["skip"])
    if static:
        src, dst = (next(j for j, n in enumerate(names) if n.lower() in _ROLES[r]) for r in ("src", "dst"))
        return Columns(tuple(names), max(ncols, len(names)), src, dst, None, None, None, (), skip, False)
    r = {role: max((j for j, n in enumerate(names) if n.lower() in keys), default=None)
         for role, keys in _ROLES.items()}
    taken = {r["src"], r["dst"], r["t"], r["label"], r["weight"], *skip}
    features = ([] if r["weight"] is None else [r["weight"]]) + [j for j in range(ncols) if j not in taken]
    bipartite = names[r["src"]].lower().startswith("user") and names[r["dst"]].lower().startswith("item")
    return Columns(tuple(names), max(ncols, len(names)), r["src"], r["dst"], r["t"], r["label"], r["weight"],
                   tuple(features), skip, bipartite)


def _csv_check(values: np.ndarray, names: Optional[list[str]]) -> Optional[tuple[int, str]]:
    """First row with a bad node id or a NaN/inf value."""
    c = csv_columns(names, values.shape[1])
    labels = None if c.label is None else check_ids(values, (c.label,), "label")  # classes 0, 1, ...
    return check_ids(values, (c.src, c.dst)) or labels or check_finite(values, list(c.names))


def load_csv(path: str) -> TemporalGraph:
    """Temporal CSV: JODIE (`user_id,item_id,timestamp,state_label,features...`), TGN
    (`,u,i,ts,label,idx`, with edge features from `ml_NAME.npy` beside it when present) or
    Bitcoin (`from,to,weight,time`: the weight becomes a 1-d edge feature, its sign the label).

    Columns with other names, and columns past the header (JODIE), are edge features; without
    a header the columns are src, dst, t, features. JODIE's `user_id`/`item_id` are separate
    id spaces: items are numbered after users.
    """
    names, a = read_table(path, sep=",", header=True, check=_csv_check, header_problem=header_problem)
    c = csv_columns(names, a.shape[1])
    src, dst, t = a[:, c.src].astype(np.int64), a[:, c.dst].astype(np.int64), a[:, c.t]
    edge_feat = a[:, list(c.features)].astype(np.float32) if c.features else None
    edge_label = None
    if c.label is not None:
        edge_label = a[:, c.label].astype(np.int64)
    elif c.weight is not None:
        edge_label = (a[:, c.weight] > 0).astype(np.int64)
    idx = [j for j in c.skip if c.names[j].lower() == "idx"]
    if idx:
        edge_feat = _tgn_edge_features(path, a[:, idx[0]].astype(np.int64), edge_feat)
    return renumbered(src, dst, t, edge_feat, edge_label, c.bipartite)


def _tgn_edge_features(path: str, idx: np.ndarray, edge_feat: Optional[np.ndarray]) -> Optional[np.ndarray]:
    """Edge features of a TGN `ml_NAME.csv` from `ml_NAME.npy` (row `idx` per event), if that file exists."""
    npy = os.path.splitext(path[:-3] if path.endswith(".gz") else path)[0] + ".npy"
    if not os.path.isfile(npy):
        return edge_feat
    table = np_file(npy, ".npy")
    if (table.ndim != 2 or table.dtype.kind not in "biuf" or idx.max(initial=0) >= table.shape[0]
            or idx.min(initial=0) < 0):
        raise GnndistError(f"{npy}: expected a 2-d numeric array with a row for every idx in {path}, "
                           f"got {table.dtype} {table.shape}")
    return table[idx].astype(np.float32)


# what np.load and reading an .npz member raise for a corrupt, truncated or pickled file
_NP_READ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, NotImplementedError)
MAX_DENSE = 1 << 31  # entries of the largest dense matrix built from CSR parts (8 GiB of float32)


def np_file(path: str, kind: str) -> Union[NpzFile, np.ndarray]:
    """np.load(path) without pickle, checked to be what `kind` (".npz" or ".npy") names."""
    with open(path, "rb") as f:
        head = f.read(6)
    if head and not head.startswith((b"PK", b"\x93NUMPY")):  # numpy would call anything else a pickle
        raise GnndistError(f"{path}: not a readable {kind} file (neither a zip archive nor a .npy array: it starts "
                           f"with {head!r})")
    try:
        obj = np.load(path, allow_pickle=False)
    except _NP_READ_ERRORS as e:
        raise GnndistError(f"{path}: not a readable {kind} file ({type(e).__name__}: {first_line(e)})") from None
    if isinstance(obj, NpzFile if kind == ".npz" else np.ndarray):
        return obj
    if isinstance(obj, NpzFile):
        obj.close()
    got = "an .npz archive" if isinstance(obj, NpzFile) else "a single .npy array"
    raise GnndistError(f"{path}: not a readable {kind} file (it holds {got})")


def _npz_key(path: str, z: NpzFile, key: str) -> np.ndarray:
    if key not in z.files:
        raise GnndistError(f"{path}: missing array '{key}' (have: {', '.join(z.files)})")
    try:
        return z[key]
    except _NP_READ_ERRORS as e:
        raise GnndistError(f"{path}: array '{key}' cannot be read ({type(e).__name__}: {first_line(e)})") from None


def as_ints(a, where: str) -> np.ndarray:
    """`a` as int64; GnndistError if it holds anything but integers (1.5, NaN, text, > 2**53 as float)."""
    a = np.asarray(a)
    if a.dtype.kind in "iu":
        return a.astype(np.int64)
    flat = a.ravel()
    ok = np.zeros(flat.size, dtype=bool)
    if a.dtype.kind == "f":
        ok = np.isfinite(flat) & (flat == np.floor(flat)) & (np.abs(flat) < 2.0 ** 53)
    if ok.all():
        return a.astype(np.int64)
    raise GnndistError(f"{where} must hold integers, got {a.dtype} value {flat[~ok][0].item()!r}")


def csr_to_dense(data: np.ndarray, indices: np.ndarray, indptr: np.ndarray, shape, where: str) -> np.ndarray:
    """A dense float32 matrix from CSR parts (duplicate entries summed, as scipy's todense)."""
    rows, cols = csr_rows_cols(indices, indptr, shape, where)
    data = np.asarray(data)
    if data.ndim != 1 or data.dtype.kind not in "biuf" or data.size != cols.size:
        raise GnndistError(f"{where}: CSR data must be {cols.size} numbers, got {data.dtype} {data.shape}")
    n, m = (int(v) for v in shape)
    if n * m > MAX_DENSE:
        raise GnndistError(f"{where}: shape ({n}, {m}) would make a dense matrix of {n * m:.3g} entries "
                           f"(more than {MAX_DENSE})")
    out = np.zeros((n, m), dtype=np.float32)
    np.add.at(out, (rows, cols), data.astype(np.float32))
    return out


def csr_rows_cols(indices: np.ndarray, indptr: np.ndarray, shape, where: str) -> tuple[np.ndarray, np.ndarray]:
    """Row and column of every entry of a CSR matrix, checked against `shape`."""
    shape = as_ints(shape, f"{where}: CSR shape")
    if shape.shape != (2,) or shape.min() < 0:
        raise GnndistError(f"{where}: CSR shape must be 2 non-negative integers, got {shape.tolist()}")
    n, m = (int(x) for x in shape)
    indptr, indices = as_ints(indptr, f"{where}: CSR indptr"), as_ints(indices, f"{where}: CSR indices")
    if (indptr.ndim != 1 or indptr.size != n + 1 or indptr[0] != 0 or indptr[-1] != indices.size
            or np.any(np.diff(indptr) < 0)):
        raise GnndistError(f"{where}: inconsistent CSR indptr for shape ({n}, {m})")
    if indices.size and (indices.min() < 0 or indices.max() >= m):
        raise GnndistError(f"{where}: CSR column index out of range for shape ({n}, {m})")
    return np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr)), indices


def load_npz(path: str) -> Graph:
    """gnn-benchmark .npz (Shchur et al.): adjacency and attributes as CSR parts, labels, and
    optionally a split as `train_mask`, `val_mask`, `test_mask` (one entry per node).

    The adjacency is symmetrized; duplicate edges are dropped, self-loops kept once.
    """
    with np_file(path, ".npz") as z:
        shape = _npz_key(path, z, "adj_shape")
        rows, cols = csr_rows_cols(_npz_key(path, z, "adj_indices"), _npz_key(path, z, "adj_indptr"), shape,
                                   f"{path}: adj")
        if shape[0] != shape[1]:
            raise GnndistError(f"{path}: adj_shape must be square, got {shape.tolist()}")
        n = int(shape[0])
        if "attr_matrix" in z.files:
            x = _npz_key(path, z, "attr_matrix")
            if x.ndim != 2 or x.dtype.kind not in "biuf":
                raise GnndistError(f"{path}: attr_matrix must be a 2-d numeric array, got {x.dtype} {x.shape}")
            x = x.astype(np.float32)
        elif "attr_data" in z.files:
            x = csr_to_dense(*(_npz_key(path, z, f"attr_{k}") for k in ("data", "indices", "indptr", "shape")),
                             where=f"{path}: attr")
        else:
            x = None
        y = _npz_key(path, z, "labels") if "labels" in z.files else None
        masks = {k: _npz_key(path, z, k) for k in MASKS if k in z.files}
    if y is not None and (y.ndim != 1 or not np.issubdtype(y.dtype, np.integer)):
        raise GnndistError(f"{path}: labels must be a 1-d integer array, got {y.dtype} {y.shape}")
    if y is not None and y.size and y.min() < 0:
        raise GnndistError(f"{path}: labels hold a negative class ({y.min()})")
    if y is not None and y.size and y.max() >= n:
        raise GnndistError(f"{path}: labels hold class {y.max()}, more classes than the {n} nodes")
    if x is not None and x.shape[0] != n:
        raise GnndistError(f"{path}: {x.shape[0]} attribute rows for {n} nodes")
    try:
        return Graph.from_edges(rows, cols, num_nodes=n, undirected=True, dedup=True, x=x,
                                y=None if y is None else y.astype(np.int64), **masks)
    except GnndistError as e:  # a mask's own check (its length, its values) does not know the file
        raise GnndistError(f"{path}: {first_line(e)}") from None
