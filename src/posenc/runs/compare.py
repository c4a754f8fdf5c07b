"""The main job: train one model per scheme under one budget, evaluate, report; the one runner of comparisons.

``compare(preset)`` trains each scheme (and seed) into ``runs/<name>/<scheme>/seed<k>``,
evaluates perplexity at every length of the preset (and the passkey cells and the
cheap far-mass pass: ``compare_extras``), appends one record per evaluation to
``runs/<name>/results.jsonl`` and writes the report. A task preset runs ``posenc.runs.retrieval``'s job per
(task, scheme, seed) instead; a preset's ``sweep`` adds grid points (``posenc.runs.sweep``). Rerunning
skips finished trainings and evaluations and resumes interrupted ones.

Each (scheme, seed) is a job (``run_job``) in its own spawned process
(``posenc.runs.jobs``), so a scheme that raises, produces NaN, segfaults or is killed
for memory is reported as failed with a one-line error (full traceback in
``<scheme>/seed<k>.error.txt``) and the other schemes' results are kept. The
preset is ``posenc.config.plan.Preset``. Perplexity at one length (``posenc.eval.perplexity.evaluate_length``)
scores the windows of ``posenc.scoring.plan``: each target once, exp(sum NLL / targets).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import torch

from posenc import encodings
from posenc.config.plan import (
    ClusterConfig,
    Point,
    Preset,
    absolute_corpus,
    at_point,
    grid_points,
    job_configs,
    job_encoding,
    mixing_windows,
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
from posenc.errors import PosencError, one_line
from posenc.eval.diagnose import far_mass_records
from posenc.eval.passkey import passkey_records
from posenc.eval.perplexity import evaluate_length
from posenc.model import LM, is_rope, set_method, with_rope_schedule
from posenc.reports.compare import with_ratios, write_report
from posenc.reports.sweep import sweep_markdown, write_sensitivity
from posenc.reports.tasks import write_task_report
from posenc.runs.jobs import (
    LAUNCHERS,
    check_same_settings,
    done_cells,
    executor,
    finish_run,
    record_run,
    run_inline,
    run_pool,
    run_submitit,
    scheme_modules,
    trained_job,
)
from posenc.runs.retrieval import done_jobs, run_task_job, task_meta
from posenc.runs.sweep import choices, merge_chosen
from posenc.scoring import eval_lengths, window_starts
from posenc.store.checkpoint import read_json
from posenc.store.records import FarMass, PasskeyCell, Ppl, Record, append, drop_torn_tail, load
from posenc.store.stamp import run_stamp, stamp_line, wall_line
from posenc.train.loop import (
    check_positions,
    check_trained_as,
    is_trained,
    load_run,
    machine_precision,
    randomized_max,
)
from posenc.train.tracking import check_kind, eval_metrics


def run_schedules(run_root: Path, preset: Preset, data, results: Path, done: set) -> dict[str, str]:
    """Evaluate every ``eval_schedules`` entry on each trained RoPE scheme; returns failures. ``done``: the recorded
    (scheme, seed, length) cells (``posenc.runs.jobs.done_cells``), read once; this is the only writer of its rows."""
    failures = {}
    ropes = [s for s in preset.schemes if is_rope(s)]
    for spec in preset.eval_schedules:
        name, params = schedule_spec(spec, preset)
        for scheme in ropes:
            for seed in preset.seeds:
                run_dir = run_root / scheme / f"seed{seed}"
                if not is_trained(run_dir):
                    continue
                try:
                    model, label = with_rope_schedule(load_run(run_dir)[0], name, params)
                    for L in eval_lengths(preset.model.train_length, preset.eval.multiples):
                        if (label, seed, L) not in done:
                            append(
                                results,
                                evaluate_length(
                                    model,
                                    data.val_docs,
                                    L,
                                    {"scheme": label, "seed": seed},
                                    preset.eval.max_tokens,
                                    preset.eval.batch_tokens,
                                    span=_span(preset),
                                ),
                            )
                except Exception as exc:  # one broken row must not lose the others
                    failures[f"{scheme}+{name} (seed {seed})"] = one_line(exc)
    return failures


def run_methods(run_root: Path, preset: Preset, data, results: Path, done: set) -> dict[str, str]:
    """Evaluate every ``eval_methods`` entry on each trained scheme it applies to (``posenc.model.set_method``
    refuses the others: no row for them); returns failures. ``done``: as ``run_schedules``'s."""
    failures = {}
    for spec in preset.eval_methods:
        for scheme in preset.schemes:
            for seed in preset.seeds:
                run_dir = run_root / scheme / f"seed{seed}"
                if not is_trained(run_dir):
                    continue
                model = load_run(run_dir)[0]
                try:
                    method = set_method(model, spec)
                except PosencError:  # not a scheme the method applies to
                    continue
                base = {"scheme": f"{scheme}+{method.describe()}", "seed": seed, "method": method.label()}
                try:
                    for L in eval_lengths(preset.model.train_length, preset.eval.multiples):
                        if (base["scheme"], seed, L) not in done:
                            append(
                                results,
                                evaluate_length(
                                    model,
                                    data.val_docs,
                                    L,
                                    base,
                                    preset.eval.max_tokens,
                                    preset.eval.batch_tokens,
                                    span=_span(preset),
                                ),
                            )
                except Exception as exc:  # one broken row must not lose the others
                    failures[f"{base['scheme']} (seed {seed})"] = one_line(exc)
    return failures


