"""Check 1: the mixing window of accumulated transports.

Paper "Why do accumulated transformations extrapolate?" (arXiv 2606.24975), Sec. 3,
Theorem 1: for i.i.d. steps with ||E[M]||_op <= beta < 1, ||E[P_n]||_op <= beta^n,
so routes longer than w_eps = ceil(log eps / log beta) are decorrelated to eps
(:func:`experiments.accumulated.window.window_size`, the study's formula).
w_eps depends on beta and eps only, not on the context length. For every
distribution in :mod:`experiments.accumulated.theory.steps`, E[M] is normal, so the bound is an
equality: ||E[P_n]||_op = ||E[M]^n||_op = beta^n.
"""

from __future__ import annotations

import math

import torch

from experiments.accumulated.theory.stats import bernstein_tol, compare
from experiments.accumulated.theory.steps import DTYPE, SO2Steps, SO2Uniform, block_norms, parse_dist, phasor_mean
from experiments.accumulated.window import window_size
from posenc.errors import PosencError

_HORIZON_CAP = 256  # longest simulated route when the window is longer (drift blocks)
_PROFILE_ELEMS = 2**20  # angles held at once when simulating whole contexts


def _horizon(window: float) -> int:
    return int(min(max(2 * window, 8), _HORIZON_CAP))


def mixing_check(
    dist: str = "so2:1",
    d: int = 16,
    eps: float = 0.01,
    samples: int = 20000,
    n_max: int | None = None,
    seed: int = 0,
    delta: float = 1e-3,
) -> dict:
    """Monte Carlo ||E[P_n]||_op against beta^n, n = 0..n_max, and the window w_eps.

    ``dist`` is a spec of :func:`experiments.accumulated.theory.steps.parse_dist`; ``samples``
    routes are drawn per n (float64). Tolerance: matrix Bernstein half-width
    (:func:`bernstein_tol`) at level ``delta`` shared over the n_max + 1 values.
    SO(2) distributions are also checked block by block (|E e^{i Phi_n,b}| vs
    beta_b^n, d = 2 per block), which is what resolves the drift variant.

    Returns a JSON-ready dict: ``beta`` (closed form), ``beta_mc`` (||mean M||),
    ``window``, ``norm_sim`` / ``norm_pred`` (lists over n), ``tolerance``,
    ``max_error``, ``holds`` and, for SO(2), ``blocks``.
    """
    steps = parse_dist(dist, d)
    beta = steps.beta()
    window = window_size(beta, eps)
    n_max = n_max or _horizon(window)
    mean = steps.mean_products(n_max, samples, torch.Generator().manual_seed(seed))
    n = torch.arange(n_max + 1, dtype=DTYPE)
    sim = torch.linalg.matrix_norm(mean, ord=2)
    pred = beta**n
    tol = bernstein_tol(samples, d, delta / (n_max + 1))
    out = {
        "dist": steps.name,
        "d": d,
        "eps": eps,
        "samples": samples,
        "n_max": n_max,
        "beta": beta,
        "beta_mc": float(sim[1]),
        "window": window,
        "norm_sim": sim.tolist(),
        "norm_pred": pred.tolist(),
        "tolerance": tol,
        "max_error": float((sim - pred).abs().max()),
    }
    out["holds"] = compare(sim, pred, tol)
    if isinstance(steps, SO2Steps):
        out["blocks"] = _block_check(steps, mean, n, eps, samples, delta)
        out["holds"] = out["holds"] and out["blocks"]["holds"]
    return out


def _block_check(steps: SO2Steps, mean, n, eps, samples, delta) -> dict:
    betas = steps.block_means().abs()
    sim, pred = block_norms(mean), betas[None, :] ** n[:, None]
    tol = bernstein_tol(samples, 2, delta / mean.shape[0] / betas.numel())
    return {
        "beta": betas.tolist(),
        "window": [window_size(float(b), eps) for b in betas],
        "tolerance": tol,
        "max_error": float((sim - pred).abs().max()),
        "holds": compare(sim, pred, tol),
    }


