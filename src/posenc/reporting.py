"""The one reporting toolkit: figures (matplotlib Agg, atomic PNG writes, readable log ticks, coinciding lines
kept visible), markdown tables and CSV tables, for compare's report, diagnose, extend's report, theory and the
benchmarks.

Figures are ``matplotlib.figure.Figure`` objects on an Agg canvas: no display and no
pyplot state, so nothing has to be closed and no backend is switched globally.
"""

from __future__ import annotations

import csv
import io
import math

import numpy as np
from pathlib import Path
from typing import Any, Iterable, Sequence

from posenc.checkpoint import atomic_write_bytes


def write_csv_table(path: Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """``path``: a CSV table (the ``header`` row, then each of ``rows``, a sequence in header order), written
    atomically; the one CSV writer of the reports (RFC 4180 line ends, as the committed tables have)."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    w.writerows(rows)
    atomic_write_bytes(Path(path), buf.getvalue().encode())


def seed_cell(values: list[float], fmt: str = ".3f") -> str:
    """A table cell over seeds: mean ± half-range ("n/a" without values, the value for one seed)."""
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    if len(values) == 1:
        return format(values[0], fmt)
    return f"{format(np.mean(values), fmt)} ± {format((max(values) - min(values)) / 2, fmt)}"


def figure(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float], layout: str | None = None, **kwargs):
    """A new Agg figure and its axes: ``(fig, axes)`` as ``Figure.subplots(nrows, ncols, **kwargs)``
    returns them (one Axes, or an array with ``squeeze=False``). figsize in inches."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout=layout)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, **kwargs)


def save_figure(fig, path: Path, dpi: int = 110) -> Path:
    """Render ``fig`` as PNG at ``dpi`` and write it atomically (temporary file, then rename); returns ``path``."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    atomic_write_bytes(Path(path), buf.getvalue())
    return Path(path)


def log_ticks(vmin: float, vmax: float, base: float = 10) -> np.ndarray:
    """Labelled tick positions of a log axis viewing [vmin, vmax]: the powers of ``base`` (with 2x and 5x for base 10
    over less than 3,000x), or, where fewer than three of those fall inside the view, a linear 1-2-2.5-5 ladder
    (about six ticks). Positions outside the view may be included (matplotlib clips them)."""
    from matplotlib.ticker import LogLocator, MaxNLocator

    vmin, vmax = sorted((vmin, vmax))
    if vmin <= 0:  # no data yet: matplotlib's own choice
        return LogLocator(base).tick_values(max(vmin, 1e-300), max(vmax, 1e-300))
    subs = (1.0, 2.0, 5.0) if base == 10 and vmax / vmin < 3e3 else (1.0,)
    ticks = LogLocator(base, subs=subs, numticks=12).tick_values(vmin, vmax)
    if np.count_nonzero((ticks >= vmin) & (ticks <= vmax)) >= 3:
        return ticks
    ladder = MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]).tick_values(vmin, vmax)
    return ladder[ladder > 0]


def log_scale(ax, which: str, base: float = 10) -> None:
    """Make ``ax``'s ``which`` ("x" or "y") axis logarithmic with at least three plain tick labels (2, not 2x10^0)
    at any range (:func:`log_ticks`, chosen at draw time from the view); the minor ticks are unlabelled."""
    from matplotlib.ticker import FuncFormatter, Locator, LogLocator, NullFormatter

    class Ticks(Locator):
        def __call__(self):
            return self.tick_values(*self.axis.get_view_interval())

        def tick_values(self, vmin, vmax):
            return log_ticks(vmin, vmax, base)

    getattr(ax, f"set_{which}scale")("log", base=base)
    axis = getattr(ax, f"{which}axis")
    axis.set_major_locator(Ticks())
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_locator(LogLocator(base, subs="auto"))
    axis.set_minor_formatter(NullFormatter())


def labelled_ticks(ax, which: str) -> list[tuple[float, str]]:
    """(position, label) of the ticks of ``ax``'s ``which`` axis that are drawn with a label inside its view, after
    rendering the figure: what a reader sees on the axis."""
    ax.figure.canvas.draw()
    axis = getattr(ax, f"{which}axis")
    lo, hi = sorted(axis.get_view_interval())
    ticks = axis.get_major_ticks() + axis.get_minor_ticks()
    return sorted((t.get_loc(), t.label1.get_text()) for t in ticks
                  if lo <= t.get_loc() <= hi and t.label1.get_visible() and t.label1.get_text())


# line styles and marker shapes of lines that repeat an earlier one, in order; each is drawn smaller and over it
REPEAT_STYLES = [("--", "s"), (":", "^"), ("-.", "D"), ((0, (5, 1, 1, 1)), "v"), ((0, (1, 3)), "P")]


def same_as(lines: Sequence[tuple[str, Sequence[float], Sequence[float]]], rtol: float = 1e-6) -> dict[str, str]:
    """{label: the label of the first earlier line it repeats} over ``lines`` of (label, x, y): equal x, and y equal
    within ``rtol`` (relative) at every point. Lines that repeat none are not in the result."""
    out: dict[str, str] = {}
    for i, (label, x, y) in enumerate(lines):
        for first, fx, fy in lines[:i]:
            if first not in out and len(fx) == len(x) and np.array_equal(fx, x) and np.allclose(fy, y, rtol=rtol, atol=0):
                out[label] = first
                break
    return out


def plot_lines(ax, lines: Sequence[dict], ms: float = 5) -> list:
    """Draw ``lines`` on ``ax`` so that identical ones stay visible; returns the Line2D objects. Each line is a dict
    with "label", "x", "y" and any ``Axes.plot`` keywords (colour, ls, marker, ...; marker "o" and ls "-" when not
    given). A line that repeats an earlier one (:func:`same_as`) is labelled "LABEL (same as FIRST)", drawn over it
    with its marker size (``ms`` unless given) x 0.7^k (the k-th repeat) and, unless its own are given, the k-th line style and
    marker shape of ``REPEAT_STYLES``."""
    repeats = same_as([(ln["label"], list(ln["x"]), list(ln["y"])) for ln in lines])
    k: dict[str, int] = {}
    drawn = []
    for z, ln in enumerate(lines):
        kw = {key: v for key, v in ln.items() if key not in ("label", "x", "y")}
        label, size = ln["label"], kw.pop("ms", ms)
        first = repeats.get(label)
        if first is not None:
            k[first] = k.get(first, 0) + 1
            ls, marker = REPEAT_STYLES[(k[first] - 1) % len(REPEAT_STYLES)]
            kw.setdefault("ls", ls)
            kw.setdefault("marker", marker)
            label, size = f"{label} (same as {first})", size * 0.7 ** k[first]
        kw.setdefault("ls", "-")
        kw.setdefault("marker", "o")
        drawn += ax.plot(ln["x"], ln["y"], label=label, ms=size, zorder=2 + z / len(lines), **kw)
    return drawn


def markdown_table(header: Sequence[Any], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table: the header row, the ``|---|`` separator and one line per row, joined
    by newlines (no trailing one). Cells are ``str()``-ed with ``|`` escaped; an empty cell is ``| |``."""
    def line(cells):
        return "|" + "|".join(f" {c} " if c != "" else " " for c in (str(c).replace("|", "\\|") for c in cells)) + "|"

    return "\n".join([line(header), "|" + "---|" * len(header), *map(line, rows)])
