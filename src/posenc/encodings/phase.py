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
    if not 0 < fraction <= 1:
        raise PosencError(f"rotary_fraction must be in (0, 1], got {fraction}")
    r = int(dims.head_dim * fraction)
    if r < 2 or r % 2:
        raise PosencError(
            f"rotary_fraction {fraction} rotates int({dims.head_dim} * {fraction}) = {r} features of head dim "
            f"{dims.head_dim}; it must give an even rotary dim >= 2"
        )
    return r
