"""The report of a task comparison (``posenc.jobs.retrieval``): tables, plots, horizons, and the claims of the
registered claim sets (``posenc.reports.claims``).

Accuracy is the share of answers whose argmax is the target. A scheme whose in-distribution
accuracy (test ``id`` at the training length) is below ``learned`` (0.9) "did not learn the
task" and gets no horizon and no verdict. Its **retrieval horizon** is the largest evidence-
distance bucket of the controlled-gap test up to which every bucket's accuracy stays within
``horizon_tol`` (5 points) of its in-distribution accuracy (None: already the smallest bucket
falls short). A horizon at the longest bucket probed is right-censored (:class:`Horizon`, shown "≥ 4,096"), never
averaged: over seeds a horizon shows its median and range (:func:`horizon_cell`), the same in report.md and the
scoreboard. The alternative rules a robustness table reads work on the same data: the tolerance
(:data:`TOLERANCES`), the buckets pooled over seeds by their plain mean or weighted by answers
(:meth:`TaskTable.pooled_horizon`), and the half-way-to-chance horizon (:func:`half_chance_horizon`).
A claim set decides its comparisons over seeds with ``posenc.reports.claims.decide`` (the test sets' binomial
standard errors among the noise: :meth:`TaskTable.values`). A claim whose schemes were
run but did not all learn is **undecided**: its evidence names each scheme that did not learn, on which seeds
(their id accuracy), and what that job's learning curve says about the budget that would decide it
(:func:`budget`, :func:`not_learned`). Claims whose schemes were not run are omitted.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import numpy as np

from posenc import encodings
from posenc.data.tasks import get_task
from posenc.errors import PosencError
from posenc.eval.tasks import bucket_error, standard_error
from posenc.reports import claims
from posenc.reports.claims import Quantity
from posenc.reports.render import (
    PCT,
    figure,
    log_scale,
    markdown_table,
    number,
    plot_lines,
    save_figure,
    seed_cell,
    write_csv_table,
)
from posenc.store.checkpoint import atomic_write_bytes
from posenc.store.records import Ppl, Task, TaskCell, load, load_ppl
from posenc.store.stamp import stamp_line
from posenc.train.curves import loss_trend

# budget(): the training loss "still falls" by posenc.train.curves.LOSS_FALLING (the rule train.until.extend_to trains
# on by); it is "at chance" from AT_CHANCE x -ln(chance)
AT_CHANCE = 0.95


def slug(task: str) -> str:
    """A file-name form of a task spec: ``mqar:pairs=8`` -> ``mqar-pairs-8``."""
    return re.sub(r"[^A-Za-z0-9.]+", "-", task).strip("-")


class Scores:
    """Answers, correct answers and NLL of one job, by (test, length, bucket)."""

    def __init__(self, cells: list[TaskCell]):
        self.cells = {(c.test, c.length, c.bucket): (c.n, c.correct, c.nll) for c in cells}

    def acc(self, test: str, length: int | None = None, bucket: int | None = None) -> tuple[float | None, int]:
        """(accuracy, answers) over the matching cells; (None, 0) when there are none."""
        sel = [v for (t, L, b), v in self.cells.items() if t == test and length in (None, L) and bucket in (None, b)]
        n = sum(v[0] for v in sel)
        return (sum(v[1] for v in sel) / n if n else None), n

    def lengths(self, test: str) -> list[int]:
        return sorted({L for t, L, _ in self.cells if t == test})

    def buckets(self, test: str) -> list[int]:
        return sorted({b for t, _, b in self.cells if t == test})


def horizon(curve: dict[int, float], id_acc: float, tol: float) -> int | None:
    """Largest bucket up to which every bucket of ``curve`` ({bucket: accuracy}) is >= id_acc - tol; None if the first
    is not."""
    best = None
    for b in sorted(curve):
        if curve[b] < id_acc - tol:
            break
        best = b
    return best


TOLERANCES = (0.02, 0.05, 0.10, 0.20)  # the tolerances (fractions) a robustness table tries beside the run's own


@dataclasses.dataclass(frozen=True)
class Horizon:
    """One horizon as data. ``value``: the largest distance bucket (tokens, int) the rule accepts; None: not even the
    smallest bucket probed (``first``). ``censored``: the rule accepts the largest bucket probed (``last``), so the
    true horizon is ``>= value`` (right-censored): never average it as a number. ``seed``: the run's seed (None: a
    horizon of buckets pooled over seeds)."""

    value: int | None
    censored: bool
    first: int
    last: int
    seed: int | None = None

    @property
    def lower(self) -> int:
        """A lower bound in tokens (int): ``value``, 0 without one."""
        return 0 if self.value is None else self.value

    def text(self) -> str:
        """The one rendering of a horizon: "1,024", "≥ 4,096" (censored), "none" (no bucket)."""
        return horizon_text(self)


def horizon_of(curve: dict[int, float], id_acc: float, tol: float, seed: int | None = None) -> Horizon:
    """:func:`horizon` of ``curve`` ({bucket: accuracy}, non-empty) as a :class:`Horizon`; PosencError without
    buckets."""
    if not curve:
        raise PosencError("horizon: no gap buckets to judge")
    h = horizon(curve, id_acc, tol)
    return Horizon(h, h is not None and h == max(curve), min(curve), max(curve), seed)


def half_chance_horizon(curve: dict[int, float], id_acc: float, chance: float, seed: int | None = None) -> Horizon:
    """The half-way-to-chance horizon: the largest bucket of ``curve`` whose accuracy is above (id_acc + chance) / 2
    (buckets beyond a dip count); None when none is. PosencError without buckets."""
    if not curve:
        raise PosencError("horizon: no gap buckets to judge")
    bar = (id_acc + chance) / 2
    above_bar = [b for b, a in curve.items() if a > bar]
    h = max(above_bar) if above_bar else None
    return Horizon(h, h is not None and h == max(curve), min(curve), max(curve), seed)


class TaskTable:
    """One task's scores over schemes and seeds, with each job's in-distribution accuracy and horizon."""

    def __init__(
        self, records: list[Task], task: str, train_length: int, tol: float, bar: float, n_head: int | None = None
    ):
        """``n_head``: the run's head count for records without their own (``Task.n_head``); None: unknown."""
        self.task, self.L0, self.tol, self.bar = task, train_length, tol, bar
        self.chance = get_task(task).chance
        self.scores: dict[str, dict[int, Scores]] = {}  # only schemes with records: a lookup adds none
        self.records: dict[tuple[str, int], Task] = {}
        # each scheme under the name its run gave it (a claim set never renames the library's rows)
        mine = [r for r in records if r.task == task]
        for r in mine:
            self.scores.setdefault(r.scheme, {})[r.seed] = Scores(r.cells)
            self.records[(r.scheme, r.seed)] = r if r.n_head is not None else r.model_copy(update={"n_head": n_head})
        # each scheme's seeds in seed order: the records come in the order the jobs finished (--parallel)
        self.scores = {s: dict(sorted(by_seed.items())) for s, by_seed in self.scores.items()}
        self.seconds = {(r.scheme, r.seed): (r.train_seconds, r.eval_seconds) for r in mine}
        self.criterion = {
            (r.scheme, r.seed): (r.criterion, r.criterion_step, r.trained_steps) for r in mine if r.criterion
        }
        self.variants: dict[str, list[str]] = {}  # {scheme: the sweep variants its jobs trained, when not itself}
        for r in mine:
            if r.encoding and encodings.canonical(r.encoding) != encodings.canonical(r.scheme):
                specs = self.variants.setdefault(r.scheme, [])
                if r.encoding not in specs:
                    specs.append(r.encoding)

    def trained_as(self, scheme: str) -> str:
        """ " (trained as forget:init_bias=4)" when the scheme's jobs trained a sweep variant of it
        (``Task.encoding``), else "": a reader joining this run with another must know it is not the plain scheme."""
        specs = self.variants.get(scheme)
        return f" (trained as {' / '.join(specs)})" if specs else ""

    def trained_values(self, values: dict[str, float | None]) -> dict[str, float | None]:
        """``values`` ({spec: a quantity's value}) with each scheme that trained a sweep variant given its variant's
        value (None where ``values`` lacks it): the value of what was trained, never the plain scheme's."""
        return {**values, **{s: values.get(v[0]) for s, v in self.variants.items()}}

    def id_acc(self, scheme: str) -> list[float]:
        return [s.acc("id", self.L0)[0] for s in self.scores.get(scheme, {}).values()]

    def seeds_learned(self, scheme: str) -> tuple[int, int]:
        """(seeds at or above the in-distribution bar, seeds)."""
        accs = self.id_acc(scheme)
        return sum(a is not None and a >= self.bar for a in accs), len(accs)

    def learned(self, scheme: str) -> bool:
        """Every seed at or above the in-distribution bar."""
        k, n = self.seeds_learned(scheme)
        return 0 < k == n

    def curve(self, scheme: str, seed: int, test: str = "gap") -> dict[int, float]:
        s = self.scores[scheme][seed]
        return {b: s.acc(test, bucket=b)[0] for b in s.buckets(test)}

    def horizons(self, scheme: str) -> list[int | None]:
        """Per seed (seed order): the horizon in tokens at the run's tolerance, None below the first bucket; the
        censoring is in :meth:`horizon_data`."""
        return [h.value for h in self.horizon_data(scheme)]

    def horizon_data(self, scheme: str, tol: float | None = None) -> list[Horizon]:
        """Per seed (seed order): the :class:`Horizon` at tolerance ``tol`` (a fraction; None: the run's)."""
        tol = self.tol if tol is None else tol
        return [
            horizon_of(self.curve(scheme, seed), s.acc("id", self.L0)[0], tol, seed)
            for seed, s in self.scores[scheme].items()
        ]

    def half_chance_horizons(self, scheme: str) -> list[Horizon]:
        """Per seed: :func:`half_chance_horizon` against the task's chance."""
        return [
            half_chance_horizon(self.curve(scheme, seed), s.acc("id", self.L0)[0], self.chance, seed)
            for seed, s in self.scores[scheme].items()
        ]

    def pooled_horizon(self, scheme: str, weighting: str = "mean", tol: float | None = None) -> Horizon:
        """One :class:`Horizon` (seed None) of the buckets pooled over seeds: each bucket's and id's accuracy the
        plain mean over the seeds that have it (``weighting="mean"``) or their correct answers over their answers
        (``"answers"``); tolerance ``tol`` (None: the run's). PosencError for another weighting."""
        if weighting not in ("mean", "answers"):
            raise PosencError(f"pooled horizon: weighting must be 'mean' or 'answers', got {weighting!r}")
        runs = list(self.scores[scheme].values())

        def pool(test: str, length: int | None = None, b: int | None = None) -> float:
            cells = [(a, n) for a, n in (s.acc(test, length, b) for s in runs) if a is not None]
            if weighting == "mean":
                return float(np.mean([a for a, _ in cells]))
            return sum(a * n for a, n in cells) / sum(n for _, n in cells)

        buckets = sorted({b for s in runs for b in s.buckets("gap")})
        curve = {b: pool("gap", None, b) for b in buckets}
        return horizon_of(curve, pool("id", self.L0), self.tol if tol is None else tol)

    def censored(self, scheme: str) -> list[bool]:
        """Per seed: the horizon is the largest distance probed (the true one may lie beyond)."""
        return [h.censored for h in self.horizon_data(scheme)]

    def values(
        self, scheme: str, test: str, length: int | None = None, bucket: int | None = None
    ) -> tuple[list[float], float]:
        """(accuracy per seed, the largest binomial standard error among them)."""
        pairs = [s.acc(test, length, bucket) for s in self.scores[scheme].values()]
        pairs = [(a, n) for a, n in pairs if a is not None]
        return [a for a, _ in pairs], max((standard_error(a, n) for a, n in pairs), default=float("nan"))


