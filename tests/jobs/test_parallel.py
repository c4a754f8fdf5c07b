"""Sweeps on several devices: `compare --parallel K` and `--nproc-per-node N` give the sequential results (CPU,
gloo)."""

import importlib
import json
import sys

import pytest

from posenc.config.plan import load_preset
from posenc.errors import PosencError
from posenc.jobs.compare import compare
from posenc.jobs.launcher import run_pool, slot_env


def ppl(run_root):
    recs = [json.loads(line) for line in (run_root / "results.jsonl").read_text().splitlines()]
    return {(r["scheme"], r["eval_length"]): r["ppl"] for r in recs if r.get("kind") == "ppl"}


def quick(name, schemes):
    return load_preset(
        "quick",
        {
            "name": name,
            "schemes": schemes,
            "train": {"steps": 6, "batch_size": 4},
            "eval": {"multiples": [1, 4], "max_tokens": 256, "passkey": {"trials": 0}, "far_mass": {"windows": 0}},
        },
    )


@pytest.mark.slow
def test_parallel_jobs_and_torchrun_training_match_the_sequential_sweep(tmp_path):
    schemes = ["rope", "acc-rand-qkv"]
    compare(quick("seq", schemes), tmp_path)
    compare(quick("par", schemes), tmp_path, parallel=2)
    compare(quick("ddp", schemes[1:]), tmp_path, nproc_per_node=2)
    seq, par, ddp = (ppl(tmp_path / n) for n in ("seq", "par", "ddp"))
    assert len(seq) == 4 and par.keys() == seq.keys()
    for key, value in seq.items():  # other thread counts round differently
        assert par[key] == pytest.approx(value, rel=1e-5)
    for key, value in ddp.items():  # gradients averaged over 2 ranks: the same steps to float rounding
        assert value == pytest.approx(seq[key], rel=1e-4)
    assert len(ddp) == 2


def test_parallel_slots_share_the_cpu_cores(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert slot_env(0, 1, 1) == {}
    assert slot_env(1, 2, 2) == {"OMP_NUM_THREADS": "2"}
    assert slot_env(0, 16, 1) == {"OMP_NUM_THREADS": "1"}


def test_parallel_needs_isolation_and_positive_counts(tmp_path):
    with pytest.raises(PosencError, match="--parallel and --nproc-per-node"):
        compare(quick("x", ["rope"]), tmp_path, isolate=False, parallel=2)
    with pytest.raises(PosencError, match="--parallel and --nproc-per-node"):
        compare(quick("x", ["rope"]), tmp_path, parallel=0)


POOL_JOBS = """
import time
from pathlib import Path


def fail():
    raise ValueError("bad job")


def wait_for(go, out):
    for _ in range(600):  # up to a minute for the other job's failure to be reported
        if Path(go).exists():
            Path(out).write_text("saw the failure")
            return
        time.sleep(0.1)
    Path(out).write_text("timed out")
"""


def test_a_failed_parallel_job_is_reported_while_the_others_run(tmp_path, monkeypatch):
    (tmp_path / "posenc_pool_jobs.py").write_text(POOL_JOBS)  # importable by the spawned job processes
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "posenc_pool_jobs", raising=False)
    mod = importlib.import_module("posenc_pool_jobs")
    go, out, seen = tmp_path / "go", tmp_path / "out", []

    def on_failure(i, error):
        seen.append((i, error))
        go.touch()  # lets the waiting job finish: a report only at the end would come too late for it

    jobs = [(mod.fail, (), tmp_path / "fail.txt", []), (mod.wait_for, (str(go), str(out)), tmp_path / "wait.txt", [])]
    assert run_pool(jobs, parallel=2, on_failure=on_failure) == {0: "ValueError: bad job"}
    assert seen == [(0, "ValueError: bad job")] and out.read_text() == "saw the failure"
