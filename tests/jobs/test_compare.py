"""The one runner: each results file read once per invocation (the run's store), jobs of every kind planned as
records, the command's options (--dry-run, --device) and a run none of whose jobs finished."""

import collections
import sys
from pathlib import Path

import pytest

import posenc.store.records as records
from posenc.cli.main import main
from posenc.config.plan import grid_points, load_preset, point_root
from posenc.jobs.compare import compare
from posenc.jobs.job import MethodJob, Plan, ScheduleJob, TextJob
from posenc.store.checkpoint import read_json


def _preset(corpus, **more):
    return load_preset(
        "quick",
        {
            "name": "reads",
            "schemes": ["rope"],
            "seeds": [0, 1],
            "model": {"n_layer": 1, "n_head": 2, "d_model": 16, "train_length": 16},
            "train": {"corpus": str(corpus), "steps": 2, "batch_size": 2, "ckpt_every": 2, "threads": 1},
            "eval": {
                "multiples": [1, 2],
                "max_tokens": 64,
                "passkey": {"trials": 1, "depths": [0.5], "lengths_multiples": [1]},
                "far_mass": {"windows": 1, "multiples": [1]},
            },
            "eval_schedules": [{"schedule": "yarn", "factor": 2}],
            **more,
        },
    )


@pytest.mark.slow
def test_a_sweep_reads_each_results_file_once(tiny_corpus, tmp_path, monkeypatch):
    preset = _preset(tiny_corpus, sweep={"grid": {"train.lr": [1e-4, 1e-2]}})
    loads: collections.Counter = collections.Counter()
    read: collections.Counter = collections.Counter()
    load, take = records.load, records.RunStore._take

    def counted(path, *args, **kwargs):
        loads[Path(path).parent.name, sys._getframe(1).f_code.co_name] += 1
        return load(path, *args, **kwargs)

    for module in [m for name, m in sys.modules.items() if name.startswith("posenc.")]:
        if getattr(module, "load", None) is load:
            monkeypatch.setattr(module, "load", counted)
    monkeypatch.setattr(records.RunStore, "_take", lambda s, data: read.update({s.path: len(data)}) or take(s, data))
    _, failures = compare(preset, tmp_path / "runs", isolate=False)
    root = tmp_path / "runs" / "reads"
    assert not failures
    files = [point_root(root, p) / "results.jsonl" for p in grid_points(preset, "rope")]
    assert read == {f: f.stat().st_size for f in files}  # every byte of each grid point's records read once
    assert loads == {("reads", "write_report"): 1}  # the report reads the merged records; nothing else loads
    rows = {(r.scheme, r.seed) for f in files for r in load(f) if r.kind == "ppl"}
    assert {("rope+yarn(s=2)", 0), ("rope+yarn(s=2)", 1)} <= rows  # the schedule rows at the chosen point


def test_the_plan_gives_every_kind_as_a_job_and_the_rows_after_the_training(tiny_corpus, tmp_path):
    preset = _preset(tiny_corpus, schemes=["rope", "alibi"], eval_methods=["lm-infinite:n_global=2"])
    plan = Plan(preset, tmp_path)
    plan.check()
    train, rows = list(plan.stages({}))
    assert [(type(j), j.scheme, j.seed) for j in train] == [(TextJob, s, k) for s in ("rope", "alibi") for k in (0, 1)]
    assert [(type(j), j.name()) for j in rows] == [
        *((ScheduleJob, f"rope+yarn (seed {k})") for k in (0, 1)),
        *((MethodJob, f"{s}+lm-infinite(n_global=2,window=16) (seed {k})") for s in ("rope", "alibi") for k in (0, 1)),
    ]
    assert (
        rows[0].label() == "rope+yarn(s=2)"
        and rows[0].error_file == tmp_path / "reads/rope/seed0+rope+yarn(s=2).error.txt"
    )
    store = records.RunStore(tmp_path / "reads" / "results.jsonl")
    assert not train[0].done(store) and all(j.done(store) for j in rows)  # nothing trained: no rows to evaluate


def test_a_method_that_skips_a_scheme_says_so_and_one_that_applies_to_none_is_refused(tiny_corpus, tmp_path, capsys):
    argv = ["compare", "--preset", "quick", "--corpus", str(tiny_corpus), "--out", str(tmp_path / "runs"), "--dry-run"]
    argv += ["--set", "eval_methods=[sinks]", "--schemes"]
    assert main([*argv, "rope", "nope"]) == 0
    out = capsys.readouterr()
    assert out.err == (
        "posenc: warning: eval_methods 'sinks': no row for nope "
        "(method sinks applies to rope (fixed-frequency schedules), alibi, t5 and kerple)\n"
    )
    assert "  - rope+sinks (seed 0)\n" in out.out and "nope+sinks" not in out.out
    assert out.out.endswith("jobs: 3  # per stage: jobs 2, rows 1\n")  # the row the run skips is not counted
    assert main([*argv, "nope", "acc-rand-qk"]) == 2
    assert capsys.readouterr().err == (
        "posenc: error: eval_methods 'sinks': applies to none of the schemes "
        "(method sinks applies to rope (fixed-frequency schedules), alibi, t5 and kerple)\n"
    )
    assert not (tmp_path / "runs").exists()


