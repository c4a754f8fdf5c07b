"""p-RoPE: RoPE that rotates only its highest frequencies (Barbero et al., ICLR 2025, "Round and Round We Go!
What makes Rotary Positional Encodings useful?", arXiv 2410.06205, sec. 6, listing ``apply_p_rope``).

Of RoPE's D/2 frequencies omega_i = rope_theta^(-2i/D) (highest first), p-RoPE keeps the P = int(p D / 2)
highest, i < P, and sets the others to 0: those pairs are never rotated, position-free channels (the paper
finds the lowest frequencies carry semantics and are not robust over long contexts). p = 1 is RoPE; 0.75 was
the paper's best (Gemma 2B on Wiki, 8K context: perplexity 4.4414 against RoPE's 4.4627). transformers'
``proportional`` rope type (Gemma 4, its ``partial_rotary_factor``) is the same map with half pairing (tested).

Not posenc's ``rope:rotary_fraction=f`` (GPT-NeoX's partial rotary, transformers' ``partial_rotary_factor``
in the default rope type): that rotates the first fD features with the frequencies of a head of fD,
rope_theta^(-2i/(fD)), i < fD/2, which span RoPE's whole range from 1 down to about 1/rope_theta more
coarsely: it keeps the lowest frequencies that p-RoPE removes. It is p-RoPE with p = f and base
rope_theta^(1/f), up to a fixed permutation of the features (tested).
"""

from __future__ import annotations

import math

from posenc.encodings.base import Dims
from posenc.encodings.registry import register
from posenc.encodings.rotary import RoPE
from posenc.errors import PosencError


def kept_pairs(head_dim: int, p: float) -> int:
    """P = int(p D / 2): the number of RoPE's highest frequencies p-RoPE rotates (the paper's listing, and
    transformers' ``proportional`` rope type). PosencError unless p is a number in (0, 1] that keeps one pair."""
    if not (isinstance(p, (int, float)) and math.isfinite(p) and 0 < p <= 1):
        raise PosencError(f"p-rope: p must be a fraction in (0, 1], got {p!r}")
    kept = int(p * head_dim // 2)
    if kept < 1:
        raise PosencError(f"p-rope: p={p} keeps int({p} * {head_dim} / 2) = 0 frequency pairs; use nope")
    return kept


@register
class PRoPE(RoPE):
    """p-RoPE: the highest int(p D/2) of RoPE's frequencies rotate, the rest are position-free (Barbero et al. 2025).

    Parameters:
        p: the fraction of RoPE's frequencies kept, highest first, in (0, 1] (0.75: the paper's best on Gemma 2B)
        rope_theta: the frequencies' base, a finite number > 1
        pairing: the rotated feature pairs: "half" (Hugging Face rotate_half) or "adjacent" (RoFormer / Meta)

    Phases: (1, 1, T, D/2) float32, t * omega_i for the kept pairs and 0 for the others (computed as RoPE's, float64
    then wrapped). Decoding, Self-Extend and the other inference methods act as on RoPE (the zero frequencies
    rotate by nothing). Raises PosencError for p outside (0, 1], a p keeping no pair, or RoPE's errors.
    """

    name = "p-rope"
    source = "Barbero et al. 2025, arXiv:2410.06205, sec. 6 (p-RoPE)"

    def __init__(self, dims: Dims, p: float = 0.75, rope_theta: float = 10000.0, pairing: str = "half"):
        super().__init__(dims, rope_theta, pairing)
        self.p, self.kept = p, kept_pairs(dims.head_dim, p)
        self.inv_freq[self.kept :] = 0.0

    def describe(self) -> str:
        half = self.dims.head_dim // 2
        return f"p-rope(p={self.p:g}: {self.kept} of {half} frequencies, theta={self.rope_theta:g}, {self.pairing})"
