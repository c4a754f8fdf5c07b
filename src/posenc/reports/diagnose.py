"""The report of ``posenc diagnose``: tables (``diagnose.md``), the records file (``diagnose.jsonl``) and the plots
of a ``diagnose_model`` result.

The measurement is ``posenc.eval.diagnose``; this module only formats its record (``posenc.store.records.Diagnosis``):
far mass (with the Sec. 4 lower bound) and entropy per layer.head and length against uniform attention, and
the spectral gaps of the step angles per layer, with the columns registered claim sets add
(``posenc.reports.claims.GapColumns``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from posenc.reports.claims import claim_sets
from posenc.reports.render import MISSING, figure, log_scale, markdown_table, number, plot_lines, save_figure
from posenc.store.checkpoint import atomic_write_bytes
from posenc.store.lock import open_run_dir
from posenc.store.records import Diagnosis, LengthDiagnosis, write


def _fmt(x, spec=".3f") -> str:
    return number(x, spec)


def _cell(r: LengthDiagnosis, key: str, at: list[int]) -> str:
    """Length ``r``'s cell of layer.head ``at`` (layer, head) in the table of ``key``: its note ("n/a: ...") when the
    model cannot run the length, else the value (n/a when there is none: no query has far keys)."""
    if r.note:
        return r.note
    values = getattr(r, key)
    return _fmt(values[at[0]][at[1]] if values else None)


def markdown(res: Diagnosis) -> str:
    """The diagnose tables: far mass and entropy per layer.head and length, spectral gaps per layer."""
    lines = [
        f"# posenc diagnose: {res.scheme}",
        "",
        f"- scheme: {res.describe}",
        f"- training length {res.train_length}; far keys: distance >= w = {res.w}; "
        f"{res.windows_per_length} held-out window(s) per length",
        "",
    ]
    if res.note:
        return "\n".join(lines + [f"**{res.note}**", ""])
    rows = res.lengths
    head = ["layer.head", *(f"{r.length} ({r.multiple:g}x)" for r in rows)]
    n_layer = max((len(r.entropy or []) for r in rows), default=0)
    n_head = max((len(r.entropy[0]) for r in rows if r.entropy), default=0)
    # a length the model cannot run (a learned table shorter than it) shows its note in each cell, as posenc eval
    # does; with no length run there are no layer.head rows to show it in: one row for them all
    heads = [(f"{layer}.{h}", layer, h) for layer in range(n_layer) for h in range(n_head)] or [("every layer.head",)]
    for title, key, ref in (
        (
            "Far attention mass (keys at distance >= w; mean over queries that have such keys)",
            "far_mass",
            "uniform_far_mass",
        ),
        (
            "Far-mass lower bound M / (M + K e^r) (Sec. 4; M far, K = w near keys, r = the query's logit range), "
            "mean over the same queries",
            "far_mass_bound",
            None,
        ),
        ("Attention entropy (nats; mean over queries)", "entropy", "uniform_entropy"),
    ):
        cells = [[label, *(_cell(r, key, at) for r in rows)] for label, *at in heads]
        cells += [["uniform", *(r.note or _fmt(getattr(r, ref)) for r in rows)]] if ref else []
        lines += [f"## {title}", "", markdown_table(head, cells), ""]
    if res.spectral_gap:
        lines += _spectral_gap_section(res)
    return "\n".join(lines)


def _spectral_gap_section(res: Diagnosis) -> list[str]:
    """The spectral-gap table, per layer, with each registered claim set's ``gap_columns`` after the library's."""
    extras = [cs.gap_columns for cs in claim_sets() if cs.gap_columns]
    first = (
        "beta_b = |mean exp(i theta)| per head and frequency block over held-out tokens; baseline: the "
        "scheme's step law (|sin a_b / a_b|; RoPE 1)"
    )
    lines = ["## Spectral gap of the step angles", "", "; ".join([first, *(e.clause for e in extras)]) + ".", ""]
    lines += [line for e in extras for line in (e.paragraph, "")]
    head = ["layer", "beta min / median / max", "baseline min / median / max", "max abs(beta - baseline)"]
    head += [h for e in extras for h, _ in e.columns]
    cells = []
    for g in res.spectral_gap or []:
        beta = np.asarray(g.beta)
        base = np.asarray(g.baseline) if g.baseline is not None else None
        rng = lambda x: f"{x.min():.4f} / {np.median(x):.4f} / {x.max():.4f}"  # noqa: E731
        row = [g.layer, rng(beta), rng(base) if base is not None else MISSING]
        row.append(_fmt(np.abs(beta - base).max() if base is not None else None, ".4f"))
        cells.append(row + [cell(g, res) for e in extras for _, cell in e.columns])
    return lines + [markdown_table(head, cells), ""]


def vs_length_figure(res: Diagnosis, key: str, ref: str, ylabel: str, dotted: str | None = None):
    """The figure of ``far_mass.png`` / ``entropy.png``: one panel per layer, each with its legend: one line per head
    (``dotted``: a second quantity per head, dotted in its colour), then the uniform reference dashed grey, drawn by
    ``posenc.reports.render.plot_lines`` so a head on the uniform line or on another head stays visible and says so;
    x = length / train length (log). key, ref, dotted: ``LengthDiagnosis`` fields."""
    rows = [r for r in res.lengths if getattr(r, key)]
    n_layer = len(getattr(rows[0], key)) if rows else 1
    fig, axes = figure(1, n_layer, figsize=(3.2 * n_layer, 3.4), squeeze=False, sharey=True)
    xs = [r.multiple for r in rows]
    for layer, ax in enumerate(axes[0]):
        heads = range(len(getattr(rows[0], key)[layer]) if rows else 0)
        lines = [
            {"label": f"head {h}", "x": xs, "y": [getattr(r, key)[layer][h] for r in rows], "color": f"C{h % 10}"}
            for h in heads
        ]
        # last, so a head on it keeps its markers under the grey dashes and the legend says "uniform (same as head h)"
        uniform = [getattr(r, ref) for r in rows]
        lines.append({"label": "uniform", "x": xs, "y": uniform, "color": "gray", "ls": "--", "marker": ""})
        plot_lines(ax, lines, ms=3)
        for h in heads if dotted else ():
            ax.plot(xs, [getattr(r, dotted)[layer][h] for r in rows], ls=":", color=f"C{h % 10}")
        log_scale(ax, "x", base=2)
        ax.set_title(f"layer {layer}")
        ax.set_xlabel("eval length / train length")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    axes[0][0].set_ylabel(ylabel)
    fig.suptitle(f"{res.scheme}: {ylabel}")
    fig.tight_layout()
    return fig


def plot_vs_length(path: Path, res: Diagnosis, key: str, ref: str, ylabel: str, dotted: str | None = None) -> None:
    """``path``: :func:`vs_length_figure` as PNG."""
    save_figure(vs_length_figure(res, key, ref, ylabel, dotted), path)


def spectral_gap_figure(res: Diagnosis):
    """The figure of ``spectral_gap.png``: beta per frequency block, the mean over heads per layer (band: min..max
    over heads, in the layer's colour), then the step-law baseline dashed black; drawn by
    ``posenc.reports.render.plot_lines``, so a layer equal to another (or to the baseline) stays visible and says
    so."""
    fig, ax = figure(figsize=(6.5, 4))
    lines = []
    for i, g in enumerate(res.spectral_gap or []):
        beta = np.asarray(g.beta)
        b = np.arange(beta.shape[1])
        lines.append({"label": f"layer {g.layer}", "x": b, "y": beta.mean(0), "color": f"C{i % 10}", "ms": 4})
        ax.fill_between(b, beta.min(0), beta.max(0), alpha=0.2, color=f"C{i % 10}")
    base = res.spectral_gap[0].baseline if res.spectral_gap else None
    if base is not None:
        baseline = {"label": "step-law baseline", "x": np.arange(len(base)), "y": base, "color": "k", "ls": "--"}
        lines.append({**baseline, "marker": ""})
    plot_lines(ax, lines)
    ax.set_xlabel("frequency block b")
    ax.set_ylabel("beta_b = |mean exp(i theta)|")
    ax.set_title(f"{res.scheme}: spectral gap of the step angles")
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def plot_spectral_gap(path: Path, res: Diagnosis) -> None:
    """``path``: :func:`spectral_gap_figure` as PNG."""
    save_figure(spectral_gap_figure(res), path)


def write_outputs(res: Diagnosis, out: Path) -> list[Path]:
    """Write diagnose.md, diagnose.jsonl (the record, through ``posenc.store.records.write``) and the plots into
    ``out``;
    returns the paths written."""
    out = Path(out)
    open_run_dir(out)  # held while it writes (posenc.store.lock)
    paths = [out / "diagnose.md", out / "diagnose.jsonl"]
    atomic_write_bytes(paths[0], markdown(res).encode())
    write(paths[1], [res])
    if res.note:
        return paths
    if any(r.far_mass for r in res.lengths):
        plot_vs_length(
            out / "far_mass.png",
            res,
            "far_mass",
            "uniform_far_mass",
            "far attention mass (dotted: lower bound)",
            "far_mass_bound",
        )
        paths.append(out / "far_mass.png")
    if any(r.entropy for r in res.lengths):
        plot_vs_length(out / "entropy.png", res, "entropy", "uniform_entropy", "attention entropy (nats)")
        paths.append(out / "entropy.png")
    if res.spectral_gap:
        plot_spectral_gap(out / "spectral_gap.png", res)
        paths.append(out / "spectral_gap.png")
    return paths
