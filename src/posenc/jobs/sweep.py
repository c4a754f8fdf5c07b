"""The sweep's choice (issue: a fair comparison): each scheme at its best setting of the preset's grid.

Every scheme trains at each point of its grid (``posenc.config.plan.grid_points``) on the first seed only; its setting
is the point with the best held-out in-distribution result of that seed (:func:`choose`): on a task the accuracy
of the ``id`` test at the training length (a point below ``task_eval.learned`` does not count: the scheme did not
learn there), on text the validation perplexity at the training length. Never an extrapolation test: the choice
must not select on what the comparison measures. The other seeds then run at the chosen point. The report gets
each scheme's chosen setting, the sensitivity table (the result at every grid point) and its plot
(``posenc.reports.sweep``).
"""

from __future__ import annotations

import math
from pathlib import Path

from posenc.config.plan import Point, point_label, point_root
from posenc.reports.tasks import Scores
from posenc.store.records import Ppl, RunStore, Task, full_records, write


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

    def edges(self) -> dict[str, str]:
        """{key: "lowest" | "highest"} of each numeric axis of this scheme's grid (more than one value, every value a
        number) on which the chosen point sits at an edge: the optimum may lie beyond the grid. {} when none was
        chosen."""
        if self.point is None:
            return {}
        axes: dict[str, set] = {}
        for p in self.points:
            for k, v in p:
                axes.setdefault(k, set()).add(v)
        out = {}
        for k, v in self.point:
            values = axes[k]
            if len(values) < 2 or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in values):
                continue
            if v == min(values):
                out[k] = "lowest"
            elif v == max(values):
                out[k] = "highest"
        return out

    def setting(self) -> str:
        """The chosen setting in words, or why there is none."""
        if self.point is not None:
            return point_label(self.point)
        if self.task is None:
            return "none chosen: no grid point has a result"
        at = f" (reported at its best, {point_label(self.shown)})" if self.shown else ""
        return "none chosen: did not learn at any grid point" + at


def choices(
    stores: dict[Path, RunStore],
    run_root: Path,
    tasks: list[str | None],
    points: dict[str, list[Point]],
    seed: int,
    train_length: int,
    bar: float,
) -> list[Choice]:
    """The choice of every (task, scheme) from the records of ``seed`` at each of its grid points (``points``: scheme
    -> its grid; ``stores``: each grid point's records by its directory); ``bar``: a task's learned threshold
    (``task_eval.learned``)."""
    out = []
    for task in tasks:
        for scheme, grid in points.items():
            found = {
                point_label(p): seed_results(stores[point_root(run_root, p)].records, task, scheme, seed, train_length)
                for p in grid
            }
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


def merge_chosen(stores: dict[Path, RunStore], run_root: Path, chosen: list[Choice], schemes: list[str]) -> None:
    """``run_root/results.jsonl``: the records of each (task, scheme) at its chosen grid point (every seed) or, on a
    task none of its points learned, at its best point (seed 0 only: no other seed runs there), the rows of RoPE
    context-extension schedules and eval_methods evaluated on a chosen scheme; rewritten whole each time from
    ``stores`` (each grid point's records by its directory, up to date)."""
    keep: dict[Point, set] = {}
    for c in chosen:
        if c.shown is not None:
            keep.setdefault(c.shown, set()).add((c.task, c.scheme))
    out = []
    for point, wanted in keep.items():
        names = {s for _, s in wanted}
        for r in full_records(stores[point_root(run_root, point)].records):
            if isinstance(r, Task):
                ok = (r.task, r.scheme) in wanted
            else:  # text: a scheme's rows, or a schedule row "<scheme>+<schedule>" of a chosen scheme
                ok = r.scheme in names or (r.scheme not in schemes and any(r.scheme.startswith(f"{s}+") for s in names))
            if ok:
                out.append(r)
    write(Path(run_root) / "results.jsonl", out)
