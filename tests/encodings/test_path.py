"""PaTH: blockwise algorithm == product-building reference == token-by-token decoding."""

import math

import pytest
import torch
import torch.nn.functional as F

from posenc import encodings
from posenc.attention import naive_attention
from posenc.encodings.base import Dims, Inputs
from posenc.encodings.forget import forget_bias, log_forget_cumsum
from posenc.encodings.householder import path_attention, path_keys
from posenc.encodings.householder_naive import path_attention_naive, path_decode, path_scores_naive
from posenc.errors import PosencError


def inputs(B=2, H=3, T=21, D=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, D, generator=g, dtype=dtype) for _ in range(3))
    w = F.normalize(torch.randn(B, H, T, D, generator=g, dtype=dtype), dim=-1)
    beta = 2 * torch.rand(B, H, T, generator=g, dtype=dtype)
    return q, k, v, w, beta


def householder(w, b):
    return torch.eye(w.shape[0], dtype=w.dtype) - b * torch.outer(w, w)


def test_naive_scores_are_the_literal_product_in_order():
    q, k, _, w, beta = inputs(B=1, H=1, T=5, D=4)
    s = path_scores_naive(q, k, w, beta)[0, 0]
    Hm = [householder(w[0, 0, t], beta[0, 0, t]) for t in range(5)]
    i, j = 4, 1
    want = q[0, 0, i] @ Hm[4] @ Hm[3] @ Hm[2] @ k[0, 0, j]  # H_i H_{i-1} ... H_{j+1}
    assert s[i, j].item() == pytest.approx(want.item(), abs=1e-12)
    wrong = q[0, 0, i] @ Hm[2] @ Hm[3] @ Hm[4] @ k[0, 0, j]
    assert abs(wrong.item() - want.item()) > 1e-3  # the order matters
    assert s[2, 2].item() == pytest.approx((q[0, 0, 2] @ k[0, 0, 2]).item())
    assert torch.isinf(s[1, 3])


@pytest.mark.parametrize("T,block", [(21, 4), (16, 16), (7, 64), (33, 8)])
def test_blockwise_equals_naive_values_and_gradients(T, block):
    leaves = [t.requires_grad_(True) for t in inputs(T=T)]
    fast = path_attention(*leaves, block_size=block, logit_scale=1.3)
    gw = torch.randn_like(fast)
    g_fast = torch.autograd.grad((fast * gw).sum(), leaves)
    ref = path_attention_naive(*leaves, logit_scale=1.3)
    g_ref = torch.autograd.grad((ref * gw).sum(), leaves)
    assert torch.allclose(fast, ref, atol=1e-10)
    for a, b in zip(g_fast, g_ref):
        assert torch.allclose(a, b, atol=1e-9)


def test_blockwise_with_forget_bias_equals_naive_and_decode():
    q, k, v, w, beta = inputs(T=19)
    lam = log_forget_cumsum(torch.randn(2, 3, 19, dtype=torch.float64) + 2)
    bias = forget_bias(lam)
    fast = path_attention(q, k, v, w, beta, bias=bias, block_size=5)
    ref = path_attention_naive(q, k, v, w, beta, bias=bias)
    assert torch.allclose(fast, ref, atol=1e-6)  # tiles are float32
    assert torch.allclose(path_decode(q, k, v, w, beta, bias=bias), ref, atol=1e-6)
    assert not torch.allclose(fast, path_attention(q, k, v, w, beta, block_size=5), atol=1e-3)


def test_decode_updates_cached_keys_equal_parallel_pass():
    q, k, v, w, beta = inputs(T=26)
    assert torch.allclose(path_decode(q, k, v, w, beta), path_attention(q, k, v, w, beta, block_size=8), atol=1e-10)


def test_beta_zero_is_plain_attention_and_float32_agrees():
    q, k, v, w, beta = inputs(T=30, dtype=torch.float32)
    out = path_attention(q, k, v, w, torch.zeros_like(beta), block_size=8)
    assert torch.allclose(out, naive_attention(q, k, v), atol=1e-5)
    ref = path_attention_naive(*(t.double() for t in (q, k, v, w, beta)))
    assert torch.allclose(path_attention(q, k, v, w, beta, block_size=8).double(), ref, atol=1e-4)


