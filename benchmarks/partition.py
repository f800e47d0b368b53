"""Partitioner benchmark: gnndist `metis` vs calling pymetis directly, `temporal` on 10M events,
and the partition quality on UCI (CollegeMsg) against `random`.

    python benchmarks/partition.py                       # 1M nodes / 10M edges, 10M events
    python benchmarks/partition.py --nodes 100000 --edges 1000000 --events 1000000   # quick
    python benchmarks/partition.py --uci-only            # only the UCI quality table

Each timed run is a fresh subprocess that loads the same saved graph, so peak memory (VmHWM,
the peak resident set size) compares like with like. pymetis gets the generated graph's CSR
as is (it is already symmetric, without duplicates or self-loops); gnndist takes the graph as
any user's graph and symmetrizes it first. Prints metrics and ratios; not a test. Linux only.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def rss_bytes() -> int:
    """Peak RSS of this process (VmHWM). Read here rather than through gnndist.partition.stats
    so that the pymetis child imports nothing of gnndist."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))

UCI = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "uci_collegemsg" / "CollegeMsg.txt.gz"


def child_pymetis(d: Path, parts: int) -> dict:
    import pymetis

    indptr, indices = np.load(d / "indptr.npy"), np.load(d / "indices.npy")
    loaded = rss_bytes()
    t0 = time.perf_counter()
    res = pymetis.part_graph(parts, pymetis.CSRAdjacency(indptr, indices), recursive=False,
                             options=pymetis.Options(ufactor=30, seed=0))
    membership = np.asarray(res.vertex_part)
    secs = time.perf_counter() - t0
    row = np.repeat(membership, np.diff(indptr))
    return {"time_s": secs, "peak_bytes": rss_bytes(), "loaded_bytes": loaded,
            "edge_cut_fraction": float(np.mean(row != membership[indices]))}


def child_gnndist(d: Path, parts: int) -> dict:
    from gnndist import Graph
    from gnndist.partition import partition_graph

    g = Graph(np.load(d / "indptr.npy"), np.load(d / "indices.npy"))
    loaded = rss_bytes()
    t0 = time.perf_counter()
    store = partition_graph(g, parts, method="metis")
    secs = time.perf_counter() - t0
    peak = rss_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        t1 = time.perf_counter()
        store.save(Path(tmp) / "store")
        save_s = time.perf_counter() - t1
    return {"time_s": secs, "peak_bytes": peak, "loaded_bytes": loaded, "save_s": save_s,
            "peak_with_save_bytes": rss_bytes(), "edge_cut_fraction": store.stats["edge_cut_fraction"],
            "imbalance": store.stats["imbalance"]}


def child_temporal(num_nodes: int, num_events: int, parts: int) -> dict:
    from gnndist.datasets import load
    from gnndist.partition import partition_graph

    g = load("synthetic-temporal", num_nodes=num_nodes, num_events=num_events, seed=0)
    out = {}
    for method in ("random", "temporal"):
        t0 = time.perf_counter()
        f = partition_graph(g, parts, method=method).stats
        out[method] = {"time_s": time.perf_counter() - t0, "cross": f["cross_partition_event_fraction"],
                       "imbalance": f["imbalance"]}
    out["peak_bytes"] = rss_bytes()
    return out


def child_generate(d: Path, nodes: int, edges: int) -> dict:
    from gnndist.datasets import load

    t0 = time.perf_counter()
    g = load("synthetic-static", num_nodes=nodes, num_edges=edges, seed=0)
    np.save(d / "indptr.npy", g.indptr)
    np.save(d / "indices.npy", g.indices)
    return {"time_s": time.perf_counter() - t0, "csr_entries": g.num_edges}


def run_child(*args: str) -> dict:
    p = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"child {args[0]} failed:\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def mib(b: float) -> str:
    return f"{b / 2**20:,.0f} MiB"


