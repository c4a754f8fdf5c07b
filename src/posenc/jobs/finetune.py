"""Fine-tuning a pretrained RoPE model after a scheme swap or a RoPE schedule: the job behind ``posenc finetune``.

``finetune(cfg)`` loads the model (``posenc.hf.loading``), puts a posenc scheme
into its attention (``posenc.hf.scheme.apply_scheme``) or sets a RoPE context-extension schedule
(``posenc.hf.adaptation.Adaptation``), scores it with ``posenc extend``'s
perplexity/passkey protocol, trains it for ``steps`` steps on random windows of
``length`` tokens of the corpus's training documents (the model's tokenizer), and scores
it again. With ``lora_rank`` > 0 only LoRA adapters (``peft``) on ``lora_targets`` and the
scheme's own parameters train; with 0 every weight does.

Run directory ``runs/finetune/<name>/``: ``finetune.json`` (the training settings), ``state.pt``
(trained tensors, the schemes' buffers, optimizer state and step: the resume point), ``trained.safetensors``
(the trained tensors by name: LoRA adapters and scheme parameters, or every weight),
``train.jsonl`` (loss per step), ``loss.png``, and the evaluation records and report
(``records.jsonl``, ``results.md``, CSV files and plots, as ``posenc extend`` writes them).
Ctrl-C ends the step in flight and checkpoints. An interrupted run resumes where it stopped:
training from its last checkpoint, with the batches and random draws an uninterrupted run would
see, and evaluation from its last record. ``load_finetuned(run_dir)`` loads a run's model back (``posenc generate``).
"""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, field_validator

from posenc.data.corpora import load_corpus
from posenc.errors import PosencError
from posenc.eval import progress
from posenc.hf import loading
from posenc.hf.adaptation import Adaptation
from posenc.jobs import extend
from posenc.reports import pretrained as report
from posenc.store.checkpoint import (
    check_run_dir,
    load_tensors,
    load_torch,
    make_run_dir,
    read_json,
    refuse_broken_link,
    write_json,
)
from posenc.store.lock import hold_run_dir, open_run_dir, run_files
from posenc.store.presets import SHIPPED, CountOrOff, StepCount, Steps, distinct, load_flat, validated
from posenc.store.presets import preset_names as shipped
from posenc.store.records import PasskeyTrial, ScoredWindow
from posenc.store.stamp import run_stamp
from posenc.train.batches import batch_at
from posenc.train.loop import fit
from posenc.train.optimizer import make_optimizer
from posenc.train.resume import Checkpoint, read_log
from posenc.train.settings import LoopConfig
from posenc.train.tracking import NO_TRACKER, Tracker, check_kind, open_tracker

PRESETS = SHIPPED / "finetune"
SETTINGS = "finetune.json"  # the training settings (config.json is the evaluation's, as posenc extend writes it)
WEIGHTS = "trained.safetensors"  # the trained tensors of the last checkpoint, by name (trained_state)
# what may change when a run resumes (scoring, run name, checkpoint interval): the rest must equal finetune.json
RESUME_FREE = {
    "name",
    "ckpt_every",
    "threads",
    "eval_lengths",
    "eval_windows",
    "docs",
    "max_tokens",
    "bos",
    "passkey_lengths",
    "passkey_depths",
    "trials",
}


