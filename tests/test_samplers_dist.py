"""Distributed sampling and feature fetching on 2 and 4 local gloo ranks, against the
single-process samplers and the global feature rows.

Each rank builds the same random global graph and keeps its own contiguous id range (unequal
sizes), as a partition store would give it. One launch per world size runs every check; the
tests below read its results.
"""
import numpy as np
import pytest
import torch

from gnndist.runtime.launch import launch
from gnndist.runtime import dist
from gnndist.partition import PartitionBook
from gnndist.samplers import (POLICIES, DistNeighborSampler, DistTemporalSampler, DistFeatures, PrefetchLoader,
                              degree_scores, sample_neighbors, sample_temporal_multihop,
                              sample_temporal_neighbors, visit_scores)
from gnndist.samplers.temporal import sample_tcsr
from test_samplers import random_graph, random_tgraph

N, F = 300, 5
FANOUTS = [4, 3]
CAPACITIES = (0.3, 40 * F * 4)  # a fraction of the remote ids, and bytes (40 rows)


def offsets_for(n, w, seed=0):
    """Unequal contiguous ranges: rank r owns ids offsets[r] .. offsets[r+1]-1."""
    cuts = np.sort(np.random.default_rng(seed).choice(np.arange(10, n - 10), w - 1, replace=False))
    return np.concatenate([[0], cuts, [n]]).astype(np.int64)


def seeds_of(r, n):
    """Rank 0 has no seeds (it still takes part in every exchange); others own and remote ones."""
    return np.empty(0, np.int64) if r == 0 else np.random.default_rng(r).permutation(n)[:25 + 5 * r]


def queries_of(r, n):
    rng = np.random.default_rng(100 + r)
    q = 0 if r == 1 else 40
    return rng.integers(0, n, q), rng.uniform(0, 210, q)


def features(n, dim, seed=0):
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def fetch_batches(r, n, steps=3):
    rng = np.random.default_rng(200 + r)
    return [rng.integers(0, n, 60) for _ in range(steps)]


def worker():
    dist.setup("cpu")
    r = dist.rank()
    out = {}
    g = random_graph(n=N)
    off = offsets_for(N, dist.world_size())
    lo, hi = int(off[r]), int(off[r + 1])
    sampler = DistNeighborSampler(g.indptr[lo:hi + 1] - g.indptr[lo], g.indices[g.indptr[lo]:g.indptr[hi]], PartitionBook(off))
    seeds = seeds_of(r, N)
    for replace in (False, True):
        b = sampler.sample(seeds, FANOUTS, replace, seed=5)
        out["static", replace] = (b.node_ids, b.num_nodes_per_hop, b.edge_index)
    b = sampler.sample(seeds, [-1, -1])
    out["static", "full"] = (b.node_ids, b.num_nodes_per_hop, b.edge_index)

    tg = random_tgraph()
    toff = offsets_for(tg.num_nodes, dist.world_size(), seed=1)
    tlo, thi = int(toff[r]), int(toff[r + 1])
    touch = ((tg.src >= tlo) & (tg.src < thi)) | ((tg.dst >= tlo) & (tg.dst < thi))
    eids = np.flatnonzero(touch)
    tsampler = DistTemporalSampler.from_events(tg.src[eids], tg.dst[eids], tg.t[eids], eids, PartitionBook(toff))
    nodes, times = queries_of(r, tg.num_nodes)
    for strategy in ("recent", "uniform"):
        s = tsampler.sample(nodes, times, 5, strategy, seed=3)
        out["temporal", strategy] = (s.nbr, s.eid, s.ts, s.dt, s.mask)
        out["multihop", strategy] = [(h.nbr, h.eid, h.ts, h.mask)
                                     for h in tsampler.sample_multihop(nodes, times, [3, 2], strategy, seed=3)]

    x = features(N, F)
    store = DistFeatures(x[lo:hi], PartitionBook(off))
    deg = degree_scores(sampler.indices, N)
    visits = visit_scores((sampler.sample(s, FANOUTS, seed=99).node_ids for s in np.array_split(seeds, 3)), N)
    scores = {"none": None, "degree": deg, "presample": visits, "adaptive": deg}
    remote = np.setdiff1d(np.arange(N), np.arange(lo, hi))
    for policy in POLICIES:
        for capacity in CAPACITIES:
            store.set_cache(policy, capacity, scores[policy])
            store.reset_counters()
            cached = None if store.cache is None else store.cache.ids[:store.cache.size].copy()
            exact = all(torch.equal(store.fetch(ids), torch.from_numpy(x[ids])) for ids in fetch_batches(r, N))
            out["features", policy, capacity] = (exact, store.stats(), cached, remote.size)
    ones = np.ones(N)
    store.set_cache("degree", 1.0, ones)
    store.reset_counters()
    exact = all(torch.equal(store.fetch(ids), torch.from_numpy(x[ids])) for ids in fetch_batches(r, N))
    out["features", "all-cached"] = (exact, store.stats())

    ef = features(tg.num_events, 3, seed=1)
    held = ef[eids]
    carried = tsampler.sample_hop(nodes, np.where(np.arange(nodes.size) % 7 == 0, -np.inf, times), 5, 0, "recent", 3,
                                  lambda e: held[np.searchsorted(eids, e)])
    out["carried"] = (carried.eid, carried.mask, carried.feat)
    estore = DistFeatures.for_events(ef[eids], eids, tg.num_events)
    batch = np.random.default_rng(r).integers(0, tg.num_events, 200)
    holder = np.searchsorted(toff, tg.src[batch], side="right") - 1  # the source's owner holds the event
    exact = {}
    for policy in POLICIES:
        far = np.setdiff1d(np.arange(tg.num_events), eids)  # candidates: events this rank does not hold
        cand = (far, np.random.default_rng(5).random(far.size), np.searchsorted(toff, tg.src[far], side="right") - 1)
        estore.set_cache(policy, 0.3, candidates=cand if policy in ("degree", "presample") else None)
        estore.reset_counters()
        exact[policy] = (all(torch.equal(estore.fetch(b, h), torch.from_numpy(ef[b]))
                             for b, h in zip(np.array_split(batch, 4), np.array_split(holder, 4))),
                         estore.stats())
    out["edge-features"] = exact

    # prefetching: sample + fetch in the background thread while the main thread all-reduces
    store.set_cache("adaptive", 0.2, deg)
    work = np.array_split(np.random.default_rng(300 + r).permutation(N)[:90], 6)

    def step(batch_seeds):
        b = sampler.sample(batch_seeds, FANOUTS, seed=7)
        return b.node_ids, store.fetch(b.node_ids)

    inline = list(PrefetchLoader(work, step, enabled=False))
    ahead = []
    for item in PrefetchLoader(work, step):
        dist.all_reduce(torch.ones(3))
        ahead.append(item)
    out["prefetch"] = all(np.array_equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(inline, ahead)) \
        and len(ahead) == len(work) and all(torch.equal(f, torch.from_numpy(x[i])) for i, f in ahead)
    return out


