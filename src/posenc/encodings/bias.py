"""Additive score biases: ALiBi.

A bias is returned as a callable giving any (query block, key block) tile, so
the attention core never builds a T x T tensor.
"""

from __future__ import annotations

import math

import torch

from posenc.encodings.base import Bias, Dims, Encoding, Inputs, PositionState
from posenc.encodings.registry import register


def alibi_slopes(n_head: int) -> torch.Tensor:
    """ALiBi head slopes m_h (Press et al. 2022, sec. 3), (H,) float64.

    For H a power of two: geometric from 2^(-8/H) with ratio 2^(-8/H). Otherwise
    c = 2^floor(log2 H) and the slopes are slopes(c) followed by
    ``slopes(2c)[0::2][:H-c]`` (the reference implementation).
    """

    def power_of_two(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (h + 1) for h in range(n)]

    c = 2 ** math.floor(math.log2(n_head))
    slopes = power_of_two(c)
    if c < n_head:
        slopes += power_of_two(2 * c)[0::2][: n_head - c]
    return torch.tensor(slopes, dtype=torch.float64)


def distance_penalty(slope, i: torch.Tensor | float, j: torch.Tensor) -> torch.Tensor:
    """ALiBi's bias -m (i - j) of a query at position i and a key at j: slope m a float or a tensor broadcast
    against positions i, j (the result has their broadcast shape and dtype)."""
    return -slope * (i - j)


def distance_bias(slopes: torch.Tensor, pos: torch.Tensor, dtype: torch.dtype = torch.float32) -> Bias:
    """Tile function for -m_h (i - j); pos: (T,) absolute positions. Tiles (1, H, tq, tk) in ``dtype`` (>= float32);
    its separable form ``keys(qs, ke)`` = -m_h (pos_qs - pos_j), (1, H, ke) (``posenc.attention.Bias``).

    i - j is formed from positions relative to the tile's first query, exact
    integers in float32 below 2^24, so a tile costs two passes and its
    values do not depend on where the tile starts (decoding equals the parallel forward).
    """
    m = slopes.to(dtype)[None, :, None, None]

    def tile(qs: int, qe: int, ks: int, ke: int) -> torch.Tensor:
        rows, cols = ((pos[a:b] - pos[qs]).to(dtype) for a, b in ((qs, qe), (ks, ke)))
        return distance_penalty(m, rows[:, None], cols[None, :])

    def keys(qs: int, ke: int) -> torch.Tensor:  # separable: -m (i - j) = -m i + m j; the row of query qs
        return distance_penalty(m[..., 0], 0.0, (pos[:ke] - pos[qs]).to(dtype))

    rel, m_h = (pos - pos[0]).to(dtype), slopes.to(dtype)
    return Bias(tile, at=lambda b, h, qi, ki: distance_penalty(m_h[h], rel[qi], rel[ki]), keys=keys)


@register
class ALiBi(Encoding):
    """ALiBi: score bias -m_h (i - j), no embedding (Press et al. 2022, eq. in sec. 3).

    Not divided by sqrt(D): the bias is added to the scaled logits.
    """

    name = "alibi"
    position_indexed = True
    family, source = "score biases", "Press et al. 2022, arXiv:2108.12409"
    has_bias = True
    slopes: torch.Tensor  # a buffer (register_buffer)

    def __init__(self, dims: Dims):
        super().__init__(dims)
        self.register_buffer("slopes", alibi_slopes(dims.n_head), persistent=False)

    def bias(self, inp: Inputs) -> Bias:
        return distance_bias(self.slopes, inp.pos, torch.promote_types(inp.x.dtype, torch.float32))

    def decoder(self) -> PositionState:
        return PositionState(self)  # the new query rows of -m (i - j) over the cached positions
