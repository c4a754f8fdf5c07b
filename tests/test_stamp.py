"""The run stamp: what decides a run's numbers (versions, commit, device, dtype, threads, command)."""

import shlex
import subprocess
import sys
from pathlib import Path

import torch

from posenc.stamp import git_commit, run_stamp, stamp_line

ROOT = Path(__file__).resolve().parents[1]


def test_stamp_records_the_settings_that_change_numbers():
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        s = run_stamp()
    finally:
        torch.set_num_threads(old)
    assert s["threads"] == 1 and s["torch"] == torch.__version__
    assert s["dtype"] == ("float32 weights, bfloat16 autocast" if torch.cuda.is_available() else "float32 weights, float32 compute")
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert (git_commit() or "").split("+")[0] == head
    if not torch.cuda.is_available():
        assert s["device"].startswith("cpu (") and f"{torch.backends.cpu.get_cpu_capability()} kernels)" in s["device"]
    line = stamp_line(s)
    assert f"commit {s['commit']}" in line and "1 threads" in line and s["dtype"] in line


def test_stamp_command_is_the_command_line_a_shell_retypes(monkeypatch):
    argv = ["/venv/bin/posenc", "generate", "runs/my run", "--prompt", "HAMLET. To be", "--top-k", "20"]
    monkeypatch.setattr(sys, "argv", argv)
    command = run_stamp()["command"]
    assert command == "posenc generate 'runs/my run' --prompt 'HAMLET. To be' --top-k 20"
    assert shlex.split(command) == ["posenc", *argv[1:]]


def test_stamp_line_says_when_transformers_is_not_installed():
    s = {**run_stamp(), "transformers": None}  # `make demo`'s environment has no transformers
    assert ", transformers not installed, " in stamp_line(s)
    assert f", transformers {run_stamp()['transformers']}, " in stamp_line(run_stamp())
