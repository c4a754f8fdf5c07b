"""One training loop (``posenc.train.loop.fit``) trains posenc's LMs and fine-tunes pretrained models: its losses
equal those of a plain reference loop written here (bit for bit on CPU), a run stopped mid-way and resumed
logs the uninterrupted losses, a NaN stops with one line, and the CLI help shows the config defaults."""

from __future__ import annotations

import dataclasses
import math
import os
import signal

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import posenc.store.stamp
import posenc.train.loop
import posenc.train.precision
import posenc.train.resume
from posenc.data.corpora import load_tokens
from posenc.errors import PosencError
from posenc.model import ModelConfig, build_model
from posenc.store.checkpoint import read_json, read_jsonl, write_json
from posenc.train.batches import batch_at
from posenc.train.loop import fit, train
from posenc.train.optimizer import lr_at
from posenc.train.precision import resolve_precision
from posenc.train.resume import Checkpoint
from posenc.train.rundir import load_run
from posenc.train.settings import LoopConfig, TrainConfig

MCFG = ModelConfig(encoding="acc-rand-qkv", n_layer=1, n_head=2, d_model=16, train_length=16)  # random draws per step
LOOP = dict(steps=8, batch_size=2, lr=3e-3, warmup=2, ckpt_every=3, threads=1, precision="fp32")


