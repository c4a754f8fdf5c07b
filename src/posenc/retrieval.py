"""Comparisons on synthetic tasks: does a scheme still *use* what lies beyond its training length?

``compare_tasks(preset)`` trains one model per (task, scheme, seed) into
``runs/<name>/<task>/<scheme>/seed<k>`` on the task's generator (``posenc.tasks``), scores
it with ``posenc.taskeval`` and appends one record per job to ``runs/<name>/results.jsonl``
(``kind: "task"``: the cells of every test, length and evidence-distance bucket), then writes
the report (``posenc.retrieval_report``). Jobs run isolated and resume like ``posenc.compare``.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

from posenc.checkpoint import read_json
from posenc.config import ClusterConfig, Preset, task_specs
from posenc.data import load_tokens
from posenc.errors import PosencError
from posenc.jobs import check_same_settings, executor, record_run, run_inline, run_pool, run_submitit, scheme_modules
from posenc.records import Task, append, drop_torn_tail, load
from posenc.retrieval_report import write_task_report
from posenc.stamp import run_stamp
from posenc.taskeval import evaluate_task
from posenc.tasks import get_task
from posenc.tracking import open_tracker, task_metrics
from posenc.train import is_trained, load_run, machine_precision, steps_to_criterion, train


def done_jobs(results: Path) -> set[tuple[str, str, int]]:
    """(task, scheme, seed) of every task record in ``results``."""
    return {(r.task, r.scheme, r.seed) for r in load(results) if isinstance(r, Task)}


def run_task_job(run_root: Path, preset: Preset, task: str, scheme: str, seed: int, log: str = "none") -> None:
    """Train (or resume) one scheme on one task and record its scores (one record, written once).
    ``log``: a tracker kind (``posenc.tracking``) for the training steps and the accuracies per test and length."""
    data = load_tokens(task, tasks=True)
    run_dir = run_root / task / scheme / f"seed{seed}"
    mcfg = dataclasses.replace(preset.model, encoding=scheme, vocab_size=data.vocab_size)
    tcfg = preset.train.model_copy(update={"seed": seed, "corpus": task})
    config = {"name": preset.name, "task": task, "scheme": scheme, "seed": seed, "model": dataclasses.asdict(mcfg), "train": tcfg.model_dump(),
              "task_eval": preset.task_eval.model_dump(), "stamp": run_stamp(machine_precision(tcfg))}
    with open_tracker(log, run_dir, f"{preset.name}/{task}/{scheme}/seed{seed}", preset.name, config) as tracker:
        if not is_trained(run_dir):
            train(run_dir, mcfg, tcfg, resume=True, data=data, desc=f"{task} {scheme} s{seed}", tracker=tracker)
        model = load_run(run_dir)[0]
        ev = preset.task_eval
        t0 = time.time()
        cells = evaluate_task(model, data.task, mcfg.train_length, ev.multiples, ev.answers, ev.max_tokens, ev.batch_tokens)
        summary = read_json(run_dir / "train_summary.json")
        record = Task(task=task, scheme=scheme, seed=seed, train_length=mcfg.train_length, train_seconds=summary["seconds"],
                      eval_seconds=time.time() - t0, threads=run_stamp()["threads"], cells=cells, trained_steps=summary["steps"],
                      criterion=tcfg.until.describe() if tcfg.until else None, criterion_step=steps_to_criterion(summary))
        append(run_root / "results.jsonl", record)
        tracker.log(task_metrics(record.cells, mcfg.train_length), summary["steps"])


def compare_tasks(preset: Preset, out_root: Path = Path("runs"), isolate: bool = True, parallel: int = 1, log: str = "none",
                  launcher: str = "pool", cluster: ClusterConfig | None = None) -> tuple[Path, dict[str, str]]:
    """Every (task, scheme, seed) of ``preset`` trained, scored and reported; returns the report path and
    the failed jobs ({job: one-line error}). ``log``, ``launcher`` and ``cluster`` as in ``posenc.compare.compare``
    (the caller checks them). Raises PosencError before any work for a run directory of other settings."""
    if parallel < 1 or (not isolate and parallel > 1):
        raise PosencError(f"--parallel must be >= 1 and needs job isolation, got {parallel}")
    run_root = Path(out_root) / preset.name
    tasks = task_specs(preset)
    for task in tasks:
        get_task(task).check_length(preset.model.train_length)
    check_same_settings(run_root, preset)
    ex = executor(launcher, run_root / "submitit", cluster, f"posenc-{preset.name}") if launcher != "pool" else None
    record_run(run_root, preset)
    results = run_root / "results.jsonl"
    drop_torn_tail(results)
    done = done_jobs(results)
    pending = [(t, s, seed) for t in tasks for s in preset.schemes for seed in preset.seeds if (t, s, seed) not in done]
    failures: dict[str, str] = {}

    def failed(task: str, scheme: str, seed: int, error: str) -> None:
        failures[f"{task} {scheme} (seed {seed})"] = error
        print(f"posenc: {task} {scheme} (seed {seed}) failed: {error}", file=sys.stderr)

    def error_file(task: str, scheme: str, seed: int) -> Path:
        return run_root / task / scheme / f"seed{seed}.error.txt"

    jobs = [(run_task_job, (run_root, preset, *job, log), error_file(*job), scheme_modules([job[1]])) for job in pending]
    if ex is not None:
        run_submitit(jobs, ex, poll_s=1 if launcher == "local" else 30, on_failure=lambda i, error: failed(*pending[i], error))
    elif isolate:
        run_pool(jobs, parallel, on_failure=lambda i, error: failed(*pending[i], error))
    else:
        for job in pending:
            error = run_inline(run_task_job, (run_root, preset, *job, log), error_file(*job))
            if error:
                failed(*job, error)
    return write_task_report(run_root, task_meta(preset), failures), failures


def task_meta(preset: Preset) -> dict:
    """The report's header: tasks, model, budget, evaluation, each scheme's mixing window, the stamp."""
    m, t = preset.model, preset.train
    return {
        "name": preset.name,
        "train_length": m.train_length,
        "tasks": {spec: get_task(spec).describe() for spec in task_specs(preset)},
        "model": f"{m.n_layer} layers, width {m.d_model}, {m.n_head} heads, {m.mlp}, {m.norm}, train length {m.train_length}",
        "budget": f"{t.steps} steps x {t.batch_size} sequences of {m.train_length} tokens, lr {t.lr}, loss on {t.loss}"
                  + (f"; until {t.until.describe()} (steps is the cap)" if t.until else ""),
        "seeds": preset.seeds,
        "eval": preset.task_eval.model_dump(),
        "mixing_windows": {s: dataclasses.replace(m, encoding=s).mixing_window() for s in preset.schemes},
        "text_results": preset.text_results,
        "reference": preset.reference,
        "notes": preset.description or None,
        "stamp": run_stamp(),
    }
