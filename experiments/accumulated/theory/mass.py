"""Checks 3 and 4: far attention mass and value-side incoherence.

Stylized attention (paper arXiv 2606.24975, Sec. 2 and 4-5): one query, K near
tokens (route lengths n = 0..K-1) and M far tokens (n = K..K+M-1), all routes
ending at the query along one sequence of i.i.d. SO(2)-uniform steps. Scores
s_n = q^T P_n q with a unit q, so logits lambda * s_n lie in [-lambda, lambda].

Far mass rho_D = sum_far e^{l_j} / sum_all e^{l_j} (Sec. 4):

- bounded logits: rho_D >= M / (M + K e^{2 lambda}) for every realization (far
  logits >= -lambda, near <= lambda); equality for near = +lambda, far = -lambda.
  The bound tends to 1 as M grows: rotations alone cannot keep the near signal.
- ALiBi (Press et al. 2022), logits l_n - m n: the same argument with geometric
  sums gives 1/(1 + e^{2 lambda} G) <= rho_D <= 1/(1 + e^{-2 lambda} G),
  G = (e^{mK} - 1) / (1 - e^{-mM}) >= e^{mK} - 1, so rho_D stays below 1 for all M.
- forget gate (FoX, Lin et al. 2025), logits l_n + Lambda_n with Lambda_n the sum
  of log sigmoid(z_t) over the n route tokens, z_t ~ N(mu, sigma^2) i.i.d.:
  E e^{Lambda_n} = f^n, f = E sigmoid(z); the query's own term gives the
  denominator >= e^{-lambda}, and x -> x / (c + x) is concave, so by Jensen
  E rho_D <= 1 / (1 + e^{-2 lambda} (1 - f) / (f^K (1 - f^M))) for all M.

Value side (Sec. 5, shared-background model, Definition 1): far values
v_j = g + n_j, g ~ N(0, sigma_g^2 I), n_j ~ N(0, sigma_n^2 I) independent, far
contribution e = sum_far a_j P_j v_j. Given weights and transports,
Cov(e) = sigma_g^2 B B^T + sigma_n^2 sum a_j^2 I with B = sum_far a_j P_j:

- identity value transport: B = rho_D I, ||Cov|| = sigma_g^2 rho_D^2 + sigma_n^2 sum a^2
  (coherent: the background survives as rho_D^2);
- SO(2) value transport: block b of B is z_b = sum a_j e^{i Psi_jb}; with phases
  independent of the weights, E|z_b|^2 = sum_jl a_j a_l beta^{|j-l|} (route between
  far tokens j, l), i.e. ~ sum a^2 (1 + beta)/(1 - beta): incoherent.
  Value phases are drawn independently of the query/key phases here so that this
  expectation is exact.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from experiments.accumulated.theory.stats import compare, z_value
from experiments.accumulated.theory.steps import DTYPE, SO2Uniform, parse_dist, unit_vectors
from posenc.encodings.forget import log_forget_cumsum
from posenc.errors import PosencError

_SCORE_ELEMS = 2**20  # angles held at once


def far_mass_bound(M, K: int, lam: float):
    """Lower bound rho_D >= M / (M + K e^{2 lambda}) for logits in [-lambda, lambda]."""
    return M / (M + K * math.exp(2 * lam))


def alibi_bounds(M, K: int, lam: float, slope: float):
    """(lower, upper) on rho_D with ALiBi bias -slope * n and logits in [-lambda, lambda]."""
    g = math.expm1(slope * K) / -np.expm1(-slope * np.asarray(M, dtype=float))
    return 1 / (1 + math.exp(2 * lam) * g), 1 / (1 + math.exp(-2 * lam) * g)


def gate_mean(mu: float, sigma: float) -> float:
    """E sigmoid(z), z ~ N(mu, sigma^2), by 64-point Gauss-Hermite quadrature."""
    x, w = np.polynomial.hermite_e.hermegauss(64)
    return float((w / (1 + np.exp(-(mu + sigma * x)))).sum() / w.sum())


def forget_gate_bound(M, K: int, lam: float, f: float):
    """Upper bound on E rho_D with a forget gate of mean f (module docstring)."""
    tail = f**K * -np.expm1(np.asarray(M, dtype=float) * math.log(f))
    return 1 / (1 + math.exp(-2 * lam) * (1 - f) / tail)


def gate_log_decay(z: torch.Tensor) -> torch.Tensor:
    """Forget-gate bias Lambda_n of the routes n = 0..R-1: the sum of log sigmoid(z_t) over the
    route's n tokens (FoX's Lambda_i - Lambda_j, ``posenc.encodings.forget``).

    z: (samples, R-1) gate logits of the tokens from the query back; returns (samples, R), z's dtype, Lambda_0 = 0.
    """
    return torch.cat([torch.zeros_like(z[:, :1]), log_forget_cumsum(z).to(z.dtype)], 1)


def route_scores(steps: SO2Uniform, q: torch.Tensor, routes: int, samples: int, gen) -> torch.Tensor:
    """s_n = q^T P_n q for n = 0..routes-1 along one step sequence per sample: (samples, routes)."""
    weights = q.view(-1, 2).square().sum(-1)  # |q_b|^2
    chunk = max(1, _SCORE_ELEMS // (routes * steps.d // 2))
    out = []
    for start in range(0, samples, chunk):
        phi = _route_phases(steps, routes, min(chunk, samples - start), gen)
        out.append(torch.cos(phi) @ weights)
    return torch.cat(out)


def _route_phases(steps: SO2Uniform, routes: int, samples: int, gen) -> torch.Tensor:
    theta = steps.angles((samples, routes - 1), gen)
    return torch.cat([torch.zeros_like(theta[:, :1]), theta.cumsum(1)], 1)  # (samples, routes, d/2)


def _far_share(weights: torch.Tensor, K: int, Ms: list[int]) -> torch.Tensor:
    """rho_D for each M from unnormalized weights (samples, routes): (samples, len(Ms))."""
    cs = weights.cumsum(1)
    total = cs[:, [K + m - 1 for m in Ms]]
    return (total - cs[:, K - 1 : K]) / total


def far_mass(
    K: int = 8,
    lam: float = 2.0,
    Ms: tuple[int, ...] = tuple(2**i for i in range(4, 17)),
    d: int = 16,
    a: float = 1.0,
    slope: float = 0.25,
    gate: tuple[float, float] = (1.0, 1.0),
    samples: int = 64,
    seed: int = 0,
    delta: float = 1e-3,
) -> dict:
    """Far mass rho_D against M for no bias, ALiBi (``slope``) and a forget gate (``gate`` = mu, sigma).

    Checks: the deterministic bounds hold on every sample (tolerance 1e-12,
    float64 rounding); the worst case attains the no-bias bound; the forget-gate
    mean stays below its Jensen bound within z standard errors (Bonferroni z at
    level ``delta``). Lists are indexed like ``Ms``.
    """
    _validate(K, lam, Ms)
    steps = parse_dist(f"so2:{a}", d)
    gen = torch.Generator().manual_seed(seed)
    q = unit_vectors(1, d, gen)[0]
    routes = K + max(Ms)
    base = torch.exp(lam * (route_scores(steps, q, routes, samples, gen) - 1))  # e^{l - lambda} <= 1
    n = torch.arange(routes, dtype=DTYPE)
    z = torch.randn(samples, routes - 1, generator=gen, dtype=DTYPE) * gate[1] + gate[0]
    log_gate = gate_log_decay(z)
    rho = {
        "none": _far_share(base, K, list(Ms)),
        "alibi": _far_share(base * torch.exp(-slope * n), K, list(Ms)),
        "forget_gate": _far_share(base * torch.exp(log_gate), K, list(Ms)),
    }
    worst = torch.cat([torch.ones(K, dtype=DTYPE), torch.full((max(Ms),), math.exp(-2 * lam), dtype=DTYPE)])[None]
    f = gate_mean(*gate)
    lower = far_mass_bound(np.asarray(Ms, dtype=float), K, lam)
    a_lo, a_hi = alibi_bounds(Ms, K, lam, slope)
    fg_hi = forget_gate_bound(Ms, K, lam, f)
    fg_mean, fg_se = rho["forget_gate"].mean(0), rho["forget_gate"].std(0) / math.sqrt(samples)
    zq = z_value(len(Ms), delta)
    checks = {  # bounds on every sample: tolerance 1e-12 (float64 rounding); the gate's mean: z SE
        "bound": compare(rho["none"].min(0).values, lower, 1e-12, "lower"),
        "tight": compare(_far_share(worst, K, list(Ms))[0], lower, 1e-12),
        "alibi": compare(rho["alibi"], a_lo, 1e-12, "lower") and compare(rho["alibi"], a_hi, 1e-12, "upper"),
        "forget_gate": compare(fg_mean, fg_hi, zq * fg_se, "upper"),
    }
    return {
        "K": K,
        "lambda": lam,
        "Ms": list(Ms),
        "d": d,
        "a": a,
        "samples": samples,
        "alibi_slope": slope,
        "gate": {"mu": gate[0], "sigma": gate[1], "mean": f},
        "lower_bound": lower.tolist(),
        "alibi_lower": a_lo.tolist(),
        "alibi_upper": a_hi.tolist(),
        "alibi_sup": 1 / (1 + math.exp(-2 * lam) * math.expm1(slope * K)),
        "forget_gate_upper": fg_hi.tolist(),
        "forget_gate_sup": forget_gate_bound(math.inf, K, lam, f).item(),
        "rho_mean": {k: v.mean(0).tolist() for k, v in rho.items()},
        "rho_min": {k: v.min(0).values.tolist() for k, v in rho.items()},
        "rho_max": {k: v.max(0).values.tolist() for k, v in rho.items()},
        "checks": checks,
        "holds": all(checks.values()),
    }


def value_incoherence(
    K: int = 8,
    lam: float = 2.0,
    Ms: tuple[int, ...] = tuple(2**i for i in range(4, 13)),
    d: int = 16,
    a: float = 1.0,
    samples: int = 256,
    seed: int = 0,
    sigma_g: float = 1.0,
    sigma_n: float = 1.0,
    delta: float = 1e-3,
) -> dict:
    """||Cov(e_i)|| of the far contribution: identity vs SO(2) value transport, against M.

    Weights a_j: softmax over the K + M route scores of :func:`far_mass` (no bias).
    Simulation: exact conditional covariance per sampled environment (weights and
    transports), averaged over ``samples`` environments. Check: the mean of
    tr(Cov)/d under SO(2) transport matches sigma_g^2 sum_jl a_j a_l beta^{|j-l|}
    + sigma_n^2 sum a^2 within z standard errors (Bonferroni z at level ``delta``).
    """
    _validate(K, lam, Ms)
    steps = parse_dist(f"so2:{a}", d)
    beta = steps.beta()
    gen = torch.Generator().manual_seed(seed)
    q = unit_vectors(1, d, gen)[0]
    routes = K + max(Ms)
    base = torch.exp(lam * (route_scores(steps, q, routes, samples, gen) - 1))
    psi = _route_phases(steps, routes, samples, gen)  # value phases, independent of q/k phases
    cos_psi, sin_psi = torch.cos(psi), torch.sin(psi)
    rows = []
    for m in Ms:
        w = base[:, : K + m]
        far = (w / w.sum(1, keepdim=True))[:, K:]
        zr = torch.einsum("sj,sjb->sb", far, cos_psi[:, K : K + m])
        zi = torch.einsum("sj,sjb->sb", far, sin_psi[:, K : K + m])
        rows.append(_value_row(m, far, zr.square() + zi.square(), beta, sigma_g, sigma_n))
    zq = z_value(len(Ms), delta)
    for r in rows:
        r["holds"] = compare(r["incoherent_trace"], r["incoherent_pred"], zq * r["incoherent_se"])
    return {
        "K": K,
        "lambda": lam,
        "d": d,
        "a": a,
        "beta": beta,
        "samples": samples,
        "sigma_g": sigma_g,
        "sigma_n": sigma_n,
        "z": zq,
        "per_M": rows,
        "holds": all(r["holds"] for r in rows),
    }


def _value_row(m: int, far: torch.Tensor, z2: torch.Tensor, beta: float, sigma_g: float, sigma_n: float) -> dict:
    rho, sq = far.sum(1), far.square().sum(1)
    trace = sigma_g**2 * z2.mean(1) + sigma_n**2 * sq
    pred = sigma_g**2 * _geometric_form(far, beta) + sigma_n**2 * sq
    return {
        "M": m,
        "rho": float(rho.mean()),
        "rho_sq": float(rho.square().mean()),
        "sum_sq_weights": float(sq.mean()),
        "coherent": float((sigma_g**2 * rho.square() + sigma_n**2 * sq).mean()),
        "incoherent": float((sigma_g**2 * z2.max(1).values + sigma_n**2 * sq).mean()),
        "incoherent_trace": float(trace.mean()),
        "incoherent_pred": float(pred.mean()),
        "incoherent_se": float((trace - pred).std()) / math.sqrt(far.shape[0]),
    }


def _geometric_form(x: torch.Tensor, beta: float) -> torch.Tensor:
    """sum_jl x_j x_l beta^{|j-l|} per row of x (samples, M): (samples,)."""
    m = x.shape[1]
    kernel = beta ** torch.arange(m, dtype=DTYPE)
    kernel[0] = 0.0
    # c_j = sum_{l>=1} beta^l x_{j-l}: a causal linear convolution, via FFT of length 2M (no wrap-around)
    c = torch.fft.irfft(torch.fft.rfft(x, 2 * m) * torch.fft.rfft(kernel, 2 * m), 2 * m)[:, :m]
    return x.square().sum(1) + 2 * (x * c).sum(1)


def _validate(K: int, lam: float, Ms) -> None:
    if K < 1 or not lam > 0 or not Ms or min(Ms) < 1:
        raise PosencError(f"need K >= 1, lambda > 0 and far counts M >= 1 (got K={K}, lambda={lam}, Ms={list(Ms)})")
