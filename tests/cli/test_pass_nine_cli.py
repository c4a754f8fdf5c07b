"""Bad input a ninth pass over the command line found (issue 59): each is one line and exit 2 naming what is wrong,
and no earlier result is lost or overwritten; before, each was taken (or said something else than the problem)."""

import errno
import hashlib
import json
import os

import pytest

from posenc.cli.main import main
from posenc.store import lock
from tests.cli.runs import COMPARE, QUICK, one_line_exit_2

DIAGNOSE = ["--multiples", "1", "2", "--windows", "1", "-q"]


def digest(folder):
    """{relative path: sha256} of every file under ``folder``."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


# ---------------------------------------------------------------- 1. diagnose --out another run's folder


@pytest.mark.parametrize(
    "other,marker", [("cmp/quick", "compare run (preset.json)"), ("tr", "train, extend or finetune run (config.json)")]
)
def test_diagnose_refuses_an_out_that_holds_another_run(runs, capsys, other, marker):
    """--out a compare run's folder replaced its far_mass.png (and wrote diagnose files among its results)."""
    before = digest(runs / other)
    argv = ["diagnose", str(runs / "cmp" / "quick" / "rope" / "seed0"), "--out", str(runs / other), *DIAGNOSE]
    one_line_exit_2(capsys, argv, f"{runs / other} holds a posenc {marker}")
    assert digest(runs / other) == before


def test_diagnose_refusal_names_the_flag(runs, capsys):
    argv = ["diagnose", str(runs / "tr"), "--out", str(runs / "cmp" / "quick"), *DIAGNOSE]
    one_line_exit_2(capsys, argv, "(preset.json): give diagnose another --out")


# ---------------------------------------------------------------- 2. diagnose honours the run's lock


def test_diagnose_refuses_a_run_another_posenc_process_holds(runs, capsys, holder):
    """A run being trained (its lock held) was diagnosed from whatever checkpoint was there, exit 0."""
    proc = holder(runs / "tr")
    before = digest(runs / "tr")
    argv = ["diagnose", str(runs / "tr"), "--out", str(runs / "d"), *DIAGNOSE]
    one_line_exit_2(capsys, argv, f"{runs / 'tr'} is in use by another posenc process (pid {proc.pid}); wait for it")
    assert digest(runs / "tr") == before and not (runs / "d").exists()


def test_diagnose_refuses_a_run_inside_a_held_compare(runs, capsys, holder):
    proc = holder(runs / "cmp" / "quick")  # a compare running: its jobs train inside its run root
    argv = ["diagnose", str(runs / "cmp" / "quick" / "rope" / "seed0"), "--out", str(runs / "d"), *DIAGNOSE]
    one_line_exit_2(capsys, argv, f"{runs / 'cmp' / 'quick'} is in use by another posenc process (pid {proc.pid})")
    assert not (runs / "d").exists()


# ---------------------------------------------------------------- 3. extend rerun with other settings


@pytest.mark.slow
@pytest.mark.parametrize(
    "change,diff",
    [
        (["--factor", "4"], "factor 2.0 -> 4.0"),
        (["--set", "factor=3"], "factor 2.0 -> 3.0"),
        (["--dtype", "bfloat16"], "dtype None -> 'bfloat16'"),
        (["--beta-fast", "16"], "beta_fast None -> 16.0"),
    ],
)
def test_extend_refuses_a_rerun_with_other_settings(llama_dir, capsys, change, diff):
    """config.json was rewritten with the new setting, its invocations dropped, and results.md replaced."""
    out = llama_dir / "o"
    argv = ["extend", "--model", str(llama_dir / "tiny"), "--corpus", str(llama_dir / "corpus.txt"), "--out", str(out)]
    argv += ["--schedules", "none", "yarn", "--lengths", "16", "--passkey-lengths", "-q"]
    assert main(argv) == 0
    capsys.readouterr()
    before = digest(out)
    message = f"{out} holds results made with other settings ({diff}); use another --name or --out"
    for dry in ([], ["--dry-run"]):
        one_line_exit_2(capsys, [*argv, *change, *dry], message)
        assert digest(out) == before
    assert main([*argv, "--lengths", "16", "32"]) == 0  # the same settings: resumed, a length added
    calls = json.loads((out / "config.json").read_text())["invocations"]
    assert [c["lengths"] for c in calls] == [[16], [16, 32]]


