"""The distributed runtime on 2-3 local gloo ranks: exchanges, gathers, and failures that end
in one line naming the rank at fault (not the one that noticed) instead of a hang."""
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace

import pytest
import torch

import gnndist
from gnndist import GnndistError
from gnndist.runtime import dist, threads
from gnndist.runtime import launch as glaunch
from gnndist.cli import main
from gnndist.datasets import load
from gnndist.partition import open_part, read_store_meta
from gnndist.runtime.launch import check_same_job, launch
from gnndist.predict import SavedModel
from gnndist.partition import partition_graph


@pytest.fixture(autouse=True)
def short_timeout(monkeypatch):
    monkeypatch.setenv("GNNDIST_TIMEOUT", "5")


def exchange_worker():
    dist.setup("cpu")
    r, w = dist.rank(), dist.world_size()
    # rank r sends to rank p a (r + p)-row block whose entries encode (sender, receiver)
    got = dist.exchange([torch.full((r + p, 2), 10.0 * r + p) for p in range(w)])
    gathered = dist.all_gather_varsize(torch.arange(r + 1))
    # under way while a collective after it runs: the same rows
    under_way = dist.start_exchange([torch.full((r + p, 2), 10.0 * r + p) for p in range(w)],
                                    recv_sizes=[s + r for s in range(w)])
    agreed = dist.agree_max(7 * r)
    assert [g.tolist() for g in under_way.wait()] == [g.tolist() for g in got]
    return [g.tolist() for g in got], [g.tolist() for g in gathered], agreed


def test_exchange_gather_and_agree_on_three_ranks():
    out = launch(3, exchange_worker)
    for r, (got, gathered, agreed) in enumerate(out):
        assert got == [[[10.0 * s + r] * 2] * (s + r) for s in range(3)]
        assert gathered == [list(range(s + 1)) for s in range(3)]
        assert agreed == 14


def pair_sum_worker():
    dist.setup("cpu")
    r = dist.rank()
    x = torch.tensor([[1.5, -2.0], [3.25, 0.1]]) * (r + 1) + r
    m = torch.tensor([r, 5 - r])
    k0 = dist.collectives_entered()
    dist.all_reduce(x)
    dist.all_reduce(m, "max")
    return x.tolist(), m.tolist(), dist.collectives_entered() - k0


def test_two_gloo_ranks_sum_in_one_swap():
    """Two gloo ranks sum by swapping their tensors (one all-to-all): both get the same sum."""
    a, b = (torch.tensor([[1.5, -2.0], [3.25, 0.1]]) * (r + 1) + r for r in range(2))
    for x, m, collectives in launch(2, pair_sum_worker):
        assert x == (a + b).tolist() and m == [1, 5] and collectives == 2


def carried_sum_worker(carry: bool) -> list:
    """Per case (an exchange of int64 rows with known or unknown sizes, a gather of uint8 rows,
    no exchange at all): the rows received, the summed gradients and extra, the collectives."""
    dist.setup("cpu")
    r, w = dist.rank(), dist.world_size()
    torch.manual_seed(r)
    lin = torch.nn.Linear(3, 5)
    unused = torch.nn.Parameter(torch.zeros(2))  # no gradient on any rank: keeps none
    params = [*lin.parameters(), unused]
    cases = {"exchange": lambda: dist.exchange([torch.full((r + p + 1, 3), 10 * r + p) for p in range(w)]),
             "planned": lambda: dist.exchange([torch.full((p + 1, 3), 10 * r + p) for p in range(w)],
                                              recv_sizes=[r + 1] * w),
             "gather": lambda: dist.all_gather_varsize(torch.full((r + 2, 5), r, dtype=torch.uint8),
                                                       sizes=[q + 2 for q in range(w)]),
             "none": lambda: []}
    out = []
    for name, make in cases.items():
        lin.zero_grad()
        (lin(torch.randn(4, 3)) ** 2).sum().backward()
        s = dist.GradientSum(params, torch.tensor([float(r + 1)]))
        k0 = dist.collectives_entered()
        with dist.carrying(s) if carry else contextlib.nullcontext():
            got = make()
        extra = s.result()
        out.append((name, [g.tolist() for g in got], [None if p.grad is None else p.grad.tolist() for p in params],
                    extra.tolist(), dist.collectives_entered() - k0))
    return out


