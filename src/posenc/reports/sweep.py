"""The sweep's tables and plot: each scheme's chosen setting, the sensitivity table (its result at every grid point,
the chosen one in bold), ``sweep.csv`` and ``sweep.png``; from the choices of ``posenc.jobs.sweep`` (objects with
``task``, ``scheme``, ``points``, ``results``, ``steps``, ``point``, ``setting()`` and ``edges()``:
``posenc.jobs.sweep.Choice``).
"""

from __future__ import annotations

import re
from pathlib import Path

from posenc.config.plan import VARIANT_KEY, Point, point_label
from posenc.reports.render import (
    PCT,
    PPL,
    figure,
    log_scale,
    markdown_table,
    number,
    plot_lines,
    save_figure,
    write_csv_table,
)


def _value(task: str | None, v: float | None) -> str:
    """A result as every report renders its kind: a task's id accuracy in percent, text's perplexity."""
    return number(None if v is None else 100 * v, PCT) if task else number(v, PPL)


def _metric(task: str | None) -> str:
    return "id accuracy (%) at the training length" if task else "validation perplexity at the training length"


def _layout(mine: list) -> tuple[list[str], list[tuple[str, object, dict[str, Point]]]]:
    """A task's sensitivity as a table: (columns, rows). The columns are the settings every scheme's grid shares
    (the sweep's grid, ``train.lr=0.001``); a row is one scheme at one value of its own keys (``sweep.schemes``):
    named by the scheme, its variant (``model.encoding``) in its place ("hybrid as <variant>" when the variant's
    spec is not the scheme's name with parameters after a colon), other own keys after it in brackets
    ("path+forget:init_bias=4 (model.n_head=2)"); each row maps a column to its grid point."""
    shared = set.intersection(*({k for p in c.points for k, _ in p} for c in mine)) - {VARIANT_KEY}
    columns: list[str] = []
    rows: dict[tuple[str, str], tuple[object, dict[str, Point]]] = {}
    for c in mine:
        for p in c.points:
            col = point_label(tuple((k, v) for k, v in p if k in shared)) or "its own grid"
            own = dict((k, v) for k, v in p if k not in shared)
            name = own.pop(VARIANT_KEY, c.scheme)
            named = name == c.scheme or name.startswith(f"{c.scheme}:")
            name = name if named else f"{c.scheme} as {name}"  # hybrid as acc-learned-qkv+forget:init_bias=4
            label = name + (f" ({point_label(tuple(own.items()))})" if own else "")
            columns += [col] * (col not in columns)
            rows.setdefault((c.scheme, label), (c, {}))[1][col] = p
    return columns, [(label, c, at) for (_, label), (c, at) in rows.items()]


def _cell(task: str | None, c, point: Point | None) -> str:
    """One sensitivity cell: the result at ``point`` (bold: the chosen one), "" where the row has no such point."""
    if point is None:
        return ""
    text = _value(task, c.results[point_label(point)])
    return f"**{text}**" if point == c.point else text


def chosen_cell(c) -> str:
    """A scheme's chosen setting in the chosen-setting table: ``setting()``, each setting at an edge of its numeric grid
    axis saying so (``edges()``): "train.lr=0.001 (lowest of the grid), model.n_head=4"."""
    if c.point is None:
        return c.setting()
    edges = c.edges()
    return ", ".join(f"{k}={v}" + (f" ({edges[k]} of the grid)" if k in edges else "") for k, v in c.point)


def sweep_markdown(chosen: list, seed: int, plot: str | None) -> list[str]:
    """The report's sweep section: each scheme's chosen setting (an edge of its grid marked: :func:`chosen_cell`), then
    the sensitivity table (the result at every grid point, laid out by ``_layout``; the chosen one in bold) and the
    plot."""
    lines = [
        "## Sweep: each scheme at its best setting",
        "",
        f"Each scheme trained at every point of its grid on seed {seed}; its setting is the point with the best "
        "held-out in-distribution result of that seed (a task: id accuracy at the training length, at or above the "
        "learned bar; text: validation perplexity at the training length), never an extrapolation test; ties go to "
        "fewer steps to criterion, then to the first point. The other seeds ran at the chosen setting; the tables "
        "below report each scheme there (the model and budget lines above are the preset's, before the grid's "
        "settings). A chosen value at the lowest or highest value of a numeric axis of the scheme's grid says so: "
        "the optimum may lie beyond the grid.",
        "",
    ]
    rows = [
        [
            c.task or "text",
            c.scheme,
            chosen_cell(c),
            _value(c.task, c.results.get(point_label(c.point)) if c.point else None),
        ]
        for c in chosen
    ]
    lines += [markdown_table(["task", "scheme", "chosen setting", "result at it"], rows), ""]
    for task in dict.fromkeys(c.task for c in chosen):
        columns, table = _layout([c for c in chosen if c.task == task])
        body = [[label] + [_cell(task, c, at.get(col)) for col in columns] for label, c, at in table]
        lines += [
            f"### Sensitivity{f' on {task}' if task else ''}: {_metric(task)}, seed {seed}",
            "",
            "A row is a scheme at one value of its own grid (its variant in its place, other own settings in "
            "brackets); a column, the settings every scheme's grid shares.",
            "",
            markdown_table(["scheme", *columns], body),
            "",
        ]
    if plot:
        lines += [f"![sensitivity]({plot})", ""]
    return lines


