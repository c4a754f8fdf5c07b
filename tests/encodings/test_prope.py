"""p-RoPE (Barbero et al. 2025): the highest int(p D/2) frequencies rotate, the rest are position-free."""

import pytest
import torch

from posenc import encodings
from posenc.attention import rotate
from posenc.encodings.base import Dims, Inputs
from posenc.errors import PosencError

DIMS = Dims(n_head=2, head_dim=32, d_model=64, vocab_size=0, train_length=16)


def phases(spec, T=9, dims=DIMS):
    return encodings.get(spec, dims).phases(Inputs(torch.zeros(1, T, dims.d_model), torch.arange(T)))


@pytest.mark.parametrize("p", [0.25, 0.5, 0.75, 1.0])
def test_rotations_equal_transformers_proportional_rope(p):
    """transformers' ``proportional`` rope type (Gemma 4) with partial_rotary_factor p: the same inv_freq and the
    same rotated q (its rotate_half over the whole head, cos/sin from float32 frequencies)."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.gemma4.modeling_gemma4 import apply_rotary_pos_emb

    cfg = LlamaConfig(
        hidden_size=64,
        num_attention_heads=2,
        head_dim=32,
        rope_parameters={"rope_type": "proportional", "rope_theta": 500.0, "partial_rotary_factor": p},
    )
    inv_freq, _ = ROPE_INIT_FUNCTIONS["proportional"](cfg, "cpu")
    enc = encodings.get(f"p-rope:p={p},rope_theta=500", DIMS)
    assert torch.allclose(enc.inv_freq.float(), inv_freq, rtol=1e-6, atol=0)
    assert int((enc.inv_freq > 0).sum()) == int(p * 16)  # the highest frequencies are the first ones
    T = 40
    freqs = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)[None]
    q = torch.randn(1, 2, T, 32, generator=torch.Generator().manual_seed(0))
    want = apply_rotary_pos_emb(q, emb.cos(), emb.sin())
    got = rotate(q, enc.phases(Inputs(torch.zeros(1, T, 64), torch.arange(T))))
    assert torch.allclose(got, want, atol=1e-5)


def test_the_lowest_pairs_are_position_free_and_the_kept_ones_are_ropes():
    pr, rope = phases("p-rope:p=0.75"), phases("rope")
    assert torch.equal(pr[..., :12], rope[..., :12]) and not pr[..., 12:].any()
    assert rope[..., 12:].any()  # RoPE rotates those pairs: the test can tell them apart


@pytest.mark.parametrize("pairing", ["half", "adjacent"])
def test_rotary_fraction_is_p_rope_with_a_larger_base_so_it_keeps_ropes_lowest_frequencies(pairing):
    """rope:rotary_fraction=f at base b rotates the first fD features with b^(-2i/(fD)): p-RoPE with p = f at base
    b^(1/f), the features permuted. Its lowest rotated frequency is RoPE's (~1/b), which p-RoPE drops."""
    f, b, D, T = 0.5, 100.0, 32, 12
    partial = encodings.get(f"rope:rotary_fraction={f},rope_theta={b},pairing={pairing}", DIMS)
    pr = encodings.get(f"p-rope:p={f},rope_theta={b ** (1 / f)},pairing={pairing}", DIMS)
    assert torch.allclose(partial.inv_freq, pr.inv_freq[: int(f * D / 2)])
    assert partial.inv_freq.min() == pytest.approx(b ** (-(1 - 2 / (f * D))))  # RoPE's lowest, near 1/b
    low = encodings.get(f"p-rope:p={f},rope_theta={b},pairing={pairing}", DIMS).inv_freq
    ratio = float(low[low > 0].min() / partial.inv_freq.min())  # p-RoPE at base b stops b^0.44 = 7.5x higher
    assert ratio == pytest.approx(b ** (1 - f - 2 / (f * D) + 2 / D)) and ratio > 7
    r = int(f * D)  # features rotated by the partial rotary, pairs within them
    if pairing == "half":  # p-RoPE pairs (i, i + D/2): its first r/2 and its D/2.. D/2 + r/2 features are rotated
        order = [*range(r // 2), *range(D // 2, D // 2 + r // 2)]
        order += [i for i in range(D) if i not in order]
    else:  # adjacent pairs: the first r features in both
        order = list(range(D))
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 2, T, D, generator=g), torch.randn(1, 2, T, D, generator=g)
    inp = Inputs(torch.zeros(1, T, 64), torch.arange(T))
    scores_partial = rotate(q, partial.phases(inp), pairing) @ rotate(k, partial.phases(inp), pairing).transpose(-1, -2)
    qp, kp = torch.empty_like(q), torch.empty_like(k)
    qp[..., order], kp[..., order] = q, k  # feature j of the partial head is feature order[j] of the p-RoPE head
    scores_p = rotate(qp, pr.phases(inp), pairing) @ rotate(kp, pr.phases(inp), pairing).transpose(-1, -2)
    assert torch.allclose(scores_partial, scores_p, atol=1e-4)


@pytest.mark.parametrize(
    "spec,message",
    [
        ("p-rope:p=0", "p must be a fraction in (0, 1]"),
        ("p-rope:p=1.5", "p must be a fraction in (0, 1]"),
        ("p-rope:p=0.01", "keeps int(0.01 * 32 / 2) = 0 frequency pairs; use nope"),
        ("p-rope:rope_theta=1", "rope_theta must be a finite number > 1"),
        ("p-rope:rotary_fraction=0.5", "has no parameter 'rotary_fraction'"),
        ("p-rope:schedule=yarn", "schedule cannot be set in a spec"),
    ],
)
def test_bad_parameters_are_one_line_errors(spec, message):
    with pytest.raises(PosencError, match=message.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")) as err:
        encodings.get(spec, DIMS)
    assert "\n" not in str(err.value)


def test_grouped_query_attention_and_decoding_equal_the_parallel_forward():
    from posenc import Attention
    from posenc.layer import LayerCache

    torch.manual_seed(0)
    layer = Attention(64, 4, "p-rope:p=0.5", n_kv_head=2, train_length=16).double().eval()
    x = torch.randn(2, 11, 64, dtype=torch.float64)
    cache, out = LayerCache(), []
    for s, e in ((0, 5), (5, 6), (6, 11)):
        out.append(layer(x[:, s:e], cache=cache))
    with torch.no_grad():
        assert torch.allclose(torch.cat(out, 1), layer(x), atol=1e-12)
