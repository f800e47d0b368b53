"""Where a training run starts (a checkpoint it resumes from, or anew), and the checkpoints it
writes on the way; both trainers' runs use it.

A run resumes
- with `resume=True` (`--resume`): from the newest checkpoint every rank completed, written
  with the same settings, on this or another number of ranks; none is an error;
- with `resume="auto"` (`--resume auto`): likewise, where that checkpoint is this same run's
  (same data, settings and number of ranks); else it starts anew, saying why;
- after a restart by the launcher (torchrun's or `--nproc`'s `--max-restarts`: the restart
  count $TORCHELASTIC_RESTART_COUNT is above 0): as `--resume`, but with none it starts anew.
Ranks started differently (a host started again by hand with `--resume auto` beside hosts its
launcher restarted) agree first. A restart or --resume auto says on one line where it resumes
from; every resume is recorded in the metrics' `restarts`: when, the rank lost (where the
launcher knows it), the position resumed from and the training steps run again.

While it runs, each rank writes a checkpoint after every `every` training steps, or every
`minutes` minutes (the ranks agree every PROBE steps whether the time is up), at the end of
each epoch, and its last finished step to the progress file of its folder (`Checkpointer`).
"""
from __future__ import annotations

import datetime
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Union

import torch

from gnndist import checkpoint
from gnndist.checkpoint import Position
from gnndist.errors import GnndistError, first_line
from gnndist.outputs import PROGRESS, Outputs
from gnndist.runlog import RunLog
from gnndist.runtime import dist
from gnndist.runtime.launch import lost_rank

PROBE = 10  # with `minutes`: the ranks agree every PROBE steps whether a checkpoint is due


def mode(resume: Union[bool, str]) -> str:
    """"require" (--resume), "restart" (a restart by the launcher), "auto" (--resume auto) or
    "anew"."""
    if resume is True:
        return "require"
    if dist.restart_count() > 0:
        return "restart"
    return "auto" if resume == "auto" else "anew"


@dataclass
class Found:
    """A checkpoint to resume from: its position, the ranks that wrote it, each one's file in rank
    order (only this rank's, where this run has the same ranks) and `payload`, the first of
    them, read."""

    position: Position
    world: int
    files: list[Path]
    payload: dict[str, Any]


def _all(ok: bool, device: torch.device) -> bool:
    """Whether `ok` holds on every rank (a collective)."""
    return dist.agree_max(int(not ok), device) == 0


def _common(held: list[Position], device: torch.device) -> Optional[Position]:
    """The newest position every rank holds (a collective)."""
    codes = torch.tensor([p.code for p in held], dtype=torch.int64, device=device)
    gathered = torch.cat(dist.all_gather_varsize(codes)).cpu()
    values, counts = torch.unique(gathered, return_counts=True)
    common = values[counts == dist.world_size()]
    return Position.from_code(int(common.max())) if common.numel() else None


def _other_world(directory: Path) -> Optional[tuple[Position, int, list[Path]]]:
    """The newest checkpoint in `directory` that every rank of the run that wrote it completed,
    read from the files of all its ranks (its position, its rank count, their files)."""
    held = [(p, directory) for p in checkpoint.positions(directory)]
    held += [(p, directory / "rank0") for p in checkpoint.positions(directory / "rank0")]
    for at, folder in sorted(held, key=lambda h: h[0], reverse=True):
        try:
            world = int(checkpoint.config(folder, at)["world_size"])
        except (GnndistError, KeyError, TypeError, ValueError):
            continue
        files = [checkpoint.folder_of(directory, world, r) / at.name for r in range(world)]
        if (world > 1) == (folder != directory) and all(checkpoint.complete(f) for f in files):
            return at, world, files
    return None


