"""PoPE: the 2D real dot product equals the complex formula (values, gradients, phase bias)."""

import math

import pytest
import torch

from posenc import encodings
from posenc.attention import Bias
from posenc.encodings.base import Dims, Inputs
from posenc.encodings.polar import pope_freqs, pope_naive


def test_frequencies_decrease_from_one():
    f = pope_freqs(4, 10000.0)
    assert f.tolist() == pytest.approx([1.0, 10.0**-1, 10.0**-2, 10.0**-3])  # base^(-(c-1)/d), not base^(+...)


@pytest.mark.parametrize("block", [512, 5])
def test_pope_equals_complex_reference(block):
    dims = Dims(n_head=2, head_dim=8, d_model=16, vocab_size=256, train_length=16)
    enc = encodings.get("pope", dims, block_size=block).double()
    with torch.no_grad():
        enc.delta.copy_(
            torch.tensor([-1.0, 0.5, -7.0, -3.0] * 4, dtype=torch.float64).view(2, 8)
        )  # some outside the clamp
    T = 23
    inp = Inputs(torch.zeros(1, T, 16), torch.arange(T), torch.zeros(1, T, dtype=torch.long))
    q, k, v = (torch.randn(2, 2, T, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    bias = Bias(lambda qs, qe, ks, ke: torch.zeros(1, 2, qe - qs, ke - ks)) if block == 5 else None
    fast = enc.attend(q, k, v, inp, bias=bias)
    leaves = (q, k, v, enc.delta)
    g_fast = torch.autograd.grad((fast**2).sum(), leaves)
    ref = pope_naive(q, k, v, inp.pos, delta=enc.delta.clamp(-2 * math.pi, 0))
    g_ref = torch.autograd.grad((ref**2).sum(), leaves)
    assert torch.allclose(fast, ref, atol=1e-10)
    for a, b in zip(g_fast, g_ref):
        assert torch.allclose(a, b, atol=1e-9)
    assert g_fast[3][0, 1] == 0 and g_fast[3][0, 2] == 0  # clamped entries get no gradient
    assert g_fast[3][0, 0] != 0


def test_phase_bias_shifts_scores():
    dims = Dims(n_head=1, head_dim=4, d_model=4, vocab_size=256, train_length=16)
    enc = encodings.get("pope", dims)
    T = 10
    inp = Inputs(torch.zeros(1, T, 4), torch.arange(T), torch.zeros(1, T, dtype=torch.long))
    q, k, v = (torch.randn(1, 1, T, 4) for _ in range(3))
    a = enc.attend(q, k, v, inp)
    with torch.no_grad():
        enc.delta.fill_(-1.0)
    assert not torch.allclose(a, enc.attend(q, k, v, inp), atol=1e-4)
    assert torch.allclose(
        enc.attend(q, k, v, inp).double(), pope_naive(q, k, v, inp.pos, delta=enc.phase_bias().detach()), atol=1e-5
    )
