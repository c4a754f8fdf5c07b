"""How results move with one setting: the report of a preset's ``trend`` axis and of ``posenc report RUN_DIR...
--trend KEY`` (a budget ladder: ``train.steps``).

Nothing is chosen on a trend axis: every rung is a whole comparison of its own (``posenc compare``), and this report
lays the rungs side by side, ordered by the setting. Per scheme and rung it gives the perplexity ratio at 16x and
128x the training length (``multiples``: else at the longest length evaluated) as the mean over the rung's seeds
with its 95% t-interval (Student t with n - 1 degrees of freedom; one seed: no interval), against the training
tokens of the rung (steps x batch size x training length); then each registered claim set's verdict of every claim
on each rung (``posenc.reports.claims``: effect and interval under the stated rule), so a reader sees which verdicts
move with the budget. Files: ``trend.md``, ``trend.csv`` (one row per scheme, rung and multiple) and ``trend.png``.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np

from posenc.errors import PosencError
from posenc.reports.claims import t_quantile, text_claims
from posenc.reports.render import RATIO, figure, log_scale, markdown_table, number, save_figure, write_csv_table
from posenc.reports.runs import Run, load_runs, schemes, seed_grid
from posenc.reports.scoreboard import shown_multiples
from posenc.store.checkpoint import atomic_write_bytes
from posenc.store.lock import open_run_dir


def multiples(runs: list[Run]) -> list[int]:
    """The lengths (multiples of the training length) the trend shows: the scoreboard's columns
    (``posenc.reports.scoreboard.shown_multiples``: the claimed 16x and 128x some run evaluated, else the longest any
    run evaluated)."""
    return shown_multiples(round(r.eval_length / run.train_length) for run in runs for r in run.records)


@dataclasses.dataclass(frozen=True)
class Point:
    """One scheme's ratio at one multiple on one rung: ``mean`` over ``n`` seeds and its 95% interval (``lo``,
    ``hi``; None for one seed)."""

    mean: float
    lo: float | None
    hi: float | None
    n: int

    def cell(self) -> str:
        """ "1.394 [1.231, 1.557]", or "1.394 (1 seed)"."""
        if self.lo is None:
            return f"{number(self.mean, RATIO)} (1 seed)"
        return f"{number(self.mean, RATIO)} [{number(self.lo, RATIO)}, {number(self.hi, RATIO)}]"


def mean_interval(values: list[float]) -> Point:
    """The mean of ``values`` (per seed) with its 95% t-interval: mean ± t_{0.975, n-1} s / sqrt(n) (s: the sample
    standard deviation). ValueError for no values."""
    v = np.asarray([x for x in values if x is not None], dtype=np.float64)
    if not len(v):
        raise ValueError("no values")
    mean = float(v.mean())
    if len(v) == 1:
        return Point(mean, None, None, 1)
    half = t_quantile(0.975, len(v) - 1) * float(v.std(ddof=1)) / math.sqrt(len(v))
    return Point(mean, mean - half, mean + half, len(v))


def rung_value(run: Run, key: str) -> Any:
    """The run's value of the setting ``key`` (dotted, as in a preset: ``train.steps``). PosencError (one line) when
    the run does not record it (a run without preset.json)."""
    if key not in run.settings:
        if run.source == "preset.json":  # its preset.json is there: the key is what is wrong
            raise PosencError(f"{run.label}'s preset.json has no setting {key} (a dotted key such as train.steps)")
        raise PosencError(f"{run.label} does not record {key} (no preset.json with it): it cannot be a rung of {key}")
    return run.settings[key]


def training_tokens(run: Run) -> int | None:
    """Tokens the run's models trained on: steps x batch size x training length; None when a setting is missing."""
    s = run.settings
    if not all(k in s for k in ("train.steps", "train.batch_size")):
        return None
    return int(s["train.steps"]) * int(s["train.batch_size"]) * run.train_length


def ordered(runs: list[Run], key: str) -> list[Run]:
    """``runs`` sorted by their value of ``key``. PosencError for two runs at one value (a rung given twice)."""
    values = [rung_value(run, key) for run in runs]
    if len(set(map(repr, values))) < len(values):
        raise PosencError(f"two runs have the same {key}: a trend needs one run per value")
    return [run for _, run in sorted(zip(values, runs), key=lambda p: p[0])]


def points(runs: list[Run]) -> dict[str, dict[int, list[Point | None]]]:
    """scheme name -> multiple (``multiples``) -> one Point per rung (None where the rung did not run the scheme at
    that length)."""
    names = schemes(runs)
    grids = [seed_grid(run, "ratio") for run in runs]
    out: dict[str, dict[int, list[Point | None]]] = {}
    for key, name in names.items():
        out[name] = {
            m: [mean_interval(g[key][float(m)]) if key in g and g[key].get(float(m)) else None for g in grids]
            for m in multiples(runs)
        }
    return out