def write_sensitivity(run_root: Path, chosen: list, seed: int, bar: float | None = None) -> str | None:
    """``sweep.csv`` (task, scheme, setting, result, steps to criterion, chosen) and ``sweep.png``
    (:func:`sensitivity_figure`); returns the plot's file name (None without results)."""
    write_csv_table(
        Path(run_root) / "sweep.csv",
        ["task", "scheme", "setting", "result", "steps_to_criterion", "chosen"],
        (
            [
                c.task,
                c.scheme,
                point_label(p),
                c.results[point_label(p)],
                c.steps[point_label(p)] or "",
                int(p == c.point),
            ]
            for c in chosen
            for p in c.points
        ),
    )
    fig = sensitivity_figure(chosen, seed, bar)
    if fig is None:
        return None
    save_figure(fig, Path(run_root) / "sweep.png")
    return "sweep.png"


def _wrap(spec: str, width: int = 40) -> str:
    """``spec`` in lines of at most ``width`` characters, broken after commas (a line without one stays whole): a
    title centred over a panel that is wider than the panel runs off the figure's left edge."""
    lines = [""]
    for part in re.findall(r"[^,]+,?", spec):
        if lines[-1] and len(lines[-1]) + len(part) > width:
            lines.append("")
        lines[-1] += part
    return "\n".join(lines)


def sensitivity_figure(chosen: list, seed: int, bar: float | None = None):
    """The figure of ``sweep.png``: one panel per task, the result against the shared settings, one line per row of
    ``_layout``, the chosen point ringed, a task's learned ``bar`` (a fraction) dashed; None without results."""
    tasks = list(dict.fromkeys(c.task for c in chosen))
    if not any(v is not None for c in chosen for v in c.results.values()):
        return None
    scale = {t: 100 if t else 1 for t in tasks}
    fig, axes = figure(1, len(tasks), figsize=(6.5 * len(tasks), 4.8), squeeze=False, layout="constrained")
    for ax, task in zip(axes[0], tasks):
        columns, table = _layout([c for c in chosen if c.task == task])
        rows = []
        for i, (label, c, at) in enumerate(table):
            xs = [x for x, col in enumerate(columns) if col in at and c.results[point_label(at[col])] is not None]
            ys = [c.results[point_label(at[columns[x]])] * scale[task] for x in xs]
            # ten colours, then the next ten rows dashed, then dotted: no two rows look alike
            rows.append({"label": label, "x": xs, "y": ys, "color": f"C{i % 10}", "ls": ("-", "--", ":")[i // 10 % 3]})
        # rows at chance on every point coincide: plot_lines draws a repeat over its first, smaller, and says so
        for line, (_, c, at), row in zip(plot_lines(ax, rows, ms=6), table, rows):
            for x, y in zip(row["x"], row["y"]):
                if at[columns[x]] == c.point:  # the chosen point, ringed
                    ax.plot([x], [y], marker="o", ms=12, mfc="none", color=line.get_color())
        if task and bar is not None:
            ax.axhline(100 * bar, color="gray", ls="--", lw=1, label="learned bar")
        ax.set_xticks(range(len(columns)), columns, fontsize=8)
        ax.set_xlim(-0.3, len(columns) - 0.7)
        ax.set_ylabel(_metric(task))
        if task is None:
            log_scale(ax, "y")
        ax.set_title(f"{_wrap(task or 'text')}\nseed {seed}, result per grid point (ringed: chosen)", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig
