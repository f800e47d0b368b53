"""Downloading files on first use: resumable, written atomically, under a lock, checked.

A file is fetched into `NAME.part` beside its place (an interrupted transfer leaves that prefix,
and the next try asks the server for the rest with an HTTP Range request), checked against its
sha256 where one is known, and renamed into place. A folder's lock (`fcntl`) makes processes
that share it, on one host or on several over a file system with POSIX locks, fetch once.

Environment: `$GNNDIST_DATA` the download folder (default: `datasets/` in the gnndist cache,
`$GNNDIST_CACHE`); `$GNNDIST_DATA_MIRROR=BASE` fetches `https://HOST/PATH` from `BASE/HOST/PATH`
(mirrors, sites without internet, tests); `$GNNDIST_DATA_TIMEOUT` the seconds a connection or a
read may stall before the download fails (default 60).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import http.client
import math
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Iterator, Optional

from tqdm import tqdm

from gnndist.errors import GnndistError, first_line
from gnndist.io import cache_root, sha256_file, show_progress

DATA_ENV, MIRROR_ENV, TIMEOUT_ENV = "GNNDIST_DATA", "GNNDIST_DATA_MIRROR", "GNNDIST_DATA_TIMEOUT"
DEFAULT_TIMEOUT_S = 60.0
_BLOCK = 1 << 20


class _Failed(Exception):
    """Why a transfer failed (becomes one GnndistError naming the URL and the file's place)."""


def data_root() -> Path:
    """The folder datasets by name are downloaded into: $GNNDIST_DATA, else `datasets` in the cache."""
    env = os.environ.get(DATA_ENV)
    return Path(env) if env else cache_root() / "datasets"


def mirrored(url: str) -> str:
    """Where `url` is fetched from: itself, or `$GNNDIST_DATA_MIRROR/HOST/PATH`."""
    base = os.environ.get(MIRROR_ENV)
    if not base:
        return url
    u = urllib.parse.urlsplit(url)
    return f"{base.rstrip('/')}/{u.netloc}{u.path}" + (f"?{u.query}" if u.query else "")


def timeout_s() -> float:
    """Seconds a connection or a read may stall: $GNNDIST_DATA_TIMEOUT, default 60."""
    raw = os.environ.get(TIMEOUT_ENV)
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise GnndistError(f"{TIMEOUT_ENV}={raw!r}: expected a number of seconds > 0")
    return value


def say(msg: str) -> None:
    """One line on stderr about fetching (gnndist.dist.say's prefix needs torch, not loaded here)."""
    print(f"gnndist: {msg}", file=sys.stderr, flush=True)


def make_folder(folder: Path) -> None:
    """`folder` made (with its parents), or one line saying why it cannot be."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise GnndistError(f"cannot make the dataset folder {folder} ({DATA_ENV}, default the datasets folder of "
                           f"GNNDIST_CACHE): {e.strerror or e}") from None


@contextlib.contextmanager
def locked(folder: Path, what: str) -> Iterator[None]:
    """Hold the exclusive lock of `folder` (its `.lock` file) inside the block; another process
    that holds it is waited for, saying so once."""
    make_folder(folder)
    lock = folder / ".lock"
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        raise GnndistError(f"cannot open the lock file {lock}: {e.strerror or e}") from None
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                raise GnndistError(f"cannot lock {lock}: {e.strerror or e}") from None
            say(f"waiting for another process that is fetching {what} (it holds {lock})")
            fcntl.lockf(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def download(url: str, dest: Path, sha256: Optional[str] = None) -> None:
    """Fetch `url` (from the mirror, if one is set) to `dest`, which must not exist yet: through
    `dest.part` (resumed if there), checked against `sha256` if given, renamed into place.
    Call it holding the folder's lock (`locked`)."""
    src = mirrored(url)
    where = url if src == url else f"{url} (from {src})"
    part = dest.with_name(dest.name + ".part")
    try:
        _transfer(src, part, timeout_s(), show_progress())
    except _Failed as e:
        raise GnndistError(f"cannot download {where}: {e}; or put the file there by hand: {dest}") from None
    if sha256 is not None:
        got = sha256_file(part)
        if got != sha256:
            part.unlink()
            raise GnndistError(f"{where}: the downloaded file's sha256 is {got}, expected {sha256} (deleted it: the "
                               f"server sends another file); put the source's file there by hand: {dest}")
    os.replace(part, dest)


def _reason(e: BaseException) -> str:
    """A network error in words: 'HTTP 500 Internal Server Error', 'timed out', 'Connection refused'."""
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code} {e.reason}"
    if isinstance(e, urllib.error.URLError):
        e = e.reason if isinstance(e.reason, BaseException) else Exception(str(e.reason))
    if isinstance(e, TimeoutError):
        return "timed out"
    return getattr(e, "strerror", None) or first_line(e)


