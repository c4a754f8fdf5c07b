"""Damaged run files and outputs that belong to another run (issue 59, the last bad-input sweep): each is one line
and exit 2 naming the file, with nothing lost; before, each printed a traceback, or was taken without a word."""

import json
import shutil

import pytest

from posenc.cli.main import main
from posenc.store.checkpoint import read_jsonl
from posenc.train import tracking

QUICK = ["--preset", "quick", "--steps", "2"]
COMPARE = ["compare", "--preset", "quick", "--set", "schemes=[rope]", "--set", "train.steps=2"]


def one_line_exit_2(capsys, argv, message):
    code = main(list(argv))
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("posenc: error: ") and message in err, err


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 2-step RoPE run and a one-scheme quick compare run, copied per test."""
    root = tmp_path_factory.mktemp("damaged")
    assert main(["train", "--scheme", "rope", *QUICK, "--out", str(root / "tr"), "-q"]) == 0
    assert main([*COMPARE, "--out", str(root / "cmp"), "-q"]) == 0
    return root


@pytest.fixture
def runs(trained, tmp_path):
    shutil.copytree(trained, tmp_path, dirs_exist_ok=True)
    return tmp_path


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
    one_line_exit_2(capsys, argv, f"{log} {message}")
    assert log.read_text() == before  # nothing rewritten


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
