"""The mixing window of accumulated transports (arXiv 2606.24975, Sec. 3, Theorem 1).

For i.i.d. steps with spectral gap ||E[M]||_op <= beta < 1, routes longer than
w_eps = ceil(log eps / log beta) are decorrelated to eps. The accumulated scheme's description and
``posenc diagnose`` report it; a study may add it to the reports (``experiments/accumulated/window.py``).
"""

from __future__ import annotations

import math

from posenc.errors import PosencError


def check_eps(eps: float) -> None:
    """Mixing tolerance must lie in (0, 1); PosencError otherwise."""
    if not 0.0 < eps < 1.0:
        raise PosencError(f"eps must be in (0, 1), got {eps}")


def window_size(beta: float, eps: float) -> float:
    """w_eps = ceil(log eps / log beta), the first n with beta^n <= eps.

    beta = 0 gives 1 (one step mixes, e.g. Haar); beta >= 1 gives ``math.inf``
    (no window: deterministic steps such as RoPE never decorrelate). PosencError
    for beta < 0 or eps outside (0, 1).
    """
    check_eps(eps)
    if beta < 0:
        raise PosencError(f"spectral gap beta must be >= 0, got {beta}")
    if beta == 0:
        return 1
    if beta >= 1:
        return math.inf
    # shave a few ulps so that beta^n == eps exactly gives n, not n + 1
    return max(1, math.ceil(math.log(eps) / math.log(beta) * (1 - 1e-12)))
