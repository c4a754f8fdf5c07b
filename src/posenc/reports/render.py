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
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from posenc.store.checkpoint import atomic_write_bytes


def write_csv_table(path: Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """``path``: a CSV table (the ``header`` row, then each of ``rows``, a sequence in header order), written
    atomically; the one CSV writer of the reports (RFC 4180 line ends, as the committed tables have)."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    w.writerows(rows)
    atomic_write_bytes(Path(path), buf.getvalue().encode())


# the one rendering of each kind of value in every table, cell and plot label of the reports: a value not measured,
# a perplexity, a perplexity ratio, a percentage (points)
MISSING = "n/a"
PPL, RATIO, PCT = ".2f", ".3f", ".1f"


def number(value: float | None, fmt: str) -> str:
    """``value`` in the format ``fmt`` (:data:`PPL`, :data:`RATIO`, :data:`PCT`, ...); :data:`MISSING` for None or
    NaN."""
    return MISSING if value is None or value != value else format(value, fmt)


def seed_cell(values: list[float], fmt: str = RATIO) -> str:
    """A table cell over seeds: mean ± half-range (:data:`MISSING` without values, the value for one seed)."""
    values = [v for v in values if v is not None]
    if not values:
        return MISSING
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
    over less than 3,000x; every ``stride``-th power over more than 12), or, where fewer than three of those fall inside
    the view, a linear 1-2-2.5-5 ladder (about five ticks). Positions outside the view may be included (matplotlib
    clips them)."""
    from matplotlib.ticker import LogLocator, MaxNLocator

    vmin, vmax = sorted((vmin, vmax))
    if vmin <= 0:  # no data yet: matplotlib's own choice
        return LogLocator(base).tick_values(max(vmin, 1e-300), max(vmax, 1e-300))
    lo, hi = math.floor(math.log(vmin, base) + 1e-9), math.ceil(math.log(vmax, base) - 1e-9)
    subs = (1, 2, 5) if base == 10 and vmax / vmin < 3e3 else (1,)
    stride = math.ceil((hi - lo + 1) / 12)
    ticks = np.array([m * float(base) ** k for k in range(lo, hi + 1, stride) for m in subs])
    if np.count_nonzero((ticks >= vmin) & (ticks <= vmax)) >= 3:
        return ticks
    ladder = MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]).tick_values(vmin, vmax)
    return ladder[ladder > 0]


