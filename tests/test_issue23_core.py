"""Issue 23: rotations stay float32+ under autocast and casts, every target scored once, and smaller defects."""

from __future__ import annotations

import importlib
import math

import pytest
import torch

from posenc import build_model
from posenc.encodings.base import Inputs

core = importlib.import_module("posenc.attention")  # the module (the package exports its function)
OFFSET, STARTS = 5, (0, 1, 1000, 30_000, 65_530)


def _scores(q: torch.Tensor, k: torch.Tensor) -> list[float]:
    """Score (float64) of the query at each start + OFFSET with the key at start: q, k (T, D) rotated."""
    return [float((q[s + OFFSET].double() * k[s].double()).sum()) for s in STARTS]


def test_rotation_under_bf16_autocast_keeps_relative_scores_to_64k(monkeypatch):
    """A fixed (bf16) q, k pair at offset 5: the rotated pair the attention core hands to SDPA under bf16 autocast
    scores the same at every position to 64K within 1e-4 (bf16 cos/sin spread it by ~0.1)."""
    model = build_model({"encoding": "rope", "n_layer": 1, "n_head": 1, "d_model": 64})
    T = STARTS[-1] + OFFSET + 1
    g = torch.Generator().manual_seed(0)
    q0, k0 = torch.randn(64, generator=g).bfloat16(), torch.randn(64, generator=g).bfloat16()
    q, k = q0.expand(1, 1, T, 64).contiguous(), k0.expand(1, 1, T, 64).contiguous()
    phases = model.blocks[0].attn.enc.phases(Inputs(torch.zeros(1, T, 64), torch.arange(T)))
    seen = {}

    def spy(q, k, v, **kw):
        seen.update(q=q, k=k)
        return torch.zeros_like(v)

    monkeypatch.setattr(core.F, "scaled_dot_product_attention", spy)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = core.attention(q, k, k.clone(), phases=phases)
    assert out.dtype == torch.bfloat16 and seen["q"].dtype == torch.float32
    scores = _scores(seen["q"][0, 0], seen["k"][0, 0])
    assert max(scores) - min(scores) < 1e-4, scores
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the autograd reference too
        rq, rk = core.rotate(q, phases), core.rotate(k, phases)
    assert rq.dtype == torch.float32
    scores = _scores(rq[0, 0], rk[0, 0])
    assert max(scores) - min(scores) < 1e-4, scores
