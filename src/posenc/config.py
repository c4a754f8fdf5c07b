"""Configs as data: the comparison preset (model, training, evaluation, schemes) and its loading.

Presets are YAML files shipped as package data (``posenc/configs/NAME.yaml``,
read with ``importlib.resources``, so an installed wheel has them); a path to a
YAML file works too. Every section is a pydantic model: unknown keys and bad
values are one-line errors before any work.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

from posenc.diagnose import FarMassConfig
from posenc.rope import check_window, schedule_params
from posenc import methods
from posenc.errors import PosencError
from posenc.model import ModelConfig
from posenc.passkey import PasskeyConfig
from posenc.presets import read_preset, validated
from posenc.tasks import get_task, is_task
from posenc.train import TrainConfig



class ClusterConfig(BaseModel):
    """Resources of each submitit job (``posenc.jobs.run_submitit``): partition, GPUs, wall-clock limit (minutes), memory (GB)."""

    model_config = ConfigDict(extra="forbid")

    partition: Optional[str] = None  # the scheduler's default when None
    gpus_per_job: Optional[int] = Field(None, ge=0)  # None: --nproc-per-node (on CPU with the local executor: 0)
    time_min: int = Field(240, gt=0)
    mem_gb: Optional[float] = Field(None, gt=0)  # the scheduler's default when None


class EvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    multiples: list[int] = [1, 2, 4, 8, 16, 32, 64]
    max_tokens: int = Field(32768, gt=0)  # targets scored per length (fewer windows at long lengths)
    batch_tokens: int = Field(8192, gt=0)
    passkey: PasskeyConfig = PasskeyConfig()  # passkey retrieval cells (posenc.passkey)
    far_mass: FarMassConfig = FarMassConfig()  # the cheap diagnose pass (posenc.diagnose)


class TaskEvalConfig(BaseModel):
    """Scoring of synthetic tasks (``posenc.taskeval``): lengths, and the answers each cell aims for."""

    model_config = ConfigDict(extra="forbid")

    multiples: list[Annotated[int, Field(gt=0)]] = [1, 4, 16, 32]  # sequence lengths; probes reach the largest
    answers: int = Field(2000, gt=0)  # answers per cell (a 1-point standard error near 90% needs ~900)
    max_tokens: int = Field(65536, gt=0)  # ... or this many tokens per cell, whichever comes first
    batch_tokens: int = Field(16384, gt=0)
    horizon_tol: float = Field(0.05, gt=0, lt=1)  # horizon: accuracy within this of in-distribution accuracy
    learned: float = Field(0.9, gt=0, le=1)  # in-distribution accuracy below this: "did not learn the task"


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
    # long-context methods (posenc.methods) evaluated after them on every trained scheme they apply to
    # (rope with fixed frequencies, alibi, t5, kerple), e.g. "self-extend:group=4" -> row "rope+self-extend(group=4,window=64)"
    eval_methods: list[str] = []
    # synthetic tasks (posenc.tasks): each scheme trains and is scored on each; a task corpus in
    # train.corpus alone means tasks: [that corpus]
    tasks: list[str] = []
    task_eval: TaskEvalConfig = TaskEvalConfig()
    # a text comparison's run directory (relative to the working directory) for the retrieval claim R1
    text_results: Optional[str] = None
    # published numbers to print beside ours: {source: str, metric: str, tests: [..], rows: {scheme: [..]}}
    reference: Optional[dict[str, Any]] = None
    # resources of each job under `compare --launcher slurm` (or local); the flags override them
    cluster: Optional[ClusterConfig] = None

    @field_validator("schemes", "seeds", "tasks")
    @classmethod
    def _distinct(cls, v: list) -> list:  # a repeat would run once and be reported as if it were two
        repeated = sorted({str(x) for x in v if v.count(x) > 1})
        if repeated:
            raise ValueError(f"each entry once: {', '.join(repeated)} repeated")
        return v

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str) -> str:  # the run directory under --out, never outside it
        if not v or v in (".", "..") or not all(c.isalnum() or c in "._-" for c in v):
            raise ValueError(f"must be a plain directory name (letters, digits, . _ -), got {v!r}")
        return v


def load_preset(name_or_path: str, overrides: Optional[dict[str, Any]] = None) -> Preset:
    """A preset by name (posenc/configs/NAME.yaml, package data) or path; ``overrides`` replace top-level keys.

    Raises PosencError for an unknown preset, invalid YAML or invalid values.
    """
    path, data = read_preset(name_or_path)
    for key, value in (overrides or {}).items():
        if isinstance(value, dict):
            data[key] = {**data.get(key, {}), **value}
        elif value is not None:
            data[key] = value
    given = any(v not in (None, {}) for v in (overrides or {}).values())
    preset = validated(Preset, data, f"preset {path.name}" + (" with command-line options" if given else ""))
    for s in preset.schemes:  # fail fast, before any training
        dataclasses.replace(preset.model, encoding=s).check_encoding()
    for spec in preset.eval_schedules:
        schedule_spec(spec, preset)
    for spec in preset.eval_methods:
        methods.parse(spec, preset.model.train_length)
    for spec in task_specs(preset):
        get_task(spec).check_length(preset.model.train_length)
    if preset.tasks and is_task(preset.train.corpus):
        raise PosencError(f"preset {preset.name}: give the tasks in 'tasks' or in train.corpus, not both")
    return preset


def task_specs(preset: Preset) -> list[str]:
    """The synthetic tasks a preset trains on: ``tasks``, or ``[train.corpus]`` when that is a task, else []."""
    return preset.tasks or ([preset.train.corpus] if is_task(preset.train.corpus) else [])


def schedule_spec(spec: dict, preset: Preset) -> tuple[str, dict]:
    """(name, validated params) of one ``eval_schedules`` entry; PosencError if invalid."""
    params = dict(spec)
    name = params.pop("schedule", None)
    if name is None:
        raise PosencError(f"eval_schedules entry {spec} needs a 'schedule' key")
    full = schedule_params(name, preset.model.train_length, params)
    check_window(full, preset.model.train_length * min(preset.eval.multiples))
    return name, full


def absolute_corpus(preset: Preset) -> Preset:
    """A local corpus by its absolute path, so one run directory means one corpus from any working directory."""
    spec = preset.train.corpus
    if spec in ("shakespeare", "pystdlib") or spec.startswith("hf:") or not Path(spec).expanduser().exists():
        return preset
    return preset.model_copy(update={"train": preset.train.model_copy(update={"corpus": str(Path(spec).expanduser().resolve())})})
