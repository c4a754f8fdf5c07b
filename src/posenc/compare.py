"""The main job: train one model per scheme under one budget, evaluate, report.

``compare(preset)`` trains each scheme (and seed) into ``runs/<name>/<scheme>/seed<k>``,
evaluates perplexity at every length of the preset, appends one record per
evaluation to ``runs/<name>/results.jsonl`` and writes the report. Rerunning
skips finished trainings and evaluations and resumes interrupted ones. A scheme
that fails (error or NaN) is reported as failed; the others go on.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from posenc import encodings
from posenc.checkpoint import append_jsonl, read_jsonl, write_json
from posenc.data import load_tokens
from posenc.errors import PosencError
from posenc.evaluate import eval_lengths, evaluate_length
from posenc.model import ModelConfig
from posenc.report import write_report
from posenc.train import TrainConfig, is_trained, load_run, train

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


class EvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    multiples: list[int] = [1, 2, 4, 8, 16, 32, 64]
    max_tokens: int = Field(32768, gt=0)  # targets scored per length (fewer windows at long lengths)
    batch_tokens: int = Field(8192, gt=0)


class Preset(BaseModel):
    """A comparison: model, training budget, evaluation and the schemes to run."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    model: ModelConfig
    train: TrainConfig
    eval: EvalConfig = EvalConfig()
    schemes: list[str]
    seeds: list[int] = [0]


def preset_names() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def load_preset(name_or_path: str, overrides: Optional[dict[str, Any]] = None) -> Preset:
    """A preset by name (configs/NAME.yaml) or path; ``overrides`` replace top-level keys.

    Raises PosencError for an unknown preset, invalid YAML or invalid values.
    """
    path = Path(name_or_path)
    if not path.suffix:
        path = CONFIG_DIR / f"{name_or_path}.yaml"
    if not path.exists():
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
        raise PosencError(f"invalid preset {path.name}: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None
    for s in preset.schemes:  # fail fast, before any training
        encodings.get(s, _dims(preset.model))
    return preset


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
        rec = evaluate_length(model, data.val_docs, L, preset.eval.max_tokens, preset.eval.batch_tokens)
        append_jsonl(results, {"kind": "ppl", "scheme": scheme, "seed": seed, "train_length": mcfg.train_length, **rec, "seconds": time.time() - t0})


def compare(preset: Preset, out_root: Path = Path("runs")) -> Path:
    """Run the whole comparison; returns the report path."""
    run_root = Path(out_root) / preset.name
    run_root.mkdir(parents=True, exist_ok=True)
    write_json(run_root / "preset.json", preset.model_dump())
    data = load_tokens(preset.train.corpus, preset.train.tokenizer)
    results = run_root / "results.jsonl"
    failures: dict[str, str] = {}
    for scheme in preset.schemes:
        for seed in preset.seeds:
            done = {(r["scheme"], r["seed"], r["eval_length"]) for r in read_jsonl(results)}
            try:
                run_scheme(run_root, preset, scheme, seed, data, results, done)
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # one broken scheme must not lose the others
                failures[f"{scheme} (seed {seed})"] = _one_line(exc)
                (run_root / scheme).mkdir(parents=True, exist_ok=True)
                (run_root / scheme / f"seed{seed}.error.txt").write_text(traceback.format_exc())
    meta = {
        "name": preset.name,
        "train_length": preset.model.train_length,
        "corpus": f"{preset.train.corpus} ({len(data.train):,} training tokens; held out: {', '.join(n for n, _ in data.val_docs)})",
        "tokenizer": f"{preset.train.tokenizer} (vocab {data.vocab_size})",
        "model": f"{preset.model.n_layer} layers, width {preset.model.d_model}, {preset.model.n_head} heads, {preset.model.mlp}, {preset.model.norm}, train length {preset.model.train_length}",
        "budget": f"{preset.train.steps} steps x {preset.train.batch_size} x {preset.model.train_length} tokens, lr {preset.train.lr}",
        "seeds": preset.seeds,
        "eval": f"non-overlapping windows, at most {preset.eval.max_tokens} scored tokens per length",
        "descriptions": {s: encodings.get(s, _dims(preset.model.model_copy(update={"vocab_size": data.vocab_size}))).describe() for s in preset.schemes},
        "notes": preset.description or None,
    }
    return write_report(run_root, meta, failures)
