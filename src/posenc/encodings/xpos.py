"""xPos: RoPE with an exponential decay per frequency pair (Sun et al. 2023, "A
Length-Extrapolatable Transformer", eq. 7-9).

Score of query n and key m (pair i, zeta_i = (2i + 0.4 D) / (1.4 D) < 1, scale
base B = 512)::

    s_nm = sum_i zeta_i^((n-m)/B) * <R(n omega_i) q_n, R(m omega_i) k_m>_i

The factorised form q_n zeta^(n/B), k_m zeta^(-m/B) under/overflows once n/B is
large (zeta^(-1e6/512) = inf in float32). Here every query block [qs, qe) with
offset o = pos[qs] scales q_n by zeta^((n-o)/B) (exponent in [0, block/B]) and
k_m by zeta^((o-m)/B): for m < o the exponent is positive (the factor can only
underflow towards its true, tiny value), for o <= m < qe it is at most block/B.
The product is zeta^((n-m)/B) exactly; no unbounded exponent ever appears.
Position ids with a gap (non-contiguous, non-decreasing) would stretch a block's
span and with it those exponents, so a block also ends before its span passes
``MAX_SPAN_BASES`` B (``query_blocks``). Scales are computed in float64 as
exp(x ln zeta), then cast (>= float32).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from posenc.attention import causal_tile, repeat_kv, rotate
from posenc.encodings.base import Bias, Buffer, DecodeState, Dims, Encoding, Inputs
from posenc.encodings.phase import check_rotary_dims
from posenc.encodings.registry import register
from posenc.errors import PosencError
from posenc.rope import rope_inv_freq, wrap_phases

SCALE_BASE = 512.0  # B of the decay zeta^((n-m)/B), tokens (Sun et al. 2023): the scheme's default


def xpos_zeta(head_dim: int) -> torch.Tensor:
    """zeta_i = (2i + 0.4 D) / (1.4 D), i = 0..D/2-1: (D/2,) float64 in (0, 1)."""
    return (torch.arange(0, head_dim, 2, dtype=torch.float64) + 0.4 * head_dim) / (1.4 * head_dim)


def _per_feature(x: torch.Tensor, pairing: str) -> torch.Tensor:
    """(..., D/2) per-pair values -> (..., D) per feature."""
    return torch.cat((x, x), dim=-1) if pairing == "half" else x.repeat_interleave(2, dim=-1)


MAX_SPAN_BASES = 8  # zeta_min^(-8) = (1.4/0.4)^8 ~ 2e4: finite even in float16


def query_blocks(pos: torch.Tensor, block_size: int, max_span: float) -> list[tuple[int, int]]:
    """[qs, qe) query blocks of at most ``block_size`` positions whose span pos[qe-1] - pos[qs] <= max_span.

    pos: (T,) int64 non-decreasing position ids; a gap longer than max_span starts a new block.
    """
    T, out, qs = len(pos), [], 0
    while qs < T:
        qe = min(qs + block_size, T)
        beyond = (pos[qs:qe] - pos[qs] > max_span).nonzero()
        qe = qs + int(beyond[0]) if len(beyond) else qe
        out.append((qs, qe))
        qs = qe
    return out


def xpos_block(q, k, pos, inv_freq, zeta, scale_base, qs, qe, pairing="half"):
    """Rotated and decayed q of queries [qs, qe) and k of keys [0, qe), relative to offset pos[qs].

    q, k: (B, H, T, D); pos: (T,) int64; inv_freq, zeta: (D/2,) float64.
    Returns (q_blk (B, H, qe-qs, D), k_pre (B, H, qe, D)) in q's dtype whose dot
    products are s_nm (module docstring) without the 1/sqrt(D).
    """
    p = pos.to(torch.float64)
    ln_zeta = torch.log(zeta).to(pos.device)

    def scaled(x, positions, exponent):
        phi = wrap_phases(positions[:, None] * inv_freq.to(pos.device), x.dtype)
        factor = torch.exp(exponent[:, None] / scale_base * ln_zeta).to(x.dtype)
        return rotate(x, phi, pairing) * _per_feature(factor, pairing)

    o = p[qs]
    return scaled(q[..., qs:qe, :], p[qs:qe], p[qs:qe] - o), scaled(k[..., :qe, :], p[:qe], o - p[:qe])


@register
class XPos(Encoding):
    """xPos: RoPE times zeta_i^((n-m)/B), zeta_i = (2i+0.4D)/(1.4D), B = 512 (Sun et al. 2023).

    Parameters:
        rope_theta: the frequencies' base, a finite number > 1
        scale_base: B of the decay zeta_i^((n-m)/B), in tokens, > 0
        pairing: the rotated feature pairs: "half" (Hugging Face rotate_half) or "adjacent" (RoFormer / Meta)
        block_size: queries per block, >= 1 (memory, not results)

    Replaces attention (``attend``): per query block one SDPA call over the
    block's keys with the causal tile (plus any other part's bias); at most
    (block x T) scores. Input q, k: (B, H, T, D) float32/64; output (B, H, T, Dv).
    Raises PosencError for decreasing position ids (a key after its query in
    position would get a growing factor zeta^((n-m)/B), n < m: inf and NaN).
    """

    name = "xpos"
    position_indexed = True
    family, source = "rotary", "Sun et al. 2023, arXiv:2212.10554"
    replaces_attention = True
    inv_freq: torch.Tensor  # buffers (register_buffer)
    zeta: torch.Tensor

    def __init__(
        self,
        dims: Dims,
        rope_theta: float = 10000.0,
        scale_base: float = SCALE_BASE,
        pairing: str = "half",
        block_size: int = 512,
    ):
        super().__init__(dims)
        check_rotary_dims(dims, pairing)
        if not (math.isfinite(scale_base) and scale_base > 0) or block_size < 1:
            raise PosencError(f"xpos needs scale_base > 0 and block_size >= 1, got {scale_base}, {block_size}")
        self.pairing, self.scale_base, self.block_size = pairing, float(scale_base), block_size
        self.register_buffer("inv_freq", rope_inv_freq(dims.head_dim, rope_theta), persistent=False)
        self.register_buffer("zeta", xpos_zeta(dims.head_dim), persistent=False)

    def attend(self, q, k, v, inp: Inputs, bias: Bias | None = None):
        if bool((inp.pos[1:] < inp.pos[:-1]).any()):
            raise PosencError(
                "xpos needs non-decreasing position ids: its decay zeta^((n-m)/B) is for keys at or before their query"
            )
        scale = self.logit_scale / math.sqrt(q.shape[-1])
        out = []
        for qs, qe in query_blocks(inp.pos, self.block_size, MAX_SPAN_BASES * self.scale_base):
            qb, kb = xpos_block(q, k, inp.pos, self.inv_freq, self.zeta, self.scale_base, qs, qe, self.pairing)
            mask = causal_tile(bias, qs, qe, qe, q.device, q.dtype)
            out.append(F.scaled_dot_product_attention(qb, kb, v[..., :qe, :], attn_mask=mask, scale=scale))
        return torch.cat(out, dim=-2)

    def decoder(self) -> XPosState:
        return XPosState(self)

    def describe(self) -> str:
        return f"xpos(B={self.scale_base:g}, {self.pairing})"


class XPosState(DecodeState):
    """xPos decoding: keys cached rotated once, R(m omega) k_m; the new query rows (blocks as ``query_blocks``,
    offset o their first position) take q_n zeta^((n-o)/B) and the cached keys k_m zeta^((o-m)/B), as ``xpos_block``
    (no unbounded exponent): O(T D) per step (one exp per cached key and pair), no cos/sin of the prefix."""

    enc: XPos

    def attend(self, q, k, v, inp: Inputs, pos: torch.Tensor, bias, keys: Buffer, values: Buffer) -> torch.Tensor:
        enc, T0 = self.enc, keys.length
        if bool((pos[max(T0, 1) :] < pos[max(T0, 1) - 1 : -1]).any()):
            raise PosencError(
                "xpos needs non-decreasing position ids: its decay zeta^((n-m)/B) is for keys at or before their query"
            )
        p, ln_zeta = pos.to(torch.float64), torch.log(enc.zeta).to(pos.device)
        phi = wrap_phases(p[T0:, None] * enc.inv_freq.to(pos.device), q.dtype)
        K, V = keys.append(rotate(k, phi, enc.pairing)), values.append(v)
        K, V = (repeat_kv(t, q.shape[1]) for t in (K, V))
        qr, scale, out = rotate(q, phi, enc.pairing), enc.logit_scale / math.sqrt(q.shape[-1]), []

        def decay(exponent):
            return _per_feature(torch.exp(exponent[:, None] / enc.scale_base * ln_zeta).to(qr.dtype), enc.pairing)

        for qs, qe in query_blocks(inp.pos, enc.block_size, MAX_SPAN_BASES * enc.scale_base):
            o, end = p[T0 + qs], T0 + qe
            mask = causal_tile(bias, T0 + qs, end, end, q.device, qr.dtype)
            out.append(
                F.scaled_dot_product_attention(
                    qr[..., qs:qe, :] * decay(p[T0 + qs : end] - o),
                    K[..., :end, :] * decay(o - p[:end]),
                    V[..., :end, :],
                    attn_mask=mask,
                    scale=scale,
                )
            )
        return torch.cat(out, dim=-2)


def xpos_score(q, k, n, m, rope_theta=10000.0, scale_base=SCALE_BASE, pairing="half"):
    """s_nm of the module docstring (no 1/sqrt(D)): the xPos score of query q at position n and key k at m, float64.

    q, k: (..., D); n, m: positions (int or float tensors) broadcastable to q's and k's leading dims, so that
    the result is (...). zeta^((n-m)/B) is evaluated directly; n < m (a key after its query, masked in
    attention) gets the decay of distance 0, so the value stays finite.
    """
    D = q.shape[-1]
    inv_freq, zeta = rope_inv_freq(D, rope_theta), xpos_zeta(D)
    n, m = n.to(torch.float64), m.to(torch.float64)
    rq, rk = rotate(q.double(), n[..., None] * inv_freq, pairing), rotate(k.double(), m[..., None] * inv_freq, pairing)
    decay = _per_feature(zeta ** ((n - m).clamp(min=0)[..., None] / scale_base), pairing)
    return (rq * rk * decay).sum(-1)


def xpos_naive_scores(q, k, pos, rope_theta=10000.0, scale_base=SCALE_BASE, pairing="half"):
    """Reference: the full (T, T) xPos score matrix (``xpos_score`` of every query-key pair), float64, no 1/sqrt(D).

    q, k: (B, H, T, D); pos: (T,) position ids. Returns (B, H, T, T).
    """
    return xpos_score(
        q[..., :, None, :], k[..., None, :, :], pos[:, None], pos[None, :], rope_theta, scale_base, pairing
    )
