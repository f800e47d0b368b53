"""The distributed runtime on torch.distributed: start-up, batched exchanges, and failures named
by their victim.

Every collective runs under the process-group timeout (`GNNDIST_TIMEOUT`, seconds, default
300). Each rank also keeps a heartbeat in the job's store (the TCPStore at MASTER_ADDR:MASTER_PORT
that torchrun or `--nproc` runs) with its host and the number of collectives it has entered, so
that when a collective fails the survivors can say which rank is gone, failed or stalled, instead
of which one noticed.

Where GLOO_SOCKET_IFNAME (and, on CUDA, NCCL_SOCKET_IFNAME) is unset, `setup` picks the network
interface whose address routes to MASTER_ADDR: a host whose name resolves to 127.0.0.1 would
otherwise offer its peers a loopback address.
"""
from __future__ import annotations

import atexit
import contextlib
import datetime
import fcntl
import gc
import ipaddress
import math
import os
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

import torch
import torch.distributed as dist

from gnndist.errors import GnndistError, first_line

TIMEOUT_RANGE = (1.0, 86400.0)  # allowed GNNDIST_TIMEOUT, seconds
BEAT_S = 0.5  # heartbeat period
GONE_S = 5.0  # a rank whose heartbeat has not moved for this long is gone
STORE_S = 5.0  # how long a store query may take before the store's host counts as unreachable


def timeout_s() -> float:
    """GNNDIST_TIMEOUT in seconds (default 300); GnndistError unless a number in TIMEOUT_RANGE."""
    raw = os.environ.get("GNNDIST_TIMEOUT", "300")
    lo, hi = TIMEOUT_RANGE
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not lo <= value <= hi:
        raise GnndistError(f"GNNDIST_TIMEOUT must be a number of seconds from {lo:.0f} to {hi:.0f}, got {raw!r}")
    return value


def in_torchrun() -> bool:
    """True when started by torchrun or the elastic launcher (the env names a world)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def restart_count() -> int:
    """How often the launcher has started this rank's group again after a failure (0 at a first
    start, and outside a launch)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def first_on_host() -> bool:
    """Whether this process is its host's first rank (local rank 0; also outside any launch)."""
    return int(os.environ.get("LOCAL_RANK", "0")) == 0


def writes_outputs() -> bool:
    """Whether this process writes a job's output files: outside a torchrun world, or its rank 0."""
    return not in_torchrun() or int(os.environ["RANK"]) == 0


# ----------------------------------------------------------------------------------------------
# Which network interface reaches the master


def route_to(host: str) -> str:
    """The local address this machine sends from to reach `host` (a name or an address)."""
    family, _, _, _, addr = socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((addr[0], 9))  # a UDP connect only picks the route; nothing is sent
        return s.getsockname()[0]


def interface_of(address: str) -> Optional[str]:
    """The name of the network interface holding `address` (IPv4 or IPv6), or None."""
    ip = ipaddress.ip_address(address.split("%")[0])
    if ip.version == 6:
        with open("/proc/net/if_inet6") as f:  # hex address, index, prefix, scope, flags, name
            for line in f:
                cols = line.split()
                if len(cols) == 6 and ipaddress.IPv6Address(int(cols[0], 16)) == ip:
                    return cols[5]
        return None
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                req = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on this interface
                continue
            if socket.inet_ntoa(req[20:24]) == str(ip):
                return name
    return None


@dataclass(frozen=True)
class Host:
    """Where this rank runs: its host name, the address it reaches the master from, and the
    interface holding that address."""

    name: str
    address: str
    interface: Optional[str]

    def __str__(self) -> str:
        return f"{self.name}, {self.address}"


def this_host(master: str) -> Host:
    """This machine as seen from the route to `master`."""
    try:
        address = route_to(master)
    except OSError as e:
        raise GnndistError(f"cannot reach MASTER_ADDR {master}: {first_line(e)}") from None
    try:
        interface = interface_of(address)
    except (OSError, ValueError):
        interface = None
    return Host(socket.gethostname(), address, interface)


def _choose_interfaces(host: Host, backend: str) -> Optional[str]:
    """Point gloo (and NCCL) at `host`'s interface unless the user chose one; returns a line
    saying what was chosen, or None."""
    names = ["GLOO_SOCKET_IFNAME"] + (["NCCL_SOCKET_IFNAME"] if backend == "nccl" else [])
    unset = [n for n in names if not os.environ.get(n)]
    if host.interface is None or not unset:
        return None
    for n in unset:
        os.environ[n] = host.interface
    return (f"network: {', '.join(unset)}={host.interface} ({host.address}, the interface that routes to "
            f"MASTER_ADDR {os.environ['MASTER_ADDR']}); set {unset[0]} to choose another")


