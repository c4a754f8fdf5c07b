"""Horizons as data (issue 57): right-censored at the longest probe, median and range over seeds, one rendering
in report.md and the scoreboard, and the alternative rules of a robustness table."""

import re

import pytest

from posenc.errors import PosencError
from posenc.reports.tasks import (
    Horizon,
    distance_markdown,
    half_chance_horizon,
    horizon_cell,
    horizon_of,
    horizon_text,
    horizon_value,
)
from tests.task_records import gap_cells, task_table

CURVE = {8: 1.0, 16: 0.97, 32: 0.9, 64: 0.8, 4096: 0.98}


def test_a_horizon_is_data_with_its_censoring():
    assert horizon_of(CURVE, 1.0, 0.05) == Horizon(16, False, 8, 4096)
    assert horizon_of(CURVE, 1.0, 0.10) == Horizon(32, False, 8, 4096)
    assert horizon_of({8: 1.0, 4096: 0.99}, 1.0, 0.05, seed=2) == Horizon(4096, True, 8, 4096, 2)
    assert horizon_of({8: 0.5, 16: 1.0}, 1.0, 0.05) == Horizon(None, False, 8, 16)
    with pytest.raises(PosencError, match="no gap buckets"):
        horizon_of({}, 1.0, 0.05)


def test_one_rendering_with_thousands_separators():
    assert horizon_text(Horizon(4096, True, 8, 4096)) == "≥ 4,096"
    assert horizon_text(Horizon(1024, False, 8, 4096)) == "1,024"
    assert horizon_text(Horizon(None, False, 8, 4096)) == "none" == horizon_text(None)
    assert horizon_value(Horizon(None, False, 8, 4096)) == 0 and horizon_value(Horizon(4096, True, 8, 4096)) == 4096
    assert horizon_value(64) == 64 and horizon_value(None) == 0


def test_seeds_show_the_median_and_the_range_never_a_mean_of_censored_values():
    """PaTH's 512 / 4,096 / 4,096 (the last two censored) was "2901 ± 1792"; now the median and range."""
    path = [Horizon(512, False, 8, 4096), Horizon(4096, True, 8, 4096), Horizon(4096, True, 8, 4096)]
    assert horizon_cell(path) == "≥ 4,096 (range 512 to ≥ 4,096; ≥ 4,096 on 2 of 3 seeds)"
    assert horizon_cell([Horizon(h, False, 8, 4096) for h in (64, 16, 32)]) == "32 (range 16 to 64)"
    assert horizon_cell([Horizon(None, False, 8, 64), Horizon(8, False, 8, 64)]) == "none (range none to 8)"
    assert horizon_cell([Horizon(4096, True, 8, 4096)] * 3) == "≥ 4,096"
    assert horizon_cell([64, None, 2048]) == "64 (range none to 2,048)" and horizon_cell([]) == ""


def test_report_and_scoreboard_show_the_same_cell():
    from posenc.reports.scoreboard import horizon_cell as scoreboard_cell

    t = task_table(
        "flipflop",
        {
            "path": {
                0: gap_cells(1.0, {8: 1.0, 16: 1.0, 32: 1.0}),
                1: gap_cells(1.0, {8: 1.0, 16: 0.5, 32: 0.5}),
                2: gap_cells(1.0, {8: 0.5, 16: 0.5, 32: 0.5}),
            }
        },
    )
    cell = "8 (range none to ≥ 32; ≥ 32 on 1 of 3 seeds)"
    assert scoreboard_cell(t, "path") == cell
    md = distance_markdown(t, ["path"], {})
    assert f"| {cell} |" in md and "8: 1,000 (1.6)" in md  # the standard error at p = 0.5 on 1,000 answers
    assert [h.censored for h in t.horizon_data("path")] == [True, False, False] == t.censored("path")
    assert t.horizons("path") == [32, 8, None]


def test_alternative_rules_on_the_same_data():
    """Tolerance, pooled buckets (plain mean vs answer-weighted) and half-way to chance, by hand."""
    t = task_table(
        "flipflop",
        {
            "rope": {
                0: gap_cells(1.0, {8: 0.99, 16: 0.93, 32: 0.85, 64: 0.5}),
                1: gap_cells(0.96, {8: 0.95, 16: 0.9, 32: 0.7, 64: 0.5}),
            }
        },
    )
    assert [h.value for h in t.horizon_data("rope", tol=0.02)] == [8, 8]
    assert [h.value for h in t.horizon_data("rope", tol=0.10)] == [16, 16]
    assert [h.value for h in t.horizon_data("rope", tol=0.20)] == [32, 16]
    # pooled: id 0.98, buckets 0.97 / 0.915 / 0.775 / 0.5 (equal answers: both weightings agree)
    assert t.pooled_horizon("rope") == Horizon(8, False, 8, 64)
    assert t.pooled_horizon("rope", "answers", tol=0.1) == Horizon(16, False, 8, 64)
    # half-way to chance: (1.0 + 0.5) / 2 = 0.75 -> 32 on seed 0; (0.96 + 0.5) / 2 = 0.73 -> 16 on seed 1
    assert [h.value for h in t.half_chance_horizons("rope")] == [32, 16]
    assert half_chance_horizon({8: 0.6, 16: 0.9, 32: 0.95}, 1.0, 0.5) == Horizon(32, True, 8, 32)
    assert half_chance_horizon({8: 0.6}, 1.0, 0.5).value is None
    with pytest.raises(PosencError, match="weighting must be"):
        t.pooled_horizon("rope", "median")