class FinetuneConfig(LoopConfig, extend.ScoringConfig):
    """One ``posenc finetune`` run: the loop's settings, then extend's scoring before and after training;
    lengths in tokens of the model's tokenizer, lr in AdamW units. It trains on the corpus's training
    documents; ``seed`` seeds the batches, LoRA and scheme initialisation and the passkey keys."""

    # the loop's defaults for a pretrained model: a short budget of small batches, a low rate, no decay
    batch_size: PositiveInt = 1
    """Sequences per optimiser step (a pretrained model's default: small batches)."""
    steps: Steps = 50
    """Optimiser steps."""
    lr: PositiveFloat = 2e-4
    """Peak learning rate (AdamW; low for a pretrained model)."""
    warmup: StepCount = 5
    """Linear warmup steps."""
    weight_decay: NonNegativeFloat = 0.0
    """AdamW weight decay (none for a pretrained model)."""
    ckpt_every: Steps = 10
    """Steps between checkpoints."""
    scheme: str | None = None
    """A posenc scheme put into the model's attention (posenc.hf.scheme.apply_scheme)."""
    schedule: str = "none"
    """``none`` or a RoPE context-extension schedule (posenc.rope); not with a scheme."""
    length: int = Field(1024, ge=2)
    """Tokens per training sequence."""
    lora_rank: int = Field(8, ge=0)
    """0: full fine-tuning."""
    lora_alpha: float = Field(16.0, gt=0)
    """LoRA scaling alpha (the update is scaled by alpha / rank)."""
    lora_targets: list[str] = Field(["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1)
    """The attention projections LoRA adapts."""
    eval_lengths: list[Annotated[int, Field(ge=2)]] = Field([1024], min_length=1)
    """Lengths (tokens) scored before and after training."""
    eval_windows: CountOrOff = 4
    """Windows per length; 0: all."""

    _distinct_finetune = field_validator("lora_targets", "eval_lengths")(distinct)
    pose_target: int | None = Field(None, ge=2)
    """PoSE: position ids skip-wise over this length (pose_position_ids)."""
    pose_chunks: int = Field(2, ge=1)
    """PoSE's chunks per training sequence (the paper's default: 2)."""


def preset_names() -> list[str]:
    """Names of the shipped finetune presets (``posenc/presets/finetune/*.yaml``)."""
    return shipped(PRESETS)


def load_finetune_config(name_or_path: str, overrides: dict[str, Any] | None = None) -> FinetuneConfig:
    """A finetune preset by name (package data) or YAML path, ``overrides`` (given flags) replacing its keys.

    Raises PosencError (one line) for an unknown preset, invalid YAML, an unknown key or bad
    value, an unknown schedule or invalid scheme, a scheme together with a schedule, a factor without one, LoRA
    settings with lora_rank 0, or pose_chunks without pose_target.
    """
    cfg = load_flat(FinetuneConfig, name_or_path, PRESETS, "finetune preset", overrides)
    if cfg.schedule == "none" and "factor" in cfg.model_fields_set:  # given, it would scale nothing
        raise PosencError(
            f"factor {cfg.factor:g} is a RoPE schedule's scale factor: give --schedule with it (a scheme takes its "
            "own parameters, e.g. --scheme rope:factor=4)"
        )
    given_lora = sorted({"lora_alpha", "lora_targets"} & cfg.model_fields_set)
    if cfg.lora_rank == 0 and given_lora:  # rank 0 trains every weight: the LoRA settings would do nothing
        raise PosencError(f"{', '.join(given_lora)} set LoRA; lora_rank 0 trains every weight instead: drop one")
    if cfg.pose_target is None and "pose_chunks" in cfg.model_fields_set:  # PoSE is off: it would split nothing
        raise PosencError("pose_chunks sets PoSE's chunks; PoSE is on only with pose_target: give it, or drop one")
    check_config(cfg)
    return cfg


def check_config(cfg: FinetuneConfig) -> None:
    """What field bounds cannot say: a scheme or a schedule (not both), PoSE's settings, and extend's checks of the
    scoring."""
    if cfg.scheme and cfg.schedule != "none":
        raise PosencError(
            f"give a scheme or a RoPE schedule, not both (scheme {cfg.scheme!r}, schedule {cfg.schedule!r})"
        )
    if cfg.pose_target is not None:
        if cfg.pose_target < cfg.length:
            raise PosencError(
                f"pose_target {cfg.pose_target} is shorter than the training sequence (length {cfg.length})"
            )
        if cfg.pose_chunks > cfg.length:
            raise PosencError(
                f"pose_chunks {cfg.pose_chunks}: more chunks than tokens per sequence (length {cfg.length})"
            )
        if cfg.scheme or cfg.schedule == "rerope":  # their attention takes positions 0..T-1, not position_ids
            raise PosencError(
                f"PoSE moves the model's RoPE positions (position_ids): not with "
                f"{'scheme ' + repr(cfg.scheme) if cfg.scheme else 'schedule rerope'}"
            )
    extend.check_config(eval_config(cfg))


def eval_config(cfg: FinetuneConfig) -> extend.ExtendConfig:
    """The ``posenc extend`` settings that score the model before and after training."""
    shared = {k: getattr(cfg, k) for k in extend.ScoringConfig.model_fields}
    return extend.ExtendConfig(
        **shared,
        seed=cfg.seed,
        schedules=[cfg.schedule],
        schemes=[cfg.scheme] if cfg.scheme else [],
        lengths=cfg.eval_lengths,
        long_schedules=None,
        max_windows=cfg.eval_windows,
    )


def train_stream(cfg: FinetuneConfig, tokenizer) -> np.ndarray:
    """The corpus's training documents in the model's tokenizer, joined by EOS: (N,) int64.
    Raises PosencError when it is not longer than one training sequence."""
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    ids = []
    for doc in load_corpus(cfg.corpus).train:
        ids += extend.text_ids(tokenizer, doc.text) + eos
    if len(ids) <= cfg.length + 1:
        raise PosencError(
            f"the training documents of {cfg.corpus} have {len(ids)} tokens, too few for --length {cfg.length}"
        )
    return np.asarray(ids, dtype=np.int64)


def check_dependencies(cfg: FinetuneConfig) -> None:
    """PosencError naming every missing package of posenc[pretrained] this run needs (peft only for LoRA)."""
    missing = []
    for name in ("transformers", "gguf", "accelerate", *(("peft",) if cfg.lora_rank else ())):
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise PosencError(
            f"posenc finetune needs {', '.join(missing)}: pip install 'posenc[pretrained]'"
            + (" (or --lora-rank 0: no peft)" if missing == ["peft"] else "")
        )


def adapt(model, cfg: FinetuneConfig) -> tuple[Adaptation, str]:
    """Put ``cfg``'s scheme or RoPE schedule into ``model`` (seeded by ``cfg.seed``); returns the adaptation and its
    report label."""
    torch.manual_seed(cfg.seed)
    adapted = Adaptation(model)
    if cfg.scheme:
        adapted.set_scheme(cfg.scheme)
        return adapted, extend.SCHEME_LABEL + cfg.scheme
    adapted.set_schedule(extend.extension(cfg, cfg.schedule))  # keeps the base RoPE, as extend does
    return adapted, cfg.schedule


def trainable(model, cfg: FinetuneConfig) -> dict[str, torch.nn.Parameter]:
    """Mark what trains and return it by name: LoRA adapters (``peft``, seeded by ``cfg.seed``; the base frozen)
    and the scheme's own parameters (``self_attn.posenc``), or every parameter when ``lora_rank`` is 0.
    Raises PosencError when peft is missing or a LoRA target names no module of the model."""
    if cfg.lora_rank == 0:
        model.requires_grad_(True)
    else:
        try:
            from peft import LoraConfig, inject_adapter_in_model  # optional dependency (posenc[pretrained])
        except ImportError:
            raise PosencError("LoRA needs peft: pip install 'posenc[pretrained]' (or --lora-rank 0)") from None
        modules = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
        missing = [t for t in cfg.lora_targets if t not in modules]
        if missing:
            raise PosencError(
                f"no module of the model is named {', '.join(missing)} (LoRA targets in a Llama-family "
                "model: q_proj, k_proj, v_proj, o_proj; MLP: gate_proj, up_proj, down_proj)"
            )
        torch.manual_seed(cfg.seed)
        lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=0.0, target_modules=cfg.lora_targets)
        try:
            inject_adapter_in_model(lora, model)  # in place; freezes every other weight
        except ValueError as exc:
            raise PosencError(
                f"peft cannot put LoRA on {', '.join(cfg.lora_targets)} (give Linear layers): "
                f"{str(exc).splitlines()[0][:120]}"
            ) from None
        for name, p in model.named_parameters():
            if ".posenc." in name:  # new parameters of the scheme: trained in full
                p.requires_grad_(True)
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def _settings(cfg: FinetuneConfig) -> dict:
    return {k: v for k, v in cfg.model_dump().items() if k not in RESUME_FREE}


def check_resumable(out: Path, cfg: FinetuneConfig) -> None:
    """Raise PosencError when ``out`` holds a run trained with other settings than ``cfg``'s (only
    ``RESUME_FREE`` keys may change), or is a directory with files but no ``finetune.json`` (other runs,
    as ``--out runs`` would be: ``--out`` is the run directory itself, as extend's and train's are), or cannot be
    made a directory (a file in the way: ``check_run_dir``)."""
    check_run_dir(out)
    if not (out / SETTINGS).exists():
        if out.is_dir() and run_files(out):  # its lock file (posenc.store.lock) is no run's
            raise PosencError(
                f"{out} holds files but no finetune run ({SETTINGS}); --out is the run directory itself: "
                "give a new or empty one (default runs/finetune/<name>)"
            )
        return
    old = read_json(out / SETTINGS)
    diff = [
        f"{k} {old.get(k)!r} -> {v!r}" for k, v in json.loads(json.dumps(_settings(cfg))).items() if old.get(k) != v
    ]
    if diff:
        raise PosencError(f"cannot resume {out}: its settings differ ({'; '.join(diff)}); use another --name or --out")


def trained_state(model, params: dict) -> dict[str, torch.Tensor]:
    """The tensors a resume needs, by name: ``params`` and every buffer of the schemes (among them the
    random-draw counter of ``acc-rand-*``, so a resumed run draws the angles an uninterrupted one would)."""
    buffers = {name: b for name, b in model.named_buffers() if ".posenc." in name}
    return {**{k: p.detach() for k, p in params.items()}, **buffers}


LOG_FIELDS = ("step", "loss", "lr", "grad_norm", "seconds")  # a train.jsonl record
POSE_STREAM = 2  # PoSE's generator is seeded (seed, step, 2): a stream apart from the batch's (seed, step)


def pose_position_ids(length: int, target: int, chunks: int, seed: int, step: int) -> torch.Tensor:
    """PoSE's position ids of one training sequence (Zhu et al. 2024, "PoSE: Efficient Context Window Extension of
    LLMs via Positional Skip-wise Training", arXiv:2309.10400, sec. 3.2): the ``length`` tokens are cut into
    ``chunks`` consecutive chunks at cut points drawn uniformly, and chunk c is shifted by a skipping bias u_c,
    u_0 = 0 and u_c ~ U{u_(c-1), ..., target - length}, so its positions are its offsets in the sequence plus u_c:
    increasing, the first 0, the last below ``target``. (length,) int64, drawn from (seed, step): a resumed run
    draws what it would have. PosencError if target < length or chunks is not in [1, length]."""
    if target < length or not 1 <= chunks <= length:
        raise PosencError(
            "PoSE needs target >= length and 1 <= chunks <= length, "
            f"got target {target}, length {length}, chunks {chunks}"
        )
    rng = np.random.default_rng([seed, step, POSE_STREAM])
    cuts = np.sort(rng.choice(np.arange(1, length), size=chunks - 1, replace=False)) if chunks > 1 else []
    bounds, u, ids = [0, *cuts, length], 0, np.arange(length)
    for c in range(1, chunks):
        u = int(rng.integers(u, target - length, endpoint=True))
        ids[bounds[c] :] = np.arange(bounds[c], length) + u
    return torch.from_numpy(ids)


def train_steps(
    model, params: dict, stream: np.ndarray, cfg: FinetuneConfig, out: Path, tracker: Tracker = NO_TRACKER
) -> None:
    """Train ``params`` of ``model`` up to ``cfg.steps`` with posenc's loop (``posenc.train.loop.fit``), resuming from
    ``out``.

    Each step's batch is ``posenc.train.batches.batch_at`` of (seed, step); the loss is the mean next-token NLL
    (nats), logged every step. The checkpoint (``state.pt``, ``trained.safetensors``) holds
    :func:`trained_state`. Raises PosencError on a non-finite loss or gradient norm, naming the step;
    Ctrl-C checkpoints and raises KeyboardInterrupt saying where."""
    make_run_dir(out)
    state = trained_state(model, params)  # views of the model's tensors: always current
    ckpt = Checkpoint(out, lambda: state, make_optimizer(model, cfg), key="trained", weights=WEIGHTS)
    step = ckpt.load()
    if step:
        progress.note(
            f"posenc: {out} is already fine-tuned (step {step} of {cfg.steps}): training skipped"
            if step >= cfg.steps
            else f"posenc: resuming {out} at step {step} of {cfg.steps}"
        )

    def loss_at(step: int) -> tuple[torch.Tensor, int]:
        x, y = batch_at(stream, step, cfg.batch_size, cfg.length, cfg.seed)
        pose = (
            {}
            if cfg.pose_target is None
            else {
                "position_ids": pose_position_ids(cfg.length, cfg.pose_target, cfg.pose_chunks, cfg.seed, step).expand(
                    x.shape[0], -1
                )
            }
        )  # one draw per step
        logits = model(input_ids=x, use_cache=False, **pose).logits
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten()), x.numel()

    fit(model, cfg, loss_at, ckpt, step, log_fields=LOG_FIELDS, tracker=tracker, desc="finetune")
    model.eval()


