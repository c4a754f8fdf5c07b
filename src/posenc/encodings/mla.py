"""MLA's decoupled RoPE (DeepSeek-V2, arXiv 2405.04434, sec. 2.1.3; DeepSeek-V3; transformers ``models/deepseek_v3``,
``DeepseekV3Attention``): each head's score is a position-free part plus a small rotary part whose key is one vector
shared by every head.

For query i, key j <= i, head h, head dim D = d_nope + r (r: ``rope_dim``)::

    z_ij = (q_nope_ih . k_nope_jh + (R_i q_rope_ih) . (R_j k_rope_j)) / sqrt(d_nope + r) + bias_ij

q_nope, q_rope: the first d_nope and the last r features of the layer's query head (DeepSeek's ``q_pass``,
``q_rot``); k_nope: the first d_nope features of the layer's key head; k_rope_j = W_kr x_j: one r-dim key per
position from the scheme's own projection W_kr (``rope_key``, d_model -> r, DeepSeek's ``k_rot`` rows of
``kv_a_proj_with_mqa``), the same for every head; R_t: RoPE's rotation by t * rope_theta^(-2i/r). The last r
features of the layer's key heads are not read (the shared key stands in their place): a layer trains
n_kv_head x r x d_model idle key weights beside the r x d_model of W_kr. Only the decoupled RoPE is implemented:
DeepSeek's low-rank compression of keys and values (``kv_lora_rank``, ``q_lora_rank``) is a memory saving of
the projections, not a positional design, and is left out; v has posenc's head dim D (DeepSeek's v_head_dim is
its own).

Paths: the forward builds the heads' keys [k_nope, R k_rope] once and runs the attention core
(``posenc.attention.attention``: fused causal SDPA, or the bias path for a composed bias or a padded batch);
decoding caches those keys per key/value head (rotated once) and attends with the new rows only. Reference:
``mla_naive`` (the two parts of every score summed in float64).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from posenc import rope
from posenc.attention import Bias, attention, causal_tile, repeat_kv, rotate
from posenc.encodings.base import Buffer, DecodeState, Dims, Encoding, Inputs
from posenc.encodings.registry import register
from posenc.errors import PosencError

DEEPSEEK_ROPE_SHARE = 64 / 192  # DeepSeek-V2/V3: qk_rope_head_dim 64 of qk_head_dim 192 (128 + 64)


def default_rope_dim(head_dim: int) -> int:
    """DeepSeek's share of rotary features (a third) of ``head_dim``, rounded to an even number >= 2."""
    return max(2, 2 * round(head_dim * DEEPSEEK_ROPE_SHARE / 2))


