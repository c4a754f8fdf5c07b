"""The main job: train one model per scheme under one budget, evaluate, report.

``compare(preset)`` trains each scheme (and seed) into ``runs/<name>/<scheme>/seed<k>``,
evaluates perplexity at every length of the preset, appends one record per
evaluation to ``runs/<name>/results.jsonl`` and writes the report. Rerunning
skips finished trainings and evaluations and resumes interrupted ones.

Each (scheme, seed) is a job in its own spawned process (``isolate=True``), so
a scheme that raises, produces NaN, segfaults or is killed for memory is
reported as failed with a one-line error (full traceback in
``<scheme>/seed<k>.error.txt``) and the other schemes' results are kept.
Schemes registered outside posenc reach the job process by importing the
module that defines them.
"""

from __future__ import annotations

import importlib
import importlib.resources
import multiprocessing
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Annotated, Any, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from posenc import encodings
from posenc.checkpoint import append_jsonl, atomic_write_bytes, make_run_dir, read_json, read_jsonl, write_json
from posenc.data import load_tokens
from posenc.diagnose import FarMassConfig, compare_extras, extras_pending
from posenc.errors import PosencError
from posenc.evaluate import eval_lengths, evaluate_length
from posenc.model import ModelConfig, is_rope, with_rope_schedule
from posenc.passkey import PasskeyConfig
from posenc.report import write_report
from posenc.rope import check_window, schedule_params
from posenc.train import TrainConfig, is_trained, load_run, train

PRESETS = importlib.resources.files("posenc") / "configs"  # package data: works from a wheel too


class EvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    multiples: list[int] = [1, 2, 4, 8, 16, 32, 64]
    max_tokens: int = Field(32768, gt=0)  # targets scored per length (fewer windows at long lengths)
    batch_tokens: int = Field(8192, gt=0)
    passkey: PasskeyConfig = PasskeyConfig()  # passkey retrieval cells (posenc.passkey)
    far_mass: FarMassConfig = FarMassConfig()  # the cheap diagnose pass (posenc.diagnose)