def pct_cell(values: list[float]) -> str:
    """Accuracies (fractions) over seeds as a percent cell (``posenc.reports.render.seed_cell``); "" without any."""
    return seed_cell([100 * x for x in values], PCT) if values else ""


def horizon_text(h: Horizon | int | None) -> str:
    """One horizon's text: "1,024" (thousands separators), "≥ 4,096" (a censored :class:`Horizon`), "none" (no
    bucket within the rule)."""
    value = h.value if isinstance(h, Horizon) else h
    if value is None:
        return "none"
    return f"≥ {value:,}" if isinstance(h, Horizon) and h.censored else f"{value:,}"


def _order(h: Horizon | int | None) -> tuple[int, bool]:
    return (horizon_value(h), isinstance(h, Horizon) and h.censored)


def horizon_cell(values: list[Horizon] | list[int | None]) -> str:
    """Horizons over seeds (:class:`Horizon`, or ints and None without censoring) as one cell: the text
    (:func:`horizon_text`) when every seed shows the same, else the median (the lower middle seed for an even count)
    and the range, "64 (range 32 to 128)", with "≥ X on k of n seeds" when some but not all are censored; "" for
    none."""
    if not values:
        return ""
    shown = [horizon_text(h) for h in values]
    if len(set(shown)) == 1:
        return shown[0]
    ordered = sorted(values, key=_order)
    cell = f"{horizon_text(ordered[(len(ordered) - 1) // 2])} (range {shown_lo(ordered)} to {horizon_text(ordered[-1])}"
    k = sum(isinstance(h, Horizon) and h.censored for h in values)
    if 0 < k < len(values):
        cell += f"; {horizon_text(ordered[-1])} on {k} of {len(values)} seeds"
    return cell + ")"


