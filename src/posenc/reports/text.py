"""Tables and plots of a ``compare`` run: markdown, CSV and PNG.

Reads ``results.jsonl`` (one record per finished evaluation) and writes
``report.md``, ``results.csv`` and ``ppl_ratio.png`` (perplexity ratio to the
training-length perplexity against evaluation length, log axis) into the run
directory; with passkey and far-mass records (``posenc.eval.passkey``,
``posenc.eval.diagnose``) also their sections, ``passkey.png`` (accuracy heat map per
scheme) and ``far_mass.png``. With several seeds a cell shows the mean and the
half-range.
"""

from __future__ import annotations

import io
from collections import defaultdict
from pathlib import Path

import numpy as np

from posenc.reports.claims import text_claims_markdown, text_figures, text_sections_markdown
from posenc.reports.render import (
    PPL,
    RATIO,
    figure,
    legend,
    log_scale,
    markdown_table,
    number,
    plot_lines,
    save_figure,
    seed_cell,
    write_csv_table,
)
from posenc.store.checkpoint import atomic_write_bytes
from posenc.store.records import FarMass, PasskeyCell, Ppl, load

CSV_FIELDS = [
    "scheme",
    "seed",
    "train_length",
    "eval_length",
    "windows",
    "scored_tokens",
    "nll",
    "ppl",
    "ratio",
    "note",
]


def with_ratios(records: list[Ppl]) -> list[Ppl]:
    """Copies with ``ratio`` = ppl / ppl at the training length (same scheme and seed)."""
    base = {(r.scheme, r.seed): r.ppl for r in records if r.eval_length == r.train_length and r.ppl}
    out = []
    for r in records:
        b = base.get((r.scheme, r.seed))
        out.append(r.model_copy(update={"ratio": r.ppl / b if (b and r.ppl) else None}))
    return out


def _grid(records, key: str, at: str = "eval_length"):
    """scheme -> length (the field ``at``) -> [values of the field ``key`` over seeds]."""
    grid = defaultdict(lambda: defaultdict(list))
    for r in records:
        grid[r.scheme][getattr(r, at)].append(getattr(r, key))
    return grid


def passkey_grid(records: list) -> dict:
    """scheme -> (length, depth) -> [correct, trials], summed over seeds; cells without trials (n/a) dropped."""
    grid = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for r in records:
        if isinstance(r, PasskeyCell) and r.trials:
            cell = grid[r.scheme][(r.length, r.depth)]
            cell[0] += r.correct
            cell[1] += r.trials
    return grid


def _passkey_at(cells: dict, L: int) -> str:
    """Accuracy over all depths at length L, with the trial count."""
    c = [v for (length, _), v in cells.items() if length == L]
    n = sum(t for _, t in c)
    return f"{sum(k for k, _ in c) / n:.2f} (n={n})" if n else "n/a"


def passkey_markdown(records: list, L0: int) -> str:
    """The passkey section: accuracy per scheme and length (all depths pooled)."""
    grid = passkey_grid(records)
    if not grid:
        return ""
    lengths = sorted({L for cells in grid.values() for L, _ in cells})
    first = next(r for r in records if isinstance(r, PasskeyCell))
    what = (
        f"whose true key has the highest log-probability among {first.candidates} candidates; "
        f"chance {1 / first.candidates:.2f}"
        if first.mode == "rank"
        else "whose key greedy decoding reproduces exactly"
    )
    out = (
        f"\n## Passkey retrieval\n\nAccuracy (fraction of trials {what}) per input length, pooled over depths; "
        "`passkey.png` shows each depth.\n\n"
    )
    rows = [[s, *(_passkey_at(cells, L) for L in lengths)] for s, cells in grid.items()]
    return out + markdown_table(["scheme", *(f"{L} ({L / L0:g}x)" for L in lengths)], rows) + "\n"


