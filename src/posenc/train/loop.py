"""The training loop (:func:`fit`: AdamW, warmup + cosine, gradient clipping, atomic checkpoints, resume)
and the training of posenc's LMs on it (:func:`train`); ``posenc.runs.finetune`` trains pretrained models on it.

A run directory holds ``config.json`` (model + training config, and the stamp of the invocation
that last wrote it: ``posenc.store.stamp``),
``model.safetensors`` (weights), ``state.pt`` (the resume point: weights, optimizer state and
step in one atomically written file) and
``train.jsonl`` (one record per logged step). Batches are a pure function of
(seed, step), so a resumed run sees exactly the batches an uninterrupted run
would.

Under ``torchrun --nproc_per_node N`` the same loop runs data-parallel
(``posenc.train.distributed``): rank r trains on its rows of each global batch,
gradients are averaged by DistributedDataParallel, the logged loss is the mean
over ranks, and only rank 0 writes. ``train.precision`` sets the forward's compute dtype: "bf16" runs it
under bfloat16 autocast with float32 master weights and optimizer state (phases, their cos/sin, gates and
cumulative sums stay float32+: ``posenc.attention.rotation_dtype``), "fp32" (the default) without autocast,
and "auto" picks bf16 where the device has bf16 matrix units (``posenc.store.stamp.bf16_units``), else fp32.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import signal
import sys
import time
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import torch
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from posenc import encodings
from posenc.data.corpora import TokenData, load_tokens
from posenc.data.positions import TRAIN_STREAM, randomized_positions
from posenc.data.tasks import TaskData
from posenc.errors import PosencError
from posenc.eval import progress
from posenc.eval.tasks import id_accuracy
from posenc.model import LM, ModelConfig
from posenc.store.checkpoint import (
    append_jsonl,
    load_tensors,
    load_torch,
    load_weights,
    make_run_dir,
    read_json,
    read_jsonl,
    save_tensors,
    save_torch,
    write_json,
    write_jsonl,
)
from posenc.store.presets import validated
from posenc.store.stamp import bf16_units, run_stamp
from posenc.train import distributed
from posenc.train.curves import LOSS_FALLING, loss_trend
from posenc.train.tracking import NO_TRACKER, Tracker


class LoopConfig(BaseModel):
    """The training loop's settings (:func:`fit`), shared by every run that trains: sequences per step,
    the budget in steps, AdamW's peak ``lr`` (linear warmup over ``warmup`` steps, then cosine decay to
    ``min_lr_ratio * lr``), weight decay on matrices, the gradient norm clip, the seed of the batches,
    the checkpoint interval (steps) and torch CPU threads. The defaults are posenc's LMs'; other runs
    (``posenc.runs.finetune.FinetuneConfig``) restate only the defaults they change."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    batch_size: PositiveInt = 16
    """Sequences per optimiser step (global: split over torchrun processes)."""
    steps: PositiveInt = 1000
    """Training budget (optimiser steps); with ``until``, the cap."""
    lr: PositiveFloat = 1e-3
    """Peak learning rate of AdamW, reached after ``warmup``."""
    min_lr_ratio: Annotated[float, Field(ge=0, le=1)] = 0.1
    """The cosine decay ends at ``min_lr_ratio * lr`` at ``steps``."""
    warmup: NonNegativeInt = 50
    """Linear warmup (steps)."""
    weight_decay: NonNegativeFloat = 0.1
    """AdamW weight decay, on matrices only."""
    grad_clip: PositiveFloat = 1.0
    """Gradient norm clip (global L2 norm)."""
    seed: NonNegativeInt = 0
    """Seed of the initialisation and the batches (numpy's generators take no negative seed)."""
    ckpt_every: PositiveInt = 100
    """Checkpoint interval (steps): a killed run resumes from the last one."""
    threads: PositiveInt | None = None
    """torch CPU threads; null: torch's choice."""


Precision = Literal["auto", "bf16", "fp32"]
PRECISIONS = typing.get_args(Precision)


def resolve_precision(precision: Precision, device: torch.device) -> Literal["bf16", "fp32"]:
    """The compute dtype a run uses: "auto" is "bf16" when ``bf16_units()`` finds bf16 matrix units on this
    machine (CUDA, AMX, AVX512-BF16) and ``device`` is where they are, else "fp32"; the others as given."""
    if precision != "auto":
        return precision
    units = bf16_units()
    return "bf16" if units and (device.type == "cuda") == (units == ["cuda"]) else "fp32"


def machine_precision(tcfg: TrainConfig) -> Literal["bf16", "fp32"]:
    """The precision ``tcfg`` resolves to on this machine's default device (a job runs on it)."""
    return resolve_precision(tcfg.precision, distributed.default_device())


def legacy_precision() -> Literal["bf16", "fp32"]:
    """The precision of a run recorded before ``train.precision`` existed, on this machine: bf16 autocast on
    CUDA, fp32 on CPU."""
    return "bf16" if distributed.default_device().type == "cuda" else "fp32"


