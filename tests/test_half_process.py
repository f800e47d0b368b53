"""The half process (`gnndist.temporal.half_process`): what it is sent and returns, against
the objects themselves; memory both processes see; its errors, its death and its end as the
rank sees them."""
import ctypes
import gc
import os
import signal
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pytest
import torch

from gnndist.errors import GnndistError
from gnndist.temporal.half_process import HalfProcess, in_shared_memory


@dataclass
class Parcel:
    rows: torch.Tensor
    host: np.ndarray
    empty: torch.Tensor
    none: Optional[torch.Tensor]
    label: str


def parcel(big: int = 1000) -> Parcel:
    g = torch.Generator().manual_seed(big)
    return Parcel(torch.randn(big, 7, generator=g), np.arange(big, dtype=np.int32) * 3, torch.zeros(0, 5, dtype=torch.long),
                  None, f"parcel {big}")


def same(a: Parcel, b: Parcel) -> None:
    assert torch.equal(a.rows, b.rows) and a.rows.dtype == b.rows.dtype
    assert isinstance(b.host, np.ndarray) and np.array_equal(a.host, b.host) and a.host.dtype == b.host.dtype
    assert b.empty.shape == a.empty.shape and b.empty.dtype == a.empty.dtype
    assert b.none is None and b.label == a.label


def echo(work, ready):
    ready()
    return work


@pytest.fixture
def process():
    made = []

    def make(run=echo, write=lambda: None, prepare=lambda work: work):
        made.append(HalfProcess(run, write, prepare))
        return made[-1]

    yield make
    for p in made:
        p.close()


STAGED = object()


def round_trip(p: HalfProcess, work):
    p.start_staged() if work is STAGED else p.start(work)
    p.wait_ready()
    return p.result()


def test_what_goes_there_comes_back_the_same_and_the_buffer_grows(process):
    p = process()
    for big in (10, 300_000, 10, 2_000_000):  # 8 and 56 MB of rows: the 1 MB buffers grow twice
        back = round_trip(p, [parcel(big), (parcel(big + 1), 5)])
        same(parcel(big), back[0])
        same(parcel(big + 1), back[1][0])
        assert back[1][1] == 5
    first = round_trip(p, parcel(10))
    round_trip(p, parcel(20))
    same(parcel(10), first)  # what `result` gave is a copy: the next message leaves it alone


def test_a_first_message_of_empty_tensors_needs_no_buffer(process):
    back = round_trip(process(), (torch.zeros(0, 3), np.zeros(0, np.int32), "label"))
    assert back[0].shape == (0, 3) and back[1].dtype == np.int32 and back[1].size == 0 and back[2] == "label"


def test_staged_work_runs_at_the_next_start(process):
    """Work staged ahead runs at `start_staged()` (also where staging it grew the buffer); a later
    `stage` replaces it; `start(work)` runs `work` and drops what was staged, after which
    `start_staged()` has nothing to run."""
    p = process()
    p.stage(parcel(10))
    same(parcel(10), round_trip(p, STAGED))
    p.stage(parcel(300_000))  # the 1 MB buffer grows
    same(parcel(300_000), round_trip(p, STAGED))
    p.stage(parcel(30))
    p.stage(parcel(40))
    same(parcel(40), round_trip(p, STAGED))
    p.stage(parcel(50))
    same(parcel(20), round_trip(p, parcel(20)))
    with pytest.raises(RuntimeError, match="no work is staged"):
        p.start_staged()


def slow_echo(work, ready):
    ready()
    time.sleep(0.2)
    return work


def test_what_a_run_was_given_stays_while_the_next_work_is_staged(process):
    """The next work staged (written to the buffer) while the process still runs the last: the
    run's work is untouched (the process copied it), and the staged work runs next."""
    p = process(slow_echo)
    p.start(parcel(10))
    p.wait_ready()
    p.stage(parcel(11))
    same(parcel(10), p.result())
    p.start_staged()
    p.wait_ready()
    same(parcel(11), p.result())


def test_both_processes_see_shared_tensors():
    table = in_shared_memory(torch.arange(6.0))
    seen = []

    def run(work, ready):
        ready()
        return table.clone()

    def write():
        table.mul_(10)

    p = HalfProcess(run, write)
    try:
        table.add_(1)  # after the fork: the process sees it
        assert torch.equal(round_trip(p, None), torch.arange(6.0) + 1)
        p.start_write()
        p.wait_written()
        seen.append(table.clone())
    finally:
        p.close()
    assert torch.equal(seen[0], (torch.arange(6.0) + 1) * 10)


def test_work_is_prepared_when_the_process_gets_it_after_what_it_wrote_before(process):
    """`prepare` runs on staged work when the process receives it, after the writes it was told
    to make before (the rank did not wait for them), and on work started at once; an error in
    preparing staged work is raised when that work is run, and the process serves on."""
    table, prepared = in_shared_memory(torch.zeros(3)), in_shared_memory(torch.zeros(1))

    def prepare(work):
        if work == "bad":
            raise GnndistError("cannot prepare")
        prepared.add_(1)
        return work, table.clone()

    def write():
        table.add_(1)

    p = process(write=write, prepare=prepare)
    work, seen = round_trip(p, "a")
    assert work == "a" and torch.equal(seen, torch.zeros(3)) and prepared.item() == 1
    p.start_write()
    p.stage("b")
    p.wait_written()
    deadline = time.monotonic() + 30
    while prepared.item() < 2 and time.monotonic() < deadline:  # prepared on receipt, before any start
        time.sleep(0.001)
    table.add_(10)  # after it was prepared: not seen
    work, seen = round_trip(p, STAGED)
    assert work == "b" and torch.equal(seen, torch.ones(3))
    p.stage("bad")
    p.start_staged()
    with pytest.raises(GnndistError, match="^cannot prepare$"):
        p.wait_ready()
    assert round_trip(p, "c")[0] == "c"


