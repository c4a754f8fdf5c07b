"""The paper's mixing window (arXiv 2606.24975, Sec. 3, Theorem 1) in posenc's reports: the study's quantity.

For i.i.d. steps with spectral gap ||E[M]||_op <= beta < 1, routes longer than w_eps = ceil(log eps / log beta)
(:func:`window_size`) are decorrelated to eps. The study registers it with its claims
(``experiments.accumulated.claims``): the ``w_0.01`` column and dash-dot line of each task report's distance table and
plot (:data:`WINDOW`, over the scheme's ``spectral_gap``), read by claims R2 and R3; the text report's "Mixing window
vs extrapolation" section with ``window.png`` (:func:`window_section`, :func:`window_figures`); and the w_eps columns
of ``posenc diagnose``'s spectral-gap table, from the measured gaps of a trained model (:data:`GAP_COLUMNS`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from posenc.encodings.accumulated import Accumulated
from posenc.errors import PosencError
from posenc.model import ModelConfig
from posenc.reports.claims import GapColumns, Quantity
from posenc.reports.render import PPL, RATIO, figure, log_scale, markdown_table, number, save_figure, seed_cell
from posenc.store.records import Diagnosis, LayerGap, Ppl

LABEL = "w_0.01"
EPS = 0.01  # the tolerance of every window the study reports (its label says so)


def check_eps(eps: float) -> None:
    """Mixing tolerance must lie in (0, 1); PosencError otherwise."""
    if not 0.0 < eps < 1.0:
        raise PosencError(f"eps must be in (0, 1), got {eps}")


def window_size(beta: float, eps: float) -> float:
    """w_eps = ceil(log eps / log beta), the first n with beta^n <= eps (arXiv 2606.24975, Sec. 3, Theorem 1).

    beta = 0 gives 1 (one step mixes, e.g. Haar); beta >= 1 gives ``math.inf``
    (no window: deterministic steps such as RoPE never decorrelate). PosencError
    for beta < 0 or eps outside (0, 1).
    """
    check_eps(eps)
    if beta < 0:
        raise PosencError(f"spectral gap beta must be >= 0, got {beta}")
    if beta == 0:
        return 1
    if beta >= 1:
        return math.inf
    # shave a few ulps so that beta^n == eps exactly gives n, not n + 1
    return max(1, math.ceil(math.log(eps) / math.log(beta) * (1 - 1e-12)))


def mixing_window(model: ModelConfig, eps: float = 0.01) -> float | None:
    """The slowest mixing window w_eps (tokens) over the model's layers: each layer whose scheme (or, in a
    composite, whose rotary part) accumulates random or per-token steps, the slowest frequency block's window (inf
    when a block never mixes); None when no layer has such a step law (learned steps: their law is known after
    training, ``posenc diagnose``). PosencError (one line) for an invalid encoding or ``eps`` outside (0, 1)."""
    windows = []
    for enc in model.layer_schemes():
        rotary = getattr(enc, "rotary_part", enc)
        if isinstance(rotary, Accumulated) and rotary.mode != "learned":
            windows.append(max(window_size(float(b), eps) for b in rotary.spectral_gap()))
    return max(windows, default=None)


WINDOW = Quantity(LABEL, "mixing window w_0.01", mixing_window)


def _grid(records: list[Ppl], key: str) -> dict:
    """scheme -> evaluation length -> [values of the field ``key`` over seeds]."""
    grid: dict = defaultdict(lambda: defaultdict(list))
    for r in records:
        grid[r.scheme][r.eval_length].append(getattr(r, key))
    return grid


def window_rows(records: list[Ppl], windows: dict[str, float], L0: int) -> list[dict]:
    """Schemes with a known mixing window (random step laws), by window: w_0.01, ppl at 1x, ratios at 32x and the
    longest length.

    Empty unless at least three schemes have distinct windows (a sweep, e.g. the ``window`` preset).
    """
    known = {s: w for s, w in windows.items() if w is not None}
    if len(set(known.values())) < 3:
        return []
    ppl, ratio = _grid(records, "ppl"), _grid(records, "ratio")
    longest = max(r.eval_length for r in records)
    rows = []
    for s, w in sorted(known.items(), key=lambda kv: kv[1]):
        rows.append(
            {
                "scheme": s,
                "w": w,
                "w_ratio": w / L0,
                "ppl1": ppl[s].get(L0, []),
                "r32": ratio[s].get(32 * L0, []),
                "rmax": ratio[s].get(longest, []),
                "longest": longest,
            }
        )
    return rows


def window_markdown(records: list[Ppl], windows: dict[str, float], L0: int) -> str:
    """The mixing-window section: extrapolation against w_0.01 / training length, beside the theory's prediction."""
    rows = window_rows(records, windows, L0)
    if not rows:
        return ""
    Lx = f"{rows[0]['longest'] // L0}x"
    out = (
        "\n## Mixing window vs extrapolation\n\n"
        "w_0.01 = ceil(log 0.01 / log beta) of the step law (beta = |sin a / a| for U[-a, a] steps), the distance "
        "beyond which routes are decorrelated to 1% (arXiv 2606.24975, Theorem 1; `posenc theory`, check 1). The "
        "theory predicts that extrapolation holds while the window fits inside the training length (w_0.01 / L <= 1): "
        "every route longer than the window looks alike, and training saw such routes. `window.png` plots these "
        "rows.\n\n"
    )
    head = ["scheme", "w_0.01 (tokens)", "w_0.01 / L", "predicted", "ppl at 1x", "ratio at 32x", f"ratio at {Lx}"]
    cells = [
        [
            r["scheme"],
            f"{r['w']:g}",
            f"{r['w_ratio']:.3g}",
            "extrapolates" if r["w_ratio"] <= 1 else "degrades",
            seed_cell(r["ppl1"], PPL),
            seed_cell(r["r32"], RATIO),
            seed_cell(r["rmax"], RATIO),
        ]
        for r in rows
    ]
    return out + markdown_table(head, cells) + "\n"


