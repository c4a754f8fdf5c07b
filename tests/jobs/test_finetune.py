"""posenc finetune on a tiny Llama built here: end to end (scored before and after, LoRA saved as safetensors),
an interrupted run resumes to the same tensors, decoding a fine-tuned swapped model equals its full forward,
and bad input is a one-line error that touches no output directory."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")
from safetensors.torch import load_file  # noqa: E402

from posenc.cli.main import main  # noqa: E402
from posenc.errors import PosencError  # noqa: E402
from posenc.hf import loading  # noqa: E402
from posenc.jobs import finetune as ft  # noqa: E402
from posenc.store import checkpoint  # noqa: E402


def argv(d, *extra):
    return [
        "finetune",
        "--model",
        str(d / "tiny"),
        "--corpus",
        str(d / "corpus.txt"),
        "--length",
        "32",
        "--eval-lengths",
        "16",
        "32",
        "--eval-windows",
        "2",
        "--lr",
        "1e-2",
        "--warmup",
        "1",
        *extra,
    ]


def records(out):
    return [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]


def test_finetune_end_to_end(llama_dir):
    out = llama_dir / "o"
    assert main(argv(llama_dir, "--scheme", "acc-rand-qk", "--steps", "12", "--out", str(out))) == 0
    label, tuned = "scheme:acc-rand-qk", "scheme:acc-rand-qk, fine-tuned 12 steps"
    ppl = {}
    for r in records(out):
        ppl.setdefault((r["adaptation"], r["length"]), []).append(r["nll_sum"] / r["n_scored"])
    assert set(ppl) == {(m, L) for m in (label, tuned) for L in (16, 32)}
    for L in (16, 32):  # the swapped model learns the repeated text: held-out NLL falls
        assert sum(ppl[tuned, L]) < 0.99 * sum(ppl[label, L])  # NLL (nats)
    log = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(1, 13))
    assert sum(r["loss"] for r in log[-3:]) < 0.97 * sum(r["loss"] for r in log[:3])
    trained = load_file(out / "trained.safetensors")
    lora = [k for k in trained if ".lora_" in k]
    assert len(lora) == 2 * 4 * 2  # A and B on q/k/v/o of 2 layers
    assert all(
        ".posenc." in k for k in trained if ".lora_" not in k
    )  # and the schemes' buffers: random steps have no weights
    assert {k: int(v) for k, v in trained.items() if k.endswith("draws")} == {  # their draw counters: one draw per
        f"model.layers.{i}.self_attn.posenc.draws": 12 for i in range(2)
    }  # training step; scoring uses the fixed draw
    assert any(float(v.abs().max()) > 0 for k, v in trained.items() if "lora_B" in k)  # B starts at 0 and trained
    md = (out / "results.md").read_text()
    assert label in md and tuned in md and "LoRA rank 8" in md
    assert all((out / f).exists() for f in ("loss.png", "ppl_vs_length.png", "ppl.csv", "finetune.json", "state.pt"))


def test_interrupted_run_resumes_to_the_same_tensors(llama_dir, monkeypatch):
    common = ["--scheme", "acc-rand-qk+forget", "--steps", "5", "--ckpt-every", "2", "--lora-rank", "0"]
    assert main(argv(llama_dir, *common, "--out", str(llama_dir / "whole"))) == 0
    batch_at = ft.batch_at

    def interrupt_at_3(stream, step, *args):
        if step == 3:  # a real Ctrl-C, before this step's forward (which advances the draw counters)
            os.kill(os.getpid(), signal.SIGINT)
        return batch_at(stream, step, *args)

    monkeypatch.setattr(ft, "batch_at", interrupt_at_3)
    previous = signal.signal(
        signal.SIGINT, signal.default_int_handler
    )  # as in a terminal (a background job ignores it)
    try:
        assert main(argv(llama_dir, *common, "--out", str(llama_dir / "cut"))) == 130
    finally:
        signal.signal(signal.SIGINT, previous)
    assert torch.load(llama_dir / "cut" / "state.pt")["step"] == 4  # Ctrl-C: the step in flight ends, then a checkpoint
    monkeypatch.setattr(ft, "batch_at", batch_at)
    assert main(argv(llama_dir, *common, "--out", str(llama_dir / "cut"))) == 0
    whole, cut = (
        load_file(llama_dir / "whole" / "trained.safetensors"),
        load_file(llama_dir / "cut" / "trained.safetensors"),
    )
    assert set(whole) == set(cut) and any(".posenc." in k for k in whole)  # every weight and the forget gates
    draws = [k for k in whole if k.endswith("draws")]  # the random-draw counters: one training draw per step
    assert draws and all(int(whole[k]) == 5 for k in draws)
    for k in whole:
        assert torch.equal(whole[k], cut[k]), k
    log = (llama_dir / "cut" / "train.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in log] == [1, 2, 3, 4, 5]
    assert {r["key"] for r in records(llama_dir / "cut")} == {r["key"] for r in records(llama_dir / "whole")}
    files = {f.name: f.read_bytes() for f in (llama_dir / "cut").iterdir()}
    assert main(argv(llama_dir, *common, "--lr", "1e-3", "--out", str(llama_dir / "cut"))) == 2  # other settings
    assert {f.name: f.read_bytes() for f in (llama_dir / "cut").iterdir()} == files
    assert oct((llama_dir / "cut" / "trained.safetensors").stat().st_mode & 0o777) == oct(0o666 & ~checkpoint._UMASK)


def test_decoding_a_finetuned_swapped_model_equals_its_full_forward(llama_dir, hf_decode):
    cfg = ft.load_finetune_config(
        "quick",
        {
            "model": str(llama_dir / "tiny"),
            "corpus": str(llama_dir / "corpus.txt"),
            "scheme": "acc-learned-qk+forget",
            "steps": 4,
            "lr": 1e-2,
            "length": 32,
        },
    )
    loaded = loading.load(cfg.model)
    model = loaded.model
    ft.adapt(model, cfg)
    params = ft.trainable(model, cfg)
    ft.train_steps(model, params, ft.train_stream(cfg, loaded.tokenizer), cfg, llama_dir / "run")
    steps = [p for k, p in params.items() if k.endswith("posenc.parts.0.step.weight")]
    assert steps and all(float(p.detach().abs().max()) > 0 for p in steps)  # the learned steps moved from W = 0
    full, decoded = hf_decode(model, torch.randint(0, model.config.vocab_size, (1, 20)), 12)
    assert torch.allclose(decoded, full, atol=1e-5)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--scheme", "alibi", "--schedule", "yarn"], "not both"),
        (["--schedule", "nosuch"], "nosuch"),
        (["--pose-target", "16"], "pose_target 16 is shorter than the training sequence (length 32)"),
        (["--pose-target", "64", "--pose-chunks", "40"], "pose_chunks 40: more chunks than tokens per sequence"),
        (
            ["--pose-target", "64", "--scheme", "alibi"],
            "PoSE moves the model's RoPE positions (position_ids): not with scheme 'alibi'",
        ),
        (["--lora-targets", "q_proj", "nosuch_proj"], "no module of the model is named nosuch_proj"),
        (["--lora-targets", "self_attn"], "peft cannot put LoRA on self_attn"),
        (["--length", "100000"], "too few for --length 100000"),
        (["--scheme", "acc-token-qk"], "token ids"),
        (["--preset", "nosuch"], "unknown finetune preset"),
        (["--steps", "0"], "steps"),
        (["--passkey-lengths", "40"], "passkey length 40 is too short"),
    ],
)
def test_bad_input_is_one_line_and_touches_nothing(llama_dir, capsys, extra, message):
    assert main(argv(llama_dir, "--steps", "2", "--out", str(llama_dir / "o"), *extra)) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # after transformers' loading progress bar, when the model loaded
    assert "Traceback" not in err and last.startswith("posenc: error:") and message in last
    assert not (llama_dir / "o").exists()


def test_a_directory_of_other_runs_is_refused_and_untouched(llama_dir, capsys):
    runs = llama_dir / "runs"  # --out runs: beside train's and extend's runs, as --out is the run directory itself
    (runs / "train" / "rope").mkdir(parents=True)
    (runs / "train" / "rope" / "model.safetensors").write_bytes(b"x")
    (runs / "notes.txt").write_text("mine")
    assert main(argv(llama_dir, "--steps", "2", "--out", str(runs))) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"posenc: error: {runs} holds files but no finetune run (finetune.json); --out is the run directory "
        "itself: give a new or empty one (default runs/finetune/<name>)"
    ]
    assert sorted(str(p.relative_to(runs)) for p in runs.rglob("*")) == [
        "notes.txt",
        "train",
        "train/rope",
        "train/rope/model.safetensors",
    ]


def test_shipped_presets_and_flags():
    assert ft.preset_names() == ["default", "drope", "quick"]
    cfg = ft.load_finetune_config("default")
    assert (cfg.model, cfg.scheme, cfg.length, cfg.steps, cfg.lora_rank, cfg.eval_lengths) == (
        "smollm2",
        "acc-rand-qk",
        1024,
        50,
        8,
        [1024],
    )
    from posenc.cli import finetune_cmd
    from posenc.cli.main import build_parser

    args = build_parser().parse_args(
        ["finetune", "--preset", "quick", "--lora-rank", "0", "--scheme", "alibi", "--passkey-lengths"]
    )
    cfg = finetune_cmd.config(args)
    assert (cfg.name, cfg.steps, cfg.lora_rank, cfg.scheme, cfg.passkey_lengths) == ("quick", 5, 0, "alibi", [])
    assert args.func is finetune_cmd.run
    for flags, want in (
        (["--schedule", "yarn"], (None, "yarn")),
        (["--scheme", "alibi"], ("alibi", "none")),
        (["--preset", "quick"], ("acc-rand-qk", "none")),
    ):  # a flag replaces the preset's adaptation
        cfg = finetune_cmd.config(build_parser().parse_args(["finetune", *flags]))
        assert (cfg.scheme, cfg.schedule) == want


def test_the_drope_recipe_drops_rope_on_every_layer_and_recalibrates_every_weight(llama_dir):
    """``--preset drope`` (DroPE, arXiv 2512.12167) on the tiny Llama at its sizes: NoPE in every layer, every weight
    trained (no LoRA), scored before and after; the recalibration lowers the held-out NLL of the dropped model."""
    cfg = ft.load_finetune_config("drope")
    assert (cfg.scheme, cfg.lora_rank, cfg.length, cfg.steps, cfg.eval_lengths) == (
        "nope",
        0,
        8192,
        100,
        [8192, 16384, 32768],
    )
    out = llama_dir / "drope"
    assert main([*argv(llama_dir, "--steps", "8", "--out", str(out)), "--preset", "drope"]) == 0
    assert json.loads((out / "finetune.json").read_text())["scheme"] == "nope"
    ppl = {}
    for r in records(out):
        ppl.setdefault(r["adaptation"], []).append(r["nll_sum"] / r["n_scored"])
    assert set(ppl) == {"scheme:nope", "scheme:nope, fine-tuned 8 steps"}
    assert sum(ppl["scheme:nope, fine-tuned 8 steps"]) < 0.99 * sum(ppl["scheme:nope"])
    trained = load_file(out / "trained.safetensors")
    assert not any(".lora_" in k for k in trained)
    assert {f"model.layers.{i}.self_attn.q_proj.weight" for i in range(2)} <= set(trained)


def test_a_rope_schedule_fine_tunes(llama_dir):
    out = llama_dir / "yarn"
    assert main(argv(llama_dir, "--schedule", "yarn", "--factor", "2", "--steps", "2", "--out", str(out))) == 0
    assert {r["adaptation"] for r in records(out)} == {"yarn", "yarn, fine-tuned 2 steps"}
    assert json.loads((out / "finetune.json").read_text())["schedule"] == "yarn"


def test_an_unknown_preset_key_is_one_line(tmp_path):
    (tmp_path / "old.yaml").write_text("name: x\nmethod: yarn\n")
    with pytest.raises(
        PosencError, match=r"^invalid finetune preset old.yaml: method: Extra inputs are not permitted$"
    ):
        ft.load_finetune_config(str(tmp_path / "old.yaml"))


@pytest.mark.parametrize(
    "length, target, chunks", [(32, 64, 2), (32, 32, 2), (1024, 16384, 2), (100, 5000, 5), (16, 100, 1), (8, 20, 8)]
)
def test_pose_position_ids(length, target, chunks):
    """PoSE (Zhu et al. 2024, sec. 3.2): chunks of consecutive positions, the first from 0, each later one shifted
    by a bias at least the previous one's, the last position below the target; the same for the same (seed, step)."""
    ids = ft.pose_position_ids(length, target, chunks, seed=3, step=5)
    assert ids.dtype == torch.int64 and ids.shape == (length,)
    assert int(ids[0]) == 0 and int(ids[-1]) < target and bool((ids.diff() >= 1).all())
    jumps = ids.diff() - 1  # 0 inside a chunk; a chunk boundary jumps by the bias's increment
    assert int((jumps != 0).sum()) <= chunks - 1
    assert torch.equal(ids, ft.pose_position_ids(length, target, chunks, seed=3, step=5))
    if target == length or chunks == 1:
        assert torch.equal(ids, torch.arange(length))  # nothing to skip over


