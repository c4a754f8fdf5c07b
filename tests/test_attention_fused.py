"""The fused path of separable score biases (``posenc.attention.fused_separable``) against the full matrix and the
tile path: values (no grad, many query blocks), values and gradients (T <= block, one SDPA call), when it is taken,
and its float32 precision at 64K tokens for ALiBi (slope 0.5) and a strongly forgetting gate."""

import math

import pytest
import torch

from posenc import encodings
from posenc.attention import Bias, attention, causal_tile, fusable, fused_separable, naive_attention, toeplitz_causal
from posenc.encodings.base import Dims, Inputs
from posenc.encodings.bias import alibi_slopes, distance_bias
from posenc.encodings.composite import sum_biases
from posenc.encodings.forget import forget_bias, forget_bias_naive, log_forget_cumsum

DIMS = Dims(n_head=3, head_dim=8, d_model=24, vocab_size=256, train_length=16)


def biases(T: int, dtype=torch.float64, B: int = 2) -> dict:
    """ALiBi, a forget gate (random gates: strong and weak forgetting) and their sum, all separable; T5 (8 buckets,
    separable beyond distance 20) alone and with them."""
    lam = log_forget_cumsum(2 * torch.randn(B, DIMS.n_head, T, dtype=dtype))
    alibi, forget = distance_bias(alibi_slopes(DIMS.n_head), torch.arange(T), dtype), forget_bias(lam, dtype)
    t5 = encodings.get("t5:num_buckets=8,max_distance=20", DIMS).to(dtype)
    torch.nn.init.normal_(t5.table)
    t5 = t5.bias(Inputs(torch.zeros(1, T, 24, dtype=dtype), torch.arange(T)))
    return {
        "alibi": alibi,
        "forget": forget,
        "alibi+forget": sum_biases([alibi, forget]),
        "t5": t5,
        "t5+forget": sum_biases([t5, forget]),
        "alibi+t5+forget": sum_biases([alibi, t5, forget]),
    }


def test_a_sum_of_biases_carries_the_forms_every_part_allows():
    """Pointwise ``at`` and separable ``keys`` where every part has them; ``far`` where each part has ``keys`` or
    ``far`` and some lack ``keys``; ``toeplitz`` only alone (T5), as a sum is not dispatched to the Toeplitz path.
    The sum's tiles are the parts' tiles summed."""
    b = biases(20)
    forms = {
        name: [form for form in ("at", "keys", "far", "toeplitz") if getattr(bias, form) is not None]
        for name, bias in b.items()
    }
    assert forms == {
        "alibi": ["at", "keys"],
        "forget": ["at", "keys"],
        "alibi+forget": ["at", "keys"],
        "t5": ["far", "toeplitz"],
        "t5+forget": ["far"],
        "alibi+t5+forget": ["far"],
    }
    parts = b["alibi"].tile(3, 9, 2, 8) + b["t5"].tile(3, 9, 2, 8) + b["forget"].tile(3, 9, 2, 8)
    assert torch.allclose(b["alibi+t5+forget"].tile(3, 9, 2, 8), parts, atol=1e-12, rtol=0)


def untiled(bias):
    """The same tiles without the separable form: the tile path's bias."""
    return Bias(bias.tile)


@pytest.mark.parametrize("name", ["alibi", "forget", "alibi+forget", "t5", "t5+forget", "alibi+t5+forget"])
@pytest.mark.parametrize("block", [1, 7, 64])
def test_fused_values_equal_full_matrix_over_many_blocks(name, block):
    T = 70
    bias = biases(T)[name]
    q, k, v = (torch.randn(2, DIMS.n_head, T, 8, dtype=torch.float64) for _ in range(3))
    with torch.no_grad():
        assert fusable(q, bias, block)
        fast = attention(q, k, v, bias=bias, block_size=block)
        ref = naive_attention(q, k, v, bias=bias)
        fused = fused_separable(q, k, v, bias, 1 / math.sqrt(8), block)
        if bias.toeplitz is not None:  # T5 alone is a bias of the distance only: the toeplitz path is taken
            assert torch.equal(fast, toeplitz_causal(q, k, v, bias.toeplitz(T), 1 / math.sqrt(8), block))
        else:
            assert torch.equal(fast, fused)  # the path attention took
    assert torch.allclose(fast, ref, atol=1e-12, rtol=0)
    assert torch.allclose(fused, ref, atol=1e-12, rtol=0)


