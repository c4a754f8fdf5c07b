"""Experiment tracking: a run's metrics to TensorBoard or Weights & Biases, or nowhere (the default).

``open_tracker(kind, log_dir, name, group, config)`` gives a :class:`Tracker`: the training loop
(``posenc.train.loop.fit``, of ``posenc train`` and ``posenc finetune``) logs loss, learning rate, tokens/s and
gradient norm at each logged step, and the commands log each evaluation (perplexity and accuracy
by length) at the step the model was trained to. The run's config and stamp are its hyper-parameters.

TensorBoard (``posenc[tensorboard]``) writes event files into ``log_dir`` (the run directory, so
``tensorboard --logdir runs/<name>`` lists one run per scheme and seed); W&B (``posenc[wandb]``)
writes under ``log_dir/wandb`` and, with ``WANDB_MODE=offline``, needs no network (``wandb sync``
uploads the run later; project from ``WANDB_PROJECT``, default ``posenc``). Both packages are
imported only when asked for.
"""

from __future__ import annotations

import importlib
import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posenc.errors import PosencError, first_line

if TYPE_CHECKING:
    from posenc.store.records import PasskeyCell, Ppl, TaskCell

KINDS = ("none", "tensorboard", "wandb")
_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}


class Tracker:
    """Where a run's metrics go; this default drops them. A context manager: leaving it closes the tracker."""

    def start(self, step: int) -> None:
        """The run (re)starts after ``step``: what an interrupted invocation logged past it is dropped."""

    def log(self, metrics: dict[str, float | None], step: int) -> None:
        """Record ``metrics`` (name -> value; None and non-finite values are skipped) at training ``step``."""

    def close(self) -> None:
        """Flush and finish the run."""

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


NO_TRACKER = Tracker()


