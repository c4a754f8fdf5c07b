"""A job is the unit of work of a comparison: a frozen record that knows when it is done and how to do it.

Each kind is one class: :class:`TextJob` (train one scheme and seed on text, evaluate perplexity at every length,
the passkey cells and the far-mass pass), :class:`TaskJob` (train and score on a synthetic task), and the rows
evaluated on a trained text run: :class:`ScheduleJob` (a RoPE context-extension schedule) and :class:`MethodJob`
(an inference method). A job carries its grid point's directory (``root``: its ``results.jsonl`` and
``<scheme>/seed<k>``), scheme, seed, grid point and model and training settings; ``done(store)`` asks the run's
records (``posenc.store.records.RunStore``) whether its work is there, ``run(store)`` does what is missing,
appending to them (a rerun resumes). :class:`Plan` turns a preset into its stages, lists of jobs;
``posenc.jobs.launcher`` runs a stage's pending jobs, each in its own process.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import torch

from posenc import encodings
from posenc.config.plan import (
    Point,
    Preset,
    absolute_corpus,
    at_point,
    eval_span,
    grid_points,
    job_configs,
    job_encoding,
    model_line,
    point_label,
    point_root,
    positions_note,
    schedule_spec,
    setting,
    task_specs,
)
from posenc.data.corpora import load_tokens
from posenc.data.tasks import get_task
from posenc.errors import PosencError
from posenc.eval.diagnose import far_mass_records
from posenc.eval.passkey import passkey_records
from posenc.eval.perplexity import evaluate_length
from posenc.eval.tasks import evaluate_task, gate_leak
from posenc.jobs.launcher import check_same_settings, trained_job
from posenc.jobs.retrieval import task_meta
from posenc.jobs.sweep import Choice, choices, merge_chosen
from posenc.methods import parse as parse_method
from posenc.model import LM, ModelConfig, is_rope, set_method, with_rope_schedule
from posenc.reports import claims
from posenc.reports.sweep import sweep_markdown, write_sensitivity
from posenc.reports.tasks import write_task_report
from posenc.reports.text import with_ratios, write_report
from posenc.rope import schedule_label, schedule_params
from posenc.scoring import eval_lengths, window_starts
from posenc.store.checkpoint import check_run_dir, read_json, write_json
from posenc.store.lock import PARENT_VAR
from posenc.store.records import FarMass, PasskeyCell, Ppl, Record, RunStore, Task
from posenc.store.stamp import run_stamp, stamp_line
from posenc.train.batches import check_positions, randomized_max
from posenc.train.curves import loss_curve
from posenc.train.precision import machine_precision
from posenc.train.resume import read_log
from posenc.train.rundir import (
    check_trained_as,
    check_weights_config,
    is_trained,
    load_run,
    read_run_config,
    steps_to_criterion,
)
from posenc.train.settings import TrainConfig
from posenc.train.tracking import eval_metrics, task_metrics


@dataclasses.dataclass(frozen=True)
class Job:
    """What every kind of job has. ``preset``: the comparison's (its grid point's settings are in ``model`` and
    ``train``: ``posenc.config.plan.job_configs``); ``root``: its grid point's directory; ``log``: a tracker kind
    (``posenc.train.tracking``)."""

    kind: ClassVar[str]
    preset: Preset
    root: Path
    scheme: str
    seed: int
    model: ModelConfig
    train: TrainConfig
    point: Point = ()
    log: str = "none"

    @property
    def run_dir(self) -> Path:
        """The run directory it trains, or evaluates."""
        return self.root / self.scheme / f"seed{self.seed}"

    @property
    def error_file(self) -> Path:
        """Where a failure's traceback goes."""
        return self.run_dir.with_suffix(".error.txt")

    def key(self) -> tuple:
        """The job whatever it evaluates: a chosen point's full job completes its screening, one job."""
        return self.kind, self.scheme, self.seed, self.point

    def name(self) -> str:
        """The job in words, as failures name it: ``rope (seed 0)``, ``... at train.lr=0.001 (screening)``."""
        return f"{self.scheme} (seed {self.seed})" + (f" at {point_label(self.point)}" if self.point else "")

    def check(self) -> None:
        """PosencError before any work when the run it would report was trained with other settings."""

    def extensions(self) -> list[Job]:
        """The jobs that evaluate this one's trained model further (none)."""
        return []

    def source_of(self, run_root: Path, source: Path) -> Path | None:
        """The trained model it would take from another comparison (``posenc compare --trained-from``): only a job
        that trains takes one (:meth:`_Trains.source_of`)."""
        return None

    def adopt(self, run_root: Path, source: Path) -> bool:
        """Whether it took a trained model from another comparison (:meth:`_Trains.adopt`); a job that trains
        nothing takes none."""
        return False

    def done(self, store: RunStore) -> bool:
        raise NotImplementedError

    def run(self, store: RunStore) -> None:
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class _Trains(Job):
    """A job that trains its run: checked against the run's recorded settings first."""

    screening: bool = False  # a sweep's grid point on the first seed: evaluated at the training length only

    def name(self) -> str:
        return super().name() + (" (screening)" if self.screening else "")

    def check(self) -> None:
        # a file where its scheme's folder belongs leaves no place for the job's error file: one line before any job
        # starts (one at the seed's own folder fails that job alone, in its process)
        check_run_dir(self.run_dir.parent)
        check_trained_as(self.run_dir, self.model, self.train, f"{self.preset.name}'s job {self.name()}")

    def source_of(self, run_root: Path, source: Path) -> Path | None:
        """The finished run at this job's place in another comparison (``source``: its run root; the place:
        ``run_dir`` under ``run_root``) that :meth:`adopt` takes, or None: this job's run directory already holds a
        finished run, or ``source`` none there. PosencError (one line), nothing written, for one it cannot take:
        trained with other settings (``check_trained_as``: evaluation settings may differ, training ones may not),
        its weights damaged or not what its config.json says (``check_weights_config``), this job's run directory
        holding an unfinished training of its own, a model trained here where ``source`` has one, or one taken from
        another source (:func:`read_adopted`)."""
        src = source / self.run_dir.relative_to(run_root)
        taken = read_adopted(self.run_dir)
        if taken is not None and Path(taken["from"]) != source.resolve():
            raise PosencError(
                f"{self.run_dir} took its model from {taken['from']}: give that --trained-from, or leave it out"
            )
        if is_trained(self.run_dir):
            if taken is None and is_trained(src):
                raise PosencError(
                    f"{self.run_dir} holds a model trained here, not taken from {source}: leave out --trained-from "
                    "or give another --out"
                )
            return None
        if not is_trained(src):
            return None
        if (self.run_dir / "state.pt").exists() or (self.run_dir / "model.safetensors").exists():
            raise PosencError(f"{self.run_dir} holds an unfinished training of its own: move it away to take {src}")
        fix = "give --trained-from a comparison trained with this one's settings"
        check_trained_as(src, self.model, self.train, f"{self.preset.name}'s job {self.name()}", fix)
        if not (src / "config.json").is_file() or not (src / "model.safetensors").is_file():
            raise PosencError(f"--trained-from: {src} has no config.json or model.safetensors")
        recorded = read_run_config(src)
        check_weights_config(src, recorded["model"], recorded["train"])
        read_adopted(src)  # damaged: refused before the copy
        return src

    def adopt(self, run_root: Path, source: Path) -> bool:
        """Take the trained model :meth:`source_of` finds instead of training (``posenc compare --trained-from``):
        its files (:data:`TRAINED_FILES`) and :data:`ADOPTED` (the comparison it came from, the one that trained it
        and the commit it was trained at) are copied in and renamed into place (a run directory without a
        checkpoint, an interrupted job's, replaced). Returns whether it did. Its config.json keeps the stamp of the
        training; this job scores it anew."""
        src = self.source_of(run_root, source)
        if src is None:
            return False
        part = self.run_dir.with_name(f".{self.run_dir.name}.adopting")
        shutil.rmtree(part, ignore_errors=True)  # an earlier copy cut short
        part.mkdir(parents=True)
        for name in TRAINED_FILES:
            if (src / name).exists():
                shutil.copy2(src / name, part / name)
        here = str(source.resolve())
        first = read_adopted(src) or {  # a model the source itself took: the comparison that trained it
            "trained_in": here,
            "commit": str((read_run_config(src).get("stamp") or {}).get("commit")),
        }
        write_json(part / ADOPTED, {"from": here, "trained_in": first["trained_in"], "commit": first["commit"]})
        shutil.rmtree(self.run_dir, ignore_errors=True)  # no checkpoint there (source_of)
        part.rename(self.run_dir)
        return True


