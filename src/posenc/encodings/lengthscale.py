"""Length-scaled attention: each query's logits multiplied by a factor of the number of keys it attends.

For query row t (0-based row of the layer's sequence, so n = t + 1 keys under the causal mask), the
content logit q_t . k_j / sqrt(D) is multiplied by c_t:

- ``ssmax``, Scalable-Softmax (Nakanishi 2025, arXiv 2501.19399, eq. 4): c_t = s_h log n, s_h learned per
  head; the attention no longer flattens as n grows (the far-mass dilution of a fixed-temperature softmax).
- ``logn``, Qwen's log-n attention (Qwen-7B ``modeling_qwen.py``, ``use_logn_attn``): c_t = log n / log L
  for n > L, else 1, L the training length (``base_length``).
- ``llama4-temp``, Llama 4's attention-temperature tuning (transformers ``models/llama4``, applied on its
  NoPE layers): c_t = log(floor(n / floor_scale) + 1) * attn_scale + 1 (floor_scale 8192, attn_scale 0.1).

All three scale q_t by c_t before the core's attention (``posenc.attention.attention``, SDPA without a
bias), as transformers does for Llama 4 and Qwen: a composed part's bias (``llama4-temp+alibi``) is added after
the scaled content logit, unscaled. The factors are computed in float64 from the integer counts and cast to
float32 (float64 for float64 q) before they multiply q; the product is cast back to q's dtype. Every
scheme here replaces attention and composes with biases and with a rotary part, whose rotated q and k it
attends (``rope+logn``, Qwen's setup; alone they are NoPE, Llama 4's setting for its temperature tuning).
Decoding scales the new query rows by their own counts over the cached keys (``LengthScaledState``), equal to
the parallel forward. Reference: ``length_scaled_naive``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from posenc.attention import attention, causal_tile, repeat_kv
from posenc.encodings.base import Bias, Buffer, DecodeState, Dims, Encoding, Inputs
from posenc.encodings.registry import register
from posenc.errors import PosencError


def key_counts(q_start: int, T: int, device) -> torch.Tensor:
    """n = t + 1 for the query rows t in [q_start, T): (T - q_start,) float64."""
    return torch.arange(q_start + 1, T + 1, dtype=torch.float64, device=device)


class LengthScaled(Encoding):
    """Base of the length-scaled schemes: ``factors`` gives c_t; ``attend`` scales q by it (not registered)."""

    replaces_attention = attends_rotated = True
    family = "length-scaled attention"

    def factors(self, n: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """c for the key counts n (Tq,) float64: (1, H|1, Tq, 1) in ``dtype`` (float32 or float64)."""
        raise NotImplementedError

    def scaled_attention(self, q, k, v, bias: Bias | None, first: torch.Tensor | None = None) -> torch.Tensor:
        """q: (B, H, Tq, D) the last Tq rows, k: (B, H, T, D), v: (B, H, T, Dv) -> (B, H, Tq, Dv) in v's dtype;
        first: (B,) a left-padded batch's first real rows (``Inputs.first``): each row counts its own keys."""
        T, dtype = k.shape[-2], torch.promote_types(q.dtype, torch.float32)
        n = key_counts(T - q.shape[-2], T, q.device)
        if first is None:
            c = self.factors(n, dtype)
        else:  # the padding keys are masked: a row's query sees n - first keys (a padding query: 1, unread)
            c = torch.cat([self.factors((n - f).clamp(min=1), dtype) for f in first.tolist()])
        return attention((q * c).to(q.dtype), k, v, bias=bias, logit_scale=self.logit_scale)

    def attend(self, q, k, v, inp: Inputs, bias: Bias | None = None) -> torch.Tensor:
        return self.scaled_attention(q, k, v, bias, inp.first)

    def decoder(self) -> LengthScaledState:
        return LengthScaledState(self)


class LengthScaledState(DecodeState):
    """Decoding: keys and values cached as they are; the new rows' factors from their counts, O(T D) per step."""

    enc: LengthScaled

    def attend(self, q, k, v, inp: Inputs, pos: torch.Tensor, bias, keys: Buffer, values: Buffer) -> torch.Tensor:
        K, V = (repeat_kv(t, q.shape[1]) for t in (keys.append(k), values.append(v)))
        return self.enc.scaled_attention(q, K, V, bias, inp.first)


