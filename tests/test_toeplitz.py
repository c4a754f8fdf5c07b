"""The evaluation path of biases of the distance only (``posenc.attention.toeplitz_causal``: T5, Kerple) against the
full matrix (``naive_attention``) and the tile path: values over many blocks, in float64 and at 8K tokens in
float32, when it is taken (prefill without grad on consecutive positions only), and NaN rows."""

import math

import pytest
import torch

from posenc import encodings
from posenc.attention import Bias, attention, naive_attention, toeplitz_causal
from posenc.encodings.base import Dims, Inputs

DIMS = Dims(n_head=3, head_dim=8, d_model=24, vocab_size=256, train_length=16)
SPECS = ["t5:num_buckets=8,max_distance=20", "kerple", "kerple-power"]


def bias_of(spec: str, T: int, dtype=torch.float64, pos=None):
    enc = encodings.get(spec, DIMS).to(dtype)
    for p in enc.parameters():  # away from the initial values (T5 starts at zero: no bias at all)
        torch.nn.init.uniform_(p, 0.1, 1.5)
    return enc.bias(Inputs(torch.zeros(1, T, 24, dtype=dtype), torch.arange(T) if pos is None else pos))


def untiled(bias):
    """The same tiles without the toeplitz form: the tile path."""
    return Bias(bias.tile)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("block", [1, 7, 64])
def test_values_equal_the_full_matrix_and_the_tiles(spec, block):
    T = 70
    bias = bias_of(spec, T)
    q, k, v = (torch.randn(2, 3, T, 8, dtype=torch.float64) for _ in range(3))
    with torch.no_grad():
        fast = attention(q, k, v, bias=bias, block_size=block)
        assert torch.equal(fast, toeplitz_causal(q, k, v, bias.toeplitz(T), 1 / math.sqrt(8), block))  # taken
        tiles = attention(q, k, v, bias=untiled(bias), block_size=block)
    torch.testing.assert_close(fast, naive_attention(q, k, v, bias=bias), atol=1e-12, rtol=0)
    torch.testing.assert_close(fast, tiles, atol=1e-12, rtol=0)


def test_float32_at_8k_tokens_matches_the_tiles():
    """Kerple at 8,192 tokens in float32, blocks of 512: the reversed key order changes only the kernel's summation
    order (measured 2e-6 at most; the bound leaves 5x)."""
    T = 8192
    bias = bias_of("kerple", T, torch.float32)
    q, k, v = (torch.randn(1, 3, T, 8) for _ in range(3))
    with torch.no_grad():
        fast = attention(q, k, v, bias=bias, block_size=512)
        tiles = attention(q, k, v, bias=untiled(bias), block_size=512)
    torch.testing.assert_close(fast, tiles, atol=1e-5, rtol=0)


def test_taken_only_in_a_prefill_without_grad_on_consecutive_positions():
    T = 24
    q, k, v = (torch.randn(1, 3, T, 8, dtype=torch.float64) for _ in range(3))
    assert bias_of("kerple", T).toeplitz is not None
    gapped = bias_of("kerple", T, pos=torch.arange(T) * 3)  # randomized positions, say: no single distance table
    assert gapped.toeplitz is None
    bias = bias_of("kerple", T)
    with torch.no_grad():
        tail = attention(q[..., -4:, :], k, v, bias=bias, block_size=8)  # the last 4 queries over the cache
    torch.testing.assert_close(tail, naive_attention(q, k, v, bias=bias)[..., -4:, :], atol=1e-12, rtol=0)
    qg, ref = q.clone().requires_grad_(), q.clone().requires_grad_()
    torch.manual_seed(1)
    attention(qg, k, v, bias=bias_of("kerple", T), block_size=8).sum().backward()  # with grad: the tile path
    torch.manual_seed(1)
    naive_attention(ref, k, v, bias=bias_of("kerple", T)).sum().backward()
    torch.testing.assert_close(qg.grad, ref.grad, atol=1e-12, rtol=0)


def test_a_nan_makes_its_rows_nan():
    T = 20
    bias = bias_of("kerple", T)
    q, k, v = (torch.randn(1, 3, T, 8, dtype=torch.float64) for _ in range(3))
    q[0, 1, 5, 0] = float("nan")
    with torch.no_grad():
        out = attention(q, k, v, bias=bias, block_size=8)
    assert out[0, 1, 5].isnan().all() and not out[0, 1, :5].isnan().any() and not out[0, 0].isnan().any()
