"""The evaluation fast path of posenc.methods.method_attention (the CPU flash kernel on each query block's runs of
uniform keys, the kernel with a mask on the rest, merged by log-sum-exp) against the explicit path and the T x T
reference: prefill and decoding shapes, RoPE in both pairings, no RoPE, value widths, NaN; and the claim that
lets the kernel run unmasked (a uniform key has one region and is visible for every query of the block)."""

import math

import pytest
import torch

from posenc.methods import (
    Method,
    block_keys,
    fast_applies,
    fast_query_blocks,
    key_runs,
    method_attention,
    naive_method_attention,
    parse,
    scheme_args,
    uniform_regions,
)
from posenc.model import LM, ModelConfig
from posenc.rope import rope_inv_freq

# windows below and above the block sizes used (16, 32), group 1/2/4, n_global / n_sink 0 and > 0, chunks
# below and above the block, a local window past the chunk
METHODS = [
    Method("self-extend", window=5, group=1),
    Method("self-extend", window=7, group=4),
    Method("self-extend", window=40, group=2),
    Method("self-extend", window=100, group=4),
    Method("lm-infinite", window=5, n_global=0),
    Method("lm-infinite", window=9, n_global=3),
    Method("lm-infinite", window=50, n_global=2),
    Method("sinks", window=6, n_sink=0),
    Method("sinks", window=12, n_sink=4),
    Method("sinks", window=40, n_sink=1),
    parse("dual-chunk:chunk=5,local=2", 8),
    parse("dual-chunk:chunk=16,local=0", 8),
    parse("dual-chunk:chunk=40,local=8", 8),
    parse("dual-chunk:chunk=24,local=30", 8),
]
TOL = {torch.float64: {"rtol": 1e-10, "atol": 1e-10}, torch.float32: {"rtol": 1e-5, "atol": 1e-5}}


def _qkv(Tq, Tk, D, dtype, seed=0, Dv=None):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 3, Tq, D, generator=g, dtype=dtype)
    k = torch.randn(2, 3, Tk, D, generator=g, dtype=dtype)
    return q, k, torch.randn(2, 3, Tk, Dv or D, generator=g, dtype=dtype)


