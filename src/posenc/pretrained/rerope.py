"""ReRoPE and leaky ReRoPE for Hugging Face Llama-family attention (Su 2023).

ReRoPE (Su, "Rectified Rotary Position Embeddings", 2023) keeps RoPE's relative
position ``i - j`` inside a window ``w`` and clamps it to ``w`` beyond::

    pos(i, j) = i - j                      if i - j < w
              = w + (i - j - w) * leak     otherwise

``leak = 0`` is ReRoPE; ``leak = 1/k`` is leaky ReRoPE (positions beyond the
window interpolated by ``k``); ``leak = 1`` is plain RoPE. The score for a fixed
relative position needs q and k rotated differently from the normal path, so the
attention is computed blockwise over query blocks: for each block, the near
scores ``<R(i) q_i, R(j) k_j>`` on the keys within the window and the far
scores ``<R(w + (i - w) leak) q_i, R(j leak) k_j>`` on the keys beyond it, one
softmax over both. Memory is O(block x T) per head, never T x T.

Integration: :func:`install` swaps the model's rotary embedding for one that
returns ``cos = 1, sin = 0`` (so the attention function receives unrotated q and
k, and the KV cache stores unrotated keys, as ReRoPE decoding needs) and
registers :func:`attention_forward` in transformers' ``AttentionInterface``.
Works for models whose attention rotates q/k with ``apply_rotary_pos_emb`` from
``model.model.rotary_emb`` and then calls the attention interface (Llama,
Mistral, Qwen2/3, SmolLM, ...), with the half-split (``rotate_half``) pairing.
"""

from __future__ import annotations

import math

import torch
from torch import nn

ATTN_NAME = "posenc_rerope"