def _span(preset: Preset) -> int:
    """Every length scores the same text: the first (longest length) targets of each held-out work used."""
    return max(eval_lengths(preset.model.train_length, preset.eval.multiples))


def train_under_torchrun(run_root: Path, scheme: str, seed: int, nproc: int, log: str = "none") -> None:
    """Train (or resume) one job data-parallel: ``posenc train`` under torchrun with ``nproc`` processes on this
    machine.

    Reads the sweep's ``preset.json`` (the resolved preset), so the run is the one the sweep would train.
    """
    out = run_root / scheme / f"seed{seed}"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(nproc),
        "-m",
        "posenc.cli.main",
        "train",
        "--scheme",
        scheme,
        "--preset",
        str(run_root / "preset.json"),
        "--seed",
        str(seed),
        "--out",
        str(out),
    ] + (["--resume"] if (out / "config.json").exists() else [])
    # torchrun's own parser takes any "--log..." as an abbreviation of its --log-dir: the tracker goes by environment
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "POSENC_LOG": log})
    if proc.returncode:  # posenc's own error, else a rank's last exception line (torchrun's summary ends in "===")
        err = proc.stderr.splitlines()
        lines = (
            [line for line in err if "posenc: error:" in line]
            or [line for line in err if line.startswith("[rank") and ("Error" in line or "Exception" in line)][-1:]
            or [line for line in err if "exitcode" in line][:1]
            or proc.stderr.strip().splitlines()[-1:]
        )
        raise PosencError(
            f"torchrun training of {scheme} (seed {seed}) failed: "
            f"{lines[0] if lines else f'exit code {proc.returncode}'}"
        )


def check_positions_reach(preset: Preset, tasks: list[str]) -> None:
    """PosencError (one line) when randomized training positions (``train.positions: randomized:max=N``) cannot
    place the longest evaluation: the jobs score such a model on randomized positions too (``posenc.data.positions``),
    so N must be at least every evaluated length (text: the eval multiples; tasks: every test's length)."""
    n = randomized_max(preset.train.positions)
    if n is None:
        return
    L = preset.model.train_length
    lengths = [t.length for spec in tasks for t in get_task(spec).tests(L, preset.task_eval.multiples)]
    longest = max(lengths) if tasks else max(eval_lengths(L, preset.eval.multiples))
    if longest > n:
        raise PosencError(
            f"train.positions {preset.train.positions!r}: max must be >= the longest evaluation length {longest} "
            "(the model is scored on randomized positions too)"
        )