def load_finetuned(run_dir: Path) -> tuple[loading.Loaded, Adaptation, str]:
    """The model of finetune run ``run_dir`` as its last checkpoint holds it, in eval mode: loaded as its
    ``finetune.json`` says, its scheme or RoPE schedule put in (:func:`adapt`), LoRA adapters injected
    (:func:`trainable`), then the checkpoint's tensors (``trained.safetensors``: :func:`trained_state`) copied in.
    Returns (the loaded model and tokenizer, the adaptation with ``weights`` set, its label: ``scheme:SPEC, fine-tuned
    N steps``, or ``N of M steps`` for a run that has not finished training). Raises PosencError for a missing or
    invalid ``finetune.json``, a missing dependency, a run with no checkpoint yet, tensors that are not the
    run's, and as ``posenc.hf.loading.load``."""
    run_dir = Path(run_dir)
    path = run_dir / SETTINGS
    if not path.exists():
        raise PosencError(f"{run_dir} is not a finetune run (no {SETTINGS})")
    cfg = validated(FinetuneConfig, {**read_json(path), "name": run_dir.name}, str(path))
    check_config(cfg)
    check_dependencies(cfg)
    weights, state = run_dir / WEIGHTS, run_dir / "state.pt"
    if not (weights.exists() and state.exists()):
        raise PosencError(
            f"{run_dir} is a finetune run without a checkpoint yet (no {WEIGHTS}): "
            "rerun its posenc finetune command to resume it"
        )
    step = int(load_torch(state, mmap=True)["step"])
    loaded = loading.load(cfg.model)
    adapted, label = adapt(loaded.model, cfg)
    live, saved = trained_state(loaded.model, trainable(loaded.model, cfg)), load_tensors(weights)
    if set(saved) != set(live) or any(saved[k].shape != t.shape for k, t in live.items() if k in saved):
        raise PosencError(f"{weights} does not hold the tensors of the model {SETTINGS} describes (its model changed?)")
    with torch.no_grad():
        for name, t in live.items():
            t.copy_(saved[name])
    loaded.model.requires_grad_(False).eval()
    tuned = tuned_label(label, step, cfg.steps)
    adapted.weights = _weights_label(tuned, cfg)
    return loaded, adapted, tuned


