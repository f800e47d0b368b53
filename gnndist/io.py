"""Atomic writes and checksums (a crash never leaves a half-written file or folder), and when to
draw progress bars."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

from gnndist.errors import GnndistError


def show_progress(quiet: bool = False) -> bool:
    """Whether to draw progress bars: stderr is a terminal and --quiet was not given."""
    return not quiet and sys.stderr.isatty()


def cache_root() -> Path:
    """Where gnndist keeps what it makes on demand (partition stores, downloaded datasets):
    $GNNDIST_CACHE or ~/.cache/gnndist (a folder, or a path where one can be made)."""
    root = Path(os.environ.get("GNNDIST_CACHE") or Path.home() / ".cache" / "gnndist")
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
