"""Feature store, cache policies and the prefetch loader in one process (the 2- and 4-rank
checks are in test_samplers_dist.py)."""
import os
import threading

import numpy as np
import pytest
import torch

from gnndist.errors import GnndistError
from gnndist.partition import PartitionBook
from gnndist.samplers import DistFeatures, PrefetchLoader, degree_scores, visit_scores
from gnndist.samplers.cache import AdaptiveCache, StaticCache, capacity_rows


def test_single_rank_store_reads_rows_in_place():
    x = np.random.default_rng(0).standard_normal((50, 4)).astype(np.float32)
    store = DistFeatures(x, PartitionBook([0, 50]))
    ids = np.array([3, 3, 49, 0, 17])
    assert torch.equal(store.fetch(ids), torch.from_numpy(x[ids]))
    s = store.stats()
    assert s["requests"] == s["hits"] == s["misses"] == s["bytes_fetched"] == 0 and s["local"] == 5
    assert s["hit_rate"] is None  # no remote request: no rate (as the trainers' metrics say it)
    store.set_cache("degree", 0.5, np.ones(50))  # nothing is remote: an empty cache
    assert store.stats()["cached_rows"] == 0
    store.reset_counters()
    assert store.counters["local"] == 0
    edges = DistFeatures.for_events(x[::2].copy(), np.arange(0, 50, 2), 50)
    even = ids[ids % 2 == 0]
    assert torch.equal(edges.fetch(even, np.zeros(even.size)), torch.from_numpy(x[even]))
    assert edges.num_remote == 25


def test_store_rejects_bad_input():
    x = np.zeros((10, 2), np.float32)
    with pytest.raises(GnndistError):
        DistFeatures(x, PartitionBook([0, 9]))
    with pytest.raises(GnndistError):
        DistFeatures(x, PartitionBook([0, 5, 10]))  # two ranges, one rank
    store = DistFeatures(x, PartitionBook([0, 10]))
    with pytest.raises(GnndistError):
        store.fetch([10])
    with pytest.raises(GnndistError):
        store.set_cache("lru", 0.1)
    with pytest.raises(GnndistError):
        store.set_cache("presample", 0.1)
    with pytest.raises(GnndistError):
        store.set_cache("degree", 0.1, np.ones(3))
    with pytest.raises(GnndistError):
        store.set_cache("degree", -1, np.ones(10))


def test_capacity_is_a_fraction_or_bytes():
    assert capacity_rows(0.1, 1000, 128) == 100
    assert capacity_rows(1.0, 1000, 128) == 1000
    assert capacity_rows(12800, 1000, 128) == 100
    assert capacity_rows(1e9, 1000, 128) == 1000


def test_scores_count_degrees_and_visits():
    rng = np.random.default_rng(1)
    indices = rng.integers(0, 30, 200)
    assert np.array_equal(degree_scores(indices, 30), np.bincount(indices, minlength=30))
    batches = [rng.permutation(30)[:10] for _ in range(7)]
    assert np.array_equal(visit_scores(batches, 30), np.bincount(np.concatenate(batches), minlength=30))


def test_static_cache_keeps_the_top_scores():
    cache = StaticCache(100, 10, 2, np.float32)
    scores = np.random.default_rng(2).permutation(100).astype(float)
    remote = np.arange(40, 100)
    chosen = cache.choose(scores[remote], remote)
    assert sorted(chosen.tolist()) == sorted(remote[np.argsort(-scores[remote])[:10]].tolist())
    scores[:] = 0
    scores[[50, 60]] = 1
    assert cache.choose(scores[remote], remote).tolist() == [50, 60]  # never-seen ids are not cached


def test_adaptive_cache_tracks_a_moving_hot_set_and_keeps_rows_right():
    n, cap, dim = 1000, 50, 3
    rows_of = np.arange(n * dim, dtype=np.float32).reshape(n, dim)
    cache = AdaptiveCache(n, cap, dim, np.float32, half_life=20)
    rng = np.random.default_rng(3)
    for phase, hot in enumerate((np.arange(0, 50), np.arange(500, 550))):
        for _ in range(150):
            req = np.unique(np.concatenate([rng.choice(hot, 30, replace=False), rng.integers(0, n, 30)]))
            miss = req[cache.slot[req] < 0]
            before = set(cache.ids[:cache.size].tolist())
            cache.observe(req, miss, rows_of[miss])
            held = cache.ids[:cache.size]
            # contents: the top of (previous contents + this step's misses) by decayed count,
            # a miss counted without the visit that just brought it
            pool = np.array(sorted(before | set(miss.tolist())), dtype=np.int64)
            out = np.setdiff1d(pool, held)
            if out.size and held.size:
                assert cache.score[held].min() >= cache.score[out].max() - cache.weight
            assert np.array_equal(cache.rows[cache.slot[held]], rows_of[held])
            assert sorted(cache.slot[held].tolist()) == list(range(cache.size))
        assert cache.size == cap
        assert np.isin(cache.ids[:cap], hot).mean() >= 0.9, phase
    assert (cache.slot >= 0).sum() == cap


