"""Run-to-run noise of the default comparison: the same seed trained with 1 and with 2 threads, or two runs compared.

Thread count changes the order of floating-point sums in the matmuls, so a learned scheme
trained twice with one seed and one budget can end at other weights. This trains seed 0 of the
default preset with one thread and compares it with a default run made with two (by default
``runs/default``, what ``posenc compare --preset default`` writes on 2 cores): how far perplexity
at 1x and the ratios at 16x and 128x move. Writes ``results/run_noise.{json,md}``; the claims'
``PPL_NOISE`` and ``RATIO_NOISE`` of ``experiments/accumulated/claims.py`` are the largest of these.

``--between A B`` trains nothing: it compares seed 0 of two default runs of the same code (run
directories, or committed results with their ``results.csv``), made on two machines, at every scheme
and evaluation length, into ``results/run_noise_machines.{json,md}``.

    .venv/bin/python benchmarks/run_noise.py [--schemes rope acc-learned-qkv] [--against runs/default]
    .venv/bin/python benchmarks/run_noise.py --between results/demo-epyc results/demo-xeon
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from posenc.config.plan import load_preset
from posenc.jobs.compare import compare
from posenc.reports.render import markdown_table
from posenc.reports.text import with_ratios
from posenc.store import records
from posenc.store.stamp import run_stamp

RESULTS = Path(__file__).resolve().parents[1] / "results"
L0 = 128


def seed0(run_dir: Path) -> dict[tuple[str, int], tuple[float, float]]:
    """{(scheme, eval length): (ppl, ratio)} of seed 0 in a compare run directory (or committed results)."""
    recs = records.load_ppl(run_dir)
    if recs is None:
        raise SystemExit(f"run_noise: {run_dir} has no results.jsonl or results.csv")
    return {(r.scheme, r.eval_length): (r.ppl, r.ratio) for r in with_ratios([r for r in recs if r.seed == 0]) if r.ppl}


def device_of(run_dir: Path) -> str:
    """The device line of the run's last compare invocation (``invocations.jsonl``)."""
    return json.loads((run_dir / "invocations.jsonl").read_text().splitlines()[-1]).get("device", "unknown")


def between(a: Path, b: Path) -> None:
    """Relative change of ppl and ratio of seed 0 from run ``a`` to run ``b`` at every scheme and length."""
    one, other = seed0(a), seed0(b)
    rows, worst = [], {}
    for s, L in sorted(set(one) & set(other)):
        (p1, r1), (p2, r2) = one[(s, L)], other[(s, L)]
        dp, dr = abs(p2 - p1) / p1, abs(r2 - r1) / r1
        w = worst.setdefault(s, {"ppl": 0.0, "ratio": 0.0})
        w["ppl"], w["ratio"] = max(w["ppl"], dp), max(w["ratio"], dr)
        rows.append(
            [
                s,
                f"{L // L0}x",
                f"{p1:.4f}",
                f"{p2:.4f}",
                f"{100 * dp:.2f}%",
                f"{r1:.4f}",
                f"{r2:.4f}",
                f"{100 * dr:.2f}%",
            ]
        )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "run_noise_machines.json").write_text(
        json.dumps(
            {"a": str(a), "b": str(b), "device_a": device_of(a), "device_b": device_of(b), "largest_by_scheme": worst},
            indent=1,
        )
        + "\n"
    )
    md = (
        f"# Run-to-run noise between machines: default preset, seed 0\n\n`{a}` ({device_of(a)}) against `{b}` "
        f"({device_of(b)}): relative change of perplexity and of its ratio to 1x at every length. Command: "
        f"`.venv/bin/python benchmarks/run_noise.py --between {a} {b}`.\n\n"
        + markdown_table(["scheme", "length", "ppl a", "ppl b", "change", "ratio a", "ratio b", "change"], rows)
        + "\n\nLargest change per scheme (over every length):\n\n"
        + markdown_table(
            ["scheme", "ppl", "ratio"],
            [[s, f"{100 * w['ppl']:.2f}%", f"{100 * w['ratio']:.2f}%"] for s, w in worst.items()],
        )
        + "\n"
    )
    (RESULTS / "run_noise_machines.md").write_text(md)
    print(md)


def threads_of(run_dir: Path, scheme: str) -> int:
    return json.loads((run_dir / scheme / "seed0" / "config.json").read_text())["stamp"]["threads"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schemes", nargs="+", default=["rope", "acc-learned-qkv", "hybrid", "rope+forget"])
    ap.add_argument(
        "--against", type=Path, default=Path("runs/default"), help="a default-preset run made with 2 threads"
    )
    ap.add_argument("--out", type=Path, default=Path("runs/noise"))
    ap.add_argument(
        "--between", type=Path, nargs=2, metavar=("A", "B"), help="compare two existing runs; train nothing"
    )
    args = ap.parse_args()
    if args.between:
        return between(*args.between)
    preset = load_preset(
        "default", {"name": "threads1", "schemes": args.schemes, "seeds": [0], "train": {"threads": 1}}
    )
    compare(preset, args.out)
    one, other = seed0(args.out / preset.name), seed0(args.against)
    rows, spread = [], {"ppl": {}, "ratio": {}}
    for s in args.schemes:
        for L in (L0, 16 * L0, 128 * L0):
            (p1, r1), (p2, r2) = one[(s, L)], other[(s, L)]
            kind, a, b = ("ppl", p1, p2) if L == L0 else ("ratio", r1, r2)
            spread[kind][f"{s}@{L // L0}x"] = abs(b - a) / a
            rows.append([s, f"{kind} at {L // L0}x", f"{a:.4f}", f"{b:.4f}", f"{100 * abs(b - a) / a:.2f}%"])
    threads = {s: threads_of(args.against, s) for s in args.schemes}
    largest = {k: max(v.values()) for k, v in spread.items()}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "run_noise.json").write_text(
        json.dumps(
            {
                "relative_difference": spread,
                "largest": largest,
                "against": str(args.against),
                "against_threads": threads,
                "stamp": run_stamp(),
            },
            indent=1,
        )
        + "\n"
    )
    md = (
        "# Run-to-run noise: default preset, seed 0, 1 thread vs 2 threads\n\n"
        f"The same preset, seed and steps trained with 1 thread (`{args.out / preset.name}`) and with "
        f"{sorted(set(threads.values()))} threads (`{args.against}`); relative difference of perplexity at 1x and "
        "of the perplexity ratio at 16x and 128x. Command: `.venv/bin/python benchmarks/run_noise.py`.\n\n"
        + markdown_table(["scheme", "value", "1 thread", "2 threads", "relative difference"], rows)
        + f"\n\nLargest: perplexity {100 * largest['ppl']:.2f}%, ratio {100 * largest['ratio']:.2f}%.\n"
    )
    (RESULTS / "run_noise.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
