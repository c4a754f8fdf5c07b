"""Randomized positions (``train.positions: randomized:max=N``; Ruoss et al. 2023, arXiv:2305.16843): the sampler,
the positions the training loss sees, evaluation on drawn positions as the paper's, resume, and the one-line
refusals."""

import json
import zlib

import numpy as np
import pytest
import torch

from posenc.cli.main import main
from posenc.config.plan import load_preset
from posenc.data.positions import EVAL_STREAM, randomized_positions, scored_max
from posenc.data.tasks import Test as TaskTest
from posenc.data.tasks import get_task
from posenc.errors import PosencError
from posenc.eval.perplexity import evaluate_length
from posenc.eval.tasks import EVAL_SEED, score_batch, score_test
from posenc.model import LM, ModelConfig, set_method, with_rope_schedule
from posenc.train.batches import batch_at, check_positions, randomized_max, training_positions
from posenc.train.loop import train
from posenc.train.rundir import load_run
from posenc.train.settings import TrainConfig

MCFG = ModelConfig(n_layer=1, n_head=2, d_model=16, train_length=16, encoding="rope")
ALIBI = ModelConfig(**{**MCFG.__dict__, "encoding": "alibi"})  # its bias reads the distances even at initialisation


def test_the_positions_are_a_sorted_subset_of_the_range_drawn_per_seed_and_step():
    p = training_positions(1000, 64, seed=3, step=7)
    assert p.dtype == torch.int64 and p.shape == (64,)
    assert bool((p.diff() > 0).all()) and int(p.min()) >= 0 and int(p.max()) < 1000  # sorted, distinct, in range
    assert torch.equal(p, training_positions(1000, 64, seed=3, step=7))  # a resumed run draws the same
    assert not torch.equal(p, training_positions(1000, 64, seed=3, step=8))
    assert not torch.equal(p, training_positions(1000, 64, seed=4, step=7))
    assert torch.equal(training_positions(64, 64, seed=0, step=0), torch.arange(64))  # N = T: every position
    # the draw is numpy's uniform choice without replacement, seeded apart from the batch offsets (seed, step)
    rng = np.random.default_rng([3, 7, 1])
    assert p.tolist() == sorted(rng.choice(1000, size=64, replace=False).tolist())


