"""The training loop (:func:`fit`: AdamW, warmup + cosine, gradient clipping, atomic checkpoints, resume)
and the training of posenc's LMs on it (:func:`train`); ``posenc.jobs.finetune`` trains pretrained models on it.

A run directory holds ``config.json`` (model + training config, and the stamp of the invocation
that last wrote it: ``posenc.store.stamp``),
``model.safetensors`` (weights), ``state.pt`` (the resume point: weights, optimizer state and
step in one atomically written file: ``posenc.train.resume``) and
``train.jsonl`` (one record per logged step). Batches are a pure function of
(seed, step) (``posenc.train.batches``), so a resumed run sees exactly the batches an uninterrupted run
would.

Under ``torchrun --nproc_per_node N`` the same loop runs data-parallel
(``posenc.train.distributed``): rank r trains on its rows of each global batch,
gradients are averaged by DistributedDataParallel, the logged loss is the mean
over ranks, and only rank 0 writes. ``train.precision`` sets the forward's compute dtype
(``posenc.train.precision``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch

from posenc import encodings
from posenc.data.corpora import TokenData, load_tokens
from posenc.errors import PosencError
from posenc.eval import progress
from posenc.eval.tasks import id_accuracy
from posenc.model import LM, ModelConfig, check_batch_fits, check_fits
from posenc.store.checkpoint import append_jsonl, read_json, write_json
from posenc.store.lock import open_run_dir
from posenc.store.stamp import run_stamp
from posenc.train import distributed
from posenc.train.batches import check_positions, check_trainable, mean_loss, training_batch, training_positions
from posenc.train.curves import loss_curve, loss_trend
from posenc.train.optimizer import lr_at, make_optimizer
from posenc.train.precision import autocast, resolve_precision
from posenc.train.resume import Checkpoint, checkpoint_step, read_log, truncate_log
from posenc.train.rundir import check_resume, finished_at, is_trained
from posenc.train.settings import LoopConfig, TrainConfig
from posenc.train.signals import StopNow, ctrl_c_between_steps
from posenc.train.tracking import NO_TRACKER, Tracker


@dataclasses.dataclass
class Criterion:
    """What :func:`fit` checks every ``every`` steps (at steps ``every``, ``2 every``, ..., the cap included):
    ``measure(step)`` gives the metric (``name`` in the line that announces a stop), the run stops once it is
    >= ``at_least``."""

    every: int
    at_least: float
    measure: Callable[[int], float]
    name: str = "criterion"


LOG_FIELDS = ("step", "loss", "loss_window", "lr", "grad_norm", "tokens_per_s")  # a train.jsonl record


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
    (step, loss in nats (the mean over ranks), loss_window (the mean of every step's loss since the previous
    logged step, or since the resume), lr, grad_norm, tokens_per_s, seconds of the step) to
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
    PosencError (one line) for an ``end`` below ``step``. A fresh run whose ``warmup`` exceeds ``cfg.steps`` says in
    one line that its rate never reaches ``lr``.
    """
    end = cfg.steps if end is None else end
    if end < step:
        raise PosencError(f"fit: end step {end} is before the start step {step}")
    run_dir, log = ckpt.run_dir, ckpt.run_dir / "train.jsonl"
    params = [p for p in model.parameters() if p.requires_grad]
    if shard.is_main:
        truncate_log(log, step)
        if criterion is not None:
            truncate_log(run_dir / "until.jsonl", step - 1, "value")  # the check at ``step`` is redone below
    if shard.is_main and step == 0 and cfg.warmup > cfg.steps:  # said, not refused: a short test run keeps its preset
        progress.note(
            f"{desc}: warmup {cfg.warmup} > steps {cfg.steps}: the learning rate rises for the whole run and never "
            f"reaches lr {cfg.lr:g}"
        )
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
    window = []  # every step's loss since the last logged step (its mean: the record's loss_window)
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
                window.append(loss_all)
                step += 1
                tokens_seen += tokens * shard.world
                tps = tokens_seen / max(1e-9, time.time() - t0)
                bar.set_postfix(loss=f"{loss_all:.3f}", tok_s=f"{tps:,.0f}", refresh=False)  # update redraws
                bar.update(1)
                if shard.is_main and (step % log_every == 0 or step == end):
                    rec = {
                        "step": step,
                        "loss": loss_all,
                        "loss_window": math.fsum(window) / len(window),
                        "lr": lr_at(step - 1, cfg),
                        "grad_norm": gnorm,
                        "tokens_per_s": tps,
                        "seconds": round(time.time() - t_step, 3),
                    }
                    append_jsonl(log, {k: rec[k] for k in log_fields})
                    window.clear()
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


