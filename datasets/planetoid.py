"""Planetoid `ind.NAME.*` files (Yang et al. 2016) read as PyG's `Planetoid` reads them.

The files are Python pickles, read by `gnndist.datasets.pickles`' unpickler, which builds
only numpy arrays, plain containers and a local stand-in for scipy's CSR matrix: a crafted
file cannot run code.
"""
from __future__ import annotations

import os
import re

import numpy as np

from gnndist.datasets import pickles
from gnndist.datasets.text import check_ids, open_bytes, read_table
from gnndist.errors import GnndistError
from gnndist.graph import MASKS, Graph

PARTS = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
_FILE = re.compile(r"^ind\.(?P<name>[^.]+)\.(?:x|tx|allx|y|ty|ally|graph|test\.index)$")


def _unpickle(path: str):
    with open_bytes(path) as f:
        return pickles.restricted_load(f, path, "Planetoid pickle")


def _matrix(path: str) -> np.ndarray:
    """A dense 2-d float32 matrix from a pickled CSR matrix or numpy array."""
    obj = _unpickle(path)
    if isinstance(obj, pickles.CSRState):
        return obj.dense(path)
    if isinstance(obj, np.ndarray) and obj.ndim == 2 and obj.dtype.kind in "biuf":
        return obj.astype(np.float32)
    raise GnndistError(f"{path}: expected a 2-d numeric matrix, got {type(obj).__name__}")


def _labels(path: str) -> np.ndarray:
    """A label matrix (y, ty, ally): rows one-hot, or all zero (PyG's argmax makes those class 0)."""
    m = _matrix(path)
    if m.shape[1] == 0 or not np.all((m == 0) | (m == 1)) or np.any(m.sum(axis=1) > 1):
        raise GnndistError(f"{path}: expected one-hot label rows (or all-zero ones) with at least one class, "
                           f"got a {m.shape} matrix that is not")
    return m


def _edges(path: str) -> tuple[np.ndarray, np.ndarray, int]:
    """(src, dst, 1 + the largest node id) from the pickled {node: [neighbours]} dict."""
    d = _unpickle(path)
    if not isinstance(d, dict):
        raise GnndistError(f"{path}: expected a dict of neighbour lists, got {type(d).__name__}")
    keys = list(d.keys())
    lists = list(d.values())
    if not all(isinstance(v, list) for v in lists):
        raise GnndistError(f"{path}: every value of the graph dict must be a list of node ids")
    bad = GnndistError(f"{path}: graph dict holds a node id that is not a non-negative integer")
    try:
        nodes, dst = np.asarray(keys), np.asarray([u for v in lists for u in v])
    except (TypeError, ValueError, OverflowError):
        raise bad from None
    # ints only: a 1.5 or "3" is refused, not truncated or parsed
    if any(a.size and (a.ndim != 1 or a.dtype.kind not in "iu" or a.min() < 0) for a in (nodes, dst)):
        raise bad
    src = np.repeat(nodes.astype(np.int64), [len(v) for v in lists])
    dst = dst.astype(np.int64)
    return src, dst, int(max(nodes.max(initial=-1), dst.max(initial=-1))) + 1


def planetoid_files(path: str) -> tuple[str, str]:
    """(folder, NAME) of a Planetoid dataset given its folder or one of its ind.NAME.* files."""
    if os.path.isdir(path):
        names = sorted({m["name"] for f in os.listdir(path) if (m := _FILE.match(f))})
        if len(names) != 1:
            raise GnndistError(f"{path}: expected the ind.NAME.* files of one Planetoid dataset, "
                               f"found {len(names)} ({', '.join(names) or 'none'})")
        return path, names[0]
    m = _FILE.match(os.path.basename(path))
    if not m:
        raise GnndistError(f"{path}: not a Planetoid file (ind.NAME.{{{','.join(PARTS)}}})")
    return os.path.dirname(path) or ".", m["name"]


def load_planetoid(path: str) -> Graph:
    """A Planetoid dataset with PyG's public split: train = the first len(y) nodes, val = the next
    500, test = test.index. Gaps in the test ids (CiteSeer) are filled with zero feature rows
    and label 0; self-loops and duplicate edges are dropped."""
    folder, name = planetoid_files(path)
    f = {part: os.path.join(folder, f"ind.{name}.{part}") for part in PARTS}
    x, tx, allx = (_matrix(f[p]) for p in ("x", "tx", "allx"))
    y, ty, ally = (_labels(f[p]) for p in ("y", "ty", "ally"))
    _, ti = read_table(f["test.index"], ncols=1, check=lambda v, _: check_ids(v, (0,)), what="node id")
    test_index = ti[:, 0].astype(np.int64)
    if x.shape[0] != y.shape[0] or allx.shape[0] != ally.shape[0] or tx.shape[0] != ty.shape[0] or tx.shape[0] != test_index.size:
        raise GnndistError(f"{folder}: row counts of x/y ({x.shape[0]}/{y.shape[0]}), allx/ally ({allx.shape[0]}/{ally.shape[0]}) or "
                           f"tx/ty/test.index ({tx.shape[0]}/{ty.shape[0]}/{test_index.size}) disagree")
    if allx.shape[1] != tx.shape[1] or ally.shape[1] != ty.shape[1]:
        raise GnndistError(f"{folder}: feature or class widths of allx/tx or ally/ty disagree")
    lo, hi = int(test_index.min()), int(test_index.max())
    if lo < allx.shape[0]:
        raise GnndistError(f"{f['test.index']}: test id {lo} falls among the {allx.shape[0]} allx rows")
    src, dst, top = _edges(f["graph"])
    top = max(top, allx.shape[0] + tx.shape[0])  # nodes the graph and the feature rows imply
    if hi >= top:  # checked before gap rows up to `hi` are allocated
        raise GnndistError(f"{f['test.index']}: test id {hi} is beyond the {top} nodes that the graph "
                           f"and the allx/tx rows imply")
    sorted_test = np.sort(test_index)
    if hi - lo + 1 > test_index.size:  # isolated test nodes left out of tx/ty: zero rows for them
        tx_ext = np.zeros((hi - lo + 1, tx.shape[1]), np.float32)
        ty_ext = np.zeros((hi - lo + 1, ty.shape[1]), np.float32)
        tx_ext[sorted_test - lo], ty_ext[sorted_test - lo] = tx, ty
        tx, ty = tx_ext, ty_ext
    feats = np.concatenate([allx, tx])
    labels = np.concatenate([ally, ty]).argmax(axis=1).astype(np.int64)
    feats[test_index], labels[test_index] = feats[sorted_test], labels[sorted_test]
    n = feats.shape[0]
    if n != lo + tx.shape[0] or y.shape[0] + 500 > n:
        raise GnndistError(f"{folder}: {n} nodes do not fit test ids {lo}-{hi} and {y.shape[0]} + 500 train/val rows")
    masks = {k: np.zeros(n, dtype=bool) for k in MASKS}
    masks["train_mask"][:y.shape[0]] = True
    masks["val_mask"][y.shape[0]:y.shape[0] + 500] = True
    masks["test_mask"][test_index] = True
    if src.size and max(src.max(), dst.max()) >= n:
        raise GnndistError(f"{f['graph']}: node id {max(src.max(), dst.max())} out of range [0, {n})")
    keep = src != dst
    return Graph.from_edges(src[keep], dst[keep], num_nodes=n, dedup=True, x=feats, y=labels, **masks)
