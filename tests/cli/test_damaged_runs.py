"""Damaged run files and outputs that belong to another run (issue 59, the last bad-input sweep): each is one line
and exit 2 naming the file, with nothing lost; before, each printed a traceback, or was taken without a word."""

import errno
import json
import math
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from posenc.cli.main import main
from posenc.model import sample
from posenc.store.checkpoint import read_jsonl
from posenc.train import tracking
from tests.cli.runs import COMPARE, QUICK, one_line_exit_2


@pytest.mark.slow
@pytest.mark.parametrize(
    "line,message",
    [
        ("[1, 2]", "line 3 is a JSON array, not a record (an object)"),
        ('{"step": "x", "loss": 1.0}', "record 3 is not a log row (integer step, numeric loss)"),
        ('{"loss": 1.0}', "record 3 is not a log row (integer step, numeric loss)"),
        ("garbage", "line 3 is not a JSON record"),
    ],
)
def test_train_resume_refuses_a_damaged_log(runs, capsys, line, message):
    log = runs / "tr" / "train.jsonl"
    before = log.read_text() + '{"step": 1, "loss": 5.0}\n' + line + "\n"
    log.write_text(before)
    message = message.replace("3", str(before.count("\n")))
    argv = ["train", "--scheme", "rope", *QUICK, "--steps", "3", "--out", str(runs / "tr"), "--resume"]
    config = (runs / "tr" / "config.json").read_text()
    one_line_exit_2(capsys, argv, f"{log} {message}")
    assert log.read_text() == before and (runs / "tr" / "config.json").read_text() == config  # nothing rewritten


@pytest.mark.slow
def test_a_log_that_is_a_folder_is_one_line(runs, capsys):
    log = runs / "tr" / "train.jsonl"
    log.unlink()
    log.mkdir()
    (runs / "tr" / "train_summary.json").unlink()  # an unfinished run: resume reads the log
    argv = ["train", "--scheme", "rope", *QUICK, "--steps", "3", "--out", str(runs / "tr"), "--resume"]
    one_line_exit_2(capsys, argv, f"{log} is damaged (a directory, not a JSONL file)")


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,content,message",
    [
        ("results.jsonl", "[1]", "line 3 is a JSON array, not a record (an object)"),
        ("preset.json", "[1]", "is damaged (a JSON array, not an object)"),
        ("invocations.jsonl", "[1]", "line 3 is a JSON array, not a record (an object)"),
        ("invocations.jsonl", None, "is damaged (a directory, not a JSONL file)"),
    ],
)
def test_a_damaged_compare_run_is_refused_by_report_and_a_rerun(runs, capsys, name, content, message):
    path = runs / "cmp" / "quick" / name
    if content is None:
        path.unlink()
        path.mkdir()
    elif name.endswith(".jsonl"):
        path.write_text("".join(path.read_text().splitlines(keepends=True)[:2]) + content + "\n")
    else:
        path.write_text(content)
    one_line_exit_2(capsys, [*COMPARE, "--out", str(runs / "cmp")], f"{path} {message}")
    if name != "invocations.jsonl":  # report reads no invocations
        one_line_exit_2(
            capsys, ["report", str(runs / "cmp" / "quick"), "--out", str(runs / "rep")], f"{path} {message}"
        )
    assert (runs / "cmp" / "quick" / "rope" / "seed0" / "model.safetensors").exists()


@pytest.mark.slow
@pytest.mark.parametrize("plugins", [3, [3], [{"file": "x.py"}], {"module": "m"}])
def test_config_plugins_of_the_wrong_shape_are_one_line(runs, capsys, plugins):
    path = runs / "tr" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "plugins": plugins}))
    message = f"{path} is damaged: 'plugins' must be a list of {{module, file}} entries"
    for argv in (["eval", str(runs / "tr")], ["generate", str(runs / "tr"), "--prompt", "x"]):
        one_line_exit_2(capsys, argv, message)


@pytest.mark.slow
def test_eval_into_a_records_file_that_is_a_folder_is_one_line(runs, capsys):
    (runs / "tr" / "eval.jsonl").mkdir()
    message = f"{runs / 'tr' / 'eval.jsonl'} is a directory where a file belongs: move it away"
    one_line_exit_2(capsys, ["eval", str(runs / "tr"), "--multiples", "1"], message)


