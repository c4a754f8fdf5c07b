"""Rotary position embedding (RoPE) for own models; frequencies and schedules from ``posenc.rope``.

RoPE (Su et al. 2021, RoFormer eq. 34) rotates each feature pair i of q and k by
``Phi_t[i] = t * omega_i`` with ``omega_i = rope_theta^(-2i/D)``. It is the
accumulated rotation (``posenc.encodings.accumulated``) with the constant step
``omega``: both produce phases for the same attention core.
"""

from __future__ import annotations

import math

import torch

from posenc import rope
from posenc.encodings.base import Buffer, DecodeState, Dims, Encoding, Inputs, PositionState
from posenc.encodings.phase import check_rotary_dims, rotary_dim
from posenc.encodings.registry import register
from posenc.errors import PosencError

_LENGTH_DEPENDENT = ("dynamic", "longrope")  # schedules whose frequencies follow the sequence length


@register
class RoPE(Encoding):
    """RoPE: q, k rotated by t * rope_theta^(-2i/D) (Su et al. 2021).

    Parameters:
        rope_theta: the frequencies' base, a finite number > 1
        pairing: the rotated feature pairs: "half" (Hugging Face rotate_half) or "adjacent" (RoFormer / Meta)
        rotary_fraction: f in (0, 1]: the first int(f D) features of each head rotate (Hugging Face
            partial_rotary_factor; not with the ReRoPE schedules)
        factor: s >= 1, linear scaling, positions / s (transformers' "linear" rope type; Gemma 3's global layers:
            8); per layer in a spec, not with a schedule (give the schedule its own factor)

    The two pairings are a
    fixed permutation of q/k features apart (``posenc.attention.half_to_adjacent``).
    ``schedule`` (``posenc.rope``: none, pi, ntk, dynamic, yarn, llama3, rerope,
    leaky-rerope) with ``schedule_params`` changes the frequencies and
    ``logit_scale`` (= attention_factor^2); ReRoPE replaces attention (``attend``,
    ``posenc.rope.rerope_attention``). Raises PosencError for an odd head dim, an
    unknown pairing, or schedule parameters that are invalid or without a schedule. With
    ``rotary_fraction`` f < 1 the frequencies are those of the rotary dim fD.
    Phases: (1, 1, T, fD/2) float32, computed as float64 t * omega mod 2 pi.
    """

    name = "rope"
    position_indexed = True
    family, source = "rotary", "Su et al. 2021, arXiv:2104.09864, eq. 34"
    rotary = True
    internal = ("schedule", "schedule_params")  # set by with_rope_schedule (posenc eval --rope-schedule), not by specs
    instance_flags = ("replaces_attention",)  # the rerope schedules' attention
    inv_freq: torch.Tensor  # a buffer (register_buffer)

    def __init__(
        self,
        dims: Dims,
        rope_theta: float = 10000.0,
        pairing: str = "half",
        schedule: str | None = None,
        schedule_params: dict | None = None,
        rotary_fraction: float = 1.0,
        factor: float = 1.0,
    ):
        super().__init__(dims)
        if not (math.isfinite(factor) and factor >= 1):
            raise PosencError(f"rope: factor must be a number >= 1 (positions / factor), got {factor!r}")
        if factor != 1 and schedule is not None:
            raise PosencError(
                f"rope: factor={factor:g} scales this layer's positions and the schedule {schedule!r} sets its own "
                "frequencies: give the schedule the factor instead"
            )
        self.factor = factor
        check_rotary_dims(dims, pairing)
        self.rope_theta, self.pairing, self.schedule, self.rotary_fraction = (
            rope_theta,
            pairing,
            schedule,
            rotary_fraction,
        )
        self.rot_dim = rotary_dim(dims, rotary_fraction)
        self.replaces_attention = schedule in rope.RELATIVE
        if self.replaces_attention and self.rot_dim < dims.head_dim:
            raise PosencError(f"rope schedule {schedule!r} rotates every feature; rotary_fraction must be 1")
        inv_freq = rope.rope_inv_freq(self.rot_dim, rope_theta) / factor  # positions / s: the "linear" rope type
        if schedule is None and schedule_params:
            raise PosencError(f"rope schedule_params {schedule_params!r} need a schedule")
        if schedule is not None:
            _check_schedule_values(schedule, schedule_params or {})
            self.schedule_params = rope.schedule_params(schedule, dims.train_length, schedule_params)
            inv_freq, attention_factor = rope.SCHEDULES[schedule](self.rot_dim, rope_theta, self.schedule_params, None)
            self.logit_scale = attention_factor**2  # the factor multiplies cos and sin
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def phases(self, inp: Inputs) -> torch.Tensor:
        inv_freq = self.inv_freq
        if self.schedule in _LENGTH_DEPENDENT:  # from the current length, every call (a host sync only for these)
            inv_freq = self._inv_freq(int(inp.pos.max()) + 1)
        phi = inp.pos.to(torch.float64)[:, None] * inv_freq.to(inp.pos.device)
        return rope.wrap_phases(phi, inp.x.dtype)[None, None]

    def _inv_freq(self, length: int) -> torch.Tensor:
        """Dynamic NTK's and LongRoPE's frequencies for a sequence of ``length`` positions (LongRoPE switches lists
        past L0)."""
        assert self.schedule is not None  # one of those schedules
        return rope.SCHEDULES[self.schedule](self.rot_dim, self.rope_theta, self.schedule_params, length)[0]

    def length_key(self, length: int):
        """Dynamic NTK and LongRoPE: their frequencies at ``length`` positions as a tuple; otherwise None."""
        return tuple(self._inv_freq(length).tolist()) if self.schedule in _LENGTH_DEPENDENT else None

    def attend(self, q, k, v, inp: Inputs, bias=None):
        """ReRoPE's attention for the ``rerope`` schedules (None: the core's rotary path).

        q, k: (B, H, T, D), v: (B, H, T, Dv); ``bias``: the other parts' Bias of a
        composed scheme. T <= window is plain RoPE, as the method is (evaluations refuse such a length:
        ``posenc.rope.check_window``; a generation's first steps are such).
        """
        if not self.replaces_attention:
            return None
        p = self.schedule_params
        return rope.rerope_attention(
            q,
            k,
            v,
            self.inv_freq,
            int(p["window"]),
            p.get("leak"),
            q_pos=inp.pos - inp.pos[0],
            pairing=self.pairing,
            bias=bias,
            scale=self.logit_scale / math.sqrt(q.shape[-1]),
        )

    def decoder(self) -> DecodeState | None:
        """Fixed frequencies: the new positions' t * omega only (``PositionState``); ReRoPE: the new query rows
        (``ReRoPEState``); dynamic NTK and LongRoPE: None, the reference (their frequencies follow the length, so
        every cached key is rotated anew at each step: O(T D) cos/sin per step, equal to the prefix's parallel
        forward)."""
        if self.schedule in _LENGTH_DEPENDENT:
            return None
        return ReRoPEState(self) if self.replaces_attention else PositionState(self)

    def spectral_gap(self) -> torch.Tensor:
        """(D/2,) float64 ones: a constant step never mixes."""
        return torch.ones(self.rot_dim // 2, dtype=torch.float64)

    def describe(self) -> str:
        extra = ""
        if self.schedule is not None:
            extra = f", {rope.schedule_label(self.schedule, self.schedule_params, self.dims.train_length)}"
        if self.rot_dim < self.dims.head_dim:
            extra += f", rotary_fraction={self.rotary_fraction:g}"
        if self.factor != 1:
            extra += f", positions / {self.factor:g}"
        return f"rope(theta={self.rope_theta:g}, {self.pairing}{extra})"


class ReRoPEState(DecodeState):
    """(Leaky) ReRoPE decoding: the new query rows over the cached unrotated keys (``rerope_attention`` with Tq = n:
    O(T D) per step, the keys rotated by their position and their window-clamped one)."""

    enc: RoPE

    def attend(self, q, k, v, inp: Inputs, pos: torch.Tensor, bias, keys: Buffer, values: Buffer) -> torch.Tensor:
        enc, p = self.enc, self.enc.schedule_params
        K, V = keys.append(k), values.append(v)
        return rope.rerope_attention(
            q,
            K,
            V,
            enc.inv_freq,
            int(p["window"]),
            p.get("leak"),
            q_pos=inp.pos - pos[0],
            pairing=enc.pairing,
            bias=bias,
            scale=enc.logit_scale / math.sqrt(q.shape[-1]),
        )


def _check_schedule_values(schedule: str, params: dict) -> None:
    """PosencError unless every schedule parameter is unset (None), true/false, a finite number or a list of them
    (the schedule checks names and ranges, ``posenc.rope.schedule_params``)."""

    def number(v) -> bool:
        return isinstance(v, (int, float)) and (isinstance(v, bool) or math.isfinite(v))

    for key, value in params.items():
        if not (value is None or number(value) or (isinstance(value, (list, tuple)) and all(map(number, value)))):
            raise PosencError(
                f"rope schedule {schedule!r}: {key}={value!r}: "
                "expected a finite number, true/false or a list of numbers"
            )
