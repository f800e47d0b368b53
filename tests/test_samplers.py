"""Local sampling kernels against brute force, networkx and a full-graph PyG layer: true
neighbours only, exact counts and neighbourhoods, strictly earlier events, the k latest for
`recent`, uniform frequencies, and identical output for 1 and 2 numba threads."""
from collections import Counter
from pathlib import Path

import networkx as nx
import numba
import numpy as np
import pytest
import torch

from gnndist.errors import GnndistError
from gnndist.graph import Graph, TemporalGraph
from gnndist.samplers import (sample_neighbors, sample_tcsr, sample_temporal_multihop,
                              sample_temporal_neighbors)
from gnndist.samplers.static import sample_rows

DATA = Path(__file__).resolve().parents[2] / "shared" / "datasets"


def random_graph(n=300, e=3000, seed=0):
    """Skewed degrees, multi-edges, self-loops and isolated nodes included."""
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, n + 1) ** 0.8
    w[-20:] = 0  # isolated tail
    src = rng.choice(n, e, p=w / w.sum())
    dst = rng.choice(n, e, p=w / w.sum())
    return Graph.from_edges(src, dst, n)


def random_tgraph(n=60, e=1500, seed=0, self_loops=True):
    """Integer times, so many ties."""
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    if not self_loops:
        dst = np.where(dst == src, (dst + 1) % n, dst)
    return TemporalGraph(src, dst, np.sort(rng.integers(0, 200, e)).astype(np.float64), num_nodes=n)


def neighbour_lists(g):
    return [g.indices[g.indptr[v]:g.indptr[v + 1]] for v in range(g.num_nodes)]


def with_threads(k, fn):
    old = numba.get_num_threads()
    numba.set_num_threads(k)
    try:
        return fn()
    finally:
        numba.set_num_threads(old)


def global_edges(b, h):
    return b.node_ids[b.edge_index[h][0]], b.node_ids[b.edge_index[h][1]]


@pytest.mark.parametrize("replace", [False, True])
def test_static_samples_are_true_neighbours_with_exact_counts(replace):
    g = random_graph()
    nbrs = neighbour_lists(g)
    seeds = np.random.default_rng(1).permutation(g.num_nodes)[:40]
    fanouts = [5, 3, 2]
    b = sample_neighbors(g, seeds, fanouts, replace=replace, seed=7)
    assert np.array_equal(b.node_ids[:40], seeds)
    assert len(set(b.node_ids.tolist())) == b.node_ids.size
    assert sum(b.num_nodes_per_hop) == b.node_ids.size and len(b.edge_index) == 3
    start = 0
    for h, f in enumerate(fanouts):
        targets = b.node_ids[:start + b.num_nodes_per_hop[h]]
        src, dst = global_edges(b, h)
        # hop h targets are every node reached before it, each with the right number of samples
        assert set(dst.tolist()) <= set(targets.tolist())
        got = Counter(dst.tolist())
        for v in targets.tolist():
            d = nbrs[v].size
            assert got.get(v, 0) == ((f if d else 0) if replace else min(d, f))
        # every sampled edge exists; without replacement no CSR slot is used twice
        for v in set(dst.tolist()):
            have, mine = Counter(nbrs[v].tolist()), Counter(src[dst == v].tolist())
            assert set(mine) <= set(have)
            if not replace:
                assert all(mine[u] <= have[u] for u in mine)
        # the next layer is exactly the new nodes this hop found, in first-seen order
        start += b.num_nodes_per_hop[h]
        seen = set(b.node_ids[:start].tolist())
        new = list(dict.fromkeys(u for u in src.tolist() if u not in seen))
        assert b.node_ids[start:start + b.num_nodes_per_hop[h + 1]].tolist() == new


def test_full_fanout_gives_exact_neighbourhoods_and_bfs_layers():
    g = random_graph(seed=3)
    nbrs = neighbour_lists(g)
    seeds = np.array([5, 17, 250])
    b = sample_neighbors(g, seeds, [-1, -1], seed=1)
    layers = list(nx.bfs_layers(g.to_networkx().reverse(copy=False), seeds.tolist()))
    start = 0
    for h in range(3):
        assert set(b.node_ids[start:start + b.num_nodes_per_hop[h]].tolist()) == set(layers[h])
        start += b.num_nodes_per_hop[h]
    for h in range(2):
        src, dst = global_edges(b, h)
        for v in set(dst.tolist()):
            assert sorted(src[dst == v].tolist()) == sorted(nbrs[v].tolist())