@pytest.fixture(scope="module", params=[2, 4])
def run(request):
    mp = pytest.MonkeyPatch()
    mp.setenv("GNNDIST_TIMEOUT", "60")
    try:
        yield request.param, launch(request.param, worker)
    finally:
        mp.undo()


def same_blocks(got, b):
    node_ids, sizes, edges = got
    return (np.array_equal(node_ids, b.node_ids) and sizes == b.num_nodes_per_hop
            and all(np.array_equal(e, f) for e, f in zip(edges, b.edge_index)))


def test_static_distributed_equals_single_process(run):
    w, outs = run
    g = random_graph(n=N)
    for r, out in enumerate(outs):
        seeds = seeds_of(r, N)
        for replace in (False, True):
            assert same_blocks(out["static", replace], sample_neighbors(g, seeds, FANOUTS, replace, seed=5))
        assert same_blocks(out["static", "full"], sample_neighbors(g, seeds, [-1, -1]))


def test_static_distributed_samples_true_neighbours_and_full_neighbourhoods(run):
    _, outs = run
    g = random_graph(n=N)
    nbrs = [sorted(g.indices[g.indptr[v]:g.indptr[v + 1]].tolist()) for v in range(N)]
    for r, out in enumerate(outs):
        for key in (False, True, "full"):
            node_ids, sizes, edges = out["static", key]
            assert sizes[0] == seeds_of(r, N).size
            for ei in edges:
                src, dst = node_ids[ei[0]], node_ids[ei[1]]
                for v in set(dst.tolist()):
                    mine = sorted(src[dst == v].tolist())
                    if key == "full":
                        assert mine == nbrs[v]
                    else:
                        assert set(mine) <= set(nbrs[v])


def test_temporal_distributed_equals_single_process_and_is_strictly_earlier(run):
    _, outs = run
    tg = random_tgraph()
    for r, out in enumerate(outs):
        nodes, times = queries_of(r, tg.num_nodes)
        for strategy in ("recent", "uniform"):
            ref = sample_temporal_neighbors(tg, nodes, times, 5, strategy, seed=3)
            nbr, eid, ts, dt, mask = out["temporal", strategy]
            for a, b in zip((nbr, eid, ts, dt, mask), (ref.nbr, ref.eid, ref.ts, ref.dt, ref.mask)):
                assert np.array_equal(a, b)
            assert np.all(ts[mask] < np.broadcast_to(times[:, None], ts.shape)[mask])
            assert np.all((tg.src[eid[mask]] == nbr[mask]) | (tg.dst[eid[mask]] == nbr[mask]))
            hops = sample_temporal_multihop(tg, nodes, times, [3, 2], strategy, seed=3)
            for got, h in zip(out["multihop", strategy], hops):
                assert all(np.array_equal(a, b) for a, b in zip(got, (h.nbr, h.eid, h.ts, h.mask)))


