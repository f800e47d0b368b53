"""Distributed TGN training on `synthetic-temporal`: what each rank holds, and what travels.

    python benchmarks/dist_tgnn.py                       # both tables of docs/benchmarks.md
    python benchmarks/dist_tgnn.py --only memory         # the memory table only
    python benchmarks/dist_tgnn.py --only speed --speed-events 50000 --ranks 1,2   # quick

Every setting is one `gnndist` command in a fresh process, as a user runs it.

Memory table (3M events, 30k nodes, 64 edge features; TGN memory 100; one epoch at batch 2000,
the batch only making the epoch shorter): per world size W = 1, 2, 4, the peak resident memory
of every rank and the bytes each holds by category (events, T-CSR, edge features, node state,
cache, id maps), with partitioned memory and a `presample` edge-feature cache of 10%; W = 1 is
one process trained from the generator's data (what `gnndist train synthetic-temporal` does).
Printed: the largest rank's peak over the one-process peak (target at W = 4: at most 0.5).

Speed table (1M events, 100k nodes, batch 200, one epoch): training events/s, node-state rows
fetched from other ranks, bytes moved between ranks per epoch (all ranks together), the
gradient all-reduce payload, the collectives each rank enters per training step, the time split
(mean over ranks) and test AP; then, per rank count, partitioned bytes with the temporal
partitioner over those with random partitioning, and every setting's events/s over one
process's. The ranks score each batch's events evened out over them (`--share even`, the
default); two more rows score each event at its source's owner (`--share owner`), the peer of
that choice in the same run. One process runs first as `gnndist train` runs it (torch on one thread, each batch
run as 2 halves of its events where it has 2 cores, the second in a process of its own:
`gnndist/temporal/split_step.py`)
and with torch on every core (`OMP_NUM_THREADS` = the core count, each batch in one piece; run only on a
machine of more than one core with the variable unset); the faster
of the two is the reference, run again after every setting, and each setting's ratio is over
the mean of the reference runs just before and just after it: a small shared machine's speed
drifts by more than the overheads measured here within the hour a run takes.
Not a test: local ranks share this machine's cores, so events/s measures overheads, not the
speed-up of ranks on machines of their own.
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
CATEGORIES = ("events", "tcsr", "edge_features", "node_state", "cache", "id_maps")
MiB = 2**20


def gnndist(*argv: str, env: dict | None = None) -> float:
    """Run the gnndist CLI in a fresh process (its output kept only when it fails), with `env`
    added to the environment; seconds."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "gnndist", *argv], capture_output=True, text=True,
                       env={**os.environ, **(env or {})})
    if p.returncode:
        sys.exit(f"gnndist {' '.join(argv)} failed:\n{p.stderr[-2000:]}")
    return time.perf_counter() - t0


def train(tmp: Path, *argv: str, env: dict | None = None) -> dict:
    out = tmp / "m.json"
    if out.exists():
        out.unlink()
    gnndist("train", *argv, "--task", "link", "--model", "tgn", "--epochs", "1", "--quiet", "--metrics-out", str(out),
            env=env)
    return json.loads(out.read_text())


def memory_table(tmp: Path, events: int, nodes: int, edge_dim: int, ranks: list[int]) -> None:
    data = ["synthetic-temporal", "--num-nodes", str(nodes), "--num-events", str(events), "--edge-dim", str(edge_dim)]
    common = ["--batch-size", "2000", "--memory", "partitioned", "--cache", "presample", "--cache-size", "0.1"]
    print(f"\nmemory: synthetic-temporal {events:,} events, {nodes:,} nodes, {edge_dim} edge features; TGN, "
          "partitioned memory, presample cache 10%, 1 epoch at batch 2000")
    head = (f"{'setting':<22}{'rank':>5}{'peak RSS MiB':>13}" + "".join(f"{c:>14}" for c in CATEGORIES)
            + f"{'events held':>13}{'test AP':>9}")
    print(head + "\n" + "-" * len(head), flush=True)
    peaks: dict[int, int] = {}
    for w in ranks:
        if w == 1:
            m = train(tmp, *data, *common)
        else:
            store = tmp / f"mem{w}"
            gnndist("partition", *data, "--parts", str(w), "--out", str(store), "--quiet")
            m = train(tmp, str(store), "--nproc", str(w), *common)
        for r in m["ranks"]:
            print(f"{f'{w} rank(s)' if r['rank'] == 0 else '':<22}{r['rank']:>5}{r['peak_rss_bytes'] / MiB:>13,.0f}"
                  + "".join(f"{r['bytes'][c] / MiB:>14,.1f}" for c in CATEGORIES)
                  + f"{r['events_held']:>13,}{m['test']['ap'] if r['rank'] == 0 else float('nan'):>9.4f}",
                  flush=True)
        e = m["epochs"][0]
        print(f"{'':<22}training {e['events_per_s']:,.0f} events/s, {e['bytes'] / MiB:,.1f} MB moved", flush=True)
        peaks[w] = max(r["peak_rss_bytes"] for r in m["ranks"])
    for w, peak in peaks.items():
        if w > 1 and 1 in peaks:
            print(f"{w} ranks: largest rank's peak / one-process peak = {peak / peaks[1]:.2f}")


