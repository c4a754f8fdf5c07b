"""`posenc report RUN_DIR...`: compare runs side by side (tables, overlaid ratio plot, claims)."""

import argparse
from pathlib import Path

from posenc.runs_report import write_runs_report


def add_parser(sub):
    p = sub.add_parser("report", help="put compare runs side by side: perplexity and ratios per scheme and run, one plot, the claims",
                       description="Runs made with other settings are labelled with how they differ (preset.json, else the "
                       "header of report.md), not refused; schemes are matched by spec.")
    p.add_argument("run_dirs", type=Path, nargs="+", metavar="RUN_DIR", help="posenc compare run directories (runs/NAME, results/default, ...)")
    p.add_argument("--out", type=_out_dir, default=Path("runs") / "report", help="output directory (default runs/report/)")
    p.set_defaults(func=run)


def _out_dir(text: str) -> Path:
    if not text.strip():
        raise argparse.ArgumentTypeError("--out is empty: give a directory")
    return Path(text)


def run(args) -> int:
    report = write_runs_report(args.run_dirs, args.out)
    print(report.read_text())
    print(f"report: {report}")
    return 0
