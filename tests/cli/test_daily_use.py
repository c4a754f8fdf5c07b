"""The daily-use features of the command (issue 59): progress and --quiet / --verbose, the early-stop line,
--dry-run, generate's prompt sources and separator, train --device, eval --json. Tiny models, a few steps."""

import io
import json
import sys

import pytest
import torch
import yaml

from posenc.cli.main import main
from posenc.eval import progress
from posenc.train.loop import Criterion, fit
from posenc.train.optimizer import make_optimizer
from posenc.train.resume import Checkpoint
from posenc.train.settings import LoopConfig

TRAIN = ["train", "--scheme", "rope", "--preset", "quick", "--steps", "2"]


def run_cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


class Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self):
        return True


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same 2-step run (on the CPU) trained under --quiet and under --verbose, with what each printed."""
    root = tmp_path_factory.mktemp("daily")
    out = {}
    for flag in ("--quiet", "--verbose"):
        stdout, stderr = io.StringIO(), io.StringIO()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(sys, "stdout", stdout)
            mp.setattr(sys, "stderr", stderr)
            argv = [*TRAIN, "--out", str(root / flag[2:]), "--device", "cpu"]
            code = main([flag, *argv] if flag == "--quiet" else [*argv, flag])  # before or after the subcommand
        out[flag[2:]] = (code, stdout.getvalue(), stderr.getvalue(), root / flag[2:])
    return out


def test_quiet_prints_the_result_only_and_verbose_the_step_log_as_lines(runs):
    code, out, err, run = runs["quiet"]
    assert code == 0 and err == "" and out.startswith("trained rope: step 2 of 2, ") and out.count("\n") == 1
    code, out, err, run = runs["verbose"]
    assert code == 0 and out.startswith("trained rope: step 2 of 2, ")
    assert "\r" not in err  # off a terminal: whole lines
    lines = err.splitlines()
    assert any(line.startswith("rope: step 2/2, loss ") and "grad norm" in line for line in lines), err  # step log
    assert any(line.startswith("rope: 100%") and "2/2 [" in line for line in lines), err  # the bar, as lines
    assert any(line.startswith("rope: step 2/2, ") and line.endswith(f"checkpoint {run}") for line in lines), err


def test_the_verbosity_changes_no_number(runs):
    quiet, verbose = runs["quiet"][3], runs["verbose"][3]
    assert (quiet / "model.safetensors").read_bytes() == (verbose / "model.safetensors").read_bytes()
    assert (quiet / "state.pt").stat().st_size > 0
    losses = [
        [json.loads(line)["loss"] for line in (r / "train.jsonl").read_text().splitlines()] for r in (quiet, verbose)
    ]
    assert losses[0] == losses[1] and len(losses[0]) == 1


def test_train_device_is_recorded_in_the_stamp(runs):
    stamp = json.loads((runs["quiet"][3] / "config.json").read_text())["stamp"]
    assert stamp["device"].startswith("cpu (")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with a GPU has cuda")
@pytest.mark.parametrize(
    "device,message",
    [
        ("cuda", "device 'cuda' is not available here"),
        ("cuda:3", "device 'cuda:3' is not available here"),
        ("tpu", "unknown device 'tpu'"),
        ("xla", "unsupported device 'xla': give cpu, cuda, cuda:N or mps"),
    ],
)
def test_train_on_an_absent_device_is_one_line(tmp_path, capsys, device, message):
    code, out, err = run_cli(capsys, *TRAIN, "--out", str(tmp_path / "r"), "--device", device)
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "r").exists()


def test_quiet_and_verbose_exclude_each_other(capsys):
    code, _, err = run_cli(capsys, "--quiet", "list", "--verbose")
    assert code == 2 and err == "posenc: error: --quiet and --verbose exclude each other\n"


def test_a_bad_progress_variable_is_one_line(capsys, monkeypatch):
    monkeypatch.setenv(progress.ENV, "loud")
    code, _, err = run_cli(capsys, "list")
    assert code == 2 and err == "posenc: error: POSENC_PROGRESS must be one of quiet, normal, verbose, got 'loud'\n"


@pytest.mark.parametrize(
    "level,tty,shows",
    [("normal", True, "live"), ("normal", False, None), ("quiet", True, None), ("verbose", False, "lines")],
)
def test_the_bar_rule(monkeypatch, level, tty, shows):
    stderr = Terminal() if tty else io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    with progress.verbosity(level):
        bar = progress.bar(total=3, desc="work", unit="step")
        for _ in range(3):
            bar.update(1)
        bar.close()
    text = stderr.getvalue()
    if shows is None:
        assert text == ""
    elif shows == "live":
        assert "\r" in text and "3/3" in text and "<" in text  # redrawn in place, with the remaining time
    else:
        assert "\r" not in text and text.splitlines()[-1].startswith("work: 100%|") and "3/3 [" in text


def _fit(tmp_path, criterion, end=10):
    w = torch.nn.Parameter(torch.ones(3))
    model = torch.nn.Module()
    model.w = w
    cfg = LoopConfig(batch_size=1, steps=end, warmup=0, ckpt_every=100)
    ckpt = Checkpoint(tmp_path, model.state_dict, make_optimizer(model, cfg))
    return fit(model, cfg, lambda step: ((w**2).sum(), 1), ckpt, desc="toy", criterion=criterion)


def test_an_early_stop_says_which_metric_value_and_step(tmp_path, capsys):
    values = {2: 0.25, 4: 0.75}
    done = _fit(tmp_path, Criterion(2, 0.5, values.get, name="id_accuracy"))
    err = capsys.readouterr().err
    assert done["criterion_step"] == 4 and done["steps"] == 4
    assert "toy: stopped at step 4 of 10: id_accuracy 0.7500 >= 0.5 (train.until)\n" in err
    assert "step 2 of" not in err  # an unmet check says nothing


def test_an_early_stop_is_silent_under_quiet(tmp_path, capsys):
    with progress.verbosity("quiet"):
        done = _fit(tmp_path, Criterion(2, 0.5, {2: 0.9}.get, name="id_accuracy"))
    assert done["criterion_step"] == 2 and capsys.readouterr().err == ""


def test_train_dry_run_prints_the_settings_and_writes_nothing(tmp_path, capsys):
    code, out, err = run_cli(
        capsys, *TRAIN, "--out", str(tmp_path / "r"), "--set", "train.lr=5e-3", "--device", "cpu", "--dry-run"
    )
    assert code == 0 and err == "" and not (tmp_path / "r").exists()
    shown = yaml.safe_load(out)
    assert shown["scheme"] == "rope" and shown["out"] == str(tmp_path / "r") and shown["device"] == "cpu"
    assert shown["train"]["steps"] == 2 and shown["train"]["lr"] == 5e-3 and shown["model"]["encoding"] == "rope"
    assert shown["jobs"] == 1 and out.startswith("# posenc train --dry-run")
    code, _, err = run_cli(capsys, "train", "--scheme", "bogus", "--preset", "quick", "--dry-run")
    assert code == 2 and "unknown scheme 'bogus'" in err  # bad settings fail as in a run


def test_a_resume_dry_run_refuses_what_the_resume_refuses(tmp_path, capsys):
    """The dry run of --resume printed settings that the run then refused: another scheme, fewer steps than
    trained, another learning rate."""
    out = str(tmp_path / "r")
    assert run_cli(capsys, *TRAIN, "--out", out)[0] == 0
    refused = {
        ("--scheme", "alibi"): "its model differs (encoding 'rope' -> 'alibi'); use another --out",
        ("--steps", "1"): "it has trained 2 steps, more than steps=1",
        ("--set", "train.lr=1e-2"): "its training differs (lr 0.003 -> 0.01); use another --out",
    }
    for flags, why in refused.items():
        for dry in ([], ["--dry-run"]):
            code, _, err = run_cli(capsys, *TRAIN, *flags, "--out", out, "--resume", *dry)
            assert (code, err) == (2, f"posenc: error: cannot resume {out}: {why}\n")
    code, shown, _ = run_cli(capsys, *TRAIN, "--steps", "4", "--out", out, "--resume", "--dry-run")
    assert code == 0 and shown.endswith(
        "jobs: 1  # one training run, resumed from its checkpoint, of at most 4 steps\n"
    )


def test_extend_and_finetune_dry_runs_load_no_model(tmp_path, capsys, monkeypatch):
    from posenc.hf import loading

    monkeypatch.setattr(loading, "load", lambda *a, **k: pytest.fail("a dry run loaded the model"))
    argv = ["--quick", "--out", str(tmp_path / "e"), "--schedules", "none", "yarn", "--dry-run"]
    code, out, err = run_cli(capsys, "extend", *argv, "--scheme", "alibi", "--lengths", "256", "512")
    shown = yaml.safe_load(out)
    assert (
        code == 0 and shown["jobs"] == 3 and shown["schedules"] == ["none", "yarn"] and shown["lengths"] == [256, 512]
    )
    assert "# adaptations (2 schedules, 0 methods, 1 schemes)" in out and not (tmp_path / "e").exists()
    code, out, err = run_cli(capsys, "extend", *argv, "--docs", "nosuch")
    assert code == 2 and out == "" and "unknown document(s) nosuch; held-out: " in err  # checked as a run does
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    code, out, err = run_cli(capsys, "finetune", "--quick", "--out", str(tmp_path / "f"), "--steps", "3", "--dry-run")
    shown = yaml.safe_load(out)
    assert code == 0 and shown["jobs"] == 1 and shown["steps"] == 3 and "one fine-tuning run of 3 steps" in out
    assert not (tmp_path / "f").exists()


@pytest.fixture(scope="module")
def greedy(runs):
    """generate's argv for the quiet run: 6 greedy tokens."""
    return ["generate", str(runs["quiet"][3]), "--max-new-tokens", "6", "--temperature", "0"]


