"""Crash recovery: `kill -9` mid-training then `--resume` gives the uninterrupted loss curve; NaN stops with one
line."""

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys

import pytest
import torch

import posenc.train.loop
from posenc import encodings
from posenc.cli.main import main
from posenc.encodings.base import Encoding

PRESET = """name: tiny
model: {n_layer: 1, n_head: 2, d_model: 16, train_length: 16}
train: {steps: STEPS, batch_size: 2, lr: 3.0e-3, warmup: 2, ckpt_every: 10, log_every: 1, threads: 1}
schemes: [acc-rand-qkv]
"""


@pytest.fixture
def setup(tmp_path, tiny_corpus):
    corpus = tiny_corpus

    def preset(steps):
        path = tmp_path / f"tiny{steps}.yaml"
        path.write_text(PRESET.replace("STEPS", str(steps)).replace("threads: 1}", f"threads: 1, corpus: {corpus}}}"))
        return str(path)

    return tmp_path, preset


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "train.jsonl").read_text().splitlines()]


KILL_AT = """
import os, signal, sys
import posenc.train.loop
from posenc.cli.main import main

real_lr_at = posenc.train.loop.lr_at


def kill_at_17(step, cfg):  # step 17 starts: 17 steps logged, the last checkpoint at step 10
    if step == 17:
        os.kill(os.getpid(), signal.SIGKILL)
    return real_lr_at(step, cfg)


posenc.train.loop.lr_at = kill_at_17
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_kill_9_then_resume_equals_uninterrupted(setup):
    tmp_path, preset = setup
    steps = 30
    args = ["train", "--scheme", "acc-rand-qkv", "--preset", preset(steps)]
    assert main([*args, "--out", str(tmp_path / "whole")]) == 0
    run = tmp_path / "killed"
    proc = subprocess.run(
        [sys.executable, "-c", KILL_AT, *args, "--out", str(run)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stderr=subprocess.DEVNULL,
    )
    assert proc.returncode == -signal.SIGKILL
    assert torch.load(run / "state.pt", weights_only=False)["step"] == 10
    assert len(records(run)) == 17 and not (run / "train_summary.json").exists()
    assert main([*args, "--out", str(run), "--resume"]) == 0
    got, want = records(run), records(tmp_path / "whole")
    assert [r["step"] for r in got] == list(range(1, steps + 1))  # steps logged after the checkpoint were dropped
    assert [r["loss"] for r in got] == [r["loss"] for r in want]  # bitwise: deterministic CPU settings


def test_resume_takes_weights_from_state_pt(setup, monkeypatch):
    """A kill between the checkpoint's two writes leaves model.safetensors of another step: resume must not use it."""
    tmp_path, preset = setup
    args = ["train", "--scheme", "acc-rand-qkv", "--preset", preset(30)]
    assert main([*args, "--out", str(tmp_path / "whole")]) == 0
    run = tmp_path / "cut"
    real_lr_at = posenc.train.loop.lr_at

    def interrupt_at_15(step, cfg):
        if step == 15:
            raise KeyboardInterrupt  # Ctrl-C: checkpoint at step 15, then re-raised
        return real_lr_at(step, cfg)

    monkeypatch.setattr(posenc.train.loop, "lr_at", interrupt_at_15)
    assert main([*args, "--out", str(run)]) == 130
    monkeypatch.setattr(posenc.train.loop, "lr_at", real_lr_at)
    assert torch.load(run / "state.pt", weights_only=False)["step"] == 15
    shutil.copy(tmp_path / "whole" / "model.safetensors", run / "model.safetensors")  # weights of another step
    assert main([*args, "--out", str(run), "--resume"]) == 0
    assert [r["loss"] for r in records(run)] == [r["loss"] for r in records(tmp_path / "whole")]


def test_resume_of_a_finished_run_keeps_it(setup, capsys):
    tmp_path, preset = setup
    run = tmp_path / "done"
    assert main(["train", "--scheme", "acc-rand-qkv", "--preset", preset(12), "--out", str(run)]) == 0
    files = {p.name: p.read_bytes() for p in run.iterdir()}
    assert main(["train", "--scheme", "acc-rand-qkv", "--preset", preset(12), "--out", str(run), "--resume"]) == 0
    assert main(["train", "--scheme", "acc-rand-qkv", "--preset", preset(5), "--out", str(run), "--resume"]) == 2
    assert (
        capsys.readouterr().err.splitlines()[-1]
        == f"posenc: error: cannot resume {run}: it has trained 12 steps, more than steps=5"
    )
    assert {p.name: p.read_bytes() for p in run.iterdir()} == files