def test_blocks_feed_pyg_layers_like_the_full_graph():
    from torch_geometric.nn import SAGEConv

    g = random_graph(n=120, e=700, seed=4)
    x = torch.randn(g.num_nodes, 8, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    conv1, conv2 = SAGEConv(8, 16), SAGEConv(16, 4)
    full_ei = g.to_pyg().edge_index
    full = conv2(conv1(x, full_ei).relu(), full_ei)
    seeds = np.array([3, 50, 7, 99])
    n_id, (ei1, ei2) = sample_neighbors(g, seeds, [-1, -1]).to_pyg()
    sub = conv2(conv1(x[n_id], ei1).relu(), ei2)
    torch.testing.assert_close(sub[:4], full[torch.from_numpy(seeds)])


def test_a_seeds_output_does_not_depend_on_the_other_seeds_of_its_batch():
    """Sampled (fanouts below the degrees), each seed's logits from a batch of 60 are those of
    the seed sampled alone with the same seed: the draws for a node at a hop are its own,
    whichever seeds reached it (what lets W ranks, each sampling its share of a global batch,
    train as one process)."""
    from torch_geometric.nn import SAGEConv

    g = random_graph(n=300, e=3000, seed=6)
    x = torch.randn(g.num_nodes, 8, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    conv1, conv2 = SAGEConv(8, 16), SAGEConv(16, 4)

    def logits(seeds):
        n_id, (ei1, ei2) = sample_neighbors(g, seeds, [4, 3], seed=11).to_pyg()
        return conv2(conv1(x[n_id], ei1).relu(), ei2)[:seeds.size]
    seeds = np.random.default_rng(2).permutation(g.num_nodes)[:60]
    together = logits(seeds)
    for i, v in enumerate(seeds[:10]):
        torch.testing.assert_close(together[i], logits(np.array([v]))[0])


def test_static_is_deterministic_across_threads_and_batches():
    g = random_graph(seed=5)
    seeds = np.arange(0, 280, 3)
    for replace in (False, True):
        one = with_threads(1, lambda: sample_neighbors(g, seeds, [4, 3], replace, seed=11))
        two = with_threads(2, lambda: sample_neighbors(g, seeds, [4, 3], replace, seed=11))
        assert np.array_equal(one.node_ids, two.node_ids)
        assert all(np.array_equal(a, b) for a, b in zip(one.edge_index, two.edge_index))
        other = sample_neighbors(g, seeds, [4, 3], replace, seed=12)
        assert not np.array_equal(one.node_ids, other.node_ids)
    # a node's draws do not depend on the rest of the batch
    a = sample_neighbors(g, seeds, [4], seed=3)
    b = sample_neighbors(g, seeds[::-1].copy(), [4], seed=3)
    sa, da = global_edges(a, 0)
    sb, db = global_edges(b, 0)
    assert all(sorted(sa[da == v].tolist()) == sorted(sb[db == v].tolist()) for v in seeds.tolist())


def test_static_uniform_frequencies():
    # 3000 targets share the same 10 neighbours: each neighbour is drawn with p = 3/10
    n_t, d, f = 3000, 10, 3
    src = np.tile(np.arange(n_t, n_t + d), n_t)
    dst = np.repeat(np.arange(n_t), d)
    g = Graph.from_edges(src, dst, n_t + d)
    for replace in (False, True):
        b = sample_neighbors(g, np.arange(n_t), [f], replace=replace, seed=2)
        freq = np.bincount(b.node_ids[b.edge_index[0][0]] - n_t, minlength=d)
        expect, sd = n_t * f / d, np.sqrt(n_t * f * (1 - 1 / d) / d)
        assert np.all(np.abs(freq - expect) < 5 * sd), freq


def test_static_rejects_bad_input():
    g = random_graph(n=30, e=100)
    with pytest.raises(GnndistError):
        sample_neighbors(g, [1, 1], [2])
    with pytest.raises(GnndistError):
        sample_neighbors(g, [1, 30], [2])
    with pytest.raises(GnndistError):
        sample_neighbors(g, [1], [0])
    empty = sample_neighbors(g, [], [3, 2])
    assert empty.num_nodes_per_hop == [0, 0, 0] and empty.num_sampled == 0


def brute_force_earlier(tg, v, t):
    """Events touching v strictly before t, most recent first (ties: larger event id first)."""
    rows = []
    for e in range(tg.num_events):
        if tg.t[e] < t:
            if tg.src[e] == v:
                rows.append((tg.t[e], e, tg.dst[e]))
            if tg.dst[e] == v:
                rows.append((tg.t[e], e, tg.src[e]))
    return sorted(rows, key=lambda r: (r[0], r[1]), reverse=True)


def test_recent_returns_exactly_the_k_latest_earlier_events():
    tg = random_tgraph()
    rng = np.random.default_rng(3)
    nodes = rng.integers(0, tg.num_nodes, 150)
    times = rng.integers(0, 210, 150).astype(np.float64)  # includes exact ties with event times
    k = 6
    s = sample_temporal_neighbors(tg, nodes, times, k)
    assert s.nbr.shape == (150, k) and s.ts.dtype == np.float64 and s.dt.dtype == np.float32
    for q in range(150):
        want = brute_force_earlier(tg, nodes[q], times[q])[:k]
        c = len(want)
        assert s.mask[q].tolist() == [True] * c + [False] * (k - c)
        assert s.ts[q, :c].tolist() == [r[0] for r in want]
        assert s.eid[q, :c].tolist() == [r[1] for r in want]
        assert s.nbr[q, :c].tolist() == [r[2] for r in want]
        assert np.all(s.ts[q, :c] < times[q])
        assert np.array_equal(s.dt[q, :c], (times[q] - s.ts[q, :c]).astype(np.float32))
        assert not s.nbr[q, c:].any() and not s.dt[q, c:].any()
    raw = sample_tcsr(*tg.tcsr(), nodes, times, k)
    assert all(np.array_equal(getattr(raw, a), getattr(s, a)) for a in ("nbr", "eid", "ts", "dt", "mask"))


def test_uniform_temporal_samples_distinct_earlier_events():
    tg = random_tgraph(seed=1, self_loops=False)
    rng = np.random.default_rng(4)
    nodes = rng.integers(0, tg.num_nodes, 200)
    times = rng.uniform(0, 210, 200)
    k = 5
    one = with_threads(1, lambda: sample_temporal_neighbors(tg, nodes, times, k, "uniform", seed=9))
    two = with_threads(2, lambda: sample_temporal_neighbors(tg, nodes, times, k, "uniform", seed=9))
    assert all(np.array_equal(getattr(one, a), getattr(two, a)) for a in ("nbr", "eid", "ts", "mask"))
    for q in range(200):
        valid = {r[1]: r for r in brute_force_earlier(tg, nodes[q], times[q])}
        c = int(one.mask[q].sum())
        assert c == min(k, len(valid))
        eids = one.eid[q, :c].tolist()
        assert len(set(eids)) == c and set(eids) <= set(valid)
        assert all(valid[e][2] == u and valid[e][0] == t for e, u, t in zip(eids, one.nbr[q], one.ts[q]))
        assert list(one.ts[q, :c]) == sorted(one.ts[q, :c], reverse=True)
    other = sample_temporal_neighbors(tg, nodes, times, k, "uniform", seed=10)
    assert not np.array_equal(one.eid, other.eid)


def test_uniform_temporal_frequencies():
    # node 0 has 10 earlier partners; 4000 queries at distinct later times each draw 3
    tg = TemporalGraph(np.zeros(10, np.int64), np.arange(1, 11), np.arange(10.0), num_nodes=11)
    q = 4000
    s = sample_temporal_neighbors(tg, np.zeros(q, np.int64), 100 + np.arange(q, dtype=np.float64), 3, "uniform")
    freq = np.bincount(s.eid[s.mask], minlength=10)
    expect, sd = q * 0.3, np.sqrt(q * 0.3 * 0.7)
    assert np.all(np.abs(freq - expect) < 5 * sd), freq


M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix64(x):
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def floyd_reference(seed, salt, key, extra, c, d):
    """The draws as the samplers first made them, in plain Python integers: the stream of
    (seed, salt, key, extra) by splitmix64, then Floyd's c distinct positions in [0, d)."""
    stream = mix64(mix64((seed + salt * GOLDEN) & M64) ^ mix64(((key * GOLDEN) & M64) ^ (extra & M64)))
    out = []
    for j in range(c):
        m = d - c + j
        t = ((mix64((stream + (j + 1) * GOLDEN) & M64) >> 32) * (m + 1)) >> 32
        out.append(m if t in out else t)
    return out


@pytest.mark.parametrize("threads", [1, 2])
def test_uniform_draws_are_the_reference_draws(threads):
    # the same seed keeps giving the same samples: temporal (sorted, most recent first) and static
    tg = random_tgraph(n=40, e=3000, seed=6)
    indptr, _, eid, ts = tg.tcsr()
    rng = np.random.default_rng(7)
    q = 5000  # above the parallel threshold at k = 10
    nodes, times = rng.integers(0, 40, q), rng.integers(-5, 215, q).astype(np.float64)
    times[::5] = -np.inf
    for k, seed, hop in ((10, 3, 0), (4, 2**64 - 1, 2)):
        s = with_threads(threads, lambda: sample_tcsr(*tg.tcsr(), nodes, times, k, "uniform", seed, hop))
        for i in range(q):
            v, t = int(nodes[i]), times[i]
            start = indptr[v]
            p = int(np.searchsorted(ts[start:indptr[v + 1]], t))
            pos = (sorted(floyd_reference(seed, hop, v, int(np.float64(t).view(np.int64)), k, p), reverse=True)
                   if p > k else range(p - 1, max(p - k, 0) - 1, -1))
            assert s.eid[i, :s.mask[i].sum()].tolist() == [int(eid[start + j]) for j in pos]
    g = random_graph(seed=8)
    rows = np.arange(g.num_nodes)
    deg = g.indptr[1:] - g.indptr[:-1]
    counts, edges = with_threads(threads, lambda: sample_rows(g.indptr, g.indices, rows, rows, 4, False, 5, 1))
    got = np.split(edges[0], np.cumsum(counts)[:-1])
    for v in rows[deg > 4].tolist():
        want = [g.indices[g.indptr[v] + j] for j in floyd_reference(5, 1, v, 0, 4, int(deg[v]))]
        assert got[v].tolist() == want


def test_temporal_multihop_queries_neighbours_at_their_event_times():
    tg = random_tgraph(seed=2)
    nodes = np.array([0, 5, 9, 33])
    times = np.array([150.0, 20.0, 0.0, 199.0])
    for strategy in ("recent", "uniform"):
        h1, h2 = sample_temporal_multihop(tg, nodes, times, [4, 3], strategy, seed=5)
        assert h2.nbr.shape == (16, 3)
        again = sample_temporal_neighbors(tg, h1.nbr.reshape(-1), h1.ts.reshape(-1), 3, strategy, seed=5)
        live = h1.mask.reshape(-1)
        if strategy == "recent":
            assert np.array_equal(h2.eid[live], again.eid[live])
        assert not h2.mask[~live].any()
        assert np.all(h2.ts[live][h2.mask[live]] < np.repeat(h1.ts.reshape(-1)[live], 3).reshape(-1, 3)[h2.mask[live]])


def test_temporal_rejects_bad_input():
    tg = random_tgraph()
    with pytest.raises(GnndistError):
        sample_temporal_neighbors(tg, [1], [np.nan], 3)
    with pytest.raises(GnndistError):
        sample_temporal_neighbors(tg, [1], [1.0], 3, strategy="latest")
    with pytest.raises(GnndistError):
        sample_temporal_neighbors(tg, [1, 2], [1.0], 3)


@pytest.mark.skipif(not (DATA / "uci_collegemsg").exists(), reason="shared datasets absent")
def test_recent_on_real_events_matches_brute_force():
    from gnndist.datasets import load

    tg = load(str(DATA / "uci_collegemsg" / "CollegeMsg.txt.gz"))
    rng = np.random.default_rng(0)
    pick = rng.integers(0, tg.num_events, 100)
    nodes, times = tg.src[pick], tg.t[pick]
    s = sample_temporal_neighbors(tg, nodes, times, 10)
    for q in range(100):
        v, t = nodes[q], times[q]
        touch = np.flatnonzero(((tg.src == v) | (tg.dst == v)) & (tg.t < t))
        want = touch[np.lexsort((touch, tg.t[touch]))][::-1][:10]  # self-loops: none in this data
        assert s.eid[q, :int(s.mask[q].sum())].tolist() == want.tolist()
