"""`posenc compare`: the main job (train every scheme, evaluate, report)."""

import sys
from pathlib import Path

from posenc.cli.common import (
    OUT,
    add_dry_run,
    add_set,
    given_settings,
    nonblank,
    print_dry_run,
    refuse_derived_settings,
)
from posenc.config.plan import ClusterConfig, Preset, load_preset, rungs, task_specs
from posenc.data.corpora import check_data
from posenc.data.tasks import TASKS
from posenc.errors import PosencError
from posenc.jobs.compare import check_source, compare
from posenc.jobs.job import Plan
from posenc.jobs.launcher import LAUNCHERS, check_options
from posenc.jobs.trend import compare_trend
from posenc.store.checkpoint import check_run_dir
from posenc.store.presets import validated
from posenc.train.settings import PRECISIONS
from posenc.train.tracking import KINDS


def add_parser(sub):
    p = sub.add_parser("compare", help="train one model per scheme under one budget and compare length extrapolation")
    p.add_argument("--preset", default="default", help="a preset name (posenc list) or a YAML path (default: default)")
    p.add_argument("--schemes", nargs="+", help="schemes to compare (default: the preset's)")
    p.add_argument("--seeds", type=int, nargs="+", help="seeds (the report shows mean ± half-range)")
    p.add_argument(
        "--tasks",
        nargs="+",
        help="synthetic tasks to train and score on (flipflop, mqar:pairs=8, ...; default: the preset's)",
    )
    p.add_argument(
        "--corpus",
        type=nonblank(),
        help=f"corpus: shakespeare, pystdlib, hf:NAME, a path, or a synthetic task ({', '.join(TASKS)})",
    )
    p.add_argument("--tokenizer", help="byte or bpeN")
    p.add_argument("--steps", type=int, help="training steps per scheme")
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="training compute dtype (train.precision; default the preset's): "
        "auto picks bf16 autocast where the device has bf16 units, else fp32",
    )
    p.add_argument("--name", help="run name (directory under --out)")
    p.add_argument(
        "--trained-from",
        type=OUT,
        metavar="RUN",
        help="take each job's trained model from this earlier comparison's run directory (runs/NAME; trained with "
        "the same settings, refused otherwise) instead of training: re-score it under this preset's evaluation "
        "settings",
    )
    add_set(p, "train.lr=3e-3 or eval.multiples=[1,4,16]")
    p.add_argument("--out", type=OUT, default=Path("runs"), help="output root (default runs/)")
    p.add_argument(
        "--no-isolate", action="store_true", help="run every scheme in this process (no crash isolation; for debugging)"
    )
    p.add_argument(
        "--parallel",
        type=int,
        default=1,
        metavar="K",
        help="jobs at once, each on its own GPUs (or its share of the CPU cores)",
    )
    p.add_argument(
        "--nproc-per-node",
        type=int,
        default=1,
        metavar="N",
        help="processes (GPUs) per job: training under torchrun, data-parallel",
    )
    p.add_argument(
        "--device",
        type=nonblank(),
        help="run every job on this device: cpu, cuda or cuda:N (default: CUDA when present, else cpu); "
        "one job at a time, each in its own process",
    )
    add_dry_run(p, "training or evaluating")
    p.add_argument(
        "--log",
        choices=KINDS,
        default="none",
        help="experiment tracking of every job: TensorBoard event files or a W&B run "
        "(WANDB_MODE=offline: no network) in each run directory (default none)",
    )
    g = p.add_argument_group(
        "cluster (submitit): one scheduler job per scheme and seed, waited for here; "
        "flags replace the values of the preset's cluster section"
    )
    g.add_argument(
        "--launcher",
        choices=LAUNCHERS,
        default="pool",
        help="pool: this machine (default); slurm: the Slurm cluster; local: submitit's local executor (testing)",
    )
    g.add_argument("--partition", help="Slurm partition (default: the preset's cluster.partition, else the cluster's)")
    g.add_argument(
        "--gpus-per-job",
        type=int,
        metavar="G",
        help="GPUs per job (default: the preset's cluster.gpus_per_job, else --nproc-per-node)",
    )
    g.add_argument(
        "--time-min",
        type=int,
        metavar="MIN",
        help=f"wall-clock limit per job in minutes (default: the preset's, else {ClusterConfig().time_min}; a job "
        "killed at its limit resumes from its last checkpoint on a rerun)",
    )
    g.add_argument(
        "--mem-gb", type=float, metavar="GB", help="memory per job (default: the preset's, else the cluster's)"
    )
    p.epilog = (
        "Exit status: 0 when every job finished, 1 when some failed (their errors are in the report), 2 for bad input "
        "or when no job finished (each failure said in one line; the records kept)."
    )
    p.set_defaults(func=run)


