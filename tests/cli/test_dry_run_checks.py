"""--dry-run fails on the settings a run rejects, with the run's own one-line error (issue 59): each check runs
before the dry run exits, so both paths share it; and a preset's encoding_params are checked against the schemes the
command trains."""

from pathlib import Path

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


def bad_data(tmp_path: Path, kind: str) -> tuple[list[str], str]:
    """(flags, the run's one-line error) of one kind of bad data."""
    path = tmp_path / kind
    if kind == "missing":
        return ["--corpus", str(path)], f"corpus '{path}' not found (not a known corpus, file or directory)"
    if kind == "empty file":
        path.write_text("")
    elif kind == "blank file":
        path.write_text(" \n\n\t\n")
    elif kind == "empty directory":
        path.mkdir()
        (path / ".hidden").write_text("a hidden file is no document")
    elif kind == "binary file":
        path.write_bytes(bytes([0xFF, 0xFE, 0x00]) * 100)
        return ["--corpus", str(path)], f"corpus '{path}' has no UTF-8 text (1 file(s) skipped as binary)"
    elif kind == "hf:":
        return ["--corpus", "hf:"], "corpus 'hf:' names no dataset: give hf:NAME[:CONFIG], hf:text:PATH or hf:json:PATH"
    elif kind == "tokenizer":
        return [
            "--tokenizer",
            "wordpiece",
        ], "unknown tokenizer 'wordpiece' (use 'byte' or 'bpeN' with 256 < N <= 65535)"
    return ["--corpus", str(path)], f"corpus '{path}' is empty (no file of it holds text)"


KINDS = ["missing", "empty file", "blank file", "empty directory", "binary file", "hf:", "tokenizer"]


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]], ids=["run", "dry-run"])
@pytest.mark.parametrize("command", [["train", "--scheme", "rope"], ["compare", "--schemes", "rope", "--no-isolate"]])
@pytest.mark.parametrize("kind", KINDS)
def test_the_dry_run_refuses_the_data_the_run_refuses(tmp_path, capsys, command, kind, dry_run):
    flags, message = bad_data(tmp_path, kind)
    out = tmp_path / "out"
    one_line_exit_2(
        capsys, [*command, "--preset", "quick", "--steps", "1", *flags, "--out", str(out), *dry_run], message
    )
    assert not out.exists()  # refused before anything is written


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]], ids=["run", "dry-run"])
@pytest.mark.parametrize("model", ["runs/nosuch", "nosuch", "./nosuch", "a/b/c"])
def test_a_missing_model_path_is_refused_at_once_with_or_without_dry_run(tmp_path, capsys, model, dry_run):
    pytest.importorskip("transformers")  # without it the run names the missing extra first
    out = tmp_path / "out"
    argv = ["extend", "--quick", "--model", model, "--schedules", "none", "--out", str(out), *dry_run]
    one_line_exit_2(capsys, argv, f"model path {model} does not exist (a Hugging Face hub id is ORG/NAME)")
    assert not out.exists()


@pytest.mark.parametrize(
    "argv",
    [["generate", "runs/nosuch", "--prompt", "hi"], ["finetune", "--quick", "--model", "runs/nosuch", "--dry-run"]],
    ids=["generate", "finetune"],
)
def test_other_commands_refuse_a_missing_model_path_at_once(tmp_path, capsys, argv):
    pytest.importorskip("transformers")
    pytest.importorskip("peft")  # finetune names the missing extra first
    one_line_exit_2(
        capsys,
        [*argv, "--out", str(tmp_path / "out")] if argv[0] == "finetune" else argv,
        "model path runs/nosuch does not exist (a Hugging Face hub id is ORG/NAME)",
    )


@pytest.mark.parametrize("command", ["extend", "finetune"])
@pytest.mark.parametrize(
    "spec, message",
    [
        ("rope:factor=0", "scheme 'rope:factor=0': rope: factor must be a number >= 1 (positions / factor), got 0"),
        ("fope:gain=-1", "scheme 'fope:gain=-1': fope: gain must be a number in [0, 10], got -1"),
        ("acc-token-qk", "'acc-token-qk' reads token ids, which a Hugging Face attention layer does not receive"),
    ],
)
def test_a_pretrained_dry_run_checks_scheme_values_before_the_model_loads(tmp_path, capsys, command, spec, message):
    """The dry run of extend and finetune builds each scheme on a stand-in layer: a value the model would refuse
    once loaded (minutes later) is refused at once, as train's dry run does."""
    one_line_exit_2(
        capsys, [command, "--preset", "quick", "--scheme", spec, "--out", str(tmp_path / "x"), "--dry-run"], message
    )
    assert not (tmp_path / "x").exists()


def test_a_pretrained_dry_run_accepts_a_valid_pattern_with_its_parameters(tmp_path, capsys):
    argv = ["extend", "--preset", "quick", "--scheme", "gemma3:factor=8", "--out", str(tmp_path / "x"), "--dry-run"]
    assert main(argv) == 0
    assert "1 schemes" in capsys.readouterr().out