@pytest.mark.slow
def test_eval_records_name_the_corpus_they_scored(runs, capsys):
    assert main(["eval", str(runs / "tr"), "--multiples", "1", "--corpus", "pystdlib", "-q"]) == 0
    assert main(["eval", str(runs / "tr"), "--multiples", "1", "-q"]) == 0
    assert [r["corpus"] for r in read_jsonl(runs / "tr" / "eval.jsonl")] == ["pystdlib", "shakespeare"]
    assert all("corpus" not in r for r in read_jsonl(runs / "cmp" / "quick" / "results.jsonl"))  # compare: preset.json


@pytest.mark.slow
def test_generate_refuses_a_prompt_that_is_not_utf8(runs, capsys):
    prompt = b"\xff\xfe".decode("utf-8", "surrogateescape")  # what Python makes of such bytes in argv
    one_line_exit_2(capsys, ["generate", str(runs / "tr"), "--prompt", prompt], "--prompt is not UTF-8 text")


@pytest.mark.parametrize("code,shown", [("3", "3"), ("'bye'", "'bye'"), ("None", "None")])
def test_an_imported_module_that_exits_is_a_failed_import(tmp_path, capsys, code, shown):
    module = tmp_path / "leaves.py"
    module.write_text(f"import sys\nsys.exit({code})\n")
    one_line_exit_2(capsys, ["--import", str(module), "list"], f"cannot import '{module}': it called sys.exit({shown})")


@pytest.mark.parametrize("command", [["train", "--scheme", "rope"], ["compare"]])
def test_the_vocabulary_is_not_a_setting(tmp_path, capsys, command):
    """`--set model.vocab_size=1` was replaced by the tokenizer's 256 without a word."""
    argv = [*command, "--preset", "quick", "--out", str(tmp_path / "o"), "--set", "model.vocab_size=1"]
    one_line_exit_2(capsys, argv, "the vocabulary comes from the tokenizer (train.tokenizer) or the task")
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_a_tracker_that_cannot_start_leaves_no_folder(tmp_path, capsys, monkeypatch):
    """`--log wandb` without a key left a folder with config.json and an empty train.jsonl."""

    def refuse(self):
        raise tracking.PosencError("wandb could not start a run (no API key)")

    monkeypatch.setattr(tracking.WandbTracker, "_open", refuse)
    out = tmp_path / "runs" / "wb"
    one_line_exit_2(capsys, ["train", "--scheme", "rope", *QUICK, "--out", str(out), "--log", "wandb"], "no API key")
    assert not out.exists() and (tmp_path / "runs").is_dir()


@pytest.mark.slow
def test_report_and_harness_do_not_write_into_another_run(runs, capsys):
    cmp, tr = runs / "cmp" / "quick", runs / "tr"
    before = (cmp / "report.md").read_text()
    (runs / "cmp2").mkdir()
    shutil.copytree(cmp, runs / "cmp2" / "quick")
    one_line_exit_2(
        capsys,
        ["report", str(cmp), "--out", str(runs / "cmp2" / "quick")],
        f"{runs / 'cmp2' / 'quick'} holds a posenc compare run (preset.json): give report another --out",
    )
    one_line_exit_2(
        capsys,
        ["report", str(cmp), "--out", str(tr)],
        f"{tr} holds a posenc train, extend or finetune run (config.json): give report another --out",
    )
    harness = ["harness", "--model", str(tr), "--tasks", "lambada_openai", "--lengths", "32", "--limit", "1"]
    one_line_exit_2(
        capsys,
        [*harness, "--out", str(cmp)],
        f"{cmp} holds a posenc compare run (preset.json): give harness another --out",
    )
    assert (cmp / "report.md").read_text() == before


@pytest.mark.slow
def test_a_run_config_naming_an_unknown_scheme_names_the_file(runs, capsys):
    path = runs / "tr" / "config.json"
    config = json.loads(path.read_text())
    config["model"]["encoding"] = "foo"
    path.write_text(json.dumps(config))
    one_line_exit_2(capsys, ["eval", str(runs / "tr")], f"{path}: unknown scheme 'foo'; valid: ")


