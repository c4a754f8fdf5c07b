"""Learned attention sinks (gpt-oss): one learned logit per head joins each softmax's denominator and is dropped.

For query i, keys j <= i, head h (transformers ``models/gpt_oss/modeling_gpt_oss.py``, ``eager_attention_forward``)::

    z_ij = q_i . k_j / sqrt(D) + bias_ij
    a_ij = exp(z_ij) / (exp(s_h) + sum_{j' <= i} exp(z_ij'))         o_i = sum_j a_ij v_j

so a query may give up to all of its weight to nothing (the sink carries no value): the trained form of
StreamingLLM's sink tokens (which posenc has as the ``sinks`` inference method). s_h starts at ``init`` (0: the
"softmax plus one" of a zero logit; gpt-oss loads its trained values). Alone the scheme is NoPE with sinks.

Paths: every query without a bias in float32/float64 (training, prefill) is one causal SDPA call over T + 1
keys, O(T) memory: a sink key first whose score with every query is s_h (the queries carry one extra feature
1 / scale, the sink key s_h there and the real keys 0), value 0, and a zero query row first so that query i
(row i + 1) sees the sink and keys 0..i; differentiable in s_h through that feature. Otherwise (a composed bias,
decoding, bf16/fp16 q) per block of 512 query rows: the block's logits in float32+, the sink column appended,
softmax, the column dropped. Reference: ``sink_attention_naive``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from posenc.attention import causal_tile, repeat_kv
from posenc.encodings.base import Bias, Buffer, DecodeState, Dims, Encoding, Inputs
from posenc.encodings.registry import register
from posenc.errors import PosencError

BLOCK = 512  # query rows per logits block (memory, not results)
MAX_INIT = 30.0  # |s_h| at the start: exp(-30) = 1e-13 of a unit logit's weight, a sink that is (almost) absent


def sink_attention_blocks(
    q, k, v, sinks: torch.Tensor, scale: float, bias: Bias | None = None, q_start: int = 0
) -> torch.Tensor:
    """Attention with a sink logit per head, per block of query rows.

    q: (B, H, Tq, D) the rows [q_start, q_start + Tq) of T; k: (B, H, T, D); v: (B, H, T, Dv); sinks: (H,);
    bias: a Bias over the T rows, or None. Logits in float32 (float64 for float64 q). Returns (B, H, Tq, Dv)
    in v's dtype."""
    dt, T, out = torch.promote_types(q.dtype, torch.float32), k.shape[-2], []
    for qs in range(q_start, T, BLOCK):
        qe = min(qs + BLOCK, T)
        z = (q[..., qs - q_start : qe - q_start, :] @ k[..., :qe, :].transpose(-1, -2)).to(dt) * scale
        z = z + causal_tile(bias, qs, qe, qe, q.device, dt)
        sink = sinks.to(dt)[None, :, None, None].expand(*z.shape[:-1], 1)
        weights = torch.softmax(torch.cat((z, sink), dim=-1), dim=-1)[..., :-1]
        out.append(weights.to(v.dtype) @ v[..., :qe, :])
    return torch.cat(out, dim=-2)


def sink_attention_sdpa(q, k, v, sinks: torch.Tensor, scale: float) -> torch.Tensor:
    """Every query's attention with a sink logit per head as one causal SDPA call over a prepended sink key.

    q, k: (B, H, T, D), v: (B, H, T, Dv), float32 or float64; sinks: (H,). Returns (B, H, T, Dv) in q's dtype."""
    B, H, T, D = q.shape
    width = max(D + 1, v.shape[-1])  # the CPU flash kernel takes one head size for q, k and v

    def widened(t: torch.Tensor, feature: torch.Tensor | float, first: torch.Tensor | float) -> torch.Tensor:
        """t with feature D (then zeros up to width) and a first row holding ``first`` at feature D."""
        body = torch.cat((t, torch.as_tensor(feature, dtype=t.dtype).expand(B, H, T, 1)), dim=-1)
        head = torch.cat((t.new_zeros(B, H, 1, D), torch.as_tensor(first, dtype=t.dtype).expand(B, H, 1, 1)), dim=-1)
        return F.pad(torch.cat((head, body), dim=-2), (0, width - D - 1))

    qx = widened(q, 1 / scale, 0.0)
    kx = widened(k, 0.0, sinks.to(k.dtype)[None, :, None, None])
    vx = F.pad(torch.cat((v.new_zeros(B, H, 1, v.shape[-1]), v), dim=-2), (0, width - v.shape[-1]))
    out = F.scaled_dot_product_attention(qx, kx, vx, is_causal=True, scale=scale)
    return out[..., 1:, : v.shape[-1]]


