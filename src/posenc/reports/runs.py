"""Compare runs side by side: the job behind ``posenc report RUN_DIR...``.

Each run is a ``posenc compare`` directory: its perplexity records come from ``results.jsonl``,
or from ``results.csv`` where there is no JSONL (the committed ``results/*`` keep only the CSV).
Schemes are matched by spec (``acc-rand-qk`` and ``acc-rand-qk:a=1`` are one scheme: aliases and
constructor defaults resolved), ratios are each run's own (perplexity over that run's perplexity at
its training length). Runs made with other settings are labelled, not refused: their settings come
from ``preset.json`` where present, else from the header of ``report.md``.

``write_runs_report(paths, out)`` writes ``report.md`` (the runs and how their settings differ, one
table of perplexity at 1x and ratios per scheme and run, the claims of each run) and
``ppl_ratio.png`` (every run's ratio curves overlaid: colour per scheme, line style per run).
Task comparisons (``posenc compare --preset retrieval``; records in ``results.jsonl`` or ``retrieval.csv``)
may be given beside them: the report then opens with the scoreboard (``posenc.reports.scoreboard``: the first
text run's perplexity and ratios beside each task's horizon and steps to criterion) and closes with the
task claims (R1 against the first text run).
"""

from __future__ import annotations

import dataclasses
import io
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from posenc import encodings
from posenc.config.plan import FREE_SETTINGS, Preset, flatten, settings
from posenc.errors import PosencError
from posenc.reports.claims import claim_sets
from posenc.reports.render import (
    PPL,
    RATIO,
    figure,
    legend,
    log_scale,
    markdown_table,
    plot_lines,
    save_figure,
    seed_cell,
)
from posenc.reports.scoreboard import TaskRun, is_task_run, load_task_run, scoreboard_markdown, task_claims_markdown
from posenc.reports.text import with_ratios
from posenc.store.checkpoint import atomic_write_bytes, read_json
from posenc.store.lock import open_run_dir
from posenc.store.records import Ppl, load_ppl

HEADER_KEYS = ("corpus", "tokenizer", "model", "budget", "eval")  # report.md header lines that describe the settings
STYLES = [
    ("-", "o"),
    ("--", "s"),
    (":", "^"),
    ("-.", "D"),
]  # per run: line style and marker (a short legend line hides a dash)


@dataclasses.dataclass
class Run:
    """One compare run as the report sees it: ``records`` are its perplexity records (with ``ratio``)."""

    path: Path
    label: str
    records: list[Ppl]
    train_length: int
    settings: dict[str, Any]  # flat: preset.json's shared settings, or report.md's header lines
    source: str  # where the settings came from: "preset.json", "report.md" or "none"
    header: dict[str, str]  # report.md's header lines (empty without one): what runs of either source share


def _header(path: Path) -> dict[str, str]:
    """The settings lines of a run's report.md header (corpus, tokenizer, model, budget, eval); {} without one."""
    if not (path / "report.md").exists():
        return {}
    lines = re.findall(r"^- \*\*(\w+)\*\*: (.*)$", (path / "report.md").read_text(encoding="utf-8"), re.M)
    return {k: v.strip() for k, v in lines if k in HEADER_KEYS}


def _settings(path: Path, header: dict[str, str]) -> tuple[dict[str, Any], str]:
    """(flat settings, source) of a run directory: preset.json's, else its report.md ``header``, else none."""
    if (path / "preset.json").exists():
        raw = read_json(path / "preset.json")
        try:
            return settings(Preset(**raw)), "preset.json"
        except (ValidationError, TypeError):  # a preset of another release: its sections as they are
            flat = flatten({k: raw.get(k) for k in ("model", "train", "eval") if isinstance(raw.get(k), dict)}, "")
            return {k: v for k, v in flat.items() if k not in FREE_SETTINGS}, "preset.json"
    return (header, "report.md") if header else ({}, "none")


def load_run(path: Path, label: str | None = None) -> Run:
    """A compare run directory's perplexity records and settings. Raises PosencError (one line) for a
    directory without results.jsonl or results.csv, or without perplexity records."""
    path = Path(path)
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "does not exist"
        raise PosencError(f"{path} {what} (give posenc compare run directories)")
    records = load_ppl(path)
    if records is None:
        raise PosencError(f"{path} has no results.jsonl or results.csv: not a posenc compare run")
    if not records:
        raise PosencError(f"{path} has no perplexity records and no task records: not a posenc compare run")
    lengths = {r.train_length for r in records}
    if len(lengths) > 1:
        raise PosencError(f"{path} mixes training lengths {sorted(lengths)}: not one compare run")
    header = _header(path)
    found, source = _settings(path, header)
    return Run(path, label or path.name, with_ratios(records), lengths.pop(), found, source, header)


