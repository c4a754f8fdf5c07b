"""train.until.extend_to: a run unmet at its step cap whose training loss is still falling there (the LOSS_FALLING rule
of posenc.train.curves, the task report's) trains on up to a stated larger cap at the schedule's final learning rate;
a flat one stops at the cap; the first ``steps`` steps are the unextended run's, and a resumed run is exact."""

import json

import pytest

from posenc.errors import PosencError
from posenc.eval.tasks import id_accuracy
from posenc.model import ModelConfig
from posenc.store.checkpoint import read_json, read_jsonl
from posenc.store.presets import validated
from posenc.train import loop as train_mod
from posenc.train.curves import loss_trend
from posenc.train.loop import train
from posenc.train.optimizer import lr_at
from posenc.train.rundir import check_trained_as
from posenc.train.settings import TrainConfig, UntilConfig

MCFG = ModelConfig(n_layer=1, n_head=2, d_model=16, train_length=16, encoding="rope", vocab_size=5)
NEVER = {"at_least": 1.0, "every": 4, "answers": 40}  # 100% of 40 answers: not met in 20 steps of this model


def tcfg(lr, extend_to=20, **over):
    until = {**NEVER, "extend_to": extend_to}
    base = dict(corpus="flipflop", steps=12, batch_size=4, warmup=1, loss="answers", ckpt_every=4, threads=1)
    return TrainConfig(**{**base, "lr": lr, "log_every": 1, "until": until, **over})


def _curve(run_dir, cap=None):
    return [(r["step"], r["loss"]) for r in read_jsonl(run_dir / "train.jsonl") if cap is None or r["step"] <= cap]


def test_a_falling_loss_trains_on_to_extend_to_at_the_final_rate(tmp_path):
    t = tcfg(1e-2)
    summary = train(tmp_path / "ext", MCFG, t)
    capped = train(tmp_path / "cap", MCFG, tcfg(1e-2, extend_to=None))
    trend = loss_trend(_curve(tmp_path / "ext", 12))
    assert trend.falling and trend.late < 0.95 * trend.before  # the loop's own losses, up to the cap
    assert summary["steps"] == 20 and summary["until"]["reached"] is None
    assert summary["until"]["extended"] == {"from": 12, "to": 20, "why": trend.falling_at(12)}
    assert summary["until"]["extended"]["why"].startswith("loss still falling at the step cap 12 (")
    assert read_json(tmp_path / "ext" / "train_summary.json") == summary
    # the first 12 steps are the unextended run's: same losses, same checks
    assert capped["steps"] == 12 and capped["until"]["extended"] is None
    assert _curve(tmp_path / "ext", 12) == _curve(tmp_path / "cap")
    checks = read_jsonl(tmp_path / "ext" / "until.jsonl")
    assert [c["step"] for c in checks] == [4, 8, 12, 16, 20] and checks[:3] == read_jsonl(
        tmp_path / "cap" / "until.jsonl"
    )
    assert all(c["value"] < 1.0 for c in checks)
    # the extra steps at the schedule's final rate, min_lr_ratio x lr (lr_at past the cap), logged as trained
    logged = {r["step"]: r["lr"] for r in read_jsonl(tmp_path / "ext" / "train.jsonl")}
    assert [logged[s] for s in range(13, 21)] == [pytest.approx(1e-3, rel=1e-12)] * 8
    assert lr_at(19, t) == lr_at(12, t) == pytest.approx(t.min_lr_ratio * t.lr, rel=1e-12)  # where the cosine ends
    assert logged[6] > logged[12] == lr_at(11, t) > logged[13]  # the cosine to the cap is the unextended one's
    assert len(logged) == 20 and _curve(tmp_path / "ext")[12:] != _curve(tmp_path / "ext", 12)[-8:]
    # the sweep's check accepts a run trained past its cap by its extension
    check_trained_as(tmp_path / "ext", MCFG, t, "a test")
    # finished: a resume keeps it as it is
    assert train(tmp_path / "ext", MCFG, t, resume=True) == summary


def test_a_flat_loss_stops_at_the_cap(tmp_path):
    summary = train(tmp_path / "flat", MCFG, tcfg(1e-6))
    trend = loss_trend(_curve(tmp_path / "flat"))
    assert not trend.falling and trend.late >= 0.95 * trend.before  # the loop's own losses
    assert summary["steps"] == 12 and summary["until"]["extended"] is None and summary["until"]["reached"] is None
    assert [c["step"] for c in read_jsonl(tmp_path / "flat" / "until.jsonl")] == [4, 8, 12]


def test_a_run_that_meets_its_criterion_under_the_cap_is_not_extended(tmp_path, monkeypatch):
    monkeypatch.setattr(train_mod, "id_accuracy", lambda *a, **k: 1.0)  # met at the first check
    summary = train(tmp_path / "met", MCFG, tcfg(1e-2))
    assert summary["steps"] == 4 and summary["until"]["reached"] == 4 and summary["until"]["extended"] is None


