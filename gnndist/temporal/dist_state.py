"""Node state of memory-based TGNNs across ranks, with the interface of `NodeState`.

`ReplicatedNodeState`: every rank holds all rows; after each batch the ranks all-gather the
rows they wrote and apply them in global event order. `PartitionedNodeState`: each rank holds
only the rows of the nodes it owns; `read` takes its own rows from its table and fetches the
others from their owners in one batched exchange (and keeps none of them), `write` sends rows
to their owners. Both are collectives: all ranks call `read` and `write` together, with or
without rows of their own.

Several ranks may write the same node in one batch (it took part in events of each). Before
`write`, the trainer names the batch's events on this rank with `begin_batch(src, dst, eid)`;
each written row is ordered by its node's last event there (`2 * eid + side`), and the row with
the largest order over all ranks wins: the node's globally last event, as in one process.

APAN's mails go to more nodes than the batch's endpoints (`deliver`): each mail travels alone,
with its global order `2 * eid + side`, and the owner of the node's row merges it into the
mailbox by (time, order), as one process does.

What depends on the events only is exchanged ahead of the steps, for a window of them at once
(`plan`): how many rows each rank writes (so a write needs no count exchange) and, partitioned,
which rows each step reads from each owner (so a read is one reply, which the owners send as
soon as the step before has written: it travels while that step ends).

Rows travel as raw bytes: one uint8 row per node holding its id, write order, memory, last-update time,
mails and mail times (a delivered mail: recipient id, order, time, mail). Traffic counters
(`rows_fetched`, `bytes_sent`) count what this rank sent to or fetched from other ranks, not
what it moved to itself.
"""
from __future__ import annotations

from collections import deque
from contextlib import contextmanager
from typing import Iterator, Optional

import numpy as np
import torch
from torch import Tensor

from gnndist.runtime import dist as gdist
from gnndist.runtime.dist import joined, pack, unpack, unpack_into
from gnndist.runtime.device import to_device
from gnndist.partition import PartitionBook
from gnndist.samplers.distributed import StepRequests, requests_per_step, sampler_group
from gnndist.temporal.state import NodeState

_INT = torch.int64


def last_event_rows(ids: Tensor, order: Tensor) -> tuple[Tensor, Tensor]:
    """Where rows (ids, order) go and which row goes there: (every row's id, the row with its id's
    largest order), so that storing row `winner[i]` at `ids[i]` for every i keeps each id's row of
    its last event. A repeated id gets the same row each time, so the order of the writes does
    not matter, and no result is sized by the data: nothing waits for the device."""
    o = torch.argsort(order, stable=True)
    o = o[torch.argsort(ids[o], stable=True)]  # by id, then order
    at = ids[o]
    return at, o[torch.searchsorted(at, at, right=True) - 1]


def _winning_rows(buf: Tensor, layout: list[tuple[torch.dtype, tuple[int, ...]]]) -> tuple[Tensor, list[Tensor]]:
    """Of packed written rows (`layout`: id, order, then the row's columns), where each id's row of
    its last event goes and the columns of that row (`last_event_rows`)."""
    at, winner = last_event_rows(*unpack(buf, layout[:2]))
    return at, unpack(buf, layout, take=winner)[2:]


class _RankState:
    """What both distributed states share: the order of this batch's writes (the position of each
    node's last event on this rank), the planned sizes of the coming writes and the traffic
    counters."""

    device: torch.device
    _nodes: Optional[np.ndarray] = None  # this batch's endpoints, sorted (host)
    _order: Optional[Tensor] = None  # their order (device)
    _write_sizes: Optional[deque] = None  # of the coming steps' writes: the rows each rank sends here
    _reads: Optional[deque] = None  # of the coming steps' reads, where they travel: (ids, their routes)
    rows_fetched = 0  # rows received from other ranks
    bytes_sent = 0  # bytes sent to other ranks

    def _planned_write(self) -> Optional[list[int]]:
        """The rows each rank sends here in this step's write (or memory rows of `deliver`), if
        planned."""
        return self._write_sizes.popleft() if self._write_sizes else None

    def reset_traffic(self) -> None:
        self.rows_fetched = self.bytes_sent = 0

    def use(self, plan: tuple[deque, deque]) -> None:
        """Have the coming steps' writes and reads follow `plan`'s routes (`plan`'s return)."""
        self._write_sizes, self._reads = plan

    def begin_batch(self, src: np.ndarray, dst: np.ndarray, eid: np.ndarray) -> None:
        """Name the events this rank processes in the current batch (host arrays; global event
        ids): each endpoint's order is that of its last event here."""
        ends = np.stack([src, dst], 1).reshape(-1)
        order = np.stack([2 * eid, 2 * eid + 1], 1).reshape(-1)
        o = np.lexsort((order, ends))  # by node, then order
        ends, order = ends[o], order[o]
        last = np.ones(ends.size, bool)
        last[:-1] = ends[1:] != ends[:-1]
        self._nodes, self._order = ends[last], to_device(order[last], self.device)

    def order_of(self, ids: np.ndarray) -> Tensor:
        """The write order of each written id (a host array of endpoints named by `begin_batch`)."""
        if self._nodes is None:
            raise RuntimeError("begin_batch must name the batch's events before write")
        pos = np.searchsorted(self._nodes, ids).clip(max=max(self._nodes.size - 1, 0))
        if ids.size and (self._nodes.size == 0 or not np.array_equal(self._nodes[pos], ids)):
            raise RuntimeError("write of a node that is no endpoint of this rank's events")
        return self._order[to_device(pos, self.device)]