def shown_lo(ordered: list[Horizon] | list[int | None]) -> str:
    """The text of the lowest of horizons sorted by :func:`_order`."""
    return horizon_text(ordered[0])


def horizon_value(h: Horizon | int | None) -> int:
    """A horizon as a number of tokens (int): its value, 0 for none; a censored one gives its lower bound."""
    if isinstance(h, Horizon):
        return h.lower
    return 0 if h is None else h


# ---------------------------------------------------------------- claims


def read_text_results(run_dir: Path) -> list[Ppl]:
    """Perplexity records of a text comparison directory (``posenc.store.records.load_ppl``); [] when it has no
    results."""
    return load_ppl(run_dir) or []


def budget(record: Task, chance: float) -> str:
    """What a job's learning curve (``Task.loss_curve``) says about the budget that would decide a claim it did not
    learn for: the training loss still falling at the step cap (``posenc.train.curves.loss_trend``, the rule
    ``train.until.extend_to`` trains on by): more steps; flat at chance (AT_CHANCE x -ln ``chance``): a plateau the
    rule does not extend, so whether more steps help is untested (a plateau at chance can break late), or another
    learning rate or head count; flat below chance (learned part of the task): another
    setting. "no loss curve in the records" when the record keeps fewer than 4
    logged steps (records before ``Task.loss_curve``)."""
    curve = record.loss_curve or []
    trend = loss_trend(curve)
    if trend is None:
        return "no loss curve in the records"
    cap, late = record.trained_steps or curve[-1][0], trend.late
    chance_loss = -math.log(chance)
    if trend.falling:
        return f"{trend.falling_at(cap)}: more steps"
    if late >= AT_CHANCE * chance_loss:
        return (
            f"loss flat at chance at the step cap {cap} ({late:.3f}; ln {1 / chance:g} = {chance_loss:.3f}): "
            "a plateau, not extended (the rule extends a falling loss): more steps untested, or another learning "
            "rate or head count"
        )
    return (
        f"loss flat at {late:.3f} at the step cap {cap} (chance {chance_loss:.3f}): "
        "another setting (learning rate, heads), not more steps"
    )


