"""Absolute schemes: NoPE, sinusoidal and learned position embeddings."""

from __future__ import annotations

import math

import torch
from torch import nn

from posenc.encodings.base import Dims, Encoding, check_pos
from posenc.encodings.registry import alias, register
from posenc.errors import PosencError


@register
class NoPE(Encoding):
    """No positional encoding: causal masking alone carries position (Kazemnejad et al. 2023)."""

    name = "nope"
    family, source = "none and absolute", "Kazemnejad et al. 2023, arXiv:2305.19466"


alias(
    "irope",
    "rope|rope|rope|nope",
    "iRoPE-style layer mix: every fourth layer NoPE (Llama 4), the others RoPE",
    source="Meta Llama 4 (iRoPE)",
)


@register
class Sinusoidal(Encoding):
    """Sinusoidal embedding added to the tokens (Vaswani et al. 2017, sec. 3.5).

    Parameters:
        base: the wavelengths' base, a finite number > 1

    PE[t, 2i] = sin(t / base^(2i/d)), PE[t, 2i+1] = cos(t / base^(2i/d)); computed
    in float64 so positions far beyond training stay exact, returned as float32.
    """

    name = "sinusoidal"
    position_indexed = True
    family, source = "none and absolute", "Vaswani et al. 2017, arXiv:1706.03762, sec. 3.5"
    additive = True

    def __init__(self, dims: Dims, base: float = 10000.0):
        super().__init__(dims)
        if dims.d_model % 2:
            raise PosencError(f"sinusoidal needs an even d_model, got {dims.d_model}")
        if not (math.isfinite(base) and base > 1):
            raise PosencError(f"sinusoidal base must be a finite number > 1, got {base}")
        self.base = base

    def embed(self, pos: torch.Tensor) -> torch.Tensor:
        """pos: (T,) int64 -> (T, d_model) float32."""
        return sinusoidal_table(pos, self.dims.d_model, self.base).float()


def sinusoidal_table(pos: torch.Tensor, d: int, base: float = 10000.0) -> torch.Tensor:
    """PE[..., 2i] = sin(t / base^(2i/d)), PE[..., 2i+1] = cos(t / base^(2i/d)) (Vaswani et al. 2017):
    pos (...) positions, any real dtype -> (..., d) float64 (angles in float64: long positions)."""
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64, device=pos.device) / d)
    ang = pos.to(torch.float64)[..., None] * inv
    return torch.stack((ang.sin(), ang.cos()), dim=-1).flatten(-2)


class LengthNotSupported(PosencError):
    """The scheme cannot represent the requested length (learned table too short)."""


@register
class Learned(Encoding):
    """Learned absolute position embedding, a table of ``train_length`` rows (GPT-2).

    Inputs longer than the table raise LengthNotSupported: evaluation reports
    them as not applicable.
    """

    name = "learned"
    position_indexed = True
    family, source = "none and absolute", "Radford et al. 2019 (GPT-2)"
    additive = True
    max_length: int  # the table's rows (set in __init__)

    @classmethod
    def positions_supported(cls, dims: Dims) -> int:
        return dims.train_length

    def __init__(self, dims: Dims):
        super().__init__(dims)
        self.max_length = self.positions_supported(dims)
        self.table = nn.Embedding(dims.train_length, dims.d_model)
        nn.init.normal_(self.table.weight, std=0.02)

    def embed(self, pos: torch.Tensor) -> torch.Tensor:
        """pos: (...) int64 positions in [0, ``max_length``) -> (..., d_model) in the table's dtype. PosencError (one
        line) for positions not int64 or negative (``check_pos``); LengthNotSupported for one past the table."""
        check_pos(pos)
        if int(pos.max()) >= self.max_length:
            raise LengthNotSupported(f"learned positions cover {self.max_length} tokens, got {int(pos.max()) + 1}")
        return self.table(pos)