def run_job(
    run_root: Path,
    preset: Preset,
    scheme: str,
    seed: int,
    data=None,
    nproc: int = 1,
    log: str = "none",
    point: Point = (),
    screening: bool = False,
) -> None:
    """One job: train (or resume) and evaluate one scheme and seed at grid ``point``
    (``posenc.config.plan.grid_points``; () without a sweep), appending result records to its point's ``results.jsonl``.
    ``screening``: evaluate at the training length only (a sweep's grid point: what the chooser reads); a later full
    job evaluates the other lengths and the extras (passkey, far mass), the recorded lengths skipped.

    ``nproc`` > 1 trains data-parallel under torchrun (``train_under_torchrun``); evaluation runs here.
    ``log``: a tracker kind (``posenc.train.tracking``) for the training steps and the job's evaluations
    (logged at the trained step count), in the run directory, named ``<name>/<scheme>/seed<k>``.
    """
    data = data or load_tokens(preset.train.corpus, preset.train.tokenizer)
    root = point_root(run_root, point)
    results = root / "results.jsonl"
    # this job's records, read once: no other job writes its (scheme, seed) rows, so it keeps them up to date itself
    mine = [
        r for r in load(results) if isinstance(r, (Ppl, PasskeyCell, FarMass)) and (r.scheme, r.seed) == (scheme, seed)
    ]
    done = done_cells(mine)
    run_dir = root / scheme / f"seed{seed}"
    mcfg, tcfg = job_configs(preset, point, scheme, seed, data.vocab_size)
    config = {
        "name": preset.name,
        "scheme": scheme,
        "seed": seed,
        "model": dataclasses.asdict(mcfg),
        "train": tcfg.model_dump(),
        "eval": preset.eval.model_dump(),
    }
    torchrun = (lambda: train_under_torchrun(root, scheme, seed, nproc, log)) if nproc > 1 else None
    name, desc = f"{preset.name}/{scheme}/seed{seed}", f"{scheme} s{seed}"
    with trained_job(run_dir, name, desc, mcfg, tcfg, config, log, data, torchrun) as (model, tracker):
        lengths = [mcfg.train_length] if screening else eval_lengths(mcfg.train_length, preset.eval.multiples)
        for L in lengths:
            if (scheme, seed, L) in done:
                continue
            rec = evaluate_length(
                model,
                data.val_docs,
                L,
                {"scheme": scheme, "seed": seed},
                preset.eval.max_tokens,
                preset.eval.batch_tokens,
                span=_span(preset),
                positions=randomized_max(tcfg.positions),
            )
            append(results, rec)
            mine.append(rec)
        if not screening:
            base = {"scheme": scheme, "seed": seed, "train_length": mcfg.train_length}
            mine += compare_extras(model, preset.eval, data, results, base, mine)
        evals = with_ratios([r for r in mine if isinstance(r, Ppl)]) + [r for r in mine if isinstance(r, PasskeyCell)]
        tracker.log(eval_metrics(evals, mcfg.train_length), read_json(run_dir / "train_summary.json")["steps"])


def _recorded(recs: list[Record], scheme: str, seed: int) -> set:
    """(kind, length, depth) of the passkey and far-mass records of (scheme, seed) among ``recs``."""
    return {
        (r.kind, r.length, getattr(r, "depth", None))
        for r in recs
        if isinstance(r, (PasskeyCell, FarMass)) and (r.scheme, r.seed) == (scheme, seed)
    }


def extras_pending(ev, train_length: int, recs: list[Record], scheme: str, seed: int) -> bool:
    """True when some passkey or far-mass record one compare job of (scheme, seed) writes is missing from ``recs``
    (a results.jsonl's, read once).

    ev: the preset's EvalConfig (its ``passkey`` and ``far_mass`` settings).
    """
    keys = set()
    if ev.passkey.trials:
        keys |= {
            ("passkey", L, d)
            for L in eval_lengths(train_length, ev.passkey.lengths_multiples)
            for d in ev.passkey.depths
        }
    if ev.far_mass.windows:
        keys |= {("far_mass", L, None) for L in eval_lengths(train_length, ev.far_mass.multiples)}
    return not keys <= _recorded(recs, scheme, seed)


def compare_extras(model: LM, ev, data, results: Path, base: dict, recorded: list[Record]) -> list[Record]:
    """Passkey cells and the cheap far-mass pass of one compare job, appended to ``results``; returns the new records.

    base: {"scheme", "seed", "train_length"} copied into each record; those already among ``recorded`` (the job's
    records, read once) are skipped (a rerun resumes).
    """
    done, new = _recorded(recorded, base["scheme"], base["seed"]), []
    for rec in passkey_records(model, data.tokenizer, ev.passkey, base, {(L, d) for k, L, d in done if k == "passkey"}):
        append(results, rec)
        new.append(rec)
    todo = [m for m in ev.far_mass.multiples if ("far_mass", m * base["train_length"], None) not in done]
    for rec in far_mass_records(model, data.val_docs, ev.far_mass.model_copy(update={"multiples": todo}), base):
        append(results, rec)
        new.append(rec)
    return new


