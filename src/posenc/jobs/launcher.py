"""The job runner of a sweep: process isolation, settings compatibility and result records.

A job is a module-level function called with picklable arguments. ``run_pool``
runs each in a fresh spawned process (several at once, each pinned to its own
devices), so a job that raises, produces NaN, segfaults
or is killed for memory fails alone with a one-line error (full traceback in its
error file); ``run_inline`` runs it in this process (for debugging). Schemes
registered outside posenc reach the job process by importing the modules that
define them (``scheme_modules``).

A run directory holds results made with one set of settings: ``check_same_settings``
refuses a rerun with other ones (it would label old results with new settings).
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path

import torch
from pydantic import ValidationError

from posenc import encodings
from posenc.config.plan import ClusterConfig, Preset, settings
from posenc.errors import PosencError, one_line, sigterm_as_interrupt
from posenc.store import records
from posenc.store.checkpoint import append_jsonl, drop_torn_tail, read_json, read_jsonl, write_json
from posenc.store.lock import holding, open_run_dir
from posenc.store.presets import refuse_other_settings
from posenc.store.stamp import run_stamp, utc_now
from posenc.train.distributed import check_device
from posenc.train.loop import train, use_threads
from posenc.train.precision import machine_precision, unrecorded_precision
from posenc.train.rundir import is_trained, load_run
from posenc.train.tracking import open_tracker


@contextlib.contextmanager
def trained_job(run_dir: Path, name: str, desc: str, mcfg, tcfg, config: dict, log: str, data, train_fn=None):
    """What every job of a comparison does before it evaluates: open its tracker (``posenc.train.tracking``, kind
    ``log``, run ``name`` in the project ``config["name"]``) with ``config`` and the stamp, train (or resume)
    ``run_dir`` at ``mcfg`` and ``tcfg`` on ``data`` unless trained (progress lines start with ``desc``;
    ``train_fn()`` instead when given: torchrun), and load the model with the threads training set (a job that only
    evaluates, a screening's completion, trained earlier). Yields (model, tracker)."""
    config = {**config, "stamp": run_stamp(machine_precision(tcfg))}
    with open_tracker(log, run_dir, name, config["name"], config) as tracker:
        if not is_trained(run_dir):
            if train_fn is not None:
                train_fn()
            else:
                train(run_dir, mcfg, tcfg, resume=True, data=data, desc=desc, tracker=tracker)
        model = load_run(run_dir)[0]
        use_threads(tcfg)
        yield model, tracker


def scheme_modules(schemes: list[str]) -> list[str]:
    """Modules defining the schemes' classes (each part of ``A+B``, each entry of ``A|B``), for a job process to import;
    plugins are left out: the job loads them itself (entry points, and POSENC_IMPORT, which it inherits)."""
    mods = {
        cls.__module__ for s in schemes for entry in encodings.layer_pattern(s) for cls, _ in encodings.parts(entry)
    }
    return sorted(mods - {"__main__"} - encodings.plugin_modules())  # spawn re-runs __main__ itself


def _entry(fn: Callable, args: tuple, modules: list[str], error_file: Path, env: dict[str, str], stop=None) -> None:
    """Entry point of a job process; an error goes to ``error_file``. ``env`` pins its devices and threads
    (set before the job touches CUDA, which reads ``CUDA_VISIBLE_DEVICES`` when it first initialises). The process
    started with Ctrl-C ignored (``start_isolated``); it takes Ctrl-C from here, after first asking ``stop`` (an
    Event its parent sets when interrupted) whether one came while it started."""
    try:
        if stop is not None:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            if stop.is_set():
                raise KeyboardInterrupt
        os.environ.update(env)
        if "OMP_NUM_THREADS" in env:
            torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
        for m in modules:
            importlib.import_module(m)
        # a stop sent to the whole group (timeout) saves the job's checkpoint, as Ctrl-C does; the run directory it
        # trains is its own to hold (posenc.store.lock), inside the run root its parent holds
        with sigterm_as_interrupt(), holding():
            fn(*args)
    except BaseException as exc:
        if interrupted(exc):
            sys.exit(130)
        error_file.write_text(f"{one_line(exc)}\n\n{traceback.format_exc()}")
        sys.exit(1)


def interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is an interruption or was raised while one unwound: cleanup code (a ``finally``, an
    ``__exit__``, a half-done import) that fails during a Ctrl-C leaves the KeyboardInterrupt only in the
    ``__context__`` chain, and the job is stopped, not failed."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def start_isolated(
    fn: Callable, args: tuple, error_file: Path, modules: list[str], env: dict[str, str] | None = None, stop=None
):
    """Start ``fn(*args)`` in a fresh spawned process (``finish_isolated`` collects it). With ``stop`` (a spawn
    context's Event, set by the caller when interrupted) the process starts with Ctrl-C ignored, so a Ctrl-C
    while it bootstraps (unpickling, importing torch) prints no traceback of Python's spawn code; its entry asks
    ``stop`` and takes Ctrl-C from there. Without ``stop``, or where Ctrl-C is ignored here (a background job), the
    process starts with this one's handling."""
    error_file.parent.mkdir(parents=True, exist_ok=True)
    error_file.unlink(missing_ok=True)
    ours = (
        threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
    )
    stop = stop if ours else None
    proc = multiprocessing.get_context("spawn").Process(
        target=_entry, args=(fn, args, modules, error_file, env or {}, stop)
    )
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if stop is not None else None  # inherited by exec
    try:
        proc.start()
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    return proc


