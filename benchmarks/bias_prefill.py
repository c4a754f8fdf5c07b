"""Evaluation-forward time of the score-bias schemes at long contexts, as a ratio to RoPE's (issue #35 item 3).

    .venv/bin/python benchmarks/bias_prefill.py                                  # 4K and 16K, 3 repeats, 1 thread
    .venv/bin/python benchmarks/bias_prefill.py --baseline old.json              # adds the old path's columns

The default ``compare`` model (4 layers, width 256, 4 heads, vocabulary 256; random weights: speed
does not depend on them) of each scheme runs one forward of one sequence of L random tokens under
``torch.no_grad()`` on one thread, timed as the process's CPU time (a shared machine's other processes
stretch wall time much more). The schemes are interleaved within each repeat and each cell is the
minimum over the repeats. ``--baseline``
takes the JSON this script wrote for another commit (run it with that commit's ``src`` on PYTHONPATH and
``--json-only``) and reports its seconds and ratios beside these. Writes ``results/bias_prefill.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from posenc.model import build_model
from posenc.reports.render import markdown_table
from posenc.store.checkpoint import atomic_write_bytes

OUT = Path(__file__).resolve().parent / "results"
SCHEMES = ["rope", "alibi", "forget", "hybrid", "rope+forget", "t5", "kerple", "fire"]


def forward_seconds(model, T: int) -> float:
    """CPU seconds of this process (one thread) for one forward: other processes on a shared machine stretch the
    wall time, far less the CPU time."""
    tokens = torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(T))
    with torch.no_grad():
        t0 = time.process_time()
        model(tokens)
        return time.process_time() - t0


def measure(schemes: list[str], lengths: list[int], repeats: int) -> dict:
    """{L: {scheme: min seconds over the repeats}}, the schemes interleaved inside each repeat."""
    models = {}
    for s in schemes:
        torch.manual_seed(0)
        models[s] = build_model({"encoding": s}).eval()
        forward_seconds(models[s], 256)  # warm-up: first-call allocations and kernel selection
    table = {}
    for T in lengths:
        best = {s: float("inf") for s in schemes}
        for _ in range(repeats):
            for s in schemes:
                best[s] = min(best[s], forward_seconds(models[s], T))
        table[str(T)] = best
        print(T, {s: round(v, 3) for s, v in best.items()}, file=sys.stderr, flush=True)
    return table


def report(res: dict, base: dict | None, command: str) -> str:
    lengths, schemes = list(res["seconds"]), list(res["seconds"][next(iter(res["seconds"]))])
    header, rows = ["scheme"], []
    for T in lengths:
        label = f"{int(T) // 1024}K"
        header += ([f"{label} old s", f"{label} old ratio"] if base else []) + [f"{label} s", f"{label} ratio"]
    for s in schemes:
        row = [s]
        for T in lengths:
            for tab in ([base["seconds"]] if base else []) + [res["seconds"]]:
                sec = tab.get(T, {}).get(s)
                row += ["", ""] if sec is None else [f"{sec:.2f}", f"{sec / tab[T]['rope']:.2f}"]
        rows.append(row)
    lines = [
        "# Score-bias schemes: evaluation forward at long contexts",
        "",
        f"Command: `{command}`",
        "",
        f"Default model (4 layers, width 256, 4 heads), one sequence, `torch.no_grad()`, {res['threads']} thread(s), "
        f"CPU seconds of the process (`time.process_time`), min of {res['repeats']} interleaved repeats; "
        f"ratio = seconds / RoPE's at the same length. "
        f"{res['platform']}, torch {res['torch']}, load average {res['load']}.",
    ]
    if base:
        lines += ["", f"old: {base['label']}; new: {res['label']}."]
    return "\n".join(lines + ["", markdown_table(header, rows), ""])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--schemes", nargs="+", default=SCHEMES)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--label", default="this commit", help="what the numbers are of (a commit), for the table")
    ap.add_argument("--baseline", type=Path, help="JSON this script wrote for the old path")
    ap.add_argument("--json-only", type=Path, help="write only this JSON (the baseline run), no results/ files")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    res = {
        "label": args.label,
        "threads": args.threads,
        "repeats": args.repeats,
        "torch": torch.__version__,
        "platform": platform.processor() or platform.machine(),
    }
    res["seconds"] = measure(args.schemes, args.lengths, args.repeats)
    res["load"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    if args.json_only:
        atomic_write_bytes(args.json_only, json.dumps(res, indent=1).encode())
        return
    base = json.loads(args.baseline.read_text()) if args.baseline else None
    command = "python benchmarks/bias_prefill.py " + " ".join(sys.argv[1:])
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(args.out / "bias_prefill.json", json.dumps({"new": res, "old": base}, indent=1).encode())
    md = report(res, base, command)
    atomic_write_bytes(args.out / "bias_prefill.md", md.encode())
    print(md)


if __name__ == "__main__":
    main()
