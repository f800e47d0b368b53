"""The one exception type for errors a user can cause."""


class GnndistError(ValueError):
    """A bad input from the user: a malformed file, a wrong flag, mismatched partitions.

    The message is one line; the CLI prints it and exits with status 2.
    """
