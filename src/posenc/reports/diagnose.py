"""The report of ``posenc diagnose``: tables (``diagnose.md``), the records file (``diagnose.jsonl``) and the plots
of a ``diagnose_model`` result.

The measurement is ``posenc.eval.diagnose``; this module only formats its record (``posenc.store.records.Diagnosis``):
far mass (with the Sec. 4 lower bound) and entropy per layer.head and length against uniform attention, and
the spectral gaps of the step angles per layer.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from posenc.reports.render import figure, log_scale, markdown_table, save_figure
from posenc.store.checkpoint import atomic_write_bytes
from posenc.store.records import Diagnosis, write


def _fmt(x, spec=".3f") -> str:
    return "n/a" if x is None else format(x, spec)


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
        cells = [
            [f"{layer}.{h}", *(_fmt(getattr(r, key)[layer][h]) if getattr(r, key) else "n/a" for r in rows)]
            for layer in range(n_layer)
            for h in range(n_head)
        ]
        cells += [["uniform", *(_fmt(getattr(r, ref)) for r in rows)]] if ref else []
        lines += [f"## {title}", "", markdown_table(head, cells), ""]
    if res.spectral_gap:
        lines += [
            "## Spectral gap of the step angles",
            "",
            f"beta_b = |mean exp(i theta)| per head and frequency block over held-out tokens; baseline: the "
            f"scheme's step law (|sin a_b / a_b|; RoPE 1); w_eps = ceil(log eps / log beta), eps = {res.eps:g}.",
            "",
            "Blocks that do not mix within the training length keep a near-constant step; their mean step "
            "arg mean exp(i theta) says whether they still rotate (RoPE-like, unseen phases at longer lengths) "
            "or stand still (NoPE-like).",
            "",
        ]
        head = [
            "layer",
            "beta min / median / max",
            "baseline min / median / max",
            "max abs(beta - baseline)",
            "w_eps median",
            "blocks with w_eps <= train length",
            "others: median abs(mean step) (rad/token)",
        ]
        cells = []
        for g in res.spectral_gap:
            beta = np.asarray(g.beta)
            base = np.asarray(g.baseline) if g.baseline is not None else None
            w_eps = np.array([np.inf if x is None else x for row in g.w_eps for x in row], dtype=float)
            rng = lambda x: f"{x.min():.4f} / {np.median(x):.4f} / {x.max():.4f}"  # noqa: E731
            slow = np.abs(np.asarray(g.mean_step)).ravel()[w_eps > res.train_length]
            cells.append(
                [
                    g.layer,
                    rng(beta),
                    rng(base) if base is not None else "n/a",
                    _fmt(np.abs(beta - base).max() if base is not None else None, ".4f"),
                    f"{np.median(w_eps):g}",
                    f"{int((w_eps <= res.train_length).sum())}/{w_eps.size}",
                    _fmt(np.median(slow) if slow.size else None, ".2e"),
                ]
            )
        lines += [markdown_table(head, cells), ""]
    return "\n".join(lines)


def plot_vs_length(path: Path, res: Diagnosis, key: str, ref: str, ylabel: str, dotted: str | None = None) -> None:
    """One subplot per layer, one line per head (``dotted``: a second quantity per head, dotted),
    the uniform reference dashed; x = length / train length. key, ref, dotted: ``LengthDiagnosis`` fields."""
    rows = [r for r in res.lengths if getattr(r, key)]
    n_layer = len(getattr(rows[0], key)) if rows else 1
    fig, axes = figure(1, n_layer, figsize=(3.2 * n_layer, 3.2), squeeze=False, sharey=True)
    xs = [r.multiple for r in rows]
    for layer, ax in enumerate(axes[0]):
        for h in range(len(getattr(rows[0], key)[layer]) if rows else 0):
            (line,) = ax.plot(xs, [getattr(r, key)[layer][h] for r in rows], marker=".", label=f"head {h}")
            if dotted:
                ax.plot(xs, [getattr(r, dotted)[layer][h] for r in rows], ls=":", color=line.get_color())
        ax.plot(xs, [getattr(r, ref) for r in rows], color="gray", ls="--", label="uniform")
        log_scale(ax, "x", base=2)
        ax.set_title(f"layer {layer}")
        ax.set_xlabel("eval length / train length")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{res.scheme}: {ylabel}")
    fig.tight_layout()
    save_figure(fig, path)


def plot_spectral_gap(path: Path, res: Diagnosis) -> None:
    """beta per frequency block: mean over heads (band: min..max) per layer; the baseline dashed."""
    fig, ax = figure(figsize=(6.5, 4))
    for g in res.spectral_gap:
        beta = np.asarray(g.beta)
        b = np.arange(beta.shape[1])
        ax.plot(b, beta.mean(0), marker=".", label=f"layer {g.layer}")
        ax.fill_between(b, beta.min(0), beta.max(0), alpha=0.2)
    base = res.spectral_gap[0].baseline
    if base is not None:
        ax.plot(np.arange(len(base)), base, color="k", ls="--", label="step-law baseline")
    ax.set_xlabel("frequency block b")
    ax.set_ylabel("beta_b = |mean exp(i theta)|")
    ax.set_title(f"{res.scheme}: spectral gap of the step angles")
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path)


def write_outputs(res: Diagnosis, out: Path) -> list[Path]:
    """Write diagnose.md, diagnose.jsonl (the record, through ``posenc.store.records.write``) and the plots into
    ``out``;
    returns the paths written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
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
