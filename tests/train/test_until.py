"""train.until: train to criterion on a task (the in-distribution accuracy on a fixed held-out set, checked
every k steps), steps the cap; resume-safe and deterministic; reported per scheme."""

import zlib

import pytest
import torch

from posenc.data.tasks import get_task
from posenc.errors import PosencError
from posenc.eval.tasks import CRITERION_SEED, EVAL_SEED, id_accuracy
from posenc.model import LM, ModelConfig
from posenc.reports.tasks import TaskTable, criterion_markdown
from posenc.store.checkpoint import read_json, read_jsonl
from posenc.store.records import Task, TaskCell
from posenc.train import loop as train_mod
from posenc.train.loop import Criterion, fit, train
from posenc.train.optimizer import make_optimizer
from posenc.train.resume import Checkpoint
from posenc.train.rundir import load_run
from posenc.train.settings import TrainConfig, UntilConfig

MCFG = ModelConfig(n_layer=1, n_head=2, d_model=16, train_length=16, encoding="rope", vocab_size=5)


def tcfg(**over):
    base = {
        "corpus": "flipflop",
        "steps": 8,
        "batch_size": 4,
        "lr": 3e-3,
        "warmup": 1,
        "loss": "answers",
        "ckpt_every": 4,
        "threads": 1,
    }
    return TrainConfig(**{**base, **over})


