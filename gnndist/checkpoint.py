"""Training checkpoints: one file per epoch (DIR/epoch-0003.pt), written atomically and read
back with `weights_only=True`. The last 2 epochs are kept, so that a run whose ranks crashed
between their writes can resume from the older epoch that every rank completed. A run that
replaces an earlier run's checkpoint keeps it in DIR/.replaced until it ends well (`run`)."""
from __future__ import annotations

import os
import random
import shutil
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np
import torch

from gnndist.runtime import dist
from gnndist.errors import GnndistError, first_line
from gnndist.io import atomic_file
from gnndist.outputs import CHECKPOINT_FILE, RANK_FOLDER, REPLACED, checkpoint_name

FORMAT = 1
KEEP = 2  # complete epochs kept in a checkpoint folder


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


def _epoch_files(directory: Path) -> dict[int, Path]:
    """Epoch -> checkpoint file in `directory`, complete or not."""
    if not directory.is_dir():
        return {}
    found = {}
    for f in directory.iterdir():
        m = CHECKPOINT_FILE.fullmatch(f.name)
        if m and f.is_file():
            found[int(m[1])] = f
    return found


def epochs(directory: str | os.PathLike) -> list[int]:
    """The epochs whose checkpoint in DIR is complete (a whole torch archive), ascending."""
    return sorted(e for e, f in _epoch_files(Path(directory)).items() if zipfile.is_zipfile(f))


def save(directory: str | os.PathLike, payload: dict[str, Any]) -> Path:
    """Write `payload` (tensors, numbers, strings, lists, dicts; its "epoch" an integer >= 0) as
    DIR/epoch-NNNN.pt, atomically; then keep only it and the newest complete earlier epoch (a
    later one belongs to a run this one replaces)."""
    epoch = payload.get("epoch")
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        raise ValueError(f"a checkpoint payload needs an integer epoch >= 0, got {epoch!r}")
    directory = Path(directory)
    path = directory / checkpoint_name(epoch)
    with atomic_file(path) as f:
        torch.save({"format": FORMAT, **payload}, f)
    older = [e for e in epochs(directory) if e < epoch][-(KEEP - 1):]
    for e, f in _epoch_files(directory).items():
        if e != epoch and e not in older:
            f.unlink(missing_ok=True)
    for f in directory.glob(".epoch-*.pt.tmp-*"):  # left by a writer that was killed
        f.unlink(missing_ok=True)
    return path


def rank_folders_in(directory: Path) -> list[int]:
    """The ranks r whose folder rank{r} is in the checkpoint folder `directory` (a W-rank link
    run's; a host of a multi-host run holds its own ranks' only), ascending."""
    if not directory.is_dir():
        return []
    return sorted(int(m[1]) for f in directory.iterdir() if (m := RANK_FOLDER.fullmatch(f.name)) and f.is_dir())


def model_folder(directory: Path) -> Path:
    """The folder of checkpoint folder `directory` whose epochs a trained model is read from:
    its lowest rank folder here (every rank of a W-rank link run holds the same parameters),
    else `directory` itself."""
    ranks = rank_folders_in(directory)
    return directory / f"rank{ranks[0]}" if ranks else directory


def _holds(folder: Path) -> bool:
    """Whether `folder` holds epoch files of a run (in .replaced too)."""
    return bool(_epoch_files(folder) or _epoch_files(folder / REPLACED))


