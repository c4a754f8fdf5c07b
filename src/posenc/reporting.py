"""The one reporting toolkit: figures (matplotlib Agg, atomic PNG writes, plain log ticks),
markdown tables and CSV tables, for compare's report, diagnose, extend's report, theory and the benchmarks.

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


def log_scale(ax, which: str, base: float = 10) -> None:
    """Make ``ax``'s ``which`` ("x" or "y") axis logarithmic with plain tick labels (2, not 2x10^0);
    of the minor ticks only 2x and 5x are labelled when the axis spans a decade or more (else they collide)."""
    from matplotlib.ticker import FuncFormatter

    getattr(ax, f"set_{which}scale")("log", base=base)
    axis = getattr(ax, f"{which}axis")

    def minor(v, _):
        lo, hi = axis.get_view_interval()
        lead = round(v / 10 ** math.floor(math.log10(v)))
        return f"{v:g}" if hi < 10 * lo or lead in (2, 5) else ""

    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(FuncFormatter(minor))


def markdown_table(header: Sequence[Any], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table: the header row, the ``|---|`` separator and one line per row, joined
    by newlines (no trailing one). Cells are ``str()``-ed with ``|`` escaped; an empty cell is ``| |``."""
    def line(cells):
        return "|" + "|".join(f" {c} " if c != "" else " " for c in (str(c).replace("|", "\\|") for c in cells)) + "|"

    return "\n".join([line(header), "|" + "---|" * len(header), *map(line, rows)])
