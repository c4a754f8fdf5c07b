"""Sweeps as data: a preset's grid over training and model settings, each scheme's setting chosen on seed 0 by its
held-out in-distribution result, the other seeds at the chosen setting, the sensitivity table; and a compare
refusing to report a run trained with other settings than its job's (a run copied in from another budget)."""

import math
import re
import shutil

import pytest
import torch
import yaml

from posenc.cli.main import main
from posenc.config.plan import (
    at_point,
    grid_points,
    job_configs,
    job_encoding,
    load_preset,
    point_label,
    point_root,
    setting,
)
from posenc.errors import PosencError
from posenc.jobs.compare import compare
from posenc.jobs.retrieval import task_meta
from posenc.jobs.sweep import Choice, choose
from posenc.reports.sweep import sweep_markdown
from posenc.reports.tasks import Scores
from posenc.store.checkpoint import read_json, read_jsonl
from posenc.store.records import Ppl, Task, load

LR = [3e-3, 1e-2]


def _preset(tmp_path, name="tiny", **over):
    body = {
        "name": name,
        "model": {"n_layer": 1, "n_head": 2, "d_model": 16, "train_length": 16},
        "train": {
            "steps": 4,
            "batch_size": 4,
            "lr": 3e-3,
            "warmup": 1,
            "loss": "answers",
            "ckpt_every": 2,
            "threads": 1,
        },
        "tasks": ["flipflop"],
        "task_eval": {"multiples": [1, 2], "answers": 40, "max_tokens": 1024, "learned": 0.01},
        "schemes": ["rope", "nope"],
        **over,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))  # the grid keeps its key order
    return load_preset(str(path))


# ---------------------------------------------------------------- the chooser


def test_choose_takes_the_best_and_breaks_ties_by_steps_then_grid_order():
    assert choose({"a": 0.5, "b": 0.9, "c": 0.7}, higher_is_better=True) == "b"
    assert choose({"a": 5.0, "b": 3.0, "c": 4.0}, higher_is_better=False) == "b"
    assert choose({"a": 0.9, "b": 0.9, "c": 0.9}, higher_is_better=True) == "a"  # a tie: the first point
    assert choose({"a": 1.0, "b": 1.0, "c": 1.0}, True, tiebreak={"a": None, "b": 300, "c": 200}) == "c"  # fewer steps
    assert choose({"a": 1.0, "b": 1.0}, True, tiebreak={"a": 200, "b": 200}) == "a"


def test_choose_counts_no_failed_point_nor_one_below_the_bar():
    assert choose({"a": None, "b": math.nan, "c": 2.0}, higher_is_better=False) == "c"
    assert choose({"a": 0.6, "b": 0.95}, True, bar=0.9) == "b"
    assert choose({"a": 0.6, "b": 0.85}, True, bar=0.9) is None  # learned at no grid point: none chosen
    assert choose({"a": None}, False) is None and choose({}, True) is None


def test_a_scheme_that_learned_nowhere_gets_no_setting_and_says_so():
    grid = [(("train.lr", 0.001),), (("train.lr", 0.01),)]
    c = Choice("flipflop", "alibi", grid, {"train.lr=0.001": 0.7, "train.lr=0.01": 0.8}, {}, 0.9)
    assert c.point is None and c.setting() == (
        "none chosen: did not learn at any grid point (reported at its best, train.lr=0.01)"
    )
    assert c.shown == (("train.lr", 0.01),)  # the reports show it where it came closest, as "did not learn"
    c = Choice("flipflop", "alibi", grid, {"train.lr=0.001": 0.95, "train.lr=0.01": 0.8}, {}, 0.9)
    assert c.point == c.shown == (("train.lr", 0.001),) and c.setting() == "train.lr=0.001"
    assert Choice("flipflop", "alibi", grid, {"train.lr=0.001": None, "train.lr=0.01": None}, {}, 0.9).shown is None
    assert (
        Choice(None, "rope", grid, {"train.lr=0.001": None, "train.lr=0.01": None}, {}, None).setting()
        == "none chosen: no grid point has a result"
    )


# ---------------------------------------------------------------- the grid


