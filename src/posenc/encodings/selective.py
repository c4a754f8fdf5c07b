"""Selective attention (Leviathan, Kalman and Matias, ICLR 2025, "Selective Attention Improves Transformer",
arXiv 2410.02703, sec. 3 and its listing): a token may mask later tokens' view of an earlier one.

One head's logits are reused as the selection scores: with z^0_kj = q^0_k . k^0_j / sqrt(D) + bias^0_kj the causal
logits of head 0 (the first key/value head under grouped-query attention), token k selects the earlier token j
by S_kj = ReLU(z^0_kj) for j < k (not itself), and the first token (the paper's <BOS>) is never masked: S_k0 = 0
(``keep_first``; in a left-padded batch each row's first real token). The selections accumulate and are
subtracted, strictly later, from every head's logits::

    F_ij = sum_{j < k < i} S_kj          z_ij <- z_ij - F_ij          a_i = softmax_j(z_i)

so a token that several later tokens judged done fades from every later query: a content-driven decay of the
logits, as FoX's forget gate (``forget``) is a content-driven decay by position (FoX's decay depends on the tokens
in between only; selective attention's on the pair). The selection head is not a new parameter.

Paths: the forward goes per block of query rows (at most block x (block + window) scores per head): head 0's logits
of the block, their ReLU'd selections summed down each key's column with a running (B, T) sum carried from block to
block (float32; float64 in a float64 model), F's rows read off that sum one row late, then one SDPA call with the
bias tile minus F as its mask. A composed bias (``selective+alibi``) joins head 0's logits and every head's; a
rotary part (``rope+selective``) rotates q and k first, so head 0's selections are its rotated logits. A window
(``selective:window=W``) hides z^0_kj as it hides z_kj (F_ij then only sums k within the window of both). Decoding
keeps the running column sum of every cached key (``SelectiveState``): a step adds the new tokens' selections, O(T D).
Reference: ``selective_attention_naive``, the paper's listing on the full matrix. Left out: the paper's context
pruning (evicting the keys whose F passed a budget), an inference-memory saving that changes the outputs.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

from posenc.attention import Window, causal_tile, repeat_kv
from posenc.encodings.base import Bias, Buffer, DecodeState, Dims, Encoding, Inputs
from posenc.encodings.registry import register
from posenc.errors import PosencError

BLOCK = 512  # query rows per block (memory, not results)


def _visible(window: Window | None, qs: int, qe: int, ks: int, ke: int, device) -> torch.Tensor:
    """(B|1, 1, qe - qs, ke - ks) bool: query row i sees key row j (causal, and the window's)."""
    if window is not None:
        return window.keep(qs, qe, ks, ke, device)
    i = torch.arange(qs, qe, device=device)[:, None]
    return (torch.arange(ks, ke, device=device)[None] <= i)[None, None]


def selective_rows(
    q, k, v, carry: torch.Tensor, scale: float, bias: Bias | None, window: Window | None, exempt: torch.Tensor | None
) -> torch.Tensor:
    """Selective attention of the last Tq of T rows, per block of ``BLOCK`` query rows.

    q: (B, H, Tq, D), k: (B, H, T, D), v: (B, H, T, Dv) (rows of the keys' frame: ``window.offset`` places them in
    the sequence); carry: (B, T) float32+, sum_{k < T - Tq, k > j} S_kj of each key column j, updated in place to
    the sum over every row; bias: a Bias over the T rows or None; exempt: (B,) int64 key row never selected (the
    first token), or None. Returns (B, H, Tq, Dv) in v's dtype."""
    T, dt, out = k.shape[-2], carry.dtype, []
    q_start = T - q.shape[-2]
    batch = torch.arange(q.shape[0], device=q.device)
    for qs in range(q_start, T, BLOCK):
        qe = min(qs + BLOCK, T)
        ks = 0 if window is None else window.start(qs)
        rows, keys = q[..., qs - q_start : qe - q_start, :], k[..., ks:qe, :]
        tile = (
            torch.zeros(1, 1, qe - qs, qe - ks, device=q.device, dtype=dt)
            if bias is None
            else bias.tile(qs, qe, ks, qe).to(dt)
        )
        visible = _visible(window, qs, qe, ks, qe, q.device)
        z0 = (rows[:, 0] @ keys[:, 0].transpose(-1, -2)).to(dt) * scale + tile[:, 0]  # (B, tq, tk) head 0
        i = torch.arange(qs, qe, device=q.device)[:, None]
        j = torch.arange(ks, qe, device=q.device)[None]
        selects = visible[:, 0] & (j < i)  # not itself
        if exempt is not None:
            selects = selects & (j[None] != exempt[:, None, None])
        s = torch.where(selects, F.relu(z0), 0.0)
        sums = carry[:, None, ks:qe] + torch.cumsum(s, dim=-2)  # sum_{j < k <= row} S_kj, rows of the block
        f = torch.cat((carry[:, None, ks:qe], sums[:, :-1]), dim=-2)  # F_ij: the rows k < i only
        carry[batch[:, None], torch.arange(ks, qe, device=q.device)] = sums[:, -1]
        mask = torch.where(visible, tile - f[:, None], float("-inf")).to(rows.dtype)
        out.append(F.scaled_dot_product_attention(rows, keys, v[..., ks:qe, :], attn_mask=mask, scale=scale))
    return torch.cat(out, dim=-2)


def selective_attention_naive(
    q, k, v, bias: Bias | None = None, window: Window | None = None, keep_first: bool = True, first=None
) -> torch.Tensor:
    """Reference: the paper's listing on the full (T, T) logits in float64. q, k, v: (B, H, T, D), every head's keys
    (head 0 selects); first: (B,) int64 first real rows of a left-padded batch, or None. Returns (B, H, T, Dv)
    float64::

        S = relu(logits[:, 0]); S[..., first] = 0; S = (1 - eye) * S; S = roll(S, 1, -2); S[..., 0, :] = 0
        logits -= cumsum(S, -2)[:, None]
    """
    q, k, v = q.double(), k.double(), v.double()
    B, _, T, _ = q.shape
    logits = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1]) + causal_tile(bias, 0, T, T, q.device, torch.float64)
    if window is not None:
        logits = logits.masked_fill(~_visible(dataclasses.replace(window, offset=0), 0, T, 0, T, q.device), -math.inf)
    s = F.relu(logits[:, 0])
    if keep_first:
        col = torch.zeros(B, dtype=torch.int64) if first is None else first
        s = s * (torch.arange(T)[None, None, :] != col[:, None, None])
    s = (1 - torch.eye(T, dtype=torch.float64)) * s
    s = torch.roll(s, 1, -2) * (torch.arange(T) > 0)[:, None]  # row 0 of the roll (the last row) dropped
    return torch.softmax(logits - torch.cumsum(s, dim=-2)[:, None], dim=-1) @ v


