"""Training checkpoints: one file per checkpoint, written atomically and read back with
`torch.load(weights_only=True)` (tensors, numbers, strings, lists and dicts; no pickled object).

A checkpoint folder DIR holds DIR/epoch-0003.pt (the state after epoch 3, trained and
validated) and DIR/epoch-0003-step-000120.pt (the state after 120 training steps of epoch 3);
a run of W > 1 ranks writes each rank's in DIR/rank{r}/. Each folder keeps its newest `keep`
complete checkpoints (default 2), and the ones those build on; a rank of several also keeps the
one before its newest until its next save, so that a run whose ranks stopped between their
writes can resume from the older one that every rank completed (even at `keep` 1). `Writer`
writes them in the background from a copy in host memory; where it can, a checkpoint holds only
the node-state rows changed since the one before it, which it builds on (`Changed`), and `load`
puts the whole node state together again. A run that replaces an earlier run's checkpoint keeps
it in DIR/.replaced until it ends well (`run`). The format is docs/guide/long-runs.md's.
"""
from __future__ import annotations

import math
import os
import random
import shutil
import threading
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

import numpy as np
import torch
import torch.utils.serialization.config as serialization

from gnndist.runtime import dist
from gnndist.errors import GnndistError, first_line
from gnndist.io import atomic_file
from gnndist.outputs import CHECKPOINT_FILE, PROGRESS, RANK_FOLDER, REPLACED, checkpoint_name

FORMAT = 3  # what `save` writes (2: no node-state deltas; 1: end-of-epoch only, node state by the store's ids)
READS = (1, 2, 3)  # the formats `load` reads
KEEP = 2  # complete checkpoints kept in a folder, by default
WRITER_NICE = 19  # the background writer's priority: it yields the cores to the training step
RESET = -1  # a node-state delta's `base` where the rows it leaves out hold their values after a reset


@dataclass(frozen=True)
class Position:
    """Where in a run a checkpoint is: after `step` training steps of `epoch`, or (`step` None)
    after the whole epoch, validation included."""

    epoch: int
    step: Optional[int] = None

    @property
    def key(self) -> tuple[int, float]:
        return self.epoch, math.inf if self.step is None else self.step

    def __lt__(self, other: "Position") -> bool:
        return self.key < other.key

    @property
    def name(self) -> str:
        return checkpoint_name(self.epoch, self.step)

    @property
    def code(self) -> int:
        """One int64 for collectives (`from_code`)."""
        return (self.epoch << 32) | (0xFFFFFFFF if self.step is None else self.step)

    @classmethod
    def from_code(cls, code: int) -> "Position":
        step = code & 0xFFFFFFFF
        return cls(code >> 32, None if step == 0xFFFFFFFF else step)

    def __str__(self) -> str:
        return f"epoch {self.epoch}" + ("" if self.step is None else f", step {self.step}")


