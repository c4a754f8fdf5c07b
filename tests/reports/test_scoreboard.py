"""The scoreboard (posenc.reports.scoreboard): values on synthetic runs, `posenc report` with task runs, and the
README's block against what the code prints from the committed results."""

from pathlib import Path

import pytest

from posenc.cli.main import main
from posenc.config.plan import load_preset
from posenc.reports.claims import ClaimSet, Quantity, register_claims, scheme_quantities
from posenc.reports.runs import scoreboard
from posenc.reports.scoreboard import BEGIN, END, load_task_run, readme_block, task_label
from posenc.reports.tasks import TaskTable
from posenc.reports.tasks import write_csv as write_task_csv
from posenc.reports.text import with_ratios, write_csv
from posenc.store.records import Ppl, TaskCell, append
from tests.task_records import task_record

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"
L0 = 128


def test_the_readme_block_is_what_the_code_prints_from_the_committed_results():
    """A generated artifact: rewrite it with
    `posenc report results/retrieval results/state-tracking results/default results/catalogue-iv-text
    results/catalogue-iv-gemma3 --readme README.md`."""
    runs = ["retrieval", "state-tracking", "default", "catalogue-iv-text", "catalogue-iv-gemma3"]
    printed = scoreboard([RESULTS / r for r in runs])
    assert readme_block(ROOT / "README.md") == printed
    text = (ROOT / "README.md").read_text()  # what posenc is, the two commands and the example first (issue 61)
    assert text.index("## Two commands") < text.index("## In your own code") < text.index(BEGIN)


def _text_run(path: Path) -> Path:
    """rope and alibi, two seeds: ppl at 1x, 16x and 128x."""
    ppl = {"rope": ([8.0, 8.2], [1.5, 1.7], [2.0, 3.0]), "alibi": ([9.0, 9.0], [1.0, 1.0], [0.99, 0.97])}
    recs = []
    for s, (p1, r16, r128) in ppl.items():
        for seed in (0, 1):
            recs += [
                Ppl(scheme=s, seed=seed, train_length=L0, eval_length=m * L0, ppl=p1[seed] * r)
                for m, r in ((1, 1.0), (16, r16[seed]), (128, r128[seed]))
            ]
    path.mkdir()
    write_csv(path / "results.csv", with_ratios(recs))
    return path


def _job(task, scheme, seed, id_acc, curve, step=None, criterion=True):
    cells = [TaskCell(test="id", length=L0, bucket=8, n=1000, correct=round(1000 * id_acc), nll=0.0)]
    cells += [
        TaskCell(test="gap", length=L0 + b + 1, bucket=b, n=1000, correct=round(1000 * a), nll=0.0)
        for b, a in curve.items()
    ]
    return task_record(
        cells,
        seed,
        scheme,
        task,
        trained_steps=step or 600,
        criterion="id_accuracy >= 0.99" if criterion else None,
        criterion_step=step,
    )


def _task_run(path: Path) -> Path:
    far, near = {8: 1.0, 64: 1.0, 1024: 1.0, 2048: 0.5}, {8: 1.0, 64: 1.0, 128: 0.5}
    jobs = [
        _job("flipflop", "rope:rope_theta=10000", 0, 0.99, near, 300),
        _job("flipflop", "rope:rope_theta=10000", 1, 0.99, far, 500),
        _job("flipflop", "rope:rope_theta=10000", 2, 0.99, far),  # criterion not met: 2 of 3 seeds
        _job("flipflop", "alibi", 0, 0.6, near),
        _job("flipflop", "alibi", 1, 0.99, near),  # 1 of 2 seeds learned
        _job("flipflop", "path", 0, 1.0, far),  # never met its criterion
        _job("modsum:m=2", "path", 0, 1.0, near, criterion=False),
        _job("modsum:m=2", "path", 1, 1.0, far, criterion=False),
    ]
    path.mkdir()
    for r in jobs:
        append(path / "results.jsonl", r)
    return path