def test_prefetch_runs_ahead_in_order_and_can_be_disabled():
    started = [threading.Event() for _ in range(6)]

    def fn(i):
        started[i].set()
        return i * i

    got = []
    for i, v in enumerate(PrefetchLoader(range(5), fn)):
        got.append(v)
        if i < 4:  # while item i is in use, item i+1 is being made
            assert started[i + 1].wait(10)
    assert got == [0, 1, 4, 9, 16]

    started = [threading.Event() for _ in range(6)]
    for i, v in enumerate(PrefetchLoader(range(5), fn, enabled=False)):
        assert v == i * i and not started[i + 1].is_set()


def test_an_idle_prefetch_thread_runs_at_the_lowest_priority():
    """`idle`: items are made under SCHED_IDLE, off the caller's thread, whose priority stays."""
    def policy(i):
        return threading.get_ident() != threading.main_thread().ident, os.sched_getscheduler(0)

    assert list(PrefetchLoader(range(3), policy, idle=True)) == [(True, os.SCHED_IDLE)] * 3
    assert list(PrefetchLoader(range(3), policy)) == [(True, os.SCHED_OTHER)] * 3
    assert os.sched_getscheduler(0) == os.SCHED_OTHER


def test_prefetch_raises_errors_in_the_caller_and_stops_early():
    def boom(i):
        if i == 2:
            raise GnndistError("bad batch 2")
        return i

    with pytest.raises(GnndistError, match="bad batch 2"):
        list(PrefetchLoader(range(5), boom))
    made, threads = [], threading.active_count()

    def record(i):
        made.append(i)
        return i

    for v in PrefetchLoader(range(1000), record):
        if v == 3:
            break
    assert len(made) < 10 and threading.active_count() == threads


def test_adaptive_prior_holds_a_good_fill_until_evidence_outweighs_it():
    n, cap = 200, 20
    scores = np.ones(n)
    scores[:cap] = 100.0  # the fill: ids 0..19, expected to be visited at every fetch
    cache = AdaptiveCache(n, cap, 1, np.float32, half_life=300)
    cache.fill(cache.choose(scores, np.arange(n)), np.zeros((cap, 1), np.float32))
    warm, rng = np.arange(100, 110), np.random.default_rng(5)

    def step():  # the fill is never visited; `warm` always is
        req = np.unique(np.concatenate([warm, rng.integers(cap, n, 40)]))
        miss = req[cache.slot[req] < 0]
        cache.observe(req, miss, np.zeros((miss.size, 1), np.float32))

    for _ in range(20):
        step()
    assert sorted(cache.ids[:cache.size].tolist()) == list(range(cap))
    for _ in range(2000):
        step()
    assert np.isin(warm, cache.ids[:cache.size]).all()


def test_sparse_map_matches_a_dict():
    from gnndist.samplers.cache import SparseMap

    rng = np.random.default_rng(0)
    m, ref = SparseMap(-1, np.int64), {}
    for _ in range(200):
        ids = rng.integers(0, 10**12, 5) if rng.random() < 0.5 else np.array(list(ref)[:3] or [7], np.int64)
        ids = np.unique(ids)
        vals = rng.integers(-1, 4, ids.size)
        m[ids] = vals
        for i, v in zip(ids.tolist(), vals.tolist()):
            if v == -1:
                ref.pop(i, None)
            else:
                ref[i] = v
        probe = np.concatenate([ids, rng.integers(0, 10**12, 3)])
        assert m[probe].tolist() == [ref.get(i, -1) for i in probe.tolist()]
        assert len(m) == len(ref)
    m.shrink(2, np.array(list(ref)[:1], np.int64))
    assert len(m) <= 3


@pytest.mark.parametrize("cls", [StaticCache, AdaptiveCache])
def test_sparse_cache_decides_as_the_dense_one(cls):
    """The tables sized by capacity (event ids) make the same choices as the dense ones."""
    rng = np.random.default_rng(1)
    n, cap, dim = 400, 30, 2
    dense, sparse = cls(n, cap, dim, np.float32), cls(n, cap, dim, np.float32, sparse=True)
    remote = np.arange(100, n)
    scores = rng.random(remote.size)
    for c in (dense, sparse):
        fill = c.choose(scores, remote)
        c.fill(fill, np.zeros((fill.size, dim), np.float32))
    for _ in range(40):
        req = np.unique(rng.integers(100, n, 25) if rng.random() < 0.7 else rng.integers(100, 160, 25))
        for c in (dense, sparse):
            miss = req[c.slot[req] < 0]
            c.observe(req, miss, np.ones((miss.size, dim), np.float32))
        assert np.array_equal(np.sort(dense.ids[:dense.size]), np.sort(sparse.ids[:sparse.size]))
        assert np.array_equal(dense.slot[req], sparse.slot[req])