def rng_state() -> dict[str, Any]:
    """The torch (and CUDA, when available), numpy and Python global RNG states, as tensors and
    plain values."""
    _, keys, pos, has_gauss, gauss = np.random.get_state()
    version, py_state, py_gauss = random.getstate()
    state = {"torch": torch.get_rng_state(),
             "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                       "has_gauss": int(has_gauss), "gauss": float(gauss)},
             "python": {"version": version, "state": list(py_state), "gauss": py_gauss}}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` returned (the CUDA states of the devices both runs have)."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        for device, cuda_state in enumerate(state["cuda"][:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state, device)


def _files(directory: Path) -> dict[Position, Path]:
    """Position -> checkpoint file in `directory`, complete or not."""
    if not directory.is_dir():
        return {}
    found = {}
    for f in directory.iterdir():
        m = CHECKPOINT_FILE.fullmatch(f.name)
        if m and f.is_file():
            found[Position(int(m[1]), None if m[2] is None else int(m[2]))] = f
    return found


def complete(path: Path) -> bool:
    """Whether a checkpoint file is whole (a torch archive to its end)."""
    return path.is_file() and zipfile.is_zipfile(path)


def positions(directory: Union[str, os.PathLike]) -> list[Position]:
    """The positions of the complete checkpoints in DIR, oldest first."""
    return sorted(p for p, f in _files(Path(directory)).items() if complete(f))


def epochs(directory: Union[str, os.PathLike]) -> list[int]:
    """The epochs whose end-of-epoch checkpoint in DIR is complete, ascending."""
    return [p.epoch for p in positions(directory) if p.step is None]


def _position_of(payload: dict[str, Any]) -> Position:
    epoch, step = payload.get("epoch"), payload.get("step")
    for name, v in (("epoch", epoch), ("step", step)):
        if (v is not None or name == "epoch") and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise ValueError(f"a checkpoint payload needs an integer {name} >= 0, got {v!r}")
    return Position(epoch, step)


def save(directory: Union[str, os.PathLike], payload: dict[str, Any], keep: int = KEEP,
         bases: Optional[dict[Position, Optional[Position]]] = None, hold: Optional[Position] = None) -> Path:
    """Write `payload` (tensors, numbers, strings, lists, dicts; its "epoch" an integer >= 0, its
    "step" one or absent) as DIR's checkpoint of that position, atomically; then keep only it, the
    newest `keep` - 1 complete earlier ones (a later one belongs to a run this one replaces), `hold`
    and those they build on. `bases`: what `_base_of` has found so far, kept from one save to the next."""
    at = _position_of(payload)
    directory = Path(directory)
    path = directory / at.name
    # no zip CRCs: torch.load does not check them, and they are a good part of the write's CPU time
    with atomic_file(path) as f, serialization.patch({"save.compute_crc32": False}):
        torch.save({"format": FORMAT, **payload}, f)
    bases = {} if bases is None else bases
    bases[at] = _base(payload.get("node_state"))
    kept = {at, *([p for p in positions(directory) if p < at][-(keep - 1):] if keep > 1 else []),
            *([hold] if hold is not None and hold < at else [])}
    for p in list(kept):
        while (p := _base_of(directory, p, bases)) is not None:
            kept.add(p)
    for p, f in _files(directory).items():
        if p not in kept:
            f.unlink(missing_ok=True)
            bases.pop(p, None)
    for f in directory.glob(".epoch-*.pt.tmp-*"):  # left by a writer that was killed
        f.unlink(missing_ok=True)
    return path


def _base(node_state: Any) -> Optional[Position]:
    """The checkpoint a payload's node state builds on (None: none, it is whole or builds on a reset)."""
    code = node_state.get("base", RESET) if isinstance(node_state, dict) else RESET
    return None if code == RESET else Position.from_code(int(code))


def _base_of(directory: Path, at: Position, bases: dict[Position, Optional[Position]]) -> Optional[Position]:
    """The checkpoint in DIR that the one at `at` builds on (None: none, or it is not there), read
    once into `bases`."""
    if at not in bases:
        try:
            payload = torch.load(directory / at.name, map_location="cpu", weights_only=True, mmap=True)
            bases[at] = _base(payload.get("node_state") if isinstance(payload, dict) else None)
        except Exception:  # not a readable checkpoint: nothing to keep for it
            bases[at] = None
    return bases[at]


@dataclass
class Changed:
    """The rows of a payload's node state (`node_ids` and tables of as many rows) written since
    the rank's previous checkpoint: `rows`, their indices; `reset`, one row of each table where
    the state was reset since (the rows not written hold it)."""

    rows: torch.Tensor
    reset: Optional[dict[str, torch.Tensor]] = None


class HostCopy:
    """Copies of a payload's tensors in host memory, made into buffers kept from one copy to the
    next (a tensor of the shape it had the copy before is copied with no allocation; those of GPU
    tensors are pinned)."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def __call__(self, tree: Any, path: str = "") -> Any:
        if isinstance(tree, torch.Tensor):
            buf = self._buffers.get(path)
            if buf is None or buf.shape != tree.shape or buf.dtype != tree.dtype:
                buf = self._buffers[path] = torch.empty(tree.shape, dtype=tree.dtype, device="cpu",
                                                        pin_memory=tree.is_cuda)
            return buf.copy_(tree.detach())
        if isinstance(tree, dict):
            return {k: self(v, f"{path}/{k}") for k, v in tree.items()}
        if isinstance(tree, (list, tuple)):
            return type(tree)(self(v, f"{path}/{i}") for i, v in enumerate(tree))
        return tree


class Writer:
    """Writes a folder's checkpoints in a thread of its own (`save`): the caller waits for the copy
    of the payload to host memory only, and for the write before it, if not done yet. `shared`:
    the folder is one rank's of several, whose caller saves once every rank completed its
    previous checkpoint: that one (at first, `resumed`, where the run resumed from) stays until
    the next save, the newest checkpoint every rank is known to hold."""

    def __init__(self, directory: Union[str, os.PathLike], keep: int = KEEP, shared: bool = False,
                 resumed: Optional[Position] = None) -> None:
        self.directory, self.keep, self.shared, self.resumed = Path(directory), keep, shared, resumed
        self._copy = HostCopy()
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self._bases: dict[Position, Optional[Position]] = {}
        self._last: Optional[Position] = None  # the checkpoint this writer wrote last
        self._chain = 0.0  # the node-state bytes of the deltas since the last whole node state (or reset)

    def save(self, payload: dict[str, Any]) -> None:
        """Copy `payload` to host memory, then write it (`save`) in the background. Where its node
        state holds `changed` (a `Changed`), the checkpoint holds only those rows (`_delta`)."""
        self.wait()
        node = payload.get("node_state")
        if isinstance(node, dict) and "changed" in node:
            payload = {**payload, "node_state": self._delta(node)}
        hold = (self.resumed if self._last is None else self._last) if self.shared else None
        self._last = _position_of(payload)
        host = self._copy(payload)
        # not a daemon: a rank that stops on an error finishes the write first
        self._thread = threading.Thread(target=self._write, args=(host, hold), name="gnndist-checkpoint")
        self._thread.start()

    def _delta(self, node: dict[str, Any]) -> dict[str, Any]:
        """The node state to write: the rows changed since this writer's last checkpoint (`base`:
        it), or since a reset (`base` RESET, with `reset`, its row), with their indices `rows`;
        the whole state where this writer has written no checkpoint since the last reset, or where
        the deltas since the last whole state would add up to more than a whole one (so that a
        resume reads at most twice a whole state)."""
        changed: Changed = node["changed"]
        tables = {k: v for k, v in node.items() if k not in ("node_ids", "changed")}
        whole = sum(v.numel() * v.element_size() for v in tables.values())
        size = whole * changed.rows.numel() / max(int(node["node_ids"].numel()), 1)
        if changed.reset is not None:
            base, self._chain = RESET, size
        elif self._last is not None and self._chain + size <= whole:
            base, self._chain = self._last.code, self._chain + size
        else:
            self._chain = 0.0
            return {"node_ids": node["node_ids"], **tables}
        rows = changed.rows
        delta = {"node_ids": node["node_ids"], "base": base, "rows": rows,
                 **{k: v.index_select(0, rows.to(v.device)) for k, v in tables.items()}}
        return delta if changed.reset is None else {**delta, "reset": changed.reset}

    def _write(self, payload: dict[str, Any], hold: Optional[Position]) -> None:
        if hasattr(os, "setpriority"):  # the write takes the cores the training step leaves (Linux: per thread)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICE)
        try:
            save(self.directory, payload, self.keep, self._bases, hold)
        except BaseException as e:  # raised in the caller's thread (`wait`)
            self._error = e

    def wait(self) -> None:
        """Wait for the write under way; a one-line error where it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise GnndistError(f"cannot write a checkpoint to {self.directory}: {first_line(error)}")


def rank_folders_in(directory: Path) -> list[int]:
    """The ranks r whose folder rank{r} is in the checkpoint folder `directory` (a W-rank run's;
    a host of a multi-host run holds its own ranks' only), ascending."""
    if not directory.is_dir():
        return []
    return sorted(int(m[1]) for f in directory.iterdir() if (m := RANK_FOLDER.fullmatch(f.name)) and f.is_dir())


def folder_of(directory: Union[str, os.PathLike], world: int, rank: int) -> Path:
    """Where rank `rank` of a `world`-rank run writes its checkpoints in `directory`."""
    return Path(directory) / f"rank{rank}" if world > 1 else Path(directory)


def model_folder(directory: Path) -> Path:
    """The folder of checkpoint folder `directory` whose checkpoints a trained model is read
    from: its lowest rank folder here (every rank of a W-rank run holds the same parameters),
    else `directory` itself."""
    ranks = rank_folders_in(directory)
    return directory / f"rank{ranks[0]}" if ranks else directory


def _holds(folder: Path) -> bool:
    """Whether `folder` holds checkpoint files of a run (in .replaced too)."""
    return bool(_files(folder) or _files(folder / REPLACED))


def _resumable(folder: Path) -> bool:
    """Whether the newest complete checkpoint in `folder` is one --resume continues (not one of
    a node run of format 1, which is for gnndist predict only)."""
    held = positions(folder)
    try:
        payload = torch.load(folder / held[-1].name, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # none, or not a torch file of ours: nothing --resume could continue
        return False
    config = payload.get("config") if isinstance(payload, dict) else None
    return not (isinstance(config, dict) and config.get("task") == "node" and "rng" not in payload)


def check_folder(directory: Union[str, os.PathLike], rank_folders: int, resume: Union[bool, str]) -> None:
    """Refuse (GnndistError), before a run starts, a checkpoint folder that the run would mix with
    another run's: one written in the other layout (one folder of checkpoints, or a folder per
    rank: `rank_folders` is W where this run's W ranks write rank0 .. rank{W-1}, else 0), or
    holding a rank's folder this run has no rank for (a host may hold only its own ranks'
    folders); with `resume` True (a run that may continue a checkpoint of another number of
    ranks) neither is refused. Without `resume`, a folder of a run that stopped while replacing
    an earlier one is refused too (both its checkpoints and the earlier run's in .replaced are
    there: which to keep is the user's call)."""
    directory = Path(directory)
    ranks = [r for r in rank_folders_in(directory) if _holds(directory / f"rank{r}")]
    writes = f"a folder per rank for {rank_folders} ranks" if rank_folders else "one folder of epochs"
    held = None
    if rank_folders and _holds(directory):
        held = "a checkpoint written as one folder of epochs (by one process, or by a node run)"
    elif ranks and not rank_folders:
        held = f"the per-rank folders of a run on several ranks ({', '.join(f'rank{r}/' for r in ranks)})"
    elif ranks and ranks[-1] >= rank_folders:
        held = f"rank{ranks[-1]}/ of a run on more ranks"
    if held and resume is not True:
        raise GnndistError(f"{directory} holds {held}, and this run writes {writes}: choose another --checkpoint, "
                           "or delete that one" + (" (--resume without auto continues it on this number of ranks)"
                                                   if resume else ""))
    if not resume:
        for folder in [directory / f"rank{r}" for r in range(rank_folders)] if rank_folders else [directory]:
            _refuse_two_runs(folder)


def _refuse_two_runs(folder: Path) -> None:
    """Refuse to replace a folder that holds both a run's checkpoints and, in .replaced, those of
    the earlier run it was replacing when it stopped."""
    aside = folder / REPLACED
    mine = positions(folder)
    if mine and _files(aside):
        keep = "--resume continues the stopped run; " if _resumable(folder) else ""
        raise GnndistError(f"{folder} holds {positions_text(mine)} of a run that stopped while replacing an earlier "
                           f"run's (kept in {aside}): {keep}to start anew, delete one of them, or choose another "
                           f"--checkpoint")


def positions_text(held: list[Position]) -> str:
    """'epoch 3', 'epochs 2, 3', or, with checkpoints within an epoch, 'checkpoints of epoch 2,
    step 40; epoch 2'."""
    if all(p.step is None for p in held):
        return f"epoch{'s' * (len(held) > 1)} {', '.join(str(p.epoch) for p in held)}"
    return f"checkpoint{'s' * (len(held) > 1)} of {'; '.join(map(str, held))}"


@contextmanager
def run(directory: Optional[Union[str, os.PathLike]], resume: bool, restore: bool = True) -> Iterator[None]:
    """The block of a training run that writes its checkpoint to DIR (None: no checkpoint).
    Without `resume`, the checkpoints (and progress file) an earlier run left in DIR move to
    DIR/.replaced first, and the first rank of each host says which; a DIR that holds both a stopped run's
    checkpoints and the ones it was replacing is refused (`check_folder`), and a stopped run's
    unfinished files beside .replaced are deleted. A run that ends well deletes DIR/.replaced.
    One that fails keeps it, and its error names it; with `restore`, a run that fails before its
    first save moves the files back (not for the per-rank folders of a W-rank run, whose ranks
    could then hold different runs' checkpoints). A failed run loses no checkpoint, and its own
    stay there to --resume."""
    if directory is None:
        yield
        return
    directory = Path(directory)
    aside = directory / REPLACED
    moved = False

    def kept() -> Optional[Path]:  # where an earlier run's checkpoints stay if the run stops now
        return None if (moved and restore and not _files(directory)) or not _files(aside) else aside

    if not resume:
        _refuse_two_runs(directory)
        left = list(_files(directory).values()) + list(directory.glob(".epoch-*.pt.tmp-*")) + \
            [f for f in [directory / PROGRESS] if f.is_file()]
        if left and _files(aside):  # only unfinished files of a stopped run (`_refuse_two_runs`)
            for f in left:
                f.unlink()
        elif left:
            if dist.first_on_host() and (earlier := positions(directory)):  # once a host, for its folder
                dist.say(f"replacing the checkpoint of an earlier run in {directory} ({positions_text(earlier)}): "
                         f"kept in {aside} until this run ends well, then deleted"
                         + ("; --resume continues it instead" if _resumable(directory) else ""))
            aside.mkdir(exist_ok=True)
            for f in left:
                os.replace(f, aside / f.name)
            moved = True
    _kept_now.append(kept)
    try:
        yield
    except BaseException as e:
        if moved and restore and not _files(directory):
            for f in aside.iterdir():
                os.replace(f, directory / f.name)
            aside.rmdir()
        elif kept() and isinstance(e, (GnndistError, OSError)):
            raise GnndistError(f"{first_line(e)} (an earlier run's checkpoint is kept in {aside})") from None
        elif kept() and isinstance(e, KeyboardInterrupt):
            raise KeyboardInterrupt(interrupt_note()) from None
        raise
    finally:
        _kept_now.remove(kept)
    shutil.rmtree(aside, ignore_errors=True)


_kept_now: list[Callable[[], Optional[Path]]] = []  # of the `run` blocks this process is in


def interrupt_note() -> str:
    """What an interrupt now says of the checkpoint a running `run` block replaces ("" when none
    is kept): what the interrupt raised from that block says, and what a launched rank leaves
    for its launcher the moment the interrupt arrives (the rank may be stopped before its
    interrupt has unwound)."""
    kept = [k() for k in _kept_now]
    return next((f"an earlier run's checkpoint is kept in {k}" for k in kept if k is not None), "")


def load(directory: Union[str, os.PathLike], at: Union[None, int, Position] = None,
         needs: tuple[str, ...] = (), mmap: bool = False) -> dict[str, Any]:
    """The payload saved in DIR at position `at` (an int: the end of that epoch; default: the
    newest), its node state whole (`_whole_node_state`); a missing, truncated or foreign
    checkpoint, or one without the keys `needs`, is a `GnndistError` naming the file. `mmap`: the
    tensors are read from the file as they are used."""
    directory = Path(directory)
    payload = _read(directory, at, needs, mmap)
    node = payload.get("node_state")
    if isinstance(node, dict) and "base" in node:
        payload = {**payload, "node_state": _whole_node_state(directory, payload, node)}
    return payload


def config(directory: Union[str, os.PathLike], at: Position) -> Any:
    """The settings DIR's checkpoint at `at` was written with (its "config"; `load`'s errors),
    read without putting its node state together."""
    return _read(Path(directory), at, ("config",), mmap=True)["config"]


def _whole_node_state(directory: Path, payload: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """The whole node state of a checkpoint in DIR (`payload`) whose node state `node` holds only
    the rows changed since the one it builds on (`Writer._delta`): those rows over the whole state
    of that one, in turn, or over the state after a reset."""
    chain = [node]
    while (base := _base(node)) is not None:
        at = _position_of(payload)
        try:
            payload = _read(directory, base, ("node_state",), mmap=True)
        except GnndistError as e:
            raise GnndistError(f"the checkpoint of {at} in {directory} builds on that of {base}: "
                               f"{first_line(e)}") from None
        node = payload["node_state"]
        chain.append(node)
    n = int(chain[0]["node_ids"].numel())
    if "base" in node:  # on a reset: every other row holds the reset row
        tables = {k: row.expand(n, *row.shape).clone() for k, row in node["reset"].items()}
    else:
        tables = {k: v.clone() for k, v in chain.pop().items() if k != "node_ids"}
    for delta in reversed(chain):
        for k, table in tables.items():
            table.index_copy_(0, delta["rows"], delta[k])
    return {"node_ids": chain[0]["node_ids"], **tables}


def _read(directory: Path, at: Union[None, int, Position], needs: tuple[str, ...], mmap: bool) -> dict[str, Any]:
    """The payload of DIR's checkpoint at `at` as written (`load`, its errors)."""
    files = _files(directory)
    if not files:
        raise GnndistError(f"no checkpoint to resume from in {directory} (no epoch-NNNN.pt files)")
    at = max(files) if at is None else Position(at) if isinstance(at, int) else at
    if at not in files:
        raise GnndistError(f"{directory} holds no checkpoint of {at} (it holds {positions_text(sorted(files))})")
    path = files[at]
    older = [p for p in positions(directory) if p < at]
    fallback = f"; {older[-1]} is complete: move {path.name} away to resume from it" if older else ""
    size = path.stat().st_size
    if not zipfile.is_zipfile(path):
        why = "it is empty (0 bytes)" if size == 0 else f"it is truncated or not a torch file ({size:,} bytes)"
        raise GnndistError(f"cannot read checkpoint {path}: {why}{fallback}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # empty, truncated, foreign or pickled-object files
        raise GnndistError(f"cannot read checkpoint {path}: {first_line(e)}{fallback}") from None
    version = payload.get("format") if isinstance(payload, dict) else None
    if isinstance(version, int) and version > FORMAT:
        raise GnndistError(f"{path} is of checkpoint format {version}, written by a newer gnndist (this one reads "
                           f"formats {', '.join(map(str, READS))}): upgrade gnndist")
    if version not in READS or payload.get("epoch") != at.epoch or payload.get("step") != at.step:
        raise GnndistError(f"{path} is not a gnndist checkpoint of {at} (format {FORMAT}){fallback}")
    missing = [k for k in needs if k not in payload]
    if missing:  # not damage: the older checkpoints are of the same run, and lack them too
        config = payload.get("config")
        node = isinstance(config, dict) and config.get("task") == "node"
        whose = " (a node run's, for gnndist predict)" if node else ""
        raise GnndistError(f"{path} is not a whole training checkpoint{whose}: it lacks {', '.join(missing)}")
    return payload


def load_params(module: torch.nn.Module, params: dict[str, Any], source: Union[str, os.PathLike]) -> None:
    """`module.load_state_dict(params)`; parameters that do not fit the module (saved by a gnndist
    that built the model otherwise) are one line naming `source`."""
    try:
        module.load_state_dict(params)
    except RuntimeError as e:
        lines = str(e).strip().splitlines()
        detail = (lines[1] if len(lines) > 1 else first_line(e)).strip().rstrip(".")
        raise GnndistError(f"{source}: its parameters do not fit this gnndist's {type(module).__name__} ({detail}): "
                           "they were saved by a version that built the model otherwise; train it anew") from None


def drop_other_worlds(directory: Union[str, os.PathLike], world: int) -> None:
    """Delete the checkpoints in DIR of ranks a `world`-rank run has not (a run resumed from a
    checkpoint of another number of ranks, once it has ended well): rank folders above its own,
    and one folder's checkpoints where it writes a folder per rank, or the reverse."""
    directory = Path(directory)
    if world > 1:
        for f in _files(directory).values():
            f.unlink(missing_ok=True)
    for r in rank_folders_in(directory):
        if world == 1 or r >= world:
            shutil.rmtree(directory / f"rank{r}", ignore_errors=True)
