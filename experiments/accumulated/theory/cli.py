"""The theory command: Monte Carlo checks of the stylized model of accumulated transports, a subcommand this study
adds to posenc's command line (``posenc.cli.main.main``'s ``commands``), run by ``python -m
experiments.accumulated.theory`` (``__main__.py``)."""

from pathlib import Path

from experiments.accumulated.theory.run import DEFAULT_DIMS, DEFAULT_DISTS, checks_table, run_theory
from posenc.cli.common import add_set, given_settings
from posenc.cli.main import main

PROG = "python -m experiments.accumulated.theory"


def theory(argv: list[str]) -> int:
    """Run the theory command with the options ``argv`` (as after ``PROG``); its exit code (posenc's: 2 for bad
    input, printed in one line under ``PROG``)."""
    return main(["theory", *argv], commands=[add_parser], prog=PROG)


def add_parser(sub):
    p = sub.add_parser(
        "theory",
        prog=PROG,
        help="Monte Carlo checks of the accumulated-transport theory (plots, summary.md, results.json)",
        description="Mixing window, score gap, far-mass bound, value incoherence and long-range decay: "
        "closed forms and bounds against float64 simulation. Exit 0 if every check holds, 1 otherwise.",
    )
    p.add_argument("--out", type=Path, default=Path("runs/theory"), help="output folder (default runs/theory)")
    p.add_argument("--quick", action="store_true", help="small sample sizes (seconds; for tests): --preset quick")
    p.add_argument(
        "--preset",
        help="the sample sizes: a budget of budgets/ beside this command (full, quick) or a YAML path (default full)",
    )
    add_set(p, "mix_samples=5000 (the keys are the budget's: docs/presets.md)")
    p.add_argument("--seed", type=int, default=0, help="base random seed (default %(default)s)")
    p.add_argument(
        "--dims",
        type=int,
        nargs="+",
        default=list(DEFAULT_DIMS),
        help="dimensions d of the score-gap check (even for SO(2))",
    )
    p.add_argument(
        "--mix-dim", type=int, default=16, help="d of the mixing, far-mass and value checks (default %(default)s)"
    )
    p.add_argument(
        "--dists",
        nargs="+",
        default=list(DEFAULT_DISTS),
        help="step distributions: so2:<a>, so2-drift[:base], householder, haar",
    )
    p.add_argument("--eps", type=float, default=0.01, help="mixing tolerance in (0, 1) (default %(default)s)")
    p.set_defaults(func=run)


def run(args) -> int:
    report = run_theory(
        args.out,
        dists=tuple(args.dists),
        dims=tuple(args.dims),
        mix_dim=args.mix_dim,
        eps=args.eps,
        seed=args.seed,
        quick=args.quick,
        preset=args.preset,
        overrides=given_settings(args, {}),
    )
    print(checks_table(report["table"]))
    held = sum(r["holds"] for r in report["table"])
    print(f"\n{held}/{len(report['table'])} checks hold; {report['runtime_s']:.1f} s; wrote {args.out}/summary.md")
    return 0 if report["all_hold"] else 1
