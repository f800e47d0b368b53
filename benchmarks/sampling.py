"""Sampling and feature-traffic benchmark: prints metrics and ratios against peers measured
in the same run (not pass/fail).

1. static uniform sampling, fanouts [15, 10] without replacement, on a generated power-law
   graph, against an exact vectorized numpy sampler on the same batches;
2. temporal `recent` sampling, k = 10, over a training pass of synthetic events;
3. remote feature bytes over one training epoch on W partitions (`gnndist.partition`,
   METIS by default; W local gloo ranks), for each cache policy; the `presample` counts come
   from an earlier epoch with another shuffle and seed.

    python benchmarks/sampling.py                 # 1M nodes / 10M edges, 10M events, 4 parts
    python benchmarks/sampling.py --scale 0.1     # everything 10x smaller

Throughput is wall-clock sampled neighbours per second; the CPU seconds the process got are
printed too, since on a shared machine wall time also counts waiting for a core.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import numba
import numpy as np

from gnndist.runtime.launch import launch
from gnndist.runtime import dist
from gnndist.datasets.generators import synthetic_static, synthetic_temporal
from gnndist.graph import Graph
from gnndist.samplers import (POLICIES, DistNeighborSampler, DistFeatures, degree_scores,
                              sample_neighbors, sample_tcsr, visit_scores)


def timed(fn):
    """(result, wall seconds, process CPU seconds)."""
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def numpy_sample(g: Graph, seeds: np.ndarray, fanouts: list[int], rng: np.random.Generator, mark: np.ndarray
                 ) -> tuple[np.ndarray, list[np.ndarray]]:
    """Exact uniform sampling without replacement, vectorized numpy: give every candidate edge
    a random key, sort by (target, key), keep the first `fanout` per target; each hop draws for
    every node reached so far. Same output as `sample_neighbors` (node ids, per-hop local
    edge_index); `mark` is all -1 on entry and exit."""
    nodes, edges = [seeds], []
    mark[seeds] = np.arange(seeds.size)
    n, frontier = seeds.size, seeds
    for f in fanouts:
        deg = g.indptr[frontier + 1] - g.indptr[frontier]
        starts = np.cumsum(deg) - deg
        tgt = np.repeat(np.arange(frontier.size), deg)
        pos = np.repeat(g.indptr[frontier] - starts, deg) + np.arange(tgt.size)
        order = np.argsort(tgt + rng.random(tgt.size))
        keep = order[(np.arange(tgt.size) - starts[tgt]) < f]  # rank within the target after sorting
        nbr, t = g.indices[pos[keep]], tgt[keep]
        new = np.unique(nbr[mark[nbr] < 0])
        mark[new] = np.arange(n, n + new.size)
        edges.append(np.stack([mark[nbr], t]))
        nodes.append(new)
        n, frontier = n + new.size, np.concatenate(nodes)
    node_ids = np.concatenate(nodes)
    mark[node_ids] = -1
    return node_ids, edges


def bench_static(g: Graph, num_seeds: int, numpy_seeds: int, batch: int) -> None:
    fanouts = [15, 10]
    seeds = np.random.default_rng(0).permutation(g.num_nodes)[:num_seeds]
    batches = [seeds[i:i + batch] for i in range(0, seeds.size, batch)]
    sample_neighbors(g, batches[0], fanouts)  # compile / load the kernels
    n_np = max(1, numpy_seeds // batch)
    ours, w, c = timed(lambda: sum(sample_neighbors(g, b, fanouts, seed=i).num_sampled for i, b in enumerate(batches)))
    print(f"static [15,10] w/o replacement, {seeds.size:,} seeds in batches of {batch}: {ours:,} sampled "
          f"in {w:.2f} s = {ours / w / 1e6:.1f} M/s wall ({c:.2f} CPU s)")
    sub, ws, cs = timed(lambda: sum(sample_neighbors(g, b, fanouts, seed=i).num_sampled for i, b in enumerate(batches[:n_np])))
    mark, rng = np.full(g.num_nodes, -1, np.int64), np.random.default_rng(1)
    ref, wn, cn = timed(lambda: sum(sum(e.shape[1] for e in numpy_sample(g, b, fanouts, rng, mark)[1]) for b in batches[:n_np]))
    print(f"  vs exact vectorized numpy on the first {n_np * batch:,} seeds: gnndist {sub / ws / 1e6:.1f} M/s, "
          f"numpy {ref / wn / 1e6:.2f} M/s -> {(sub / ws) / (ref / wn):.1f}x wall "
          f"({(sub / cs) / (ref / cn):.1f}x per CPU s); sampled {sub:,} vs {ref:,}")


class NumpyTemporal:
    """Exact vectorized numpy temporal sampler on the same T-CSR, the peer of `sample_tcsr`:
    one `searchsorted` over keys (row, rank of time) finds every query's first event at or
    after its time; `recent` gathers the k before it, `uniform` draws k distinct positions
    among them with Floyd's algorithm vectorized over the queries (numpy's RNG, so other
    draws than gnndist's, from the same distribution). Same padded outputs as `sample_tcsr`."""

    def __init__(self, indptr: np.ndarray, nbr: np.ndarray, eid: np.ndarray, ts: np.ndarray) -> None:
        self.indptr, self.nbr, self.eid, self.ts = indptr, nbr, eid, ts
        self.times = np.unique(ts)
        rows = np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
        self.key = rows * (self.times.size + 1) + np.searchsorted(self.times, ts)  # sorted

    def sample(self, nodes: np.ndarray, times: np.ndarray, k: int, uniform: bool, rng: np.random.Generator):
        start = self.indptr[nodes]
        lo = np.searchsorted(self.key, nodes * (self.times.size + 1) + np.searchsorted(self.times, times))
        p = lo - start
        j = np.arange(k)
        mask = j < np.minimum(p, k)[:, None]
        pos = np.where(mask, lo[:, None] - 1 - j, 0)  # recent: the k latest
        if uniform:
            big = np.flatnonzero(p > k)
            pb, draw = p[big], np.empty((big.size, k), np.int64)
            for i in range(k):  # Floyd: draw i in [0, m]; a repeat takes m itself
                m = pb - k + i
                t = (rng.random(big.size) * (m + 1)).astype(np.int64)
                draw[:, i] = np.where((draw[:, :i] == t[:, None]).any(axis=1), m, t)
            draw.sort(axis=1)
            pos[big] = start[big, None] + draw[:, ::-1]
        ts = np.where(mask, self.ts[pos], 0.0)
        return (np.where(mask, self.nbr[pos], 0), np.where(mask, self.eid[pos], 0), ts,
                np.where(mask, times[:, None] - ts, 0.0).astype(np.float32), mask)