# what a finished run directory holds that its evaluation reads (the resume state, state.pt, is left behind)
TRAINED_FILES = ("config.json", "model.safetensors", "train_summary.json", "train.jsonl")
ADOPTED = "trained_from.json"  # in a run directory whose model was taken from another comparison (read_adopted)


def read_adopted(run_dir: Path) -> dict[str, str] | None:
    """``run_dir``'s :data:`ADOPTED` ({"from": the comparison's run root its model was copied from, "trained_in":
    the one that trained it, "commit": the commit it was trained at}), None without one; PosencError (one line)
    when damaged."""
    path = Path(run_dir) / ADOPTED
    if not path.is_file():
        return None
    got = read_json(path)
    if not all(isinstance(got.get(k), str) for k in ("from", "trained_in", "commit")):
        raise PosencError(f"{path} is damaged (from, trained_in and commit, each a string); repair or remove it")
    return got


def adopted_line(jobs: list[Job]) -> str | None:
    """The report's line for the models of ``jobs`` taken from other comparisons (:func:`read_adopted`), None when
    every one trained here: how many, from where, trained where and at which commits."""
    taken = [a for a in (read_adopted(j.run_dir) for j in jobs) if a]
    if not taken:
        return None
    froms, trained = sorted({t["from"] for t in taken}), sorted({t["trained_in"] for t in taken})
    commits = sorted({t["commit"] for t in taken})
    where = "" if trained == froms else f" (trained in {', '.join(trained)})"
    return (
        f"{len(taken)} of {len(jobs)} models taken from {', '.join(froms)}{where}, trained at commit "
        f"{', '.join(commits)}; scored here (posenc compare --trained-from)"
    )


