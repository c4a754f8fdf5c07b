"""Run-to-run noise of the default comparison: the same seed trained with 1 and with 2 threads.

Thread count changes the order of floating-point sums in the matmuls, so a learned scheme
trained twice with one seed and one budget ends at other weights. This measures how far its
perplexity at 1x and its ratios move, beside the seed-to-seed spread, and writes
``results/run_noise.{json,md}``; ``posenc.claims.RUN_NOISE`` comes from it.

    .venv/bin/python benchmarks/run_noise.py [--schemes rope acc-learned-qkv] [--out runs/noise]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from posenc.checkpoint import read_jsonl
from posenc.compare import compare
from posenc.config import load_preset
from posenc.report import with_ratios
from posenc.reporting import markdown_table
from posenc.stamp import run_stamp

HERE = Path(__file__).parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schemes", nargs="+", default=["rope", "acc-learned-qkv", "hybrid"])
    ap.add_argument("--out", type=Path, default=Path("runs/noise"))
    ap.add_argument("--results", type=Path, default=HERE / "results")
    args = ap.parse_args()
    values: dict[int, dict] = {}
    for threads in (1, 2):
        preset = load_preset("default", {"name": f"threads{threads}", "schemes": args.schemes, "train": {"threads": threads}})
        compare(preset, args.out)
        recs = with_ratios([r for r in read_jsonl(args.out / preset.name / "results.jsonl") if r.get("kind", "ppl") == "ppl"])
        values[threads] = {(r["scheme"], r["eval_length"]): (r["ppl"], r["ratio"]) for r in recs}
    rows, spread = [], {}
    L0 = 128
    for s in args.schemes:
        for L in (L0, 16 * L0, 128 * L0):
            (p1, r1), (p2, r2) = values[1][(s, L)], values[2][(s, L)]
            rel = abs(p2 - p1) / p1 if L == L0 else abs(r2 - r1) / r1
            spread[f"{s}@{L}"] = rel
            rows.append([s, f"{L // L0}x", f"{p1:.3f}" if L == L0 else f"{r1:.4f}", f"{p2:.3f}" if L == L0 else f"{r2:.4f}", f"{100 * rel:.2f}%"])
    args.results.mkdir(exist_ok=True)
    (args.results / "run_noise.json").write_text(json.dumps({"relative_difference": spread, "stamp": run_stamp()}, indent=1))
    md = ("# Run-to-run noise: default preset, seed 0, 1 vs 2 threads\n\n"
          "Perplexity at 1x, perplexity ratio at 16x and 128x; relative difference between the two runs.\n\n"
          + markdown_table(["scheme", "value", "1 thread", "2 threads", "relative difference"], rows)
          + f"\n\nLargest: {100 * max(spread.values()):.2f}%.\n")
    (args.results / "run_noise.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
