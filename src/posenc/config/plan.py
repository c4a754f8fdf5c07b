"""Configs as data: the comparison preset (model, training, evaluation, schemes) and its loading.

Presets are YAML files shipped as package data (``posenc/presets/NAME.yaml``,
read with ``importlib.resources``, so an installed wheel has them); a path to a
YAML file works too. Every section is a pydantic model: unknown keys and bad
values are one-line errors before any work.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from posenc import encodings, methods
from posenc.data.tasks import get_task, is_task
from posenc.errors import PosencError
from posenc.eval.diagnose import FarMassConfig
from posenc.eval.passkey import PasskeyConfig
from posenc.model import ModelConfig
from posenc.rope import check_window, schedule_label, schedule_params
from posenc.scoring import eval_lengths
from posenc.store.presets import Count, Seed, apply, distinct, read_preset, validated
from posenc.train.batches import randomized_max
from posenc.train.precision import machine_precision
from posenc.train.settings import TrainConfig


class ClusterConfig(BaseModel):
    """Resources of each submitit job (``posenc.jobs.launcher.run_submitit``): partition, GPUs, wall-clock limit
    (minutes), memory (GB)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    partition: str | None = None
    """Slurm partition; null: the scheduler's default."""
    gpus_per_job: int | None = Field(None, ge=0)
    """GPUs per job; null: ``--nproc-per-node`` (on CPU with the local executor: 0)."""
    time_min: int = Field(240, gt=0)
    """Wall-clock limit per job (minutes); a job killed at it resumes from its last checkpoint on a rerun."""
    mem_gb: float | None = Field(None, gt=0)
    """Memory per job (GB); null: the scheduler's default."""


def plain_name(v: str) -> str:
    """``v`` unchanged; ValueError unless it is a plain directory name (letters, digits, . _ -; not . or ..): a run
    directory under its parent, never outside it."""
    if not v or v in (".", "..") or not all(c.isalnum() or c in "._-" for c in v):
        raise ValueError(f"must be a plain directory name (letters, digits, . _ -), got {v!r}")
    return v


class EvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    multiples: list[Annotated[int, Field(gt=0)]] = Field([1, 2, 4, 8, 16, 32, 64], min_length=1)
    """Evaluation lengths, as multiples of ``model.train_length`` (at least one)."""
    max_tokens: Count = 32768
    """Targets scored per length (tokens; fewer windows at long lengths)."""
    batch_tokens: Count = 8192
    """Tokens per evaluation forward batch: memory and speed only."""
    passkey: PasskeyConfig = PasskeyConfig(trials=0)
    """Passkey retrieval cells (``posenc.eval.passkey``): off (``trials: 0``) unless a preset gives ``eval.passkey``; a
    block given takes the defaults below for the keys it leaves out."""
    far_mass: FarMassConfig = FarMassConfig()
    """The cheap diagnose pass (far attention mass and entropy, ``posenc.eval.diagnose``)."""

    @field_validator("multiples")
    @classmethod
    def _distinct(cls, v: list) -> list:
        return distinct(v)