def _resumable(folder: Path) -> bool:
    """Whether the newest complete epoch in `folder` is a link run's, which --resume continues
    (a node run's is for gnndist predict)."""
    held = epochs(folder)
    try:
        payload = torch.load(folder / checkpoint_name(held[-1]), map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # none, or not a torch file of ours: nothing --resume could continue
        return False
    config = payload.get("config") if isinstance(payload, dict) else None
    return not (isinstance(config, dict) and config.get("task") == "node")


def check_folder(directory: str | os.PathLike, rank_folders: int, resume: bool) -> None:
    """Refuse (GnndistError), before a run starts, a checkpoint folder that the run would mix with
    another run's: one written in the other layout (one folder of epochs, or a folder per rank:
    `rank_folders` is W where this run's W ranks write rank0 .. rank{W-1}, else 0), or holding a
    rank's folder this run has no rank for (a host may hold only its own ranks' folders); and,
    without `resume`, a folder of a run that stopped while replacing an earlier one (both its
    epochs and the earlier run's in .replaced are there: which to keep is the user's call)."""
    directory = Path(directory)
    ranks = [r for r in rank_folders_in(directory) if _holds(directory / f"rank{r}")]
    writes = f"a folder per rank for {rank_folders} ranks" if rank_folders else "one folder of epochs"
    held = None
    if rank_folders and _holds(directory):
        held = "a checkpoint written as one folder of epochs (by one process, or by a node run)"
    elif ranks and not rank_folders:
        held = f"the per-rank folders of a link run ({', '.join(f'rank{r}/' for r in ranks)})"
    elif ranks and ranks[-1] >= rank_folders:
        held = f"rank{ranks[-1]}/ of a link run on more ranks"
    if held:
        raise GnndistError(f"{directory} holds {held}, and this run writes {writes}: choose another --checkpoint, "
                           f"or delete that one")
    if not resume:
        for folder in [directory / f"rank{r}" for r in range(rank_folders)] if rank_folders else [directory]:
            _refuse_two_runs(folder)


def _refuse_two_runs(folder: Path) -> None:
    """Refuse to replace a folder that holds both a run's epochs and, in .replaced, the epochs of
    the earlier run it was replacing when it stopped."""
    aside = folder / REPLACED
    mine = epochs(folder)
    if mine and _epoch_files(aside):
        keep = "--resume continues the stopped run; " if _resumable(folder) else ""
        raise GnndistError(f"{folder} holds {_epochs_text(mine)} of a run that stopped while replacing an earlier "
                           f"run's (kept in {aside}): {keep}to start anew, delete one of them, or choose another "
                           f"--checkpoint")


def _epochs_text(held: list[int]) -> str:
    """'epoch 3' or 'epochs 2, 3'."""
    return f"epoch{'s' * (len(held) > 1)} {', '.join(map(str, held))}"


@contextmanager
def run(directory: Optional[str | os.PathLike], resume: bool, restore: bool = True) -> Iterator[None]:
    """The block of a training run that writes its checkpoint to DIR (None: no checkpoint).
    Without `resume`, the epoch files an earlier run left in DIR move to DIR/.replaced first, and
    the first rank of each host says which; a DIR that holds both a stopped run's epochs and the ones it was replacing
    is refused (`check_folder`), and a stopped run's unfinished files beside .replaced are
    deleted. A run that ends well deletes DIR/.replaced. One that fails keeps it, and its error
    names it; with `restore`, a run that fails before its first save moves the files back (not
    for the per-rank folders of a W-rank run, whose ranks could then hold different runs'
    epochs). A failed run loses no checkpoint, and its own epochs stay there to --resume."""
    if directory is None:
        yield
        return
    directory = Path(directory)
    aside = directory / REPLACED
    moved = False

    def kept() -> Optional[Path]:  # where an earlier run's epochs stay if the run stops now
        return None if (moved and restore and not _epoch_files(directory)) or not _epoch_files(aside) else aside

    if not resume:
        _refuse_two_runs(directory)
        left = list(_epoch_files(directory).values()) + list(directory.glob(".epoch-*.pt.tmp-*"))
        if left and _epoch_files(aside):  # only unfinished files of a stopped run (`_refuse_two_runs`)
            for f in left:
                f.unlink()
        elif left:
            if dist.first_on_host() and (earlier := epochs(directory)):  # once a host, for its folder
                dist.say(f"replacing the checkpoint of an earlier run in {directory} ({_epochs_text(earlier)}): kept "
                         f"in {aside} until this run ends well, then deleted"
                         + ("; --resume continues it instead" if _resumable(directory) else ""))
            aside.mkdir(exist_ok=True)
            for f in left:
                os.replace(f, aside / f.name)
            moved = True
    _kept_now.append(kept)
    try:
        yield
    except BaseException as e:
        if moved and restore and not _epoch_files(directory):
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


def load(directory: str | os.PathLike, epoch: Optional[int] = None, needs: tuple[str, ...] = ()) -> dict[str, Any]:
    """The payload saved in DIR for `epoch` (default: the newest); a missing, truncated or
    foreign checkpoint, or one without the keys `needs`, is a `GnndistError` naming the file."""
    directory = Path(directory)
    files = _epoch_files(directory)
    if not files:
        raise GnndistError(f"no checkpoint to resume from in {directory} (no epoch-NNNN.pt files)")
    if epoch is None:
        epoch = max(files)
    if epoch not in files:
        raise GnndistError(f"{directory} holds no checkpoint of epoch {epoch} (it holds epochs "
                           f"{', '.join(map(str, sorted(files)))})")
    path = files[epoch]
    older = [e for e in epochs(directory) if e < epoch]
    fallback = f"; epoch {older[-1]} is complete: move {path.name} away to resume from it" if older else ""
    size = path.stat().st_size
    if not zipfile.is_zipfile(path):
        why = "it is empty (0 bytes)" if size == 0 else f"it is truncated or not a torch file ({size:,} bytes)"
        raise GnndistError(f"cannot read checkpoint {path}: {why}{fallback}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # empty, truncated, foreign or pickled-object files
        raise GnndistError(f"cannot read checkpoint {path}: {first_line(e)}{fallback}") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT or payload.get("epoch") != epoch:
        raise GnndistError(f"{path} is not a gnndist checkpoint of epoch {epoch} (format {FORMAT}){fallback}")
    missing = [k for k in needs if k not in payload]
    if missing:  # not damage: the older epochs are of the same run, and lack them too
        config = payload.get("config")
        node = isinstance(config, dict) and config.get("task") == "node"
        whose = " (a node run's, for gnndist predict)" if node else ""
        raise GnndistError(f"{path} is not a whole training checkpoint{whose}: it lacks {', '.join(missing)}")
    return payload
