"""Experiment tracking (posenc.train.tracking): TensorBoard event files and W&B offline runs read back with their own
readers; the terminal habits of training (no progress bar in a log file, Ctrl-C names the resume command)."""

import json

import pytest

from posenc.cli import main as cli
from posenc.cli.main import main
from posenc.config.plan import load_preset
from posenc.errors import PosencError
from posenc.jobs.compare import compare
from posenc.train import tracking

PRESET = """name: tiny
model: {n_layer: 1, n_head: 2, d_model: 16, train_length: 16}
train: {steps: 4, batch_size: 2, lr: 3.0e-3, warmup: 1, ckpt_every: 2, log_every: 1, threads: 1, corpus: CORPUS}
schemes: [rope]
"""


@pytest.fixture
def preset_file(tmp_path, tiny_corpus):
    path = tmp_path / "tiny.yaml"
    path.write_text(PRESET.replace("CORPUS", str(tiny_corpus)))
    return str(path)


def sweep_preset(corpus, steps=4):
    return load_preset(
        "quick",
        {
            "name": "sweep",
            "schemes": ["rope"],
            "model": {"n_layer": 1, "n_head": 2, "d_model": 16, "train_length": 16},
            "train": {
                "corpus": str(corpus),
                "steps": steps,
                "batch_size": 2,
                "ckpt_every": 2,
                "log_every": 1,
                "threads": 1,
            },
            "eval": {
                "multiples": [1, 2],
                "max_tokens": 64,
                "passkey": {"lengths_multiples": [8], "depths": [0.5], "trials": 1},
                "far_mass": {"windows": 0},
            },
        },
    )


def events(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return acc


def hparams(acc) -> dict:
    from tensorboard.plugins.hparams import plugin_data_pb2

    data = plugin_data_pb2.HParamsPluginData.FromString(
        acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    )
    return {k: v.string_value or v.number_value or v.bool_value for k, v in data.session_start_info.hparams.items()}


def test_tensorboard_gets_every_logged_step_and_the_config(preset_file, tmp_path, capsys):
    pytest.importorskip("tensorboard")
    out = tmp_path / "run"
    assert main(["train", "--scheme", "rope", "--preset", preset_file, "--out", str(out), "--log", "tensorboard"]) == 0
    acc = events(out)
    logged = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    for key in ("loss", "lr", "grad_norm", "tokens_per_s"):
        got = acc.Scalars(f"train/{key}")
        assert [e.step for e in got] == [1, 2, 3, 4]
        assert [e.value for e in got] == pytest.approx([r[key] for r in logged], rel=1e-6)  # float32 in the events
    params = hparams(acc)
    assert params["scheme"] == "rope" and params["train.steps"] == 4 and params["stamp.torch"]
    assert "\r" not in capsys.readouterr().err  # not a terminal: no progress bar


def test_compare_logs_training_and_each_evaluation_under_the_job(tiny_corpus, tmp_path):
    pytest.importorskip("tensorboard")
    compare(sweep_preset(tiny_corpus), tmp_path / "runs", isolate=False, log="tensorboard")
    run = tmp_path / "runs" / "sweep"
    acc = events(run / "rope" / "seed0")
    results = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    ppl = {r["eval_length"]: r["ppl"] for r in results if r["kind"] == "ppl"}
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2, 3, 4]
    for L, x in ((16, "1x"), (32, "2x")):
        (e,) = acc.Scalars(f"eval/ppl@{x}")
        assert e.step == 4 and e.value == pytest.approx(ppl[L], rel=1e-6)
    assert acc.Scalars("eval/ratio@2x")[0].value == pytest.approx(ppl[32] / ppl[16], rel=1e-6)
    (pk,) = [r for r in results if r["kind"] == "passkey"]
    assert acc.Scalars("eval/passkey@8x")[0].value == pk["correct"] / pk["trials"]
    params = hparams(acc)
    assert params["name"] == "sweep" and params["seed"] == 0 and params["model.encoding"] == "rope"