def not_learned(t: TaskTable, schemes: list[str]) -> str:
    """Why a claim over ``schemes`` is undecided: each of them that did not learn, the seeds below the bar with their
    in-distribution accuracy, grouped by what each job's learning curve says (:func:`budget`)."""
    parts = []
    for s in schemes:
        if s not in t.scores or t.learned(s):
            continue
        low: dict[str, list[tuple[int, float]]] = {}
        for seed, scores in sorted(t.scores[s].items()):
            acc = scores.acc("id", t.L0)[0]
            if acc is None or acc < t.bar:
                low.setdefault(budget(t.records[(s, seed)], t.chance), []).append((seed, acc or 0.0))
        parts.append(
            f"{s} did not learn on "
            + "; ".join(
                f"seed{'s' * (len(v) > 1)} {', '.join(str(seed) for seed, _ in v)} "
                f"(id {' / '.join(number(100 * a, PCT) for _, a in v)}% "
                f"< {100 * t.bar:.0f}%: {why})"
                for why, v in low.items()
            )
        )
    return "; ".join(parts)


# ---------------------------------------------------------------- tables and plots


def _seeds_learned(t: TaskTable, s: str) -> str:
    """ "" when no seed or every seed learned, else "(k of n seeds learned)": a scheme that learns on some
    seeds only has still not learned the task at this budget, but it is not the same as never."""
    k, n = t.seeds_learned(s)
    return f" ({k} of {n} seeds learned)" if 0 < k < n else ""