def autocast(precision: Literal["bf16", "fp32"], device: torch.device) -> contextlib.AbstractContextManager:
    """bfloat16 autocast on ``device`` for "bf16", nothing for "fp32"."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()


class UntilConfig(BaseModel):
    """Train to criterion (synthetic tasks only): every ``every`` steps the in-distribution accuracy (``metric``
    "id_accuracy": ``posenc.eval.tasks.id_accuracy`` on ``answers`` answers of a fixed held-out set) is measured, and
    training stops at the first check where it is >= ``at_least`` (a fraction); ``train.steps`` stays the cap.

    ``extend_to`` (steps, > ``train.steps``; null: off): a run whose criterion is unmet at the cap and whose training
    loss is still falling there (``posenc.train.curves.loss_trend`` on its logged losses up to the cap, the rule of
    ``posenc.reports.tasks.budget``) trains on, checked as before, until it meets the criterion or reaches step
    ``extend_to``. The extra steps run at the schedule's final learning rate (``min_lr_ratio * lr``, what
    :func:`lr_at` gives past ``steps``), so the first ``steps`` steps are the unextended run's (:func:`train`)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    metric: Literal["id_accuracy"] = "id_accuracy"
    """What is checked: ``id_accuracy``, the in-distribution answer accuracy."""
    at_least: Annotated[float, Field(gt=0, le=1)]
    """Training stops at the first check where the metric is >= this (a fraction)."""
    every: PositiveInt
    """Check interval (steps)."""
    answers: PositiveInt = 1000
    """Held-out answers per check (a 1-point standard error at 90% accuracy needs ~900)."""
    extend_to: PositiveInt | None = None
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


@dataclasses.dataclass
class Criterion:
    """What :func:`fit` checks every ``every`` steps (at steps ``every``, ``2 every``, ..., the cap included):
    ``measure(step)`` gives the metric (``name`` in the line that announces a stop), the run stops once it is
    >= ``at_least``."""

    every: int
    at_least: float
    measure: Callable[[int], float]
    name: str = "criterion"


class TrainConfig(LoopConfig):
    """Data and loop settings of one of posenc's LMs. ``steps`` is the budget; ``time_budget`` (s) may stop earlier."""

    corpus: str = "shakespeare"
    """Training text: ``shakespeare``, ``pystdlib``, ``hf:NAME``, a local path, or a synthetic task spec
    (``posenc list``)."""
    tokenizer: str = "byte"
    """``byte`` (256 entries) or ``bpeN`` (a byte-level BPE of N entries trained on the corpus)."""
    time_budget: float | None = Field(None, gt=0)
    """Stop after this many seconds of training (a later ``--resume`` continues); null: no limit."""
    log_every: int = Field(10, gt=0)
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


