"""Accumulated token-dependent SO(2) rotations (arXiv 2606.24975, sec. 3 and Example 1).

Per head h and frequency block b, token t has a step angle theta[t, b]; the phase
is the prefix sum Phi[t, b] = sum_{s<=t} theta[s, b]. The route transport
P(j->i) is the block rotation by Phi_j - Phi_i, so with q and k each rotated
by their own Phi the standard attention core (SDPA) computes
q_i^T P(j->i) k_j in O(T) memory. With ``rotate="qkv"`` values are transported
too: c_i = sum_j a_ij P(j->i) v_j = R(-Phi_i) sum_j a_ij R(Phi_j) v_j.

Step angles are theta = c_b + a_b * u with u in [-1, 1]:
- ``center="rope"`` (drift): c_b = a_b = omega_b = rope_theta^(-2b/D), so
  theta ~ U[0, 2 omega_b] has RoPE's frequency as its mean;
- ``center="zero"``: c_b = 0, a_b = a, theta ~ U[-a, a] (the paper's Example 1).
and u is
- ``mode="random"``: i.i.d. U[-1, 1] per (sequence, head, position, block);
  a fresh draw each training forward, seeded by (seed, forward counter, global
  batch row) so data-parallel ranks draw their slice of one global draw; a
  fixed seed at evaluation;
- ``mode="token"``: a fixed random U[-1, 1] per token id (seeded table);
- ``mode="learned"``: tanh(W x_t) from the layer's input (zero-initialised, so
  the drift variant starts as RoPE).
For uniform u the spectral gap of block b is beta_b = |E exp(i theta)| = |sin a_b / a_b|.
Phases are summed in float64, reduced mod 2 pi, then cast to float32.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from posenc.encodings import alias, register
from posenc.encodings.base import Dims, Encoding, Inputs
from posenc.encodings.rotary import check_rotary_dims, rope_inv_freq, wrap_phases
from posenc.errors import PosencError


def accumulate(theta: torch.Tensor, dim: int = -2, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Phi = cumsum(theta) along ``dim`` in float64, mod 2 pi, cast to ``dtype`` (>= float32)."""
    return wrap_phases(torch.cumsum(theta.to(torch.float64), dim=dim), dtype)


def spectral_gap(a: torch.Tensor) -> torch.Tensor:
    """beta = |sin a / a| for steps uniform on an interval of half-width a (elementwise)."""
    a = a.to(torch.float64)
    return torch.where(a == 0, torch.ones_like(a), (torch.sin(a) / a).abs())