# ----------------------------------------------------------------------------------------------
# The watch: heartbeats, hosts and failures in the job's store


def _tcp_store(timeout: float) -> dist.TCPStore:
    """A new client of the job's store (MASTER_ADDR:MASTER_PORT)."""
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                         timeout=datetime.timedelta(seconds=timeout), wait_for_workers=False)


def _probe_tcp_store() -> None:
    """OSError unless the job's store accepts a connection within STORE_S (a store op on a dead
    link would block past the store's own timeout)."""
    socket.create_connection((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])), STORE_S).close()


class Heartbeat:
    """This rank's entries in the job's store, `gnndist/<kind>/<rank>`: its host, a heartbeat (a
    thread sets `beat` to "<beats> <collectives entered>" every BEAT_S) and, when it fails with
    its own error, that error's line (`failed`). `diagnose` reads the others' entries to tell who
    is gone. (A job whose ranks are restarted has a store of its own for each start:
    `launch._refuse_shared_store_restarts`; the restart counts of its hosts may differ.)"""

    def __init__(self, rank: int, world: int, host: Host) -> None:
        self.rank, self.world, self.host = rank, world, host
        self.prefix = "gnndist/"
        self._lock, self._verdict = threading.Lock(), None  # why the first failed collective failed
        self._query = _tcp_store(timeout_s())  # the first connection waits as long as a collective would
        self._query.set_timeout(datetime.timedelta(seconds=STORE_S))
        self.put("host", str(host))
        self._beat = _tcp_store(STORE_S)  # the heartbeat thread's own connection
        self._beat.set(self._key("beat", rank), "0 0")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beating, name="gnndist-heartbeat", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def _key(self, kind: str, rank: int) -> str:
        return f"{self.prefix}{kind}/{rank}"

    def put(self, kind: str, value: str) -> None:
        """Set this rank's `kind` entry, in the store when this returns: a store's `set` does not
        wait for the store, so a rank that read the entry after a collective could miss it
        (`check`, a round trip on the same connection, comes back after the set is done)."""
        key = self._key(kind, self.rank)
        self._query.set(key, value)
        self._query.check([key])

    def get(self, kind: str, rank: int) -> Optional[str]:
        """Rank `rank`'s `kind` entry, None if it has none."""
        key = self._key(kind, rank)
        return self._query.get(key).decode() if self._query.check([key]) else None

    def _entries(self, kind: str, ranks: Sequence[int]) -> dict[int, str]:
        return {r: v for r in ranks if (v := self.get(kind, r)) is not None}

    def host_of(self, rank: int) -> str:
        return self.get("host", rank) or "unknown"

    def _doing(self, rank: int) -> str:
        """What `rank` said it was doing (see `busy`), as ", while ...", or "" when nothing."""
        doing = self.get("busy", rank)
        return f", while {doing}" if doing else ""

    def _beating(self) -> None:
        n = 0
        while not self._stop.wait(BEAT_S):
            n += 1
            try:
                self._beat.set(self._key("beat", self.rank), f"{n} {collectives_entered()}")
            except Exception:  # the store is unreachable: the next collective will say so
                pass

    def close(self) -> None:
        """Stop the heartbeat (before the interpreter shuts down under it)."""
        self._stop.set()
        self._thread.join(STORE_S + 1)

    def post_failure(self, line: str) -> None:
        """Leave this rank's own error line where the survivors will read it."""
        try:
            _probe_tcp_store()
            self.put("failed", line)
        except Exception:  # the store is unreachable; this rank's own output still has the line
            pass

    def diagnose(self, op: str, error: BaseException) -> str:
        """A one-line account of why collective `op` failed here: the rank that failed with its
        own error, is gone (heartbeat stopped) or stalled (alive but behind), or else that the
        store's host cannot be reached. Found once: a second failing thread gets the same line."""
        with self._lock:
            if self._verdict is None:
                self._verdict = self._find_cause(op, error)
            return self._verdict

    def _find_cause(self, op: str, error: BaseException) -> str:
        me, others = self.rank, [r for r in range(self.world) if r != self.rank]
        try:
            _probe_tcp_store()
            failed, start = self._entries("failed", others), self._entries("beat", others)
            now, alive, deadline = start, set(), time.monotonic() + GONE_S
            while not failed and len(alive) < len(others) and time.monotonic() < deadline:
                time.sleep(BEAT_S / 2)
                now = self._entries("beat", others)  # "<beats> <collectives entered>"
                alive |= {r for r in now if r in start and now[r].split()[0] != start[r].split()[0]}
                failed = self._entries("failed", others)
            if failed:
                r = min(failed)
                return f"rank {r} (host {self.host_of(r)}) failed: {failed[r]}"
            gone = [r for r in others if r not in alive]
            if len(gone) == 1:
                return (f"rank {gone[0]} (host {self.host_of(gone[0])}) is gone: no heartbeat for "
                        f"{GONE_S:.0f}s{self._doing(gone[0])} (rank {me} noticed in {op})")
            if gone:  # which went first cannot be told (a host's launcher stops its other ranks at once)
                hosts = {self.host_of(r) for r in gone}
                who = (f"ranks {', '.join(map(str, gone))} (host {hosts.pop()})" if len(hosts) == 1 else
                       "ranks " + ", ".join(f"{r} (host {self.host_of(r)})" for r in gone))
                return f"{who} are gone: no heartbeat for {GONE_S:.0f}s (rank {me} noticed in {op})"
            entered = {**{r: int(b.split()[1]) for r, b in now.items()}, me: collectives_entered()}
            behind = [r for r in entered if entered[r] < max(entered.values())]
            if behind:
                r = min(behind, key=lambda r: (entered[r], r))
                return (f"rank {r} (host {self.host_of(r)}) stalled: it is alive but has not joined {op}"
                        f"{self._doing(r)}, which rank {me} gave up on after {timeout_s():.0f}s (GNNDIST_TIMEOUT)")
        except Exception:  # the store does not answer: its host (rank 0's) is gone or cut off
            return (f"rank 0's host ({os.environ['MASTER_ADDR']}, which holds the job's store at port "
                    f"{os.environ['MASTER_PORT']}) cannot be reached: it is gone or the network to it is down "
                    f"(rank {me} noticed in {op})")
        return f"collective {op} failed on rank {me} (host {self.host}) while every rank is alive: {first_line(error)}"