@dataclasses.dataclass(frozen=True)
class TextJob(_Trains):
    """Train (or resume) one scheme and seed on text, then evaluate perplexity at every length of the preset, the
    passkey cells and the far-mass pass (a screening job: perplexity at the training length only, what the sweep's
    chooser reads; the chosen point's full job evaluates the rest). ``nproc`` > 1 trains data-parallel under
    torchrun (:func:`train_under_torchrun`); evaluation runs in the job's process."""

    kind: ClassVar[str] = "text"
    nproc: int = 1

    @staticmethod
    def prepare(preset: Preset, nproc: int):
        """(the preset, its tokens): bad input fails before anything is written; the
        held-out text must be long enough for the longest evaluation."""
        data = load_tokens(preset.train.corpus, preset.train.tokenizer)
        window_starts(data.val_docs, eval_span(preset), preset.eval.max_tokens, span=eval_span(preset))
        return preset, data

    @staticmethod
    def longest(preset: Preset) -> int:
        """The longest length a job evaluates."""
        return eval_span(preset)

    @staticmethod
    def report(plan: Plan, failures: dict[str, str], meta: dict) -> Path:
        """``report.md`` and its tables and plots (``posenc.reports.text.write_report``)."""
        trained = {c.scheme: job_encoding(c.shown, c.scheme) for c in plan.chosen if c.shown is not None}
        return write_report(plan.run_root, {**text_meta(plan.preset, plan.data, trained), **meta}, failures)

    def lengths(self) -> list[int]:
        L = self.model.train_length
        return [L] if self.screening else eval_lengths(L, self.preset.eval.multiples)

    def extras(self) -> set[tuple[str, int, float | None]]:
        """(kind, length, depth) of the passkey and far-mass records the full job writes."""
        ev, L = self.preset.eval, self.model.train_length
        keys: set[tuple[str, int, float | None]] = set()
        if ev.passkey.trials:
            lengths = eval_lengths(L, ev.passkey.lengths_multiples)
            keys |= {("passkey", n, d) for n in lengths for d in ev.passkey.depths}
        if ev.far_mass.windows:
            keys |= {("far_mass", n, None) for n in eval_lengths(L, ev.far_mass.multiples)}
        return keys

    def _mine(self, store: RunStore) -> list[Record]:
        return [
            r
            for r in store.records
            if isinstance(r, (Ppl, PasskeyCell, FarMass)) and (r.scheme, r.seed) == (self.scheme, self.seed)
        ]

    def done(self, store: RunStore) -> bool:
        mine = self._mine(store)
        cells = {r.eval_length for r in mine if isinstance(r, Ppl)}
        extras = {(r.kind, r.length, getattr(r, "depth", None)) for r in mine if not isinstance(r, Ppl)}
        return is_trained(self.run_dir) and set(self.lengths()) <= cells and (self.screening or self.extras() <= extras)

    def run(self, store: RunStore) -> None:
        preset, mcfg, tcfg = self.preset, self.model, self.train
        data = load_tokens(preset.train.corpus, preset.train.tokenizer)
        mine = self._mine(store)  # only this job writes its (scheme, seed) rows: it keeps them up to date itself
        config = {
            "name": preset.name,
            "scheme": self.scheme,
            "seed": self.seed,
            "model": dataclasses.asdict(mcfg),
            "train": tcfg.model_dump(),
            "eval": preset.eval.model_dump(),
        }
        torchrun = (lambda: train_under_torchrun(self)) if self.nproc > 1 else None
        name, desc = f"{preset.name}/{self.scheme}/seed{self.seed}", f"{self.scheme} s{self.seed}"
        with trained_job(self.run_dir, name, desc, mcfg, tcfg, config, self.log, data, torchrun) as (model, tracker):
            done = {r.eval_length for r in mine if isinstance(r, Ppl)}
            for L in self.lengths():
                if L in done:
                    continue
                rec = evaluate_length(
                    model,
                    data.val_docs,
                    L,
                    {"scheme": self.scheme, "seed": self.seed},
                    preset.eval.max_tokens,
                    preset.eval.batch_tokens,
                    span=eval_span(preset),
                    positions=randomized_max(tcfg.positions),
                )
                store.append(rec)
                mine.append(rec)
            if not self.screening:
                mine += self._extras(model, data, store, mine)
            evals = [*with_ratios([r for r in mine if isinstance(r, Ppl)]), *(r for r in mine if r.kind == "passkey")]
            tracker.log(eval_metrics(evals, mcfg.train_length), read_json(self.run_dir / "train_summary.json")["steps"])

    def _extras(self, model: LM, data, store: RunStore, mine: list[Record]) -> list[Record]:
        """The passkey cells and the far-mass pass not among ``mine``, appended; returns the new records."""
        ev = self.preset.eval
        base = {"scheme": self.scheme, "seed": self.seed, "train_length": self.model.train_length}
        done = {(r.kind, r.length, getattr(r, "depth", None)) for r in mine if not isinstance(r, Ppl)}
        todo = [m for m in ev.far_mass.multiples if ("far_mass", m * base["train_length"], None) not in done]
        new = [
            *passkey_records(model, data.tokenizer, ev.passkey, base, {(n, d) for k, n, d in done if k == "passkey"}),
            *far_mass_records(model, data.val_docs, ev.far_mass.model_copy(update={"multiples": todo}), base),
        ]
        for rec in new:
            store.append(rec)
        return new

    def extensions(self) -> list[Job]:
        at, common = at_point(self.preset, self.point), {f.name: getattr(self, f.name) for f in dataclasses.fields(Job)}
        schedules = [
            ScheduleJob(**common, order=(0, i), schedule=name, params=params)
            for i, (name, params) in enumerate(schedule_spec(spec, at) for spec in self.preset.eval_schedules)
            if is_rope(self.scheme)
        ]
        return [*schedules, *(MethodJob(**common, order=(1, i), method=m) for i, m in enumerate(at.eval_methods))]