def test_a_resumed_run_drops_what_the_interrupted_one_logged_past_its_checkpoint(tmp_path):
    pytest.importorskip("tensorboard")
    cfg = {"scheme": "rope"}
    with tracking.open_tracker("tensorboard", tmp_path, "r", "g", cfg) as t:
        t.start(0)
        for step in (1, 2, 3):  # checkpointed at 2, killed after logging 3
            t.log({"train/loss": 1.0 / step, "train/skipped": None}, step)
    with tracking.open_tracker("tensorboard", tmp_path, "r", "g", cfg) as t:
        t.start(2)
        t.log({"train/loss": 0.25}, 3)
    assert [(e.step, e.value) for e in events(tmp_path).Scalars("train/loss")] == [(1, 1.0), (2, 0.5), (3, 0.25)]
    assert "train/skipped" not in events(tmp_path).Tags()["scalars"]


def test_wandb_offline_run_has_the_metrics_config_and_name(tiny_corpus, tmp_path, monkeypatch, wandb_records):
    pytest.importorskip("wandb")
    for var, value in {
        "WANDB_MODE": "offline",
        "WANDB_CONFIG_DIR": tmp_path / "cfg",
        "WANDB_CACHE_DIR": tmp_path / "cache",
        "WANDB_DATA_DIR": tmp_path / "data",
    }.items():
        monkeypatch.setenv(var, str(value))
    compare(sweep_preset(tiny_corpus), tmp_path / "runs", isolate=False, log="wandb")
    recs = wandb_records(tmp_path / "runs" / "sweep" / "rope" / "seed0")
    (run,) = [r.run for r in recs if r.WhichOneof("record_type") == "run"]
    assert (run.display_name, run.run_group, run.project) == ("sweep/rope/seed0", "sweep", "posenc")
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert config["scheme"] == "rope" and config["train"]["steps"] == 4 and config["stamp"]["torch"]
    history = [
        {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}  # W&B splits "a/b" keys
        for r in recs
        if r.WhichOneof("record_type") == "history"
    ]
    assert [h["_step"] for h in history if "train/loss" in h] == [1, 2, 3, 4]
    assert all({"train/lr", "train/grad_norm", "train/tokens_per_s"} <= set(h) for h in history if "train/loss" in h)
    results = [json.loads(line) for line in (tmp_path / "runs" / "sweep" / "results.jsonl").read_text().splitlines()]
    final = next(h for h in history if "eval/ppl@1x" in h)
    assert final["_step"] == 4 and final["eval/ppl@2x"] == pytest.approx(
        next(r["ppl"] for r in results if r.get("eval_length") == 32)
    )


def test_a_missing_tracker_package_is_one_line(monkeypatch):
    import importlib

    real = importlib.import_module
    monkeypatch.setattr(
        importlib,
        "import_module",
        lambda name: (_ for _ in ()).throw(ImportError(name)) if name == "wandb" else real(name),
    )
    with pytest.raises(PosencError, match=r"^--log wandb needs wandb: pip install 'posenc\[wandb\]'$"):
        tracking.check_kind("wandb")
    with pytest.raises(PosencError, match="unknown --log 'mlflow'"):
        tracking.open_tracker("mlflow", ".", "r", "g", {})


def test_ctrl_c_in_training_names_the_checkpoint_and_the_resume_command(preset_file, tmp_path, monkeypatch, capsys):
    import posenc.train.loop

    real_lr_at = posenc.train.loop.lr_at

    def interrupt_at_3(step, cfg):
        if step == 3:
            raise KeyboardInterrupt
        return real_lr_at(step, cfg)

    monkeypatch.setattr(posenc.train.loop, "lr_at", interrupt_at_3)
    out = tmp_path / "run"
    argv = ["train", "--scheme", "rope", "--preset", preset_file, "--out", str(out)]
    assert main(argv) == 130
    err = capsys.readouterr().err.splitlines()
    assert err[-2:] == [
        f"posenc: interrupted: {out} checkpointed at step 3 of 4",
        f"posenc: resume with: posenc train --scheme rope --preset {preset_file} --out {out} --resume",
    ]
    assert "\r" not in "".join(err)
    assert any(
        line.startswith("rope: step 2/4, loss ") and line.endswith(f"checkpoint {out}") for line in err
    )  # line-based progress
    monkeypatch.setattr(posenc.train.loop, "lr_at", real_lr_at)
    assert main([*argv, "--resume"]) == 0