def window_vs_context(
    dist: str = "so2:1",
    d: int = 16,
    lengths: tuple[int, ...] = (512, 2048, 8192),
    eps: float = 0.01,
    samples: int = 2000,
    seed: int = 0,
    batches: int = 10,
    fit_floor: float = 0.1,
    z: float = 4.0,
) -> dict:
    """Window measured inside whole contexts of each length L: it does not move with L.

    For each L, ``samples`` sequences of L i.i.d. SO(2)-uniform steps; the query is
    the last token and every j < L is a route of n = L-1-j steps. The decay
    profile c_L(n) = |mean over sequences and blocks of exp(i Phi(j -> L-1))|
    (E[P_n] = beta^n I, so pooling the d/2 blocks is exact) is fitted by
    log c_L(n) = n log beta over n with c_L >= ``fit_floor`` (least squares through
    the origin), giving w_L = ceil(log eps / log beta_L). Tolerance:
    |w_L - w_eps| <= 1 + z * SE(w_L), SE by batch means over ``batches`` groups of
    sequences, propagated through w = log eps / log beta.
    """
    steps = parse_dist(dist, d)
    if not isinstance(steps, SO2Uniform):
        raise PosencError(f"window_vs_context needs an so2:<a> distribution, got {dist!r}")
    beta = steps.beta()
    window = window_size(beta, eps)
    gen = torch.Generator().manual_seed(seed)
    per_length = [_window_in_context(steps, L, eps, samples, batches, fit_floor, z, gen) for L in lengths]
    return {
        "dist": steps.name,
        "d": d,
        "eps": eps,
        "samples": samples,
        "beta": beta,
        "window": window,
        "lengths": list(lengths),
        "contexts": per_length,
        "holds": compare([c["window_sim"] for c in per_length], window, [c["tolerance"] for c in per_length]),
    }


def _window_in_context(steps, length, eps, samples, batches, fit_floor, z, gen) -> dict:
    shown = min(length, 4 * window_size(steps.beta(), eps))
    far = torch.unique(torch.logspace(math.log10(shown), math.log10(length - 1), 32).long()) if shown < length else []
    idx = torch.cat([torch.arange(shown), torch.as_tensor(far, dtype=torch.long)])
    per_batch = torch.stack([_route_profile(steps, length, samples // batches, idx, gen) for _ in range(batches)])
    profile = per_batch.mean(0).abs()
    below = (profile[:shown] < fit_floor).nonzero()
    n_fit = int(below[0]) if below.numel() else shown
    if n_fit < 2:
        raise PosencError(f"{steps.name}: the profile drops below {fit_floor} after one step; nothing to fit")
    n = torch.arange(1, n_fit, dtype=DTYPE)
    slope = float(_slope(profile[1:n_fit], n))
    slopes = torch.stack([_slope(p.abs()[1:n_fit], n) for p in per_batch])
    se = float(slopes.std()) / math.sqrt(batches)
    return {
        "length": length,
        "beta_sim": math.exp(slope),
        "window_sim": window_size(math.exp(slope), eps),
        "tolerance": 1 + z * abs(math.log(eps)) * se / slope**2,
        "far_max": float(profile[shown:].max()) if shown < length else None,
        "profile": profile[:shown].tolist(),
    }


def _slope(profile: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    # least squares through the origin: log c(0) = 0 exactly since P_0 = I
    return (n * profile.clamp_min(1e-300).log()).sum() / (n * n).sum()


def _route_profile(steps: SO2Uniform, length: int, n_seq: int, idx: torch.Tensor, gen) -> torch.Tensor:
    """mean over n_seq sequences and blocks of exp(i Phi(L-1-n -> L-1)) at n = idx: complex."""
    chunk = max(1, _PROFILE_ELEMS // (length * steps.d // 2))
    total = torch.zeros(idx.numel(), dtype=torch.complex128)
    for start in range(0, n_seq, chunk):
        theta = steps.angles((min(chunk, n_seq - start), length - 1), gen)
        # route of n steps ending at the last token: the last n angles, summed in float64
        phi = torch.cat([torch.zeros_like(theta[:, :1]), theta.flip(1).cumsum(1)], 1)
        total += phasor_mean(phi[:, idx], (0, 2)) * phi.shape[0]
    return total / n_seq