def test_uniform_over_the_range():
    """Each position of 0..N-1 is kept with probability T/N: over 400 draws of 32 of 128, every quarter of the
    range holds a quarter of the positions (3,200 each; 5 standard deviations ~ 260)."""
    counts = np.bincount(torch.cat([training_positions(128, 32, 0, s) for s in range(400)]).numpy() // 32, minlength=4)
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
        assert randomized == pytest.approx(at(training_positions(4096, 16, tcfg.seed, 0)), rel=1e-6)
        assert contiguous == pytest.approx(at(None), rel=1e-6)
    assert abs(randomized - contiguous) > 1e-3  # 400x the tolerance of the two matches above
    saved = json.loads((tmp_path / "randomized" / "config.json").read_text())
    assert saved["train"]["positions"] == "randomized:max=4096"  # recorded with the run
    loaded, _, loaded_tcfg = load_run(tmp_path / "randomized")
    assert loaded_tcfg.positions == "randomized:max=4096"


def _trained(tmp_path, tiny_corpus, positions="randomized:max=256"):
    tcfg = TrainConfig(
        corpus=str(tiny_corpus), steps=2, batch_size=2, lr=1e-3, warmup=1, threads=1, positions=positions
    )
    train(tmp_path / "run", ALIBI, tcfg)
    return load_run(tmp_path / "run")[0].eval()


def test_perplexity_is_scored_on_the_drawn_positions(tmp_path, tiny_corpus):
    """A run trained on randomized positions is scored on them, as the paper's evaluation is: evaluate_length's NLL
    is the model's at the batch's seeded draw (key: length, batch, EVAL_STREAM), not at 0..T-1; at T = N the draw is
    0..N-1; beyond N the length is n/a."""
    model = _trained(tmp_path, tiny_corpus)
    tokens = torch.randint(0, 256, (17,), generator=torch.Generator().manual_seed(1))
    docs = [("doc", tokens.numpy().astype(np.uint16))]  # one window of 16 model positions
    with torch.no_grad():
        drawn = randomized_positions(256, 16, (16, 0, EVAL_STREAM))
        at = lambda pos: float(model.token_nll(tokens[None, :-1], tokens[None, 1:], pos=pos).double().sum())  # noqa: E731
        rec = evaluate_length(model, docs, 16, {"scheme": "alibi"}, progress=False, positions=256)
        assert rec.nll == pytest.approx(at(drawn), rel=1e-9)
        assert abs(rec.nll - at(None)) > 1e-3  # ALiBi's bias grows with the drawn gaps
        whole = evaluate_length(model, docs, 16, {"scheme": "alibi"}, progress=False, positions=16)
        assert whole.nll == pytest.approx(at(None), rel=1e-9)  # N = T: every position
    beyond = evaluate_length(model, docs, 16, {"scheme": "alibi"}, progress=False, positions=8)
    assert beyond.ppl is None and beyond.note == "n/a: randomized positions of max 8 cannot place 16 tokens"


def test_task_answers_are_scored_on_the_drawn_positions(tmp_path, tiny_corpus):
    """A task cell of such a model is its answers' scores at each batch's draw (key: the cell's seed, step,
    EVAL_STREAM); the same cell on contiguous positions scores otherwise."""
    model = _trained(tmp_path, tiny_corpus)
    task, test = get_task("flipflop"), TaskTest("id", 16, {})
    seed = EVAL_SEED + zlib.crc32(b"id:16")
    b = task.batch(seed, 0, range(4), 16)
    with torch.no_grad():
        logits = model(b.inputs, randomized_positions(256, 16, (seed, 0, EVAL_STREAM)))
        expected = score_batch(logits.float(), b.targets, b.answer, b.distance)
        got = score_test(model, task, test, answers=1, max_tokens=64, batch_tokens=64, positions=256)
        plain = score_test(model, task, test, answers=1, max_tokens=64, batch_tokens=64)
    assert got.keys() == expected.keys()
    for k in got:
        assert got[k] == pytest.approx(expected[k], rel=1e-9)
    assert any(abs(got[k][2] - plain[k][2]) > 1e-3 for k in got)


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
    assert (
        main(
            [
                "compare",
                "--preset",
                "quick",
                "--schemes",
                "rope",
                "--set",
                "train.positions=randomized:max=128",
                "--out",
                str(tmp_path),
            ]
        )
        == 2
    )  # quick evaluates up to 8 x 32 = 256 tokens, each scored on a draw of 0..max-1
    assert capsys.readouterr().err.strip().splitlines() == [
        "posenc: error: train.positions 'randomized:max=128': max must be >= the longest evaluation length 256 (the "
        "model is scored on randomized positions too)"
    ]
    assert not (tmp_path / "quick").exists()
    assert main(["compare", "--preset", "quick", "--set", "train.positions=shuffled", "--out", str(tmp_path)]) == 2
    assert "train.positions must be 'contiguous' or 'randomized:max=N', got 'shuffled'" in capsys.readouterr().err
    assert load_preset("quick").train.positions == "contiguous"


def test_a_comparison_on_randomized_positions_says_so(tmp_path, tiny_corpus):
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


def test_eval_of_a_randomized_run_says_how_it_scores_and_why_a_length_is_na(tmp_path, tiny_corpus, capsys):
    _trained(tmp_path, tiny_corpus, positions="randomized:max=32")
    assert main(["eval", str(tmp_path / "run"), "--multiples", "1", "4"]) == 0
    out = capsys.readouterr().out
    assert "positions: randomized:max=32, scored on a seeded draw of each window's positions (as trained)" in out
    assert out.rstrip().splitlines()[-1].split() == [
        "64",
        "n/a",
        "randomized",
        "positions",
        "of",
        "max",
        "32",
        "cannot",
        "place",
        "64",
        "tokens",
    ]


def test_methods_and_schedules_keep_the_positions_in_order_on_every_command(tmp_path, tiny_corpus):
    """One rule (``scored_max``) for a run trained on randomized positions: plain, it is scored on the draw; under
    an inference method or a RoPE schedule on 0..T-1, by ``posenc eval`` as by ``posenc compare``'s method and
    schedule rows (the same perplexity, to the last digit)."""
    common = ["--preset", "quick", "--schemes", "rope", "--corpus", str(tiny_corpus), "--steps", "2"]
    sets = ["train.positions=randomized:max=256", "eval_methods=['sinks:n_sink=2,window=30']"]
    sets.append("eval_schedules=[{schedule: pi, factor: 2}]")
    assert main(["compare", *common, *(a for s in sets for a in ("--set", s)), "--out", str(tmp_path)]) == 0
    run = tmp_path / "quick"
    compared = {
        (r["scheme"], r["eval_length"]): r["ppl"]
        for r in map(json.loads, (run / "results.jsonl").read_text().splitlines())
        if r.get("kind") == "ppl"
    }
    flags = ["--multiples", "1", "2", "4", "8", "--max-tokens", "1024"]
    for extra in (["--method", "sinks:n_sink=2,window=30"], ["--rope-schedule", "pi", "--factor", "2"], []):
        assert main(["eval", str(run / "rope" / "seed0"), *flags, *extra]) == 0
    evaluated = {
        (r["scheme"], r["eval_length"]): r["ppl"]
        for r in map(json.loads, (run / "rope" / "seed0" / "eval.jsonl").read_text().splitlines())
    }
    labels = {s for s, _ in evaluated}
    assert labels == {"rope", "rope+sinks(n_sink=2,window=30)", "rope+pi(s=2)"}, labels
    for key, ppl in evaluated.items():
        assert ppl == compared[key], key
    model = load_run(run / "rope" / "seed0")[0]
    assert scored_max(model, 256) == 256
    assert scored_max(set_method(model, "sinks") and model, 256) is None
    assert scored_max(with_rope_schedule(load_run(run / "rope" / "seed0")[0], "pi", {"factor": 2.0})[0], 256) is None
