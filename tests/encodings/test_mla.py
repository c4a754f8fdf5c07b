"""MLA's decoupled RoPE (``mla``): its naive reference, transformers' DeepSeek-V3 attention, decoding, bad input."""

import math

import pytest
import torch

from posenc import Attention, encodings
from posenc.attention import Bias
from posenc.encodings.base import Dims, Inputs
from posenc.encodings.mla import MLA, default_rope_dim, mla_naive, mla_phases
from posenc.errors import PosencError
from tests.decoding import assert_grouped_query_decoding_equals_the_parallel_forward


def test_the_default_rotary_dim_is_deepseeks_third_of_the_head():
    assert default_rope_dim(192) == 64  # DeepSeek-V2/V3: qk_rope_head_dim 64 of 192
    assert [default_rope_dim(d) for d in (4, 8, 16, 32, 64)] == [2, 2, 6, 10, 22]
    assert encodings.get("mla", Dims(4, 32, 128, 0, 16)).rope_dim == 10


@pytest.mark.parametrize("pairing", ["half", "adjacent"])
def test_mla_equals_its_definition_with_a_bias(pairing):
    """The fast path (one attention-core call over [k_nope, R k_rope]) equals the two parts of the score summed in
    float64, with a composed bias and a logit scale; the last r features of the layer's keys are never read."""
    torch.manual_seed(0)
    dims = Dims(n_head=3, head_dim=12, d_model=24, vocab_size=0, train_length=8)
    enc = encodings.get(f"mla:rope_dim=4,pairing={pairing}", dims).double()
    enc.logit_scale = 1.3
    B, T = 2, 11
    q, k, v = (torch.randn(B, 3, T, 12, dtype=torch.float64) for _ in range(3))
    inp = Inputs(torch.randn(B, T, 24, dtype=torch.float64), torch.arange(T) + 5)
    slope = torch.tensor([0.5, 0.25, 0.125], dtype=torch.float64)[None, :, None, None]

    bias = Bias(lambda qs, qe, ks, ke: -slope * (torch.arange(qs, qe)[:, None] - torch.arange(ks, ke)).abs().double())

    out = enc.attend(q, k, v, inp, bias)
    ref = mla_naive(q, k, v, enc.rope_key(inp.x), mla_phases(inp.pos, enc.inv_freq, q.dtype), pairing, bias, 1.3)
    assert torch.allclose(out, ref, atol=1e-12)
    k_other = torch.cat((k[..., :8], torch.randn(B, 3, T, 4, dtype=torch.float64)), dim=-1)
    assert torch.equal(enc.attend(q, k_other, v, inp, bias), out)
    assert torch.allclose(enc.attend(q, k, v, Inputs(inp.x, torch.arange(T)), bias), out, atol=1e-12)  # relative
    assert not torch.allclose(enc.attend(q, k, v, Inputs(inp.x, 2 * torch.arange(T)), bias), out)  # distances count
    no_nope = mla_naive(q, torch.zeros_like(k), v, enc.rope_key(inp.x), mla_phases(inp.pos, enc.inv_freq, q.dtype))
    assert not torch.allclose(out, no_nope, atol=1e-3)  # the position-free part counts too


