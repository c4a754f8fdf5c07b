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

from posenc.config.plan import Point, point_label, point_root
from posenc.reports.render import figure, log_scale, markdown_table, save_figure, write_csv_table
from posenc.reports.tasks import Scores
from posenc.store.records import Ppl, Task, load, write


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
        return "none chosen: did not learn at any grid point"


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


def sweep_markdown(chosen: list[Choice], seed: int, plot: str | None) -> list[str]:
    """The report's sweep section: each scheme's chosen setting, then the sensitivity table (the result at every
    grid point; the chosen one in bold) and the plot."""
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
        mine = [c for c in chosen if c.task == task]
        labels = list(dict.fromkeys(point_label(p) for c in mine for p in c.points))
        body = [
            [c.scheme]
            + [
                (
                    f"**{_value(task, c.results[lb])}**"
                    if c.point and lb == point_label(c.point)
                    else _value(task, c.results[lb])
                )
                if lb in c.results
                else ""
                for lb in labels
            ]
            for c in mine
        ]
        lines += [
            f"### Sensitivity{f' on {task}' if task else ''}: {_metric(task)}, seed {seed}",
            "",
            markdown_table(["scheme", *labels], body),
            "",
        ]
    if plot:
        lines += [f"![sensitivity]({plot})", ""]
    return lines


def write_sensitivity(run_root: Path, chosen: list[Choice], seed: int, bar: float | None = None) -> str | None:
    """``sweep.csv`` (task, scheme, setting, result, steps to criterion, chosen) and ``sweep.png`` (one panel per task:
    the result against the grid point, one line per scheme, a task's learned ``bar`` dashed); returns the plot's file
    name (None without results)."""
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
    fig, axes = figure(1, len(tasks), figsize=(5.5 * len(tasks), 4.2), squeeze=False, layout="constrained")
    for ax, task in zip(axes[0], tasks):
        mine = [c for c in chosen if c.task == task]
        labels = list(dict.fromkeys(point_label(p) for c in mine for p in c.points))
        for c in mine:
            xs = [labels.index(point_label(p)) for p in c.points if c.results[point_label(p)] is not None]
            ys = [c.results[labels[x]] * (100 if task else 1) for x in xs]
            (line,) = ax.plot(xs, ys, marker="o", label=c.scheme)
            if c.point is not None:  # the chosen point, ringed
                x = labels.index(point_label(c.point))
                ax.plot(
                    [x],
                    [c.results[labels[x]] * (100 if task else 1)],
                    marker="o",
                    ms=12,
                    mfc="none",
                    color=line.get_color(),
                )
        if task and bar is not None:
            ax.axhline(100 * bar, color="gray", ls="--", lw=1, label="learned bar")
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel(_metric(task))
        if task is None:
            log_scale(ax, "y")
        ax.set_title(f"{task or 'text'}: seed {seed}, result per grid point (ringed: chosen)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
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
        for r in load(point_root(run_root, point) / "results.jsonl"):
            if isinstance(r, Task):
                ok = (r.task, r.scheme) in wanted
            else:  # text: a scheme's rows, or a schedule row "<scheme>+<schedule>" of a chosen scheme
                ok = r.scheme in names or (r.scheme not in schemes and any(r.scheme.startswith(f"{s}+") for s in names))
            if ok:
                out.append(r)
    write(Path(run_root) / "results.jsonl", out)