def on_host(ids: Tensor, host: Optional[np.ndarray]) -> np.ndarray:
    """`host`, the ids as the caller's host array, or else the ids read back from the device."""
    return ids.cpu().numpy() if host is None else host


def _layout(state: NodeState) -> list[tuple[torch.dtype, tuple[int, ...]]]:
    """(dtype, row shape) of (id, order, memory, last_update, mail, mail_time)."""
    return [(_INT, ()), (_INT, ())] + [(t.dtype, tuple(t.shape[1:])) for t in
                                       (state.memory, state.last_update, state.mail, state.mail_time)]


def _mail_layout(state: NodeState) -> list[tuple[torch.dtype, tuple[int, ...]]]:
    """(dtype, row shape) of a delivered mail: (recipient, order, time, mail)."""
    return [(_INT, ()), (_INT, ()), (state.mail_time.dtype, ()), (state.mail.dtype, tuple(state.mail.shape[2:]))]


class ReplicatedNodeState(_RankState, NodeState):
    """All rows on every rank; writes are all-gathered and applied in global event order."""

    def __init__(self, num_nodes: int, memory_dim: int, mail_dim: int, mailbox_size: int = 1,
                 start_time: float = 0.0, device: torch.device | str = "cpu") -> None:
        super().__init__(num_nodes, memory_dim, mail_dim, mailbox_size, start_time, device)
        self.device = self.memory.device

    def plan(self, writes: list[np.ndarray], reads: Optional[list[np.ndarray]] = None) -> tuple[deque, deque]:
        """Every rank's row count of each coming write, in one all-gather (reads are local)."""
        mine = torch.tensor([ids.size for ids in writes], dtype=torch.int64)
        counts = torch.stack(gdist.all_gather_varsize(mine, sampler_group(), [len(writes)] * gdist.world_size()), 1)
        return deque(counts.tolist()), deque()

    def _gather(self, buf: Tensor, sizes: Optional[list[int]] = None) -> Tensor:
        """Every rank's `buf` rows (`sizes` of them, if known), concatenated (counts what this
        rank sends and receives)."""
        parts = gdist.all_gather_varsize(buf, sizes=sizes)
        me = gdist.rank()
        self.bytes_sent += buf.numel() * (len(parts) - 1)
        self.rows_fetched += sum(p.shape[0] for r, p in enumerate(parts) if r != me)
        return joined(parts)

    def write(self, ids: Tensor, memory: Tensor, last_update: Tensor, mail: Tensor, mail_time: Tensor,
              host_ids: Optional[np.ndarray] = None) -> None:
        """Apply this batch's rows from every rank."""
        buf = pack([ids, self.order_of(on_host(ids, host_ids)), memory.detach(), last_update, mail.detach(), mail_time])
        at, rows = _winning_rows(self._gather(buf, self._planned_write()), _layout(self))
        super().write(at, *rows)

    def deliver(self, ids: Tensor, memory: Tensor, last_update: Tensor, to: Tensor, mail: Tensor,
                mail_time: Tensor, seq: Tensor, host_ids: Optional[np.ndarray] = None,
                host_to: Optional[np.ndarray] = None) -> None:
        """Apply this batch's memory rows and mails from every rank."""
        order = self.order_of(on_host(ids, host_ids))
        at, (memory, last_update) = _winning_rows(self._gather(pack([ids, order, memory.detach(), last_update]),
                                                                  self._planned_write()), _layout(self)[:4])
        to, seq, mail_time, mail = unpack(self._gather(pack([to, seq, mail_time, mail.detach()])),
                                          _mail_layout(self))
        super().deliver(at, memory, last_update, to, mail, mail_time, seq)


