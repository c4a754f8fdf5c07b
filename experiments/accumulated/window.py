"""The paper's mixing window (arXiv 2606.24975, Sec. 3, Theorem 1) in posenc's reports: the study's quantity.

w_eps = ceil(log eps / log beta) of a random step law with spectral gap beta (``posenc.encodings.mixing.window_size``
over the scheme's ``spectral_gap``): routes longer than it are decorrelated to eps. The study registers it with its
claims (``experiments.accumulated.claims``): the ``w_0.01`` column and dash-dot line of each task report's distance
table and plot (:data:`WINDOW`), read by claims R2 and R3, and the text report's "Mixing window vs extrapolation"
section with ``window.png`` (:func:`window_section`, :func:`window_figures`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from posenc.encodings.accumulated import Accumulated
from posenc.encodings.mixing import window_size
from posenc.model import ModelConfig
from posenc.reports.claims import Quantity
from posenc.reports.render import PPL, RATIO, figure, log_scale, markdown_table, save_figure, seed_cell
from posenc.store.records import Ppl

LABEL = "w_0.01"


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