def test_grid_points_per_scheme_and_at_point(tmp_path):
    p = _preset(
        tmp_path, sweep={"grid": {"train.lr": LR, "model.n_head": [2, 4]}, "schemes": {"nope": {"train.lr": [5e-3]}}}
    )
    assert grid_points(p, "rope") == [(("train.lr", a), ("model.n_head", h)) for a in LR for h in (2, 4)]
    assert grid_points(p, "nope") == [
        (("train.lr", 5e-3), ("model.n_head", 2)),
        (("train.lr", 5e-3), ("model.n_head", 4)),
    ]
    q = at_point(p, grid_points(p, "rope")[3])
    assert (q.train.lr, q.model.n_head, q.sweep) == (1e-2, 4, None) and p.model.n_head == 2
    assert point_root(tmp_path, grid_points(p, "rope")[1]) == tmp_path / "sweep" / "train.lr=0.003,model.n_head=4"
    assert grid_points(_preset(tmp_path), "rope") == [()] and point_root(tmp_path, ()) == tmp_path
    run_fewer = _preset(
        tmp_path, schemes=["rope"], sweep={"grid": {"train.lr": LR}, "schemes": {"alibi": {"model.n_head": [4]}}}
    )
    assert grid_points(run_fewer, "rope") == [
        (("train.lr", a),) for a in LR
    ]  # a scheme left out (--schemes): its grid unused


@pytest.mark.parametrize(
    "sweep, message",
    [
        ({"grid": {"train.seed": [0, 1]}}, "train.seed cannot be swept"),
        ({"grid": {"train.lr": [1e-3, 1e-3]}}, "each value once"),
        ({"grid": {"train.lr": []}}, "each value once, at least one"),
        ({"schemes": {"alibii": {"train.lr": [1e-3]}}}, "sweep.schemes names 'alibii', not a scheme"),
        ({"schemes": {"rope": {"train.lr": [1e-3]}}}, "scheme 'nope' has no grid in the sweep"),
        ({}, "scheme 'rope' has no grid in the sweep"),
        ({"grid": {"model.n_head": [3]}}, "n_head|head"),
        ({"grid": {"train.lr": [-1.0]}}, "grid point train.lr=-1.0: train.lr"),
        ({"grid": {"model.encoding": ["rope"]}}, "model.encoding gives one scheme's variants: sweep it per scheme"),
        (
            {"grid": {"train.lr": LR}, "schemes": {"rope": {"model.encoding": [4]}}},
            r"sweep.schemes.rope.model.encoding: give scheme specs \(strings\)",
        ),
        (  # a literal duplicate: the validator names the scheme as the canonical-spec check does
            {"grid": {"train.lr": LR}, "schemes": {"forget": {"model.encoding": ["forget", "forget"]}}},
            r"sweep.schemes.forget.model.encoding: give each value once, at least one, got \['forget', 'forget'\]",
        ),
        ({"schemes": {"rope": {"train.seed": [0]}}}, "sweep.schemes.rope.train.seed cannot be swept"),
        (
            {"grid": {"train.lr": LR}, "schemes": {"rope": {"model.encoding": ["rope", "alibi"]}}},
            r"sweep.schemes.rope.model.encoding gives 'alibi', not a variant of 'rope'",
        ),
        (
            {"grid": {"train.lr": LR}, "schemes": {"rope": {"model.encoding": ["rope+forget"]}}},
            "not a variant of 'rope'",
        ),
        ({"grid": {"train.lr": LR}, "schemes": {"rope": {"model.encoding": ["rope:theta=-1"]}}}, "theta"),
        (  # a scheme the run leaves out (--schemes) still has its variants checked
            {"grid": {"train.lr": LR}, "schemes": {"forget": {"model.encoding": ["forget", "alibi"]}}},
            "gives 'alibi', not a variant of 'forget'",
        ),
    ],
)
def test_a_bad_grid_is_refused_before_any_work(tmp_path, sweep, message):
    with pytest.raises(PosencError, match=message):
        _preset(tmp_path, sweep=sweep)