def test_generate_separates_prompt_and_completion(greedy, capsys):
    code, plain, _ = run_cli(capsys, *greedy, "--prompt", "To be", "--no-separator")
    assert code == 0 and plain.startswith("To be")
    completion = plain.removesuffix("\n")[len("To be") :]
    code, out, _ = run_cli(capsys, *greedy, "--prompt", "To be")
    assert out == f"To be\n----- completion: 6 tokens -----\n{completion}\n"
    code, out, _ = run_cli(capsys, *greedy, "--prompt", "To be", "--completion-only")
    assert out == f"{completion}\n"


def test_generate_reads_the_prompt_from_a_file_or_stdin(greedy, tmp_path, capsys, monkeypatch):
    code, expected, _ = run_cli(capsys, *greedy, "--prompt", "To be\nor")
    (tmp_path / "p.txt").write_text("To be\nor\n")  # one trailing newline dropped
    code, out, _ = run_cli(capsys, *greedy, "--prompt-file", str(tmp_path / "p.txt"))
    assert code == 0 and out == expected
    for argv in (["--prompt", "-"], []):  # asked for, or piped
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"To be\nor\n")))
        code, out, _ = run_cli(capsys, *greedy, *argv)
        assert code == 0 and out == expected


@pytest.mark.parametrize(
    "make,message",
    [
        (None, "--prompt-file {p} does not exist"),
        (lambda p: p.mkdir(), "--prompt-file {p} is a directory: give a text file"),
        (lambda p: p.write_text("\n"), "--prompt-file {p} is empty"),
        (lambda p: p.write_bytes(b"To \xff be"), "--prompt-file {p} is not UTF-8 text (byte 3)"),
    ],
)
def test_a_bad_prompt_file_is_one_line(greedy, tmp_path, capsys, make, message):
    path = tmp_path / "prompt.txt"
    if make:
        make(path)
    code, out, err = run_cli(capsys, *greedy, "--prompt-file", str(path))
    assert (
        code == 2 and out == "" and err.count("\n") == 1 and err.startswith(f"posenc: error: {message.format(p=path)}")
    )


