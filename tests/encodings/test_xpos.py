"""xPos: blockwise offsets == the float64 formula, finite at position 1,000,000."""

import math

import pytest
import torch

from posenc import encodings
from posenc.attention import naive_attention
from posenc.encodings.base import Dims, Inputs
from posenc.encodings.xpos import query_blocks, xpos_block, xpos_naive_scores, xpos_zeta


def test_zeta_values():
    z = xpos_zeta(8)
    assert z.tolist() == pytest.approx([3.2 / 11.2, 5.2 / 11.2, 7.2 / 11.2, 9.2 / 11.2])


@pytest.mark.parametrize("pairing,block", [("half", 7), ("adjacent", 64)])
def test_xpos_attention_equals_naive_values_and_gradients(pairing, block):
    dims = Dims(n_head=2, head_dim=8, d_model=16, vocab_size=256, train_length=16)
    enc = encodings.get("xpos", dims, pairing=pairing, block_size=block, scale_base=8.0)  # small B: visible decay
    T = 30
    inp = Inputs(torch.zeros(1, T, 16), torch.arange(T), torch.zeros(1, T, dtype=torch.long))
    q, k, v = (torch.randn(2, 2, T, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    fast = enc.attend(q, k, v, inp)
    scores = xpos_naive_scores(q, k, inp.pos, scale_base=8.0, pairing=pairing) / math.sqrt(8)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    ref = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1) @ v
    assert torch.allclose(fast, ref, atol=1e-10)
    for a, b in zip(torch.autograd.grad(fast.sum(), (q, k, v)), torch.autograd.grad(ref.sum(), (q, k, v))):
        assert torch.allclose(a, b, atol=1e-10)
    plain = naive_attention(*(t.detach() for t in (q, k, v)))
    assert not torch.allclose(fast.detach(), plain, atol=1e-3)


def test_logits_at_one_million_are_finite_and_exact():
    D, T, C = 16, 96, 32
    pos = torch.arange(1_000_000 - T + 1, 1_000_001)
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 1, T, D, generator=g) for _ in range(2))
    ref = xpos_naive_scores(q.double(), k.double(), pos)[0, 0]  # zeta^((n-m)/B) directly, float64
    inv = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    for qs in range(0, T, C):
        qb, kb = xpos_block(q, k, pos, inv, xpos_zeta(D), 512.0, qs, qs + C)
        logits = (qb @ kb.transpose(-1, -2))[0, 0]
        assert torch.isfinite(logits).all()
        want = ref[qs : qs + C, : qs + C]
        mask = torch.ones_like(want, dtype=torch.bool).tril(qs)
        assert torch.allclose(logits.double()[mask], want[mask], rtol=1e-4, atol=1e-4)
    # the factorised form q zeta^(n/B), k zeta^(-m/B) overflows in float32 there
    ln = torch.log(xpos_zeta(D)).float()
    assert not torch.isfinite(torch.exp(-float(pos[-1]) / 512 * ln)).all()


def test_position_gap_inside_a_block_stays_finite_and_exact():
    """Position ids with a 10^5 gap inside one query block: the block splits at the gap (no inf * 0 = NaN)."""
    dims = Dims(n_head=1, head_dim=8, d_model=8, vocab_size=256, train_length=16)
    enc = encodings.get("xpos", dims, scale_base=8.0, block_size=64)
    pos = torch.cat((torch.arange(10), torch.arange(100_000, 100_010)))
    T = len(pos)
    assert query_blocks(pos, 64, 64.0) == [(0, 10), (10, 20)]
    inp = Inputs(torch.zeros(1, T, 8), pos, torch.zeros(1, T, dtype=torch.long))
    q, k, v = (torch.randn(1, 1, T, 8, dtype=torch.float64) for _ in range(3))
    out = enc.attend(q, k, v, inp)
    scores = xpos_naive_scores(q, k, pos, scale_base=8.0) / math.sqrt(8)
    ref = torch.softmax(scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")), -1) @ v
    assert torch.isfinite(out).all() and torch.allclose(out, ref, atol=1e-10)