def _status(t: TaskTable, s: str) -> str:
    return "yes" if t.learned(s) else "**did not learn**" + _seeds_learned(t, s)


# the tests scored by sequence length, in the order of the accuracy table's columns and of length-TASK.png's panels:
# one list for both, so the plot shows every test its table does
LENGTH_TESTS = ("id", "sparse", "dense", "near")


def length_tests(t: TaskTable, schemes: list[str]) -> list[str]:
    """The tests of :data:`LENGTH_TESTS` the first scheme's first seed was scored on, in that order."""
    first = next(iter(t.scores[schemes[0]].values()))
    return [test for test in LENGTH_TESTS if first.lengths(test)]


def accuracy_markdown(t: TaskTable, schemes: list[str]) -> str:
    first = next(iter(t.scores[schemes[0]].values()))
    cols = [(test, L) for test in length_tests(t, schemes) for L in first.lengths(test)]
    header = ["scheme", "learned"] + [f"{test} {L // t.L0 if L % t.L0 == 0 else L / t.L0:g}x" for test, L in cols]
    rows = [[s, _status(t, s)] + [pct_cell(t.values(s, test, L)[0]) for test, L in cols] for s in schemes]
    counts = [f"{test} {L}: {first.acc(test, L)[1]}" for test, L in cols]
    return markdown_table(header, rows) + f"\n\nAnswers per cell (one seed): {', '.join(counts)}."


def distance_markdown(t: TaskTable, schemes: list[str], quantities: dict[str, dict[str, float | None]]) -> str:
    """The distance table: each scheme's id accuracy, its controlled-gap accuracy per evidence-distance bucket and its
    horizon; a column per quantity ({label: {scheme: tokens}}, ``posenc.reports.claims.Quantity``) after the scheme."""
    first = next(iter(t.scores[schemes[0]].values()))
    buckets = first.buckets("gap")
    header = ["scheme", *quantities, "id 1x"] + [f"{b:,}" for b in buckets] + ["horizon"]  # tokens, as horizons read
    rows = []
    for s in schemes:
        values = [v.get(s) for v in quantities.values()]
        rows.append(
            [s, *("" if v is None else f"{v:.0f}" for v in values), pct_cell(t.id_acc(s))]
            + [pct_cell(t.values(s, "gap", bucket=b)[0]) for b in buckets]
            + [horizon_cell(t.horizon_data(s)) if t.learned(s) else "no verdict (did not learn)" + _seeds_learned(t, s)]
        )
    counts = ", ".join(f"{b:,}: {bucket_counts(t, schemes, b)}" for b in buckets)
    return (
        markdown_table(header, rows)
        + "\n\nAnswers per distance bucket (the fewest and most over the schemes and seeds) and, in brackets, the "
        "largest standard error among them (points; the accuracy moved toward 1/2 as (c + 2) / (n + 4), so that a "
        f"bucket all right is not read as exact): {counts}. Horizon: the median over seeds and the range; ≥ X: "
        "within the tolerance up to the longest bucket probed (right-censored); none: the first bucket already "
        "falls short."
    )


def bucket_counts(t: TaskTable, schemes: list[str], b: int) -> str:
    """A gap bucket's answers over ``schemes`` and their seeds ("625" or "68-625") and its largest
    :func:`posenc.eval.tasks.bucket_error` in points, "(2.0)"."""
    pairs = [s.acc("gap", bucket=b) for x in schemes for s in t.scores[x].values()]
    pairs = [(a, n) for a, n in pairs if n]
    ns = sorted(n for _, n in pairs)
    span = f"{ns[0]:,}" if ns[0] == ns[-1] else f"{ns[0]:,}-{ns[-1]:,}"
    return f"{span} ({100 * max(bucket_error(n, a * n) for a, n in pairs):.1f})"


