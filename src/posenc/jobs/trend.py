"""A preset's ``trend`` axis: each rung a whole comparison, then the trend report (``posenc.reports.trend``)."""

from __future__ import annotations

from pathlib import Path

from posenc.config.plan import Preset, rungs
from posenc.jobs.compare import check_source, compare
from posenc.jobs.job import Plan
from posenc.reports.trend import write_trend_report


def compare_trend(
    preset: Preset, out_root: Path = Path("runs"), trained_from: Path | None = None, **options
) -> tuple[Path, dict[str, str]]:
    """Run every rung of ``preset.trend`` (``posenc.config.plan.rungs``) as ``compare`` would, in the order of the
    axis, under ``out_root/<name>/<key>-<value>``, then write the trend report (``trend.md``, ``trend.csv``,
    ``trend.png``) in ``out_root/<name>``; returns trend.md's path and the failed jobs ({"<rung>: <job>": one-line
    error}). ``trained_from``: another trend's root (compare's, rung by rung); ``options``: compare's (isolate,
    parallel, launcher, ...). A rerun skips finished jobs (compare's
    resume); a rung none of whose jobs finished is left out of the report. Raises PosencError as compare does."""
    root = Path(out_root) / preset.name
    failures: dict[str, str] = {}
    done = []
    if trained_from is not None:  # every rung's models checked before any rung runs
        for rung in rungs(preset):
            plan = Plan(rung, root)
            plan.check()
            check_source(plan, trained_from / rung.name)
    for rung in rungs(preset):
        source = trained_from and trained_from / rung.name  # another trend's root: each rung takes from its own
        _, failed = compare(rung, root, **options, trained_from=source)
        failures.update({f"{rung.name}: {job}": why for job, why in failed.items()})
        if (root / rung.name / "results.jsonl").exists():
            done.append(root / rung.name)
    return write_trend_report(done, root, preset.trend.key), failures
