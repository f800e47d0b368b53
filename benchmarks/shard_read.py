"""Reading a large event file: the shard reader (pyarrow) against the hand-written numpy reader.

    python benchmarks/shard_read.py                 # 4M events (CSV with a label and 4 features, SNAP text, Parquet)
    python benchmarks/shard_read.py --rows 1000000

Each case runs in its own process; its peak RSS is counted from after the imports (peak reset
through /proc/self/clear_refs) minus the RSS then. Cases per file:
- stream: every chunk parsed and dropped (bounded memory): the numpy reader's chunks
  (gnndist.datasets.text, np.loadtxt on 16 MiB of lines) against `shards.read_unit`;
- load: the whole graph in memory: `load_snap` / `load_csv` (numpy) against `shards.read_graph`.
Ratios are pyarrow's over numpy's.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def _status_mb(key: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":")) / 1024


def _case(name: str, path: str) -> dict:
    from gnndist.datasets import shards, text
    from gnndist.datasets.formats import load_csv, load_snap

    base = _status_mb("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    t0 = time.perf_counter()
    rows = 0
    if name == "numpy-stream":
        sep = "," if path.endswith(".csv") else "whitespace"
        for i, chunk in enumerate(text._chunks(path)):
            if i == 0 and sep == ",":
                chunk = chunk.partition(b"\n")[2]  # the header
            rows += text._parse(chunk, sep).shape[0]
    elif name == "pyarrow-stream":
        s = shards.open_shards(path)
        for unit in shards.plan_shards([s.files]).units[0]:
            rows += sum(len(c) for c in shards.read_unit(s, unit))
    elif name == "numpy-load":
        rows = (load_csv if path.endswith(".csv") else load_snap)(path).num_events
    elif name == "pyarrow-load":
        rows = shards.read_graph(path).num_events
    else:
        raise SystemExit(f"unknown case {name}")
    seconds = time.perf_counter() - t0
    return {"case": name, "seconds": seconds, "peak_mb": _status_mb("VmHWM") - base, "rows": rows}


def _run(name: str, path: str) -> dict:
    p = subprocess.run([sys.executable, __file__, "--case", name, "--path", path], capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"{name} {path} failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _write(folder: str, rows: int) -> list[str]:
    """The synthetic-temporal events (ids 0..N-1: the numpy loaders refuse negative ones) with a
    label and 4 features as CSV, as SNAP text (src dst t) and as Parquet, each one file."""
    import numpy as np

    from gnndist.datasets.generators import synthetic_temporal
    from gnndist.datasets.shard_writer import ShardWriteConfig, write_shards

    g = synthetic_temporal(num_nodes=max(2, rows // 10), num_events=rows, edge_dim=4)
    g.edge_label = (np.arange(rows) % 2).astype(np.int64)
    paths = []
    for fmt in ("csv", "snap", "parquet"):
        if fmt == "snap":
            g.edge_feat = g.edge_label = None
        out = os.path.join(folder, fmt)
        s = write_shards(g, out, ShardWriteConfig(num_shards=1, format=fmt, shuffle_ids=False))
        paths.append(s.path(s.files[0][0]))
    return paths


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=4_000_000, help="events in the file (default: 4M)")
    p.add_argument("--case", help=argparse.SUPPRESS)
    p.add_argument("--path", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.case:
        print(json.dumps(_case(args.case, args.path)))
        return
    print(f"{args.rows} events; {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp:
        for path in _write(tmp, args.rows):
            print(f"\n{os.path.basename(path)} ({os.path.getsize(path) / 2**20:.0f} MiB)")
            print(f"  {'case':<16} {'seconds':>8} {'peak MiB':>9} {'rows':>10}")
            pairs = [("numpy-stream", "pyarrow-stream"), ("numpy-load", "pyarrow-load")]
            for peer, ours in pairs:
                if path.endswith(".parquet"):
                    print(f"  {ours:<16}", end="")
                    r = _run(ours, path)
                    print(f" {r['seconds']:>8.2f} {r['peak_mb']:>9.0f} {r['rows']:>10}")
                    continue
                a, b = _run(peer, path), _run(ours, path)
                for r in (a, b):
                    print(f"  {r['case']:<16} {r['seconds']:>8.2f} {r['peak_mb']:>9.0f} {r['rows']:>10}")
                print(f"  {'ratio':<16} {b['seconds'] / a['seconds']:>8.2f} {b['peak_mb'] / a['peak_mb']:>9.2f}")


if __name__ == "__main__":
    main()