def test_features_sent_with_a_sample_are_the_sampled_events_rows(run):
    """The sampling rank sends the rows of the events it sampled (it holds every event touching
    the node it sampled); padding, and queries at time -inf, get zeros."""
    _, outs = run
    tg = random_tgraph()
    ef = features(tg.num_events, 3, seed=1)
    for out in outs:  # rank 1 asks nothing, and is asked
        eid, mask, feat = out["carried"]
        assert feat.shape == (*eid.shape, 3) and not mask[::7].any()
        assert np.array_equal(feat[mask], ef[eid[mask]]) and not feat[~mask].any()
    assert sum(int(out["carried"][1].sum()) for out in outs) > 100


def test_fetched_features_are_bit_exact_with_every_cache(run):
    _, outs = run
    for out in outs:
        for policy in POLICIES:
            for capacity in CAPACITIES:
                exact, stats, cached, n_remote = out["features", policy, capacity]
                assert exact, (policy, capacity)
                assert stats["hits"] + stats["misses"] == stats["requests"] > 0
                assert stats["bytes_fetched"] == stats["misses"] * F * 4
                assert stats["bytes_saved"] == stats["hits"] * F * 4
                if policy == "none":
                    assert stats["hits"] == 0 and cached is None
                else:
                    limit = 40 if capacity > 1 else int(capacity * n_remote)
                    assert stats["cached_rows"] <= limit
        for policy, (exact, stats) in out["edge-features"].items():
            assert exact, policy  # every row right, read in place, from the cache or from its holder
            assert stats["hits"] + stats["misses"] == stats["requests"] > 0
            assert (stats["hits"] > 0) == (policy != "none") and stats["cached_rows"] <= stats["requests"] + 1000
        exact, stats = out["features", "all-cached"]
        assert exact and stats["misses"] == 0 and stats["hits"] == stats["requests"] > 0


def test_static_caches_hold_the_top_scored_remote_ids(run):
    w, outs = run
    g = random_graph(n=N)
    off = offsets_for(N, w)
    deg = np.bincount(g.indices, minlength=N)
    for r, out in enumerate(outs):
        remote = np.setdiff1d(np.arange(N), np.arange(off[r], off[r + 1]))
        _, stats, cached, _ = out["features", "degree", 0.3]
        assert cached.size == int(0.3 * remote.size) and np.isin(cached, remote).all()
        assert deg[cached].min() >= deg[np.setdiff1d(remote, cached)].max()


def test_prefetch_with_concurrent_main_thread_collectives(run):
    _, outs = run
    assert all(out["prefetch"] for out in outs)


def test_one_rank_samples_without_an_exchange_as_the_single_process_sampler():
    """Outside a process group (one rank) `sample_hop` runs the kernel on the queries directly:
    the single-process sample of every hop and strategy, queries at time -inf empty, and the
    sampled events' feature rows where asked (zeros in padding)."""
    tg = random_tgraph()
    ef = features(tg.num_events, 3, seed=1)
    eids = np.arange(tg.num_events)
    sampler = DistTemporalSampler.from_events(tg.src, tg.dst, tg.t, eids, PartitionBook.whole(tg.num_nodes))
    nodes, times = queries_of(0, tg.num_nodes)
    times = np.where(np.arange(nodes.size) % 7 == 0, -np.inf, times)
    for strategy in ("recent", "uniform"):
        got = sampler.sample_hop(nodes, times, 5, 1, strategy, 3, lambda e: ef[e])
        ref = sample_tcsr(*tg.tcsr(), nodes, times, 5, strategy, 3, 1)
        for a, b in zip((got.nbr, got.eid, got.ts, got.dt, got.mask), (ref.nbr, ref.eid, ref.ts, ref.dt, ref.mask)):
            assert a.dtype == b.dtype and np.array_equal(a, b)
        assert not got.mask[::7].any() and got.mask.sum() > 50
        assert np.array_equal(got.feat[got.mask], ef[got.eid[got.mask]]) and not got.feat[~got.mask].any()
        hops = sampler.sample_multihop(nodes, np.where(times > -np.inf, times, 1.0), [3, 2], strategy, seed=3)
        for h, r in zip(hops, sample_temporal_multihop(tg, nodes, np.where(times > -np.inf, times, 1.0), [3, 2],
                                                       strategy, seed=3)):
            assert all(np.array_equal(a, b) for a, b in zip((h.nbr, h.eid, h.ts, h.dt, h.mask),
                                                            (r.nbr, r.eid, r.ts, r.dt, r.mask)))
