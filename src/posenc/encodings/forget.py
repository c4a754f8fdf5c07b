"""FoX-style forget gate: a data-dependent score bias (Lin et al. 2025, "Forgetting
Transformer", eq. 4-6).

Per head h and token t, f_t = sigmoid(w_h^T x_t + b_h) in (0, 1); the bias of
query i over key j <= i is

    D_ij = log prod_{t=j+1..i} f_t = Lambda_i - Lambda_j,   Lambda = cumsum(log f)

log f = logsigmoid(.) is taken in float32 (float64 in a float64 model) and summed
in float64 (long inputs); tiles are differences relative to their first query,
rounded to float32 and clamped to <= 0, so only non-positive differences are ever
exponentiated by the softmax (rounding cannot make a causal entry positive).
Alone (``forget``) it is FoX over NoPE, the bias added to q.k / sqrt(D) as in Lin
et al. and flash-linear-attention's ``forgetting_attn``; with ``+`` it adds to any
other part (``acc-rand-qkv+forget``). ``scaled=true`` multiplies the bias by
1 / sqrt(D) too: flash-linear-attention's PaTH-FoX adds the gates to q.k before
its score scale (``parallel_path_attn``, kernel and decoding), so its PaTH-FoX is
``path+forget:scaled=true``; ``path+forget`` (the default) keeps FoX's unscaled gate.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from posenc.encodings.base import Bias, Buffer, DecodeState, Dims, Encoding, Inputs
from posenc.encodings.registry import register
from posenc.errors import PosencError


def log_gates(logits: torch.Tensor) -> torch.Tensor:
    """log f = logsigmoid(logits), taken in the logits' dtype, float32 at least (bf16 gates would be off by ~1e-3),
    returned float64: (B, H, T) -> (B, H, T)."""
    return F.logsigmoid(logits.to(torch.promote_types(logits.dtype, torch.float32))).double()


def log_forget_cumsum(logits: torch.Tensor) -> torch.Tensor:
    """Lambda = cumsum(logsigmoid(logits)) over the last dim: (B, H, T) -> (B, H, T) float64 (``log_gates``)."""
    return torch.cumsum(log_gates(logits), dim=-1)


def forget_bias(lam: torch.Tensor, dtype: torch.dtype = torch.float32) -> Bias:
    """Tile function for Lambda_i - Lambda_j (clamped <= 0); lam: (B, H, T) float64. Tiles (B, H, tq, tk) in ``dtype``.

    Both sides are taken relative to Lambda at the tile's first query in float64
    and only then rounded to ``dtype`` (float32; float64 in a float64 model), so
    the tile is one pass: near the diagonal the offsets are small (exact to the
    rounding of a block's worth of log-gates); far keys, where the offset is
    large, carry a bias whose softmax weight is ~0. Its separable form ``keys(qs, ke)`` = Lambda_qs - Lambda_j,
    (B, H, ke) in ``dtype`` (``posenc.attention.Bias``), is offset likewise (not clamped: the softmax drops
    Lambda_i, and a key's weight is the same whatever the rounding of the query's term).
    """

    def tile(qs: int, qe: int, ks: int, ke: int) -> torch.Tensor:
        ref = lam[..., qs : qs + 1]
        rows, cols = (lam[..., qs:qe] - ref).to(dtype), (lam[..., ks:ke] - ref).to(dtype)
        return (rows[..., :, None] - cols[..., None, :]).clamp_(max=0.0)

    def keys(qs: int, ke: int) -> torch.Tensor:  # separable: Lambda_i - Lambda_j; the row of query qs, in float64
        return (lam[..., qs : qs + 1] - lam[..., :ke]).to(dtype)

    return Bias(tile, at=lambda b, h, qi, ki: (lam[b, h, qi] - lam[b, h, ki]).clamp(max=0.0).to(dtype), keys=keys)


NEUTRAL_GATE_BIAS = 8.0  # a gate that (almost) never forgets: f = 1 needs b = +inf
MAX_INIT_BIAS = 30.0  # |b| at the start: sigmoid(30) leaks 1e-13 nats per token, sigmoid(-30) 30 (a closed gate)


@register
class ForgetGate(Encoding):
    """FoX forget gate: score bias Lambda_i - Lambda_j, Lambda = cumsum log sigmoid(W x + b) (Lin et al. 2025).

    One gate per head from the layer's input x (B, T, d_model); the bias tiles
    are (B, H, tq, tk) float32 (float64 in a float64 model), never a T x T tensor
    in the chunked path.

    Parameters:
        scaled: the bias times 1 / sqrt(head_dim), as flash-linear-attention's PaTH-FoX (``path+forget:scaled=true``)
        init_bias: b at the start, every head, in [-30, 30] (f = sigmoid(b) where W x = 0: b = 4 leaks 0.018 nats
            per token); None: ``nn.Linear``'s default, uniform within 1 / sqrt(d_model) of 0 (FoX's code starts it at
            0), so f ~ 0.5 and the gate starts 0.69 nats per token against every earlier key

    Raises PosencError for an ``init_bias`` outside [-30, 30].
    """

    name = "forget"
    family, source = "score biases", "Lin et al. 2025, arXiv:2503.02130 (Forgetting Transformer)"
    has_bias = True

    def __init__(self, dims: Dims, scaled: bool = False, init_bias: float | None = None):
        super().__init__(dims)
        if init_bias is not None and not abs(init_bias) <= MAX_INIT_BIAS:
            raise PosencError(
                f"forget: init_bias must lie in [-{MAX_INIT_BIAS:g}, {MAX_INIT_BIAS:g}] (f = sigmoid(b) at the start), "
                f"got {init_bias}"
            )
        self.gate = nn.Linear(dims.d_model, dims.n_head, bias=True)
        self.init_bias = init_bias
        if init_bias is not None:  # after nn.Linear's draw: the random-number order of every model stays the same
            nn.init.constant_(self.gate.bias, init_bias)
        self.scaled = scaled
        self.bias_scale = 1 / math.sqrt(dims.head_dim) if scaled else 1.0

    def log_lambda(self, inp: Inputs) -> torch.Tensor:
        """Lambda (times ``bias_scale``): (B, H, T) float64."""
        return log_forget_cumsum(self.gate(inp.x).transpose(1, 2)) * self.bias_scale

    def neutral_init(self) -> None:
        """W = 0, b = NEUTRAL_GATE_BIAS: every f_t = sigmoid(8) ~ 0.99966 (-3.4e-4 nats of bias per token of
        distance)."""
        nn.init.zeros_(self.gate.weight)
        nn.init.constant_(self.gate.bias, NEUTRAL_GATE_BIAS)

    def bias(self, inp: Inputs) -> Bias:
        return forget_bias(self.log_lambda(inp), torch.promote_types(inp.x.dtype, torch.float32))

    def decoder(self) -> ForgetState:
        return ForgetState(self)

    def describe(self) -> str:
        return (
            "forget gate (FoX): bias cumsum log sigmoid(Wx+b), float64 prefix sums"
            + (", times 1/sqrt(D)" if self.scaled else "")
            + ("" if self.init_bias is None else f", b starts at {self.init_bias:g}")
        )


class ForgetState(DecodeState):
    """The running cumulative log-gate: Lambda (B, H, T) float64 (times ``bias_scale``) of every cached
    position; a step computes the gates of the new inputs only, adds their prefix sum to Lambda_{T-1}
    (the parallel ``log_lambda``'s float64 sums) and gives the bias rows Lambda_i - Lambda_j, O(T) per step."""

    enc: ForgetGate

    def __init__(self, enc: ForgetGate):
        super().__init__(enc)
        self.lam = Buffer(-1)

    def bias(self, inp: Inputs, pos: torch.Tensor) -> Bias:
        enc = self.enc
        lam = torch.cumsum(log_gates(enc.gate(inp.x).transpose(1, 2)), dim=-1)
        if self.lam.length:
            held = self.lam.value
            assert held is not None  # rows are held
            lam = lam + held[..., -1:] / enc.bias_scale  # the unscaled running sum
        return forget_bias(self.lam.append(lam * enc.bias_scale), torch.promote_types(inp.x.dtype, torch.float32))


def forget_bias_naive(logits: torch.Tensor) -> torch.Tensor:
    """Reference: D_ij = sum_{j<t<=i} log sigmoid(logits_t) by explicit masked sums, (B, H, T, T) float64."""
    T = logits.shape[-1]
    logf = torch.log(torch.sigmoid(logits.double()))
    t = torch.arange(T)
    window = (t[:, None, None] >= t[None, None, :]) & (t[None, None, :] > t[None, :, None])  # [i, j, t]: j < t <= i
    return torch.einsum("bht,ijt->bhij", logf, window.double())
