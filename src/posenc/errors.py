"""User-facing errors: the CLI prints them as one line and exits with code 2; SIGTERM as an interrupt."""

import contextlib
import signal
from collections.abc import Iterator


class PosencError(Exception):
    """Bad input (unknown scheme, invalid config, missing corpus, ...).

    Raised anywhere in posenc for problems the user can fix; ``posenc.cli.main.main``
    turns it into ``posenc: error: <message>`` on stderr and exit code 2.
    """


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its type name when it has none (for one-line errors)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def one_line(exc: BaseException) -> str:
    """``TypeName: first line of the message`` (a failed job's or a failed import's error, in one line)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[list[int]]:
    """SIGTERM (``timeout``, a scheduler's stop, ``kill``) raises KeyboardInterrupt as Ctrl-C does, so a command
    saves its checkpoint, waits for its jobs and says how to resume instead of dying mid-write (its job
    processes' semaphores reported as leaked). Yields the list the signals received are appended to; the
    previous handler is restored on exit. Main thread only (where Python runs signal handlers)."""
    received: list[int] = []

    def interrupt(signum, frame):
        received.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, previous)
