"""Bad input a tenth pass over the command line found (issue 59): each is one line and exit 2 naming what is wrong,
nothing written; before, each printed a traceback or was taken without a word."""

import pytest

from posenc.errors import PosencError
from tests.cli.runs import QUICK, one_line_exit_2


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


def test_a_dry_run_refuses_a_run_name_past_the_file_systems_limit_as_the_run_does(tmp_path, capsys):
    """compare --dry-run --name <300 characters> into a folder not yet made said the run was valid; the run refused."""
    out = tmp_path / "new"
    for dry in (["--dry-run"], []):
        argv = ["compare", "--preset", "quick", "--name", "c" * 300, "--out", str(out), *dry]
        one_line_exit_2(capsys, argv, "a name of 300 bytes passes the file system's 255")
    assert list(tmp_path.iterdir()) == []


def test_train_refuses_a_folder_holding_other_files_as_finetune_does(tmp_path, capsys):
    """train --out into a folder of unrelated files trained beside them (finetune refused it)."""
    out = tmp_path / "notes"
    out.mkdir()
    (out / "todo.txt").write_text("mine")
    one_line_exit_2(capsys, ["train", "--scheme", "rope", *QUICK, "--out", str(out)], "holds files but no train run")
    assert sorted(p.name for p in out.iterdir() if p.name != ".lock") == ["todo.txt"]


def test_generate_names_a_missing_model_before_an_empty_prompt(tmp_path, capsys, monkeypatch):
    """generate NOSUCH with nothing on stdin blamed the empty stdin, not the model path that does not exist."""
    import io

    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"")))
    one_line_exit_2(capsys, ["generate", str(tmp_path / "nosuch")], f"model path {tmp_path / 'nosuch'} does not exist")


def test_a_symlink_loop_given_to_report_is_one_line(tmp_path, capsys, monkeypatch):
    """report on a link loop raised RuntimeError("Symlink loop from ...") from Path.resolve, exit 1."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "loop2").symlink_to("loop1")
    (tmp_path / "loop1").symlink_to("loop2")
    one_line_exit_2(capsys, ["report", "loop1"], "too many levels of symbolic links: loop1")


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--schedules", "rerope", "--rerope-window", "100000"],
            "rerope window 100000 must be below the native context L0 = 256",
        ),
        (
            ["--schedules", "none", "--method", "sinks:n_sink=2,window=100000"],
            "method sinks: n_sink + window = 100002 passes the trained length 256",
        ),
        (
            ["--schedules", "none", "--method", "pi+self-extend:window=600", "--factor", "2"],
            "method self-extend: window = 600 passes the trained length 512",
        ),
    ],
)
def test_extend_refuses_a_window_that_never_acts_or_reads_untrained_positions(llama_dir, capsys, flags, message):
    """A ReRoPE window or a sinks window past the native context (256) was scored and labelled as the method, with
    the plain model's numbers (ppl 53.88 in both rows); posenc eval refused the same setting."""
    argv = ["extend", "--model", str(llama_dir / "tiny"), "--corpus", str(llama_dir / "corpus.txt")]
    argv += ["--out", str(llama_dir / "x"), "--lengths", "64", "--max-windows", "1", "--passkey-lengths", *flags]
    one_line_exit_2(capsys, argv, message)
    assert not (llama_dir / "x").exists()


def test_a_pretrained_models_method_within_what_its_schedule_reaches_is_taken(llama_dir):
    from posenc.hf.adaptation import Adaptation
    from posenc.hf.loading import load
    from posenc.hf.schedules import Extension

    adapted = Adaptation(load(str(llama_dir / "tiny")).model)
    with pytest.raises(PosencError, match="window = 300 passes the trained length 256"):
        adapted.set_method("self-extend:window=300")
    adapted.set_schedule(Extension("yarn", factor=2.0))
    assert adapted.set_method("self-extend:window=300").window == 300  # yarn x2 reaches 512


@pytest.mark.parametrize(
    "setting",
    ["tasks=[flipflop]", "sweep={grid: {train.lr: [0.001, 0.002]}}", "schemes=[alibi]", "eval.multiples=[1,3]"],
)
def test_train_refuses_a_setting_only_compare_reads(tmp_path, capsys, setting):
    """train's dry run printed the resolved settings, exit 0, and the run trained rope on text without the task,
    the grid or the lengths given."""
    key = setting.split("=")[0].split(".")[0]
    argv = ["train", "--preset", "quick", "--scheme", "rope", "--out", str(tmp_path / "r"), "--set", setting]
    one_line_exit_2(capsys, [*argv, "--dry-run"], f"--set {key}: train reads the model and train settings only")
    one_line_exit_2(capsys, argv, f"--set {key}: train reads the model and train settings only")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("dry", [["--dry-run"], []])
def test_a_tokenizer_on_a_task_corpus_is_refused(tmp_path, capsys, dry):
    """The task's vocabulary (5 tokens) was used and config.json recorded train.tokenizer 'bpe300', exit 0."""
    argv = ["train", "--preset", "quick", "--scheme", "rope", "--steps", "1", "--corpus", "flipflop"]
    argv += ["--tokenizer", "bpe300", "--out", str(tmp_path / "r"), *dry]
    one_line_exit_2(
        capsys, argv, "train.tokenizer 'bpe300': the synthetic task 'flipflop' has its own token vocabulary"
    )
    assert not (tmp_path / "r").exists()