class TaskEvalConfig(BaseModel):
    """Scoring of synthetic tasks (``posenc.eval.tasks``): lengths, and the answers each cell aims for."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    multiples: list[Annotated[int, Field(gt=0)]] = Field([1, 4, 16, 32], min_length=1)
    """Sequence lengths scored, as multiples of ``model.train_length`` (at least one); probes reach the largest."""

    @field_validator("multiples")
    @classmethod
    def _distinct(cls, v: list) -> list:
        return distinct(v)

    answers: Count = 2000
    """Answers a cell holds at least (a 1-point standard error near 90% needs ~900; whole batches, so the last may
    pass it) ..."""
    max_tokens: Count = 65536
    """... or tokens a cell has used at least, whichever comes first (likewise whole batches)."""
    se: float | None = Field(None, gt=0, lt=0.5)
    """... or, when set, a standard error (a fraction: 0.02 is 2 points) that every bucket of the cell has reached
    (``posenc.eval.tasks.precise``): the controlled-gap probe's cell is one distance bucket, so its answers follow
    its accuracy (625 at 50%, 68 all right); ``max_tokens`` still caps it. None: the first two caps only."""
    batch_tokens: Count = 16384
    """Tokens per scoring forward batch: memory and speed only."""
    horizon_tol: float = Field(0.05, gt=0, lt=1)
    """The horizon: the longest distance whose accuracy is within this (a fraction) of the in-distribution accuracy."""
    learned: float = Field(0.9, gt=0, le=1)
    """In-distribution accuracy below this (a fraction): the scheme did not learn the task."""


VARIANT_KEY = "model.encoding"  # per scheme only: the scheme's spec with parameters added (``forget:init_bias=4``)
# the settings a sweep may vary (``SweepConfig``): training budget and optimiser, the model's shape, a scheme's variants
SWEEP_KEYS = (
    "train.lr",
    "train.weight_decay",
    "train.steps",
    "train.warmup",
    "model.n_head",
    "model.n_layer",
    "model.d_model",
    "model.canon",
    VARIANT_KEY,
)
Point = tuple[
    tuple[str, Any], ...
]  # one grid point: ((key, value), ...) in the grid's key order; () is the preset itself


def _check_axes(axes: dict[str, list], scheme: str | None) -> dict[str, list]:
    """``scheme``: whose own values ``axes`` are (None: the grid for every scheme); it names them in the errors."""
    where = "" if scheme is None else f"sweep.schemes.{scheme}."
    for key, values in axes.items():
        if key not in SWEEP_KEYS:
            raise ValueError(f"{where}{key} cannot be swept (valid: {', '.join(SWEEP_KEYS)})")
        if key == VARIANT_KEY and scheme is None:
            raise ValueError(f"{key} gives one scheme's variants: sweep it per scheme (sweep.schemes), not in the grid")
        if key == VARIANT_KEY and not all(isinstance(v, str) for v in values):
            raise ValueError(f"{where}{key}: give scheme specs (strings), got {values!r}")
        if not values or len({repr(v) for v in values}) < len(values):
            raise ValueError(f"{where}{key}: give each value once, at least one, got {values!r}")
    return axes


class SweepConfig(BaseModel):
    """A grid over training and model settings, each scheme trained at every point of its grid on the first
    seed, its setting chosen by the held-out in-distribution result (``posenc.jobs.sweep``) and the other seeds run
    there. ``grid``: {key: [values]} for every scheme; ``schemes``: {scheme: {key: [values]}}, that scheme's
    own values (they replace the grid's for its keys and may add keys). Keys: ``SWEEP_KEYS``; ``model.encoding``, per
    scheme only, gives variants of that scheme (its parts in order, parameters added: ``[forget, forget:init_bias=4]``):
    its jobs train the variant and record under the scheme's name."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    grid: dict[str, list[Any]] = {}
    """{key: [values]} for every scheme; keys: train.lr, train.weight_decay, train.steps, train.warmup, model.n_head,
    model.n_layer, model.d_model, model.canon."""
    schemes: dict[str, dict[str, list[Any]]] = {}
    """{scheme: {key: [values]}}: that scheme's own values, replacing the grid's for its keys (and adding keys); also
    model.encoding: variants of the scheme (its parts in order, parameters added)."""

    @field_validator("grid")
    @classmethod
    def _grid(cls, v: dict) -> dict:
        return _check_axes(v, scheme=None)

    @field_validator("schemes")
    @classmethod
    def _per_scheme(cls, v: dict) -> dict:
        for scheme, axes in v.items():
            _check_axes(axes, scheme)
        return v


class TrendConfig(BaseModel):
    """One setting run at several values, each value (a rung) a whole comparison of its own under
    ``run_root/<key>-<value>``, reported as a trend (``posenc.reports.trend``): nothing is chosen on it. A budget
    ladder: ``{key: train.steps, values: [200, 800, 3200], seeds: {"3200": [0, 1]}}``."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    key: str
    """The setting (a dotted key a sweep may vary, ``SWEEP_KEYS``, the scheme variants excepted: train.steps,
    model.d_model, model.n_layer, ...)."""
    values: list[Any] = Field(min_length=2)
    """Its values, each once, in the order they run (cheapest first serves an interrupted run best)."""
    seeds: dict[str, list[Annotated[int, Field(ge=0)]]] = {}
    """{value as written: [seeds]}: a rung's own seeds (fewer on the costliest rung); the others take the preset's
    ``seeds``."""

    @field_validator("key")
    @classmethod
    def _key(cls, v: str) -> str:
        if v not in SWEEP_KEYS or v == VARIANT_KEY:
            raise ValueError(f"{v} cannot be a trend (valid: {', '.join(k for k in SWEEP_KEYS if k != VARIANT_KEY)})")
        return v

    @field_validator("values")
    @classmethod
    def _distinct(cls, v: list) -> list:
        if len({repr(x) for x in v}) < len(v):
            raise ValueError(f"give each value once, got {v!r}")
        return v

    def rung_name(self, value: Any) -> str:
        """The rung's run directory: ``train.steps-800``."""
        return f"{self.key}-{value}"


class Preset(BaseModel):
    """A comparison: model, training budget, evaluation and the schemes to run."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    name: str
    """The run directory under ``--out`` (letters, digits, . _ -); each preset states its own (never taken from its
    base)."""
    description: str = ""
    """What the comparison tests, as the report quotes it; each preset states its own (never taken from its base)."""
    model: ModelConfig
    """The model every scheme trains (a scheme's spec replaces ``encoding``)."""
    train: TrainConfig
    """The training budget, data and optimiser of every job."""
    eval: EvalConfig = EvalConfig()
    """Perplexity against length, passkey and far mass on text."""
    schemes: list[str] = Field(min_length=1)
    """The positional schemes to compare (``posenc list``), each once."""
    seeds: list[Seed] = Field([0], min_length=1)
    """Training seeds, each once; the report shows mean ± half-range."""
    eval_schedules: list[dict[str, Any]] = []
    """RoPE context-extension rows evaluated after the plain rows on every trained RoPE scheme, e.g.
    ``{schedule: yarn, factor: 8}`` -> row ``rope+yarn(s=8)`` (``posenc.rope``)."""
    eval_methods: list[str] = []
    """Long-context methods (``posenc.methods``) evaluated after them on every trained scheme they apply to (RoPE with
    fixed frequencies, ALiBi, T5, Kerple), e.g. ``self-extend:group=4``."""
    tasks: list[str] = []
    """Synthetic tasks (``posenc.data.tasks``): each scheme trains and is scored on each; a task in ``train.corpus``
    alone means ``tasks: [that task]``."""
    task_eval: TaskEvalConfig = TaskEvalConfig()
    """Scoring of the synthetic tasks."""
    text_results: str | None = None
    """A text comparison's run directory (relative to the working directory) for the retrieval claim R1; null: none."""
    reference: dict[str, Any] | None = None
    """Published numbers printed beside ours: ``{source, task, tests: [...], rows: {scheme: [...]}}``; null: none."""
    cluster: ClusterConfig | None = None
    """Resources of each job under ``compare --launcher slurm`` (or ``local``); the flags override them; null: the
    defaults below."""
    sweep: SweepConfig | None = None
    """A grid over training and model settings, chosen per scheme on the first seed; null: no sweep."""
    trend: TrendConfig | None = None
    """One setting at several values, each a comparison of its own, reported as a trend (nothing chosen on it: a
    budget ladder over ``train.steps``); null: none."""

    @field_validator("seeds", "tasks")
    @classmethod
    def _distinct(cls, v: list) -> list:
        return distinct(v)

    @field_validator("schemes")
    @classmethod
    def _distinct_specs(cls, v: list) -> list:  # rope and rope:rope_theta=10000 are one scheme: reported as one
        return distinct(v, encodings.canonical)

    _plain_name = field_validator("name")(plain_name)


def load_preset(name_or_path: str, overrides: dict[str, Any] | None = None, schemes: list[str] | None = None) -> Preset:
    """A preset by name (posenc/presets/NAME.yaml, package data) or path, its ``base`` resolved
    (``posenc.store.presets.read_preset``), with ``overrides`` set ({dotted key: value}, ``{"train.lr": 3e-3}``; a
    section given a mapping, ``{"train": {"steps": 5}}``, merges it: ``posenc.store.presets.apply``), as the command
    line's flags and ``--set`` give them. The format: docs/presets.md. ``schemes``: the schemes the command trains
    (``train --scheme``), each built with ``model.encoding_params`` (``check_scheme``); None: the preset's
    ``schemes`` (``compare``, after ``--schemes``). A scheme the command does not train is not built with them: a
    parameter of the trained scheme that another lacks is no error.

    Raises PosencError for an unknown preset, invalid YAML, a cycle of bases, an unknown key or invalid values, or a
    trained scheme that cannot be built (``check_scheme``).
    """
    path, data = read_preset(name_or_path, cls=Preset)
    if schemes is not None:  # a command that names its scheme (train) needs no list of them in the preset
        data.setdefault("schemes", schemes)
    written = (
        validated(Preset, data, f"preset {path.name}").model_dump(mode="json", include=STATED)
        if data.get("description")
        else None
    )
    data = apply(Preset, data, overrides)
    preset = validated(
        Preset, data, f"preset {path.name}" + (" with command-line options" if overrides else ""), overrides
    )
    if written is not None:
        _flag_overrides(preset, written)
    trained = preset.schemes if schemes is None else schemes
    for p in [preset, *rungs(preset)]:  # fail fast, before any training (every rung's settings valid; its model too)
        for s in trained:
            check_scheme(p.model, s)
    labels = [schedule_label(*schedule_spec(spec, preset), preset.model.train_length) for spec in preset.eval_schedules]
    for label in {x for x in labels if labels.count(x) > 1}:  # one row would hold both, as a spread over seeds
        raise PosencError(f"preset {preset.name}: eval_schedules has two rows {label}: give each setting once")
    for spec in preset.eval_methods:
        methods.check_reach(methods.parse(spec, preset.model.train_length), preset.model.train_length)
    randomized_max(preset.train.positions)  # the spec (each scheme is checked where it trains: check_positions)
    for spec in task_specs(preset):
        get_task(spec).check_length(preset.model.train_length)
    if preset.tasks and is_task(preset.train.corpus):
        raise PosencError(f"preset {preset.name}: give the tasks in 'tasks' or in train.corpus, not both")
    if preset.sweep is not None:
        _check_sweep(preset, trained)
        swept = {*preset.sweep.grid, *(k for grid in preset.sweep.schemes.values() for k in grid)}
        given = sorted(set(overrides or {}) & swept)
        if given:  # every grid point sets it: the given value would be dropped
            raise PosencError(
                f"preset {preset.name}: {given[0]} is given and swept (the sweep's grid sets it at each point): "
                "drop one (a one-value grid fixes it)"
            )
    if preset.train.until is not None and not task_specs(preset):
        raise PosencError(f"preset {preset.name}: train.until needs synthetic tasks (tasks, or a task in train.corpus)")
    return preset


def check_scheme(model: ModelConfig, spec: str) -> None:
    """PosencError (one line) before any work when scheme ``spec`` cannot be built with ``model`` (its size, depth
    and ``encoding_params``: ``ModelConfig.check_encoding``)."""
    dataclasses.replace(model, encoding=spec).check_encoding()


SETTINGS = {"model", "train", "eval", "task_eval"}  # what a preset's description may state and a run override
STATED = SETTINGS | {"sweep"}  # the grid too ("each learning rate of the grid"), though no run record holds it
# the lengths: a rerun adds to a run's (posenc.jobs.launcher.with_earlier_rows) and its tables show them, so a note
# of one invocation's would misdescribe the run
LENGTHS = {"eval.multiples", "task_eval.multiples"}


def _flag_overrides(preset: Preset, written: dict) -> None:
    """Append to ``preset.description`` the settings this run changes from the preset as written: the
    description states them ("2 layers, width 128, 2 heads", "4,000 steps", the grid) and a report quotes it."""
    now = preset.model_dump(mode="json", include=STATED)
    changed = [
        f"{section}.{k} = {v!r}"
        for section in sorted(STATED)
        for k, v in (now[section] or {}).items()
        if (written[section] or {}).get(k) != v and f"{section}.{k}" not in LENGTHS
    ]
    if now["sweep"] is None and written["sweep"] is not None:
        changed.append("no sweep")
    if changed:
        preset.description += f" [The preset as written; this run sets {', '.join(changed)}.]"


def _check_sweep(preset: Preset, trained: list[str]) -> None:
    """PosencError before any work for a per-scheme grid of no valid scheme, a scheme without a grid, or a grid point
    whose settings are invalid (validation) or that a scheme cannot be built with (its head dim, a variant that is
    not one): a scheme's own grid is checked even when the run leaves the scheme out (``--schemes``), without
    ``model.encoding_params`` unless it is ``trained``."""
    for s in sorted(set(preset.sweep.schemes) - set(preset.schemes)):
        try:  # the name only: model.encoding_params are the trained schemes' (load_preset)
            dataclasses.replace(preset.model, encoding_params={}, encoding=s).check_encoding()
        except PosencError as exc:
            raise PosencError(f"preset {preset.name}: sweep.schemes names {s!r}, not a scheme ({exc})") from None
    bare = [s for s in preset.schemes if not {**preset.sweep.grid, **preset.sweep.schemes.get(s, {})}]
    if bare:  # its jobs would train in the comparison's own directory, where the sweep writes the chosen runs' records
        raise PosencError(
            f"preset {preset.name}: scheme {bare[0]!r} has no grid in the sweep: give sweep.grid, or sweep.schemes "
            f"with a value (one is enough) for it"
        )
    for s in dict.fromkeys([*preset.schemes, *preset.sweep.schemes]):  # a left-out scheme's variants too
        variants = preset.sweep.schemes.get(s, {}).get(VARIANT_KEY, [])
        if len({encodings.canonical(v) for v in variants}) < len(variants):  # they would train twice, as one
            raise PosencError(
                f"preset {preset.name}: sweep.schemes.{s}.{VARIANT_KEY} spells one variant twice: {variants}"
            )
        for point in grid_points(preset, s):
            spec = job_encoding(point, s)
            if not is_variant(spec, s):
                raise PosencError(
                    f"preset {preset.name}: sweep.schemes.{s}.{VARIANT_KEY} gives {spec!r}, not a variant of {s!r} "
                    f"(its parts in its order, with parameters added)"
                )
            model = at_point(preset, point).model
            check_scheme(model if s in trained else dataclasses.replace(model, encoding_params={}), spec)


def is_variant(spec: str, scheme: str) -> bool:
    """Whether ``spec`` is ``scheme`` with parameters added: each layer entry's parts the same classes in the same
    order, each part keeping every parameter the scheme's sets (an alias's too: acc-rand-qkv is no variant of
    acc-rand-qk, whose rotate=qk it drops). PosencError for an invalid spec."""
    mine, theirs = ([encodings.parts(entry) for entry in encodings.layer_pattern(x)] for x in (spec, scheme))
    return len(mine) == len(theirs) and all(
        len(a) == len(b) and all(ca is cb and pb.items() <= pa.items() for (ca, pa), (cb, pb) in zip(a, b))
        for a, b in zip(mine, theirs)
    )


def job_encoding(point: Point, scheme: str) -> str:
    """The spec a job of ``scheme`` at grid ``point`` trains: the point's variant (``model.encoding``) or the scheme."""
    return dict(point).get(VARIANT_KEY, scheme)


def grid_points(preset: Preset, scheme: str) -> list[Point]:
    """The grid points of ``scheme``: the cartesian product of the sweep's values (its own replacing the grid's),
    in the grid's key order then its own; ``[()]`` (the preset itself) without a sweep."""
    if preset.sweep is None:
        return [()]
    axes = {**preset.sweep.grid, **preset.sweep.schemes.get(scheme, {})}
    return [tuple(zip(axes, values)) for values in itertools.product(*axes.values())]


def scheme_values(preset: Preset, of: Callable[[ModelConfig], Any]) -> dict[str, Any]:
    """{spec: ``of`` its model} of every scheme (with the preset's model) and every sweep variant a job of it trains
    (``job_encoding``; with the model of the first grid point that trains it). Raises PosencError for a grid point
    whose settings are invalid (``at_point``)."""
    out = {s: of(dataclasses.replace(preset.model, encoding=s)) for s in preset.schemes}
    for s in preset.schemes:
        for point in grid_points(preset, s):
            spec, model = job_encoding(point, s), at_point(preset, point).model
            if spec not in out:
                out[spec] = of(dataclasses.replace(model, encoding=spec))
    return out


def setting(preset: Preset, key: str):
    """The value of ``key`` (``train.lr``) a report's header states: the preset's, or "swept" when its sweep varies
    it for some scheme the run trains (each scheme's value is then its chosen grid point, which the sweep table names;
    a left-out scheme's own grid varies nothing)."""
    sweep = preset.sweep
    own = [] if sweep is None else [sweep.schemes[s] for s in preset.schemes if s in sweep.schemes]
    axes = set() if sweep is None else {k for g in (sweep.grid, *own) for k in g}
    if key in axes:
        return "swept"
    section, field = key.split(".")
    return getattr(getattr(preset, section), field)


def model_line(preset: Preset) -> str:
    """The report header's model line: "2 layers, width 128, 4 heads, gelu, rmsnorm, train length 128", then
    ", Canon-A width 3" for a Canon layer (``setting``: "swept" for what the sweep varies)."""
    m, canon = preset.model, setting(preset, "model.canon")
    return (
        f"{setting(preset, 'model.n_layer')} layers, width {setting(preset, 'model.d_model')}, "
        f"{setting(preset, 'model.n_head')} heads, {m.mlp}, {m.norm}, train length {m.train_length}"
        + (f", Canon-A width {canon}" if canon else "")
    )


def positions_note(preset: Preset) -> str:
    """ ", randomized positions (max N)" for a budget line when the preset trains on randomized positions, else ""."""
    n = randomized_max(preset.train.positions)
    return "" if n is None else f", randomized positions (max {n})"


def point_label(point: Point) -> str:
    """A grid point as one word (its run directory's name): ``train.lr=0.002,model.n_head=4``; "" for ()."""
    return ",".join(f"{k}={v}" for k, v in point)


def point_root(run_root: Path, point: Point) -> Path:
    """Where the jobs of a grid point train and record: ``run_root/sweep/<label>``, or ``run_root`` for ()."""
    return Path(run_root) / "sweep" / point_label(point) if point else Path(run_root)


def at_point(preset: Preset, point: Point) -> Preset:
    """``preset`` with the grid point's settings in its model and train sections (no sweep of its own);
    PosencError naming the point when they are invalid."""
    if not point:
        return preset
    data = preset.model_dump()
    for key, value in point:
        section, field = key.split(".")
        data[section][field] = value
    return validated(Preset, {**data, "sweep": None}, f"preset {preset.name} at grid point {point_label(point)}")


def rungs(preset: Preset) -> list[Preset]:
    """The comparisons of a preset's ``trend``: one per value, named ``<key>-<value>`` (its run directory under the
    preset's), the value set, the rung's own seeds where ``trend.seeds`` gives them, no trend of its own; [] without a
    trend. PosencError naming the rung when its settings are invalid, or for ``trend.seeds`` of a value not on the
    axis, a trend on synthetic tasks (the trend report reads text comparisons only) or without a length past the
    training length (it plots the ratio there)."""
    if preset.trend is None:
        return []
    t = preset.trend
    if task_specs(preset):
        raise PosencError(f"preset {preset.name}: a trend compares text runs only, not synthetic tasks (tasks)")
    if max(preset.eval.multiples) <= 1:
        raise PosencError(
            f"preset {preset.name}: a trend plots the perplexity ratio past the training length; eval.multiples "
            f"{preset.eval.multiples} has no length above 1x"
        )
    unknown = sorted(set(t.seeds) - {str(v) for v in t.values})
    if unknown:
        raise PosencError(f"preset {preset.name}: trend.seeds names {unknown[0]!r}, not a value of {t.key}")
    section, field = t.key.split(".")
    out = []
    for value in t.values:
        data = preset.model_dump()
        data[section][field] = value
        data.update(name=t.rung_name(value), trend=None, seeds=t.seeds.get(str(value), preset.seeds))
        out.append(validated(Preset, data, f"preset {preset.name} at {t.key} = {value!r}"))
    return out


def job_configs(preset: Preset, point: Point, scheme: str, seed: int, vocab_size: int, task: str | None = None):
    """(ModelConfig, TrainConfig) of one job: the preset at grid ``point``, ``scheme``, ``seed`` and the data's
    vocabulary, on ``task`` when given (its corpus): what the job trains and what its run must record."""
    p = at_point(preset, point)
    mcfg = dataclasses.replace(p.model, encoding=job_encoding(point, scheme), vocab_size=vocab_size)
    return mcfg, p.train.model_copy(update={"seed": seed, **({"corpus": task} if task else {})})


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
    return preset.model_copy(
        update={"train": preset.train.model_copy(update={"corpus": str(Path(spec).expanduser().resolve())})}
    )


# set per job, lists of cells that may grow (results are kept per cell), or memory/speed knobs
FREE_SETTINGS = {
    "model.encoding",
    "model.attn_block_size",
    "train.seed",
    "train.threads",
    "train.compile",
    "train.ckpt_every",
    "train.log_every",
    "eval.multiples",
    "eval.batch_tokens",
    "task_eval.multiples",
    "task_eval.batch_tokens",
    "task_eval.horizon_tol",
    "task_eval.learned",
    "eval.passkey.lengths_multiples",
    "eval.passkey.depths",
    "eval.far_mass.multiples",
}


def flatten(d: dict, prefix: str) -> dict[str, Any]:
    """Nested dict ``d`` as {dotted key: leaf value}, each key after ``prefix``."""
    out = {}
    for k, v in d.items():
        out.update(flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def eval_span(preset: Preset) -> int:
    """The text a text comparison scores at every length: the first ``eval_span`` targets (its longest evaluation
    length) of each held-out work it uses (``posenc.scoring.plan``), so ratios between lengths compare the same
    tokens."""
    return max(eval_lengths(preset.model.train_length, preset.eval.multiples))


def settings(preset: Preset) -> dict[str, Any]:
    """The settings every result of a run directory shares (model, training, evaluation), flattened. The lengths
    (``eval.multiples``) are free, but not the text they score: ``eval.span`` (:func:`eval_span`), so a rerun that
    adds a longer length, or drops the longest, is told that its records would score other text than the kept
    ones."""
    flat = flatten(preset.model_dump(mode="json", include={"model", "train", "eval", "task_eval"}), "")
    flat["train.precision"] = machine_precision(preset.train)  # "auto" compares as what it picks here
    flat["eval.span"] = eval_span(preset)
    return {k: v for k, v in flat.items() if k not in FREE_SETTINGS}