def criterion_markdown(t: TaskTable, schemes: list[str]) -> str:
    """Steps to criterion (``train.until``) per scheme: each seed's step, or "not reached (N steps)" at the cap, and
    the mean over the seeds that reached it."""
    rows = []
    for s in schemes:
        runs = [t.criterion[(s, seed)] for seed in sorted(t.scores[s]) if (s, seed) in t.criterion]
        reached = [step for _, step, _ in runs if step is not None]
        shown = [str(step) if step is not None else f"not reached ({trained} steps)" for _, step, trained in runs]
        rows.append(
            [
                s,
                " / ".join(shown),
                f"{np.mean(reached):.0f}" if reached else "not reached",
                f"{len(reached)} of {len(runs)}",
            ]
        )
    what = "; ".join(sorted({c for c, _, _ in t.criterion.values()}))
    return (
        markdown_table(["scheme", "steps (each seed)", "mean over seeds that reached it", "reached"], rows)
        + f"\n\nCriterion: {what}."
    )


def reference_markdown(t: TaskTable, ref: dict) -> str:
    """Our error (%) at the training length beside a published table ``ref`` ({source, tests, rows})."""
    tests = ref["tests"]
    header = ["scheme"] + [f"{test} (ours)" for test in tests] + [f"{test} ({ref['source']})" for test in tests]
    rows = []
    for s, theirs in ref["rows"].items():
        if s in t.scores:
            ours = [pct_cell([1 - a for a in t.values(s, test, t.L0)[0]]) for test in tests]
            rows.append([s] + ours + [f"{v:g}" for v in theirs])
    return markdown_table(header, rows)


NOT_LEARNED_LS = ":"  # distance plot: the curve of a scheme that did not learn
LINE_STYLES = {"-.": "dash-dot", "--": "dashed", ":": "dotted", "-": "solid"}  # the legend's words for a line style


def quantity_label(q: Quantity) -> str:
    """The distance plot's legend entry for the lines of quantity ``q``."""
    return f"{q.legend} ({LINE_STYLES.get(q.ls, q.ls)}, in the scheme's colour)"