def markdown(runs: list[Run], key: str) -> str:
    """The trend report (see the module docstring) of ``runs``, already ordered by ``key``."""
    pts = points(runs)
    rungs = [f"{key}={rung_value(run, key)}" for run in runs]
    toks = [training_tokens(run) for run in runs]
    head = ["scheme", *(f"{r} ({t:,} tokens)" if t else r for r, t in zip(rungs, toks))]
    out = [f"# Trend over {key}: {', '.join(run.label for run in runs)}\n"]
    out.append(
        "\nEach rung is a whole comparison (`posenc compare`), nothing chosen on the axis. Ratio: perplexity at the "
        "length over the same run's perplexity at its training length; mean over the rung's seeds with its 95% "
        "t-interval (Student t, n - 1 degrees of freedom).\n"
    )
    out.append(
        "\n"
        + markdown_table(
            ["rung", "run", "seeds", "training tokens"],
            [
                [r, f"`{run.path}`", ", ".join(str(s) for s in sorted({x.seed for x in run.records})), t or "n/a"]
                for r, run, t in zip(rungs, runs, toks)
            ],
        )
        + "\n"
    )
    for m in multiples(runs):
        rows = [[name, *(p.cell() if p else "not run" for p in per[m])] for name, per in pts.items()]
        if any(p for per in pts.values() for p in per[m]):
            out.append(f"\n## Ratio at {m}x the training length\n\n" + markdown_table(head, rows) + "\n")
    out.append(claims_markdown(runs, rungs))
    return "".join(out)


def claims_markdown(runs: list[Run], rungs: list[str]) -> str:
    """Each registered claim set's claims on every rung: verdict with effect and 95% interval ("" without claims)."""
    checked = [{(cs.name, c.key, c.text): c for cs, c in text_claims(run.records, run.train_length)} for run in runs]
    keys = list(dict.fromkeys(k for per in checked for k in per))
    if not keys:
        return ""
    rows = []
    for k in keys:
        cells = []
        for per in checked:
            c = per.get(k)
            cells.append(
                "not run"
                if c is None
                else f"**{c.verdict}**" + (f" {c.outcome.what} {c.outcome.cell()}" if c.outcome else "")
            )
        rows.append([f"({k[1]}) {k[2]}", *cells])
    return (
        "\n## Claims on each rung\n\nThe stated rule of each claim set on each rung's records (effect and 95% "
        "interval; a rung with one seed has none).\n\n" + markdown_table(["claim", *rungs], rows) + "\n"
    )


def csv_rows(runs: list[Run], key: str) -> list[list[Any]]:
    """[scheme, key value, training tokens, multiple, seeds, mean, lo, hi] per scheme, rung and multiple."""
    rows = []
    for name, per in points(runs).items():
        for m in multiples(runs):
            for run, p in zip(runs, per[m]):
                if p:
                    rows.append([name, rung_value(run, key), training_tokens(run), m, p.n, p.mean, p.lo, p.hi])
    return rows


def trend_figure(runs: list[Run], key: str):
    """Ratio at each of ``multiples`` against training tokens (log-log), one panel per multiple, a line per scheme
    with its 95% interval as error bars; a rung without training tokens is placed at its value of ``key``."""
    toks = [training_tokens(run) or rung_value(run, key) for run in runs]
    shown = multiples(runs)
    fig, axes = figure(1, len(shown), figsize=(5.5 * len(shown), 4.5), squeeze=False)
    for ax, m in zip(axes[0], shown):
        for i, (name, per) in enumerate(points(runs).items()):
            xs = [(x, p) for x, p in zip(toks, per[m]) if p]
            if not xs:
                continue
            y = np.array([p.mean for _, p in xs])
            err = np.array(
                [
                    [p.mean - (p.lo if p.lo is not None else p.mean) for _, p in xs],
                    [(p.hi if p.hi is not None else p.mean) - p.mean for _, p in xs],
                ]
            )
            # a small horizontal offset per scheme keeps coinciding error bars apart
            x = np.array([x for x, _ in xs], dtype=float) * 1.04 ** (i - 4)
            ax.errorbar(
                x,
                y,
                yerr=err,
                marker="o",
                ms=4,
                capsize=3,
                label=name,
                color=f"C{i % 10}",
                ls=["-", "--", ":"][i // 10 % 3],
            )
        log_scale(ax, "x")
        log_scale(ax, "y")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xlabel("training tokens" if all(training_tokens(r) for r in runs) else key)
        ax.set_ylabel(f"perplexity ratio at {m}x / 1x")
        ax.set_title(f"Ratio at {m}x the training length (95% interval over seeds)", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def write_trend_report(paths: list[Path], out: Path, key: str) -> Path:
    """Read the text comparisons at ``paths`` (one per value of ``key``, any order), write ``out/trend.md``,
    ``out/trend.csv`` and ``out/trend.png``; returns trend.md's path. PosencError (one line) for a task comparison
    among them, a run that does not record ``key``, or two runs at one value."""
    runs, task_runs = load_runs(paths)
    if task_runs or not runs:
        raise PosencError("a trend reads text comparisons only (posenc compare on a corpus): give their directories")
    runs = ordered(runs, key)
    open_run_dir(Path(out))  # held while it writes (posenc.store.lock)
    save_figure(trend_figure(runs, key), Path(out) / "trend.png")
    write_csv_table(
        Path(out) / "trend.csv",
        ["scheme", key, "training_tokens", "multiple", "seeds", "mean", "lo", "hi"],
        csv_rows(runs, key),
    )
    report = Path(out) / "trend.md"
    atomic_write_bytes(report, markdown(runs, key).encode())
    return report