def test_module_gates_and_composite_path_forget():
    dims = Dims(n_head=2, head_dim=8, d_model=16, vocab_size=256, train_length=16)
    x = torch.randn(1, 12, 16)
    inp = Inputs(x, torch.arange(12), torch.zeros(1, 12, dtype=torch.long))
    enc = encodings.get("path+forget", dims)
    path, fgate = enc.parts
    w, beta = path.gates(x)
    assert w.shape == (1, 2, 12, 8) and w.dtype == torch.float32
    assert torch.allclose(w.norm(dim=-1), torch.ones(1, 2, 12), atol=1e-5)
    assert bool(((beta > 0) & (beta < 2)).all())
    # causal: w_t does not depend on later inputs
    x2 = x.clone()
    x2[:, 8:] += 1
    assert torch.equal(path.gates(x2)[0][:, :, :8], w[:, :, :8])
    q, k, v = (torch.randn(1, 2, 12, 8) for _ in range(3))
    out = enc.attend(q, k, v, inp)
    ref = path_attention_naive(q, k, v, w, beta, bias=fgate.bias(inp))
    assert torch.allclose(out, ref, atol=1e-5)
    assert not torch.allclose(out, path.attend(q, k, v, inp), atol=1e-3)


def test_composite_rejects_attend_part_with_other_rotation():
    with pytest.raises(PosencError, match="replaces attention"):
        encodings.get("acc-rand-qk+path")


def test_long_input_last_query_matches_key_updates():
    """Many blocks in float32, inference mode (memory: benchmarks/bench_catalogue.py)."""
    T, D, C = 1000, 16, 64
    q, k, v, w, beta = inputs(B=1, H=1, T=T, D=D, dtype=torch.float32)
    with torch.inference_mode():
        out = path_attention(q, k, v, w, beta, block_size=C)
    assert out.shape == (1, 1, T, D) and torch.isfinite(out).all()
    # spot-check the last query against the decode recurrence restricted to it
    i = T - 1
    kk = k[0, 0, : i + 1].double().clone()
    for t in range(1, i + 1):  # apply H_t to keys j < t
        wt, bt = w[0, 0, t].double(), beta[0, 0, t].double()
        kk[:t] -= bt * (kk[:t] @ wt)[:, None] * wt
    a = torch.softmax(kk @ q[0, 0, i].double() / math.sqrt(D), 0)
    assert torch.allclose(out[0, 0, i].double(), a @ v[0, 0, : i + 1].double(), atol=1e-4)


