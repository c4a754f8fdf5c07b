"""Ctrl-C during training: the first stops the loop between steps (:func:`ctrl_c_between_steps`), a second at once
(:class:`StopNow`), but never inside a checkpoint's writes (:func:`held_signals`)."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading


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


HELD = (signal.SIGINT, signal.SIGTERM)  # what stops a run: Ctrl-C, and SIGTERM (posenc.errors.sigterm_as_interrupt)


@contextlib.contextmanager
def held_signals():
    """Within: SIGINT and SIGTERM are held (recorded, not acted on) and delivered to the handlers they had when it
    ends, so a Ctrl-C cannot stop a checkpoint between its files (``state.pt`` of one step beside weights of
    another). Handlers, not a signal mask: a process-directed signal may land on any of torch's threads, while
    Python runs its handlers on the main thread. A no-op off the main thread (its handlers are not ours to swap)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: caught.append(signum)) for s in HELD}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)  # None: installed outside Python
        for s in caught:
            signal.raise_signal(s)
