"""T5 bucketed bias and Kerple: tiles against explicit loops, chunked attention against the full matrix, HF buckets."""

import pytest
import torch

from posenc import build_model, encodings
from posenc.attention import Bias, attention, naive_attention
from posenc.encodings.base import Dims, Inputs
from posenc.encodings.relative import relative_bias_naive, t5_bucket
from posenc.errors import PosencError

DIMS = Dims(n_head=3, head_dim=8, d_model=24, vocab_size=256, train_length=16)
POS = [0, 1, 2, 3, 5, 8, 9, 20, 47, 48, 130, 131, 400]  # gaps: every bucket regime


def test_t5_buckets_equal_hugging_face():
    from transformers.models.t5.modeling_t5 import T5Attention

    q = torch.arange(0, 3000)[:, None]
    k = torch.arange(0, 3000, 7)[None, :]
    for buckets, dist in ((32, 128), (8, 20), (2, 5)):
        want = T5Attention._relative_position_bucket(k - q, bidirectional=False, num_buckets=buckets, max_distance=dist)
        assert torch.equal(t5_bucket(q - k, buckets, dist)[k <= q], want[k <= q])


def _enc(spec):
    enc = encodings.get(spec, DIMS)
    with torch.no_grad():
        for p in enc.parameters():  # away from the zero / clamp boundaries
            p.copy_(torch.rand(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 1.5 + 0.05)
    return enc


@pytest.mark.parametrize("spec", ["t5", "t5:num_buckets=8,max_distance=20", "kerple", "kerple-power"])
@pytest.mark.parametrize("positions", [POS, list(range(7, 7 + len(POS)))])  # a gather; a Toeplitz strided view
def test_tiles_equal_the_explicit_formula(spec, positions):
    enc = _enc(spec)
    pos = torch.tensor(positions)
    bias = enc.bias(Inputs(torch.zeros(1, len(pos), 24), pos, torch.zeros(1, len(pos), dtype=torch.int64)))
    full = bias.tile(0, len(pos), 0, len(pos)).double()
    ref = relative_bias_naive(enc, positions)
    causal = torch.tril(torch.ones(len(pos), len(pos), dtype=torch.bool))
    torch.testing.assert_close(full[..., causal], ref[..., causal], rtol=1e-5, atol=1e-5)
    for qs, qe, ks, ke in ((4, 9, 2, 7), (9, 10, 0, 10), (0, 3, 5, 12)):  # any tile is a slice, above the diagonal too
        assert torch.equal(bias.tile(qs, qe, ks, ke).double(), full[..., qs:qe, ks:ke])


@pytest.mark.parametrize("spec", ["t5:num_buckets=8,max_distance=20", "kerple", "kerple-power"])
@pytest.mark.parametrize("block", [1, 5, 64])
def test_chunked_attention_equals_full_matrix_with_gradients(spec, block):
    enc = _enc(spec)
    T = len(POS)
    inp = Inputs(torch.zeros(1, T, 24), torch.tensor(POS), torch.zeros(1, T, dtype=torch.int64))
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, T, 8, dtype=torch.float64, generator=g).requires_grad_(True) for _ in range(3))
    fast = attention(q, k, v, bias=enc.bias(inp), block_size=block)
    ref_bias = relative_bias_naive(enc, POS)
    ref = naive_attention(q, k, v, bias=Bias(lambda qs, qe, ks, ke: ref_bias[..., qs:qe, ks:ke]))
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-5)
    params = list(enc.parameters())
    g_fast = torch.autograd.grad(fast.square().sum(), [q, k, v, *params])
    g_ref = torch.autograd.grad(ref.square().sum(), [q, k, v, *params])
    for a, b in zip(g_fast, g_ref):
        torch.testing.assert_close(a.double(), b.double(), rtol=1e-4, atol=1e-4)


def test_kerple_coefficients_are_clamped_positive():
    enc = encodings.get("kerple-power", DIMS)
    with torch.no_grad():
        enc.r1.fill_(-1.0)
        enc.r2.fill_(5.0)
    r1, r2 = enc.coefficients()
    assert torch.all(r1 == 1e-2) and torch.all(r2 == 2.0)


@pytest.mark.parametrize(
    "spec,message",
    [
        ("kerple:variant=cubic", "variant must be 'log' or 'power'"),
        ("t5:num_buckets=1", "2 <= num_buckets <= 4096"),
        ("t5:num_buckets=32,max_distance=16", "max_distance > num_buckets / 2"),
        ("t5:num_buckets=-4", "2 <= num_buckets <= 4096"),
    ],
)
def test_bad_parameters_are_one_line_errors(spec, message):
    with pytest.raises(PosencError, match=message):
        encodings.get(spec, DIMS)


@pytest.mark.parametrize("spec", ["t5", "kerple", "kerple-power", "acc-rand-qkv+kerple"])
def test_models_with_relative_biases_train(spec):
    torch.manual_seed(0)
    model = build_model({"encoding": spec, "n_layer": 1, "n_head": 2, "d_model": 16, "train_length": 8})
    tokens = torch.randint(0, 256, (4, 12))
    loss = model.token_nll(tokens[:, :-1], tokens[:, 1:]).mean()
    loss.backward()
    grads = [p.grad for n, p in model.named_parameters() if "enc" in n]
    assert grads and all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)