def rotate(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (..., T, D) by positions ``pos`` (T,) float, half-split pairing.

    ``inv_freq`` (D/2,) float32 are RoPE's omega_i. Angles are computed in float32.
    """
    ang = pos.to(torch.float32)[:, None] * inv_freq.to(torch.float32)[None, :]
    cos, sin = ang.cos().repeat(1, 2), ang.sin().repeat(1, 2)
    half = x.shape[-1] // 2
    rot_half = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rot_half * sin


def _attend(q, k, v, keep, scale, fused):
    """Softmax attention of q (B, H, bq, D) over k, v (B, H, n, D), where ``keep`` (bq, n)
    bool or None (all keys); returns (out (B, H, bq, D), logsumexp (B, H, bq)). A row
    with no key gives out 0, lse -inf. ``fused``: torch's CPU flash kernel (it returns
    the logsumexp), else matmuls."""
    if fused:
        bias = None if keep is None else torch.zeros(keep.shape, dtype=q.dtype).masked_fill_(~keep, -math.inf)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=bias, scale=scale)
        return out, lse if keep is None else lse.masked_fill(~keep.any(-1), -math.inf)
    s = q @ k.transpose(-1, -2) * scale
    if keep is not None:
        s.masked_fill_(~keep, -math.inf)
    lse = s.logsumexp(-1)
    return (s - lse.nan_to_num(neginf=0.0)[..., None]).exp_() @ v, lse


def _merge(parts):
    """One softmax over disjoint key sets from their (out, logsumexp) pairs."""
    lse = torch.stack([lse for _, lse in parts]).logsumexp(0)
    return sum(o * (part_lse - lse).exp()[..., None] for o, part_lse in parts)


def rerope_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    inv_freq: torch.Tensor,
    window: int,
    leak: float = 0.0,
    q_pos: torch.Tensor | None = None,
    scale: float | None = None,
    block: int = 512,
    fused: bool | None = None,
) -> torch.Tensor:
    """Causal (leaky) ReRoPE attention, blockwise over query blocks.

    Args:
        q: (B, H, Tq, D) unrotated queries, float32.
        k, v: (B, Hkv, Tk, D) unrotated keys / values at positions 0..Tk-1; H must be
            a multiple of Hkv (grouped-query attention).
        inv_freq: (D/2,) RoPE frequencies omega_i (radians per token).
        window: w >= 1, relative positions below w are exact.
        leak: slope beyond the window (0: ReRoPE, 1/k: leaky ReRoPE).
        q_pos: (Tq,) integer query positions; default ``Tk - Tq + arange(Tq)``.
        scale: logit scale, default 1/sqrt(D).
        block: queries per block; peak memory ~ block * Tk mask entries (fused) or
            H * block * Tk scores (matmul path).
        fused: use torch's CPU flash kernel per part (default: on CPU).

    Returns:
        (B, H, Tq, D) attention output. The near part (keys within the window) and
        the far part are attended separately and merged by their logsumexps, which
        equals one softmax over both.
    """
    Tq, D = q.shape[2], q.shape[3]
    Tk, G = k.shape[2], q.shape[1] // k.shape[1]
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    fused = q.device.type == "cpu" if fused is None else fused
    if q_pos is None:
        q_pos = torch.arange(Tk - Tq, Tk, device=q.device)
    k_pos = torch.arange(Tk, device=q.device)
    k_near = rotate(k, k_pos, inv_freq).repeat_interleave(G, dim=1)
    k_far = rotate(k, k_pos * leak, inv_freq).repeat_interleave(G, dim=1)
    v = v.repeat_interleave(G, dim=1)
    q_near, q_far = rotate(q, q_pos, inv_freq), rotate(q, window + (q_pos - window) * leak, inv_freq)
    out = torch.empty_like(q)
    for a in range(0, Tq, block):
        p = q_pos[a : a + block, None]
        lo, hi = int(p[0]), int(p[-1])
        qn, qf = q_near[:, :, a : a + block], q_far[:, :, a : a + block]
        # Keys by role for this block: far j <= i - w, near i - w < j <= i. Masks only
        # where the role changes inside the block (triangles of width < block).
        f0, f1 = max(0, lo - window + 1), max(0, hi - window + 1)
        n1 = hi + 1
        m0, m1 = min(max(hi - window + 1, f0), lo + 1), lo + 1
        parts = []
        for kk, q_, j0, j1, rule in ((k_far, qf, 0, f0, None), (k_far, qf, f0, f1, "far"),
                                     (k_near, qn, f0, m0, "near"), (k_near, qn, m0, m1, None),
                                     (k_near, qn, m1, n1, "near")):
            if j1 > j0:
                j = k_pos[None, j0:j1]
                keep = None if rule is None else (j <= p - window) if rule == "far" else (j > p - window) & (j <= p)
                parts.append(_attend(q_, kk[:, :, j0:j1], v[:, :, j0:j1], keep, scale, fused))
        out[:, :, a : a + block] = _merge(parts)
    return out


def rerope_attention_naive(q, k, v, inv_freq, window, leak=0.0, scale=None):
    """Reference: full T x T relative-position matrix (tests only; O(T^2 D) memory).

    Same arguments as :func:`rerope_attention` with Tq == Tk; each score is
    ``<R(pos(i, j)) q_i, k_j>`` with the clamped relative position of the module docstring.
    """
    B, H, T, D = q.shape
    k = k.repeat_interleave(H // k.shape[1], dim=1)
    v = v.repeat_interleave(H // v.shape[1], dim=1)
    i = torch.arange(T)[:, None].float()
    j = torch.arange(T)[None, :].float()
    rel = i - j
    pos = torch.where(rel < window, rel, window + (rel - window) * leak)
    ang = pos[..., None] * inv_freq  # (T, T, D/2)
    cos, sin = ang.cos().repeat(1, 1, 2), ang.sin().repeat(1, 1, 2)
    qe = q[:, :, :, None, :]  # (B, H, T, 1, D)
    half = D // 2
    q_rot = qe * cos + torch.cat((-qe[..., half:], qe[..., :half]), -1) * sin  # (B, H, T, T, D)
    scores = (q_rot * k[:, :, None, :, :]).sum(-1) * (scale or 1.0 / math.sqrt(D))
    scores = scores.masked_fill(j > i, -math.inf)
    return scores.softmax(-1) @ v


class IdentityRotary(nn.Module):
    """Stands in for ``model.model.rotary_emb``: cos = 1, sin = 0 (no rotation).

    Keeps the real frequencies as ``inv_freq`` (D/2,) and ``attention_scaling``
    (1.0) so they can be read back like any transformers rotary embedding.
    """

    def __init__(self, inv_freq: torch.Tensor):
        super().__init__()
        self.register_buffer("inv_freq", inv_freq.clone(), persistent=False)
        self.attention_scaling = 1.0

    def forward(self, x, position_ids):
        shape = (*position_ids.shape, 2 * self.inv_freq.shape[0])
        return torch.ones(shape, dtype=x.dtype, device=x.device), torch.zeros(shape, dtype=x.dtype, device=x.device)


def attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, position_ids=None, **kwargs):
    """transformers ``AttentionInterface`` entry: (B, H, Tq, D) -> ((B, Tq, H, D), None).

    Reads ``module.rerope = (inv_freq, window, leak)`` set by :func:`install`.
    Batch of unpadded sequences starting at position 0 (``attention_mask`` unused).
    """
    inv_freq, window, leak = module.rerope
    q_pos = position_ids[0] if position_ids is not None else None
    out = rerope_attention(query.float(), key.float(), value.float(), inv_freq, window, leak, q_pos, scaling)
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def install(model, inv_freq: torch.Tensor, window: int, leak: float) -> None:
    """Switch a Llama-family model to (leaky) ReRoPE attention in place.

    ``inv_freq`` (D/2,) are the unscaled RoPE frequencies; ``window`` w (tokens);
    ``leak`` in [0, 1]. Undone by rebuilding ``model.model.rotary_emb`` and
    setting the attention implementation back (``schedules.apply_method`` does).
    """
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, attention_forward)
    model.model.rotary_emb = IdentityRotary(inv_freq)
    for layer in model.model.layers:
        layer.self_attn.rerope = (inv_freq, int(window), float(leak))
    model.set_attn_implementation(ATTN_NAME)