# ---------------------------------------------------------------- 4. compare into results without preset.json


@pytest.mark.parametrize("dry", [[], ["--dry-run"]])
def test_compare_refuses_results_whose_settings_are_not_recorded(runs, capsys, dry):
    """With preset.json deleted a rerun of other settings trained and appended to the old results.jsonl."""
    root = runs / "cmp" / "quick"
    (root / "preset.json").unlink()
    before = digest(root)
    argv = [*COMPARE, "--set", "train.steps=3", "--out", str(runs / "cmp"), *dry]
    one_line_exit_2(
        capsys,
        argv,
        f"{root} holds results (results.jsonl) but no preset.json recording their settings; "
        "use another --name or --out",
    )
    assert digest(root) == before


def test_compare_refuses_a_rerun_that_drops_a_section_of_the_settings(tmp_path, capsys):
    """A run trained to a criterion (train.until) rerun without one was taken: its keys were only in the old run's
    settings, and only the rerun's keys were compared."""
    from posenc.config.plan import load_preset
    from posenc.jobs.launcher import record_run

    root = tmp_path / "quick"
    record_run(root, load_preset("quick", {"tasks": ["flipflop"], "train.until": {"at_least": 0.9, "every": 10}}))
    before = digest(root)
    argv = ["compare", "--preset", "quick", "--tasks", "flipflop", "--out", str(tmp_path), "--dry-run"]
    one_line_exit_2(capsys, argv, f"{root} holds results made with other settings (train.until.metric 'id_accuracy'")
    assert digest(root) == before


# ---------------------------------------------------------------- 5. a read-only run folder


@pytest.fixture
def read_only(monkeypatch):
    """read_only(folder): the file system refuses every write into ``folder`` (mounting one read-only needs root)."""
    folders = []
    real_open, real_access = os.open, os.access

    def refused(path):
        return any(os.path.realpath(os.path.dirname(path)) == str(f.resolve()) for f in folders)

    def fake_open(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and refused(path):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args, **kwargs)

    def fake_access(path, mode, *args, **kwargs):
        if mode & os.W_OK and any(os.path.realpath(path) == str(f.resolve()) for f in folders):
            return False
        return real_access(path, mode, *args, **kwargs)

    monkeypatch.setattr(lock.os, "open", fake_open)
    monkeypatch.setattr(lock.os, "access", fake_access)
    return folders.append


def test_eval_in_a_read_only_run_says_the_folder_is_read_only(runs, capsys, read_only):
    """It said "read-only file system: RUN/.lock": the lock file, not the folder eval records its results in."""
    read_only(runs / "tr")
    before = digest(runs / "tr")
    argv = ["eval", str(runs / "tr"), "--multiples", "1", "--max-tokens", "64", "-q"]
    err = one_line_exit_2(capsys, argv, f"{runs / 'tr'} is read-only (read-only file system)")
    assert ".lock" not in err and "eval.jsonl" in err
    assert digest(runs / "tr") == before


def test_diagnose_reads_a_read_only_run_into_an_out_elsewhere(runs, capsys, read_only):
    read_only(runs / "tr")
    assert main(["diagnose", str(runs / "tr"), "--out", str(runs / "d"), *DIAGNOSE]) == 0
    assert (runs / "d" / "diagnose.md").exists() and not (runs / "tr" / "diagnose").exists()


def test_diagnose_into_a_read_only_run_is_refused_before_the_work(runs, capsys, read_only, monkeypatch):
    """Its default --out (RUN_DIR/diagnose) in a read-only run failed only after the diagnosis, at the mkdir."""
    from posenc.cli import diagnose_cmd

    read_only(runs / "tr")
    monkeypatch.setattr(diagnose_cmd, "diagnose_model", lambda *a: pytest.fail("diagnosed"))
    message = f"cannot create output directory {runs / 'tr' / 'diagnose'}: {runs / 'tr'} is not writable (read-only)"
    one_line_exit_2(capsys, ["diagnose", str(runs / "tr"), *DIAGNOSE], message)


