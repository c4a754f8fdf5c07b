"""Tables and plots for ``posenc extend``: aggregate JSONL records into
``results.md``, ``ppl.csv``, ``passkey.csv``, ``ppl_vs_length.png``,
``ppl_by_position.png`` and ``passkey.png``."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from posenc.reports.render import (
    MISSING,
    PPL,
    figure,
    log_scale,
    markdown_table,
    number,
    plot_lines,
    save_figure,
    write_csv_table,
)
from posenc.store.checkpoint import atomic_write_bytes
from posenc.store.records import PasskeyTrial, PretrainedRecord, ScoredWindow

PPL_FIELDS = [
    "adaptation",
    "factor",
    "length",
    "stride",
    "bos",
    "windows",
    "scored_tokens",
    "ppl",
    "docs",
    "seconds",
    "reused_from",
]
PASSKEY_FIELDS = ["adaptation", "factor", "length", "depth", "trials", "correct", "accuracy", "prompt_tokens"]


def ppl_rows(records: list[PretrainedRecord]) -> list[dict]:
    """One row per (adaptation, factor, length): windows, scored tokens, PPL and per-bucket sums."""
    groups = defaultdict(list)
    for r in records:
        if isinstance(r, ScoredWindow):
            groups[(r.adaptation, r.factor, r.length)].append(r)
    rows = []
    for (adaptation, factor, length), rs in groups.items():
        nll, n = sum(r.nll_sum for r in rs), sum(r.n_scored for r in rs)
        width = max(len(r.bucket_n) for r in rs)
        b_nll, b_n = [0.0] * width, [0] * width
        for r in rs:
            for i, (s, c) in enumerate(zip(r.bucket_nll, r.bucket_n)):
                b_nll[i] += s
                b_n[i] += c
        rows.append(
            {
                "adaptation": adaptation,
                "factor": factor,
                "length": length,
                "stride": rs[0].stride,
                "bos": rs[0].bos,
                "windows": len(rs),
                "scored_tokens": n,
                "ppl": math.exp(nll / n),
                "docs": ",".join(sorted({r.doc for r in rs})),
                "seconds": sum(r.seconds for r in rs),
                "reused_from": ",".join(sorted({r.reused_from for r in rs if r.reused_from is not None})),
                "bucket": rs[0].bucket,
                "bucket_ppl": [math.exp(s / c) if c else None for s, c in zip(b_nll, b_n)],
            }
        )
    return sorted(rows, key=lambda r: (r["adaptation"], r["length"]))


def passkey_rows(records: list[PretrainedRecord]) -> list[dict]:
    """One row per (adaptation, factor, length, depth): trials and accuracy."""
    groups = defaultdict(list)
    for r in records:
        if isinstance(r, PasskeyTrial):
            groups[(r.adaptation, r.factor, r.length, r.depth)].append(r)
    return sorted(
        (
            {
                "adaptation": m,
                "factor": f,
                "length": L,
                "depth": d,
                "trials": len(rs),
                "correct": sum(r.correct for r in rs),
                "accuracy": sum(r.correct for r in rs) / len(rs),
                "prompt_tokens": max(r.prompt_tokens for r in rs),
            }
            for (m, f, L, d), rs in groups.items()
        ),
        key=lambda r: (r["adaptation"], r["length"], r["depth"]),
    )


def _k(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def markdown(ppl: list[dict], passkey: list[dict], adaptations: list[str], header: str) -> str:
    lengths = sorted({r["length"] for r in ppl})
    cell = {(r["adaptation"], r["length"]): r for r in ppl}
    head = ["adaptation", *(_k(L) for L in lengths)]
    lines = [
        header,
        "",
        "## Perplexity (lower is better)",
        "",
        markdown_table(
            head,
            [[m, *(number(cell[m, L]["ppl"] if (m, L) in cell else None, PPL) for L in lengths)] for m in adaptations],
        ),
        "",
        "Scored tokens per point (windows):",
        "",
        markdown_table(
            head,
            [
                [
                    m,
                    *(
                        f"{cell[m, L]['scored_tokens']} ({cell[m, L]['windows']})" if (m, L) in cell else MISSING
                        for L in lengths
                    ),
                ]
                for m in adaptations
            ],
        ),
    ]
    if passkey:
        cols = sorted({(r["length"], r["depth"]) for r in passkey})
        pk = {(r["adaptation"], r["length"], r["depth"]): r for r in passkey}
        rows = [
            [m, *(f"{pk[m, L, d]['correct']}/{pk[m, L, d]['trials']}" if (m, L, d) in pk else MISSING for L, d in cols)]
            for m in adaptations
        ]
        lines += [
            "",
            "## Passkey retrieval (correct / trials)",
            "",
            markdown_table(["adaptation", *(f"{_k(L)} @ {d:g}" for L, d in cols)], rows),
        ]
    return "\n".join(lines) + "\n"


def length_figure(ppl: list[dict], adaptations: list[str]):
    """The figure of ``ppl_vs_length.png``: perplexity against evaluation length (log-log), one curve per adaptation
    in ``adaptations`` (rows of :func:`ppl_rows`); identical curves stay visible
    (``posenc.reports.render.plot_lines``)."""
    from matplotlib.ticker import NullLocator

    fig, ax = figure(figsize=(9, 4.5))
    lines = []
    for m in adaptations:
        rs = sorted((r for r in ppl if r["adaptation"] == m), key=lambda r: r["length"])
        if rs:
            lines.append({"label": m, "x": [r["length"] for r in rs], "y": [r["ppl"] for r in rs]})
    plot_lines(ax, lines)
    ax.set(xscale="log", xlabel="evaluation length (tokens)", ylabel="perplexity")
    log_scale(ax, "y")
    lengths = sorted({r["length"] for r in ppl})
    ax.set_xticks(lengths, [_k(L) for L in lengths], minor=False)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))  # outside: the curves stay uncovered
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig


def position_figure(ppl: list[dict], adaptations: list[str]):
    """The figure of ``ppl_by_position.png``: perplexity per position bucket (each point at its bucket's middle,
    tokens) at each adaptation's longest length; identical curves stay visible."""
    fig, ax = figure(figsize=(9, 4.5))
    longest = [
        max((r for r in ppl if r["adaptation"] == m), key=lambda r: r["length"])
        for m in adaptations
        if any(r["adaptation"] == m for r in ppl)
    ]
    lines = []
    for r in longest:
        xs = [(i + 0.5) * r["bucket"] for i, v in enumerate(r["bucket_ppl"]) if v]
        lines.append(
            {
                "label": f"{r['adaptation']} @ {_k(r['length'])}",
                "x": xs,
                "y": [v for v in r["bucket_ppl"] if v],
                "ms": 3,
            }
        )
    plot_lines(ax, lines)
    widths = " / ".join(str(w) for w in sorted({r["bucket"] for r in longest}))
    ax.set(
        xlabel=f"position in window (tokens; buckets of {widths} tokens, each point at its middle)",
        ylabel="bucket perplexity",
    )
    log_scale(ax, "y")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def passkey_figure(passkey: list[dict], adaptations: list[str]):
    """The figure of ``passkey.png``: per adaptation, correct / trials by key depth (rows) and length (columns)."""
    lengths = sorted({r["length"] for r in passkey})
    depths = sorted({r["depth"] for r in passkey})
    ms = [m for m in adaptations if any(r["adaptation"] == m for r in passkey)]
    fig, axes = figure(1, len(ms), figsize=(1.6 * len(ms) + 1.5, 3), squeeze=False, layout="constrained")
    for n, (ax, m) in enumerate(zip(axes[0], ms)):
        grid = np.full((len(depths), len(lengths)), np.nan)
        for r in passkey:
            if r["adaptation"] == m:
                y, x = depths.index(r["depth"]), lengths.index(r["length"])
                grid[y, x] = r["accuracy"]
                ax.text(x, y, f"{r['correct']}/{r['trials']}", ha="center", va="center", fontsize=8)
        im = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        ax.set(
            title=m,
            xticks=range(len(lengths)),
            xticklabels=[_k(L) for L in lengths],
            xlabel="length",
            yticks=range(len(depths)),
            yticklabels=[f"{d:g}" for d in depths] if n == 0 else [],
        )
    axes[0][0].set_ylabel("key depth")
    fig.colorbar(im, ax=axes[0].tolist(), label="accuracy")
    return fig


