"""One posenc process at a time in a run directory: an exclusive advisory lock (``fcntl.flock``) on its ``.lock``.

A command opens a scope (:func:`holding`; the command line opens one around every command) and takes the lock of
each directory it writes into with :func:`hold_run_dir` (an existing directory: before it reads what the directory
holds) or :func:`open_run_dir` (made where absent); one it only reads (a trained run whose model it loads) with
:func:`hold_to_read`. The scope's end releases them and removes the lock files; a
killed process releases its locks with its file descriptors, so a stale ``.lock`` never blocks (it holds a dead
process's pid, rewritten by the next holder). Outside a scope nothing is locked: the library's functions called from
Python (tests, notebooks) hold nothing that a later command would trip on.

The lock file holds the holder's pid, for the message another process gets. Directory listings that look for
results skip it (:func:`run_files`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from posenc.errors import PosencError
from posenc.store.checkpoint import make_run_dir

LOCK_FILE = ".lock"
# set by a compare job for the ``posenc train`` it runs under torchrun inside the compare's run root, which the
# compare holds: that process's run directory is inside a held one by design
PARENT_VAR = "POSENC_PARENT_HOLDS"
_TRIES, _PAUSE = 5, 0.02  # a probe of an ancestor (:func:`_held_by_other`) holds a lock a moment: retry past it

_held: dict[Path, int] | None = None  # {directory (resolved): lock file descriptor}; None: no scope open


@contextlib.contextmanager
def holding() -> Iterator[None]:
    """A scope of locks: those :func:`hold_run_dir` takes inside it are released (their lock files removed) at its
    end. Scopes do not nest: inside one, another is part of it (the outermost releases everything)."""
    global _held
    if _held is not None:
        yield
        return
    _held = {}
    try:
        yield
    finally:
        held, _held = _held, None
        for path, fd in held.items():
            _release(path, fd)


def resolved(path: Path) -> Path:
    """``path`` made absolute, its links followed; a symlink loop is OSError ELOOP (Python before 3.13 raises a
    RuntimeError there), which the command line reports in one line."""
    try:
        return Path(path).resolve()
    except RuntimeError:
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(path)) from None


def hold_run_dir(
    path: Path, fix: str = "use another --out", ancestors: bool = False, writes: str = "its results"
) -> None:
    """Take the lock of the existing directory ``path`` for the current scope (no-op outside a scope, when this
    process holds it already, or when ``path`` is not a directory). With ``ancestors``, also refuse a ``path``
    inside a directory another posenc process holds (a compare's run root; not under ``PARENT_VAR``). PosencError
    "PATH is in use by another posenc process (pid N); wait for it or FIX" (``fix`` empty: no "or") when another
    process holds it, and "PATH is read-only (...): posenc writes WRITES there; ..." when it cannot be written (the
    lock file is the command's first write there)."""
    if _held is None:
        return
    if ancestors:
        _refuse_held_above(path, fix)
    key = resolved(path)
    if key in _held or not key.is_dir():
        return
    _held[key] = _acquire(Path(path), fix, writes)


def hold_to_read(path: Path, fix: str = "") -> None:
    """For a command that reads the run directory ``path`` and writes nothing into it (``posenc diagnose``): as
    :func:`hold_run_dir` with ``ancestors`` (refused while another posenc process holds it or a directory above it,
    such as a training, whose checkpoints would change under the reader; none starts there while it reads), except
    that a directory this process cannot write (read-only) is only checked: no lock file can be made there."""
    if _held is None:
        return
    if not Path(path).is_dir() or os.access(path, os.W_OK):
        hold_run_dir(path, fix, ancestors=True)
        return
    _refuse_held_above(path, fix)
    if _held_by_other(Path(path)):
        raise PosencError(_in_use(path, fix))


def _refuse_held_above(path: Path, fix: str) -> None:
    """PosencError (:func:`_in_use`) when another posenc process holds a directory above ``path`` (a compare's run
    root), unless this process runs under ``PARENT_VAR`` (a compare's job, inside the root its compare holds)."""
    if os.environ.get(PARENT_VAR):
        return
    for parent in resolved(path).parents:
        if _held_by_other(parent):
            raise PosencError(_in_use(_shown(parent), fix))


def open_run_dir(path: Path, fix: str = "use another --out") -> None:
    """``make_run_dir(path)``, then :func:`hold_run_dir`: raises as the two do."""
    make_run_dir(path)
    hold_run_dir(path, fix)


def holds(path: Path) -> bool:
    """Whether this process holds ``path``'s lock (in the current scope)."""
    return _held is not None and resolved(path) in _held


def run_files(path: Path) -> list[Path]:
    """The entries of the directory ``path``, its lock file left out."""
    return [p for p in Path(path).iterdir() if p.name != LOCK_FILE]


def _acquire(path: Path, fix: str, writes: str) -> int:
    """The descriptor of ``path/.lock``, locked, holding this process's pid. PosencError (:func:`_in_use`) when
    another process holds it, or naming the directory as read-only (``writes``: what the command writes there) when
    the lock file cannot be made because it is. A lock file removed by its releasing holder between our open and our
    lock is opened anew (else two processes could each hold a file of their own)."""
    lock = path / LOCK_FILE
    for attempt in range(_TRIES):
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:  # the lock file is the command's first write there: say what refused it
            if exc.errno == errno.EROFS or (exc.errno in (errno.EACCES, errno.EPERM) and not os.access(path, os.W_OK)):
                raise PosencError(_read_only(path, exc.errno, fix, writes)) from None
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if attempt == _TRIES - 1:
                raise PosencError(_in_use(path, fix)) from None
            time.sleep(_PAUSE)
            continue
        if _same_file(fd, lock):
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return fd
        os.close(fd)
    raise PosencError(_in_use(path, fix))


def _same_file(fd: int, lock: Path) -> bool:
    """Whether ``fd`` is the file at ``lock`` now (not one a releasing holder removed)."""
    try:
        now = os.stat(lock)
    except OSError:  # removed, or its directory replaced
        return False
    mine = os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (now.st_dev, now.st_ino)


def _held_by_other(path: Path) -> bool:
    """Whether another process holds ``path``'s lock: a shared lock taken and dropped at once (never blocks)."""
    if _held is not None and resolved(path) in _held:
        return False
    try:
        fd = os.open(path / LOCK_FILE, os.O_RDONLY)
    except OSError:  # no lock file (or none readable): never held
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # drops the shared lock


def _shown(path: Path) -> Path:
    """``path`` relative to the working directory when it is inside it (as a command line names it)."""
    try:
        return path.relative_to(Path.cwd().resolve())
    except ValueError:
        return path


def _in_use(path: Path, fix: str) -> str:
    """The refusal naming ``path`` and the pid its lock file holds."""
    try:
        pid = (Path(path) / LOCK_FILE).read_text().strip() or "unknown"
    except OSError:
        pid = "unknown"
    return f"{path} is in use by another posenc process (pid {pid}); wait for it" + (f" or {fix}" if fix else "")


def _read_only(path: Path, code: int, fix: str, writes: str) -> str:
    """The refusal of a directory the command writes ``writes`` into that is read-only (``code``: the errno that
    said so)."""
    reason = os.strerror(code).lower()
    return f"{path} is read-only ({reason}): posenc writes {writes} there; make it writable" + (
        f" or {fix}" if fix else ""
    )


def _release(path: Path, fd: int) -> None:
    """Remove ``path``'s lock file while still holding it, then unlock (a directory removed meanwhile, by this
    process: its lock file is gone already)."""
    if _same_file(fd, path / LOCK_FILE):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path / LOCK_FILE)
    os.close(fd)