@dataclasses.dataclass(frozen=True)
class Job:
    """One job of a comparison: a scheme and seed (on a task, for task presets) at a grid point (() without a sweep)."""

    task: str | None
    scheme: str
    seed: int
    point: Point = ()
    screening: bool = False  # a sweep's grid point on the first seed: evaluated at the training length only

    def key(self) -> tuple:
        """The job whatever it evaluates: a chosen point's full job completes its screening, one job."""
        return self.task, self.scheme, self.seed, self.point

    def where(self, run_root: Path) -> Path:
        """Its run directory."""
        return point_root(run_root, self.point) / (self.task or "") / self.scheme / f"seed{self.seed}"

    def name(self) -> str:
        at = f" at {point_label(self.point)}" if self.point else ""
        return f"{self.task + ' ' if self.task else ''}{self.scheme} (seed {self.seed}){at}" + (
            " (screening)" if self.screening else ""
        )


def _finished(run_root: Path, preset: Preset, job: Job, done: dict, recs: dict) -> bool:
    """Trained and every evaluation it makes recorded (a screening job's: those at the training length): no job to
    start. ``done``: each grid point's recorded (scheme, seed, length) cells on text, {(task, scheme, seed): screening
    only} on tasks; ``recs``: each grid point's records; both read once per stage."""
    root = point_root(run_root, job.point)
    if job.task:
        screened = done[root].get((job.task, job.scheme, job.seed))
        return screened is not None and (job.screening or not screened)
    L0 = preset.model.train_length
    lengths = [L0] if job.screening else eval_lengths(L0, preset.eval.multiples)
    return (
        is_trained(job.where(run_root))
        and all((job.scheme, job.seed, L) in done[root] for L in lengths)
        and (job.screening or not extras_pending(preset.eval, L0, recs[root], job.scheme, job.seed))
    )


