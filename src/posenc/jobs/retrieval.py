"""The header of a comparison on synthetic tasks: does a scheme still *use* what lies beyond its training length?

A task comparison trains one model per (task, scheme, seed) into ``runs/<name>/<task>/<scheme>/seed<k>`` (under
``sweep/<grid point>/`` in a sweep) on the task's generator (``posenc.data.tasks``), scores it with
``posenc.eval.tasks`` and appends one record per job to the ``results.jsonl`` beside it (``kind: "task"``: the cells
of every test, length and evidence-distance bucket): ``posenc.jobs.job.TaskJob``. ``task_meta`` is its report's
header (``posenc.reports.tasks``).
"""

from __future__ import annotations

from posenc.config.plan import Preset, model_line, positions_note, setting, task_specs
from posenc.data.tasks import get_task
from posenc.reports import claims
from posenc.store.stamp import run_stamp
from posenc.train.precision import machine_precision


def task_meta(preset: Preset) -> dict:
    """The report's header: tasks, model, budget, evaluation, the registered sets' quantities of each scheme
    (``posenc.reports.claims.Quantity``), the stamp."""
    m, t = preset.model, preset.train
    return {
        "name": preset.name,
        "train_length": m.train_length,
        "tasks": {spec: get_task(spec).describe() for spec in task_specs(preset)},
        "model": model_line(preset),
        "n_head": m.n_head,  # the head count of records without their own (retrieval_report.claim_alibi_slopes)
        "budget": (
            f"{setting(preset, 'train.steps')} steps x {t.batch_size} sequences of {m.train_length} tokens, "
            f"lr {setting(preset, 'train.lr')}, loss on {t.loss}{positions_note(preset)}"
        )
        + (f"; until {t.until.describe()} (steps is the cap)" if t.until else ""),
        "seeds": preset.seeds,
        "eval": preset.task_eval.model_dump(),
        "quantities": claims.scheme_quantities(preset),
        "text_results": preset.text_results,
        "reference": preset.reference,
        "notes": preset.description or None,
        "stamp": run_stamp(machine_precision(t)),  # the precision the jobs train at, not auto's pick
    }