_heartbeat: Optional[Heartbeat] = None


def heartbeat() -> Optional[Heartbeat]:
    """This process's `Heartbeat` (None outside a torchrun world)."""
    return _heartbeat


@contextlib.contextmanager
def busy(doing: str) -> Iterator[None]:
    """Tell the other ranks what this one does meanwhile, for their diagnosis should they give up
    on it (partitioning holds the interpreter, and so the heartbeat, for longer than GONE_S)."""
    if _heartbeat is not None:
        _heartbeat.put("busy", doing)
    yield
    if _heartbeat is not None:
        _heartbeat.put("busy", "")


def post_failure(e: BaseException) -> None:
    """Tell the other ranks that this rank stops on its own error `e` (not a peer's failure)."""
    if _heartbeat is not None and not isinstance(e, PeerFailure):
        _heartbeat.post_failure(first_line(e))


# ----------------------------------------------------------------------------------------------
# Start-up


def setup(device: str = "cpu") -> torch.device:
    """Join the process group described by the environment (gloo on CPU, NCCL on CUDA).

    Outside torchrun this is a no-op and the world is one process. Returns the device this
    rank computes on.
    """
    global _heartbeat, _entered, _job_store, _groups_joined
    _entered = 0  # the ranks' counts are compared when a collective fails
    if device.startswith("cuda"):
        dev = rank_gpu(int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    if in_torchrun() and not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        r, w = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        host = this_host(os.environ["MASTER_ADDR"])
        said = _choose_interfaces(host, backend)
        if _heartbeat is None:
            if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
                _job_store = _rank0_store(r, w, host)
            _heartbeat = _join_heartbeat(r, w, host)
        if said and r == 0 and _several_nodes(w):
            print(said, file=sys.stderr, flush=True)
        store = {}
        if _job_store is not None:  # a prefix per process group: this process may join one again
            _groups_joined += 1
            store = {"store": dist.PrefixStore(f"gnndist-pg/{_groups_joined}", _job_store), "rank": r,
                     "world_size": w}
        try:
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s()), **store,
                                    **({"device_id": dev} if dev.type == "cuda" else {}))
        except (RuntimeError, dist.DistError) as e:
            raise PeerFailure(_join_failure(_heartbeat, e)) from None
        # the host groups are made here, where every rank is, not at a first use: a rank that
        # stops before it would leave the others in torch's group creation, which no failure check watches
        host_group("samplers")
        if dev.type == "cuda":
            host_group("counts")
    return dev