def lr_at(step: int, cfg: LoopConfig) -> float:
    """Linear warmup to ``lr`` then cosine decay to ``min_lr_ratio * lr`` at ``steps``, and that final rate after it
    (the extra steps of ``train.until.extend_to``)."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def batch_at(stream: np.ndarray, step: int, batch_size: int, length: int, seed: int, rows: slice = slice(None)):
    """The global batch of ``step``: (B, length) inputs and targets, int64.

    Offsets are drawn from a generator seeded by (seed, step); ``rows`` selects
    this process's share of the global batch (data-parallel ranks).
    """
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, len(stream) - length - 1, size=batch_size)[rows]
    chunk = np.stack([stream[s : s + length + 1] for s in starts]).astype(np.int64)
    t = torch.from_numpy(chunk)
    return t[:, :-1], t[:, 1:]


def training_batch(data: TokenData | TaskData, step: int, tcfg: TrainConfig, length: int, rows: slice = slice(None)):
    """(inputs, targets, answers) of ``step``: (B, length) int64 twice, then the (B, length) bool mask of the
    targets the loss averages over (``tcfg.loss`` "answers" on a task), or None for every target."""
    if isinstance(data, TaskData):
        b = data.batch(step, tcfg.batch_size, length, tcfg.seed, rows)
        return b.inputs, b.targets, b.answer if tcfg.loss == "answers" else None
    return (*batch_at(data.train, step, tcfg.batch_size, length, tcfg.seed, rows), None)


def randomized_max(spec: str) -> int | None:
    """N of ``train.positions`` ``randomized:max=N``; None for ``contiguous``. PosencError (one line) for another
    spec or a max that is not an integer >= 1 (``check_positions`` compares it with the training length)."""
    name, params = encodings.split_part(spec, "train.positions")
    if name == "contiguous" and not params:
        return None
    if name != "randomized" or set(params) != {"max"}:
        raise PosencError(f"train.positions must be 'contiguous' or 'randomized:max=N', got {spec!r}")
    n = params["max"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise PosencError(f"train.positions {spec!r}: max must be an integer >= 1")
    return n


def training_positions(n_max: int, length: int, seed: int, step: int) -> torch.Tensor:
    """The training positions of ``step`` under ``randomized:max=n_max`` (``posenc.data.positions``): ``length``
    sorted distinct positions in 0..n_max-1, (length,) int64. One draw per step, shared by the batch's sequences,
    seeded by (seed, step), so a resumed run draws what it would have."""
    return randomized_positions(n_max, length, (seed, step, TRAIN_STREAM))


def check_positions(mcfg: ModelConfig, tcfg: TrainConfig) -> int | None:
    """N of randomized training positions (None: contiguous), checked against the model before it is built:
    PosencError (one line) when N < the training length, when no layer's scheme reads positions
    (``Encoding.position_indexed``: nope, the accumulated, PaTH and forget-gate schemes take none), or when a
    scheme takes fewer than N positions (a learned table, ``Encoding.positions_supported``)."""
    n = randomized_max(tcfg.positions)
    if n is None:
        return None
    L, scheme = mcfg.train_length, mcfg.encoding
    if n < L:
        raise PosencError(f"train.positions {tcfg.positions!r}: max must be >= the training length {L}")
    classes = [cls for spec in encodings.layer_pattern(scheme) for cls, _ in encodings.parts(spec)]
    if not any(cls.position_indexed for cls in classes):
        raise PosencError(
            f"train.positions {tcfg.positions!r}: scheme {scheme!r} reads no position (randomized "
            "positions apply to position-indexed schemes: rope, alibi, t5, kerple, fire, xpos, pope, ...)"
        )
    short = [m for cls in classes if (m := cls.positions_supported(mcfg.dims())) is not None and m < n]
    if short:
        raise PosencError(
            f"train.positions {tcfg.positions!r}: scheme {scheme!r} takes {short[0]} positions, fewer than max"
        )
    return n


def mean_loss(nll: torch.Tensor, answers: torch.Tensor | None) -> torch.Tensor:
    """The mean of the (B, T) per-target NLL over ``answers`` (every target when None)."""
    if answers is None:
        return nll.mean()
    return (nll * answers).sum() / answers.sum().clamp(min=1)


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


SMALL_CORPUS = 100_000  # tokens; nanoGPT's smallest corpus (Shakespeare, characters) has 1M


def check_data(data: TokenData | TaskData, mcfg: ModelConfig, tcfg: TrainConfig) -> None:
    """PosencError when the data cannot train this model: a text stream shorter than a window, answer-only
    loss on text (it has no answer positions), a task whose training sequences do not fit the length, randomized
    positions the scheme cannot take (``check_positions``)."""
    check_positions(mcfg, tcfg)
    if isinstance(data, TaskData):
        data.task.check_length(mcfg.train_length)
    elif tcfg.until is not None:
        raise PosencError(f"train.until needs a synthetic task corpus (posenc.data.tasks), not {tcfg.corpus!r}")
    elif tcfg.loss == "answers":
        raise PosencError(
            f"train.loss 'answers' needs a synthetic task corpus (posenc.data.tasks), not {tcfg.corpus!r}"
        )
    elif len(data.train) <= mcfg.train_length + 1:
        raise PosencError(f"training split has {len(data.train)} tokens, fewer than train_length {mcfg.train_length}")
    elif len(data.train) < SMALL_CORPUS:
        seen = tcfg.steps * tcfg.batch_size * mcfg.train_length
        print(
            f"posenc: warning: the training split has only {len(data.train):,} tokens (the budget reads {seen:,}, "
            f"{seen / len(data.train):.2g} times the split): numbers will measure memorisation",
            file=sys.stderr,
        )


def make_optimizer(model: torch.nn.Module, cfg: LoopConfig) -> torch.optim.AdamW:
    """AdamW (betas 0.9, 0.95) over the parameters of ``model`` that require gradients: weight decay on
    matrices, none on vectors and scalars (norms, biases, gates)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    other = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95))


@dataclasses.dataclass
class Checkpoint:
    """The resume point of a run in ``run_dir``: ``state.pt`` holds the step, the trained tensors (under
    ``key``) and the optimizer state, so it alone resumes (a kill between the two writes cannot pair
    tensors and optimizer state of different steps); ``weights`` holds the same tensors as safetensors,
    for other tools. ``tensors()`` gives the live tensors by name (e.g. ``model.state_dict``)."""

    run_dir: Path
    tensors: Callable[[], dict[str, torch.Tensor]]
    opt: torch.optim.Optimizer
    key: str = "model"
    weights: str = "model.safetensors"

    def save(self, step: int) -> None:
        tensors = self.tensors()
        save_torch(self.run_dir / "state.pt", {"step": step, self.key: tensors, "optimizer": self.opt.state_dict()})
        save_tensors(self.run_dir / self.weights, tensors)

    def load(self) -> int:
        """Load ``state.pt`` into the tensors and the optimizer; returns its step (0 without one). Raises
        PosencError naming the file when it lacks the step or optimizer state, or holds other tensors."""
        path = self.run_dir / "state.pt"
        if not path.exists():
            return 0
        state = load_torch(path)
        missing = [k for k in ("step", "optimizer") if not isinstance(state, dict) or k not in state]
        if missing:
            raise PosencError(f"{path} is damaged: no {', '.join(missing)}; use another --out")
        # written before state.pt held the tensors: they are in the weights file
        saved = state[self.key] if self.key in state else load_tensors(self.run_dir / self.weights)
        live = self.tensors()
        if set(saved) != set(live):
            raise PosencError(f"{path} does not hold this run's trained tensors; use another --out")
        with torch.no_grad():
            for name, t in live.items():
                t.copy_(saved[name])
        self.opt.load_state_dict(state["optimizer"])
        return int(state["step"])


