"""posenc.hf.scheme.apply_scheme: any scheme inside a tiny Hugging Face Llama (GQA: 4 heads, 2 key/value heads)."""

import re

import pytest
import torch
from tiny_llama import tiny_llama

from posenc.errors import PosencError

transformers = pytest.importorskip("transformers")
from posenc.encodings.rotary import RoPE  # noqa: E402
from posenc.hf import scheme as hf  # noqa: E402

THETA = 5000.0


def llama(seed=0):
    return tiny_llama(seed, 64, THETA)


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("spec", ["rope", "acc-learned-qk:center=rope"])
def test_identity_equivalent_schemes_reproduce_the_model(spec):
    """RoPE with the model's own theta (taken from the config), and learned steps around RoPE's frequencies at W = 0."""
    model, ids = llama(), torch.randint(0, 128, (2, 40))
    before = logits(model, ids)
    hf.apply_scheme(model, spec)
    assert model.config._attn_implementation == hf.ATTN_NAME
    enc = model.model.layers[0].self_attn.posenc
    assert enc.modules().__next__() is enc and (not isinstance(enc, RoPE) or enc.rope_theta == THETA)
    after = logits(model, ids)
    assert (after - before).abs().max().item() < 1e-6, (after - before).abs().max().item()  # float32 rounding
    assert before.abs().max().item() > 0.1  # not a trivially small comparison


def test_a_different_theta_changes_the_model():
    model, ids = llama(), torch.randint(0, 128, (1, 40))
    before = logits(model, ids)
    hf.apply_scheme(model, "rope:rope_theta=10")
    assert (logits(model, ids) - before).abs().max().item() > 1e-3  # 1000x the rounding of the identity test


def test_decoding_with_the_hf_cache_equals_the_full_forward(hf_decode):
    model, ids = llama(1), torch.randint(0, 128, (1, 20))
    hf.apply_scheme(model, "hybrid")
    full, decoded = hf_decode(model, ids, 12)
    assert (decoded - full).abs().max().item() < 1e-4


@pytest.mark.parametrize("spec", ["acc-rand-qkv", "alibi", "hybrid"])
def test_swapped_model_is_finite_and_trains(spec):
    model, ids = llama(2), torch.randint(0, 128, (4, 32))
    hf.apply_scheme(model, spec)
    names = {n for n, _ in model.named_parameters() if ".posenc." in n}
    assert (spec == "hybrid") == bool(names)  # learned parts are model parameters
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(20):
        loss = model(ids, labels=ids).loss
        assert torch.isfinite(loss)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5, losses


def test_forget_gate_starts_neutral():
    model = llama()
    hf.apply_scheme(model, "hybrid")
    gate = model.model.layers[1].self_attn.posenc.parts[1].gate
    assert gate.weight.abs().max().item() == 0 and torch.all(gate.bias == 8.0)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("sinusoidal", "additive input embedding"),
        ("acc-token-qkv", "reads token ids"),
        ("nosuch", "unknown scheme"),
        ("gemma3", "scheme 'gemma3' is a pattern of 6 layer entries for a model of 2 layers"),  # was truncated
        ("rope|rope|nope", "scheme 'rope|rope|nope' is a pattern of 3 layer entries for a model of 2 layers"),
    ],
)
def test_refused_schemes_are_one_line_errors(spec, message):
    model = llama()
    with pytest.raises(PosencError, match=re.escape(message)) as exc:
        hf.apply_scheme(model, spec)
    assert "\n" not in str(exc.value)
    assert not any(hasattr(layer.self_attn, "posenc") for layer in model.model.layers)  # refused before any change


def test_schemes_that_replace_attention_run_full_forwards_and_refuse_cached_decoding():
    model, ids = llama(3), torch.randint(0, 128, (1, 12))
    hf.apply_scheme(model, "path")
    with torch.no_grad():
        out = model(ids, use_cache=True)
        assert torch.isfinite(out.logits).all()
        with pytest.raises(PosencError, match=r"'path' replaces attention .* \(generate\(\.\.\., use_cache=False\)"):
            model(ids[:, :1], cache=out.past_key_values, use_cache=True)
        full = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False, use_cache=False
        )
        assert full.shape == (1, 15) and torch.equal(full[:, :12], ids)


def test_padded_batches_are_refused():
    model, ids = llama(3), torch.randint(0, 128, (2, 8))
    hf.apply_scheme(model, "rope")
    mask = torch.ones_like(ids)
    assert torch.isfinite(model(ids, attention_mask=mask).logits).all()
    mask[0, :3] = 0  # left padding: posenc's attention would read the pads as positions 0..2
    with pytest.raises(PosencError, match="unpadded batches"):
        model(ids, attention_mask=mask)
