"""The sweep's choice (issue: a fair comparison): each scheme at its best setting of the preset's grid.

Every scheme trains at each point of its grid (``posenc.config.plan.grid_points``) on the first seed only; its setting
is the point with the best held-out in-distribution result of that seed (:func:`choose`): on a task the accuracy
of the ``id`` test at the training length (a point below ``task_eval.learned`` does not count: the scheme did not
learn there), on text the validation perplexity at the training length. Never an extrapolation test: the choice
must not select on what the comparison measures. The other seeds then run at the chosen point. The report gets
each scheme's chosen setting, the sensitivity table (the result at every grid point) and its plot.
"""

from __future__ import annotations

import math
from pathlib import Path

from posenc.config.plan import VARIANT_KEY, Point, point_label, point_root
from posenc.reports.render import figure, log_scale, markdown_table, save_figure, write_csv_table
from posenc.reports.tasks import Scores
from posenc.store.records import Ppl, Task, full_records, load, write


def choose(
    results: dict[str, float | None],
    higher_is_better: bool,
    bar: float | None = None,
    tiebreak: dict[str, int | None] | None = None,
) -> str | None:
    """The grid point (a key of ``results``, in grid order) with the best value; None when none has one.

    ``results``: {point: value, or None when the point has no result (failed, not measurable)}. A value below
    ``bar`` (when given, higher is better) does not count. Ties go to the smaller ``tiebreak`` (steps to
    criterion; None counts as never), then to the first point in grid order.
    """
    counted = {p: v for p, v in results.items() if v is not None and math.isfinite(v) and (bar is None or v >= bar)}
    if not counted:
        return None
    best = (max if higher_is_better else min)(counted.values())
    tied = [p for p, v in counted.items() if v == best]
    steps = tiebreak or {}
    return min(tied, key=lambda p: (math.inf if steps.get(p) is None else steps[p], tied.index(p)))


def seed_results(
    records: list, task: str | None, scheme: str, seed: int, train_length: int
) -> tuple[float | None, int | None]:
    """(held-out in-distribution result, steps to criterion) of one job in a grid point's ``records``: the id accuracy
    at the training length on a task, the perplexity at the training length on text; (None, None) without a record."""
    for r in records:
        if task and isinstance(r, Task) and (r.task, r.scheme, r.seed) == (task, scheme, seed):
            return Scores(r.cells).acc("id", train_length)[0], r.criterion_step
        if not task and isinstance(r, Ppl) and (r.scheme, r.seed, r.eval_length) == (scheme, seed, train_length):
            return r.ppl, None
    return None, None


class Choice:
    """The sweep of one (task, scheme): its result at each grid point and the chosen point (None: none chosen)."""

    def __init__(
        self,
        task: str | None,
        scheme: str,
        points: list[Point],
        results: dict[str, float | None],
        steps: dict[str, int | None],
        bar: float | None,
    ):
        self.task, self.scheme, self.points, self.results, self.steps = task, scheme, points, results, steps
        label = choose(results, higher_is_better=task is not None, bar=bar, tiebreak=steps)
        self.point: Point | None = next((p for p in points if point_label(p) == label), None)
        # what the reports show: the chosen point, else (a task none of whose points learned) the best one, so the
        # scheme appears as "did not learn" with its measurement instead of vanishing from the tables
        best = label if label is not None or task is None else choose(results, higher_is_better=True, tiebreak=steps)
        self.shown: Point | None = next((p for p in points if point_label(p) == best), None)

    def setting(self) -> str:
        """The chosen setting in words, or why there is none."""
        if self.point is not None:
            return point_label(self.point)
        if self.task is None:
            return "none chosen: no grid point has a result"
        at = f" (reported at its best, {point_label(self.shown)})" if self.shown else ""
        return "none chosen: did not learn at any grid point" + at


def choices(
    run_root: Path, tasks: list[str | None], points: dict[str, list[Point]], seed: int, train_length: int, bar: float
) -> list[Choice]:
    """The choice of every (task, scheme) from the records of ``seed`` at each of its grid points (``points``: scheme
    -> its grid); ``bar``: a task's learned threshold (``task_eval.learned``)."""
    out, records = [], {}
    for task in tasks:
        for scheme, grid in points.items():
            for p in grid:  # each grid point's records read once
                records.setdefault(p, load(point_root(run_root, p) / "results.jsonl"))
            found = {point_label(p): seed_results(records[p], task, scheme, seed, train_length) for p in grid}
            out.append(
                Choice(
                    task,
                    scheme,
                    grid,
                    {k: v for k, (v, _) in found.items()},
                    {k: s for k, (_, s) in found.items()},
                    bar if task else None,
                )
            )
    return out


def _value(task: str | None, v: float | None) -> str:
    if v is None:
        return "—"
    return f"{100 * v:.1f}" if task else f"{v:.3f}"


def _metric(task: str | None) -> str:
    return "id accuracy (%) at the training length" if task else "validation perplexity at the training length"


