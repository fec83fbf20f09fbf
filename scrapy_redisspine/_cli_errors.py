"""The ``redisspine`` command's exit codes and its one user-facing error."""

from __future__ import annotations

#: Exit codes, as the table of the docs' Operations page (docs/operations.md) documents them.
EXIT_OK = 0
EXIT_PARTIAL = 1  # partly done: malformed seed lines, unknown dead letters, a "no"
EXIT_USAGE = 2  # bad usage, unknown crawl, no Redis configured
EXIT_UNREACHABLE = 3  # Redis unreachable, or it answered with an error
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
EXIT_PIPE_CLOSED = 141  # the reader of the output went away (128 + SIGPIPE), e.g. `| head`


class CliError(Exception):
    """A user-facing failure: its message is printed, its code is the exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code
