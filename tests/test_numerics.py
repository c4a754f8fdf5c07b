"""Positional buffers survive module casts: angles, frequencies and slopes stay float32 or better."""

import math

import pytest
import torch

from posenc import build_model
from posenc.encodings.base import Encoding, Inputs

SCHEMES = ["rope", "rope:rope_theta=500000", "acc-rand-qkv", "acc-drift-qkv", "acc-token-qkv", "xpos", "pope", "alibi", "hybrid"]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("cast", ["bf16", "half"])
def test_cast_model_keeps_positional_buffers(scheme, cast):
    model = build_model({"encoding": scheme, "n_layer": 1, "n_head": 2, "d_model": 32})
    ref = {n: b.clone() for n, b in model.named_buffers() if b.is_floating_point()}
    assert ref, "every listed scheme holds a floating buffer"
    model = model.to(torch.bfloat16) if cast == "bf16" else model.half()
    assert next(model.parameters()).dtype in (torch.bfloat16, torch.float16)  # the weights were cast
    for n, b in model.named_buffers():
        if n in ref:
            assert b.dtype == ref[n].dtype and torch.equal(b, ref[n]), n


def test_rope_phases_at_long_positions_do_not_depend_on_the_module_dtype():
    model = build_model({"encoding": "rope", "n_layer": 1, "n_head": 2, "d_model": 32})
    enc: Encoding = model.blocks[0].attn.enc
    pos = torch.tensor([10_000, 123_457, 1_000_003])
    inp = Inputs(torch.zeros(1, 3, 32), pos, torch.zeros(1, 3, dtype=torch.int64))
    before = enc.phases(inp)
    model.to(torch.bfloat16)
    after = enc.phases(Inputs(inp.x.bfloat16(), pos, inp.tokens))
    assert after.dtype == torch.float32 and torch.equal(after, before)
    exact = torch.remainder(pos.double()[:, None] * (10000.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)), 2 * math.pi)
    torch.testing.assert_close(after[0, 0].double(), exact, atol=1e-5, rtol=0)


def test_nonsensical_parameters_and_inputs_are_one_line_errors():
    from posenc import encodings
    from posenc.errors import PosencError

    for params in ({"rope_theta": float("nan")}, {"rope_theta": float("inf")}, {"rope_theta": 0.5}, {"rope_theta": "x"}):
        with pytest.raises(PosencError, match="rope_theta"):
            encodings.get("rope", **params)
    model = build_model({"encoding": "rope", "n_layer": 1, "n_head": 2, "d_model": 32})
    with pytest.raises(PosencError, match="T >= 1"):
        model(torch.zeros(1, 0, dtype=torch.int64))
    with pytest.raises(PosencError, match="positions must be"):
        model.hidden(torch.zeros(1, 5, dtype=torch.int64), torch.arange(4))
