"""DAPE: data-adaptive positional encoding (Zheng et al. 2024, "DAPE: Data-Adaptive
Positional Encoding for Length Extrapolation", NeurIPS, arXiv 2405.14722; the authors'
code, chuanyang-Zheng/DAPE ``DAPE.py``, ``AliBi_DAPE`` and ``ParallelKerpleLog_DAPE``).

For query i and key j, with A = s Q K^T (s = logit_scale / sqrt(D)) and B the base bias::

    logit_ij = A_ij + B_ij + f([A_ij; B_ij])        then the causal mask and softmax

f: R^{2H} -> R^H a one-hidden-layer LeakyReLU MLP over the heads of each (i, j) pair
(width 32), applied before the causal mask, as the authors' code (the mask comes in the
softmax). Each (i, j) pair is refined alone, so the mask after f keeps causality. B is
ALiBi (``base=alibi``, default) or Kerple log (``base=kerple``, learned as ``kerple``);
in a composition the other parts' bias joins B (f sees it). MLP initialised as
``nn.Linear``'s default, as the authors' code. Logits are float32 (float64 for float64
inputs); f runs per (query block x key block) tile, so at most (block x T) logits and
(block x block x width) hidden units exist.
"""

from __future__ import annotations

import math

import torch

from posenc.attention import causal_tile, repeat_kv
from posenc.encodings.base import Bias, BiasFn, Buffer, DecodeState, Dims, Encoding, Inputs
from posenc.encodings.bias import ALiBi
from posenc.encodings.mlp import PointMLP
from posenc.encodings.registry import alias, register
from posenc.encodings.relative import Kerple
from posenc.errors import PosencError

BASES = {"alibi": ALiBi, "kerple": Kerple}


def dape_tile(
    q, k, bias: BiasFn, mlp: PointMLP, scale: float, qs: int, qe: int, ks: int, ke: int, q_start: int = 0
) -> torch.Tensor:
    """A + B + f([A; B]) for queries [qs, qe) over keys [ks, ke), unmasked: (B, H, tq, tk) float32 (float64 for
    float64 q).

    q: (B, H, Tq, D) the queries of rows [q_start, q_start + Tq) (decoding: the new rows only),
    k: (B, H, T, D); bias: the tile function of B. A -inf in B masks the score (a padding key): the MLP reads 0
    there (its outputs would be NaN) and the logit is -inf.
    """
    dt = torch.promote_types(q.dtype, torch.float32)
    a = (q[..., qs - q_start : qe - q_start, :] @ k[..., ks:ke, :].transpose(-1, -2)).to(dt) * scale
    b = bias(qs, qe, ks, ke).to(dt).expand_as(a)
    masked = b == float("-inf")
    b = b.masked_fill(masked, 0.0)
    return (a + b + mlp(torch.cat((a, b), dim=1).movedim(1, -1)).movedim(-1, 1)).masked_fill(masked, float("-inf"))


