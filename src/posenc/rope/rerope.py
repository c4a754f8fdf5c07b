"""ReRoPE and leaky ReRoPE attention (Su 2023), one implementation for own and Hugging Face models.

ReRoPE (Su, "Rectified Rotary Position Embeddings", 2023) keeps RoPE's relative
position ``i - j`` inside a window ``w`` and clamps it beyond; leaky ReRoPE
interpolates beyond the window by ``k > 1`` (Su's k)::

    pos(i, j) = i - j                  if i - j < w
              = w                      otherwise (ReRoPE, leak None)
              = w + (i - j - w) / k    otherwise (leaky ReRoPE, leak k)

The score ``<R(pos(i, j)) q_i, k_j>`` for a clamped position needs q and k
rotated differently from the normal path, but only by one position each:
near keys (i - j < w) use ``<R(i) q_i, R(j) k_j>``, far keys
``<R(w + (i - w)/k) q_i, R(j/k) k_j>`` (ReRoPE: ``<R(w) q_i, k_j>``).
``rerope_attention`` works over query blocks: per block, the keys split into
far, near and causal ranges (at most five tiles, masks only where a role changes
inside the block), each attended separately and merged by logsumexp, which
equals one softmax over all keys. Memory O(block x T) per head, never T x T.
``naive`` beside it builds the full T x T matrix of clamped positions: the
reference the tests compare against (values and gradients).

Angles are float64 ``position * omega`` reduced mod 2 pi, then float32 or
better (``posenc.rope.schedules.wrap_phases``).
"""

from __future__ import annotations

import math

import torch

from posenc.attention import Bias, merge_lse, repeat_kv, rotate
from posenc.rope.schedules import wrap_phases


def _slope(leak: float | None) -> float:
    """d pos / d (i - j) beyond the window: 0 for ReRoPE, 1/k for leaky ReRoPE."""
    return 0.0 if leak is None else 1.0 / leak


def _rot(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, pairing: str) -> torch.Tensor:
    """R(positions) x for x (B, H, T, D), positions (T,) or (Tq, Tk) float64: float64 angles mod 2 pi."""
    phi = positions.to(torch.float64)[..., None] * inv_freq.to(device=x.device, dtype=torch.float64)
    return rotate(x, wrap_phases(phi, x.dtype), pairing)


def _attend(q, k, v, keep, bias, scale, fused):
    """Softmax attention of q (B, H, bq, D) over k, v (B, H, n, D) with ``keep`` (bq, n) bool
    (None: all keys) and an additive ``bias`` tile (or None; a -inf in it drops its key, as a padding key).

    Returns (out (B, H, bq, Dv), logsumexp (B, H, bq)); a row with no key has lse -inf
    (its out is finite and gets weight 0 in ``merge_lse``). ``fused``: torch's CPU flash
    kernel (returns the logsumexp; no gradient through it), else matmuls.
    """
    if bias is not None:  # a part whose keys the bias masks all (the padding) is empty for that row, not uniform
        seen = bias > -math.inf
        keep = seen if keep is None else keep & seen
    if fused:
        mask = None if bias is None else bias.to(q.dtype)
        if keep is not None:
            mask = (torch.zeros(keep.shape, dtype=q.dtype, device=q.device) if mask is None else mask).masked_fill(
                ~keep, -math.inf
            )
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=mask, scale=scale)
        return out, lse if keep is None else lse.masked_fill(~keep.any(-1), -math.inf)
    s = q @ k.transpose(-1, -2) * scale
    if bias is not None:
        s = s + bias.to(s.dtype)
    if keep is None:
        return torch.softmax(s, -1) @ v, s.logsumexp(-1)
    has_key = keep.any(-1)
    s = s.masked_fill(~(keep | ~has_key[..., None]), -math.inf)  # an empty row keeps finite scores: no NaN gradient
    lse = torch.where(has_key, s.logsumexp(-1), -math.inf)
    return torch.softmax(s, -1) @ v, lse