def _labels(paths: list[Path]) -> list[str]:
    """Directory names, with parents added until they are distinct."""
    paths = [Path(p).resolve() for p in paths]
    for depth in range(1, max(len(p.parts) for p in paths) + 1):
        labels = ["/".join(p.parts[-depth:]) for p in paths]
        if len(set(labels)) == len(labels):
            return labels
    twice = next(str(p) for p in paths if paths.count(p) > 1)
    raise PosencError(f"run directory {twice} is given twice")


def differences(base: Run, run: Run) -> str:
    """How ``run``'s settings differ from ``base``'s, as one phrase ("same settings" when they do not)."""
    if run.source == "none" or base.source == "none":
        return "settings unknown (no preset.json or report.md)"
    old, new = base.settings, run.settings
    if run.source != base.source:  # a run with preset.json against one without: compare their report headers
        if not (base.header and run.header):
            return f"settings not comparable ({run.label}: {run.source}, {base.label}: {base.source})"
        old, new = base.header, run.header
    keys = sorted(set(old) | set(new))
    diff = [f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in keys if old.get(k) != new.get(k)]
    return "other settings: " + "; ".join(diff) if diff else "same settings"


def seed_grid(run: Run, key: str) -> dict[str, dict[float, list[float]]]:
    """spec key -> evaluation length / training length -> values over seeds."""
    grid: dict = defaultdict(lambda: defaultdict(list))
    for r in run.records:
        grid[encodings.canonical(r.scheme)][r.eval_length / run.train_length].append(getattr(r, key))
    return grid


def schemes(runs: list[Run]) -> dict[str, str]:
    """spec key -> the scheme's name as the first run that has it spells it, in order of first appearance."""
    out: dict[str, str] = {}
    for run in runs:
        for r in run.records:
            out.setdefault(encodings.canonical(r.scheme), r.scheme)
    return out


def markdown(runs: list[Run], task_runs: list[TaskRun] = ()) -> str:
    """The side-by-side report (see the module docstring): with ``task_runs``, the scoreboard first and their claims
    last."""
    out = io.StringIO()
    out.write(f"# posenc report: {', '.join(run.label for run in [*task_runs, *runs])}\n\n")
    if task_runs:
        out.write("## Scoreboard\n\n" + scoreboard_markdown(list(runs), list(task_runs)) + "\n")
    if runs:
        out.write(text_markdown(runs))
    out.write(task_claims_markdown(runs[0] if runs else None, list(task_runs)))
    return out.getvalue()


def text_markdown(runs: list[Run]) -> str:
    """The text runs' sections: the runs and their settings, perplexity and ratios per scheme and run, the claims."""
    names = schemes(runs)
    multiples = sorted({r.eval_length / run.train_length for run in runs for r in run.records} - {1.0})
    ppl, ratio = [seed_grid(run, "ppl") for run in runs], [seed_grid(run, "ratio") for run in runs]
    out = io.StringIO()
    out.write("## Runs\n\n")
    rows = [
        [
            run.label,
            f"`{run.path}`",
            ", ".join(str(s) for s in sorted({r.seed for r in run.records})),
            run.train_length,
            run.source,
            "reference" if i == 0 else differences(runs[0], run),
        ]
        for i, run in enumerate(runs)
    ]
    out.write(
        markdown_table(["run", "directory", "seeds", "train length", "settings from", f"against {runs[0].label}"], rows)
        + "\n"
    )
    for run in runs:
        if run.source == "report.md":
            out.write(f"\n- **{run.label}**: " + "; ".join(f"{k}: {v}" for k, v in run.settings.items()) + "\n")
    out.write(
        "\n## Perplexity at the training length and ratios per scheme and run\n\n"
        "Ratio: perplexity at the length over the same run's perplexity at its training length (1x); "
        "mean ± half-range over the run's seeds.\n\n"
    )
    head = ["scheme", "run", "ppl at 1x", *(f"ratio {m:g}x" for m in multiples)]
    rows = []
    for key, name in names.items():
        for i, run in enumerate(runs):
            if key in ppl[i]:
                rows.append(
                    [
                        name,
                        run.label,
                        seed_cell(ppl[i][key].get(1.0, []), PPL),
                        *(seed_cell(ratio[i][key].get(m, []), RATIO) for m in multiples),
                    ]
                )
    out.write(
        markdown_table(head, rows)
        + "\n\n`ppl_ratio.png` overlays the ratio curves (colour: scheme, line style: run).\n"
    )
    out.write(claims_markdown(runs))
    return out.getvalue()