def speed_table(tmp: Path, events: int, nodes: int, ranks: list[int]) -> None:
    data = ["synthetic-temporal", "--num-nodes", str(nodes), "--num-events", str(events)]
    common = ["--batch-size", "200"]
    print(f"\nspeed: synthetic-temporal {events:,} events, {nodes:,} nodes; TGN memory 100, batch 200, 1 epoch; "
          f"{os.cpu_count()} cores")
    worlds = [w for w in ranks if w > 1]
    stores = {}
    for w in worlds:
        for method in ("temporal", "random"):
            stores[w, method] = str(tmp / f"{method}{w}")
            s = gnndist("partition", *data, "--parts", str(w), "--method", method, "--out", stores[w, method],
                        "--quiet")
            print(f"  ({method} partition into {w} parts: {s:.1f}s)", flush=True)
    head = (f"{'setting':<45}{'events/s':>9}{'rem. rows':>11}{'MB moved':>10}{'grad MB':>10}{'coll/step':>10}"
            + "".join(f"{h:>8}" for h in PHASES) + f"{'test AP':>8}")
    print(head + "\n" + "-" * len(head), flush=True)

    def row(label: str, *argv: str, env: dict | None = None) -> dict:
        m = train(tmp, *argv, *common, env=env)
        e = m["epochs"][0]
        split = "".join(f"{e[f'{p}_s']:>8.1f}" if f"{p}_s" in e else f"{'-':>8}" for p in PHASES)
        print(f"{label:<45}{e['events_per_s']:>9,.0f}{e.get('remote_rows', 0):>11,}{e.get('bytes', 0) / MiB:>10.1f}"
              f"{e.get('grad_bytes', 0) / MiB:>10.1f}{e['collectives_per_step']:>10.1f}{split}{m['test']['ap']:>8.4f}",
              flush=True)
        return e

    modes = {"1 process": None}
    if (os.cpu_count() or 1) > 1 and "OMP_NUM_THREADS" not in os.environ:
        modes[f"1 process, {os.cpu_count()} torch threads"] = {"OMP_NUM_THREADS": str(os.cpu_count())}
    reference = None  # events/s of the faster one-process mode, run again after every setting
    if 1 in ranks:
        first = {label: row(label, *data, env=env)["events_per_s"] for label, env in modes.items()}
        peer = max(first, key=first.get)
        reference = first[peer]
    lines = []
    for w in worlds:
        got = {}
        for memory, method, share in (("replicated", "temporal", "even"), ("partitioned", "temporal", "even"),
                                      ("partitioned", "random", "even"), ("replicated", "temporal", "owner"),
                                      ("partitioned", "temporal", "owner")):
            label = f"{w} ranks {memory}, {method}" + (", --share owner" if share == "owner" else "")
            e = row(label, stores[w, method], "--nproc", str(w), "--memory", memory, "--share", share)
            if memory == "partitioned" and share == "even":
                got[method] = e["bytes"]
            if reference is not None:
                before, after = reference, row(f"{peer} (again)", *data, env=modes[peer])["events_per_s"]
                reference = after
                lines.append(f"{label}: events/s over one process ({peer}, mean of the runs just before and after: "
                             f"{before:,.0f}, {after:,.0f}) = {e['events_per_s'] * 2 / (before + after):.2f}")
        lines.append(f"{w} ranks, partitioned: bytes moved temporal / random = "
                     f"{got['temporal'] / max(got['random'], 1):.2f} ({got['temporal'] / MiB:.1f} / "
                     f"{got['random'] / MiB:.1f} MB)")
    print("\n".join(lines))


def parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs.py checks the documented commands against it)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=("memory", "speed"), default=None)
    p.add_argument("--ranks", default="1,2,4")
    p.add_argument("--memory-events", type=int, default=3_000_000)
    p.add_argument("--memory-nodes", type=int, default=30_000)
    p.add_argument("--edge-dim", type=int, default=64)
    p.add_argument("--speed-events", type=int, default=1_000_000)
    p.add_argument("--speed-nodes", type=int, default=None, help="default: events / 10")
    return p


def main() -> None:
    a = parser().parse_args()
    ranks = [int(r) for r in a.ranks.split(",")]
    with tempfile.TemporaryDirectory(prefix="dist-tgnn-") as tmp:
        if a.only in (None, "memory"):
            memory_table(Path(tmp), a.memory_events, a.memory_nodes, a.edge_dim, ranks)
        if a.only in (None, "speed"):
            speed_table(Path(tmp), a.speed_events, a.speed_nodes or max(a.speed_events // 10, 2), ranks)


if __name__ == "__main__":
    main()
