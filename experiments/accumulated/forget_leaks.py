"""The forget gate's leak of every gated job of a task comparison's seed-0 grid, as CSV on standard output.

Each job's record carries ``leak`` (``posenc.eval.tasks.gate_leak``: the mean -log f per token of each head of each
gated layer, nats) but the committed ``retrieval.csv`` keeps no such column, and the grid's records stay in the run
directory. This writes one row per seed-0 job and gated layer for the tasks whose name starts with PREFIX (default:
all); a chosen point's screening and its completed job are one job (the same weights, the same leak):

    .venv/bin/python experiments/accumulated/forget_leaks.py LABEL=RUN_ROOT [LABEL=RUN_ROOT ...] [--task PREFIX]

(``results/retrieval-protocol/forget-leaks.csv`` is its output for ``results/retrieval (seed-0 grid)=RUN_ROOT``, the
root of the aa760a4 run of ``compare --preset retrieval`` (``runs/retrieval``), and
``mqar-forget-init=runs/forget-init/mqar-forget-init`` with ``--task mqar``.)
"""

import argparse
import csv
import sys
from pathlib import Path

from posenc.store.records import load_tasks


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="LABEL=RUN_ROOT: a comparison's root (its sweep/ holds the grid)")
    parser.add_argument("--task", default="", help="only tasks whose spec starts with this")
    args = parser.parse_args(argv)
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(["run", "scheme", "setting", "seed", "gated_layer", "leak_per_head_nats_per_token", "flattest"])
    for label, _, root in (run.partition("=") for run in args.runs):
        for point in sorted((Path(root) / "sweep").iterdir()):
            written = set()
            for r in load_tasks(point) or []:
                if r.task.startswith(args.task) and r.leak and r.seed == 0 and (r.task, r.scheme) not in written:
                    written.add((r.task, r.scheme))
                    for layer, heads in enumerate(r.leak, 1):
                        flat = ";".join(f"{h:.4f}" for h in heads)
                        out.writerow([label, r.scheme, point.name, r.seed, layer, flat, f"{min(heads):.4f}"])


if __name__ == "__main__":
    main(sys.argv[1:])