def uci_table(parts: int) -> None:
    from gnndist.datasets import load
    from gnndist.errors import GnndistError
    from gnndist.partition import partition_graph

    if not UCI.exists():
        print("UCI: shared dataset absent, skipped")
        return
    g = load(str(UCI))
    rows = [("random", {"method": "random"}), ("metis (balance events)", {"method": "metis", "balance": ["edges"]}),
            ("temporal, 1 window", {"method": "temporal", "time_windows": 1}),
            ("temporal (4 windows, default)", {"method": "temporal"}),
            *((f"events only, tolerance {tol}", {"method": "temporal", "time_windows": 1, "recency": 0.0,
                                                 "imbalance_tol": tol}) for tol in (1.1, 1.5, 2.0, 3.0)),
            ("random + 32 hubs", {"method": "random", "replicate_hubs": 32}),
            ("temporal + 32 hubs", {"method": "temporal", "replicate_hubs": 32})]
    print(f"\nUCI CollegeMsg, {parts} parts ({g.num_nodes:,} nodes, {g.num_events:,} events)")
    print("cross: fraction of events whose endpoints have different owners; w/ replicas: of those, the ones\n"
          "touching no replicated hub; worst window: max over 4 equal time windows of max/mean owned events;\n"
          "events only: METIS minimizing exactly the crossing events (no recency, 1 window) at looser balance")
    print(f"{'method':32}{'cross':>8}{'vs random':>11}{'w/ replicas':>13}{'ev. imb':>9}{'worst win':>11}"
          f"{'repl.':>7}{'time':>8}")
    win = np.arange(g.num_events) * 4 // g.num_events
    base = None
    for name, kw in rows:
        try:
            store = partition_graph(g, parts, **kw)
        except GnndistError as e:  # e.g. a tolerance so loose that METIS leaves a part empty
            print(f"{name:32}  refused: {e}")
            continue
        f = store.stats
        per_win = np.bincount(win * parts + store.membership[g.src], minlength=4 * parts).reshape(4, parts)
        base = base or f["cross_partition_event_fraction"]
        print(f"{name:32}{f['cross_partition_event_fraction']:8.3f}{f['cross_partition_event_fraction'] / base:10.2f}x"
              f"{f['cross_partition_event_fraction_with_replicas']:13.3f}{f['imbalance']['events']:9.3f}"
              f"{(per_win.max(1) / per_win.mean(1)).max():11.3f}{f['replication_factor']:7.2f}"
              f"{f['partition_time_s']:7.2f}s")


def parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs.py checks the documented commands against it)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1_000_000)
    ap.add_argument("--edges", type=int, default=10_000_000, help="undirected edges (stored both ways)")
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--temporal-nodes", type=int, default=100_000)
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2, help="runs of each side, alternating; the fastest counts")
    ap.add_argument("--uci-only", action="store_true", help="print only the UCI quality table")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    return ap


def main() -> None:
    a = parser().parse_args()
    if a.uci_only:
        uci_table(a.parts)
        return
    if a.child:
        kind, *rest = a.child
        if kind == "temporal":
            res = child_temporal(int(rest[0]), int(rest[1]), int(rest[2]))
        elif kind == "generate":
            res = child_generate(Path(rest[0]), int(rest[1]), int(rest[2]))
        else:
            res = {"pymetis": child_pymetis, "gnndist": child_gnndist}[kind](Path(rest[0]), int(rest[1]))
        print(json.dumps(res))
        return

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        gen = run_child("generate", str(d), str(a.nodes), str(a.edges))
        print(f"synthetic-static: {a.nodes:,} nodes, {a.edges:,} undirected edges "
              f"({gen['csr_entries']:,} CSR entries), generated in {gen['time_s']:.1f} s; {a.parts} parts")
        runs: dict[str, list[dict]] = {"pymetis": [], "gnndist": []}
        for _ in range(a.repeat):  # alternate, keep each side's fastest run (other load on the machine)
            for kind in runs:
                runs[kind].append(run_child(kind, str(d), str(a.parts)))
        pm, gd = (min(runs[k], key=lambda r: r["time_s"]) for k in ("pymetis", "gnndist"))
    print(f"best of {a.repeat} runs each")
    print(f"{'':24}{'time':>10}{'peak RSS':>14}{'after load':>14}{'edge cut':>10}")
    for name, r in (("pymetis.part_graph", pm), ("gnndist metis", gd)):
        print(f"{name:24}{r['time_s']:9.1f}s{mib(r['peak_bytes']):>14}{mib(r['loaded_bytes']):>14}"
              f"{r['edge_cut_fraction']:10.3f}")
    print(f"gnndist/pymetis: time {gd['time_s'] / pm['time_s']:.2f}x, "
          f"peak memory {gd['peak_bytes'] / pm['peak_bytes']:.2f}x"
          f" (above load: {(gd['peak_bytes'] - gd['loaded_bytes']) / (pm['peak_bytes'] - pm['loaded_bytes']):.2f}x)")
    print(f"gnndist imbalance {gd['imbalance']}; writing the store: {gd['save_s']:.1f} s, "
          f"peak with writing {mib(gd['peak_with_save_bytes'])}")

    tr = run_child("temporal", str(a.temporal_nodes), str(a.events), str(a.parts))
    print(f"\nsynthetic-temporal: {a.events:,} events, {a.temporal_nodes:,} nodes, {a.parts} parts "
          f"(peak RSS incl. generation {mib(tr['peak_bytes'])})")
    for m in ("random", "temporal"):
        r = tr[m]
        print(f"  {m:10} {r['time_s']:7.1f} s   cross-partition events {r['cross']:.3f}   "
              f"event imbalance {r['imbalance']['events']:.3f}   "
              f"worst window {r['imbalance']['events_worst_window']:.3f}")
    print(f"  temporal cross / random cross: {tr['temporal']['cross'] / tr['random']['cross']:.2f}x")
    uci_table(a.parts)


if __name__ == "__main__":
    main()