def truncate_log(path: Path, step: int) -> None:
    """Drop log records after ``step``: a killed run logged steps its checkpoint does not hold."""
    kept = [r for r in read_jsonl(path) if r["step"] <= step]
    write_jsonl(path, kept)


LOG_FIELDS = ("step", "loss", "lr", "grad_norm", "tokens_per_s")  # a train.jsonl record


def fit(
    model: torch.nn.Module,
    cfg: LoopConfig,
    loss_at: Callable[[int], tuple[torch.Tensor, int]],
    ckpt: Checkpoint,
    step: int = 0,
    *,
    log_every: int = 1,
    log_fields: tuple[str, ...] = LOG_FIELDS,
    time_budget: float | None = None,
    shard: distributed.Shard = distributed.Shard(),
    tracker: Tracker = NO_TRACKER,
    desc: str = "train",
    criterion: Criterion | None = None,
    end: int | None = None,
) -> dict:
    """The training loop: from ``step`` to ``end`` (default ``cfg.steps``), AdamW ``ckpt.opt`` at :func:`lr_at` (the
    schedule of ``cfg.steps``: past it, its final rate ``min_lr_ratio * lr``), gradients of
    ``model``'s trainable parameters clipped to ``cfg.grad_clip`` (global norm), a checkpoint every
    ``cfg.ckpt_every`` steps and at the end. Returns {steps, seconds, tokens_per_s, final_loss}.

    ``loss_at(step)``: the scalar loss of that step's batch on this rank (the mean over its rows) and the
    tokens it holds; batches must be a function of the step, so a resumed run sees the batches of an
    uninterrupted one. Every ``log_every`` steps (and the last) rank 0 appends ``log_fields`` of the step
    (step, loss in nats (the mean over ranks), lr, grad_norm, tokens_per_s, seconds of the step) to
    ``train.jsonl`` (records after ``step`` are dropped first) and gives them to ``tracker``. Only rank 0
    writes; every rank stops at the same step. A NaN/inf loss or gradient norm raises PosencError naming
    the step and the last good checkpoint, before the update. Ctrl-C lets the step in flight end, saves a
    checkpoint and raises KeyboardInterrupt saying where (a second Ctrl-C: StopNow, at once). Progress on stderr
    (rank 0, ``posenc.eval.progress``'s rule): a bar with an ETA on a terminal; elsewhere (a log file) one line per
    checkpoint; ``--verbose`` adds one line per logged step; ``--quiet`` prints none.

    ``criterion``: checked at every step that is a multiple of its ``every`` (each check appended to
    ``until.jsonl`` as {step, value}); the loop stops at the first check that meets it, saying so in one line
    (the metric, its value and the step; not under ``--quiet``), and the result gets
    ``criterion_step`` (that step, or None when never met). The check of the step a resumed run starts at is
    redone (the same weights give the same value), so the checks are those of an uninterrupted run.
    PosencError (one line) for an ``end`` below ``step``.
    """
    end = cfg.steps if end is None else end
    if end < step:
        raise PosencError(f"fit: end step {end} is before the start step {step}")
    run_dir, log = ckpt.run_dir, ckpt.run_dir / "train.jsonl"
    params = [p for p in model.parameters() if p.requires_grad]
    if shard.is_main:
        truncate_log(log, step)
        if criterion is not None:
            truncate_log(run_dir / "until.jsonl", step - 1)  # the check at ``step`` is redone below
    reached = None

    def met(step: int) -> bool:  # a check is due at multiples of ``every``
        if criterion is None or step == 0 or step % criterion.every:
            return False
        value = criterion.measure(step)
        if shard.is_main:
            append_jsonl(run_dir / "until.jsonl", {"step": step, "value": value})
        if value < criterion.at_least:
            return False
        if shard.is_main:
            progress.note(
                f"{desc}: stopped at step {step} of {end}: {criterion.name} {value:.4f} >= {criterion.at_least:g} "
                "(train.until)"
            )
        return True

    model.train()
    tracker.start(step)
    t0, tokens_seen, loss_all, saved = time.time(), 0, None, None
    last_good = step or None
    bar = progress.bar(total=end, initial=step, desc=desc, unit="step", shown=shard.is_main)
    with ctrl_c_between_steps() as interrupted:
        try:
            while step < end:
                if met(step):
                    reached = step
                    break
                if time_budget and shard.any(time.time() - t0 > time_budget):
                    break
                if shard.any(interrupted()):  # every rank stops at the same step boundary
                    raise KeyboardInterrupt
                t_step = time.time()
                for g in ckpt.opt.param_groups:
                    g["lr"] = lr_at(step, cfg)
                loss, tokens = loss_at(step)
                ckpt.opt.zero_grad(set_to_none=True)
                loss.backward()
                gnorm = float(torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip))
                loss_all = float(shard.mean(loss.detach()))
                if not (math.isfinite(loss_all) and math.isfinite(gnorm)):
                    what = f"loss is {loss_all}" if not math.isfinite(loss_all) else f"gradient norm is {gnorm}"
                    good = f"{run_dir / ckpt.weights} (step {last_good})" if last_good is not None else "none yet"
                    raise PosencError(f"{what} at step {step}; last good checkpoint: {good}")
                ckpt.opt.step()
                step += 1
                tokens_seen += tokens * shard.world
                tps = tokens_seen / max(1e-9, time.time() - t0)
                bar.set_postfix(loss=f"{loss_all:.3f}", tok_s=f"{tps:,.0f}", refresh=False)  # update redraws
                bar.update(1)
                if shard.is_main and (step % log_every == 0 or step == end):
                    rec = {
                        "step": step,
                        "loss": loss_all,
                        "lr": lr_at(step - 1, cfg),
                        "grad_norm": gnorm,
                        "tokens_per_s": tps,
                        "seconds": round(time.time() - t_step, 3),
                    }
                    append_jsonl(log, {k: rec[k] for k in log_fields})
                    progress.detail(
                        f"{desc}: step {step}/{end}, loss {loss_all:.4f}, lr {rec['lr']:.3g}, grad norm {gnorm:.3g}, "
                        f"{tps:,.0f} tokens/s"
                    )
                    tracker.log({f"train/{k}": rec[k] for k in ("loss", "lr", "grad_norm", "tokens_per_s")}, step)
                if (
                    step % cfg.ckpt_every == 0 or step == end
                ):  # the last step too: a run shorter than ckpt_every shows progress
                    if shard.is_main:
                        ckpt.save(step)
                        if not progress.live():  # a live bar shows the step already
                            progress.note(
                                f"{desc}: step {step}/{end}, loss {loss_all:.3f}, {tps:,.0f} tokens/s, "
                                f"checkpoint {run_dir}"
                            )
                    last_good = saved = step
        except StopNow:
            raise
        except KeyboardInterrupt:
            if shard.is_main:
                ckpt.save(step)
            raise KeyboardInterrupt(f"{run_dir} checkpointed at step {step} of {end}") from None
        finally:
            bar.close()
    if reached is None and step == end and met(step):  # the check at the cap
        reached = step
    if shard.is_main and saved != step:
        ckpt.save(step)
    seconds = time.time() - t0
    done = {"steps": step, "seconds": seconds, "tokens_per_s": tokens_seen / max(1e-9, seconds), "final_loss": loss_all}
    return done if criterion is None else {**done, "criterion_step": reached}