def plot_window(path: Path, rows: list[dict], train_length: int) -> None:
    """Ratio at 32x and the longest length, and the 1x perplexity, against w_0.01 / training length (log x)."""
    fig, (ax, bx) = figure(1, 2, figsize=(11, 4.2))
    x = [r["w_ratio"] for r in rows]
    for key, label in (("r32", "ratio at 32x"), ("rmax", f"ratio at {rows[0]['longest'] // train_length}x")):
        pts = [(xi, np.mean(r[key])) for xi, r in zip(x, rows) if r[key]]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    pts = [(xi, np.mean(r["ppl1"])) for xi, r in zip(x, rows) if r["ppl1"]]
    bx.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color="C2")
    for a in (ax, bx):
        a.axvline(1.0, color="gray", ls="--", lw=1, label="theory: extrapolates left of w_0.01 = L")
        log_scale(a, "x")
        a.set_xlabel("mixing window w_0.01 / training length")
        a.grid(True, which="both", alpha=0.3)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_ylabel("perplexity / perplexity at training length")
    ax.legend(fontsize=8)
    bx.set_ylabel("perplexity at the training length")
    fig.suptitle("Accumulated random rotations: step half-width a sets the mixing window")
    fig.tight_layout()
    save_figure(fig, path)


def window_section(records: list[Ppl], meta: dict, L0: int) -> str:
    """The text report's section (``ClaimSet.text_section``): :func:`window_markdown` of the report's windows."""
    return window_markdown(records, (meta.get("quantities") or {}).get(LABEL) or {}, L0)


def window_figures(records: list[Ppl], meta: dict, L0: int) -> dict[str, Callable[[Path], None]]:
    """``window.png`` (:func:`plot_window`) when the section has rows (``ClaimSet.text_figures``), else nothing."""
    rows = window_rows(records, (meta.get("quantities") or {}).get(LABEL) or {}, L0)
    return {"window.png": lambda path: plot_window(path, rows, L0)} if rows else {}


def layer_windows(gap: LayerGap, eps: float = EPS) -> np.ndarray:
    """w_eps (tokens) of each head and frequency block of a diagnosed layer, flattened (H * D/2,) float64; inf
    where beta = 1 (the block never mixes)."""
    return np.array([window_size(float(b), eps) for row in gap.beta for b in row], dtype=float)


def _slow_drift(gap: LayerGap, res: Diagnosis) -> str:
    """Median abs(mean step) (rad/token) over the blocks that do not mix within the training length."""
    slow = np.abs(np.asarray(gap.mean_step)).ravel()[layer_windows(gap) > res.train_length]
    return number(np.median(slow) if slow.size else None, ".2e")


GAP_COLUMNS = GapColumns(
    clause=f"w_eps = ceil(log eps / log beta), eps = {EPS:g}",
    paragraph="Blocks that do not mix within the training length keep a near-constant step; their mean step "
    "arg mean exp(i theta) says whether they still rotate (RoPE-like, unseen phases at longer lengths) "
    "or stand still (NoPE-like).",
    columns=(
        ("w_eps median", lambda g, res: f"{np.median(layer_windows(g)):g}"),
        (
            "blocks with w_eps <= train length",
            lambda g, res: f"{int((layer_windows(g) <= res.train_length).sum())}/{layer_windows(g).size}",
        ),
        ("others: median abs(mean step) (rad/token)", _slow_drift),
    ),
)
