"""Seeded synthetic graphs that scale to millions of nodes and edges (vectorized numpy).

`synthetic_static`: communities = classes, power-law degrees, homophilous edges, and node
features that say little about the class alone but much after averaging over neighbours.
`synthetic_temporal`: interactions in bursts, each node returning to a few preferred partners
in its community that drift over time, with edge features tied to the pair.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from gnndist.errors import GnndistError
from gnndist.validate import INT_MAX, is_int
from gnndist.graph import Graph, TemporalGraph, indptr_of, unique_ints

HOMOPHILY = 0.8  # share of static edges drawn inside the source's community
SIGNAL = 0.2  # class-mean scale against unit noise in the static features
SPLIT = (0.3, 0.1, 0.2)  # train / val / test shares of the static nodes (the rest unlabelled for training)


def _named(name: str) -> str:
    """An option's name with the CLI flag that sets it, e.g. "num_nodes (--num-nodes)"; the seed's
    flag is --data-seed (--seed is the partitioner's or the trainer's)."""
    return f"{name} (--{'data-seed' if name == 'seed' else name.replace('_', '-')})"


def _positive(**kw: int) -> None:
    """Each a positive integer that an int64 count holds."""
    for name, v in kw.items():
        if not is_int(v) or not 1 <= v <= INT_MAX:
            raise GnndistError(f"{_named(name)} must be a positive integer below 2**63, got {v!r}")


SEED_LIMIT = 2**64


def _check_seed(seed: int) -> None:
    """The generator seed must be an integer in [0, 2**64) (numpy's seeding refuses negatives)."""
    if not is_int(seed) or not 0 <= seed < SEED_LIMIT:
        raise GnndistError(f"{_named('seed')} must be an integer from 0 to {SEED_LIMIT - 1}, got {seed!r}")


def _power_law_weights(rng: np.random.Generator, n: int, exponent: float = 2.2, cap: float = 1e3) -> np.ndarray:
    """Pareto(exponent) node weights in [1, cap]: expected degrees follow a power law."""
    return np.minimum((1.0 - rng.random(n)) ** (-1.0 / (exponent - 1.0)), cap)


class _GroupSampler:
    """Draws nodes with probability proportional to a weight, globally or inside one group."""

    def __init__(self, group: np.ndarray, weight: np.ndarray, num_groups: int):
        self.order = np.argsort(group, kind="stable")
        self.cum = np.cumsum(weight[self.order])
        bounds = np.searchsorted(group[self.order], np.arange(num_groups + 1))
        self.lo = np.concatenate([[0.0], self.cum])[bounds[:-1]]
        self.hi = np.concatenate([[0.0], self.cum])[bounds[1:]]

    def draw(self, rng: np.random.Generator, groups: np.ndarray | None = None, size: int = 0,
             shuffle: bool = True) -> np.ndarray:
        """One node per entry of `groups` from that group, or `size` nodes from all; the latter
        are looked up in sorted order (cache-friendly), then shuffled unless `shuffle` is False."""
        if groups is not None:
            u = self.lo[groups] + rng.random(groups.size) * (self.hi[groups] - self.lo[groups])
        else:
            u = np.sort(rng.random(size)) * self.cum[-1]
        nodes = self.order[np.minimum(np.searchsorted(self.cum, u, side="right"), self.cum.size - 1)]
        return rng.permutation(nodes) if groups is None and shuffle else nodes


def synthetic_static(num_nodes: int = 10_000, num_edges: int = 100_000, num_features: int = 32,
                     num_classes: int = 8, seed: int = 0) -> Graph:
    """Undirected node-classification graph with exactly `num_edges` distinct undirected edges
    (no self-loops; stored both ways, so `Graph.num_edges == 2 * num_edges`)."""
    _positive(num_nodes=num_nodes, num_edges=num_edges, num_features=num_features, num_classes=num_classes)
    _check_seed(seed)
    if num_classes > num_nodes:
        raise GnndistError(f"num_classes ({num_classes}) must not exceed {_named('num_nodes')} ({num_nodes})")
    if num_edges > num_nodes * (num_nodes - 1) // 4:
        raise GnndistError(f"{_named('num_edges')} must be at most a quarter of all node pairs "
                           f"({num_nodes * (num_nodes - 1) // 4}) for {num_nodes} nodes, got {num_edges}")
    rng = np.random.default_rng(seed)
    n = num_nodes
    y = rng.permutation(np.arange(n) % num_classes).astype(np.int64)
    sampler = _GroupSampler(y, _power_law_weights(rng, n), num_classes)
    keys = np.empty(0, dtype=np.int64)
    while keys.size < num_edges:  # draw, drop self-loops and repeats, top up until enough
        m = int((num_edges - keys.size) * 1.1) + 16
        src = sampler.draw(rng, size=m, shuffle=False)  # sorted: edge order does not matter
        inside = rng.random(m) < HOMOPHILY
        dst = np.empty_like(src)
        dst[inside] = sampler.draw(rng, y[src[inside]])
        dst[~inside] = sampler.draw(rng, size=int(m - inside.sum()))
        lo, hi = np.minimum(src, dst), np.maximum(src, dst)
        keys = unique_ints(np.concatenate([keys, (lo * n + hi)[lo != hi]]))
    if keys.size > num_edges:
        keys = np.sort(keys[rng.choice(keys.size, num_edges, replace=False)])
    means = rng.standard_normal((num_classes, num_features), dtype=np.float32) * np.float32(SIGNAL)
    x = rng.standard_normal((n, num_features), dtype=np.float32)
    x += means[y]
    split = rng.random(n)
    bounds = np.cumsum(SPLIT)
    both = np.sort(np.concatenate([keys, (keys % n) * n + keys // n]))  # (row, col) keys, both directions
    return Graph(indptr_of(both // n, n), both % n, x=x, y=y, train_mask=split < bounds[0],
                 val_mask=(split >= bounds[0]) & (split < bounds[1]), test_mask=(split >= bounds[1]) & (split < bounds[2]))


def _mix(*parts: np.ndarray) -> np.ndarray:
    """A 64-bit hash of integer arrays (splitmix64 finalizer over a combination)."""
    h = np.zeros(np.broadcast(*parts).shape, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for p in parts:
            h = (h ^ np.asarray(p).astype(np.uint64)) * np.uint64(0x9E3779B97F4A7C15)
            h ^= h >> np.uint64(31)
            h = h * np.uint64(0xBF58476D1CE4E5B9)
            h ^= h >> np.uint64(29)
    return h


class _TemporalModel:
    """The node-level state of `synthetic_temporal`'s model (communities, activity, each node's
    partners), from which events of any time window are drawn."""

    K_PREF, MEAN_SESSION = 4, 6.0

    def __init__(self, rng: np.random.Generator, num_nodes: int, num_events: int, seed: int):
        n = num_nodes
        self.n, self.e, self.seed = n, num_events, seed
        num_comm = max(1, int(round(np.sqrt(n) / 2)))
        self.comm = rng.integers(0, num_comm, n)
        self.sampler = _GroupSampler(self.comm, _power_law_weights(rng, n), num_comm)
        self.counts = np.bincount(self.comm, minlength=num_comm)
        self.members = np.argsort(self.comm, kind="stable")
        self.first = np.concatenate([[0], np.cumsum(self.counts)])[:-1]

    def events(self, rng: np.random.Generator, e: int, t0: float, span: float
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """`e` events (src, dst, t sorted, and each one's place in its session from 0) of
        sessions starting in [t0, t0 + span)."""
        n, k_pref, mean_session = self.n, self.K_PREF, self.MEAN_SESSION
        # sessions: a source node, a start time, a main partner slot, and a length (>= 1 event)
        lengths = rng.geometric(1.0 / mean_session, size=int(e / mean_session * 1.2) + 16)
        while lengths.sum() < e:
            lengths = np.concatenate([lengths, rng.geometric(1.0 / mean_session, size=lengths.size)])
        lengths = lengths[:np.searchsorted(np.cumsum(lengths), e) + 1]
        lengths[-1] -= lengths.sum() - e
        s = lengths.size
        who = self.sampler.draw(rng, size=s)
        start = np.sort(rng.random(s)) * span  # sessions in start order: events come out nearly sorted
        if t0:
            start += t0
        main_slot = rng.integers(0, k_pref, s)
        sess = np.repeat(np.arange(s), lengths)
        begin = np.cumsum(lengths) - lengths  # position of each session's first event
        gaps = rng.exponential(0.02 * mean_session, e)  # within-session gaps, far below the mean spacing 1
        gaps[begin] = 0.0
        run = np.cumsum(gaps)
        t = start[sess] + (run - run[begin][sess])
        src = who[sess]
        # partner: the session's main slot (60%), another slot (30%), or anyone (10%)
        u = rng.random(e)
        slot = np.where(u < 0.6, main_slot[sess], rng.integers(0, k_pref, e))
        seed = self.seed
        period = self.e / 8.0 * (0.5 + _mix(seed, src, slot, 1).astype(np.float64) / 2.0 ** 64)  # each slot drifts
        phase = _mix(seed, src, slot, 2).astype(np.float64) / 2.0 ** 64
        epoch = np.floor(t / period + phase).astype(np.int64)
        c = self.comm[src]
        dst = self.members[self.first[c] + (_mix(seed, src, slot, epoch) % self.counts[c].astype(np.uint64)
                                            ).astype(np.int64)]
        anyone = u >= 0.9
        dst[anyone] = self.sampler.draw(rng, size=int(anyone.sum()))
        clash = dst == src
        dst[clash] = (src[clash] + 1 + rng.integers(0, n - 1, int(clash.sum()))) % n
        order = np.argsort(t, kind="stable")
        return src[order], dst[order], t[order], (np.arange(e) - begin[sess])[order]


def _edge_features(rng: np.random.Generator, node_vec: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Edge features: the two endpoints' fixed vectors plus noise."""
    feat = rng.standard_normal((src.size, node_vec.shape[1]), dtype=np.float32)
    feat *= np.float32(0.5)
    feat += node_vec[src]
    feat += node_vec[dst]
    return feat


def _check_temporal(num_nodes: int, num_events: int, edge_dim: int, seed: int, session_labels: int) -> None:
    _positive(num_nodes=num_nodes, num_events=num_events, edge_dim=edge_dim)
    _check_seed(seed)
    if not is_int(session_labels) or not 0 <= session_labels <= INT_MAX:
        raise GnndistError(f"{_named('session_labels')} must be an integer >= 0 (0: no labels), got {session_labels!r}")
    if num_nodes < 2:
        raise GnndistError(f"{_named('num_nodes')} must be at least 2, got {num_nodes}")


def synthetic_temporal(num_nodes: int = 1_000, num_events: int = 20_000, edge_dim: int = 8,
                       seed: int = 0, session_labels: int = 0) -> TemporalGraph:
    """Temporal interaction graph with exactly `num_events` events at times from 0 to about
    `num_events` (one event per time unit on average).

    Nodes (power-law activity) open sessions: bursts of events at short gaps. In a session a node
    mostly messages one of its K preferred partners (drawn from its community, each replaced
    at its own pace over time), sometimes another preferred one, rarely anyone. Edge features
    are a mix of the two endpoints' fixed vectors plus noise. With `session_labels` N > 0, each
    event has a state label of its source, as JODIE's files do (`edge_label`): 1 from the Nth
    event of the source's session on (a node deep in a burst), else 0.
    """
    _check_temporal(num_nodes, num_events, edge_dim, seed, session_labels)
    rng = np.random.default_rng(seed)
    model = _TemporalModel(rng, num_nodes, num_events, seed)
    src, dst, t, place = model.events(rng, num_events, 0.0, float(num_events))
    node_vec = rng.standard_normal((num_nodes, edge_dim), dtype=np.float32)
    return TemporalGraph(src, dst, t, _edge_features(rng, node_vec, src, dst), num_nodes=num_nodes,
                         edge_label=_session_labels(place, session_labels))


def _session_labels(place: np.ndarray, n: int) -> np.ndarray | None:
    """State labels of events at `place` in their sessions: 1 from the nth on (None where n is 0)."""
    return (place >= n - 1).astype(np.int64) if n else None


def synthetic_temporal_windows(num_nodes: int, num_events: int, edge_dim: int, seed: int, windows: int,
                               session_labels: int = 0
                               ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]]:
    """`synthetic_temporal`'s model generated one time window at a time: (src, dst, t, edge
    features, state labels or None) of each of `windows` consecutive windows, in time order (each
    sorted by time, every time at or after the previous window's last).

    Window w holds about `num_events / windows` events: those of the sessions that start in
    [num_events * w / windows, num_events * (w + 1) / windows), less the few that run past its end
    (held back for the next window). Window 0 draws from the generator's own random stream, so
    one window gives exactly `synthetic_temporal(num_nodes, num_events, edge_dim, seed,
    session_labels)`; window w >= 1 from a stream seeded by (seed, w). Held between windows: the
    node-level state (a few arrays of num_nodes entries, the node vectors [num_nodes, edge_dim])
    and those held-back events.
    """
    _check_temporal(num_nodes, num_events, edge_dim, seed, session_labels)
    _positive(windows=windows)
    rng = np.random.default_rng(seed)
    model = _TemporalModel(rng, num_nodes, num_events, seed)
    node_vec = None
    # src, dst, t, place in session, edge features
    held = (np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0), np.empty(0, np.int64),
            np.empty((0, edge_dim), np.float32))
    for w in range(windows):
        lo, hi = num_events * w // windows, num_events * (w + 1) // windows
        if w:
            rng = np.random.default_rng([seed, w])
        src, dst, t, place = model.events(rng, hi - lo, float(lo), float(hi - lo)) if hi > lo else held[:4]
        if node_vec is None:
            node_vec = rng.standard_normal((num_nodes, edge_dim), dtype=np.float32)
        new = (src, dst, t, place, _edge_features(rng, node_vec, src, dst)) if hi > lo else held
        if hi > lo and held[0].size:
            both = [np.concatenate([a, b]) for a, b in zip(held, new)]
            order = np.argsort(both[2], kind="stable")
            new = tuple(a[order] for a in both)
        cut = new[2].size if w == windows - 1 else int(np.searchsorted(new[2], float(hi)))
        held = tuple(a[cut:] for a in new)
        src, dst, t, place, feat = (a[:cut] for a in new)
        yield src, dst, t, feat, _session_labels(place, session_labels)