def flat_params(config: dict, prefix: str = "") -> dict[str, Any]:
    """``config`` flattened to ``a.b`` keys with scalar values (lists and None as JSON text): hyper-parameters."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        if isinstance(v, dict):
            out.update(flat_params(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v if isinstance(v, (bool, int, float, str)) else json.dumps(v, default=str)
    return out


def _finite(metrics: dict[str, float | None]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}


class TensorBoardTracker(Tracker):
    """Event files in ``log_dir`` (``torch.utils.tensorboard``); the config as hyper-parameters and as JSON text.
    The writer opens at the first start or log, so bad input refused before training leaves no directory."""

    def __init__(self, log_dir: Path, config: dict):
        self.log_dir, self.config, self.writer = log_dir, config, None

    def _open(self):
        if self.writer is None:
            from torch.utils.tensorboard import SummaryWriter
            from torch.utils.tensorboard.summary import hparams

            self.writer = SummaryWriter(str(self.log_dir))
            for summary in hparams(flat_params(self.config), {}):  # experiment, session start and end: the HParams tab
                self.writer.file_writer.add_summary(summary)
            self.writer.add_text("config", "```json\n" + json.dumps(self.config, indent=1, default=str) + "\n```")
        return self.writer

    def start(self, step: int) -> None:
        writer = self._open()
        if step > 0:  # as SummaryWriter(purge_step=step + 1): readers drop earlier events past the checkpoint
            from tensorboard.compat.proto.event_pb2 import Event, SessionLog

            writer.file_writer.add_event(Event(step=step + 1, session_log=SessionLog(status=SessionLog.START)))

    def log(self, metrics: dict[str, float | None], step: int) -> None:
        writer = self._open()
        for k, v in _finite(metrics).items():
            writer.add_scalar(k, v, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class WandbTracker(Tracker):
    """One W&B run named ``name`` in group ``group``, files under ``log_dir/wandb``; the config as its config.
    The run starts at the first start or log (raising PosencError when W&B cannot start one)."""

    def __init__(self, log_dir: Path, name: str, group: str, config: dict):
        self.log_dir, self.name, self.group, self.config, self.run = Path(log_dir), name, group, config, None

    def _open(self):
        if self.run is None:
            import wandb

            self.log_dir.mkdir(parents=True, exist_ok=True)
            try:
                self.run = wandb.init(
                    project=os.environ.get("WANDB_PROJECT", "posenc"),
                    name=self.name,
                    group=self.group,
                    dir=str(self.log_dir),
                    config=self.config,
                    settings=wandb.Settings(silent=True),
                )
            except Exception as exc:  # no API key, no network: wandb's own errors are long
                raise PosencError(
                    f"wandb could not start a run ({first_line(exc)}); WANDB_MODE=offline writes it under "
                    f"{self.log_dir}/wandb without network (upload later with `wandb sync`)"
                ) from None
        return self.run

    def start(self, step: int) -> None:
        self._open()

    def log(self, metrics: dict[str, float | None], step: int) -> None:
        values = _finite(metrics)
        if values:
            self._open().log(values, step=step)

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()


def check_kind(kind: str) -> None:
    """PosencError (one line) for an unknown kind or a tracker whose package is not installed."""
    if kind not in KINDS:
        given = "--log" if os.environ.get("POSENC_LOG") != kind else "POSENC_LOG (the default of --log)"
        raise PosencError(f"unknown {given} {kind!r}; valid: {', '.join(KINDS)}")
    if kind != "none":
        try:
            importlib.import_module(_PACKAGES[kind])
        except ImportError:
            raise PosencError(f"--log {kind} needs {_PACKAGES[kind]}: pip install 'posenc[{kind}]'") from None


def open_tracker(kind: str, log_dir: Path, name: str, group: str, config: dict) -> Tracker:
    """A tracker of ``kind`` ("none", "tensorboard", "wandb") for the run ``name`` (its scheme, seed, ...)
    in ``group`` (a sweep's name), writing into ``log_dir``; ``config``: JSON-able hyper-parameters
    (settings and stamp). Raises PosencError as :func:`check_kind`; a W&B run that cannot start raises
    PosencError at the tracker's first start or log."""
    check_kind(kind)
    if kind == "tensorboard":
        return TensorBoardTracker(log_dir, config)
    if kind == "wandb":
        return WandbTracker(log_dir, name, group, config)
    return NO_TRACKER


def eval_metrics(records: list[Ppl | PasskeyCell], train_length: int) -> dict[str, float | None]:
    """Tracker metrics of compare's evaluation records: ``eval/ppl@Mx`` and ``eval/ratio@Mx`` of ppl records (with
    ``ratio``), ``eval/passkey@Mx`` (accuracy) of passkey records pooled over depths, M = length / train_length."""
    out: dict[str, float | None] = {}
    hits: dict[str, list[int]] = {}
    for r in records:
        if r.kind == "ppl":
            x = f"{r.eval_length / train_length:g}x"
            out[f"eval/ppl@{x}"] = r.ppl
            out[f"eval/ratio@{x}"] = r.ratio
        elif r.kind == "passkey" and r.trials:
            cell = hits.setdefault(f"eval/passkey@{r.length / train_length:g}x", [0, 0])
            cell[0] += r.correct
            cell[1] += r.trials
    out.update({k: c / n for k, (c, n) in hits.items()})
    return out


def task_metrics(cells: list[TaskCell], train_length: int) -> dict[str, float]:
    """Tracker metrics of a task job's cells (``posenc.eval.tasks.evaluate_task``): ``eval/<test>@Mx``, the
    accuracy on answers pooled over distance buckets, M = length / train_length; the controlled-gap probe,
    whose length follows its gap, by distance instead: ``eval/gap@D`` (D the bucket, tokens)."""
    pooled: dict[str, list[int]] = {}
    for c in cells:
        at = str(c.bucket) if c.test == "gap" else f"{c.length / train_length:g}x"
        cell = pooled.setdefault(f"eval/{c.test}@{at}", [0, 0])
        cell[0] += c.correct
        cell[1] += c.n
    return {k: hit / n for k, (hit, n) in pooled.items() if n}