def test_scoreboard_values_on_synthetic_runs(tmp_path):
    text, tasks = _text_run(tmp_path / "text"), _task_run(tmp_path / "tasks")
    lines = scoreboard([tasks, text]).splitlines()
    assert lines[0] == (
        "| scheme | ppl at 1x | ratio at 16x | ratio at 128x | flip-flop horizon | parity horizon | "
        "flip-flop steps to criterion |"
    )
    rows = {line.split(" | ")[0].strip("| "): line for line in lines[2:5]}
    # rope matched by spec; horizons 64 / 1024 / 1024 -> median 1,024, range 64 to 1,024 (as report.md shows it);
    # criterion met on seeds 0, 1 (300, 500)
    assert (
        rows["rope"] == "| rope | 8.10 ± 0.10 | 1.600 ± 0.100 | 2.500 ± 0.500 | 1,024 (range 64 to 1,024) | "
        "| 400 ± 100 (2 of 3 seeds) |"
    )
    assert (
        rows["alibi"]
        == "| alibi | 9.00 ± 0.00 | 1.000 ± 0.000 | 0.980 ± 0.010 | did not learn (1 of 2 seeds learned) | "
        "| not reached (600 steps) |"
    )
    # path: one seed at 1,024; on parity 64 / 1,024 -> the lower middle of an even count, 64
    assert rows["path"] == "| path | | | | 1,024 | 64 (range 64 to 1,024) | not reached (600 steps) |"
    assert "parity: `tasks`" in lines[-1] and "settings from defaults" in lines[-1]
    only_tasks = scoreboard([tasks]).splitlines()  # no text run: no text columns
    assert only_tasks[0] == "| scheme | flip-flop horizon | parity horizon | flip-flop steps to criterion |"


def test_the_ratio_columns_are_the_lengths_the_text_run_evaluated(tmp_path):
    """A text run evaluated to 8x gets an 8x column with its ratios (the columns were fixed at 16x and 128x: n/a)."""
    recs = [
        Ppl(scheme="rope", seed=seed, train_length=L0, eval_length=m * L0, ppl=8.0 * r)
        for seed, rs in ((0, (1.0, 1.2, 1.5)), (1, (1.0, 1.4, 1.7)))
        for m, r in zip((1, 4, 8), rs)
    ]
    (tmp_path / "text").mkdir()
    write_csv(tmp_path / "text" / "results.csv", with_ratios(recs))
    lines = scoreboard([_task_run(tmp_path / "tasks"), tmp_path / "text"]).splitlines()
    assert lines[0].startswith("| scheme | ppl at 1x | ratio at 8x | flip-flop horizon |")
    assert lines[2].startswith("| rope | 8.00 ± 0.00 | 1.600 ± 0.100 | ")
    assert "n/a" not in "\n".join(lines)


def test_report_with_task_runs_writes_the_scoreboard_and_the_task_claims(tmp_path, capsys, accumulated_claims):
    text, tasks = _text_run(tmp_path / "text"), _task_run(tmp_path / "tasks")
    assert main(["report", str(tasks), str(text), "--out", str(tmp_path / "o")]) == 0
    report = (tmp_path / "o" / "report.md").read_text()
    assert report.startswith("# posenc report: tasks, text\n\n## Scoreboard\n\n" + scoreboard([tasks, text]))
    assert (
        "## Perplexity at the training length and ratios per scheme and run" in report
        and (tmp_path / "o" / "ppl_ratio.png").exists()
    )
    assert (
        "| tasks | (R1) flipflop: flat perplexity is not far retrieval" in report
    )  # alibi, flat in the text run: undecided
    assert "| tasks | (R7) flipflop: ALiBi's horizon follows its slopes" in report
    capsys.readouterr()
    assert main(["report", str(tasks), str(text), "--scoreboard"]) == 0
    assert capsys.readouterr().out == scoreboard([tasks, text])
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{BEGIN}\nold\n{END}\n\nrest\n")
    assert main(["report", str(tasks), "--readme", str(readme)]) == 0
    assert readme.read_text() == f"# x\n\n{BEGIN}\n{scoreboard([tasks])}{END}\n\nrest\n" and readme_block(
        readme
    ) == scoreboard([tasks])


def test_scoreboard_bad_input_is_one_line(tmp_path, capsys):
    text, tasks = _text_run(tmp_path / "text"), _task_run(tmp_path / "tasks")
    (tmp_path / "README.md").write_text("# no block\n")
    cases = [
        (["report", str(text), "--scoreboard"], "the scoreboard needs a task comparison"),
        (["report", str(tasks), "--readme", str(tmp_path / "README.md")], f"{tmp_path / 'README.md'} has no {BEGIN}"),
        (["report", str(tasks), "--readme", str(tmp_path / "NO.md")], f"{tmp_path / 'NO.md'}: no such file to write"),
        (["report", str(tasks), "--readme", str(tmp_path)], f"{tmp_path}: a directory, not a file, to write"),
        (["report", str(tasks), "--readme", str(tmp_path / "bin.md")], f"{tmp_path / 'bin.md'} is not UTF-8 text"),
    ]
    (tmp_path / "bin.md").write_bytes(b"\xff\xfe" + BEGIN.encode())  # before: a UnicodeDecodeError traceback
    for argv, message in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"posenc: error: {message}") and len(err.splitlines()) == 1
    assert (tmp_path / "README.md").read_text() == "# no block\n"
    (tmp_path / "mixed").mkdir()
    for L in (128, 64):
        append(
            tmp_path / "mixed" / "results.jsonl",
            _job("flipflop", "path", 0, 1.0, {8: 1.0}).model_copy(update={"train_length": L}),
        )
    assert main(["report", str(tmp_path / "mixed"), "--scoreboard"]) == 2
    assert (
        capsys.readouterr().err == f"posenc: error: {tmp_path / 'mixed'} mixes training lengths [64, 128] on flipflop: "
        "not one task comparison\n"
    )


