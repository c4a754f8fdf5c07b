"""Defects a new-user pass found (issue 59): each bad input is one line and exit 2, and eval's ratios do not depend
on the order of --multiples."""

import json

import pytest

from posenc.cli.main import main


def run_cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def one_line_exit_2(capsys, argv, message):
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and err.count("\n") == 1 and err.startswith("posenc: error: ") and message in err, err


@pytest.mark.parametrize(
    "name,content,message",
    [
        ("empty.txt", b"", "not a .py file or module name"),
        ("blob.bin", bytes(range(256)), "not a .py file or module name"),
        ("latin1.txt", "caf\xe9".encode("latin-1"), "not a .py file or module name"),
        ("schemes", None, "is a directory"),
    ],
)
def test_import_of_a_file_that_is_no_module_is_one_line(tmp_path, capsys, name, content, message):
    path = tmp_path / name
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    one_line_exit_2(capsys, ["--import", str(path), "list"], f"cannot import '{path}': {message}")


@pytest.mark.parametrize(
    "corpus,message",
    [("hf:", "corpus 'hf:' names no dataset"), ("hf:text:", "corpus 'hf:text:' names no file")],
)
@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_an_hf_corpus_naming_nothing_is_refused_before_loading(tmp_path, capsys, corpus, message, dry_run):
    argv = ["train", "--scheme", "rope", "--preset", "quick", "--corpus", corpus, "--out", str(tmp_path / "x")]
    one_line_exit_2(capsys, [*argv, "--steps", "2", *dry_run], message)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("seed", ["-1", str(2**64)])
def test_generate_refuses_a_seed_its_generator_cannot_take(tmp_path, capsys, seed):
    """-1 was taken by torch.manual_seed; 2^64 raised a traceback from torch.Generator.manual_seed."""
    one_line_exit_2(
        capsys,
        ["generate", str(tmp_path), "--prompt", "hi", "--seed", seed],
        f"--seed must be in [0, 2^64), got {seed}",
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--scheme", "rope", "--preset", "quick", "--seed", str(2**31), "--dry-run"],
        ["compare", "--preset", "quick", "--seeds", str(2**31), "--dry-run"],
        ["extend", "--quick", "--seed", str(10**20), "--dry-run"],
        ["finetune", "--quick", "--seed", str(10**20), "--dry-run"],
    ],
)
def test_a_seed_past_2_31_is_refused_by_the_dry_run(capsys, argv):
    """The dry run accepted it; the model then raised a traceback (its draws are int32 counters)."""
    one_line_exit_2(capsys, argv, "Input should be less than 2147483648")


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--scheme", "rope", "--preset", "quick", "--dry-run", "--out"],
        ["extend", "--quick", "--dry-run", "--out"],
        ["finetune", "--quick", "--dry-run", "--out"],
        ["harness", "--tasks", "niah_single_1", "--lengths", "512", "--limit", "1", "--out"],
        ["compare", "--preset", "quick", "--dry-run", "--name", "run", "--out"],
    ],
)
def test_an_out_with_a_file_in_the_way_is_refused_before_the_work(tmp_path, capsys, argv):
    """extend scored for minutes, then crashed making the directory; the dry runs accepted it."""
    blocker = tmp_path / "file"
    blocker.write_text("kept")
    if argv[0] == "harness":
        pytest.importorskip("lm_eval")
    out = str(blocker) if argv[0] == "compare" else str(blocker / "run")  # compare writes into out/name
    one_line_exit_2(capsys, [*argv, out], f"cannot create output directory {blocker / 'run'}: a file is in the way")
    assert blocker.read_text() == "kept"


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["train", "--scheme", "rope", "--out", ""], "--out"),
        (["diagnose", "runs/x", "--out", ""], "--out"),
        (["extend", "--quick", "--dry-run", "--out", " "], "--out"),
        (["harness", "--tasks", "x", "--lengths", "8", "--out", ""], "--out"),
        (["harness", "--tasks", "x", "--lengths", "8", "--out", "x", "--tokenizer", ""], "--tokenizer"),
        (["eval", "runs/x", "--corpus", ""], "--corpus"),
        (["train", "--scheme", "rope", "--device", "", "--dry-run"], "--device"),
        (["extend", "--quick", "--model", "", "--dry-run"], "--model"),
        (["finetune", "--quick", "--corpus", "", "--dry-run"], "--corpus"),
    ],
)
def test_an_empty_path_corpus_model_or_device_is_refused(capsys, argv, flag):
    """An empty --out wrote into the current directory (Path("") is "."); an empty --corpus, --model or --device
    fell back to the default silently (or loaded the current directory as a model)."""
    with pytest.raises(SystemExit) as stop:  # argparse's own error: one line, exit 2
        main(argv)
    assert stop.value.code == 2 and capsys.readouterr().err == f"posenc: error: argument {flag}: is empty\n"


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory):
    """A 2-step RoPE run (train_length 32)."""
    run = tmp_path_factory.mktemp("rope") / "run"
    assert main(["train", "--scheme", "rope", "--preset", "quick", "--steps", "2", "--out", str(run)]) == 0
    return run