def bench_temporal(num_nodes: int, num_events: int, batch: int, k: int = 10) -> None:
    tg, wg, _ = timed(lambda: synthetic_temporal(num_nodes, num_events, edge_dim=1))
    tcsr, wt, _ = timed(tg.tcsr)
    ref = NumpyTemporal(*tcsr)
    print(f"temporal: {num_events:,} synthetic events over {num_nodes:,} nodes (generated in {wg:.1f} s, "
          f"T-CSR in {wt:.1f} s), k={k}, both endpoints of every event, batches of {batch} events, one pass")
    queries = [(np.concatenate([tg.src[i:i + batch], tg.dst[i:i + batch]]),
                np.concatenate([tg.t[i:i + batch], tg.t[i:i + batch]])) for i in range(0, tg.num_events, batch)]
    q_total = 2 * tg.num_events
    first = sample_tcsr(*tcsr, *queries[0], k)  # compile / load the kernels
    want = ref.sample(*queries[0], k, False, None)
    assert all(np.array_equal(getattr(first, a), w) for a, w in zip(("nbr", "eid", "ts", "dt", "mask"), want))
    for strategy in ("recent", "uniform"):
        rng = np.random.default_rng(0)
        # each batch's output is dropped before the next (a trainer consumes it), so its memory is reused
        got, w, c = timed(lambda: sum(int(sample_tcsr(*tcsr, n, t, k, strategy, seed=i).mask.sum())
                                      for i, (n, t) in enumerate(queries)))
        want, wn, cn = timed(lambda: sum(int(ref.sample(n, t, k, strategy == "uniform", rng)[4].sum()) for n, t in queries))
        assert got == want, (got, want)
        print(f"  {strategy:8s} gnndist {q_total / w / 1e6:5.2f} M queries/s ({w:.2f} s wall, {c:.2f} CPU s), "
              f"numpy {q_total / wn / 1e6:5.2f} M queries/s ({wn:.2f} s, {cn:.2f} CPU s) -> "
              f"{wn / w:.2f}x wall ({cn / c:.2f}x per CPU s); load {open('/proc/loadavg').read().split()[0]}")