# each flag of a preset setting: the key it sets (as --set KEY=VALUE does)
FLAGS = {
    "schemes": "schemes",
    "seeds": "seeds",
    "tasks": "tasks",
    "name": "name",
    "corpus": "train.corpus",
    "tokenizer": "train.tokenizer",
    "steps": "train.steps",
    "precision": "train.precision",
}


def cluster_config(args, preset: Preset) -> ClusterConfig | None:
    """The submitit jobs' resources: the preset's ``cluster``, the flags given replacing its values (None with
    the pool launcher); PosencError for bad values or resource flags without a submitit launcher."""
    flags = {
        "partition": args.partition,
        "gpus_per_job": args.gpus_per_job,
        "time_min": args.time_min,
        "mem_gb": args.mem_gb,
    }
    given = {k: v for k, v in flags.items() if v is not None}
    if args.launcher == "pool":
        if given:
            raise PosencError(
                f"{', '.join('--' + k.replace('_', '-') for k in given)}: only with --launcher slurm (or local)"
            )
        return None
    return validated(
        ClusterConfig, {**(preset.cluster.model_dump() if preset.cluster else {}), **given}, "cluster flags"
    )


def dry_run(preset: Preset, out: Path, trained_from: Path | None = None) -> int:
    """``--dry-run``: the resolved preset and each stage's jobs (``posenc.jobs.job.Plan.outline``; a trend's rungs
    each), printed; nothing trained or written, nothing loaded but, with ``trained_from``, the text corpus's
    vocabulary the models it would take are checked against (``posenc.jobs.compare.check_source``)."""
    plans = {f"{r.name}/": Plan(r, out / preset.name) for r in rungs(preset)} or {"": Plan(preset, out)}
    for rung, plan in plans.items():  # a directory of other settings, refused as the run refuses it
        plan.check_settings()
        if trained_from is not None:
            plan.check()
            check_source(plan, trained_from / rung if rung else trained_from)
    stages = {f"{rung}{stage}": jobs for rung, plan in plans.items() for stage, jobs in plan.outline().items()}
    detail = ", ".join(f"{stage} {len(jobs)}" for stage, jobs in stages.items())
    started = [p.run_root for p in plans.values() if (p.run_root / "results.jsonl").exists()]
    if started:  # which of them are done is known once the plan's stages run
        detail += f"; {', '.join(map(str, started))} holds results: a run skips the jobs finished there"
    settings = {"out": out, **preset.model_dump(mode="json"), "stages": stages}
    return print_dry_run("posenc compare", settings, sum(map(len, stages.values())), f"per stage: {detail}")


def check_source_dir(source: Path | None, run_root: Path) -> None:
    """PosencError (one line) for a ``--trained-from`` that is not a directory or is this run's own."""
    if source is None:
        return
    if not source.is_dir():
        raise PosencError(f"--trained-from {source}: not a directory (give an earlier comparison's runs/NAME)")
    if run_root.exists() and source.resolve() == run_root.resolve():
        raise PosencError(f"--trained-from {source}: this run's own directory (give another --name)")


def run(args) -> int:
    settings = given_settings(args, FLAGS)
    refuse_derived_settings(settings, "compare", "--schemes (or the preset's schemes)")
    preset = load_preset(args.preset, settings)
    cluster = cluster_config(args, preset)
    check_options(args.launcher, not args.no_isolate, args.parallel, args.nproc_per_node, args.device)
    if not task_specs(preset):  # the text every job loads, refused once before any job as --dry-run refuses it
        check_data(preset.train.corpus, preset.train.tokenizer)
    check_run_dir(args.out / preset.name)  # a file in the way, refused before any job (and by the dry run)
    check_source_dir(args.trained_from, args.out / preset.name)
    if args.dry_run:
        return dry_run(preset, args.out, args.trained_from)
    try:
        options = dict(
            isolate=not args.no_isolate,
            parallel=args.parallel,
            nproc_per_node=args.nproc_per_node,
            log=args.log,
            launcher=args.launcher,
            cluster=cluster,
            device=args.device,
            trained_from=args.trained_from,
        )
        if preset.trend:  # each rung a comparison, then the trend report
            report, failures = compare_trend(preset, args.out, **options)
        else:
            report, failures = compare(preset, args.out, **options)
    except KeyboardInterrupt:  # cli prints it with the command that resumes
        raise KeyboardInterrupt(
            f"finished jobs are kept in {args.out / preset.name}; each interrupted one resumes from its last checkpoint"
        ) from None
    print(report.read_text())
    print(f"report: {report}")
    if failures:  # the others' results are in the report; scripts still learn that some failed
        print(f"posenc: {len(failures)} job(s) failed: {', '.join(failures)}", file=sys.stderr)
        return 1
    return 0
