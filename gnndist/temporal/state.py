"""Per-node state of memory-based temporal GNNs, held as tensors.

`memory` [N, d], `last_update` [N] (time of the last mail folded into the memory), and a
mailbox of the last M mails per node: `mail` [N, M, m] with `mail_time` [N, M] (an empty slot
has time -inf). Times are float64 so that unix-second timestamps keep their resolution.
Rows are read and changed only through `read`, `write` and `deliver` (`provisional`: changes
undone after a block), which mark the rows they change for the next checkpoint
(`take_changed`); the distributed versions (`gnndist.temporal.dist_state`) have the same
methods.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from gnndist.errors import GnndistError
from gnndist.temporal.half_process import in_shared_memory

EMPTY = float("-inf")


class NodeState:
    """Memory, last-update time and mailbox rows of `num_nodes` nodes on one device."""

    def __init__(self, num_nodes: int, memory_dim: int, mail_dim: int, mailbox_size: int = 1,
                 start_time: float = 0.0, device: torch.device | str = "cpu") -> None:
        self.num_nodes, self.start_time = int(num_nodes), float(start_time)
        self.memory = torch.zeros(num_nodes, memory_dim, device=device)
        self.last_update = torch.zeros(num_nodes, dtype=torch.float64, device=device)
        self.mail = torch.zeros(num_nodes, mailbox_size, mail_dim, device=device)
        self.mail_time = torch.zeros(num_nodes, mailbox_size, dtype=torch.float64, device=device)
        self.changed = torch.zeros(num_nodes, dtype=torch.bool, device=device)  # rows written since `take_changed`
        self._undo: Optional[list[tuple[Tensor, tuple[Tensor, ...]]]] = None  # (rows, their rows before) while provisional
        self.reset()

    def move_to_shared_memory(self) -> None:
        """Its tables moved to memory that processes forked afterwards share
        (`gnndist.temporal.half_process`)."""
        self.memory, self.last_update, self.mail, self.mail_time, self.changed = (
            in_shared_memory(t) for t in (self.memory, self.last_update, self.mail, self.mail_time, self.changed))

    def reset(self) -> None:
        """Every row set to `reset_row`, none marked changed (`take_changed` then says the state was
        reset)."""
        for name, row in self.reset_row().items():
            self.state_dict()[name].copy_(row)
        self.changed.zero_()
        self._was_reset = True

    def reset_row(self) -> dict[str, Tensor]:
        """A row of each table (as `state_dict` names them) after a reset: zero memory, no mails,
        last updated at `start_time`."""
        return {"memory": self.memory.new_zeros(self.memory.shape[1:]),
                "last_update": self.last_update.new_tensor(self.start_time),
                "mail": self.mail.new_zeros(self.mail.shape[1:]),
                "mail_time": self.mail_time.new_full(self.mail_time.shape[1:], EMPTY)}

    def take_changed(self) -> tuple[Tensor, Optional[dict[str, Tensor]]]:
        """The rows written since the last call (their indices, increasing) and, where the state
        was reset since, `reset_row` (the other rows hold it); the next call counts from here."""
        rows = self.changed.nonzero().squeeze(1)
        self.changed.zero_()
        reset, self._was_reset = (self.reset_row() if self._was_reset else None), False
        return rows, reset

    def begin_batch(self, src: np.ndarray, dst: np.ndarray, eid: np.ndarray) -> None:
        """The events of the next write, as host arrays (what distributed states key writes by);
        nothing here."""

    def plan(self, writes: list[np.ndarray], reads: Optional[list[np.ndarray]] = None) -> Any:
        """The nodes the coming steps write (each step's distinct endpoints) and, where reads
        travel between ranks, read (each step's `read` ids), as host arrays, ahead of the steps:
        a distributed state exchanges what depends on them for all the steps at once (a
        collective) and returns it for `use`; nothing here."""

    def use(self, plan: Any) -> None:
        """Have the coming steps' writes and reads follow `plan`'s routes; nothing here."""

    def read(self, ids: Tensor, host_ids: Optional[np.ndarray] = None, out: Optional[Sequence[Tensor]] = None
             ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(memory, last_update, mail, mail_time) rows of the global node ids `ids`, read into
        `out` where given. `host_ids` (here and below): the same ids as a host array, with which a
        distributed state routes rows without reading the ids back from the device; unused here."""
        tables = (self.memory, self.last_update, self.mail, self.mail_time)
        if out is None:
            return tuple(t.index_select(0, ids) for t in tables)
        return tuple(torch.index_select(t, 0, ids, out=o) for t, o in zip(tables, out))

    @contextmanager
    def provisional(self) -> Iterator[None]:
        """The writes and deliveries within the block are undone at its end (not nested)."""
        if self._undo is not None:
            raise RuntimeError("a provisional block is open already")
        self._undo = []
        try:
            yield
        finally:
            tables = (self.memory, self.last_update, self.mail, self.mail_time)
            for rows, before in reversed(self._undo):
                for table, old in zip(tables, before):
                    table.index_copy_(0, rows, old)
            self._undo = None

    @property
    def provisional_open(self) -> bool:
        """Whether a `provisional` block is open."""
        return self._undo is not None

    def _overwriting(self, rows: Tensor) -> None:
        """`rows` are about to change: mark them changed, and within `provisional`, keep what they
        hold."""
        self.changed.index_fill_(0, rows, True)
        if self._undo is not None:
            self._undo.append((rows, tuple(t.index_select(0, rows) for t in
                                           (self.memory, self.last_update, self.mail, self.mail_time))))

    def write(self, ids: Tensor, memory: Tensor, last_update: Tensor, mail: Tensor, mail_time: Tensor,
              host_ids: Optional[np.ndarray] = None) -> None:
        """Overwrite the rows of the node ids `ids` (an id may repeat with identical rows)."""
        self._overwriting(ids)
        self.memory.index_copy_(0, ids, memory.detach())
        self.last_update.index_copy_(0, ids, last_update)
        self.mail.index_copy_(0, ids, mail.detach())
        self.mail_time.index_copy_(0, ids, mail_time)

    def deliver(self, ids: Tensor, memory: Tensor, last_update: Tensor, to: Tensor, mail: Tensor,
                mail_time: Tensor, seq: Tensor, host_ids: Optional[np.ndarray] = None,
                host_to: Optional[np.ndarray] = None) -> None:
        """Overwrite the memory and last-update rows of the node ids `ids` (as `write`), and append mail
        i (time `mail_time[i]`, global order `seq[i]`) to the mailbox of node `to[i]`; each
        mailbox keeps its M latest mails by (time, seq). `host_to`: `to` as a host array."""
        self._overwriting(ids)
        self.memory.index_copy_(0, ids, memory.detach())
        self.last_update.index_copy_(0, ids, last_update)
        if to.numel():
            nodes, rows = torch.unique(to, return_inverse=True)
            self._overwriting(nodes)
            box, box_time = merge_mailbox(self.mail.index_select(0, nodes), self.mail_time.index_select(0, nodes),
                                          rows, mail.detach(), mail_time, seq)
            self.mail.index_copy_(0, nodes, box)
            self.mail_time.index_copy_(0, nodes, box_time)

    def state_dict(self) -> dict[str, Tensor]:
        return {"memory": self.memory, "last_update": self.last_update, "mail": self.mail,
                "mail_time": self.mail_time}

    def held_ids(self) -> np.ndarray:
        """The global node ids of the rows this state holds, in row order."""
        return np.arange(self.num_nodes, dtype=np.int64)

    def load_rows(self, ids: np.ndarray, rows: dict[str, Tensor]) -> int:
        """Set the rows of the global node ids `ids` (a host array) this state holds to `rows`
        (as `state_dict` names them, one row per id); how many it set."""
        at = torch.from_numpy(ids).to(self.memory.device)
        self._overwriting(at)
        for name, mine in self.state_dict().items():
            mine.index_copy_(0, at, rows[name].to(mine.device, mine.dtype))
        return int(ids.size)

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        for name, mine in self.state_dict().items():
            value = state[name]
            if value.shape != mine.shape:
                raise GnndistError(f"node state {name} has shape {tuple(value.shape)}, expected {tuple(mine.shape)}")
            mine.copy_(value)
        self.changed.fill_(True)


def merge_mailbox(mail: Tensor, mail_time: Tensor, rows: Tensor, new_mail: Tensor, new_time: Tensor,
                  seq: Tensor) -> tuple[Tensor, Tensor]:
    """Mailboxes [R, M, m] / [R, M] after delivering new mails to `rows`: each keeps its M latest
    mails by (time, seq), oldest first; old mails go before new ones of the same time."""
    r, m_slots, dim = mail.shape
    dev = mail.device
    own = torch.arange(r, device=dev).repeat_interleave(m_slots)
    all_rows = torch.cat([own, rows])
    times = torch.cat([mail_time.reshape(-1), new_time])
    seqs = torch.cat([torch.arange(m_slots, device=dev).repeat(r) - m_slots - 1, seq.to(dev)])
    o = torch.argsort(seqs, stable=True)
    o = o[torch.argsort(times[o], stable=True)]
    o = o[torch.argsort(all_rows[o], stable=True)]
    sorted_rows = all_rows[o]
    end = torch.cumsum(torch.zeros(r, dtype=torch.int64, device=dev).index_add_(0, all_rows, torch.ones_like(all_rows)), 0)
    from_end = end[sorted_rows] - torch.arange(o.numel(), device=dev) - 1
    # the M latest of each row go to slots 0..M-1 (oldest first), the others to a spare slot M
    slot = torch.where(from_end < m_slots, m_slots - 1 - from_end, m_slots)
    out_mail = mail.new_empty((r, m_slots + 1, dim))
    out_time = mail_time.new_empty((r, m_slots + 1))
    out_mail[sorted_rows, slot] = torch.cat([mail.reshape(-1, dim), new_mail])[o]
    out_time[sorted_rows, slot] = times[o]
    return out_mail[:, :m_slots], out_time[:, :m_slots]