def read_run_config(run_dir: Path) -> dict:
    """A run's config.json; PosencError naming it when damaged or without its model/train sections."""
    path = Path(run_dir) / "config.json"
    cfg = read_json(path)
    if not (isinstance(cfg, dict) and all(isinstance(cfg.get(k), dict) for k in ("model", "train"))):
        raise PosencError(f"{path} is damaged: it needs 'model' and 'train' sections")
    return cfg


def check_plugins(run_dir: Path, cfg: dict) -> None:
    """PosencError naming what to ``--import`` when the run's scheme came from a plugin this process has not loaded
    (``config.json``'s ``plugins``, from ``encodings.plugin_sources``)."""
    missing = [p for p in cfg.get("plugins", []) if p["module"] not in encodings.plugin_modules()]
    if missing:
        what = ", ".join(p["file"] or p["module"] for p in missing)
        raise PosencError(
            f"{run_dir} was trained with the scheme plugin {what}: "
            f"load it with posenc --import {missing[0]['file'] or missing[0]['module']} "
            f"(or POSENC_IMPORT)"
        )


def load_run(run_dir: Path) -> tuple[LM, ModelConfig, TrainConfig]:
    """Model (weights loaded, on the default device: CUDA if present), model and training config of a run."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.json").exists() or not (run_dir / "model.safetensors").exists():
        raise PosencError(f"{run_dir} has no checkpoint (config.json + model.safetensors)")
    cfg = read_run_config(run_dir)
    check_plugins(run_dir, cfg)
    mcfg, tcfg = (
        validated(ModelConfig, cfg["model"], "model config"),
        validated(TrainConfig, cfg["train"], "training config"),
    )
    model = LM(mcfg)
    load_weights(run_dir / "model.safetensors", model)
    return model.to(distributed.default_device()), mcfg, tcfg


class _TokenNLL(torch.nn.Module):
    """forward(x, y) = the LM's per-token NLL: the call DistributedDataParallel wraps."""

    def __init__(self, lm: LM):
        super().__init__()
        self.lm = lm

    def forward(self, x: torch.Tensor, y: torch.Tensor, pos: torch.Tensor | None = None) -> torch.Tensor:
        return self.lm.token_nll(x, y, pos=pos)