def rerope_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    inv_freq: torch.Tensor,
    window: int,
    leak: float | None = None,
    *,
    q_pos: torch.Tensor | None = None,
    pairing: str = "half",
    bias: Bias | None = None,
    scale: float | None = None,
    block_size: int = 512,
    fused: bool | None = None,
) -> torch.Tensor:
    """Causal (leaky) ReRoPE attention of unrotated q, k, blockwise over query blocks (Su 2023).

    Args:
        q: (B, H, Tq, D) unrotated queries, float32 or float64.
        k: (B, Hkv, Tk, D) unrotated keys at positions 0..Tk-1; H a multiple of Hkv (grouped-query attention).
        v: (B, Hkv, Tk, Dv) values at the keys' positions.
        inv_freq: (D/2,) RoPE frequencies omega_i, radians per token.
        window: w >= 1 tokens; relative positions below w are exact (w >= Tk: plain RoPE).
        leak: None for ReRoPE, Su's k > 1 for leaky ReRoPE (w + (i-j-w)/k beyond w).
        q_pos: (Tq,) consecutive integer query positions; default ``Tk - Tq + arange(Tq)``
            (decoding with a cache of unrotated keys).
        pairing: "half" (Hugging Face ``rotate_half``) or "adjacent" (``posenc.attention.rotate``).
        bias: ``posenc.attention.Bias``, an additive score bias by (query position, key
            position) tiles, e.g. the other parts of a composed scheme.
        scale: multiplies q.k; default 1/sqrt(D).
        block_size: queries per block: at most H x block x Tk scores (or mask entries) exist.
        fused: torch's CPU flash kernel per tile (default: on CPU when no gradient is
            needed and Dv == D; it gives no gradient through the logsumexp).

    Returns:
        (B, H, Tq, Dv) in v's dtype. Equals ``naive`` (tested: values and gradients).
    """
    Tq, Tk, H = q.shape[2], k.shape[2], q.shape[1]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if fused is None:
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        fused = q.device.type == "cpu" and not grad and v.shape[-1] == q.shape[-1]
    q_pos = torch.arange(Tk - Tq, Tk, device=q.device) if q_pos is None else q_pos.to(q.device)
    k_pos = torch.arange(Tk, device=q.device)
    slope, qp, kp = _slope(leak), q_pos.to(torch.float64), k_pos.to(torch.float64)  # int * float would be float32
    k_near, v = repeat_kv(_rot(k, kp, inv_freq, pairing), H), repeat_kv(v, H)
    k_far = repeat_kv(k if leak is None else _rot(k, kp * slope, inv_freq, pairing), H)
    q_near = _rot(q, qp, inv_freq, pairing)
    q_far = _rot(q, window + (qp - window) * slope, inv_freq, pairing)
    out = []
    for a in range(0, Tq, block_size):
        p = q_pos[a : a + block_size, None]
        lo, hi = int(p[0]), int(p[-1])
        qn, qf = q_near[:, :, a : a + block_size], q_far[:, :, a : a + block_size]
        # Keys by role for this block: far j <= i - w, near i - w < j <= i. Masks only
        # where the role changes inside the block (triangles of width < block).
        f0, f1 = max(0, lo - window + 1), max(0, hi - window + 1)
        m0, m1 = min(max(hi - window + 1, f0), lo + 1), lo + 1
        parts = []
        for kk, q_, j0, j1, rule in (
            (k_far, qf, 0, f0, None),
            (k_far, qf, f0, f1, "far"),
            (k_near, qn, f0, m0, "near"),
            (k_near, qn, m0, m1, None),
            (k_near, qn, m1, hi + 1, "near"),
        ):
            if j1 > j0:
                j = k_pos[None, j0:j1]
                keep = None if rule is None else (j <= p - window) if rule == "far" else (j > p - window) & (j <= p)
                tile = None if bias is None else bias.tile(lo, hi + 1, j0, j1)
                parts.append(_attend(q_, kk[:, :, j0:j1], v[:, :, j0:j1], keep, tile, scale, fused))
        out.append(merge_lse(parts))
    return torch.cat(out, dim=-2).to(v.dtype)


def naive(q, k, v, inv_freq, window, leak=None, *, q_pos=None, pairing="half", bias=None, scale=None):
    """Reference for ``rerope_attention`` (same arguments): the full Tq x Tk matrix of clamped
    relative positions, each score ``<R(pos(i, j)) q_i, k_j>``; O(Tq Tk D) memory, tests only."""
    Tq, Tk, H = q.shape[2], k.shape[2], q.shape[1]
    k, v = repeat_kv(k, H), repeat_kv(v, H)
    i = (torch.arange(Tk - Tq, Tk, device=q.device) if q_pos is None else q_pos)[:, None].to(torch.float64)
    j = torch.arange(Tk, dtype=torch.float64, device=q.device)[None, :]
    rel = torch.where(i - j < window, i - j, window + (i - j - window) * _slope(leak))
    q_rot = _rot(q[:, :, :, None, :], rel, inv_freq, pairing)  # (B, H, Tq, Tk, D)
    scores = (q_rot * k[:, :, None]).sum(-1) * (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if bias is not None:
        scores = scores + bias.tile(int(i[0]), int(i[-1]) + 1, 0, Tk)
    return scores.masked_fill(j > i, -math.inf).softmax(-1) @ v