def test_pose_covers_the_target_over_steps():
    """Over many steps the positions reach the target's far end, and the chunks' cuts move."""
    draws = [ft.pose_position_ids(64, 4096, 2, 0, s) for s in range(300)]
    assert (
        max(int(d[-1]) for d in draws) > 3900
        and len({int((d.diff() > 1).nonzero()[0]) for d in draws if (d.diff() > 1).any()}) > 20
    )


def test_pose_fine_tuning_feeds_the_position_ids(llama_dir, monkeypatch):
    """Each PoSE step draws its position ids from (seed, step), the model trains at them (its first loss differs from
    the same step at 0..L-1), and the run's config records the setting."""
    seen = []
    real = ft.pose_position_ids

    def spy(*a):
        seen.append(real(*a))
        return seen[-1]

    monkeypatch.setattr(ft, "pose_position_ids", spy)
    out = llama_dir / "pose"
    assert (
        main(
            argv(
                llama_dir,
                "--schedule",
                "yarn",
                "--factor",
                "2",
                "--steps",
                "2",
                "--pose-target",
                "64",
                "--out",
                str(out),
            )
        )
        == 0
    )
    assert len(seen) == 2 and all(int(s[-1]) < 64 for s in seen)
    assert [s.tolist() for s in seen] == [real(32, 64, 2, 0, step).tolist() for step in (0, 1)]
    cfg = json.loads((out / "finetune.json").read_text())
    assert cfg["pose_target"] == 64 and cfg["pose_chunks"] == 2
    plain = llama_dir / "plain"
    assert main(argv(llama_dir, "--schedule", "yarn", "--factor", "2", "--steps", "2", "--out", str(plain))) == 0
    first = [json.loads((d / "train.jsonl").read_text().splitlines()[0])["loss"] for d in (out, plain)]
    assert abs(first[0] - first[1]) > 1e-4, first


@pytest.mark.parametrize("command", ["extend", "finetune"])
def test_quick_means_preset_quick_in_both_commands(command, capsys):
    """``--quick`` is ``--preset quick`` for finetune as for extend (finetune refused it); with --preset it is
    refused."""
    from posenc.cli import extend_cmd, finetune_cmd
    from posenc.cli.main import build_parser

    module = {"extend": extend_cmd, "finetune": finetune_cmd}[command]
    quick = module.config(build_parser().parse_args([command, "--quick"]))
    assert quick == module.config(build_parser().parse_args([command, "--preset", "quick"])) and quick.name == "quick"
    with pytest.raises(SystemExit) as err:
        build_parser().parse_args([command, "--quick", "--preset", "default"])
    assert err.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