def test_an_error_there_is_raised_here_and_the_process_serves_on(process):
    def run(work, ready):
        if work == "user":
            raise GnndistError("--lr 5: too large")
        if work == "bug":
            return {}["missing"]
        ready()
        return work

    p = process(run)
    p.start("user")
    with pytest.raises(GnndistError, match=r"^--lr 5: too large$"):
        p.wait_ready()
    p.start("bug")
    with pytest.raises(RuntimeError, match=r"(?s)second half.*KeyError: 'missing'"):
        p.wait_ready()
    assert round_trip(p, "fine") == "fine"


def test_an_error_in_the_writes_is_raised_here_and_the_process_serves_on(process):
    writes = in_shared_memory(torch.zeros(1))

    def write():
        writes.add_(1)
        if writes.item() == 1:
            raise GnndistError("disk full")

    p = process(write=write)
    assert round_trip(p, 1) == 1
    p.start_write()
    with pytest.raises(GnndistError, match="^disk full$"):
        p.wait_written()
    assert round_trip(p, 2) == 2
    p.start_write()
    p.wait_written()
    assert writes.item() == 2


def test_a_killed_process_is_named_not_waited_for(process):
    p, q = process(lambda work, ready: time.sleep(60)), process()
    named = r"^the process running the second half of each step \(pid {}\) ended: killed by SIGKILL$"
    p.start("anything")
    os.kill(p.pid, signal.SIGKILL)
    with pytest.raises(GnndistError, match=named.format(p.pid)):
        p.wait_ready()
    os.kill(q.pid, signal.SIGKILL)
    time.sleep(0.2)
    with pytest.raises(GnndistError, match=named.format(q.pid)):  # found dead when sent to
        q.start("anything")
    r = process(write=lambda: time.sleep(60))
    assert round_trip(r, 3) == 3
    r.start_write()
    os.kill(r.pid, signal.SIGKILL)
    with pytest.raises(GnndistError, match=named.format(r.pid)):  # found dead while waited for
        r.wait_written()


def test_ctrl_c_is_the_ranks_and_close_ends_the_process(process):
    p = process()
    assert round_trip(p, 6) == 6
    status = open(f"/proc/{p.pid}/status").read()
    assert int(status.split("SigIgn:")[1].split()[0], 16) >> (signal.SIGINT - 1) & 1  # it ignores SIGINT
    os.kill(p.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole process group
    time.sleep(0.2)
    assert round_trip(p, 7) == 7
    p.close()
    with pytest.raises(ChildProcessError):
        os.waitpid(p.pid, os.WNOHANG)  # reaped


def test_the_process_runs_torch_on_one_thread_whatever_the_rank_runs(process):
    """OpenMP's teams do not survive a fork: the process never starts one, even where the rank
    ran its products on two threads before it was forked."""
    gomp = next(line.split()[-1] for line in open("/proc/self/maps") if "torch/lib/libgomp" in line)  # torch's runtime
    max_threads = ctypes.CDLL(gomp).omp_get_max_threads
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.randn(500, 500) @ torch.randn(500, 500)  # a team of two, here
        p = process(lambda work, ready: (ready(), torch.get_num_threads(), max_threads(),
                                         float((torch.ones(300, 300) @ torch.ones(300, 300))[0, 0]))[1:])
        assert round_trip(p, None) == (1, 1, 300.0)
    finally:
        torch.set_num_threads(threads)


def test_a_later_process_holds_no_end_of_an_earlier_ones_pipe(process):
    """Else closing the rank's end would not end the earlier process (it waits for its pipe to
    close): a trainer's half process outlived it while a second trainer's ran."""
    p, q = process(), process()
    mine = f"socket:[{os.fstat(p.conn.fileno()).st_ino}]"
    assert round_trip(q, 1) == 1  # q is past its start
    held = [os.readlink(f"/proc/{q.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{q.pid}/fd")]
    assert mine not in held
    p.close()
    with pytest.raises(ChildProcessError):
        os.waitpid(p.pid, os.WNOHANG)
    assert round_trip(q, 2) == 2


def collect(work, ready):
    ready()
    gc.collect()
    return os.getpid()


def test_the_process_never_frees_the_ranks_garbage(process, tmp_path):
    """What was garbage in the rank when the process was forked is the rank's to free: its
    destructors may reach what only the rank has (a TCP store's server, held by a traceback's
    reference cycle, joins its thread when it is freed: in the process, a thread that was never
    forked, and a SIGSEGV in the middle of a training step). A collection in the process leaves
    it alone; the rank frees it itself."""
    class Cycle:
        def __del__(self):
            with open(tmp_path / "freed", "a") as f:
                f.write(f"{os.getpid()}\n")

    gc.collect()
    gc.disable()  # as between two collections of the rank: the cycle is there when the process forks
    try:
        cycle = Cycle()
        cycle.self = cycle
        del cycle
        p = process(run=collect)
    finally:
        gc.enable()
    p.start("work")
    p.wait_ready()
    child = p.result()
    gc.collect()
    assert (tmp_path / "freed").read_text().split() == [str(os.getpid())] and child != os.getpid()
