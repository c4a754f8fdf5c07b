"""The run stamp: what decides a run's numbers (versions, commit, device, dtype, threads, command)."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from posenc.store.stamp import bf16_units, git_commit, run_stamp, stamp_line, utc_now, wall_line

ROOT = Path(__file__).resolve().parents[2]


def test_stamp_records_the_settings_that_change_numbers():
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        s = run_stamp()
    finally:
        torch.set_num_threads(old)
    assert s["threads"] == 1 and s["torch"] == torch.__version__
    assert s["bf16_units"] == bf16_units()
    assert s["dtype"] == "float32 weights, float32 compute"  # no autocast unless a training run says so
    assert run_stamp("fp32")["dtype"] == "float32 weights, float32 compute"
    assert run_stamp("bf16")["dtype"] == "float32 weights, bfloat16 autocast"
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
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


def test_bf16_units_are_read_from_the_cpu_flags(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_tile amx_bf16 avx512_bf16\n\nprocessor\t: 1\nflags\t\t: fpu\n"
    )
    assert bf16_units(info) == ["amx_bf16", "avx512_bf16"]
    info.write_text("flags\t\t: fpu avx2 avx512f avx512_vnni\n")  # AVX512 without BF16: bf16 would be emulated
    assert bf16_units(info) == []
    assert bf16_units(tmp_path / "absent") == []


def test_wall_line_sums_the_finished_invocations_and_says_what_it_leaves_out():
    calls = [
        {"commit": "a"},  # before the fields
        {"invocation": "1", "started": "2026-12-06T00:00:00Z"},
        {"invocation": "1", "finished": "2026-12-06T01:30:00Z"},
        {"invocation": "2", "started": "2026-12-06T02:00:00Z"},  # killed outright: no end
        {"invocation": "3", "started": "2026-12-06T03:00:00Z"},
        {"invocation": "3", "finished": "2026-12-06T03:10:30Z"},
    ]
    assert wall_line(calls) == (
        "at least 100 min over 2 invocations (2026-12-06T00:00:00Z to 2026-12-06T03:10:30Z); 1 killed before its end "
        "(not counted); 1 recorded before the invocation times (not counted)"
    )
    stopped = [  # Ctrl-C or SIGTERM: the end line says so, and the time to the stop counts
        {"invocation": "4", "started": "2026-12-06T04:00:00Z"},
        {"invocation": "4", "finished": "2026-12-06T04:05:00Z", "interrupted": True},
        {"invocation": "5", "started": "2026-12-06T04:10:00Z"},
        {"invocation": "5", "finished": "2026-12-06T04:30:00Z"},
    ]
    assert wall_line(stopped) == (
        "25 min over 2 invocations (2026-12-06T04:00:00Z to 2026-12-06T04:30:00Z); 1 stopped by an interrupt "
        "(counted to its stop)"
    )
    assert wall_line(calls[1:3]) == "90 min over 1 invocation (2026-12-06T00:00:00Z to 2026-12-06T01:30:00Z)"
    assert wall_line([]) == "no invocation recorded"
    short = [
        {"invocation": "6", "started": "2026-12-06T05:00:00Z"},
        {"invocation": "6", "finished": "2026-12-06T05:00:42Z"},
    ]
    assert wall_line(short) == "42 s over 1 invocation (2026-12-06T05:00:00Z to 2026-12-06T05:00:42Z)"  # not "0 min"
    with pytest.raises(ValueError):
        wall_line([{"invocation": "1", "started": "06/12/2026"}, {"invocation": "1", "finished": "07/12/2026"}])


def test_finish_run_appends_this_invocations_end_only(tmp_path):
    from posenc.config.plan import load_preset
    from posenc.jobs.launcher import finish_run, record_run
    from posenc.store.checkpoint import read_jsonl

    preset = load_preset("quick")
    first = record_run(tmp_path, preset)
    finish_run(tmp_path, first)
    second = record_run(tmp_path, preset)  # a resumed run, killed before its end
    calls = read_jsonl(tmp_path / "invocations.jsonl")
    assert calls[0] == first and calls[2] == second and first["invocation"] != second["invocation"]
    assert set(calls[1]) == {"invocation", "finished"} and calls[1]["invocation"] == first["invocation"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", calls[1]["finished"]) and utc_now() >= calls[1]["finished"]
    assert wall_line(calls).endswith("; 1 killed before its end (not counted)")
    assert wall_line(calls).startswith("at least ")
    finish_run(tmp_path, second, interrupted=True)
    calls = read_jsonl(tmp_path / "invocations.jsonl")
    assert calls[-1]["interrupted"] is True and calls[-1]["invocation"] == second["invocation"]
    assert "at least" not in wall_line(calls) and wall_line(calls).endswith(
        "; 1 stopped by an interrupt (counted to its stop)"
    )