def far_mass_markdown(records: list, L0: int) -> str:
    """The far-mass section: mean attention mass on keys beyond the training length per scheme and length."""
    recs = [r for r in records if isinstance(r, FarMass)]
    if not recs:
        return ""
    lengths = sorted({r.length for r in recs})
    w = next((r.w for r in recs if r.w is not None), L0)  # "not supported" records carry no w
    grid = _grid(recs, "far_mass_mean", at="length")
    uniform = {
        r.length: r.uniform_far_mass for r in recs if r.uniform_far_mass is not None
    }  # "not supported" records carry none
    out = (
        f"\n## Far attention mass\n\nMean softmax mass on keys at distance >= {w} (the training length), over "
        "layers, heads and the queries that have such keys (`posenc diagnose` gives each layer and head; "
        "`far_mass.png`). Uniform attention is the reference; a distance bias keeps it near 0.\n\n"
    )
    rows = [[s, *(seed_cell(row[L], ".3f") for L in lengths)] for s, row in grid.items()]
    rows.append(["uniform", *(seed_cell([uniform.get(L)], ".3f") for L in lengths)])
    out += markdown_table(["scheme", *(f"{L} ({L / L0:g}x)" for L in lengths)], rows) + "\n"
    notes = {(f"{r.scheme} at {r.length}: " if r.note.startswith("n/a") else "") + r.note for r in recs if r.note}
    return out + "".join(f"\n- {n}\n" for n in sorted(notes))  # an n/a cell's reason, by scheme and length


def markdown(records: list[Ppl], failures: dict[str, str], meta: dict, extras: list[PasskeyCell | FarMass] = ()) -> str:
    """The report; ``records``: ppl records with ``ratio``; ``extras``: passkey and far-mass records (a passkey
    column and their sections)."""
    lengths = sorted({r.eval_length for r in records})
    seen = list(dict.fromkeys(r.scheme for r in records))  # parallel jobs append in finishing order
    schemes = [s for s in meta.get("descriptions", {}) if s in seen] + [
        s for s in seen if s not in meta.get("descriptions", {})
    ]
    L0 = meta.get("train_length")
    meta = {**meta, "seeds": sorted({r.seed for r in records}) or meta.get("seeds")}  # the records' (reruns add seeds)
    out = io.StringIO()
    out.write(f"# posenc compare: {meta.get('name', '')}\n\n")
    for k in ("corpus", "tokenizer", "model", "budget", "seeds", "eval", "run", "wall", "trained", "notes"):
        if meta.get(k) is not None:
            out.write(f"- **{ {'wall': 'wall time', 'trained': 'models'}.get(k, k) }**: {meta[k]}\n")
    if meta.get("sweep"):  # posenc.jobs.sweep.sweep_markdown: each scheme's chosen setting and the sensitivity table
        out.write("\n" + "\n".join(meta["sweep"]))
    pk = passkey_grid(extras)
    pk_L = max((L for cells in pk.values() for L, _ in cells), default=None)
    for title, key, fmt in (("Perplexity ratio to the training length", "ratio", RATIO), ("Perplexity", "ppl", PPL)):
        grid = _grid(records, key)
        pk_col = key == "ratio" and pk_L is not None  # passkey accuracy at its longest length
        head = ["scheme", *(f"{L} ({L // L0}x)" if L0 else str(L) for L in lengths)] + [f"passkey @ {pk_L}"] * pk_col
        rows = [
            [s, *(seed_cell(grid[s][L], fmt) for L in lengths)] + [_passkey_at(pk.get(s, {}), pk_L)] * pk_col
            for s in schemes
        ]
        out.write(f"\n## {title}\n\n" + markdown_table(head, rows) + "\n")
    out.write(text_claims_markdown(records, L0))
    out.write(
        "\nFlat perplexity does not say whether a scheme still uses what lies beyond its training length: "
        "`posenc --import experiments/accumulated/claims.py compare --preset retrieval` (from the repository's root: "
        "a study's preset) measures that on tasks with a known distance to the evidence "
        "(flip-flop, associative recall; `results/retrieval/`).\n"
    )
    out.write(text_sections_markdown(records, meta, L0))
    out.write(passkey_markdown(extras, L0))
    out.write(far_mass_markdown(extras, L0))
    if meta.get("descriptions"):
        out.write("\n## Schemes\n\n")
        for s, d in meta["descriptions"].items():
            out.write(f"- `{s}`: {d}\n")
    if failures:
        out.write("\n## Failed\n\n")
        for s, err in failures.items():
            out.write(f"- `{s}`: {err}\n")
    far = any(isinstance(r, FarMass) and r.far_mass_mean is not None for r in extras)
    pngs = (
        ["ppl_ratio.png", "buckets.png"]
        + list(text_figures(records, meta, L0))
        + ["passkey.png"] * bool(pk)
        + ["far_mass.png"] * far
    )
    out.write(
        "\nFiles: `results.jsonl` (one record per evaluation), `results.csv`, "
        + ", ".join(f"`{f}`" for f in pngs)
        + ".\n"
    )
    return out.getvalue()