def test_task_labels_and_the_committed_task_runs_settings(accumulated_claims):
    assert [
        task_label(t)
        for t in ("flipflop", "flipflop:p_ignore=0.9", "mqar:pairs=4", "modsum:m=2", "modsum", "modsum:m=3")
    ] == ["flip-flop", "flip-flop", "gap-MQAR", "parity", "parity", "modsum:m=3"]
    retrieval, tracking = load_task_run(RESULTS / "retrieval", "r"), load_task_run(RESULTS / "state-tracking", "s")
    assert (retrieval.source, retrieval.n_head, retrieval.learned, retrieval.horizon_tol) == (
        "preset.json",
        4,
        0.9,
        0.05,
    )
    windows = retrieval.quantities["w_0.01"]  # the study's quantity (experiments/accumulated/window.py)
    assert windows["acc-rand-qkv:a=0.5"] == 110 and windows["rope"] is None
    assert (tracking.source, tracking.n_head, tracking.tasks()) == ("preset.json", 4, ["modsum:m=2"])


@pytest.mark.parametrize("kind", ["flipflop", "mqar"])
def test_a_task_in_two_runs_gives_the_later_run_rows_of_its_own(tmp_path, kind):
    """The first run's schemes hold the task's columns; a later run's get rows named by run (side by side)."""
    task = "flipflop" if kind == "flipflop" else "mqar:pairs=2,keys=4,values=4,filler=2,gap=0-8"
    for name, h in (("a", {8: 1.0, 16: 0.2}), ("b", {8: 1.0, 16: 1.0, 32: 0.2})):
        (tmp_path / name).mkdir()
        append(tmp_path / name / "results.jsonl", _job(task, "path", 0, 1.0, h, criterion=False))
    append(tmp_path / "b" / "results.jsonl", _job("modsum:m=2", "rope", 0, 1.0, {8: 1.0}, step=250))
    assert scoreboard([tmp_path / "a", tmp_path / "b"]).splitlines()[:5] == [
        f"| scheme | {task_label(task)} horizon | parity horizon | parity steps to criterion |",
        "|---|---|---|---|",
        "| path | 8 | | |",
        "| rope | | ≥ 8 | 250 |",  # its only bucket probed is within the tolerance: censored
        "| path (b) | 16 | | |",
    ]


def test_a_scheme_trained_as_a_sweep_variant_says_so_in_the_scoreboard_and_the_csv(tmp_path):
    """A row joins runs by scheme: where a task run trained a variant (forget:init_bias=4), its cells say so."""
    far = {8: 1.0, 64: 1.0, 1024: 1.0, 2048: 0.5}
    jobs = [
        _job("flipflop", "forget", seed, 1.0, far).model_copy(update={"encoding": "forget:init_bias=4"})
        for seed in (0, 1)
    ]
    jobs += [_job("flipflop", "alibi", 0, 1.0, far).model_copy(update={"encoding": "alibi"})]  # itself: nothing said
    path = tmp_path / "tasks"
    path.mkdir()
    for r in jobs:
        append(path / "results.jsonl", r)
    rows = {line.split(" | ")[0].strip("| "): line for line in scoreboard([path]).splitlines()[2:4]}
    assert rows["forget"].startswith("| forget | 1,024 (trained as forget:init_bias=4) |")
    assert rows["alibi"].startswith("| alibi | 1,024 |")
    write_task_csv(path / "retrieval.csv", jobs)
    (path / "results.jsonl").unlink()  # a committed run keeps the CSV: the variant survives it
    assert [r.encoding for r in load_task_run(path, "tasks").records] == ["forget:init_bias=4"] * 2 + ["alibi"]
    again = scoreboard([path]).splitlines()[2:4]  # the horizon cells (the CSV keeps no criterion text)
    assert [r.split(" |")[:2] for r in again] == [r.split(" |")[:2] for r in rows.values()]


def test_a_variant_gets_its_own_quantity():
    register_claims(ClaimSet("q", "Q", quantities=(Quantity("chars", "spec length", lambda m: len(m.encoding)),)))
    preset = load_preset(
        "retrieval",
        {"schemes": ["acc-rand-qkv"], "sweep": {"schemes": {"acc-rand-qkv": {"model.encoding": ["acc-rand-qkv:a=2"]}}}},
    )
    windows = scheme_quantities(preset, {"rope"})["chars"]
    assert windows == {"acc-rand-qkv": 12, "acc-rand-qkv:a=2": 16, "rope": 4}  # the variant, and a record's scheme
    far = {8: 1.0, 64: 1.0}
    t = TaskTable(
        [_job("flipflop", "acc-rand-qkv", 0, 1.0, far).model_copy(update={"encoding": "acc-rand-qkv:a=2"})],
        "flipflop",
        L0,
        0.05,
        0.9,
    )
    assert t.trained_values(windows)["acc-rand-qkv"] == windows["acc-rand-qkv:a=2"]
    assert t.trained_as("acc-rand-qkv") == " (trained as acc-rand-qkv:a=2)"