def _fit(tmp_path, measure, every=2, at_least=0.5, steps=10):
    tmp_path.mkdir(exist_ok=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    cfg = TrainConfig(steps=steps, warmup=1, ckpt_every=100)
    ckpt = Checkpoint(tmp_path, model.state_dict, make_optimizer(model, cfg))

    def loss_at(step):
        return model(torch.ones(1, 2)).pow(2).mean(), 1

    return fit(model, cfg, loss_at, ckpt, criterion=Criterion(every, at_least, measure))


def test_fit_stops_at_the_first_check_that_meets_the_criterion(tmp_path):
    seen = []
    done = _fit(tmp_path, lambda step: seen.append(step) or step / 10)
    assert seen == [2, 4, 6] and done["steps"] == 6 and done["criterion_step"] == 6
    assert read_jsonl(tmp_path / "until.jsonl") == [
        {"step": 2, "value": 0.2},
        {"step": 4, "value": 0.4},
        {"step": 6, "value": 0.6},
    ]


def test_fit_checks_at_the_cap_and_says_when_never_met(tmp_path):
    seen = []
    done = _fit(tmp_path / "a", lambda step: seen.append(step) or 0.0, every=5, steps=10)
    assert seen == [5, 10] and done["steps"] == 10 and done["criterion_step"] is None
    done = _fit(tmp_path / "b", lambda step: float(step == 10), every=5, steps=10)
    assert done["criterion_step"] == 10  # met at the cap's own check


def test_train_until_stops_early_and_records_steps_to_criterion(tmp_path):
    probe = train(tmp_path / "probe", MCFG, tcfg(steps=12, until={"at_least": 1.0, "every": 3, "answers": 50}))
    checks = read_jsonl(tmp_path / "probe" / "until.jsonl")
    best = max(c["value"] for c in checks)
    assert probe["until"]["reached"] is None and best > 0 and [c["step"] for c in checks] == [3, 6, 9, 12]
    first = next(c["step"] for c in checks if c["value"] >= best)
    t = tcfg(steps=12, until={"at_least": best, "every": 3, "answers": 50})
    summary = train(tmp_path / "r", MCFG, t)
    assert summary["steps"] == first and summary["until"] == {
        "metric": "id_accuracy",
        "at_least": best,
        "every": 3,
        "answers": 50,
        "extend_to": None,
        "reached": first,
        "extended": None,
    }
    assert read_json(tmp_path / "r" / "train_summary.json") == summary
    assert read_jsonl(tmp_path / "r" / "until.jsonl") == [c for c in checks if c["step"] <= first]
    model = load_run(tmp_path / "r")[0]  # the checkpoint holds the weights that met it
    assert id_accuracy(model, get_task("flipflop"), 16, 50) == best
    # a resumed run that met its criterion stays stopped, even under a larger cap
    again = train(tmp_path / "r", MCFG, t.model_copy(update={"steps": 80}), resume=True)
    assert again == summary and read_jsonl(tmp_path / "r" / "until.jsonl") == [c for c in checks if c["step"] <= first]


def test_the_checks_do_not_change_training_and_a_resume_repeats_them(tmp_path, monkeypatch):
    never = {"at_least": 1.0, "every": 2, "answers": 40}
    plain = train(tmp_path / "plain", MCFG, tcfg())
    full = train(tmp_path / "full", MCFG, tcfg(until=never))
    losses = [r["loss"] for r in read_jsonl(tmp_path / "plain" / "train.jsonl")]
    assert [r["loss"] for r in read_jsonl(tmp_path / "full" / "train.jsonl")] == losses
    assert full["final_loss"] == plain["final_loss"]
    checks = read_jsonl(tmp_path / "full" / "until.jsonl")
    assert [c["step"] for c in checks] == [2, 4, 6, 8]
    if full["until"]["reached"] is not None:  # accuracy 1.0 that early: the checks still must agree below
        checks = checks[: [c["step"] for c in checks].index(full["until"]["reached"]) + 1]

    calls = []

    def interrupted(*args, **kwargs):  # Ctrl-C during the check at step 4 (after its checkpoint)
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return id_accuracy(*args, **kwargs)

    monkeypatch.setattr(train_mod, "id_accuracy", interrupted)
    with pytest.raises(KeyboardInterrupt, match="step 4"):
        train(tmp_path / "cut", MCFG, tcfg(until=never))
    monkeypatch.setattr(train_mod, "id_accuracy", id_accuracy)
    resumed = train(tmp_path / "cut", MCFG, tcfg(until=never), resume=True)
    assert read_jsonl(tmp_path / "cut" / "until.jsonl") == checks
    assert [r["loss"] for r in read_jsonl(tmp_path / "cut" / "train.jsonl")] == losses[
        : len(read_jsonl(tmp_path / "cut" / "train.jsonl"))
    ]
    assert resumed["until"] == full["until"] and resumed["steps"] == full["steps"]


def test_the_held_out_set_is_its_own():
    task = get_task("flipflop")
    crc = zlib.crc32(b"id:16")
    held_out = task.batch(CRITERION_SEED + crc, 0, range(4), 16).inputs
    assert not torch.equal(held_out, task.batch(EVAL_SEED + crc, 0, range(4), 16).inputs)  # not the report's id test
    assert not torch.equal(held_out, task.batch(0, 0, range(4), 16).inputs)  # nor a training batch of seed 0


def test_id_accuracy_against_a_naive_count():
    task = get_task("flipflop")
    torch.manual_seed(1)
    model = LM(MCFG)
    correct = total = 0
    seed, step = CRITERION_SEED + zlib.crc32(b"id:16"), 0
    while total < 30:
        b = task.batch(seed, step, range(16384 // 16), 16)
        with torch.no_grad():
            pred = model(b.inputs).argmax(-1)
        correct += int((pred == b.targets)[b.answer].sum())
        total += int(b.answer.sum())
        step += 1
    assert id_accuracy(model, task, 16, 30) == pytest.approx(correct / total, abs=1e-12)
    assert model.training  # put back


def test_until_is_refused_on_text_and_validated(tiny_corpus, tmp_path):
    with pytest.raises(PosencError, match="train.until needs a synthetic task corpus"):
        train(tmp_path / "t", MCFG, TrainConfig(corpus=str(tiny_corpus), steps=2, until={"at_least": 0.9, "every": 1}))
    with pytest.raises(ValueError):
        UntilConfig(at_least=1.5, every=1)


def _record(seed, step, trained):
    return Task(
        task="flipflop",
        scheme="rope",
        seed=seed,
        train_length=16,
        train_seconds=1.0,
        eval_seconds=1.0,
        threads=1,
        cells=[TaskCell(test="id", length=16, bucket=2, n=10, correct=10, nll=0.1)],
        trained_steps=trained,
        criterion="id_accuracy >= 0.99, checked every 50 steps on 1000 held-out answers",
        criterion_step=step,
    )


def test_the_report_gives_steps_to_criterion_per_scheme():
    t = TaskTable([_record(0, 150, 150), _record(1, None, 600), _record(2, 250, 250)], "flipflop", 16, 0.05, 0.9)
    text = criterion_markdown(t, ["rope"])
    assert "| rope | 150 / not reached (600 steps) / 250 | 200 | 2 of 3 |" in text
    assert "Criterion: id_accuracy >= 0.99, checked every 50 steps" in text


def test_posenc_train_says_the_run_met_its_criterion(tmp_path, monkeypatch, capsys):
    import yaml

    from posenc.cli.main import main

    preset = tmp_path / "p.yaml"
    preset.write_text(
        yaml.safe_dump(
            {
                "name": "p",
                "model": {"n_layer": 1, "n_head": 2, "d_model": 16, "train_length": 16},
                "train": {
                    "corpus": "flipflop",
                    "steps": 20,
                    "batch_size": 4,
                    "warmup": 1,
                    "loss": "answers",
                    "until": {"at_least": 0.5, "every": 4, "answers": 20},
                },
                "schemes": ["rope"],
            }
        )
    )
    monkeypatch.setattr(train_mod, "id_accuracy", lambda *args, **kwargs: 0.75)  # met at the first check
    out = tmp_path / "run"
    assert main(["train", "--scheme", "rope", "--preset", str(preset), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "step 4 of 20" in said and "met train.until: id_accuracy >= 0.5" in said and "time budget" not in said
    assert main(["train", "--scheme", "rope", "--preset", str(preset), "--out", str(out), "--resume"]) == 0
    assert "already trained (step 4 of 20)" in capsys.readouterr().out
