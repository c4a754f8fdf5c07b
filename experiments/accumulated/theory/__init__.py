"""Monte Carlo checks of the stylized model of accumulated transports.

Paper: "Why do accumulated transformations extrapolate?" (arXiv 2606.24975);
positional-encoding survey (seeds/003) for the long-range decay check.

1. :func:`mixing_check`, :func:`window_vs_context` - ||E[P_n]|| = beta^n, w_eps.
2. :func:`score_gap` - near vs far route scores, Hoeffding / Levy / Chebyshev tails.
3. :func:`far_mass` - rho_D >= M / (M + K e^(2 lambda)); ALiBi and forget-gate control.
4. :func:`value_incoherence` - coherent vs incoherent far value contribution.
5. :func:`long_range_decay`, :func:`translation_invariance` - survey schemes.

:func:`run_theory` runs all of them and writes plots, summary.md and results.json.
"""

from experiments.accumulated.theory.decay import long_range_decay, translation_invariance
from experiments.accumulated.theory.mass import far_mass, value_incoherence
from experiments.accumulated.theory.mixing import mixing_check, window_size, window_vs_context
from experiments.accumulated.theory.run import run_theory
from experiments.accumulated.theory.scores import score_gap
from experiments.accumulated.theory.steps import parse_dist

__all__ = [
    "far_mass",
    "long_range_decay",
    "mixing_check",
    "parse_dist",
    "run_theory",
    "score_gap",
    "translation_invariance",
    "value_incoherence",
    "window_size",
    "window_vs_context",
]