# ---------------------------------------------------------------- 6. absurd step counts


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--scheme", "rope", "--preset", "quick", "--steps", str(10**20), "--dry-run"],
        ["train", "--scheme", "rope", "--preset", "quick", "--set", f"train.steps={10**20}", "--dry-run"],
        ["train", "--scheme", "rope", "--preset", "quick", "--set", f"train.warmup={2**31}", "--dry-run"],
        ["train", "--scheme", "rope", "--preset", "quick", "--set", f"train.ckpt_every={10**20}", "--dry-run"],
        ["compare", "--preset", "quick", "--steps", str(10**20), "--dry-run"],
        ["finetune", "--quick", "--steps", str(10**20), "--dry-run"],
    ],
)
def test_a_step_count_past_the_bound_is_refused(tmp_path, capsys, argv):
    """steps=10^20 trained on, at a schedule 10^20 steps long, until killed."""
    one_line_exit_2(capsys, [*argv, "--out", str(tmp_path / "x")], "less than or equal to 2147483647")
    assert not (tmp_path / "x").exists()


def test_the_step_bound_itself_is_accepted():
    from posenc.store.presets import MAX_STEPS
    from posenc.train.settings import TrainConfig

    assert MAX_STEPS == 2**31 - 1
    assert TrainConfig(steps=MAX_STEPS, warmup=MAX_STEPS, ckpt_every=MAX_STEPS).steps == MAX_STEPS


# ---------------------------------------------------------------- 7. a preset that is no regular file


@pytest.mark.parametrize(
    "argv,kind",
    [
        (["compare", "--dry-run"], "preset"),
        (["train", "--scheme", "rope", "--dry-run"], "preset"),
        (["extend", "--dry-run"], "extend preset"),
        (["finetune", "--dry-run"], "finetune preset"),
    ],
)
def test_a_preset_that_is_a_device_says_so(capsys, argv, kind):
    """--preset /dev/null said the file "does not exist"."""
    err = one_line_exit_2(
        capsys,
        [*argv, "--preset", "/dev/null"],
        f"{kind} file /dev/null is not a regular file (a device, FIFO or socket), not a YAML file",
    )
    assert "does not exist" not in err


def test_a_preset_at_a_broken_link_says_so(tmp_path, capsys):
    (tmp_path / "p.yaml").symlink_to(tmp_path / "gone.yaml")
    one_line_exit_2(capsys, ["compare", "--dry-run", "--preset", str(tmp_path / "p.yaml")], "is a broken symbolic link")


# ---------------------------------------------------------------- 8. generate takes only what is named


@pytest.mark.parametrize(
    "command,what",
    [
        (["generate", "{}", "--prompt", "hi"], "nor a model directory (config.json)"),
        (["extend", "--dry-run", "--model", "{}"], "holds no config.json (not a Hugging Face model directory)"),
    ],
)
def test_a_folder_with_a_stray_gguf_is_not_taken_for_a_model(tmp_path, capsys, command, what):
    """generate /tmp loaded a stray .gguf lying there as the model ("cannot load ...: old.gguf does not start with
    the GGUF magic bytes"); only a GGUF file named is loaded."""
    folder = tmp_path / "downloads"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    (folder / "old.gguf").write_text("not a model")
    argv = [a.replace("{}", str(folder)) for a in command]
    err = one_line_exit_2(capsys, argv, f"{folder} ")
    assert f"{what}; to load its .gguf file name it: {folder / 'old.gguf'}\n" in err
    (folder / "new.gguf").write_text("not a model either")
    err = one_line_exit_2(capsys, argv, f"; to load one of its 2 .gguf files name it (such as {folder / 'new.gguf'})")