def write_csv(path: Path, records: list[Ppl]) -> None:
    """results.csv: one row of ``CSV_FIELDS`` per ppl record (``posenc.store.records.load_csv`` reads it back)."""
    write_csv_table(path, CSV_FIELDS, ([getattr(r, f) for f in CSV_FIELDS] for r in records))


def ratio_figure(records: list[Ppl], train_length: int):
    """The figure of ``ppl_ratio.png``: each scheme's ratio (mean over seeds) against evaluation length / training
    length, log-log; identical curves stay visible (``posenc.reports.render.plot_lines``)."""
    fig, ax = figure(figsize=(7, 4.5))
    lines = []
    for s, row in _grid(records, "ratio").items():
        pts = [
            (L / train_length, np.mean([v for v in row[L] if v is not None]))
            for L in sorted(row)
            if any(v is not None for v in row[L])
        ]
        if pts:
            lines.append({"label": s, "x": [p[0] for p in pts], "y": [p[1] for p in pts]})
    plot_lines(ax, lines)
    log_scale(ax, "x", base=2)
    log_scale(ax, "y")
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.set_xlabel("evaluation length / training length")
    ax.set_ylabel("perplexity / perplexity at training length")
    ax.set_title(f"Length extrapolation (train length {train_length})")
    legend(ax, len(lines), fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_ratio(path: Path, records: list[Ppl], train_length: int) -> None:
    """``path``: :func:`ratio_figure` as PNG."""
    save_figure(ratio_figure(records, train_length), path)


def buckets_figure(records: list[Ppl], train_length: int):
    """The figure of ``buckets.png``: per-position-bucket perplexity at each scheme's longest evaluated length, each
    point at its bucket's midpoint (position / training length, log axis) and the x ticks at those midpoints,
    labelled with the bucket's range ("2-4": positions from 2 to 4 training lengths)."""
    from matplotlib.ticker import NullLocator

    fig, ax = figure(figsize=(7, 4.5))
    longest = {}
    for r in records:
        if r.bucket_ppl and (r.scheme not in longest or r.eval_length >= longest[r.scheme].eval_length):
            longest[r.scheme] = r
    ticks = {}
    lines = []
    for s, r in longest.items():
        spans = [(a / train_length, b / train_length) for a, b in zip(r.bucket_edges[:-1], r.bucket_edges[1:])]
        ticks.update({(a + b) / 2: f"{a:g}-{b:g}" for a, b in spans})
        lines.append({"label": f"{s} (L={r.eval_length})", "x": [(a + b) / 2 for a, b in spans], "y": r.bucket_ppl})
    plot_lines(ax, lines)
    log_scale(ax, "x", base=2)
    log_scale(ax, "y")
    ax.set_xticks(sorted(ticks), [ticks[x] for x in sorted(ticks)])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("position bucket in the window (training lengths; points at the bucket's middle)")
    ax.set_ylabel("perplexity of the position bucket")
    ax.set_title("Where each scheme breaks")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_buckets(path: Path, records: list[Ppl], train_length: int) -> None:
    """``path``: :func:`buckets_figure` as PNG."""
    save_figure(buckets_figure(records, train_length), path)


def plot_passkey(path: Path, records: list, train_length: int) -> None:
    """Heat map per scheme: passkey accuracy by depth (rows) and input length (columns), seeds pooled."""
    grid = passkey_grid(records)
    lengths = sorted({L for cells in grid.values() for L, _ in cells})
    depths = sorted({d for cells in grid.values() for _, d in cells})
    fig, axes = figure(1, len(grid), figsize=(0.9 * len(lengths) + 1.6, 0.5 * len(depths) + 1.6), squeeze=False)
    fig.set_figwidth(fig.get_figwidth() * len(grid))
    for ax, (s, cells) in zip(axes[0], grid.items()):
        acc = np.full((len(depths), len(lengths)), np.nan)
        for (L, d), (c, n) in cells.items():
            acc[depths.index(d), lengths.index(L)] = c / n
        im = ax.imshow(acc, vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="lower")
        for (i, j), v in np.ndenumerate(acc):
            ax.text(
                j,
                i,
                number(v, ".2f"),  # a fraction correct
                ha="center",
                va="center",
                fontsize=7,
                color="w" if v < 0.6 else "k",
            )
        ax.set_xticks(range(len(lengths)), [f"{L / train_length:g}x" for L in lengths])
        ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths])
        ax.set_title(s, fontsize=9)
        ax.set_xlabel("input length / train length")
    axes[0][0].set_ylabel("key depth")
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="passkey accuracy")
    save_figure(fig, path)


