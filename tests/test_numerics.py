"""Positional buffers survive module casts: angles, frequencies and slopes stay float32 or better."""

import importlib
import math

import pytest
import torch

from posenc import build_model, encodings
from posenc.attention import rotate
from posenc.encodings.base import Encoding, Inputs

SCHEMES = [
    "rope",
    "rope:rope_theta=500000",
    "acc-rand-qkv",
    "acc-drift-qkv",
    "acc-token-qkv",
    "xpos",
    "pope",
    "alibi",
    "hybrid",
]


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
    exact = torch.remainder(
        pos.double()[:, None] * (10000.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)), 2 * math.pi
    )
    torch.testing.assert_close(after[0, 0].double(), exact, atol=1e-5, rtol=0)


def test_nonsensical_parameters_and_inputs_are_one_line_errors():
    from posenc import encodings
    from posenc.errors import PosencError

    for params in (
        {"rope_theta": float("nan")},
        {"rope_theta": float("inf")},
        {"rope_theta": 0.5},
        {"rope_theta": "x"},
    ):
        with pytest.raises(PosencError, match="rope_theta"):
            encodings.get("rope", **params)
    model = build_model({"encoding": "rope", "n_layer": 1, "n_head": 2, "d_model": 32})
    with pytest.raises(PosencError, match="T >= 1"):
        model(torch.zeros(1, 0, dtype=torch.int64))
    with pytest.raises(PosencError, match="positions must be"):
        model.hidden(torch.zeros(1, 5, dtype=torch.int64), torch.arange(4))


@pytest.mark.parametrize("scheme", encodings.names())
def test_every_scheme_under_cpu_bf16_autocast_has_a_finite_loss_and_float32_angles(scheme):
    torch.manual_seed(0)
    n_layer = len(encodings.layer_pattern(scheme))  # every entry of a pattern (gemma3: 6)
    model = build_model({"encoding": scheme, "n_layer": n_layer, "n_head": 2, "d_model": 32, "train_length": 32})
    x = torch.randint(0, 256, (2, 32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model.token_nll(x, x).mean()
        for a in model.prepare(x):
            assert a.phases is None or a.phases.dtype in (torch.float32, torch.float64)
    assert torch.isfinite(loss)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_bf16_rope_angles_and_relative_scores_do_not_drift_with_position():
    """A bf16 model: RoPE's angle at positions up to 131072 within 1e-3 rad of float64, and the score of
    one (q, k) pair at a fixed offset the same wherever the pair sits."""
    model = build_model({"encoding": "rope", "n_layer": 1, "n_head": 2, "d_model": 32}).to(torch.bfloat16)
    enc = model.blocks[0].attn.enc
    pos = torch.tensor([0, 1, 4095, 65536, 131071])
    phases = enc.phases(Inputs(torch.zeros(1, 5, 32, dtype=torch.bfloat16), pos, torch.zeros(1, 5, dtype=torch.int64)))[
        0, 0
    ]
    exact = pos.double()[:, None] * (10000.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16))
    diff = torch.remainder(phases.double() - exact + math.pi, 2 * math.pi) - math.pi
    assert float(diff.abs().max()) < 1e-3
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 16, generator=g), torch.randn(1, 1, 1, 16, generator=g)
    scores = []
    for start in (0, 1000, 65000, 131000):
        p = torch.tensor([start, start + 7])
        phi = enc.phases(Inputs(torch.zeros(1, 2, 32, dtype=torch.bfloat16), p, torch.zeros(1, 2, dtype=torch.int64)))
        scores.append(float((rotate(q, phi[..., 1:, :]) * rotate(k, phi[..., :1, :])).sum()))
    assert max(scores) - min(scores) < 1e-4, scores


def _preparable():
    """Every registered scheme that ``posenc.prepare`` builds from its spec (no learned parameters, not additive)."""
    import posenc
    from posenc.errors import PosencError

    out = []
    for spec in encodings.names():
        try:
            posenc.prepare(spec, torch.randn(1, 4, 16), n_head=2)
        except PosencError:
            continue
        out.append(spec)
    return out