def length_scaled_naive(q, k, v, factors: torch.Tensor, bias: Bias | None = None) -> torch.Tensor:
    """Reference: the full (T, T) causal softmax of c_t q_t . k_j / sqrt(D) + bias in float64; factors: (1|H, T) or
    broadcastable to (B, H, T). Returns (B, H, T, Dv) float64."""
    q, k, v = q.double(), k.double(), v.double()
    T = q.shape[-2]
    scores = factors.double()[..., None] * (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores + causal_tile(bias, 0, T, T, q.device, torch.float64)
    return torch.softmax(scores, dim=-1) @ v


@register
class SSMax(LengthScaled):
    """SSMax: each query's logits times s_h log n, n the keys it attends, s_h learned per head (Nakanishi 2025).

    Parameters:
        init: the initial s of every head, a number in (0, 10] (default 1 / ln(train_length): factor 1 at the
            training length)

    Raises PosencError for init out of range, or no init with a training length below 2.
    """

    name = "ssmax"
    source = "Nakanishi 2025, arXiv:2501.19399, eq. 4 (Scalable-Softmax)"

    def __init__(self, dims: Dims, init: float | None = None):
        super().__init__(dims)
        if init is None:
            if dims.train_length < 2:
                raise PosencError("ssmax: the default init 1 / ln(train_length) needs train_length >= 2; give init")
            init = 1 / math.log(dims.train_length)
        if not (math.isfinite(init) and 0 < init <= 10):
            raise PosencError(f"ssmax: init must be a number in (0, 10], got {init!r}")
        self.init = init
        self.s = nn.Parameter(torch.full((dims.n_head,), float(init)))

    def factors(self, n: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        s = self.s.to(torch.promote_types(self.s.dtype, dtype))
        return (s[:, None] * n.log().to(s.dtype))[None, :, :, None]

    def describe(self) -> str:
        return f"ssmax(logits x s_h ln n, s_h learned, init {self.init:.4g})"


@register
class LogN(LengthScaled):
    """Qwen's log-n attention: each query's logits times log n / log L beyond L keys (Qwen-7B, use_logn_attn).

    Parameters:
        base_length: L, the length up to which the factor is 1, an integer >= 2 (default: the training length)

    Raises PosencError for base_length below 2, or no base_length with a training length below 2.
    """

    name = "logn"
    source = "Qwen-7B (Bai et al. 2023, arXiv:2309.16609, sec. 2.3; modeling_qwen.py use_logn_attn)"

    def __init__(self, dims: Dims, base_length: int | None = None):
        super().__init__(dims)
        length = dims.train_length if base_length is None else base_length
        if length < 2:
            raise PosencError(f"logn: base_length must be an integer >= 2, got {length} (the training length if unset)")
        self.base_length, self.length = base_length, length

    def factors(self, n: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        c = torch.where(n > self.length, n.log() / math.log(self.length), torch.ones_like(n))
        return c.to(dtype)[None, None, :, None]

    def describe(self) -> str:
        return f"logn(logits x log_{self.length} n beyond {self.length} keys)"


@register
class Llama4Temperature(LengthScaled):
    """Llama 4's attention temperature: q times log(floor(n / floor_scale) + 1) attn_scale + 1 (its NoPE layers).

    Parameters:
        floor_scale: keys per step of the factor, an integer >= 1 (Llama 4: 8192)
        attn_scale: the factor's slope per log step, a number in [0, 10] (Llama 4: 0.1)

    Raises PosencError for values out of range.
    """

    name = "llama4-temp"
    source = "Meta Llama 4 (transformers models/llama4, attn_temperature_tuning)"

    def __init__(self, dims: Dims, floor_scale: int = 8192, attn_scale: float = 0.1):
        super().__init__(dims)
        if floor_scale < 1:
            raise PosencError(f"llama4-temp: floor_scale must be an integer >= 1, got {floor_scale}")
        if not (math.isfinite(attn_scale) and 0 <= attn_scale <= 10):
            raise PosencError(f"llama4-temp: attn_scale must be a number in [0, 10], got {attn_scale!r}")
        self.floor_scale, self.attn_scale = floor_scale, attn_scale

    def factors(self, n: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        c = torch.log1p(torch.floor(n / self.floor_scale)) * self.attn_scale + 1
        return c.to(dtype)[None, None, :, None]

    def describe(self) -> str:
        return f"llama4-temp(q x log(floor(n / {self.floor_scale}) + 1) x {self.attn_scale:g} + 1)"