class PartitionedNodeState(_RankState):
    """The rows of the nodes this rank owns: rank r owns the node ids
    `book.range(r)` (a partition store's numbering). Other rows are fetched from their
    owners per batch and never kept here."""

    def __init__(self, book: PartitionBook, memory_dim: int, mail_dim: int, mailbox_size: int = 1,
                 start_time: float = 0.0, device: torch.device | str = "cpu") -> None:
        self.rank = gdist.rank()
        self.book = book.for_world(gdist.world_size())
        self.lo, self.hi = book.range(self.rank)
        self.num_nodes = book.num_nodes
        self.local = NodeState(self.hi - self.lo, memory_dim, mail_dim, mailbox_size, start_time, device)
        self.device = self.local.memory.device
        self._reply: Optional[tuple[np.ndarray, gdist.Exchange]] = None  # of the next read, sent ahead

    @contextmanager
    def provisional(self) -> Iterator[None]:
        """The writes within the block are undone at its end (`NodeState.provisional`)."""
        with self.local.provisional():
            try:
                yield
            finally:
                self._drop_reply()

    def reset(self) -> None:
        self._drop_reply()
        self.local.reset()

    def use(self, plan: tuple[deque, deque]) -> None:
        self._drop_reply()
        super().use(plan)

    def plan(self, writes: list[np.ndarray], reads: Optional[list[np.ndarray]] = None) -> tuple[deque, deque]:
        """How many rows each owner gets from each rank in each coming write, in one exchange;
        and the ids each coming read asks each owner for, in one more (without `reads`, the
        reads ask step by step)."""
        w, group, k = self.book.num_parts, sampler_group(), len(writes)
        counts = np.stack([np.bincount(self.book.owner(ids), minlength=w) for ids in writes]).reshape(k, w)
        got = gdist.exchange(list(torch.from_numpy(np.ascontiguousarray(counts.T))), group, recv_sizes=[k] * w)
        write_sizes = deque(torch.stack(got, 1).tolist())
        if reads is None:
            return write_sizes, deque()
        owner = [self.book.owner(ids) for ids in reads]
        other = [o != self.rank for o in owner]  # this rank's own rows are read here
        routed = requests_per_step([ids[m] for ids, m in zip(reads, other)], [o[m] for o, m in zip(owner, other)],
                                   group)
        self.bytes_sent += 16 * sum(sum(r.send_sizes) for r in routed)  # id, step
        return write_sizes, deque(zip(reads, routed))

    def _to_owners(self, ids: np.ndarray, rows: Tensor, recv_sizes: Optional[list[int]] = None) -> Tensor:
        """Send row i of `rows` to the owner of node `ids[i]` (a host array; `recv_sizes`: the
        rows each rank sends here, if known); returns what the ranks sent here, in rank order.
        Counts the bytes that leave this rank."""
        owner = self.book.owner(ids)
        sizes = np.bincount(owner, minlength=self.book.num_parts).tolist()
        if np.any(owner[1:] < owner[:-1]):  # not in owner order yet (a write's ids are increasing)
            rows = rows[to_device(np.argsort(owner, kind="stable"), self.device)]
        recv = gdist.exchange(rows.split(sizes), recv_sizes=recv_sizes)
        per_row = rows[0].numel() * rows.element_size() if rows.shape[0] else 0
        self.bytes_sent += per_row * (sum(sizes) - sizes[self.rank])
        return joined(recv)

    def read(self, ids: Tensor, host_ids: Optional[np.ndarray] = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(memory, last_update, mail, mail_time) rows of the node ids `ids` (distinct, increasing,
        as `state_rows` gives them): this rank's own from its table, the others' from their
        owners: where the read was planned, their reply (sent after the write before it,
        `_send_next_reply`, or now), else the ids are sent to them first."""
        host_ids = on_host(ids, host_ids)
        if host_ids.size > 1 and not np.all(host_ids[1:] > host_ids[:-1]):
            raise ValueError("a partitioned read takes distinct node ids in increasing order")
        bounds = np.searchsorted(host_ids, self.book.offsets)  # rank r's rows: bounds[r] .. bounds[r+1]-1
        a, b = int(bounds[self.rank]), int(bounds[self.rank + 1])
        reply, self._reply = self._reply, None
        if reply is None and self._reads:
            reply = self._send_reply(*self._reads.popleft())
        if reply is not None:
            planned, under_way = reply
            if not np.array_equal(planned, host_ids):
                under_way.wait()
                raise RuntimeError("a read of other ids than the ones planned")
        else:
            sizes = [0 if r == self.rank else int(n) for r, n in enumerate(np.diff(bounds))]
            asked = gdist.exchange([ids[int(lo):int(lo) + n] for lo, n in zip(bounds, sizes)])
            under_way = self._answer(joined(asked) - self.lo, [x.shape[0] for x in asked], sizes)
        out = [torch.empty((host_ids.size, *shape), dtype=dtype, device=self.device)
               for dtype, shape in _layout(self.local)[2:]]
        self.local.read(ids[a:b] - self.lo, out=[o[a:b] for o in out])
        got = joined(under_way.wait())  # the other ranks' rows in rank order: those before this rank's, then after
        unpack_into(got[:a], [o[:a] for o in out])
        unpack_into(got[a:], [o[b:] for o in out])
        return tuple(out)

    def _answer(self, mine: Tensor, asked: list[int], sizes: list[int]) -> gdist.Exchange:
        """Send the rows `mine` (local row numbers, `asked[r]` of them asked for by rank r, in
        rank order) to the ranks that asked, and get those this rank asked for (`sizes[r]` from
        rank r), under way."""
        rows = pack(self.local.read(mine))
        self.bytes_sent += rows.shape[1] * sum(asked)
        self.rows_fetched += sum(sizes)
        return gdist.start_exchange(rows.split(asked), recv_sizes=sizes)

    def _send_reply(self, planned: np.ndarray, step: StepRequests) -> tuple[np.ndarray, gdist.Exchange]:
        """The reply to a planned read (its ids and routes, `plan`), under way: (the ids, the
        exchange)."""
        return planned, self._answer(to_device(step.received[:, 0] - self.lo, self.device), step.recv_sizes,
                                    step.send_sizes)

    def _send_next_reply(self) -> None:
        """After a write: the reply to the next planned read goes now (every rank writes and
        then reads in each step), in the background while the step ends and the next begins."""
        self._drop_reply()  # where a step wrote twice: not a reply to this write
        if self._reads:
            self._reply = self._send_reply(*self._reads.popleft())

    def _drop_reply(self) -> None:
        """Forget a reply sent ahead (the rows may change before the read): wait for it to come."""
        reply, self._reply = self._reply, None
        if reply is not None:
            reply[1].wait()

    def write(self, ids: Tensor, memory: Tensor, last_update: Tensor, mail: Tensor, mail_time: Tensor,
              host_ids: Optional[np.ndarray] = None) -> None:
        """Send each row to its owner, which keeps per node the row of the globally last event."""
        host_ids = on_host(ids, host_ids)
        buf = pack([ids, self.order_of(host_ids), memory.detach(), last_update, mail.detach(), mail_time])
        at, rows = _winning_rows(self._to_owners(host_ids, buf, self._planned_write()),
                                    _layout(self.local))
        self.local.write(at - self.lo, *rows)
        self._send_next_reply()

    def deliver(self, ids: Tensor, memory: Tensor, last_update: Tensor, to: Tensor, mail: Tensor,
                mail_time: Tensor, seq: Tensor, host_ids: Optional[np.ndarray] = None,
                host_to: Optional[np.ndarray] = None) -> None:
        """Send each memory row and each mail to its node's owner, which keeps the memory of the
        globally last event and merges the mails into the mailbox."""
        host_ids = on_host(ids, host_ids)
        rows = pack([ids, self.order_of(host_ids), memory.detach(), last_update])
        at, (memory, last_update) = _winning_rows(
            self._to_owners(host_ids, rows, self._planned_write()), _layout(self.local)[:4])
        mails = pack([to, seq, mail_time, mail.detach()])
        to, seq, mail_time, mail = unpack(self._to_owners(on_host(to, host_to), mails),
                                          _mail_layout(self.local))
        self.local.deliver(at - self.lo, memory, last_update, to - self.lo, mail, mail_time, seq)
        self._send_next_reply()

    def state_dict(self) -> dict[str, Tensor]:
        """This rank's rows (of the ids `held_ids`)."""
        return self.local.state_dict()

    def held_ids(self) -> np.ndarray:
        return np.arange(self.lo, self.hi, dtype=np.int64)

    def take_changed(self) -> tuple[Tensor, Optional[dict[str, Tensor]]]:
        """This rank's rows written since the last call (`NodeState.take_changed`)."""
        return self.local.take_changed()

    def load_rows(self, ids: np.ndarray, rows: dict[str, Tensor]) -> int:
        """Set this rank's rows among the global node ids `ids` (`NodeState.load_rows`)."""
        self._drop_reply()
        mine = (ids >= self.lo) & (ids < self.hi)
        at = torch.from_numpy(np.flatnonzero(mine))
        return self.local.load_rows(ids[mine] - self.lo, {k: v.index_select(0, at) for k, v in rows.items()})
