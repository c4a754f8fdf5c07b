"""Bad input to ``posenc harness`` and to lm-eval's command with posenc's model (``python -m posenc.harness``), issue
59's sweep: each is one line and exit code 2, and nothing is written."""

import subprocess
import sys
from pathlib import Path

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
        # a bad adaptation after a good one: every adaptation is checked before anything is written (out/cells was)
        (["--adaptations", "none", "yarn:factr=2"], "model_args: unknown key 'factr'"),
        (["--adaptations", "none", "scheme:nosuch"], "unknown scheme 'nosuch'"),
        # what needs the model's weights: refused when the first model is adapted, before out is made
        (["--adaptations", "scheme:gemma3"], "scheme 'gemma3' is a pattern of 6 layer entries for a model of 2 layers"),
        (["--model", "runs/nosuch"], "model path runs/nosuch does not exist (a Hugging Face hub id is ORG/NAME)"),
        (
            ["--model", "{empty}"],
            "holds no config.json (not a Hugging Face model directory): give a Hugging Face model",
        ),
        (["--tokenizer", "{empty}"], "--tokenizer {empty} holds no Hugging Face tokenizer transformers can load"),
        (["--tokenizer", "runs/nosuch"], "--tokenizer runs/nosuch does not exist"),
    ],
)
def test_posenc_harness_bad_input(llama_dir, tmp_path, capsys, flags, message):
    empty = tmp_path / "empty"
    empty.mkdir()
    flags, message = [f.format(empty=empty) for f in flags], message.format(empty=empty)
    out = tmp_path / "out"
    argv = ["harness", "--model", str(llama_dir / "tiny"), "--tasks", "niah_single_1", "--lengths", "64"]
    one_line_exit_2(capsys, main([*argv, *flags, "--out", str(out)]), message)
    assert not out.exists()  # nothing written: no cells folder, no invocations.jsonl


@pytest.mark.parametrize(
    "model_args,message",
    [
        ("windw=3", "model_args: unknown key 'windw'"),
        ("pretrained={tiny},factor=2", "model_args: factor is a schedule setting: it needs schedule=NAME"),
        ("pretrained={tiny},dtype=float8", "model_args: dtype must be one of"),
        ("pretrained={tiny},scheme=nosuch", "unknown scheme 'nosuch'"),
        ("pretrained={tiny},scheme=rope,schedule=yarn", "model_args: a scheme replaces RoPE"),
    ],
)
def test_lm_evals_command_with_posenc_refuses_bad_model_args_in_one_line(llama_dir, model_args, message):
    """``python -m posenc.harness`` (lm-eval's command with posenc's model registered) as a subprocess: exit code 2,
    posenc's error as one line (the last, after lm-eval's own log lines), no traceback; each refused before the
    model loads or any task runs."""
    root = Path(__file__).resolve().parents[2]
    argv = ["run", "--model", "posenc", "--model_args", model_args.format(tiny=llama_dir / "tiny")]
    proc = subprocess.run(
        [sys.executable, "-m", "posenc.harness", *argv, "--tasks", "niah_single_1", "--device", "cpu"],
        cwd=root,
        capture_output=True,
        text=True,
    )
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert [line for line in lines if line.startswith("posenc: error: ")] == lines[-1:] and message in lines[-1]


def test_ruler_on_a_train_run_needs_a_tokenizer_in_one_line(tmp_path, capsys):
    """A posenc train run (byte tokenizer) has no Hugging Face tokenizer for RULER to size its prompts with: lm-eval
    raised an AssertionError traceback after the model loaded and left the output folder behind."""
    run = tmp_path / "run"
    assert main(["train", "--scheme", "rope", "--preset", "quick", "--steps", "1", "--out", str(run)]) == 0
    capsys.readouterr()
    out = tmp_path / "out"
    code = main(["harness", "--model", str(run), "--tasks", "niah_single_1", "--lengths", "64", "--out", str(out)])
    one_line_exit_2(capsys, code, "--tasks niah_single_1: RULER sizes its prompts with a Hugging Face tokenizer")
    assert not out.exists()


def test_a_length_ruler_builds_no_sample_of_is_one_line(llama_dir, tmp_path, capsys):
    """lm-eval raised a ValueError traceback ("Could not generate any sample ... Raise max_seq_lengths")."""
    argv = ["harness", "--model", str(llama_dir / "tiny"), "--tasks", "niah_single_1", "--lengths", "64"]
    code = main([*argv, "--limit", "1", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err  # lm-eval's sample bars and nltk's offline notice come first, then posenc's line
    assert code == 2  # caught: lm-eval's ValueError exited 1 with its traceback
    assert err.splitlines()[-1] == (
        "posenc: error: niah_single_1 builds no sample of 64 tokens (its prompt does not fit): raise --lengths"
    )