def claims_markdown(runs: list[Run]) -> str:
    """Each registered claim set's text claims (``posenc.reports.claims``) checked on each run: one table of verdicts
    per set, then each run's numbers."""
    return "".join(_claim_set_markdown(cs, runs) for cs in claim_sets() if cs.text)


def _claim_set_markdown(cs, runs: list[Run]) -> str:
    checked = [{c.key + c.text: c for c in cs.text(run.records, run.train_length)} for run in runs]
    claims = list(dict.fromkeys(k for per_run in checked for k in per_run))
    if not claims:
        return ""
    first = {k: next(per_run[k] for per_run in checked if k in per_run) for k in claims}
    out = (
        f"\n## {cs.title} on each run\n\n"
        + markdown_table(
            ["claim", *(run.label for run in runs)],
            [
                [
                    f"({first[k].key}) {first[k].text}",
                    *(per_run[k].verdict if k in per_run else "not run" for per_run in checked),
                ]
                for k in claims
            ],
        )
        + "\n"
    )
    for run, per_run in zip(runs, checked):
        out += f"\n### {run.label}\n\n" + "".join(
            f"- ({c.key}) **{c.verdict}**: {c.evidence}\n" for c in per_run.values()
        )
    return out


def ratio_figure(runs: list[Run]):
    """The figure of ratio against evaluation length / training length (log-log), every run overlaid: colour per
    scheme, line style and marker per run (repeating after four runs); a curve equal to an earlier one is drawn
    smaller over it and its legend entry says "(same as ...)" (``posenc.reports.render.plot_lines``)."""
    names = schemes(runs)
    colours = {key: f"C{i % 10}" for i, key in enumerate(names)}
    fig, ax = figure(figsize=(8, 5))
    lines = []
    for i, run in enumerate(runs):
        for key, row in seed_grid(run, "ratio").items():
            pts = [
                (m, np.mean([v for v in row[m] if v is not None]))
                for m in sorted(row)
                if any(v is not None for v in row[m])
            ]
            if pts:
                ls, marker = STYLES[i % len(STYLES)]
                lines.append(
                    {
                        "label": f"{names[key]} ({run.label})",
                        "x": [m for m, _ in pts],
                        "y": [v for _, v in pts],
                        "ls": ls,
                        "marker": marker,
                        "ms": 4,
                        "color": colours[key],
                    }
                )
    plot_lines(ax, lines)
    log_scale(ax, "x", base=2)
    log_scale(ax, "y")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xlabel("evaluation length / training length")
    ax.set_ylabel("perplexity / perplexity at training length")
    ax.set_title("Length extrapolation: " + " vs ".join(run.label for run in runs))
    legend(ax, len(lines), fontsize=7, ncol=2, handlelength=3)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig


def load_runs(paths: list[Path]) -> tuple[list[Run], list[TaskRun]]:
    """(text runs, task runs) of the directories ``paths``, each in the order given, labelled by :func:`_labels`.
    Raises PosencError as :func:`load_run`, or for no run or a run given twice."""
    if not paths:
        raise PosencError("give at least one compare run directory")
    labelled = list(zip(paths, _labels(paths)))
    tasks = [load_task_run(p, label) for p, label in labelled if Path(p).is_dir() and is_task_run(p)]
    return [load_run(p, label) for p, label in labelled if not (Path(p).is_dir() and is_task_run(p))], tasks


def write_runs_report(paths: list[Path], out: Path) -> Path:
    """Read the compare runs at ``paths`` (text and task comparisons) and write ``out/report.md`` and, with text
    runs, ``out/ppl_ratio.png``; returns the report's path. Raises PosencError as :func:`load_runs`."""
    runs, task_runs = load_runs(paths)
    open_run_dir(Path(out))  # held while it writes (posenc.store.lock)
    if runs:
        save_figure(ratio_figure(runs), Path(out) / "ppl_ratio.png")
    report = Path(out) / "report.md"
    atomic_write_bytes(report, markdown(runs, task_runs).encode())
    return report


def scoreboard(paths: list[Path]) -> str:
    """The scoreboard of the runs at ``paths`` (``posenc.reports.scoreboard``): the text runs beside every task
    run. Raises PosencError as :func:`load_runs`, or when no task run is given."""
    runs, task_runs = load_runs(paths)
    if not task_runs:
        raise PosencError(
            "the scoreboard needs a task comparison "
            "(`posenc --import experiments/accumulated/claims.py compare --preset retrieval`): none given"
        )
    return scoreboard_markdown(runs, task_runs)
