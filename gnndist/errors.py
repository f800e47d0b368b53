"""The one exception type for errors a user can cause, and the allocation failures that become one."""
from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Iterator


class GnndistError(ValueError):
    """A bad input from the user: a malformed file, a wrong flag, mismatched partitions.

    The message is one line; the CLI prints it and exits with status 2.
    """


def first_line(e: BaseException) -> str:
    """An exception's message cut to its first line (its type name when it has none)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def is_allocation_failure(e: BaseException) -> bool:
    """Whether `e` is numpy's or torch's report of an allocation that failed."""
    return isinstance(e, MemoryError) or (isinstance(e, RuntimeError) and any(
        s in str(e) for s in ("can't allocate memory", "not enough memory", "out of memory")))


@contextmanager
def allocating(what: str) -> Iterator[None]:
    """An allocation failure inside becomes one GnndistError: not enough memory for `what`."""
    try:
        yield
    except (MemoryError, RuntimeError) as e:
        if not is_allocation_failure(e):
            raise
        reason = re.sub(r"^\[enforce fail at [^\]]*\]\s*(err == 0\.\s*)?", "", first_line(e))
        raise GnndistError(f"not enough memory for {what}: {reason}") from None