def _transfer(src: str, part: Path, timeout: float, progress: bool) -> None:
    """Write `src`'s bytes into `part`, after those it already holds when the server can send the
    rest (an HTTP 206 answer to a Range request), else from the start."""
    have = part.stat().st_size if part.is_file() else 0
    headers = {"User-Agent": "gnndist"}
    if have:
        headers["Range"] = f"bytes={have}-"
    try:
        resp = urllib.request.urlopen(urllib.request.Request(src, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # nothing past the part's end
            if e.headers.get("Content-Range", "") == f"bytes */{have}":
                return  # the part is the whole file already
            part.unlink()  # the part is not a prefix of this file: start again
            return _transfer(src, part, timeout, progress)
        raise _Failed(_reason(e)) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as e:
        raise _Failed(_reason(e)) from None
    with resp:
        start, total = _range(resp, have)
        got = start
        name = part.name[:-len(".part")]
        read = getattr(resp, "read1", resp.read)  # what has come, so that a stall keeps the bytes before it
        try:
            with open(part, "ab" if start else "wb") as f, tqdm(
                    total=total, initial=start, unit="B", unit_scale=True, desc=name, disable=not progress) as bar:
                while block := read(_BLOCK):
                    f.write(block)
                    got += len(block)
                    bar.update(len(block))
                f.flush()
                os.fsync(f.fileno())
        except (OSError, http.client.HTTPException) as e:
            if not got:
                part.unlink(missing_ok=True)
                raise _Failed(f"no bytes came ({_reason(e)})") from None
            raise _Failed(f"the transfer stopped after {got:,} bytes ({_reason(e)}); kept them in {part}, where the "
                          f"next try resumes") from None
    if total is not None and got != total:
        if got > total or not got:
            part.unlink(missing_ok=True)
            raise _Failed(f"the server sent {got:,} bytes, {'more than' if got else 'not'} the {total:,} it announced")
        raise _Failed(f"the server sent {got:,} of {total:,} bytes; kept them in {part}, where the next try resumes")


def _range(resp, have: int) -> tuple[int, Optional[int]]:
    """(where the body starts in the file, the file's size if told): `have` when the server sent
    the rest of the file (HTTP 206 starting there), else 0."""
    length = resp.headers.get("Content-Length", "")
    length = int(length) if length.strip().isdigit() else None
    if have and getattr(resp, "status", None) == 206:
        unit, _, spec = resp.headers.get("Content-Range", "").partition(" ")  # "bytes FIRST-LAST/SIZE"
        span, _, size = spec.partition("/")
        if unit == "bytes" and span.partition("-")[0].strip() == str(have):
            return have, int(size) if size.strip().isdigit() else (None if length is None else have + length)
    return 0, length


def verify(path: Path, sha256: Optional[str], url: str) -> None:
    """GnndistError unless the file at `path` (placed by hand, or downloaded before) has `sha256`."""
    if sha256 is None:
        return
    got = sha256_file(path)
    if got != sha256:
        raise GnndistError(f"{path}: sha256 {got}, expected {sha256}: not the file {url} serves (remove it to "
                           f"download it again)")