@register
class Selective(Encoding):
    """Selective attention: head 0's ReLU'd logits, summed over later tokens, are subtracted from every head's logits
    (Leviathan et al. 2025).

    Parameters:
        keep_first: the first token (the paper's <BOS>; each row's first real token) is never masked (true, the
            paper's) or is selectable like any other (false)

    Replaces attention (``attend``), takes the other parts' bias, a rotary part's rotated q and k, and the layer's
    window. q, k: (B, H, T, D), v: (B, H, T, Dv) -> (B, H, T, Dv) in v's dtype. No parameters to learn and no
    errors of its own (a decoding cache refuses a crop).
    """

    name = "selective"
    replaces_attention = attends_rotated = attends_window = True
    family = "attention variants"
    source = "Leviathan et al. 2025, arXiv:2410.02703 (Selective Attention, ICLR 2025)"

    def __init__(self, dims: Dims, keep_first: bool = True):
        super().__init__(dims)
        self.keep_first = keep_first

    def exempt(self, inp: Inputs, B: int, offset: int = 0) -> torch.Tensor | None:
        """(B,) int64 key row of each batch row's first token (its first real one), ``offset`` rows dropped before;
        None without ``keep_first``."""
        if not self.keep_first:
            return None
        first = torch.zeros(B, dtype=torch.int64, device=inp.x.device) if inp.first is None else inp.first
        return first.to(inp.x.device) - offset

    def attend(self, q, k, v, inp: Inputs, bias: Bias | None = None) -> torch.Tensor:
        dt, (B, _, T, _) = torch.promote_types(q.dtype, torch.float32), q.shape
        carry = torch.zeros(B, T, dtype=dt, device=q.device)
        window = None if self.window is None else dataclasses.replace(self.window, first=inp.first)
        scale = self.logit_scale / math.sqrt(q.shape[-1])
        return selective_rows(q, k, v, carry, scale, bias, window, self.exempt(inp, B)).to(v.dtype)

    def decoder(self) -> SelectiveState:
        return SelectiveState(self)

    def describe(self) -> str:
        return "selective attention (head 0's ReLU'd logits accumulated and subtracted)" + (
            "" if self.keep_first else ", the first token selectable"
        )


class SelectiveState(DecodeState):
    """Decoding: keys and values cached as they are, and the running selection sum of every cached key column,
    ``sums`` (B, T) float32+ (sum over the tokens so far of their ReLU'd head-0 logits on it); a step adds the new
    tokens' selections and reads F's new rows off it, O(T D). ``fed`` counts the positions fed, so a windowed
    layer's cache (which drops its oldest keys and their sums) is placed in the sequence's rows."""

    enc: Selective

    def __init__(self, enc: Selective):
        super().__init__(enc)
        self.sums = Buffer(-1)
        self.fed = 0

    def attend(self, q, k, v, inp: Inputs, pos: torch.Tensor, bias, keys: Buffer, values: Buffer) -> torch.Tensor:
        enc, (B, _, n, _) = self.enc, q.shape
        K, V = (repeat_kv(t, q.shape[1]) for t in (keys.append(k), values.append(v)))
        carry = self.sums.append(torch.zeros(B, n, dtype=torch.promote_types(q.dtype, torch.float32), device=q.device))
        self.fed += n
        offset = self.fed - K.shape[-2]
        window = None if enc.window is None else dataclasses.replace(enc.window, offset=offset, first=inp.first)
        scale = enc.logit_scale / math.sqrt(q.shape[-1])
        return selective_rows(q, K, V, carry, scale, bias, window, enc.exempt(inp, B, offset)).to(v.dtype)

    def crop(self, length: int) -> None:
        if length < self.fed:  # the sums hold the later tokens' selections too: they cannot go back
            raise PosencError(
                "selective attention's decoding cache cannot be cropped (its running sums hold the cropped tokens' "
                "selections)"
            )
        super().crop(length)
