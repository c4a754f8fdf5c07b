"""Selective attention (Leviathan et al. 2025): head 0's ReLU'd logits, summed over the tokens in between, are
subtracted from every head's later logits; the paper's listing, a hand-computed case, windows, decoding, bad input."""

import math

import pytest
import torch

from posenc import Attention, LayerCache, encodings
from posenc.attention import Window, naive_attention
from posenc.encodings import selective
from posenc.encodings.base import Bias, Dims, Inputs
from posenc.encodings.selective import selective_attention_naive
from posenc.errors import PosencError
from tests.decoding import assert_grouped_query_decoding_equals_the_parallel_forward


def test_a_hand_computed_case():
    """One head, D = 1, T = 4, q = k = (1, 2, -1, 1): z_kj = q_k k_j. F_31 = relu(z_21) = relu(-2) = 0 and
    F_32 = 0 (no token between 2 and 3) leave row 3 plain; with q_2 = +1, F_31 = relu(1 * 2) = 2 lowers key 1 in
    row 3 only; key 0 (the first token) is never lowered, F_30 = 0 though z_10 = 2 and z_20 = 1 > 0."""
    k = torch.tensor([1.0, 2.0, -1.0, 1.0], dtype=torch.float64).view(1, 1, 4, 1)
    v = torch.eye(4, dtype=torch.float64).view(1, 1, 4, 4)
    inp = Inputs(torch.zeros(1, 4, 1, dtype=torch.float64), torch.arange(4))
    enc = encodings.get("selective", Dims(1, 1, 1, 0, 8))
    plain = naive_attention(k, k, v)
    assert (enc.attend(k, k, v, inp) - plain).abs().max() < 1e-15
    q = k.clone()
    q[..., 2, 0] = 1.0
    z3 = torch.tensor([1.0, 2.0, -1.0, 1.0], dtype=torch.float64) - torch.tensor([0.0, 2.0, 0.0, 0.0])
    want = torch.softmax(z3, dim=-1)
    out = enc.attend(q, k, v, inp)
    assert (out[0, 0, 3] - want).abs().max() < 1e-15
    assert (out[0, 0, :3] - naive_attention(q, k, v)[0, 0, :3]).abs().max() < 1e-15  # rows 0-2: nothing between


@pytest.mark.parametrize("block", [512, 4])
@pytest.mark.parametrize("window", [None, Window(5), Window(4, chunked=True)], ids=["every-key", "sliding", "chunked"])
@pytest.mark.parametrize("keep_first", [True, False])
def test_the_blockwise_path_equals_the_papers_listing_with_a_bias_and_its_gradients(
    block, window, keep_first, monkeypatch
):
    """``selective_attention_naive`` (the listing on the full matrix, float64) with a composed ALiBi-like bias:
    outputs to 1e-12 and gradients to 1e-10, over one block or several (the running column sums cross blocks)."""
    monkeypatch.setattr(selective, "BLOCK", block)
    torch.manual_seed(0)
    B, H, T, D = 2, 3, 13, 8
    q, k, v = (torch.randn(B, H, T, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    slope = torch.tensor([0.3, 0.2, 0.1], dtype=torch.float64)[None, :, None, None]

    def tile(qs, qe, ks, ke):
        return -slope * (torch.arange(qs, qe)[:, None] - torch.arange(ks, ke)).abs().double()

    bias = Bias(tile)

    enc = encodings.get(f"selective:keep_first={str(keep_first).lower()}", Dims(H, D, 24, 0, 8))
    enc.window = window
    fast = enc.attend(q, k, v, Inputs(torch.zeros(B, T, 24, dtype=torch.float64), torch.arange(T)), bias)
    ref = selective_attention_naive(q, k, v, bias, window, keep_first)
    assert (fast - ref).abs().max() < 1e-12
    g_fast = torch.autograd.grad(fast.square().sum(), (q, k, v))
    g_ref = torch.autograd.grad(ref.square().sum(), (q, k, v))
    assert all((a - r).abs().max() < 1e-10 for a, r in zip(g_fast, g_ref))
    with torch.no_grad():
        assert (ref - naive_attention(q, k, v, bias=bias, window=window)).abs().max() > 1e-2  # the masking counts


def test_head_zero_selects_for_every_head():
    """The selection reads head 0 only: changing head 1's q changes head 1's output, not the others'; changing head
    0's q changes every head's."""
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 3, 10, 4, dtype=torch.float64) for _ in range(3))
    enc, inp = encodings.get("selective", Dims(3, 4, 12, 0, 8)), Inputs(torch.zeros(1, 10, 12), torch.arange(10))
    out = enc.attend(q, k, v, inp)
    q1 = q.clone()
    q1[:, 1] = torch.randn(10, 4, dtype=torch.float64)
    assert torch.equal(enc.attend(q1, k, v, inp)[:, [0, 2]], out[:, [0, 2]])
    q0 = q.clone()
    q0[:, 0] = torch.randn(10, 4, dtype=torch.float64)
    assert (enc.attend(q0, k, v, inp)[:, 1:] - out[:, 1:]).abs().max() > 1e-3


