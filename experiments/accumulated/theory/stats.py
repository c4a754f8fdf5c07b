"""Monte Carlo tolerances that follow from the sample size.

Every check compares a closed form (or bound) with a simulation at a stated
family-wise failure probability ``delta`` (default 1e-3 per check), through
:func:`compare`.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import torch

from posenc.errors import PosencError

SIDES = ("both", "upper", "lower")


def compare(sim, bound, tol=0.0, side: str = "both") -> bool:
    """Whether a simulation meets its closed form or bound within ``tol`` at every point.

    ``side``: ``"both"`` |sim - bound| <= tol (a closed form), ``"upper"``
    sim <= bound + tol (an upper bound), ``"lower"`` sim >= bound - tol (a lower
    bound). sim, bound, tol: floats, sequences, arrays or tensors that broadcast
    together, compared in float64; NaN never holds. PosencError for another side.
    """
    if side not in SIDES:
        raise PosencError(f"side must be one of {', '.join(SIDES)}, got {side!r}")
    sim, bound, tol = (torch.as_tensor(x, dtype=torch.float64) for x in (sim, bound, tol))
    if side == "upper":
        return bool((sim <= bound + tol).all())
    if side == "lower":
        return bool((sim >= bound - tol).all())
    return bool(((sim - bound).abs() <= tol).all())


def bernstein_tol(samples: int, d: int, delta: float) -> float:
    """Half-width t: P(||mean of N i.i.d. d x d matrices - E||_op >= t) <= delta.

    For X with ||X||_op <= 1 (orthogonal or contractive transports). Rectangular
    matrix Bernstein (Tropp 2012, "User-friendly tail bounds for sums of random
    matrices", Thm 1.6) on Z_k = (X_k - E X)/N: ||Z_k|| <= R = 2/N and
    sigma^2 <= ||E X X^T||/N <= 1/N, so P(||sum Z_k|| >= t) <= 2d exp(-(t^2/2)/(sigma^2 + R t/3));
    solved for t at probability delta.
    """
    log_term = math.log(2 * d / delta)
    r = 2.0 * log_term / (3.0 * samples)
    return r + math.sqrt(r * r + 2.0 * log_term / samples)


def proportion_tol(samples: int, delta: float) -> float:
    """One-sided Hoeffding half-width for an empirical frequency: sqrt(log(1/delta) / (2N))."""
    return math.sqrt(math.log(1.0 / delta) / (2.0 * samples))


def z_value(tests: int, delta: float) -> float:
    """Two-sided normal quantile for ``tests`` comparisons at family-wise level delta (Bonferroni)."""
    return NormalDist().inv_cdf(1.0 - delta / (2.0 * tests))