def tuned_label(label: str, step: int, steps: int) -> str:
    """The report's label of adaptation ``label`` trained ``step`` of ``steps`` steps: ``LABEL, fine-tuned N steps``
    (``N of M steps`` before the end)."""
    return f"{label}, fine-tuned {step} steps" if step >= steps else f"{label}, fine-tuned {step} of {steps} steps"


def _weights_label(tuned: str, cfg: FinetuneConfig) -> str:
    """``Adaptation.weights`` of a fine-tuned model: its label and training settings (no reuse of other weights'
    scores)."""
    return tuned + " " + json.dumps(_settings(cfg), sort_keys=True)


def finetune(cfg: FinetuneConfig, out: Path | None = None, log: str = "none") -> tuple[Path, str]:
    """Score, train and score again the adapted model of ``cfg``; returns the run directory and the report's markdown.

    ``out``: the run directory (default ``runs/finetune/<cfg.name>``). ``log``: a tracker kind
    (``posenc.train.tracking``) for the training steps and both scorings (at step 0 and at ``steps``). Raises
    PosencError, before ``out`` is touched, for a missing dependency (transformers, gguf, accelerate; peft for LoRA), a
    run directory of other settings or a directory of other files, everything ``posenc extend`` refuses, a corpus too
    short for ``length`` or a bad LoRA target; later, for a non-finite loss."""
    check_config(cfg)
    check_dependencies(cfg)
    check_kind(log)
    out = Path(out or Path("runs") / "finetune" / cfg.name)
    check_resumable(out, cfg)  # a run of other settings is refused before the model loads
    hold_run_dir(out)  # an existing one held before its records are read (posenc.store.lock)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    ecfg = eval_config(cfg)
    documents = extend.held_out(ecfg)  # a bad document name fails before the model loads
    loaded = loading.load(cfg.model)
    l0, docs, plan, bos_id = extend.eval_inputs(ecfg, loaded, documents)
    stream = train_stream(cfg, loaded.tokenizer)
    model, tok = loaded.model, loaded.tokenizer
    adapted, label = adapt(model, cfg)
    params = trainable(model, cfg)  # LoRA starts at zero: the model is unchanged until it trains
    open_run_dir(out)
    write_json(
        out / SETTINGS, _settings(cfg)
    )  # first: it marks out as this run's, also when the first scoring is interrupted
    store = extend.open_store(out, ecfg, docs, l0, loaded.source)
    tuned = tuned_label(label, cfg.steps, cfg.steps)
    with open_tracker(log, out, cfg.name, "finetune", {"finetune": cfg.model_dump(), "stamp": run_stamp()}) as tracker:
        extend.measure(
            adapted, tok, label, cfg.eval_lengths, plan, dict(docs), store, ecfg, bos_id
        )  # before any training
        tracker.log(scores(store.records, label), 0)
        train_steps(model, params, stream, cfg, out, tracker)
        adapted.weights = _weights_label(tuned, cfg)  # no reuse of the scores before
        with torch.no_grad():
            extend.measure(adapted, tok, tuned, cfg.eval_lengths, plan, dict(docs), store, ecfg, bos_id)
        tracker.log(scores(store.records, tuned), cfg.steps)
    log = read_log(out / "train.jsonl")
    report.plot_loss(out, log, tuned)
    header = _header(cfg, label, l0, params, log)
    return out, report.write_report(out, store.records, [label, tuned], header)