def test_train_takes_a_preset_without_a_schemes_list(tmp_path, capsys):
    """`train --scheme` names its scheme; a user's preset without `schemes:` was refused ("schemes: Field required")."""
    preset = tmp_path / "mine.yaml"
    preset.write_text("name: mine\nmodel: {n_layer: 1, d_model: 32, n_head: 2, train_length: 16}\n")
    argv = ["train", "--scheme", "rope", "--preset", str(preset), "--steps", "1", "--out", str(tmp_path / "r")]
    assert main([*argv, "-q"]) == 0
    assert json.loads((tmp_path / "r" / "config.json").read_text())["model"]["n_layer"] == 1


@pytest.mark.slow
@pytest.mark.parametrize(
    "edit,message",
    [
        ({"step": "x"}, "its step 'x' is not a non-negative integer"),
        ({"step": -3}, "its step -3 is not a non-negative integer"),  # emptied train.jsonl, rewrote config.json
        ({"step": 1.5}, "its step 1.5 is not a non-negative integer"),  # was taken as step 1
        ({"model": None}, "its tensors are not a {name: tensor} mapping"),
        ({"optimizer": {}}, "its optimizer state is not an optimizer's"),
    ],
)
def test_a_damaged_state_pt_is_refused_before_anything_is_rewritten(runs, capsys, edit, message):
    run = runs / "tr"
    (run / "train_summary.json").unlink()  # unfinished: resume loads state.pt
    torch.save({**torch.load(run / "state.pt", weights_only=False), **edit}, run / "state.pt")
    kept = {name: (run / name).read_bytes() for name in ("config.json", "train.jsonl")}
    argv = ["train", "--scheme", "rope", *QUICK, "--steps", "3", "--out", str(run), "--resume"]
    one_line_exit_2(capsys, argv, f"{run / 'state.pt'} is damaged: {message}; use another --out")
    assert {name: (run / name).read_bytes() for name in kept} == kept


