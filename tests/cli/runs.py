"""What the command-line tests of damaged runs and bad input share: a 2-step train run and a one-scheme quick compare
run (``trained_runs``), and the check that a command failed in one line with exit code 2."""

from pathlib import Path

from posenc.cli.main import main

QUICK = ["--preset", "quick", "--steps", "2", "--set", "train.warmup=1"]  # warmup 5 > 2 steps would add a line
COMPARE = ["compare", "--preset", "quick", "--set", "schemes=[rope]", "--set", "train.steps=2"]


def one_line_exit_2(capsys, argv, message):
    """Run the posenc command ``argv``: exit code 2 and one line on stderr, ``posenc: error: ...`` holding
    ``message``; returns that line."""
    code = main(list(argv))
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("posenc: error: ") and message in err, err
    return err


def trained_runs(root: Path) -> Path:
    """``root/tr``: a 2-step RoPE train run; ``root/cmp/quick``: a one-scheme quick compare run. Returns root."""
    assert main(["train", "--scheme", "rope", *QUICK, "--out", str(root / "tr"), "-q"]) == 0
    assert main([*COMPARE, "--out", str(root / "cmp"), "-q"]) == 0
    return root