@pytest.mark.parametrize("spec", _preparable())
@pytest.mark.parametrize("T", [6, 40])  # 6: fewer keys than a CPU vector, where the flash kernel dropped NaN
def test_a_nan_reaches_every_output_row_that_reads_it_on_every_path(spec, T):
    """A NaN in query row j: output row j is NaN; in key or value row j: every row from j on is NaN
    (all features for q and k, at least one for v); for the whole sequence, one decoding row and a chunk of 3."""
    import posenc

    assert {"nope", "rope", "alibi"} <= set(_preparable())  # the fused no-bias path and the bias path
    p = posenc.prepare(spec, torch.randn(1, T, 16), n_head=2)
    for which, j, n in [(w, j, n) for w in "qkv" for j in (0, T // 2, T - 1) for n in (T, 1, 3)]:
        if (which == "q" and j < T - n) or (p.encoding.replaces_attention and n < T):
            continue  # no such query row; schemes that replace attention take every query
        t = dict(zip("qkv", torch.randn(3, 1, 2, T, 8)))
        t[which][0, 0, j, 3] = math.nan
        out = posenc.attend(t["q"][:, :, T - n :], t["k"], t["v"], p)[0, 0]
        nan = out.isnan().any(-1) if which == "v" else out.isnan().all(-1)
        rows = torch.arange(T - n, T)
        assert bool(nan[rows == j if which == "q" else rows >= j].all()), (which, j, n)


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


@pytest.mark.parametrize("cast", ["float", "half", "bf16"])
def test_casts_keep_float64_frequencies_and_relative_scores_to_64k(cast):
    """After .float() / .half() / .to(bf16) RoPE's frequencies are still float64: the angles to 131072 stay within
    1e-5 rad of float64's (a float32 copy puts them up to 3.9e-3 off), and a fixed float32 q, k pair at offset 5
    scores the same to 64K within 1e-4."""
    model = build_model({"encoding": "rope", "n_layer": 1, "n_head": 1, "d_model": 64})
    enc = model.blocks[0].attn.enc
    assert enc.inv_freq.dtype == torch.float64
    model = {"float": model.float, "half": model.half, "bf16": lambda: model.to(torch.bfloat16)}[cast]()
    assert enc.inv_freq.dtype == torch.float64
    pos = torch.tensor([4095, 65536, 131071])
    exact = pos.double()[:, None] * (10000.0 ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64))
    diff = (
        torch.remainder(enc.phases(Inputs(torch.zeros(1, 3, 64), pos))[0, 0].double() - exact + math.pi, 2 * math.pi)
        - math.pi
    )
    assert float(diff.abs().max()) < 1e-5
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 64, generator=g), torch.randn(1, 1, 1, 64, generator=g)
    scores = []
    for s in STARTS:
        phi = enc.phases(Inputs(torch.zeros(1, 2, 64), torch.tensor([s, s + OFFSET])))
        scores.append(
            float((core.rotate(q, phi[..., 1:, :]).double() * core.rotate(k, phi[..., :1, :]).double()).sum())
        )
    assert max(scores) - min(scores) < 1e-4, scores
    model.double()  # raising precision is allowed
    assert enc.inv_freq.dtype == torch.float64


def test_fox_log_gates_take_the_inputs_precision():
    """float64 gate logits give float64 log-gates (they were taken in float32: 1e-7 off); bf16 ones float32."""
    from posenc.encodings.forget import log_forget_cumsum

    logits = torch.randn(2, 3, 257, dtype=torch.float64) * 4
    exact = torch.cumsum(torch.log(torch.sigmoid(logits)), dim=-1)
    assert float((log_forget_cumsum(logits) - exact).abs().max()) < 1e-12
    low = log_forget_cumsum(logits.bfloat16())
    assert low.dtype == torch.float64
    torch.testing.assert_close(low, log_forget_cumsum(logits.bfloat16().float()), rtol=0, atol=0)