def test_generate_without_a_prompt_on_a_terminal_says_how_to_give_one(greedy, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", Terminal())
    code, _, err = run_cli(capsys, *greedy)
    assert code == 2 and "no prompt: give --prompt TEXT, --prompt-file PATH or pipe the text on stdin" in err
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"")))
    code, _, err = run_cli(capsys, *greedy)
    assert code == 2 and err == "posenc: error: stdin is empty: give the text to continue\n"


def test_eval_json_is_the_table_in_json_and_nothing_else(runs, capsys):
    argv = ["eval", str(runs["quiet"][3]), "--multiples", "1", "2", "--max-tokens", "64"]
    code, table, _ = run_cli(capsys, *argv)
    code, out, err = run_cli(capsys, "--verbose", *argv, "--json")
    doc = json.loads(out)  # the whole of stdout
    assert "eval L=64: 100%|" in err and "\r" not in err  # the bar of each length on stderr, as lines in a log
    assert code == 0 and doc["scheme"] == "rope" and [r["length"] for r in doc["lengths"]] == [32, 64]
    rows = [line.split() for line in table.splitlines() if line.split() and line.split()[0] in ("32", "64")]
    for row, rec in zip(rows, doc["lengths"]):
        assert row[:4] == [str(rec["length"]), str(rec["windows"]), str(rec["scored_tokens"]), f"{rec['ppl']:.3f}"]
    assert doc["lengths"][0]["ratio"] == 1.0 and rows[1][4] == f"{doc['lengths'][1]['ratio']:.3f}"