def traffic_rank(folder: str, batch: int, capacity: float) -> dict:
    """One rank: an epoch over its training nodes per cache policy; returns its counters."""
    from gnndist.partition import load_partition

    dist.setup("cpu")
    r, w = dist.rank(), dist.world_size()
    part = load_partition(folder, r, world_size=w)
    sampler = DistNeighborSampler.from_partition(part)
    store = DistFeatures.from_partition(part)
    own = part.start + np.flatnonzero(part.train_mask)
    steps = dist.agree_max(-(-own.size // batch))

    def epoch(seed: int, fetch: bool) -> list[np.ndarray]:
        order = np.random.default_rng(1000 * seed + r).permutation(own)
        seen = []
        for s in range(steps):
            b = sampler.sample(order[s * batch:(s + 1) * batch], [15, 10], seed=seed * 100_003 + s)
            seen.append(b.node_ids)
            if fetch:
                store.fetch(b.node_ids)
        return seen

    deg = degree_scores(sampler.indices, sampler.num_nodes)
    visits = visit_scores(epoch(0, fetch=False), sampler.num_nodes)  # presampling epoch (other shuffle, seed)
    out = {}
    for policy in POLICIES:
        store.set_cache(policy, capacity, {"degree": deg, "presample": visits, "adaptive": deg}.get(policy))
        store.reset_counters()
        t = time.perf_counter()
        epoch(1, fetch=True)
        out[policy] = dict(store.stats(), seconds=time.perf_counter() - t, steps=steps)
    return out


def bench_traffic(g: Graph, parts: int, method: str, batch: int, capacity: float) -> None:
    from gnndist.partition import partition_graph

    with tempfile.TemporaryDirectory(prefix="gnndist-bench-") as folder:
        _, wp, _ = timed(lambda: partition_graph(g, parts, method=method, out=folder))
        os.environ.setdefault("GNNDIST_TIMEOUT", "600")
        os.environ["NUMBA_NUM_THREADS"] = "1"  # W ranks share the cores; counts do not depend on it
        res, w, _ = timed(lambda: launch(parts, traffic_rank, folder, batch // parts, capacity))
    print(f"feature traffic: one epoch over {int(g.train_mask.sum()):,} training nodes on {parts} ranks "
          f"({method} partition, {wp:.0f} s), global batch {batch} ({batch // parts}/rank, "
          f"{res[0]['none']['steps']} steps), [15,10], {g.num_features} float32 features, "
          f"cache {capacity:g} of remote nodes ({w:.0f} s)")
    base = sum(r["none"]["bytes_fetched"] for r in res)
    for policy in POLICIES:
        tot = {k: sum(r[policy][k] for r in res) for k in ("requests", "hits", "bytes_fetched", "fill_bytes")}
        print(f"  {policy:10s} remote bytes {tot['bytes_fetched'] / 2**20:9.1f} MiB = {tot['bytes_fetched'] / base:6.1%} "
              f"of no cache; hit rate {tot['hits'] / max(tot['requests'], 1):6.1%}; "
              f"cache fill {tot['fill_bytes'] / 2**20:.1f} MiB once; "
              f"epoch {max(r[policy]['seconds'] for r in res):.1f} s")


def parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs.py checks the documented commands against it)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=float, default=1.0, help="multiply every size by this")
    p.add_argument("--threads", type=int, default=2, help="numba threads for the sampling benchmarks")
    p.add_argument("--batch", type=int, default=1024,
                   help="seed nodes per static batch; global batch (split over ranks) for the traffic part")
    p.add_argument("--numpy-seeds", type=int, default=100_000, help="seeds the numpy peer samples (before --scale)")
    p.add_argument("--parts", type=int, default=4, help="ranks for the traffic benchmark")
    p.add_argument("--partition", choices=("metis", "random"), default="metis", help="partition method (traffic)")
    p.add_argument("--capacity", type=float, default=0.1, help="cache capacity, fraction of remote nodes")
    p.add_argument("--dim", type=int, default=64, help="feature width for the traffic benchmark")
    p.add_argument("--only", choices=("static", "temporal", "traffic"), action="append", help="run only these parts")
    return p


def main() -> None:
    a = parser().parse_args()
    only = set(a.only or ("static", "temporal", "traffic"))
    numba.set_num_threads(a.threads)
    n, e, ev = int(1_000_000 * a.scale), int(10_000_000 * a.scale), int(10_000_000 * a.scale)
    print(f"numba {numba.__version__}, {numba.get_num_threads()} threads, {os.cpu_count()} cores, "
          f"OMP_WAIT_POLICY as gnndist left it: {os.environ.get('OMP_WAIT_POLICY')}, "
          f"load average {os.getloadavg()[0]:.1f} at start")
    if only & {"static", "traffic"}:
        g, w, _ = timed(lambda: synthetic_static(n, e // 2, num_features=a.dim))
        print(f"graph: synthetic-static power law, {g.num_nodes:,} nodes, {g.num_edges:,} directed edges "
              f"(max degree {g.degrees().max():,}; generated in {w:.1f} s)")
        if "static" in only:
            bench_static(g, n, int(a.numpy_seeds * a.scale), a.batch)
        if "traffic" in only:
            bench_traffic(g, a.parts, a.partition, a.batch, a.capacity)
    if "temporal" in only:
        bench_temporal(n, ev, 600)


if __name__ == "__main__":
    main()
