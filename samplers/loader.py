"""Prefetching: compute batch i+1 (sample, fetch features) in a background thread while
the caller trains on batch i.

Collectives: `fn` may run the samplers' and feature stores' exchanges. Those run on their
own gloo group (`sampler_group()`), so they do not interleave with what the main thread runs
on the default group meanwhile (gradient all-reduce). While a loader is being iterated, the
main thread must not use any sampler or feature store itself (the group is the prefetch
thread's alone), and every rank must iterate the same number of items (SPMD).
numba kernels run in that thread too; the `omp` and `tbb` threading layers allow that while
other threads run kernels, numba's fallback `workqueue` layer does not.
"""
from __future__ import annotations

import os
import queue
import threading
from typing import Any, Callable, Iterable, Iterator

from gnndist.runtime.threads import torch_threads_here

_DONE = object()


class PrefetchLoader:
    """Yields `fn(w)` for each `w` in `work`, in order. With `enabled`, a background thread
    runs one item ahead; with `enabled=False` everything runs inline (debug). With `idle` (Linux)
    the thread runs at the lowest priority (SCHED_IDLE): on a core the caller keeps busy it runs
    only while the caller waits (for other ranks, or for it), never slowing the caller down."""

    def __init__(self, work: Iterable[Any], fn: Callable[[Any], Any], enabled: bool = True, idle: bool = False) -> None:
        self.work, self.fn, self.enabled, self.idle = work, fn, enabled, idle

    def __iter__(self) -> Iterator[Any]:
        if not self.enabled:
            for w in self.work:
                yield self.fn(w)
            return
        q: queue.Queue = queue.Queue(maxsize=1)
        stop = threading.Event()

        def produce() -> None:
            torch_threads_here()
            if self.idle and hasattr(os, "SCHED_IDLE"):
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            try:
                for w in self.work:
                    if stop.is_set():
                        return
                    q.put((True, self.fn(w)))
            except BaseException as e:  # handed to the consumer, raised there
                q.put((False, e))
                return
            q.put((True, _DONE))

        thread = threading.Thread(target=produce, name="gnndist-prefetch", daemon=True)
        thread.start()
        try:
            while True:
                ok, item = q.get()
                if not ok:
                    raise item
                if item is _DONE:
                    return
                yield item
        finally:
            stop.set()
            while thread.is_alive():  # unblock a producer waiting on a full queue
                try:
                    q.get(timeout=0.05)
                except queue.Empty:
                    pass
            thread.join()
