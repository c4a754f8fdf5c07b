"""Progress on stderr: bars with an ETA (tqdm) and progress lines, under the one verbosity the ``posenc`` command
sets (``--quiet`` / ``--verbose``); job processes inherit it through the environment variable ``POSENC_PROGRESS``.

The rule (docs/usage.md, "Progress and output"); results go to stdout, progress and errors to stderr:

- ``quiet``: no bars, no progress lines; only results, warnings and errors.
- ``normal`` (the default): a bar when stderr is a terminal; off a terminal (a log file, a pipe) no bar, and the few
  progress lines (a training checkpoint, an early stop, a scored window of ``posenc extend``) as whole lines.
- ``verbose``: normal's, plus the per-step training log (one line per logged step), and bars off a terminal too,
  written as whole lines at most every :data:`LOG_INTERVAL` seconds (a log file gets no carriage returns).

Progress reads no random generator and changes no computation: a run's numbers are the same at every verbosity.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Iterator

from tqdm.auto import tqdm

from posenc.errors import PosencError

ENV = "POSENC_PROGRESS"
LEVELS = ("quiet", "normal", "verbose")
LOG_INTERVAL = 10.0  # seconds between a bar's lines off a terminal (--verbose): a log file stays short


def level() -> str:
    """The verbosity now: ``$POSENC_PROGRESS`` (one of :data:`LEVELS`), ``normal`` when unset. PosencError (one line)
    for another value."""
    value = os.environ.get(ENV, "normal")
    if value not in LEVELS:
        raise PosencError(f"{ENV} must be one of {', '.join(LEVELS)}, got {value!r}")
    return value


@contextlib.contextmanager
def verbosity(value: str | None) -> Iterator[None]:
    """Within: the verbosity ``value`` (None: as it is), for this process and the job processes it starts; the
    previous value restored after."""
    if value is None:
        yield
        return
    if value not in LEVELS:
        raise PosencError(f"verbosity must be one of {', '.join(LEVELS)}, got {value!r}")
    before = os.environ.get(ENV)
    os.environ[ENV] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before


def live() -> bool:
    """Whether a bar shows live (redrawn in place): stderr is a terminal and the verbosity is not quiet."""
    return level() != "quiet" and sys.stderr.isatty()


class _Lines:
    """A file for tqdm off a terminal: each redraw (``\\r`` + status) becomes one whole line."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> None:
        for part in text.replace("\r", "\n").split("\n"):
            if part.strip():
                self.stream.write(part.rstrip() + "\n")

    def flush(self) -> None:
        self.stream.flush()


def bar(
    total: int | None = None,
    *,
    desc: str,
    iterable: Iterable | None = None,
    unit: str = "it",
    initial: int = 0,
    leave: bool = True,
    shown: bool = True,
) -> tqdm:
    """A tqdm bar with an ETA on stderr, by the rule above: live on a terminal (not quiet), as whole lines off it
    under ``verbose`` (left at the end, so its last line stays), disabled otherwise or when ``shown`` is False (a
    caller's own switch, e.g. ranks other than 0). ``total``, ``iterable`` (iterate over the bar to step it),
    ``unit``, ``initial`` and ``leave`` as tqdm's."""
    now = level()
    if not shown or now == "quiet" or (now == "normal" and not sys.stderr.isatty()):
        return tqdm(iterable, total=total, initial=initial, desc=desc, unit=unit, disable=True)
    if sys.stderr.isatty():
        return tqdm(
            iterable,
            total=total,
            initial=initial,
            desc=desc,
            unit=unit,
            leave=leave,
            dynamic_ncols=True,
            file=sys.stderr,
        )
    return tqdm(
        iterable,
        total=total,
        initial=initial,
        desc=desc,
        unit=unit,
        leave=True,
        file=_Lines(sys.stderr),
        mininterval=LOG_INTERVAL,
        ncols=100,
        ascii=True,
    )


def note(message: str) -> None:
    """A progress line on stderr (above a live bar), unless quiet."""
    if level() != "quiet":
        tqdm.write(message, file=sys.stderr)


def detail(message: str) -> None:
    """A line of the per-step log on stderr (above a live bar): verbose only."""
    if level() == "verbose":
        tqdm.write(message, file=sys.stderr)