def plot_far_mass(path: Path, records: list, train_length: int) -> None:
    """Far attention mass (mean over layers and heads) vs evaluation length per scheme; uniform dashed; identical
    curves stay visible (``posenc.reports.render.plot_lines``)."""
    recs = [r for r in records if isinstance(r, FarMass) and r.far_mass_mean is not None]
    fig, ax = figure(figsize=(7, 4.5))
    plot_lines(
        ax,
        [
            {"label": s, "x": [L / train_length for L in sorted(row)], "y": [np.mean(row[L]) for L in sorted(row)]}
            for s, row in _grid(recs, "far_mass_mean", at="length").items()
        ],
    )
    uniform = sorted({(r.length, r.uniform_far_mass) for r in recs})
    ax.plot(
        [L / train_length for L, _ in uniform],
        [u for _, u in uniform],
        color="gray",
        ls="--",
        label="uniform attention",
    )
    log_scale(ax, "x", base=2)
    ax.set_ylim(0, 1)
    ax.set_xlabel("evaluation length / training length")
    ax.set_ylabel("attention mass at distance >= training length")
    ax.set_title("Far attention mass (mean over layers and heads)")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path)


def write_report(run_dir: Path, meta: dict, failures: dict[str, str] | None = None) -> Path:
    """Write report.md, results.csv, ppl_ratio.png, buckets.png and the registered claim sets' figures
    (``posenc.reports.claims.ClaimSet.text_figures``); returns report.md's path."""
    run_dir = Path(run_dir)
    all_records = load(run_dir / "results.jsonl")
    records = with_ratios([r for r in all_records if isinstance(r, Ppl)])
    extras = [r for r in all_records if isinstance(r, (PasskeyCell, FarMass))]
    write_csv(run_dir / "results.csv", records)
    if records:
        plot_ratio(run_dir / "ppl_ratio.png", records, meta["train_length"])
        plot_buckets(run_dir / "buckets.png", records, meta["train_length"])
    for name, write in (text_figures(records, meta, meta["train_length"]) if records else {}).items():
        write(run_dir / name)
    if passkey_grid(extras):
        plot_passkey(run_dir / "passkey.png", extras, meta["train_length"])
    if any(isinstance(r, FarMass) and r.far_mass_mean is not None for r in extras):
        plot_far_mass(run_dir / "far_mass.png", extras, meta["train_length"])
    path = run_dir / "report.md"
    atomic_write_bytes(path, markdown(records, failures or {}, meta, extras).encode())
    return path
