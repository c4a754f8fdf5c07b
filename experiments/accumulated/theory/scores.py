"""Check 2: the score gap between near and far routes.

Paper arXiv 2606.24975, Sec. 3 (score-side decoherence): a near route (n < w_eps)
keeps q^T P_n k close to q^T k, while a far route (n >> w_eps) gives a score that
concentrates at 0 as d grows. Bounds on P(|q^T P_n k| > t) for fixed unit q, k:

- SO(2) blocks (Hoeffding 1963, Thm 2): the score is a sum over the d/2 blocks of
  independent terms X_b = |q_b||k_b| cos(Phi_b + psi_b) in [-r_b, r_b],
  r_b = |q_b||k_b|, so P(|s| > t) <= 2 exp(-(t - |E s|)^2 / (2 sum_b r_b^2)),
  with E s = q^T E[M]^n k exact (|E s| <= beta^n).
- Haar O(d) (Levy concentration; Ball 1997, "An elementary introduction to modern
  convex geometry", Lemma 2.2: a cap {x_1 >= t} of S^{d-1} has measure <=
  exp(-d t^2/2)): U k is uniform on S^{d-1}, so P(|q^T U k| > t) <= 2 exp(-d t^2/2).
- Householder-like steps (not orthogonal, no Levy bound): Chebyshev,
  P(|s| > t) <= E[s^2] / t^2 with E[s^2] exact (:meth:`Householder.second_moment`).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from experiments.accumulated.theory.stats import compare, proportion_tol, z_value
from experiments.accumulated.theory.steps import DTYPE, Haar, Householder, SO2Steps, StepDist, parse_dist, unit_vectors
from experiments.accumulated.window import window_size
from posenc.errors import PosencError

FAR_CAP = 4096  # longest far route simulated; windows beyond it have no reachable far regime
THRESHOLDS = tuple(np.round(np.linspace(0.05, 0.95, 19), 2))
_BINS = np.linspace(-1.0, 1.0, 81)


def mean_score(steps: StepDist, q: torch.Tensor, k: torch.Tensor, n: int) -> float:
    """E[q^T P_n k] = q^T E[M]^n k, exact (i.i.d. steps)."""
    return float(q @ torch.linalg.matrix_power(steps.mean_step(), n) @ k)


def tail_bound(steps: StepDist, q: torch.Tensor, k: torch.Tensor, n: int, t: torch.Tensor) -> torch.Tensor:
    """Upper bound on P(|q^T P_n k| > t) for each t (see module docstring), clipped to 1."""
    if n == 0:
        return (abs(float(q @ k)) > t).to(DTYPE)
    if isinstance(steps, SO2Steps):
        r2 = (q.view(-1, 2).norm(dim=-1) * k.view(-1, 2).norm(dim=-1)).square().sum()
        gap = (t - abs(mean_score(steps, q, k, n))).clamp_min(0)
        bound = 2 * torch.exp(-gap.square() / (2 * r2))
    elif isinstance(steps, Haar):
        bound = 2 * torch.exp(-steps.d * t.square() / 2)
    elif isinstance(steps, Householder):
        bound = steps.second_moment(q, k, n) / t.square()
    else:
        raise PosencError(f"no tail bound for {steps.name}")
    return bound.clamp_max(1.0)


def score_gap(
    dist: str = "so2:1",
    dims: tuple[int, ...] = (8, 16, 32, 64, 128),
    eps: float = 0.01,
    samples: int = 10000,
    seed: int = 0,
    delta: float = 1e-3,
    thresholds: tuple[float, ...] = THRESHOLDS,
) -> dict:
    """Near (n = 1) and far (n = 2 w_eps) route scores q^T P_n k, q = k a random unit vector.

    Per d: ``samples`` routes of each kind (float64). Checks, at family-wise level
    ``delta``: the empirical far tail P(|s| > t) <= bound(t) + Hoeffding frequency
    tolerance (:func:`proportion_tol`) at every t in ``thresholds``; and the near / far
    mean scores equal q^T E[M]^n k within z standard errors (Bonferroni z). For
    Haar steps the only near route is n = 0 (any step mixes).
    """
    t = torch.tensor(thresholds, dtype=DTYPE)
    per_dim = []
    gen = torch.Generator().manual_seed(seed)
    for d in dims:
        steps = parse_dist(dist, d)
        window = window_size(steps.beta(), eps)
        if window * 2 > FAR_CAP:
            raise PosencError(f"{steps.name}: window {window} > {FAR_CAP // 2} steps; no far routes to simulate")
        per_dim.append(_one_dim(steps, window, samples, t, gen))
    tests = len(dims) * len(thresholds)
    tol = proportion_tol(samples, delta / tests)
    z = z_value(2 * len(dims), delta)
    for r in per_dim:
        r["tail_holds"] = compare(r["tail_sim"], r["tail_bound"], tol, "upper")
        r["mean_holds"] = all(
            compare(r[f"{w}_mean"], r[f"{w}_pred"], z * r[f"{w}_se"] + 1e-12) for w in ("near", "far")
        )
    return {
        "dist": per_dim[0]["dist"],
        "dims": list(dims),
        "samples": samples,
        "thresholds": list(thresholds),
        "tail_tolerance": tol,
        "z": z,
        "per_dim": per_dim,
        "holds": all(r["tail_holds"] and r["mean_holds"] for r in per_dim),
    }


def _one_dim(steps: StepDist, window: int, samples: int, t: torch.Tensor, gen) -> dict:
    q = unit_vectors(1, steps.d, gen)[0]
    k = q
    routes = {"near": min(1, window - 1), "far": 2 * window}
    out = {"dist": steps.name, "d": steps.d, "window": window, "n_near": routes["near"], "n_far": routes["far"]}
    for which, n in routes.items():
        s = steps.apply(k.expand(samples, -1).clone(), n, gen) @ q
        out[f"{which}_mean"] = float(s.mean())
        out[f"{which}_se"] = float(s.std()) / math.sqrt(samples)
        out[f"{which}_pred"] = mean_score(steps, q, k, n)
        out[f"{which}_hist"] = np.histogram(s.numpy(), _BINS)[0].tolist()
        if which == "far":
            out["far_std"] = float(s.std())
            out["far_above_near"] = float((s >= out["near_pred"]).to(DTYPE).mean())
            out["tail_sim"] = (s.abs()[:, None] > t).to(DTYPE).mean(0).tolist()
            out["tail_bound"] = tail_bound(steps, q, k, n, t).tolist()
    return out