def sink_attention_naive(q, k, v, sinks: torch.Tensor, bias: Bias | None = None, logit_scale: float = 1.0):
    """Reference: gpt-oss's definition on the full (T, T) logits in float64, the sink as an extra column of
    exp(s_h) in the denominator. Returns (B, H, T, Dv) float64."""
    q, k, v = q.double(), k.double(), v.double()
    T = q.shape[-2]
    z = logit_scale * (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    z = (z + causal_tile(bias, 0, T, T, q.device, torch.float64)).exp()
    return (z / (sinks.double()[None, :, None, None].exp() + z.sum(-1, keepdim=True))) @ v


@register
class LearnedSinks(Encoding):
    """Learned attention sinks: one learned logit per head joins each softmax's denominator and is dropped (gpt-oss).

    Parameters:
        init: the sink logit s_h every head starts at, a number in [-30, 30] (0: "softmax plus one")

    Replaces attention (``attend``), takes the other parts' bias and a rotary part's rotated q, k
    (``rope+learned-sinks``, gpt-oss's setup).
    q, k: (B, H, T, D), v: (B, H, T, Dv) -> (B, H, T, Dv) in v's dtype. Raises PosencError for init out of range.
    """

    name = "learned-sinks"
    replaces_attention = attends_rotated = True
    family = "attention variants"
    source = "OpenAI gpt-oss 2025 (transformers models/gpt_oss, eager_attention_forward)"

    def __init__(self, dims: Dims, init: float = 0.0):
        super().__init__(dims)
        if not (math.isfinite(init) and abs(init) <= MAX_INIT):
            raise PosencError(f"learned-sinks: init must be a number in [-{MAX_INIT:g}, {MAX_INIT:g}], got {init!r}")
        self.init = init
        self.sinks = nn.Parameter(torch.full((dims.n_head,), float(init)))

    def attend(self, q, k, v, inp: Inputs, bias: Bias | None = None) -> torch.Tensor:
        scale = self.logit_scale / math.sqrt(q.shape[-1])
        if bias is None and q.dtype in (torch.float32, torch.float64) and not torch.is_autocast_enabled(q.device.type):
            return sink_attention_sdpa(q, k, v, self.sinks, scale).to(v.dtype)
        return sink_attention_blocks(q, k, v, self.sinks, scale, bias)

    def decoder(self) -> LearnedSinksState:
        return LearnedSinksState(self)

    def neutral_init(self) -> None:
        """Sinks at -30: a pretrained model's attention is unchanged to 1e-13."""
        with torch.no_grad():
            self.sinks.fill_(-MAX_INIT)

    def describe(self) -> str:
        return f"learned-sinks(one learned logit per head in the softmax denominator, init {self.init:g})"


class LearnedSinksState(DecodeState):
    """Decoding: keys and values cached as they are; the new query rows over them with the sink, O(T D) per step."""

    enc: LearnedSinks

    def attend(self, q, k, v, inp: Inputs, pos: torch.Tensor, bias, keys: Buffer, values: Buffer) -> torch.Tensor:
        K, V = (repeat_kv(t, q.shape[1]) for t in (keys.append(k), values.append(v)))
        scale = self.enc.logit_scale / math.sqrt(q.shape[-1])
        return sink_attention_blocks(q, K, V, self.enc.sinks, scale, bias, q_start=K.shape[-2] - q.shape[-2])
