"""Learned attention sinks (gpt-oss): values against transformers, the paths, decoding, GQA, errors."""

import math

import pytest
import torch
from torch import nn

from posenc import Attention, encodings
from posenc.encodings.base import Dims, Inputs
from posenc.encodings.sinks import sink_attention_blocks, sink_attention_naive, sink_attention_sdpa
from posenc.errors import PosencError
from tests.decoding import assert_grouped_query_decoding_equals_the_parallel_forward

DIMS = Dims(n_head=4, head_dim=8, d_model=32, vocab_size=0, train_length=8)


def test_equals_transformers_gpt_oss_eager_attention_with_grouped_query_heads():
    """transformers' gpt_oss ``eager_attention_forward`` (its sinks, repeat_kv, an additive causal mask) on a
    tiny input: the same output as the scheme's attention given the keys repeated to the query heads."""
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    g = torch.Generator().manual_seed(0)
    B, H, Hkv, T, D = 2, 4, 2, 7, 8
    q = torch.randn(B, H, T, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, Hkv, T, D, generator=g, dtype=torch.float64) for _ in range(2))
    module = nn.Module()
    module.sinks = nn.Parameter(torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.float64))
    module.num_key_value_groups = H // Hkv
    mask = torch.full((T, T), -math.inf, dtype=torch.float64).triu(1)[None, None]
    want, _ = eager_attention_forward(module.eval(), q, k, v, mask, scaling=D**-0.5)
    enc = encodings.get("learned-sinks", DIMS).double()
    with torch.no_grad():
        enc.sinks.copy_(module.sinks)
    rep = (t.repeat_interleave(H // Hkv, dim=1) for t in (k, v))
    got = enc.attend(q, *rep, Inputs(torch.zeros(1, T, 32), torch.arange(T)))
    assert torch.allclose(got.transpose(1, 2), want, atol=1e-12)
    plain = torch.softmax((q @ k.repeat_interleave(2, 1).transpose(-1, -2)) * D**-0.5 + mask, -1)
    assert (plain @ v.repeat_interleave(2, 1) - got).abs().max() > 1e-2  # the sinks take weight


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_sdpa_and_block_paths_equal_the_naive_reference_with_their_gradients(dtype):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 600, 8, generator=g, dtype=dtype).requires_grad_() for _ in range(3))
    s = torch.tensor([0.3, -2.0, 4.0], dtype=dtype, requires_grad=True)
    want = sink_attention_naive(q, k, v, s, logit_scale=1.5)
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    for out in (sink_attention_sdpa(q, k, v, s, 1.5 / math.sqrt(8)), sink_attention_blocks(q, k, v, s, 1.5 / 8**0.5)):
        assert (out.double() - want).abs().max() < tol
        grads = torch.autograd.grad(out.double().square().sum(), (q, s))
        ref = torch.autograd.grad(want.square().sum(), (q, s), retain_graph=True)
        assert all((a.double() - b).abs().max() < 50 * tol for a, b in zip(grads, ref))


def test_a_composed_bias_joins_the_logits():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 4, 10, 8, generator=g, dtype=torch.float64) for _ in range(3))
    enc = encodings.get("learned-sinks:init=1+alibi", DIMS).double()
    inp = Inputs(torch.zeros(1, 10, 32), torch.arange(10))
    want = sink_attention_naive(q, k, v, enc.parts[0].sinks, bias=enc.bias(inp))
    assert torch.allclose(enc.attend(q, k, v, inp), want, atol=1e-12)


@pytest.mark.parametrize("spec", ["learned-sinks:init=1", "learned-sinks+forget"])
def test_grouped_query_decoding_equals_the_parallel_forward(spec):
    assert_grouped_query_decoding_equals_the_parallel_forward(spec)


def test_the_sinks_learn_and_neutral_init_silences_them():
    layer = Attention(32, 4, "learned-sinks", train_length=8)
    x = torch.randn(1, 12, 32)
    layer(x).square().sum().backward()
    assert layer.enc.sinks.grad is not None and layer.enc.sinks.grad.abs().min() > 0
    layer.enc.neutral_init()
    plain = Attention(32, 4, "nope", train_length=8)
    plain.load_state_dict(layer.state_dict(), strict=False)
    with torch.no_grad():
        assert torch.allclose(layer(x), plain(x), atol=1e-6)


@pytest.mark.parametrize(
    "spec,message",
    [
        ("learned-sinks:init=31", "learned-sinks: init must be a number in [-30, 30], got 31"),
        ("learned-sinks:init=x", "init='x': expected float"),
        ("learned-sinks:window=4", "window applies to schemes that attend through posenc's core"),
    ],
)
def test_bad_settings_are_one_line_errors(spec, message):
    with pytest.raises(PosencError) as err:
        encodings.get(spec, DIMS)
    assert message in str(err.value) and "\n" not in str(err.value)