@pytest.mark.parametrize("w", [2, 3])
def test_a_state_write_exchange_carries_the_gradient_sum_of_two_ranks(w):
    """Inside `carrying`, the first exchange or gather on the default group of two gloo ranks
    also sums the gradients: the same rows and sums as apart, in one collective fewer; with
    three ranks, or with no exchange in the block, the sum runs apart."""
    apart, carried = launch(w, carried_sum_worker, False), launch(w, carried_sum_worker, True)
    for r in range(w):
        for (name, rows, grads, extra, k_apart), (_, rows_c, grads_c, extra_c, k_carried) in zip(apart[r], carried[r]):
            assert rows_c == rows and grads_c == grads and extra_c == extra == [w * (w + 1) / 2], (name, r)
            assert grads[-1] is None  # no rank had a gradient for it
            assert k_carried == k_apart - (w == 2 and name != "none"), (name, k_apart, k_carried)


def affinity_worker() -> dict:
    """The cores this rank's threads may run on: each thread it has, and one it starts now."""
    dist.setup("cpu")
    try:
        started = {}
        t = threading.Thread(target=lambda: started.update(cores=os.sched_getaffinity(0)))
        t.start(), t.join()
        tasks = [os.sched_getaffinity(int(tid)) for tid in os.listdir("/proc/self/task")]
        return {"tasks": tasks, "started": started["cores"]}
    finally:
        dist.teardown()


@pytest.mark.parametrize("w", [2, 3])
def test_local_ranks_run_on_disjoint_slices_of_the_cores(w):
    """Every thread of each local rank, those started later too, on its own slice of the
    launcher's cores; with fewer cores than ranks, on all of them."""
    cores = sorted(os.sched_getaffinity(0))
    slices = [threads.rank_cores(cores, r, w) for r in range(w)]
    if len(cores) >= w:
        assert sorted(sum(slices, [])) == cores and all(slices)  # disjoint, every core used
    else:
        assert slices == [None] * w
    for r, got in enumerate(launch(w, affinity_worker)):
        want = set(cores if slices[r] is None else slices[r])
        assert got["started"] == want and all(t == want for t in got["tasks"]), (r, got)


def native_threads() -> int:
    """This process's threads that Python did not start (gloo's workers among them)."""
    return len(os.listdir("/proc/self/task")) - threading.active_count()


def teardown_worker() -> tuple:
    before = native_threads()
    dist.setup("cpu")
    dist.exchange([torch.ones(3) for _ in range(2)])
    dist.exchange([torch.ones(3) for _ in range(2)], group=dist.host_group("samplers"))
    joined = native_threads()
    dist.teardown()
    return before, joined, native_threads()


def test_teardown_ends_the_groups_worker_threads_before_the_interpreter_exits():
    """A gloo worker still alive when the interpreter finalizes can abort the process as it drops
    a finished collective's tensors; teardown must leave no group thread behind."""
    for before, joined, after in launch(2, teardown_worker):
        assert joined > before  # the groups' threads are seen
        assert after == before


def test_an_entry_put_by_one_rank_is_read_at_once_by_another(monkeypatch):
    """What a rank puts in the job's store is there when `put` returns (a store's own `set`
    returns before the store has it: without the round trip, from 2 to about 1,000 of these 2,000
    reads missed their entry here, 2026-12-04)."""
    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    here = dist.Host("test", "127.0.0.1", None)
    writer, reader = dist.Heartbeat(0, 2, here), dist.Heartbeat(1, 2, here)
    try:
        missed = [i for i in range(2000) if (writer.put(f"entry{i}", "x"), reader.get(f"entry{i}", 0))[1] != "x"]
        assert missed == []
    finally:
        writer.close()
        reader.close()


