"""The stylized model's scores are the schemes': experiments.accumulated.theory.decay, steps and mass build on the
schemes' own formulas (sinusoidal table, xPos decay, PoPE frequencies, forget-gate prefix sums), and
what they write in closed form (score of a query-key pair, the step laws) is tested against the scheme."""

import inspect
import math

import torch

from experiments.accumulated.theory import decay, parse_dist
from experiments.accumulated.theory.mass import gate_log_decay
from posenc import encodings
from posenc.encodings.absolute import sinusoidal_table
from posenc.encodings.base import Dims, Inputs
from posenc.encodings.bias import alibi_slopes, distance_bias
from posenc.encodings.forget import forget_bias, log_forget_cumsum
from posenc.encodings.polar import pope_features, pope_freqs
from posenc.encodings.xpos import SCALE_BASE, XPos, xpos_block, xpos_naive_scores, xpos_zeta
from posenc.rope import rope_inv_freq


def test_sinusoidal_table_golden_values():
    # d = 4: frequencies 1 and 1/100 (base 10000^(-2/4))
    pe = sinusoidal_table(torch.tensor([0, 1, 100]), 4)
    want = torch.tensor(
        [
            [0.0, 1.0, 0.0, 1.0],
            [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)],
            [math.sin(100), math.cos(100), math.sin(1), math.cos(1)],
        ],
        dtype=torch.float64,
    )
    assert pe.dtype == torch.float64 and torch.allclose(pe, want, rtol=0, atol=1e-15)
    enc = encodings.get("sinusoidal", Dims(n_head=2, head_dim=2, d_model=4, vocab_size=8, train_length=16))
    assert torch.equal(enc.embed(torch.tensor([0, 1, 100])), want.float())


def _qk(d, n=32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(n, d, generator=gen, dtype=torch.float64) for _ in range(2))
    j = torch.randint(0, 3000, (n,), generator=gen).double()
    return q, k, j + torch.randint(0, 3000, (n,), generator=gen).double(), j


def test_xpos_score_is_the_scheme():
    q, k, i, j = _qk(16)
    assert SCALE_BASE == inspect.signature(XPos).parameters["scale_base"].default == 512  # theory uses the scheme's B
    pos = torch.cat([j, i]).long()  # key m = j[n], query = i[n]: entry (n + 32, n) of the (T, T) matrix
    ref = xpos_naive_scores(torch.cat([k, q])[None, None], torch.cat([k, q])[None, None], pos, pairing="adjacent")
    n = torch.arange(32)
    assert torch.allclose(decay.SCHEMES["xpos"](q, k, i, j), ref[0, 0, n + 32, n], rtol=1e-12, atol=1e-12)
    # the scheme's fast path (block-relative scales, phases mod 2 pi): query rows 32.., keys 0..31
    qb, kb = xpos_block(
        torch.cat([k, q])[None, None],
        torch.cat([k, q])[None, None],
        pos,
        rope_inv_freq(16),
        xpos_zeta(16),
        SCALE_BASE,
        32,
        64,
        "adjacent",
    )
    fast = (qb[0, 0] * kb[0, 0, :32]).sum(-1)
    assert torch.allclose(decay.SCHEMES["xpos"](q, k, i, j), fast, rtol=1e-9, atol=1e-9)


def test_pope_score_is_the_scheme():
    q, k, i, j = _qk(16, seed=1)
    delta = -2 * torch.pi * torch.rand(16, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    qf = pope_features(q[None, None], i.long(), pope_freqs(16))[0, 0]  # (32, 2d): query n at position i[n]
    kf = pope_features(k[None, None], j.long(), pope_freqs(16), delta[None])[0, 0]
    # wrap_phases reduces the phases mod 2 pi in float64: agreement to rounding of angles < 6000 rad
    assert torch.allclose(decay._pope(q, k, i, j, delta), (qf * kf).sum(-1), rtol=0, atol=1e-9)
    assert torch.allclose(decay.SCHEMES["pope"](q, k, i, j), decay._pope(q, k, i, j, torch.zeros(16)))


def test_alibi_score_is_the_distance_bias():
    q, k, i, j = _qk(8, seed=3)
    slope = torch.tensor([decay.ALIBI_SLOPE], dtype=torch.float64)
    bias = distance_bias(slope, torch.cat([j, i]).long(), torch.float64)  # keys j at 0..31, queries i at 32..63
    n = torch.arange(32)
    assert torch.equal(decay.SCHEMES["alibi"](q, k, i, j) - (q * k).sum(-1), bias.tile(32, 64, 0, 32)[0, 0, n, n])
    assert decay.ALIBI_SLOPE == float(alibi_slopes(8)[3]) == 1 / 16  # head 4 of 8 in Press et al.
    # the registered scheme's own bias (8 heads): head 3's tile over positions j then i
    alibi = encodings.get("alibi", Dims(n_head=8, head_dim=8, d_model=64, vocab_size=8, train_length=16))
    pos = torch.cat([j, i]).long()
    own = alibi.bias(Inputs(torch.zeros(1, 64, 64, dtype=torch.float64), pos, torch.zeros(1, 64, dtype=torch.long)))
    assert torch.equal(decay.SCHEMES["alibi"](q, k, i, j) - (q * k).sum(-1), own.tile(32, 64, 0, 32)[0, 3, n, n])


def test_step_laws_are_the_accumulated_scheme():
    dims = Dims(n_head=2, head_dim=16, d_model=32, vocab_size=8, train_length=16)
    for a in (0.5, 1.0, 2.0):  # so2:<a> is center="zero" with half-width a
        acc = encodings.get("accumulated", dims, a=a)
        assert torch.allclose(parse_dist(f"so2:{a}", 16).block_means().abs(), acc.spectral_gap(), rtol=1e-15)
    drift, acc = parse_dist("so2-drift", 16), encodings.get("accumulated", dims, center="rope")
    assert torch.equal(acc.center_b, drift.omega.float()) and torch.equal(acc.width_b, drift.omega.float())
    assert torch.allclose(drift.block_means().abs(), acc.spectral_gap(), rtol=1e-6)  # float32 widths


def test_forget_gate_decay_is_fox_bias():
    z = torch.randn(40, generator=torch.Generator().manual_seed(4)) + 1.0  # float32 logits, tokens 0..39
    bias = forget_bias(log_forget_cumsum(z[None, None]), torch.float64)
    query_row = bias.tile(39, 40, 0, 40)[0, 0, 0].flip(0)  # bias of keys 39, 38, ..., 0 (routes n = 0..39)
    ours = gate_log_decay(z.double().flip(0)[None, :-1])[0]  # the route's tokens from the query back
    assert ours[0] == 0 and torch.allclose(ours, query_row, rtol=0, atol=1e-6)  # FoX: logsigmoid in float32