@register
class Accumulated(Encoding):
    """Accumulated SO(2) rotations: random, per-token or learned step angles; rotating QK or QKV.

    Parameters: mode ("random" | "token" | "learned"), rotate ("qk" | "qkv"),
    center ("rope" | "zero"), a (half-width for center="zero", radians),
    rope_theta, pairing, seed. Phases: (B, H, T, D/2) float32 ((1, H, T, D/2)
    for fixed per-position draws at evaluation).
    """

    name = "accumulated"
    batch_row_offset = 0  # first global batch row held by this process (posenc.distributed.set_batch_rows)

    def __init__(
        self,
        dims: Dims,
        mode: str = "random",
        rotate: str = "qk",
        center: str = "rope",
        a: float = math.pi / 2,
        rope_theta: float = 10000.0,
        pairing: str = "half",
        seed: int = 0,
    ):
        super().__init__(dims)
        check_rotary_dims(dims, pairing)
        if mode not in ("random", "token", "learned"):
            raise PosencError(f"accumulated mode must be random, token or learned, got {mode!r}")
        if rotate not in ("qk", "qkv"):
            raise PosencError(f"accumulated rotate must be 'qk' or 'qkv', got {rotate!r}")
        if center not in ("rope", "zero"):
            raise PosencError(f"accumulated center must be 'rope' or 'zero', got {center!r}")
        if center == "zero" and not a > 0:
            raise PosencError(f"accumulated half-width a must be > 0, got {a}")
        self.mode, self.center, self.pairing, self.a = mode, center, pairing, a
        self.rotate_v = rotate == "qkv"
        self.seed = seed * 1_000_003 + dims.layer_index
        half = dims.head_dim // 2
        omega = rope_inv_freq(dims.head_dim, rope_theta).float()
        width = omega if center == "rope" else torch.full((half,), float(a))
        self.register_buffer("center_b", omega if center == "rope" else torch.zeros(half), persistent=False)
        self.register_buffer("width_b", width, persistent=False)
        # Training draws advance this counter; it is saved so a resumed run draws the same angles.
        self.register_buffer("draws", torch.zeros((), dtype=torch.int64))
        if mode == "token":
            g = torch.Generator().manual_seed(self.seed)
            self.register_buffer("token_u", torch.rand(dims.vocab_size, dims.n_head, half, generator=g) * 2 - 1, persistent=False)
        if mode == "learned":
            self.step = nn.Linear(dims.d_model, dims.n_head * half, bias=False)
            nn.init.zeros_(self.step.weight)

    def _u(self, inp: Inputs) -> torch.Tensor:
        """Unit steps u in [-1, 1]: (B|1, H, T, D/2) float32."""
        B, T = inp.tokens.shape
        H, half = self.dims.n_head, self.dims.head_dim // 2
        if self.mode == "learned":
            return torch.tanh(self.step(inp.x)).view(B, T, H, half).transpose(1, 2)
        if self.mode == "token":
            return self.token_u[inp.tokens].transpose(1, 2)
        if self.training:
            return self._fresh_draw(B, H, T, half, inp.x.device)
        g = torch.Generator().manual_seed(self.seed)  # evaluation: the same draw for every window
        return (torch.rand(1, H, T, half, generator=g) * 2 - 1).to(inp.x.device)

    def _fresh_draw(self, B: int, H: int, T: int, half: int, device: torch.device) -> torch.Tensor:
        """Training draw (B, H, T, D/2) in [-1, 1): global batch row r from a generator seeded by (seed, counter, r).

        Seeding per global row makes data-parallel ranks, each holding rows
        [batch_row_offset, batch_row_offset + B), draw exactly their slice of the
        single-process draw; the counter (saved with the weights) makes a resumed
        run draw what an uninterrupted one would.
        """
        draw = int(self.draws)
        self.draws += 1
        rows = []
        for r in range(self.batch_row_offset, self.batch_row_offset + B):
            seed = int(np.random.SeedSequence([self.seed, draw, r]).generate_state(1, np.uint64)[0])
            rows.append(torch.rand(H, T, half, generator=torch.Generator(device).manual_seed(seed), device=device))
        return torch.stack(rows) * 2 - 1

    def phases(self, inp: Inputs) -> torch.Tensor:
        theta = torch.addcmul(self.center_b, self.width_b, self._u(inp))  # c_b + a_b * u: (B|1, H, T, D/2)
        return accumulate(theta, dtype=inp.x.dtype)

    def spectral_gap(self) -> torch.Tensor:
        """(D/2,) float64: beta_b of the step distribution (uniform u; learned: at init spread)."""
        return spectral_gap(self.width_b)

    def describe(self) -> str:
        dist = "U[0, 2 omega_b]" if self.center == "rope" else f"U[-{self.a:g}, {self.a:g}]"
        beta = self.spectral_gap()
        src = {"random": "i.i.d. per position", "token": "fixed per token id", "learned": "learned a*tanh(Wx)"}[self.mode]
        return (
            f"accumulated SO(2) {'QKV' if self.rotate_v else 'QK'}, steps {dist}, {src}; "
            f"beta range [{beta.min():.3f}, {beta.max():.3f}]"
        )


alias("acc-rand-qk", "accumulated", "accumulated random rotations on Q/K", mode="random", rotate="qk")
alias("acc-rand-qkv", "accumulated", "accumulated random rotations on Q/K/V", mode="random", rotate="qkv")
alias("acc-zero-qkv", "accumulated", "accumulated random rotations on Q/K/V, steps U[-1, 1] (Example 1, beta 0.84)", mode="random", rotate="qkv", center="zero", a=1.0)
alias("acc-token-qkv", "accumulated", "accumulated per-token-id rotations on Q/K/V", mode="token", rotate="qkv")
alias("acc-learned-qk", "accumulated", "accumulated learned rotations on Q/K", mode="learned", rotate="qk")
alias("acc-learned-qkv", "accumulated", "accumulated learned rotations on Q/K/V", mode="learned", rotate="qkv")
alias("rope-adjacent", "rope", "RoPE with adjacent (RoFormer/Meta) pairing", pairing="adjacent")
