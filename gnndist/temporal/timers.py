"""Where a training step's time goes: seconds per phase, timed on the host or by CUDA events."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

import torch

PHASES = ("sample", "fetch", "compute", "sync")


class Timers:
    """Seconds per phase: sample (neighbour sampling, with the sampled events' edge features when
    they come with the samples), fetch (state rows, and edge features fetched behind a cache),
    sync (gradient all-reduce, state writes, served embeddings); compute is the rest. On a GPU
    a phase is timed by CUDA events at its ends, on the device's stream: the time it adds after
    the work queued before it, read when `seconds` is asked for (one wait for the device, at the
    end of an epoch, instead of two per phase). Work a thread does beside the steps (planning
    ahead: `LinkTrainer.steps`) runs `untimed`: it is no phase of the step; the step's wait for
    it is."""

    def __init__(self, device: torch.device = torch.device("cpu")) -> None:
        self.device, self._untimed = device, threading.local()
        self.reset()

    def reset(self) -> None:
        self._seconds = dict.fromkeys(PHASES, 0.0)
        self._events: list[tuple[str, Any, Any]] = []  # (phase, start, end) CUDA events not yet read

    def wait(self) -> None:
        """Wait for the device's queued work (nothing on the CPU)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @property
    def seconds(self) -> dict[str, float]:
        if self._events:
            self._events[-1][2].synchronize()
            for name, start, end in self._events:
                self._seconds[name] += start.elapsed_time(end) / 1000
            self._events.clear()
        return self._seconds

    @contextmanager
    def untimed(self) -> Iterator[None]:
        """Phases entered within the block, in this thread, are not timed."""
        self._untimed.on = True
        try:
            yield
        finally:
            self._untimed.on = False

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if getattr(self._untimed, "on", False):
            yield
            return
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                yield
            finally:
                end.record()
                self._events.append((name, start, end))
            return
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._seconds[name] += time.perf_counter() - t0