@dataclasses.dataclass(frozen=True)
class TaskJob(_Trains):
    """Train (or resume) one scheme on one synthetic task and record its scores (one :class:`Task` record, written
    once; a screening scores the in-distribution test at the training length only, ``Task.screening``, and the
    later full job of the same run scores the other tests and records every one, the screened cells kept)."""

    kind: ClassVar[str] = "task"
    task: str = ""

    @staticmethod
    def prepare(preset: Preset, nproc: int):
        """(the preset, None: each job loads its task); PosencError for more than one process per job."""
        if nproc > 1:
            raise PosencError("synthetic-task comparisons train each job in one process: no --nproc-per-node")
        return preset, None

    @staticmethod
    def longest(preset: Preset) -> int:
        """The longest length a job evaluates: every test's of every task."""
        L = preset.model.train_length
        return max(t.length for spec in task_specs(preset) for t in get_task(spec).tests(L, preset.task_eval.multiples))

    @staticmethod
    def report(plan: Plan, failures: dict[str, str], meta: dict) -> Path:
        """The task report (``posenc.reports.tasks.write_task_report``)."""
        return write_task_report(plan.run_root, {**task_meta(plan.preset), **meta}, failures)

    @property
    def run_dir(self) -> Path:
        return self.root / self.task / self.scheme / f"seed{self.seed}"

    def key(self) -> tuple:
        return (*super().key(), self.task)

    def name(self) -> str:
        return f"{self.task} {super().name()}"

    def _records(self, store: RunStore) -> list[Task]:
        key = (self.task, self.scheme, self.seed)
        return [r for r in store.records if isinstance(r, Task) and (r.task, r.scheme, r.seed) == key]

    def done(self, store: RunStore) -> bool:
        recorded = self._records(store)
        return bool(recorded) and (self.screening or any(not r.screening for r in recorded))

    def run(self, store: RunStore) -> None:
        preset, mcfg, tcfg = self.preset, self.model, self.train
        data = load_tokens(self.task, tasks=True)
        config = {
            "name": preset.name,
            "task": self.task,
            "scheme": self.scheme,
            "seed": self.seed,
            "model": dataclasses.asdict(mcfg),
            "train": tcfg.model_dump(),
            "task_eval": preset.task_eval.model_dump(),
        }
        name = f"{preset.name}/{self.task}/{self.scheme}/seed{self.seed}"
        desc = f"{self.task} {self.scheme} s{self.seed}"
        with trained_job(self.run_dir, name, desc, mcfg, tcfg, config, self.log, data) as (model, tracker):
            ev, screened = preset.task_eval, self._records(store)
            t0 = time.time() - sum(r.eval_seconds for r in screened)  # the screening's time counts to the job's
            cells = evaluate_task(
                model,
                data.task,
                mcfg.train_length,
                [1] if self.screening else ev.multiples,
                ev.answers,
                ev.max_tokens,
                ev.batch_tokens,
                positions=randomized_max(tcfg.positions),
                done=[c.model_dump() for r in screened for c in r.cells],
                only=("id",) if self.screening else None,
                seed=self.seed,  # the probes are drawn from the run's seed (posenc.eval.tasks.cell_seed)
                se=ev.se,
            )
            summary = read_json(self.run_dir / "train_summary.json")
            record = Task(
                task=self.task,
                scheme=self.scheme,
                seed=self.seed,
                train_length=mcfg.train_length,
                train_seconds=summary["seconds"],
                eval_seconds=time.time() - t0,
                threads=run_stamp()["threads"],
                cells=cells,
                trained_steps=summary["steps"],
                criterion=tcfg.until.describe() if tcfg.until else None,
                criterion_step=steps_to_criterion(summary),
                n_head=mcfg.n_head,
                loss_curve=loss_curve(read_log(self.run_dir / "train.jsonl")),
                leak=gate_leak(model, data.task, mcfg.train_length),
                encoding=mcfg.encoding,
                screening=self.screening,
            )
            store.append(record)
            tracker.log(task_metrics(record.cells, mcfg.train_length), summary["steps"])


