"""An attending scheme whose logits are q . k (``attends_rotated``) composed with a rotary part (issue 60): gpt-oss's
``rope+learned-sinks`` against transformers, ``rope+logn`` and ``p-rope+ssmax`` against the rotation then the
length-scaled softmax written here, decoding, grouped-query heads, and the one-line refusals that remain."""

import math

import pytest
import torch
from torch import nn

from posenc import Attention, encodings
from posenc.attention import rotate
from posenc.encodings.base import Dims, Inputs
from posenc.encodings.composite import Composite
from posenc.encodings.lengthscale import length_scaled_naive
from posenc.encodings.rotary import RoPE
from posenc.encodings.sinks import LearnedSinks, sink_attention_naive
from posenc.errors import PosencError
from posenc.layer import LayerCache

B, H, HKV, T, D = 2, 4, 2, 9, 8
DIMS = Dims(n_head=H, head_dim=D, d_model=H * D, vocab_size=0, train_length=4)


def qkv(seed=0):
    """q (B, H, T, D) and k, v (B, Hkv, T, D) float64."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, HKV, T, D, generator=g, dtype=torch.float64) for _ in range(2))
    return q, k, v


def inputs() -> Inputs:
    return Inputs(torch.zeros(1, T, H * D, dtype=torch.float64), torch.arange(T))


def attend(enc, q, k, v) -> torch.Tensor:
    """The composite's attention as the layer calls it: keys and values repeated to the H query heads."""
    return enc.attend(q, k.repeat_interleave(H // HKV, 1), v.repeat_interleave(H // HKV, 1), inputs())


def test_rope_with_learned_sinks_equals_transformers_gpt_oss_attention_after_its_rotary_embedding():
    """gpt-oss's attention layer: transformers' RoPE (``apply_rotary_pos_emb``, half pairing) on q and the Hkv keys,
    then gpt_oss ``eager_attention_forward`` with its sinks and repeat_kv."""
    from transformers import LlamaConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    q, k, v = qkv()
    config = LlamaConfig(hidden_size=H * D, num_attention_heads=H, num_key_value_heads=HKV, rope_theta=500.0)
    cos, sin = LlamaRotaryEmbedding(config)(v, torch.arange(T)[None])
    qr, kr = apply_rotary_pos_emb(q, k, cos.double(), sin.double())
    module = nn.Module()
    module.sinks = nn.Parameter(torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.float64))
    module.num_key_value_groups = H // HKV
    mask = torch.full((T, T), -math.inf, dtype=torch.float64).triu(1)[None, None]
    want, _ = eager_attention_forward(module.eval(), qr, kr, v, mask, scaling=D**-0.5)
    enc = encodings.get("rope:rope_theta=500+learned-sinks", DIMS).double()
    with torch.no_grad():
        enc.parts[1].sinks.copy_(module.sinks)
    got = attend(enc, q, k, v)
    assert (got.transpose(1, 2) - want).abs().max() < 1e-6  # both take cos and sin of float32 angles
    unrotated = attend(encodings.get("learned-sinks", DIMS).double(), q, k, v)
    assert (unrotated - got).abs().max() > 1e-2  # the rotation acts


def rotated(q, k, phases):
    return rotate(q, phases), rotate(k.repeat_interleave(H // HKV, 1), phases)


@pytest.mark.parametrize("spec", ["rope+logn:base_length=3", "p-rope:p=0.5+ssmax:init=0.7"])
def test_rotary_then_length_scaled_equals_the_naive_composition(spec):
    q, k, v = qkv(1)
    enc = encodings.get(spec, DIMS).double()
    rot, scaled = enc.parts
    qr, kr = rotated(q, k, rot.phases(inputs()).double())
    c = scaled.factors(torch.arange(1, T + 1, dtype=torch.float64), torch.float64)[..., 0]
    want = length_scaled_naive(qr, kr, v.repeat_interleave(H // HKV, 1), c)
    got = attend(enc, q, k, v)
    assert (got - want).abs().max() < 1e-12
    assert (got - attend(encodings.get(spec.split("+")[1], DIMS).double(), q, k, v)).abs().max() > 1e-3


def test_the_rotary_parts_logit_scale_multiplies_the_logits():
    """A YaRN schedule's attention factor (``logit_scale``) scales q . k as in the core's attention."""
    rope = RoPE(DIMS, schedule="yarn", schedule_params={"factor": 4.0, "original_max_position_embeddings": 4})
    assert rope.logit_scale != 1.0
    enc = Composite(DIMS, [rope, LearnedSinks(DIMS, init=0.5)], "rope+learned-sinks").double()
    q, k, v = qkv(2)
    qr, kr = rotated(q, k, rope.phases(inputs()).double())
    sinks = enc.parts[1].sinks
    want = sink_attention_naive(qr, kr, v.repeat_interleave(H // HKV, 1), sinks, logit_scale=rope.logit_scale)
    assert (attend(enc, q, k, v) - want).abs().max() < 1e-12


@pytest.mark.parametrize(
    "spec",
    [
        "rope+learned-sinks:init=1",
        "rope+logn:base_length=3",
        "p-rope+ssmax",
        "rope+stick-breaking",
        "acc-rand-qkv:a=0.3+learned-sinks+alibi",  # per-head phases, rotate_v, a composed bias
    ],
)
def test_grouped_query_decoding_equals_the_parallel_forward(spec):
    torch.manual_seed(0)
    layer = Attention(H * D, H, spec, n_kv_head=HKV, train_length=4).double().eval()
    with torch.no_grad():  # the sinks and scales off their init
        for p in layer.enc.parameters():
            p.add_(0.3 * torch.randn_like(p))
    x = torch.randn(2, 13, H * D, dtype=torch.float64)
    cache, out = LayerCache(), []
    with torch.no_grad():
        for s, e in ((0, 5), (5, 6), (6, 9), (9, 13)):
            out.append(layer(x[:, s:e], cache=cache))
        assert (torch.cat(out, 1) - layer(x)).abs().max() < 1e-12


@pytest.mark.parametrize("spec", ["rope+path", "rope+cope", "rope+xpos", "rope:rope_theta=500+dape"])
def test_an_attending_part_with_its_own_positions_refuses_a_rotary_part_in_one_line(spec):
    with pytest.raises(PosencError, match="cannot take the rotary part 'rope'") as e:
        encodings.get(spec, DIMS)
    assert "\n" not in str(e.value)