def compare(
    preset: Preset,
    out_root: Path = Path("runs"),
    isolate: bool = True,
    parallel: int = 1,
    nproc_per_node: int = 1,
    log: str = "none",
    launcher: str = "pool",
    cluster: ClusterConfig | None = None,
) -> tuple[Path, dict[str, str]]:
    """Run the whole comparison, on text or on synthetic tasks (``tasks``); returns the report path and the failed jobs
    ({job: one-line error}). The one runner: it enumerates tasks x schemes x grid points x seeds.

    With a ``sweep``, every scheme first trains at each point of its grid on the first seed (under
    ``out_root/name/sweep/<point>/``, each point a run directory of its own) and is evaluated there on the
    in-distribution test at the training length only (a screening job: what the chooser reads), its setting is
    chosen from that seed's held-out in-distribution result (``posenc.runs.sweep``), the chosen point's first-seed
    job completes its evaluation (a task none of whose points learned: its best point's) and the other seeds run at
    the chosen point; the report
    (``out_root/name/``: the chosen runs' records in ``results.jsonl``, rewritten each time) names the choices and
    shows the sensitivity table and plot. Without one, every seed runs at the preset's settings in ``out_root/name``.
    Each invocation's stamp in ``invocations.jsonl`` gets its start and end (UTC); the report's header sums them.

    ``isolate``: one spawned process per job, so that even a crash or an out-of-memory kill only fails that job;
    False runs the jobs in this process (faster start, easier to debug; a crash ends the sweep).
    ``parallel``: jobs at once, each pinned to its own devices (``posenc.runs.jobs.run_pool``);
    ``nproc_per_node``: processes (GPUs) per job, training under torchrun (text only).
    ``log``: a tracker kind for every job (``posenc.train.tracking``). ``launcher``: "pool" (this machine,
    ``run_pool``), or submitit ("slurm": one scheduler job per job with ``cluster``'s resources, default the preset's;
    "local": the same jobs through submitit's LocalExecutor), waited for here; job files go
    to ``out_root/name/submitit``. Every launcher skips finished jobs and resumes interrupted ones.
    Raises PosencError before any work when ``out_root/name`` (or a grid point's directory) holds results made
    with other model, training or evaluation settings, when a run a job would report was trained with other settings
    than the job's (``train.check_trained_as``: a run copied in from another budget), for too few GPUs, a missing
    tracker or launcher package, or more than one process per job for synthetic tasks.
    """
    if parallel < 1 or nproc_per_node < 1 or (not isolate and (parallel > 1 or nproc_per_node > 1)):
        raise PosencError(
            f"--parallel and --nproc-per-node must be >= 1 and need job isolation, got {parallel}, {nproc_per_node}"
        )
    if launcher not in LAUNCHERS:
        raise PosencError(f"unknown --launcher {launcher!r}; valid: {', '.join(LAUNCHERS)}")
    if launcher != "pool" and (not isolate or parallel > 1):
        raise PosencError(
            f"--launcher {launcher} runs every job at once in its own process: no --no-isolate or --parallel"
        )
    check_kind(log)
    if launcher != "pool":
        cluster = cluster or preset.cluster or ClusterConfig()
        if cluster.gpus_per_job is None:
            cluster = cluster.model_copy(
                update={"gpus_per_job": nproc_per_node if launcher == "slurm" or torch.cuda.is_available() else 0}
            )
        if 0 < cluster.gpus_per_job < nproc_per_node:  # 0: CPU jobs (torchrun over gloo)
            raise PosencError(f"--gpus-per-job {cluster.gpus_per_job} is fewer than --nproc-per-node {nproc_per_node}")
    tasks = task_specs(preset)
    if tasks and nproc_per_node > 1:
        raise PosencError("synthetic-task comparisons train each job in one process: no --nproc-per-node")
    run_root = Path(out_root) / preset.name
    data = None
    if not tasks:
        preset = absolute_corpus(preset)
        data = load_tokens(preset.train.corpus, preset.train.tokenizer)  # bad input fails before anything is written
        window_starts(
            data.val_docs, _span(preset), preset.eval.max_tokens, span=_span(preset)
        )  # held-out text long enough
    grids = {s: grid_points(preset, s) for s in preset.schemes}
    for s in preset.schemes:  # randomized training positions: every scheme (each variant) takes them, before any job
        for spec in dict.fromkeys(job_encoding(p, s) for p in grids[s]):
            check_positions(dataclasses.replace(preset.model, encoding=spec), preset.train)
    check_positions_reach(preset, tasks)
    points = list(dict.fromkeys(p for grid in grids.values() for p in grid))
    check_same_settings(run_root, preset)
    for p in points:
        if p:
            check_same_settings(point_root(run_root, p), at_point(preset, p))
    ex = executor(launcher, run_root / "submitit", cluster, f"posenc-{preset.name}") if launcher != "pool" else None
    opened = [(run_root, record_run(run_root, preset))]  # each directory's invocation line, closed at the end
    for p in points:
        if p:
            at = at_point(preset, p).model_copy(update={"schemes": [s for s in preset.schemes if p in grids[s]]})
            opened.append((point_root(run_root, p), record_run(point_root(run_root, p), at)))
        drop_torn_tail(point_root(run_root, p) / "results.jsonl")
    failures: dict[str, str] = {}
    units = [None] if not tasks else tasks

    def failed(job: Job, error: str) -> None:  # one broken job must not lose the others
        failures[job.name()] = error
        print(f"posenc: {job.name()} failed: {error}", file=sys.stderr)  # now, not when the sweep ends

    def run(stage: list[Job]) -> int:
        """Run the stage's unfinished jobs after checking every run it would report; returns how many were pending."""
        for job in stage:
            vocab = get_task(job.task).vocab_size if job.task else data.vocab_size
            check_trained_as(
                job.where(run_root),
                *job_configs(preset, job.point, job.scheme, job.seed, vocab, job.task),
                f"{preset.name}'s job {job.name()}",
            )
        recs = {point_root(run_root, p): load(point_root(run_root, p) / "results.jsonl") for p in points}
        done = {root: (done_jobs if tasks else done_cells)(r) for root, r in recs.items()}
        pending = [job for job in stage if not _finished(run_root, preset, job, done, recs)]
        # inline, a text job gets this process's data (no reload); isolated, it loads its own
        jobs = [
            (
                (run_task_job, (run_root, preset, j.task, j.scheme, j.seed, log, j.point, j.screening))
                if j.task
                else (
                    run_job,
                    (
                        run_root,
                        preset,
                        j.scheme,
                        j.seed,
                        None if isolate else data,
                        nproc_per_node,
                        log,
                        j.point,
                        j.screening,
                    ),
                )
            )
            + (j.where(run_root).with_suffix(".error.txt"), scheme_modules([j.scheme]))
            for j in pending
        ]
        if ex is not None:
            run_submitit(
                jobs, ex, poll_s=1 if launcher == "local" else 30, on_failure=lambda i, error: failed(pending[i], error)
            )
        elif isolate:
            run_pool(jobs, parallel, nproc_per_node, on_failure=lambda i, error: failed(pending[i], error))
        else:
            for job, (fn, args, error_file, _) in zip(pending, jobs):
                error = run_inline(fn, args, error_file)
                if error:
                    failed(job, error)
        return len(pending)

    try:
        first, swept = preset.seeds[0], preset.sweep is not None
        n_pending, chosen, grid_jobs = 0, [], []
        if swept:  # every grid point screened on the first seed, then each scheme's choice from its records
            grid_jobs = [Job(t, s, first, p, screening=True) for t in units for s in preset.schemes for p in grids[s]]
            n_pending = run(grid_jobs)
            chosen = choices(run_root, units, grids, first, preset.model.train_length, preset.task_eval.learned)
            # the chosen point on every seed (its first completes the screening); a task none of whose points learned
            # is reported at its best point on the first seed
            final = [
                Job(c.task, c.scheme, seed, c.point) for c in chosen if c.point is not None for seed in preset.seeds
            ]
            final += [Job(c.task, c.scheme, first, c.shown) for c in chosen if c.point is None and c.shown is not None]
        else:
            final = [Job(t, s, seed) for t in units for s in preset.schemes for seed in preset.seeds]
        n_pending += run(final)
        if not n_pending:
            _all_done(run_root, len({j.key() for j in grid_jobs + final}))  # a chosen point's first seed is a grid job
        for p in points if not tasks else []:  # the RoPE schedule and method rows of the schemes reported at each point
            at = list(dict.fromkeys(j.scheme for j in final if j.point == p))
            results = point_root(run_root, p) / "results.jsonl"
            at_p = at_point(preset, p).model_copy(update={"schemes": at})
            args = (point_root(run_root, p), at_p, data, results, done_cells(load(results)))  # rows apart: one read
            failures.update(run_schedules(*args))
            failures.update(run_methods(*args))
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the time up to the stop counts in the run's wall time
        for root, stamp in opened:
            finish_run(root, stamp, interrupted=True)
        raise
    calls = [finish_run(root, stamp) for root, stamp in opened]  # every directory's line closed
    wall = wall_line(calls[0])  # the comparison's own invocations: its total wall time
    sweep_lines = []
    if swept:
        merge_chosen(run_root, chosen, preset.schemes)
        sweep_lines = sweep_markdown(
            chosen, first, write_sensitivity(run_root, chosen, first, preset.task_eval.learned)
        )
    if tasks:
        return write_task_report(
            run_root, {**task_meta(preset), "sweep": sweep_lines, "wall": wall}, failures
        ), failures
    trained = {c.scheme: job_encoding(c.shown, c.scheme) for c in chosen if c.shown is not None}  # sweep variants
    return write_report(
        run_root, {**_meta(preset, data, trained), "sweep": sweep_lines, "wall": wall}, failures
    ), failures


def _all_done(run_root: Path, n_jobs: int) -> None:
    print(f"posenc: all {n_jobs} jobs already done in {run_root} (the report is rewritten)", file=sys.stderr)


def _meta(preset: Preset, data, trained: dict[str, str] | None = None) -> dict:
    """The report's header: corpus, model, budget, evaluation, and each scheme's description and mixing window (of
    the spec it trained: ``trained`` maps a swept scheme to its chosen variant, ``posenc.config.plan.job_encoding``)."""
    mcfg = dataclasses.replace(preset.model, vocab_size=data.vocab_size)
    windows, trained = mixing_windows(preset), trained or {}
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
            f"the first {_span(preset)} targets of each of the first "
            f"{-(-preset.eval.max_tokens // _span(preset))} held-out works"
        ),
        "descriptions": {s: encodings.describe(s, mcfg.dims(), **mcfg.encoding_params) for s in preset.schemes},
        "mixing_windows": {s: windows[trained.get(s, s)] for s in preset.schemes},
        "notes": preset.description or None,
        "run": stamp_line(run_stamp(machine_precision(preset.train))),
    }