@dataclasses.dataclass(frozen=True)
class _Evaluates(Job):
    """Perplexity rows of a trained text run under something applied to its model, at every length of the preset;
    nothing to do while the run is not trained (its training job failed: reported there) or where it does not
    apply. ``order``: its place among a run's rows (schedules first, each kind in the preset's order)."""

    order: tuple[int, int] = (0, 0)

    def label(self) -> str:
        """The rows' scheme label."""
        raise NotImplementedError

    def applied(self) -> tuple[LM, dict] | None:
        """The trained model with it applied and the rows' fields; None when it does not apply to the scheme."""
        raise NotImplementedError

    @property
    def error_file(self) -> Path:
        return self.root / self.scheme / f"seed{self.seed}+{self.label()}.error.txt"

    def key(self) -> tuple:
        return (*super().key(), self.label())

    def name(self) -> str:
        return f"{self.label()} (seed {self.seed})"

    def _missing(self, store: RunStore) -> list[int]:
        key = (self.label(), self.seed)
        done = {r.eval_length for r in store.records if isinstance(r, Ppl) and (r.scheme, r.seed) == key}
        return [L for L in eval_lengths(self.model.train_length, self.preset.eval.multiples) if L not in done]

    def done(self, store: RunStore) -> bool:
        return not is_trained(self.run_dir) or not self._missing(store)

    def run(self, store: RunStore) -> None:
        got = self.applied()
        if got is None:
            return
        model, fields = got
        ev, data = self.preset.eval, load_tokens(self.preset.train.corpus, self.preset.train.tokenizer)
        for L in self._missing(store):
            store.append(
                evaluate_length(
                    model, data.val_docs, L, fields, ev.max_tokens, ev.batch_tokens, span=eval_span(self.preset)
                )
            )


