"""Length-scaled attention (SSMax, Qwen's log-n, Llama 4's temperature): values, decoding, GQA, errors."""

import math

import pytest
import torch

from posenc import Attention, encodings
from posenc.encodings.base import Dims, Inputs
from posenc.encodings.lengthscale import length_scaled_naive
from posenc.errors import PosencError
from tests.decoding import assert_grouped_query_decoding_equals_the_parallel_forward

DIMS = Dims(n_head=2, head_dim=8, d_model=16, vocab_size=0, train_length=8)


def qkv(T=20, B=2, H=2, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, T, D, generator=g, dtype=torch.float64) for _ in range(3))


def attend(spec, q, k, v, dims=DIMS):
    enc = encodings.get(spec, dims).double()
    return enc.attend(q, k, v, Inputs(torch.zeros(1, q.shape[-2], dims.d_model), torch.arange(q.shape[-2]))), enc


def test_factors_are_the_published_formulas():
    n = torch.arange(1, 41, dtype=torch.float64)
    ss = encodings.get("ssmax:init=0.3", DIMS)
    assert torch.allclose(ss.factors(n, torch.float64).detach()[0, :, :, 0], 0.3 * n.log().expand(2, -1), atol=1e-7)
    qwen = [math.log(i, 8) if i > 8 else 1 for i in range(1, 41)]  # Qwen-7B's logn_list, seq_length 8
    assert torch.allclose(encodings.get("logn", DIMS).factors(n, torch.float64).flatten(), torch.tensor(qwen).double())
    llama = encodings.get("llama4-temp:floor_scale=4,attn_scale=0.1", DIMS).factors(n, torch.float32).flatten()
    assert llama.dtype == torch.float32
    assert (
        llama[2] == 1
        and llama[3] == pytest.approx(1 + 0.1 * math.log(2))
        and llama[39] == pytest.approx(1 + 0.1 * math.log(11))
    )
    # SSMax's default s = 1 / ln(train_length): the factor is 1 where n is the training length
    assert float(encodings.get("ssmax", DIMS).factors(n, torch.float64).detach()[0, 0, 7, 0]) == pytest.approx(1.0)


@pytest.mark.parametrize("spec", ["ssmax:init=0.5", "logn:base_length=6", "llama4-temp:floor_scale=3,attn_scale=0.5"])
def test_attention_equals_the_naive_reference_and_differs_from_plain_attention(spec):
    q, k, v = qkv()
    out, enc = attend(spec, q, k, v)
    c = enc.factors(torch.arange(1, 21, dtype=torch.float64), torch.float64)[..., 0]
    assert torch.allclose(out, length_scaled_naive(q, k, v, c), atol=1e-12)
    nope = length_scaled_naive(q, k, v, torch.ones(1, 20, dtype=torch.float64))
    assert (out - nope).abs().max() > 1e-3  # the scaling acts


def test_a_composed_bias_is_added_after_the_scaled_content_logit():
    q, k, v = qkv()
    enc = encodings.get("logn:base_length=4+alibi", DIMS).double()
    inp = Inputs(torch.zeros(1, 20, 16), torch.arange(20))
    c = enc.parts[0].factors(torch.arange(1, 21, dtype=torch.float64), torch.float64)[..., 0]
    want = length_scaled_naive(q, k, v, c, bias=enc.bias(inp))
    assert torch.allclose(enc.attend(q, k, v, inp), want, atol=1e-12)


def test_llama4_temperature_equals_transformers_llama4_nope_layer_attention():
    """transformers' Llama4TextAttention on a NoPE layer with attn_temperature_tuning (floor_scale 4 so that the
    factor moves within 24 tokens), eager attention, causal mask: the same output as posenc's layer with its weights."""
    from transformers import Llama4TextConfig
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention

    cfg = Llama4TextConfig(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_hidden_layers=1,
        no_rope_layers=[0],
        attn_temperature_tuning=True,
        floor_scale=4,
        attn_scale=0.1,
        attention_bias=False,
    )
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    ref = Llama4TextAttention(cfg, 0).double().eval()
    assert not ref.use_rope
    ours = Attention(32, 4, "llama4-temp:floor_scale=4,attn_scale=0.1", n_kv_head=2).double().eval()
    with torch.no_grad():
        ours.qkv.weight.copy_(torch.cat((ref.q_proj.weight, ref.k_proj.weight, ref.v_proj.weight)))
        ours.proj.weight.copy_(ref.o_proj.weight)
        x, T = torch.randn(2, 24, 32, dtype=torch.float64), 24
        mask = torch.full((T, T), -math.inf, dtype=torch.float64).triu(1)[None, None]
        want, _ = ref(x, position_embeddings=None, attention_mask=mask)
        got = ours(x)
        assert (got - want).abs().max() < 1e-7  # transformers takes the factors in float32, posenc in float64
        plain = Attention(32, 4, "nope", n_kv_head=2).double().eval()
        plain.load_state_dict(ours.state_dict(), strict=False)
        assert (plain(x) - want).abs().max() > 1e-4  # the temperature acts in this range


@pytest.mark.parametrize("spec", ["ssmax:init=0.5", "logn:base_length=4", "llama4-temp:floor_scale=3,attn_scale=0.5"])
def test_grouped_query_decoding_equals_the_parallel_forward(spec):
    assert_grouped_query_decoding_equals_the_parallel_forward(spec)


def test_ssmax_learns_its_per_head_scale():
    layer = Attention(16, 2, "ssmax", train_length=8)
    layer(torch.randn(1, 12, 16)).square().sum().backward()
    assert layer.enc.s.grad is not None and layer.enc.s.grad.shape == (2,) and layer.enc.s.grad.abs().min() > 0


@pytest.mark.parametrize(
    "spec,dims,message",
    [
        ("ssmax:init=0", DIMS, "ssmax: init must be a number in (0, 10], got 0"),
        ("ssmax", Dims(2, 8, 16, 0, 1), "needs train_length >= 2; give init"),
        ("logn:base_length=1", DIMS, "logn: base_length must be an integer >= 2, got 1"),
        ("logn:base_length=2.5", DIMS, "base_length=2.5: expected int"),
        ("llama4-temp:floor_scale=0", DIMS, "floor_scale must be an integer >= 1, got 0"),
        ("llama4-temp:attn_scale=-1", DIMS, "attn_scale must be a number in [0, 10], got -1"),
    ],
)
def test_bad_settings_are_one_line_errors(spec, dims, message):
    with pytest.raises(PosencError) as err:
        encodings.get(spec, dims)
    assert message in str(err.value) and "\n" not in str(err.value)