def plots(out: Path, ppl: list[dict], passkey: list[dict], adaptations: list[str]) -> None:
    """``ppl_vs_length.png``, ``ppl_by_position.png`` (with perplexity rows) and ``passkey.png`` (with passkey rows)
    under ``out``."""
    save_figure(length_figure(ppl, adaptations), out / "ppl_vs_length.png")
    if ppl:
        save_figure(position_figure(ppl, adaptations), out / "ppl_by_position.png")
    if passkey:
        save_figure(passkey_figure(passkey, adaptations), out / "passkey.png")


def write_report(out: Path, records: list[PretrainedRecord], adaptations: list[str], header: str) -> str:
    """Write all report files under ``out``, one table row per adaptation label in ``adaptations`` (their order);
    returns the markdown."""
    ppl, pk = ppl_rows(records), passkey_rows(records)
    md = markdown(ppl, pk, adaptations, header)
    atomic_write_bytes(out / "results.md", md.encode())
    for name, rows, fields in (("ppl.csv", ppl, PPL_FIELDS), ("passkey.csv", pk, PASSKEY_FIELDS)):
        write_csv_table(out / name, fields, ([r.get(f) for f in fields] for r in rows))
    plots(out, ppl, pk, adaptations)
    return md


def plot_loss(out: Path, log: list[dict], label: str) -> None:
    """``out/loss.png``: a fine-tuning run's training loss (nats per token) against the step, from its log lines
    (``{"step", "loss"}``)."""
    fig, ax = figure(figsize=(6, 3.5))
    ax.plot([r["step"] for r in log], [r["loss"] for r in log], lw=1)
    ax.set(xlabel="step", ylabel="training loss (nats/token)", title=label)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, out / "loss.png")
