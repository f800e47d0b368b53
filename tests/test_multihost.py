"""Runs across two real network hosts: two Linux network namespaces joined by a veth pair, each
with its own address, one torchrun node in each, started with the plain command of
docs/guide/several-machines.md (no GLOO_SOCKET_IFNAME: the hosts' name resolves to 127.0.0.1, and
gnndist must pick the veth itself). The veth byte counters show the traffic crossed the link.

They need root and `ip netns`; without them they skip, saying why."""
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

import gnndist
import gnndist.datasets
import gnndist.partition
import gnndist.samplers
from gnndist import checkpoint
from gnndist.cli import main

pytestmark = pytest.mark.multihost

ADDRS = ("10.250.0.1", "10.250.0.2")  # inside the namespaces only
PORT = 29500
STATIC = ["synthetic-static", "--num-nodes", "300", "--num-edges", "1500"]
TEMPORAL = ["synthetic-temporal", "--num-nodes", "60", "--num-events", "900"]
SAGE = ["--task", "node", "--model", "sage", "--hidden", "16", "--batch-size", "64", "--quiet"]
TGN = ["--task", "link", "--model", "tgn", "--memory-dim", "8", "--batch-size", "100", "--memory", "partitioned",
       "--quiet"]


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True)


def _why_no_netns() -> str:
    if shutil.which("ip") is None:
        return "needs the `ip` command (iproute2)"
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    probe = f"gdprobe{secrets.token_hex(3)}"
    made = _ip("netns", "add", probe)
    if made.returncode != 0:
        return f"`ip netns add` fails here: {made.stderr.strip()}"
    try:
        veth = _ip("-n", probe, "link", "add", "gdpa", "type", "veth", "peer", "name", "gdpb")
        return "" if veth.returncode == 0 else f"cannot make a veth pair here: {veth.stderr.strip()}"
    finally:
        _ip("netns", "del", probe)


