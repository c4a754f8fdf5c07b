"""FoPE (Hua et al. 2025): each pair a Fourier series over RoPE's frequencies above the floor 2 pi / L, fixed random
coefficients from the run's seed; its complex-number definition, RoPE at gain 0, decoding, bad input."""

import math

import pytest
import torch

from posenc import Attention, encodings
from posenc.attention import naive_attention, rotate
from posenc.encodings.base import Bias, Dims, Inputs
from posenc.encodings.fope import fope_frequencies, fope_naive
from posenc.errors import PosencError
from tests.decoding import assert_grouped_query_decoding_equals_the_parallel_forward

DIMS = Dims(n_head=3, head_dim=16, d_model=48, vocab_size=0, train_length=200)


def test_the_frequencies_are_ropes_above_the_floor():
    """head dim 16, base 1e4, L = 200: omega_m = 10^(-m/2) >= 2 pi / 200 = 0.0314 for m <= 3 (0.0316), not m = 4."""
    assert torch.allclose(fope_frequencies(16, 1e4, 200), torch.tensor([1, 10**-0.5, 0.1, 10**-1.5]).double())
    enc = encodings.get("fope", DIMS)
    assert (len(enc.inv_freq), enc.n_series) == (4, 4)  # P = min(M, D / 4)
    assert enc.cos_coef.shape == enc.sin_coef.shape == (3, 4, 4)


