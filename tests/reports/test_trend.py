"""The trend report (a preset's trend axis, `posenc report --trend KEY`): means with 95% t-intervals per scheme and
rung, rungs ordered by the setting, each claim on each rung; bad input one line."""

import csv
import math
from pathlib import Path

import pytest

from posenc.errors import PosencError
from posenc.reports.runs import Run
from posenc.reports.trend import markdown, mean_interval, multiples, ordered, points, training_tokens
from posenc.store.records import Ppl


def run(steps: int, ratios: dict[str, list[float]], label: str | None = None) -> Run:
    """A text run at ``steps`` whose scheme s has ratio ratios[s][seed] at 16x and 1 + 2 (ratio - 1) at 128x."""
    recs = []
    for scheme, per_seed in ratios.items():
        for seed, r in enumerate(per_seed):
            for m, ratio in ((1, 1.0), (16, r), (128, 1 + 2 * (r - 1))):
                recs.append(Ppl(scheme=scheme, seed=seed, train_length=128, eval_length=128 * m, ppl=8 * ratio))
    for r in recs:
        r.ratio = r.ppl / 8
    settings = {"train.steps": steps, "train.batch_size": 16}
    return Run(Path(f"runs/s{steps}"), label or f"s{steps}", recs, 128, settings, "preset.json", {})


def test_the_interval_is_the_t_interval_over_seeds():
    p = mean_interval([1.0, 2.0, 3.0])  # s = 1, t_{0.975, 2} = 4.303
    assert p.mean == 2.0 and p.n == 3
    assert p.hi - p.mean == pytest.approx(4.302653 / math.sqrt(3), rel=1e-5)
    assert p.lo == pytest.approx(2 * p.mean - p.hi)
    one = mean_interval([1.5])
    assert (one.lo, one.hi, one.cell()) == (None, None, "1.500 (1 seed)")
    with pytest.raises(ValueError):
        mean_interval([])


def test_rungs_are_ordered_by_the_setting_with_their_tokens_and_each_schemes_points():
    big, small = run(800, {"rope": [1.2, 1.4]}), run(200, {"rope": [1.1, 1.3, 1.2], "alibi": [1.0, 1.0, 1.0]})
    runs = ordered([big, small], "train.steps")
    assert [r.label for r in runs] == ["s200", "s800"]
    assert [training_tokens(r) for r in runs] == [200 * 16 * 128, 800 * 16 * 128]
    assert multiples(runs) == [16, 128]
    pts = points(runs)
    assert pts["rope"][16][0].mean == pytest.approx(1.2) and pts["rope"][16][1].mean == pytest.approx(1.3)
    assert pts["rope"][128][1].mean == pytest.approx(1.6)
    assert pts["alibi"][16][1] is None  # not run on that rung
    text = markdown(runs, "train.steps")
    row = next(line for line in text.splitlines() if line.startswith("| alibi |"))
    assert row == "| alibi | 1.000 [1.000, 1.000] | not run |"
    assert "train.steps=200 (409,600 tokens)" in text


def test_a_trend_needs_one_run_per_value_and_the_setting_recorded():
    with pytest.raises(PosencError, match="two runs have the same train.steps"):
        ordered([run(200, {"rope": [1.0]}, "a"), run(200, {"rope": [1.0]}, "b")], "train.steps")
    with pytest.raises(PosencError, match=r"^s200's preset.json has no setting model.d_model \(a dotted key"):
        ordered([run(200, {"rope": [1.0]})], "model.d_model")
    bare = run(200, {"rope": [1.0]})
    bare = Run(bare.path, bare.label, bare.records, 128, {}, "none", {})
    with pytest.raises(PosencError, match=r"^s200 does not record train.steps \(no preset.json with it\)"):
        ordered([bare], "train.steps")


def test_each_claim_is_checked_on_each_rung(accumulated_claims):
    schemes = {"rope": [1.30, 1.40, 1.35], "acc-rand-qk": [1.01, 1.02, 1.01], "acc-rand-qkv": [1.03, 1.04, 1.05]}
    text = markdown(
        ordered([run(200, schemes), run(800, {**schemes, "rope": [1.01, 1.02, 1.01]})], "train.steps"), "train.steps"
    )
    rows = [line for line in text.splitlines() if line.startswith("| (i) ")]
    assert len(rows) == 2  # (i) for acc-rand-qk and for acc-rand-qkv
    cells = rows[0].split(" | ")
    assert cells[1].startswith("**holds**") and not cells[2].startswith("**holds**")


