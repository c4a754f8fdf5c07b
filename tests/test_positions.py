"""Randomized training positions (``train.positions: randomized:max=N``; Ruoss et al. 2023, arXiv:2305.16843): the
sampler, the positions the training loss sees, contiguous evaluation, resume, and the one-line refusals."""

import json

import numpy as np
import pytest
import torch

from posenc.cli.main import main
from posenc.config.plan import load_preset
from posenc.errors import PosencError
from posenc.model import LM, ModelConfig
from posenc.train.loop import (
    TrainConfig,
    batch_at,
    check_positions,
    load_run,
    randomized_max,
    randomized_positions,
    train,
)

MCFG = ModelConfig(n_layer=1, n_head=2, d_model=16, train_length=16, encoding="rope")
ALIBI = ModelConfig(**{**MCFG.__dict__, "encoding": "alibi"})  # its bias reads the distances even at initialisation


def test_the_positions_are_a_sorted_subset_of_the_range_drawn_per_seed_and_step():
    p = randomized_positions(1000, 64, seed=3, step=7)
    assert p.dtype == torch.int64 and p.shape == (64,)
    assert bool((p.diff() > 0).all()) and int(p.min()) >= 0 and int(p.max()) < 1000  # sorted, distinct, in range
    assert torch.equal(p, randomized_positions(1000, 64, seed=3, step=7))  # a resumed run draws the same
    assert not torch.equal(p, randomized_positions(1000, 64, seed=3, step=8))
    assert not torch.equal(p, randomized_positions(1000, 64, seed=4, step=7))
    assert torch.equal(randomized_positions(64, 64, seed=0, step=0), torch.arange(64))  # N = T: every position
    # the draw is numpy's uniform choice without replacement, seeded apart from the batch offsets (seed, step)
    rng = np.random.default_rng([3, 7, 1])
    assert p.tolist() == sorted(rng.choice(1000, size=64, replace=False).tolist())


def test_uniform_over_the_range():
    """Each position of 0..N-1 is kept with probability T/N: over 400 draws of 32 of 128, every quarter of the
    range holds a quarter of the positions (3,200 each; 5 standard deviations ~ 260)."""
    counts = np.bincount(
        torch.cat([randomized_positions(128, 32, 0, s) for s in range(400)]).numpy() // 32, minlength=4
    )
    assert np.abs(counts - 3200).max() < 260, counts


def test_the_spec():
    assert randomized_max("contiguous") is None and randomized_max("randomized:max=2048") == 2048
    for bad, message in [
        ("randomized", "must be 'contiguous' or 'randomized:max=N'"),
        ("shuffled:max=4", "must be 'contiguous'"),
        ("randomized:max=0", "max must be an integer >= 1"),
        ("randomized:max=1.5", "max must be an integer >= 1"),
        ("randomized:max=4,x=1", "must be 'contiguous'"),
    ]:
        with pytest.raises(PosencError, match=message):
            randomized_max(bad)


@pytest.mark.parametrize(
    "scheme, message",
    [
        ("nope", "scheme 'nope' reads no position"),
        ("acc-rand-qkv", "reads no position"),
        ("path", "reads no position"),
        ("forget", "reads no position"),
        ("learned", "scheme 'learned' takes 16 positions, fewer than max"),
    ],
)
def test_schemes_that_take_no_positions_are_refused(scheme, message):
    tcfg = TrainConfig(positions="randomized:max=64")
    with pytest.raises(PosencError, match=message):
        check_positions(ModelConfig(**{**MCFG.__dict__, "encoding": scheme}), tcfg)


@pytest.mark.parametrize(
    "scheme", ["rope", "alibi", "t5", "kerple", "fire", "xpos", "pope", "sinusoidal", "rope+forget", "rope|nope"]
)
def test_position_indexed_schemes_take_them(scheme):
    assert (
        check_positions(
            ModelConfig(**{**MCFG.__dict__, "encoding": scheme}), TrainConfig(positions="randomized:max=64")
        )
        == 64
    )
    with pytest.raises(PosencError, match="max must be >= the training length 16"):
        check_positions(ModelConfig(**{**MCFG.__dict__, "encoding": scheme}), TrainConfig(positions="randomized:max=8"))


def _first_loss(tmp_path, tiny_corpus, positions, name):
    tcfg = TrainConfig(
        corpus=str(tiny_corpus), steps=1, batch_size=2, lr=1e-3, warmup=1, log_every=1, threads=1, positions=positions
    )
    train(tmp_path / name, ALIBI, tcfg)
    return json.loads((tmp_path / name / "train.jsonl").read_text().splitlines()[0])["loss"], tcfg