@pytest.mark.parametrize(
    "setting, message",
    [
        (
            "eval.multiples=[1,1,2]",
            "invalid eval.multiples=[1, 1, 2] (command line): Value error, each entry once: 1 repeated",
        ),
        (
            "task_eval.multiples=[1,4,4]",
            "invalid task_eval.multiples=[1, 4, 4] (command line): Value error, each entry once: 4 repeated",
        ),
    ],
)
def test_a_repeated_length_is_refused(tmp_path, capsys, setting, message):
    """A length given twice was scored twice: two identical records, and the report showed a spread of 0 over one
    seed."""
    one_line_exit_2(
        capsys, ["compare", "--preset", "quick", "--set", setting, "--out", str(tmp_path), "--dry-run"], message
    )


def test_two_spellings_of_one_scheme_are_refused(tmp_path, capsys):
    """rope and rope:rope_theta=10000 are one spec: both trained, then reported as one scheme of two 'seeds'."""
    one_line_exit_2(
        capsys,
        [
            "compare",
            "--preset",
            "quick",
            "--schemes",
            "rope",
            "rope:rope_theta=10000",
            "--out",
            str(tmp_path),
            "--dry-run",
        ],
        "invalid schemes=['rope', 'rope:rope_theta=10000'] (command line): Value error, each entry once: rope, "
        "rope:rope_theta=10000 repeated (one spec)",
    )


@pytest.mark.parametrize("command", ["extend", "finetune"])
@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--name", "../x"],
            "invalid name=../x (command line): Value error, must be a plain directory name (letters, "
            "digits, . _ -), got '../x'",
        ),
        (["--seed", "-1"], "invalid seed=-1 (command line): Input should be greater than or equal to 0"),
    ],
)
def test_pretrained_commands_validate_name_and_seed_as_compare_does(tmp_path, capsys, command, flags, message):
    """extend accepted --name ../x (writing runs/extend/../x) and --seed -1; finetune the name."""
    one_line_exit_2(capsys, [command, "--quick", *flags, "--dry-run"], message)


def test_extend_dry_run_counts_the_passkey_adaptations_a_run_scores(capsys):
    """Passkey trials run for the schedules of the run that passkey_schedules keeps, each method and each scheme: the
    count took passkey_schedules' length (5 for one schedule and three schemes where the run scores 4)."""
    argv = ["extend", "--quick", "--schedules", "none", "--scheme", "rope", "alibi", "acc-rand-qkv:a=1", "--dry-run"]
    assert main(argv) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith("1 passkey trial(s) for each of 4 adaptation(s)")


def test_report_refuses_to_write_over_a_run_it_reads(tmp_path, capsys):
    """`posenc report RUN --out RUN` replaced the compare run's own report.md and ppl_ratio.png without a word."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "report.md").write_text("the compare run's report")
    one_line_exit_2(
        capsys,
        ["report", str(run), "--out", str(run)],
        f"--out {run} is one of the runs read: its report would be replaced; give another folder",
    )
    assert (run / "report.md").read_text() == "the compare run's report"


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--schedules", "leaky-rerope", "--leak", "0.5"], "leaky-rerope: leak k must be > 1, got 0.5"),
        (
            ["--schedules", "yarn", "--beta-fast", "-1"],
            "yarn needs beta_fast > beta_slow > 0, got beta_fast=-1.0, beta_slow=1.0",
        ),
        (
            ["--schedules", "rerope", "--rerope-window", "0"],
            "rope schedule 'rerope': window must be a positive integer, got 0",
        ),
    ],
)
def test_extend_dry_run_refuses_a_schedule_setting_out_of_range(tmp_path, capsys, flags, message):
    """Each setting's range needs no model: the dry run passed --leak 0.5, which the run refused once loaded."""
    one_line_exit_2(capsys, ["extend", "--quick", *flags, "--out", str(tmp_path / "x"), "--dry-run"], message)
    assert not (tmp_path / "x").exists()


def test_finetune_refuses_a_factor_without_a_schedule(tmp_path, capsys):
    """--factor 4 on a scheme swap scaled nothing and was accepted silently."""
    argv = ["finetune", "--quick", "--factor", "4", "--out", str(tmp_path / "x")]
    for dry in (["--dry-run"], []):
        one_line_exit_2(
            capsys,
            [*argv, *dry],
            "factor 4 is a RoPE schedule's scale factor: give --schedule with it (a scheme takes its own parameters, "
            "e.g. --scheme rope:factor=4)",
        )
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("dry_run", [["--dry-run"], []])
def test_answer_only_loss_on_text_is_refused_with_or_without_dry_run(tmp_path, capsys, dry_run):
    """A dry run printed it valid (exit 0) while the run refused it after loading the corpus."""
    argv = ["train", "--scheme", "rope", "--preset", "quick", "--steps", "3", "--set", "train.loss=answers"]
    assert main([*argv, "--out", str(tmp_path / "r"), *dry_run]) == 2
    assert capsys.readouterr().err == (
        "posenc: error: train.loss 'answers' needs a synthetic task corpus (posenc.data.tasks), not 'shakespeare'\n"
    )
    assert not (tmp_path / "r").exists()