def test_a_second_text_run_adds_its_schemes_and_labels_its_shared_references(tmp_path):
    """Catalogue IV's comparison beside the default one: its new schemes get rows of their own with its text cells,
    its run of a scheme the first text run holds (the reference, rope) a row named by the run; different training
    lengths are refused in one line."""
    text, tasks = _text_run(tmp_path / "text"), _task_run(tmp_path / "tasks")
    recs = [
        Ppl(scheme=s, seed=seed, train_length=L0, eval_length=m * L0, ppl=p * r)
        for s, p in (("rope", 7.0), ("stick-breaking", 9.0))
        for seed in (0, 1)
        for m, r in ((1, 1.0), (16, 1.1 + 0.1 * seed), (128, 1.2))
    ]
    (tmp_path / "iv").mkdir()
    write_csv(tmp_path / "iv" / "results.csv", with_ratios(recs))
    lines = scoreboard([tasks, text, tmp_path / "iv"]).splitlines()
    rows = {line.split(" | ")[0].strip("| "): line for line in lines[2:] if line.startswith("| ")}
    assert rows["rope"].startswith("| rope | 8.10 ± 0.10 | 1.600 ± 0.100 | 2.500 ± 0.500 | 1,024")
    assert rows["stick-breaking"] == "| stick-breaking | 9.00 ± 0.00 | 1.150 ± 0.050 | 1.200 ± 0.000 | | | |"
    assert rows["rope (iv)"] == "| rope (iv) | 7.00 ± 0.00 | 1.150 ± 0.050 | 1.200 ± 0.000 | | | |"
    assert "text: `text`" in lines[-1] and "text: `iv`" in lines[-1]
    other = [Ppl(scheme="rope", seed=0, train_length=64, eval_length=m * 64, ppl=5.0) for m in (1, 16)]
    (tmp_path / "short").mkdir()
    write_csv(tmp_path / "short" / "results.csv", with_ratios(other))
    assert main(["report", str(tasks), str(text), str(tmp_path / "short"), "--scoreboard"]) == 2


def test_a_later_run_of_two_known_tasks_gives_one_row_per_scheme(tmp_path):
    """A later run holding several tasks the first run holds: each of its schemes is one row, its tasks side by
    side (before, one row per task, each with the others' cells empty)."""
    mqar = "mqar:pairs=2,keys=4,values=4,filler=2,gap=0-8"
    for name, h in (("a", {8: 1.0, 16: 0.2}), ("b", {8: 1.0, 16: 1.0, 32: 0.2})):
        (tmp_path / name).mkdir()
        for task in ("flipflop", mqar):
            append(tmp_path / name / "results.jsonl", _job(task, "path", 0, 1.0, h, criterion=False))
    assert scoreboard([tmp_path / "a", tmp_path / "b"]).splitlines()[:4] == [
        "| scheme | flip-flop horizon | gap-MQAR horizon |",
        "|---|---|---|",
        "| path | 8 | 8 |",
        "| path (b) | 16 | 16 |",
    ]


def test_a_report_header_names_the_seeds_its_records_hold(tmp_path):
    """A rerun with --seeds 1 beside seed 0's records headed its report "seeds: [1]" over means of both."""
    from posenc.reports.tasks import write_task_report
    from posenc.reports.text import markdown
    from posenc.store.stamp import run_stamp

    recs = with_ratios([Ppl(scheme="rope", seed=s, train_length=L0, eval_length=L0, ppl=8.0 + s) for s in (0, 1)])
    assert "- **seeds**: [0, 1]\n" in markdown(recs, {}, {"name": "x", "seeds": [1]})
    for seed in (0, 1):
        append(tmp_path / "results.jsonl", _job("flipflop", "rope", seed, 1.0, {8: 1.0}))
    meta = {
        "name": "t",
        "model": "m",
        "budget": "b",
        "seeds": [1],
        "train_length": L0,
        "text_results": None,
        "tasks": {},
    }
    meta |= {"eval": {"answers": 1, "max_tokens": 1, "multiples": [1], "learned": 0.9, "horizon_tol": 0.05}}
    meta |= {"stamp": run_stamp("fp32")}
    write_task_report(tmp_path, meta)
    assert "- seeds: [0, 1]\n" in (tmp_path / "report.md").read_text()
