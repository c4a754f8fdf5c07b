"""A run's resume point: :class:`Checkpoint` (``state.pt``: step, trained tensors and optimizer state in one atomically
written file, and the same tensors as safetensors), its step (:func:`checkpoint_step`) and the log cut back to it
(:func:`truncate_log`), read through :func:`read_log`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import torch

from posenc.errors import PosencError
from posenc.store.checkpoint import load_tensors, load_torch, read_jsonl, save_tensors, save_torch, write_jsonl
from posenc.train.signals import held_signals


@dataclasses.dataclass
class Checkpoint:
    """The resume point of a run in ``run_dir``: ``state.pt`` holds the step, the trained tensors (under
    ``key``) and the optimizer state, so it alone resumes (a kill between the two writes cannot pair
    tensors and optimizer state of different steps); ``weights`` holds the same tensors as safetensors,
    for other tools, with ``metadata`` in its header. ``tensors()`` gives the live tensors by name (e.g.
    ``model.state_dict``)."""

    run_dir: Path
    tensors: Callable[[], dict[str, torch.Tensor]]
    opt: torch.optim.Optimizer
    key: str = "model"
    weights: str = "model.safetensors"
    metadata: dict[str, str] | None = None

    def save(self, step: int) -> None:
        """Write ``state.pt`` and the weights of ``step``, Ctrl-C and SIGTERM held until both are written
        (``posenc.train.signals.held_signals``)."""
        tensors = self.tensors()
        with held_signals():
            save_torch(self.run_dir / "state.pt", {"step": step, self.key: tensors, "optimizer": self.opt.state_dict()})
            save_tensors(self.run_dir / self.weights, tensors, self.metadata)

    def load(self) -> int:
        """Load ``state.pt`` into the tensors and the optimizer; returns its step (0 without one). Raises
        PosencError naming the file when it lacks the step or optimizer state, or holds other tensors."""
        path = self.run_dir / "state.pt"
        if not path.exists():
            return 0
        state = _resume_point(path)
        # a state.pt without the tensors (an older layout) reads them from the weights file beside it
        saved = state[self.key] if self.key in state else load_tensors(self.run_dir / self.weights)
        live = self.tensors()
        if set(saved) != set(live) or any(saved[k].shape != t.shape for k, t in live.items()):
            raise PosencError(f"{path} does not hold this run's trained tensors; use another --out")
        with torch.no_grad():
            for name, t in live.items():
                t.copy_(saved[name])
        self.opt.load_state_dict(state["optimizer"])
        return int(state["step"])


def _resume_point(path: Path, mmap: bool = False) -> dict:
    """``state.pt`` at ``path`` (``mmap``: its tensors mapped, not read); PosencError naming it when it lacks the
    step (a non-negative integer) or the optimizer state (a torch optimizer's state dict), or holds tensors other
    than a {name: tensor} mapping."""
    state = load_torch(path, mmap=mmap)
    missing = [k for k in ("step", "optimizer") if not isinstance(state, dict) or k not in state]
    if missing:
        raise PosencError(f"{path} is damaged: no {', '.join(missing)}; use another --out")
    step, opt = state["step"], state["optimizer"]
    tensors = [v for k, v in state.items() if k not in ("step", "optimizer")]
    if type(step) is not int or step < 0:
        raise PosencError(f"{path} is damaged: its step {step!r} is not a non-negative integer; use another --out")
    if not (isinstance(opt, dict) and isinstance(opt.get("state"), dict) and isinstance(opt.get("param_groups"), list)):
        raise PosencError(f"{path} is damaged: its optimizer state is not an optimizer's; use another --out")
    if not all(isinstance(t, dict) and all(isinstance(x, torch.Tensor) for x in t.values()) for t in tensors):
        raise PosencError(f"{path} is damaged: its tensors are not a {{name: tensor}} mapping; use another --out")
    return state


def checkpoint_step(run_dir: Path) -> int:
    """The step of the run's ``state.pt`` (0 without one), read without loading its tensors; PosencError as
    :meth:`Checkpoint.load`'s for a damaged file."""
    path = Path(run_dir) / "state.pt"
    return _resume_point(path, mmap=True)["step"] if path.exists() else 0


def read_log(path: Path, value: str = "loss") -> list[dict]:
    """The rows of a per-step log ([] when missing), each with an integer ``step`` and a numeric ``value``:
    ``train.jsonl`` of ``posenc train`` and ``posenc finetune`` (its ``loss``, nats), ``until.jsonl`` (the
    criterion's ``value``). PosencError (one line naming the file and record) for a row without them, or as
    ``read_jsonl``'s for a line that is no record."""
    rows = read_jsonl(path)
    for i, row in enumerate(rows, 1):
        if type(row.get("step")) is not int or type(row.get(value)) not in (int, float):
            raise PosencError(f"{path} record {i} is not a log row (integer step, numeric {value}): repair it")
    return rows


def truncate_log(path: Path, step: int, value: str = "loss") -> None:
    """Drop log records after ``step``: a killed run logged steps its checkpoint does not hold. PosencError as
    :func:`read_log`'s (rows with an integer step and a numeric ``value``)."""
    write_jsonl(path, [r for r in read_log(path, value) if r["step"] <= step])
