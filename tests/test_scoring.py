"""posenc.scoring: every target scored exactly once in every (length, window, stride, BOS)
setting; own models and Hugging Face models share one NLL."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from posenc import build_model
from posenc.errors import PosencError
from posenc.evaluate import evaluate_length
from posenc.pretrained import evaluate as hf
from posenc.scoring import Window, check_once, token_nll, windows


@pytest.mark.parametrize("bos", [False, True])
@pytest.mark.parametrize("stride", [None, 1, "half", "max"])
@pytest.mark.parametrize("span", [2, 5, 16])
@pytest.mark.parametrize("n", [1, 16, 17, 50, 103])
def test_every_target_scored_exactly_once(n, span, stride, bos):
    per_window = span - (not bos)
    stride = {"half": max(1, per_window // 2), "max": per_window}.get(stride, stride)
    wins = windows(n, span, stride, bos)
    count = np.zeros(n, dtype=int)
    for w in wins:
        assert w.span == span and w.begin + span <= n and w.hi == w.begin + span
        assert w.lo >= w.begin + (not bos)  # each target has its context inside the window
        count[w.lo : w.hi] += 1
    covered = wins[-1].hi if wins else 0
    expect = np.zeros(n, dtype=int)
    expect[(not bos) : covered] = 1
    assert (count == expect).all()
    step = stride or per_window
    assert len(wins) == (max(0, (n - span) // step + 1))
    if n >= span + per_window:  # room for a second window: its first target is scored too
        assert count[wins[1].begin + (not bos)] == 1


def test_bos_none_default_stride_scores_each_windows_first_target():
    """The bug of `posenc extend --bos none`: windows of L text tokens every L tokens left target L, 2L, ... unscored."""
    wins = hf.windows(100, 10, None, bos=False)
    assert [w.begin for w in wins[:3]] == [0, 9, 18] and [(w.lo, w.hi) for w in wins[:2]] == [(1, 10), (10, 19)]
    assert sum(w.n_scored for w in wins) == wins[-1].hi - 1 == 99
    assert [w.begin for w in hf.windows(100, 10, None, bos=True)[:3]] == [0, 9, 18]  # BOS + 9 text tokens


def test_bad_stride_and_bad_plans_raise():
    for stride in (0, 10):
        with pytest.raises(PosencError, match=r"stride must be in \[1, 9\]"):
            windows(100, 10, stride)
    assert windows(100, 10, 10, bos=True)[1].begin == 10
    check_once([Window(0, 10, 1, 10), Window(9, 10, 10, 19)], 1)
    with pytest.raises(RuntimeError, match="exactly once"):
        check_once([Window(0, 10, 1, 10), Window(10, 10, 11, 20)], 1)  # target 10 skipped
    with pytest.raises(RuntimeError, match="exactly once"):
        check_once([Window(0, 10, 1, 10), Window(5, 10, 9, 15)], 1)  # target 9 twice


def test_token_nll_chunks_equal_one_pass_and_check_shapes():
    torch.manual_seed(0)
    h, W, y = torch.randn(2, 11, 8), torch.randn(30, 8), torch.randint(0, 30, (2, 11))
    ref = torch.nn.functional.cross_entropy((h @ W.T).transpose(1, 2), y, reduction="none")
    got = token_nll(h, lambda x: x @ W.T, y, chunk=4)
    assert got.dtype == torch.float32 and torch.allclose(got, ref, atol=1e-6)
    with pytest.raises(PosencError, match="do not match"):
        token_nll(h, lambda x: x @ W.T, y[:, :5])


class _AsHF(torch.nn.Module):
    """An own LM behind the Hugging Face interface ``posenc.pretrained.evaluate`` reads."""

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
    own = evaluate_length(lm, [("x", tokens)], 16, progress=False)
    # own windows read 16 tokens and score the next 16: HF windows of 17 positions, no BOS
    res = [hf.score_window(_AsHF(lm), tokens, w, None, bucket=8) for w in hf.windows(len(tokens), 17)]
    assert sum(r["n_scored"] for r in res) == own["scored_tokens"] == 64
    assert sum(r["nll_sum"] for r in res) == pytest.approx(own["nll"], rel=1e-6)


def test_extend_ignores_records_of_the_old_bos_none_accounting():
    from posenc.extend import _skipped_a_target

    old = {"kind": "ppl", "bos": "none", "length": 16, "stride": 16, "begin": 16}  # skipped target 16
    assert _skipped_a_target(old) and not _skipped_a_target({**old, "begin": 0})  # the first window was right
    assert not _skipped_a_target({**old, "stride": 15}) and not _skipped_a_target({**old, "bos": "prepend", "stride": 15})
    assert not _skipped_a_target({"kind": "passkey", "length": 16})
