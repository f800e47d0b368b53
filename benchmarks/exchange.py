"""What one swap between two processes on this machine costs: gloo's all-to-all between two
local ranks (`gnndist.runtime.dist.exchange`, what `gnndist train --nproc 2` uses, and torch's
`all_to_all_single` called directly on the same buffers each time) against a swap through shared
memory and semaphores (what a one-process run uses with its half process,
`gnndist/temporal/half_process.py`).

    python benchmarks/exchange.py

Each side sends the other the same number of bytes: 8, 50 KB and 750 KB (about what a
replicated TGN step of `benchmarks/dist_tgnn.py`'s speed setting swaps: its gradient sum of
175,321 float32, 701 KB, carried by its state write). Each process is pinned to a core of its
own, as `--nproc 2` pins its ranks, and swaps back to back. Printed per swap, the median of 5
rounds of 400: wall time (the slower side's) and CPU time (of all a process's threads, the mean
of the two processes); then `exchange`'s over shared memory's. Not a test: the metrics are this
machine's.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time

import torch
import torch.distributed as dist

from gnndist.runtime import dist as gdist
from gnndist.runtime import threads
from gnndist.runtime.launch import launch

SIZES = (8, 50_000, 750_000)
ROUNDS, SWAPS, WARMUP = 5, 400, 50


def _timed(swap) -> tuple[float, float]:
    """(wall, process CPU) seconds per swap: the median of the rounds."""
    for _ in range(WARMUP):
        swap()
    walls, cpus = [], []
    for _ in range(ROUNDS):
        c, t = time.process_time(), time.perf_counter()
        for _ in range(SWAPS):
            swap()
        walls.append((time.perf_counter() - t) / SWAPS)
        cpus.append((time.process_time() - c) / SWAPS)
    return statistics.median(walls), statistics.median(cpus)


def _gloo_rank() -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """On each of 2 local ranks: every size swapped with the other rank by `exchange`, and by
    `all_to_all_single` into the same buffer each time."""
    gdist.setup()
    try:
        me, ours, torchs = gdist.rank(), [], []
        for size in SIZES:
            buf, into = torch.ones(size, dtype=torch.uint8), torch.empty(size, dtype=torch.uint8)
            send = [buf[:0], buf] if me == 0 else [buf, buf[:0]]  # nothing to itself
            split = [0, size] if me == 0 else [size, 0]
            ours.append(_timed(lambda: gdist.exchange(send, recv_sizes=split)))
            torchs.append(_timed(lambda: dist.all_to_all_single(into, buf, split, split)))
        return ours, torchs
    finally:
        gdist.teardown()


def _shm_side(me: int, core: int, slots: list[torch.Tensor], ready: list, results) -> None:
    """One side of the shared-memory swap: write its bytes into its slot, say so, wait for the
    other's and copy them out."""
    threads.pin([core])
    torch.set_num_threads(1)
    out = []
    for size in SIZES:
        mine, theirs = slots[me][:size], slots[1 - me][:size]
        buf, got = torch.ones(size, dtype=torch.uint8), torch.empty(size, dtype=torch.uint8)

        def swap() -> None:
            mine.copy_(buf)
            ready[me].release()
            ready[1 - me].acquire()
            got.copy_(theirs)

        out.append(_timed(swap))
    results.put((me, out))


def shared_memory_swaps(cores: list[int]) -> list[tuple[float, float]]:
    """Both sides of the shared-memory swap, forked; per size (wall, CPU) as `_mean_of_sides`."""
    ctx = multiprocessing.get_context("fork")
    slots = [torch.empty(max(SIZES), dtype=torch.uint8).share_memory_() for _ in range(2)]
    ready, results = [ctx.Semaphore(0) for _ in range(2)], ctx.Queue()
    sides = [ctx.Process(target=_shm_side, args=(r, cores[r], slots, ready, results)) for r in range(2)]
    for p in sides:
        p.start()
    got = dict(results.get() for _ in sides)
    for p in sides:
        p.join()
    return _mean_of_sides(got[0], got[1])


def _mean_of_sides(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Per size: the slower side's wall time (the swap ends for both) and the mean CPU time."""
    return [(max(x[0], y[0]), (x[1] + y[1]) / 2) for x, y in zip(a, b)]


def parser() -> argparse.ArgumentParser:
    """The command line, which takes no flags (tests/test_docs.py checks the documented commands against it)."""
    return argparse.ArgumentParser(description=__doc__.splitlines()[0])


def main() -> None:
    parser().parse_args()
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("benchmarks/exchange.py needs 2 cores (one per side)")
    shm = shared_memory_swaps(cores)
    (ours0, torch0), (ours1, torch1) = launch(2, _gloo_rank)
    ours, torchs = _mean_of_sides(ours0, ours1), _mean_of_sides(torch0, torch1)
    print(f"one swap between 2 processes on cores of their own (median of {ROUNDS} rounds of {SWAPS}), "
          "wall / CPU ms")
    head = (f"{'bytes each way':>15}{'exchange':>16}{'all_to_all_single':>19}{'shared memory':>16}"
            f"{'exchange/shm wall':>19}{'CPU':>8}")
    print(head + "\n" + "-" * len(head))
    for size, (gw, gc), (tw, tc), (sw, sc) in zip(SIZES, ours, torchs, shm):
        print(f"{size:>15,}{1e3 * gw:>9.3f} /{1e3 * gc:>5.3f}{1e3 * tw:>12.3f} /{1e3 * tc:>5.3f}"
              f"{1e3 * sw:>9.3f} /{1e3 * sc:>5.3f}{gw / sw:>18.1f}x{gc / sc:>7.1f}x")


if __name__ == "__main__":
    main()
