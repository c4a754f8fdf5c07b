"""PoPE: polar coordinate position embedding (Gopalakrishnan et al. 2025,
"Decoupling the 'What' and 'Where' With Polar Coordinate Positional Embeddings", sec. 3).

Each of the D features c = 1..D of q and k becomes a complex number whose
magnitude is content only and whose phase is position only::

    q~_tc = softplus(q_tc) exp(i t theta_c),   k~_sc = softplus(k_sc) exp(i (s theta_c + delta_c))
    theta_c = base^(-(c-1)/D)                    (D frequencies; the survey in seeds/003 drops the minus)
    score   = Re sum_c q~_tc conj(k~_sc) / sqrt(D) = sum_c mu_q mu_k cos((t-s) theta_c - delta_c) / sqrt(D)

with a learnable per-head phase bias delta_c clamped to [-2 pi, 0] (initialised
to 0). The score is the real dot product of the 2D-vectors
[mu cos phi, mu sin phi], so the standard attention core (SDPA) applies; v is
zero-padded to 2D so PyTorch keeps its fused O(T)-memory kernel (SDPA falls back
to the T x T math kernel when q and v head dims differ). Phases t * theta_c are
computed in float64 and reduced mod 2 pi.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from posenc.attention import attention
from posenc.encodings.base import Bias, Buffer, DecodeState, Dims, Encoding, Inputs
from posenc.encodings.registry import register
from posenc.errors import PosencError
from posenc.rope import wrap_phases

TWO_PI = 2 * math.pi


def pope_freqs(head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """theta_c = base^(-(c-1)/D), c = 1..D: (D,) float64 radians per token, decreasing from 1."""
    if not (math.isfinite(base) and base > 1):
        raise PosencError(f"PoPE base must be a finite number > 1, got {base}")
    return base ** (-torch.arange(head_dim, dtype=torch.float64) / head_dim)


def pope_features(
    x: torch.Tensor, pos: torch.Tensor, freqs: torch.Tensor, delta: torch.Tensor | None = None
) -> torch.Tensor:
    """[mu cos phi, mu sin phi]: (B, H, T, D) -> (B, H, T, 2D) in x's dtype.

    mu = softplus(x); phi = pos * freqs (float64, mod 2 pi) + delta (H, D), if given. pos: (T,) position ids
    (int or float; any shape broadcastable to x's leading dims works).
    """
    phi = wrap_phases(pos.to(torch.float64)[..., None] * freqs.to(pos.device), x.dtype)  # (T, D)
    if delta is not None:
        phi = phi + delta[:, None, :]  # (H, T, D)
    mu = F.softplus(x)
    return torch.cat((mu * torch.cos(phi).to(x.dtype), mu * torch.sin(phi).to(x.dtype)), dim=-1)


@register
class PoPE(Encoding):
    """PoPE: softplus magnitudes, D position phases base^(-(c-1)/D), key phase bias in [-2pi, 0].

    Parameters:
        base: the phases' base, a finite number > 1
        block_size: queries per block of the chunked path (with a bias), >= 1

    Replaces attention (``attend``): features of size 2D through the core.
    q, k, v: (B, H, T, D); output (B, H, T, D) in v's dtype.
    """

    name = "pope"
    position_indexed = True
    family, source = "rotary", "Gopalakrishnan et al. 2025, PoPE (polar coordinate positions)"
    replaces_attention = True
    freqs: torch.Tensor  # a buffer (register_buffer)

    def __init__(self, dims: Dims, base: float = 10000.0, block_size: int = 512):
        super().__init__(dims)
        if block_size < 1:
            raise PosencError(f"pope needs block_size >= 1, got {block_size}")
        self.base, self.block_size = base, block_size
        self.register_buffer("freqs", pope_freqs(dims.head_dim, base), persistent=False)
        self.delta = nn.Parameter(torch.zeros(dims.n_head, dims.head_dim))

    def phase_bias(self) -> torch.Tensor:
        """delta clamped to [-2 pi, 0]: (H, D) float32."""
        return self.delta.clamp(-TWO_PI, 0.0)

    def attend(self, q, k, v, inp: Inputs, bias: Bias | None = None):
        q2 = pope_features(q, inp.pos, self.freqs)
        k2 = pope_features(k, inp.pos, self.freqs, self.phase_bias())
        D = v.shape[-1]
        v2 = F.pad(v, (0, q2.shape[-1] - D))
        # logit_scale sqrt(2): the core divides by sqrt(2D), PoPE by sqrt(D)
        out = attention(q2, k2, v2, bias=bias, logit_scale=self.logit_scale * math.sqrt(2), block_size=self.block_size)
        return out[..., :D]

    def decoder(self) -> PoPEState:
        return PoPEState(self)

    def describe(self) -> str:
        return f"pope(base={self.base:g})"


class PoPEState(DecodeState):
    """PoPE decoding: key features [mu cos phi, mu sin phi] (B, H, T, 2D) cached once (per head: the phase bias
    delta); the new queries' features over them, O(T D) per step. Values stay (B, H, T, D) (no zero padding: one
    query row needs no fused kernel)."""

    enc: PoPE
    per_head_keys = True

    def attend(self, q, k, v, inp: Inputs, pos: torch.Tensor, bias, keys: Buffer, values: Buffer) -> torch.Tensor:
        enc = self.enc
        K, V = keys.append(pope_features(k, inp.pos, enc.freqs, enc.phase_bias())), values.append(v)
        return attention(
            pope_features(q, inp.pos, enc.freqs),
            K,
            V,
            bias=bias,
            logit_scale=enc.logit_scale * math.sqrt(2),
            block_size=enc.block_size,
        )


def pope_naive(q, k, v, pos, base=10000.0, delta=None):
    """Reference from the complex formula: full T x T causal softmax in complex128 / float64.

    q, k, v: (B, H, T, D); delta: (H, D) already clamped (None: 0). Returns (B, H, T, D) float64.
    """
    D, T = q.shape[-1], q.shape[-2]
    theta = pope_freqs(D, base)
    t = pos.to(torch.float64)[:, None] * theta
    d = torch.zeros(q.shape[1], D, dtype=torch.float64) if delta is None else delta.double()
    qc = F.softplus(q.double()) * torch.exp(1j * t)
    kc = F.softplus(k.double()) * torch.exp(1j * (t + d[:, None, :]))
    scores = (qc @ kc.conj().transpose(-1, -2)).real / math.sqrt(D)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1) @ v.double()