@pytest.mark.parametrize(
    "spec",
    ["selective", "selective:window=4", "selective:chunk=4+alibi", "rope+selective+forget", "rope:window=3+selective"],
)
def test_grouped_query_decoding_equals_the_parallel_forward(spec):
    assert_grouped_query_decoding_equals_the_parallel_forward(spec)


def test_a_windowed_decoding_cache_stays_bounded():
    torch.manual_seed(0)
    layer = Attention(32, 4, "selective:window=4", n_kv_head=2).double().eval()
    x, cache = torch.randn(1, 30, 32, dtype=torch.float64), LayerCache()
    with torch.no_grad():
        out = torch.cat([layer(x[:, t : t + 1], cache=cache) for t in range(30)], 1)
        assert (out - layer(x)).abs().max() < 1e-12
    assert cache.evicted == 27 and cache.state.sums.length == 3


def test_a_left_padded_row_equals_the_row_alone_its_first_token_kept():
    torch.manual_seed(0)
    layer = Attention(32, 4, "rope+selective", n_kv_head=2).double().eval()
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    mask = torch.tensor([[0, 0, 0] + [1] * 6, [1] * 9])
    with torch.no_grad():
        both = layer(x, attention_mask=mask)
        assert (both[0, 3:] - layer(x[:1, 3:])[0]).abs().max() < 1e-12
        assert (both[1] - layer(x[1:])[0]).abs().max() < 1e-12
        cache = LayerCache()
        steps = [layer(x[:, :5], cache=cache, attention_mask=mask[:, :5])] + [
            layer(x[:, t : t + 1], cache=cache) for t in range(5, 9)
        ]
        assert (torch.cat(steps, 1)[0, 3:] - both[0, 3:]).abs().max() < 1e-12


def test_the_decoding_cache_refuses_a_crop_in_one_line():
    layer = Attention(32, 4, "selective").eval()
    cache = LayerCache()
    with torch.no_grad():
        layer(torch.randn(1, 5, 32), cache=cache)
    with pytest.raises(
        PosencError, match=r"cannot be cropped \(its running sums hold the cropped tokens' selections\)$"
    ):
        cache.crop(3)


def test_a_bad_setting_is_one_line():
    with pytest.raises(PosencError, match=r"keep_first='yes': expected bool$") as err:
        encodings.get("selective:keep_first=yes")
    assert "\n" not in str(err.value)


def test_selective_is_listed_with_its_source():
    rows = {name: (doc, source) for rows in encodings.catalogue().values() for name, doc, source in rows}
    doc, source = rows["selective"]
    assert doc.startswith("Selective attention: head 0's") and "2410.02703" in source
    assert math.isclose(1.0, 1.0)