def _decode_both(q, k, v, w, beta, prefill, chunks, every, bias=None):
    """Decode q, k, v after a prefill of ``prefill`` tokens in the given chunk sizes, with the reference
    (``path_step``) and the pending-factor fast path (``path_step_pending``): both outputs, the reference's
    keys after each chunk and the fast path's exact keys after each chunk."""
    from posenc.encodings.base import Buffer
    from posenc.encodings.householder import PendingFactors, path_keys, path_step, path_step_pending

    scale = 1.3 / math.sqrt(q.shape[-1])
    bufs = {}
    for name in ("ref", "fast"):
        keys, values = Buffer(-2), Buffer(-2)
        keys.append(path_keys(k[:, :, :prefill], w[:, :, :prefill], beta[:, :, :prefill], 5))
        values.append(v[:, :, :prefill])
        bufs[name] = (keys, values)
    pending, flushes = PendingFactors(every, prefill), []
    flush = pending.flush
    pending.flush = lambda keys: (flushes.append(keys.length), flush(keys))  # counted
    outs, key_pairs, start = {"ref": [], "fast": []}, [], prefill
    for n in chunks:
        sl = slice(start, start + n)
        args = (q[:, :, sl], k[:, :, sl], v[:, :, sl], w[:, :, sl], beta[:, :, sl])
        outs["ref"].append(path_step(*args, *bufs["ref"], bias, scale))
        outs["fast"].append(path_step_pending(*args, *bufs["fast"], pending, bias, scale))
        key_pairs.append((bufs["ref"][0].value.clone(), pending.exact_keys(bufs["fast"][0])))
        start += n
    return torch.cat(outs["ref"], dim=2), torch.cat(outs["fast"], dim=2), key_pairs, len(flushes)


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize("every, chunks", [(4, [1] * 15), (3, [2, 1, 5, 1, 1, 7]), (1, [1, 3, 1, 4]), (64, [1] * 9)])
def test_pending_factors_decode_equals_the_step_by_step_update(dtype, tol, every, chunks):
    """Token by token and in chunks, across flush boundaries: the outputs and the (exact) cached keys equal
    the rank-one update of every cached key per token."""
    T = 9 + sum(chunks)
    q, k, v, w, beta = inputs(T=T, D=8, dtype=dtype, seed=7)
    ref, fast, key_pairs, flushes = _decode_both(q, k, v, w, beta, 9, chunks, every)
    assert flushes == (sum(chunks) // every)
    assert (ref - fast).abs().max().item() < tol
    for a, b in key_pairs:
        assert a.shape == b.shape and (a - b).abs().max().item() < tol
    full = path_attention_naive(q, k, v, w, beta, logit_scale=1.3)[:, :, 9:].to(ref.dtype)
    assert (fast - full).abs().max().item() < 10 * tol  # and both are the parallel attention's last rows


def test_pending_factors_with_a_forget_bias_and_an_empty_flush_point():
    """A score bias (PaTH-FoX) goes to every row; a prefill of one token leaves one flushed row."""
    q, k, v, w, beta = inputs(T=14, seed=8)
    bias = forget_bias(log_forget_cumsum(torch.randn(2, 3, 14, dtype=torch.float64)), torch.float64)
    ref, fast, _, flushes = _decode_both(q, k, v, w, beta, 1, [1] * 13, 5, bias)
    assert flushes == 2 and (ref - fast).abs().max().item() < 1e-10
    assert (
        fast - path_attention_naive(q, k, v, w, beta, bias=bias, logit_scale=1.3)[:, :, 1:]
    ).abs().max().item() < 1e-10


def test_chunked_with_forget_bias_gradients_equal_naive_including_the_gate():
    """path+forget in float64: values and the gradients to q, k, v, w, beta and the forget-gate logits."""
    q, k, v, w, beta = inputs(T=23, seed=3)
    logits = torch.randn(2, 3, 23, dtype=torch.float64, generator=torch.Generator().manual_seed(4)) + 1
    leaves = [t.requires_grad_(True) for t in (q, k, v, w, beta, logits)]

    def run(fn, **kw):
        out = fn(*leaves[:5], bias=forget_bias(log_forget_cumsum(leaves[5]), torch.float64), logit_scale=0.8, **kw)
        return out, torch.autograd.grad((out * gw).sum(), leaves)

    gw = torch.randn(2, 3, 23, 8, dtype=torch.float64)
    fast, g_fast = run(path_attention, block_size=4)
    ref, g_ref = run(path_attention_naive)
    assert (fast - ref).abs().max().item() < 1e-12
    for name, a, b in zip("q k v w beta gate".split(), g_fast, g_ref):
        assert (a - b).abs().max().item() < 1e-10, name
    assert g_fast[5].abs().max().item() > 1e-3  # the gate does get a gradient


@pytest.mark.parametrize("T,block", [(23, 4), (64, 16), (1, 8)])
def test_inference_buffers_equal_the_autograd_rows(T, block):
    """Without gradients path_attention runs _rows_inference (buffers); with them _rows: the same numbers."""
    q, k, v, w, beta = inputs(T=T, seed=5)
    bias = forget_bias(log_forget_cumsum(torch.randn(2, 3, T, dtype=torch.float64)), torch.float64)
    for b in (None, bias):
        with torch.no_grad():
            fast = path_attention(q, k, v, w, beta, bias=b, block_size=block)
        with_grad = path_attention(q.clone().requires_grad_(True), k, v, w, beta, bias=b, block_size=block)
        assert with_grad.requires_grad
        assert (fast - with_grad).abs().max().item() < 1e-12
        assert (fast - path_attention_naive(q, k, v, w, beta, bias=b)).abs().max().item() < 1e-12


def test_chunk_size_short_and_long_inputs():
    from posenc.encodings.householder import chunk_size

    assert [chunk_size(T, 128) for T in (7, 128, 1024, 4096, 16384)] == [7, 32, 64, 128, 128]
    assert chunk_size(21, 4) == 4 and chunk_size(1, 128) == 1


def test_products_stay_float32_under_bf16_autocast():
    q, k, v, w, beta = inputs(B=1, H=2, T=150, D=16, dtype=torch.float32, seed=6)
    ref = path_attention_naive(*(t.double() for t in (q, k, v, w, beta)))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = path_attention(q, k, v, w, beta, block_size=32)
        keys = path_keys(k, w, beta, 32)
    assert out.dtype == torch.float32 and (out.double() - ref).abs().max().item() < 1e-4  # bf16 products: ~1e-2
    assert (keys - path_keys(k, w, beta, 32)).abs().max().item() < 1e-5


def test_path_plus_forget_model_gradients_use_the_chunked_form():
    """The module's training forward goes through path_attention (chunked) and equals the naive one, float64."""
    dims = Dims(n_head=2, head_dim=8, d_model=16, vocab_size=256, train_length=16)
    torch.manual_seed(1)
    enc = encodings.get("path+forget", dims).double()
    x = torch.randn(1, 40, 16, dtype=torch.float64)
    inp = Inputs(x, torch.arange(40), torch.zeros(1, 40, dtype=torch.long))
    path, fgate = enc.parts
    path.block_size = 8
    q, k, v = (torch.randn(1, 2, 40, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    params = [p for p in enc.parameters()]
    out = enc.attend(q, k, v, inp)
    w, beta = path.gates(x)
    ref = path_attention_naive(q, k, v, w, beta, bias=fgate.bias(inp))
    gw = torch.randn_like(out)
    g_fast = torch.autograd.grad((out * gw).sum(), [q, k, v, *params])
    g_ref = torch.autograd.grad((ref * gw).sum(), [q, k, v, *params])
    assert (out - ref).abs().max().item() < 1e-12
    for a, b in zip(g_fast, g_ref):
        assert (a - b).abs().max().item() < 1e-10


def test_path_fox_matches_flash_linear_attentions_pathfox():
    """flash-linear-attention's PaTH-FoX: softmax((q^T H_i..H_{j+1} k_j + G_i - G_j) / sqrt(D)) v, G = cumsum of the
    log-gates (``parallel_path_attn``). ``path+forget:scaled=true`` gives it; ``path+forget`` adds FoX's unscaled
    gate."""
    from posenc import encodings
    from posenc.encodings.base import Dims
    from posenc.encodings.householder_naive import path_scores_naive

    torch.manual_seed(0)
    dims = Dims(n_head=2, head_dim=16, d_model=32, vocab_size=256, train_length=16)
    x = torch.randn(1, 12, 32, dtype=torch.float64)
    inp = Inputs(x, torch.arange(12))
    q, k, v = (torch.randn(1, 2, 12, 16, dtype=torch.float64) for _ in range(3))
    fox = encodings.get("path+forget:scaled=true", dims).double()
    plain = encodings.get("path+forget", dims).double()
    plain.load_state_dict(fox.state_dict())
    path, gate = fox.parts
    w, beta = path.gates(x)
    G = torch.cumsum(torch.nn.functional.logsigmoid(gate.gate(x).transpose(1, 2)), dim=-1)
    s = path_scores_naive(q, k, w, beta) + G[..., :, None] - G[..., None, :]
    ref = torch.softmax(s / math.sqrt(16), dim=-1) @ v
    torch.testing.assert_close(fox.attend(q, k, v, inp), ref, rtol=0, atol=1e-10)
    fox_unscaled = (
        torch.softmax(path_scores_naive(q, k, w, beta) / math.sqrt(16) + G[..., :, None] - G[..., None, :], dim=-1) @ v
    )
    torch.testing.assert_close(plain.attend(q, k, v, inp), fox_unscaled, rtol=0, atol=1e-10)
