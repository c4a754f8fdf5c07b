"""Bad input a tenth pass over the command line found (issue 59): each is one line and exit 2 naming what is wrong,
nothing written; before, each printed a traceback or was taken without a word."""

import pytest

from tests.cli.runs import one_line_exit_2


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--preset", "quick", "--scheme", "rope", "--steps", "1", "--out", "{long}"],
        ["eval", "{long}"],
        ["diagnose", "{long}"],
        ["report", "{long}"],
        ["train", "--scheme", "rope", "--preset", "{long}.yaml", "--dry-run"],
        ["--import", "{long}.py", "list"],
    ],
)
def test_a_path_with_a_name_past_the_file_systems_limit_is_one_line(tmp_path, capsys, argv):
    """A path component of 300 characters raised OSError ENAMETOOLONG with its traceback, exit 1."""
    long = str(tmp_path / ("b" * 300))
    one_line_exit_2(capsys, [a.format(long=long) for a in argv], f"file name too long: {long}")
    assert list(tmp_path.iterdir()) == []


def test_a_symlink_loop_given_to_report_is_one_line(tmp_path, capsys, monkeypatch):
    """report on a link loop raised RuntimeError("Symlink loop from ...") from Path.resolve, exit 1."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "loop2").symlink_to("loop1")
    (tmp_path / "loop1").symlink_to("loop2")
    one_line_exit_2(capsys, ["report", "loop1"], "too many levels of symbolic links: loop1")