def scores(records: list[ScoredWindow | PasskeyTrial], label: str) -> dict[str, float]:
    """Tracker metrics of one scoring (``label``) in extend's records: ``eval/ppl@L`` (exp of the summed NLL over
    the scored tokens of every window of length L) and ``eval/passkey@L`` (fraction of trials correct)."""
    nll: dict[int, list[float]] = {}
    keys: dict[int, list[int]] = {}
    for r in records:
        if r.adaptation == label and isinstance(r, ScoredWindow):
            cell = nll.setdefault(r.length, [0.0, 0])
            cell[0] += r.nll_sum
            cell[1] += r.n_scored
        elif r.adaptation == label and isinstance(r, PasskeyTrial):
            keys.setdefault(r.length, []).append(r.correct)
    return {
        **{f"eval/ppl@{L}": math.exp(s / n) for L, (s, n) in nll.items() if n},
        **{f"eval/passkey@{L}": sum(v) / len(v) for L, v in keys.items()},
    }


def _header(cfg: FinetuneConfig, label: str, l0: int, params: dict, log: list[dict]) -> str:
    """The report's first lines: model, adaptation, what trained, time and loss."""
    n = sum(p.numel() for p in params.values())
    what = f"LoRA rank {cfg.lora_rank} on {', '.join(cfg.lora_targets)}" if cfg.lora_rank else "every weight"
    k = max(1, len(log) // 10)
    loss = (
        (
            f"mean loss of the first {k} step(s) {np.mean([r['loss'] for r in log[:k]]):.3f}, "
            f"of the last {k} {np.mean([r['loss'] for r in log[-k:]]):.3f}"
        )
        if log
        else "no steps logged"
    )
    return (
        f"# posenc finetune: {cfg.model} (native context {l0}) with {label}\n\n"
        f"Trained {cfg.steps} steps of {cfg.batch_size} x {cfg.length} tokens of {cfg.corpus} ({what}, "
        f"{n:,} trained parameters, lr {cfg.lr:g}): {sum(r['seconds'] for r in log):.0f} s of training; {loss}.\n\n"
        f"Scored on held-out text as `posenc extend` scores: {', '.join(d for d in cfg.docs)}, "
        f"{cfg.eval_windows or 'all'} window(s) per length, BOS policy {cfg.bos}."
    )


def model_kind(spec: str) -> str:
    """What MODEL names: ``train`` (a directory whose config.json has posenc's model and train sections), ``finetune``
    (a directory with ``finetune.json``) or ``pretrained`` (anything else ``posenc.hf.loading`` takes: a model
    directory with config.json, a .gguf file, 'smollm2', a hub id; a missing path is its error). PosencError for a
    directory that is none of these (one holding a .gguf file: name the file, ``posenc.hf.loading.unnamed_gguf``)."""
    path = Path(spec).expanduser()
    if not path.is_dir():
        return "pretrained"
    if (path / SETTINGS).exists():
        return "finetune"
    if (path / "preset.json").exists():  # as load_run says it
        raise PosencError(f"{spec} is a posenc compare run: give one of its models (a SCHEME/seedN folder in it)")
    config = path / "config.json"
    refuse_broken_link(config, "point it at the model's file")
    if config.exists():
        cfg = read_json(config)
        return "train" if isinstance(cfg, dict) and "model_type" not in cfg and "train" in cfg else "pretrained"
    raise PosencError(
        f"{spec} is neither a posenc train run (config.json, model.safetensors), a posenc finetune run "
        f"({SETTINGS}) nor a model directory (config.json)" + loading.unnamed_gguf(path)
    )