@pytest.mark.slow
def test_a_preset_trend_runs_each_rung_as_a_comparison_and_reports_it(tiny_corpus, tmp_path):
    """Two rungs of train.steps (the second with its own seeds): each rung is the comparison `--set train.steps=N`
    makes (the same perplexities), the trend report lists both."""
    from posenc.config.plan import load_preset
    from posenc.jobs.compare import compare
    from posenc.jobs.trend import compare_trend

    settings = {
        "name": "t",
        "schemes": ["rope"],
        "seeds": [0, 1],
        "model": {"n_layer": 1, "n_head": 2, "d_model": 16, "train_length": 16},
        "train": {"corpus": str(tiny_corpus), "batch_size": 2, "ckpt_every": 3, "threads": 1},
        "eval": {"multiples": [1, 2], "max_tokens": 64, "passkey": {"trials": 0}, "far_mass": {"windows": 0}},
        "trend": {"key": "train.steps", "values": [2, 3], "seeds": {"3": [1]}},
    }
    report, failures = compare_trend(load_preset("quick", settings), tmp_path / "runs", isolate=False)
    assert failures == {} and report == tmp_path / "runs" / "t" / "trend.md"
    plain = load_preset("quick", {**settings, "trend": None, "name": "plain", "seeds": [1], "train.steps": 3})
    compare(plain, tmp_path / "runs", isolate=False)
    rows = {}
    for path in (tmp_path / "runs" / "t" / "train.steps-3", tmp_path / "runs" / "plain"):
        with open(path / "results.csv") as f:
            rows[path.name] = [(r["seed"], r["eval_length"], r["ppl"]) for r in csv.DictReader(f)]
    assert rows["train.steps-3"] == rows["plain"] and {r[0] for r in rows["plain"]} == {"1"}
    text = report.read_text()
    assert "| train.steps=2 | " in text and "| 0, 1 | 64 |" in text and "| train.steps=3 | " in text
    assert (tmp_path / "runs" / "t" / "trend.png").stat().st_size > 10_000
    # each rung takes its models from the same rung of the earlier trend; a rung it lacks is refused before any work
    rescored = load_preset("quick", {**settings, "name": "r", "eval": {**settings["eval"], "max_tokens": 48}})
    compare_trend(rescored, tmp_path / "runs", isolate=False, trained_from=tmp_path / "runs" / "t")
    for rung in ("train.steps-2", "train.steps-3"):
        for seed in {"train.steps-2": [0, 1], "train.steps-3": [1]}[rung]:
            run = f"{rung}/rope/seed{seed}"
            assert (tmp_path / "runs" / "r" / run / "model.safetensors").read_bytes() == (
                tmp_path / "runs" / "t" / run / "model.safetensors"
            ).read_bytes()
    longer = {**settings, "name": "l", "trend": {"key": "train.steps", "values": [2, 4]}}
    with pytest.raises(PosencError, match=r"--trained-from .*t/train.steps-4: no trained model where"):
        compare_trend(
            load_preset("quick", longer), tmp_path / "runs", isolate=False, trained_from=tmp_path / "runs" / "t"
        )
    assert not (tmp_path / "runs" / "l").exists()


def test_a_trend_on_a_synthetic_task_is_refused_before_any_rung_runs():
    from posenc.config.plan import load_preset

    with pytest.raises(PosencError, match="a trend compares text runs only, not synthetic tasks"):
        load_preset("quick", {"trend": {"key": "train.steps", "values": [2, 3]}, "tasks": ["flipflop"]})
    with pytest.raises(PosencError, match=r"eval.multiples \[1\] has no length above 1x"):
        load_preset("quick", {"trend": {"key": "train.steps", "values": [2, 3]}, "eval.multiples": [1]})


@pytest.mark.parametrize(
    ("trend", "message"),
    [
        ({"key": "train.lr", "values": [1e-3]}, "values"),
        ({"key": "eval.max_tokens", "values": [1, 2]}, "eval.max_tokens cannot be a trend"),
        ({"key": "train.steps", "values": [2, 2]}, "give each value once"),
        ({"key": "train.steps", "values": [2, 3], "seeds": {"4": [0]}}, "trend.seeds names '4', not a value"),
        ({"key": "model.d_model", "values": [16, 15]}, "at model.d_model = 15"),
    ],
)
def test_a_bad_trend_is_refused_in_one_line_before_any_work(trend, message):
    from posenc.config.plan import load_preset

    with pytest.raises(PosencError, match=message) as info:
        load_preset("quick", {"trend": trend})
    assert "\n" not in str(info.value)
