"""The encoding contract: every scheme's declared flags match what its hooks return."""

import dataclasses

import pytest
import torch

from posenc import encodings
from posenc.encodings.base import Dims, Inputs
from posenc.encodings.registry import names
from posenc.model import LM, ModelConfig

DIMS = Dims(n_head=2, head_dim=8, d_model=16, vocab_size=32, train_length=16)


def _inputs(T=6):
    return Inputs(torch.randn(1, T, DIMS.d_model), torch.arange(T), torch.randint(0, DIMS.vocab_size, (1, T)))


SPECS = names() + ["rope:schedule=rerope", "acc-rand-qkv+alibi", "path+forget", "xpos+t5"]


def _build(spec):
    if spec == "rope:schedule=rerope":  # an internal key: set the way with_rope_schedule does
        return encodings.get("rope", DIMS, schedule="rerope", schedule_params={"window": 4})
    return encodings.get(spec, DIMS)


@pytest.mark.parametrize("spec", SPECS)
def test_flags_match_hooks(spec):
    enc, inp = _build(spec), _inputs()
    q, k, v = (torch.randn(1, DIMS.n_head, 6, DIMS.head_dim) for _ in range(3))
    assert enc.additive == (enc.embed(inp.pos) is not None)
    if enc.additive:
        return
    assert enc.rotary == (enc.phases(inp) is not None)
    assert enc.has_bias == (enc.bias(inp) is not None)
    assert enc.replaces_attention == (enc.attend(q, k, v, inp) is not None)
    assert enc.has_logits == (enc.logits(q, k, inp, None, 0, 6) is not None) and (
        enc.replaces_attention or not enc.has_logits
    )
    assert enc.rotary == (enc.spectral_gap() is not None)


def test_composite_flags_are_its_parts():
    enc = encodings.get("acc-rand-qkv+alibi", DIMS)
    assert (enc.rotary, enc.has_bias, enc.replaces_attention, enc.rotate_v) == (True, True, False, True)
    enc = encodings.get("path+forget", DIMS)
    assert (enc.rotary, enc.has_bias, enc.replaces_attention) == (False, True, True)


def test_rope_replaces_attention_only_with_rerope():
    assert not encodings.get("rope", DIMS).replaces_attention
    assert _build("rope:schedule=rerope").replaces_attention


def test_model_init_keeps_declared_zero_layers():
    cfg = ModelConfig(vocab_size=32, n_layer=2, n_head=2, d_model=16, train_length=16, encoding="acc-learned-qkv")
    model = LM(cfg)
    for block in model.blocks:
        assert block.attn.enc.zero_init() == (block.attn.enc.step,)
        assert torch.count_nonzero(block.attn.enc.step.weight) == 0
        assert 0.01 < float(block.attn.qkv.weight.detach().std()) < 0.03  # N(0, 0.02^2)
    model = LM(dataclasses.replace(cfg, encoding_params={"init": "random"}))
    assert all(
        b.attn.enc.zero_init() == () and float(b.attn.enc.step.weight.detach().std()) > 0.01 for b in model.blocks
    )


def test_every_scheme_has_a_family_and_a_source():
    for family, entries in encodings.catalogue().items():
        assert family != "other", [name for name, _, _ in entries]
    classes = {cls for name in names() for entry in encodings.layer_pattern(name) for cls, _ in encodings.parts(entry)}
    assert all(cls.source for cls in classes), [cls.name for cls in classes if not cls.source]
