"""The data model: `Graph` (static, CSR) and `TemporalGraph` (time-ordered events, T-CSR)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import numpy as np
from tqdm import tqdm

from gnndist.errors import GnndistError, first_line
from gnndist.validate import is_int

if TYPE_CHECKING:  # pragma: no cover
    import networkx as nx
    import torch_geometric.data


def as_numbers(name: str, a, dtype=None) -> np.ndarray:
    """`a` as a numpy array of numbers (cast to `dtype`), or one line saying why it is none."""
    try:
        a = np.asarray(a)
    except (TypeError, ValueError) as e:
        raise GnndistError(f"{name} must be an array of numbers: {first_line(e)}") from None
    if a.dtype.kind not in "biuf":
        raise GnndistError(f"{name} must be an array of numbers, got {a.dtype}")
    return a if dtype is None else a.astype(dtype, copy=False)


def _not_whole(a: np.ndarray) -> bool:
    """Whether a float array `a` holds a value that is not a whole number (NaN, inf, 0.5)."""
    return a.dtype.kind == "f" and a.size > 0 and (not np.all(np.isfinite(a)) or bool(np.any(a != np.round(a))))


def as_node_ids(name: str, a, num_nodes: Optional[int] = None) -> np.ndarray:
    """`a` as an int64 array of node ids, checked to be in [0, num_nodes)."""
    a = as_numbers(name, a)
    if a.ndim != 1:
        raise GnndistError(f"{name} must be a 1-d array, got shape {a.shape}")
    if _not_whole(a):
        raise GnndistError(f"{name} must hold integer node ids")
    a = a.astype(np.int64, copy=False)
    if a.size and a.min() < 0:
        raise GnndistError(f"{name} holds a negative node id ({a.min()})")
    if num_nodes is not None and a.size and a.max() >= num_nodes:
        raise GnndistError(f"{name} holds node id {a.max()} >= num_nodes {num_nodes}")
    return a


def _node_count(num_nodes) -> int:
    """A given node count, checked: an integer >= 0."""
    if not is_int(num_nodes) or num_nodes < 0:
        raise GnndistError(f"num_nodes must be an integer >= 0, got {num_nodes!r}")
    return int(num_nodes)


def _check_rows(name: str, a, n: int, dtype=None, ndims: tuple[int, ...] = (1,)) -> Optional[np.ndarray]:
    """Optional per-row array of numbers with `n` rows and one of `ndims` dimensions (the
    second, if any, not empty); float arrays must be finite."""
    if a is None:
        return None
    a = as_numbers(name, a, dtype)
    if a.ndim not in ndims or (a.ndim == 2 and a.shape[1] == 0):
        want = " or ".join(f"{d}-d" for d in ndims) + " array" + (" with at least one column" if 2 in ndims else "")
        raise GnndistError(f"{name} must be a {want}, got shape {a.shape}")
    if a.shape[0] != n:
        raise GnndistError(f"{name} has {a.shape[0]} rows, expected {n}")
    if np.issubdtype(a.dtype, np.floating) and not np.all(np.isfinite(a)):
        raise GnndistError(f"{name} holds NaN or inf")
    return a


def _labels(a, n: int) -> Optional[np.ndarray]:
    """Optional node labels: class ids 0, 1, ... (int64)."""
    a = _check_rows("y", a, n)
    if a is None:
        return None
    if _not_whole(a) or (a.size and a.min() < 0):
        raise GnndistError(f"y must hold class ids 0, 1, 2, ... (integers >= 0), got {a[(a != np.round(a)) | (a < 0)][0]}")
    return a.astype(np.int64, copy=False)


MASKS = ("train_mask", "val_mask", "test_mask")  # a static graph's split, one bool per node


def _mask(name: str, a, n: int) -> Optional[np.ndarray]:
    """Optional boolean node mask (True/False, or 0/1)."""
    a = _check_rows(name, a, n)
    if a is None:
        return None
    if a.dtype != bool and a.size and not np.all((a == 0) | (a == 1)):
        raise GnndistError(f"{name} must hold True/False (or 0/1)")
    return a.astype(bool, copy=False)


def unique_ints(a: np.ndarray) -> np.ndarray:
    """Sorted distinct values of an integer array (sort + mask: np.unique is many times slower on
    large int64 arrays; docs/benchmarks.md, "Measurements behind the code")."""
    s = np.sort(a)
    if s.size > 1:
        keep = np.empty(s.size, dtype=bool)
        keep[0] = True
        np.not_equal(s[1:], s[:-1], out=keep[1:])
        s = s[keep]
    return s


def indptr_of(rows: np.ndarray, num_rows: int) -> np.ndarray:
    """CSR row pointers, int64 [num_rows + 1], of entries whose rows are `rows` (any order)."""
    indptr = np.zeros(num_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=num_rows), out=indptr[1:])
    return indptr


def csr_from_edges(src: np.ndarray, dst: np.ndarray, num_nodes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR (indptr, indices, perm) with row = src; `perm` maps CSR slots to input edge positions."""
    perm = np.argsort(src, kind="stable")
    return indptr_of(src, num_nodes), dst[perm], perm


