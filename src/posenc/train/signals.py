"""Ctrl-C during training: the first stops the loop between steps (:func:`ctrl_c_between_steps`), a second at once
(:class:`StopNow`)."""

from __future__ import annotations

import contextlib
import signal
import sys


class StopNow(KeyboardInterrupt):
    """A second Ctrl-C: stop at once, without a checkpoint (the step in flight is lost, the last checkpoint kept)."""


@contextlib.contextmanager
def ctrl_c_between_steps():
    """Within: the first Ctrl-C (SIGINT) only sets a flag, read by the yielded ``interrupted()`` at the top of
    a step, so the checkpoint written then holds one step's weights, optimizer state and draw counters; a
    second raises StopNow. Where SIGINT is ignored (a background job) or not ours (not the main thread),
    ``interrupted()`` stays False."""
    hits = []

    def handler(signum, frame):
        hits.append(signum)
        if len(hits) > 1:
            raise StopNow
        print("posenc: stopping after this step (Ctrl-C again: at once, without a checkpoint)", file=sys.stderr)

    try:
        previous = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread
        yield lambda: False
        return
    if previous is signal.SIG_IGN:
        signal.signal(signal.SIGINT, previous)
    try:
        yield lambda: bool(hits)
    finally:
        signal.signal(signal.SIGINT, previous)