class Hosts:
    """Two namespaces `ns[0]`, `ns[1]` joined by veths `dev[0]`, `dev[1]` at ADDRS."""

    def __init__(self, tmp: Path) -> None:
        tag = secrets.token_hex(3)
        self.tmp = tmp
        self.ns = (f"gdA{tag}", f"gdB{tag}")
        self.dev = (f"gdA{tag}", f"gdB{tag}")
        self.procs: list[subprocess.Popen] = []
        for ns in self.ns:
            self._must("netns", "add", ns)
        self._must("link", "add", self.dev[0], "netns", self.ns[0], "type", "veth", "peer", "name", self.dev[1],
                   "netns", self.ns[1])
        for ns, dev, addr in zip(self.ns, self.dev, ADDRS):
            self._must("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            self._must("-n", ns, "link", "set", dev, "up")
            self._must("-n", ns, "link", "set", "lo", "up")

    def _must(self, *args: str) -> None:
        p = _ip(*args)
        assert p.returncode == 0, f"ip {' '.join(args)}: {p.stderr}"

    def start(self, i: int, argv: list[str], timeout: str = "60", c10d: bool = False, restarts: int = 0,
              command: str = "train") -> subprocess.Popen:
        """Host `i`'s torchrun node running `gnndist COMMAND ARGV` (stderr in host{i}.err), joined
        by --node-rank and --master-addr, or with `c10d` by the c10d rendezvous (which, where a
        host's name resolves to 127.0.0.1, needs is_host=1 on the endpoint and --local-addr);
        with `restarts`, torchrun --max-restarts (and a store of the ranks' own, which restarts
        need)."""
        env = {k: v for k, v in os.environ.items() if not k.endswith("_SOCKET_IFNAME")}
        env.update(GNNDIST_TIMEOUT=timeout, OMP_NUM_THREADS="1", GNNDIST_CACHE=str(self.tmp / f"cache{i}"))
        if restarts:
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        if c10d:
            join = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{ADDRS[0]}:{PORT}", "--rdzv-id", "job1",
                    "--local-addr", ADDRS[i], *(["--rdzv-conf", "is_host=1"] if i == 0 else [])]
        else:
            join = ["--node-rank", str(i), "--master-addr", ADDRS[0], "--master-port", str(PORT)]
        cmd = ["ip", "netns", "exec", self.ns[i], sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
               "--nproc-per-node", "1", "--max-restarts", str(restarts), *join, "-m", "gnndist", command, *argv]
        with open(self.tmp / f"host{i}.err", "w") as err:
            p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True)
        self.procs.append(p)
        return p

    def run(self, argvs: tuple[list[str], list[str]], timeout: float = 110, c10d: bool = False,
            command: str = "train") -> list[int]:
        """Both hosts' nodes to the end; their exit statuses."""
        procs = [self.start(i, argv, c10d=c10d, command=command) for i, argv in enumerate(argvs)]
        deadline = time.monotonic() + timeout
        try:
            return [p.wait(timeout=max(0.0, deadline - time.monotonic())) for p in procs]
        except subprocess.TimeoutExpired:
            pytest.fail(f"a node still ran after {timeout:.0f}s:\n{self.err(0)[-3000:]}\n{self.err(1)[-3000:]}")

    def err(self, i: int) -> str:
        return (self.tmp / f"host{i}.err").read_text()

    def wait_for(self, i: int, text: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.err(i):
            assert time.monotonic() < deadline, f"host {i} never printed {text!r}:\n{self.err(i)[-3000:]}"
            assert all(p.poll() is None for p in self.procs), f"a node ended early:\n{self.err(0)}\n{self.err(1)}"
            time.sleep(0.2)

    def kill_host(self, i: int) -> None:
        """SIGKILL every process of host `i` (all started by this test)."""
        for pid in _ip("netns", "pids", self.ns[i]).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass

    def link_bytes(self) -> list[int]:
        """Bytes each host's veth has received."""
        out = []
        for ns, dev in zip(self.ns, self.dev):
            stats = json.loads(_ip("-n", ns, "-j", "-s", "link", "show", "dev", dev).stdout)[0]["stats64"]
            out.append(stats["rx"]["bytes"])
        return out

    def close(self) -> None:
        for i in range(2):
            self.kill_host(i)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for ns in self.ns:
            _ip("netns", "del", ns)


@pytest.fixture
def hosts(tmp_path):
    why = _why_no_netns()
    if why:
        pytest.skip(why)
    h = Hosts(tmp_path)
    try:
        yield h
    finally:
        h.close()


def _own_part_store(full: Path, dest: Path, part: int) -> Path:
    """What a host of `part` needs of store `full`: meta.json, the id map and its own part."""
    dest.mkdir(parents=True)
    for f in ("meta.json", "orig_to_new.npy"):
        shutil.copy(full / f, dest / f)
    shutil.copytree(full / f"part{part}", dest / f"part{part}")
    return dest


OUR_CODE = [str(Path(m.__file__).parent) + os.sep for m in (gnndist, gnndist.partition, gnndist.samplers,
                                                              gnndist.datasets)]


def _clean_failure(err: str) -> None:
    """gnndist said why in one line, with no traceback of its own (torchrun then prints its
    failure box, which repeats the line) and no warning."""
    assert len(re.findall(r"^gnndist train: error: ", err, re.M)) == 1, err[-3000:]
    assert not any(f'File "{d}' in err for d in OUR_CODE), err[-3000:]
    assert "leaked semaphore" not in err


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """A 2-part static and temporal store, and the `--nproc 2` metrics on each."""
    tmp = tmp_path_factory.mktemp("stores")
    out = {}
    for kind, data, argv in (("static", STATIC, SAGE), ("temporal", TEMPORAL, TGN)):
        store = tmp / kind
        method = ["--balance", "nodes,train"] if kind == "static" else []
        assert main(["partition", *data, "--parts", "2", *method, "--out", str(store), "--quiet"]) == 0
        out[kind] = store
    return out


@pytest.fixture(scope="module")
def nproc_metrics(stores, tmp_path_factory):
    """`nproc_metrics(kind)`: the metrics of `--nproc 2` on that store (2 epochs), run once."""
    done = {}

    def metrics(kind: str) -> dict:
        if kind not in done:
            tmp = tmp_path_factory.mktemp(f"nproc-{kind}")
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("OMP_NUM_THREADS", "1")
                mp.setenv("GNNDIST_TIMEOUT", "60")
                mp.setenv("GNNDIST_CACHE", str(tmp / "cache"))
                argv = SAGE if kind == "static" else TGN
                assert main(["train", str(stores[kind]), *argv, "--epochs", "2", "--nproc", "2",
                             "--metrics-out", str(tmp / "nproc.json")]) == 0
            done[kind] = json.loads((tmp / "nproc.json").read_text())
        return done[kind]

    return metrics


def _same_metrics(got: dict, want: dict) -> None:
    assert got["world_size"] == want["world_size"] == 2
    assert got["test"] == pytest.approx(want["test"], abs=1e-6)
    assert [e["loss"] for e in got["epochs"]] == pytest.approx([e["loss"] for e in want["epochs"]], abs=1e-6)


def _two_hosts_own_parts(hosts, store: Path, argv: list[str], tmp: Path, want: Callable[[], dict]) -> None:
    """Each host holds only its own part; the run ends with the metrics of `--nproc 2`."""
    local = [_own_part_store(store, tmp / f"host{i}" / "store", i) for i in range(2)]
    before = hosts.link_bytes()
    rcs = hosts.run(([str(local[0]), *argv, "--epochs", "2", "--metrics-out", str(tmp / "hosts.json")],
                     [str(local[1]), *argv, "--epochs", "2"]))
    assert rcs == [0, 0], hosts.err(0)[-3000:] + hosts.err(1)[-3000:]
    moved = [b - a for a, b in zip(before, hosts.link_bytes())]
    got = json.loads((tmp / "hosts.json").read_text())
    assert f"GLOO_SOCKET_IFNAME={hosts.dev[0]} ({ADDRS[0]}" in hosts.err(0)  # chosen, and said
    assert f"rank 1 (host {os.uname().nodename}, {ADDRS[1]}): running on part 1" in hosts.err(1)
    _same_metrics(got, want())
    remote = sum(e.get("remote_bytes", e.get("bytes", 0)) for e in got["epochs"])
    assert min(moved) > 0 and sum(moved) >= remote, (moved, remote)


def test_sage_on_two_hosts_each_holding_its_own_part_equals_nproc(hosts, stores, nproc_metrics, tmp_path):
    _two_hosts_own_parts(hosts, stores["static"], SAGE, tmp_path, lambda: nproc_metrics("static"))


def test_tgn_on_two_hosts_each_holding_its_own_part_equals_nproc(hosts, stores, nproc_metrics, tmp_path):
    _two_hosts_own_parts(hosts, stores["temporal"], TGN, tmp_path, lambda: nproc_metrics("temporal"))


def test_raw_data_on_two_hosts_joined_by_c10d_partitions_alike_on_each(hosts, stores, nproc_metrics, tmp_path):
    """Given the generator, each host partitions into its own cache (the same store as
    `gnndist partition` writes) and the run equals `--nproc 2` on that store; whichever host
    the rendezvous makes rank 0 writes --metrics-out, the other does not."""
    argv = [*STATIC, *SAGE, "--epochs", "2"]
    out = [tmp_path / f"host{i}.json" for i in range(2)]
    rcs = hosts.run(([*argv, "--metrics-out", str(out[0])], [*argv, "--metrics-out", str(out[1])]), c10d=True)
    assert rcs == [0, 0], hosts.err(0)[-3000:] + hosts.err(1)[-3000:]
    want = json.loads((stores["static"] / "meta.json").read_text())["files"]
    for i in range(2):
        (made,) = (tmp_path / f"cache{i}" / "partitions").iterdir()
        assert json.loads((made / "meta.json").read_text())["files"] == want
        assert re.search(rf"^rank \d \(host [^,]+, {ADDRS[i]}\): partitioning into 2 parts", hosts.err(i), re.M)
    (written,) = [f for f in out if f.exists()]
    got = json.loads(written.read_text())
    _same_metrics(got, nproc_metrics("static"))


def _start_long_run(hosts, stores, tmp: Path, timeout: str) -> None:
    local = [_own_part_store(stores["static"], tmp / f"host{i}" / "store", i) for i in range(2)]
    loud = [a for a in SAGE if a != "--quiet"]  # with its epoch lines
    for i in range(2):
        hosts.start(i, [str(local[i]), *loud, "--epochs", "100000"], timeout=timeout)
    hosts.wait_for(0, "epoch   1 ")  # mid-training


def test_a_killed_host_is_named_by_the_survivor_within_30s(hosts, stores, tmp_path):
    _start_long_run(hosts, stores, tmp_path, timeout="60")
    t0 = time.monotonic()
    hosts.kill_host(1)
    rc = hosts.procs[0].wait(timeout=60)
    took = time.monotonic() - t0
    err = hosts.err(0)
    assert rc != 0 and took < 30, (rc, took, err[-3000:])
    assert f"rank 1 (host {os.uname().nodename}, {ADDRS[1]}) is gone" in err, err[-3000:]
    _clean_failure(err)


def test_a_cut_link_ends_both_hosts_within_the_timeout_plus_30s(hosts, stores, tmp_path):
    timeout = 5
    _start_long_run(hosts, stores, tmp_path, timeout=str(timeout))
    t0 = time.monotonic()
    assert _ip("-n", hosts.ns[0], "link", "set", hosts.dev[0], "down").returncode == 0
    rcs = [p.wait(timeout=timeout + 60) for p in hosts.procs]
    took = time.monotonic() - t0
    assert all(rc != 0 for rc in rcs) and took < timeout + 30, (rcs, took)
    assert f"rank 1 (host {os.uname().nodename}, {ADDRS[1]}) is gone" in hosts.err(0), hosts.err(0)[-3000:]
    assert f"rank 0's host ({ADDRS[0]}" in hosts.err(1), hosts.err(1)[-3000:]
    for i in range(2):
        _clean_failure(hosts.err(i))


def test_a_host_whose_part_is_damaged_is_named_by_the_other_within_30s(hosts, stores, tmp_path):
    """Host 1's own part fails its checksum when its rank loads it, after the ranks joined: host
    0 says which rank failed and why within seconds (it waited the whole GNNDIST_TIMEOUT in
    torch's group creation, then printed a traceback), and host 1's line names its rank."""
    local = [_own_part_store(stores["temporal"], tmp_path / f"host{i}" / "store", i) for i in range(2)]
    t = local[1] / "part1" / "t.npy"
    t.write_bytes(t.read_bytes()[: t.stat().st_size // 2])
    t0 = time.monotonic()
    procs = [hosts.start(i, [str(local[i]), *TGN, "--epochs", "1"], timeout="60") for i in range(2)]
    rcs = [p.wait(timeout=120) for p in procs]
    took = time.monotonic() - t0
    err = hosts.err(0)
    assert rcs[0] != 0 and rcs[1] != 0 and took < 30, (rcs, took, err[-3000:])
    assert (f"rank 1 (host {os.uname().nodename}, {ADDRS[1]}) failed: partition store file {local[1]}/part1/t.npy "
            f"is corrupted (sha256 mismatch)") in err, err[-3000:]
    assert (f"gnndist train: error: rank 1 (host {os.uname().nodename}, {ADDRS[1]}): partition store file "
            f"{local[1]}/part1/t.npy is corrupted") in hosts.err(1)  # its own line says which rank it is
    for i in range(2):
        _clean_failure(hosts.err(i))


def test_a_host_killed_mid_epoch_rejoins_with_resume_auto_and_the_job_ends_as_uninterrupted(hosts, tmp_path):
    """Each host's torchrun with --max-restarts 1 and the c10d rendezvous, checkpoints every 10
    steps in a folder of its own: host 1's torchrun is killed (every process of it) after step 8
    of epoch 2, once both hosts hold a checkpoint within epoch 2 (written in the background, it may
    complete some steps after the step it was taken at); host 0's restarts its rank, which waits in
    the rendezvous; host 1's is started again with the same command and --resume auto. Both resume
    from the newest checkpoint both ranks completed, and the job ends with the figures of the same
    run on --nproc 2, uninterrupted."""
    data = ["synthetic-temporal", "--num-nodes", "100", "--num-events", "2500"]  # 35 steps of 50 an epoch
    flags = [*TGN, "--batch-size", "50", "--epochs", "2"]
    store, ref = tmp_path / "store", tmp_path / "ref.json"
    assert main(["partition", *data, "--parts", "2", "--out", str(store), "--quiet"]) == 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        mp.setenv("GNNDIST_TIMEOUT", "60")
        assert main(["train", str(store), *flags, "--nproc", "2", "--metrics-out", str(ref)]) == 0
    local = [_own_part_store(store, tmp_path / f"host{i}" / "store", i) for i in range(2)]
    ck, out = [tmp_path / f"host{i}" / "ck" for i in range(2)], tmp_path / "hosts.json"
    argv = [[str(local[i]), *flags, "--checkpoint", str(ck[i]), "--checkpoint-every", "10"] for i in range(2)]
    argv[0] += ["--metrics-out", str(out)]
    first = [hosts.start(i, argv[i], c10d=True, restarts=1) for i in range(2)]
    deadline, progress = time.monotonic() + 90, ck[1] / "rank1" / ".progress"  # its last step: "epoch step"

    def ready() -> bool:
        done = [int(x) for x in (progress.read_text().split() if progress.exists() else [0, 0])]
        return done >= [2, 8] and all(any(p.epoch == 2 and p.step is not None
                                          for p in checkpoint.positions(ck[i] / f"rank{i}")) for i in range(2))
    while not ready():
        assert time.monotonic() < deadline and all(p.poll() is None for p in first), hosts.err(0)[-3000:]
        time.sleep(0.01)
    hosts.kill_host(1)
    again = hosts.start(1, argv[1] + ["--resume", "auto"], c10d=True, restarts=1)
    rcs = [p.wait(timeout=150) for p in (first[0], again)]
    assert rcs == [0, 0], hosts.err(0)[-3000:] + hosts.err(1)[-3000:]
    got = json.loads(out.read_text())
    _same_metrics(got, json.loads(ref.read_text()))
    (r,) = got["restarts"]
    # a checkpoint every 10 steps of the run: of epoch 2 at its steps 5, 15, ...; torchrun does not tell the rank lost
    assert r["epoch"] == 2 and r["step"] % 10 == 5 and r["rank_lost"] is None, r
    assert re.search(r"^restart 1: resuming from epoch 2, step \d+ of 35 \(the checkpoint in ", hosts.err(0), re.M)


def test_hosts_each_given_their_own_shard_files_partition_together_then_train(hosts, tmp_path):
    """Each host holds only its own shard files: they partition them together (each host writes
    meta.json, the id maps and its own part: the store `--nproc 2` writes on one host, but for
    the parts), then train on what each wrote, with the metrics of `--nproc 2`."""
    from gnndist.datasets import load
    from gnndist.datasets.shard_writer import ShardWriteConfig, write_shards

    shards = tmp_path / "shards"
    write_shards(load(*TEMPORAL[:1], num_nodes=60, num_events=900), shards, ShardWriteConfig(num_shards=4))
    files = sorted(p for p in shards.rglob("*.parquet"))
    for i in range(2):
        (tmp_path / f"host{i}" / "shards").mkdir(parents=True)
        for f in files[i::2]:
            shutil.copy(f, tmp_path / f"host{i}" / "shards" / f.name)
    one = tmp_path / "one"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GNNDIST_TIMEOUT", "60")
        assert main(["partition", str(shards), "--parts", "2", "--out", str(one), "--nproc", "2", "--quiet"]) == 0
    argvs = [[str(tmp_path / f"host{i}" / "shards"), "--parts", "2", "--out", str(tmp_path / f"host{i}" / "store"),
              "--quiet"] for i in range(2)]
    rcs = hosts.run((argvs[0], argvs[1]), command="partition")
    assert rcs == [0, 0], hosts.err(0)[-3000:] + hosts.err(1)[-3000:]
    want = json.loads((one / "meta.json").read_text())
    for i in range(2):
        store = tmp_path / f"host{i}" / "store"
        assert sorted(p.name for p in store.iterdir()) == ["meta.json", "orig_to_new.npy", f"part{i}"]
        got = json.loads((store / "meta.json").read_text())
        assert got["files"] == want["files"] and got["node_offsets"] == want["node_offsets"]
    rcs = hosts.run(([str(tmp_path / "host0" / "store"), *TGN, "--epochs", "2", "--metrics-out",
                      str(tmp_path / "hosts.json")], [str(tmp_path / "host1" / "store"), *TGN, "--epochs", "2"]))
    assert rcs == [0, 0], hosts.err(0)[-3000:] + hosts.err(1)[-3000:]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        mp.setenv("GNNDIST_TIMEOUT", "60")
        assert main(["train", str(one), *TGN, "--epochs", "2", "--nproc", "2",
                     "--metrics-out", str(tmp_path / "nproc.json")]) == 0
    _same_metrics(json.loads((tmp_path / "hosts.json").read_text()), json.loads((tmp_path / "nproc.json").read_text()))