def test_mla_equals_transformers_deepseek_v3_attention():
    """transformers' DeepseekV3Attention (MLA, rope_interleave: DeepSeek's adjacent pairs) on a tiny random config:
    our ``attend`` given its q (q_proj), its per-head k_nope and v (kv_b_proj of the normalised latent), and its
    shared-key rows of kv_a_proj_with_mqa as ``rope_key``, equals its eager attention output (o_proj's input) to
    1e-5 in float32: the rotation of q_rot and of the shared k_rot by position, the sum of both parts and the
    softmax scale qk_head_dim^-0.5. (Its low-rank latent feeds k_nope and v here; posenc's layer projects them
    directly, so the layer's weights are not copied.)"""
    from transformers.models.deepseek_v3 import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3RotaryEmbedding

    torch.manual_seed(0)
    H, nope, r, lora, d_model, T = 4, 8, 8, 12, 32, 10
    cfg = DeepseekV3Config(
        hidden_size=d_model,
        num_attention_heads=H,
        num_key_value_heads=H,
        q_lora_rank=None,
        kv_lora_rank=lora,
        qk_nope_head_dim=nope,
        qk_rope_head_dim=r,
        v_head_dim=nope + r,
        rope_interleave=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        attn_implementation="eager",
    )
    attn = DeepseekV3Attention(cfg, layer_idx=0).eval()
    for p in attn.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(2, T, d_model)
    pos = torch.arange(T)[None]
    mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
    seen = {}
    attn.o_proj.register_forward_pre_hook(lambda m, args: seen.update(out=args[0]))
    with torch.no_grad():
        attn(x, DeepseekV3RotaryEmbedding(cfg)(x, pos), mask)
        q = attn.q_proj(x).view(2, T, H, nope + r).transpose(1, 2)
        latent, _ = attn.kv_a_proj_with_mqa(x).split((lora, r), dim=-1)
        kv = attn.kv_b_proj(attn.kv_a_layernorm(latent)).view(2, T, H, 2 * nope + r).transpose(1, 2)
        k_nope, v = kv.split((nope, nope + r), dim=-1)
        k = torch.cat((k_nope, torch.randn(2, H, T, r)), dim=-1)  # the layer's last r key features: not read
        enc = MLA(Dims(H, nope + r, d_model, 0, T), rope_dim=r, pairing="adjacent")
        enc.rope_key.weight.copy_(attn.kv_a_proj_with_mqa.weight[lora:])
        ours = enc.attend(q, k, v, Inputs(x, torch.arange(T)))
    theirs = seen["out"].view(2, T, H, nope + r).transpose(1, 2)
    assert attn.scaling == pytest.approx((nope + r) ** -0.5)
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=0)
    half = MLA(Dims(H, nope + r, d_model, 0, T), rope_dim=r, pairing="half")
    half.rope_key.load_state_dict(enc.rope_key.state_dict())
    with torch.no_grad():
        assert not torch.allclose(half.attend(q, k, v, Inputs(x, torch.arange(T))), theirs, atol=1e-3)


@pytest.mark.parametrize("spec", ["mla", "mla:rope_dim=8,pairing=adjacent", "mla+alibi"])
def test_grouped_query_decoding_equals_the_parallel_forward(spec):
    assert_grouped_query_decoding_equals_the_parallel_forward(spec)


def test_mla_trains_its_shared_key_and_leaves_the_layers_rotary_key_features_idle():
    torch.manual_seed(0)
    layer = Attention(32, 4, "mla:rope_dim=4", n_kv_head=2)
    layer(torch.randn(2, 6, 32)).square().sum().backward()
    assert layer.enc.rope_key.weight.grad.abs().sum() > 0
    k_rows = layer.qkv.weight.grad[4 * 8 : 6 * 8].view(2, 8, 32)  # the two key heads' rows
    assert k_rows[:, :4].abs().sum() > 0 and torch.equal(k_rows[:, 4:], torch.zeros(2, 4, 32))


@pytest.mark.parametrize(
    "params, message",
    [
        ({"rope_dim": 3}, r"rope_dim must be an even number in \[2, head dim 8\] \(an even head dim\), got 3$"),
        ({"rope_dim": 0}, r"got 0$"),
        ({"rope_dim": 10}, r"got 10$"),
        ({"pairing": "interleaved"}, r"mla: pairing must be 'half' or 'adjacent', got 'interleaved'$"),
        ({"rope_theta": 1.0}, r"rope_theta must be a finite number > 1, got 1.0$"),
    ],
)
def test_bad_parameters_are_one_line(params, message):
    with pytest.raises(PosencError, match=message) as err:
        Attention(32, 4, "mla", params=params)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("d_model, n_head, head_dim", [(60, 4, 15), (64, 64, 1)])
def test_an_odd_or_tiny_head_dim_is_named_not_a_rope_dim_never_given(d_model, n_head, head_dim):
    want = rf"^scheme .mla.: mla needs an even head dim >= 2 \(d_model / n_head\), got {head_dim}$"
    with pytest.raises(PosencError, match=want):
        Attention(d_model, n_head, "mla")


def test_mla_is_listed_with_its_source():
    rows = {name: (doc, source) for rows in encodings.catalogue().values() for name, doc, source in rows}
    doc, source = rows["mla"]
    assert doc.startswith("MLA's decoupled RoPE") and "2405.04434" in source
    assert math.isclose(encodings.get("mla:rope_dim=8", Dims(2, 8, 16, 0, 8)).rope_dim, 8)
