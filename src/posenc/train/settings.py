"""The settings of a training run, as validated data: :class:`LoopConfig` (the loop's, shared by every run that
trains), :class:`TrainConfig` (posenc's LMs: data, precision, loss, positions) and :class:`UntilConfig` (train to
criterion)."""

from __future__ import annotations

import typing
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from posenc.store.presets import Count, Seed, StepCount, Steps, Threads
from posenc.train.curves import LOSS_FALLING

Precision = Literal["auto", "bf16", "fp32"]  # the forward's compute dtype: posenc.train.precision
PRECISIONS = typing.get_args(Precision)


class LoopConfig(BaseModel):
    """The training loop's settings (:func:`fit`), shared by every run that trains: sequences per step,
    the budget in steps, AdamW's peak ``lr`` (linear warmup over ``warmup`` steps, then cosine decay to
    ``min_lr_ratio * lr``), weight decay on matrices, the gradient norm clip, the seed of the batches,
    the checkpoint interval (steps) and torch CPU threads. The defaults are posenc's LMs'; other runs
    (``posenc.jobs.finetune.FinetuneConfig``) restate only the defaults they change."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    batch_size: PositiveInt = 16
    """Sequences per optimiser step (global: split over torchrun processes)."""
    steps: Steps = 1000
    """Training budget (optimiser steps); with ``until``, the cap."""
    lr: PositiveFloat = 1e-3
    """Peak learning rate of AdamW, reached after ``warmup``."""
    min_lr_ratio: Annotated[float, Field(ge=0, le=1)] = 0.1
    """The cosine decay ends at ``min_lr_ratio * lr`` at ``steps``."""
    warmup: StepCount = 50
    """Linear warmup (steps)."""
    weight_decay: NonNegativeFloat = 0.1
    """AdamW weight decay, on matrices only."""
    grad_clip: PositiveFloat = 1.0
    """Gradient norm clip (global L2 norm)."""
    seed: Seed = 0
    """Seed of the initialisation and the batches, in [0, 2^31) (``posenc.store.presets.Seed``)."""
    ckpt_every: Steps = 100
    """Checkpoint interval (steps): a killed run resumes from the last one."""
    threads: Threads | None = None
    """torch CPU threads; null: torch's choice."""


class UntilConfig(BaseModel):
    """Train to criterion (synthetic tasks only): every ``every`` steps the in-distribution accuracy (``metric``
    "id_accuracy": ``posenc.eval.tasks.id_accuracy`` on ``answers`` answers of a fixed held-out set) is measured, and
    training stops at the first check where it is >= ``at_least`` (a fraction); ``train.steps`` stays the cap.

    ``extend_to`` (steps, > ``train.steps``; null: off): a run whose criterion is unmet at the cap and whose training
    loss is still falling there (``posenc.train.curves.loss_trend`` on its logged window losses up to the cap,
    ``posenc.train.curves.loss_curve``: each the mean over the steps since the previous log; the rule of
    ``posenc.reports.tasks.budget``) trains on, checked as before, until it meets the criterion or reaches step
    ``extend_to``. The extra steps run at the schedule's final learning rate (``min_lr_ratio * lr``, what
    ``posenc.train.optimizer.lr_at`` gives past ``steps``), so the first ``steps`` steps are the unextended run's
    (``posenc.train.loop.train``)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    metric: Literal["id_accuracy"] = "id_accuracy"
    """What is checked: ``id_accuracy``, the in-distribution answer accuracy."""
    at_least: Annotated[float, Field(gt=0, le=1)]
    """Training stops at the first check where the metric is >= this (a fraction)."""
    every: Steps
    """Check interval (steps)."""
    answers: Count = 1000
    """Held-out answers per check (a 1-point standard error at 90% accuracy needs ~900)."""
    extend_to: Steps | None = None
    """Unmet at the cap (``train.steps``) with the training loss still falling: train on up to this step, at the
    schedule's final learning rate; null: stop at the cap."""

    def describe(self) -> str:
        """The criterion in words (a task record's ``criterion``, the report's budget line)."""
        out = f"{self.metric} >= {self.at_least:g}, checked every {self.every} steps on {self.answers} held-out answers"
        if self.extend_to is not None:
            out += (
                f"; unmet at the step cap with the training loss still falling (its last eighth of logged steps more "
                f"than {LOSS_FALLING:.0%} below the window a quarter of the steps earlier): trained on up to step "
                f"{self.extend_to} at the final learning rate"
            )
        return out


class TrainConfig(LoopConfig):
    """Data and loop settings of one of posenc's LMs. ``steps`` is the budget; ``time_budget`` (s) may stop earlier."""

    corpus: str = "shakespeare"
    """Training text: ``shakespeare``, ``pystdlib``, ``hf:NAME``, a local path, or a synthetic task spec
    (``posenc list``)."""
    tokenizer: str = "byte"
    """``byte`` (256 entries) or ``bpeN`` (a byte-level BPE of N entries trained on the corpus)."""
    time_budget: float | None = Field(None, gt=0)
    """Stop after this many seconds of training (a later ``--resume`` continues); null: no limit."""
    log_every: Steps = 10
    """Loss log interval (steps)."""
    compile: bool = False
    """torch.compile the model's forward (same losses to float rounding; faster on GPU)."""
    # the forward's compute dtype (resolve_precision); fp32 until bf16's effect on a preset's results is measured
    precision: Precision = "fp32"
    """The forward's compute dtype: ``fp32``, ``bf16`` (autocast) or ``auto`` (bf16 where the device has bf16 units)."""
    # "answers": the mean NLL over a task's answer positions only (posenc.data.tasks); "all": every target
    loss: Literal["all", "answers"] = "all"
    """``all``: the mean NLL over every target; ``answers``: over a task's answer positions only."""
    until: UntilConfig | None = None
    """Train to criterion (synthetic tasks only; ``steps`` is the cap); null: train ``steps`` steps."""
    positions: str = "contiguous"
    # randomized: Ruoss et al. 2023, a sorted random subset of 0..N-1 per step (posenc.data.positions)
    """``contiguous`` (0..T-1) or ``randomized:max=N`` (position-indexed schemes only; evaluation draws them too)."""

    @model_validator(mode="after")
    def _extension_past_the_cap(self) -> TrainConfig:
        if self.until is not None and self.until.extend_to is not None and self.until.extend_to <= self.steps:
            raise ValueError(f"until.extend_to ({self.until.extend_to}) must exceed steps ({self.steps}), the cap")
        return self

    def last_step(self) -> int:
        """The most steps a run may train: ``until.extend_to`` when set, else ``steps``."""
        return self.until.extend_to if self.until is not None and self.until.extend_to is not None else self.steps
