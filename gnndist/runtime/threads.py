"""Thread setup, run by `import gnndist`: no thread of torch or numba ever spins while it waits,
whatever the environment and whichever of torch and gnndist is imported first, so the CLI and
a user's script or notebook run alike.

Why: torch and numba both run their parallel regions on the one GNU OpenMP runtime of the
process, whose idle threads spin (busy-wait) for a while after every region unless
OMP_WAIT_POLICY=PASSIVE was set before the runtime loaded (it reads it once, when torch
loads it). Spinning threads take the core that the thread holding the work needs as soon as
anything else runs on the machine: on a shared machine a TGN epoch and the temporal sampler
ran many times slower (docs/benchmarks.md, "Measurements behind the code").

What `configure` does:
- OMP_WAIT_POLICY unset: it is set to PASSIVE. When no OpenMP runtime is loaded yet
  (gnndist imported before torch, as the CLI does), the process's runtime then sleeps idle
  threads and nothing else changes: torch keeps its thread count (outside jobs, below),
  numba uses its `omp` threading layer (the cheapest launch, and safe to call from several
  threads, e.g. `PrefetchLoader`'s). Ranks started by
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

Numba's parallel kernels run under `numba_parallel`: one launch at a time (`workqueue` allows
no concurrent launches, and two teams that each take every core only oversubscribe them), and
the first one starts numba's thread pool without touching torch's thread count. On the `omp`
layer the pool's start sets the runtime's thread count, which is torch's too: a rank given
OMP_NUM_THREADS=1 by the launcher ran torch on 2 threads after its first sampling.

A job (`gnndist.runtime.launch.run_job`: training, prediction) runs torch on OMP_NUM_THREADS threads
where it is set, else on one (`job_threads`), whichever was imported first; so do the trainers'
epochs and evaluations (`job_threads` as their decorator), and a temporal trainer's halves are
chosen for that count, also where a script builds the trainer and runs them itself. On a
machine of few cores, waking a second thread for every small operation costs more than it
brings (docs/benchmarks.md, "Measurements behind the code"). Local ranks (`--nproc W`) get
OMP_NUM_THREADS = cores / W from the launcher (torchrun gives 1 where it starts several per
host).

The second core of a one-rank temporal job is used by splitting work, not operations: each
batch runs as `step_halves()` halves of its events, the second in a process forked from the
rank, each with its own forward and backward pass (`gnndist.temporal.split_step`,
`gnndist.temporal.half_process`). A half's operations run on one thread of their own, so none
waits at a barrier for a thread that another job holds; the two meet a few times per step.
(Halves on two threads of one process waited for each other's GIL at each of their small
operations.)
"""
from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager
from typing import Iterator, Optional, Sequence

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


_LAUNCH = threading.Lock()
_pool_started = False


@contextmanager
def numba_parallel() -> Iterator[None]:
    """One numba parallel launch at a time, the first starting numba's pool without changing
    torch's thread count (see the module docstring). Held while the kernel runs."""
    global _pool_started
    with _LAUNCH:
        if not _pool_started:
            import numba
            import torch

            count = torch.get_num_threads()
            numba.get_num_threads()  # starts the pool
            torch.set_num_threads(count)
            _pool_started = True
        yield


def torch_threads_here() -> None:
    """Torch's thread count, as the process has it, in the calling thread's OpenMP setting, which
    is per thread: a thread gnndist starts runs this first, or its matrix products take every
    core whatever `torch.get_num_threads()` says (a product in a new thread runs on every core
    with the count at 1)."""
    import torch

    torch.set_num_threads(torch.get_num_threads())


def step_halves() -> int:
    """How many halves a one-process temporal training step runs its batch as
    (`gnndist.temporal.split_step`): 2 where a job runs torch on one thread (`job_thread_count`) and
    the process may use 2 cores or more (the second half's process runs torch on one thread
    too), else 1."""
    return 2 if job_thread_count() == 1 and len(os.sched_getaffinity(0)) >= 2 else 1


def rank_cores(cores: Sequence[int], local_rank: int, local_world: int) -> Optional[list[int]]:
    """The cores local rank `local_rank` of `local_world` runs on: its contiguous slice of
    `cores` (the launcher's), as its OMP_NUM_THREADS is its portion of them; None where there are
    fewer cores than ranks (the ranks then run on any of them, as the scheduler sees fit)."""
    n = len(cores)
    if n < local_world:
        return None
    return sorted(cores)[local_rank * n // local_world:(local_rank + 1) * n // local_world]


def pin(cores: Sequence[int]) -> None:
    """Every thread of this process, and every thread it starts later (threads inherit their
    creator's), on `cores` only. Local ranks on one machine run on disjoint cores: left to the
    scheduler, 2 ranks on 2 cores reached their per-step exchange further apart and trained
    slower (docs/benchmarks.md, "Measurements behind the code")."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:  # a thread that ended meanwhile
            pass


def job_thread_count() -> int:
    """Torch's threads while a job runs: OMP_NUM_THREADS (read when torch loaded, as torch's count
    has it) where it is set, else one."""
    import torch

    return torch.get_num_threads() if "OMP_NUM_THREADS" in os.environ else 1


@contextmanager
def job_threads() -> Iterator[None]:
    """Torch on `job_thread_count()` threads while a job runs in this process; the count before
    it afterwards. Also a decorator: the trainers' epochs and evaluations run as in a job where a
    script calls them itself, without `gnndist.runtime.launch.run_job`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(job_thread_count())
    try:
        yield
    finally:
        torch.set_num_threads(before)