class Preset(BaseModel):
    """A comparison: model, training budget, evaluation and the schemes to run."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    model: ModelConfig
    train: TrainConfig
    eval: EvalConfig = EvalConfig()
    schemes: list[str] = Field(min_length=1)
    seeds: list[Annotated[int, Field(ge=0)]] = Field([0], min_length=1)
    # RoPE context-extension rows evaluated after the plain rows on every trained RoPE
    # scheme, e.g. {schedule: yarn, factor: 8} -> row "rope+yarn(s=8)" (posenc.rope)
    eval_schedules: list[dict[str, Any]] = []

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str) -> str:  # the run directory under --out, never outside it
        if not v or v in (".", "..") or not all(c.isalnum() or c in "._-" for c in v):
            raise ValueError(f"must be a plain directory name (letters, digits, . _ -), got {v!r}")
        return v


def preset_names() -> list[str]:
    return sorted(p.name.removesuffix(".yaml") for p in PRESETS.iterdir() if p.name.endswith(".yaml"))


def load_preset(name_or_path: str, overrides: Optional[dict[str, Any]] = None) -> Preset:
    """A preset by name (posenc/configs/NAME.yaml, package data) or path; ``overrides`` replace top-level keys.

    Raises PosencError for an unknown preset, invalid YAML or invalid values.
    """
    path = Path(name_or_path)
    if not path.suffix:
        path = PRESETS / f"{name_or_path}.yaml"
    if not path.is_file():
        raise PosencError(f"unknown preset {name_or_path!r}; valid: {', '.join(preset_names())}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise PosencError(f"preset {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    for key, value in (overrides or {}).items():
        if isinstance(value, dict):
            data[key] = {**data.get(key, {}), **value}
        elif value is not None:
            data[key] = value
    try:
        preset = Preset(**data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = f"preset {path.name}" + (" with command-line options" if any(v not in (None, {}) for v in (overrides or {}).values()) else "")
        raise PosencError(f"invalid {where}: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None
    for s in preset.schemes:  # fail fast, before any training
        encodings.get(s, _dims(preset.model), **preset.model.encoding_params)
    for spec in preset.eval_schedules:
        _schedule_spec(spec, preset)
    return preset


def _schedule_spec(spec: dict, preset: Preset) -> tuple[str, dict]:
    """(name, validated params) of one ``eval_schedules`` entry; PosencError if invalid."""
    params = dict(spec)
    name = params.pop("schedule", None)
    if name is None:
        raise PosencError(f"eval_schedules entry {spec} needs a 'schedule' key")
    full = schedule_params(name, preset.model.train_length, params)
    check_window(full, preset.model.train_length * min(preset.eval.multiples))
    return name, full


def run_schedules(run_root: Path, preset: Preset, data, results: Path) -> dict[str, str]:
    """Evaluate every ``eval_schedules`` entry on each trained RoPE scheme; returns failures."""

    failures = {}
    ropes = [s for s in preset.schemes if is_rope(s)]
    for spec in preset.eval_schedules:
        name, params = _schedule_spec(spec, preset)
        for scheme in ropes:
            for seed in preset.seeds:
                run_dir = run_root / scheme / f"seed{seed}"
                if not is_trained(run_dir):
                    continue
                try:
                    model, label = with_rope_schedule(load_run(run_dir)[0], name, params)
                    for L in eval_lengths(preset.model.train_length, preset.eval.multiples):
                        if (label, seed, L) not in _done(results):
                            rec = evaluate_length(model, data.val_docs, L, preset.eval.max_tokens, preset.eval.batch_tokens, span=_span(preset))
                            append_jsonl(results, {"kind": "ppl", "scheme": label, "seed": seed, "train_length": preset.model.train_length, **rec})
                except Exception as exc:  # one broken row must not lose the others
                    failures[f"{scheme}+{name} (seed {seed})"] = _one_line(exc)
    return failures


def _span(preset: Preset) -> int:
    """Every length scores the same text: the first (longest length) targets of each held-out work used."""
    return max(eval_lengths(preset.model.train_length, preset.eval.multiples))


def _dims(m: ModelConfig):
    from posenc.encodings.base import Dims

    return Dims(m.n_head, m.head_dim, m.d_model, m.vocab_size, m.train_length)


def _one_line(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0] if msg else ''}"


def run_scheme(run_root: Path, preset: Preset, scheme: str, seed: int, data, results: Path, done: set) -> None:
    """Train (or resume) and evaluate one scheme and seed, appending result records."""
    run_dir = run_root / scheme / f"seed{seed}"
    mcfg = preset.model.model_copy(update={"encoding": scheme, "vocab_size": data.vocab_size})
    tcfg = preset.train.model_copy(update={"seed": seed})
    if not is_trained(run_dir):
        train(run_dir, mcfg, tcfg, resume=True, data=data, desc=f"{scheme} s{seed}")
    model, _, _ = load_run(run_dir)
    for L in eval_lengths(mcfg.train_length, preset.eval.multiples):
        if (scheme, seed, L) in done:
            continue
        t0 = time.time()
        rec = evaluate_length(model, data.val_docs, L, preset.eval.max_tokens, preset.eval.batch_tokens, span=_span(preset))
        append_jsonl(results, {"kind": "ppl", "scheme": scheme, "seed": seed, "train_length": mcfg.train_length, **rec, "seconds": time.time() - t0})
    compare_extras(model, preset.eval, data, results, {"scheme": scheme, "seed": seed, "train_length": mcfg.train_length})


def _done(results: Path) -> set:
    return {(r["scheme"], r["seed"], r["eval_length"]) for r in read_jsonl(results) if r.get("kind", "ppl") == "ppl"}


def _finished(run_root: Path, preset: Preset, scheme: str, seed: int, done: set) -> bool:
    """Trained and every evaluation recorded: no job to start."""
    lengths = eval_lengths(preset.model.train_length, preset.eval.multiples)
    return (
        is_trained(run_root / scheme / f"seed{seed}") and all((scheme, seed, L) in done for L in lengths)
        and not extras_pending(preset.eval, preset.model.train_length, run_root / "results.jsonl", scheme, seed)
    )


def _drop_torn_tail(path: Path) -> None:
    """Cut a last line left unfinished by a killed writer, so the next append starts a clean line."""
    if path.exists() and path.stat().st_size and not path.read_bytes().endswith(b"\n"):
        text = path.read_bytes()
        atomic_write_bytes(path, text[: text.rfind(b"\n") + 1])


def _scheme_modules(schemes: list[str]) -> list[str]:
    """Modules defining the schemes' classes (each part of ``A+B``), for the job process to import."""
    mods = {cls.__module__ for s in schemes for cls, _ in encodings.parts(s)}
    return sorted(mods - {"__main__"})  # spawn re-runs __main__ itself