def _layout(mine: list[Choice]) -> tuple[list[str], list[tuple[str, Choice, dict[str, Point]]]]:
    """A task's sensitivity as a table: (columns, rows). The columns are the settings every scheme's grid shares
    (the sweep's grid, ``train.lr=0.001``); a row is one scheme at one value of its own keys (``sweep.schemes``):
    named by the scheme, its variant (``model.encoding``) in its place ("hybrid as <variant>" when the variant's
    spec is not the scheme's name with parameters after a colon), other own keys after it in brackets
    ("path+forget:init_bias=4 (model.n_head=2)"); each row maps a column to its grid point."""
    shared = set.intersection(*({k for p in c.points for k, _ in p} for c in mine)) - {VARIANT_KEY}
    columns: list[str] = []
    rows: dict[tuple[str, str], tuple[Choice, dict[str, Point]]] = {}
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


def _cell(task: str | None, c: Choice, point: Point | None) -> str:
    """One sensitivity cell: the result at ``point`` (bold: the chosen one), "" where the row has no such point."""
    if point is None:
        return ""
    text = _value(task, c.results[point_label(point)])
    return f"**{text}**" if point == c.point else text


def sweep_markdown(chosen: list[Choice], seed: int, plot: str | None) -> list[str]:
    """The report's sweep section: each scheme's chosen setting, then the sensitivity table (the result at every
    grid point, laid out by ``_layout``; the chosen one in bold) and the plot."""
    lines = [
        "## Sweep: each scheme at its best setting",
        "",
        f"Each scheme trained at every point of its grid on seed {seed}; its setting is the point with the best "
        "held-out in-distribution result of that seed (a task: id accuracy at the training length, at or above the "
        "learned bar; text: validation perplexity at the training length), never an extrapolation test; ties go to "
        "fewer steps to criterion, then to the first point. The other seeds ran at the chosen setting; the tables "
        "below report each scheme there (the model and budget lines above are the preset's, before the grid's "
        "settings).",
        "",
    ]
    rows = [
        [
            c.task or "text",
            c.scheme,
            c.setting(),
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


def write_sensitivity(run_root: Path, chosen: list[Choice], seed: int, bar: float | None = None) -> str | None:
    """``sweep.csv`` (task, scheme, setting, result, steps to criterion, chosen) and ``sweep.png`` (one panel per task:
    the result against the shared settings, one line per row of ``_layout``, the chosen point ringed, a task's
    learned ``bar`` dashed); returns the plot's file name (None without results)."""
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
    tasks = list(dict.fromkeys(c.task for c in chosen))
    if not any(v is not None for c in chosen for v in c.results.values()):
        return None
    scale = {t: 100 if t else 1 for t in tasks}
    fig, axes = figure(1, len(tasks), figsize=(6.5 * len(tasks), 4.8), squeeze=False, layout="constrained")
    for ax, task in zip(axes[0], tasks):
        columns, table = _layout([c for c in chosen if c.task == task])
        for i, (label, c, at) in enumerate(table):
            xs = [x for x, col in enumerate(columns) if col in at and c.results[point_label(at[col])] is not None]
            ys = [c.results[point_label(at[columns[x]])] * scale[task] for x in xs]
            # ten colours, then the next ten rows dashed, then dotted: no two rows look alike
            (line,) = ax.plot(xs, ys, marker="o", label=label, color=f"C{i % 10}", ls=("-", "--", ":")[i // 10 % 3])
            for x, y in zip(xs, ys):
                if at[columns[x]] == c.point:  # the chosen point, ringed
                    ax.plot([x], [y], marker="o", ms=12, mfc="none", color=line.get_color())
        if task and bar is not None:
            ax.axhline(100 * bar, color="gray", ls="--", lw=1, label="learned bar")
        ax.set_xticks(range(len(columns)), columns, fontsize=8)
        ax.set_xlim(-0.3, len(columns) - 0.7)
        ax.set_ylabel(_metric(task))
        if task is None:
            log_scale(ax, "y")
        ax.set_title(f"{task or 'text'}: seed {seed}, result per grid point (ringed: chosen)", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))
    save_figure(fig, Path(run_root) / "sweep.png")
    return "sweep.png"


def merge_chosen(run_root: Path, chosen: list[Choice], schemes: list[str]) -> None:
    """``run_root/results.jsonl``: the records of each (task, scheme) at its chosen grid point (every seed) or, on a
    task none of its points learned, at its best point (seed 0 only: no other seed runs there), the rows of RoPE
    context-extension schedules and eval_methods evaluated on a chosen scheme; rewritten whole each time."""
    keep: dict[Point, set] = {}
    for c in chosen:
        if c.shown is not None:
            keep.setdefault(c.shown, set()).add((c.task, c.scheme))
    out = []
    for point, wanted in keep.items():
        names = {s for _, s in wanted}
        for r in full_records(load(point_root(run_root, point) / "results.jsonl")):
            if isinstance(r, Task):
                ok = (r.task, r.scheme) in wanted
            else:  # text: a scheme's rows, or a schedule row "<scheme>+<schedule>" of a chosen scheme
                ok = r.scheme in names or (r.scheme not in schemes and any(r.scheme.startswith(f"{s}+") for s in names))
            if ok:
                out.append(r)
    write(Path(run_root) / "results.jsonl", out)
