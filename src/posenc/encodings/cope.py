"""CoPE: contextual position encoding (Golovneva et al. 2024, "Contextual Position Encoding:
Learning to Count What's Important", arXiv 2405.18719; the authors' code,
facebookresearch/RAM ``projects/cope/src/cope/context_position.py``).

For query i and key j <= i, head dim D, s = logit_scale / sqrt(D)::

    g_ij = sigmoid(s q_i . k_j)                                  gates
    p_ij = min(sum_{t=j..i} g_it, npos_max - 1)                  contextual positions
    e(p) = (1 - w) e[floor p] + w e[ceil p],  w = p - floor p    linear interpolation
    logit_ij = s q_i . (k_j + e(p_ij)) + bias_ij                 then the causal softmax

e: (D, npos_max) learned per layer, shared by the heads, zero at init (the model starts as
NoPE), as the authors' code. The position term is scaled by s with the content term (their
default; the paper's listing adds it unscaled: the same model up to e -> e sqrt(D)). Since
q_i . e(p) interpolates q_i . e[n], only the (queries x npos_max) products are formed.
Gates see the content logit only; other parts' bias (a composition) joins the final logits.
Gates, positions and logits are float32 (float64 for float64 inputs) whatever q's dtype.
``npos_max`` defaults to 64, the CoPE baseline of the DAPE authors' language-model code
(``CoPE(64, head_dim)``); the RAM code's default is the context length + 1.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from posenc.attention import causal_tile, repeat_kv
from posenc.encodings.base import Bias, Buffer, DecodeState, Dims, Encoding, Inputs
from posenc.encodings.registry import register
from posenc.errors import PosencError


def cope_logits(
    q: torch.Tensor, k: torch.Tensor, emb: torch.Tensor, qs: int, qe: int, scale: float, q_start: int = 0
) -> torch.Tensor:
    """Content plus contextual-position logits of queries [qs, qe) over keys [0, qe), before bias and mask.

    q: (B, H, Tq, D) the queries of rows [q_start, q_start + Tq) (decoding: the new rows
    only), k: (B, H, T, D); emb: (D, npos_max). Returns (B, H, qe-qs, qe) in float32
    (float64 for float64 q); keys after the query get finite values (gate 0), to be masked.
    """
    dt = torch.promote_types(q.dtype, torch.float32)
    qb = q[..., qs - q_start : qe - q_start, :]
    dots = (qb @ k[..., :qe, :].transpose(-1, -2)).to(dt) * scale
    future = torch.arange(qe, device=q.device)[None, :] > torch.arange(qs, qe, device=q.device)[:, None]
    gates = torch.sigmoid(dots).masked_fill(future, 0.0)
    p = gates.flip(-1).cumsum(-1).flip(-1).clamp(max=emb.shape[-1] - 1)  # sum over t = j..i
    table = (qb @ emb.to(qb.dtype)).to(dt) * scale  # s q_i . e[n]: (B, H, tq, npos_max)
    lo = p.floor()  # no gradient through the integer parts; w carries it, as the authors' code
    w = p - lo
    e_lo, e_hi = table.gather(-1, lo.long()), table.gather(-1, p.ceil().long())
    return dots + e_lo + w * (e_hi - e_lo)


@register
class CoPE(Encoding):
    """CoPE: gates sigmoid(q.k) counted back from each query give positions p_ij, logit q . e(p_ij) \
(Golovneva et al. 2024).

    Parameters:
        npos_max: position embeddings, >= 1 (contextual positions are clipped at npos_max - 1)
        block_size: queries per block, >= 1 (memory, not results)

    Replaces attention (``attend``): per query
    block the (block x T) logits, softmax, values; takes the other parts' bias.
    q, k: (B, H, T, D), v: (B, H, T, Dv) -> (B, H, T, Dv) in v's dtype. Raises
    PosencError for a parameter out of range.
    """

    name = "cope"
    replaces_attention = has_logits = True
    family, source = "contextual and adaptive", "Golovneva et al. 2024, arXiv:2405.18719 (CoPE)"

    def __init__(self, dims: Dims, npos_max: int = 64, block_size: int = 512):
        super().__init__(dims)
        if npos_max < 1 or block_size < 1:
            raise PosencError(f"cope needs npos_max >= 1 and block_size >= 1, got {npos_max}, {block_size}")
        self.npos_max, self.block_size = npos_max, block_size
        self.pos_emb = nn.Parameter(torch.zeros(dims.head_dim, npos_max))

    def logits(self, q, k, inp: Inputs, bias: Bias | None, qs: int, qe: int):
        logits = cope_logits(q, k, self.pos_emb, qs, qe, self.logit_scale / math.sqrt(q.shape[-1]))
        return logits + causal_tile(bias, qs, qe, qe, q.device, logits.dtype)

    def attend(self, q, k, v, inp: Inputs, bias: Bias | None = None):
        return self.attend_by_logits(q, k, v, inp, bias, self.block_size)

    def decoder(self) -> CoPEState:
        return CoPEState(self)

    def describe(self) -> str:
        return f"CoPE: contextual positions from sigmoid(q.k) gates, {self.npos_max} interpolated position embeddings"


class CoPEState(DecodeState):
    """CoPE decoding: the new query rows' gates, positions and logits over every cached key (unrotated, as
    the parallel ``logits``), O(T D) per step."""

    enc: CoPE

    def attend(self, q, k, v, inp: Inputs, pos: torch.Tensor, bias, keys: Buffer, values: Buffer) -> torch.Tensor:
        enc = self.enc
        K, V = (repeat_kv(t, q.shape[1]) for t in (keys.append(k), values.append(v)))
        T, scale, out = K.shape[-2], enc.logit_scale / math.sqrt(q.shape[-1]), []
        T0 = T - q.shape[-2]
        for qs in range(T0, T, enc.block_size):
            qe = min(qs + enc.block_size, T)
            logits = cope_logits(q, K, enc.pos_emb, qs, qe, scale, q_start=T0)
            logits = logits + causal_tile(bias, qs, qe, qe, q.device, logits.dtype)
            out.append(torch.softmax(logits, dim=-1).to(v.dtype) @ V[..., :qe, :])
        return torch.cat(out, dim=-2)


def cope_attention_naive(
    q, k, v, emb: torch.Tensor, bias: Bias | None = None, logit_scale: float = 1.0
) -> torch.Tensor:
    """Reference: the full (T, T) CoPE attention in float64. p by a matrix product with the
    lower-triangular ones, e(p) by hat weights max(0, 1 - |p - n|) over all n (no floor/ceil)."""
    q, k, v, emb = q.double(), k.double(), v.double(), emb.double()
    T, npos, s = q.shape[-2], emb.shape[-1], logit_scale / math.sqrt(q.shape[-1])
    ones = torch.tril(torch.ones(T, T, dtype=torch.float64))  # ones[t, j] = [j <= t]
    dots = s * q @ k.transpose(-1, -2)
    p = ((torch.sigmoid(dots) * ones) @ ones).clamp(max=npos - 1)  # sum_t g_it [t <= i] [t >= j]
    hat = torch.relu(1 - (p[..., None] - torch.arange(npos, dtype=torch.float64)).abs())
    scores = dots + s * torch.einsum("bhijn,bhid,dn->bhij", hat, q, emb) + causal_tile(bias, 0, T, T, q.device, q.dtype)
    return torch.softmax(scores, dim=-1) @ v