def _job(run_root: Path, preset: Preset, scheme: str, seed: int, modules: list[str], error_file: Path) -> None:
    """Entry point of a job process: one scheme and seed; an error goes to ``error_file``."""
    try:
        for m in modules:
            importlib.import_module(m)
        data = load_tokens(preset.train.corpus, preset.train.tokenizer)
        results = run_root / "results.jsonl"
        run_scheme(run_root, preset, scheme, seed, data, results, _done(results))
    except KeyboardInterrupt:
        sys.exit(130)
    except BaseException as exc:
        error_file.write_text(f"{_one_line(exc)}\n\n{traceback.format_exc()}")
        sys.exit(1)


def _run_job(run_root: Path, preset: Preset, scheme: str, seed: int) -> Optional[str]:
    """Run one job in a fresh process; None on success, else its one-line error."""
    error_file = run_root / scheme / f"seed{seed}.error.txt"
    error_file.parent.mkdir(parents=True, exist_ok=True)
    error_file.unlink(missing_ok=True)
    proc = multiprocessing.get_context("spawn").Process(
        target=_job, args=(run_root, preset, scheme, seed, _scheme_modules([scheme]), error_file)
    )
    proc.start()
    try:
        proc.join()
    except KeyboardInterrupt:  # the job got Ctrl-C too: let it save its checkpoint
        proc.join()
        raise
    if proc.exitcode == 0:
        return None
    if proc.exitcode == 130:
        raise KeyboardInterrupt
    if error_file.exists():
        return error_file.read_text().splitlines()[0]
    sig = signal.Signals(-proc.exitcode).name if proc.exitcode < 0 else f"exit code {proc.exitcode}"
    hint = " (out of memory?)" if proc.exitcode == -signal.SIGKILL else ""
    error_file.write_text(f"job process died: {sig}{hint}\n")
    return f"job process died: {sig}{hint}"


def _run_inline(run_root: Path, preset: Preset, scheme: str, seed: int, data) -> Optional[str]:
    """Run one job in this process; None on success, else its one-line error."""
    results = run_root / "results.jsonl"
    try:
        run_scheme(run_root, preset, scheme, seed, data, results, _done(results))
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        (run_root / scheme).mkdir(parents=True, exist_ok=True)
        (run_root / scheme / f"seed{seed}.error.txt").write_text(f"{_one_line(exc)}\n\n{traceback.format_exc()}")
        return _one_line(exc)
    return None


# set per job, lists of cells that may grow (results are kept per cell), or memory/speed knobs
_FREE_SETTINGS = {
    "model.encoding", "model.attn_block_size", "train.seed", "train.threads", "train.ckpt_every", "train.log_every",
    "eval.multiples", "eval.batch_tokens", "eval.passkey.lengths_multiples", "eval.passkey.depths", "eval.far_mass.multiples",
}


def _flatten(d: dict, prefix: str) -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _settings(preset: Preset) -> dict[str, Any]:
    """The settings every result of a run directory shares (model, training, evaluation), flattened."""
    flat = _flatten(preset.model_dump(mode="json", include={"model", "train", "eval"}), "")
    return {k: v for k, v in flat.items() if k not in _FREE_SETTINGS}


