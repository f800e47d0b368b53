"""Fast reading of numeric text tables (whitespace or comma separated, optionally gzipped).

Each chunk of lines is parsed by numpy's C reader in one go; only when a chunk holds a bad line
is it scanned line by line in Python, to name that line in the error.
"""
from __future__ import annotations

import gzip
import io
import os
import warnings
import zlib
from typing import Callable, Iterator, Optional

import numpy as np
from tqdm import tqdm

from gnndist.errors import GnndistError
from gnndist.io import real_path, show_progress

CHUNK_BYTES = 16 << 20
PROGRESS_BYTES = 64 << 20  # files at least this large show a progress bar
# check(values of a chunk, header names) -> (row within the chunk, message) of its first bad row, or None
RowCheck = Callable[[np.ndarray, Optional[list[str]]], Optional[tuple[int, str]]]


def open_bytes(path: str):
    """A binary file object for `path`, gunzipped when it ends in .gz; GnndistError if missing or
    not a regular file (a fifo or device is refused before it is opened: reading it could block
    or never end)."""
    check_regular(path)
    try:
        return gzip.open(path, "rb") if str(path).endswith(".gz") else open(path, "rb")
    except OSError as e:
        raise GnndistError(f"{path}: cannot open: {e.strerror or e}") from None


def check_regular(path: str, folder_ok: bool = False) -> None:
    """GnndistError unless `path` is a regular file (or, with `folder_ok`, a folder); only stats it."""
    real_path(path)
    if not os.path.exists(path):
        raise GnndistError(f"{path}: no such file")
    if os.path.isdir(path) and not folder_ok:
        raise GnndistError(f"{path}: is a folder, expected a file")
    if not (os.path.isfile(path) or os.path.isdir(path)):
        raise GnndistError(f"{path}: not a regular file{' or folder' if folder_ok else ''} "
                           f"(a fifo, device or socket cannot be read as data)")


def _chunks(path: str) -> Iterator[bytes]:
    """The file's bytes in pieces of about CHUNK_BYTES that end at a line end, with a progress
    bar over the bytes on disk for large files when stderr is a terminal."""
    rest = b""
    first = True
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise GnndistError(f"{path}: {e.strerror.lower() if e.strerror else 'cannot read'}") from None
    with open_bytes(path) as f, tqdm(total=size, unit="B", unit_scale=True, desc=os.path.basename(path),
                                      disable=size < PROGRESS_BYTES or not show_progress()) as bar:
        raw = getattr(f, "fileobj", f)  # a gzip file's compressed stream
        while True:
            try:
                block = f.read(CHUNK_BYTES)
            except (OSError, EOFError, zlib.error) as e:
                raise GnndistError(f"{path}: cannot read: {e}") from None
            bar.update(raw.tell() - bar.n)
            if not block:
                break
            if first:  # a UTF-8 byte order mark is not part of the first field
                block, first = block.removeprefix(b"\xef\xbb\xbf"), False
            block = rest + block
            cut = block.rfind(b"\n") + 1
            if cut == 0:
                rest = block
                continue
            rest = block[cut:]
            yield block[:cut]
    if rest:
        yield rest


def _show(token: str) -> str:
    return repr(token if len(token) <= 40 else token[:40] + "...")


def data_lines(chunk: bytes, sep: str) -> Iterator[tuple[int, list[str]]]:
    """(line index within `chunk`, fields) of each line that holds data: '#' starts a comment,
    and a line of only whitespace (as numpy's reader counts it: bytes read as latin-1) is blank."""
    for i, line in enumerate(chunk.decode("latin1").split("\n")):
        line = line.split("#", 1)[0]
        if line.strip():
            yield i, (line.split() if sep == "whitespace" else [f.strip() for f in line.split(sep)])


def _blank_out(chunk: bytes, sep: str) -> bytes:
    """`chunk` with its lines that hold no data emptied (line count kept): numpy's reader
    rejects a comma-separated line of only whitespace, such as a form feed."""
    lines = chunk.split(b"\n")
    keep = np.zeros(len(lines), dtype=bool)
    keep[[i for i, _ in data_lines(chunk, sep)]] = True
    return b"\n".join(line if k else b"" for line, k in zip(lines, keep))


def is_number(token: str) -> bool:
    """Whether a field reads as a number (as Python's float reads it, without '_' separators)."""
    try:
        float(token)
    except ValueError:
        return False
    return "_" not in token


def raise_bad_line(path: str, chunk: bytes, line0: int, sep: str, ncols: Optional[int], want: str) -> None:
    """Raise for the first line of `chunk` that is not `ncols` numbers (default: as many as its
    first data line)."""
    for i, fields in data_lines(chunk, sep):
        ncols = ncols or len(fields)
        if len(fields) != ncols:
            raise GnndistError(f"{path}:{line0 + i}: expected {ncols} fields{want}, got {len(fields)}")
        for j, tok in enumerate(fields):
            if not is_number(tok):
                raise GnndistError(f"{path}:{line0 + i}: field {j + 1} is not a number: {_show(tok)}")
    last = line0 + chunk.count(b"\n")
    raise GnndistError(f"{path}: a line in {line0}-{last} could not be parsed")


