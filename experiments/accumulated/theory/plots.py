"""PNG plots of the theory checks (``posenc.reports.render`` figures: Agg canvas, atomic writes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from posenc.reports.render import figure, log_scale, plot_lines, save_figure


def write_all(out: Path, results: dict) -> list[Path]:
    """Write every plot whose check ran; returns the paths written."""
    makers = {
        "mixing.png": (_mixing, results["mixing"]),
        "window_context.png": (_context, results.get("window_vs_context")),
        "score_gap.png": (_score_gap, results["score_gap"]),
        "far_mass.png": (_far_mass, results.get("far_mass")),
        "value_incoherence.png": (_value, results.get("value")),
        "decay.png": (_decay, results.get("decay")),
    }
    written = []
    for name, (draw, data) in makers.items():
        if data:
            written.append(save_figure(draw(data), out / name))
    return written


def _figure(width: float, height: float, nrows: int = 1, ncols: int = 1, **kwargs):
    """``posenc.reports.render.figure`` with fixed margins: tight_layout costs a full tick layout
    per axes, most of the plotting time."""
    fig, axes = figure(nrows, ncols, figsize=(width, height), **kwargs)
    fig.subplots_adjust(
        left=0.7 / width, right=0.98, bottom=0.5 / height, top=1 - 0.35 / height, wspace=0.25, hspace=0.35
    )
    return fig, axes


def _mixing(results: dict) -> Figure:
    fig, (ax, bx) = _figure(11, 4.2, 1, 2)
    for i, r in enumerate(results.values()):
        n = np.arange(len(r["norm_sim"]))
        color = f"C{i}"
        ax.plot(n, np.maximum(r["norm_pred"], 1e-6), color=color, lw=1)
        ax.plot(n, r["norm_sim"], ".", color=color, ms=3, label=f"{r['dist']} (beta={r['beta']:.3g})")
    log_scale(ax, "y")
    eps = next(iter(results.values()))["eps"]
    ax.axhline(eps, color="k", ls="--", lw=0.8, label=f"eps = {eps:g}")
    ax.axhline(
        max(r["tolerance"] for r in results.values()), color="gray", ls=":", lw=0.8, label="largest MC tolerance"
    )
    ax.set(
        xlabel="route length n",
        ylabel="||E[P_n]||_op",
        ylim=(1e-3, 1.5),
        title="Mixing: Monte Carlo (dots) vs beta^n (lines)",
    )
    ax.legend(fontsize=7)
    drift = next((r for r in results.values() if r["dist"].startswith("so2-drift")), None)
    if drift:
        n = np.arange(len(drift["norm_sim"]))
        betas = np.array(drift["blocks"]["beta"])
        blocks = range(0, len(betas), max(1, len(betas) // 4))
        # slow blocks all sit at 1: plot_lines keeps each visible (sparse markers) and says which repeats which
        label = "block {}: beta={:.4g}, w={}"
        lines = [
            {"label": label.format(b, betas[b], drift["blocks"]["window"][b]), "x": n, "y": betas[b] ** n}
            | {"color": f"C{i}", "markevery": 0.1}
            for i, b in enumerate(blocks)
        ]
        plot_lines(bx, lines, ms=4)
        bx.set(
            xlabel="route length n",
            ylabel="|E exp(i Phi_n,b)|",
            title=f"{drift['dist']}: slow blocks never mix (closed form)",
        )
        bx.legend(fontsize=7)
    else:
        bx.set_axis_off()
    return fig


def _context(r: dict) -> Figure:
    fig, ax = _figure(6, 4.2)
    for c in r["contexts"]:
        ax.plot(np.maximum(c["profile"], 1e-4), ".", ms=4, label=f"L = {c['length']}: w = {c['window_sim']}")
    n = np.arange(len(r["contexts"][0]["profile"]))
    ax.plot(n, r["beta"] ** n, "k-", lw=1, label=f"beta^n, w_eps = {r['window']}")
    log_scale(ax, "y")
    ax.axhline(r["eps"], color="k", ls="--", lw=0.8)
    ax.axvline(r["window"], color="gray", ls=":", lw=0.8)
    ax.set(
        xlabel="route length n (query = last token)",
        ylabel="|E exp(i Phi)|",
        ylim=(1e-3, 1.5),
        title=f"{r['dist']}: the window does not depend on context length",
    )
    ax.legend(fontsize=8)
    return fig


def _score_gap(results: dict) -> Figure:
    fig, axes = _figure(4 * len(results), 7.5, 2, len(results), squeeze=False)
    edges = np.linspace(-1, 1, 81)
    centers = (edges[1:] + edges[:-1]) / 2
    for col, r in enumerate(results.values()):
        ax, hx = axes[0, col], axes[1, col]
        for i, p in enumerate(r["per_dim"]):
            ax.plot(r["thresholds"], np.maximum(p["tail_sim"], 1e-5), "-", color=f"C{i}", label=f"d={p['d']}")
            ax.plot(r["thresholds"], p["tail_bound"], "--", color=f"C{i}")
        log_scale(ax, "y")
        ax.set(xlabel="t", ylim=(1e-4, 1.2))
        ax.set_title(f"{r['dist']}: far tail (solid), bound (dashed)", fontsize=9)
        ax.legend(fontsize=7)
        for p, style in ((r["per_dim"][0], ":"), (r["per_dim"][-1], "-")):
            for which, color in (("near", "C3"), ("far", "C0")):
                label = f"{which} n={p[f'n_{which}']}, d={p['d']}"
                hx.plot(centers, p[f"{which}_hist"], style, color=color, label=label)
        hx.set(xlabel="score q^T P_n k (q = k)")
        hx.set_title("near vs far routes", fontsize=9)
        hx.legend(fontsize=7)
    axes[0, 0].set_ylabel("P(|q^T P_n k| > t), far route")
    axes[1, 0].set_ylabel("count")
    return fig


def _far_mass(r: dict) -> Figure:
    fig, ax = _figure(6.5, 4.5)
    M = np.array(r["Ms"])
    labels = {"none": "no bias", "alibi": f"ALiBi m={r['alibi_slope']:g}", "forget_gate": "forget gate"}
    for i, (key, label) in enumerate(labels.items()):
        ax.plot(M, r["rho_mean"][key], "o-", color=f"C{i}", ms=3, label=f"{label}: mean rho_D")
        ax.fill_between(M, r["rho_min"][key], r["rho_max"][key], color=f"C{i}", alpha=0.15)
    ax.plot(M, r["lower_bound"], "k--", label="lower bound M/(M+K e^(2 lambda))")
    ax.plot(M, r["alibi_upper"], "--", color="C1", label="ALiBi upper bound")
    ax.plot(M, r["forget_gate_upper"], ":", color="C2", label="forget gate: bound on E rho_D")
    log_scale(ax, "x")
    ax.set(
        xlabel="far tokens M",
        ylabel="far mass rho_D",
        ylim=(0, 1.02),
        title=f"Far mass, K={r['K']} near, logits in [-{r['lambda']:g}, {r['lambda']:g}]",
    )
    ax.legend(fontsize=7)
    return fig


def _value(r: dict) -> Figure:
    fig, ax = _figure(6.5, 4.5)
    rows = r["per_M"]
    M = np.array([x["M"] for x in rows])
    series = {
        "identity transport ||Cov|| (coherent)": ("coherent", "C3", "o-"),
        "SO(2) transport ||Cov||_op": ("incoherent", "C0", "o-"),
        "SO(2) transport tr(Cov)/d": ("incoherent_trace", "C0", "s:"),
        "prediction E tr(Cov)/d": ("incoherent_pred", "k", "--"),
        "rho_D^2": ("rho_sq", "C3", ":"),
        "sum of squared weights": ("sum_sq_weights", "gray", ":"),
    }
    for label, (key, color, style) in series.items():
        ax.plot(M, [x[key] for x in rows], style, color=color, ms=3, label=label)
    log_scale(ax, "x")
    log_scale(ax, "y")
    ax.set(
        xlabel="far tokens M",
        ylabel="covariance norm",
        title="Far values with a shared background (sigma_g = sigma_n = 1)",
    )
    ax.legend(fontsize=7)
    return fig


def _decay(r: dict) -> Figure:
    fig, (ax, bx) = _figure(11, 4.2, 1, 2)
    dist, grid = np.array(r["dist"]), np.array(r["grid"])
    curves = [(i, name, s) for i, (name, s) in enumerate(r["schemes"].items()) if name != "alibi"]
    # through plot_lines: schemes with the same curve (sinusoidal and rope-10000) are drawn over each other, smaller,
    # and say so; sparse markers (markevery) tell a repeat's dashes from its first's line
    lines = [
        {"label": name, "x": dist[1:], "y": s["curve"][1:], "color": f"C{i}", "lw": 1, "markevery": 0.1}
        | ({"ls": ":"} if name == "pope-survey-sign" else {})
        for i, name, s in curves
    ]
    plot_lines(ax, lines, ms=3)
    for i, _, s in curves:
        if "mc_mean" in s:
            ax.plot(grid[1:], s["mc_mean"][1:], ".", color=f"C{i}", ms=4)
    log_scale(ax, "x")
    ax.axhline(0, color="k", lw=0.5)
    ax.set(
        xlabel="distance i - j",
        ylabel="E score / E score(0)",
        title=f"Long-range decay, q = k random, d={r['d']} (dots: Monte Carlo)",
    )
    ax.legend(fontsize=7)
    alibi = r["schemes"]["alibi"]
    bx.plot(dist, alibi["curve"], "-", lw=1)
    bx.plot(grid, alibi["mc_mean"], ".", ms=4)
    bx.set(xlabel="distance i - j", ylabel="E score / E score(0)", title="ALiBi: linear bias, no saturation")
    return fig