@pytest.mark.parametrize(
    "scheme, variant",
    [
        ("acc-rand-qk", "acc-rand-qkv"),  # one class, but the alias's rotate=qk dropped
        ("hybrid", "acc-rand-qkv+forget:init_bias=4"),  # hybrid's rotation is the learned one
        ("rope+forget", "forget+rope"),  # parts in another order
        ("acc-rand-qkv:a=0.25", "acc-rand-qkv:a=0.5"),  # a parameter the scheme sets, changed: another scheme
    ],
)
def test_a_variant_of_another_scheme_is_refused(tmp_path, scheme, variant):
    with pytest.raises(PosencError, match=re.escape(f"gives {variant!r}, not a variant of {scheme!r}")):
        _preset(tmp_path, schemes=[scheme], sweep={"schemes": {scheme: {"model.encoding": [scheme, variant]}}})


def test_one_variant_spelt_twice_is_refused(tmp_path):
    twice = {"schemes": {"forget": {"model.encoding": ["forget:init_bias=4", "forget:init_bias=4.0"]}}}
    with pytest.raises(PosencError, match=r"sweep.schemes.forget.model.encoding spells one variant twice"):
        _preset(tmp_path, schemes=["forget"], sweep=twice)


def test_a_variant_adds_parameters_to_any_part(tmp_path):
    p = _preset(
        tmp_path,
        schemes=["hybrid", "acc-rand-qkv"],
        sweep={
            "schemes": {
                "hybrid": {"model.encoding": ["hybrid", "acc-learned-qkv+forget:init_bias=4"]},
                "acc-rand-qkv": {"model.encoding": ["acc-rand-qkv:a=0.5"]},
            }
        },
    )
    assert [job_encoding(q, "hybrid") for q in grid_points(p, "hybrid")] == [
        "hybrid",
        "acc-learned-qkv+forget:init_bias=4",
    ]


def test_a_variant_axis_trains_the_variant_and_records_under_the_scheme(tmp_path):
    variants = ["rope+forget", "rope+forget:init_bias=4"]
    p = _preset(
        tmp_path,
        schemes=["rope+forget", "nope"],
        sweep={"grid": {"train.lr": LR}, "schemes": {"rope+forget": {"model.encoding": variants}}},
    )
    points = grid_points(p, "rope+forget")
    assert points == [(("train.lr", a), ("model.encoding", v)) for a in LR for v in variants]
    assert point_label(points[1]) == "train.lr=0.003,model.encoding=rope+forget:init_bias=4"
    mcfg, tcfg = job_configs(p, points[1], "rope+forget", 0, 10, "flipflop")
    assert (mcfg.encoding, tcfg.lr, tcfg.corpus) == ("rope+forget:init_bias=4", 3e-3, "flipflop")
    gate = mcfg.layer_schemes()[0].parts[1].gate  # the variant's gate starts at its bias
    assert torch.equal(gate.bias, torch.full_like(gate.bias, 4.0))
    assert job_configs(p, points[0], "rope+forget", 0, 10)[0].encoding == "rope+forget"
    assert job_configs(p, grid_points(p, "nope")[0], "nope", 0, 10)[0].encoding == "nope"
    assert job_encoding((("train.lr", 1e-3),), "alibi") == "alibi"


def test_the_sensitivity_table_has_a_column_per_shared_setting_and_a_row_per_own_value():
    def choice(scheme, own):
        points = [(("train.lr", a), *o) for a in LR for o in own]
        results = {point_label(p): 0.5 + 0.1 * k for k, p in enumerate(points)}
        return Choice("flipflop", scheme, points, results, dict.fromkeys(results), 0.4)

    chosen = [
        choice("rope", [()]),
        choice("path", [(("model.n_head", 4),), (("model.n_head", 2),)]),
        choice(
            "hybrid", [(("model.encoding", "hybrid"),), (("model.encoding", "acc-learned-qkv+forget:init_bias=4"),)]
        ),
        choice("forget", [(("model.encoding", "forget:init_bias=4"),)]),
    ]
    table = _table_after("\n".join(sweep_markdown(chosen, 0, None)), "### Sensitivity on flipflop")
    assert table[0] == "| scheme | train.lr=0.003 | train.lr=0.01 |"
    assert table[2:] == [
        "| rope | 50.0 | **60.0** |",
        "| path (model.n_head=4) | 50.0 | 70.0 |",
        "| path (model.n_head=2) | 60.0 | **80.0** |",
        "| hybrid | 50.0 | 70.0 |",
        "| hybrid as acc-learned-qkv+forget:init_bias=4 | 60.0 | **80.0** |",
        "| forget:init_bias=4 | 50.0 | **60.0** |",
    ]


