"""Atomic writes and checksums (a crash never leaves a half-written file or folder), user paths
resolved (`real_path`), .npy arrays memory-mapped (`open_npy`), and when to draw progress bars."""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np

from gnndist.errors import GnndistError, first_line


def show_progress(quiet: bool = False) -> bool:
    """Whether to draw progress bars: stderr is a terminal and --quiet was not given."""
    return not quiet and sys.stderr.isatty()


def real_path(path: str | os.PathLike, flag: Optional[str] = None) -> Path:
    """`path` with its symbolic links resolved (it need not exist). Every path a user gives
    goes through here before it is resolved or looked at, so that links that loop (a link to
    itself, or links to each other) are one line naming the path (and `flag`, where the path
    is a flag's value) instead of pathlib's RuntimeError or a file said to be missing."""
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:  # the path, or a folder on its way, is such a link
            raise GnndistError(f"{flag + ' ' if flag else ''}{path}: its symbolic links loop (a link to itself, or "
                               f"links to each other), so it names no file or folder") from None
    return Path(path).resolve()


def cache_root() -> Path:
    """Where gnndist keeps what it makes on demand (partition stores, downloaded datasets):
    $GNNDIST_CACHE or ~/.cache/gnndist (a folder, or a path where one can be made)."""
    root = Path(os.environ.get("GNNDIST_CACHE") or Path.home() / ".cache" / "gnndist")
    real_path(root, "GNNDIST_CACHE")
    above = next((p for p in (root, *root.absolute().parents) if p.exists()), None)
    if above is not None and not above.is_dir():
        raise GnndistError(f"the cache {root} (GNNDIST_CACHE, default ~/.cache/gnndist) cannot be a folder: "
                           f"{above} is a file")
    return root


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temp folder beside `path`; on success it replaces `path` in one rename.

    On an exception the temp folder is removed and any existing `path` is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; give the usual mode
        if path.exists():
            if not overwrite:
                raise FileExistsError(path)
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
            os.rename(path, old / "x")
            os.rename(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "wb") -> Iterator[Any]:
    """Open a temp file beside `path` for writing; it replaces `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual mode
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write `obj` as indented JSON, atomically."""
    with atomic_file(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=False)
        f.write("\n")


def open_npy(path: str | os.PathLike) -> np.ndarray:
    """A .npy file memory-mapped, without pickle; one line where it is not a readable array."""
    with open(path, "rb") as f:
        head = f.read(6)
    if head != b"\x93NUMPY":
        raise GnndistError(f"{path}: not a .npy array (it starts with {head!r})")
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise GnndistError(f"{path}: not a readable .npy array ({type(e).__name__}: {first_line(e)})") from None