def find(directory: Union[str, os.PathLike], resume: Union[bool, str], device: torch.device,
         needs: tuple[str, ...], differs: Callable[[dict[str, Any], bool], Optional[str]]) -> Optional[Found]:
    """The checkpoint in DIR this run resumes from (see the module docstring), or None: start anew
    (a collective). `needs`: the payload keys a resume reads; `differs(config, whole)`: why a
    checkpoint's settings are not this run's, as "was written with ..." (None: they are),
    comparing every setting and the rank count where `whole` (--resume auto), else those a
    resume must share."""
    directory, world, how = Path(directory), dist.world_size(), mode(resume)
    own = checkpoint.folder_of(directory, world, dist.rank())
    held = checkpoint.positions(own)
    if how == "require" and not held and any(own.glob("epoch-*.pt")):
        checkpoint.load(own)  # says what is wrong with what is there
    at, found, why, settings = _common(held, device), None, None, False
    if at is not None:
        try:
            payload = checkpoint.load(own, at, needs, mmap=True)
            why = differs(payload["config"], how == "auto")
            settings = why is not None
            if why is None:
                found = Found(at, int(payload["config"].get("world_size", 1)), [own / at.name], payload)
        except GnndistError as e:
            if how != "auto":
                raise
            why = f"cannot be read: {first_line(e)}"
    if _all(found is not None and found.world == world, device):
        return found
    if found is not None:  # held by every rank, but written on another number of ranks
        found, why = None, f"was written on {found.world} rank(s)"
    if _all(how in ("require", "restart"), device):
        other = _other_world(directory)
        mine = [-1, -1] if other is None else [other[0].code, other[1]]
        seen = torch.cat(dist.all_gather_varsize(torch.tensor([mine], dtype=torch.int64, device=device))).cpu()
        if other is not None and bool((seen == seen[0]).all()):
            at, w, files = other
            payload = checkpoint.load(files[0].parent, at, needs, mmap=True)
            why = differs(payload["config"], False)
            settings = why is not None
            if why is None:
                return Found(at, w, files, payload)
        elif bool((seen[:, 0] >= 0).any()):
            why = ("is of another number of ranks, whose folders are not all readable here: a resume on another "
                   "number of ranks reads every rank's checkpoint (on one host, or in a folder all hosts share)")
    if how == "require":
        raise GnndistError(f"checkpoint in {directory} {why}" if why else
                           f"no checkpoint in {directory} is complete on every rank; start afresh without --resume")
    if how == "restart" and settings:
        raise GnndistError(f"restart {dist.restart_count()}: checkpoint in {directory} {why}")
    if how != "anew":
        dist.log(("" if how == "auto" else f"restart {dist.restart_count()}: ") + "starting anew: "
                 + (f"the checkpoint in {directory} {why}" if why else
                    f"no checkpoint in {directory} is complete on every rank"))
    return None


def changed(saved: dict[str, Any], config: dict[str, Any], same: tuple[str, ...], whole: bool) -> Optional[str]:
    """Why a checkpoint's settings `saved` are not a run's `config`, as `find` takes it: the first
    of the settings `same` that differs (`whole`: of every setting but `quiet`), or None."""
    keys = sorted((set(saved) | set(config)) - {"quiet"}) if whole else same
    key = next((k for k in keys if saved.get(k) != config.get(k)), None)
    return None if key is None else f"was written with {key}={saved.get(key)}, this run has {key}={config.get(key)}"


def start(outputs: Outputs, device: torch.device, needs: tuple[str, ...],
          differs: Callable[[dict[str, Any], bool], Optional[str]]) -> Optional[Found]:
    """`find` in the run's checkpoint folder, where the run may resume (a collective)."""
    how = mode(outputs.resume)
    if how == "anew":
        return None
    if not outputs.checkpoint:
        dist.log(f"restart {dist.restart_count()}: starting anew (no --checkpoint to resume from)")
        return None
    return find(outputs.checkpoint, outputs.resume, device, needs, differs)


def folder(outputs: Outputs) -> Optional[Path]:
    """This rank's checkpoint folder (None without a checkpoint)."""
    return None if not outputs.checkpoint else checkpoint.folder_of(outputs.checkpoint, dist.world_size(),
                                                                    dist.rank())


