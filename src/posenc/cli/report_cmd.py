"""`posenc report RUN_DIR...`: compare runs side by side (tables, overlaid ratio plot, claims); with task comparisons
among them, the scoreboard (``--scoreboard`` prints it alone, ``--readme FILE`` writes it into FILE's block)."""

from pathlib import Path

from posenc.cli.common import OUT, nonblank
from posenc.errors import PosencError
from posenc.reports.runs import scoreboard, write_runs_report
from posenc.reports.scoreboard import write_readme_block
from posenc.reports.trend import write_trend_report
from posenc.store.checkpoint import refuse_run_dir
from posenc.store.lock import hold_to_read


def add_parser(sub):
    p = sub.add_parser(
        "report",
        help="put compare runs side by side: perplexity and ratios per scheme and run, one plot, the claims; "
        "with task runs, the scoreboard",
        description="Runs made with other settings are labelled with how they differ (preset.json, else the "
        "header of report.md), not refused; schemes are matched by spec. Task comparisons (retrieval, "
        "state-tracking) add the scoreboard and the task claims.",
    )
    p.add_argument(
        "run_dirs",
        type=nonblank(Path),
        nargs="+",
        metavar="RUN_DIR",
        help="posenc compare run directories, text or task (runs/NAME, results/default, results/retrieval, ...)",
    )
    p.add_argument("--out", type=OUT, default=Path("runs") / "report", help="output directory (default runs/report/)")
    board = p.add_mutually_exclusive_group()  # one prints and writes nothing, the other writes the file
    board.add_argument(
        "--scoreboard", action="store_true", help="print the scoreboard alone (needs a task run) and write nothing"
    )
    board.add_argument(
        "--readme",
        type=nonblank(Path),
        metavar="FILE",
        help="write the scoreboard between FILE's <!-- scoreboard:begin --> and <!-- scoreboard:end --> lines",
    )
    p.add_argument(
        "--trend",
        type=nonblank(),
        metavar="KEY",
        help="lay text runs made at different values of one setting side by side as a trend (train.steps: a budget "
        "ladder): ratio at 16x and 128x against training tokens with 95%% intervals, each claim on each rung; "
        "writes trend.md, trend.csv, trend.png",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    for run_dir in args.run_dirs:  # a compare being written is refused, and none starts while it is read
        hold_to_read(run_dir)  # a read-only folder (a committed results/ one) only checked (posenc.store.lock)
    if args.scoreboard or args.readme:
        block = scoreboard(args.run_dirs)
        if args.readme:
            write_readme_block(args.readme, block)
            print(f"scoreboard: {args.readme}")
        else:
            print(block, end="")
        return 0
    given = [Path(d).resolve() for d in args.run_dirs]
    if Path(args.out).resolve() in given:  # its report.md (and plots) are the compare run's own
        raise PosencError(
            f"--out {args.out} is one of the runs read: its report would be replaced; give another folder"
        )
    refuse_run_dir(args.out, "report")
    if args.trend:
        report = write_trend_report(args.run_dirs, args.out, args.trend)
        print(report.read_text())
        print(f"report: {report}")
        return 0
    report = write_runs_report(args.run_dirs, args.out)
    print(report.read_text())
    print(f"report: {report}")
    return 0