def test_a_text_report_gives_each_scheme_the_quantities_of_the_variant_it_trained():
    """A registered quantity (``posenc.reports.claims.Quantity``) of a swept scheme is its chosen variant's."""
    from types import SimpleNamespace

    from posenc.jobs.job import text_meta
    from posenc.reports.claims import ClaimSet, Quantity, register_claims

    register_claims(ClaimSet("q", "Q", quantities=(Quantity("chars", "spec length", lambda m: len(m.encoding)),)))
    preset = load_preset(
        "default",
        {
            "schemes": ["rope", "acc-rand-qkv"],
            "sweep": {"grid": {"train.lr": LR}, "schemes": {"acc-rand-qkv": {"model.encoding": ["acc-rand-qkv:a=2"]}}},
        },
    )
    data = SimpleNamespace(vocab_size=256, train=[0] * 10, val_docs=[("hamlet", None)])
    values = text_meta(preset, data, {"acc-rand-qkv": "acc-rand-qkv:a=2"})["quantities"]
    assert values == {"chars": {"rope": 4, "acc-rand-qkv": len("acc-rand-qkv:a=2")}}  # schemes only
    assert text_meta(preset, data)["quantities"]["chars"]["acc-rand-qkv"] == len("acc-rand-qkv")


# ---------------------------------------------------------------- end to end