def _rope(variant, D):
    """RoPE arguments: posenc's frequencies with half pairing, or random positive ones on half the features
    (partial rotary) with adjacent pairing, or none."""
    if variant == "half":
        return {"inv_freq": rope_inv_freq(D, 10000.0), "pairing": "half"}
    if variant == "adjacent-partial":
        g = torch.Generator().manual_seed(D)
        return {"inv_freq": torch.rand(D // 4, generator=g, dtype=torch.float64) * 1.5 + 0.01, "pairing": "adjacent"}
    return {}


def _three_ways(q, k, v, q_pos, k_pos, method, block_size, **kw):
    """(method_attention under no_grad (the fast path), the explicit path under no_grad, method_attention with
    grad enabled)."""
    with torch.no_grad():
        assert fast_applies(q, k, v, None)
        fast = method_attention(q, k, v, q_pos, k_pos, method, block_size=block_size, **kw)
        explicit = method_attention(q, k, v, q_pos, k_pos, method, block_size=block_size, fast=False, **kw)
    with torch.enable_grad():
        grad_mode = method_attention(q, k, v, q_pos, k_pos, method, block_size=block_size, **kw)
    return fast, explicit, grad_mode


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("T", [1, 2, 61, pytest.param(300, marks=pytest.mark.slow)])
@pytest.mark.parametrize("n", range(len(METHODS)), ids=lambda n: METHODS[n].label())
def test_prefill_fast_equals_explicit_and_naive(n, T, dtype):
    method = METHODS[n]
    # the head size, block size and RoPE variant rotate with the case, so each meets every method
    D, block, variant = (8, 16, "half") if (n + T) % 2 else (16, 32, "adjacent-partial")
    q, k, v = _qkv(T, T, D, dtype, seed=n)
    pos, kw = torch.arange(T), _rope(variant, D)
    fast, explicit, grad_mode = _three_ways(q, k, v, pos, pos, method, block, **kw)
    assert fast.dtype == dtype and fast.shape == (2, 3, T, D)
    torch.testing.assert_close(fast, explicit, **TOL[dtype])
    assert torch.equal(grad_mode, explicit)  # with grad enabled: the explicit path, unchanged
    ref = naive_method_attention(q.double(), k.double(), v.double(), pos, pos, method, **kw)
    torch.testing.assert_close(fast.double(), ref, **TOL[dtype])


@pytest.mark.parametrize("n", range(len(METHODS)), ids=lambda n: METHODS[n].label())
def test_fast_without_rope_equals_naive(n):
    q, k, v = _qkv(97, 97, 8, torch.float64, seed=n)
    pos = torch.arange(97)
    fast, explicit, _ = _three_ways(q, k, v, pos, pos, METHODS[n], 16)
    torch.testing.assert_close(fast, explicit, **TOL[torch.float64])
    torch.testing.assert_close(fast, naive_method_attention(q, k, v, pos, pos, METHODS[n]), **TOL[torch.float64])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("Tq", [1, 5, 40])
@pytest.mark.parametrize("n", range(len(METHODS)), ids=lambda n: METHODS[n].label())
def test_decoding_rows_fast_equal_explicit_and_the_full_rows(n, Tq, dtype):
    """Tq < Tk, the queries the last positions (a cache's new rows): the fast path equals the explicit one and
    the last Tq rows of the full T x T reference."""
    method, Tk, D = METHODS[n], 130, 16
    q, k, v = _qkv(Tk, Tk, D, dtype, seed=10 + n)
    pos, kw = torch.arange(Tk), _rope("half" if Tq % 2 else "adjacent-partial", D)
    rows = slice(Tk - Tq, Tk)
    fast, explicit, grad_mode = _three_ways(q[..., rows, :], k, v, pos[rows], pos, method, 16, **kw)
    torch.testing.assert_close(fast, explicit, **TOL[dtype])
    assert torch.equal(grad_mode, explicit)
    ref = naive_method_attention(q.double(), k.double(), v.double(), pos, pos, method, **kw)[..., rows, :]
    torch.testing.assert_close(fast.double(), ref, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("n_sink, W, n_new", [(4, 12, 1), (4, 12, 7), (0, 6, 3), (2, 40, 20), (3, 9, 9)])
def test_sinks_decoding_over_the_kept_keys_only(n_sink, W, n_new, dtype):
    """A bounded cache after eviction: the keys 0..n_sink-1 and the last W before the n_new new rows, then the new
    rows' keys; non-contiguous k_pos. The fast path equals the explicit one on these keys and the rows of the
    full reference over every key."""
    method, T, D = Method("sinks", window=W, n_sink=n_sink), 150, 8
    q, k, v = _qkv(T, T, D, dtype, seed=W)
    past = T - n_new  # the cache held positions < past
    kept = torch.cat((torch.arange(n_sink), torch.arange(past - W, T)))
    rows, kw = torch.arange(past, T), _rope("half", D)
    args = (q[..., rows, :], k[..., kept, :], v[..., kept, :], rows, kept, method)
    fast, explicit, _ = _three_ways(*args, 4, **kw)
    torch.testing.assert_close(fast, explicit, **TOL[dtype])
    ref = naive_method_attention(q.double(), k.double(), v.double(), torch.arange(T), torch.arange(T), method, **kw)
    torch.testing.assert_close(fast.double(), ref[..., rows, :], **TOL[dtype])


@pytest.mark.parametrize("Dv", [4, 8, 24])
@pytest.mark.parametrize("n", [1, 6, 9, 12], ids=lambda n: METHODS[n].label())
def test_values_of_another_width(n, Dv):
    """Dv != D: the kernel's q, k or v widened with zero features."""
    q, k, v = _qkv(70, 70, 8, torch.float64, seed=n, Dv=Dv)
    pos = torch.arange(70)
    fast, explicit, _ = _three_ways(q, k, v, pos, pos, METHODS[n], 16, **_rope("half", 8))
    assert fast.shape == (2, 3, 70, Dv)
    torch.testing.assert_close(fast, explicit, **TOL[torch.float64])


@pytest.mark.parametrize("n", [2, 6, 9, 12], ids=lambda n: METHODS[n].label())
def test_nan_reaches_the_same_rows(n):
    """A NaN in a query row, or in a key, makes NaN exactly the rows the explicit path makes NaN (the kernel alone
    would write 0 for a row whose scores are all NaN), the other rows unchanged."""
    q, k, v = _qkv(90, 90, 8, torch.float64, seed=n)
    q[0, 1, 50, 3] = math.nan  # a query row
    k[1, 2, 20, 0] = math.nan  # a key that a uniform run carries
    k[0, 0, 71, 2] = math.nan
    pos = torch.arange(90)
    fast, explicit, _ = _three_ways(q, k, v, pos, pos, METHODS[n], 16, **_rope("half", 8))
    assert torch.equal(fast.isnan(), explicit.isnan()) and bool(explicit.isnan().any())
    torch.testing.assert_close(fast.nan_to_num(7.0), explicit.nan_to_num(7.0), **TOL[torch.float64])


def test_one_query_nan_reaches_its_row_with_no_explicit_part():
    """One query (decoding): every key of it is uniform, no explicit part; its NaN still comes through."""
    q, k, v = _qkv(1, 40, 8, torch.float64)
    q[0, 0, 0, 0] = math.nan
    method, pos = Method("self-extend", window=8, group=2), torch.arange(40)
    with torch.no_grad():
        out = method_attention(q, k, v, pos[-1:], pos, method, block_size=16, **_rope("half", 8))
    assert bool(out[0, 0].isnan().all()) and not bool(out[1:].isnan().any()) and not bool(out[0, 1:].isnan().any())


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.label())
def test_uniform_keys_have_one_region_and_are_seen_across_the_block(method):
    """The claim behind the unmasked kernel (``uniform_regions``), checked at every query position of each block:
    a uniform key's region is the same for all of them, and all of them see it; a key left to the explicit part
    changes region or is hidden at one end of the block."""
    k_pos = torch.arange(200)
    for lo in range(0, 200, 3):
        for hi in (lo, min(lo + 5, 199), min(lo + 16, 199), min(lo + 45, 199)):
            keys = block_keys(method, k_pos, lo, hi)
            j = k_pos[keys][None, :]
            label = uniform_regions(method, j[0], lo, hi)
            i = torch.arange(lo, hi + 1)[:, None]
            region, seen = method.region(i, j), method.visible(i, j)
            uniform = label >= 0
            assert bool((region[:, uniform] == label[uniform]).all()) and bool(seen[:, uniform].all())
            ends = region[[0, -1]][:, ~uniform], seen[[0, -1]][:, ~uniform]
            assert bool(((ends[0][0] != ends[0][1]) | ~ends[1].all(0)).all())


def test_key_runs_are_maximal_and_contiguous_in_k():
    keys = torch.tensor([0, 1, 2, 3, 4, 9, 10, 11, 12, 13, 14])
    label = torch.tensor([1, 1, -1, 0, 0, 0, 0, 2, 2, -1, 0])
    assert key_runs(label, keys) == [(1, 0, 2), (0, 3, 5), (0, 9, 11), (2, 11, 13), (0, 14, 15)]
    assert key_runs(label[:0], keys[:0]) == []


@pytest.mark.parametrize("S, block", [(5, 16), (40, 16), (16, 16), (7, 3)])
def test_dual_chunk_query_blocks_end_at_chunk_boundaries(S, block):
    q_pos = torch.arange(3, 120)
    blocks = fast_query_blocks(parse(f"dual-chunk:chunk={S},local=1", 8), q_pos, block)
    assert blocks[0][0] == 0 and blocks[-1][1] == len(q_pos)
    assert all(b0[1] == b1[0] for b0, b1 in zip(blocks, blocks[1:]))
    assert all(0 < b - a <= block and len(set((q_pos[a:b] // S).tolist())) == 1 for a, b in blocks)
    assert all(a % block == 0 or int(q_pos[a]) % S == 0 for a, _ in blocks)  # cut nowhere else


def test_fast_applies_only_in_evaluation_on_cpu_float():
    q, k, v = _qkv(4, 4, 8, torch.float32)
    with torch.no_grad():
        assert fast_applies(q, k, v, None) and fast_applies(q.double(), k.double(), v.double(), None)
        assert fast_applies(q.bfloat16(), k.bfloat16(), v.bfloat16(), None)  # a bf16 model's evaluation
        assert not fast_applies(q, k, v, lambda pos: None)  # a score bias
        assert not fast_applies(q.half(), k.half(), v.half(), None)
        assert not fast_applies(q, k, v.double(), None)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert not fast_applies(q, k, v, None)
    assert not fast_applies(q, k, v, None)  # grad enabled, even without requires_grad


def _bias_of(scheme):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=32, n_layer=1, n_head=3, d_model=24, train_length=8, encoding=scheme)
    enc = LM(cfg).double().blocks[0].attn.enc
    with torch.no_grad():
        for p in enc.parameters():
            p.normal_()
    return scheme_args(enc, METHODS[0], torch.zeros(1, 1, 24, dtype=torch.float64))


@pytest.mark.parametrize("scheme", ["alibi", "t5", "kerple"])
def test_bias_schemes_keep_the_explicit_path_in_evaluation(scheme):
    kw = _bias_of(scheme)
    q, k, v = _qkv(60, 60, 8, torch.float64)
    pos, method = torch.arange(60), METHODS[2]
    with torch.no_grad():
        out = method_attention(q, k, v, pos, pos, method, block_size=16, **kw)
        explicit = method_attention(q, k, v, pos, pos, method, block_size=16, fast=False, **kw)
        with pytest.raises(ValueError, match="takes no score bias"):
            method_attention(q, k, v, pos, pos, method, block_size=16, fast=True, **kw)
    assert torch.equal(out, explicit)
    torch.testing.assert_close(out, naive_method_attention(q, k, v, pos, pos, method, **kw))


@pytest.mark.parametrize("n", range(len(METHODS)), ids=lambda n: METHODS[n].label())
def test_bf16_fast_path_is_as_accurate_as_the_explicit_path_in_bf16(n):
    """bfloat16 q, k, v (a bf16 model's evaluation): q and k rotate in bfloat16 (float32 angles), as a bf16 model's
    native attention does, the kernel runs in bfloat16 on uniform keys, the masked rest and the merge in float32.
    Against the explicit path in float32 on the same (bf16-valued) inputs, its error is no larger than the explicit
    path's run in bfloat16 (mean; max within 10%), and bfloat16-sized (> 0: the kernel did run in bf16)."""
    method, T, D = METHODS[n], 150, 16
    q, k, v = (t.bfloat16() for t in _qkv(T, T, D, torch.float32, seed=30 + n))
    pos, kw = torch.arange(T), _rope("half", D)
    with torch.no_grad():
        fast = method_attention(q, k, v, pos, pos, method, block_size=32, **kw)
        bf16 = method_attention(q, k, v, pos, pos, method, block_size=32, fast=False, **kw)
        exact = method_attention(q.float(), k.float(), v.float(), pos, pos, method, block_size=32, fast=False, **kw)
    err, err16 = (fast.float() - exact).abs(), (bf16.float() - exact).abs()
    assert fast.dtype == torch.bfloat16 and 0 < err.max() < 0.03
    assert err.mean() <= err16.mean() and err.max() <= 1.1 * err16.max()