def finish_isolated(proc, error_file: Path) -> str | None:
    """Wait for a job process; None on success, else its one-line error.

    Ctrl-C reaches the job too: it is waited for (it saves its checkpoint) and re-raised here.
    """
    try:
        proc.join()
    except KeyboardInterrupt:
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


def slot_env(slot: int, parallel: int, nproc: int) -> dict[str, str]:
    """Devices and threads of parallel job ``slot``: its own ``nproc`` GPUs (CUDA_VISIBLE_DEVICES), or on CPU
    an equal share of the cores (OMP_NUM_THREADS). Raises PosencError when there are too few GPUs."""
    if parallel == 1 and nproc == 1:
        return {}
    if torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpus = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
        if len(gpus) < parallel * nproc:
            raise PosencError(
                f"--parallel {parallel} x --nproc-per-node {nproc} needs {parallel * nproc} GPUs, found {len(gpus)}"
            )
        return {"CUDA_VISIBLE_DEVICES": ",".join(gpus[slot * nproc : (slot + 1) * nproc])}
    return {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // (parallel * nproc)))}


def run_pool(
    jobs: list[tuple[Callable, tuple, Path, list[str]]],
    parallel: int,
    nproc: int = 1,
    on_failure: Callable[[int, str], None] | None = None,
    on_done: Callable[[int], None] | None = None,
    env: dict[str, str] | None = None,
) -> dict[int, str]:
    """Run isolated jobs (fn, args, error file, modules), ``parallel`` at a time, each pinned by ``slot_env`` (and
    ``env``: ``device_env``'s).

    Returns {index of a failed job: its one-line error}; ``on_failure(index, error)`` is called as each
    job fails (a long sweep reports it then, not hours later), ``on_done(index)`` as each ends, failed or not.
    Ctrl-C waits for the running jobs and re-raises.
    """
    envs = [{**slot_env(slot, parallel, nproc), **(env or {})} for slot in range(parallel)]  # too few GPUs: now
    queue, running, failures = list(enumerate(jobs)), {}, {}
    stop = multiprocessing.get_context("spawn").Event()
    try:
        while queue or running:
            while queue and len(running) < parallel:
                slot = min(set(range(parallel)) - {s for s, _, _ in running.values()})
                i, (fn, args, error_file, modules) = queue.pop(0)
                running[i] = (slot, start_isolated(fn, args, error_file, modules, envs[slot], stop), error_file)
            multiprocessing.connection.wait([proc.sentinel for _, proc, _ in running.values()])
            for i in [i for i, (_, proc, _) in running.items() if not proc.is_alive()]:
                _, proc, error_file = running.pop(i)
                error = finish_isolated(proc, error_file)
                if error:
                    failures[i] = error
                    if on_failure:
                        on_failure(i, error)
                if on_done:
                    on_done(i)
    except KeyboardInterrupt:
        stop.set()  # a job still starting missed the Ctrl-C: it stops at its entry
        for _, proc, _ in running.values():
            proc.join()
        raise
    return failures


LAUNCHERS = ("pool", "local", "slurm")  # pool: run_pool on this machine; local, slurm: submitit (run_submitit)


def _cluster_entry(fn: Callable, args: tuple, modules: list[str], error_file: Path, argv: list[str]) -> None:
    """What a submitit job runs: the schemes' modules imported, then ``fn(*args)``; an error also goes to
    ``error_file`` (one line, then the traceback), as a pool job's does. ``argv``: the submitting command's,
    so the run's stamp names it (a spawned pool job inherits it), not submitit's entry point."""
    sys.argv = argv
    for m in modules:
        importlib.import_module(m)
    try:
        fn(*args)
    except BaseException as exc:
        error_file.write_text(f"{one_line(exc)}\n\n{traceback.format_exc()}")
        raise


def executor(launcher: str, folder: Path, cluster: ClusterConfig, name: str = "posenc"):
    """A submitit executor ("local": LocalExecutor, this machine; "slurm": the Slurm cluster) writing its job
    files (logs, pickles) into ``folder``. PosencError when submitit is missing or Slurm cannot be reached."""
    try:
        import submitit
    except ImportError:
        raise PosencError(f"--launcher {launcher} needs submitit: pip install 'posenc[slurm]'") from None
    if launcher == "local":
        ex = submitit.LocalExecutor(folder=folder)
        ex.update_parameters(timeout_min=cluster.time_min, gpus_per_node=cluster.gpus_per_job)
        return ex
    try:
        ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
    except Exception as exc:  # no sbatch here
        raise PosencError(f"--launcher slurm: submitit cannot use Slurm here ({one_line(exc)})") from None
    params = {
        "timeout_min": cluster.time_min,
        "gpus_per_node": cluster.gpus_per_job,
        "nodes": 1,
        "tasks_per_node": 1,
        "name": name,
    }
    params |= {
        k: v for k, v in {"slurm_partition": cluster.partition, "mem_gb": cluster.mem_gb}.items() if v is not None
    }
    ex.update_parameters(**params)
    return ex


def run_submitit(
    jobs: list[tuple[Callable, tuple, Path, list[str]]],
    ex,
    poll_s: float = 5,
    on_failure: Callable[[int, str], None] | None = None,
    on_done: Callable[[int], None] | None = None,
) -> dict[int, str]:
    """Submit each job (fn, args, error file, modules) through the submitit executor ``ex`` (``executor``) and
    wait for all of them (stderr says what was submitted and where each job's output goes); returns {index of a
    failed job: its one-line error}, calling ``on_failure`` as each fails and ``on_done`` as each ends (a job
    killed at its time limit fails too: a rerun resumes it from its last checkpoint).
    Ctrl-C cancels the jobs not finished (they keep their last checkpoints) and re-raises. What the processes
    started by the submission write to their inherited stderr (submitit's local job controllers: a KeyboardInterrupt
    traceback each at Ctrl-C) goes to ``controllers.err`` in the executor's folder, not to this terminal."""
    import submitit

    if not jobs:
        return {}
    for _, _, error_file, _ in jobs:
        error_file.parent.mkdir(parents=True, exist_ok=True)
        error_file.unlink(missing_ok=True)
    with (
        _stderr_into(Path(ex.folder) / "controllers.err"),
        ex.batch(),
    ):  # one submission (a Slurm job array where the scheduler has them)
        submitted = [
            ex.submit(_cluster_entry, fn, args, modules, error_file, sys.argv) for fn, args, error_file, modules in jobs
        ]
    print(
        f"posenc: {len(submitted)} submitit job(s) submitted ({', '.join(job.job_id for job in submitted)}), waiting; "
        f"each job's output: {submitted[0].paths.stderr.parent}/<job id>_0_log.err",
        file=sys.stderr,
    )
    index = {job.job_id: i for i, job in enumerate(submitted)}
    failures: dict[int, str] = {}
    try:
        for job in submitit.helpers.as_completed(submitted, poll_frequency=poll_s):
            exc, i = job.exception(), index[job.job_id]
            if on_done:
                on_done(i)
            if exc is None:
                continue
            error_file = jobs[i][2]
            failures[i] = error_file.read_text().splitlines()[0] if error_file.exists() else one_line(exc)
            if not error_file.exists():  # killed (time limit, memory, cancelled): the scheduler's word
                error_file.write_text(f"{failures[i]}\n\n{exc}\n")
            if on_failure:
                on_failure(i, failures[i])
    except KeyboardInterrupt:
        for job in submitted:
            if not job.done():
                job.cancel(check=False)
        raise
    return failures


@contextlib.contextmanager
def _stderr_into(path: Path):
    """Within, file descriptor 2 is ``path`` (appended): what processes started here inherit. submitit's local job
    controllers, in this terminal's process group, get its Ctrl-C (and the cancel's SIGINT) and print a
    KeyboardInterrupt traceback each; there, not after posenc's own interrupted and resume lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(path, "ab") as f:
            os.dup2(f.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def run_inline(fn: Callable, args: tuple, error_file: Path) -> str | None:
    """Run ``fn(*args)`` in this process; None on success, else its one-line error (traceback in ``error_file``)."""
    try:
        fn(*args)
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        error_file.parent.mkdir(parents=True, exist_ok=True)
        error_file.write_text(f"{one_line(exc)}\n\n{traceback.format_exc()}")
        return one_line(exc)
    return None


def record_run(run_root: Path, preset: Preset) -> dict:
    """Write the resolved preset (``preset.json``) and append this invocation's stamp (versions, commit,
    device, threads, command; ``posenc.store.stamp``) with an id (``invocation``) and its start time (``started``,
    UTC) to ``invocations.jsonl``: a resumed run keeps every one. Returns the stamp (``finish_run`` closes it).
    ``preset.json`` keeps the rows earlier invocations added (``with_earlier_rows``): a rerun of some schemes still
    describes every result the directory holds. PosencError (one line) when ``invocations.jsonl`` is damaged
    (``read_jsonl``), or, in a command's scope, when another posenc process holds ``run_root`` (``posenc.store.lock``:
    this process holds it from here)."""
    open_run_dir(run_root)
    drop_torn_tail(run_root / "invocations.jsonl")  # a line a kill cut short must not swallow this stamp
    read_jsonl(run_root / "invocations.jsonl")  # a damaged file refused now, not at finish_run after the work
    write_json(run_root / "preset.json", with_earlier_rows(preset, run_root / "preset.json").model_dump())
    stamp = {**run_stamp(machine_precision(preset.train)), "invocation": uuid.uuid4().hex, "started": utc_now()}
    append_jsonl(run_root / "invocations.jsonl", stamp)
    return stamp


ROWS = ("schemes", "seeds", "tasks", "eval_schedules", "eval_methods")  # what a rerun may add (check_same_settings)


def with_earlier_rows(preset: Preset, saved: Path) -> Preset:
    """``preset`` whose schemes, seeds, tasks and extension rows are those of the run's ``saved`` preset.json, in
    their recorded order, then its own new ones, and whose evaluation lengths (``eval.multiples``) are both files'
    (``preset`` unchanged when there is none): the records of an earlier invocation stay described when a rerun
    names fewer. ``check_same_settings`` has read the file."""
    if not saved.exists():
        return preset
    earlier = read_json(saved)
    rows = {
        key: [*earlier.get(key, []), *(v for v in getattr(preset, key) if v not in earlier.get(key, []))]
        for key in ROWS
    }
    multiples = sorted({*earlier.get("eval", {}).get("multiples", []), *preset.eval.multiples})
    return preset.model_copy(update={**rows, "eval": preset.eval.model_copy(update={"multiples": multiples})})


def finish_run(run_root: Path, stamp: dict, interrupted: bool = False) -> list[dict]:
    """Append this invocation's end to ``run_root/invocations.jsonl``: ``{"invocation": its id, "finished": UTC}``,
    with ``"interrupted": true`` when Ctrl-C or SIGTERM stopped it (``stamp`` as ``record_run`` returned it;
    append-only, as every write there). An invocation without an end was killed outright. Returns every line of the
    file (``posenc.store.stamp.wall_line`` sums them)."""
    path = run_root / "invocations.jsonl"
    append_jsonl(
        path,
        {"invocation": stamp["invocation"], "finished": utc_now(), **({"interrupted": True} if interrupted else {})},
    )
    return read_jsonl(path)


def check_same_settings(run_root: Path, preset: Preset) -> None:
    """Raise PosencError when ``run_root`` holds results made with other settings.

    Reruns skip what is finished, so mixing settings would label old results with
    new settings; schemes, seeds, lengths below the longest (``eval.span``) and extension rows may be added
    (``posenc.store.presets.refuse_other_settings``). Results (``results.jsonl``) without a ``preset.json`` (deleted:
    record_run writes it before any job) were made with settings no file records: refused as well.
    """
    path = run_root / "preset.json"
    if not path.exists():
        if (run_root / "results.jsonl").exists():
            raise PosencError(
                f"{run_root} holds results (results.jsonl) but no preset.json recording their settings; "
                "use another --name or --out"
            )
        return
    try:
        saved = read_json(path)
        saved.setdefault("train", {}).setdefault("precision", unrecorded_precision())  # a preset.json without it
        old = settings(Preset(**saved))
    except (ValidationError, ValueError, TypeError) as exc:
        raise PosencError(f"{path} is unreadable ({one_line(exc)}); use another --name or --out") from None
    refuse_other_settings(run_root, old, settings(preset))


def device_env(device: str | None) -> dict[str, str]:
    """What pins a job process to ``device`` ("cpu": no GPU visible; "cuda" or "cuda:N": that GPU alone; None: the
    default, CUDA when present): its CUDA_VISIBLE_DEVICES. PosencError (one line) for a device not available here."""
    if device is None:
        return {}
    dev = check_device(device)
    if dev.type == "cpu":
        return {"CUDA_VISIBLE_DEVICES": ""}
    if dev.type != "cuda":
        raise PosencError(f"--device {device!r}: compare's jobs run on cpu or cuda[:N]")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    return {"CUDA_VISIBLE_DEVICES": gpus[dev.index or 0]}


def check_options(kind: str, isolate: bool, parallel: int, nproc: int, device: str | None) -> None:
    """PosencError (one line) for launcher options that are out of range or do not go together (as
    :class:`Launcher` takes them); ``posenc compare --dry-run`` checks them too, so it fails as the run would."""
    if parallel < 1 or nproc < 1 or (not isolate and (parallel > 1 or nproc > 1)):
        raise PosencError(
            f"--parallel and --nproc-per-node must be >= 1 and need job isolation, got {parallel}, {nproc}"
        )
    if kind not in LAUNCHERS:
        raise PosencError(f"unknown --launcher {kind!r}; valid: {', '.join(LAUNCHERS)}")
    if kind != "pool" and (not isolate or parallel > 1):
        raise PosencError(f"--launcher {kind} runs every job at once in its own process: no --no-isolate or --parallel")
    if device is not None and (kind != "pool" or not isolate or parallel > 1 or nproc > 1):
        raise PosencError(
            "--device pins the job processes of the pool launcher one at a time: no --launcher, --no-isolate, "
            "--parallel or --nproc-per-node with it"
        )
    device_env(device)  # an unknown or absent device, refused here so --dry-run fails as the run would


class Launcher:
    """Runs a stage's jobs (``posenc.jobs.job``; a job and its grid point's store, ``job.run(store)``) in isolation:
    ``pool`` (each in a fresh spawned process, ``parallel`` at a time pinned by ``slot_env``, on ``device``), or
    submitit (``local``: its LocalExecutor; ``slurm``: one scheduler job each with ``cluster``'s resources, default
    the preset's; job files under ``folder``), or, ``isolate`` False, in this process (no crash isolation: for
    debugging). ``nproc``: processes (GPUs) per job. Raises PosencError (one line) before any work for settings that
    do not go together, too few GPUs, an unavailable device or a missing submitit."""

    def __init__(
        self,
        kind: str = "pool",
        isolate: bool = True,
        parallel: int = 1,
        nproc: int = 1,
        cluster: ClusterConfig | None = None,
        device: str | None = None,
        folder: Path = Path("submitit"),
        name: str = "posenc",
    ):
        check_options(kind, isolate, parallel, nproc, device)
        self.kind, self.isolate, self.parallel, self.nproc = kind, isolate, parallel, nproc
        self.env, self.ex = device_env(device), None
        if kind != "pool":
            cluster = cluster or ClusterConfig()
            if cluster.gpus_per_job is None:
                gpus = nproc if kind == "slurm" or torch.cuda.is_available() else 0
                cluster = cluster.model_copy(update={"gpus_per_job": gpus})
            if 0 < cluster.gpus_per_job < nproc:  # 0: CPU jobs (torchrun over gloo)
                raise PosencError(f"--gpus-per-job {cluster.gpus_per_job} is fewer than --nproc-per-node {nproc}")
            self.ex = executor(kind, folder, cluster, name)

    def run(self, jobs: list, stores: dict[Path, records.RunStore], failed: Callable, done: Callable[[], None]) -> None:
        """Run ``jobs``, each with its grid point's store; ``failed(job, one-line error)`` as each fails,
        ``done()`` as each ends."""
        tasks = [(job.run, (stores[job.root],), job.error_file, scheme_modules([job.scheme])) for job in jobs]
        on_failure = lambda i, error: failed(jobs[i], error)  # noqa: E731
        if self.ex is not None:
            poll = 1 if self.kind == "local" else 30
            run_submitit(tasks, self.ex, poll_s=poll, on_failure=on_failure, on_done=lambda i: done())
        elif self.isolate:
            run_pool(tasks, self.parallel, self.nproc, on_failure=on_failure, on_done=lambda i: done(), env=self.env)
        else:
            for job, (fn, args, error_file, _) in zip(jobs, tasks):
                error = run_inline(fn, args, error_file)
                if error:
                    failed(job, error)
                done()
