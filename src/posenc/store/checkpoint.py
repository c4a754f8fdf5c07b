"""Atomic run-directory I/O: weights (safetensors), optimizer state, JSON and JSONL.

Every write goes to a temporary file in the same directory and is moved into
place with ``os.replace``, so an interrupted run never leaves a torn file.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save

from posenc.errors import PosencError, first_line

_UMASK = os.umask(0o022)
os.umask(_UMASK)  # read the process umask (os has no getter)


def temp_beside(path: Path) -> Path:
    """A new, uniquely named empty file beside ``path``, with the mode ``open()`` would give, to write and then
    rename onto ``path``: writers of one file at once (jobs of ``compare --parallel``, torchrun ranks filling one
    cache) each write their own, and the last rename wins; with one shared name the first rename left the others
    nothing to rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600
    os.close(fd)
    return Path(tmp)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a uniquely named temporary file (``temp_beside``). PosencError (one line) when
    ``path`` is a directory (the temporary file is removed)."""
    tmp = temp_beside(path)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    try:
        os.replace(tmp, path)
    except IsADirectoryError:
        os.unlink(tmp)
        raise PosencError(f"{path} is a directory where a file belongs: move it away") from None


def make_run_dir(path: Path) -> None:
    """``mkdir -p path``; PosencError naming it when impossible (a file or a broken link there, an unwritable place)."""
    check_run_dir(path)
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        why = "a file is in the way" if isinstance(exc, (FileExistsError, NotADirectoryError)) else exc.strerror or exc
        raise PosencError(f"cannot create output directory {path}: {why}") from None


def check_run_dir(path: Path) -> None:
    """PosencError (as :func:`make_run_dir`'s) when ``path`` could not be made a directory because a file is in the
    way (at it or at an ancestor) or the directory it would be made in cannot be written (a read-only folder);
    nothing is created, so a command can check its output before the work and still leave nothing behind when it
    refuses its input, or a name it would make is longer than the file system there allows."""
    missing = []
    for p in [Path(path), *Path(path).parents]:
        if p.is_symlink() and not p.exists():  # exists() follows the link: a dangling one reads as nothing there
            raise PosencError(f"cannot create output directory {path}: {p} is a broken symbolic link")
        if p.exists():
            if not p.is_dir():
                raise PosencError(f"cannot create output directory {path}: a file is in the way")
            if p != Path(path) and not os.access(p, os.W_OK | os.X_OK):  # mkdir would fail there after the work
                raise PosencError(f"cannot create output directory {path}: {p} is not writable (read-only)")
            longest = os.pathconf(p, "PC_NAME_MAX")
            for name in missing:
                if len(os.fsencode(name)) > longest:
                    raise PosencError(
                        f"cannot create output directory {path}: a name of {len(os.fsencode(name))} bytes passes the "
                        f"file system's {longest}"
                    )
            return
        missing.append(p.name)


def refuse_run_dir(path: Path, command: str) -> None:
    """PosencError when the output directory ``path`` holds a run of another command (a compare run's preset.json; a
    train, extend or finetune run's config.json): ``command``'s files would replace or mix with that run's."""
    for marker, what in (("preset.json", "compare run"), ("config.json", "train, extend or finetune run")):
        if (Path(path) / marker).is_file():
            raise PosencError(f"{path} holds a posenc {what} ({marker}): give {command} another --out")


def write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(Path(path), (json.dumps(obj, indent=2, default=str) + "\n").encode())


def read_json(path: Path) -> dict:
    """The JSON object of ``path`` (every JSON file posenc writes holds one). PosencError (one line naming the file)
    when it is not JSON, not UTF-8, a directory, another kind of file (a FIFO would block the read), or a JSON
    value other than an object."""
    if Path(path).exists() and not Path(path).is_file() and not Path(path).is_dir():
        raise PosencError(f"{path} is damaged (not a regular file: a FIFO, socket or device)")
    try:
        value = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PosencError(f"{path} is damaged (not valid JSON: {exc})") from None
    except IsADirectoryError:
        raise PosencError(f"{path} is damaged (a directory, not a JSON file)") from None
    if not isinstance(value, dict):
        raise PosencError(f"{path} is damaged (a JSON {_json_kind(value)}, not an object)")
    return value


def _json_kind(value: Any) -> str:
    """The JSON name of a decoded value's type, for messages."""
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def _jsonl_line(record: dict) -> bytes:
    return (json.dumps(record, default=str) + "\n").encode()


def refuse_broken_link(path: Path, fix: str = "remove it or point it at a file") -> None:
    """PosencError saying ``path`` is a symbolic link to nothing (``fix``: what to do), where a missing file would
    be taken for another state (no checkpoint, no config) or fail later with a less clear message."""
    if path.is_symlink() and not path.exists():  # exists() follows the link
        raise PosencError(f"{path} is a broken symbolic link: {fix}")


def append_jsonl(path: Path, record: dict) -> None:
    """Append one record as a single write of one line (never a partial record on resume); several processes may
    append to one file (compare's jobs), so nothing here rewrites it: a writer that starts on a file a killed writer
    may have left unfinished calls :func:`drop_torn_tail` first. PosencError (one line) when ``path`` is a directory
    or a broken symbolic link."""
    path = Path(path)
    if path.is_dir():
        raise PosencError(f"{path} is a directory where a file belongs: move it away")
    refuse_broken_link(path)  # open() would fail on the missing target
    with open(path, "ab") as f:
        f.write(_jsonl_line(record))
        f.flush()
        os.fsync(f.fileno())


def drop_torn_tail(path: Path) -> None:
    """Cut a last line left unfinished by a killed writer (no newline, not JSON); a whole JSON line without its
    newline (written by hand) gets the newline instead."""
    if not path.is_file() or not path.stat().st_size:
        return
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return
    data = path.read_bytes()
    cut = data.rfind(b"\n") + 1
    atomic_write_bytes(path, data + b"\n" if is_json(data[cut:]) else data[:cut])


def is_json(line: bytes) -> bool:
    try:
        json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    return True


def write_jsonl(path: Path, records: list[dict]) -> None:
    """Replace ``path`` by ``records``, one line each, in one atomic write."""
    atomic_write_bytes(Path(path), b"".join(_jsonl_line(r) for r in records))


def read_jsonl(path: Path) -> list[dict]:
    """The records (JSON objects, one a line) of a JSONL file; [] when it does not exist. A last line without its
    newline that is not JSON (a writer killed mid-append) is ignored; blank lines hold nothing. PosencError (one
    line naming the file and line) for a directory, bytes that are not UTF-8, or any other line that is not a JSON
    object."""
    lines = jsonl_bytes(Path(path)).split(b"\n")
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip() or (i == len(lines) and not is_json(line)):
            continue
        out.append(decode_record(line, f"{path} line {i}"))
    return out


def jsonl_bytes(path: Path) -> bytes:
    """The bytes of the JSONL file ``path`` (b"" when it does not exist); PosencError (one line) for a directory."""
    if path.is_dir():
        raise PosencError(f"{path} is damaged (a directory, not a JSONL file)")
    return path.read_bytes() if path.exists() else b""


def decode_record(line: bytes, where: str) -> dict:
    """The record (a JSON object) of one JSONL line; PosencError naming ``where`` (its file and line) when the line
    is not JSON or holds another JSON value."""
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise PosencError(f"{where} is not a JSON record; repair or remove that line") from None
    if not isinstance(record, dict):
        raise PosencError(f"{where} is a JSON {_json_kind(record)}, not a record (an object); repair or remove it")
    return record


def save_tensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """Write named tensors as one safetensors file, atomically, with ``metadata`` (text by key) in its header."""
    atomic_write_bytes(path, save({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, metadata=metadata))


def tensors_metadata(path: Path) -> dict[str, str]:
    """The metadata in a safetensors file's header ({} when it has none); errors as :func:`load_tensors`'s."""
    _check_tensors_file(path)
    try:
        with safe_open(str(path), "pt") as f:
            return f.metadata() or {}
    except SafetensorError as exc:
        raise PosencError(f"{path} is damaged or unreadable ({exc})") from None


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The named tensors of a safetensors file; PosencError naming it when damaged or a directory, PermissionError
    when it cannot be read (safetensors says "no such file")."""
    _check_tensors_file(path)
    try:
        return load_file(str(path))
    except SafetensorError as exc:  # truncated or overwritten
        raise PosencError(f"{path} is damaged or unreadable ({exc})") from None


def _check_tensors_file(path: Path) -> None:
    if Path(path).is_dir():
        raise PosencError(f"{path} is damaged (a directory, not a safetensors file)")
    if Path(path).exists() and not os.access(path, os.R_OK):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))


def save_weights(path: Path, model: torch.nn.Module) -> None:
    save_tensors(path, model.state_dict())


def load_weights(path: Path, model: torch.nn.Module) -> None:
    """``path``'s tensors into ``model``; PosencError (one line) when they do not match its state dict (names,
    shapes, or dtypes: ``load_state_dict`` would cast a tensor stored as integers or float16 back, its lost digits
    silently gone; posenc saves weights in the model's own dtype) or
    hold a value that is not finite (a diverged or damaged run: every number it would give is NaN)."""
    state = load_tensors(path)
    live = model.state_dict()
    cast = next((n for n, t in state.items() if n in live and live[n].dtype != t.dtype), None)
    if cast is not None:
        raise PosencError(
            f"{path} holds {cast} as {state[cast].dtype} where the model has {live[cast].dtype}: weights cast to "
            "another number type; use the run's own file"
        )
    bad = next((name for name, t in state.items() if t.is_floating_point() and not torch.isfinite(t).all()), None)
    if bad is not None:
        raise PosencError(
            f"{path} holds non-finite weights (NaN or inf, first in {bad}): the run diverged or is damaged"
        )
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:  # a multi-line report under a heading: its first finding names the mismatch
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        found = next((line for line in lines[1:]), lines[0] if lines else "")
        more = f" (and {len(lines) - 2} more)" if len(lines) > 2 else ""
        raise PosencError(f"{path} does not match the run's model config: {found}{more}") from None


def load_torch(path: Path, mmap: bool = False) -> Any:
    """``torch.load`` of a file ``save_torch`` wrote (``mmap``: tensors mapped from the file, read only when used);
    PosencError naming it when damaged (pickle's opcodes fail in many ways on bytes it did not write)."""
    try:
        return torch.load(path, weights_only=False, mmap=mmap)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, ValueError, OverflowError, MemoryError) as exc:
        raise PosencError(
            f"{path} is damaged or unreadable ({first_line(exc).split('. ')[0]})"
        ) from None  # torch's are long


def save_torch(path: Path, obj: Any) -> None:
    tmp = temp_beside(path)
    torch.save(obj, tmp)
    os.replace(tmp, path)