def test_eval_ratios_do_not_depend_on_the_order_of_multiples(rope_run, capsys):
    code, out, _ = run_cli(capsys, "eval", str(rope_run), "--multiples", "2", "1", "--max-tokens", "256", "--json")
    assert code == 0
    rows = {row["length"]: row for row in json.loads(out)["lengths"]}
    assert rows[32]["ratio"] == pytest.approx(1.0)
    assert rows[64]["ratio"] == pytest.approx(rows[64]["ppl"] / rows[32]["ppl"])


def test_eval_refuses_repeated_multiples(rope_run, capsys):
    eval_log = rope_run / "eval.jsonl"
    before = eval_log.read_bytes() if eval_log.exists() else None
    one_line_exit_2(capsys, ["eval", str(rope_run), "--multiples", "1", "2", "1"], "--multiples repeats 1")
    assert (eval_log.read_bytes() if eval_log.exists() else None) == before  # nothing scored, nothing appended


@pytest.mark.parametrize(
    "argv,scheme,entries",
    [
        (["train", "--scheme", "rope|rope|rope"], "rope|rope|rope", 3),
        (["compare", "--schemes", "rope", "irope"], "irope", 4),
        (["train", "--scheme", "rope|nope", "--set", "model.n_layer=1"], "rope|nope", 2),
    ],
)
def test_a_layer_pattern_longer_than_the_model_is_refused(tmp_path, capsys, argv, scheme, entries):
    layers = 1 if "model.n_layer=1" in argv else 2  # the quick preset's 2 layers unless set
    one_line_exit_2(
        capsys,
        [*argv, "--preset", "quick", "--out", str(tmp_path / "x"), "--dry-run"],
        f"scheme {scheme!r} is a pattern of {entries} layer entries for a model of {layers} layers",
    )
    assert not (tmp_path / "x").exists()


def test_a_layer_pattern_shorter_than_the_model_repeats(tmp_path, capsys):
    argv = ["train", "--scheme", "rope|nope", "--preset", "quick", "--set", "model.n_layer=3"]
    assert main([*argv, "--out", str(tmp_path / "x"), "--dry-run"]) == 0  # layer i takes entry i mod 2


@pytest.mark.parametrize(
    "sizes,why", [([200, 300, 40], "the other 1 have fewer than 65 tokens"), ([200, 300], "all 2 are used")]
)
def test_eval_says_why_it_scores_fewer_targets_than_asked(sizes, why):
    """Each document gives only the first span targets: with every held-out document used, "no other held-out document
    has 65 tokens" was the wrong reason."""
    import numpy as np

    from posenc.cli.eval_cmd import scored_text

    docs = [(f"d{i}", np.arange(n)) for i, n in enumerate(sizes)]
    line = scored_text(docs, "corpus", 64, 10_000)
    assert line.startswith("text: the first 64 targets of 2 held-out document(s) of corpus (d0, d1), 128 targets")
    assert (
        ", fewer than --max-tokens 10000: each held-out document gives its first 64 targets only (every length "
        f"scores the same text), and {why} (posenc compare" in line
    )


