"""Every command a report or an error suggests runs as printed: each backticked ``posenc ...`` command with options
is parsed from the rendered text and resolves (parsed, its imports imported, its preset loaded) in a fresh process
from the repository's root, as a user's would (a study's preset loads only under its ``--import``)."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from posenc.cli.main import main
from posenc.reports.text import markdown
from posenc.store.records import Ppl

ROOT = Path(__file__).resolve().parents[2]
SUGGESTED = re.compile(r"`(posenc [^`]*--[^`]*)`")  # a command with options, not a bare mention of one


RESOLVE = """
import sys
from posenc import encodings
from posenc.cli.main import build_parser
from posenc.config.plan import load_preset
args = build_parser().parse_args(sys.argv[1:])
for target in args.imports:
    encodings.import_schemes(target)
if getattr(args, "preset", None):
    load_preset(args.preset)
"""  # what the command does before its work: parse, import, load the preset; in a fresh process, as a user's


def _check_runs_as_printed(text: str) -> list[str]:
    commands = SUGGESTED.findall(text)
    env = {k: v for k, v in os.environ.items() if k != "POSENC_IMPORT"}  # nothing imported but what it says
    for command in commands:
        argv = [sys.executable, "-c", RESOLVE, *shlex.split(command)[1:]]
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)  # from the repository root
        assert done.returncode == 0, f"{command}: {done.stderr.strip().splitlines()[-1:]}"
    return commands


def test_the_comparison_report_suggests_a_command_that_runs():
    rec = Ppl(scheme="rope", train_length=32, eval_length=32, ppl=5.0, ratio=1.0)
    commands = _check_runs_as_printed(markdown([rec], {}, {"name": "x", "train_length": 32}))
    assert any("--preset retrieval" in c for c in commands), commands


def test_the_scoreboard_suggests_a_command_that_runs(capsys):
    assert main(["report", str(ROOT / "results" / "default"), "--scoreboard"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("posenc: error: the scoreboard needs a task comparison") and err.count("\n") == 1
    assert _check_runs_as_printed(err), err


def test_a_study_preset_without_its_import_is_refused():
    """The check itself: the bare command the reports once printed does not resolve."""
    with pytest.raises(AssertionError, match="unknown preset 'retrieval'"):
        _check_runs_as_printed("`posenc compare --preset retrieval --parallel 2`")