def _absolute_corpus(preset: Preset) -> Preset:
    """A local corpus by its absolute path, so one run directory means one corpus from any working directory."""
    spec = preset.train.corpus
    if spec in ("shakespeare", "pystdlib") or spec.startswith("hf:") or not Path(spec).expanduser().exists():
        return preset
    return preset.model_copy(update={"train": preset.train.model_copy(update={"corpus": str(Path(spec).expanduser().resolve())})})


def _check_same_settings(run_root: Path, preset: Preset) -> None:
    """Raise PosencError when ``run_root`` holds results made with other settings.

    Reruns skip what is finished, so mixing settings would label old results with
    new settings; schemes, seeds, lengths and extension rows may be added.
    """
    path = run_root / "preset.json"
    if not path.exists():
        return
    try:
        old = _settings(Preset(**read_json(path)))
    except (ValidationError, ValueError, TypeError) as exc:
        raise PosencError(f"{path} is unreadable ({_one_line(exc)}); use another --name or --out") from None
    now = _settings(preset)
    diff = [f"{k} {old.get(k)!r} -> {v!r}" for k, v in now.items() if old.get(k) != v]
    if diff:
        raise PosencError(f"{run_root} holds results made with other settings ({'; '.join(diff)}); use another --name or --out")


def compare(preset: Preset, out_root: Path = Path("runs"), isolate: bool = True) -> tuple[Path, dict[str, str]]:
    """Run the whole comparison; returns the report path and the failed jobs ({job: one-line error}).

    ``isolate``: one spawned process per (scheme, seed) job, so that even a
    crash or an out-of-memory kill only fails that job; False runs the jobs in
    this process (faster start, easier to debug; a crash ends the sweep).
    Raises PosencError before any work when ``out_root/name`` holds results made
    with other model, training or evaluation settings.
    """
    run_root = Path(out_root) / preset.name
    preset = _absolute_corpus(preset)
    data = load_tokens(preset.train.corpus, preset.train.tokenizer)  # bad input fails before anything is written
    _check_same_settings(run_root, preset)
    make_run_dir(run_root)
    write_json(run_root / "preset.json", preset.model_dump())
    results = run_root / "results.jsonl"
    _drop_torn_tail(results)
    failures: dict[str, str] = {}
    for scheme in preset.schemes:
        for seed in preset.seeds:
            if _finished(run_root, preset, scheme, seed, _done(results)):
                continue
            error = _run_job(run_root, preset, scheme, seed) if isolate else _run_inline(run_root, preset, scheme, seed, data)
            if error:  # one broken scheme must not lose the others
                failures[f"{scheme} (seed {seed})"] = error
                print(f"posenc: {scheme} (seed {seed}) failed: {error}", file=sys.stderr)
    failures.update(run_schedules(run_root, preset, data, results))
    dims = _dims(preset.model.model_copy(update={"vocab_size": data.vocab_size}))
    encs = {s: encodings.get(s, dims, **preset.model.encoding_params) for s in preset.schemes}
    meta = {
        "name": preset.name,
        "train_length": preset.model.train_length,
        "corpus": f"{preset.train.corpus} ({len(data.train):,} training tokens; held out: {', '.join(n for n, _ in data.val_docs)})",
        "tokenizer": f"{preset.train.tokenizer} (vocab {data.vocab_size})",
        "model": f"{preset.model.n_layer} layers, width {preset.model.d_model}, {preset.model.n_head} heads, {preset.model.mlp}, {preset.model.norm}, train length {preset.model.train_length}",
        "budget": f"{preset.train.steps} steps x {preset.train.batch_size} x {preset.model.train_length} tokens, lr {preset.train.lr}",
        "seeds": preset.seeds,
        "eval": f"non-overlapping windows; every length scores the same text: the first {_span(preset)} targets of each of the first {-(-preset.eval.max_tokens // _span(preset))} held-out works",
        "descriptions": {s: e.describe() for s, e in encs.items()},
        "mixing_windows": {s: e.mixing_window(0.01) for s, e in encs.items()},
        "notes": preset.description or None,
    }
    return write_report(run_root, meta, failures), failures
