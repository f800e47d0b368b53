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

Then, within one checkpointed run per setting (`fit` on a `LinkTrainer` whose `step` is timed,
the library calls `gnndist train` makes; W ranks by `launch`), where the machine's drift from one
run to the next cancels: per checkpoint, the milliseconds the run loses to it (the step cycle that
saves, and the slower cycles of the 59 steps after it while the write runs, each against the mean
cycle of the steps outside those), and 1 - the share of the epoch's time that adds up to.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gnndist import checkpoint
from gnndist.datasets import load
from gnndist.outputs import Outputs
from gnndist.runtime import dist
from gnndist.runtime.launch import launch
from gnndist.temporal.config import LinkConfig
from gnndist.temporal.fit import fit, rank_events
from gnndist.temporal.trainer import LinkTrainer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dist_tgnn import gnndist, train  # noqa: E402  (the same fresh-process runs)

MiB = 2**20


def one_checkpoint(folder: Path) -> tuple[int, float, float, float]:
    """Rank 0's newest checkpoint within the epoch in `folder` (else its newest), its node state
    whole: (bytes, seconds of the copy to host memory, seconds of the write), the times the
    median of 3; and the mean bytes of rank 0's kept checkpoints within the epoch that hold only
    the node rows changed since the one before (NaN: none kept)."""
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


AFTER = 60  # the step cycles a checkpoint slows: its own, and those while the write runs in the background


def timed_run(source: Any, memory: str, folder: str, every: int) -> tuple[list[float], int, float]:
    """One epoch of this rank (of `source`: a graph or a store) with `memory`, a checkpoint every
    `every` steps in `folder`: the step cycles (start of a step to the start of the next, the
    checkpoint after a step in its cycle), the steps per epoch and the epoch's seconds."""
    cfg = LinkConfig(model="tgn", batch_size=200, epochs=1, quiet=True, memory=memory)
    trainer = LinkTrainer(rank_events(source), cfg)
    starts, step = [], trainer.step

    def timed(*a, **kw):
        starts.append(time.perf_counter())
        return step(*a, **kw)
    trainer.step = timed
    m = fit(trainer, Outputs(checkpoint=folder, checkpoint_every=every))
    spe = trainer.steps_per_epoch
    return list(np.diff(starts[:spe])), spe, m["epochs"][0]["time_s"]


def timed_worker(store: str, folder: str, every: int) -> tuple[list[float], int, float]:
    dist.setup("cpu")
    try:
        return timed_run(store, "partitioned", folder, every)
    finally:
        dist.teardown()


def within(cycles: list[float], spe: int, seconds: float, every: int) -> tuple[float, float]:
    """(ms a checkpoint costs, 1 - their share of the epoch) from one run's step cycles."""
    saves = range(every - 1, spe - 1, every)  # the cycles that checkpoint
    slowed = np.zeros(len(cycles), dtype=bool)
    for k in saves:
        slowed[k:k + AFTER] = True
    base = float(np.mean(np.asarray(cycles)[~slowed]))
    cost = statistics.fmean(sum(cycles[k:k + AFTER]) - len(cycles[k:k + AFTER]) * base for k in saves)
    return cost * 1e3, 1 - len(saves) * cost / seconds


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
    nodes = a.nodes or max(a.events // 10, 2)
    data = ["synthetic-temporal", "--num-nodes", str(nodes), "--num-events", str(a.events)]
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
            folder = str(tmp / f"within{w}")
            if w == 1:
                graph = load("synthetic-temporal", num_nodes=nodes, num_events=a.events)
                runs = [timed_run(graph, LinkConfig().memory, folder, a.every)]
            else:
                runs = launch(w, timed_worker, str(store), folder, a.every)
            print("  within one run, per rank: ms lost a checkpoint, 1 - their "
                  "share: " + "; ".join("%.1f ms, %.3f" % within(*r, a.every) for r in runs), flush=True)


if __name__ == "__main__":
    main()
