"""Partial rotary (`rotary_fraction`): only the first int(f D) features of each head rotate."""

import pytest
import torch

from posenc import build_model, encodings
from posenc.attention import attention, naive_attention, rotate, rotate_shared
from posenc.encodings.base import Dims, Inputs
from posenc.errors import PosencError

DIMS = Dims(n_head=2, head_dim=16, d_model=32, vocab_size=32, train_length=16)


def _reference_rotate(x, phi, pairing):
    """R(phi) on the first 2P features by the full-width reference, the rest untouched."""
    r = 2 * phi.shape[-1]
    return torch.cat((rotate(x[..., :r], phi, pairing), x[..., r:]), dim=-1)


@pytest.mark.parametrize("pairing", ["half", "adjacent"])
@pytest.mark.parametrize("rotate_v", [False, True])
def test_core_with_partial_phases_equals_naive(pairing, rotate_v):
    torch.manual_seed(0)
    B, H, T, D, P = 2, 2, 9, 16, 3  # 6 of 16 features rotate
    q, k, v = (torch.randn(B, H, T, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    phi = (torch.rand(B, H, T, P, dtype=torch.float64) * 6).requires_grad_()
    got = attention(q, k, v, phases=phi, rotate_v=rotate_v, pairing=pairing, block_size=4)
    rq, rk = _reference_rotate(q, phi, pairing), _reference_rotate(k, phi, pairing)
    rv = _reference_rotate(v, phi, pairing) if rotate_v else v
    want = naive_attention(rq, rk, rv)
    if rotate_v:
        want = _reference_rotate(want, -phi, pairing)
    assert torch.allclose(got, want, atol=1e-12)
    g = torch.randn_like(got)
    grads = torch.autograd.grad((got * g).sum(), (q, k, v, phi))
    ref = torch.autograd.grad((want * g).sum(), (q, k, v, phi))
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(grads, ref))
    if rotate_v:  # the unrotated value features are plain attention values
        plain = naive_attention(rq, rk, v)
        assert torch.allclose(got[..., 2 * P :], plain[..., 2 * P :], atol=1e-12)


def test_rotate_shared_partial_equals_rotate():
    x = torch.randn(1, 2, 5, 8, dtype=torch.float64, requires_grad=True)
    phi = torch.rand(1, 2, 5, 2, dtype=torch.float64)
    got = rotate_shared(x, phi, phi.cos(), phi.sin(), "half", sign=-1)
    assert torch.allclose(got, _reference_rotate(x, -phi, "half"), atol=1e-14)
    assert torch.equal(got[..., 4:], x[..., 4:])


def test_rope_partial_matches_gpt_neox():
    """Golden: transformers' GPT-NeoX rotary (partial_rotary_factor) gives the same frequencies and rotated q."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt_neox import modeling_gpt_neox as neox

    cfg = transformers.GPTNeoXConfig(
        hidden_size=32,
        num_attention_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    )
    hf_inv, _ = neox.GPTNeoXRotaryEmbedding.compute_default_rope_parameters(cfg)
    enc = encodings.get("rope:rotary_fraction=0.25", DIMS)
    assert enc.inv_freq.shape == (2,) and torch.allclose(enc.inv_freq.float(), hf_inv, rtol=1e-6)
    T = 7
    x = torch.randn(1, T, DIMS.d_model)
    phi = enc.phases(Inputs(x, torch.arange(T), torch.zeros(1, T, dtype=torch.long)))
    q = torch.randn(1, 2, T, 16)
    emb = torch.cat((torch.arange(T)[:, None] * hf_inv,) * 2, dim=-1)[None]
    hf_q, _ = neox.apply_rotary_pos_emb(q, q, emb.cos(), emb.sin())
    assert torch.allclose(rotate(q, phi), hf_q, atol=1e-5)


def test_partial_models_train_and_leave_the_rest_alone():
    for spec, pairs in (
        ("rope:rotary_fraction=0.25", 2),
        ("acc-rand-qkv:rotary_fraction=0.5", 4),
        ("acc-learned-qk:rotary_fraction=0.5", 4),
    ):
        model = build_model(
            {"vocab_size": 32, "n_layer": 2, "n_head": 2, "d_model": 32, "train_length": 16, "encoding": spec}
        )
        x = torch.randint(0, 32, (2, 12))
        a = next(model.prepare(x))
        assert a.phases.shape[-1] == pairs
        loss = model.token_nll(x, x).mean()
        loss.backward()
        assert loss.isfinite() and all(p.grad is None or p.grad.isfinite().all() for p in model.parameters())
    assert "rotary_fraction=0.25" in encodings.describe("rope:rotary_fraction=0.25", DIMS)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("rope:rotary_fraction=0", "scheme 'rope:rotary_fraction=0': rotary_fraction must be in (0, 1], got 0"),
        ("rope:rotary_fraction=1.5", "scheme 'rope:rotary_fraction=1.5': rotary_fraction must be in (0, 1], got 1.5"),
        (
            "acc-rand-qkv:rotary_fraction=0.1",
            "scheme 'acc-rand-qkv:rotary_fraction=0.1': rotary_fraction 0.1 rotates int(16 * 0.1) = 1 features of "
            "head dim 16; "
            "it must give an even rotary dim >= 2",
        ),
    ],
)
def test_bad_fractions_are_one_line(spec, message):
    with pytest.raises(PosencError) as err:
        encodings.get(spec, DIMS)
    assert str(err.value) == message


def test_rerope_needs_every_feature():
    with pytest.raises(PosencError, match="rotary_fraction must be 1"):
        encodings.get("rope", DIMS, schedule="rerope", schedule_params={"window": 4}, rotary_fraction=0.5)
