"""How results/state-tracking/ was made (commit ee7182f, one thread per job, this session's machine):

    posenc compare --preset state-tracking --parallel 2 --out runs                  # seed 0 of the ten schemes
    posenc compare --preset state-tracking --seeds 1 2 --schemes path acc-learned-qkv acc-learned-qk hybrid rope \
        --parallel 2 --out runs                                                     # seeds 1-2 of five of them
    .venv/bin/python results/state-tracking/make_report.py                          # this report (seeds 0-2)

The report of a compare invocation states that invocation's seeds; this one states all three and which
schemes have them, then copies the report, retrieval.csv and the plots here.
"""
import shutil
from pathlib import Path

from posenc.config import load_preset
from posenc.retrieval import task_meta
from posenc.retrieval_report import write_task_report

ROOT = Path(__file__).resolve().parents[2]
run, here = ROOT / "runs" / "state-tracking", Path(__file__).parent
meta = task_meta(load_preset("state-tracking", {"seeds": [0, 1, 2]}))
meta["notes"] = (meta["notes"] or "") + (
    "\n\nSeeds: 0 for every scheme; 1 and 2 for path, acc-learned-qkv, acc-learned-qk, hybrid and rope only "
    "(the schemes the claim and the Q/K-against-Q/K/V comparison need, and the RoPE baseline); the five others "
    "did not learn the task on seed 0 and have that seed alone.")
report = write_task_report(run, meta)
for f in [report, run / "retrieval.csv", *run.glob("*.png"), run / "invocations.jsonl"]:
    shutil.copy(f, here / f.name)
print(here / "report.md")
