"""Check 5: long-range decay and translation invariance of positional scores.

Following the survey (seeds/003, Sec. 2.2, 3.2, 5): the score between a query at
position i and a key at j, averaged over random content q = k ~ N(0, I/d)
(E|q|^2 = 1), as a function of the distance D = i - j. Closed forms:

- sinusoidal (additive, Vaswani et al. 2017; PE[2b] = sin(t w_b), PE[2b+1] = cos(t w_b),
  w_b = 10000^(-2b/d)): E (q + p_i)^T (q + p_j) = 1 + sum_b cos(D w_b);
- RoPE (Su et al. 2024), theta_b = base^(-2b/d): (2/d) sum_b cos(D theta_b);
- xPos (Sun et al. 2023): RoPE times zeta_b^(D/B), zeta_b = (2b + 0.4 d)/(1.4 d), B = 512:
  (2/d) sum_b zeta_b^(D/B) cos(D theta_b); scales are taken relative to the key
  position so only the bounded exponent D/B appears (``posenc.encodings.xpos``);
- PoPE (Gopalakrishnan et al. 2025): d frequencies theta_c = base^(-(c-1)/d), c = 1..d
  (the survey writes base^((c-1)/d), dropping the minus sign), magnitudes softplus:
  score sum_c mu_qc mu_kc cos((j - i) theta_c + delta_c); with delta = 0,
  E = E[softplus(x)^2] sum_c cos(D theta_c), x ~ N(0, 1/d);
- ALiBi (Press et al. 2022): q^T k - m D, mean 1 - m D.

Relative schemes depend on i - j only; the additive table does not (its cross
terms q^T p_j depend on absolute positions), and accumulated transports depend on
the tokens in between (route i <- j), not on the distance.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from experiments.accumulated.theory.stats import compare, z_value
from experiments.accumulated.theory.steps import DTYPE
from posenc.attention import rotate
from posenc.encodings.absolute import sinusoidal_table
from posenc.encodings.bias import alibi_slopes, distance_penalty
from posenc.encodings.polar import pope_features, pope_freqs
from posenc.encodings.xpos import SCALE_BASE, xpos_score, xpos_zeta
from posenc.rope import rope_inv_freq

ALIBI_SLOPE = float(alibi_slopes(8)[3])  # the scheme's slope of head 4 of 8 (Press et al.): m = 1/16
TRANSLATION_INVARIANT = ("rope-10000", "rope-500000", "xpos", "pope", "alibi")  # scores depend on i - j only
CHECKPOINTS = (1, 16, 256, 4096)  # distances quoted in the summary


def _rope(base):
    def score(q, k, i, j):
        theta = rope_inv_freq(q.shape[-1], base)
        return (rotate(q, i[..., None] * theta, "adjacent") * rotate(k, j[..., None] * theta, "adjacent")).sum(-1)

    return score


def _xpos(q, k, i, j):
    return xpos_score(q, k, i, j, pairing="adjacent")  # the scheme's formula, its default B


def _pope(q, k, i, j, delta=None):
    # the scheme's features: absolute phases i*theta (query) and j*theta + delta (key), a real dot product of size 2d
    theta = pope_freqs(q.shape[-1])
    return (pope_features(q, i, theta) * pope_features(k, j, theta, None if delta is None else delta[None])).sum(-1)


def _sinusoidal(q, k, i, j):
    d = q.shape[-1]
    return ((q + sinusoidal_table(i, d)) * (k + sinusoidal_table(j, d))).sum(-1)


def _alibi(q, k, i, j):
    return (q * k).sum(-1) + distance_penalty(ALIBI_SLOPE, i, j)


SCHEMES = {
    "sinusoidal": _sinusoidal,
    "rope-10000": _rope(10000.0),
    "rope-500000": _rope(500000.0),
    "xpos": _xpos,
    "pope": _pope,
    "alibi": _alibi,
}


def expected_score(scheme: str, dist: np.ndarray, d: int) -> np.ndarray:
    """Closed-form E score(D) over q = k ~ N(0, I/d) (module docstring): (len(dist),) float64."""
    D = np.asarray(dist, dtype=float)[:, None]
    if scheme == "sinusoidal":
        return 1 + np.cos(D * rope_inv_freq(d).numpy()).sum(1)
    if scheme.startswith("rope-"):
        return np.cos(D * rope_inv_freq(d, float(scheme[5:])).numpy()).mean(1)
    if scheme == "xpos":
        z = xpos_zeta(d).numpy()
        return (z ** (D / SCALE_BASE) * np.cos(D * rope_inv_freq(d).numpy())).mean(1)
    if scheme.startswith("pope"):
        theta = pope_freqs(d).numpy()
        if scheme == "pope-survey-sign":  # the survey's base^((c-1)/d)
            theta = 1 / theta
        return _softplus_sq(d) * np.cos(D * theta).sum(1)
    if scheme == "alibi":
        return 1 - ALIBI_SLOPE * D[:, 0]
    raise KeyError(scheme)


def _softplus_sq(d: int) -> float:
    """E softplus(x)^2, x ~ N(0, 1/d), by Gauss-Hermite quadrature."""
    x, w = np.polynomial.hermite_e.hermegauss(64)
    return float((w * np.logaddexp(0, x / math.sqrt(d)) ** 2).sum() / w.sum())


def long_range_decay(
    d: int = 64,
    max_dist: int = 8192,
    samples: int = 2000,
    seed: int = 0,
    delta: float = 1e-3,
) -> dict:
    """E score(D) / E score(0) for each scheme: closed form and Monte Carlo, D in [0, max_dist].

    Closed forms on ``dist`` (0 and ~400 log-spaced distances); Monte Carlo on a
    coarser log ``grid``: ``samples`` draws of q = k ~ N(0, I/d) and a key position
    j in [0, 1000) per point, scored by the scheme itself (float64). Check: the
    mean equals the closed form within z standard errors (Bonferroni z over all
    schemes and grid points at level ``delta``). ``far_residual`` is the mean
    |normalized score| over D in [max_dist/2, max_dist]. ``pope-survey-sign``
    (closed form only) shows what the survey's sign error does.
    """
    gen = torch.Generator().manual_seed(seed)
    dist = _log_grid(max_dist, 400)
    grid = _log_grid(max_dist, 24)
    far = np.arange(max_dist // 2, max_dist + 1)
    z = z_value(len(SCHEMES) * len(grid), delta)
    out = {"d": d, "max_dist": max_dist, "samples": samples, "dist": dist.tolist(), "grid": grid.tolist(), "z": z}
    out["schemes"] = {
        name: _decay_one(name, score, d, dist, grid, far, samples, z, gen) for name, score in SCHEMES.items()
    }
    survey = expected_score("pope-survey-sign", np.concatenate([[0], dist, far]), d)
    out["schemes"]["pope-survey-sign"] = {
        "curve": _normalized(survey[: len(dist)]),
        "far_residual": float(np.mean(np.abs(survey[-len(far) :] / survey[0]))),
        "at": _checkpoints("pope-survey-sign", d, max_dist),
    }
    out["holds"] = all(s.get("holds", True) for s in out["schemes"].values())
    return out


def _log_grid(max_dist: int, points: int) -> np.ndarray:
    return np.unique(np.concatenate([[0], np.geomspace(1, max_dist, points).round()])).astype(int)


def _decay_one(name, score, d, dist, grid, far, samples, z, gen) -> dict:
    exact = expected_score(name, grid, d)
    q = torch.randn(len(grid), samples, d, generator=gen, dtype=DTYPE) / math.sqrt(d)
    j = torch.randint(0, 1000, (len(grid), samples), generator=gen).to(DTYPE)
    s = score(q, q, j + torch.as_tensor(grid, dtype=DTYPE)[:, None], j)
    mean, se = s.mean(1).numpy(), s.std(1).numpy() / math.sqrt(samples)
    return {
        "curve": _normalized(expected_score(name, dist, d)),
        "mc_mean": (mean / exact[0]).tolist(),
        "max_z_error": float(np.max(np.abs(mean - exact) / se)),
        "far_residual": float(np.mean(np.abs(expected_score(name, far, d) / exact[0]))),
        "at": _checkpoints(name, d, far[-1]),
        "holds": compare(mean, exact, z * se),
    }


def _checkpoints(name: str, d: int, max_dist: int) -> dict[str, float]:
    """Normalized closed-form score at the CHECKPOINTS distances <= max_dist."""
    dist = [D for D in CHECKPOINTS if D <= max_dist]
    values = expected_score(name, np.array([0, *dist]), d)
    return {str(D): float(v / values[0]) for D, v in zip(dist, values[1:])}


def _normalized(curve: np.ndarray) -> list[float]:
    return (curve / curve[0]).tolist()


def translation_invariance(
    d: int = 64,
    samples: int = 256,
    shifts: tuple[int, ...] = (1, 1000, 100000),
    a: float = 1.0,
    vocab: int = 256,
    seed: int = 0,
    rtol: float = 1e-9,
    fail_rtol: float = 1e-2,
) -> dict:
    """max |score(i + s, j + s) - score(i, j)| / max |score| per scheme, over random q, k, (i, j), s.

    Invariant means relative change <= ``rtol`` (float64 rounding of angles up to
    1e5 rad is ~1e-11); not invariant means >= ``fail_rtol``. Accumulated SO(2)
    routes (angles U[-a, a]) are run twice: i.i.d. steps per position (the shift
    changes the tokens in between: not invariant) and a fixed angle per token id
    with the same tokens shifted along (invariant: the route depends on content).
    """
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(samples, d, generator=gen, dtype=DTYPE) / math.sqrt(d) for _ in range(2))
    j = torch.randint(0, 512, (samples,), generator=gen).to(DTYPE)
    i = j + torch.randint(0, 512, (samples,), generator=gen).to(DTYPE)
    delta = -2 * math.pi * torch.rand(d, generator=gen, dtype=DTYPE)  # PoPE phase bias in [-2pi, 0]
    scores = dict(SCHEMES, pope=lambda q, k, i, j: _pope(q, k, i, j, delta))
    out = {}
    for name, score in scores.items():
        base = score(q, k, i, j)
        change = max(float((score(q, k, i + s, j + s) - base).abs().max()) for s in shifts)
        out[name] = _verdict(change / float(base.abs().max()), name in TRANSLATION_INVARIANT, rtol, fail_rtol)
    for name, (before, after) in _accumulated_pairs(q, k, i, j, shifts, a, vocab, gen).items():
        change = max(float((x - before).abs().max()) for x in after)
        out[name] = _verdict(change / float(before.abs().max()), name == "accumulated-token", rtol, fail_rtol)
    return {
        "d": d,
        "shifts": list(shifts),
        "rtol": rtol,
        "fail_rtol": fail_rtol,
        "schemes": out,
        "holds": all(v["holds"] for v in out.values()),
    }


def _verdict(rel_change: float, expect_invariant: bool, rtol: float, fail_rtol: float) -> dict:
    ok = compare(rel_change, rtol, side="upper") if expect_invariant else compare(rel_change, fail_rtol, side="lower")
    return {"rel_change": rel_change, "expected_invariant": expect_invariant, "holds": ok}


def _accumulated_pairs(q, k, i, j, shifts, a, vocab, gen) -> dict:
    """Scores q^T R(Phi_i - Phi_j) k at (i, j) and at the shifted positions, for both variants."""
    d, length = q.shape[-1], int(i.max()) + 1
    table = a * (2 * torch.rand(vocab, d // 2, generator=gen, dtype=DTYPE) - 1)
    tokens = torch.randint(0, vocab, (length,), generator=gen)
    iid = a * (2 * torch.rand(length + max(shifts), d // 2, generator=gen, dtype=DTYPE) - 1)

    def route_score(theta, ii, jj):
        phi = torch.cat([torch.zeros_like(theta[:1]), theta[1:].cumsum(0)])  # step t acts at token t
        return (rotate(q, -phi[ii.long()], "adjacent") * rotate(k, -phi[jj.long()], "adjacent")).sum(-1)

    shifted_tokens = [torch.cat([torch.randint(0, vocab, (s,), generator=gen), tokens]) for s in shifts]
    return {
        "accumulated-iid": (route_score(iid, i, j), [route_score(iid, i + s, j + s) for s in shifts]),
        "accumulated-token": (
            route_score(table[tokens], i, j),
            [route_score(table[t], i + s, j + s) for s, t in zip(shifts, shifted_tokens)],
        ),
    }
