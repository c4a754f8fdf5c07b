"""Evaluation accounting: every target token scored exactly once; learned tables report n/a."""

import math

import numpy as np
import pytest
import torch

from posenc import build_model
from posenc.errors import PosencError
from posenc.eval.perplexity import evaluate_length
from posenc.scoring import bucket_edges, plan, window_starts

RUN = {"scheme": "rope"}  # the run fields each record carries


def test_windows_score_every_target_once():
    """Every target 1..N-1 of each document at least L + 1 tokens long, each once (a last window overlapping its
    predecessor scores only what is left); shorter documents have no window."""
    docs = [
        ("a", np.arange(101)),
        ("b", np.arange(50)),
        ("c", np.arange(10)),
        ("d", np.arange(17)),
        ("e", np.arange(16)),
    ]
    L = 16
    seen = {d: np.zeros(len(a), int) for d, (_, a) in enumerate(docs)}
    for d, w in plan(docs, L):
        assert w.span == L + 1 and w.begin + 1 <= w.lo < w.hi == w.begin + L + 1 <= len(docs[d][1])
        seen[d][w.lo : w.hi] += 1
    for d, (_, a) in enumerate(docs):
        assert seen[d].tolist() == ([0] + [1] * (len(a) - 1) if len(a) > L else [0] * len(a))
    assert window_starts(docs, L) == [(d, w.begin) for d, w in plan(docs, L)]
    assert [w.begin for d, w in plan(docs, L) if d == 0] == [0, 16, 32, 48, 64, 80, 84]  # 84: the last 17 tokens


def test_windows_respect_token_cap_and_reject_too_long():
    docs = [("a", np.arange(1000)), ("b", np.arange(1000))]
    w = window_starts(docs, 100, max_tokens=300)
    assert len(w) == 3 and {d for d, _ in w} == {0, 1}  # round-robin over documents
    with pytest.raises(PosencError, match="exceeds the longest"):
        window_starts(docs, 1000)


def test_evaluate_length_sums_nll_over_scored_tokens():
    torch.manual_seed(0)
    model = build_model({"n_layer": 1, "n_head": 2, "d_model": 16, "train_length": 8, "encoding": "rope"})
    rng = np.random.default_rng(0)
    docs = [("x", rng.integers(0, 256, 70).astype(np.uint16)), ("y", rng.integers(0, 256, 40).astype(np.uint16))]
    rec = evaluate_length(model, docs, 16, RUN, progress=False)
    assert rec.windows == (4 + 1) + (2 + 1) and rec.scored_tokens == 69 + 39  # every target of both
    # the same NLL computed window by window, each target once
    total = 0.0
    for d, w in plan(docs, 16):
        a = torch.from_numpy(docs[d][1][w.begin : w.begin + 17].astype(np.int64))[None]
        with torch.no_grad():
            total += float(model.token_nll(a[:, :-1], a[:, 1:]).double()[0, w.lo - w.begin - 1 :].sum())
    assert rec.nll == pytest.approx(total, rel=1e-6)
    assert rec.ppl == pytest.approx(math.exp(total / 108), rel=1e-6)
    assert rec.bucket_edges == bucket_edges(16, 8) == [0, 8, 16]


def test_no_progress_bar_off_a_terminal(capsys):
    """The default progress bar is for a terminal: stderr captured (a log file) gets no bar, no carriage return
    (posenc eval, diagnose and compare's schedule rows pass no ``progress``)."""
    model = build_model({"n_layer": 1, "n_head": 2, "d_model": 16, "train_length": 8, "encoding": "rope"})
    rec = evaluate_length(model, [("x", np.arange(70, dtype=np.uint16))], 16, RUN)
    assert rec.windows == 5 and capsys.readouterr().err == ""


def test_learned_beyond_table_is_not_applicable():
    model = build_model({"n_layer": 1, "n_head": 2, "d_model": 16, "train_length": 8, "encoding": "learned"})
    docs = [("x", np.arange(100, dtype=np.uint16) % 256)]
    assert evaluate_length(model, docs, 8, RUN, progress=False).ppl is not None
    rec = evaluate_length(model, docs, 16, RUN, progress=False)
    assert rec.ppl is None and rec.note.startswith("n/a")


def test_span_makes_every_length_score_the_same_targets():
    docs = [("a", np.arange(200)), ("short", np.arange(40)), ("b", np.arange(129)), ("c", np.arange(300))]
    targets = {}
    for L in (16, 32, 64, 128):
        wins = window_starts(docs, L, max_tokens=200, span=128)
        targets[L] = sorted((d, t) for d, s in wins for t in range(s + 1, s + L + 1))
    assert targets[16] == targets[32] == targets[64] == targets[128]
    assert {d for d, _ in targets[16]} == {0, 2} and len(targets[16]) == 256  # 2 spans of 128 cover 200
    with pytest.raises(PosencError, match="not a multiple"):
        window_starts(docs, 48, span=128)
    with pytest.raises(PosencError, match="exceeds the longest"):
        window_starts(docs, 16, span=512)


def test_eval_says_which_text_it_scored_and_when_it_is_fewer_tokens_than_asked(tmp_path, capsys):
    from posenc.cli.main import main

    run = tmp_path / "run"
    assert main(["train", "--scheme", "rope", "--preset", "quick", "--steps", "1", "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["eval", str(run), "--multiples", "1", "--max-tokens", "100000000"]) == 0
    text = [line for line in capsys.readouterr().out.splitlines() if line.startswith("text: ")]
    assert len(text) == 1 and "held-out document(s) of shakespeare" in text[0]
    assert "fewer than --max-tokens 100000000: each held-out document gives its first 32 targets only" in text[0]
    assert "posenc compare scores this text when its longest length is" in text[0]


def test_stream_buckets_are_equal_spans_of_the_targets():
    from posenc.eval.perplexity import stream_buckets

    nll = np.log(np.array([2.0, 2.0, 8.0, 8.0, 4.0, 4.0, 4.0, 4.0]))
    edges, ppl = stream_buckets(nll, parts=4)
    assert edges == [0, 2, 4, 6, 8] and np.allclose(ppl, [2.0, 8.0, 4.0, 4.0], rtol=1e-12)
    edges, ppl = stream_buckets(nll[:3])  # fewer targets than parts: no empty span
    assert edges == [0, 1, 2, 3] and np.allclose(ppl, [2.0, 2.0, 8.0])