def test_fused_values_with_wider_values_and_logit_scale():
    """Dv > Dk + 1 (the kernel's common width is v's) and a logit scale: the extra feature divides it out."""
    T = 40
    bias = biases(T, B=1)["alibi+forget"]
    q, k, v = (
        torch.randn(1, 3, T, 4, dtype=torch.float64),
        torch.randn(1, 3, T, 4, dtype=torch.float64),
        torch.randn(1, 3, T, 12, dtype=torch.float64),
    )
    with torch.no_grad():
        fast = attention(q, k, v, bias=bias, logit_scale=1.7, block_size=16)
    assert torch.allclose(fast, naive_attention(q, k, v, bias=bias, logit_scale=1.7), atol=1e-12, rtol=0)


@pytest.mark.parametrize("spec", ["forget", "alibi+forget", "hybrid", "rope+forget", "forget:scaled=true"])
def test_fused_training_forward_gradients_equal_tile_path(spec):
    """With grad enabled and T <= block the fused path is one causal SDPA call: autograd reaches q, k, v, the gate
    weights and the rotary part's learned steps as through the tile path (itself tested against the full matrix)."""
    torch.manual_seed(0)
    enc = encodings.get(spec, DIMS).double()
    for p in enc.parameters():
        torch.nn.init.normal_(p, std=0.5)
    T = 33
    inp = Inputs(torch.randn(2, T, 24, dtype=torch.float64), torch.arange(T), torch.zeros(2, T, dtype=torch.long))
    q, k, v = (torch.randn(2, 3, T, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    leaves = (q, k, v, *enc.parameters())
    outs, grads = [], []
    for block, fn in ((64, lambda b: b), (8, untiled)):  # fused (one call), then tiles over 5 query blocks
        bias = enc.bias(inp)
        assert fusable(q, fn(bias), block) == (block == 64)
        out = attention(
            q,
            k,
            v,
            bias=fn(bias),
            phases=enc.phases(inp),
            rotate_v=enc.rotate_v,
            logit_scale=enc.logit_scale,
            block_size=block,
        )
        outs.append(out)
        grads.append(torch.autograd.grad((out * torch.linspace(-1, 1, 8, dtype=torch.float64)).sum(), leaves))
    assert torch.allclose(*outs, atol=1e-12, rtol=0)
    assert len(grads[0]) > 3 and all(g.abs().max() > 0 for g in grads[0])
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-10, rtol=0)


def test_fused_gate_gradients_equal_explicit_products():
    """The fused call against the full matrix of the explicit gate products (``forget_bias_naive``)."""
    T = 20
    logits = torch.randn(1, 2, T, dtype=torch.float64, requires_grad=True)
    q, k, v = (torch.randn(1, 2, T, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    fast = attention(q, k, v, bias=forget_bias(log_forget_cumsum(logits), torch.float64))
    ref_bias = forget_bias_naive(logits)
    ref = naive_attention(q, k, v, bias=Bias(lambda *a: ref_bias.clone()))
    assert torch.allclose(fast, ref, atol=1e-12)
    for a, b in zip(
        torch.autograd.grad(fast.sum(), (q, k, v, logits)), torch.autograd.grad(ref.sum(), (q, k, v, logits))
    ):
        assert torch.allclose(a, b, atol=1e-10)


def test_when_the_fused_path_is_taken():
    bias = biases(10)["forget"]
    q = torch.zeros(1, 3, 10, 8)
    assert fusable(q, bias, 10) and not fusable(q, bias, 9)  # grad enabled: one block only
    with torch.no_grad():
        assert fusable(q, bias, 2)
        assert not fusable(q, untiled(bias), 2) and not fusable(q, None, 2)
        with torch.autocast("cpu", dtype=torch.bfloat16):  # the key term must not reach a bf16 kernel
            assert not fusable(q, bias, 2)
    t5, kerple = (
        encodings.get(s, DIMS).bias(Inputs(torch.zeros(1, 10, 24), torch.arange(10))) for s in ("t5", "kerple")
    )
    with torch.no_grad():  # T5: separable on far keys only, so without grad
        assert fusable(q, t5, 2) and fusable(q, sum_biases([bias, t5]), 2)
        assert not fusable(q, kerple, 2) and not fusable(q, sum_biases([bias, kerple]), 2)  # not separable: tiles
    assert not fusable(q, t5, 10) and not fusable(q, sum_biases([bias, t5]), 10)


def test_autocast_forward_is_the_tile_path():
    T = 50
    bias = biases(T, torch.float32)["alibi+forget"]
    q, k, v = (torch.randn(2, 3, T, 8) for _ in range(3))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(
            attention(q, k, v, bias=bias, block_size=16), attention(q, k, v, bias=untiled(bias), block_size=16)
        )


@pytest.mark.slow
@pytest.mark.parametrize("name", ["alibi", "forget"])
def test_fused_float32_precision_at_64k_tokens(name):
    """T = 65,536, one head of 8 features, float32: the fused forward's last 64 rows equal the tile path's (its
    last query block, a cache's last 512 rows) to 1e-6, and both a float64 reference of those rows (its (64 x T)
    tile; no larger tensor) to 5e-5 (measured: 2.6e-7 and 3.4e-5). ALiBi with slope 0.5 (far keys at -32,768);
    a gate with log f ~ -1.6 per token on average, Lambda ~ -1e5 at the end (float32 would resolve it to 0.008):
    its error is that of the tiles' float32 offsets within a block of 512 queries."""
    T, rows = 65_536, 64
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, T, 8, generator=g) for _ in range(3))
    if name == "alibi":

        def make(dtype):
            return distance_bias(torch.tensor([0.5], dtype=torch.float64), torch.arange(T), dtype)
    else:
        lam = log_forget_cumsum(4 * torch.randn(1, 1, T, generator=g, dtype=torch.float64))

        def make(dtype):
            return forget_bias(lam, dtype)

    with torch.no_grad():
        fast = attention(q, k, v, bias=make(torch.float32))[..., -rows:, :]
        qs = T - rows
        q64, k64, v64 = (t.double() for t in (q, k, v))
        scores = q64[..., qs:, :] @ k64.transpose(-1, -2) / 8**0.5 + causal_tile(
            make(torch.float64), qs, T, T, "cpu", torch.float64
        )
        ref = torch.softmax(scores, dim=-1) @ v64
        tiles = attention(q[..., -512:, :], k, v, bias=make(torch.float32))[
            ..., -rows:, :
        ]  # the tile path's last block
    assert (fast - tiles).abs().max() < 1e-6
    assert (fast.double() - ref).abs().max() < 5e-5 and (tiles.double() - ref).abs().max() < 5e-5


@pytest.mark.parametrize("spec", ["alibi", "hybrid", "rope+forget", "t5", "alibi+forget"])
def test_model_evaluation_forward_equals_the_tile_path(spec):
    """An LM (grouped-query attention, value rotation in the hybrid) through the layers: the evaluation forward
    (no grad: fused) equals the forward with grad enabled over several query blocks (the tile path)."""
    from posenc import build_model

    torch.manual_seed(0)
    model = build_model(
        {"encoding": spec, "n_layer": 2, "d_model": 32, "n_head": 4, "n_kv_head": 2, "attn_block_size": 16}
    ).double()
    for p in model.parameters():  # learned biases and gates away from their neutral starts
        torch.nn.init.normal_(p, std=0.3)
    tokens = torch.randint(0, 256, (2, 53))
    with torch.no_grad():
        fast = model(tokens)
    torch.testing.assert_close(fast, model(tokens).detach(), atol=1e-10, rtol=0)
