"""How results/retrieval/ was assembled: runs/retrieval3/results.jsonl holds seed 0 from the committed
retrieval.csv (the previous session's run, commit 3b4d92c; no per-job times kept, NaN) and seeds 1-2 from
runs/retrieval (commit 0befcb3, `posenc compare --preset retrieval --seeds 1 2 ...`); then the report.

    .venv/bin/python results/retrieval/merge_seeds.py     # writes runs/retrieval3/report.md and plots
"""
import csv
import json
import math
from collections import defaultdict
from pathlib import Path

from posenc.config import load_preset
from posenc.retrieval import task_meta
from posenc.retrieval_report import write_task_report

ROOT = Path(__file__).resolve().parents[2]
out = ROOT / "runs" / "retrieval3"
jobs = defaultdict(list)
for r in csv.DictReader(open(ROOT / "results" / "retrieval" / "retrieval.csv")):
    if r["seed"] == "0":
        n = int(r["answers"])
        jobs[(r["task"], r["scheme"])].append({"test": r["test"], "length": int(r["length"]), "bucket": int(r["bucket"]),
                                               "n": n, "correct": int(r["correct"]), "nll": float(r["nll_mean"]) * n})
lines = [json.dumps({"kind": "task", "task": t, "scheme": s, "seed": 0, "train_length": 128, "train_seconds": math.nan,
                     "eval_seconds": math.nan, "threads": 1, "cells": cells}) for (t, s), cells in jobs.items()]
lines += [line.strip() for line in open(ROOT / "runs" / "retrieval" / "results.jsonl") if '"kind": "task"' in line]
out.mkdir(parents=True, exist_ok=True)
(out / "results.jsonl").write_text("\n".join(lines) + "\n")
meta = task_meta(load_preset("retrieval", {"seeds": [0, 1, 2]}))
meta["notes"] = (meta["notes"] or "") + (
    "\n\nSeeds: seed 0 of every scheme is the run committed with commit 3b4d92c (its cells, from retrieval.csv; "
    "no per-job times kept); seeds 1 and 2 of the eleven main schemes on flip-flop, and of path and rope on gap-MQAR, were run "
    "by commit 0befcb3 (one thread per job, the same settings). The step-width sweep (a = 0.25, 0.5, 2) and the other schemes' "
    "gap-MQAR runs are seed 0 only.")
print(write_task_report(out, meta))