RESUME_FREE = {"steps", "time_budget", "ckpt_every", "log_every", "threads", "compile"}  # may change on resume
MODEL_KNOBS = {"attn_block_size"}  # model fields of speed and memory only: a trained run may be evaluated under another
# model fields added after runs were recorded: the value that builds the model as before
MODEL_ADDED = {"canon": 0, "seed": 0}
UNTIL_ADDED = {"extend_to": None}  # train.until fields added after runs were recorded: the value that trains as before


def run_differences(run_dir: Path, mcfg: ModelConfig, tcfg: TrainConfig) -> dict[str, list[str]]:
    """{"model" | "training": ["field recorded -> given", ...]}: where the run in ``run_dir`` (its config.json) was
    trained with other settings than ``mcfg`` and ``tcfg`` (precision as resolved), the fields that may change on
    resume (``RESUME_FREE``) excepted; empty when none differs."""
    saved = read_run_config(run_dir)
    old_train = {"precision": legacy_precision(), **saved["train"]}
    if isinstance(old_train.get("until"), dict):
        old_train["until"] = {**UNTIL_ADDED, **old_train["until"]}
    out = {}
    # the model's seed is the training seed's (train); a run recorded before the field drew from seed 0
    derived = {"seed"} if "seed" in saved["model"] else set()
    for section, settings, free in (
        ("model", dataclasses.asdict(mcfg), derived),
        ("training", tcfg.model_dump(), RESUME_FREE),
    ):
        now = json.loads(json.dumps(settings, default=str))  # as config.json stores it
        old = {**MODEL_ADDED, **saved["model"]} if section == "model" else old_train
        diff = [f"{k} {old.get(k)!r} -> {v!r}" for k, v in now.items() if k not in free and old.get(k) != v]
        if diff:
            out[section] = diff
    return out


def _check_same_run(run_dir: Path, mcfg: ModelConfig, tcfg: TrainConfig) -> None:
    """Raise PosencError when the run in ``run_dir`` was trained with another model or training config.

    Resuming continues the same loss curve: only the step count, time budget, checkpoint
    and log intervals and CPU threads may change.
    """
    for section, diff in run_differences(run_dir, mcfg, tcfg).items():
        raise PosencError(f"cannot resume {run_dir}: its {section} differs ({'; '.join(diff)}); use another --out")


