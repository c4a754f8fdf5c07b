"""Stick-breaking attention (Tan et al., ICLR 2025, "Scaling Stick-Breaking Attention", arXiv 2410.17980; the
reference of flash-linear-attention, ``fla/ops/stickbreaking_attn/naive.py``): no softmax, no positional encoding.

For query i and its visible keys j (j <= i; with ``attend_current=false`` j < i), head dim D::

    z_ij = q_i . k_j / sqrt(D) + bias_ij        beta_ij = sigmoid(z_ij)
    A_ij = beta_ij * prod_{l visible, l > j} (1 - beta_il)        o_i = sum_j A_ij v_j

The nearest key breaks off its share of the stick first, each farther key a share of what is left; the rest,
prod_j (1 - beta_ij), goes nowhere. Order comes from the process itself, so the scheme carries no positional
encoding (a composed bias joins z). posenc's default lets a query attend to its own position, as the
catalogue's definition (``prod_{j<l<=i}``) and every other scheme here; ``attend_current=false`` is the paper's
and fla's default (keys before the query only: query 0 sees no key and outputs 0, and a query's own key and
value never reach its output). In log space (float32, float64 for float64 q): log A_ij = logsigmoid(z_ij) + the sum
of logsigmoid(-z_il) over the visible l > j, a reverse cumulative sum over the keys of one block of query rows
(at most block x T logits). Decoding computes the new rows over the cached keys, equal to the parallel forward.
Reference: ``stick_breaking_naive`` (the definition's products, term by term).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from posenc.attention import causal_tile, repeat_kv
from posenc.encodings.base import Bias, Buffer, DecodeState, Dims, Encoding, Inputs
from posenc.encodings.registry import register

BLOCK = 512  # query rows per logits block (memory, not results)


def stick_breaking_attention(
    q, k, v, scale: float, attend_current: bool = False, bias: Bias | None = None, q_start: int = 0
) -> torch.Tensor:
    """Stick-breaking attention of the query rows [q_start, q_start + Tq) over keys [0, T), per block of rows.

    q: (B, H, Tq, D), k: (B, H, T, D), v: (B, H, T, Dv); bias: a Bias over the T rows, or None.
    Returns (B, H, Tq, Dv) in v's dtype."""
    dt, T, out = torch.promote_types(q.dtype, torch.float32), k.shape[-2], []
    for qs in range(q_start, T, BLOCK):
        qe = min(qs + BLOCK, T)
        z = (q[..., qs - q_start : qe - q_start, :] @ k[..., :qe, :].transpose(-1, -2)).to(dt) * scale
        if bias is not None:
            z = z + bias.tile(qs, qe, 0, qe).to(dt)
        rows, cols = torch.arange(qs, qe, device=q.device)[:, None], torch.arange(qe, device=q.device)
        visible = cols <= rows if attend_current else cols < rows
        log_rest = F.logsigmoid(-z).masked_fill(~visible, 0.0)  # hidden keys leave the stick as it is
        after = log_rest.flip(-1).cumsum(-1).flip(-1) - log_rest  # sum over the visible l > j
        weights = (F.logsigmoid(z) + after).masked_fill(~visible, -math.inf).exp()
        out.append(weights.to(v.dtype) @ v[..., :qe, :])
    return torch.cat(out, dim=-2)


def stick_breaking_naive(q, k, v, attend_current: bool = False, bias: Bias | None = None) -> torch.Tensor:
    """Reference: A_ij = beta_ij prod_{l visible, j < l} (1 - beta_il) term by term in float64 (loops over i, j; tiny
    T only). Returns (B, H, T, Dv) float64."""
    q, k, v = q.double(), k.double(), v.double()
    T = q.shape[-2]
    z = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if bias is not None:  # the finite tile only: visibility is decided below
        z = z + causal_tile(bias, 0, T, T, q.device, torch.float64).nan_to_num(neginf=0.0)
    beta = torch.sigmoid(z)
    weights = torch.zeros_like(z)
    for i in range(T):
        last = i if attend_current else i - 1  # the nearest visible key
        for j in range(last + 1):
            weights[..., i, j] = beta[..., i, j] * torch.prod(1 - beta[..., i, j + 1 : last + 1], dim=-1)
    return weights @ v


@register
class StickBreaking(Encoding):
    """Stick-breaking attention: A_ij = sigmoid(z_ij) prod_{nearer l} (1 - sigmoid(z_il)), no softmax (Tan et al. 2025).

    Parameters:
        attend_current: whether a query also attends to its own position (fla's attend_current; false, the
            paper's and fla's default: keys before the query only, query 0 outputs 0)

    Replaces attention (``attend``), takes the other parts' bias (added to z) and a rotary part's rotated q, k.
    q, k: (B, H, T, D), v: (B, H, T, Dv)
    -> (B, H, T, Dv) in v's dtype.
    """

    name = "stick-breaking"
    replaces_attention = attends_rotated = True
    family = "attention variants"
    source = "Tan et al. 2025, arXiv:2410.17980 (ICLR 2025, stick-breaking attention)"

    def __init__(self, dims: Dims, attend_current: bool = True):
        super().__init__(dims)
        self.attend_current = attend_current

    def attend(self, q, k, v, inp: Inputs, bias: Bias | None = None) -> torch.Tensor:
        scale = self.logit_scale / math.sqrt(q.shape[-1])
        return stick_breaking_attention(q, k, v, scale, self.attend_current, bias)

    def decoder(self) -> StickBreakingState:
        return StickBreakingState(self)

    def describe(self) -> str:
        own = "" if self.attend_current else ", keys before the query only"
        return f"stick-breaking(sigmoid stick shares from the nearest key back, no softmax{own})"


class StickBreakingState(DecodeState):
    """Decoding: keys and values cached as they are; the new query rows over them, O(T D) per step."""

    enc: StickBreaking

    def attend(self, q, k, v, inp: Inputs, pos: torch.Tensor, bias, keys: Buffer, values: Buffer) -> torch.Tensor:
        K, V = (repeat_kv(t, q.shape[1]) for t in (keys.append(k), values.append(v)))
        scale = self.enc.logit_scale / math.sqrt(q.shape[-1])
        return stick_breaking_attention(q, K, V, scale, self.enc.attend_current, bias, K.shape[-2] - q.shape[-2])