def test_resume_without_state_pt_is_refused(setup, capsys):
    tmp_path, preset = setup
    args = ["train", "--scheme", "acc-rand-qkv", "--preset", preset(10), "--out", str(tmp_path / "r")]
    assert main(args) == 0
    (tmp_path / "r" / "state.pt").unlink()
    weights = (tmp_path / "r" / "model.safetensors").read_bytes()
    assert main([*args, "--resume"]) == 2
    assert (
        capsys.readouterr().err.splitlines()[-1]
        == f"posenc: error: cannot resume {tmp_path / 'r'}: it has weights but no state.pt (optimizer state); "
        "use another --out"
    )
    assert (tmp_path / "r" / "model.safetensors").read_bytes() == weights


class NaNAfter(Encoding):
    """test-only: NaN phases from the 15th forward pass on."""

    name = "test-nan-after"
    rotary = True

    def __init__(self, dims):
        super().__init__(dims)
        self.calls = 0

    def phases(self, inp):
        self.calls += 1
        value = float("nan") if self.calls >= 15 else 0.0
        return torch.full((1, 1, inp.x.shape[1], self.dims.head_dim // 2), value)


@pytest.fixture
def nan_scheme():
    encodings.register(NaNAfter)
    yield
    encodings.unregister(NaNAfter.name)


def test_nan_loss_stops_with_one_line_naming_step_and_checkpoint(setup, nan_scheme, capsys):
    tmp_path, preset = setup
    run = tmp_path / "nan"
    code = main(["train", "--scheme", "test-nan-after", "--preset", preset(40), "--out", str(run)])
    err = capsys.readouterr().err
    assert code == 2 and err.endswith("\n") and "Traceback" not in err
    last = err.splitlines()[-1]  # after the closed progress bar
    assert last == f"posenc: error: loss is nan at step 14; last good checkpoint: {run / 'model.safetensors'} (step 10)"
    assert torch.load(run / "state.pt", weights_only=False)["step"] == 10  # the good checkpoint is kept


def test_resume_state_pt_without_step_or_optimizer_is_one_line(tmp_path, capsys):
    run = tmp_path / "r"
    assert main(["train", "--scheme", "rope", "--preset", "quick", "--steps", "2", "--out", str(run)]) == 0
    torch.save({"model": {}}, run / "state.pt")  # unpickles, but is not a resume point
    capsys.readouterr()
    assert main(["train", "--scheme", "rope", "--preset", "quick", "--steps", "4", "--out", str(run), "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "state.pt is damaged: no step, optimizer" in err


def test_resume_with_other_training_settings_is_refused(setup, capsys):
    tmp_path, preset = setup
    run = tmp_path / "r"
    assert main(["train", "--scheme", "acc-rand-qkv", "--preset", preset(10), "--out", str(run)]) == 0
    files = {p.name: p.read_bytes() for p in run.iterdir()}
    assert (
        main(
            [
                "train",
                "--scheme",
                "acc-rand-qkv",
                "--preset",
                preset(20),
                "--out",
                str(run),
                "--resume",
                "--seed",
                "3",
                "--batch-size",
                "4",
            ]
        )
        == 2
    )
    assert (
        capsys.readouterr().err.splitlines()[-1]
        == f"posenc: error: cannot resume {run}: its training differs (batch_size 2 -> 4; seed 0 -> 3); "
        "use another --out"
    )
    assert {p.name: p.read_bytes() for p in run.iterdir()} == files  # nothing touched
    assert (
        main(["train", "--scheme", "acc-rand-qkv", "--preset", preset(20), "--out", str(run), "--resume"]) == 0
    )  # more steps: fine


@pytest.mark.slow
def test_sigterm_is_an_interrupt_with_the_resume_line(tiny_corpus, tmp_path):
    """``timeout`` sends SIGTERM to the command's process group: compare and its job process stop as on Ctrl-C
    (checkpoint, the resume line, exit 128 + 15), with no leaked-semaphore warnings or tracebacks."""
    runs = tmp_path / "runs"
    cmd = [
        sys.executable,
        "-m",
        "posenc.cli.main",
        "compare",
        "--preset",
        "quick",
        "--schemes",
        "rope",
        "--steps",
        "100000",
        "--corpus",
        str(tiny_corpus),
        "--out",
        str(runs),
    ]
    proc = subprocess.Popen(
        cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    lines = []
    while not any("checkpoint" in line for line in lines):  # the job trains and has saved a checkpoint
        lines.append(proc.stderr.readline())
        assert lines[-1], "".join(lines)
    os.killpg(proc.pid, signal.SIGTERM)
    err = "".join(lines) + proc.communicate(timeout=120)[1]
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "leaked" not in err and "Traceback" not in err, err
    assert err.splitlines()[-2:] == [
        f"posenc: interrupted: finished jobs are kept in {runs / 'quick'}; "
        "each interrupted one resumes from its last checkpoint",
        f"posenc: resume with: {shlex.join(['posenc', *cmd[3:]])}",
    ]
    assert (runs / "quick" / "rope" / "seed0").is_dir()