def test_the_decision_follows_the_loss_not_a_second_formula(tmp_path, monkeypatch):
    """The same real run, its falling curve read as flat by the one rule (posenc.train.curves): no extension."""
    monkeypatch.setattr(train_mod, "loss_trend", lambda curve: loss_trend([(s, 1.0) for s, _ in curve]))
    assert train(tmp_path / "r", MCFG, tcfg(1e-2))["steps"] == 12


@pytest.mark.parametrize("cut", [4, 5])  # Ctrl-C in the redone check at the cap (step 12), in the check at step 16
def test_a_run_interrupted_in_its_extension_resumes_exactly(tmp_path, monkeypatch, cut):
    whole = train(tmp_path / "whole", MCFG, tcfg(1e-2))
    calls = []

    def interrupted(*args, **kwargs):  # checks: 4, 8, 12, 12 (redone as the extension starts), 16, 20
        calls.append(1)
        if len(calls) == cut:
            raise KeyboardInterrupt
        return id_accuracy(*args, **kwargs)

    monkeypatch.setattr(train_mod, "id_accuracy", interrupted)
    with pytest.raises(KeyboardInterrupt, match=f"step {(12, 16)[cut - 4]} of 20"):
        train(tmp_path / "cut", MCFG, tcfg(1e-2))
    monkeypatch.setattr(train_mod, "id_accuracy", id_accuracy)
    resumed = train(tmp_path / "cut", MCFG, tcfg(1e-2), resume=True)
    assert _curve(tmp_path / "cut") == _curve(tmp_path / "whole")
    assert read_jsonl(tmp_path / "cut" / "until.jsonl") == read_jsonl(tmp_path / "whole" / "until.jsonl")
    same = ("steps", "until", "params")
    assert {k: resumed[k] for k in same} == {k: whole[k] for k in same} and resumed["final_loss"] == whole["final_loss"]


def test_extend_to_must_pass_the_cap_and_old_runs_still_match(tmp_path):
    with pytest.raises(PosencError, match=r"until.extend_to \(12\) must exceed steps \(12\)"):
        validated(TrainConfig, {"corpus": "flipflop", "steps": 12, "until": {**NEVER, "extend_to": 12}}, "training")
    with pytest.raises(PosencError, match="extend_to"):
        validated(TrainConfig, {"corpus": "flipflop", "until": {**NEVER, "extend_to": 0}}, "training")
    assert UntilConfig(**NEVER).extend_to is None
    assert "trained on up to step 1200 at the final learning rate" in UntilConfig(**NEVER, extend_to=1200).describe()
    assert UntilConfig(**NEVER).describe() == "id_accuracy >= 1, checked every 4 steps on 40 held-out answers"
    # a run recorded before the field (its until without extend_to) is the same run as extend_to null
    t = tcfg(1e-6, extend_to=None)
    train(tmp_path / "old", MCFG, t)
    config = read_json(tmp_path / "old" / "config.json")
    del config["train"]["until"]["extend_to"]
    (tmp_path / "old" / "config.json").write_text(json.dumps(config))
    check_trained_as(tmp_path / "old", MCFG, t, "a test")
    with pytest.raises(PosencError, match="until"):  # but one trained without the extension is not one with it
        check_trained_as(tmp_path / "old", MCFG, tcfg(1e-6), "a test")


def test_the_logged_window_is_the_mean_of_every_step_since_the_last_log(tmp_path):
    """loss_window at a logged step = the mean of the per-step losses an every-step log records over its window."""
    every = train(tmp_path / "every", MCFG, tcfg(1e-2, extend_to=None))
    fourth = train(tmp_path / "fourth", MCFG, tcfg(1e-2, extend_to=None, log_every=4))
    assert every["steps"] == fourth["steps"] == 12
    per_step = {r["step"]: r["loss"] for r in read_jsonl(tmp_path / "every" / "train.jsonl")}
    rows = read_jsonl(tmp_path / "fourth" / "train.jsonl")
    assert [r["step"] for r in rows] == [4, 8, 12]
    for r in rows:
        want = sum(per_step[s] for s in range(r["step"] - 3, r["step"] + 1)) / 4
        assert r["loss_window"] == pytest.approx(want, rel=1e-12) and r["loss"] == per_step[r["step"]]
    assert all(r["loss_window"] == r["loss"] for r in read_jsonl(tmp_path / "every" / "train.jsonl"))


def test_the_rule_reads_the_window_not_one_batch():
    """One batch's loss at chance but for two batches that held a short row, both in the last eighth: read alone it
    'falls'; the window means (flat) do not. Rows logged before loss_window keep their loss."""
    from posenc.train.curves import loss_curve

    rows = [{"step": 20 * i, "loss": 0.3 if i in (30, 32) else 0.69, "loss_window": 0.6} for i in range(1, 33)]
    assert loss_trend([(r["step"], r["loss"]) for r in rows]).falling
    assert not loss_trend(loss_curve(rows)).falling
    assert loss_curve([{"step": 1, "loss": 0.5}]) == [(1, 0.5)]
