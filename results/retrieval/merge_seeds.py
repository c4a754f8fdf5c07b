"""How results/retrieval/ was assembled from three sessions' jobs (each on its own machine; the same settings,
one thread per job):
- the cells committed in results/retrieval/retrieval.csv before this merge: seed 0 of every job (commit 3b4d92c),
  seeds 1-2 of the eleven main schemes on flip-flop and of path and rope on gap-MQAR (commit 0befcb3); the CSV
  keeps no per-job times (NaN here; the earlier reports' time ranges are quoted in the notes);
- runs/retrieval/results.jsonl: the jobs run since (`posenc compare --preset retrieval --seeds 1 2 --schemes ...
  --tasks mqar:...`, see invocations-seeds12.jsonl), which replace nothing already in the CSV.

    .venv/bin/python results/retrieval/merge_seeds.py     # writes runs/retrieval3/report.md, retrieval.csv, plots
"""

import csv
import math
from collections import defaultdict
from pathlib import Path

from posenc.config import load_preset
from posenc.records import Task, TaskCell, append, load
from posenc.retrieval import task_meta
from posenc.retrieval_report import write_task_report

ROOT = Path(__file__).resolve().parents[2]
out = ROOT / "runs" / "retrieval3"
cells = defaultdict(list)
for r in csv.DictReader(open(ROOT / "results" / "retrieval" / "retrieval.csv")):
    n = int(r["answers"])
    cells[(r["task"], r["scheme"], int(r["seed"]))].append(
        TaskCell(
            test=r["test"],
            length=int(r["length"]),
            bucket=int(r["bucket"]),
            n=n,
            correct=int(r["correct"]),
            nll=float(r["nll_mean"]) * n,
        )
    )
records = [
    Task(
        task=t, scheme=s, seed=seed, train_length=128, train_seconds=math.nan, eval_seconds=math.nan, threads=1, cells=c
    )
    for (t, s, seed), c in cells.items()
]
records += [
    r
    for r in load(ROOT / "runs" / "retrieval" / "results.jsonl")
    if isinstance(r, Task) and (r.task, r.scheme, r.seed) not in cells
]
out.mkdir(parents=True, exist_ok=True)
(out / "results.jsonl").unlink(missing_ok=True)
for r in records:
    append(out / "results.jsonl", r)
meta = task_meta(load_preset("retrieval", {"seeds": [0, 1, 2]}))
meta["notes"] = (meta["notes"] or "") + (
    "\n\nSeeds: seed 0 of every job ran with commit 3b4d92c; seeds 1 and 2 of the eleven main schemes on flip-flop, "
    "and of path and rope on gap-MQAR, with commit 0befcb3 "
    "(training 149-435 s, evaluation 40-168 s per flip-flop job); "
    "seeds 1 and 2 of the other nine schemes on gap-MQAR with commit b3bfe8e (their times are below). Three sessions, "
    "three machines, the same settings and one thread per job; only the last jobs' times are kept. The step-width "
    "sweep (a = 0.25, 0.5, 2) is seed 0 only."
)
print(write_task_report(out, meta))