def check_trained_as(run_dir: Path, mcfg: ModelConfig, tcfg: TrainConfig, what: str) -> None:
    """Raise PosencError (one line naming each differing field) when the run in ``run_dir`` (if any: its config.json)
    was not trained with ``mcfg`` and ``tcfg`` (precision "auto" as this machine resolves it), the fields that may
    change on resume and the model's speed knobs (``MODEL_KNOBS``) excepted, or, finished, trained another number of
    steps than ``tcfg.steps`` (fewer only by meeting ``train.until`` or under a ``time_budget``, more only to the
    extension its summary records: ``train.until.extend_to``). ``what`` names who expects these settings (a sweep's
    job)."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.json").exists():
        return
    tcfg = tcfg.model_copy(update={"precision": machine_precision(tcfg)})
    recorded = read_run_config(run_dir)["model"]
    mcfg = dataclasses.replace(mcfg, **{k: recorded[k] for k in MODEL_KNOBS if k in recorded})
    diff = [f"{section} {d}" for section, ds in run_differences(run_dir, mcfg, tcfg).items() for d in ds]
    if is_trained(run_dir):
        summary = read_json(run_dir / "train_summary.json")
        steps = summary.get("steps")
        early = (tcfg.until is not None and (summary.get("until") or {}).get("reached") == steps) or (
            tcfg.time_budget and steps < tcfg.steps
        )
        if steps != tcfg.steps and not early and steps != _extended_to(summary):
            diff.append(f"trained steps {steps!r} -> {tcfg.steps!r}")
    if diff:
        raise PosencError(
            f"{run_dir} was not trained with the settings of {what} ({'; '.join(diff)}); "
            "move it away or use another --out"
        )


def use_threads(tcfg: TrainConfig) -> None:
    """Set torch's intra-op threads to ``tcfg.threads`` (0: leave them as they are): training, and a job that only
    evaluates a model trained earlier, run at the thread count the run records (it changes learned results)."""
    if tcfg.threads:
        torch.set_num_threads(tcfg.threads)


def train(
    run_dir: Path,
    mcfg: ModelConfig,
    tcfg: TrainConfig,
    resume: bool = False,
    data: TokenData | None = None,
    desc: str = "",
    tracker: Tracker = NO_TRACKER,
    device: torch.device | None = None,
) -> dict:
    """Train one model into ``run_dir`` with :func:`fit` on ``device`` (None: ``distributed.default_device``, the
    GPU when there is one; ``config.json``'s stamp records it); returns a summary dict.

    With ``resume`` and a checkpoint present, continues from its step (weights,
    optimizer, schedule, random draws and batches as if never interrupted; log
    records after the checkpoint are dropped). Ctrl-C lets the step in flight end, saves a
    checkpoint and re-raises (a second Ctrl-C stops at once, keeping the last checkpoint).
    A NaN/inf loss or gradient norm raises PosencError naming the step and the last good
    checkpoint. ``tracker`` gets each logged step's loss, lr, tokens/s and gradient norm (give it on
    rank 0 only). Progress as :func:`fit` shows it. Under torchrun (``WORLD_SIZE`` > 1) runs
    data-parallel; ``batch_size`` is the global batch and must divide evenly.

    With ``train.until`` the summary's ``until`` holds its settings, ``reached`` (the step it met the criterion at,
    or None) and ``extended``: {"from": the cap, "to": ``extend_to``, "why": the falling loss in words} when the run
    trained on past its cap (:class:`UntilConfig`: at the schedule's final learning rate), else None. PosencError
    (one line) for a checkpoint past the last step the settings allow.
    """
    run_dir = Path(run_dir)
    shard = distributed.setup(device)
    tcfg = tcfg.model_copy(
        update={"precision": resolve_precision(tcfg.precision, shard.device)}
    )  # config.json: what ran
    rows = shard.rows(tcfg.batch_size)
    use_threads(tcfg)
    with shard.main_first():  # rank 0 builds the token cache, the others read it
        data = data or load_tokens(tcfg.corpus, tcfg.tokenizer, tasks=True)
    if mcfg.seed not in (0, tcfg.seed):
        raise PosencError(
            f"model.seed is the training seed's (train.seed {tcfg.seed}); got {mcfg.seed}: set train.seed"
        )
    # every random draw of the run comes from its seed: the weights, the batches, the scheme's own draws
    mcfg = dataclasses.replace(mcfg, vocab_size=data.vocab_size, seed=tcfg.seed)
    check_data(data, mcfg, tcfg)
    if shard.is_main:  # after the corpus loads, so bad input leaves no empty run directory
        make_run_dir(run_dir)
    torch.manual_seed(tcfg.seed)
    model = LM(mcfg).to(shard.device)  # before the optimizer, so its state lives on the device
    ckpt = Checkpoint(run_dir, model.state_dict, make_optimizer(model, tcfg))
    step = 0
    if resume and (run_dir / "state.pt").exists():
        _check_same_run(run_dir, mcfg, tcfg)
        step = ckpt.load()
        if step > tcfg.last_step():
            most = "steps" if tcfg.last_step() == tcfg.steps else "until.extend_to"
            raise PosencError(
                f"cannot resume {run_dir}: it has trained {step} steps, more than {most}={tcfg.last_step()}"
            )
        if is_trained(run_dir) and _finished_at(read_json(run_dir / "train_summary.json"), step, tcfg):
            return read_json(run_dir / "train_summary.json")  # finished: keep its summary and log as they are
    elif resume and (run_dir / "model.safetensors").exists():  # starting over would overwrite these weights
        raise PosencError(
            f"cannot resume {run_dir}: it has weights but no state.pt (optimizer state); use another --out"
        )
    elif shard.is_main:  # a fresh run replaces an old summary (and log: fit)
        (run_dir / "train_summary.json").unlink(missing_ok=True)
    if shard.is_main:
        write_json(
            run_dir / "config.json",
            {
                "model": dataclasses.asdict(mcfg),
                "train": tcfg.model_dump(),
                "stamp": run_stamp(tcfg.precision, shard.device),
                "plugins": encodings.plugin_sources(mcfg.encoding),
            },
        )
    distributed.set_batch_rows(model, rows)
    loss_fn = distributed.wrap(_TokenNLL(model), shard)
    if tcfg.compile:
        loss_fn = torch.compile(loss_fn)

    n_max = check_positions(mcfg, tcfg)

    def loss_at(step: int) -> tuple[torch.Tensor, int]:
        x, y, answers = (
            t if t is None else t.to(shard.device) for t in training_batch(data, step, tcfg, mcfg.train_length, rows)
        )
        pos = () if n_max is None else (training_positions(n_max, x.shape[1], tcfg.seed, step).to(shard.device),)
        with autocast(tcfg.precision, shard.device):
            return mean_loss(loss_fn(x, y, *pos), answers), x.numel()  # mean over this rank's rows (answers)

    criterion = None
    if tcfg.until is not None:
        until = tcfg.until
        criterion = Criterion(
            until.every,
            until.at_least,
            lambda step: id_accuracy(
                model, data.task, mcfg.train_length, until.answers, positions=n_max, seed=tcfg.seed
            ),
            name=until.metric,
        )

    def fit_to(start: int, end: int, time_budget: float | None) -> dict:
        return fit(
            model,
            tcfg,
            loss_at,
            ckpt,
            start,
            log_every=tcfg.log_every,
            time_budget=time_budget,
            shard=shard,
            tracker=tracker,
            desc=desc or mcfg.encoding,
            criterion=criterion,
            end=end,
        )

    # up to the cap; a run resumed past it (within its extension) skips this phase
    done = fit_to(step, tcfg.steps, tcfg.time_budget) if step <= tcfg.steps else None
    extended = None
    if tcfg.last_step() > tcfg.steps and (
        done is None or (done["criterion_step"] is None and done["steps"] == tcfg.steps)
    ):
        # the extension continues the run rather than restarting it under a schedule of extend_to steps: the first
        # ``steps`` steps (their checks, a stop at criterion, everything recorded under the cap) stay exactly the
        # unextended run's and an extension costs only its own steps; its steps train at the schedule's final rate
        # (lr_at past steps). The decision reads train.jsonl up to the cap only, which a resumed run keeps as an
        # uninterrupted one wrote it, so a run resumed at or past the cap decides the same.
        why = _still_falling(run_dir / "train.jsonl", tcfg.steps) if shard.is_main else None
        if shard.any(why is not None):  # rank 0 reads the log; every rank follows its decision
            extended = {"from": tcfg.steps, "to": tcfg.last_step(), "why": why}
        elif done is None:
            raise PosencError(
                f"cannot resume {run_dir}: its checkpoint (step {step}) is past the cap {tcfg.steps}, but its loss "
                "up to the cap was not still falling (train.until.extend_to); use another --out"
            )
    if extended is not None:
        spent = done["seconds"] if done else 0.0
        budget = None if not tcfg.time_budget else max(tcfg.time_budget - spent, 1e-9)
        more = fit_to(max(step, tcfg.steps), tcfg.last_step(), budget)
        if done is not None:  # one summary over both phases
            seconds = done["seconds"] + more["seconds"]
            tokens = done["tokens_per_s"] * done["seconds"] + more["tokens_per_s"] * more["seconds"]
            final = more["final_loss"] if more["final_loss"] is not None else done["final_loss"]
            more = {**more, "seconds": seconds, "tokens_per_s": tokens / max(1e-9, seconds), "final_loss": final}
        done = more
    summary = {**done, "params": model.num_params()}
    if tcfg.until is not None:
        summary["until"] = {**tcfg.until.model_dump(), "reached": summary.pop("criterion_step"), "extended": extended}
    if shard.is_main:
        write_json(run_dir / "train_summary.json", summary)
    shard.wait_all()
    return summary


def _finished_at(summary: dict, step: int, tcfg: TrainConfig) -> bool:
    """Whether a run whose summary is ``summary`` and whose checkpoint is at ``step`` is done under ``tcfg``: it
    reached the cap (the end of its extension when its summary records one: ``train.until.extend_to``), or it met its
    criterion at that step (it stays stopped, even under a larger cap)."""
    reached = (summary.get("until") or {}).get("reached")
    end = _extended_to(summary) or tcfg.steps
    return summary.get("steps") == step and (step == end or (tcfg.until is not None and reached == step))


def _extended_to(summary: dict) -> int | None:
    """The step a run's summary says it trains on to past its cap (``train.until.extend_to``); None: not extended."""
    return ((summary.get("until") or {}).get("extended") or {}).get("to")


def _still_falling(log: Path, cap: int) -> str | None:
    """Why a run unmet at its cap ``cap`` trains on: its training loss still falling there (the words of
    ``posenc.train.curves.Trend.falling_at``, from the losses logged in ``log`` at steps <= ``cap``); None when it is
    not (or too few steps were logged to tell)."""
    trend = loss_trend([(r["step"], r["loss"]) for r in read_jsonl(log) if r["step"] <= cap])
    return trend.falling_at(cap) if trend is not None and trend.falling else None


def steps_to_criterion(summary: dict) -> int | None:
    """The step a run's summary (``train_summary.json``) says it met ``train.until`` at; None when not met."""
    return (summary.get("until") or {}).get("reached")


def is_trained(run_dir: Path) -> bool:
    """True when ``run_dir`` holds a finished run (its summary is written last)."""
    return (Path(run_dir) / "train_summary.json").exists()