@pytest.mark.parametrize(
    "setting", ["model.encoding=bogus", "model.encoding=rope|rope|rope|rope|rope", 'model={"encoding": "alibi"}']
)
@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_compare_refuses_a_model_encoding_every_job_would_replace(tmp_path, capsys, setting, dry_run):
    """compare sets model.encoding to each scheme it trains: a --set of it was accepted and silently ignored."""
    assert main(["compare", "--preset", "quick", *dry_run, "--out", str(tmp_path), "--set", setting]) == 2
    err = capsys.readouterr().err
    assert err == (
        "posenc: error: compare takes the scheme from --schemes (or the preset's schemes): give it there, not as "
        "--set model.encoding\n"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_train_refuses_a_model_encoding_its_scheme_flag_would_replace(tmp_path, capsys, dry_run):
    """train set model.encoding to --scheme after the --set: `--set model.encoding=alibi` trained RoPE, exit 0."""
    argv = ["train", "--scheme", "rope", "--preset", "quick", "--steps", "2", "--out", str(tmp_path / "x")]
    assert main([*argv, *dry_run, "--set", "model.encoding=alibi"]) == 2
    assert capsys.readouterr().err == (
        "posenc: error: train takes the scheme from --scheme: give it there, not as --set model.encoding\n"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "scheme,message",
    [
        # a named pattern inside '|' was expanded into its 6 layers, so 'entry i mod 2' read as 7 entries
        ("gemma3|nope", "scheme spec 'gemma3|nope': the entry 'gemma3' is a per-layer pattern (rope:rope_theta=10000"),
        # named a composition
        ("gemma3+alibi", "'gemma3' is a per-layer pattern (rope:rope_theta=10000,window=1024|"),
        # quoted the expanded entry 'rope:rope_theta=10000,window=0'
        ("gemma3:window=0", "scheme 'gemma3:window=0': window=0: must be an integer from 1 to 2^63 - 1 (tokens)"),
        ("irope-shipped:chunk=-1", "scheme 'irope-shipped:chunk=-1': chunk=-1: must be an integer from 1 to 2^63 - 1"),
        # an OverflowError traceback at the first attention, past the dry run
        ("rope:window=99999999999999999999", "window=99999999999999999999: must be an integer from 1 to 2^63 - 1"),
        # said mla replaces attention 'with its own softmax over every key'
        ("mla:window=4", "scheme 'mla:window=4': window is not supported on 'mla', which replaces attention (its own"),
    ],
)
def test_named_patterns_and_windows_are_refused_naming_what_was_written(tmp_path, capsys, scheme, message):
    argv = ["train", "--scheme", scheme, "--preset", "quick", "--set", "model.n_layer=8", "--dry-run"]
    one_line_exit_2(capsys, [*argv, "--out", str(tmp_path / "x")], message)
    assert not (tmp_path / "x").exists()


def test_posenc_list_gives_the_named_patterns_their_sources(capsys):
    code, out, _ = run_cli(capsys, "list", "--json")
    sources = {s["name"]: s["source"] for s in json.loads(out)["schemes"]}
    assert code == 0 and "arXiv:2503.19786" in sources["gemma3"] and "arXiv:2501.18795" in sources["rnope-swa"]
    assert "models/llama4" in sources["irope-shipped"] and "Llama 4" in sources["irope"]
    assert sources["acc-rand-qkv"] == sources["accumulated"] != ""  # an alias of one scheme has its scheme's


@pytest.fixture(scope="module")
def rope_pattern_run(tmp_path_factory):
    """A 2-step run of the pattern rope|rope (train_length 32): RoPE in every layer, as a pattern."""
    run = tmp_path_factory.mktemp("rope-rope") / "run"
    assert main(["train", "--scheme", "rope|rope", "--preset", "quick", "--steps", "2", "--out", str(run)]) == 0
    return run


@pytest.mark.parametrize("command", ["generate", "eval"])
def test_a_schedule_on_a_pattern_of_rope_layers_names_the_reason(rope_pattern_run, capsys, command):
    """It said 'rope schedules apply to RoPE models' of a model whose every layer is RoPE."""
    flags = ["--prompt", "To be", "--schedule", "yarn"] if command == "generate" else ["--rope-schedule", "yarn"]
    one_line_exit_2(
        capsys,
        [command, str(rope_pattern_run), *flags],
        "this run's 'rope|rope' is a per-layer pattern of 2 entries: a schedule is set on the model's one scheme spec, "
        "not per layer entry",
    )


@pytest.fixture(scope="module")
def task_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("task") / "run"
    assert (
        main(
            [
                "train",
                "--preset",
                "quick",
                "--scheme",
                "rope",
                "--corpus",
                "flipflop",
                "--steps",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    return out


@pytest.mark.parametrize(
    "command, more",
    [("eval", []), ("diagnose", []), ("generate", ["--prompt", "hi"]), ("eval", ["--corpus", "shakespeare"])],
)
def test_a_task_trained_run_is_refused_naming_the_task_not_the_corpus(task_run, capsys, command, more):
    """The message said "corpus 'flipflop' is a synthetic task; this command needs a text corpus", blaming a
    --corpus the user never gave; with --corpus, a text of another vocabulary than the model's."""
    one_line_exit_2(
        capsys,
        [command, str(task_run), *more],
        f"{task_run} was trained on the synthetic task 'flipflop' (a vocabulary of task tokens); posenc {command} "
        "reads text runs: a task run is scored by posenc compare with a task preset",
    )


def test_a_preset_path_that_is_a_directory_says_so(tmp_path, capsys):
    """A folder named like a preset file was reported as not existing."""
    folder = tmp_path / "mine.yaml"
    folder.mkdir()
    one_line_exit_2(
        capsys,
        ["compare", "--preset", str(folder), "--dry-run"],
        f"preset file {folder} is a directory, not a YAML file (shipped presets: ",
    )


def test_train_and_compare_do_not_share_a_folder(tmp_path, capsys):
    """Each wrote its files into the other's run folder without a word."""
    compare_root = tmp_path / "quick"
    compare_root.mkdir()
    (compare_root / "preset.json").write_text("{}")
    one_line_exit_2(
        capsys,
        ["train", "--scheme", "rope", "--preset", "quick", "--out", str(compare_root), "--dry-run"],
        f"{compare_root} holds a posenc compare run (preset.json): give train another --out",
    )
    train_root = tmp_path / "t1"
    train_root.mkdir()
    (train_root / "config.json").write_text("{}")
    one_line_exit_2(
        capsys,
        ["compare", "--preset", "quick", "--out", str(tmp_path), "--name", "t1", "--dry-run"],
        f"{train_root} holds a posenc train run (config.json): give compare another --name or --out",
    )


def test_a_finetune_interrupted_before_its_folder_exists_claims_no_checkpoint(tmp_path, capsys, monkeypatch):
    """Ctrl-C while the model loaded said "the run keeps its last checkpoint" and offered to resume a folder that
    was never made; once the folder exists, it names it."""
    import posenc.cli.finetune_cmd as cmd

    def stopped(cfg, out, log):
        raise KeyboardInterrupt

    monkeypatch.setattr(cmd, "finetune", stopped)
    out = tmp_path / "ft"
    assert main(["finetune", "--quick", "--out", str(out)]) == 130
    assert capsys.readouterr().err == "posenc: interrupted\n"
    out.mkdir()
    assert main(["finetune", "--quick", "--out", str(out)]) == 130
    assert capsys.readouterr().err.startswith(f"posenc: interrupted: {out} keeps its last checkpoint and records\n")


def test_a_train_interrupted_before_its_first_write_offers_no_resume(tmp_path, capsys, monkeypatch):
    """Ctrl-C while a huge model was being built said "keeps its last checkpoint" and offered a --resume that was
    then refused (no config.json); once the run has written its config, --resume is offered."""
    import posenc.cli.train_cmd as cmd

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cmd, "train", stopped)
    out = tmp_path / "t"
    argv = ["train", "--scheme", "rope", "--preset", "quick", "--steps", "1", "--out", str(out)]
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert err == (
        f"posenc: interrupted: {out} holds no checkpoint yet (the same command starts it again)\n"
        f"posenc: resume with: posenc {' '.join(argv)}\n"
    )
    out.mkdir(exist_ok=True)
    (out / "config.json").write_text("{}")
    assert main(argv) == 130
    assert capsys.readouterr().err.endswith(f"posenc {' '.join(argv)} --resume\n")


@pytest.mark.parametrize(
    "value,message",
    [
        ("", "POSENC_CACHE is empty: unset it (~/.cache/posenc) or name a directory"),
        ("{file}", "POSENC_CACHE={file} cannot be the cache directory: a file is in the way"),
        ("{file}/sub", "POSENC_CACHE={file}/sub cannot be the cache directory: a file is in the way"),
    ],
)
def test_a_cache_that_cannot_be_a_directory_is_one_line(tmp_path, capsys, monkeypatch, value, message):
    """A file as POSENC_CACHE gave a FileExistsError traceback; an empty one wrote the cache into the current
    directory."""
    file = tmp_path / "afile.txt"
    file.write_text("x")
    monkeypatch.setenv("POSENC_CACHE", value.format(file=file))
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--scheme", "rope", "--preset", "quick", "--steps", "1", "--out", str(tmp_path / "r")]
    one_line_exit_2(capsys, argv, message.format(file=file))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile.txt"]  # nothing written, no run folder


def test_generate_takes_the_same_default_factor_for_a_train_run_as_for_a_pretrained_model(tmp_path, capsys):
    """--factor's help says "default 2": a pretrained model took it, a train run said "yarn needs factor"."""
    run = tmp_path / "r"
    assert main(["train", "--scheme", "rope", "--preset", "quick", "--steps", "2", "--out", str(run)]) == 0
    capsys.readouterr()
    argv = ["generate", str(run), "--prompt", "To be", "--max-new-tokens", "6", "--temperature", "0", "--json"]
    assert main([*argv, "--schedule", "yarn"]) == 0  # was: rope schedule 'yarn' needs factor
    default = capsys.readouterr().out
    assert main([*argv, "--schedule", "yarn", "--factor", "2"]) == 0 and capsys.readouterr().out == default


def test_weights_that_do_not_match_the_config_name_the_mismatch(tmp_path, capsys):
    """A config.json edited after training said only "Error(s) in loading state_dict for LM:"."""
    import json

    from safetensors.torch import load_file, save_file

    run = tmp_path / "r"
    assert main(["train", "--scheme", "rope", "--preset", "quick", "--steps", "1", "--out", str(run)]) == 0
    capsys.readouterr()
    weights = run / "model.safetensors"
    save_file(load_file(weights), weights)  # weights saved without their model config (older runs)
    config = json.loads((run / "config.json").read_text())
    config["model"]["n_layer"] += 1
    (run / "config.json").write_text(json.dumps(config))
    one_line_exit_2(
        capsys,
        ["eval", str(run)],
        f"{run / 'model.safetensors'} does not match the run's model config: Missing key(s) in state_dict: ",
    )


def test_a_key_given_twice_in_a_preset_is_refused_with_its_lines(tmp_path, capsys):
    """PyYAML kept the last of two `model:` sections silently."""
    preset = tmp_path / "d.yaml"
    preset.write_text("name: d\nmodel: {n_layer: 1}\ntrain: {steps: 1}\nmodel: {n_layer: 2}\nschemes: [rope]\n")
    one_line_exit_2(
        capsys,
        ["compare", "--preset", str(preset), "--dry-run"],
        f"preset {preset} is not valid YAML: line 4, column 1: key 'model' given twice (first at line 2)",
    )


def test_import_of_a_file_by_its_bare_name_is_read_as_that_file(tmp_path, capsys, monkeypatch):
    """`--import afile.txt` from its folder said "No module named 'afile'": a bare name that is a file is a file."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile.txt").write_text("x")
    one_line_exit_2(capsys, ["--import", "afile.txt", "list"], "cannot import 'afile.txt': not a .py file or module")


def test_a_model_too_large_for_the_machine_is_refused_before_it_is_built(tmp_path, capsys, monkeypatch):
    """n_layer=1e8 built modules until killed, then offered to resume a folder with nothing in it."""
    import posenc.model

    monkeypatch.setattr(posenc.model, "physical_memory", lambda: 2.0**30)  # 1 GiB: the bound is the machine's
    out = tmp_path / "big"
    argv = ["train", "--scheme", "rope", "--preset", "quick", "--steps", "1", "--out", str(out)]
    one_line_exit_2(
        capsys,
        [*argv, "--set", "model.n_layer=100000"],
        "model of n_layer=100000, d_model=64 needs at least 15 GiB for its float32 weights; this machine has 1 GiB",
    )
    assert not out.exists()
    assert main([*argv, "--set", "model.n_layer=2"]) == 0  # what fits trains


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_a_run_file_that_is_a_directory_is_one_line(tmp_path, capsys, name):
    """eval, diagnose, generate (IsADirectoryError) and train --resume (its atomic write) printed tracebacks."""
    run = tmp_path / "r"
    assert main(["train", "--scheme", "rope", "--preset", "quick", "--steps", "1", "--out", str(run)]) == 0
    capsys.readouterr()
    (run / name).unlink()
    (run / name).mkdir()
    kind = "a JSON file" if name.endswith(".json") else "a safetensors file"
    for argv in (["eval", str(run)], ["diagnose", str(run)], ["generate", str(run), "--prompt", "x"]):
        one_line_exit_2(capsys, argv, f"{run / name} is damaged (a directory, not {kind})")
    if name == "model.safetensors":  # training reaches its first save, which must not replace a directory
        argv = ["train", "--scheme", "rope", "--preset", "quick", "--steps", "2", "--out", str(run), "--resume"]
        one_line_exit_2(capsys, argv, f"{run / name} is a directory where a file belongs: move it away")
        assert not [p for p in run.iterdir() if ".tmp" in p.name]  # its temporary file removed


def test_eval_of_a_missing_folder_or_a_compare_run_says_what_it_is(tmp_path, capsys):
    """Both said "has no checkpoint"."""
    one_line_exit_2(capsys, ["eval", str(tmp_path / "nope")], f"run directory {tmp_path / 'nope'} does not exist")
    (tmp_path / "cmp").mkdir()
    (tmp_path / "cmp" / "preset.json").write_text("{}")
    one_line_exit_2(
        capsys,
        ["diagnose", str(tmp_path / "cmp")],
        f"{tmp_path / 'cmp'} is a posenc compare run: give one of its models (a SCHEME/seedN folder in it)",
    )


def test_an_output_at_a_broken_link_says_so(tmp_path, capsys):
    """`train --out` at a dangling symlink said "a file is in the way"."""
    link = tmp_path / "gone"
    link.symlink_to(tmp_path / "nowhere")
    argv = ["train", "--scheme", "rope", "--preset", "quick", "--steps", "1", "--out", str(link)]
    one_line_exit_2(capsys, argv, f"cannot create output directory {link}: {link} is a broken symbolic link")
    assert link.is_symlink() and not (tmp_path / "nowhere").exists()


BATCH_ARGV = ["train", "--scheme", "rope", "--preset", "quick", "--steps", "2", "--device", "cpu"]


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_a_batch_too_large_for_the_machine_is_refused_before_the_run_directory(tmp_path, capsys, monkeypatch, dry_run):
    """train.batch_size=1e8 passed validation and was killed for memory (exit 137, no error line), leaving a run
    directory of config.json and train.jsonl only."""
    import posenc.model

    monkeypatch.setattr(posenc.model, "physical_memory", lambda: 16.0 * 2**30)
    out = tmp_path / "D"
    one_line_exit_2(
        capsys,
        [*BATCH_ARGV, "--out", str(out), "--set", "train.batch_size=100000000", *dry_run],
        # 1e8 rows x 32 tokens x 64 features x 2 layers x 8 bytes = 3,051.8 GiB
        "train.batch_size=100000000 needs at least 3,051.8 GiB of activations per training step (100,000,000 rows x "
        "train_length 32 x d_model 64 x n_layer 2 x 8 bytes); this machine has 16.0 GiB: lower train.batch_size",
    )
    assert not out.exists()


def test_the_batch_check_of_the_library_counts_this_process_rows_and_a_bias_score_tile(monkeypatch):
    """train() refuses as the command line does (torchrun: this process's rows of the global batch); a biased scheme
    past its attention block adds the one score tile the chunked path surely holds."""
    import posenc.model
    from posenc.errors import PosencError
    from posenc.model import ModelConfig, check_batch_fits

    monkeypatch.setattr(posenc.model, "physical_memory", lambda: 2.0**30)
    cfg = ModelConfig(encoding="alibi", n_layer=2, n_head=4, d_model=64, train_length=1024, attn_block_size=256)
    # rows x 1024 x 64 x 2 x 8 bytes = rows MiB, and the tile 4 heads x 256 x 256 x 4 bytes = 1 MiB
    check_batch_fits(cfg, 8192, 1023)  # 1 GiB exactly: a lower bound that fits
    with pytest.raises(PosencError) as err:
        check_batch_fits(cfg, 8192, 1024)
    assert str(err.value) == (
        "train.batch_size=8192 needs at least 1.0 GiB of activations per training step (1,024 rows of it per process "
        "x train_length 1024 x d_model 64 x n_layer 2 x 8 bytes, and a 1 MiB score tile); this machine has 1.0 GiB: "
        "lower train.batch_size"
    )


@pytest.mark.parametrize(
    "scheme,precision,block",
    [("rope", "fp32", 512), ("rope", "bf16", 512), ("alibi", "fp32", 16), ("t5", "bf16", 16), ("nope", "fp32", 512)],
)
def test_the_batch_bound_is_below_what_one_training_step_keeps(scheme, precision, block):
    """The bound never refuses a batch that fits: a training forward keeps at least as many bytes for its backward
    (its saved tensors, weights left out), at float32 and under bf16 autocast, on the fused and the chunked paths."""
    import torch

    from posenc.model import ACTIVATION_BYTES, LM, ModelConfig, score_tile_bytes
    from posenc.train.precision import autocast

    cfg = ModelConfig(
        encoding=scheme, vocab_size=64, n_layer=2, n_head=2, d_model=32, train_length=48, attn_block_size=block
    )
    model, rows = LM(cfg), 3
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    x = torch.randint(0, 64, (rows, 48))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast(precision, torch.device("cpu")):
        model.token_nll(x, x).mean()
    bound = rows * 48 * 32 * 2 * ACTIVATION_BYTES + score_tile_bytes(cfg)
    assert score_tile_bytes(cfg) == (4 * 2 * 16 * 16 if block == 16 else 0)
    assert sum(kept.values()) >= bound
