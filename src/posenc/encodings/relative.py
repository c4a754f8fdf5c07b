"""Learned relative-distance score biases: T5 buckets and Kerple.

Both add b_h(i - j) to the scaled logits of query i over key j <= i, as a tile
callable (``posenc.attention``), so evaluation never holds a T x T tensor:

- T5 (Raffel et al. 2020, sec. 2.1; Hugging Face ``T5Attention._relative_position_bucket``
  with ``bidirectional=False``): distance n = i - j goes to bucket n when
  n < B/2, else B/2 + floor(log(n / (B/2)) / log(D / (B/2)) * (B - B/2)), capped at
  B - 1 (B buckets, D max_distance); one learned scalar per bucket and head
  (zero at init: the model starts as NoPE).
- Kerple (Chi et al. 2022, eq. 6-7): logarithmic ``-r1 log(1 + r2 |i - j|)`` or
  power ``-r1 |i - j|^r2``, learned r1, r2 per head, kept positive by clamping
  at 1e-2 (power: r2 <= 2, a conditionally positive definite kernel) as the
  reference implementation does; initialised uniformly in (0, 2) and (0, 1).
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from posenc.encodings.base import Bias, Dims, Encoding, Inputs, PositionState
from posenc.encodings.registry import alias, register
from posenc.errors import PosencError

KERPLE_EPS = 1e-2


def t5_bucket(distance: torch.Tensor, num_buckets: int = 32, max_distance: int = 128) -> torch.Tensor:
    """T5's causal bucket of each distance i - j >= 0 (int64 tensor, same shape)."""
    n = distance.clamp(min=0)
    exact = num_buckets // 2
    large = (
        exact
        + (torch.log(n.float().clamp(min=1) / exact) / math.log(max_distance / exact) * (num_buckets - exact)).long()
    )
    return torch.where(n < exact, n, large.clamp(max=num_buckets - 1))


def distance_tiles(values, pos: torch.Tensor, distance) -> Bias:
    """The bias of the distance only, b_h(i, j) = v[h, distance(pos_i - pos_j)].

    values(n) gives v, (H, n) float32+ at the distances 0..n-1 (called once per bias, n spanning the positions
    pos (T,) int64); distance folds a signed distance tensor into [0, n) (T5 clamps at 0, Kerple takes |.|). The
    formula thus runs on n distances, not on every score: a tile (1, H, tq, tk) is one gather, or, for
    consecutive positions (a Toeplitz tile), one copy of a strided view of v over the signed distances; such a
    bias also carries ``toeplitz`` (``posenc.attention.Bias``), v itself, which the core's evaluation path reads
    without writing any tile (``posenc.attention.toeplitz_causal``).
    """
    n = int(pos.max() - pos.min()) + 1
    table = values(n)
    if not bool((pos.diff() == 1).all()):
        return Bias(lambda qs, qe, ks, ke: table[:, distance(pos[qs:qe, None] - pos[None, ks:ke])][None])
    signed = table[:, distance(torch.arange(n - 1, -n, -1, device=pos.device))]  # column c: distance n - 1 - c
    at_distances = table[:, distance(torch.arange(n, device=pos.device))]  # the toeplitz form: b at 0..n-1

    def tile(qs: int, qe: int, ks: int, ke: int) -> torch.Tensor:
        windows = signed.unfold(-1, ke - ks, 1)  # windows[:, s, t]: distance n - 1 - s - t
        return windows[:, n - qe + ks : n - qs + ks].flip(-2)[None]  # row i: s = n - 1 - (qs + i) + ks

    return Bias(tile, toeplitz=lambda m: at_distances[:, :m])