def _parse(chunk: bytes, sep: str) -> Optional[np.ndarray]:
    """The chunk's numbers as a 2-d array in one numpy call; None if numpy rejects a line."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a chunk of only comments is "empty input"
            return np.loadtxt(io.BytesIO(chunk), dtype=np.float64, comments="#", ndmin=2,
                              delimiter=None if sep == "whitespace" else sep)
    except ValueError:
        return None


def read_table(path: str, sep: str = "whitespace", header: bool = False, ncols: Optional[int] = None,
               check: Optional[RowCheck] = None, what: str = "",
               header_problem: Optional[Callable[[list[str]], Optional[str]]] = None,
               ) -> tuple[Optional[list[str]], np.ndarray]:
    """Parse a numeric table into float64 `[rows, ncols]`; returns `(header names or None, values)`.

    `sep` is "whitespace" or ",". Blank lines and '#' comments are skipped. With `header`, the
    first non-blank line holds column names (unless it is all numbers: then there is no header),
    which `header_problem` may reject. `ncols`
    defaults to the field count of the first data line. `check` flags bad rows. Every malformed
    line raises GnndistError naming `path` and the line number; `what` (e.g. "src dst time")
    is added to field-count errors.
    """
    names: Optional[list[str]] = None
    parts: list[np.ndarray] = []
    line0 = 1  # number of the first line of the current chunk
    want = f" ({what})" if what else ""
    for chunk in _chunks(path):
        if header and names is None:
            body = chunk.lstrip()  # ASCII whitespace, form feeds included
            if not body:
                line0 += chunk.count(b"\n")
                continue
            line0 += chunk.count(b"\n", 0, len(chunk) - len(body))
            head, _, rest = body.partition(b"\n")
            text = head.decode("utf-8", "replace")
            names = [n.strip().strip('"').strip() for n in text.split(None if sep == "whitespace" else sep)]
            if all(is_number(n) for n in names):  # no header: the line is data
                names, header = None, False
                chunk = body
            else:
                problem = header_problem(names) if header_problem else None
                if problem:
                    raise GnndistError(f"{path}:{line0}: {problem}")
                line0 += 1
                chunk = rest
        values = _parse(chunk, sep)
        if values is None:  # a whitespace-only line, or a bad one
            chunk = _blank_out(chunk, sep)
            values = _parse(chunk, sep)
        if values is None or (values.size and ncols is not None and values.shape[1] != ncols):
            raise_bad_line(path, chunk, line0, sep, ncols, want)
        if values.size:
            if ncols is None:
                ncols = values.shape[1]
                if names is not None and ncols < len(names):
                    raise GnndistError(f"{path}:{line0 + next(data_lines(chunk, sep))[0]}: expected "
                                       f"{len(names)} fields (one per header name), got {ncols}")
            found = check(values, names) if check is not None else None
            if found is not None:
                row, msg = found
                line = next(i for k, (i, _) in enumerate(data_lines(chunk, sep)) if k == row)
                raise GnndistError(f"{path}:{line0 + line}: {msg}")
            parts.append(values)
        line0 += chunk.count(b"\n")
    if header and names is None:
        raise GnndistError(f"{path}: empty file (expected a header line)")
    if not parts:
        raise GnndistError(f"{path}: no data lines" + (" after the header" if header else " (empty file)"))
    return names, np.concatenate(parts) if len(parts) > 1 else parts[0]


def check_ids(values: np.ndarray, cols: tuple[int, ...], what: str = "node id") -> Optional[tuple[int, str]]:
    """First row whose columns `cols` are not non-negative integers (`what`: node ids, labels)."""
    a = values[:, list(cols)]
    bad = ~((a >= 0) & (a == np.floor(a)) & (a < 2.0 ** 53))
    rows = np.flatnonzero(bad.any(axis=1))
    if not rows.size:
        return None
    r = int(rows[0])
    v = a[r][bad[r]][0]
    why = "is negative" if v < 0 else "is too large" if v >= 2.0 ** 53 else "is not an integer"
    return r, f"{what} {v:g} {why}"


def check_finite(values: np.ndarray, names: Optional[list[str]] = None) -> Optional[tuple[int, str]]:
    """First row holding NaN or inf, naming the column by `names` or by field number."""
    rows = np.flatnonzero(~np.isfinite(values).all(axis=1))
    if not rows.size:
        return None
    r = int(rows[0])
    j = int(np.flatnonzero(~np.isfinite(values[r]))[0])
    name = names[j] if names and j < len(names) and names[j] else f"field {j + 1}"
    return r, f"{name} is {values[r, j]:g}"
