"""Build the synthetic graphs at scale and read a large SNAP file, with time and peak memory.

    python benchmarks/generators.py                      # 10M edges / 10M events (the targets: < 60 s each)
    python benchmarks/generators.py --scale 0.1          # a tenth of that

Each case runs in its own process; its peak RSS is counted from after the imports (peak reset
through /proc/self/clear_refs) minus the RSS then.
Peers, measured in the same run: PyG's FakeDataset (uniform random graph, same nodes, degree and
feature width) for synthetic-static; plain uniform random events (the floor: just drawing the
arrays) for synthetic-temporal; np.loadtxt on the whole file for the SNAP reader.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time


def _status_mb(key: str) -> float:
    """A memory number (VmRSS, VmHWM) of this process from /proc, in MiB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":")) / 1024


def _reset_peak() -> bool:
    """Reset this process's peak RSS (Linux >= 4.0); False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _case(name: str, nodes: int, edges: int, events: int, path: str) -> dict:
    import numpy as np

    if name.startswith("pyg"):
        from torch_geometric.datasets import FakeDataset
    from gnndist.datasets import load
    base = _status_mb("VmRSS")
    reset = _reset_peak()
    t0 = time.perf_counter()
    if name == "gnndist-static":
        g = load("synthetic-static", num_nodes=nodes, num_edges=edges)
        size = f"{g.num_nodes} nodes, {g.num_edges} directed edges, {g.num_features} features"
    elif name == "pyg-fake-static":
        d = FakeDataset(num_graphs=1, avg_num_nodes=nodes, avg_degree=edges / nodes, num_channels=32,
                        num_classes=8)[0]
        size = f"{d.num_nodes} nodes, {d.num_edges} directed edges, {d.num_features} features"
    elif name == "gnndist-temporal":
        g = load("synthetic-temporal", num_nodes=nodes, num_events=events)
        size = f"{g.num_nodes} nodes, {g.num_events} events, edge_dim {g.edge_dim}"
    elif name == "uniform-temporal":
        rng = np.random.default_rng(0)
        src, dst = rng.integers(0, nodes, events), rng.integers(0, nodes, events)
        t = np.sort(rng.random(events) * events)
        feat = rng.standard_normal((events, 8), dtype=np.float32)
        size = f"{nodes} nodes, {len(src)} events ({dst.dtype}, {t.dtype}), edge_dim {feat.shape[1]}"
    elif name == "gnndist-load-snap":
        g = load(path)
        size = f"{g.num_nodes} nodes, {g.num_events} events"
    elif name == "np-loadtxt-snap":
        a = np.loadtxt(path)
        size = f"{a.shape[0]} rows"
    else:
        raise SystemExit(f"unknown case {name}")
    seconds = time.perf_counter() - t0
    peak = _status_mb("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"case": name, "seconds": seconds, "peak_mb": peak - base, "size": size}


def _run(name: str, args: argparse.Namespace, path: str = "") -> dict:
    cmd = [sys.executable, __file__, "--case", name, "--nodes", str(args.nodes), "--edges", str(args.edges),
           "--events", str(args.events), "--path", path]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _write_snap(path: str, nodes: int, events: int) -> float:
    """Write the synthetic-temporal events as a SNAP text file; returns seconds taken."""
    import numpy as np

    from gnndist.datasets import load
    t0 = time.perf_counter()
    g = load("synthetic-temporal", num_nodes=nodes, num_events=events)
    with open(path, "w") as f:
        f.write("# src dst time\n")
        np.savetxt(f, np.column_stack([g.src, g.dst, g.t]), fmt=["%d", "%d", "%.6f"])
    return time.perf_counter() - t0


def parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs.py checks the documented commands against it)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=float, default=1.0, help="fraction of the full size (1M nodes, 10M edges/events)")
    p.add_argument("--case", help=argparse.SUPPRESS)
    p.add_argument("--nodes", type=int, help=argparse.SUPPRESS)
    p.add_argument("--edges", type=int, help=argparse.SUPPRESS)
    p.add_argument("--events", type=int, help=argparse.SUPPRESS)
    p.add_argument("--path", default="", help=argparse.SUPPRESS)
    p.add_argument("--skip-io", action="store_true", help="skip writing and reading the SNAP text file")
    return p


def main() -> None:
    args = parser().parse_args()
    if args.case:
        print(json.dumps(_case(args.case, args.nodes, args.edges, args.events, args.path)))
        return
    args.nodes, args.edges, args.events = (int(v * args.scale) for v in (1_000_000, 10_000_000, 10_000_000))
    print(f"sizes: {args.nodes} nodes, {args.edges} undirected edges, {args.events} events; {os.cpu_count()} CPUs")
    pairs = [("gnndist-static", "pyg-fake-static"), ("gnndist-temporal", "uniform-temporal")]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "events.txt")
        if not args.skip_io:
            print(f"(writing {args.events} events as SNAP text took {_write_snap(path, args.nodes, args.events):.1f} s, "
                  f"{os.path.getsize(path) / 2**20:.0f} MiB)")
            pairs.append(("gnndist-load-snap", "np-loadtxt-snap"))
        print(f"{'case':<20} {'seconds':>8} {'peak MiB':>9}  size")
        for ours, peer in pairs:
            a, b = _run(ours, args, path), _run(peer, args, path)
            for r in (a, b):
                print(f"{r['case']:<20} {r['seconds']:>8.2f} {r['peak_mb']:>9.0f}  {r['size']}")
            print(f"{'  ratio (ours/peer)':<20} {a['seconds'] / b['seconds']:>8.2f} {a['peak_mb'] / b['peak_mb']:>9.2f}")


if __name__ == "__main__":
    main()
