"""Fast reading of numeric text tables (whitespace or comma separated, optionally gzipped).

Each chunk of lines is parsed with numpy in one go; only when a chunk holds a bad line is it
scanned line by line, to name that line in the error.
"""
from __future__ import annotations

import gzip
import re
import zlib
from typing import Callable, Iterator, Optional

import numpy as np

from gnndist.errors import GnndistError

CHUNK_BYTES = 16 << 20
_COMMENT = re.compile(rb"(?m)^[ \t]*#[^\n]*")
# check(values of a chunk, header names) -> (row within the chunk, message) of its first bad row, or None
RowCheck = Callable[[np.ndarray, Optional[list[str]]], Optional[tuple[int, str]]]


def open_bytes(path: str):
    """A binary file object for `path`, gunzipped when it ends in .gz; GnndistError if missing."""
    try:
        return gzip.open(path, "rb") if str(path).endswith(".gz") else open(path, "rb")
    except FileNotFoundError:
        raise GnndistError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise GnndistError(f"{path}: is a folder, expected a file") from None


def _chunks(path: str) -> Iterator[bytes]:
    """The file's bytes in pieces of about CHUNK_BYTES that end at a line end."""
    rest = b""
    with open_bytes(path) as f:
        while True:
            try:
                block = f.read(CHUNK_BYTES)
            except (OSError, EOFError, zlib.error) as e:
                raise GnndistError(f"{path}: cannot read: {e}") from None
            if not block:
                break
            block = rest + block
            cut = block.rfind(b"\n") + 1
            if cut == 0:
                rest = block
                continue
            rest = block[cut:]
            yield block[:cut]
    if rest:
        yield rest


def _show(token: bytes) -> str:
    s = token.decode("latin1")
    return repr(s if len(s) <= 40 else s[:40] + "...")


def _token_starts(b: np.ndarray) -> np.ndarray:
    """Positions where a run of non-blank bytes starts (blank: byte <= 32)."""
    blank = b <= 32
    start = ~blank
    start[1:] &= blank[:-1]
    return np.flatnonzero(start)


def _scan_for_bad_token(path: str, chunk: bytes, first_line: int, ncols: int) -> None:
    """Raise for the first line of `chunk` numpy cannot parse as `ncols` numbers."""
    lines = chunk.split(b"\n")
    for i, line in enumerate(lines):
        for j, tok in enumerate(line.split()):
            try:
                ok = np.fromstring(tok, dtype=np.float64, sep=" ").size == 1
            except ValueError:
                ok = False
            if not ok:
                raise GnndistError(f"{path}:{first_line + i}: field {j + 1} is not a number: {_show(tok)}")
    raise GnndistError(f"{path}: lines {first_line}-{first_line + len(lines) - 1} could not be parsed")


def read_table(path: str, sep: str = "whitespace", header: bool = False, ncols: Optional[int] = None,
               check: Optional[RowCheck] = None, what: str = "") -> tuple[Optional[list[str]], np.ndarray]:
    """Parse a numeric table into float64 `[rows, ncols]`; returns `(header names or None, values)`.

    `sep` is "whitespace" or ",". Blank lines and lines starting with '#' are skipped. With
    `header`, the first non-blank line holds column names. `ncols` defaults to the field count of
    the first data line. `check` flags bad rows. Every malformed line raises GnndistError naming
    `path` and the line number; `what` (e.g. "src dst time") is added to field-count errors.
    """
    names: Optional[list[str]] = None
    parts: list[np.ndarray] = []
    line0 = 1  # number of the first line of the current chunk
    want = f" ({what})" if what else ""
    for chunk in _chunks(path):
        if b"#" in chunk:
            chunk = _COMMENT.sub(b"", chunk)
        if header and names is None:
            body = chunk.lstrip(b" \t\r\n")
            if not body:
                line0 += chunk.count(b"\n")
                continue
            skipped = chunk[:len(chunk) - len(body)].count(b"\n")
            head, _, rest = body.partition(b"\n")
            text = head.decode("utf-8", "replace")
            names = [n.strip().strip('"').strip() for n in text.split(None if sep == "whitespace" else sep)]
            line0 += skipped + 1
            chunk = rest
        if sep != "whitespace":
            chunk = chunk.replace(sep.encode(), b" ")
        b = np.frombuffer(chunk, dtype=np.uint8)
        starts = _token_starts(b)
        newlines = np.flatnonzero(b == 10)
        line_of = np.searchsorted(newlines, starts)  # line within the chunk of every token
        per_line = np.bincount(line_of, minlength=newlines.size + 1)
        data_lines = np.flatnonzero(per_line)
        if data_lines.size:
            if ncols is None:
                ncols = int(per_line[data_lines[0]])
                if names is not None and ncols < len(names):
                    raise GnndistError(f"{path}:{line0 + int(data_lines[0])}: expected {len(names)} fields "
                                       f"(one per header name), got {ncols}")
            bad = np.flatnonzero(per_line[data_lines] != ncols)
            if bad.size:
                i = int(data_lines[bad[0]])
                raise GnndistError(f"{path}:{line0 + i}: expected {ncols} fields{want}, got {per_line[i]}")
            try:
                values = np.fromstring(chunk, dtype=np.float64, sep=" ")
            except ValueError:
                values = None
            if values is None or values.size != starts.size:
                _scan_for_bad_token(path, chunk, line0, ncols)
            values = values.reshape(-1, ncols)
            if check is not None:
                found = check(values, names)
                if found is not None:
                    row, msg = found
                    raise GnndistError(f"{path}:{line0 + int(data_lines[row])}: {msg}")
            parts.append(values)
        line0 += newlines.size
    if header and names is None:
        raise GnndistError(f"{path}: empty file (expected a header line)")
    if not parts:
        raise GnndistError(f"{path}: no data lines (empty file)")
    return names, np.concatenate(parts) if len(parts) > 1 else parts[0]


def check_ids(values: np.ndarray, cols: tuple[int, ...]) -> Optional[tuple[int, str]]:
    """First row whose columns `cols` are not non-negative integer node ids."""
    a = values[:, list(cols)]
    bad = ~((a >= 0) & (a == np.floor(a)) & (a < 2.0 ** 53))
    rows = np.flatnonzero(bad.any(axis=1))
    if not rows.size:
        return None
    r = int(rows[0])
    v = a[r][bad[r]][0]
    why = "is negative" if v < 0 else "is too large" if v >= 2.0 ** 53 else "is not an integer"
    return r, f"node id {v:g} {why}"


def check_finite(values: np.ndarray, names: Optional[list[str]] = None) -> Optional[tuple[int, str]]:
    """First row holding NaN or inf, naming the column by `names` or by field number."""
    rows = np.flatnonzero(~np.isfinite(values).all(axis=1))
    if not rows.size:
        return None
    r = int(rows[0])
    j = int(np.flatnonzero(~np.isfinite(values[r]))[0])
    name = names[j] if names and j < len(names) and names[j] else f"field {j + 1}"
    return r, f"{name} is {values[r, j]:g}"
