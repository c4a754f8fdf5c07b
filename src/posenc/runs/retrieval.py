"""The job of a comparison on synthetic tasks: does a scheme still *use* what lies beyond its training length?

``run_task_job`` trains one model per (task, scheme, seed) into
``runs/<name>/<task>/<scheme>/seed<k>`` (under ``sweep/<grid point>/`` in a sweep) on the task's generator
(``posenc.data.tasks``), scores it with ``posenc.eval.tasks`` and appends one record per job to the ``results.jsonl``
beside it (``kind: "task"``: the cells of every test, length and evidence-distance bucket). ``posenc.runs.compare``
runs the jobs (isolated, resumable) and writes the report (``posenc.reports.tasks``).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from posenc.config.plan import (
    Point,
    Preset,
    job_configs,
    mixing_windows,
    model_line,
    point_root,
    positions_note,
    setting,
    task_specs,
)
from posenc.data.corpora import load_tokens
from posenc.data.tasks import get_task
from posenc.eval.tasks import evaluate_task, gate_leak
from posenc.runs.jobs import trained_job
from posenc.store.checkpoint import read_json, read_jsonl
from posenc.store.records import Record, Task, append, load
from posenc.store.stamp import run_stamp
from posenc.train.loop import machine_precision, randomized_max, steps_to_criterion
from posenc.train.tracking import task_metrics


def done_jobs(recs: list[Record]) -> dict[tuple[str, str, int], bool]:
    """{(task, scheme, seed): whether its record is a screening only (``Task.screening``)} of every task job recorded
    among ``recs`` (a results.jsonl's, read once; a job with a full record counts as full)."""
    out: dict[tuple[str, str, int], bool] = {}
    for r in recs:
        if isinstance(r, Task):
            key = (r.task, r.scheme, r.seed)
            out[key] = out.get(key, True) and r.screening
    return out


def run_task_job(
    run_root: Path,
    preset: Preset,
    task: str,
    scheme: str,
    seed: int,
    log: str = "none",
    point: Point = (),
    screening: bool = False,
) -> None:
    """Train (or resume) one scheme on one task at grid ``point`` (``posenc.config.plan.grid_points``; () without a
    sweep) and record its scores (one record, written once). ``log``: a tracker kind (``posenc.train.tracking``) for the
    training steps and the accuracies per test and length. ``screening``: score the in-distribution test at the
    training length only (a sweep's grid point: all the chooser reads; ``Task.screening``); a later full job of the
    same run scores the other tests and records every one, the screened cells kept."""
    data = load_tokens(task, tasks=True)
    root, key = point_root(run_root, point), (task, scheme, seed)
    run_dir = root / task / scheme / f"seed{seed}"
    mcfg, tcfg = job_configs(preset, point, scheme, seed, data.vocab_size, task)
    config = {
        "name": preset.name,
        "task": task,
        "scheme": scheme,
        "seed": seed,
        "model": dataclasses.asdict(mcfg),
        "train": tcfg.model_dump(),
        "task_eval": preset.task_eval.model_dump(),
    }
    name, desc = f"{preset.name}/{task}/{scheme}/seed{seed}", f"{task} {scheme} s{seed}"
    with trained_job(run_dir, name, desc, mcfg, tcfg, config, log, data) as (model, tracker):
        ev = preset.task_eval
        screened = [
            r for r in load(root / "results.jsonl") if isinstance(r, Task) and (r.task, r.scheme, r.seed) == key
        ]
        t0 = time.time() - sum(r.eval_seconds for r in screened)  # the screening's time counts to the job's
        cells = evaluate_task(
            model,
            data.task,
            mcfg.train_length,
            [1] if screening else ev.multiples,
            ev.answers,
            ev.max_tokens,
            ev.batch_tokens,
            positions=randomized_max(tcfg.positions),
            done=[c.model_dump() for r in screened for c in r.cells],
            only=("id",) if screening else None,
            seed=seed,  # the probes are drawn from the run's seed (posenc.eval.tasks.cell_seed)
        )
        summary = read_json(run_dir / "train_summary.json")
        record = Task(
            task=task,
            scheme=scheme,
            seed=seed,
            train_length=mcfg.train_length,
            train_seconds=summary["seconds"],
            eval_seconds=time.time() - t0,
            threads=run_stamp()["threads"],
            cells=cells,
            trained_steps=summary["steps"],
            criterion=tcfg.until.describe() if tcfg.until else None,
            criterion_step=steps_to_criterion(summary),
            n_head=mcfg.n_head,
            loss_curve=[(r["step"], r["loss"]) for r in read_jsonl(run_dir / "train.jsonl")],
            leak=gate_leak(model, data.task, mcfg.train_length),
            encoding=mcfg.encoding,
            screening=screening,
        )
        append(root / "results.jsonl", record)
        tracker.log(task_metrics(record.cells, mcfg.train_length), summary["steps"])


def task_meta(preset: Preset) -> dict:
    """The report's header: tasks, model, budget, evaluation, each scheme's mixing window, the stamp."""
    m, t = preset.model, preset.train
    return {
        "name": preset.name,
        "train_length": m.train_length,
        "tasks": {spec: get_task(spec).describe() for spec in task_specs(preset)},
        "model": model_line(preset),
        "n_head": m.n_head,  # the head count of records without their own (retrieval_report.claim_alibi_slopes)
        "budget": (
            f"{setting(preset, 'train.steps')} steps x {t.batch_size} sequences of {m.train_length} tokens, "
            f"lr {setting(preset, 'train.lr')}, loss on {t.loss}{positions_note(preset)}"
        )
        + (f"; until {t.until.describe()} (steps is the cap)" if t.until else ""),
        "seeds": preset.seeds,
        "eval": preset.task_eval.model_dump(),
        "mixing_windows": mixing_windows(preset),
        "text_results": preset.text_results,
        "reference": preset.reference,
        "notes": preset.description or None,
        "stamp": run_stamp(machine_precision(t)),  # the precision the jobs train at, not auto's pick
    }
