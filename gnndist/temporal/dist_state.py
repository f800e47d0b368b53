"""Node state of memory-based TGNNs across ranks, with the interface of `NodeState`.

`ReplicatedNodeState`: every rank holds all rows; after each batch the ranks all-gather the
rows they wrote and apply them in global event order. `PartitionedNodeState`: each rank holds
only the rows of the nodes it owns; `read` fetches other rows from their owners in one batched
exchange (and keeps none of them), `write` sends rows to their owners. Both are collectives:
all ranks call `read` and `write` together, with or without rows of their own.

Several ranks may write the same node in one batch (it took part in events of each). Before
`write`, the trainer names the batch's events on this rank with `begin_batch(src, dst, eid)`;
each written row is keyed by its node's last event there (`2 * eid + side`), and the row with
the largest key over all ranks wins: the node's globally last event, as in one process.

APAN's mails go to more nodes than the batch's endpoints (`deliver`): each mail travels alone,
with its global order `2 * eid + side`, and the holder of the node's row merges it into the
mailbox by (time, order), as one process does.

What depends on the events only is exchanged ahead of the steps, for a window of them at once
(`plan`): how many rows each rank writes (so a write needs no count exchange) and, partitioned,
which rows each step reads from each owner (so a read is one reply).

Rows travel as raw bytes: one uint8 row per node holding its id, key, memory, last-update time,
mails and mail times (a delivered mail: recipient id, order, time, mail). Traffic counters (`rows_fetched`, `bytes_sent`) count what this rank sent
to or fetched from other ranks, not what it moved to itself.
"""
from __future__ import annotations

from collections import deque
from typing import Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from gnndist import dist as gdist
from gnndist.dist import pack, unpack
from gnndist.device import to_device
from gnndist.graph import owners
from gnndist.samplers.distributed import requests_per_step, sampler_group
from gnndist.temporal.state import NodeState

_INT = torch.int64


def last_event_rows(ids: Tensor, key: Tensor) -> tuple[Tensor, Tensor]:
    """Where rows (ids, key) go and which row goes there: (every row's id, the row with its id's
    largest key), so that storing row `winner[i]` at `ids[i]` for every i keeps each id's row of
    its last event. A repeated id gets the same row each time, so the order of the writes does
    not matter, and no result is sized by the data: nothing waits for the device."""
    o = torch.argsort(key, stable=True)
    o = o[torch.argsort(ids[o], stable=True)]  # by id, then key
    at = ids[o]
    return at, o[torch.searchsorted(at, at, right=True) - 1]


class _RankState:
    """What both distributed states share: the keys of this batch's writes (the position of each
    node's last event on this rank), the planned sizes of the coming writes and the traffic
    counters."""

    device: torch.device
    _nodes: Optional[np.ndarray] = None  # this batch's endpoints, sorted (host)
    _keys: Optional[Tensor] = None  # their keys (device)
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
        ids): each endpoint's key is that of its last event here."""
        ends = np.stack([src, dst], 1).reshape(-1)
        keys = np.stack([2 * eid, 2 * eid + 1], 1).reshape(-1)
        o = np.lexsort((keys, ends))  # by node, then key
        ends, keys = ends[o], keys[o]
        last = np.ones(ends.size, bool)
        last[:-1] = ends[1:] != ends[:-1]
        self._nodes, self._keys = ends[last], to_device(keys[last], self.device)

    def key_of(self, ids: np.ndarray) -> Tensor:
        """The key of each written id (a host array of endpoints named by `begin_batch`)."""
        if self._nodes is None:
            raise RuntimeError("begin_batch must name the batch's events before write")
        pos = np.searchsorted(self._nodes, ids).clip(max=max(self._nodes.size - 1, 0))
        if ids.size and (self._nodes.size == 0 or not np.array_equal(self._nodes[pos], ids)):
            raise RuntimeError("write of a node that is no endpoint of this rank's events")
        return self._keys[to_device(pos, self.device)]


def on_host(ids: Tensor, host: Optional[np.ndarray]) -> np.ndarray:
    """`host`, the ids as the caller's host array, or else the ids read back from the device."""
    return ids.cpu().numpy() if host is None else host


