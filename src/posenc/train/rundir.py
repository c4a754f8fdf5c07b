"""A trained run's directory read back: its ``config.json`` (:func:`read_run_config`, with the scheme plugins it needs:
:func:`check_plugins`), its model (:func:`load_run`; :func:`load_text_run` for a command that reads text), whether it
is finished (:func:`is_trained`, :func:`finished_at`) and whether it was trained with given settings
(:func:`run_differences`; :func:`check_same_run` and :func:`check_resume` on resume, :func:`check_trained_as` for a
job that expects them)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from posenc import encodings
from posenc.data.corpora import load_tokens
from posenc.data.tasks import is_task
from posenc.errors import PosencError
from posenc.eval import progress
from posenc.model import LM, ModelConfig
from posenc.store.checkpoint import load_weights, read_json, refuse_broken_link, tensors_metadata
from posenc.store.presets import validated
from posenc.train import distributed
from posenc.train.precision import machine_precision, unrecorded_precision
from posenc.train.resume import checkpoint_step
from posenc.train.settings import TrainConfig


def read_run_config(run_dir: Path) -> dict:
    """A run's config.json; PosencError naming it when damaged, without its model/train sections, or with a
    ``plugins`` entry that is not {"module": name, "file": path or null}."""
    path = Path(run_dir) / "config.json"
    cfg = read_json(path)
    if not all(isinstance(cfg.get(k), dict) for k in ("model", "train")):
        raise PosencError(f"{path} is damaged: it needs 'model' and 'train' sections")
    plugins = cfg.get("plugins", [])
    if not (isinstance(plugins, list) and all(_is_plugin(p) for p in plugins)):
        raise PosencError(f"{path} is damaged: 'plugins' must be a list of {{module, file}} entries")
    return cfg


def _is_plugin(entry: object) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("module"), str)
        and isinstance(entry.get("file"), (str, type(None)))
    )


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
    if not run_dir.exists():
        raise PosencError(f"run directory {run_dir} does not exist")
    if (run_dir / "preset.json").exists():  # a compare run: its models are one folder per scheme and seed
        raise PosencError(f"{run_dir} is a posenc compare run: give one of its models (a SCHEME/seedN folder in it)")
    for name in ("config.json", "model.safetensors"):
        refuse_broken_link(run_dir / name, "point it at the run's file")
    if not (run_dir / "config.json").exists() or not (run_dir / "model.safetensors").exists():
        raise PosencError(f"{run_dir} has no checkpoint (config.json + model.safetensors)")
    cfg = read_run_config(run_dir)
    check_plugins(run_dir, cfg)
    path = run_dir / "config.json"
    mcfg, tcfg = (
        validated(ModelConfig, cfg["model"], f"model section of {path}"),
        validated(TrainConfig, cfg["train"], f"train section of {path}"),
    )
    try:
        model = LM(mcfg)
    except PosencError as exc:  # a scheme or setting this posenc cannot build: the file that asked for it
        raise PosencError(f"{path}: {exc}") from None
    check_weights_config(run_dir, cfg["model"], cfg.get("train", {}))
    load_weights(run_dir / "model.safetensors", model)
    return model.to(distributed.default_device()), mcfg, tcfg


def check_weights_config(run_dir: Path, model: dict, train: dict) -> None:
    """PosencError when ``model`` (config.json's model section) differs from the model config ``model.safetensors``
    was saved with (its header's ``trained_as``, ``model`` in older runs: a config.json edited after training, say
    another encoding, would evaluate the weights under a scheme they never learned), or ``train``'s corpus or
    tokenizer from the corpus and tokenizer it records (an edited corpus would be scored as the run's held-out text);
    speed knobs (``MODEL_KNOBS``) may differ. Weights saved without them (older runs) are not checked."""
    header = tensors_metadata(run_dir / "model.safetensors")
    saved = (
        json.loads(header["trained_as"]) if "trained_as" in header else {"model": json.loads(header.get("model", "{}"))}
    )
    trained = {f"model.{k}": v for k, v in saved["model"].items() if k not in MODEL_KNOBS}
    trained |= {f"train.{k}": v for k, v in saved.get("data", {}).items()}  # weights saved before it: model only
    now = {
        **{f"model.{k}": v for k, v in {**MODEL_ADDED, **model}.items()},
        **{f"train.{k}": v for k, v in train.items()},
    }
    diff = [f"{k} {now.get(k)!r} (trained {v!r})" for k, v in trained.items() if now.get(k) != v]
    if diff:
        raise PosencError(
            f"{run_dir / 'config.json'} differs from what its weights were trained as: {', '.join(diff)}; restore it "
            "(evaluation settings, such as another corpus, go on the command line)"
        )


def load_text_run(run_dir: Path, command: str) -> tuple[LM, ModelConfig, TrainConfig]:
    """:func:`load_run` of a run trained on text, for ``command`` (its name, for the message), which reads text with
    the run's tokenizer. PosencError (one line) for a run trained on a synthetic task: its vocabulary is the task's
    tokens, and a task preset of ``posenc compare`` scores it. An unfinished run (no ``train_summary.json``: stopped
    before its last step) is read from its last checkpoint, said in one line on stderr with that step."""
    model, mcfg, tcfg = load_run(run_dir)
    if is_task(tcfg.corpus):
        raise PosencError(
            f"{run_dir} was trained on the synthetic task {tcfg.corpus!r} (a vocabulary of task tokens); posenc "
            f"{command} reads text runs: a task run is scored by posenc compare with a task preset"
        )
    if not is_trained(run_dir):
        step = (
            f"step {checkpoint_step(run_dir)}" if (run_dir / "state.pt").exists() else "an unknown step (no state.pt)"
        )
        progress.note(
            f"posenc {command}: {run_dir} is unfinished: its weights are the checkpoint of {step} of {tcfg.steps} "
            "(rerun what trained it to resume: posenc train --resume, or its posenc compare)"
        )
    return model, mcfg, tcfg


def run_tokens(run_dir: Path, tcfg: TrainConfig, corpus: str | None = None):
    """The token data of ``corpus`` (default: the run's training corpus) under the run's tokenizer
    (``posenc.data.corpora.load_tokens``). PosencError when the run recorded its tokenizer (config.json's
    ``tokenizer``: byte, or a BPE's size and merges) and this one differs: a BPE is built from the corpus it reads,
    so a corpus edited since training, or another corpus, would give token ids the model never learned."""
    data = load_tokens(corpus or tcfg.corpus, tcfg.tokenizer)
    recorded = read_run_config(run_dir).get("tokenizer")
    if recorded is not None and recorded != data.tokenizer.fingerprint:
        source = f"corpus {corpus}" if corpus and corpus != tcfg.corpus else f"its corpus {tcfg.corpus} as it is now"
        raise PosencError(
            f"{run_dir} was trained with another {tcfg.tokenizer} tokenizer than {source} builds (other merges: other "
            "token ids); score it on its training corpus as it was, or train a run on this one"
        )
    return data


RESUME_FREE = {"steps", "time_budget", "ckpt_every", "log_every", "threads", "compile"}  # may change on resume
MODEL_KNOBS = {"attn_block_size"}  # model fields of speed and memory only: a trained run may be evaluated under another
# a config.json without one of these model fields built its model as this value does (compared so on resume)
MODEL_ADDED = {"canon": 0, "seed": 0}
UNTIL_ADDED = {"extend_to": None}  # likewise for train.until's fields


def run_differences(run_dir: Path, mcfg: ModelConfig, tcfg: TrainConfig) -> dict[str, list[str]]:
    """{"model" | "training": ["field recorded -> given", ...]}: where the run in ``run_dir`` (its config.json) was
    trained with other settings than ``mcfg`` and ``tcfg`` (precision as resolved), the fields that may change on
    resume (``RESUME_FREE``) excepted; empty when none differs."""
    saved = read_run_config(run_dir)
    old_train = {"precision": unrecorded_precision(), **saved["train"]}
    if isinstance(old_train.get("until"), dict):
        old_train["until"] = {**UNTIL_ADDED, **old_train["until"]}
    out = {}
    # the model's seed is the training seed's (train: compared there); without the field it is MODEL_ADDED's 0
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


def check_same_run(run_dir: Path, mcfg: ModelConfig, tcfg: TrainConfig) -> None:
    """Raise PosencError when the run in ``run_dir`` was trained with another model or training config.

    Resuming continues the same loss curve: only the step count, time budget, checkpoint
    and log intervals and CPU threads may change.
    """
    for section, diff in run_differences(run_dir, mcfg, tcfg).items():
        raise PosencError(f"cannot resume {run_dir}: its {section} differs ({'; '.join(diff)}); use another --out")


def check_resume(run_dir: Path, mcfg: ModelConfig, tcfg: TrainConfig, step: int) -> None:
    """PosencError (one line) when the run in ``run_dir``, checkpointed at ``step``, cannot be resumed with ``mcfg``
    and ``tcfg``: other settings (:func:`check_same_run`) or more steps trained than the settings allow."""
    check_same_run(run_dir, mcfg, tcfg)
    if step > tcfg.last_step():
        most = "steps" if tcfg.last_step() == tcfg.steps else "until.extend_to"
        raise PosencError(f"cannot resume {run_dir}: it has trained {step} steps, more than {most}={tcfg.last_step()}")


def check_trained_as(
    run_dir: Path, mcfg: ModelConfig, tcfg: TrainConfig, what: str, fix: str = "move it away or use another --out"
) -> None:
    """Raise PosencError (one line naming each differing field) when the run in ``run_dir`` (if any: its config.json)
    was not trained with ``mcfg`` and ``tcfg`` (precision "auto" as this machine resolves it), the fields that may
    change on resume and the model's speed knobs (``MODEL_KNOBS``) excepted, or, finished, trained another number of
    steps than ``tcfg.steps`` (fewer only by meeting ``train.until`` or under a ``time_budget``, more only to the
    extension its summary records: ``train.until.extend_to``). ``what`` names who expects these settings (a sweep's
    job); ``fix`` ends the message."""
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
        if steps != tcfg.steps and not early and steps != extended_to(summary):
            diff.append(f"trained steps {steps!r} -> {tcfg.steps!r}")
    if diff:
        raise PosencError(f"{run_dir} was not trained with the settings of {what} ({'; '.join(diff)}); {fix}")


def finished_at(summary: dict, step: int, tcfg: TrainConfig) -> bool:
    """Whether a run whose summary is ``summary`` and whose checkpoint is at ``step`` is done under ``tcfg``: it
    reached the cap (the end of its extension when its summary records one: ``train.until.extend_to``), or it met its
    criterion at that step (it stays stopped, even under a larger cap)."""
    reached = (summary.get("until") or {}).get("reached")
    end = extended_to(summary) or tcfg.steps
    return summary.get("steps") == step and (step == end or (tcfg.until is not None and reached == step))


def extended_to(summary: dict) -> int | None:
    """The step a run's summary says it trains on to past its cap (``train.until.extend_to``); None: not extended."""
    return ((summary.get("until") or {}).get("extended") or {}).get("to")


def steps_to_criterion(summary: dict) -> int | None:
    """The step a run's summary (``train_summary.json``) says it met ``train.until`` at; None when not met."""
    return (summary.get("until") or {}).get("reached")


def is_trained(run_dir: Path) -> bool:
    """True when ``run_dir`` holds a finished run (its summary is written last)."""
    return (Path(run_dir) / "train_summary.json").exists()
