"""End to end through the CLI: a tiny compare writes the report; bad input exits 2 with one line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from posenc import encodings
from posenc.cli.main import main
from posenc.store.records import PasskeyCell, load


def run_cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    assert main(["compare", "--preset", "quick", "--out", str(out)]) == 0
    return out / "quick"


@pytest.mark.slow
def test_quick_compare_writes_report(quick_run):
    for name in (
        "report.md",
        "results.csv",
        "results.jsonl",
        "ppl_ratio.png",
        "buckets.png",
        "passkey.png",
        "far_mass.png",
    ):
        assert (quick_run / name).stat().st_size > 0, name
    records = [json.loads(line) for line in (quick_run / "results.jsonl").read_text().splitlines()]
    assert {r["kind"] for r in records} == {"ppl", "passkey", "far_mass"}
    records = [r for r in records if r["kind"] == "ppl"]
    assert {r["scheme"] for r in records} == {"nope", "rope", "alibi", "acc-rand-qkv"}
    assert {r["eval_length"] for r in records} == {32, 64, 128, 256}
    for r in records:
        assert r["scored_tokens"] == r["windows"] * r["eval_length"] and 1 < r["ppl"] < 256
    report = (quick_run / "report.md").read_text()
    assert "| acc-rand-qkv | 1.000 |" in report
    assert "| passkey @ 256 |" in report and "## Passkey retrieval" in report and "## Far attention mass" in report


@pytest.mark.slow
def test_report_files_get_the_usual_file_mode(quick_run):
    modes = {p.name: p.stat().st_mode & 0o777 for p in quick_run.iterdir() if p.is_file()}
    assert modes["report.md"] == modes["ppl_ratio.png"] == modes["results.jsonl"]  # atomic writes are not 0600


@pytest.mark.slow
def test_rerun_skips_finished_work(quick_run, capsys):
    before = (quick_run / "results.jsonl").read_text()
    code, out, _ = run_cli(capsys, "compare", "--preset", "quick", "--out", str(quick_run.parent))
    assert code == 0 and (quick_run / "results.jsonl").read_text() == before


@pytest.mark.parametrize(
    "argv,message",
    [
        (["compare", "--preset", "quick", "--schemes", "rope", "bogus"], "unknown scheme 'bogus'; valid: "),
        (["compare", "--preset", "nosuch"], "unknown preset 'nosuch'"),
        (
            ["compare", "--preset", "/nonexistent/mine.yaml"],
            "preset file /nonexistent/mine.yaml does not exist (shipped",
        ),
        (["compare", "--preset", "quick", "--corpus", "/nonexistent/corpus"], "not found"),
        (["compare", "--preset", "quick", "--steps", "0"], "train.steps"),
        (["compare", "--preset", "quick", "--tokenizer", "wordpiece"], "unknown tokenizer"),
        (["compare", "--preset", "quick", "--seeds", "0", "-1"], "seeds.1: Input should be greater than or equal to 0"),
        (["eval", "/nonexistent/run"], "run directory /nonexistent/run does not exist"),
    ],
)
@pytest.mark.slow
def test_bad_input_one_line_exit_2(quick_run, capsys, argv, message):
    before = (quick_run / "results.jsonl").read_text()
    code, _, err = run_cli(capsys, *argv, *(["--out", str(quick_run.parent)] if argv[0] == "compare" else []))
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("posenc: error: ") and message in err
    assert (quick_run / "results.jsonl").read_text() == before  # earlier results untouched


def test_invalid_model_config_odd_head_dim(tmp_path, capsys):
    preset = tmp_path / "odd.yaml"
    preset.write_text("name: odd\nmodel: {n_layer: 1, n_head: 2, d_model: 18}\ntrain: {steps: 1}\nschemes: [rope]\n")
    code, _, err = run_cli(capsys, "compare", "--preset", str(preset), "--out", str(tmp_path))
    assert code == 2 and "even head dim, got 9" in err
    preset.write_text(
        "name: neg\nmodel: {n_layer: 1, n_head: 2, d_model: 16, train_length: -4}\ntrain: {steps: 1}\nschemes: [rope]\n"
    )
    code, _, err = run_cli(capsys, "compare", "--preset", str(preset), "--out", str(tmp_path))
    assert (
        code == 2 and "invalid preset odd.yaml: model: Value error, train_length must be an integer > 0, got -4" in err
    )


def test_empty_corpus(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("  \n")
    code, _, err = run_cli(
        capsys,
        "train",
        "--scheme",
        "rope",
        "--preset",
        "quick",
        "--corpus",
        str(tmp_path / "empty"),
        "--out",
        str(tmp_path / "r"),
    )
    assert code == 2 and "is empty" in err
    assert not (tmp_path / "r").exists()  # bad input leaves no empty run directory


def test_list(capsys):
    code, out, _ = run_cli(capsys, "list")
    assert code == 0 and "acc-rand-qkv" in out and "alibi" in out and "quick" in out
    groups = out.split("\n\n")  # one block per family, its scheme lines under its heading
    biases = next(g for g in groups if g.startswith("score biases:"))
    assert "  alibi " in biases and "arXiv:2108.12409" in biases and "  rope " not in biases
    assert "  irope " in next(g for g in groups if g.startswith("per-layer mixes:"))
    assert "rope_theta=10000.0" not in out  # parameters only with --params (a named pattern's entries show theirs)


def test_list_params_shows_each_schemes_parameters_under_it(capsys):
    code, out, _ = run_cli(capsys, "list", "--params")
    assert code == 0
    rotary = next(g for g in out.split("\n\n") if g.startswith("rotary:")).splitlines()
    rope = rotary.index(next(line for line in rotary if line.startswith("  rope ")))
    assert [line.split()[0] for line in rotary[rope + 1 : rope + 5]] == [
        "rope_theta=10000.0",
        "pairing=half",
        "rotary_fraction=1.0",
        "factor=1.0",
    ]
    assert "the frequencies' base, a finite number > 1" in rotary[rope + 1]
    assert rotary[rope + 5].startswith("  rope-adjacent ") and rotary[rope + 6].startswith(
        "  xpos "
    )  # an alias: its scheme's lines
    assert "      init_L=None " in out and "(None: train_length / 4)" in out


@pytest.mark.parametrize(
    "scheme, shown",
    [
        ("rope", "factor, pairing, rope_theta, rotary_fraction"),
        ("rope-adjacent", "factor, rope_theta, rotary_fraction"),
    ],
)  # the alias fixes pairing
def test_an_unknown_parameter_lists_what_list_params_shows(capsys, scheme, shown):
    code, _, err = run_cli(capsys, "train", "--scheme", f"{scheme}:bogus=1", "--preset", "quick")
    assert code == 2 and err.strip() == f"posenc: error: scheme {scheme!r} has no parameter 'bogus'; valid: {shown}"
    listed = {
        s["name"]: [p["name"] for p in s["params"]] for s in json.loads(run_cli(capsys, "list", "--json")[1])["schemes"]
    }
    assert sorted(listed[scheme]) == shown.split(", ")  # RoPE's internal schedule keys in neither


def test_list_json_is_every_scheme_with_its_parameters(capsys):
    code, out, _ = run_cli(capsys, "list", "--json")
    listing = json.loads(out)
    schemes = {s["name"]: s for s in listing["schemes"]}
    assert code == 0 and sorted(schemes) == encodings.names()
    assert [(p["name"], p["default"], p["type"]) for p in schemes["rope"]["params"]] == [
        ("rope_theta", 10000.0, "float"),
        ("pairing", "half", "str"),
        ("rotary_fraction", 1.0, "float"),
        ("factor", 1.0, "float"),
    ]
    assert (
        schemes["rope"]["family"] == "rotary"
        and schemes["rope"]["alias_of"] is None
        and "arXiv:2104.09864" in schemes["rope"]["source"]
    )
    assert schemes["acc-rand-qkv"]["alias_of"] == {"spec": "accumulated", "params": {"mode": "random", "rotate": "qkv"}}
    assert "mode" not in {p["name"] for p in schemes["acc-rand-qkv"]["params"]} and schemes["hybrid"]["params"] == []
    assert {
        "name": "a",
        "default": None,
        "type": "float | None",
        "doc": 'the steps\' half-width in radians, in (0, pi], center="zero" only (None: 1)',
    } in schemes["accumulated"]["params"]
    assert {t["name"]: t["params"] for t in listing["tasks"]}["mqar"]["gap"] == "0-fit"
    assert (
        "quick" in listing["presets"]
        and "quick" in listing["extend_presets"]
        and "quick" in listing["finetune_presets"]
    )


def test_train_then_eval(tmp_path, capsys):
    run = tmp_path / "run"
    code, out, _ = run_cli(
        capsys, "train", "--scheme", "learned", "--preset", "quick", "--steps", "4", "--out", str(run)
    )
    assert code == 0 and (run / "model.safetensors").exists()
    weights = (run / "model.safetensors").read_bytes()
    code, _, err = run_cli(capsys, "train", "--scheme", "rope", "--preset", "quick", "--steps", "4", "--out", str(run))
    assert code == 2 and "already holds a run; pass --resume" in err  # never overwritten silently
    code, _, err = run_cli(
        capsys, "train", "--scheme", "rope", "--preset", "quick", "--steps", "8", "--out", str(run), "--resume"
    )
    assert code == 2 and err.count("\n") == 1 and "its model differs (encoding 'learned' -> 'rope')" in err
    assert (run / "model.safetensors").read_bytes() == weights
    code, out, _ = run_cli(
        capsys, "eval", str(run), "--multiples", "1", "2", "--max-tokens", "256", "--passkey", "rank"
    )
    assert code == 0 and "n/a" in out  # learned table is 32 long: 64 is not applicable
    cells = [r for r in load(run / "eval.jsonl") if isinstance(r, PasskeyCell)]
    assert [(c.scheme, c.train_length, c.length, c.depth) for c in cells] == [
        ("learned", 32, L, d) for L in (32, 128) for d in (0.1, 0.5, 0.9)
    ]
    assert "n/a: passkey length 32 is shorter than the needle" in out  # the reason, not a bare n/a
    # 32 tokens hold no needle and prompt, 128 are past the learned table: each cell says so, none is scored
    assert all(c.trials == 0 and c.accuracy is None and c.note.startswith("n/a: ") for c in cells), [
        c.note for c in cells
    ]


def test_train_stopped_by_its_time_budget_says_so(tmp_path, capsys):
    run = tmp_path / "run"
    code, out, _ = run_cli(
        capsys,
        "train",
        "--scheme",
        "rope",
        "--preset",
        "quick",
        "--steps",
        "400",
        "--time-budget",
        "0.001",
        "--out",
        str(run),
    )
    step = int(out.split("step ", 1)[1].split(" ", 1)[0])
    assert code == 0 and 0 <= step < 400 and json.loads((run / "train_summary.json").read_text())["steps"] == step
    assert out.startswith(f"trained rope: step {step} of 400, ") and out.rstrip().endswith(
        "(time budget 0.001 s reached; --resume continues)"
    )
    code, out, _ = run_cli(
        capsys,
        "train",
        "--scheme",
        "rope",
        "--preset",
        "quick",
        "--steps",
        f"{step + 2}",
        "--out",
        str(run),
        "--resume",
    )
    assert code == 0 and out.startswith(f"trained rope: step {step + 2} of {step + 2}, ") and "time budget" not in out
    code, out, _ = run_cli(
        capsys,
        "train",
        "--scheme",
        "rope",
        "--preset",
        "quick",
        "--steps",
        f"{step + 2}",
        "--out",
        str(run),
        "--resume",
    )
    assert code == 0 and out == f"{run} is already trained (step {step + 2} of {step + 2}): nothing left to do\n"


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory):
    """A 4-step RoPE run for the bad-input tests below."""
    run = tmp_path_factory.mktemp("rope") / "run"
    assert main(["train", "--scheme", "rope", "--preset", "quick", "--steps", "4", "--out", str(run)]) == 0
    return run


def _one_line_exit_2(capsys, argv, message):
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and err.count("\n") == 1 and err.startswith("posenc: error: ") and message in err, err


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--max-tokens", "0"], "max_tokens (scored tokens per length) must be >= 1, got 0"),
        (["--max-tokens", "-5"], "must be >= 1, got -5"),
        (["--rope-schedule", "yarn", "--factor", "inf"], "factor must be finite, got inf"),
        (
            ["--rope-schedule", "yarn", "--factor", "2", "--rope-param", "attention_factor=0"],
            "attention_factor must be > 0",
        ),
        (
            ["--factor", "8"],
            "--factor/--rerope-window/--leak/--short-factor/--long-factor/--rope-param need --rope-schedule",
        ),
        (["--short-factor", "1,2"], "need --rope-schedule"),
        (
            ["--rope-schedule", "longrope", "--factor", "2", "--short-factor", "1,x", "--long-factor", "1"],
            "--short-factor takes comma-separated numbers, got '1,x'",
        ),
        (
            ["--rope-schedule", "longrope", "--factor", "2", "--short-factor", "1,2", "--long-factor", "1,2"],
            "longrope: short_factor has 2 entries; head dim 32 needs 16",
        ),
        (["--rope-param", "beta_fast=16"], "need --rope-schedule"),
    ],
)
def test_eval_bad_options_one_line_exit_2(rope_run, capsys, argv, message):
    code, out, err = run_cli(capsys, "eval", str(rope_run), "--multiples", "1", *argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("posenc: error: ") and message in err, (
        out,
        err,
    )


def test_eval_takes_the_longrope_factor_lists_from_the_command_line(rope_run, capsys):
    short, long = ",".join(["1"] * 16), ",".join(str(1 + i) for i in range(16))  # D/2 = 16 each
    code, out, err = run_cli(
        capsys,
        "eval",
        str(rope_run),
        "--multiples",
        "1",
        "2",
        "--max-tokens",
        "64",
        "--rope-schedule",
        "longrope",
        "--factor",
        "2",
        "--short-factor",
        short,
        "--long-factor",
        long,
    )
    assert code == 0 and "scheme: rope+longrope(s=2)" in out, err


def test_eval_bad_max_tokens_prints_only_the_error(rope_run, capsys):
    code, out, err = run_cli(capsys, "eval", str(rope_run), "--max-tokens", "0")
    assert (code, out, err) == (2, "", "posenc: error: max_tokens (scored tokens per length) must be >= 1, got 0\n")


def test_train_repeated_composite_part(tmp_path, capsys):
    argv = ["train", "--scheme", "alibi+alibi", "--preset", "quick", "--out", str(tmp_path / "r")]
    _one_line_exit_2(capsys, argv, "'alibi+alibi': each part may appear once; repeated 'alibi'")


def test_hf_corpus_unreachable(tmp_path, capsys, monkeypatch):
    datasets = pytest.importorskip("datasets")

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'foo' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    argv = ["train", "--scheme", "rope", "--preset", "quick", "--corpus", "hf:foo", "--out", str(tmp_path / "r")]
    _one_line_exit_2(capsys, argv, "could not fetch Hugging Face dataset 'foo' (no network?)")
    argv[6] = f"hf:text:{tmp_path / 'missing.txt'}"
    monkeypatch.undo()
    _one_line_exit_2(capsys, argv, "Hugging Face dataset 'text:")
    assert not (tmp_path / "r").exists()


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


NOT_JSON, NO_SECTIONS = (lambda p: p.write_text("{not json")), (lambda p: p.write_text("{}"))


def _garbage(path):
    path.write_text("garbage\n")  # pickle reads 'g' as GET and fails on 'arbage' with a ValueError


EVAL, RESUME = "eval", "resume"


@pytest.mark.parametrize(
    "command,name,damage,message",
    [  # every file each command reads (eval needs no state.pt; resuming takes the weights from state.pt)
        (EVAL, "config.json", NOT_JSON, "is damaged (not valid JSON"),
        (EVAL, "config.json", NO_SECTIONS, "is damaged: it needs 'model' and 'train' sections"),
        (EVAL, "model.safetensors", _truncate, "is damaged or unreadable"),
        (RESUME, "config.json", NOT_JSON, "is damaged (not valid JSON"),
        (RESUME, "config.json", NO_SECTIONS, "is damaged: it needs 'model' and 'train' sections"),
        (RESUME, "state.pt", _truncate, "is damaged or unreadable"),
        (RESUME, "state.pt", _garbage, "is damaged or unreadable"),
    ],
)
def test_damaged_run_dir_one_line_exit_2(rope_run, tmp_path, capsys, command, name, damage, message):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(rope_run, run)
    damage(run / name)
    if command == EVAL:
        argv = ["eval", str(run), "--multiples", "1", "--max-tokens", "64"]
    else:
        argv = ["train", "--scheme", "rope", "--preset", "quick", "--steps", "6", "--out", str(run), "--resume"]
    _one_line_exit_2(capsys, argv, f"{run / name} {message}")


def test_resume_of_a_directory_without_a_run_is_refused(tmp_path, capsys):
    """A mistyped --out with --resume started a fresh run and exited 0."""
    _one_line_exit_2(
        capsys,
        ["train", "--scheme", "rope", "--preset", "quick", "--steps", "2", "--out", str(tmp_path / "typo"), "--resume"],
        f"--resume: {tmp_path / 'typo'} holds no run to resume (no config.json)",
    )
    assert not (tmp_path / "typo").exists()


def test_train_out_cannot_be_created(tmp_path, capsys):
    (tmp_path / "file").write_text("not a directory\n")
    outs = [tmp_path / "file", tmp_path / "file" / "run"] + (
        [Path("/proc/nope")] if Path("/proc/self").exists() else []
    )
    for out in outs:
        argv = ["train", "--scheme", "rope", "--preset", "quick", "--steps", "2", "--out", str(out)]
        _one_line_exit_2(capsys, argv, f"cannot create output directory {out}: ")
    _one_line_exit_2(
        capsys,
        ["compare", "--preset", "quick", "--out", str(tmp_path / "file")],
        f"cannot create output directory {tmp_path / 'file' / 'quick'}: ",
    )
    assert (tmp_path / "file").read_text() == "not a directory\n"


def test_negative_seed_and_empty_preset_lists(tmp_path, capsys):
    argv = ["train", "--scheme", "rope", "--preset", "quick", "--seed", "-1", "--out", str(tmp_path / "r")]
    _one_line_exit_2(capsys, argv, "train.seed=-1 (command line): Input should be greater than or equal to 0")
    assert not (tmp_path / "r").exists()
    preset = tmp_path / "p.yaml"
    for body, message in [
        ("schemes: []\n", "schemes: List should have at least 1 item"),
        ("schemes: [rope]\nseeds: []\n", "seeds: List should have at least 1 item"),
        ("schemes: [rope]\nseeds: [-2]\n", "seeds.0: Input should be greater than or equal to 0"),
    ]:
        preset.write_text("name: p\nmodel: {n_layer: 1, n_head: 2, d_model: 16}\ntrain: {steps: 1}\n" + body)
        _one_line_exit_2(capsys, ["compare", "--preset", str(preset), "--out", str(tmp_path)], message)


@pytest.mark.parametrize(
    "device, message", [("bogus", "unknown device 'bogus'"), ("cuda:7", "device 'cuda:7' is not available here")]
)
def test_diagnose_bad_device_is_one_line(tmp_path, capsys, device, message):
    code, _, err = run_cli(capsys, "diagnose", str(tmp_path / "nosuch"), "--device", device)
    assert code == 2 and err.count("\n") == 1 and message in err


def test_python_m_posenc_is_the_posenc_command(tmp_path):
    """``python -m posenc`` runs the same command: its version line, and bad input exits 2 with one line."""

    def run(*a):
        return subprocess.run([sys.executable, "-m", "posenc", *a], capture_output=True, text=True, cwd=tmp_path)

    ok = run("--version")
    assert ok.returncode == 0 and ok.stdout.startswith("posenc 0.1.0 (commit ")
    bad = run("compare", "--preset", "no-such-preset")
    assert bad.returncode == 2 and bad.stderr.startswith("posenc: error: unknown preset 'no-such-preset'")
    assert len(bad.stderr.strip().splitlines()) == 1


def test_output_into_a_closed_pipe_ends_quietly(tmp_path):
    """``posenc list | head``: a reader that is gone gives exit 141 and no traceback (the read end is closed before
    the command writes, so every run sees it)."""
    read, write = os.pipe()
    os.close(read)
    proc = subprocess.run(
        [sys.executable, "-m", "posenc", "list"], stdout=write, stderr=subprocess.PIPE, text=True, cwd=tmp_path
    )
    os.close(write)
    assert (proc.returncode, proc.stderr) == (141, "")


def test_diagnose_refuses_an_out_it_cannot_create_before_the_work(rope_run, tmp_path, capsys):
    """A file where --out points gave a FileExistsError traceback after the whole diagnosis."""
    (tmp_path / "afile").write_text("kept")
    for out in (tmp_path / "afile", tmp_path / "afile" / "sub"):
        _one_line_exit_2(
            capsys,
            ["diagnose", str(rope_run), "--multiples", "1", "--out", str(out)],
            f"cannot create output directory {out}: a file is in the way",
        )
    assert (tmp_path / "afile").read_text() == "kept"
