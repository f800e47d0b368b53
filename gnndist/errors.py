"""The one exception type for errors a user can cause."""


class GnndistError(ValueError):
    """A bad input from the user: a malformed file, a wrong flag, mismatched partitions.

    The message is one line; the CLI prints it and exits with status 2.
    """


def first_line(e: BaseException) -> str:
    """An exception's message cut to its first line (its type name when it has none)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
