"""posenc.scoring: every target scored exactly once in every (length, window, stride, BOS)
setting; own models and Hugging Face models share one NLL."""

import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from posenc import build_model
from posenc.errors import PosencError
from posenc.eval import perplexity as hf
from posenc.eval.perplexity import evaluate_length
from posenc.scoring import Window, check_once, plan, text_windows, token_nll


def _check_plan(n: int, span: int, stride, bos: bool) -> list[Window]:
    """The plan's property: each target 1..n-1 (0..n-1 with BOS) scored exactly once, with its context inside a
    window of exactly ``span`` tokens; no window for a document shorter than one."""
    wins = text_windows(n, span, stride, bos)
    count = np.zeros(n, dtype=int)
    for w in wins:
        assert w.span == span and 0 <= w.begin and w.begin + span <= n and w.hi == w.begin + span
        assert w.begin + (not bos) <= w.lo < w.hi  # each target has its context inside the window
        count[w.lo : w.hi] += 1
    expect = np.zeros(n, dtype=int)
    if n >= span:
        expect[(not bos) :] = 1
    assert (count == expect).all(), (n, span, stride, bos)
    return wins


@pytest.mark.parametrize("bos", [False, True])
@pytest.mark.parametrize("stride", [None, 1, "half", "max"])
@pytest.mark.parametrize("span", [2, 5, 16])
@pytest.mark.parametrize("n", [1, 16, 17, 50, 103])
def test_every_target_scored_exactly_once(n, span, stride, bos):
    per_window = span - (not bos)
    stride = {"half": max(1, per_window // 2), "max": per_window}.get(stride, stride)
    wins = _check_plan(n, span, stride, bos)
    grid = max(0, (n - span) // (stride or per_window) + 1)  # windows on the stride grid, then one for the rest
    assert len(wins) == grid + (grid > 0 and wins[grid - 1].hi < n)


def test_random_lengths_windows_and_strides_score_every_target_once():
    rng = np.random.default_rng(23)
    for _ in range(3000):
        span = int(rng.integers(2, 60))
        bos = bool(rng.integers(2))
        n = int(rng.integers(1, 400))
        stride = None if rng.integers(4) == 0 else int(rng.integers(1, span - (not bos) + 1))
        _check_plan(n, span, stride, bos)


def test_the_reported_case_scores_all_1099_targets():
    """1,100 tokens, windows of 1,024, stride 512 planned one window: 76 targets were never scored."""
    wins = hf.model_windows(1100, 1024, 512)
    assert [(w.begin, w.lo, w.hi) for w in wins] == [(0, 1, 1024), (76, 1024, 1100)]
    assert sum(w.n_scored for w in wins) == 1099
    wins = hf.model_windows(2048, 1024)  # the default stride left the last target unscored
    assert wins[-1].hi == 2048 and sum(w.n_scored for w in wins) == 2047


def test_bos_none_default_stride_scores_each_windows_first_target():
    """The bug of `posenc extend --bos none`: windows of L text tokens every L tokens left target L, 2L, ...
    unscored."""
    wins = hf.model_windows(100, 10, None, bos=False)
    assert [w.begin for w in wins[:3]] == [0, 9, 18] and [(w.lo, w.hi) for w in wins[:2]] == [(1, 10), (10, 19)]
    assert sum(w.n_scored for w in wins) == wins[-1].hi - 1 == 99
    assert [w.begin for w in hf.model_windows(100, 10, None, bos=True)[:3]] == [0, 9, 18]  # BOS + 9 text tokens


def test_bad_stride_and_bad_plans_raise():
    for stride in (0, 10):
        with pytest.raises(PosencError, match=r"stride must be in \[1, 9\]"):
            text_windows(100, 10, stride)
    assert text_windows(100, 10, 10, bos=True)[1].begin == 10
    check_once([Window(0, 10, 1, 10), Window(9, 10, 10, 19)], 1, 19)
    with pytest.raises(RuntimeError, match="exactly once"):
        check_once([Window(0, 10, 1, 10), Window(10, 10, 11, 20)], 1, 20)  # target 10 skipped
    with pytest.raises(RuntimeError, match="exactly once"):
        check_once([Window(0, 10, 1, 10), Window(5, 10, 9, 15)], 1, 15)  # target 9 twice
    with pytest.raises(RuntimeError, match="exactly once"):
        check_once([Window(0, 10, 1, 10), Window(9, 10, 10, 19)], 1, 25)  # targets 19..24 never scored


def test_a_held_out_text_too_small_for_one_window_says_the_corpus_is_too_small():
    """Fewer held-out tokens in all than one window: the corpus is too small, with its sizes; enough in all but in
    documents each too short: the longest document's size."""
    tiny = [("a", np.zeros(30, np.uint16)), ("b", np.zeros(20, np.uint16))]
    message = (
        "corpus too small: its held-out text has 50 tokens in 2 document(s), and one window of evaluation length "
        "256 needs 257 tokens in one document"
    )
    for span in (None, 256):
        with pytest.raises(PosencError, match=re.escape(message)):
            plan(tiny, 256, span=span)
    with pytest.raises(PosencError, match=re.escape("evaluation length 40 exceeds the longest held-out document (29")):
        plan(tiny, 40)


def test_token_nll_chunks_equal_one_pass_and_check_shapes():
    torch.manual_seed(0)
    h, W, y = torch.randn(2, 11, 8), torch.randn(30, 8), torch.randint(0, 30, (2, 11))
    ref = torch.nn.functional.cross_entropy((h @ W.T).transpose(1, 2), y, reduction="none")
    got = token_nll(h, lambda x: x @ W.T, y, chunk=4)
    assert got.dtype == torch.float32 and torch.allclose(got, ref, atol=1e-6)
    with pytest.raises(PosencError, match="do not match"):
        token_nll(h, lambda x: x @ W.T, y[:, :5])


class _AsHF(torch.nn.Module):
    """An own LM behind the Hugging Face interface ``posenc.eval.perplexity`` reads."""

    def __init__(self, lm):
        super().__init__()
        self.lm, self.config = lm, SimpleNamespace()

    def model(self, input_ids):
        return SimpleNamespace(last_hidden_state=self.lm.hidden(input_ids))

    def get_output_embeddings(self):
        return lambda h: h @ self.lm.tok.weight.T


def test_own_and_hf_paths_give_the_same_nll():
    torch.manual_seed(0)
    lm = build_model({"n_layer": 1, "n_head": 2, "d_model": 16, "train_length": 8, "encoding": "rope"})
    tokens = np.random.default_rng(0).integers(0, 256, 70).astype(np.uint16)
    own = evaluate_length(lm, [("x", tokens)], 16, {"scheme": "rope"}, progress=False)
    # own windows read 16 tokens and score the next 16: HF windows of 17 positions, no BOS
    res = [hf.score_window(_AsHF(lm), tokens, w, None, bucket=8) for w in hf.model_windows(len(tokens), 17)]
    assert sum(r["n_scored"] for r in res) == own.scored_tokens == 69  # every target of 70 tokens
    assert sum(r["nll_sum"] for r in res) == pytest.approx(own.nll, rel=1e-6)


def test_extend_ignores_records_of_the_old_bos_none_accounting():
    from posenc.jobs.extend import _skipped_a_target
    from posenc.store.records import PasskeyTrial, ScoredWindow

    def window(**over):
        fields = {
            "key": "ppl|none|16|doc|16",
            "adaptation": "none",
            "factor": 1.0,
            "length": 16,
            "stride": 16,
            "bos": "none",
            "doc": "doc",
            "begin": 16,
            "bucket": 16,
            "signature": "s",
            "seconds": 0.0,
            "nll_sum": 1.0,
            "n_scored": 15,
            "bucket_nll": [1.0],
            "bucket_n": [15],
        }
        return ScoredWindow(**{**fields, **over})

    assert _skipped_a_target(window()) and not _skipped_a_target(
        window(begin=0)
    )  # skipped target 16; the first window was right
    assert not _skipped_a_target(window(stride=15)) and not _skipped_a_target(window(bos="prepend", stride=15))
    trial = PasskeyTrial(
        key="passkey|none|16|0.5|0",
        adaptation="none",
        factor=1.0,
        length=16,
        depth=0.5,
        trial=0,
        passkey=1,
        correct=True,
        prompt_tokens=16,
    )
    assert not _skipped_a_target(trial)
