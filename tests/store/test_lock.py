"""A run directory is held by one posenc process at a time (issue 59: two `posenc compare --out X` started 0.5 s
apart both exited 0 with every record of results.jsonl twice, and two `posenc train --out D` duplicated every line
of train.jsonl): the second is refused in one line naming the holder's pid and writes nothing; a lock left by a
killed process does not block; no command leaves its lock file behind."""

import os
import signal
import subprocess
import sys

import pytest

from posenc.cli.main import main
from posenc.errors import PosencError
from posenc.store import lock
from posenc.store.lock import LOCK_FILE, PARENT_VAR, hold_run_dir, holding, holds, run_files

QUICK = ["--preset", "quick", "--steps", "2"]


def files(folder):
    """{relative path: bytes} of every file under ``folder``."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(capsys, argv, path, pid):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err == (
        f"posenc: error: {path} is in use by another posenc process (pid {pid}); wait for it or use another --out\n"
    ), err


def test_a_second_holder_is_refused_naming_the_first_ones_pid(tmp_path, holder):
    proc = holder(tmp_path / "run")
    assert (tmp_path / "run" / LOCK_FILE).read_text() == f"{proc.pid}\n"
    with holding(), pytest.raises(PosencError) as err:
        hold_run_dir(tmp_path / "run")
    assert str(err.value) == (
        f"{tmp_path / 'run'} is in use by another posenc process (pid {proc.pid}); wait for it or use another --out"
    )


def test_a_lock_held_by_a_killed_process_does_not_block(tmp_path, holder):
    proc = holder(tmp_path / "run")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert (tmp_path / "run" / LOCK_FILE).read_text() == f"{proc.pid}\n"  # its stale lock file stays
    with holding():
        hold_run_dir(tmp_path / "run")
        assert holds(tmp_path / "run")
        assert (tmp_path / "run" / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    assert not (tmp_path / "run" / LOCK_FILE).exists() and not holds(tmp_path / "run")  # released, removed


def test_one_process_holds_a_directory_once_and_only_in_a_scope(tmp_path):
    (tmp_path / "run").mkdir()
    hold_run_dir(tmp_path / "run")  # outside a scope (the library called from Python): nothing held
    assert not holds(tmp_path / "run") and not (tmp_path / "run" / LOCK_FILE).exists()
    with holding():
        hold_run_dir(tmp_path / "run")
        with holding():  # a scope inside one is part of it
            hold_run_dir(tmp_path / "run")  # held already: no second lock (which its own first would block)
        assert holds(tmp_path / "run")
        assert run_files(tmp_path / "run") == []  # the lock file is no result
    assert lock._held is None and list((tmp_path / "run").iterdir()) == []


def test_a_directory_inside_a_held_one_is_refused_unless_its_holder_started_this_process(tmp_path, holder, monkeypatch):
    proc = holder(tmp_path / "runs" / "quick")
    inside = tmp_path / "runs" / "quick" / "rope" / "seed0"
    with holding(), pytest.raises(PosencError, match=rf"quick is in use by another posenc process \(pid {proc.pid}\)"):
        hold_run_dir(inside, ancestors=True)
    monkeypatch.setenv(PARENT_VAR, str(tmp_path / "runs" / "quick"))  # a compare's job under torchrun
    with holding():
        hold_run_dir(inside, ancestors=True)
        hold_run_dir(tmp_path / "runs", ancestors=True)  # a folder above a held one is not inside it


@pytest.mark.slow
def test_train_into_a_held_run_is_refused_and_leaves_its_files_as_they_were(tmp_path, holder, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--scheme", "rope", *QUICK, "--out", "D"]) == 0
    assert not (tmp_path / "D" / LOCK_FILE).exists()  # released, and removed, when the command ended
    proc = holder(tmp_path / "D")
    before, _ = files(tmp_path / "D"), capsys.readouterr()
    refused(capsys, ["train", "--scheme", "rope", *QUICK, "--out", "D", "--resume"], "D", proc.pid)
    refused(capsys, ["train", "--scheme", "rope", *QUICK, "--out", "D"], "D", proc.pid)
    code = main(["eval", "D", "--multiples", "1"])
    assert code == 2 and capsys.readouterr().err == (
        f"posenc: error: D is in use by another posenc process (pid {proc.pid}); wait for it\n"
    )
    assert files(tmp_path / "D") == before  # nothing written: the log's lines not doubled, no eval.jsonl


@pytest.mark.slow
def test_a_second_compare_into_a_held_run_root_is_refused_before_it_writes(tmp_path, holder, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    proc = holder(tmp_path / "X" / "quick")
    refused(capsys, ["compare", *QUICK, "--schemes", "rope", "--out", "X"], "X/quick", proc.pid)
    assert files(tmp_path / "X") == {f"quick/{LOCK_FILE}": f"{proc.pid}\n".encode()}  # no record, no preset.json
    # a run directory inside the compare's run root (a job's) is the compare's while it runs
    refused(capsys, ["train", "--scheme", "rope", *QUICK, "--out", "X/quick/rope/seed0"], "X/quick", proc.pid)
    assert not (tmp_path / "X" / "quick" / "rope").exists()


@pytest.mark.slow
def test_a_real_second_posenc_process_is_refused_in_one_line(tmp_path, holder):
    proc = holder(tmp_path / "runs" / "quick")
    second = subprocess.run(
        [sys.executable, "-m", "posenc", "compare", *QUICK, "--schemes", "rope", "--out", "runs"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert second.returncode == 2 and second.stderr == (
        f"posenc: error: runs/quick is in use by another posenc process (pid {proc.pid}); "
        "wait for it or use another --out\n"
    )
    assert run_files(tmp_path / "runs" / "quick") == []
