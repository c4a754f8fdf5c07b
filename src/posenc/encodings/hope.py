"""HoPE: RoPE that keeps only the frequencies completing a full period within the training length (Chen et al.,
ACL 2025, "HoPE: A Novel Positional Encoding Without Long-Term Decay for Enhanced Context Awareness and
Extrapolation", arXiv 2410.21216).

Of RoPE's D/2 frequencies omega_i = rope_theta^(-2i/D), HoPE keeps those that turn at least once over the training
length L, omega_i L >= 2 pi (period 2 pi / omega_i <= L), and replaces the others by position-independent
components (frequency 0, never rotated). The paper finds that the components which do not complete a period in
training are the ones that learn its U-shaped attention and RoPE's long-term decay (the "activated" components,
plus the lowest ones, which settle into near-constant, semantic channels); removing them drops long-term decay
in theory, and no kept component sees an angle it was not trained on beyond L.

Against its neighbours: p-RoPE (Barbero et al. 2025, ``p-rope``) keeps the same end of the spectrum, the highest
frequencies, but a fixed fraction p of them; HoPE's cut follows L (HoPE at L is p-RoPE with p = P / (D/2), P the
pairs with omega_i L >= 2 pi; tested). posenc's ``rope:rotary_fraction=f`` is neither: it rotates fD features with
the frequencies of a head of fD, which reach RoPE's lowest (about 1/rope_theta), the end both papers remove.
FoPE (``fope``) zeroes the same frequencies (its floor 2 pi / L) before building its Fourier series.
"""

from __future__ import annotations

import math

import torch

from posenc.encodings.base import Dims
from posenc.encodings.registry import register
from posenc.encodings.rotary import RoPE
from posenc.errors import PosencError


def full_period_pairs(inv_freq: torch.Tensor, length: int) -> int:
    """The number of frequencies (highest first, (P,) float64 radians per token) with omega L >= 2 pi: those
    completing a full period within ``length`` tokens. The frequencies fall with the index, so they are the first."""
    return int((inv_freq * length >= 2 * math.pi).sum())


@register
class HoPE(RoPE):
    """HoPE: RoPE's frequencies that complete a period within the training length rotate, the rest are position-free.

    Parameters:
        base_length: L, the training length whose full periods decide the kept frequencies (omega L >= 2 pi), an
            integer >= 7 (default: the training length)
        rope_theta: the frequencies' base, a finite number > 1
        pairing: the rotated feature pairs: "half" (Hugging Face rotate_half) or "adjacent" (RoFormer / Meta)

    Phases: (1, 1, T, D/2) float32, t * omega_i for the kept pairs (omega_i L >= 2 pi) and 0 for the others
    (computed as RoPE's, float64 then wrapped). Decoding and the inference methods act as on RoPE. Raises
    PosencError for a base_length below 7 (omega_0 = 1 needs L >= 2 pi to keep a pair) or RoPE's errors.
    """

    name = "hope"
    source = "Chen et al. 2025, arXiv:2410.21216 (HoPE, ACL 2025)"

    def __init__(self, dims: Dims, base_length: int | None = None, rope_theta: float = 10000.0, pairing: str = "half"):
        super().__init__(dims, rope_theta, pairing)
        length = dims.train_length if base_length is None else base_length
        if length < 7:
            raise PosencError(
                f"hope: base_length must be an integer >= 7 (the highest frequency, 1 rad per token, completes a "
                f"period in 2 pi tokens), got {length} (the training length if unset)"
            )
        self.base_length, self.length = base_length, length
        self.kept = full_period_pairs(self.inv_freq, length)
        self.inv_freq[self.kept :] = 0.0

    def describe(self) -> str:
        half = self.dims.head_dim // 2
        return (
            f"hope(L={self.length}: {self.kept} of {half} frequencies complete a period, "
            f"theta={self.rope_theta:g}, {self.pairing})"
        )
