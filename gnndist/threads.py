"""Thread setup, run by `import gnndist`: no thread of torch or numba ever spins while it waits,
whatever the environment and whichever of torch and gnndist is imported first, so the CLI and
a user's script or notebook run alike.

Why: torch and numba both run their parallel regions on the one GNU OpenMP runtime of the
process, whose idle threads spin (busy-wait) for a while after every region unless
OMP_WAIT_POLICY=PASSIVE was set before the runtime loaded (it reads it once, when torch
loads it). Measured on a shared 2-core machine: after each torch matmul two-thread teams burn
4-12 ms of CPU spinning while the process sleeps (0.1 ms with PASSIVE); a one-epoch TGN run
ran 182 events/s with torch's default 2 spinning threads against 6,153 with 1 thread, at
load 5-7 (`benchmarks/tgn_vs_pyg.py`); the temporal sampler's parallel kernel ran 10x
slower in a spinning runtime (0.32 M queries/s) than serial (2.46 M). Spinning threads take
the core that the thread holding the work needs as soon as anything else runs on the machine.

What `configure` does:
- OMP_WAIT_POLICY unset: it is set to PASSIVE. When no OpenMP runtime is loaded yet
  (gnndist imported before torch, as the CLI does), the process's runtime then sleeps idle
  threads and nothing else changes: torch keeps its thread count, numba uses its `omp`
  threading layer (the cheapest launch: 15-50 us against 70-180 us for `workqueue`, and
  safe to call from several threads, e.g. `PrefetchLoader`'s). Ranks started by
  `gnndist train --nproc` inherit it either way.
- The runtime was loaded already with the spinning default (torch imported first), which no
  setting can change any more: torch runs its intra-op work on one thread (a team of one has
  no thread to spin), and numba takes its `workqueue` layer, whose workers sleep on condition
  variables. `tbb` would be the other non-spinning layer but is not a dependency of ours (pip's
  `tbb` is not even found by numba without LD_LIBRARY_PATH). The second core then serves work
  that runs beside torch's (sampling ahead in `PrefetchLoader`, other ranks, other jobs).
- What the user set explicitly wins: OMP_WAIT_POLICY (e.g. ACTIVE on a machine of one's
  own), OMP_NUM_THREADS (torch's count) and NUMBA_THREADING_LAYER are left alone, as is a
  numba threading layer that is running already.
`gnndist.samplers.kernels` launches one parallel kernel at a time (`workqueue` allows no
concurrent launches, and two teams that each take every core only oversubscribe them).
"""
from __future__ import annotations

import os
import sys

OPENMP_RUNTIMES = ("libgomp", "libiomp", "libomp")


def openmp_loaded() -> bool:
    """Whether an OpenMP runtime is mapped into this process (without /proc: whether torch,
    which brings one, is imported)."""
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return "torch" in sys.modules
    return any(name in maps for name in OPENMP_RUNTIMES)


def configure() -> None:
    """Make idle OpenMP threads sleep, or keep torch and numba out of spinning teams where the
    runtime spins already (see the module docstring). Idempotent."""
    if "OMP_WAIT_POLICY" in os.environ:
        return
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    if not openmp_loaded():
        return
    if "OMP_NUM_THREADS" not in os.environ:
        import torch

        torch.set_num_threads(1)
    if "NUMBA_THREADING_LAYER" not in os.environ:
        import numba

        try:
            numba.threading_layer()  # raises while no layer is chosen yet
        except ValueError:
            numba.config.THREADING_LAYER = "workqueue"