# ---------------------------------------------------------------- 9. absurd thread counts


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--scheme", "rope", *QUICK, "--set", f"train.threads={10**20}"],  # trained: a traceback, no dry run
        ["train", "--scheme", "rope", "--preset", "quick", "--set", f"train.threads={2**31}", "--dry-run"],
        ["compare", "--preset", "quick", "--set", f"train.threads={10**20}", "--dry-run"],
        ["extend", "--threads", str(10**20), "--dry-run"],
        ["finetune", "--quick", "--set", f"threads={10**20}", "--dry-run"],
    ],
)
def test_a_thread_count_past_the_bound_is_refused(tmp_path, capsys, argv):
    """threads=10^20 was taken, and training raised torch's "Overflow when unpacking long long" (a traceback);
    2^31 - 1, which torch takes, aborted OpenMP at the first parallel op."""
    err = one_line_exit_2(capsys, [*argv, "--out", str(tmp_path / "x")], "Input should be less than or equal to 1024")
    assert "threads=" in err
    assert not (tmp_path / "x").exists()


def test_the_thread_bound_is_stated_and_itself_accepted(tmp_path, capsys):
    from posenc.store.presets import MAX_THREADS
    from posenc.train.settings import TrainConfig

    assert MAX_THREADS == 1024 and TrainConfig(threads=MAX_THREADS).threads == MAX_THREADS
    argv = ["train", "--scheme", "rope", "--preset", "quick", "--set", "train.threads=1025", "--dry-run"]
    one_line_exit_2(
        capsys,
        [*argv, "--out", str(tmp_path / "x")],
        "invalid train.threads=1025 (command line): Input should be less than or equal to 1024",
    )


# ---------------------------------------------------------------- 10. absurd evaluation counts

COUNTS = [
    "eval.max_tokens",
    "eval.batch_tokens",
    "eval.passkey.trials",
    "eval.passkey.candidates",
    "eval.far_mass.windows",
    "task_eval.answers",
    "task_eval.max_tokens",
    "task_eval.batch_tokens",
]


@pytest.mark.parametrize("key", COUNTS)
def test_an_evaluation_count_past_the_bound_is_refused(tmp_path, capsys, key):
    """eval.passkey.trials=10^20 (and each count here) was taken: the evaluation would have run until killed."""
    argv = [*COMPARE, "--set", f"{key}={10**20}", "--out", str(tmp_path / "x"), "--dry-run"]
    one_line_exit_2(
        capsys, argv, f"invalid {key}={10**20} (command line): Input should be less than or equal to 2147483647"
    )
    assert not (tmp_path / "x").exists()


def test_the_criterion_answers_are_bounded(tmp_path, capsys):
    until = f"train.until={{at_least: 0.9, every: 10, answers: {10**20}}}"
    argv = [*COMPARE, "--tasks", "flipflop", "--set", until, "--out", str(tmp_path / "x"), "--dry-run"]
    one_line_exit_2(capsys, argv, "less than or equal to 2147483647")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["extend", "--set", f"trials={10**20}"],
        ["extend", "--set", f"max_tokens={10**20}"],
        ["extend", "--set", f"max_windows={10**20}"],
        ["extend", "--set", f"stream={10**20}"],
        ["finetune", "--quick", "--set", f"eval_windows={10**20}"],
    ],
)
def test_a_scoring_count_of_extend_or_finetune_past_the_bound_is_refused(tmp_path, capsys, argv):
    one_line_exit_2(capsys, [*argv, "--dry-run", "--out", str(tmp_path / "x")], "less than or equal to 2147483647")
    assert not (tmp_path / "x").exists()


def test_a_negative_passkey_seed_is_refused_before_training(tmp_path, capsys):
    """eval.passkey.seed=-1 trained, then numpy's "expected non-negative integer" at the passkey pass (a traceback)."""
    argv = [*COMPARE, "--set", "eval.passkey.seed=-1", "--out", str(tmp_path / "x"), "--dry-run"]
    one_line_exit_2(
        capsys, argv, "invalid eval.passkey.seed=-1 (command line): Input should be greater than or equal to 0"
    )


def test_the_count_bound_is_stated_and_every_count_accepts_it():
    from posenc.config.plan import load_preset
    from posenc.store.presets import MAX_COUNT

    assert MAX_COUNT == 2**31 - 1
    preset = load_preset("quick", {key: MAX_COUNT for key in COUNTS})
    assert preset.eval.passkey.trials == preset.task_eval.answers == MAX_COUNT


# ---------------------------------------------------------------- 11. generate and report honour the lock


