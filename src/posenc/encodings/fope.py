"""FoPE: Fourier Position Embedding (Hua et al., ICML 2025, "Fourier Position Embedding: Enhancing Attention's
Periodic Extension for Length Generalization", arXiv 2412.17739; official code TsinghuaC3I/Fourier-Position-Embedding,
``olmo/model.py`` ``FourierEmbedding``, with the paper's configs ``fourier_ignore_zero``, ``rope_clamp_floor_to_zero``,
``fourier_separate_basis``, ``fourier_separate_head``, ``fourier_init: eye_xavier_norm``).

RoPE gives each pair d of a head one frequency; FoPE gives it a Fourier series over RoPE's frequencies, so the
spectrum damage of the linear layers (a frequency leaking into its neighbours) is modelled, and it zeroes the
frequencies too low to be trained (clipping to a floor):

1. frequencies omega_m = rope_theta^(-2m/D), m < D/2; those below the floor 2 pi / L (no full period within the
   training length L) are set to 0 and dropped, leaving the M that complete one (HoPE's cut, ``hope``);
2. per head h two fixed random matrices C_cos, C_sin (H, M, P), P = min(M, D/4) series: each is the "step
   identity" (C[h, m, p] = 1 at m = p * ceil(M / P) < M) plus a Xavier-normal draw of gain ``gain`` (torch's
   ``xavier_normal_`` on the (H, M, P) tensor, std = gain sqrt(2 / (P (M + H)))), from the run's seed and the
   layer index (``Dims.seed``): not trained, as the official configs;
3. at position t, pair p < P: c_p(t) = sum_m cos(omega_m t) C_cos[h, m, p], s_p(t) = sum_m sin(omega_m t) C_sin[h, m,
   p]; pairs p >= P get c = s = 1 (the official code pads both with 1: a position-free map, (x1, x2) -> (x1 - x2,
   x1 + x2), which doubles those features' share of q . k);
4. q and k (half pairing, Hugging Face's rotate_half) become x * [c, c] + rotate_half(x) * [s, s], i.e. each pair
   (x1, x2) -> (c x1 - s x2, s x1 + c x2), then causal softmax attention with scale 1 / sqrt(D).

With gain 0 every series is one frequency, c = cos(omega t), s = sin(omega t): RoPE on the P pairs, on every
ceil(M/P)-th kept frequency (tested). c and s are not a rotation (c^2 + s^2 != 1), so q . k depends on both
positions, not only their distance; the transform is a complex multiplication of each pair by c + i s
(``fope_naive`` is that definition in complex numbers). Angles omega t in float64, their cos and sin cast to
float32 (float64 in a float64 model) before the series. Replaces attention (``attend``), takes the other parts'
bias and the layer's window; decoding caches the transformed keys per query head (the series differ per head).
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from posenc.attention import attention, naive_attention, repeat_kv
from posenc.encodings.base import Bias, Buffer, DecodeState, Dims, Encoding, Inputs
from posenc.encodings.registry import register
from posenc.errors import PosencError
from posenc.rope import rope_inv_freq


def fope_frequencies(head_dim: int, rope_theta: float, length: int) -> torch.Tensor:
    """RoPE's frequencies omega_m >= 2 pi / length (the floor; the rest are clipped to 0 and dropped): (M,)
    float64, highest first."""
    inv_freq = rope_inv_freq(head_dim, rope_theta)
    return inv_freq[inv_freq >= 2 * math.pi / length]


def fope_coefficients(n_head: int, n_freq: int, n_series: int, gain: float, generator: torch.Generator) -> torch.Tensor:
    """One coefficient matrix (H, M, P) float32: the step identity, 1 at [h, p * ceil(M / P), p] where
    p * ceil(M / P) < M, plus
    ``xavier_normal_`` of ``gain`` drawn from ``generator`` (the official ``eye_xavier_norm`` init)."""
    coef = torch.empty(n_head, n_freq, n_series)
    nn.init.xavier_normal_(coef, gain=gain, generator=generator)
    step = math.ceil(n_freq / n_series)
    p = torch.arange(n_series)
    p = p[p * step < n_freq]  # a series whose step lands past the last frequency has noise only (as the official)
    coef[:, p * step, p] += 1.0
    return coef


def fope_series(
    pos: torch.Tensor, inv_freq: torch.Tensor, cos_coef: torch.Tensor, sin_coef: torch.Tensor, half: int, dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """c and s of every pair: pos (T,) or (B, T) int64 positions -> two (1|B, H, T, half) tensors in ``dtype``
    (float32 or float64), the pairs >= P equal to 1."""
    rows = pos if pos.dim() == 2 else pos[None]
    phi = rows.to(torch.float64)[..., None] * inv_freq.to(device=pos.device)  # (B|1, T, M) radians
    c = torch.einsum("btm,hmp->bhtp", phi.cos().to(dtype), cos_coef.to(dtype))
    s = torch.einsum("btm,hmp->bhtp", phi.sin().to(dtype), sin_coef.to(dtype))
    pad = half - c.shape[-1]
    ones = c.new_ones(*c.shape[:-1], pad)
    return torch.cat((c, ones), dim=-1), torch.cat((s, ones), dim=-1)


def fope_transform(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """x (B, H, T, D) -> x * [c, c] + rotate_half(x) * [s, s] in c's dtype: each pair (x_i, x_{i+D/2}) ->
    (c x_i - s x_{i+D/2}, s x_i + c x_{i+D/2})."""
    x1, x2 = x.to(c.dtype).chunk(2, dim=-1)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def fope_naive(q, k, v, c: torch.Tensor, s: torch.Tensor, bias: Bias | None = None) -> torch.Tensor:
    """Reference: the pairs as complex numbers multiplied by c + i s, then the full (T, T) causal softmax of
    Re(q' . conj(k')) / sqrt(D) + bias in float64. q, k, v: (B, H, T, D); c, s: (1|B, H, T, D/2). Returns (B, H, T, Dv)
    float64."""

    def complex_pairs(x):
        x1, x2 = x.double().chunk(2, dim=-1)
        z = torch.complex(x1, x2) * torch.complex(c.double(), s.double())
        return torch.cat((z.real, z.imag), dim=-1)

    return naive_attention(complex_pairs(q), complex_pairs(k), v.double(), bias=bias)


@register
class FoPE(Encoding):
    """FoPE: each pair of q and k a Fourier series over RoPE's frequencies above the floor 2 pi / L (Hua et al. 2025).

    Parameters:
        base_length: L, the training length whose floor 2 pi / L clips the frequencies that cannot complete a period,
            an integer >= 7 (default: the training length)
        rope_theta: the frequencies' base, a finite number > 1
        gain: the Xavier-normal gain of the series' random coefficients, a number in [0, 10] (the official configs: 0.3
            at 60M, 0.4 at 180M, 0.6 at 1.2B parameters; 0: RoPE on the series' dominant frequencies)

    q, k: (B, H, T, D), v: (B, H, T, Dv) -> (B, H, T, Dv) in v's dtype. Raises PosencError for an odd head dim, a
    head dim below 4 (no series: P = min(M, D/4)), a base_length below 7, or values out of range.
    """

    name = "fope"
    replaces_attention = attends_window = True
    position_indexed = True
    family = "rotary"
    source = "Hua et al. 2025, arXiv:2412.17739 (FoPE, ICML 2025; TsinghuaC3I/Fourier-Position-Embedding)"
    inv_freq: torch.Tensor  # buffers (register_buffer)
    cos_coef: torch.Tensor
    sin_coef: torch.Tensor

    def __init__(self, dims: Dims, base_length: int | None = None, rope_theta: float = 10000.0, gain: float = 0.3):
        super().__init__(dims)
        if dims.head_dim % 2 or dims.head_dim < 4:
            raise PosencError(f"fope needs an even head dim >= 4 (d_model / n_head), got {dims.head_dim}")
        length = dims.train_length if base_length is None else base_length
        if length < 7:
            raise PosencError(
                f"fope: base_length must be an integer >= 7 (no frequency completes a period in fewer tokens), "
                f"got {length} (the training length if unset)"
            )
        if not (isinstance(gain, (int, float)) and math.isfinite(gain) and 0 <= gain <= 10):
            raise PosencError(f"fope: gain must be a number in [0, 10], got {gain!r}")
        self.base_length, self.length, self.rope_theta, self.gain = base_length, length, rope_theta, gain
        inv_freq = fope_frequencies(dims.head_dim, rope_theta, length)
        self.n_series = min(len(inv_freq), dims.head_dim // 4)
        g = torch.Generator().manual_seed(dims.seed * 1_000_003 + dims.layer_index)
        cos_coef = fope_coefficients(dims.n_head, len(inv_freq), self.n_series, gain, g)
        sin_coef = fope_coefficients(dims.n_head, len(inv_freq), self.n_series, gain, g)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("cos_coef", cos_coef, persistent=False)
        self.register_buffer("sin_coef", sin_coef, persistent=False)

    def series(self, pos: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """c, s at positions pos ((T,) or (B, T) int64): two (1|B, H, T, D/2) tensors in ``dtype``."""
        return fope_series(pos, self.inv_freq, self.cos_coef, self.sin_coef, self.dims.head_dim // 2, dtype)

    def transformed(self, q, k, inp: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
        """q of the last Tq positions and k of all T of ``inp`` (B, H, ., D), transformed, in float32+."""
        c, s = self.series(inp.row_positions(), torch.promote_types(q.dtype, torch.float32))
        return fope_transform(q, c[..., -q.shape[-2] :, :], s[..., -q.shape[-2] :, :]), fope_transform(k, c, s)

    def attend(self, q, k, v, inp: Inputs, bias: Bias | None = None) -> torch.Tensor:
        qt, kt = self.transformed(q, k, inp)
        window = None if self.window is None else dataclasses.replace(self.window, first=inp.first)
        return attention(qt.to(q.dtype), kt.to(k.dtype), v, bias=bias, logit_scale=self.logit_scale, window=window)

    def decoder(self) -> FoPEState:
        return FoPEState(self)

    def describe(self) -> str:
        return (
            f"fope(L={self.length}: {len(self.inv_freq)} frequencies in {self.n_series} series per head, "
            f"theta={self.rope_theta:g}, gain {self.gain:g})"
        )


class FoPEState(DecodeState):
    """Decoding: the new rows of q and k transformed by their positions' series, the keys cached transformed (per query
    head: the series differ per head), the new queries over them; O(T D) per step. ``fed`` counts the positions
    fed, so a windowed layer's cache (which drops its oldest keys) is placed in the sequence's rows."""

    enc: FoPE
    per_head_keys = True

    def __init__(self, enc: FoPE):
        super().__init__(enc)
        self.fed = 0

    def attend(self, q, k, v, inp: Inputs, pos: torch.Tensor, bias, keys: Buffer, values: Buffer) -> torch.Tensor:
        enc = self.enc
        qt, kt = enc.transformed(q, repeat_kv(k, q.shape[1]), inp)
        K, V = keys.append(kt.to(k.dtype)), values.append(repeat_kv(v, q.shape[1]))
        self.fed += q.shape[-2]
        window = enc.window
        if window is not None:
            window = dataclasses.replace(window, offset=self.fed - K.shape[-2], first=inp.first)
        return attention(qt.to(q.dtype), K, V, bias=bias, logit_scale=enc.logit_scale, window=window)

    def crop(self, length: int) -> None:
        super().crop(length)
        self.fed = min(self.fed, length)