@dataclasses.dataclass(frozen=True)
class ScheduleJob(_Evaluates):
    """A RoPE context-extension schedule (``eval_schedules``, its validated ``params``) on a trained RoPE run: rows
    labelled as ``posenc.model.with_rope_schedule`` labels them (``rope+yarn(s=8)``)."""

    kind: ClassVar[str] = "schedule"
    schedule: str = ""
    params: dict = dataclasses.field(default_factory=dict)

    def label(self) -> str:
        full = schedule_params(self.schedule, self.model.train_length, self.params)
        return f"{self.model.encoding}+{schedule_label(self.schedule, full, self.model.train_length)}"

    def name(self) -> str:
        return f"{self.scheme}+{self.schedule} (seed {self.seed})"

    def applied(self) -> tuple[LM, dict]:
        model, label = with_rope_schedule(load_run(self.run_dir)[0], self.schedule, self.params)
        return model, {"scheme": label, "seed": self.seed}


@dataclasses.dataclass(frozen=True)
class MethodJob(_Evaluates):
    """An inference method (``eval_methods``, ``posenc.methods``) on a trained run: rows ``<scheme>+<method>`` with
    the method's full spec; none for a scheme it does not apply to (``posenc.model.set_method`` refuses it)."""

    kind: ClassVar[str] = "method"
    method: str = ""

    def label(self) -> str:
        return f"{self.scheme}+{parse_method(self.method, self.model.train_length).describe()}"

    def done(self, store: RunStore) -> bool:
        return super().done(store) or self.applied() is None

    def applied(self) -> tuple[LM, dict] | None:
        model = load_run(self.run_dir)[0]
        try:
            method = set_method(model, self.method)
        except PosencError:  # not a scheme the method applies to
            return None
        return model, {"scheme": self.label(), "seed": self.seed, "method": method.label()}


