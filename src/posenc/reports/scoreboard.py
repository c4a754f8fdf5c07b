"""One scoreboard: the table a user reads to choose a scheme, generated from a comparison's records (issue 36).

For each scheme: perplexity at the training length and the ratios at the lengths the text claims read (16x and
128x: :data:`CLAIMED`) of the text comparisons (``posenc compare``, e.g. ``results/default``; a later one adds its
schemes beside the first's), those of them the first evaluated,
else its longest (:func:`shown_multiples`), then for each task of the task comparisons (``posenc compare --preset
retrieval`` / ``state-tracking``) its retrieval horizon and, where the records have ``criterion_step``
(``train.until``), its steps to criterion. Every number is its mean ± half-range over the seeds
(``posenc.reports.render.seed_cell``), except a horizon: its median and range, censored at the longest probe
(``posenc.reports.tasks.horizon_cell``, as report.md shows it); a scheme that did not learn a task on every seed
shows "did not learn" (and on how many seeds it did) instead of a horizon (``posenc.reports.tasks``: in-distribution
accuracy below the run's ``task_eval.learned``); a cell is empty where the scheme was not run. Schemes are matched
across runs by spec (``posenc.encodings.canonical``), each named as first seen (the text run, then each task
run). The README's scoreboard block is this table for the committed results (``posenc report results/retrieval
results/state-tracking results/default results/catalogue-iv-text --readme README.md`` writes it; a test checks they
agree).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pydantic import ValidationError

from posenc import encodings
from posenc.config.plan import Preset, TaskEvalConfig
from posenc.data.tasks import get_task
from posenc.errors import PosencError
from posenc.reports.claims import scheme_quantities, task_claims
from posenc.reports.render import PPL, RATIO, markdown_table, seed_cell
from posenc.reports.tasks import TaskTable
from posenc.reports.tasks import horizon_cell as horizons_cell
from posenc.store.checkpoint import atomic_write_bytes, read_json
from posenc.store.records import Task, load_tasks

BEGIN, END = "<!-- scoreboard:begin -->", "<!-- scoreboard:end -->"
CLAIMED = (16, 128)  # the lengths (x the training length) the text claims read: the ratio columns where evaluated


def shown_multiples(multiples) -> list[int]:
    """The ratio columns (ints, multiples of the training length) of runs that evaluated ``multiples`` (ints, 1x
    included or not): those of :data:`CLAIMED` among them, else the longest ([] with none beyond 1x), so a run evaluated
    to 8x shows its 8x ratio rather than empty 16x and 128x columns."""
    seen = sorted(set(multiples) - {1})
    return [m for m in CLAIMED if m in seen] or seen[-1:]


@dataclasses.dataclass
class TaskRun:
    """One task comparison as the scoreboard sees it: its records and the settings that judge them (``preset.json``'s
    ``task_eval``, head count and the registered sets' quantities, ``posenc.reports.claims.scheme_quantities``; without
    one, ``TaskEvalConfig``'s defaults and neither)."""

    path: Path
    label: str
    records: list[Task]
    horizon_tol: float
    learned: float
    n_head: int | None
    quantities: dict[str, dict[str, float | None]]  # {label: {spec: value}}
    source: str  # "preset.json" or "defaults"

    def tasks(self) -> list[str]:
        return list(dict.fromkeys(r.task for r in self.records))

    def table(self, task: str) -> TaskTable:
        mine = [r for r in self.records if r.task == task]
        lengths = {r.train_length for r in mine}
        if len(lengths) > 1:
            raise PosencError(
                f"{self.path} mixes training lengths {sorted(lengths)} on {task}: not one task comparison"
            )
        return TaskTable(mine, task, lengths.pop(), self.horizon_tol, self.learned, self.n_head)


def is_task_run(path: Path) -> bool:
    """Whether ``path`` holds task records (``posenc.store.records.load_tasks``): a task comparison, not a text one."""
    return bool(load_tasks(path))


def load_task_run(path: Path, label: str) -> TaskRun:
    """A task comparison directory's records and settings. Raises PosencError (one line) for a directory without
    task records."""
    path = Path(path)
    records = load_tasks(path)
    if not records:
        raise PosencError(f"{path} has no task records (results.jsonl or retrieval.csv): not a task comparison")
    ev, n_head, values, source = TaskEvalConfig(), None, {}, "defaults"
    if (path / "preset.json").exists():
        try:
            preset = Preset(**read_json(path / "preset.json"))
        except (ValidationError, TypeError):  # a preset of another release: the defaults judge its records
            preset = None
        if preset is not None:
            ev, n_head, source = preset.task_eval, preset.model.n_head, "preset.json"
            # with the records of schemes the preset no longer lists
            values = scheme_quantities(preset, {r.scheme for r in records})
    return TaskRun(path, label, records, ev.horizon_tol, ev.learned, n_head, values, source)


def task_label(task: str) -> str:
    """The column name of a task: flip-flop, gap-MQAR, parity (modsum at m=2), else the spec."""
    kind = task.partition(":")[0]
    if kind == "modsum":
        return "parity" if get_task(task).values["m"] == 2 else task
    return {"flipflop": "flip-flop", "mqar": "gap-MQAR"}.get(kind, task)


def _key(scheme: str):
    return encodings.canonical(scheme)


def horizon_cell(t: TaskTable, scheme: str) -> str:
    """A scheme's horizon over seeds as report.md shows it (``posenc.reports.tasks.horizon_cell``: the median and the
    range, "≥ X" right-censored at the longest bucket probed, "none" below the first), or "did not learn" (with "k of
    n seeds learned" when some did); then "(trained as <variant>)" when its jobs trained a sweep variant of it
    (``TaskTable.trained_as``), so a row joining runs says where its setting differs."""
    if not t.learned(scheme):
        k, n = t.seeds_learned(scheme)
        return "did not learn" + (f" ({k} of {n} seeds learned)" if k else "") + t.trained_as(scheme)
    return horizons_cell(t.horizon_data(scheme)) + t.trained_as(scheme)


def criterion_cell(t: TaskTable, scheme: str) -> str:
    """Steps to criterion over the seeds that met it (mean ± half-range, "(k of n seeds)" when not all did), "not
    reached (N steps)" when none did; empty when the records keep no criterion."""
    runs = [t.records[(scheme, seed)] for seed in sorted(t.scores[scheme])]
    if not any(r.criterion or r.criterion_step is not None for r in runs):
        return ""
    reached = [r.criterion_step for r in runs if r.criterion_step is not None]
    if not reached:
        return f"not reached ({max(r.trained_steps or 0 for r in runs)} steps)"
    return seed_cell(reached, ".0f") + (f" ({len(reached)} of {len(runs)} seeds)" if len(reached) < len(runs) else "")


def scoreboard_markdown(texts: list, task_runs: list[TaskRun]) -> str:
    """The scoreboard (see the module docstring) of the text runs ``texts`` (``posenc.reports.runs.Run``s, [] for
    none) and ``task_runs``. The text columns are the first text run's; a later text run adds its schemes that no
    earlier one holds as rows of their own, and its runs of a scheme an earlier one holds as a row named "scheme
    (run)" (a comparison of other schemes beside the default one, with shared references). A task in several task
    runs takes its columns from the first, and each later run's schemes on it get rows of their own, named
    "scheme (run)" (runs of one task side by side: plain against randomized positions, say). PosencError for text
    runs of different training lengths. Returns markdown: the table, then the sources."""
    text = texts[0] if texts else None
    if any(t.train_length != text.train_length for t in texts):
        raise PosencError(
            f"text runs of training lengths {sorted({t.train_length for t in texts})}: one scoreboard compares "
            "ratios at one training length"
        )
    tables: dict[str, tuple[TaskRun, TaskTable]] = {}
    later: list[tuple[TaskRun, str, TaskTable]] = []  # a task an earlier run holds: its rows are labelled by run
    for run in task_runs:
        for task in run.tasks():
            if task in tables:
                later.append((run, task, run.table(task)))
            else:
                tables[task] = (run, run.table(task))
    names: dict = {}  # spec key -> (the scheme's name as first seen: the text runs, then each task run; its text run)
    relabelled: list[tuple[str, object]] = []  # (row name, text run) of a scheme an earlier text run holds
    for run in texts:
        for scheme in dict.fromkeys(r.scheme for r in run.records):
            if _key(scheme) not in names:
                names[_key(scheme)] = (scheme, run)
            elif names[_key(scheme)][1] is not run:
                relabelled.append((scheme, run))
    for _, t in tables.values():
        for s in t.scores:
            names.setdefault(_key(s), (s, text))
    labels = [task_label(task) for task in tables]
    labels = [lb if labels.count(lb) == 1 else task for lb, task in zip(labels, tables)]
    steps = [
        task
        for task, (_, t) in [*tables.items(), *((task, (run, t)) for run, task, t in later)]
        if any(r.criterion or r.criterion_step is not None for r in t.records.values())
    ]
    steps = list(dict.fromkeys(steps))
    shown = (
        shown_multiples(
            r.eval_length // text.train_length for r in text.records if r.eval_length % text.train_length == 0
        )
        if text
        else []
    )

    def text_cells(run, key) -> list[str]:
        mine = [r for r in run.records if _key(r.scheme) == key] if run else []
        if not text:
            return []
        if not mine:
            return [""] * (1 + len(shown))
        cells = [seed_cell([r.ppl for r in mine if r.eval_length == text.train_length], PPL)]
        return cells + [
            seed_cell([r.ratio for r in mine if r.eval_length == m * text.train_length], RATIO) for m in shown
        ]

    head = ["scheme"] + (["ppl at 1x", *(f"ratio at {m}x" for m in shown)] if text else [])
    head += [f"{lb} horizon" for lb in labels] + [
        f"{labels[list(tables).index(task)]} steps to criterion" for task in steps
    ]
    rows = []
    for key, (name, run) in names.items():
        row = [name, *text_cells(run, key)]
        cells = {task: next((s for s in t.scores if _key(s) == key), None) for task, (_, t) in tables.items()}
        row += [horizon_cell(tables[task][1], s) if s else "" for task, s in cells.items()]
        row += [criterion_cell(tables[task][1], cells[task]) if cells[task] else "" for task in steps]
        rows.append(row)
    empty_tasks = [""] * (len(tables) + len(steps))
    rows += [[f"{scheme} ({run.label})", *text_cells(run, _key(scheme)), *empty_tasks] for scheme, run in relabelled]
    blank = [""] * (1 + len(shown)) if text else []
    for run in task_runs:  # one row per scheme of a later run, its tasks side by side
        mine = {task: t for r, task, t in later if r is run}
        for s in dict.fromkeys(s for t in mine.values() for s in t.scores):
            held = {task for task, t in mine.items() if s in t.scores}
            row = [f"{s} ({run.label})", *blank]
            row += [horizon_cell(mine[task], s) if task in held else "" for task in tables]
            row += [criterion_cell(mine[task], s) if task in held else "" for task in steps]
            rows.append(row)
    sources = [
        f"text: `{t.label}` (ppl at the training length {t.train_length}; ratio: ppl at the length over it)"
        for t in texts
    ]
    sources += [
        f"{', '.join(task_label(task) for task in run.tasks())}: `{run.label}` "
        f"(learned: id accuracy >= {100 * run.learned:.0f}%; "
        f"horizon: the largest gap bucket within {100 * run.horizon_tol:.0f} points of id; settings from {run.source})"
        for run in task_runs
    ]
    return (
        markdown_table(head, rows)
        + "\n\nMean ± half-range over seeds, except horizons: in tokens, the median over seeds (the lower middle "
        "one for an even count) and the range when the seeds differ; ≥ X: within the tolerance up to the longest "
        "gap bucket probed (right-censored, never averaged); none: the first gap bucket already falls short of id by "
        "more than the tolerance, however flat its accuracy beyond; steps to "
        'criterion: over the seeds that met it ("k of n seeds" when not all did), "not reached (N steps)" when '
        "none met it by the step cap N, "
        "empty when the records keep no criterion (a retrieval.csv alone) or not run; other cells empty: not run. "
        "Sources: " + "; ".join(sources) + ".\n"
    )


def task_claims_markdown(text, task_runs: list[TaskRun]) -> str:
    """The registered claim sets' task claims (``posenc.reports.claims.task_claims``) of every task of ``task_runs``,
    read against the text run ``text`` (None: the claims that need one are omitted)."""
    rows = []
    for run in task_runs:
        for task in run.tasks():
            t = run.table(task)
            meta = {"quantities": {q: t.trained_values(v) for q, v in run.quantities.items()}}
            for c in task_claims(t, meta, text.records if text else []):
                rows.append([run.label, f"({c.key}) {c.text}", f"**{c.verdict}**", c.evidence])
    if not rows:
        return ""
    return "\n## Task claims\n\n" + markdown_table(["run", "claim", "verdict", "numbers"], rows) + "\n"


def write_readme_block(path: Path, block: str) -> None:
    """Replace what lies between BEGIN and END in the file ``path`` by ``block`` (atomic). Raises PosencError when
    the file is missing, a directory, not UTF-8 text or lacks either marker."""
    path = Path(path)
    if not path.is_file():
        what = "a directory, not a file," if path.is_dir() else "no such file"
        raise PosencError(f"{path}: {what} to write the scoreboard into")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise PosencError(f"{path} is not UTF-8 text: no README to write the scoreboard into") from None
    if BEGIN not in text or END not in text.partition(BEGIN)[2]:
        raise PosencError(f"{path} has no {BEGIN} ... {END} block to write the scoreboard into")
    before, _, rest = text.partition(BEGIN)
    atomic_write_bytes(path, f"{before}{BEGIN}\n{block}{END}{rest.partition(END)[2]}".encode())


def readme_block(path: Path) -> str:
    """What lies between BEGIN and END in the file ``path`` (after BEGIN's line end); "" without the block."""
    text = Path(path).read_text(encoding="utf-8")
    if BEGIN not in text:
        return ""
    return text.partition(BEGIN)[2].partition(END)[0].removeprefix("\n")