def test_answer_weighting_differs_from_the_plain_mean():
    from posenc.reports.tasks import TaskTable
    from posenc.store.records import TaskCell
    from tests.task_records import task_records

    recs = task_records("flipflop", {"s": {0: gap_cells(1.0, {8: 1.0, 16: 1.0}), 1: gap_cells(1.0, {8: 1.0})}})
    cells = [TaskCell(test="gap", length=145, bucket=16, n=9000, correct=0, nll=0.0)]
    recs[1] = recs[1].model_copy(update={"cells": recs[1].cells + cells})
    t = TaskTable(recs, "flipflop", 128, 0.05, 0.9)
    assert t.pooled_horizon("s", "mean") == Horizon(8, False, 8, 16)  # bucket 16: (1.0 + 0.0) / 2
    assert t.pooled_horizon("s", "answers") == Horizon(8, False, 8, 16)  # 1,000 / 10,000
    seed0 = {0: gap_cells(1.0, {8: 1.0, 16: 1.0}), 1: gap_cells(1.0, {8: 1.0, 16: 0.9})}
    recs = task_records("flipflop", {"s": seed0})
    recs[0] = recs[0].model_copy(
        update={
            "cells": [c if c.bucket != 16 else c.model_copy(update={"n": 9000, "correct": 9000}) for c in recs[0].cells]
        }
    )
    t = TaskTable(recs, "flipflop", 128, 0.04, 0.9)
    assert t.pooled_horizon("s", "mean").value == 8  # (1.0 + 0.9) / 2 = 0.95 < 0.96
    assert t.pooled_horizon("s", "answers").value == 16  # 9,900 / 10,000 = 0.99


def test_a_horizon_of_no_bucket_reads_none_everywhere_never_0(tmp_path, accumulated_claims):
    """The scoreboard, its task claims and report.md print "none"; the claims printed "horizon none (bias there 0
    nats)", a bias read at 0 tokens."""
    from posenc.reports.runs import write_runs_report
    from posenc.store.records import append
    from tests.reports.test_scoreboard import _job, _text_run

    (tmp_path / "tasks").mkdir()
    for scheme in ("alibi", "forget"):
        for seed in (0, 1):
            job = _job("flipflop", scheme, seed, 0.99, {8: 0.5, 64: 0.5, 128: 0.5}, 300)
            append(tmp_path / "tasks" / "results.jsonl", job.model_copy(update={"leak": [[0.01, 0.02]]}))
    report = write_runs_report([tmp_path / "tasks", _text_run(tmp_path / "text")], tmp_path / "out").read_text()
    assert "| forget | | | | none | 300 ± 0 |" in report
    assert "forget seed 0: leak 0.0100 nats/token, w 100, band [25, 400], horizon none;" in report
    assert not re.search(r"horizon 0\b|bias there 0 ", report)


def test_the_distance_table_gives_each_buckets_fewest_and_most_answers_and_its_largest_error():
    """Cells drawn to a standard error (task_eval.se) hold different counts: the line gives their span and the largest
    error, the accuracy moved toward 1/2 ((c + 2) / (n + 4)), so 68 of 68 right reads 2.0 points, not 0."""
    from posenc.reports.tasks import TaskTable
    from posenc.store.records import TaskCell
    from tests.task_records import task_record

    def record(seed, n, correct):
        cells = [TaskCell(test="id", length=128, bucket=8, n=1000, correct=1000, nll=0.0)]
        return task_record(
            [*cells, TaskCell(test="gap", length=8 + 129, bucket=8, n=n, correct=correct, nll=0.0)], seed
        )

    t = TaskTable([record(0, 68, 68), record(1, 625, 312)], "flipflop", 128, 0.05, 0.9)
    assert (
        "in brackets, the largest standard error among them (points; the accuracy moved toward 1/2 as (c + 2) / "
        "(n + 4), so that a bucket all right is not read as exact): 8: 68-625 (2.0)."
        in " ".join(distance_markdown(t, ["rope"], {}).split())
    )
    alone = TaskTable([record(0, 68, 68)], "flipflop", 128, 0.05, 0.9)
    assert "8: 68 (2.0)." in distance_markdown(alone, ["rope"], {})
