"""The one runner's reads: each stage, job and report reads a run's records (``results.jsonl``) once."""

import collections
import sys
from pathlib import Path

import pytest

import posenc.store.records as records
from posenc.config.plan import grid_points, load_preset, point_root
from posenc.runs.compare import compare


@pytest.mark.slow
def test_a_sweep_reads_each_results_file_once_per_stage_job_and_report(tiny_corpus, tmp_path, monkeypatch):
    preset = load_preset(
        "quick",
        {
            "name": "reads",
            "schemes": ["rope"],
            "seeds": [0, 1],
            "model": {"n_layer": 1, "n_head": 2, "d_model": 16, "train_length": 16},
            "train": {"corpus": str(tiny_corpus), "steps": 2, "batch_size": 2, "ckpt_every": 2, "threads": 1},
            "eval": {
                "multiples": [1, 2],
                "max_tokens": 64,
                "passkey": {"trials": 1, "depths": [0.5], "lengths_multiples": [1]},
                "far_mass": {"windows": 1, "multiples": [1]},
            },
            "eval_schedules": [{"schedule": "yarn", "factor": 2}],
            "sweep": {"grid": {"train.lr": [1e-4, 1e-2]}},
        },
    )
    reads: collections.Counter = collections.Counter()
    load = records.load

    def counted(path, *args, **kwargs):
        reads[Path(path).parent.name, sys._getframe(1).f_code.co_name] += 1
        return load(path, *args, **kwargs)

    for module in [m for name, m in sys.modules.items() if name.startswith("posenc.")]:
        if getattr(module, "load", None) is load:
            monkeypatch.setattr(module, "load", counted)
    _, failures = compare(preset, tmp_path / "runs", isolate=False)
    root = tmp_path / "runs" / "reads"
    # the chosen point: the one with both seeds' rows (read with the unpatched loader, so not counted)
    seeds = {p: {r.seed for r in load(point_root(root, p) / "results.jsonl")} for p in grid_points(preset, "rope")}
    (at,), (off,) = (
        [point_root(root, p).name for p in seeds if (seeds[p] == {0, 1}) == want] for want in (True, False)
    )
    assert not failures
    assert reads == {
        (at, "<dictcomp>"): 2,  # the two stages: which jobs are pending
        (off, "<dictcomp>"): 2,
        (at, "choices"): 1,
        (off, "choices"): 1,
        (at, "run_job"): 3,  # its screening job, then the full jobs of seeds 0 and 1
        (off, "run_job"): 1,  # its screening job
        (at, "compare"): 1,  # the schedule and method rows
        (off, "compare"): 1,
        (at, "merge_chosen"): 1,
        ("reads", "write_report"): 1,
    }