@register
class T5Bias(Encoding):
    """T5 relative bias: a learned scalar per distance bucket and head (Raffel et al. 2020).

    Parameters:
        num_buckets: distance buckets (half exact, half log-spaced), in [2, 4096]
        max_distance: the distance from which all share the last bucket, > num_buckets / 2

    Tiles (1, H, tq, tk) float32 (float64 for a float64 module); ``far`` (``posenc.attention.Bias``): the
    keys at least max_distance before every query of a block, whose bias is the last bucket's.
    """

    name = "t5"
    position_indexed = True
    family, source = "score biases", "Raffel et al. 2020, arXiv:1910.10683, sec. 2.1"
    has_bias = True

    def __init__(self, dims: Dims, num_buckets: int = 32, max_distance: int = 128):
        super().__init__(dims)
        if not 2 <= num_buckets <= 4096 or max_distance <= num_buckets // 2:
            raise PosencError(
                "t5 needs 2 <= num_buckets <= 4096 and max_distance > num_buckets / 2, "
                f"got {num_buckets}, {max_distance}"
            )
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.table = nn.Parameter(torch.zeros(num_buckets, dims.n_head))

    def bias(self, inp: Inputs) -> Bias:
        pos, table = inp.pos, self.table.to(torch.promote_types(self.table.dtype, torch.float32))

        def values(n: int) -> torch.Tensor:
            return table[t5_bucket(torch.arange(n, device=pos.device), self.num_buckets, self.max_distance)].T

        def far(qs: int, qe: int) -> tuple[int, torch.Tensor]:  # distances >= max_distance share the last bucket
            near = int(((pos[qs:qe].min() - pos[:qs]) >= self.max_distance).int().cumprod(0).sum())
            return near, table[-1][None, :, None].expand(1, -1, near)

        # far: the keys at distance >= max_distance from every query of a block, one constant per head
        return dataclasses.replace(distance_tiles(values, pos, lambda d: d.clamp(min=0)), far=far)

    def decoder(self) -> PositionState:
        return PositionState(self)  # buckets of the new query rows' distances only

    def describe(self) -> str:
        return f"T5 relative bias, {self.num_buckets} buckets up to distance {self.max_distance}, learned per head"


@register
class Kerple(Encoding):
    """Kerple: -r1 log(1 + r2 |i-j|) ("log") or -r1 |i-j|^r2 ("power"), learned r1, r2 > 0 per head (Chi et al. 2022).

    Parameters:
        variant: the kernel: "log" (-r1 log(1 + r2 |i-j|)) or "power" (-r1 |i-j|^r2)

    Tiles (1, H, tq, tk) float32 (float64 for a float64 module).
    """

    name = "kerple"
    position_indexed = True
    family, source = "score biases", "Chi et al. 2022, arXiv:2205.09921"
    has_bias = True

    def __init__(self, dims: Dims, variant: str = "log"):
        super().__init__(dims)
        if variant not in ("log", "power"):
            raise PosencError(f"kerple variant must be 'log' or 'power', got {variant!r}")
        self.variant = variant
        self.r1 = nn.Parameter(torch.rand(dims.n_head) * 2)
        self.r2 = nn.Parameter(torch.rand(dims.n_head))

    def coefficients(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(r1, r2) as used: clamped to >= 1e-2 (power: r2 <= 2), (H,) float32 (float64 for a float64 module)."""
        r2_max, dt = 2.0 if self.variant == "power" else None, torch.promote_types(self.r1.dtype, torch.float32)
        return self.r1.to(dt).clamp(min=KERPLE_EPS), self.r2.to(dt).clamp(min=KERPLE_EPS, max=r2_max)

    def bias(self, inp: Inputs) -> Bias:
        def values(n: int) -> torch.Tensor:
            r1, r2 = (c[:, None] for c in self.coefficients())
            dist = torch.arange(n, device=inp.pos.device).to(r1.dtype)
            return -r1 * (torch.log1p(r2 * dist) if self.variant == "log" else dist.pow(r2))

        return distance_tiles(values, inp.pos, torch.abs)

    def decoder(self) -> PositionState:
        return PositionState(self)  # the new query rows' distances only

    def describe(self) -> str:
        form = "-r1 log(1 + r2 |i-j|)" if self.variant == "log" else "-r1 |i-j|^r2"
        return f"Kerple ({self.variant}): bias {form}, learned r1, r2 per head"


alias("kerple-power", "kerple", "Kerple power variant -r1 |i-j|^r2", variant="power")


def relative_bias_naive(enc: T5Bias | Kerple, pos: list[int]) -> torch.Tensor:
    """Reference: b[h, i, j] by an explicit loop over query/key pairs, (1, H, T, T) float64 (0 above the diagonal)."""
    H, T = enc.dims.n_head, len(pos)
    out = torch.zeros(1, H, T, T, dtype=torch.float64)
    for i in range(T):
        for j in range(i + 1):
            n = pos[i] - pos[j]
            for h in range(H):
                if isinstance(enc, T5Bias):
                    exact = enc.num_buckets // 2
                    b = (
                        n
                        if n < exact
                        else min(
                            enc.num_buckets - 1,
                            exact
                            + int(math.log(n / exact) / math.log(enc.max_distance / exact) * (enc.num_buckets - exact)),
                        )
                    )
                    out[0, h, i, j] = enc.table[b, h]
                else:  # tensors, so gradients reach r1 and r2
                    r1, r2 = (c[h].double() for c in enc.coefficients())
                    out[0, h, i, j] = -r1 * (
                        torch.log1p(r2 * n)
                        if enc.variant == "log"
                        else torch.tensor(float(n), dtype=torch.float64) ** r2
                    )
    return out