def test_interrupt_message_without_a_checkpoint_is_the_plain_line():
    assert cli.interrupted_message(KeyboardInterrupt(), ["compare"]) == "posenc: interrupted"
    assert cli.interrupted_message(KeyboardInterrupt("kept", "--resume"), ["train", "--resume"]).endswith(
        "resume with: posenc train --resume"
    )


def test_a_compare_rerun_with_nothing_to_do_says_so(tiny_corpus, tmp_path, capsys):
    preset = sweep_preset(tiny_corpus, steps=2)
    compare(preset, tmp_path / "runs", isolate=False)
    assert "already done" not in capsys.readouterr().err
    compare(preset, tmp_path / "runs", isolate=False)
    assert f"posenc: all 1 jobs already done in {tmp_path / 'runs' / 'sweep'}" in capsys.readouterr().err


@pytest.mark.slow
def test_finetune_logs_its_steps_and_both_scorings(tmp_path, word_tokenizer):
    pytest.importorskip("tensorboard")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("peft")
    import torch

    from posenc.eval import passkey

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=len(word_tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "tiny")
    word_tokenizer.save_pretrained(tmp_path / "tiny")
    (tmp_path / "corpus.txt").write_text((passkey.TASK + " " + passkey.FILLER + "\n") * 60)
    out = tmp_path / "ft"
    assert (
        main(
            [
                "finetune",
                "--preset",
                "quick",
                "--model",
                str(tmp_path / "tiny"),
                "--corpus",
                str(tmp_path / "corpus.txt"),
                "--scheme",
                "rope",
                "--length",
                "32",
                "--steps",
                "3",
                "--eval-lengths",
                "16",
                "32",
                "--eval-windows",
                "1",
                "--out",
                str(out),
                "--log",
                "tensorboard",
            ]
        )
        == 0
    )
    acc = events(out)
    logged = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [
        (r["step"], pytest.approx(r["loss"], rel=1e-6)) for r in logged
    ]
    assert {"train/lr", "train/grad_norm", "train/tokens_per_s"} <= set(acc.Tags()["scalars"])
    for L in (16, 32):
        assert [e.step for e in acc.Scalars(f"eval/ppl@{L}")] == [0, 3]  # before and after training
    assert hparams(acc)["finetune.scheme"] == "rope"


def test_ctrl_c_in_compare_says_what_is_kept_and_the_command(monkeypatch, tmp_path, capsys):
    import posenc.cli.compare_cmd as compare_cmd

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(compare_cmd, "compare", interrupted)
    argv = ["compare", "--preset", "quick", "--out", str(tmp_path)]
    assert main(argv) == 130
    assert capsys.readouterr().err.splitlines() == [
        f"posenc: interrupted: finished jobs are kept in {tmp_path / 'quick'}; "
        "each interrupted one resumes from its last checkpoint",
        f"posenc: resume with: posenc compare --preset quick --out {tmp_path}",
    ]


def test_bad_input_with_a_tracker_leaves_no_run_directory(preset_file, tmp_path, capsys):
    pytest.importorskip("tensorboard")
    out = tmp_path / "run"
    argv = ["train", "--scheme", "rope", "--preset", preset_file, "--out", str(out), "--log", "tensorboard"]
    assert main([*argv, "--corpus", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.startswith("posenc: error: ") and not out.exists()
