"""Rotary dimension checks shared by every scheme with phases (frequencies and angle wrapping: ``posenc.rope``)."""

from __future__ import annotations

from posenc.encodings.base import Dims
from posenc.errors import PosencError


def check_rotary_dims(dims: Dims, pairing: str) -> None:
    if dims.head_dim % 2:
        raise PosencError(f"rotary schemes need an even head dim, got {dims.head_dim}")
    if pairing not in ("half", "adjacent"):
        raise PosencError(f"pairing must be 'half' or 'adjacent', got {pairing!r}")