def _table_after(text: str, heading: str) -> list[str]:
    """The lines of the first markdown table after ``heading``."""
    lines = text.split(heading, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def _id_acc(root, scheme, seed):
    runs = [r for r in load(root / "results.jsonl") if isinstance(r, Task) and (r.scheme, r.seed) == (scheme, seed)]
    assert len({Scores(r.cells).acc("id", 16) for r in runs}) == 1  # a screening and its completion agree
    return Scores(runs[0].cells).acc("id", 16)[0]


@pytest.mark.slow
def test_a_task_sweep_chooses_on_seed_0_and_runs_the_other_seeds_there(tmp_path, capsys):
    preset = _preset(
        tmp_path,
        seeds=[0, 1],
        sweep={"grid": {"train.lr": LR}, "schemes": {"nope": {"train.steps": [2, 4]}}},
        train={
            "steps": 4,
            "batch_size": 4,
            "lr": 3e-3,
            "warmup": 1,
            "loss": "answers",
            "ckpt_every": 2,
            "threads": 1,
            "until": {"at_least": 0.99, "every": 2, "answers": 40},
        },
    )
    report, failures = compare(preset, tmp_path / "runs", isolate=False)
    assert not failures
    root = tmp_path / "runs" / "tiny"
    expected, shown = {}, {}
    for scheme in preset.schemes:
        grid = grid_points(preset, scheme)
        accs = {point_label(p): _id_acc(point_root(root, p), scheme, 0) for p in grid}
        best = max(accs.values())
        expected[scheme] = next(p for p in grid if accs[point_label(p)] == best) if best >= 0.01 else None
        shown[scheme] = next(p for p in grid if accs[point_label(p)] == best)  # a scheme that learned nowhere: its best
        for p in grid:  # seed 1 trained at the chosen point only
            assert (point_root(root, p) / "flipflop" / scheme / "seed1").exists() == (p == expected[scheme])
        if expected[scheme] is not None:
            assert (
                read_json(point_root(root, expected[scheme]) / "flipflop" / scheme / "seed1" / "config.json")["train"][
                    "lr"
                ]
                == dict(expected[scheme])["train.lr"]
            )
    chosen = [s for s in preset.schemes if expected[s] is not None]
    assert chosen, "no scheme learned at the bar: the test's budget is too small"
    merged = load(root / "results.jsonl")
    assert sorted((r.scheme, r.seed) for r in merged) == sorted(
        (s, k) for s in preset.schemes for k in ((0, 1) if s in chosen else (0,))
    )
    for r in merged:  # the top-level records are the chosen point's (a scheme that learned nowhere: seed 0 at its best)
        *screened, full = [
            x
            for x in load(point_root(root, shown[r.scheme]) / "results.jsonl")
            if isinstance(x, Task) and (x.scheme, x.seed) == (r.scheme, r.seed)
        ]
        assert r.cells == full.cells and not r.screening and not full.screening and full.threads == 1
        # seed 0 was screened at the training length, then completed: the screened cells kept, every length scored
        assert [x.screening for x in screened] == ([True] if r.seed == 0 else [])
        assert {c.length for c in full.cells if c.test == "id"} == {16, 32}
        for x in screened:
            assert {(c.test, c.length) for c in x.cells} < {(c.test, c.length) for c in full.cells}
            assert all(c in full.cells for c in x.cells)
    for scheme in preset.schemes:  # an unchosen point was screened only: no evaluation beyond the training length
        for p in grid_points(preset, scheme):
            if p != shown[scheme]:
                (x,) = [x for x in load(point_root(root, p) / "results.jsonl") if x.scheme == scheme]
                assert x.screening and {(c.test, c.length) for c in x.cells} == {("id", 16)}  # what the chooser reads
                assert x.threads == 1  # the preset's, as every job's
    text = report.read_text()
    assert "## Sweep: each scheme at its best setting" in text and "### Sensitivity on flipflop" in text
    for s in preset.schemes:  # every axis here has two values: a chosen value is at an edge of it, and says so
        axes = {"train.lr": LR, "train.steps": [2, 4]}
        edge = {0: " (lowest of the grid)", 1: " (highest of the grid)"}
        setting = (
            ", ".join(f"{k}={v}{edge[axes[k].index(v)]}" for k, v in expected[s])
            if expected[s]
            else f"none chosen: did not learn at any grid point (reported at its best, {point_label(shown[s])})"
        )
        assert f"| flipflop | {s} | {setting} |" in text
    # the columns are the shared grid, a row each scheme at one value of its own keys
    table = _table_after(text, "### Sensitivity on flipflop")
    assert table[0] == "| scheme | train.lr=0.003 | train.lr=0.01 |"
    assert [row.split(" | ")[0] for row in table[2:]] == ["| rope", "| nope (train.steps=2)", "| nope (train.steps=4)"]
    assert sum(row.count("**") for row in table) == 2 * len(chosen)  # each chosen point in bold
    start, end = read_jsonl(root / "invocations.jsonl")  # the stamp, then its end
    assert start["invocation"] == end["invocation"] and start["started"] <= end["finished"]
    for point in root.glob("sweep/*"):  # each grid point's directory records the invocation too, closed
        assert [set(c) >= {"invocation"} for c in read_jsonl(point / "invocations.jsonl")] == [True, True]
    assert re.search(r"- wall time: \d+ (min|s) over 1 invocation \(", text)
    rows = (root / "sweep.csv").read_text().splitlines()
    assert rows[0] == "task,scheme,setting,result,steps_to_criterion,chosen" and len(rows) == 1 + 2 + 4
    assert sum(line.endswith(",1") for line in rows[1:]) == len(chosen) and (root / "sweep.png").exists()
    n = {p: len(read_jsonl(p / "results.jsonl")) for p in root.glob("sweep/*")}
    capsys.readouterr()
    compare(preset, tmp_path / "runs", isolate=False)  # a rerun: nothing new, the same choice
    n_jobs = 2 + 4 + len(chosen)  # every grid point on seed 0, then seed 1 at each chosen point
    assert f"posenc: all {n_jobs} jobs already done" in capsys.readouterr().err
    assert {p: len(read_jsonl(p / "results.jsonl")) for p in root.glob("sweep/*")} == n
    again = report.read_text()
    assert re.search(r"- wall time: \d+ (min|s) over 2 invocations \(", again)  # the rerun counts too
    assert (
        again.splitlines()[:5] == text.splitlines()[:5]
        and again.split("wall time")[1].split("\n", 1)[1] == (text.split("wall time")[1].split("\n", 1)[1])
    )  # the rest of the report unchanged


@pytest.mark.slow
def test_a_text_sweep_chooses_by_validation_perplexity_at_the_training_length(tiny_corpus, tmp_path):
    preset = load_preset(
        "quick",
        {
            "name": "textsweep",
            "schemes": ["rope"],
            "seeds": [0],
            "model": {"n_layer": 1, "n_head": 2, "d_model": 16, "train_length": 16},
            "train": {"corpus": str(tiny_corpus), "steps": 4, "batch_size": 2, "ckpt_every": 2, "threads": 1},
            "eval": {"multiples": [1, 2], "max_tokens": 64, "passkey": {"trials": 0}, "far_mass": {"windows": 0}},
            "eval_schedules": [{"schedule": "yarn", "factor": 2}],
            "sweep": {"grid": {"train.lr": [1e-4, 1e-2]}},
        },
    )
    report, failures = compare(preset, tmp_path / "runs", isolate=False)
    root = tmp_path / "runs" / "textsweep"
    ppl = {
        p: next(
            r.ppl
            for r in load(point_root(root, p) / "results.jsonl")
            if isinstance(r, Ppl) and r.eval_length == 16 and r.scheme == "rope"
        )
        for p in grid_points(preset, "rope")
    }
    best = min(ppl, key=ppl.get)
    merged = load(root / "results.jsonl")
    assert not failures and sorted((r.scheme, r.eval_length) for r in merged) == [
        ("rope", 16),
        ("rope", 32),
        ("rope+yarn(s=2)", 16),
        ("rope+yarn(s=2)", 32),
    ]
    assert merged == [
        r for r in load(point_root(root, best) / "results.jsonl")
    ]  # the chosen point's rows, schedule rows too
    assert [r.ppl for r in merged if (r.scheme, r.eval_length) == ("rope", 16)] == [ppl[best]]
    edge = {1e-4: "lowest", 1e-2: "highest"}[dict(best)["train.lr"]]  # a two-value axis: either edge, said
    assert f"| text | rope | {point_label(best)} ({edge} of the grid) | {ppl[best]:.2f} |" in report.read_text()
    (other,) = [p for p in grid_points(preset, "rope") if p != best]  # screened: the training length only
    assert [(r.scheme, r.eval_length) for r in load(point_root(root, other) / "results.jsonl")] == [("rope", 16)]


# ---------------------------------------------------------------- a run of another budget is refused


@pytest.mark.slow
def test_a_run_trained_with_another_budget_is_refused_with_its_fields(tmp_path, capsys):
    short = _preset(
        tmp_path,
        name="short",
        schemes=["rope"],
        train={"steps": 2, "batch_size": 4, "lr": 1e-2, "warmup": 1, "loss": "answers"},
    )
    compare(short, tmp_path / "runs", isolate=False)
    full = _preset(tmp_path, name="full", schemes=["rope"])
    dest = tmp_path / "runs" / "full" / "flipflop" / "rope" / "seed0"
    shutil.copytree(
        tmp_path / "runs" / "short" / "flipflop" / "rope" / "seed0", dest
    )  # "a run directory of it can be copied in"
    with pytest.raises(
        PosencError,
        match=r"seed0 was not trained with the settings of full's job flipflop rope \(seed 0\) "
        r"\(training lr 0.01 -> 0.003; trained steps 2 -> 4\)",
    ):
        compare(full, tmp_path / "runs", isolate=False)
    assert not (tmp_path / "runs" / "full" / "results.jsonl").exists() or not read_jsonl(
        tmp_path / "runs" / "full" / "results.jsonl"
    )
    capsys.readouterr()
    assert (
        main(["compare", "--preset", str(tmp_path / "full.yaml"), "--out", str(tmp_path / "runs"), "--no-isolate"]) == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "trained steps 2 -> 4" in err and "training lr 0.01 -> 0.003" in err
    shutil.rmtree(dest)  # moved away: the job trains it itself
    report, failures = compare(full, tmp_path / "runs", isolate=False)
    assert not failures and read_json(dest / "train_summary.json")["steps"] == 4


def test_until_on_a_text_preset_is_refused_at_load():
    with pytest.raises(PosencError, match="train.until needs synthetic tasks"):
        load_preset("quick", {"train": {"until": {"at_least": 0.9, "every": 10}}})


def test_the_window_preset_no_longer_invites_copying_the_default_run():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "experiments" / "accumulated" / "presets" / "window.yaml").read_text()
    assert "can be copied in" not in text and "same model, seed and budget" not in text


@pytest.mark.slow
def test_a_sweep_killed_before_its_other_seeds_resumes_them_only(tmp_path):
    from posenc.store.records import write

    preset = _preset(tmp_path, schemes=["rope"], seeds=[0, 1], sweep={"grid": {"train.lr": LR}})
    compare(preset, tmp_path / "runs", isolate=False)
    root = tmp_path / "runs" / "tiny"
    (seed1,) = root.glob("sweep/*/flipflop/rope/seed1")
    point = seed1.parents[2]
    write(point / "results.jsonl", [r for r in load(point / "results.jsonl") if r.seed != 1])  # as if killed in stage 2
    shutil.rmtree(seed1)
    stamps = {p: p.stat().st_mtime_ns for p in root.glob("sweep/*/flipflop/rope/seed0/train_summary.json")}
    report, failures = compare(preset, tmp_path / "runs", isolate=False)
    assert not failures and (seed1 / "train_summary.json").exists()
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps  # the grid points were not retrained
    assert sorted(r.seed for r in load(root / "results.jsonl")) == [0, 1]


def test_a_report_header_says_swept_for_a_setting_the_sweep_varies():
    preset = load_preset("retrieval")  # grid train.lr; path and path+forget also model.n_head
    assert (setting(preset, "train.lr"), setting(preset, "model.n_head"), setting(preset, "train.steps")) == (
        "swept",
        "swept",
        600,
    )
    meta = task_meta(preset)
    assert "lr swept" in meta["budget"] and meta["budget"].startswith("600 steps") and "swept heads" in meta["model"]
    plain = load_preset("retrieval", {"sweep": None})
    assert setting(plain, "train.lr") == plain.train.lr == 2e-3 and "lr 0.002" in task_meta(plain)["budget"]
    point = task_meta(at_point(preset, (("train.lr", 1e-3), ("model.n_head", 2))))  # one grid point: its own values
    assert "2 heads" in point["model"] and "lr 0.001" in point["budget"]
    # --schemes leaving out path and path+forget, the only schemes with a head grid: the heads are not swept
    some = load_preset("retrieval", {"schemes": ["rope", "alibi"]})
    assert setting(some, "model.n_head") == some.model.n_head == 4 and "4 heads" in task_meta(some)["model"]
    assert setting(some, "train.lr") == "swept"


def test_a_task_report_header_gives_the_precision_the_jobs_train_at():
    """The header's compute dtype is the preset's train.precision as this machine resolves it, never what auto
    would pick here (a fp32 protocol re-rendered on a CPU with bf16 units said "bfloat16 autocast")."""
    assert task_meta(load_preset("retrieval"))["stamp"]["dtype"] == "float32 weights, float32 compute"
    bf16 = load_preset("retrieval", {"train.precision": "bf16"})
    assert task_meta(bf16)["stamp"]["dtype"] == "float32 weights, bfloat16 autocast"


@pytest.mark.slow
def test_a_variant_sweep_end_to_end_records_the_chosen_variant_under_the_scheme(tmp_path):
    variants = ["forget", "forget:init_bias=4"]
    preset = _preset(tmp_path, schemes=["forget"], sweep={"schemes": {"forget": {"model.encoding": variants}}})
    report, failures = compare(preset, tmp_path / "runs", isolate=False)
    assert not failures
    root = tmp_path / "runs" / "tiny"
    for v in variants:
        job = point_root(root, (("model.encoding", v),)) / "flipflop" / "forget" / "seed0"
        assert read_json(job / "config.json")["model"]["encoding"] == v
    assert {(r.scheme, r.seed) for r in load(root / "results.jsonl")} == {("forget", 0)}
    text = report.read_text()
    assert "| scheme | its own grid |" in text  # a variant is a row, never a column
    assert re.search(r"\| forget \| \*?\*?\d", text) and re.search(r"\| forget:init_bias=4 \| \*?\*?\d", text)
    chosen = next(r for r in load(root / "results.jsonl") if isinstance(r, Task))
    shown = [line for line in (root / "sweep.csv").read_text().splitlines() if line.endswith(",1")]
    assert [line.split(",")[2] for line in shown] == [f"model.encoding={chosen.encoding}"]  # the record says which