_job_store: Optional[Any] = None  # the job's store, where this process holds or joined it itself (`_rank0_store`)
_groups_joined = 0  # the process groups this process has joined on `_job_store`


def _rank0_store(rank: int, world: int, host: Host) -> Any:
    """The job's store at MASTER_ADDR:MASTER_PORT where no launcher holds one for its ranks (a
    restartable launch: torch's restarted ranks cannot share the launcher's): rank 0 holds it,
    for the rest of its process; the others connect, waiting for it up to GNNDIST_TIMEOUT."""
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    try:
        return dist.TCPStore(addr, port, world, is_master=rank == 0, wait_for_workers=False,
                             timeout=datetime.timedelta(seconds=timeout_s()))
    except (OSError, RuntimeError, dist.DistError) as e:
        raise GnndistError(f"rank {rank} (host {host}) cannot " + ("hold" if rank == 0 else "reach")
                           + f" the job's store at {addr}:{port} (MASTER_ADDR:MASTER_PORT; rank 0 holds it): "
                           f"{first_line(e)}") from None


def rank_gpu(local_rank: int) -> torch.device:
    """The GPU of the rank with this local rank: one GPU per rank (NCCL refuses two ranks on
    one GPU), so a host runs at most as many ranks as it has GPUs."""
    if not torch.cuda.is_available():
        raise GnndistError("--device cuda given but CUDA is not available")
    gpus = torch.cuda.device_count()
    if local_rank >= gpus:
        raise GnndistError(f"--device cuda runs one rank per GPU, and this host has {gpus}: local rank "
                           f"{local_rank} has none (run at most {gpus} rank(s) per host)")
    return torch.device("cuda", local_rank)


def _several_nodes(world: int) -> bool:
    """Whether the `world` ranks span several torchrun nodes (hosts, as a rule)."""
    return world > int(os.environ.get("LOCAL_WORLD_SIZE", world))


def _join_heartbeat(rank: int, world: int, host: Host) -> Heartbeat:
    """This rank's `Heartbeat`; a one-line error at once when the job's store does not answer."""
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    try:
        _probe_tcp_store()  # fails at once where TCPStore would retry for the whole timeout
        return Heartbeat(rank, world, host)
    except (OSError, RuntimeError, dist.DistError) as e:
        hint = ""
        if ipaddress.ip_address(host.address.split("%")[0]).is_loopback and _several_nodes(world):
            hint = (f"; MASTER_ADDR {addr} is this host's loopback: if the nodes run on several hosts, torchrun "
                    "was not told rank 0's address (with --rdzv-backend c10d give every host's torchrun "
                    "--local-addr ITS_ADDRESS)")
        raise GnndistError(f"rank {rank} (host {host}) cannot reach the job's store at {addr}:{port} "
                           f"(MASTER_ADDR:MASTER_PORT): {first_line(e)}{hint}") from None


def _join_failure(w: Heartbeat, e: BaseException) -> str:
    """Why joining the process group failed: the ranks that never reached the store, or else
    what `Heartbeat.diagnose` finds."""
    try:
        missing = [r for r in range(w.world) if w.get("host", r) is None]
    except Exception:
        missing = []
    if missing:
        hint = ("is torchrun running on its host, with the same --nnodes, --master-addr and --master-port, and "
                "can it reach this host (its own output says if not)?" if _several_nodes(w.world)
                else "it is stuck or was stopped")
        return f"rank {missing[0]} never joined the job within {timeout_s():.0f}s (GNNDIST_TIMEOUT): {hint}"
    return w.diagnose("joining the process group", e)


def teardown() -> None:
    """Leave the process group (if joined) and end its groups' worker threads now, while the
    interpreter runs: a gloo worker that drops a finished collective's tensors once the
    interpreter is finalizing aborts the process ("terminate called without an active
    exception"), and the other ranks' torchrun then waits out its exit barrier. A group's
    threads end when its last reference goes; the objects that held one are garbage by now.
    Without a group there is nothing to end, and the full garbage collection is skipped."""
    if not dist.is_initialized() and not _host_groups:
        return
    if dist.is_initialized():
        dist.destroy_process_group()
    _host_groups.clear()
    gc.collect()