def plain_number(v: float) -> str:
    """A tick label: an integer in full (1048576, not 1.04858e+06), anything else as ``format(v, "g")`` (0.25, 1.5)."""
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def log_scale(ax, which: str, base: float = 10) -> None:
    """Make ``ax``'s ``which`` ("x" or "y") axis logarithmic with at least three plain tick labels (2, not 2x10^0)
    at any range (:func:`log_ticks`, chosen at draw time from the view); the minor ticks are unlabelled."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    class Ticks(LogLocator):  # LogLocator's view limits and nonsingular handling, log_ticks's positions
        def tick_values(self, vmin, vmax):
            return log_ticks(vmin, vmax, base)

    getattr(ax, f"set_{which}scale")("log", base=base)
    axis = getattr(ax, f"{which}axis")
    axis.set_major_locator(Ticks(base))
    axis.set_major_formatter(FuncFormatter(lambda v, _: plain_number(v)))
    axis.set_minor_locator(LogLocator(base, subs="auto"))
    axis.set_minor_formatter(NullFormatter())


# line styles and marker shapes of lines that repeat an earlier one, in order; each is drawn smaller and over it
REPEAT_STYLES = [("--", "s"), (":", "^"), ("-.", "D"), ((0, (5, 1, 1, 1)), "v"), ((0, (1, 3)), "P")]


def same_as(
    lines: Sequence[tuple[str, Sequence[float], Sequence[float]]], rtol: float = 1e-6, atol: float = 0.0
) -> dict[str, str]:
    """{label: the label of the first earlier line it repeats} over ``lines`` of (label, x, y): equal x, and y equal
    within ``atol + rtol * |y|`` at every point (a gap, None or NaN, equals a gap). Lines that repeat none are not in
    the result."""
    out: dict[str, str] = {}
    for i, (label, x, y) in enumerate(lines):
        for first, fx, fy in lines[:i]:
            if (
                first not in out
                and len(fx) == len(x)
                and np.array_equal(fx, x)
                and np.allclose(np.asarray(fy, float), np.asarray(y, float), rtol=rtol, atol=atol, equal_nan=True)
            ):
                out[label] = first
                break
    return out


LABEL_WIDTH = 44  # characters per legend line: a longer label wraps


def short_label(label: str, width: int = LABEL_WIDTH) -> str:
    """A legend's label of a scheme spec: one of at most ``width`` characters as it is; a longer one with the repeated
    entries of a '|' pattern collapsed ("3 x A | B") and wrapped after a ',', '|' or space into lines of at most
    ``width`` characters (a longer piece stays whole), so that a long spec neither hides the plot nor pushes the axes
    off the figure."""
    if len(label) <= width:
        return label
    entries = label.split("|")
    groups: list[list] = []
    for e in entries:
        if groups and groups[-1][0] == e:
            groups[-1][1] += 1
        else:
            groups.append([e, 1])
    text = " | ".join(f"{n} x {e}" if n > 1 else e for e, n in groups) if len(entries) > 1 else label
    lines, line = [], ""
    for piece in re.findall(r"[^,| ]*[,| ]?", text):
        if line and len(line) + len(piece.rstrip()) > width:
            lines.append(line.rstrip())
            line = ""
        line += piece
    return "\n".join([*lines, line.rstrip()]) if line.strip() else "\n".join(lines)


MAX_INSIDE = 8  # legend entries a plot holds inside its axes


def legend(ax, entries: int, **kw) -> None:
    """The axes' legend (``Axes.legend`` keywords ``kw``): inside the axes for at most ``MAX_INSIDE`` entries, else
    beside them on the right with the figure widened by half, where a dozen entries would cover the curves."""
    if entries <= MAX_INSIDE:
        ax.legend(**kw)
        return
    w, h = ax.figure.get_size_inches()
    ax.figure.set_size_inches(w * 1.5, h)
    ax.legend(**{**kw, "ncol": 1}, loc="upper left", bbox_to_anchor=(1.02, 1), borderaxespad=0)


def plot_lines(ax, lines: Sequence[dict], ms: float = 5, close: float = 0.01) -> list:
    """Draw ``lines`` on ``ax`` so that identical and nearly identical ones stay visible; returns the Line2D objects.
    Each line is a dict with "label", "x", "y" and any ``Axes.plot`` keywords (colour, ls, marker, ...; marker "o" and
    ls "-" when not given). A line that repeats an earlier one (:func:`same_as`) is labelled "LABEL (same as FIRST)",
    one within ``close`` at every point (of its value, or of the span of all the lines' values: it would hide under
    the first on a log or a linear axis) "LABEL (within 1% of FIRST)"; either is
    drawn over the first with its marker size (``ms`` unless given) x 0.7^k (the k-th such line) and, unless its own
    are given, the k-th line style and marker shape of ``REPEAT_STYLES``. A line whose colour, line style and marker
    all equal an earlier line's (more lines than colours) takes the first marker shape of ``REPEAT_STYLES`` no line of
    its colour and style has. Labels are shown by :func:`short_label`."""
    from matplotlib.colors import to_hex

    points = [(ln["label"], list(ln["x"]), list(ln["y"])) for ln in lines]
    ys = np.array([v for _, _, y in points for v in y if v is not None], float)
    span = float(np.ptp(ys[np.isfinite(ys)])) if np.isfinite(ys).any() else 0.0
    repeats, near = same_as(points), same_as(points, rtol=close, atol=close * span)
    k: dict[str, int] = {}
    drawn, styles = [], set()
    for z, ln in enumerate(lines):
        kw = {key: v for key, v in ln.items() if key not in ("label", "x", "y")}
        name, size = ln["label"], kw.pop("ms", ms)
        label, first = short_label(name), repeats.get(name) or near.get(name)
        if first is not None:
            k[first] = k.get(first, 0) + 1
            ls, marker = REPEAT_STYLES[(k[first] - 1) % len(REPEAT_STYLES)]
            kw.setdefault("ls", ls)
            kw.setdefault("marker", marker)
            how = "same as" if name in repeats else f"within {close:.0%} of"
            label, size = f"{label} ({how} {short_label(first)})", size * 0.7 ** k[first]
        kw.setdefault("ls", "-")
        kw.setdefault("marker", "o")
        (line,) = ax.plot(ln["x"], ln["y"], label=label, ms=size, zorder=2 + z / len(lines), **kw)
        style = (to_hex(line.get_color()), line.get_linestyle(), line.get_marker())
        if style in styles:  # indistinguishable from an earlier line: another marker shape
            line.set_marker(next(m for _, m in REPEAT_STYLES if (*style[:2], m) not in styles))
            style = (*style[:2], line.get_marker())
        styles.add(style)
        drawn.append(line)
    return drawn


def markdown_table(header: Sequence[Any], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table: the header row, the ``|---|`` separator and one line per row, joined
    by newlines (no trailing one). Cells are ``str()``-ed with ``|`` escaped; an empty cell is ``| |``."""

    def line(cells):
        return "|" + "|".join(f" {c} " if c != "" else " " for c in (str(c).replace("|", "\\|") for c in cells)) + "|"

    return "\n".join([line(header), "|" + "---|" * len(header), *map(line, rows)])


def plot_stream(nll: np.ndarray, path: Path, label: str, points: int = 100) -> Path:
    """Perplexity per position to the end of a streamed text: the mean NLL of ``points`` equal spans of the
    targets (nll (T,) nats), exponentiated; written atomically to ``path`` (PNG)."""
    edges = sorted({round(len(nll) * b / points) for b in range(points + 1)})
    fig, ax = figure(figsize=(7, 3.5), layout="constrained")
    ax.plot(edges[1:], [math.exp(float(np.mean(nll[a:b], dtype=np.float64))) for a, b in zip(edges, edges[1:])])
    ax.set(xlabel="target position (tokens)", ylabel="perplexity (per span)", title=label)
    return save_figure(fig, path)
