"""Partitioning at scale: a generated temporal graph written once as shard files, partitioned by
one process (`gnndist partition`, the whole graph in memory) and by W ranks (`--nproc W`, each
rank its portion): the largest rank's peak resident memory against the one process's, events
partitioned per second, and the cross-part event fraction of METIS (gathered to rank 0),
label propagation (`temporal-lp`) and `random` on W ranks.

    python benchmarks/partition_scale.py --events 50000000 --nodes 2000000 --ranks 2,4

The shards are written into --folder once and reused (delete it afterwards: a 50M-event graph
with 16 edge features is about 5 GB of Parquet). The goal for the largest rank's peak:
1/W x 1.3 of the one process's, plus the arrays sized by the node count that every rank holds.
Peak memory is the VmHWM of each process (meta.json's `stats.ranks` for the ranks, wait4's
ru_maxrss for the one process).

Out of core, `--memory-budget SIZE` runs each method on W ranks twice, with the default budget
(everything in memory) and with SIZE a rank (the events a rank read kept in files, their keys
ranked in rounds, the part it writes spilled in sorted runs beyond it), and prints each rank's
peak resident memory against SIZE plus the node-sized arrays (and the phase it reached it in;
also less what the rank held when it started: its libraries and process group, which no budget
shrinks),
what it spilled, and the events partitioned per second of both runs (mind the disk: the shards,
a store and the spilled files at once):

    python benchmarks/partition_scale.py --events 300000000 --nodes 5000000 --edge-dim 1 --ranks 4 --memory-budget 1GiB --methods random --budget-only
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from gnndist.partition.stats import parse_size

GIB = 2**30


def run(argv: list[str]) -> tuple[float, int]:
    """`gnndist ARGV` in a process of its own: (wall seconds, its peak resident bytes)."""
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "gnndist", *argv], stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(p.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"failed: gnndist {' '.join(argv)}")
    return time.perf_counter() - t0, usage.ru_maxrss * 1024


def stats(store: Path) -> dict:
    return json.loads((store / "meta.json").read_text())["stats"]


def parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs.py checks the documented commands against it)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=50_000_000)
    p.add_argument("--nodes", type=int, default=2_000_000)
    p.add_argument("--edge-dim", type=int, default=16)
    p.add_argument("--shards", type=int, default=64)
    p.add_argument("--ranks", default="2,4", help="comma-separated W")
    p.add_argument("--folder", default="bench-partition-scale", help="where the shards and stores go")
    p.add_argument("--methods", default="temporal,temporal-lp,random", help="the methods run on W ranks")
    p.add_argument("--memory-budget", default=None, help="out of core: each rank's budget (e.g. 1GiB)")
    p.add_argument("--budget-only", action="store_true",
                   help="out of core: no run with the default budget (for a graph whose ranks cannot hold their events)")
    return p


def reached(rank: dict) -> str:
    """The phase in which a rank reached its peak (the write, where no phase's end had it yet)."""
    by_phase = rank["peak_memory_bytes_by_phase"]
    return next((p for p, b in by_phase.items() if b >= rank["peak_memory_bytes"]), "write")


def out_of_core(args: argparse.Namespace, shards: Path, root: Path, node_arrays: int) -> None:
    """Each method on W ranks in memory, then under --memory-budget: per rank, its peak against
    the budget plus the node-sized arrays, the phase it reached it in, and what it spilled."""
    budget = parse_size(args.memory_budget)
    goal = budget + node_arrays
    print(f"--memory-budget {args.memory_budget} a rank; goal for a rank's peak: the budget plus the node-sized "
          f"arrays, {goal / GIB:.2f} GiB")
    print(f"{'run':<36}{'rank':>5}{'wall s':>9}{'events/s':>12}{'peak GiB':>10}{'/ goal':>8}{'at start':>10}"
          f"{'(peak - start) / goal':>23}{'reached in':>12}{'read GiB spilled':>17}{'sort rounds':>12}{'runs':>6}"
          f"{'part GiB spilled':>17}")
    for w in map(int, args.ranks.split(",")):
        for method in args.methods.split(","):
            for limit in ([] if args.budget_only else [None]) + [args.memory_budget]:
                store = root / f"{method}-{w}-{limit}"
                more = [] if limit is None else ["--memory-budget", limit]
                took, _ = run(["partition", str(shards), "--parts", str(w), "--out", str(store), "--nproc", str(w),
                               "--method", method, "--quiet", *more])
                name = f"{w} ranks, {method}, " + ("in memory" if limit is None else f"budget {limit}")
                for r in stats(store)["ranks"]:
                    peak, start = r["peak_memory_bytes"], r["resident_at_start_bytes"]
                    print(f"{name:<36}{r['rank']:>5}{took:>9.0f}{args.events / took:>12,.0f}{peak / GIB:>10.2f}"
                          f"{peak / goal:>8.2f}{start / GIB:>10.2f}{(peak - start) / goal:>23.2f}{reached(r):>12}{r['portion_bytes_spilled'] / GIB:>17.2f}"
                          f"{r['sort_rounds']:>12}{r['runs_spilled']:>6}{r['bytes_spilled'] / GIB:>17.2f}", flush=True)
                shutil.rmtree(store)


def main() -> None:
    args = parser().parse_args()
    root = Path(args.folder)
    shards = root / f"shards-{args.events}-{args.nodes}-{args.edge_dim}"
    root.mkdir(parents=True, exist_ok=True)
    if not shards.exists():
        took, _ = run(["datasets", "synthetic-temporal", "--num-events", str(args.events), "--num-nodes",
                       str(args.nodes), "--edge-dim", str(args.edge_dim), "--write-shards", str(shards),
                       "--shards", str(args.shards)])
        print(f"wrote {shards} in {took:.0f} s", flush=True)
    node_arrays = args.nodes * 8 * 4  # ids, membership, id maps: int64 each
    print(f"{args.events:,} events, {args.nodes:,} nodes, {args.edge_dim} edge features; node-sized arrays "
          f"{node_arrays / GIB:.2f} GiB per rank", flush=True)
    if args.memory_budget is not None:
        out_of_core(args, shards, root, node_arrays)
        return
    print(f"{'run':<28}{'wall s':>9}{'events/s':>12}{'peak GiB':>10}{'ratio':>8}{'goal':>8}{'cross':>8}")
    for w in map(int, args.ranks.split(",")):
        one = root / f"one-{w}"
        took, peak = run(["partition", str(shards), "--parts", str(w), "--out", str(one), "--quiet"])
        print(f"{f'1 process, {w} parts':<28}{took:>9.0f}{args.events / took:>12,.0f}{peak / GIB:>10.2f}{'':>16}"
              f"{stats(one)['cross_partition_event_fraction']:>8.3f}", flush=True)
        shutil.rmtree(one)
        for method in args.methods.split(","):
            store = root / f"{method}-{w}"
            took, _ = run(["partition", str(shards), "--parts", str(w), "--out", str(store), "--nproc", str(w),
                           "--method", method, "--quiet"])
            s = stats(store)
            largest = max(r["peak_memory_bytes"] for r in s["ranks"])
            goal = peak / w * 1.3 + node_arrays
            print(f"{f'{w} ranks, {method}':<28}{took:>9.0f}{args.events / took:>12,.0f}{largest / GIB:>10.2f}"
                  f"{largest / peak:>8.2f}{goal / peak:>8.2f}{s['cross_partition_event_fraction']:>8.3f}", flush=True)
            shutil.rmtree(store)
    print(f"this process's own peak: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    main()