def tcsr_rows(src: np.ndarray, dst: np.ndarray, t: np.ndarray, eid: np.ndarray, lo: int, hi: int,
              progress: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """T-CSR `(indptr, nbr, eid, ts)` of the nodes lo .. hi-1 from events in time order (global
    event ids `eid`, increasing): row v - lo lists every event with endpoint v (an event appears in
    the rows of both endpoints), sorted by time, ties by event id. `progress`: a bar over its
    three phases (select, sort, index)."""
    with tqdm(total=3, desc="T-CSR", unit="phase", leave=False, disable=not progress) as bar:
        own_src, own_dst = (src >= lo) & (src < hi), (dst >= lo) & (dst < hi)
        node = np.concatenate([src[own_src], dst[own_dst]]) - lo
        nbr = np.concatenate([dst[own_src], src[own_dst]])
        ids = np.concatenate([eid[own_src], eid[own_dst]])
        ts = np.concatenate([t[own_src], t[own_dst]])
        bar.update()
        order = np.lexsort((ids, node))  # event ids number events in time order
        bar.update()
        indptr = indptr_of(node, hi - lo)
        bar.update()
    return indptr, nbr[order], ids[order], ts[order]


@dataclass(eq=False)
class Graph:
    """A static graph in CSR form: row v lists the neighbours v aggregates from.

    Optional node features `x` [N, F] (float32), labels `y` [N] (int64), and boolean split
    masks. Undirected graphs store both directions.
    """

    indptr: np.ndarray
    indices: np.ndarray
    x: Optional[np.ndarray] = None
    y: Optional[np.ndarray] = None
    train_mask: Optional[np.ndarray] = None
    val_mask: Optional[np.ndarray] = None
    test_mask: Optional[np.ndarray] = None

    def __post_init__(self) -> None:
        self.indptr = as_numbers("indptr", self.indptr)
        if _not_whole(self.indptr):
            raise GnndistError("indptr must hold integers")
        self.indptr = self.indptr.astype(np.int64, copy=False)
        if self.indptr.ndim != 1 or self.indptr.size < 1 or self.indptr[0] != 0:
            raise GnndistError("indptr must be a 1-d array starting at 0")
        if np.any(np.diff(self.indptr) < 0):
            raise GnndistError("indptr must be non-decreasing")
        n = self.indptr.size - 1
        self.indices = as_node_ids("indices", self.indices, n)
        if self.indices.size != self.indptr[-1]:
            raise GnndistError(f"indices has {self.indices.size} entries, indptr says {self.indptr[-1]}")
        self.x = _check_rows("x", self.x, n, np.float32, ndims=(2,))
        self.y = _labels(self.y, n)
        for name in MASKS:
            setattr(self, name, _mask(name, getattr(self, name), n))

    @property
    def num_nodes(self) -> int:
        return int(self.indptr.size - 1)

    @property
    def num_edges(self) -> int:
        """Directed CSR entries (an undirected edge counts twice)."""
        return int(self.indices.size)

    @property
    def num_features(self) -> int:
        return 0 if self.x is None else int(self.x.shape[1])

    @property
    def num_classes(self) -> int:
        return 0 if self.y is None else int(self.y.max()) + 1

    def degrees(self) -> np.ndarray:
        return np.diff(self.indptr)

    @classmethod
    def from_edges(cls, src, dst, num_nodes: Optional[int] = None, undirected: bool = False,
                   dedup: bool = False, **node_data) -> "Graph":
        """Build from an edge list; row of each edge is `dst` (messages flow src -> dst)."""
        src, dst = as_node_ids("src", src), as_node_ids("dst", dst)
        if src.size != dst.size:
            raise GnndistError(f"src has {src.size} entries, dst has {dst.size}")
        if num_nodes is None:
            num_nodes = int(max(src.max(initial=-1), dst.max(initial=-1)) + 1)
        num_nodes = _node_count(num_nodes)
        as_node_ids("src", src, num_nodes), as_node_ids("dst", dst, num_nodes)
        if undirected:
            src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
        if dedup:
            key = unique_ints(dst * num_nodes + src)
            dst, src = key // num_nodes, key % num_nodes
        indptr, indices, _ = csr_from_edges(dst, src, num_nodes)
        return cls(indptr, indices, **node_data)

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """(src, dst) of every CSR entry, in CSR order (dst is the row)."""
        dst = np.repeat(np.arange(self.num_nodes, dtype=np.int64), self.degrees())
        return self.indices.copy(), dst

    def to_pyg(self) -> "torch_geometric.data.Data":
        import torch
        from torch_geometric.data import Data

        src, dst = self.edges()
        data = Data(edge_index=torch.from_numpy(np.stack([src, dst])), num_nodes=self.num_nodes)
        for name in ("x", "y", *MASKS):
            value = getattr(self, name)
            if value is not None:
                data[name] = torch.from_numpy(value)
        return data

    @classmethod
    def from_pyg(cls, data: "torch_geometric.data.Data") -> "Graph":
        ei = data.edge_index.cpu().numpy()
        node_data = {name: data[name].cpu().numpy() for name in ("x", "y", *MASKS)
                     if name in data and data[name] is not None}
        return cls.from_edges(ei[0], ei[1], num_nodes=data.num_nodes, **node_data)

    def to_networkx(self) -> "nx.DiGraph":
        import networkx as nx

        g = nx.DiGraph()
        g.add_nodes_from(range(self.num_nodes))
        src, dst = self.edges()
        g.add_edges_from(zip(src.tolist(), dst.tolist()))
        return g

    @classmethod
    def from_networkx(cls, g: "nx.Graph") -> "Graph":
        """Nodes must be 0..N-1; an undirected networkx graph gives both directions."""
        n = g.number_of_nodes()
        if set(g.nodes) != set(range(n)):
            raise GnndistError("networkx graph nodes must be the integers 0..N-1")
        e = np.array(list(g.edges), dtype=np.int64).reshape(-1, 2)
        return cls.from_edges(e[:, 0], e[:, 1], num_nodes=n, undirected=not g.is_directed(), dedup=True)


@dataclass(eq=False)
class TemporalGraph:
    """Timestamped interaction events `src -> dst` at time `t`, in non-decreasing time order.

    `edge_feat` [E, D] float32 and `edge_label` [E] are optional. Give `sort=True` to sort
    unsorted input (stable); otherwise unsorted times are an error.
    """

    src: np.ndarray
    dst: np.ndarray
    t: np.ndarray
    edge_feat: Optional[np.ndarray] = None
    edge_label: Optional[np.ndarray] = None
    num_nodes: Optional[int] = None
    sort: bool = False
    _tcsr: Optional[tuple] = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.src, self.dst = as_node_ids("src", self.src), as_node_ids("dst", self.dst)
        self.t = as_numbers("t", self.t, np.float64)
        e = self.src.size
        if self.dst.size != e or self.t.shape != (e,):
            raise GnndistError(f"src, dst and t must have equal lengths, got {e}, {self.dst.size}, {self.t.size}")
        if not np.all(np.isfinite(self.t)):
            raise GnndistError("t holds NaN or inf")
        if e and not np.isfinite(float(self.t.max()) - float(self.t.min())):  # Python floats: no numpy warning
            raise GnndistError(f"t spans {self.t.min():g} to {self.t.max():g}, farther apart than float64 can "
                               f"count (the time gaps would overflow to inf); shift or scale the times")
        if self.num_nodes is None:
            self.num_nodes = int(max(self.src.max(initial=-1), self.dst.max(initial=-1)) + 1)
        self.num_nodes = _node_count(self.num_nodes)
        as_node_ids("src", self.src, self.num_nodes), as_node_ids("dst", self.dst, self.num_nodes)
        self.edge_feat = _check_rows("edge_feat", self.edge_feat, e, np.float32, ndims=(1, 2))
        if self.edge_feat is not None and self.edge_feat.ndim == 1:
            self.edge_feat = self.edge_feat[:, None]
        self.edge_label = _check_rows("edge_label", self.edge_label, e)
        if e and np.any(np.diff(self.t) < 0):
            if not self.sort:
                raise GnndistError("event times are not sorted; pass sort=True to sort them")
            order = np.argsort(self.t, kind="stable")
            self.src, self.dst, self.t = self.src[order], self.dst[order], self.t[order]
            if self.edge_feat is not None:
                self.edge_feat = self.edge_feat[order]
            if self.edge_label is not None:
                self.edge_label = self.edge_label[order]
        self.sort = False

    @property
    def num_events(self) -> int:
        return int(self.src.size)

    @property
    def edge_dim(self) -> int:
        return 0 if self.edge_feat is None else int(self.edge_feat.shape[1])

    def tcsr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """T-CSR `(indptr, nbr, eid, ts)` of all nodes, built once (see `tcsr_rows`)."""
        if self._tcsr is None:
            self._tcsr = tcsr_rows(self.src, self.dst, self.t, np.arange(self.num_events, dtype=np.int64),
                                   0, self.num_nodes)
        return self._tcsr

    def slice(self, start: int, stop: int) -> "TemporalGraph":
        """Events [start, stop) as a new graph with the same node count."""
        s = slice(start, stop)
        return TemporalGraph(self.src[s], self.dst[s], self.t[s],
                             None if self.edge_feat is None else self.edge_feat[s],
                             None if self.edge_label is None else self.edge_label[s],
                             num_nodes=self.num_nodes)

    def to_pyg(self) -> "torch_geometric.data.TemporalData":
        import torch
        from torch_geometric.data import TemporalData

        kw = {}
        if self.edge_feat is not None:
            kw["msg"] = torch.from_numpy(self.edge_feat)
        if self.edge_label is not None:
            kw["y"] = torch.from_numpy(np.asarray(self.edge_label))
        return TemporalData(src=torch.from_numpy(self.src), dst=torch.from_numpy(self.dst),
                            t=torch.from_numpy(self.t), **kw)

    @classmethod
    def from_pyg(cls, data: "torch_geometric.data.TemporalData", num_nodes: Optional[int] = None) -> "TemporalGraph":
        msg = getattr(data, "msg", None)
        y = getattr(data, "y", None)
        return cls(data.src.cpu().numpy(), data.dst.cpu().numpy(), data.t.cpu().numpy(),
                   None if msg is None else msg.cpu().numpy(), None if y is None else y.cpu().numpy(),
                   num_nodes=num_nodes, sort=True)

    def to_networkx(self) -> "nx.MultiDiGraph":
        """One multi-edge per event with attributes `t` and `eid`."""
        import networkx as nx

        g = nx.MultiDiGraph()
        g.add_nodes_from(range(self.num_nodes))
        for i, (u, v, t) in enumerate(zip(self.src.tolist(), self.dst.tolist(), self.t.tolist())):
            g.add_edge(u, v, t=t, eid=i)
        return g

    @classmethod
    def from_networkx(cls, g: "nx.Graph") -> "TemporalGraph":
        """Edges need a `t` attribute; nodes must be 0..N-1."""
        n = g.number_of_nodes()
        if set(g.nodes) != set(range(n)):
            raise GnndistError("networkx graph nodes must be the integers 0..N-1")
        rows = [(u, v, d.get("t")) for u, v, d in g.edges(data=True)]
        if any(r[2] is None for r in rows):
            raise GnndistError("every networkx edge needs a 't' attribute")
        a = np.array(rows, dtype=np.float64).reshape(-1, 3)
        return cls(a[:, 0].astype(np.int64), a[:, 1].astype(np.int64), a[:, 2], num_nodes=n, sort=True)
