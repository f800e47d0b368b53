"""Distributed TGN training on `synthetic-temporal`: 1 process against 2 and 4 local ranks,
node memory replicated or partitioned, temporal against random partitioning.

    python benchmarks/dist_tgnn.py                              # 1M events, 100k nodes, ranks 1,2,4
    python benchmarks/dist_tgnn.py --num-events 20000 --ranks 1,2   # quick

For each setting one training epoch (then the validation and test passes every run makes) with
the same global batch. Prints per setting: training events/s, remote node-state rows and bytes
moved per epoch (all ranks), gradient all-reduce payload, the time split (mean over ranks) and
test AP; then, per rank count, partitioned bytes with the temporal partitioner over those with
random partitioning (target <= 0.5). Not a test: local ranks share this machine's cores, so
events/s measures overheads, not the speed-up of ranks on their own machines.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from gnndist import dist
from gnndist.datasets import load
from gnndist.partition import partition_graph
from gnndist.temporal_dist import rank_main
from gnndist.temporal_trainer import run


def train_args(a: argparse.Namespace, memory: str = "replicated", share: str = "owner") -> argparse.Namespace:
    return argparse.Namespace(data="synthetic-temporal", model="tgn", epochs=1, batch_size=a.batch_size, lr=1e-4,
                              memory_dim=a.memory_dim, neg="random", seed=0, device="cpu", quiet=True,
                              checkpoint=None, resume=False, metrics_out=None, memory=memory, share=share,
                              nproc=1)


def row(label: str, m: dict) -> str:
    e = m["epochs"][0]
    mb = lambda k: f"{e.get(k, 0) / 2**20:>9.1f}"  # noqa: E731
    split = "".join(f"{e.get(f'{p}_s', float('nan')):>8.1f}" for p in ("sample", "fetch", "compute", "sync"))
    return (f"{label:<40}{e['events_per_s']:>10,.0f}{e.get('remote_rows', 0):>12,}{mb('state_bytes')}"
            f"{mb('grad_bytes')}{split}{m['test']['ap']:>8.4f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-events", type=int, default=1_000_000)
    p.add_argument("--num-nodes", type=int, default=None, help="default: events / 10")
    p.add_argument("--ranks", default="1,2,4")
    p.add_argument("--batch-size", type=int, default=200)
    p.add_argument("--memory-dim", type=int, default=100)
    p.add_argument("--shares", default="owner,slice", help="batch shares to run with partitioned memory")
    a = p.parse_args()
    nodes = a.num_nodes or max(a.num_events // 10, 2)
    tg = load("synthetic-temporal", num_nodes=nodes, num_events=a.num_events)
    print(f"synthetic-temporal: {tg.num_nodes:,} nodes, {tg.num_events:,} events, edge dim {tg.edge_dim}; "
          f"TGN memory {a.memory_dim}, batch {a.batch_size}")
    head = (f"{'setting':<40}{'events/s':>10}{'rem. rows':>12}{'state MB':>9}{'grad MB':>9}"
            f"{'sample':>8}{'fetch':>8}{'compute':>8}{'sync':>8}{'test AP':>8}")
    print(head + "\n" + "-" * len(head), flush=True)
    ranks = [int(r) for r in a.ranks.split(",")]
    ratios = []
    with tempfile.TemporaryDirectory(prefix="dist-tgnn-") as tmp:
        for w in ranks:
            if w == 1:
                print(row("1 process", run(train_args(a), tg)), flush=True)
                continue
            stores = {}
            for method in ("temporal", "random"):
                t0 = time.perf_counter()
                stores[method] = str(Path(tmp) / f"{method}{w}")
                partition_graph(tg, w, method=method, out=stores[method])
                print(f"  ({method} partition into {w}: {time.perf_counter() - t0:.1f}s)", flush=True)
            runs = [("replicated", "temporal", "owner")]
            runs += [("partitioned", method, share) for share in a.shares.split(",") for method in ("temporal", "random")]
            got = {}
            for memory, method, share in runs:
                m = dist.launch(w, rank_main, train_args(a, memory, share), stores[method])[0]
                got[memory, method, share] = m["epochs"][0]["state_bytes"]
                print(row(f"{w} ranks {memory} {method} {share}", m), flush=True)
            for share in a.shares.split(","):
                t, r = got["partitioned", "temporal", share], got["partitioned", "random", share]
                ratios.append(f"{w} ranks, {share} share: partitioned bytes temporal / random = "
                              f"{t / max(r, 1):.2f} ({t / 2**20:.1f} / {r / 2**20:.1f} MB)")
    print("\n".join(ratios))


if __name__ == "__main__":
    main()