def failing_job_worker(store: str) -> tuple:
    def rank_fn(source, *args):
        dist.exchange([torch.ones(3) for _ in range(2)])
        raise GnndistError("stops here")

    before = native_threads()
    with pytest.raises(GnndistError, match="stops here"):
        glaunch.run_job(store, 2, glaunch.Split("static", "metis", ()), rank_fn, Cfg())
    return before, native_threads()


def test_a_rank_that_fails_also_ends_its_groups_worker_threads(tmp_path):
    partition_graph(load("synthetic-static", num_nodes=200, num_edges=800, seed=1), 2, out=tmp_path / "s")
    for before, after in launch(2, failing_job_worker, str(tmp_path / "s")):
        assert after == before


SCRIPT = """import gnndist
from gnndist.datasets import DataSource
data, cfg = DataSource("synthetic-temporal", options={"num_nodes": 40, "num_events": 400}), gnndist.LinkConfig(
    epochs=1, memory_dim=8, quiet=True)
gnndist.train_link(data, cfg)
print("trained in one process")
gnndist.train_link(data, cfg, nproc=2)
"""


@pytest.mark.parametrize("guarded", [False, True])
def test_a_script_without_a_main_guard_is_told_to_add_one(guarded, tmp_path):
    """Ranks start by spawning, which imports the calling script again: unguarded, each rank
    would run its top-level calls again (and the job fail as ranks try to start ranks); such a
    rank stops at the first gnndist call and the job fails with one line saying what to do."""
    body = SCRIPT if not guarded else "if __name__ == '__main__':\n" + "".join(
        "    " + line + "\n" for line in SCRIPT.splitlines())
    (tmp_path / "job.py").write_text(body)
    env = {**os.environ, "GNNDIST_CACHE": str(tmp_path / "cache")}
    p = subprocess.run([sys.executable, "job.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.stdout.count("trained in one process") == 1, p.stdout  # by this process only
    if guarded:
        assert p.returncode == 0, p.stderr[-2000:]
        return
    assert p.returncode != 0
    assert p.stderr.strip().splitlines()[-1] == (
        'gnndist.errors.GnndistError: the script calling gnndist runs again in each rank gnndist starts: '
        'put its calls under `if __name__ == "__main__":`'), p.stderr[-2000:]


def single_process_is_identity():
    assert dist.world_size() == 1
    x = torch.arange(4)
    return dist.exchange([x])[0] is x and dist.all_gather_varsize(x)[0] is x and dist.agree_max(3) == 3


def test_one_process_world_needs_no_group():
    assert single_process_is_identity()


def failing_worker():
    dist.setup("cpu")
    if dist.rank() == 1:
        raise GnndistError("partition 1 does not match")
    dist.agree_max(1)


def test_a_failing_rank_is_named_in_one_line():
    t0 = time.time()
    with pytest.raises(GnndistError) as e:
        launch(2, failing_worker)
    assert str(e.value) == "rank 1: partition 1 does not match"
    assert time.time() - t0 < 30


def stalling_worker():
    dist.setup("cpu")
    if dist.rank() == 1:
        with dist.busy("partitioning into 2 parts"):
            time.sleep(60)
    dist.agree_max(1)


def test_a_stalled_rank_is_named_not_the_one_that_noticed():
    t0 = time.time()
    with pytest.raises(GnndistError, match=r"^rank 1 \(host [^)]*\) stalled: it is alive but has not joined "
                                           r"all_reduce\(max\), while partitioning into 2 parts, which rank 0 gave "
                                           r"up on after 5s"):
        launch(2, stalling_worker)
    assert time.time() - t0 < 40


def signalled_worker(sig: int, stamp: str):
    """Rank 1 sends itself `sig` once both ranks are in; rank 0 then waits in a collective."""
    dist.setup("cpu")
    dist.agree_max(0)
    if dist.rank() == 1:
        with open(stamp, "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), sig)
    dist.agree_max(1)


@pytest.mark.parametrize("sig,cause,within", [
    (signal.SIGKILL, "is gone: killed by SIGKILL", 10),
    # stopped: rank 0's collective times out (5 s), its heartbeat is seen to have stopped (5 s);
    # torch's launcher alone would then wait 30 s more for the stopped rank
    (signal.SIGSTOP, "is gone: no heartbeat for 5s (rank 0 noticed in all_reduce(max))", 25),
])
def test_a_lost_rank_is_named_and_launch_returns_soon_after(sig, cause, within, tmp_path):
    stamp = tmp_path / "signalled"
    with pytest.raises(GnndistError) as e:
        launch(2, signalled_worker, sig, str(stamp))
    took = time.time() - float(stamp.read_text())
    assert str(e.value).startswith("rank 1 (host ") and str(e.value).endswith(cause), str(e.value)
    assert took < within


def two_stopped_worker():
    """Ranks 1 and 2 stop themselves once all are in; rank 0 then waits in a collective."""
    dist.setup("cpu")
    dist.agree_max(0)
    if dist.rank() > 0:
        os.kill(os.getpid(), signal.SIGSTOP)
    dist.agree_max(1)


def test_ranks_lost_together_are_named_together():
    """Which of two silent ranks went first cannot be told (a host's launcher stops its other
    ranks at once): both are named, neither as the one at fault."""
    with pytest.raises(GnndistError) as e:
        launch(3, two_stopped_worker)
    assert re.fullmatch(r"ranks 1, 2 \(host [^)]*\) are gone: no heartbeat for 5s \(rank 0 noticed in "
                        r"all_reduce\(max\)\)", str(e.value)), str(e.value)


def posting_worker():
    """Rank 1 leaves its own error in the store and lingers; rank 0's collective times out."""
    dist.setup("cpu")
    dist.agree_max(0)
    if dist.rank() == 1:
        dist.post_failure(GnndistError("part1/x.npy is missing"))
        time.sleep(8)  # past rank 0's timeout (5 s)
        return None
    try:
        dist.agree_max(1)
    except dist.PeerFailure as e:
        return str(e)


def test_survivors_name_the_rank_that_failed_and_its_own_reason():
    msg = launch(2, posting_worker)[0]
    assert msg.startswith("rank 1 (host ") and msg.endswith(") failed: part1/x.npy is missing"), msg


@pytest.mark.parametrize("value", ["abc", "nan", "inf", "", "0", "-1", "1e9"])
def test_a_bad_timeout_is_refused_before_anything_starts(value, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GNNDIST_TIMEOUT", value)
    monkeypatch.setenv("GNNDIST_CACHE", str(tmp_path / "cache"))
    assert main(["train", "synthetic-static", "--num-nodes", "100", "--num-edges", "300", "--nproc", "2"]) == 2
    err = capsys.readouterr().err
    assert err == f"gnndist train: error: GNNDIST_TIMEOUT must be a number of seconds from 1 to 86400, got {value!r}\n"
    assert not (tmp_path / "cache").exists()  # nothing partitioned, no rank started


@pytest.mark.parametrize("gpus", [0, 1])
def test_more_ranks_than_gpus_is_refused_before_anything_starts(gpus, tmp_path, monkeypatch, capsys):
    """One rank per GPU (NCCL refuses two ranks on one GPU); told before the data is split."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setenv("GNNDIST_CACHE", str(tmp_path / "cache"))
    assert main(["train", "synthetic-temporal", "--num-events", "500", "--nproc", "2", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err == ("gnndist train: error: " + ("--device cuda given but CUDA is not available" if gpus == 0 else
                   "--device cuda runs one rank per GPU, and this host has 1: local rank 1 has none "
                   "(run at most 1 rank(s) per host)") + "\n")
    assert not (tmp_path / "cache").exists()
    if gpus:
        assert dist.rank_gpu(0) == torch.device("cuda", 0)


def test_the_interface_holding_each_address_is_found():
    """Against `ip -o addr`: every (primary) address maps to the interface that lists it."""
    if shutil.which("ip") is None:
        pytest.skip("needs the `ip` command (iproute2) as the reference")
    seen = set()
    for line in subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True).stdout.splitlines():
        cols = line.split()
        name, addr = cols[1].split("@")[0], cols[3].split("/")[0]
        if addr in seen or "secondary" in cols:
            continue
        seen.add(addr)
        assert dist.interface_of(addr) == name, line
    assert dist.route_to("127.0.0.1") == "127.0.0.1"


@dataclass
class Cfg:
    lr: float = 0.01
    quiet: bool = False


def same_job_worker(stores):
    """Rank 1 differs in one thing per case; every rank reports what the check said."""
    dist.setup("cpu")
    out, version = [], glaunch.__version__
    for case in ("same", "quiet", "version", "store", "config", "paths", "resume", "history", "params"):
        store, cfg, ckpt, resume = stores[0], Cfg(), "ck", False
        saved = SavedModel("ck", "link", {"lr": 0.01}, {"w": torch.ones(2)}, 3, 2, [{"epoch": 1, "time_s": 1.0}])
        if dist.rank() == 1:
            store = stores[1] if case == "store" else store
            cfg = Cfg(lr=0.02) if case == "config" else Cfg(quiet=True) if case == "quiet" else cfg
            glaunch.__version__ = "9.9" if case == "version" else version
            ckpt = "elsewhere/ck" if case == "paths" else ckpt
            resume = case == "resume"
            if case in ("history", "paths"):  # its own folder's path and timings: the same model
                saved = replace(saved, path="elsewhere/ck", history=[{"epoch": 1, "time_s": 1.5}])
            if case == "params":
                saved = replace(saved, params={"w": torch.full((2,), 2.0)})
        try:
            check_same_job(read_store_meta(store), (cfg, saved, glaunch.Outputs("m.json" if dist.rank() == 0 else None, ckpt, resume)))
            out.append(None)
        except GnndistError as e:
            out.append(str(e))
        dist.agree_max(0)  # both have read the others' entries before the next case posts
    return out


def test_every_rank_names_the_rank_whose_job_differs(tmp_path):
    g = load("synthetic-static", num_nodes=200, num_edges=800, seed=1)
    stores = []
    for method in ("metis", "random"):
        partition_graph(g, 2, method=method, out=tmp_path / method)
        stores.append(str(tmp_path / method))
    got = launch(2, same_job_worker, stores)
    assert got[0] == got[1]  # the same line on every rank
    same, quiet, version, store, config, paths, resume, history, params = got[0]
    assert same is None and quiet is None and paths is None and history is None  # --quiet and the paths may differ
    assert resume.startswith("rank 1 (host ") and resume.endswith(" with --resume=False: give every host the same flags")
    assert " was started with parameters='" in params
    assert version.startswith("rank 1 (host ") and " runs gnndist 9.9 but rank 0 (host " in version
    assert version.endswith(f" runs {gnndist.__version__}: install the same version on every host")
    assert store.startswith("the partition store of rank 1 (host ") and "differs from that of rank 0" in store
    assert config.startswith("rank 1 (host ") and " was started with lr=0.02 but rank 0 (host " in config
    assert config.endswith(" with lr=0.01: give every host the same flags")


def test_a_missing_part_names_itself_the_rank_and_the_fix(tmp_path):
    g = load("synthetic-static", num_nodes=200, num_edges=800, seed=1)
    store = tmp_path / "s"
    partition_graph(g, 2, out=store)
    shutil.rmtree(store / "part0")
    who = f"rank 0 (host {socket.gethostname()})"
    open_part(store, 1, 2, "static")  # a host of rank 1 needs only part1/
    with pytest.raises(GnndistError) as e:
        open_part(store, 0, 2, "static", who)
    msg = str(e.value)
    assert msg.startswith(f"{who}: the partition store {store} on this host lacks part0/")
    assert "copy meta.json, orig_to_new.npy and part0/ there from the host that partitioned" in msg
    (store / "orig_to_new.npy").unlink()
    with pytest.raises(GnndistError, match="lacks orig_to_new.npy"):
        open_part(store, 1, 2, "static")


def test_a_cpu_tensor_on_an_nccl_group_is_refused(monkeypatch):
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(torch.distributed, "get_backend", lambda group=None: "nccl")
    for call in (lambda: dist.all_reduce(torch.zeros(2)), lambda: dist.exchange([torch.zeros(1)] * 2),
                 lambda: dist.all_gather_varsize(torch.zeros(1))):
        with pytest.raises(RuntimeError, match="a CPU tensor on the NCCL group"):
            call()
    monkeypatch.setattr(torch.distributed, "get_backend", lambda group=None: "gloo")
    dist._on_device("all_reduce", torch.zeros(1), None)  # gloo takes CPU tensors


@pytest.mark.parametrize("rows", [5, 1, 0])
def test_pack_then_unpack_gives_the_columns_back_of_any_dtype_and_width(rows):
    """Rows packed as raw bytes (what `exchange` carries) come back as they were, also columns of
    no width (a graph without edge features, a replay without negatives), which take no bytes, and
    rows of one, or none."""
    g = torch.Generator().manual_seed(rows)
    cols = [torch.randint(-9, 9, (rows,), generator=g), torch.randn(rows, generator=g, dtype=torch.float64),
            torch.randn(rows, 3, generator=g), torch.zeros(rows, 0, dtype=torch.long),
            torch.rand(rows, 2, generator=g) > 0.5, torch.zeros(rows, 0, 4),
            torch.randn(rows, 1, generator=g).as_strided((rows, 1), (1, 0))]  # a size-1 dim's stride: any
    buf = dist.pack(cols)
    assert buf.dtype == torch.uint8 and tuple(buf.shape) == (rows, 8 + 8 + 12 + 2 + 4)
    back = dist.unpack(buf, [(c.dtype, tuple(c.shape[1:])) for c in cols])
    assert len(back) == len(cols)
    for a, b in zip(cols, back):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    only_empty = dist.pack(cols[3:4])
    assert tuple(only_empty.shape) == (rows, 0)
    assert dist.unpack(only_empty, [(torch.long, (0,))])[0].shape == (rows, 0)
    # some rows only, in any order, repeated: as the columns' rows
    take = torch.randint(0, max(rows, 1), (2 * rows + 1,), generator=g) if rows else torch.zeros(0, dtype=torch.long)
    for a, b in zip(cols, dist.unpack(buf, [(c.dtype, tuple(c.shape[1:])) for c in cols], take)):
        assert a.dtype == b.dtype and torch.equal(a[take], b)
    # into the rows 1.. of tensors one row longer
    into = [torch.full((rows + 1, *c.shape[1:]), 7, dtype=c.dtype) for c in cols]
    dist.unpack_into(buf, [t[1:] for t in into])
    for a, b in zip(cols, into):
        assert torch.equal(b[1:], a) and torch.equal(b[0], torch.full_like(b[0], 7))


def test_joined_parts_equal_their_concatenation_and_are_no_copy_where_they_lie_back_to_back():
    a = torch.arange(24.0).reshape(8, 3)
    for sizes in ([2, 3, 3], [0, 8], [8, 0], [3, 0, 5], [8]):
        got = dist.joined(a.split(sizes))
        assert torch.equal(got, a) and got.data_ptr() == a.data_ptr(), sizes
    for parts in ([a[:2], a[4:]], [a[2:4], a[:2]], [a[:2], a[2:].clone()], [a.t()[:1], a.t()[1:]],
                  [a[:2], torch.zeros(0, 3), torch.ones(1, 3)]):
        got = dist.joined(parts)
        assert torch.equal(got, torch.cat(parts)) and got.is_contiguous()
        assert all(got.data_ptr() != p.data_ptr() for p in parts if p.numel())  # a copy
    assert dist.joined([a[:0], a[:0]]).shape == (0, 3)