def _layout(state: NodeState) -> list[tuple[torch.dtype, tuple[int, ...]]]:
    """(dtype, row shape) of (id, key, memory, last_update, mail, mail_time)."""
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
        return torch.cat(parts)

    def write(self, ids: Tensor, memory: Tensor, last_update: Tensor, mail: Tensor, mail_time: Tensor,
              host_ids: Optional[np.ndarray] = None) -> None:
        """Apply this batch's rows from every rank."""
        buf = pack([ids, self.key_of(on_host(ids, host_ids)), memory.detach(), last_update, mail.detach(), mail_time])
        ids, key, *rows = unpack(self._gather(buf, self._planned_write()), _layout(self))
        at, winner = last_event_rows(ids, key)
        super().write(at, *(x[winner] for x in rows))

    def deliver(self, ids: Tensor, memory: Tensor, last_update: Tensor, to: Tensor, mail: Tensor,
                mail_time: Tensor, seq: Tensor, host_ids: Optional[np.ndarray] = None,
                host_to: Optional[np.ndarray] = None) -> None:
        """Apply this batch's memory rows and mails from every rank."""
        key = self.key_of(on_host(ids, host_ids))
        ids, key, memory, last_update = unpack(self._gather(pack([ids, key, memory.detach(), last_update]),
                                                            self._planned_write()), _layout(self)[:4])
        to, seq, mail_time, mail = unpack(self._gather(pack([to, seq, mail_time, mail.detach()])),
                                          _mail_layout(self))
        at, winner = last_event_rows(ids, key)
        super().deliver(at, memory[winner], last_update[winner], to, mail, mail_time, seq)


