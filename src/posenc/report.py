"""Tables and plots of a ``compare`` run: markdown, CSV and PNG.

Reads ``results.jsonl`` (one record per finished evaluation) and writes
``report.md``, ``results.csv`` and ``ppl_ratio.png`` (perplexity ratio to the
training-length perplexity against evaluation length, log axis) into the run
directory. With several seeds a cell shows the mean and the half-range.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from pathlib import Path

import numpy as np

from posenc.checkpoint import atomic_write_bytes, read_jsonl

CSV_FIELDS = ["scheme", "seed", "train_length", "eval_length", "windows", "scored_tokens", "nll", "ppl", "ratio", "note"]


def with_ratios(records: list[dict]) -> list[dict]:
    """Add ``ratio`` = ppl / ppl at the training length (same scheme and seed)."""
    base = {(r["scheme"], r["seed"]): r["ppl"] for r in records if r.get("eval_length") == r.get("train_length") and r.get("ppl")}
    out = []
    for r in records:
        b = base.get((r["scheme"], r["seed"]))
        out.append({**r, "ratio": r["ppl"] / b if (b and r.get("ppl")) else None})
    return out


def _cell(values: list[float], fmt: str) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    if len(values) == 1:
        return format(values[0], fmt)
    return f"{format(np.mean(values), fmt)} ± {format((max(values) - min(values)) / 2, fmt)}"


def _grid(records, key):
    """scheme -> eval_length -> [values over seeds]."""
    grid = defaultdict(lambda: defaultdict(list))
    for r in records:
        grid[r["scheme"]][r["eval_length"]].append(r.get(key))
    return grid


def markdown(records: list[dict], failures: dict[str, str], meta: dict) -> str:
    lengths = sorted({r["eval_length"] for r in records})
    schemes = list(dict.fromkeys(r["scheme"] for r in records))
    L0 = meta.get("train_length")
    out = io.StringIO()
    out.write(f"# posenc compare: {meta.get('name', '')}\n\n")
    for k in ("corpus", "tokenizer", "model", "budget", "seeds", "eval", "notes"):
        if meta.get(k) is not None:
            out.write(f"- **{k}**: {meta[k]}\n")
    for title, key, fmt in (("Perplexity ratio to the training length", "ratio", ".3f"), ("Perplexity", "ppl", ".2f")):
        grid = _grid(records, key)
        head = " | ".join(f"{L} ({L // L0}x)" if L0 else str(L) for L in lengths)
        out.write(f"\n## {title}\n\n| scheme | {head} |\n|---|{'---|' * len(lengths)}\n")
        for s in schemes:
            out.write(f"| {s} | " + " | ".join(_cell(grid[s][L], fmt) for L in lengths) + " |\n")
    if meta.get("descriptions"):
        out.write("\n## Schemes\n\n")
        for s, d in meta["descriptions"].items():
            out.write(f"- `{s}`: {d}\n")
    if failures:
        out.write("\n## Failed\n\n")
        for s, err in failures.items():
            out.write(f"- `{s}`: {err}\n")
    out.write("\nFiles: `results.jsonl` (one record per evaluation), `results.csv`, `ppl_ratio.png`, `buckets.png`.\n")
    return out.getvalue()


def write_csv(path: Path, records: list[dict]) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore")
    w.writeheader()
    w.writerows(records)
    atomic_write_bytes(path, buf.getvalue().encode())


def plot_ratio(path: Path, records: list[dict], train_length: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    grid = _grid(records, "ratio")
    for s, row in grid.items():
        xs = [L / train_length for L in sorted(row) if any(v is not None for v in row[L])]
        ys = [np.mean([v for v in row[L] if v is not None]) for L in sorted(row) if any(v is not None for v in row[L])]
        if xs:
            ax.plot(xs, ys, marker="o", label=s)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.set_xlabel("evaluation length / training length")
    ax.set_ylabel("perplexity / perplexity at training length")
    ax.set_title(f"Length extrapolation (train length {train_length})")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    _save_fig(fig, path)


def plot_buckets(path: Path, records: list[dict], train_length: int) -> None:
    """Per-position-bucket perplexity at the longest evaluated length, per scheme."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    longest = {}
    for r in records:
        if r.get("bucket_ppl") and r["eval_length"] >= longest.get(r["scheme"], {}).get("eval_length", 0):
            longest[r["scheme"]] = r
    for s, r in longest.items():
        mids = [(a + b) / 2 / train_length for a, b in zip(r["bucket_edges"][:-1], r["bucket_edges"][1:])]
        ax.plot(mids, r["bucket_ppl"], marker=".", label=f"{s} (L={r['eval_length']})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("position in window / training length")
    ax.set_ylabel("perplexity of the position bucket")
    ax.set_title("Where each scheme breaks")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    _save_fig(fig, path)


def _save_fig(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(Path(path), buf.getvalue())


def write_report(run_dir: Path, meta: dict, failures: dict[str, str] | None = None) -> Path:
    """Write report.md, results.csv, ppl_ratio.png, buckets.png; returns report.md's path."""
    run_dir = Path(run_dir)
    records = with_ratios([r for r in read_jsonl(run_dir / "results.jsonl") if r.get("kind", "ppl") == "ppl"])
    write_csv(run_dir / "results.csv", records)
    if records:
        plot_ratio(run_dir / "ppl_ratio.png", records, meta["train_length"])
        plot_buckets(run_dir / "buckets.png", records, meta["train_length"])
    path = run_dir / "report.md"
    atomic_write_bytes(path, markdown(records, failures or {}, meta).encode())
    return path
