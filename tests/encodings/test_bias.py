"""ALiBi slopes (reference values) and the chunked biased path against the full matrix."""

import pytest
import torch

from posenc import encodings
from posenc.attention import attention, naive_attention
from posenc.encodings.base import Dims, Inputs
from posenc.encodings.bias import alibi_slopes
from posenc.errors import PosencError

REFERENCE = {  # the ALiBi reference implementation's get_slopes(n)
    8: [2.0**-i for i in range(1, 9)],
    6: [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3],
    12: [2.0**-i for i in range(1, 9)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5],
}


@pytest.mark.parametrize("n_head", [8, 6, 12])
def test_alibi_slopes_reference(n_head):
    assert alibi_slopes(n_head).tolist() == pytest.approx(REFERENCE[n_head], rel=1e-12)


@pytest.mark.parametrize("block", [1, 7, 16, 64])
def test_chunked_biased_attention_equals_full_matrix(block):
    dims = Dims(n_head=6, head_dim=8, d_model=48, vocab_size=256, train_length=16)
    T = 45
    inp = Inputs(torch.zeros(1, T, 48), torch.arange(T), torch.zeros(1, T, dtype=torch.long))
    bias = encodings.get("alibi", dims).bias(inp)
    q, k, v = (torch.randn(2, 6, T, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    fast = attention(q, k, v, bias=bias, block_size=block)
    ref = naive_attention(q, k, v, bias=bias)
    assert torch.allclose(fast, ref, atol=1e-10)
    g1 = torch.autograd.grad(fast.sum(), (q, k, v))
    g2 = torch.autograd.grad(ref.sum(), (q, k, v))
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, atol=1e-10)
    # the bias is -m_h (i - j), not divided by sqrt(d)
    tile = bias.tile(3, 5, 0, 2)
    assert tile[0, 0, 1, 0].item() == pytest.approx(-alibi_slopes(6)[0].item() * 4)


def test_composite_adds_rotary_phases_and_bias():
    dims = Dims(n_head=4, head_dim=8, d_model=32, vocab_size=256, train_length=16)
    enc = encodings.get("acc-rand-qkv+alibi", dims)
    inp = Inputs(torch.zeros(1, 12, 32), torch.arange(12), torch.zeros(1, 12, dtype=torch.long))
    enc.eval()
    assert enc.rotate_v and enc.phases(inp).shape == (1, 4, 12, 4)
    assert torch.equal(enc.bias(inp).tile(0, 12, 0, 12), encodings.get("alibi", dims).bias(inp).tile(0, 12, 0, 12))


@pytest.mark.parametrize("spec", ["alibi+alibi", "rope+alibi+rope"])
def test_composite_rejects_repeated_part(spec):
    with pytest.raises(PosencError, match="each part may appear once; repeated"):
        encodings.get(spec)
