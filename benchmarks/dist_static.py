"""Distributed node-classification benchmark: GraphSAGE training on `synthetic-static`
(1M nodes, 10M undirected edges, 100 features at --scale 1) on 1, 2 and 4 local gloo ranks,
each with every feature-cache policy. Prints training nodes per second, cache hit rate and
remote feature bytes per epoch, with ratios against peers measured in the same run: the
1-rank run (throughput) and the no-cache run of the same rank count (remote bytes).

    python benchmarks/dist_static.py                       # full size
    python benchmarks/dist_static.py --scale 0.1 --steps 20

Partitions are METIS with balanced nodes and training nodes (`gnndist.partition`), made once
per rank count (their time is printed). `--steps S` keeps each rank's first S x (its portion of
a global batch) training nodes (the same nodes for every policy), so that an epoch is about S
global batches: metrics are then per S steps. The
`presample` cache counts visits over one earlier sampling epoch (other order and seed).
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from gnndist.runtime.launch import launch
from gnndist.runtime import dist
from gnndist.datasets import load
from gnndist.partition import load_partition, partition_graph
from gnndist.samplers import POLICIES
from gnndist.static.trainer import WholeGraph, NodeConfig, NodeTrainer, PartGraph, local_portion


def capped(graph, cfg: NodeConfig, steps: int):
    """`graph` with its training nodes cut to `steps` portions of a global batch (0: all)."""
    if steps:
        graph.train_ids = graph.train_ids[: steps * max(local_portion(cfg.batch_size), 1)]
    return graph


def one_epoch(graph, cfg: NodeConfig) -> dict:
    t0 = time.perf_counter()
    trainer = NodeTrainer(graph, cfg)
    setup = time.perf_counter() - t0
    rec = trainer.train_epoch(1)
    rec["setup_s"] = setup
    return rec


def bench_rank(store: str, cfgs: list[NodeConfig], steps: int) -> list[dict]:
    """One epoch per config (cache policy) on this rank's part, after a 2-step warm-up (JIT,
    first-call costs); the global metrics."""
    dist.setup("cpu")
    part = load_partition(store, dist.rank(), dist.world_size())
    one_epoch(capped(PartGraph(part, cfgs[0]), cfgs[0], 2), cfgs[0])
    out = [one_epoch(capped(PartGraph(part, cfg), cfg, steps), cfg) for cfg in cfgs]
    dist.teardown()
    return out


def parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs.py checks the documented commands against it)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", type=float, default=1.0, help="graph size relative to 1M nodes / 10M edges")
    p.add_argument("--ranks", default="1,2,4")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--cache-size", type=float, default=0.1, help="fraction of remote nodes (<= 1) or bytes")
    p.add_argument("--batch-size", type=int, default=1024, help="global batch")
    p.add_argument("--fanouts", default="15,10")
    p.add_argument("--steps", type=int, default=0, help="local batches per rank (0: the whole epoch)")
    p.add_argument("--workdir", default=None, help="where to keep the partition stores (default: a temp dir)")
    return p


def main() -> None:
    a = parser().parse_args()

    n, m = int(1_000_000 * a.scale), int(10_000_000 * a.scale)
    t0 = time.perf_counter()
    graph = load("synthetic-static", num_nodes=n, num_edges=m, num_features=100)
    print(f"synthetic-static: {graph.num_nodes:,} nodes, {graph.num_edges // 2:,} undirected edges, "
          f"{graph.num_features} features, {int(graph.train_mask.sum()):,} training nodes "
          f"(generated in {time.perf_counter() - t0:.1f}s)", flush=True)
    fanouts = [int(f) for f in a.fanouts.split(",")]
    policies = a.policies.split(",")
    # eval_fanouts: no evaluation runs here, and the memory check would count one over full neighbourhoods
    cfgs = [NodeConfig.for_model("sage", batch_size=a.batch_size, fanouts=fanouts, eval_fanouts=fanouts, cache=pol,
                                 cache_size=None if pol == "none" else a.cache_size, quiet=True) for pol in policies]
    rows = []
    with tempfile.TemporaryDirectory(prefix="dist_static-") as tmp:
        work = Path(a.workdir or tmp)
        for w in (int(r) for r in a.ranks.split(",")):
            if w == 1:
                one_epoch(capped(WholeGraph(graph), cfgs[0], 2), cfgs[0])  # warm-up
                rows.append((1, "none", one_epoch(capped(WholeGraph(graph), cfgs[0], a.steps), cfgs[0])))
                continue
            store = work / f"parts{w}"
            t0 = time.perf_counter()
            partition_graph(graph, w, method="metis", balance=["nodes", "train"], out=store)
            print(f"partitioned into {w} parts in {time.perf_counter() - t0:.1f}s", flush=True)
            recs = launch(w, bench_rank, str(store), cfgs, a.steps)[0]
            rows += [(w, cfg.cache, rec) for cfg, rec in zip(cfgs, recs)]

    base = next((r["nodes_per_s"] for w, _, r in rows if w == 1), None)
    nocache = {w: r["remote_bytes"] for w, pol, r in rows if pol == "none"}
    unit = f"per {a.steps} steps/rank" if a.steps else "per epoch"
    print(f"\nGraphSAGE, fanouts {a.fanouts}, global batch {a.batch_size}, cache {a.cache_size}; metrics {unit}")
    print(f"{'ranks':>5} {'cache':>10} {'nodes/s':>10} {'vs 1 rank':>9} {'hit rate':>8} {'remote MiB':>11} "
          f"{'vs none':>8} {'setup s':>8} {'epoch s':>8}")
    for w, pol, r in rows:
        hr = "-" if r["cache_hit_rate"] is None else f"{r['cache_hit_rate']:.3f}"
        speed = f"{r['nodes_per_s'] / base:.2f}x" if base else "-"
        vs = f"{r['remote_bytes'] / nocache[w]:.2f}x" if nocache.get(w) else "-"
        print(f"{w:>5} {pol:>10} {r['nodes_per_s']:>10,.0f} {speed:>9} {hr:>8} {r['remote_bytes'] / 2**20:>11,.1f} "
              f"{vs:>8} {r['setup_s']:>8.1f} {r['time_s']:>8.1f}")


if __name__ == "__main__":
    main()
