"""A half of each step run in a process of its own, forked from the rank: how a one-process
temporal job uses its second core (`gnndist.temporal.split_step` cuts the batch).

Why a process and not a thread: a half's forward pass makes about 140 small torch calls, each
of which lets go of the GIL and takes it back. Two threads doing that wait for each other at
every call, where two processes run side by side as fast as one alone (the measurements:
docs/benchmarks.md, "Design measurements").

The process is forked when the first step needs it, after the parameters and the node state
have been moved to shared memory (`in_shared_memory`): both processes then read and write the same
tables, and the optimizer's in-place updates reach the half's process with no copy. Per step
the rank sends the half's events and neighbours and receives its results (the loss, the
scores) through a buffer of shared memory each way (`Channel`), and learns that the process
has read its half and made its writes from semaphores (`_Signals`); the trainer has the
half's gradients written to shared tensors of their own, which the rank sums from; the half's
state writes are made in its process, after the rank's own half's (time order). The next
step's half can be sent while this one runs (`stage`; the process copies what it receives, so
the rank may overwrite the buffer): the process prepares it as soon as it gets it (the trainer
reads its state rows and neighbour contexts then, while the rank sums the gradients and steps
the optimizer) and starts it as soon as the rank says (`start_staged`), with the parameters
updated. The process ignores Ctrl-C (the rank handles it) and ends when the rank closes the
pipe or ends. Its collector never frees what it inherited (`gc.freeze` at once): garbage the rank
had at the fork is the rank's to free, and a destructor run in the process may reach what the
rank alone has (a TCP store's server, kept by a traceback's reference cycle in a process that
had run a failed launch, joined a thread that was never forked: SIGSEGV in a training step).
"""
from __future__ import annotations

import gc
import math
import mmap
import multiprocessing
import os
import signal
import time
import traceback
import weakref
from dataclasses import fields, is_dataclass, replace
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler, recv_handle, send_handle
from typing import Any, Callable, Optional

import numpy as np
import torch
from torch import Tensor

from gnndist.errors import GnndistError

ALIGN = 64
_RUNNING: "weakref.WeakSet[HalfProcess]" = weakref.WeakSet()  # of this process


def in_shared_memory(t: Tensor) -> Tensor:
    """A copy of `t` in anonymous shared memory, which a process forked afterwards shares (not
    in /dev/shm, whose size containers limit)."""
    if t.numel() == 0:
        return t.clone()
    out = torch.frombuffer(mmap.mmap(-1, t.numel() * t.element_size()), dtype=t.dtype, count=t.numel())
    return out.view(t.shape).copy_(t)


class Placement:
    """Where a step's second half runs: in the half process, or here after the first half. Both
    run the same operations on one thread, so the results are the same either way (bit for bit);
    only the time differs. A step takes the way of the lower time per event, and every `PROBE`
    steps the other, so that a change in what else runs on the machine is noticed. The way in
    use follows its times slowly (a moving average: one slow step does not move the job to the
    slower way for `PROBE` steps); a probe's time replaces the other way's. Why: beside another
    job that takes one of two cores, the two processes share the other core and wait for each
    other at every meeting (docs/benchmarks.md, "Design measurements")."""

    PROBE = 50
    FOLLOW = 0.2  # weight of a step's time in the way in use's average

    def __init__(self) -> None:
        self.cost: dict[bool, Optional[float]] = {True: None, False: None}  # seconds per event, by `remote`
        self.steps = 0

    def remote(self) -> bool:
        """Whether the next step runs its second half in the half process."""
        self.steps += 1
        for way in (True, False):
            if self.cost[way] is None:
                return way
        return self._in_use() != (self.steps % self.PROBE == 0)

    def took(self, remote: bool, seconds: float, events: int) -> None:
        """A step run the way `remote` took `seconds` for `events` events (the next step's way may
        have been chosen meanwhile: a step of the way not in use was a probe)."""
        now, before = seconds / max(events, 1), self.cost[remote]
        probe = before is None or self.cost[not remote] is None or remote != self._in_use()
        self.cost[remote] = now if probe else (1 - self.FOLLOW) * before + self.FOLLOW * now

    def _in_use(self) -> bool:
        """The way of the lower time per event (both known)."""
        return self.cost[True] <= self.cost[False]


class _Hole:
    """Where a tensor or array was in an object sent through a `Channel` (its data goes apart);
    pickled as a reference to the one `_HOLE`."""

    def __reduce__(self) -> str:
        return "_HOLE"


_HOLE = _Hole()


