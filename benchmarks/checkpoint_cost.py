"""The cost of checkpoints within an epoch, on the speed setting of benchmarks/dist_tgnn.py
(synthetic-temporal, 1M events, 100k nodes; TGN memory 100, batch 200, one epoch).

    python benchmarks/checkpoint_cost.py                       # 1 process and 2 ranks, every 100 steps
    python benchmarks/checkpoint_cost.py --ranks 2 --events 200000   # quick

Per setting (one process as `gnndist train` runs it; W ranks with partitioned memory), runs
alternated, each one `gnndist train` command in a fresh process: without checkpoints, then
`--repeat` times with `--checkpoint DIR --checkpoint-every N` and without again; printed:
training events/s of each, the mean of the checkpointed runs over the mean of those without
(goal: at least 0.95); of one checkpoint with the whole node state (rank 0's newest within the
epoch, put together): its size, its copy to host memory (into the buffers of the copy before,
as in a run) and its write (`gnndist.checkpoint.save`: serialise, write, fsync, rename), which
runs in the background; and the mean size of rank 0's kept checkpoints that hold only the node
rows changed since the one before (most of a run's: the step copies and the writer writes only
those). Not a test: the machine's other load moves events/s by a few percent.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dist_tgnn import gnndist, train  # noqa: E402  (the same fresh-process runs)

MiB = 2**20


def one_checkpoint(folder: Path) -> tuple[int, float, float, float]:
    """Rank 0's newest checkpoint within the epoch in `folder` (else its newest), its node state
    whole: (bytes, seconds of the copy to host memory, seconds of the write), the times the
    median of 3; and the mean bytes of rank 0's kept checkpoints within the epoch that hold only
    the node rows changed since the one before (NaN: none kept)."""
    import torch
    from gnndist import checkpoint

    rank0 = checkpoint.model_folder(folder)
    held = checkpoint.positions(rank0)
    at = max([p for p in held if p.step is not None] or held)
    payload = checkpoint.load(rank0, at)
    copy = checkpoint.HostCopy()
    copy(payload)  # a run's first copy makes the buffers; the later ones fill them
    copies, writes = [], []
    with tempfile.TemporaryDirectory(prefix="ckpt-write-") as out:
        for _ in range(3):
            t0 = time.perf_counter()
            host = copy(payload)
            copies.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            path = checkpoint.save(out, host)
            writes.append(time.perf_counter() - t0)
        size = path.stat().st_size
    deltas = [(rank0 / p.name).stat().st_size for p in held if p.step is not None and
              "rows" in torch.load(rank0 / p.name, map_location="cpu", weights_only=True, mmap=True)["node_state"]]
    return size, statistics.median(copies), statistics.median(writes), statistics.fmean(deltas) if deltas else math.nan


def parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs.py checks the documented commands against it)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--nodes", type=int, default=None, help="default: events / 10")
    p.add_argument("--every", type=int, default=100, help="steps between checkpoints")
    p.add_argument("--ranks", default="1,2")
    p.add_argument("--repeat", type=int, default=1, help="checkpointed runs per setting (each followed by one without)")
    return p


def main() -> None:
    a = parser().parse_args()
    data = ["synthetic-temporal", "--num-nodes", str(a.nodes or max(a.events // 10, 2)), "--num-events", str(a.events)]
    print(f"synthetic-temporal {a.events:,} events; TGN memory 100, batch 200, 1 epoch; --checkpoint-every {a.every}")
    head = (f"{'setting':<24}{'events/s: none, every N, none, ...':<44}{'ratio':>7}{'whole MiB':>10}{'copy ms':>9}"
            f"{'write s':>9}{'delta MiB':>10}")
    print(head + "\n" + "-" * len(head), flush=True)
    with tempfile.TemporaryDirectory(prefix="ckpt-cost-") as tmp:
        tmp = Path(tmp)
        for w in [int(r) for r in a.ranks.split(",")]:
            if w == 1:
                label, argv = "1 process", data
            else:
                store = tmp / f"store{w}"
                gnndist("partition", *data, "--parts", str(w), "--out", str(store), "--quiet")
                label, argv = f"{w} ranks, partitioned", [str(store), "--nproc", str(w), "--memory", "partitioned"]
            common = [*argv, "--batch-size", "200"]
            ck = tmp / f"ck{w}"
            saving = ["--checkpoint", str(ck), "--checkpoint-every", str(a.every)]
            rates = [train(tmp, *common, *(saving if i % 2 else []))["epochs"][0]["events_per_s"]
                     for i in range(2 * a.repeat + 1)]
            size, copy_s, write_s, delta = one_checkpoint(ck)
            ratio = statistics.fmean(rates[1::2]) / statistics.fmean(rates[::2])
            print(f"{label:<24}{', '.join(f'{r:,.0f}' for r in rates):<44}{ratio:>7.3f}{size / MiB:>10.1f}"
                  f"{copy_s * 1e3:>9.1f}{write_s:>9.2f}{delta / MiB:>10.1f}", flush=True)


if __name__ == "__main__":
    main()
