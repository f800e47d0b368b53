"""Distributed TGN training on `synthetic-temporal`: 1 process against 2 and 4 local ranks,
node memory replicated or partitioned, temporal against random partitioning, owner or slice
batch shares.

    python benchmarks/dist_tgnn.py                                  # 1M events, 100k nodes, ranks 1,2,4
    python benchmarks/dist_tgnn.py --num-events 50000 --ranks 1,2   # quick

Every setting is one `gnndist train` command (a fresh process, as a user runs it) training one
epoch with the same global batch, then the validation and test passes. Prints per setting:
training events/s, node-state rows fetched from other ranks, bytes moved between ranks per
epoch (state rows plus, in partitioned mode, the negatives' queries, embeddings and their
gradients; all ranks together), the gradient all-reduce payload, the time split (mean over
ranks) and test AP. Then, per rank count and share, partitioned bytes with the temporal
partitioner over those with random partitioning (target: at most 0.5). Not a test: local ranks
share this machine's cores, so events/s measures overheads, not the speed-up of ranks on
machines of their own.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PHASES = ("sample", "fetch", "compute", "sync")


def gnndist(*argv: str) -> None:
    """Run the gnndist CLI in a fresh process; its output is kept only when it fails."""
    p = subprocess.run([sys.executable, "-m", "gnndist", *argv], capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"gnndist {' '.join(argv)} failed:\n{p.stderr[-2000:]}")


def row(label: str, m: dict) -> str:
    e = m["epochs"][0]
    mb = lambda k: f"{e.get(k, 0) / 2**20:>10.1f}"  # noqa: E731
    split = "".join(f"{e[f'{p}_s']:>8.1f}" if f"{p}_s" in e else f"{'-':>8}" for p in PHASES)
    return (f"{label:<36}{e['events_per_s']:>9,.0f}{e.get('remote_rows', 0):>11,}{mb('bytes')}{mb('grad_bytes')}"
            f"{split}{m['test']['ap']:>8.4f}")


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
    data = ["synthetic-temporal", "--num-nodes", str(nodes), "--num-events", str(a.num_events)]
    train = ["--task", "link", "--model", "tgn", "--epochs", "1", "--batch-size", str(a.batch_size),
             "--memory-dim", str(a.memory_dim), "--quiet"]
    print(f"synthetic-temporal: {nodes:,} nodes, {a.num_events:,} events; TGN memory {a.memory_dim}, "
          f"batch {a.batch_size}, 1 epoch; {os.cpu_count()} cores")
    head = (f"{'setting':<36}{'events/s':>9}{'rem. rows':>11}{'MB moved':>10}{'grad MB':>10}"
            + "".join(f"{h:>8}" for h in PHASES) + f"{'test AP':>8}")
    print(head + "\n" + "-" * len(head), flush=True)
    ratios = []
    with tempfile.TemporaryDirectory(prefix="dist-tgnn-") as tmp:
        def measure(label: str, *argv: str) -> dict:
            out = Path(tmp) / "m.json"
            gnndist("train", *argv, *train, "--metrics-out", str(out))
            m = json.loads(out.read_text())
            print(row(label, m), flush=True)
            return m

        for w in (int(r) for r in a.ranks.split(",")):
            if w == 1:
                measure("1 process", *data)
                continue
            stores = {}
            for method in ("temporal", "random"):
                stores[method] = str(Path(tmp) / f"{method}{w}")
                t0 = time.perf_counter()
                gnndist("partition", *data, "--parts", str(w), "--method", method, "--out", stores[method], "--quiet")
                print(f"  ({method} partition into {w} parts: {time.perf_counter() - t0:.1f}s)", flush=True)
            measure(f"{w} ranks replicated temporal owner", stores["temporal"], "--nproc", str(w))
            for share in a.shares.split(","):
                got = {method: measure(f"{w} ranks partitioned {method} {share}", stores[method], "--nproc", str(w),
                                       "--memory", "partitioned", "--share", share)["epochs"][0]["bytes"]
                       for method in ("temporal", "random")}
                ratios.append(f"{w} ranks, {share} share: partitioned bytes temporal / random = "
                              f"{got['temporal'] / max(got['random'], 1):.2f} "
                              f"({got['temporal'] / 2**20:.1f} / {got['random'] / 2**20:.1f} MB)")
    print("\n".join(ratios))


if __name__ == "__main__":
    main()