class Channel:
    """One direction of a pipe for objects holding tensors and arrays (also within dataclasses,
    lists and tuples): their data goes through a buffer of shared memory, the rest is pickled.
    The buffer grows as needed (a new memfd, whose descriptor is passed on). `receive` copies
    out of the buffer, which the sender may overwrite with its next message."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.buffer: Optional[mmap.mmap] = None
        self.size = 0

    @staticmethod
    def frame(obj: Any) -> bytes:
        """`obj` (holding no tensor or array) as `send_frame` sends it: made once, sent often."""
        return bytes(ForkingPickler.dumps(("data", (obj, None))))

    def send_frame(self, frame: bytes) -> None:
        self.conn.send_bytes(frame)

    def send(self, obj: Any) -> None:
        leaves: list[Any] = []
        outline = _mapped(obj, lambda x: isinstance(x, (Tensor, np.ndarray)), lambda x: leaves.append(x) or _HOLE)
        if not leaves:
            self.send_frame(self.frame(outline))
            return
        raws, specs, end = [], [], 0  # each leaf's bytes and (offset, dtype, shape, is an array)
        for x in leaves:
            numpy = isinstance(x, np.ndarray)
            a = np.ascontiguousarray(x) if numpy else x.detach().contiguous().numpy()
            raws.append(a.reshape(-1).view(np.uint8))
            specs.append((end, a.dtype.str, a.shape, numpy))
            end += -(-raws[-1].size // ALIGN) * ALIGN
        if end > self.size:
            self.size = max(end, 2 * self.size, 1 << 20)
            fd = os.memfd_create("gnndist-half")
            try:
                os.ftruncate(fd, self.size)
                self.buffer = mmap.mmap(fd, self.size)
                self.conn.send(("buffer", self.size))
                send_handle(self.conn, fd, None)
            finally:
                os.close(fd)
        if end:  # else all are empty (and there may be no buffer yet)
            view = np.frombuffer(self.buffer, np.uint8)
            for (offset, *_), raw in zip(specs, raws):
                view[offset:offset + raw.size] = raw
        self.conn.send(("data", (outline, (specs, end))))

    def receive(self) -> Any:
        while True:
            kind, value = self.conn.recv()
            if kind == "data":
                return value[0] if value[1] is None else self._take(value[0], *value[1])
            fd = recv_handle(self.conn)
            try:
                self.buffer, self.size = mmap.mmap(fd, value), value
            finally:
                os.close(fd)

    def _take(self, outline: Any, specs: list[tuple[int, str, tuple, bool]], end: int) -> Any:
        """`outline` with its holes filled by the tensors and arrays of `specs`: views of one copy
        of the buffer's first `end` bytes (one copy, not one per tensor)."""
        host = np.frombuffer(self.buffer, np.uint8, end).copy() if end else np.empty(0, np.uint8)
        leaves = []
        for offset, dtype, shape, numpy in specs:
            dtype = np.dtype(dtype)
            a = host[offset:offset + math.prod(shape) * dtype.itemsize].view(dtype).reshape(shape)
            leaves.append(a if numpy else torch.from_numpy(a))
        taken = iter(leaves)
        return _mapped(outline, lambda x: x is _HOLE, lambda _: next(taken))


def _mapped(obj: Any, is_leaf: Callable[[Any], bool], fn: Callable[[Any], Any]) -> Any:
    """`obj` with each leaf (`is_leaf`) replaced by `fn(leaf)`, within dataclasses, lists and tuples."""
    if obj is None or isinstance(obj, (str, int, float)):  # most fields: no need to ask further
        return obj
    if is_leaf(obj):
        return fn(obj)
    if is_dataclass(obj):
        return replace(obj, **{f.name: _mapped(getattr(obj, f.name), is_leaf, fn) for f in fields(obj)})
    if isinstance(obj, (list, tuple)):
        return type(obj)(_mapped(x, is_leaf, fn) for x in obj)
    return obj


class _Signals:
    """What the process tells the rank without a message: that it has read what it was given
    (`ready`) and made its writes (`written`), each a semaphore, which the rank takes without a
    system call where it was given before (the common case; as messages, each cost the rank far
    more CPU time per step), and its CPU time as of then (`cpu`). Its
    errors, and its end, come through the pipe."""

    def __init__(self) -> None:
        fork = multiprocessing.get_context("fork")
        self.ready, self.written = fork.Semaphore(0), fork.Semaphore(0)
        self.cpu = np.frombuffer(mmap.mmap(-1, 8), np.float64)