BATCH = ["To be, or not", "Ay", "HAMLET. Words, words, words"]  # different lengths: the shorter rows are padded


def test_generate_batch_rows_equal_each_prompt_alone(greedy, tmp_path, capsys, monkeypatch):
    """--batch from a file (a CRLF line end too) and from stdin: one block per row, in input order, each the
    block the prompt gives alone (greedy); --json: one object per row."""
    alone = [run_cli(capsys, *greedy, "--prompt", p) for p in BATCH]
    assert all(code == 0 for code, _, _ in alone)
    (tmp_path / "p.txt").write_bytes(("\r\n".join(BATCH) + "\n").encode())
    code, out, err = run_cli(capsys, *greedy, "--batch", "--prompt-file", str(tmp_path / "p.txt"))
    assert code == 0 and out == "".join(o for _, o, _ in alone), err
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("\n".join(BATCH).encode())))
    code, out, _ = run_cli(capsys, *greedy, "--batch", "--json")
    docs = [json.loads(line) for line in out.splitlines()]
    completions = [o.split("\n", 2)[2].removesuffix("\n") for _, o, _ in alone]
    assert code == 0 and [d["prompt"] for d in docs] == BATCH and [d["completion"] for d in docs] == completions
    assert [d["new_tokens"] for d in docs] == [6, 6, 6]


def test_generate_json_of_one_prompt(greedy, capsys):
    code, block, _ = run_cli(capsys, *greedy, "--prompt", "To be")
    code, doc, _ = run_cli(capsys, *greedy, "--prompt", "To be", "--json")
    completion = block.split("\n", 2)[2].removesuffix("\n")
    assert code == 0 and json.loads(doc) == {"prompt": "To be", "completion": completion, "new_tokens": 6}


@pytest.mark.parametrize(
    "argv,text,message",
    [
        ([], "To be\n\nor", "line 2 of --prompt-file {p} is empty: --batch takes one prompt per line"),
        (["--method", "sinks:n_sink=2,window=8"], "To be\nor", "sinks:n_sink=2,window=8 does not take a padding mask"),
        (["--schedule", "dynamic"], "x" * 40 + "\nor", "dynamic"),  # the rows' lengths set other frequencies
    ],
)
def test_a_bad_batch_is_one_line(greedy, tmp_path, capsys, argv, text, message):
    path = tmp_path / "p.txt"
    path.write_text(text)
    code, out, err = run_cli(capsys, *greedy, "--batch", "--prompt-file", str(path), *argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and message.format(p=path) in err, err


def test_an_empty_batch_line_from_stdin_names_stdin(tmp_path, capsys, monkeypatch):
    """The message named --prompt, which was never given: the read text had replaced it."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a\n\nb\n")))
    (tmp_path / "empty.gguf").touch()  # never opened: refused before any load
    code, out, err = run_cli(capsys, "generate", str(tmp_path / "empty.gguf"), "--batch")
    assert (code, out) == (
        2,
        "",
    ) and err == "posenc: error: line 2 of stdin is empty: --batch takes one prompt per line\n"


@pytest.mark.parametrize("kind", ["pretrained model", "finetune run"])
def test_generate_batch_refuses_a_hugging_face_model_before_loading_it(tmp_path, capsys, monkeypatch, kind):
    if kind == "finetune run":
        model = tmp_path / "ft"
        model.mkdir()
        (model / "finetune.json").write_text("{}")
    else:
        model = tmp_path / "empty.gguf"  # never opened: the refusal comes first
        model.touch()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"To be\nor")))
    code, out, err = run_cli(capsys, "generate", str(model), "--batch")
    expected = (
        f"posenc: error: --batch is for posenc train runs, whose models take a left-padding mask; {model} is a "
        f"{kind}, decoded by transformers one prompt at a time: give one prompt per command\n"
    )
    assert code == 2 and out == "" and err == expected