class Plan:
    """The stages of a comparison, each a list of jobs (``stages``). ``preset``: the comparison's (its corpus
    absolute: ``posenc.config.plan.absolute_corpus``); ``vocab``: the text corpus's vocabulary size (a task job
    takes its task's); ``log`` and ``nproc`` as the jobs'.

    Without a sweep: one job per (task,) scheme and seed, then the schedule and method rows of the trained text
    runs. With one, every grid point of each scheme first on the first seed (screening jobs), then each scheme's
    choice from their records (``posenc.jobs.sweep.choices``; ``chosen`` after that stage) on every seed (the first
    seed's completes its screening; a task none of whose points learned: its best point on the first seed), then
    the rows."""

    def __init__(self, preset: Preset, out_root: Path, log: str = "none", nproc: int = 1):
        self.tasks = task_specs(preset)
        self.kind: type[TextJob] | type[TaskJob] = TaskJob if self.tasks else TextJob  # the one choice of kind
        self.preset, self.data = absolute_corpus(preset), None
        self.run_root, self.log, self.nproc = Path(out_root) / preset.name, log, nproc
        self.grids = {s: grid_points(preset, s) for s in preset.schemes}
        self.points = list(dict.fromkeys(p for grid in self.grids.values() for p in grid))
        self.chosen: list[Choice] = []
        self.final: list[Job] = []

    def check(self) -> None:
        """PosencError (one line) before any work: the kind's own checks (``prepare``: a text corpus is loaded),
        then :meth:`check_settings`."""
        self.preset, self.data = self.kind.prepare(self.preset, self.nproc)
        self.check_settings()

    def check_settings(self) -> None:
        """PosencError (one line) for what needs nothing loaded (``posenc compare --dry-run`` checks it too):
        randomized training positions that a scheme (each variant) refuses or that cannot place the longest
        evaluation (the jobs score such a model on randomized positions too, ``posenc.data.positions``), or a run
        directory holding results made with other settings (``posenc.jobs.launcher.check_same_settings``) or a
        ``posenc train`` run (its ``config.json``: the two would share one folder)."""
        p = self.preset
        if (self.run_root / "config.json").exists():
            raise PosencError(
                f"{self.run_root} holds a posenc train run (config.json): give compare another --name or --out"
            )
        for s in p.schemes:
            for spec in dict.fromkeys(job_encoding(g, s) for g in self.grids[s]):
                check_positions(dataclasses.replace(p.model, encoding=spec), p.train)
        n = randomized_max(p.train.positions)
        if n is not None and self.kind.longest(p) > n:
            raise PosencError(
                f"train.positions {p.train.positions!r}: max must be >= the longest evaluation length "
                f"{self.kind.longest(p)} (the model is scored on randomized positions too)"
            )
        check_same_settings(self.run_root, p)
        for g in self.points:
            if g:
                check_same_settings(point_root(self.run_root, g), at_point(p, g))
        if self.kind is TextJob:
            check_methods_apply(p)

    def at(self, point: Point) -> Preset:
        """The preset of a grid point's directory: its settings, the schemes that train there."""
        return at_point(self.preset, point).model_copy(
            update={"schemes": [s for s in self.preset.schemes if point in self.grids[s]]}
        )

    def roots(self) -> list[Path]:
        """Each grid point's directory (``run_root`` alone without a sweep)."""
        return [point_root(self.run_root, p) for p in self.points]

    def job(self, task: str | None, scheme: str, seed: int, point: Point = (), screening: bool = False) -> Job:
        """The training job of (task, scheme, seed) at ``point``."""
        vocab = get_task(task).vocab_size if task else self.data.vocab_size
        mcfg, tcfg = job_configs(self.preset, point, scheme, seed, vocab, task)
        common = dict(
            preset=self.preset,
            root=point_root(self.run_root, point),
            scheme=scheme,
            seed=seed,
            model=mcfg,
            train=tcfg,
            point=point,
            log=self.log,
            screening=screening,
        )
        return TaskJob(**common, task=task) if task else TextJob(**common, nproc=self.nproc)

    def first_stage(self) -> list[Job]:
        """The first stage's jobs, known before any job runs (after :meth:`check`): a sweep's screening, else every
        training job."""
        p, units = self.preset, self.tasks or [None]
        if p.sweep is None:
            return [self.job(t, s, seed) for t in units for s in p.schemes for seed in p.seeds]
        return [self.job(t, s, p.seeds[0], g, screening=True) for t in units for s in p.schemes for g in self.grids[s]]

    def stages(self, stores: dict[Path, RunStore]) -> Iterator[list[Job]]:
        """The stages in order; each after the one before has run (``stores``: each grid point's records, read up
        to date by then)."""
        p, units, first = self.preset, self.tasks or [None], self.preset.seeds[0]
        if p.sweep is None:
            final = self.first_stage()
        else:
            yield self.first_stage()
            L, bar = p.model.train_length, p.task_eval.learned
            self.chosen = choices(stores, self.run_root, units, self.grids, first, L, bar)
            final = [
                self.job(c.task, c.scheme, k, c.point) for c in self.chosen if c.point is not None for k in p.seeds
            ]
            final += [  # a task none of whose points learned: its best point, on the first seed
                self.job(c.task, c.scheme, first, c.shown)
                for c in self.chosen
                if c.point is None and c.shown is not None
            ]
        self.final = final
        yield final
        yield sorted((x for j in final for x in j.extensions()), key=lambda x: x.order)

    def outline(self) -> dict[str, list[str]]:
        """The jobs of each stage in words, without loading or running anything (``posenc compare --dry-run``); a
        sweep's chosen points are known only after its screening."""
        p, units, first = self.preset, self.tasks or [None], self.preset.seeds[0]

        def named(t: str | None, s: str, k: int, at: str = "") -> str:
            return f"{t + ' ' if t else ''}{s} (seed {k}){at}"

        out = {}
        if p.sweep is None:
            out["jobs"] = [named(t, s, k) for t in units for s in p.schemes for k in p.seeds]
        else:
            out["screening"] = [
                named(t, s, first, f" at {point_label(g)} (screening)")
                for t in units
                for s in p.schemes
                for g in self.grids[s]
            ]
            out["chosen"] = [named(t, s, k, " at its chosen point") for t in units for s in p.schemes for k in p.seeds]
        if not self.tasks:
            rows = [f"{s}+{spec['schedule']}" for spec in p.eval_schedules for s in p.schemes if is_rope(s)]
            refused = {m: refused_schemes(p, m) for m in p.eval_methods}  # one model per scheme and method
            rows += [f"{s}+{m}" for m in p.eval_methods for s in p.schemes if s not in refused[m]]
            if rows:  # a method row only where the method applies to the scheme
                out["rows"] = [named(None, r, k) for r in rows for k in p.seeds]
        return out

    def sweep_lines(self, stores: dict[Path, RunStore]) -> list[str]:
        """With a sweep: the chosen runs' records merged into ``run_root/results.jsonl`` (``merge_chosen``), the
        sensitivity table and plot written; the report's sweep lines. [] without one."""
        if self.preset.sweep is None:
            return []
        first, learned = self.preset.seeds[0], self.preset.task_eval.learned
        merge_chosen(stores, self.run_root, self.chosen, self.preset.schemes)
        return sweep_markdown(self.chosen, first, write_sensitivity(self.run_root, self.chosen, first, learned))


