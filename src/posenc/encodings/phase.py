"""Rotary dimension checks shared by every scheme with phases (frequencies and angle wrapping: ``posenc.rope``)."""

from __future__ import annotations

from posenc.encodings.base import Dims
from posenc.errors import PosencError


def check_rotary_dims(dims: Dims, pairing: str) -> None:
    if dims.head_dim % 2:
        raise PosencError(f"rotary schemes need an even head dim, got {dims.head_dim}")
    if pairing not in ("half", "adjacent"):
        raise PosencError(f"pairing must be 'half' or 'adjacent', got {pairing!r}")


def rotary_dim(dims: Dims, fraction: float) -> int:
    """Features rotated per head for partial rotary: int(head_dim * fraction), as Hugging Face's
    ``partial_rotary_factor`` (GPT-NeoX rotates 25%). PosencError unless fraction is in (0, 1] and
    the result is an even number >= 2."""
    r = int(dims.head_dim * fraction) if 0 < fraction <= 1 else 0
    if r < 2 or r % 2:
        raise PosencError(f"rotary_fraction must be in (0, 1] and give an even rotary dim >= 2 of head dim {dims.head_dim}, got {fraction} ({r})")
    return r