@pytest.mark.parametrize(
    "held,read",
    [
        ("tr", ["generate", "{tr}", "--prompt", "hi", "--max-new-tokens", "2"]),
        ("cmp/quick", ["generate", "{cmp}/quick/rope/seed0", "--prompt", "hi", "--max-new-tokens", "2"]),
        ("cmp/quick", ["report", "{cmp}/quick", "--out", "{rep}"]),
        ("cmp/quick", ["report", "{cmp}/quick", "--scoreboard"]),
        ("cmp/quick/rope/seed0", ["report", "{cmp}/quick/rope/seed0", "--out", "{rep}"]),
    ],
)
def test_generate_and_report_refuse_a_run_another_posenc_process_holds(runs, capsys, holder, held, read):
    """A run being trained (or a compare being written) was read as it stood, exit 0."""
    proc = holder(runs / held)
    before = digest(runs)
    argv = [a.format(tr=runs / "tr", cmp=runs / "cmp", rep=runs / "rep") for a in read]
    err = one_line_exit_2(capsys, argv, f"{runs / held} is in use by another posenc process (pid {proc.pid}); wait")
    assert "completion" not in capsys.readouterr().out and err
    assert digest(runs) == before and not (runs / "rep").exists()


def test_generate_and_report_read_a_run_nobody_holds_and_leave_no_lock(runs, capsys):
    assert main(["generate", str(runs / "tr"), "--prompt", "hi", "--max-new-tokens", "2"]) == 0
    assert main(["report", str(runs / "cmp" / "quick"), "--out", str(runs / "rep")]) == 0
    assert not list(runs.rglob(lock.LOCK_FILE))


def test_report_reads_a_read_only_results_folder(runs, capsys, read_only):
    """A committed results/ folder that cannot be written: no lock can be held there, it is only checked."""
    read_only(runs / "cmp" / "quick")
    before = digest(runs / "cmp" / "quick")
    assert main(["report", str(runs / "cmp" / "quick"), "--out", str(runs / "rep")]) == 0
    assert (runs / "rep" / "report.md").is_file() and digest(runs / "cmp" / "quick") == before


# ---------------------------------------------------------------- 12. diagnose past a learned table


@pytest.fixture(scope="module")
def learned(tmp_path_factory):
    """A 2-step run of a learned position table (as long as the training length, 32 tokens)."""
    run = tmp_path_factory.mktemp("pass9-learned") / "learned"
    assert main(["train", "--scheme", "learned", *QUICK, "--out", str(run), "-q"]) == 0
    return run


def test_diagnose_past_a_learned_table_says_why_in_each_cell(learned, tmp_path, capsys):
    """The tables past the table's length were empty (no layer.head rows, or bare n/a cells), exit 0."""
    out = tmp_path / "d"
    assert main(["diagnose", str(learned), "--out", str(out), "--multiples", "2", "4", "--windows", "1", "-q"]) == 0
    md = (out / "diagnose.md").read_text()
    assert capsys.readouterr().out.startswith(md)
    for table in md.split("## ")[1:]:  # far mass, its bound, entropy: each says why for every cell
        rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| layer.head")]
        assert rows and rows[0].startswith("| every layer.head |"), table
        for row in rows:
            assert row.split(" | ")[1:] == [
                "n/a: learned positions cover 32 tokens, got 64",
                "n/a: learned positions cover 32 tokens, got 128 |",
            ], row


def test_diagnose_of_a_learned_table_keeps_the_lengths_it_covers(learned, tmp_path, capsys):
    out = tmp_path / "d"
    assert main(["diagnose", str(learned), "--out", str(out), "--multiples", "1", "2", "--windows", "1", "-q"]) == 0
    entropy = (out / "diagnose.md").read_text().split("## Attention entropy")[1]
    rows = [line.split(" | ") for line in entropy.splitlines() if line.startswith(("| 0.", "| 1.", "| uniform"))]
    assert len(rows) == 5  # 2 layers x 2 heads, uniform
    for row in rows:
        float(row[1])  # the 1x cell: measured
        assert row[2] == "n/a: learned positions cover 32 tokens, got 64 |"