def rank() -> int:
    """This process's rank (0 outside a process group)."""
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    """The number of ranks (1 outside a process group)."""
    return dist.get_world_size() if dist.is_initialized() else 1


# ----------------------------------------------------------------------------------------------
# Collectives


_entered, _entered_lock = 0, threading.Lock()


def collectives_entered() -> int:
    """How many collectives this process has entered (any thread)."""
    return _entered


def _check(op: str, fn: Callable[[], Any]) -> Any:
    """Run a collective; turn a timeout or a lost peer into one line naming the rank at fault."""
    global _entered
    with _entered_lock:
        _entered += 1
    return _failing_as_peer(op, fn)


def _failing_as_peer(op: str, fn: Callable[[], Any]) -> Any:
    """`fn()` (a collective or the wait for one), a timeout or a lost peer turned into one line
    naming the rank at fault."""
    try:
        return fn()
    except (RuntimeError, dist.DistError) as e:  # gloo/nccl report peers' failures so
        if _heartbeat is None:
            raise PeerFailure(f"rank {rank()}: collective {op} failed (a peer rank died or stalled past "
                              f"{timeout_s():.0f}s): {first_line(e)}") from None
        raise PeerFailure(_heartbeat.diagnose(op, e)) from None


_host_groups: dict[str, Any] = {}


def host_group(name: str) -> Any:
    """A gloo process group of all ranks for host-side exchanges, one per `name` (None in a
    1-process world); created on first use in each world, which is a collective: all ranks
    must get there in the same order."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    if _host_groups.get("world") is not dist.group.WORLD:  # a new world: the old groups are gone
        _host_groups.clear()
        _host_groups["world"] = dist.group.WORLD
    if name not in _host_groups:
        _host_groups[name] = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s()))
    return _host_groups[name]


def counts_group(payload: torch.Tensor, group: Any) -> Any:
    """Where the row counts of `payload`, sent on `group`, travel: a device payload's on the
    gloo group "counts", as host ints (read back from the device they would make the host wait
    for it); a host payload's on its own group."""
    return host_group("counts") if payload.is_cuda else group


def all_reduce(t: torch.Tensor, op: str = "sum", group: Any = None) -> torch.Tensor:
    """In-place all-reduce (`sum` or `max`) over `group` (default: the world); identity in a
    1-process world. Two gloo ranks sum by swapping their tensors in one all-to-all and adding
    (the same result on both): gloo's ring all-reduce takes two rounds for it, about twice the
    time for a gradient (docs/benchmarks.md, "Measurements behind the code")."""
    if world_size() == 1:
        return t
    if op == "sum" and swaps(group):
        me, flat = rank(), t.reshape(-1)
        send, sizes = ([flat[:0], flat], [0, flat.numel()]) if me == 0 else ([flat, flat[:0]], [flat.numel(), 0])
        return t.add_(exchange(send, group, sizes, f"all_reduce({op})")[1 - me].view_as(t))
    red = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]
    _on_device(f"all_reduce({op})", t, group)
    _check(f"all_reduce({op})", lambda: dist.all_reduce(t, op=red, group=group))
    return t


def swaps(group: Any = None) -> bool:
    """Whether a sum over `group` is a swap: two gloo ranks send each other their tensor in one
    all-to-all and add (see `all_reduce`)."""
    return world_size() == 2 and dist.get_backend(group) == "gloo"


def agree_max(n: int, device: torch.device | str = "cpu") -> int:
    """The largest `n` over all ranks (e.g. the step count every rank must run)."""
    return int(all_reduce(torch.tensor([n], dtype=torch.int64, device=device), "max").item())