def refused_schemes(preset: Preset, spec: str) -> dict[str, str]:
    """The schemes of ``preset`` that method ``spec`` does not apply to, each with the reason: ``set_method`` on the
    scheme's untrained model, the refusal that skips its :class:`MethodJob`."""
    refused = {}
    for scheme in preset.schemes:
        with torch.random.fork_rng():  # the draws of building a model leave the caller's generator as it was
            model = LM(dataclasses.replace(preset.model, encoding=scheme))
        try:
            set_method(model, spec)
        except PosencError as exc:
            refused[scheme] = str(exc).split("; ")[0]
    return refused


def check_methods_apply(preset: Preset) -> None:
    """PosencError (one line) for an ``eval_methods`` entry that applies to none of the schemes; a warning naming
    those it gets no row for."""
    for spec in preset.eval_methods:
        refused = refused_schemes(preset, spec)
        why = next(iter(refused.values()), "")
        if len(refused) == len(preset.schemes):
            raise PosencError(f"eval_methods {spec!r}: applies to none of the schemes ({why})")
        if refused:
            print(f"posenc: warning: eval_methods {spec!r}: no row for {', '.join(refused)} ({why})", file=sys.stderr)


def text_meta(preset: Preset, data, trained: dict[str, str] | None = None) -> dict:
    """The text report's header: corpus, model, budget, evaluation, each scheme's description and the registered sets'
    quantities (``posenc.reports.claims.Quantity``; of the spec each scheme trained: ``trained`` maps a swept scheme
    to its chosen variant, ``posenc.config.plan.job_encoding``)."""
    mcfg = dataclasses.replace(preset.model, vocab_size=data.vocab_size)
    values, trained = claims.scheme_quantities(preset), trained or {}
    return {
        "name": preset.name,
        "train_length": preset.model.train_length,
        "corpus": (
            f"{preset.train.corpus} ({len(data.train):,} training tokens; "
            f"held out: {', '.join(n for n, _ in data.val_docs)})"
        ),
        "tokenizer": f"{preset.train.tokenizer} (vocab {data.vocab_size})",
        "model": model_line(preset),
        "budget": (
            f"{setting(preset, 'train.steps')} steps x {preset.train.batch_size} x {preset.model.train_length} tokens, "
            f"lr {setting(preset, 'train.lr')}{positions_note(preset)}"
        ),
        "seeds": preset.seeds,
        "eval": (
            "non-overlapping windows; every length scores the same text: "
            f"the first {eval_span(preset)} targets of each of the first "
            f"{-(-preset.eval.max_tokens // eval_span(preset))} held-out works"
        ),
        "descriptions": {s: encodings.describe(s, mcfg.dims(), **mcfg.encoding_params) for s in preset.schemes},
        "quantities": {q: {s: v[trained.get(s, s)] for s in preset.schemes} for q, v in values.items()},
        "notes": preset.description or None,
        "run": stamp_line(run_stamp(machine_precision(preset.train))),
    }


def train_under_torchrun(job: TextJob) -> None:
    """Train (or resume) ``job`` data-parallel: ``posenc train`` under torchrun with ``job.nproc`` processes on this
    machine, reading its grid point's ``preset.json`` (the resolved preset), so the run is the one the sweep would
    train. PosencError with posenc's own error line, else a rank's last exception line."""
    out = job.run_dir
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(job.nproc),
        "-m",
        "posenc.cli.main",
        "train",
        "--scheme",
        job.scheme,
        "--preset",
        str(job.root / "preset.json"),
        "--seed",
        str(job.seed),
        "--out",
        str(out),
    ] + (["--resume"] if (out / "config.json").exists() else [])
    # torchrun's own parser takes any "--log..." as an abbreviation of its --log-dir: the tracker goes by environment;
    # the run directory is inside the run root this job's compare holds (posenc.store.lock.PARENT_VAR)
    env = {**os.environ, "POSENC_LOG": job.log, PARENT_VAR: str(job.root)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:  # posenc's own error, else a rank's last exception line (torchrun's summary ends in "===")
        err = proc.stderr.splitlines()
        lines = (
            [line for line in err if "posenc: error:" in line]
            or [line for line in err if line.startswith("[rank") and ("Error" in line or "Exception" in line)][-1:]
            or [line for line in err if "exitcode" in line][:1]
            or proc.stderr.strip().splitlines()[-1:]
        )
        raise PosencError(
            f"torchrun training of {job.scheme} (seed {job.seed}) failed: "
            f"{lines[0] if lines else f'exit code {proc.returncode}'}"
        )