@pytest.mark.slow
def test_non_finite_weights_are_refused_not_scored(runs, capsys):
    """NaN weights gave "ppl nan" with exit 0."""
    path = runs / "tr" / "model.safetensors"
    save_file({k: v * math.nan for k, v in load_file(path).items()}, path)
    for argv in (["eval", str(runs / "tr")], ["generate", str(runs / "tr"), "--prompt", "x"]):
        one_line_exit_2(capsys, argv, f"{path} holds non-finite weights (NaN or inf, first in ")


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.int64, torch.float16])
def test_weights_cast_to_another_type_are_refused_not_scored(runs, capsys, dtype):
    """Weights cast to int64 or float16 loaded (load_state_dict casts back) and gave a perplexity of truncated
    weights, with exit 0."""
    path = runs / "tr" / "model.safetensors"
    save_file({k: v.to(dtype) for k, v in load_file(path).items()}, path)
    assert main(["eval", str(runs / "tr")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"posenc: error: {path} holds ") and err.count("\n") == 1
    assert err.endswith(
        f" as {dtype} where the model has torch.float32: weights cast to another number type; use the run's own file\n"
    )


def test_a_tiny_temperature_samples_the_argmax():
    """temperature 1e-39 turned the logits into inf - inf: "probability tensor contains either inf, nan"."""
    logits = torch.tensor([[1.0, 3.0, 2.0], [5.0, -1.0, 0.0]])
    for t in (1e-39, 5e-324):
        assert sample(logits, t, None, torch.Generator().manual_seed(0)).tolist() == [[1], [0]]


@pytest.mark.slow
def test_a_file_posenc_may_not_read_is_one_line(runs, capsys, monkeypatch):
    """Unreadable run files gave PermissionError tracebacks (root reads anything: the refusal is simulated)."""
    from posenc.train import rundir

    def refuse(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(rundir, "read_json", refuse)
    code = main(["eval", str(runs / "tr")])
    assert code == 2 and capsys.readouterr().err == f"posenc: error: permission denied: {runs / 'tr' / 'config.json'}\n"


@pytest.mark.slow
@pytest.mark.parametrize(
    "damage,message",
    [
        ("folder", "results.jsonl is damaged (a directory, not a JSONL file)"),
        ("negative", "results.jsonl line 1: not a ppl record (ppl: Input should be greater than 0)"),
        ("nan", "results.jsonl line 1: not a ppl record (ppl: Input should be a finite number)"),
        ("csv folder", "results.csv is damaged (a directory, not a CSV file)"),
        ("csv bytes", "results.csv is damaged (not UTF-8 text"),
    ],
)
def test_damaged_results_are_refused_by_report(runs, capsys, damage, message):
    """A folder gave IsADirectoryError, bytes a UnicodeDecodeError; a negative or NaN perplexity was reported."""
    cmp = runs / "cmp" / "quick"
    lines = (cmp / "results.jsonl").read_text().splitlines()
    if damage == "folder":
        (cmp / "results.jsonl").unlink()
        (cmp / "results.jsonl").mkdir()
    elif damage in ("negative", "nan"):
        first = {**json.loads(lines[0]), "ppl": -5.0 if damage == "negative" else math.nan}
        (cmp / "results.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    else:
        (cmp / "results.jsonl").unlink()
        (cmp / "results.csv").unlink()
        if damage == "csv folder":
            (cmp / "results.csv").mkdir()
        else:
            (cmp / "results.csv").write_bytes(b"scheme,train_length,eval_length\n\xff,32,32\n")
    one_line_exit_2(capsys, ["report", str(cmp), "--out", str(runs / "rep")], f"{cmp / message.split()[0]}")
    one_line_exit_2(capsys, ["report", str(cmp), "--out", str(runs / "rep")], message)


@pytest.mark.slow
def test_an_append_to_a_broken_link_is_one_line(runs, capsys):
    """eval appended to a dangling eval.jsonl link: FileNotFoundError (a compare rerun created the link's target)."""
    (runs / "tr" / "eval.jsonl").symlink_to(runs / "gone" / "x.jsonl")
    message = f"{runs / 'tr' / 'eval.jsonl'} is a broken symbolic link: remove it or point it at a file"
    one_line_exit_2(capsys, ["eval", str(runs / "tr"), "--multiples", "1"], message)
    assert not (runs / "gone").exists()


@pytest.mark.parametrize("given,ok", [(["--steps", "3", "--set", "train.steps=2"], False), (["--steps", "2"], True)])
def test_a_flag_and_a_set_of_its_key_must_agree(tmp_path, capsys, given, ok):
    """`--set train.steps=2 --steps 3` trained 2 steps without a word."""
    argv = ["train", "--scheme", "rope", "--preset", "quick", "--out", str(tmp_path / "o"), "--dry-run"]
    if ok:
        assert main([*argv, *given, "--set", "train.steps=2"]) == 0 and "steps: 2\n" in capsys.readouterr().out
    else:
        one_line_exit_2(capsys, [*argv, *given], "--steps 3 and --set train.steps=2 disagree: give one")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_a_run_file_at_a_broken_link_says_so(runs, capsys, name):
    """It said the run "has no checkpoint"."""
    (runs / "tr" / name).unlink()
    (runs / "tr" / name).symlink_to(runs / "gone")
    message = f"{runs / 'tr' / name} is a broken symbolic link: point it at the run's file"
    for argv in (["eval", str(runs / "tr")], ["diagnose", str(runs / "tr")]):
        one_line_exit_2(capsys, argv, message)


@pytest.mark.parametrize("command", [["eval"], ["generate", "--prompt", "a", "--max-new-tokens", "1"]])
def test_a_config_edited_after_training_is_refused(runs, capsys, command):
    path = runs / "tr" / "config.json"
    cfg = json.loads(path.read_text())
    cfg["model"]["encoding"] = "alibi"  # the weights learned RoPE: evaluating them under ALiBi scores another model
    path.write_text(json.dumps(cfg))
    one_line_exit_2(capsys, [*command, str(runs / "tr")], "model.encoding 'alibi' (trained 'rope')")
    cfg["model"]["encoding"], cfg["model"]["attn_block_size"] = "rope", 64  # a speed knob may change
    path.write_text(json.dumps(cfg))
    assert main(["eval", str(runs / "tr"), "--multiples", "1", "--max-tokens", "64", "-q"]) == 0


@pytest.mark.parametrize(
    "edit, shown",
    [
        ({"corpus": "pystdlib"}, "train.corpus 'pystdlib' (trained 'shakespeare')"),
        ({"tokenizer": "bpe512"}, "train.tokenizer"),
    ],
)
def test_a_training_corpus_edited_after_training_is_refused(runs, capsys, edit, shown):
    """eval scored 86 pystdlib documents as the run's held-out text (ppl 243.4) and recorded them, exit 0."""
    path = runs / "tr" / "config.json"
    cfg = json.loads(path.read_text())
    cfg["train"].update(edit)
    path.write_text(json.dumps(cfg))
    one_line_exit_2(capsys, ["eval", str(runs / "tr"), "--multiples", "1"], shown)
    assert not (runs / "tr" / "eval.jsonl").exists()


@pytest.mark.parametrize("command", [["generate", "--prompt", "a", "{}"], ["finetune", "--dry-run", "--model", "{}"]])
def test_a_config_at_a_broken_link_says_so_on_every_command(runs, capsys, command):
    config = runs / "tr" / "config.json"
    config.unlink()
    config.symlink_to(runs / "gone.json")
    argv = [a.replace("{}", str(runs / "tr")) for a in command]
    one_line_exit_2(capsys, argv, f"{config} is a broken symbolic link")


@pytest.mark.parametrize(
    "code, shown", [(errno.EROFS, "read-only file system"), (errno.ENOSPC, "no space left on device")]
)
def test_a_file_system_that_refuses_writes_is_one_line(runs, capsys, monkeypatch, code, shown):
    """A read-only or full file system gave an OSError traceback (eval after printing its table, train --resume,
    diagnose, a compare rerun); the refusal is simulated (mounting read-only needs root)."""
    from posenc.cli import eval_cmd

    def refuse(path, record):
        raise OSError(code, os.strerror(code), str(path))

    monkeypatch.setattr(eval_cmd, "append", refuse)
    assert main(["eval", str(runs / "tr"), "--multiples", "1", "--max-tokens", "64", "-q"]) == 2
    err = capsys.readouterr().err
    assert err == f"posenc: error: {shown}: {runs / 'tr' / 'eval.jsonl'}\n"


def test_another_os_error_keeps_its_traceback(runs, monkeypatch):
    from posenc.cli import eval_cmd

    def fail(path, record):
        raise OSError(errno.EIO, "Input/output error", str(path))

    monkeypatch.setattr(eval_cmd, "append", fail)
    with pytest.raises(OSError, match="Input/output error"):
        main(["eval", str(runs / "tr"), "--multiples", "1", "--max-tokens", "64", "-q"])


def test_generate_on_a_compare_run_says_so(runs, capsys):
    """It said "neither a posenc train run ... nor a model directory"; eval named the compare run."""
    one_line_exit_2(
        capsys, ["generate", str(runs / "cmp" / "quick"), "--prompt", "a"], "is a posenc compare run: give one"
    )


def test_a_config_that_is_a_fifo_is_one_line_not_a_hang(runs, capsys):
    config = runs / "tr" / "config.json"
    config.unlink()
    os.mkfifo(config)  # reading it blocked until killed
    one_line_exit_2(capsys, ["eval", str(runs / "tr")], f"{config} is damaged (not a regular file")


def test_eval_stream_refuses_the_flags_it_ignores(runs, capsys):
    """--stream scored its own stream and dropped --multiples and --max-tokens with exit 0."""
    for flag in (["--multiples", "1", "4"], ["--max-tokens", "256"]):
        argv = ["eval", str(runs / "tr"), "--method", "sinks:n_sink=4,window=60", "--stream", "100", *flag]
        one_line_exit_2(capsys, argv, "--stream scores one stream of its own length: --multiples and --max-tokens")


def test_a_perplexity_record_given_twice_is_refused_not_taken_for_a_seed(runs, capsys):
    """A copied line with another ppl was reported as a second seed (367.81 ± 132.19 where one seed gave 235.62)."""
    cmp = runs / "cmp" / "quick"
    lines = (cmp / "results.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    other = {**first, "nll": 2 * first["nll"], "ppl": math.exp(2 * first["nll"] / first["scored_tokens"])}
    (cmp / "results.jsonl").write_text("\n".join([*lines, json.dumps(other)]) + "\n")
    message = f"{cmp / 'results.jsonl'} holds two perplexity records of rope seed 0 at length {first['eval_length']}"
    one_line_exit_2(capsys, ["report", str(cmp), "--out", str(runs / "rep")], message)


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"ppl": 5.0}, "(ppl 5.0 is not exp(nll / scored_tokens) = "),
        ({"kind": "passkey", "accuracy": 0.9}, "(accuracy 0.9 is not correct / trials = "),
        ({"kind": "passkey", "correct": 99}, "(correct 99 is not in [0, trials = "),
    ],
)
def test_a_number_edited_apart_from_what_it_derives_from_is_refused(runs, capsys, edit, message):
    """A ppl edited without its nll (and a passkey accuracy without its counts) was reported as measured."""
    cmp = runs / "cmp" / "quick"
    lines = (cmp / "results.jsonl").read_text().splitlines()
    kind = edit.pop("kind", "ppl")
    at = next(i for i, x in enumerate(lines) if json.loads(x)["kind"] == kind)
    lines[at] = json.dumps({**json.loads(lines[at]), **edit})
    (cmp / "results.jsonl").write_text("\n".join(lines) + "\n")
    one_line_exit_2(
        capsys, ["report", str(cmp), "--out", str(runs / "rep")], f"line {at + 1}: not a {kind} record {message}"
    )


