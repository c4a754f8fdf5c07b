"""Is a training loss still falling at the end of training? One rule, :data:`LOSS_FALLING`, read by two layers: the
training loop (``train.until.extend_to``: a run whose criterion is unmet at the cap trains on while it holds,
``posenc.train.loop``) and the task report (``posenc.reports.tasks.budget``: what the curve of a job that did not
learn says about the budget that would decide a claim). numpy only, no torch, no posenc import beyond the error
type, so either layer imports it without a cycle.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from posenc.errors import PosencError

# the training loss "still falls" when the mean of its last eighth of logged steps is more than LOSS_FALLING
# (relative) below the same-sized window a quarter of the steps earlier
LOSS_FALLING = 0.05


@dataclasses.dataclass(frozen=True)
class Trend:
    """The end of a loss curve: ``before`` and ``late`` are mean training losses (nats) of two windows of the same
    number of logged steps, ``late`` the last eighth of them, ``before`` ending ``span`` steps earlier (the logged
    step nearest below a quarter of the curve's steps before its end)."""

    before: float
    late: float
    span: int

    @property
    def falling(self) -> bool:
        """Whether ``late`` is more than LOSS_FALLING (relative) below ``before``."""
        return self.late < self.before * (1 - LOSS_FALLING)

    def falling_at(self, cap: int) -> str:
        """The words of a falling curve at step ``cap``: "loss still falling at the step cap 600 (0.580 -> 0.420
        over its last 160 steps)"."""
        change = f"{self.before:.3f} -> {self.late:.3f} over its last {self.span} steps"
        return f"loss still falling at the step cap {cap} ({change})"


def loss_curve(rows: Sequence[dict]) -> list[tuple[int, float]]:
    """(step, training loss in nats) of each logged row of a ``train.jsonl``: its ``loss_window`` (the mean over
    every step since the previous logged one) where the row has one, else its ``loss`` (that step's batch alone, the
    rows of runs logged before ``loss_window``). One batch's loss is too noisy a curve on tasks whose rows hold very
    different numbers of answers: on log-uniform parity the logged loss jumped between chance and 0.3 from one log
    to the next, and :func:`loss_trend`'s windows differed by about one standard error."""
    return [(r["step"], r.get("loss_window", r["loss"])) for r in rows]


def loss_trend(curve: Sequence[tuple[int, float]]) -> Trend | None:
    """The :class:`Trend` of ``curve`` ((step, training loss in nats) of each logged step, steps increasing); None
    when it has fewer than 4 logged steps (too few to tell). PosencError (one line) when its steps do not increase
    or a loss is not finite."""
    if len(curve) < 4:
        return None
    steps, loss = [s for s, _ in curve], [float(v) for _, v in curve]
    if any(b <= a for a, b in zip(steps, steps[1:])):
        raise PosencError(f"a loss curve's steps must increase, got {steps[:3]}...{steps[-3:]}")
    if not all(map(math.isfinite, loss)):
        raise PosencError("a loss curve holds a loss that is not finite")
    k = max(1, len(curve) // 8)
    late = float(np.mean(loss[-k:]))
    i = max(j for j, s in enumerate(steps) if s <= steps[-1] - (steps[-1] - steps[0]) / 4)
    before = float(np.mean(loss[max(0, i - k + 1) : i + 1]))
    return Trend(before=before, late=late, span=steps[-1] - steps[i])