def distance_figure(
    t: TaskTable, schemes: list[str], quantities: dict[Quantity, dict[str, float | None]], chance: float
):
    """The figure of ``distance-TASK.png``: each scheme's controlled-gap accuracy (mean over seeds) against evidence
    distance (log axis); a scheme that did not learn is dotted, each quantity's value ({Quantity: {scheme: tokens}},
    where known) a vertical line in the scheme's colour and the quantity's line style (one legend entry per quantity),
    the training length dashed black, chance grey. Identical curves stay visible
    (``posenc.reports.render.plot_lines``)."""
    from matplotlib.lines import Line2D

    fig, ax = figure(figsize=(9.5, 4.5))
    colors = {s: f"C{i % 10}" for i, s in enumerate(schemes)}
    lines = []
    for s in schemes:
        curves = [t.curve(s, seed) for seed in t.scores[s]]
        buckets = sorted(curves[0])
        lines.append(
            {
                "label": s + ("" if t.learned(s) else " (did not learn: dotted)"),
                "x": buckets,
                "y": [100 * np.mean([c[b] for c in curves if b in c]) for b in buckets],
                "ms": 4,
                "color": colors[s],
                "ls": "-" if t.learned(s) else NOT_LEARNED_LS,
            }
        )
    plot_lines(ax, lines)
    for q, values in quantities.items():
        for s in schemes:
            if values.get(s):
                ax.axvline(values[s], color=colors[s], ls=q.ls, lw=1)
    ax.axvline(t.L0, color="black", ls="--", lw=1, label=f"training length {t.L0}")
    ax.axhline(100 * chance, color="grey", lw=1, label="chance")
    handles, labels = ax.get_legend_handles_labels()
    for q, values in quantities.items():  # one entry per quantity: grey, as each line has its scheme's colour
        if any(values.get(s) for s in schemes):
            handles.append(Line2D([], [], color="grey", ls=q.ls, lw=1))
            labels.append(quantity_label(q))
    log_scale(ax, "x", base=2)
    ax.set_xlabel("evidence distance (tokens)")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(
        f"{t.task}: controlled-gap test", loc="left"
    )  # a long task spec runs over the legend, not off the edge
    ax.legend(handles, labels, fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_distance(
    path: Path, t: TaskTable, schemes: list[str], quantities: dict[Quantity, dict[str, float | None]], chance: float
) -> None:
    """``path``: :func:`distance_figure` as PNG."""
    save_figure(distance_figure(t, schemes, quantities, chance), path)


def length_figure(t: TaskTable, schemes: list[str], chance: float):
    """The figure of ``length-TASK.png``: accuracy (mean over seeds) against sequence length, one panel per test the
    accuracy table shows (:func:`length_tests`: id, sparse, dense, near, those run); the training length dashed,
    chance grey; identical curves stay visible."""
    tests = length_tests(t, schemes)
    fig, axes = figure(1, len(tests), figsize=(4.5 * len(tests), 4 + 0.18 * ((len(schemes) + 1) // 2)), squeeze=False)
    for ax, test in zip(axes[0], tests):
        lines = []
        for i, s in enumerate(schemes):
            lengths = next(iter(t.scores[s].values())).lengths(test)
            lines.append(
                {
                    "label": s,
                    "x": lengths,
                    "y": [100 * np.mean(t.values(s, test, L)[0]) for L in lengths],
                    "ms": 4,
                    "color": f"C{i % 10}",
                }
            )
        plot_lines(ax, lines)
        ax.axvline(t.L0, color="black", ls="--", lw=1)
        ax.axhline(100 * chance, color="grey", lw=1)
        log_scale(ax, "x", base=2)
        ax.set_xlabel("sequence length (tokens)")
        ax.set_ylabel("accuracy (%)")
        ax.set_title(f"{t.task}: {test}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(
            fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.2)
        )  # below: per panel, its own repeats
    fig.tight_layout()
    return fig


def plot_length(path: Path, t: TaskTable, schemes: list[str], chance: float) -> None:
    """``path``: :func:`length_figure` as PNG."""
    save_figure(length_figure(t, schemes, chance), path)


def write_csv(path: Path, records: list[Task]) -> None:
    """retrieval.csv: one row per cell of each job, with the job's training length and steps
    (``posenc.store.records.load_task_csv`` reads it back)."""
    header = [
        "task",
        "scheme",
        "seed",
        "test",
        "length",
        "bucket",
        "answers",
        "correct",
        "accuracy",
        "nll_mean",
        "train_length",
        "trained_steps",
        "criterion_step",
        "encoding",
    ]
    write_csv_table(
        path,
        header,
        (
            [
                r.task,
                r.scheme,
                r.seed,
                c.test,
                c.length,
                c.bucket,
                c.n,
                c.correct,
                f"{c.correct / c.n:.4f}",
                f"{c.nll / c.n:.4f}",
                r.train_length,
                r.trained_steps,
                r.criterion_step,
                r.encoding,
            ]
            for r in records
            for c in r.cells
        ),
    )


def _times_line(seconds: list[tuple[float, float]]) -> str:
    """Training and evaluation time ranges over the jobs that recorded them (records rebuilt from a CSV keep none:
    NaN)."""
    timed = [v for v in seconds if not any(math.isnan(x) for x in v)]
    if not timed:
        return "Training and evaluation times were not recorded."
    of = f" ({len(timed)} of {len(seconds)} jobs recorded their times)" if len(timed) < len(seconds) else ""
    return (
        f"Training time per job: {min(v[0] for v in timed):.0f}-{max(v[0] for v in timed):.0f} s; "
        f"evaluation {min(v[1] for v in timed):.0f}-{max(v[1] for v in timed):.0f} s{of}."
    )


def write_task_report(run_dir: Path, meta: dict, failures: dict[str, str] | None = None) -> Path:
    """report.md, retrieval.csv and two plots per task (distance-*.png, length-*.png); returns report.md's path."""
    run_dir = Path(run_dir)
    records = [r for r in load(run_dir / "results.jsonl") if isinstance(r, Task)]
    write_csv(run_dir / "retrieval.csv", records)
    meta = {**meta, "seeds": sorted({r.seed for r in records}) or meta["seeds"]}  # the records' (reruns add seeds)
    ev, L0, values = meta["eval"], meta["train_length"], meta.get("quantities") or {}
    registered = {q.label: q for q in claims.quantities() if q.label in values}
    text = meta.get("text_results")
    text_records = read_text_results(Path(text)) if text else []
    st = meta["stamp"]
    lines = [
        f"# posenc retrieval: {meta['name']}",
        "",
        f"- model: {meta['model']}",
        f"- budget: {meta['budget']}",
        f"- seeds: {meta['seeds']}",
        f"- evaluation: whole batches per cell until >= {ev['answers']} answers (or >= {ev['max_tokens']} tokens"
        + (f", or every bucket's standard error <= {100 * ev['se']:g} points" if ev.get("se") else "")
        + f"), lengths {ev['multiples']} x {L0}; "
        f"learned: id accuracy >= {100 * ev['learned']:.0f}%; "
        f"horizon: accuracy within {100 * ev['horizon_tol']:.0f} points of id",
        f"- run: {stamp_line(st)} (each invocation: `invocations.jsonl`; each job's threads: its record)",
        *([f"- wall time: {meta['wall']}"] if meta.get("wall") else []),
        *([f"- models: {meta['trained']}"] if meta.get("trained") else []),
        f"- noise: a comparison is over seeds ({len(meta['seeds'])}) "
        "plus two binomial standard errors of the test sets; "
        + (
            "one seed does not measure training noise (thread count changes learned schemes' weights)"
            if len(meta["seeds"]) == 1
            else "the seed range is the training noise"
        ),
        "",
    ]
    if meta.get("notes"):
        lines += [meta["notes"], ""]
    lines += (
        meta.get("sweep") or []
    )  # posenc.jobs.sweep.sweep_markdown: each scheme's chosen setting and the sensitivity table
    checked = []
    # every task the run holds: a task added by an earlier invocation (--tasks X, then --tasks Y) keeps its section
    tasks = {**meta["tasks"], **{r.task: get_task(r.task).describe() for r in records if r.task not in meta["tasks"]}}
    for task, desc in tasks.items():
        t = TaskTable(records, task, L0, ev["horizon_tol"], ev["learned"], meta.get("n_head"))
        schemes = list(t.scores)
        trained = {label: t.trained_values(values[label]) for label in registered}
        lines += [f"## {task}", "", f"{desc}", ""]
        if not schemes:
            lines += ["No results yet.", ""]
            continue
        lines += ["### Accuracy (%) by test and sequence length", "", accuracy_markdown(t, schemes), ""]
        lines += [
            "### Accuracy (%) by evidence distance (controlled-gap test) and retrieval horizon",
            "",
            distance_markdown(t, schemes, trained),
            "",
        ]
        if t.criterion:
            lines += [
                "### Steps to criterion",
                "",
                criterion_markdown(t, [s for s in schemes if any(k[0] == s for k in t.criterion)]),
                "",
            ]
        lines += [_times_line(list(t.seconds.values())), ""]
        ref = meta.get("reference")
        if ref and ref.get("task", "flipflop") == task.partition(":")[0]:
            lines += [
                f"### Error (%) at the training length beside {ref['source']}",
                "",
                reference_markdown(t, ref),
                "",
            ]
            if ref.get("note"):
                lines += [ref["note"], ""]
        chance = get_task(task).chance
        lines_at = {q: trained[label] for label, q in registered.items()}
        plot_distance(run_dir / f"distance-{slug(task)}.png", t, schemes, lines_at, chance)
        plot_length(run_dir / f"length-{slug(task)}.png", t, schemes, chance)
        checked += claims.task_claims(t, {**meta, "quantities": trained}, text_records)
    if checked:
        lines += [
            "## Claims",
            "",
            claims.claims_table(checked),
            "",
        ]
    elif records and claims.claim_sets():
        lines += ["## Claims", "", "No claim applies: each compares schemes this run did not train.", ""]
    if text and not text_records:
        lines += [f"(The text comparison the claims read, {text} (results.jsonl or results.csv): not found.)", ""]
    if failures:
        lines += ["## Failed jobs", ""] + [f"- {k}: {v}" for k, v in failures.items()] + [""]
    path = run_dir / "report.md"
    atomic_write_bytes(path, "\n".join(lines).encode())
    return path