def test_dry_run_prints_each_stage_and_writes_nothing(tiny_corpus, tmp_path, capsys):
    argv = ["compare", "--preset", "quick", "--corpus", str(tiny_corpus), "--schemes", "rope", "alibi"]
    sets = ["--set", "sweep={grid: {train.lr: [0.001, 0.01]}}", "--set", "eval_schedules=[{schedule: pi, factor: 2}]"]
    assert main([*argv, *sets, "--out", str(tmp_path / "runs"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert (
        "  - rope (seed 0) at train.lr=0.001 (screening)\n" in out and "  - alibi (seed 0) at its chosen point\n" in out
    )
    assert "  - rope+pi (seed 0)\n" in out
    assert out.endswith("jobs: 7  # per stage: screening 4, chosen 2, rows 1\n")
    assert not (tmp_path / "runs").exists()


def test_an_unavailable_device_is_one_line(tiny_corpus, tmp_path, capsys):
    argv = ["compare", "--preset", "quick", "--corpus", str(tiny_corpus), "--out", str(tmp_path / "runs")]
    assert main([*argv, "--device", "cuda:7"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("posenc: error: device 'cuda:7' is not available here") and err.count("\n") == 1
    assert main([*argv, "--device", "cpu", "--parallel", "2"]) == 2
    assert "--device pins the job processes" in capsys.readouterr().err
    assert main([*argv, "--device", "foo", "--dry-run"]) == 2  # the dry run refuses what the run refuses
    assert capsys.readouterr().err == "posenc: error: unknown device 'foo' (e.g. cpu, cuda, cuda:1, mps)\n"
    assert not (tmp_path / "runs").exists()


def test_a_dry_run_into_a_run_of_other_settings_is_refused_as_the_run_is(tiny_corpus, tmp_path, capsys):
    from posenc.jobs.launcher import record_run

    argv = ["compare", "--preset", "quick", "--corpus", str(tiny_corpus), "--schemes", "rope", "--out", str(tmp_path)]
    root = tmp_path / "quick"
    record_run(
        root, Plan(load_preset("quick", {"schemes": ["rope"], "train": {"corpus": str(tiny_corpus)}}), tmp_path).preset
    )
    (root / "results.jsonl").touch()
    assert main([*argv, "--dry-run"]) == 0
    assert capsys.readouterr().out.endswith(
        f"jobs: 1  # per stage: jobs 1; {root} holds results: a run skips the jobs finished there\n"
    )
    for dry in (["--dry-run"], []):
        assert main([*argv, "--steps", "31", *dry]) == 2
        assert capsys.readouterr().err == (
            f"posenc: error: {root} holds results made with other settings (train.steps 30 -> 31); use another "
            "--name or --out\n"
        )


def test_a_rerun_of_fewer_schemes_keeps_the_earlier_rows_in_preset_json(tmp_path):
    """preset.json describes every result the directory holds: a rerun naming some schemes or seeds adds its new
    ones after the recorded ones (before, it rewrote the lists to the rerun's)."""
    from posenc.jobs.launcher import record_run

    root = tmp_path / "quick"
    record_run(root, load_preset("quick", {"schemes": ["rope", "alibi"], "seeds": [0, 1]}))
    record_run(root, load_preset("quick", {"schemes": ["nope", "rope"], "seeds": [2]}))
    saved = read_json(root / "preset.json")
    assert (saved["schemes"], saved["seeds"]) == (["rope", "alibi", "nope"], [0, 1, 2])
    record_run(root, load_preset("quick", {"eval": {"multiples": [8]}}))  # quick's longest length kept: same text
    assert read_json(root / "preset.json")["eval"]["multiples"] == [1, 2, 4, 8]


def test_a_rerun_whose_lengths_score_other_text_is_refused(tiny_corpus, tmp_path, capsys):
    """Every length scores the first (longest length) targets of each work: a rerun adding a longer length, or
    dropping the longest, would report its records beside kept ones scored on other text (before: accepted, a ratio
    of 1.004 where the same text gives 0.990)."""
    from posenc.jobs.launcher import record_run

    root = tmp_path / "quick"
    record_run(root, load_preset("quick", {"train": {"corpus": str(tiny_corpus)}, "eval": {"multiples": [1, 2]}}))
    argv = ["compare", "--preset", "quick", "--corpus", str(tiny_corpus), "--out", str(tmp_path), "--dry-run"]
    for multiples, change in (("[1,2,4]", "64 -> 128"), ("[1]", "64 -> 32")):
        assert main([*argv, "--set", f"eval.multiples={multiples}"]) == 2
        assert capsys.readouterr().err == (
            f"posenc: error: {root} holds results made with other settings (eval.span {change}); use another "
            "--name or --out\n"
        )
    assert main([*argv, "--set", "eval.multiples=[2]"]) == 0  # the same text: the lengths are free
