"""Rotary phase helpers shared by every scheme with phases: frequencies, dimension checks, angle wrapping."""

from __future__ import annotations

import math

import torch

from posenc.encodings.base import Dims
from posenc.errors import PosencError

TWO_PI = 2 * math.pi


def check_rotary_dims(dims: Dims, pairing: str) -> None:
    if dims.head_dim % 2:
        raise PosencError(f"rotary schemes need an even head dim, got {dims.head_dim}")
    if pairing not in ("half", "adjacent"):
        raise PosencError(f"pairing must be 'half' or 'adjacent', got {pairing!r}")


def rope_inv_freq(head_dim: int, rope_theta: float = 10000.0) -> torch.Tensor:
    """omega_i = rope_theta^(-2i/D), i = 0..D/2-1: (D/2,) float64 radians per token."""
    if not (math.isfinite(rope_theta) and rope_theta > 1):
        raise PosencError(f"rope_theta must be a finite number > 1, got {rope_theta}")
    return rope_theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def wrap_phases(phi: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Reduce float64 angles mod 2 pi, then cast to ``dtype`` (float32 or float64, never lower).

    The result is contiguous: the four rotations of an attention layer run ~1.5x
    faster on CPU than with the permuted layout a per-head projection leaves.
    """
    return torch.remainder(phi, TWO_PI).to(torch.promote_types(dtype, torch.float32), memory_format=torch.contiguous_format)