class _TokenNLL(torch.nn.Module):
    """forward(x, y) = the LM's per-token NLL: the call DistributedDataParallel wraps."""

    def __init__(self, lm: LM):
        super().__init__()
        self.lm = lm

    def forward(self, x: torch.Tensor, y: torch.Tensor, pos: torch.Tensor | None = None) -> torch.Tensor:
        return self.lm.token_nll(x, y, pos=pos)


def use_threads(tcfg: TrainConfig) -> None:
    """Set torch's intra-op threads to ``tcfg.threads`` (0: leave them as they are): training, and a job that only
    evaluates a model trained earlier, run at the thread count the run records (it changes learned results)."""
    if tcfg.threads:
        torch.set_num_threads(tcfg.threads)


def check_model_seed(mcfg: ModelConfig, tcfg: TrainConfig) -> None:
    """PosencError unless ``mcfg.seed`` is 0 (unset) or the training seed: training sets it from ``train.seed``, so
    another value would be silently replaced (``train`` and its dry run check it)."""
    if mcfg.seed not in (0, tcfg.seed):
        raise PosencError(
            f"model.seed is the training seed's (train.seed {tcfg.seed}); got {mcfg.seed}: set train.seed"
        )


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
    (one line) for a checkpoint past the last step the settings allow, a model or batch too large for the machine
    (``posenc.model.check_fits``, ``check_batch_fits``: before ``run_dir`` is made), and, in a command's scope,
    a ``run_dir`` another posenc process holds (``posenc.store.lock``).
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
    check_model_seed(mcfg, tcfg)
    # every random draw of the run comes from its seed: the weights, the batches, the scheme's own draws
    mcfg = dataclasses.replace(mcfg, vocab_size=data.vocab_size, seed=tcfg.seed)
    check_trainable(data, mcfg, tcfg)
    check_fits(mcfg)  # before the folder: a model too large for the machine leaves nothing behind
    # a batch too large for the device: refused in a line, not killed for memory
    check_batch_fits(mcfg, tcfg.batch_size, rows.stop - rows.start, shard.device)
    if shard.is_main:  # after the corpus loads, so bad input leaves no empty run directory
        open_run_dir(run_dir)  # held by this process in a command's scope (posenc.store.lock)
    torch.manual_seed(tcfg.seed)
    model = LM(mcfg).to(shard.device)  # before the optimizer, so its state lives on the device
    # the weights name the model and data they belong to: load_run refuses a config.json edited since
    # (check_weights_config)
    # one header key: safetensors writes several in a hash map's order, and the file's bytes would vary between runs
    trained = {"model": dataclasses.asdict(mcfg), "data": {"corpus": tcfg.corpus, "tokenizer": tcfg.tokenizer}}
    trained_as = {"trained_as": json.dumps(trained)}
    ckpt = Checkpoint(run_dir, model.state_dict, make_optimizer(model, tcfg), metadata=trained_as)
    step = 0
    if resume and (run_dir / "state.pt").exists():
        check_resume(run_dir, mcfg, tcfg, checkpoint_step(run_dir))  # before the load: other tensors would not fit
        read_log(run_dir / "train.jsonl")  # a damaged log refused before config.json is rewritten
        read_log(run_dir / "until.jsonl", "value")
        step = ckpt.load()
        if is_trained(run_dir) and finished_at(read_json(run_dir / "train_summary.json"), step, tcfg):
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
                "tokenizer": getattr(getattr(data, "tokenizer", None), "fingerprint", None),  # run_tokens checks it
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


def _still_falling(log: Path, cap: int) -> str | None:
    """Why a run unmet at its cap ``cap`` trains on: its training loss still falling there (the words of
    ``posenc.train.curves.Trend.falling_at``, from the losses logged in ``log`` at steps <= ``cap``); None when it is
    not (or too few steps were logged to tell)."""
    trend = loss_trend(loss_curve([r for r in read_log(log) if r["step"] <= cap]))
    return trend.falling_at(cap) if trend is not None and trend.falling else None
