"""--dry-run fails on the settings a run rejects, with the run's own one-line error (issue 59): each check runs
before the dry run exits, so both paths share it; and a preset's encoding_params are checked against the schemes the
command trains."""

import pytest

from posenc.cli.main import main


def one_line_exit_2(capsys, argv: list[str], message: str) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert err == f"posenc: error: {message}\n"


@pytest.mark.parametrize("flag", ["--parallel", "--nproc-per-node"])
def test_compare_dry_run_refuses_launcher_options_the_run_refuses(tmp_path, capsys, flag):
    argv = ["compare", "--preset", "quick", flag, "0", "--out", str(tmp_path), "--dry-run"]
    got = "0, 1" if flag == "--parallel" else "1, 0"
    one_line_exit_2(capsys, argv, f"--parallel and --nproc-per-node must be >= 1 and need job isolation, got {got}")
    assert not any(tmp_path.iterdir())


THETA = "model.encoding_params={rope_theta: 500}"  # a parameter of rope that the quick preset's nope, alibi lack


@pytest.mark.parametrize(
    "argv",
    [["train", "--scheme", "rope"], ["compare", "--schemes", "rope", "rope:rotary_fraction=0.5"]],
    ids=["train", "compare"],
)
def test_encoding_params_are_checked_against_the_trained_schemes_only(tmp_path, capsys, argv):
    assert main([*argv, "--preset", "quick", "--out", str(tmp_path / "x"), "--set", THETA, "--dry-run"]) == 0
    assert "rope_theta: 500" in capsys.readouterr().out
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "argv", [["train", "--scheme", "nope"], ["compare", "--schemes", "rope", "nope"]], ids=["train", "compare"]
)
def test_encoding_params_a_trained_scheme_lacks_are_refused(tmp_path, capsys, argv):
    argv = [*argv, "--preset", "quick", "--out", str(tmp_path / "x"), "--set", THETA, "--dry-run"]
    one_line_exit_2(capsys, argv, "scheme 'nope' has no parameter 'rope_theta'; valid: none")