class HalfProcess:
    """A forked process that runs `run(prepare(work), ready)` on what `start(work)` sends, or on
    what `stage(work)` sent before when `start_staged()` says (`run` calls `ready()` once it has
    read what the rank may then overwrite: `wait_ready`), and returns its result through
    `result()`, then `write()` when told (`start_write`, `wait_written`). Staged work is prepared
    as soon as the process gets to it, after what it ran and wrote before. Tensors that both
    processes must see are to be in shared memory (`in_shared_memory`) before it is created."""

    def __init__(self, run: Callable[[Any, Callable[[], None]], Any], write: Callable[[], None],
                 prepare: Callable[[Any], Any] = lambda work: work) -> None:
        signals = _Signals()
        ours, theirs = Pipe()
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # a Ctrl-C now waits for the rank
        try:
            pid = os.fork()
        except BaseException:
            ours.close()
            theirs.close()
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            raise
        if pid == 0:  # the half's process: serves until the rank closes the pipe, never returns
            gc.freeze()  # what it inherited is the rank's to free (see the module docstring)
            code = 1
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the rank's to handle
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
                for conn in [ours] + [p.conn for p in _RUNNING]:  # the rank's ends: closing them ends those processes
                    conn.close()
                code = _work_loop(theirs, signals, run, write, prepare)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        theirs.close()
        self.pid, self.conn, self._signals = pid, ours, signals
        self.staged = False  # whether work is staged for `start_staged()`
        self.inbox, self.outbox = Channel(ours), Channel(ours)
        self._close = weakref.finalize(self, _stop, ours, pid)
        _RUNNING.add(self)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # once it is sure to be reaped

    def stage(self, work: Any) -> None:
        """Send `work` now, to be run at `start_staged()`. The process copies it out of the buffer
        only when it gets to it, after the work it runs: work sent until then (`start`, `stage`)
        may overwrite it, and replaces it."""
        self._send(("stage", work))
        self.staged = True

    def start(self, work: Any) -> None:
        """Run `work` (dropping what is staged)."""
        self.staged = False
        self._send(("run", (False, work)))

    def start_staged(self) -> None:
        """Run the work staged last."""
        if not self.staged:
            raise RuntimeError("no work is staged for the half process")
        self.staged = False
        self._send(_RUN_STAGED)

    @property
    def cpu_seconds(self) -> float:
        """The process's CPU time, as of its last result or writes."""
        return float(self._signals.cpu[0])

    def wait_ready(self) -> None:
        self._wait(self._signals.ready, "ready")

    def result(self) -> Any:
        """What `run` returned for the work last started (copies)."""
        return self._expect("done")

    def start_write(self) -> None:
        self._send(_WRITE)

    def wait_written(self) -> None:
        self._wait(self._signals.written, "written")

    def close(self) -> None:
        self._close()

    def _send(self, message: tuple[str, Any] | bytes) -> None:
        """Send (kind, value), or a message made before (`Channel.frame`)."""
        try:
            if isinstance(message, bytes):
                self.outbox.send_frame(message)
            else:
                self.outbox.send(message)
        except OSError:
            raise self._ended() from None

    def _ended(self) -> GnndistError:
        return GnndistError(f"the process running the second half of each step (pid {self.pid}) ended: "
                            f"{_how_it_ended(self.pid)}")

    def _wait(self, sem: Any, what: str) -> None:
        """Take `sem` (of `_Signals`), or raise what the process sent instead (an error) or its end."""
        while not sem.acquire(timeout=0.05):
            if self.conn.poll() and not sem.acquire(False):  # the signal is given before any later message
                self._expect(what)

    def _expect(self, what: str) -> Any:
        try:
            kind, value = self.inbox.receive()
        except (EOFError, OSError):
            raise self._ended() from None
        if kind == "error":
            gnndist, text = value
            if gnndist:
                raise GnndistError(text)
            raise RuntimeError(f"in the process running the second half of each step:\n{text}")
        if kind != what:
            raise RuntimeError(f"the half's process sent {kind!r} where {what!r} was due")
        return value


_RUN_STAGED, _WRITE = Channel.frame(("run", (True, None))), Channel.frame(("write", None))


def _work_loop(conn: Connection, signals: _Signals, run: Callable[[Any, Callable[[], None]], Any],
           write: Callable[[], None], prepare: Callable[[Any], Any]) -> int:
    """The half process's loop; its exit status."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    torch.set_num_threads(1)  # never an OpenMP team: the rank's, if it had one, did not survive the fork
    inbox, outbox = Channel(conn), Channel(conn)
    gone = (EOFError, BrokenPipeError, ConnectionResetError)  # the rank closed the pipe, or ended
    staged = None
    while True:
        try:
            kind, work = inbox.receive()  # copies: the rank may stage the next step's half meanwhile
            if kind == "stage":
                try:
                    staged = prepare(work)
                except Exception as e:  # raised when the staged work is to run
                    staged = e
                continue
            try:
                if kind == "run":
                    work, staged = staged if work[0] else prepare(work[1]), None
                    if isinstance(work, Exception):
                        raise work
                    reply = ("done", run(work, signals.ready.release))
                    signals.cpu[0] = time.process_time()
                else:
                    write()
                    signals.cpu[0] = time.process_time()
                    signals.written.release()
                    continue
            except gone:
                raise
            except Exception as e:  # reported to the rank, which raises it
                reply = ("error", (isinstance(e, GnndistError), str(e) if isinstance(e, GnndistError)
                                   else traceback.format_exc()))
            outbox.send(reply)
        except gone:
            return 0


def _stop(conn: Connection, pid: int) -> None:
    """Close the pipe, which ends the process; kill it if it has not ended within 10 s."""
    conn.close()
    try:
        for _ in range(1000):
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ChildProcessError, ProcessLookupError):
        pass


def _how_it_ended(pid: int) -> str:
    """How the process `pid`, whose pipe closed, ended (waiting up to a second for it to go)."""
    for _ in range(100):
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return "reaped elsewhere"
        if done:
            if os.WIFSIGNALED(status):
                return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
            return f"exit status {os.WEXITSTATUS(status)}"
        time.sleep(0.01)
    return "it closed its pipe"
