"""Task records and tables built by hand, for the tests of task reports and task claims."""

from posenc.reports.tasks import TaskTable
from posenc.store.records import Task, TaskCell


def task_record(cells, seed=0, scheme="rope", task="flipflop", **fields):
    """One job's record holding ``cells`` (TaskCell), trained at length 128; ``fields``: its other fields."""
    return Task(
        task=task,
        scheme=scheme,
        seed=seed,
        train_length=128,
        train_seconds=1,
        eval_seconds=1,
        threads=1,
        cells=cells,
        **fields,
    )


def task_records(task, table):
    """Records from {scheme: {seed: {(test, length, bucket): accuracy}}} with 1,000 answers a cell."""
    return [
        task_record(
            [
                TaskCell(test=t, length=L, bucket=b, n=1000, correct=round(1000 * a), nll=0.0)
                for (t, L, b), a in cells.items()
            ],
            seed,
            s,
            task,
        )
        for s, seeds in table.items()
        for seed, cells in seeds.items()
    ]


def gap_cells(id_acc, curve, near=None):
    cells = {("id", 128, 8): id_acc, **{("gap", b + 129, b): a for b, a in curve.items()}}
    for L, a in (near or {}).items():
        cells[("near", L, 64)] = a
    return cells


def task_table(task, table):
    return TaskTable(task_records(task, table), task, 128, 0.05, 0.9)


def task_job(curve=None, steps=600, **fields):
    return Task(
        task="flipflop",
        scheme="rope",
        seed=0,
        train_length=128,
        train_seconds=1,
        eval_seconds=1,
        threads=1,
        cells=[],
        trained_steps=steps,
        loss_curve=curve,
        **fields,
    )
