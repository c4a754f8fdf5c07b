"""A task job under train.until.extend_to: its record says the cap it reached (trained_steps past train.steps) and
why (the criterion's words name the rule; train_summary.json the numbers); and matched training beside train to
criterion: the study preset with train.until=null trains every scheme the full cap."""

import yaml

from posenc.config.plan import load_preset
from posenc.jobs.job import Plan
from posenc.jobs.retrieval import task_meta
from posenc.store.checkpoint import read_json
from posenc.store.records import RunStore, Task, load
from posenc.train.curves import loss_trend


def _preset(tmp_path, lr):
    body = {
        "name": "tiny",
        "model": {"n_layer": 1, "n_head": 2, "d_model": 16, "train_length": 16},
        "train": {
            "steps": 12,
            "batch_size": 4,
            "lr": lr,
            "warmup": 1,
            "loss": "answers",
            "ckpt_every": 4,
            "log_every": 1,
            "threads": 1,
            "until": {"at_least": 1.0, "every": 4, "answers": 40, "extend_to": 20},
        },
        "tasks": ["flipflop"],
        "task_eval": {"multiples": [1, 2], "answers": 40, "max_tokens": 1024, "learned": 0.01},
        "schemes": ["rope"],
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return load_preset(str(path))


def test_an_extended_task_job_records_the_cap_it_reached_and_why(tmp_path):
    preset = _preset(tmp_path, 1e-2)
    job = Plan(preset, tmp_path / "run").job("flipflop", "rope", 0)
    job.run(RunStore(job.root / "results.jsonl"))
    (record,) = [r for r in load(job.root / "results.jsonl") if isinstance(r, Task)]
    assert record.trained_steps == 20 and record.criterion_step is None  # the cap it reached: extend_to
    assert record.criterion == (
        "id_accuracy >= 1, checked every 4 steps on 40 held-out answers; unmet at the step cap with the training "
        "loss still falling (its last eighth of logged steps more than 5% below the window a quarter of the steps "
        "earlier): trained on up to step 20 at the final learning rate"
    )
    assert [s for s, _ in record.loss_curve] == list(range(1, 21))
    summary = read_json(job.run_dir / "train_summary.json")
    why = loss_trend(record.loss_curve[:12]).falling_at(12)  # the record's own losses up to the cap
    assert summary["until"]["extended"] == {"from": 12, "to": 20, "why": why}
    assert "trained on up to step 20" in task_meta(preset)["budget"]


def test_a_flat_task_job_stops_at_the_cap(tmp_path):
    job = Plan(_preset(tmp_path, 1e-6), tmp_path / "run").job("flipflop", "rope", 0)
    job.run(RunStore(job.root / "results.jsonl"))
    (record,) = [r for r in load(job.root / "results.jsonl") if isinstance(r, Task)]
    assert record.trained_steps == 12 and not loss_trend(record.loss_curve).falling


def test_the_matched_comparison_command_resolves_without_early_stop(monkeypatch, capsys):
    """docs/retrieval.md's matched training: the command line as given resolves (no training: compare is replaced)
    to the retrieval preset with no criterion, so every scheme trains the full cap, under its own run name."""
    from pathlib import Path

    from posenc.cli import compare_cmd
    from posenc.cli.main import main

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)
    monkeypatch.delenv("POSENC_IMPORT", raising=False)  # the --import below joins it; restored afterwards
    seen = []

    def dry(preset, out, **options):
        seen.append(preset)
        report = out / preset.name / "report.md"
        return type("Report", (), {"read_text": lambda self: "", "__str__": lambda self: str(report)})(), []

    monkeypatch.setattr(compare_cmd, "compare", dry)
    argv = "--import experiments/accumulated/claims.py compare --preset retrieval --set train.until=null"
    assert main([*argv.split(), "--name", "retrieval-matched"]) == 0
    (matched,) = seen
    written = load_preset("retrieval")  # the claims module is loaded now: the study's presets resolve by name
    assert written.train.until is not None and written.train.until.extend_to == 1200  # train to criterion, extended
    assert matched.name == "retrieval-matched" and matched.train.until is None  # no early stop, no extension
    assert matched.train.steps == written.train.steps == 600  # every scheme the full cap
    assert matched.sweep == written.sweep and matched.schemes == written.schemes and matched.tasks == written.tasks
    assert "this run sets train.until = None" in matched.description
    assert "; until" not in task_meta(matched)["budget"] and "600 steps x 32 sequences" in task_meta(matched)["budget"]
    st = load_preset("state-tracking", {"train.until": None})
    assert st.train.until is None and st.train.steps == 600