def keeps(outputs: Outputs, found: Optional[Found]) -> bool:
    """Whether the run keeps the checkpoints in its folder where they are (`checkpoint.run`'s
    `resume`): it resumes from them, or it is a restart of the run that wrote them."""
    return found is not None or mode(outputs.resume) == "restart"


def finish(outputs: Outputs, found: Optional[Found]) -> None:
    """After a run that ended well: where it resumed from a checkpoint of another number of ranks,
    rank 0 deletes that checkpoint's files this run's ranks did not replace."""
    if found is not None and found.world != dist.world_size() and dist.rank() == 0:
        checkpoint.drop_other_worlds(outputs.checkpoint, dist.world_size())


def _steps_run(directory: Path, spe: int, device: torch.device) -> Optional[int]:
    """The training steps the run stopped after, by the ranks' progress files (the most of
    any rank; None where no rank has one; a collective)."""
    f = checkpoint.folder_of(directory, dist.world_size(), dist.rank()) / PROGRESS
    try:
        epoch, step = map(int, f.read_text().split()[:2])
        done = (epoch - 1) * spe + step
    except (OSError, ValueError):
        done = -1
    done = dist.agree_max(done, device)
    return None if done < 0 else done


def resumed(found: Found, outputs: Outputs, steps_per_epoch: int, device: torch.device) -> list[dict[str, Any]]:
    """The restarts of a run resumed from `found`: those its checkpoint records and this one
    (when, the rank lost, the position resumed from, the steps run again); a restart or
    --resume auto says on one line (rank 0) from where it resumes (a collective)."""
    at, directory = found.position, outputs.checkpoint
    step = steps_per_epoch if at.step is None else at.step
    done = _steps_run(Path(directory), steps_per_epoch, device)
    lost = None if done is None else max(done - ((at.epoch - 1) * steps_per_epoch + step), 0)
    count = dist.agree_max(dist.restart_count(), device)
    gone = lost_rank() if count else None
    record = {"time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "restart": count, "rank_lost": gone, "epoch": at.epoch, "step": step, "steps_lost": lost}
    what = f"restart {count}" + (f" (rank {gone} was lost)" if gone is not None else "") + ": " if count else ""
    where = (f"epoch {at.epoch}, step {step} of {steps_per_epoch}" if at.step is not None
             else f"the end of epoch {at.epoch}")
    ranks = f", written on {found.world} rank(s)" if found.world != dist.world_size() else ""
    if count or mode(outputs.resume) == "auto":
        dist.log(f"{what}resuming from {where} (the checkpoint in {directory}{ranks})"
                 + ("" if not lost else f"; {lost} training step(s) to run again"))
    return list(found.payload.get("restarts", [])) + [record]


def first_epoch(at: Position, epochs: int, outputs: Outputs) -> int:
    """The epoch a run at checkpoint position `at` goes on from. Past its last `epochs` where the
    checkpoint holds them all: a restart then goes on to the test, --resume asks for more epochs
    (one line)."""
    first = at.epoch + (at.step is None)
    if first > epochs and mode(outputs.resume) == "require":
        raise GnndistError(f"the checkpoint already holds {first - 1} epochs; ask for more with --epochs")
    return first


def begin(outputs: Outputs, found: Optional[Found], at: Position, epochs: int, steps_per_epoch: int,
          device: torch.device) -> tuple[int, list[dict[str, Any]], RunLog]:
    """Where a run at checkpoint position `at` (resumed from `found`, or anew) goes on: its first
    epoch (`first_epoch`), its restarts (`resumed`: none for a new run) and its log (rank 0
    writes it, from the step after `at`; a collective)."""
    first = first_epoch(at, epochs, outputs)
    restarts = [] if found is None else resumed(found, outputs, steps_per_epoch, device)
    log_dir = outputs.log_dir if dist.rank() == 0 else None
    return first, restarts, RunLog(log_dir, first_step=global_step(first, at.step or 0, steps_per_epoch))


def global_step(epoch: int, step: int, steps_per_epoch: int) -> int:
    """The training steps of a run up to `step` of `epoch` (epochs count from 1)."""
    return (epoch - 1) * steps_per_epoch + step


class EpochClock:
    """Wall and CPU seconds of the epoch in progress, those it ran before a resume included
    (`cpu`: this rank's CPU seconds so far)."""

    def __init__(self, cpu: Callable[[], float] = time.process_time) -> None:
        self.cpu = cpu
        self.start()

    def start(self, at: Optional[dict[str, Any]] = None) -> None:
        """The epoch starts here, or resumes from `at` (its checkpoint's `epoch_state`)."""
        self._t0, self._c0 = time.perf_counter(), self.cpu()
        self._before = (0.0, 0.0) if at is None else (at["time_s"], at.get("cpu_s", 0.0))

    def elapsed(self) -> tuple[float, float]:
        """(wall, CPU) seconds of the epoch so far."""
        return self._before[0] + time.perf_counter() - self._t0, self._before[1] + self.cpu() - self._c0


class Checkpointer:
    """What a rank writes to its checkpoint folder while it trains (see the module docstring):
    `step` after each training step, `save` at the end of an epoch; `close` waits for the last
    write. Without a folder, nothing. `found`: the checkpoint the run resumed from."""

    def __init__(self, outputs: Outputs, steps_per_epoch: int, device: torch.device,
                 found: Optional[Found] = None) -> None:
        self.folder = None if not outputs.checkpoint else checkpoint.folder_of(
            outputs.checkpoint, dist.world_size(), dist.rank())
        self.every, self.minutes = outputs.checkpoint_every, outputs.checkpoint_minutes
        self.spe, self.device = steps_per_epoch, device
        self.writer = None if self.folder is None else checkpoint.Writer(
            self.folder, outputs.keep_checkpoints, shared=dist.world_size() > 1,
            resumed=found.position if found is not None and found.world == dist.world_size() else None)
        self._last = time.monotonic()
        self._progress: Optional[int] = None
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._progress = os.open(self.folder / PROGRESS, os.O_WRONLY | os.O_CREAT, 0o666)

    def step(self, epoch: int, step: int, payload: Callable[[], dict[str, Any]]) -> None:
        """After training step `step` of `epoch` (from 1): note it, and save `payload()` if a
        checkpoint is due there (not at an epoch's last step: its end-of-epoch checkpoint
        follows)."""
        if self.writer is None:
            return
        os.pwrite(self._progress, f"{epoch} {step}".ljust(32).encode(), 0)
        if step < self.spe and self._due(global_step(epoch, step, self.spe)):
            self.save(payload())

    def _due(self, done: int) -> bool:
        if self.every is not None:
            return done % self.every == 0
        if self.minutes is None or done % PROBE:
            return False
        return not _all(time.monotonic() - self._last < 60 * self.minutes, self.device)

    def save(self, payload: dict[str, Any]) -> None:
        """Write `payload` (its copy in host memory, in the background), once every rank has
        completed its previous checkpoint, which the save keeps (`checkpoint.Writer`): no rank
        deletes the newest checkpoint every rank holds while another still writes the next."""
        if self.writer is not None:
            self.writer.wait()
            _all(True, self.device)
            self.writer.save(payload)
            self._last = time.monotonic()

    def close(self) -> None:
        """Wait for the write under way (its error, if it failed)."""
        if self.writer is not None:
            os.close(self._progress)
            self.writer, writer = None, self.writer
            writer.wait()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, kind: Any, *rest: Any) -> None:
        if kind is None:
            self.close()
        elif self.writer is not None:  # the run failed: the write under way still ends (its error is not this one)
            try:
                self.close()
            except GnndistError:
                pass
