"""Data-parallel training under torchrun (2 CPU processes, gloo) equals one process on the same global batch."""

import dataclasses
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from posenc import encodings
from posenc.config.plan import load_preset
from posenc.data.corpora import load_tokens
from posenc.encodings.base import Dims, Inputs
from posenc.errors import PosencError
from posenc.model import build_model
from posenc.train import distributed
from posenc.train.batches import batch_at
from posenc.train.loop import train
from posenc.train.optimizer import make_optimizer

PRESET = """name: tiny
model: {n_layer: 2, n_head: 2, d_model: 32, train_length: 16}
train: {steps: 5, batch_size: 4, lr: 3.0e-3, warmup: 2, ckpt_every: 5, log_every: 1, threads: 1}
schemes: [acc-rand-qkv]
"""


@pytest.fixture
def setup(tmp_path, tiny_corpus):
    corpus = tiny_corpus
    preset = tmp_path / "tiny.yaml"
    preset.write_text(PRESET.replace("threads: 1}", f"threads: 1, corpus: {corpus}}}"))
    return tmp_path, preset


def losses(run_dir):
    return [json.loads(line)["loss"] for line in (run_dir / "train.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_torchrun_two_processes_equal_single_process(setup):
    tmp_path, preset_path = setup
    preset = load_preset(str(preset_path))
    single = tmp_path / "single"
    train(single, dataclasses.replace(preset.model, encoding="acc-rand-qkv"), preset.train)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "posenc.cli.main",
        "train",
        "--scheme",
        "acc-rand-qkv",
        "--preset",
        str(preset_path),
        "--out",
        str(tmp_path / "ddp"),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[:4000] + "\n...\n" + proc.stderr[-2000:]  # the ranks' errors come first
    assert proc.stdout.count("trained acc-rand-qkv: step 5 of 5, ") == 1  # rank 0 reports, rank 1 stays quiet
    ref, got = losses(single), losses(tmp_path / "ddp")
    assert len(got) == 5  # only rank 0 logs
    assert torch.allclose(torch.tensor(got), torch.tensor(ref), rtol=0, atol=1e-5), (got, ref)
    assert got[-1] < got[0] - 0.1  # it did train


def test_random_draw_of_a_shard_is_its_slice_of_the_global_draw():
    enc = encodings.get("acc-rand-qkv", Dims(n_head=2, head_dim=8, d_model=16, vocab_size=256, train_length=16)).train()
    x = torch.zeros(4, 12, 16)
    whole = enc.phases(Inputs(x, torch.arange(12), torch.zeros(4, 12, dtype=torch.long)))
    enc.draws.zero_()
    distributed.set_batch_rows(enc, slice(2, 4))
    part = enc.phases(Inputs(x[2:], torch.arange(12), torch.zeros(2, 12, dtype=torch.long)))
    assert torch.equal(part, whole[2:]) and not torch.equal(whole[:2], whole[2:])


def test_shard_rows():
    assert distributed.Shard(1, 2).rows(8) == slice(4, 8)
    with pytest.raises(PosencError, match="batch_size 5 is not divisible by the 2 processes"):
        distributed.Shard(0, 2).rows(5)


@pytest.mark.slow
def test_paper_preset_runs_a_few_steps_on_cpu(setup):
    """The paper preset's model (16 x 768, BPE) on a tiny stand-in corpus: 2 optimizer steps on 64-token rows.

    The training loop itself is covered above; here no 2 GiB checkpoint is written, to keep CI quick.
    """
    tmp_path, _ = setup
    preset = load_preset("paper", {"train": {"corpus": str(tmp_path / "corpus")}})
    m = preset.model
    assert (m.n_layer, m.d_model, m.n_head, m.train_length, preset.train.tokenizer) == (16, 768, 12, 512, "bpe32768")
    data = load_tokens(preset.train.corpus, "bpe300")  # the stand-in has merges for 303 entries, not 32,768
    assert data.vocab_size == 300
    model = build_model(dataclasses.replace(m, encoding="acc-rand-qkv", vocab_size=data.vocab_size))
    assert 113_000_000 < model.num_params() < 114_000_000  # 16 x 12 d^2 + the stand-in vocabulary
    opt = make_optimizer(model, preset.train)
    losses = []
    for step in range(2):
        x, y = batch_at(data.train, step, 1, 64, seed=0)
        loss = model.token_nll(x, y).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert abs(losses[0] - math.log(data.vocab_size)) < 1.0 and losses[1] < losses[0]