def test_at_gain_zero_fope_is_rope_on_its_series_frequencies():
    """Gain 0 leaves the step identity: pair p < P rotates by t * omega_{p ceil(M/P)} (RoPE, relative) where that
    index is below M (series 3 here: 3 * 2 = 6 is not, so it is 0), the pairs >= P take (x1, x2) -> (x1 - x2,
    x1 + x2) (the official code's padding of both c and s with 1)."""
    dims = Dims(n_head=2, head_dim=16, d_model=32, vocab_size=0, train_length=4000)
    enc = encodings.get("fope:gain=0", dims).double()
    M, P = len(enc.inv_freq), enc.n_series
    assert (M, P) == (6, 4)  # 10^(-m/2) >= 2 pi / 4000 for m <= 5; step ceil(6 / 4) = 2
    step = math.ceil(M / P)
    picked = [m * step for m in range(P) if m * step < M]
    assert picked == [0, 2, 4]
    torch.manual_seed(0)
    B, T = 2, 9
    q, k, v = (torch.randn(B, 2, T, 16, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(T)
    omega = torch.zeros(8, dtype=torch.float64)
    omega[: len(picked)] = enc.inv_freq[picked]

    def by_hand(x):
        y = rotate(x, pos.double()[:, None] * omega)
        x1, x2 = x.chunk(2, dim=-1)
        rest, empty = slice(P, 8), slice(len(picked), P)
        y1, y2 = y.chunk(2, dim=-1)
        y1[..., rest], y2[..., rest] = x1[..., rest] - x2[..., rest], x1[..., rest] + x2[..., rest]
        y1[..., empty], y2[..., empty] = 0.0, 0.0
        return torch.cat((y1, y2), dim=-1)

    want = naive_attention(by_hand(q), by_hand(k), v)
    got = enc.attend(q, k, v, Inputs(torch.zeros(B, T, 32, dtype=torch.float64), pos))
    assert (got - want).abs().max() < 1e-12
    shifted = enc.attend(q, k, v, Inputs(torch.zeros(B, T, 32, dtype=torch.float64), pos + 37))
    assert (shifted - got).abs().max() < 1e-12  # one frequency per pair: only distances count


def test_the_fast_path_equals_the_complex_definition_with_a_bias_and_its_gradients():
    """q and k pairs times c + i s (``fope_naive``), a composed bias, float64; at gain 0.3 the logits depend on the
    positions themselves (c^2 + s^2 != 1), so a shift changes the output."""
    torch.manual_seed(0)
    enc = encodings.get("fope", DIMS).double()
    B, T = 2, 11
    q, k, v = (torch.randn(B, 3, T, 16, dtype=torch.float64, requires_grad=True) for _ in range(3))
    inp = Inputs(torch.zeros(B, T, 48, dtype=torch.float64), torch.arange(T) + 3)
    slope = torch.tensor([0.5, 0.25, 0.125], dtype=torch.float64)[None, :, None, None]

    def tile(qs, qe, ks, ke):
        return -slope * (torch.arange(qs, qe)[:, None] - torch.arange(ks, ke)).abs().double()

    bias = Bias(tile)

    c, s = enc.series(inp.pos, torch.float64)
    fast, ref = enc.attend(q, k, v, inp, bias), fope_naive(q, k, v, c, s, bias)
    assert (fast - ref).abs().max() < 1e-12
    g_fast = torch.autograd.grad(fast.square().sum(), (q, k, v))
    g_ref = torch.autograd.grad(ref.square().sum(), (q, k, v))
    assert all((a - r).abs().max() < 1e-10 for a, r in zip(g_fast, g_ref))
    with torch.no_grad():
        moved = enc.attend(q, k, v, Inputs(inp.x, torch.arange(T) + 40), bias)
        assert (moved - fast).abs().max() > 1e-3


def test_the_coefficients_are_the_step_identity_plus_xavier_normal_from_the_runs_seed():
    """C - step identity has the std of ``xavier_normal_`` on (H, M, P): gain sqrt(2 / (P (M + H))); one seed and
    layer draw one table, another seed or layer another."""
    dims = Dims(n_head=8, head_dim=256, d_model=2048, vocab_size=0, train_length=4096, seed=3)
    enc = encodings.get("fope:gain=0.6", dims)
    M, P = len(enc.inv_freq), enc.n_series
    assert (M, P) == (91, 64)  # 10000^(-m/128) >= 2 pi / 4096 for m <= 90; step ceil(91 / 64) = 2
    eye = torch.zeros(8, M, P)
    p = torch.arange(46)  # 2 p < 91
    eye[:, 2 * p, p] = 1.0
    noise = enc.cos_coef - eye
    assert noise.std().item() == pytest.approx(0.6 * math.sqrt(2 / (P * (M + 8))), rel=0.03)
    assert abs(noise.mean().item()) < 0.003 and not torch.equal(enc.cos_coef, enc.sin_coef)
    again = encodings.get("fope:gain=0.6", dims)
    assert torch.equal(again.cos_coef, enc.cos_coef) and torch.equal(again.sin_coef, enc.sin_coef)
    for other in (Dims(8, 256, 2048, 0, 4096, seed=4), Dims(8, 256, 2048, 0, 4096, layer_index=1, seed=3)):
        assert not torch.equal(encodings.get("fope:gain=0.6", other).cos_coef, enc.cos_coef)


@pytest.mark.parametrize("spec", ["fope", "fope+alibi", "fope:window=4", "fope:chunk=4+forget", "alibi:window=3+fope"])
def test_grouped_query_decoding_equals_the_parallel_forward(spec):
    assert_grouped_query_decoding_equals_the_parallel_forward(spec)


@pytest.mark.parametrize("spec", ["fope:window=4", "fope:chunk=5"])
def test_a_window_equals_the_definition_over_the_whole_matrix(spec):
    from posenc.attention import Window

    torch.manual_seed(0)
    enc = encodings.get(spec, DIMS).double()
    B, T = 2, 13
    q, k, v = (torch.randn(B, 3, T, 16, dtype=torch.float64) for _ in range(3))
    inp = Inputs(torch.zeros(B, T, 48, dtype=torch.float64), torch.arange(T))
    c, s = enc.series(inp.pos, torch.float64)

    def pairs(x):
        x1, x2 = x.chunk(2, dim=-1)
        z = torch.complex(x1, x2) * torch.complex(c, s)
        return torch.cat((z.real, z.imag), dim=-1)

    window = Window(enc.window.size, enc.window.chunked)
    want = naive_attention(pairs(q), pairs(k), v, window=window)
    assert (enc.attend(q, k, v, inp) - want).abs().max() < 1e-12
    assert (naive_attention(pairs(q), pairs(k), v) - want).abs().max() > 1e-3


def test_a_left_padded_row_equals_the_row_alone():
    torch.manual_seed(0)
    layer = Attention(32, 4, "fope:window=5", n_kv_head=2, train_length=64).double().eval()
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    mask = torch.tensor([[0, 0, 0] + [1] * 6, [1] * 9])
    with torch.no_grad():
        both = layer(x, attention_mask=mask)
        assert (both[0, 3:] - layer(x[:1, 3:])[0]).abs().max() < 1e-12
        assert (both[1] - layer(x[1:])[0]).abs().max() < 1e-12


@pytest.mark.parametrize(
    "params, message",
    [
        ({"base_length": 6}, r"fope: base_length must be an integer >= 7 .*got 6 \(the training length if unset\)$"),
        ({"gain": -0.1}, r"fope: gain must be a number in \[0, 10\], got -0.1$"),
        ({"rope_theta": 1.0}, r"rope_theta must be a finite number > 1, got 1.0$"),
        ({"pairing": "adjacent"}, r"has no parameter 'pairing'"),
    ],
)
def test_bad_parameters_are_one_line(params, message):
    with pytest.raises(PosencError, match=message) as err:
        Attention(32, 4, "fope", params=params)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("d_model, n_head, head_dim", [(60, 4, 15), (8, 4, 2)])
def test_an_odd_or_tiny_head_dim_is_one_line(d_model, n_head, head_dim):
    with pytest.raises(PosencError, match=rf"fope needs an even head dim >= 4 \(d_model / n_head\), got {head_dim}$"):
        Attention(d_model, n_head, "fope")


def test_fope_is_listed_with_its_source():
    rows = {name: (doc, source) for rows in encodings.catalogue().values() for name, doc, source in rows}
    doc, source = rows["fope"]
    assert doc.startswith("FoPE: each pair") and "2412.17739" in source