def test_the_training_loss_sees_the_drawn_positions(tmp_path, tiny_corpus):
    """The first step's logged loss is the loss of the freshly seeded model on step 0's batch at step 0's positions;
    contiguous training's is the loss at 0..T-1 (they differ: ALiBi's bias grows with the drawn gaps)."""
    randomized, tcfg = _first_loss(tmp_path, tiny_corpus, "randomized:max=4096", "randomized")
    contiguous, _ = _first_loss(tmp_path, tiny_corpus, "contiguous", "contiguous")
    torch.manual_seed(tcfg.seed)
    model = LM(ALIBI)
    from posenc.data.corpora import load_tokens

    x, y = batch_at(load_tokens(str(tiny_corpus), "byte").train, 0, 2, 16, tcfg.seed)
    with torch.no_grad():
        at = lambda pos: float(model.token_nll(x, y, pos=pos).mean())  # noqa: E731
        assert randomized == pytest.approx(at(randomized_positions(4096, 16, tcfg.seed, 0)), rel=1e-6)
        assert contiguous == pytest.approx(at(None), rel=1e-6)
    assert abs(randomized - contiguous) > 1e-3  # 400x the tolerance of the two matches above
    saved = json.loads((tmp_path / "randomized" / "config.json").read_text())
    assert saved["train"]["positions"] == "randomized:max=4096"  # recorded with the run
    loaded, _, loaded_tcfg = load_run(tmp_path / "randomized")
    assert loaded_tcfg.positions == "randomized:max=4096"


def test_evaluation_stays_contiguous(tmp_path, tiny_corpus):
    """A run trained on randomized positions scores with 0..T-1: eval's perplexity is the model's at contiguous
    positions (the model's default), never a draw."""
    tcfg = TrainConfig(
        corpus=str(tiny_corpus), steps=2, batch_size=2, lr=1e-3, warmup=1, threads=1, positions="randomized:max=256"
    )
    train(tmp_path / "run", MCFG, tcfg)
    model = load_run(tmp_path / "run")[0].eval()
    tokens = torch.randint(0, 256, (1, 17))
    with torch.no_grad():
        torch.testing.assert_close(
            model.token_nll(tokens[:, :-1], tokens[:, 1:]),
            model.token_nll(tokens[:, :-1], tokens[:, 1:], pos=torch.arange(16)),
            rtol=0,
            atol=0,
        )


def test_resume_draws_what_the_uninterrupted_run_draws(tmp_path, tiny_corpus):
    """4 steps, then resumed to 8, log the losses of 8 steps in one go: the positions come from (seed, step). (A
    constant learning rate after warmup, min_lr_ratio 1, so the 4-step run's schedule is the 8-step one's.)"""
    base = dict(
        corpus=str(tiny_corpus),
        batch_size=2,
        lr=3e-3,
        warmup=1,
        min_lr_ratio=1.0,
        log_every=1,
        threads=1,
        ckpt_every=4,
        positions="randomized:max=512",
    )
    train(tmp_path / "once", MCFG, TrainConfig(steps=8, **base))
    train(tmp_path / "twice", MCFG, TrainConfig(steps=4, **base))
    train(tmp_path / "twice", MCFG, TrainConfig(steps=8, **base), resume=True)
    losses = [
        [json.loads(line)["loss"] for line in (tmp_path / d / "train.jsonl").read_text().splitlines()]
        for d in ("once", "twice")
    ]
    assert len(losses[0]) == 8 and losses[0] == losses[1]


def test_bad_positions_on_the_command_line_are_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--scheme",
                "nope",
                "--preset",
                "quick",
                "--steps",
                "1",
                "--set",
                "train.positions=randomized:max=64",
                "--out",
                str(out),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "posenc: error: train.positions 'randomized:max=64': scheme 'nope' reads no position (randomized positions "
        "apply to position-indexed schemes: rope, alibi, t5, kerple, fire, xpos, pope, ...)"
    ]
    assert not out.exists()  # refused before the run directory is made
    assert (
        main(["compare", "--preset", "quick", "--set", "train.positions=randomized:max=8", "--out", str(tmp_path)]) == 2
    )
    assert "max must be >= the training length 32" in capsys.readouterr().err
    assert not (tmp_path / "quick").exists()
    assert main(["compare", "--preset", "quick", "--set", "train.positions=shuffled", "--out", str(tmp_path)]) == 2
    assert "train.positions must be 'contiguous' or 'randomized:max=N', got 'shuffled'" in capsys.readouterr().err
    assert load_preset("quick").train.positions == "contiguous"


def test_a_comparison_on_randomized_positions_says_so_and_scores_contiguously(tmp_path, tiny_corpus):
    """``posenc compare`` with randomized positions: the report's budget line names them, the run's config records
    them, and ``posenc report`` labels it apart from a contiguous run of the same preset."""
    common = ["--preset", "quick", "--schemes", "alibi", "--corpus", str(tiny_corpus), "--steps", "2"]
    assert main(["compare", *common, "--set", "train.positions=randomized:max=256", "--out", str(tmp_path / "r")]) == 0
    assert main(["compare", *common, "--out", str(tmp_path / "c")]) == 0
    report = (tmp_path / "r" / "quick" / "report.md").read_text()
    assert "- **budget**: 2 steps x 8 x 32 tokens, lr 0.003, randomized positions (max 256)\n" in report
    assert "randomized positions" not in (tmp_path / "c" / "quick" / "report.md").read_text()
    cfg = json.loads((tmp_path / "r" / "quick" / "alibi" / "seed0" / "config.json").read_text())
    assert cfg["train"]["positions"] == "randomized:max=256"
    assert (
        main(["report", str(tmp_path / "r" / "quick"), str(tmp_path / "c" / "quick"), "--out", str(tmp_path / "both")])
        == 0
    )
    both = (tmp_path / "both" / "report.md").read_text()
    assert "other settings: train.positions 'randomized:max=256' -> 'contiguous' |" in both