def reference_losses(model, params: list, cfg: LoopConfig, loss_at) -> list[float]:
    """AdamW (0.9, 0.95; decay on matrices), linear warmup then cosine to min_lr_ratio * lr, global-norm
    clipping: the schedule every posenc run trains with, written out without the loop."""
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95))
    model.train()
    losses = []
    for step in range(cfg.steps):
        if step < cfg.warmup:
            lr = cfg.lr * (step + 1) / cfg.warmup
        else:
            cos = 0.5 * (1 + math.cos(math.pi * min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))))
            lr = cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cos)
        for g in opt.param_groups:
            g["lr"] = lr
        loss = loss_at(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        losses.append(loss.item())
    return losses


def logged(run_dir) -> list[float]:
    return [r["loss"] for r in read_jsonl(run_dir / "train.jsonl")]


class Stop(Exception):
    """A crash (not Ctrl-C): the loop writes no checkpoint for it."""


def crash_at(monkeypatch, at: int):
    """Make step ``at`` of the loop crash as a kill would (the last checkpoint and log stay as they were)."""
    real = posenc.train.loop.lr_at

    def lr_at(step, cfg):
        if step == at:
            raise Stop
        return real(step, cfg)

    monkeypatch.setattr(posenc.train.loop, "lr_at", lr_at)
    return lambda: monkeypatch.setattr(posenc.train.loop, "lr_at", real)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_train_runs_on_the_loop_with_the_reference_losses(tiny_corpus, tmp_path, monkeypatch, precision):
    """fp32, and bf16 autocast (float32 master weights): the loop's losses are the reference loop's, bit for bit,
    and config.json records the precision that ran."""
    tcfg = TrainConfig(corpus=str(tiny_corpus), log_every=1, **{**LOOP, "precision": precision})
    calls = []
    monkeypatch.setattr(posenc.train.loop, "fit", lambda *a, **k: calls.append(a[3]) or fit(*a, **k))
    train(tmp_path / "run", MCFG, tcfg)
    assert len(calls) == 1 and calls[0].run_dir == tmp_path / "run"
    data = load_tokens(tcfg.corpus, tcfg.tokenizer)
    torch.manual_seed(tcfg.seed)
    model = build_model(dataclasses.replace(MCFG, vocab_size=data.vocab_size))

    def loss_at(step):
        x, y = batch_at(data.train, step, tcfg.batch_size, MCFG.train_length, tcfg.seed)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            return model.token_nll(x, y).mean()

    want = reference_losses(model, list(model.parameters()), tcfg, loss_at)
    assert logged(tmp_path / "run") == want  # bitwise: deterministic CPU settings
    config = read_json(tmp_path / "run" / "config.json")
    assert config["train"]["precision"] == precision and all(p.dtype == torch.float32 for p in model.parameters())
    assert (
        config["stamp"]["dtype"]
        == f"float32 weights, {'bfloat16 autocast' if precision == 'bf16' else 'float32 compute'}"
    )


def test_a_crashed_train_run_resumes_to_the_uninterrupted_losses(tiny_corpus, tmp_path, monkeypatch):
    tcfg = TrainConfig(corpus=str(tiny_corpus), log_every=1, **LOOP)
    train(tmp_path / "whole", MCFG, tcfg)
    restore = crash_at(monkeypatch, 5)  # 5 steps logged, the last checkpoint at step 3
    with pytest.raises(Stop):
        train(tmp_path / "cut", MCFG, tcfg)
    assert (
        len(logged(tmp_path / "cut")) == 5
        and torch.load(tmp_path / "cut" / "state.pt", weights_only=False)["step"] == 3
    )
    restore()
    train(tmp_path / "cut", MCFG, tcfg, resume=True)
    assert [r["step"] for r in read_jsonl(tmp_path / "cut" / "train.jsonl")] == list(range(1, 9))
    assert logged(tmp_path / "cut") == logged(tmp_path / "whole")


def test_a_nan_loss_stops_with_one_line_naming_the_step_and_the_last_good_checkpoint(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    ckpt = Checkpoint(
        tmp_path, model.state_dict, torch.optim.AdamW(model.parameters()), key="trained", weights="w.safetensors"
    )
    x = torch.randn(4, 3)

    def loss_at(step):
        loss = model(x).square().mean()
        return (loss * float("nan") if step == 4 else loss), x.numel()

    with pytest.raises(PosencError) as err:
        fit(model, LoopConfig(steps=6, warmup=0, ckpt_every=2), loss_at, ckpt)
    assert str(err.value) == f"loss is nan at step 4; last good checkpoint: {tmp_path / 'w.safetensors'} (step 4)"
    assert torch.load(tmp_path / "state.pt", weights_only=False)["step"] == 4  # the good checkpoint is kept


@pytest.mark.parametrize("steps,ckpt_every,shown", [(3, 100, [3]), (5, 2, [2, 4, 5])])
def test_progress_is_printed_at_each_checkpoint_and_the_last_step(tmp_path, capsys, steps, ckpt_every, shown):
    """Off a terminal, one line per checkpoint and one at the end: a run shorter than ckpt_every printed none."""
    model = torch.nn.Linear(3, 1)
    ckpt = Checkpoint(
        tmp_path, model.state_dict, torch.optim.AdamW(model.parameters()), key="trained", weights="w.safetensors"
    )
    x = torch.randn(4, 3)
    fit(
        model,
        LoopConfig(steps=steps, warmup=0, ckpt_every=ckpt_every),
        lambda step: (model(x).square().mean(), x.numel()),
        ckpt,
        desc="job",
    )
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("job: step")]
    assert [int(line.split()[2].split("/")[0]) for line in lines] == shown
    assert all(f"/{steps}, loss " in line and line.endswith(f"checkpoint {tmp_path}") for line in lines)


@pytest.mark.parametrize("warmup,said", [(4, True), (3, False)])
def test_a_warmup_longer_than_the_run_is_said_in_one_line(tmp_path, capsys, warmup, said):
    """warmup > steps: the rate never reaches its peak (warmup == steps reaches it at the last step)."""
    model = torch.nn.Linear(3, 1)
    ckpt = Checkpoint(
        tmp_path, model.state_dict, torch.optim.AdamW(model.parameters()), key="trained", weights="w.safetensors"
    )
    x = torch.randn(4, 3)
    cfg = LoopConfig(steps=3, warmup=warmup, lr=1e-2, ckpt_every=100)
    fit(model, cfg, lambda step: (model(x).square().mean(), x.numel()), ckpt, desc="job")
    err = capsys.readouterr().err
    expected = "job: warmup 4 > steps 3: the learning rate rises for the whole run and never reaches lr 0.01"
    assert (expected in err.splitlines()) == said
    assert max(lr_at(s, cfg) for s in range(3)) == pytest.approx(1e-2 * min(1.0, 3 / warmup))


def test_a_ctrl_c_during_a_checkpoint_is_held_until_both_files_are_written(tmp_path, monkeypatch):
    """A second Ctrl-C between state.pt and the weights left them at different steps (a new-user pass: state.pt
    at step 71, the weights at 60); it now lands after both."""

    class Stopped(Exception):
        pass

    def stop(signum, frame):
        raise Stopped

    model = torch.nn.Linear(3, 1)
    ckpt = Checkpoint(
        tmp_path, model.state_dict, torch.optim.AdamW(model.parameters()), key="trained", weights="w.safetensors"
    )
    save_torch = posenc.train.resume.save_torch

    def save_then_ctrl_c(path, obj):
        save_torch(path, obj)
        os.kill(os.getpid(), signal.SIGINT)  # between the two files

    monkeypatch.setattr(posenc.train.resume, "save_torch", save_then_ctrl_c)
    previous = signal.signal(signal.SIGINT, stop)
    try:
        with pytest.raises(Stopped):
            ckpt.save(7)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert torch.load(tmp_path / "state.pt", weights_only=False)["step"] == 7
    assert torch.equal(load_file(tmp_path / "w.safetensors")["weight"], model.weight.detach())


# fine-tuning a pretrained model: the tiny saved Llama of conftest's llama_dir


def _finetune_setup(llama_dir, **overrides):
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from posenc.hf import loading
    from posenc.jobs import finetune as ft

    cfg = ft.load_finetune_config(
        "quick",
        {
            "model": str(llama_dir / "tiny"),
            "corpus": str(llama_dir / "corpus.txt"),
            "scheme": "acc-rand-qk",
            "steps": 6,
            "lr": 1e-2,
            "length": 32,
            "ckpt_every": 2,
            "threads": 1,
            **overrides,
        },
    )
    loaded = loading.load(cfg.model)
    ft.adapt(loaded.model, cfg)
    return ft, cfg, loaded.model, ft.trainable(loaded.model, cfg), ft.train_stream(cfg, loaded.tokenizer)


@pytest.mark.parametrize("lora_rank", [8, 0])
def test_finetune_runs_on_the_loop_with_the_reference_losses(llama_dir, lora_rank):
    ft, cfg, model, params, stream = _finetune_setup(llama_dir, lora_rank=lora_rank)
    assert ft.fit is posenc.train.loop.fit and issubclass(type(cfg), LoopConfig)
    ft.train_steps(model, params, stream, cfg, llama_dir / "run")
    _, _, model, params, stream = _finetune_setup(llama_dir, lora_rank=lora_rank)

    def loss_at(step):
        x, y = batch_at(stream, step, cfg.batch_size, cfg.length, cfg.seed)
        return F.cross_entropy(model(input_ids=x, use_cache=False).logits.float().flatten(0, 1), y.flatten())

    want = reference_losses(model, list(params.values()), cfg, loss_at)
    assert logged(llama_dir / "run") == want
    assert [sorted(r) for r in read_jsonl(llama_dir / "run" / "train.jsonl")][0] == [
        "grad_norm",
        "loss",
        "lr",
        "seconds",
        "step",
    ]


def test_a_crashed_finetune_resumes_to_the_uninterrupted_losses(llama_dir, monkeypatch):
    ft, cfg, model, params, stream = _finetune_setup(llama_dir)
    ft.train_steps(model, params, stream, cfg, llama_dir / "whole")
    restore = crash_at(monkeypatch, 3)  # 3 steps logged, the last checkpoint at step 2
    _, _, model, params, stream = _finetune_setup(llama_dir)
    with pytest.raises(Stop):
        ft.train_steps(model, params, stream, cfg, llama_dir / "cut")
    assert len(logged(llama_dir / "cut")) == 3
    restore()
    _, _, model, params, stream = _finetune_setup(llama_dir)
    ft.train_steps(model, params, stream, cfg, llama_dir / "cut")  # resumes from state.pt at step 2
    assert logged(llama_dir / "cut") == logged(llama_dir / "whole")


def test_configs_share_the_loop_and_scoring_fields():
    from posenc.jobs.extend import ExtendConfig, ScoringConfig
    from posenc.jobs.finetune import FinetuneConfig, eval_config, load_finetune_config

    loop, scoring = set(LoopConfig.model_fields), set(ScoringConfig.model_fields)
    assert loop <= set(TrainConfig.model_fields) and loop | scoring <= set(FinetuneConfig.model_fields)
    assert scoring <= set(ExtendConfig.model_fields) and not loop & scoring
    cfg = load_finetune_config("quick", {"docs": ["all"], "passkey_lengths": [64], "trials": 3})
    assert all(getattr(eval_config(cfg), k) == getattr(cfg, k) for k in scoring)  # finetune scores as extend does
    for cls in (TrainConfig, FinetuneConfig):  # the bounds come from LoopConfig, also where a default differs
        for field, bad in (("steps", 0), ("lr", 0.0), ("warmup", -1), ("min_lr_ratio", 1.5), ("threads", 0)):
            with pytest.raises(ValueError, match=field):
                cls(name="x", **{field: bad}) if cls is FinetuneConfig else cls(**{field: bad})


def _helps(command: str) -> dict[str, str]:
    from posenc.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    return {a.dest: a.help % {"default": a.default} for a in sub._actions if a.help}


# defaults that helps say in words (the schedule settings: the schedule's own default when not given)
IN_WORDS = {
    "name",
    "threads",
    "schedules",
    "stride",
    "rerope_window",
    "leak",
    "original_max_position_embeddings",
    "attention_factor",
    "beta_fast",
    "beta_slow",
    "truncate",
    "low_freq_factor",
    "high_freq_factor",
    "bucket",
}


@pytest.mark.parametrize("command, module", [("finetune", "posenc.jobs.finetune"), ("extend", "posenc.jobs.extend")])
def test_help_shows_the_default_presets_values(command, module, monkeypatch):
    import importlib

    from posenc.cli.common import shown

    load = f"load_{command}_config"
    d = getattr(importlib.import_module(module), load)("default")
    helps = _helps(command)
    fields = [k for k, h in helps.items() if k in type(d).model_fields and "default" in h and k not in IN_WORDS]
    assert len(fields) >= 12
    for k in fields:
        assert f"default {shown(getattr(d, k))}" in helps[k] or f"default: {shown(getattr(d, k))}" in helps[k], k
    cmd = importlib.import_module(f"posenc.cli.{command}_cmd")  # read from the config, not written in the help
    monkeypatch.setattr(cmd, load, lambda name: d.model_copy(update={"trials": 777, "seed": 5}))
    assert "(default 777)" in _helps(command)["trials"] and "(default 5)" in _helps(command)["seed"]


def test_shown_formats_config_values():
    from posenc.cli.common import shown

    assert [shown(v) for v in (2e-4, 2.0, [8192, 16384], [], None, "first", 7)] == [
        "0.0002",
        "2",
        "8192 16384",
        "none",
        "none",
        "first",
        "7",
    ]


def test_auto_precision_is_bf16_only_where_the_device_has_bf16_units(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    for units, on_cpu, on_cuda in (
        ([], "fp32", "fp32"),
        (["avx512_bf16"], "bf16", "fp32"),
        (["amx_bf16", "avx512_bf16"], "bf16", "fp32"),
        (["cuda"], "fp32", "bf16"),
    ):
        monkeypatch.setattr(posenc.store.stamp, "bf16_units", lambda units=units: units)  # one rule: bf16_native
        assert (resolve_precision("auto", cpu), resolve_precision("auto", cuda)) == (on_cpu, on_cuda), units
        assert resolve_precision("fp32", cpu) == "fp32" and resolve_precision("bf16", cpu) == "bf16"


def test_resume_refuses_another_precision_and_reads_a_run_from_before_the_field_as_fp32(tiny_corpus, tmp_path):
    run = tmp_path / "run"
    train(run, MCFG, TrainConfig(corpus=str(tiny_corpus), **{**LOOP, "steps": 3}))
    with pytest.raises(PosencError, match=r"its training differs \(precision 'fp32' -> 'bf16'\)"):
        train(run, MCFG, TrainConfig(corpus=str(tiny_corpus), **{**LOOP, "steps": 4, "precision": "bf16"}), resume=True)
    config = read_json(run / "config.json")
    del config["train"]["precision"]  # as a run written before train.precision
    write_json(run / "config.json", config)
    assert train(run, MCFG, TrainConfig(corpus=str(tiny_corpus), **{**LOOP, "steps": 4}), resume=True)["steps"] == 4


def eval_phases(model) -> torch.Tensor:
    """The first layer's evaluation phases at positions 0..15: (1, H, 16, D/2) float32."""
    from posenc.encodings.base import Inputs

    enc = model.blocks[0].attn.enc.eval()
    return enc.phases(Inputs(torch.zeros(1, 16, model.cfg.d_model), torch.arange(16)))


def test_the_training_seed_seeds_the_random_rotations_and_a_spec_seed_overrides_it(tiny_corpus, tmp_path):
    """Two training seeds evaluate different random steps, the same seed the same ones (after a reload too), and
    seed 0 draws what a model built without a seed draws (the committed seed-0 runs); ``seed=`` in the spec wins."""
    phases = {}
    for seed in (0, 1, 1):
        run = tmp_path / f"s{seed}-{len(phases)}"
        tcfg = TrainConfig(corpus=str(tiny_corpus), **{**LOOP, "steps": 1, "seed": seed})
        train(run, MCFG, tcfg)
        assert read_json(run / "config.json")["model"]["seed"] == seed
        model, mcfg, _ = load_run(run)
        phases.setdefault(seed, []).append(eval_phases(model))
    assert torch.equal(phases[1][0], phases[1][1])
    assert not torch.allclose(phases[0][0], phases[1][0], atol=1e-3)
    assert torch.equal(phases[0][0], eval_phases(build_model(dataclasses.replace(MCFG, vocab_size=256))))
    pinned = dataclasses.replace(MCFG, encoding="acc-rand-qkv:seed=0", seed=1, vocab_size=256)
    assert torch.equal(eval_phases(build_model(pinned)), phases[0][0])


def test_a_model_seed_other_than_the_training_seeds_is_refused_in_one_line(tiny_corpus, tmp_path):
    tcfg = TrainConfig(corpus=str(tiny_corpus), **{**LOOP, "steps": 1, "seed": 2})
    with pytest.raises(PosencError, match=r"^model.seed is the training seed's \(train.seed 2\); got 3"):
        train(tmp_path / "run", dataclasses.replace(MCFG, seed=3), tcfg)