def gather_objects(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's `obj` (picklable, made by the job itself: listings, errors, metrics), by
    rank; `[obj]` in a 1-process world."""
    if world_size() == 1:
        return [obj]
    out: list[Any] = [None] * world_size()
    _check("all_gather_object", lambda: dist.all_gather_object(out, obj, group=group))
    return out


def _on_device(op: str, t: torch.Tensor, group: Any) -> None:
    """A CPU tensor on an NCCL group is a bug (host-side exchanges go on the samplers' gloo group)."""
    if not t.is_cuda and dist.is_initialized() and dist.get_backend(group) == "nccl":
        raise RuntimeError(f"{op}: a CPU tensor on the NCCL group (use the gloo group for host-side exchanges)")


def all_gather_varsize(t: torch.Tensor, group: Any = None, sizes: Optional[Sequence[int]] = None
                       ) -> list[torch.Tensor]:
    """Gather a tensor whose first dimension differs between ranks; list indexed by rank.
    `group`: a process group spanning all ranks (default: the default group). `sizes`: every
    rank's first dimension, where all ranks know them; else they are gathered first, in one more
    collective."""
    w = world_size()
    if w == 1:
        return [t]
    _on_device("all_gather", t, group)
    if sizes is None:
        n, counts = torch.tensor([t.shape[0]], dtype=torch.int64), counts_group(t, group)
        gathered = [torch.zeros_like(n) for _ in range(w)]
        _check("all_gather(sizes)", lambda: dist.all_gather(gathered, n, group=counts))
        sizes = gathered
    sizes = [int(s) for s in sizes]
    if sizes[rank()] != t.shape[0]:
        raise RuntimeError(f"all_gather: this rank has {t.shape[0]} rows, {sizes[rank()]} were announced")
    if _carried is not None and group is None:
        return exchange([t] * w, recv_sizes=sizes, name="all_gather")
    pad = t.new_zeros((max(sizes), *t.shape[1:]))
    pad[: t.shape[0]] = t
    out = [torch.empty_like(pad) for _ in range(w)]
    _check("all_gather", lambda: dist.all_gather(out, pad.contiguous(), group=group))
    return [o[:s] for o, s in zip(out, sizes)]


class Exchange:
    """An `exchange` under way (`start_exchange`): `wait` returns what `exchange` would."""

    def __init__(self, parts: list[torch.Tensor], work: Any = None, name: str = "all_to_all",
                 sent: Optional[torch.Tensor] = None) -> None:
        self._parts, self._work, self._name = parts, work, name
        self._sent = sent  # held until the exchange is done

    def wait(self) -> list[torch.Tensor]:
        """What each rank sent here, once it has come."""
        if self._work is not None:
            _failing_as_peer(self._name, self._work.wait)
            self._work = self._sent = None
        return self._parts


def exchange(send: Sequence[torch.Tensor], group: Any = None,
             recv_sizes: Optional[Sequence[int]] = None, name: str = "all_to_all") -> list[torch.Tensor]:
    """Send `send[r]` to rank r and return what each rank sent here, in one batched
    `all_to_all_single`. Tensors share dtype and trailing shape. `recv_sizes`: the rows each
    rank sends here, where this rank knows them (a reply to its own request); else the row
    counts are exchanged first, in one more collective. `group`: a process group spanning all
    ranks (default: the default group). `name`: the collective's name in failure messages."""
    return _exchange(send, group, recv_sizes, name, True).wait()


def start_exchange(send: Sequence[torch.Tensor], group: Any = None, recv_sizes: Optional[Sequence[int]] = None,
                   name: str = "all_to_all") -> Exchange:
    """`exchange`, left under way while this rank goes on: the rows arrive in the background
    (`Exchange.wait`). The sent tensors must stay unchanged until then; the collectives that
    follow on `group` run after it."""
    return _exchange(send, group, recv_sizes, name, False)


def _exchange(send: Sequence[torch.Tensor], group: Any, recv_sizes: Optional[Sequence[int]], name: str,
              wait: bool) -> Exchange:
    w = world_size()
    if len(send) != w:
        raise ValueError(f"exchange needs one tensor per rank ({w}), got {len(send)}")
    if w == 1:
        return Exchange([send[0]])
    ref = send[0]
    _on_device(name, ref, group)
    in_split = [s.shape[0] for s in send]
    carried = _take_carried(group) if wait else None
    if recv_sizes is None:
        in_sizes = torch.tensor(in_split, dtype=torch.int64)
        out_sizes = torch.empty_like(in_sizes)
        counts = counts_group(ref, group)
        _check("all_to_all(sizes)", lambda: dist.all_to_all_single(out_sizes, in_sizes, group=counts))
        recv_sizes = out_sizes.tolist()
    out_split = [int(n) for n in recv_sizes]
    if carried is not None:
        return Exchange(_exchange_carrying(send, out_split, carried, name))
    flat_in = joined([s.reshape(s.shape[0], *ref.shape[1:]) for s in send])
    flat_out = ref.new_empty((sum(out_split), *ref.shape[1:]))
    work = _check(name, lambda: dist.all_to_all_single(flat_out, flat_in, out_split, in_split, group=group,
                                                       async_op=not wait))
    return Exchange(list(flat_out.split(out_split)), work, name, flat_in)


def joined(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """`torch.cat(parts)` (contiguous), without the copy where the parts lie back to back in one
    tensor, as the split of one tensor or what an exchange returns do: then a view of it."""
    full = [p for p in parts if p.numel()]  # an empty tensor has no address
    if not full:
        return torch.cat(parts)
    first, at = full[0], full[0].data_ptr()
    for p in full:
        if not p.is_contiguous() or p.untyped_storage().data_ptr() != first.untyped_storage().data_ptr() \
                or p.data_ptr() != at or p.shape[1:] != first.shape[1:] or p.dtype != first.dtype:
            return torch.cat(parts)
        at += p.numel() * p.element_size()
    rows = sum(p.shape[0] for p in full)
    return first.as_strided((rows, *first.shape[1:]), (math.prod(first.shape[1:]), *first.stride()[1:]),
                            first.storage_offset())


def pack(cols: Sequence[torch.Tensor]) -> torch.Tensor:
    """Rows of tensors sharing their first dimension, side by side as raw bytes [R, total]: one
    tensor for `exchange` (columns of no width take none)."""
    def as_bytes(c: torch.Tensor) -> torch.Tensor:
        flat = c.reshape(-1)
        if flat.stride(0) != 1:  # a dim of size 1 may have any stride, which `clone` keeps
            flat = torch.empty_like(flat, memory_format=torch.contiguous_format).copy_(flat)
        return flat.view(torch.uint8).view(r, math.prod(c.shape[1:]) * c.element_size())

    r = cols[0].shape[0]
    raw = [as_bytes(c) for c in cols if math.prod(c.shape[1:])]
    return torch.cat(raw, 1) if raw else torch.empty((r, 0), dtype=torch.uint8)


def unpack_into(buf: torch.Tensor, outs: Sequence[torch.Tensor]) -> None:
    """`unpack` into the contiguous tensors `outs` (a column each, in order, of `buf`'s rows)."""
    at = 0
    for o in outs:
        width = math.prod(o.shape[1:]) * o.element_size()
        if o.numel():
            o.view(-1).view(torch.uint8).view(o.shape[0], width).copy_(buf[:, at:at + width])
        at += width


def unpack(buf: torch.Tensor, like: Sequence[tuple[torch.dtype, tuple[int, ...]]], take: Optional[torch.Tensor] = None
           ) -> list[torch.Tensor]:
    """Inverse of `pack`: columns of the given (dtype, per-row shape), in order; of the rows `take`
    only, in its order, where given (as `unpack(buf[take])`, with one copy instead of two)."""
    out, at, r = [], 0, buf.shape[0] if take is None else take.numel()
    for dtype, shape in like:
        width = math.prod(shape) * dtype.itemsize
        col = buf[:, at:at + width]  # made a copy at offset 0
        col = col.clone(memory_format=torch.contiguous_format) if take is None else col.index_select(0, take)
        out.append(col.view(-1).view(dtype).view(r, *shape) if width else torch.empty((r, *shape), dtype=dtype))
        at += width
    return out


class PeerFailure(GnndistError):
    """A collective failed because another rank died, failed or stalled (the message names it)."""


def log(msg: str) -> None:
    """Print on rank 0 only."""
    if rank() == 0:
        print(msg, file=sys.stderr, flush=True)


class GradientSum:
    """The gradients of `params`, and `extra` (e.g. the loss), summed over the ranks in one
    collective: on its own (`result`), or carried by the exchange of the state write that
    precedes it (`carrying`). A parameter that no rank has a gradient for keeps none (as in one
    process, the optimizer then skips it)."""

    def __init__(self, params: Sequence[torch.nn.Parameter], extra: Optional[torch.Tensor] = None) -> None:
        self.params, self.extra = list(params), extra
        self._flat: Optional[torch.Tensor] = None
        self._has: list[bool] = []
        self.summed = False

    @property
    def size(self) -> int:
        """The entries of `flat`."""
        return sum(p.numel() for p in self.params) + len(self.params) + (0 if self.extra is None else
                                                                          self.extra.numel())

    def flat(self, into: Optional[torch.Tensor] = None) -> torch.Tensor:
        """This rank's gradients, a flag per parameter (whether it has one) and `extra`, as one
        float32 vector of `size` entries (the sum once `summed`); made in `into` (e.g. the front
        of an exchange's send buffer) where given, which then holds it."""
        if self._flat is None:
            dev = self.params[0].device
            extra = (torch.zeros(0, device=dev) if self.extra is None
                     else self.extra.detach().reshape(-1).float().to(dev))
            self._has = [p.grad is not None for p in self.params]
            self._flat = torch.cat([p.grad.reshape(-1) if h else torch.zeros(p.numel(), device=dev)
                                    for p, h in zip(self.params, self._has)]
                                   + [torch.tensor(self._has, dtype=torch.float32, device=dev), extra], out=into)
        elif into is not None:
            self._flat = into.copy_(self._flat)
        return self._flat

    def result(self) -> Optional[torch.Tensor]:
        """Replace each gradient by its sum over the ranks (summing now, unless an exchange
        carried it): views of the one summed vector, which nothing else holds; the summed
        `extra`."""
        if world_size() == 1:
            return self.extra
        flat = self.flat()
        if not self.summed:
            all_reduce(flat)
            self.summed = True
        at, has = 0, self._has
        for p in self.params:
            p.grad = flat[at:at + p.numel()].view_as(p)
            at += p.numel()
        if not all(has):  # a parameter without a gradient here: the sum says whether a rank had one
            has = flat[at:at + len(self.params)].tolist()
        for p, h in zip(self.params, has):
            if not h:
                p.grad = None
        return flat[at + len(self.params):]


def sum_gradients(params: Sequence[torch.nn.Parameter], extra: Optional[torch.Tensor] = None
                  ) -> Optional[torch.Tensor]:
    """Replace each gradient by its sum over the ranks and return `extra` summed with them, in
    one collective (`GradientSum`)."""
    return GradientSum(params, extra).result()


_carried: Optional[GradientSum] = None  # for the next exchange on the default group to carry


@contextlib.contextmanager
def carrying(s: GradientSum) -> Iterator[None]:
    """Within the block, the first exchange or gather on the default group also sums `s`, where
    a sum is a swap (`swaps`): a training step's state write and its gradient sum then travel in
    one collective instead of two (faster: docs/benchmarks.md, "Measurements behind the code").
    Elsewhere `s.result()` sums on its own after the block."""
    global _carried
    _carried = s if swaps() else None
    try:
        yield
    finally:
        _carried = None


def _take_carried(group: Any) -> Optional[GradientSum]:
    """The gradient sum this exchange on `group` carries, if any (it carries it once)."""
    global _carried
    if group is not None:
        return None
    s, _carried = _carried, None
    return s


def _exchange_carrying(send: Sequence[torch.Tensor], recv_sizes: list[int], s: GradientSum,
                       name: str) -> list[torch.Tensor]:
    """`exchange` between the two ranks of a swap, the gradient sum `s` travelling with the rows:
    one all-to-all of raw bytes, gradients first (padded to 16 bytes, so the rows stay aligned)."""
    me, other = rank(), 1 - rank()
    rows, grad_bytes = send[other].contiguous(), 4 * s.size
    head = -(-grad_bytes // 16) * 16
    row_bytes = math.prod(rows.shape[1:]) * rows.element_size()
    out = torch.empty(head + rows.numel() * rows.element_size(), dtype=torch.uint8)
    flat = s.flat(out[:grad_bytes].view(torch.float32))  # made in place: no copy of the gradients
    out[grad_bytes:head] = 0
    out[head:] = rows.reshape(-1).view(torch.uint8)
    got = torch.empty(head + recv_sizes[other] * row_bytes, dtype=torch.uint8)
    out_split, in_split = [[0, n] if me == 0 else [n, 0] for n in (got.numel(), out.numel())]
    _check(f"{name} (with the gradient sum)", lambda: dist.all_to_all_single(got, out, out_split, in_split))
    flat.add_(got[:grad_bytes].view(torch.float32))  # a + b == b + a: the same sum on both ranks
    s.summed = True
    parts = [send[me], got[head:].view(rows.dtype).reshape(recv_sizes[other], *rows.shape[1:])]
    return parts if me == 0 else parts[::-1]


def line_prefix() -> str:
    """What this rank's lines start with in a torchrun world: its rank and host, as in
    `rank 1 (host node2, 10.0.0.2): `; nothing outside one."""
    return f"rank {_heartbeat.rank} (host {_heartbeat.host}): " if _heartbeat is not None else ""


def say(msg: str) -> None:
    """Print on this rank, after its rank and host when it is one of a torchrun world."""
    print(line_prefix() + msg, file=sys.stderr, flush=True)