def mla_phases(pos: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """RoPE angles of positions ``pos`` (T,) int64 for frequencies ``inv_freq`` (r/2,) float64: (T, r/2), taken in
    float64 and wrapped mod 2 pi into float32 (float64 for a float64 ``dtype``)."""
    return rope.wrap_phases(pos.to(torch.float64)[:, None] * inv_freq.to(pos.device), dtype)


def mla_naive(
    q, k, v, k_rope, phases, pairing: str = "half", bias: Bias | None = None, logit_scale: float = 1.0
) -> torch.Tensor:
    """Reference: DeepSeek-V2's score as two dot products summed in float64, causal softmax over the full (T, T).

    q, k: (B, H, T, D), v: (B, H, T, Dv); k_rope: (B, T, r) the shared rotary key; phases: (T, r/2) radians.
    The nope part reads q[..., :D-r], k[..., :D-r]; the rotary part q[..., D-r:] and k_rope, each rotated by its
    position's phases. Returns (B, H, T, Dv) float64."""
    q, k, v, k_rope, phases = q.double(), k.double(), v.double(), k_rope.double(), phases.double()
    T, D, r = q.shape[-2], q.shape[-1], k_rope.shape[-1]
    nope = q[..., : D - r] @ k[..., : D - r].transpose(-1, -2)
    q_rot = rotate(q[..., D - r :], phases, pairing)
    k_rot = rotate(k_rope[:, None], phases, pairing)  # (B, 1, T, r): one key for every head
    z = logit_scale * (nope + q_rot @ k_rot.transpose(-1, -2)) / math.sqrt(D)
    return torch.softmax(z + causal_tile(bias, 0, T, T, q.device, torch.float64), dim=-1) @ v


@register
class MLA(Encoding):
    """MLA's decoupled RoPE: a position-free score per head plus a rotary one on a key shared by every head (DeepSeek).

    Parameters:
        rope_dim: r, the rotary features of each query head and of the shared key, an even number in [2, head_dim];
            None: DeepSeek's share, a third of the head dim rounded to an even number (64 of 192)
        rope_theta: the rotary part's frequencies' base, a finite number > 1
        pairing: the rotated feature pairs: "half" (Hugging Face rotate_half) or "adjacent" (DeepSeek's
            interleaved layout, transformers' rope_interleave)

    Replaces attention (``attend``) and takes the other parts' bias; its own projection ``rope_key`` (d_model -> r)
    gives the shared key from the layer's input x (B, T, d_model). q, k: (B, H, T, D), v: (B, H, T, Dv) ->
    (B, H, T, Dv) in v's dtype; softmax scale 1 / sqrt(D) = 1 / sqrt(d_nope + r), as DeepSeek's
    qk_head_dim^-0.5. Raises PosencError for an odd head dim, a rope_dim that is odd or outside [2, head_dim],
    or RoPE's errors (rope_theta, pairing).
    """

    name = "mla"
    replaces_attention = True
    position_indexed = True
    family = "attention variants"
    source = "DeepSeek-AI 2024, arXiv:2405.04434, sec. 2.1.3 (MLA's decoupled RoPE; transformers models/deepseek_v3)"
    inv_freq: torch.Tensor  # a buffer (register_buffer)

    def __init__(self, dims: Dims, rope_dim: int | None = None, rope_theta: float = 10000.0, pairing: str = "half"):
        super().__init__(dims)
        D = dims.head_dim
        r = default_rope_dim(D) if rope_dim is None else rope_dim
        if pairing not in ("half", "adjacent"):
            raise PosencError(f"mla: pairing must be 'half' or 'adjacent', got {pairing!r}")
        if D % 2 or D < 2:
            raise PosencError(f"mla needs an even head dim >= 2 (d_model / n_head), got {D}")
        if r % 2 or not 2 <= r <= D:
            raise PosencError(f"mla: rope_dim must be an even number in [2, head dim {D}] (an even head dim), got {r}")
        self.rope_dim, self.rope_theta, self.pairing = r, rope_theta, pairing
        self.rope_key = nn.Linear(dims.d_model, r, bias=False)
        self.register_buffer("inv_freq", rope.rope_inv_freq(r, rope_theta), persistent=False)

    def keys(self, k: torch.Tensor, inp: Inputs) -> torch.Tensor:
        """The heads' keys [k_nope, R k_rope] of the positions ``inp`` holds: k (B, Hk, n, D) -> (B, Hk, n, D) in
        the rotation's dtype (k's; float32+ under autocast), the shared rotated key in the last r features of
        every head."""
        r = self.rope_dim
        phases = mla_phases(inp.pos, self.inv_freq, inp.x.dtype)
        k_rot = rotate(self.rope_key(inp.x)[:, None], phases, self.pairing)  # (B, 1, n, r)
        k_nope = k[..., : k.shape[-1] - r].to(k_rot.dtype)
        return torch.cat((k_nope, k_rot.expand(*k.shape[:-1], r)), dim=-1)

    def queries(self, q: torch.Tensor, inp: Inputs) -> torch.Tensor:
        """q (B, H, n, D) with its last r features rotated by the positions of ``inp`` (the last n of them)."""
        r, n = self.rope_dim, q.shape[-2]
        phases = mla_phases(inp.pos[inp.pos.shape[0] - n :], self.inv_freq, inp.x.dtype)
        q_rot = rotate(q[..., q.shape[-1] - r :], phases, self.pairing)
        return torch.cat((q[..., : q.shape[-1] - r].to(q_rot.dtype), q_rot), dim=-1)

    def attend(self, q, k, v, inp: Inputs, bias: Bias | None = None) -> torch.Tensor:
        return attention(self.queries(q, inp), self.keys(k, inp), v, bias=bias, logit_scale=self.logit_scale)

    def decoder(self) -> MLAState:
        return MLAState(self)

    def describe(self) -> str:
        D = self.dims.head_dim
        return (
            f"mla(decoupled RoPE: {D - self.rope_dim} position-free + {self.rope_dim} rotary features per head, "
            f"one shared rotary key, theta={self.rope_theta:g}, {self.pairing})"
        )


class MLAState(DecodeState):
    """Decoding: the new positions' keys [k_nope, R k_rope] cached per key/value head (rotated once, O(n r) per
    step), the new queries rotated by their positions and attending over the cache, O(T D) per step."""

    enc: MLA

    def attend(self, q, k, v, inp: Inputs, pos: torch.Tensor, bias, keys: Buffer, values: Buffer) -> torch.Tensor:
        enc = self.enc
        K, V = keys.append(enc.keys(k, inp)), values.append(v)
        return attention(
            enc.queries(q, inp),
            repeat_kv(K, q.shape[1]),
            repeat_kv(V, q.shape[1]),
            bias=bias,
            logit_scale=enc.logit_scale,
        )