@register
class DAPE(Encoding):
    """DAPE: logits A + B + MLP([A; B]) over heads, B = ALiBi or Kerple (Zheng et al. 2024).

    Parameters:
        base: the base bias B: "alibi" or "kerple"
        mlp_width: hidden width of the MLP over heads, >= 1
        block_size: queries and keys per tile, >= 1 (memory, not results)

    Replaces attention (``attend``); takes the other
    parts' bias. q, k: (B, H, T, D), v: (B, H, T, Dv) -> (B, H, T, Dv) in v's dtype.
    Raises PosencError for an unknown base or a parameter out of range.
    """

    name = "dape"
    position_indexed = True
    replaces_attention = has_logits = True
    family, source = "contextual and adaptive", "Zheng et al. 2024, arXiv:2405.14722 (DAPE)"

    def __init__(self, dims: Dims, base: str = "alibi", mlp_width: int = 32, block_size: int = 512):
        super().__init__(dims)
        if base not in BASES:
            raise PosencError(f"dape base must be 'alibi' or 'kerple', got {base!r}")
        if mlp_width < 1 or block_size < 1:
            raise PosencError(f"dape needs mlp_width >= 1 and block_size >= 1, got {mlp_width}, {block_size}")
        self.base_name, self.block_size = base, block_size
        self.base = BASES[base](dims)
        self.mlp = PointMLP(2 * dims.n_head, mlp_width, dims.n_head, "leaky_relu")

    def logits(self, q, k, inp: Inputs, bias: Bias | None, qs: int, qe: int):
        base = self.base.bias(inp)
        total = base.tile if bias is None else (lambda *t: base.tile(*t) + bias.tile(*t))
        C, scale = self.block_size, self.logit_scale / math.sqrt(q.shape[-1])
        logits = torch.cat(
            [dape_tile(q, k, total, self.mlp, scale, qs, qe, ks, min(ks + C, qe)) for ks in range(0, qe, C)], dim=-1
        )
        return logits + causal_tile(None, qs, qe, qe, q.device, logits.dtype)

    def attend(self, q, k, v, inp: Inputs, bias: Bias | None = None):
        return self.attend_by_logits(q, k, v, inp, bias, self.block_size)

    def decoder(self) -> DAPEState:
        return DAPEState(self)

    def describe(self) -> str:
        return (
            f"DAPE: logits A + B + MLP([A; B]) over heads (width {self.mlp.w1.shape[0]}), "
            f"base bias B = {self.base.describe()}"
        )


class DAPEState(DecodeState):
    """DAPE decoding: the new query rows' logits A + B + f([A; B]) over every cached key (unrotated), the base
    bias over the cached positions (its new rows only), O(T (D + width H)) per step."""

    enc: DAPE

    def attend(self, q, k, v, inp: Inputs, pos: torch.Tensor, bias, keys: Buffer, values: Buffer) -> torch.Tensor:
        enc = self.enc
        K, V = (repeat_kv(t, q.shape[1]) for t in (keys.append(k), values.append(v)))
        base = enc.base.bias(Inputs(inp.x, pos))
        total = base.tile if bias is None else (lambda *t: base.tile(*t) + bias.tile(*t))
        T, C, scale, out = K.shape[-2], enc.block_size, enc.logit_scale / math.sqrt(q.shape[-1]), []
        T0 = T - q.shape[-2]
        for qs in range(T0, T, C):
            qe = min(qs + C, T)
            logits = torch.cat(
                [
                    dape_tile(q, K, total, enc.mlp, scale, qs, qe, ks, min(ks + C, qe), q_start=T0)
                    for ks in range(0, qe, C)
                ],
                dim=-1,
            )
            logits = logits + causal_tile(None, qs, qe, qe, q.device, logits.dtype)
            out.append(torch.softmax(logits, dim=-1).to(v.dtype) @ V[..., :qe, :])
        return torch.cat(out, dim=-2)


alias("dape-kerple", "dape", "DAPE on a Kerple (log) base bias", base="kerple")


def dape_attention_naive(q, k, v, enc: DAPE, base: torch.Tensor, logit_scale: float = 1.0) -> torch.Tensor:
    """Reference: the full (T, T) DAPE attention in float64 from explicit weights.

    base: (1|B, H, T, T) the base bias B (e.g. from ``relative_bias_naive``); the MLP is
    written out with einsum, the causal mask applied after it.
    """
    q, k, v = q.double(), k.double(), v.double()
    T = q.shape[-2]
    a = logit_scale / math.sqrt(q.shape[-1]) * q @ k.transpose(-1, -2)
    b = base.double().expand_as(a)
    w1, b1, w2, b2 = (p.double() for p in (enc.mlp.w1, enc.mlp.b1, enc.mlp.w2, enc.mlp.b2))
    hidden = torch.nn.functional.leaky_relu(
        torch.einsum("uc,bcij->buij", w1, torch.cat((a, b), dim=1)) + b1[:, None, None]
    )
    f = torch.einsum("hu,buij->bhij", w2, hidden) + b2[:, None, None]
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    return torch.softmax((a + b + f).masked_fill(mask, float("-inf")), dim=-1) @ v
