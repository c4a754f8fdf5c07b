"""The main job: train one model per scheme under one budget, evaluate, report; the one runner of comparisons.

``compare(preset)`` checks the preset and the run directories, runs each stage's pending jobs (``posenc.jobs.job``:
the plan of a preset, each job a frozen record that knows when it is done) and writes the report of their kind.
A job trains each scheme (and seed; on each task of a task preset) into ``runs/<name>/<scheme>/seed<k>``, evaluates
it and appends its records to ``runs/<name>/results.jsonl`` through the run's store (``posenc.store.records.RunStore``:
each file read once per invocation); a preset's ``sweep`` adds grid points (``posenc.jobs.sweep``). Rerunning skips
finished jobs and resumes interrupted ones. Each job runs in its own process (``posenc.jobs.launcher.Launcher``), so a
job that raises, produces NaN, segfaults or is killed for memory is reported as failed with a one-line error (full
traceback in its ``.error.txt``) and the other jobs' results are kept.
"""

from __future__ import annotations

import sys
from pathlib import Path

from posenc.config.plan import ClusterConfig, Preset, point_root
from posenc.errors import PosencError
from posenc.eval.progress import bar, note
from posenc.jobs.job import ADOPTED, Job, Plan, adopted_line, read_adopted
from posenc.jobs.launcher import Launcher, finish_run, record_run
from posenc.store.lock import hold_run_dir
from posenc.store.records import RunStore
from posenc.store.stamp import wall_line
from posenc.train.rundir import is_trained
from posenc.train.tracking import check_kind


def compare(
    preset: Preset,
    out_root: Path = Path("runs"),
    isolate: bool = True,
    parallel: int = 1,
    nproc_per_node: int = 1,
    log: str = "none",
    launcher: str = "pool",
    cluster: ClusterConfig | None = None,
    device: str | None = None,
    trained_from: Path | None = None,
) -> tuple[Path, dict[str, str]]:
    """Run the whole comparison, on text or on synthetic tasks; returns the report path and the failed jobs
    ({job: one-line error}).

    The stages are ``posenc.jobs.job.Plan``'s: with a ``sweep``, every scheme's grid points screened on the first
    seed (each point a run directory of its own under ``out_root/name/sweep/``), then each scheme at its chosen
    point on every seed, then the schedule and method rows; the report (``out_root/name/``: with a sweep, the chosen
    runs' records merged into ``results.jsonl``, rewritten each time) names the choices and shows the sensitivity
    table and plot. Each invocation's stamp in ``invocations.jsonl`` gets its start and end (UTC); the report's
    header sums them. A bar on stderr counts each stage's jobs done with an ETA (``posenc.eval.progress``).

    ``isolate``, ``parallel``, ``nproc_per_node`` (processes per job, torchrun; text only), ``launcher``, ``cluster``
    (default the preset's) and ``device``: how the jobs run (``posenc.jobs.launcher.Launcher``); ``log``: a tracker kind
    for every job (``posenc.train.tracking``). ``trained_from``: another comparison's run root whose trained models
    the jobs take where they have none (``posenc.jobs.job._Trains.adopt``): scored anew under this preset's
    evaluation settings; PosencError when the first stage finds none there. Raises PosencError before any work for
    bad input (``Plan.check``, the launcher's settings, a missing tracker, a run root another posenc process holds:
    ``posenc.store.lock``), when a run a job would report was trained with other settings than the job's
    (``train.check_trained_as``: a run copied in from another budget), and, after the jobs, when none of the jobs
    the report shows finished (each failure was said in one line; the records are kept).
    """
    check_kind(log)
    run_root = Path(out_root) / preset.name
    jobs = Launcher(
        launcher,
        isolate,
        parallel,
        nproc_per_node,
        cluster or preset.cluster,
        device,
        run_root / "submitit",
        f"posenc-{preset.name}",
    )
    plan = Plan(preset, out_root, log, nproc_per_node)
    hold_run_dir(run_root)  # before its settings are read; record_run holds a new one (posenc.store.lock)
    plan.check()
    for marker in run_root.rglob(ADOPTED):  # a damaged record of where a model came from: before anything is written
        read_adopted(marker.parent)
    if trained_from is not None:  # refused before anything is written
        check_source(plan, trained_from)
    opened = [(point_root(run_root, p), record_run(point_root(run_root, p), plan.at(p))) for p in plan.points]
    if plan.points != [()]:  # the comparison's own directory, beside its grid points'
        opened.insert(0, (run_root, record_run(run_root, plan.preset)))
    stores = {root: RunStore(root / "results.jsonl") for root in plan.roots()}
    failures: dict[str, str] = {}

    def failed(job: Job, error: str) -> None:  # one broken job must not lose the others
        failures[job.name()] = error
        print(f"posenc: {job.name()} failed: {error}", file=sys.stderr)  # now, not when the sweep ends

    try:
        seen, pending = set(), 0
        for i, stage in enumerate(plan.stages(stores), 1):
            if trained_from is not None:
                adopt(stage, run_root, trained_from)
            for job in stage:
                job.check()
            todo = [job for job in stage if not job.done(stores[job.root])]
            seen |= {job.key() for job in stage}
            pending += len(todo)
            with bar(len(todo), desc=f"{preset.name} stage {i}", unit="job", shown=bool(todo)) as progress:
                jobs.run(todo, stores, failed, lambda: progress.update())
            for store in stores.values():
                store.refresh()
        if not pending:
            note(f"posenc: all {len(seen)} jobs already done in {run_root} (the report is rewritten)")
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the time up to the stop counts in the run's wall time
        for root, stamp in opened:
            finish_run(root, stamp, interrupted=True)
        raise
    calls = [finish_run(root, stamp) for root, stamp in opened]  # every directory's line closed
    if not any(job.done(stores[job.root]) for job in plan.final):
        raise PosencError(
            f"no job finished ({len(failures)} failed, each said above); the records are kept in {run_root}"
        )
    meta = {"sweep": plan.sweep_lines(stores), "wall": wall_line(calls[0]), "trained": adopted_line(plan.final)}
    return plan.kind.report(plan, failures, meta), failures


def check_source(plan: Plan, source: Path) -> None:
    """PosencError (one line) before any work when ``source`` (``--trained-from``) holds a model the first stage's
    jobs cannot take (``_Trains.source_of``) or none at any of their places (a wrong path)."""
    jobs = plan.first_stage()
    for job in jobs:
        job.source_of(plan.run_root, source)
    if not any(is_trained(source / job.run_dir.relative_to(plan.run_root)) for job in jobs):
        raise PosencError(
            f"--trained-from {source}: no trained model where this comparison's jobs would take one (a committed "
            "results/ folder holds records only: give the runs/NAME folder the comparison trained)"
        )


def adopt(stage: list[Job], run_root: Path, source: Path) -> None:
    """Each training job of ``stage`` takes its trained model from ``source`` (``_Trains.adopt``), said in one line."""
    taken = sum(job.adopt(run_root, source) for job in stage)
    if taken:
        note(f"posenc: {taken} trained model(s) taken from {source}; scored under this preset's evaluation settings")
