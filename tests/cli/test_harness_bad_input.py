"""Bad input to ``posenc harness`` (issue 59's sweep): each is one line and exit code 2, and no result is written."""

import pytest

pytest.importorskip("lm_eval")

from posenc.cli.main import main  # noqa: E402


def one_line_exit_2(capsys, code: int, message: str) -> None:
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("posenc: error: ") and message in err, err


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--tasks", "no_such_task"], "--tasks: no_such_task is not an lm-eval task, group or tag (lm-eval ls tasks)"),
        (["--lengths", "0"], "--lengths must be >= 1 token, got 0"),
        (["--lengths", "64", "-5"], "--lengths must be >= 1 token, got -5"),
        (["--limit", "0"], "--limit must be >= 1 sample, got 0"),
        (["--adaptations", "warp:factor=2"], "warp"),
        (["--adaptations", "yarn:factr=2"], "factr"),
        (["--adaptations", "scheme:nosuch"], "nosuch"),
        (["--model", "runs/nosuch"], "model path runs/nosuch does not exist (a Hugging Face hub id is ORG/NAME)"),
    ],
)
def test_posenc_harness_bad_input(llama_dir, tmp_path, capsys, flags, message):
    out = tmp_path / "out"
    argv = ["harness", "--model", str(llama_dir / "tiny"), "--tasks", "niah_single_1", "--lengths", "64"]
    one_line_exit_2(capsys, main([*argv, *flags, "--out", str(out)]), message)
    assert not (out / "table.md").exists() and not any((out / "cells").glob("*"))  # no result written