class PartitionedNodeState(_RankState):
    """The rows of the nodes this rank owns: rank r owns the node ids `node_offsets[r] ..
    node_offsets[r+1]-1` (a partition store's numbering). Other rows are fetched from their
    owners per batch and never kept here."""

    def __init__(self, node_offsets: Sequence[int], memory_dim: int, mail_dim: int, mailbox_size: int = 1,
                 start_time: float = 0.0, device: torch.device | str = "cpu") -> None:
        self.rank = gdist.rank()
        self.offsets = np.asarray(list(node_offsets), dtype=np.int64)
        if self.offsets.size != gdist.world_size() + 1:
            raise ValueError(f"node_offsets has {self.offsets.size} entries; the world of "
                             f"{gdist.world_size()} ranks needs {gdist.world_size() + 1}")
        self.lo, self.hi = int(self.offsets[self.rank]), int(self.offsets[self.rank + 1])
        self.num_nodes = int(self.offsets[-1])
        self.local = NodeState(self.hi - self.lo, memory_dim, mail_dim, mailbox_size, start_time, device)
        self.device = self.local.memory.device

    def provisional(self):
        """The writes within the block are undone at its end (`NodeState.provisional`)."""
        return self.local.provisional()

    def reset(self) -> None:
        self.local.reset()

    def plan(self, writes: list[np.ndarray], reads: Optional[list[np.ndarray]] = None) -> tuple[deque, deque]:
        """How many rows each owner gets from each rank in each coming write, in one exchange;
        and the ids each coming read asks each owner for, in one more (without `reads`, the
        reads ask step by step)."""
        w, group, k = self.offsets.size - 1, sampler_group(), len(writes)
        counts = np.stack([np.bincount(owners(ids, self.offsets), minlength=w) for ids in writes]).reshape(k, w)
        got = gdist.exchange(list(torch.from_numpy(np.ascontiguousarray(counts.T))), group, recv_sizes=[k] * w)
        write_sizes = deque(torch.stack(got, 1).tolist())
        if reads is None:
            return write_sizes, deque()
        routed = requests_per_step(reads, [owners(ids, self.offsets) for ids in reads], group)
        self.bytes_sent += 16 * sum(sum(r.send_sizes) - r.send_sizes[self.rank] for r in routed)  # id, step
        return write_sizes, deque(zip(reads, routed))

    def _to_owners(self, ids: np.ndarray, rows: Tensor, recv_sizes: Optional[list[int]] = None
                   ) -> tuple[list[Tensor], Tensor, list[int]]:
        """Send row i of `rows` to the owner of node `ids[i]` (a host array; `recv_sizes`: the
        rows each rank sends here, if known); returns (what each rank sent here, the send order,
        rows sent per rank). Counts the bytes that leave this rank."""
        owner = owners(ids, self.offsets)
        order = to_device(np.argsort(owner, kind="stable"), self.device)
        sizes = np.bincount(owner, minlength=self.offsets.size - 1).tolist()
        recv = gdist.exchange(rows[order].split(sizes), recv_sizes=recv_sizes)
        per_row = rows[0].numel() * rows.element_size() if rows.shape[0] else 0
        self.bytes_sent += per_row * (sum(sizes) - sizes[self.rank])
        return recv, order, sizes

    def read(self, ids: Tensor, host_ids: Optional[np.ndarray] = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(memory, last_update, mail, mail_time) rows of the node ids `ids`: one reply from the
        owners where the read was planned, else the ids are sent to them first."""
        host_ids = on_host(ids, host_ids)
        if self._reads:
            planned, step = self._reads.popleft()
            if not np.array_equal(planned, host_ids):
                raise RuntimeError("a read of other ids than the ones planned")
            mine, sizes, recv_sizes = (to_device(step.received[:, 0] - self.lo, self.device), step.send_sizes,
                                       step.recv_sizes)
            back_order = to_device(np.argsort(step.order), self.device)
        else:
            asked, order, sizes = self._to_owners(host_ids, ids.unsqueeze(1))
            recv_sizes = [a.shape[0] for a in asked]
            mine, back_order = torch.cat(asked).squeeze(1) - self.lo, torch.argsort(order)
        rows = pack(self.local.read(mine))
        back = gdist.exchange(rows.split(recv_sizes), recv_sizes=sizes)
        self.bytes_sent += rows.shape[1] * (sum(recv_sizes) - recv_sizes[self.rank])
        self.rows_fetched += sum(sizes) - sizes[self.rank]
        got = torch.cat(back)  # in send order: back into the order of `ids`
        return tuple(unpack(got.index_select(0, back_order), _layout(self.local)[2:]))

    def write(self, ids: Tensor, memory: Tensor, last_update: Tensor, mail: Tensor, mail_time: Tensor,
              host_ids: Optional[np.ndarray] = None) -> None:
        """Send each row to its owner, which keeps per node the row of the globally last event."""
        host_ids = on_host(ids, host_ids)
        buf = pack([ids, self.key_of(host_ids), memory.detach(), last_update, mail.detach(), mail_time])
        ids, key, *rows = unpack(torch.cat(self._to_owners(host_ids, buf, self._planned_write())[0]),
                                 _layout(self.local))
        at, winner = last_event_rows(ids, key)
        self.local.write(at - self.lo, *(x[winner] for x in rows))

    def deliver(self, ids: Tensor, memory: Tensor, last_update: Tensor, to: Tensor, mail: Tensor,
                mail_time: Tensor, seq: Tensor, host_ids: Optional[np.ndarray] = None,
                host_to: Optional[np.ndarray] = None) -> None:
        """Send each memory row and each mail to its node's owner, which keeps the memory of the
        globally last event and merges the mails into the mailbox."""
        host_ids = on_host(ids, host_ids)
        rows = pack([ids, self.key_of(host_ids), memory.detach(), last_update])
        ids, key, memory, last_update = unpack(torch.cat(self._to_owners(host_ids, rows, self._planned_write())[0]),
                                               _layout(self.local)[:4])
        mails = pack([to, seq, mail_time, mail.detach()])
        to, seq, mail_time, mail = unpack(torch.cat(self._to_owners(on_host(to, host_to), mails)[0]),
                                          _mail_layout(self.local))
        at, winner = last_event_rows(ids, key)
        self.local.deliver(at - self.lo, memory[winner], last_update[winner], to - self.lo, mail, mail_time, seq)

    def state_dict(self) -> dict[str, Tensor]:
        """This rank's rows, with the id range they belong to."""
        return {**self.local.state_dict(), "node_range": torch.tensor([self.lo, self.hi])}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        state = dict(state)
        got = state.pop("node_range").tolist()
        if got != [self.lo, self.hi]:
            raise ValueError(f"node state rows are of ids {got[0]}..{got[1] - 1}, this rank owns "
                             f"{self.lo}..{self.hi - 1}")
        self.local.load_state_dict(state)