def test_a_record_at_a_length_compare_never_scores_is_refused(runs, capsys):
    """eval_length edited to 31 gave a "0.96875x" column, every other cell n/a, exit 0."""
    cmp = runs / "cmp" / "quick"
    lines = (cmp / "results.jsonl").read_text().splitlines()
    first = {**json.loads(lines[0]), "eval_length": 31}
    (cmp / "results.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    one_line_exit_2(capsys, ["report", str(cmp), "--out", str(runs / "rep")], "at length 31, not a multiple of its")


def test_a_bpe_run_whose_corpus_changed_is_refused(tmp_path, capsys, monkeypatch):
    """The BPE is built from the corpus it reads: after an edit eval scored other token ids (ppl 127.5 -> 180.2)."""
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "corp.txt"
    corpus.write_text("to be or not to be, that is the question. " * 200)
    run = tmp_path / "r"
    argv = ["train", "--scheme", "rope", *QUICK, "--tokenizer", "bpe280", "--corpus", str(corpus), "--out", str(run)]
    assert main([*argv, "-q"]) == 0
    score = ["eval", str(run), "--multiples", "1", "--max-tokens", "64", "-q"]
    assert main(score) == 0
    capsys.readouterr()
    corpus.write_text("whether 'tis nobler in the mind to suffer the slings and arrows. " * 200)
    one_line_exit_2(capsys, score, f"{run} was trained with another bpe280 tokenizer than its corpus {corpus} as it is")


@pytest.mark.slow
@pytest.mark.parametrize("command", ["eval", "diagnose"])
def test_an_unfinished_run_is_scored_from_its_checkpoint_and_says_so(runs, capsys, command):
    """A run stopped before its summary (killed after its last checkpoint) is read from that checkpoint: said."""
    (runs / "tr" / "train_summary.json").unlink()
    assert main([command, str(runs / "tr"), "--multiples", "1"]) == 0
    said = f"posenc {command}: {runs / 'tr'} is unfinished: its weights are the checkpoint of step 2 of 2"
    assert said in capsys.readouterr().err
    (runs / "tr" / "state.pt").unlink()  # the step is state.pt's: without it, not "step 0"
    assert main([command, str(runs / "tr"), "--multiples", "1"]) == 0
    assert "the checkpoint of an unknown step (no state.pt) of 2 (" in capsys.readouterr().err


@pytest.mark.parametrize("isolate", [[], ["--no-isolate"]])
def test_a_file_where_a_scheme_folder_belongs_is_one_line(tmp_path, capsys, isolate):
    """A file at the run's scheme folder gave a FileExistsError traceback from the job launcher."""
    (tmp_path / "quick").mkdir()
    (tmp_path / "quick" / "rope").write_text("mine")
    one_line_exit_2(
        capsys,
        [*COMPARE, "--out", str(tmp_path), *isolate],
        f"cannot create output directory {tmp_path / 'quick' / 'rope'}: a file is in the way",
    )
    assert (tmp_path / "quick" / "rope").read_text() == "mine"
