"""Accumulated token-dependent SO(2) rotations (arXiv 2606.24975, sec. 3 and Example 1).

Per head h and frequency block b, token t has a step angle theta[t, b]; the phase
is the prefix sum Phi[t, b] = sum_{s<=t} theta[s, b]. The route transport
P(j->i) is the block rotation by Phi_j - Phi_i, so with q and k each rotated
by their own Phi the standard attention core (SDPA) computes
q_i^T P(j->i) k_j in O(T) memory. With ``rotate="qkv"`` values are transported
too: c_i = sum_j a_ij P(j->i) v_j = R(-Phi_i) sum_j a_ij R(Phi_j) v_j.

Step angles are theta = c_b + a_b * u with u in [-1, 1]:
- ``center="zero"`` (default, the paper's Example 1): c_b = 0, a_b = a on every
  block, theta ~ U[-a, a]. The spectral gap beta = |sin a / a| is the same for
  every block, so every block mixes within w_eps = ceil(log eps / log beta)
  tokens. The default a = 1 gives beta = 0.841 and w_0.01 = 27 tokens, well
  inside a training length of 128 or more: routes longer than the window are
  decorrelated during training already, so longer contexts add only more of
  what training saw (the paper's mechanism). Smaller a widens the window
  (a = 0.1: 2,760 tokens); the study's ``window`` preset (``experiments/accumulated``) sweeps it.
- ``center="rope"`` (drift, an ablation; ``acc-drift-*``): c_b = a_b = omega_b =
  rope_theta^(-2b/D), so theta ~ U[0, 2 omega_b] has RoPE's frequency as its
  mean; low-frequency blocks have beta ~ 1 and never mix at these lengths.
and u is
- ``mode="random"``: i.i.d. U[-1, 1] per (sequence, head, position, block),
  a counter-based hash of (seed, forward counter, global batch row, position,
  head, block) (``posenc.encodings.draw``): a fresh draw each training forward,
  data-parallel ranks draw their slice of one global draw, and a position's step
  does not depend on the sequence length (token-by-token decoding sees the
  parallel forward's steps); at evaluation one fixed draw per position;
- ``mode="token"``: a fixed random U[-1, 1] per token id (seeded table);
- ``mode="learned"``: tanh(W x_t) from the layer's input x_t, bounded by a_b.
  ``init="zero"`` starts with W = 0 (no rotation: the model starts as NoPE and
  learns how much to rotate), ``init="random"`` with W ~ N(0, 0.02^2);
  ``learn_a=True`` makes the half-width a learned parameter per head and block
  (a_hb = a * exp(s_hb), s = 0 at init; s is a 2-D weight, so AdamW's weight
  decay pulls it towards the prior a).
For uniform u the spectral gap of block b is beta_b = |E exp(i theta)| = |sin a_b / a_b|.
Phases are summed in float64, reduced mod 2 pi, then cast to float32.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from posenc.encodings.base import Dims, Encoding, Inputs, check_ids
from posenc.encodings.draw import counter_uniform, row_key_int, uniform_at
from posenc.encodings.phase import check_rotary_dims, rotary_dim
from posenc.encodings.registry import alias, register
from posenc.errors import PosencError
from posenc.rope import rope_inv_freq, wrap_phases

EVAL_DRAW = 2**31 - 1  # the draw counter value reserved for evaluation (training never reaches it)


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

    Parameters:
        mode: where the steps come from: "random" (a fresh draw per position), "token" (per token id), "learned"
            (a tanh(Wx))
        rotate: "qk" (queries and keys) or "qkv" (values too, the output rotated back)
        center: "zero" (steps U[-a, a], the paper's Example 1) or "rope" (U[0, 2 omega_b], drift around RoPE's
            frequencies)
        a: the steps' half-width in radians, in (0, pi], center="zero" only (None: 1)
        init: the learned W at the start, mode="learned" only: "zero" (no rotation) or "random" (N(0, 0.02^2))
        learn_a: the half-width learned per head and block too (mode="learned", center="zero")
        rope_theta: the frequencies' base for center="rope", a finite number > 1
        pairing: the rotated feature pairs: "half" (Hugging Face rotate_half) or "adjacent" (RoFormer / Meta)
        seed: the random steps' draw (mode "random" and "token"), in [0, 2^31); None: the run's seed (``Dims.seed``,
            a trained model's ``train.seed``), so each training seed draws its own steps
        rotary_fraction: f in (0, 1]: the first int(f D) features of each head rotate (fD/2 blocks; under Q/K/V
            the unrotated value features are plain attention values)

    Phases: (B, H, T, fD/2)
    float32 ((1, H, T, fD/2) for fixed per-position draws at evaluation).
    Raises PosencError for an invalid parameter value.
    """

    name = "accumulated"
    family, source = "accumulated transports", "arXiv 2606.24975 (Example 1; learned steps)"
    rotary = accumulates = True  # decoding keeps the running phase (base.RunningPhaseState)
    batch_row_offset = 0  # first global batch row held by this process (posenc.train.distributed.set_batch_rows)
    center_b: torch.Tensor  # buffers (register_buffer); token_u with mode='token' only
    width_b: torch.Tensor
    draws: torch.Tensor
    token_u: torch.Tensor

    @classmethod
    def effective(cls, params: dict) -> dict:
        """a = None is the half-width 1 around zero (it is None so that center='rope' can refuse an a given)."""
        return {**params, "a": 1.0} if params.get("a") is None and params.get("center") == "zero" else params

    @classmethod
    def applies_to(cls, params: dict) -> dict[str, str]:
        learned, zero = params.get("mode") == "learned", params.get("center") == "zero"
        out = {} if learned else {"init": "mode='learned'", "learn_a": "mode='learned'"}
        if not zero:
            out |= {"a": "center='zero'", "learn_a": "mode='learned' and center='zero'"}
        if params.get("center") != "rope":
            out["rope_theta"] = "center='rope'"
        if learned:
            out["seed"] = "mode='random' or 'token'"
        return out

    def __init__(
        self,
        dims: Dims,
        mode: str = "random",
        rotate: str = "qk",
        center: str = "zero",
        a: float | None = None,
        init: str = "zero",
        learn_a: bool = False,
        rope_theta: float = 10000.0,
        pairing: str = "half",
        seed: int | None = None,
        rotary_fraction: float = 1.0,
    ):
        super().__init__(dims)
        check_rotary_dims(dims, pairing)
        _check_choice("mode", mode, ("random", "token", "learned"))
        _check_choice("rotate", rotate, ("qk", "qkv"))
        _check_choice("center", center, ("zero", "rope"))
        _check_choice("init", init, ("zero", "random"))
        self.check_applies(
            dict(
                mode=mode,
                rotate=rotate,
                center=center,
                a=a,
                init=init,
                learn_a=learn_a,
                rope_theta=rope_theta,
                pairing=pairing,
                seed=seed,
                rotary_fraction=rotary_fraction,
            )
        )
        a = 1.0 if a is None else a
        if not 0 < a <= math.pi:  # U[-pi, pi] is already uniform on the circle (beta = 0)
            raise PosencError(f"accumulated half-width a must be in (0, pi], got {a!r}")
        seed = dims.seed if seed is None else seed  # the run's seed unless the spec names one
        if not 0 <= seed < 2**31:
            raise PosencError(f"accumulated seed must be in [0, 2^31), got {seed}")
        if mode == "token" and (dims.vocab_size or 0) < 1:  # else an empty table, and an index error at the first token
            raise PosencError(
                "accumulated mode='token' draws a step per token id: it needs vocab_size >= 1 "
                f"(Attention(..., vocab_size=V)), got {dims.vocab_size}"
            )
        self.mode, self.center, self.pairing, self.a, self.init = mode, center, pairing, float(a), init
        self.rotate_v = rotate == "qkv"
        self.seed = seed * 1_000_003 + dims.layer_index
        self.eval_key = row_key_int(
            self.seed, EVAL_DRAW, 0
        )  # evaluation's key: decoding steps hash their positions only
        self.rotary_fraction, rot = rotary_fraction, rotary_dim(dims, rotary_fraction)
        self.n_blocks = half = rot // 2  # frequency blocks (rotated feature pairs)
        omega = rope_inv_freq(rot, rope_theta).float()
        width = omega if center == "rope" else torch.full((half,), float(a))
        self.register_buffer("center_b", omega if center == "rope" else torch.zeros(half), persistent=False)
        self.register_buffer("width_b", width, persistent=False)
        # Training draws advance this counter; it is saved so a resumed run draws the same angles.
        self.register_buffer("draws", torch.zeros((), dtype=torch.int64))
        self.uses_tokens = mode == "token"
        if mode == "token":
            g = torch.Generator().manual_seed(self.seed)
            self.register_buffer(
                "token_u", torch.rand(dims.vocab_size, dims.n_head, half, generator=g) * 2 - 1, persistent=False
            )
        if mode == "learned":
            self.step = nn.Linear(dims.d_model, dims.n_head * half, bias=False)
            nn.init.zeros_(self.step.weight) if init == "zero" else nn.init.normal_(self.step.weight, std=0.02)
        self.log_a = nn.Parameter(torch.zeros(dims.n_head, half)) if learn_a else None

    def widths(self) -> torch.Tensor:
        """Half-widths a_b: (D/2,) float32, or (H, D/2) when learned (``learn_a``)."""
        return self.width_b if self.log_a is None else self.width_b * self.log_a.float().exp()

    def _u(self, inp: Inputs) -> torch.Tensor:
        """Unit steps u in [-1, 1]: (B|1, H, T, D/2) float32. Mode 'token': PosencError (one line) without token ids,
        for an id outside [0, vocab_size) or ids of another shape than x's (B, T) (a raw RuntimeError, or "phases do
        not fit", before)."""
        B, T = inp.x.shape[:2]
        H, half = self.dims.n_head, self.n_blocks
        if self.mode == "learned":
            return torch.tanh(self.step(inp.x)).view(B, T, H, half).transpose(1, 2)
        if self.mode == "token":
            if inp.tokens is None:
                raise PosencError("per-token-id steps (mode='token') need the token ids; this layer has none")
            check_ids(inp.tokens, self.dims.vocab_size, "token ids")  # a negative id would wrap around the table
            if inp.tokens.shape != (B, T):
                raise PosencError(
                    f"token ids must be (batch, T) = ({B}, {T}), x's, got shape {tuple(inp.tokens.shape)}"
                )
            return self.token_u[inp.tokens].transpose(1, 2)
        if not self.training:  # evaluation: one fixed draw per position, the same for every row and window
            key = torch.tensor(
                [[self.eval_key]], device=inp.pos.device
            )  # counter_uniform's chain up to the row, computed once
            return uniform_at(key, inp.row_positions(), H, half)
        rows = torch.arange(self.batch_row_offset, self.batch_row_offset + B)
        u = counter_uniform(self.seed, self.draws, rows, inp.row_positions(), H, half)
        self.draws += 1  # a tensor, saved with the weights: a resumed run draws what an uninterrupted one would
        return u

    def steps(self, inp: Inputs) -> torch.Tensor:
        """Step angles c_b + a_b u of inp's positions: (B|1, H, T, D/2) float32 (float64 in a float64 model); 0 on
        the padding of a left-padded batch (``Inputs.first``), so a row's phases are those of the row alone."""
        widths = self.widths()
        widths = widths[:, None, :] if widths.dim() == 2 else widths  # (H, 1, D/2) per head
        steps = torch.addcmul(self.center_b, widths, self._u(inp))
        real = inp.real()
        return steps if real is None else steps * real[:, None, :, None]

    def phases(self, inp: Inputs) -> torch.Tensor:
        return accumulate(self.steps(inp), dtype=inp.x.dtype)

    def spectral_gap(self) -> torch.Tensor:
        """(D/2,) float64: beta_b = |sin a_b / a_b| of uniform steps (learned: the bound's law; learned a: mean over
        heads)."""
        widths = self.widths().detach()
        return spectral_gap(widths.mean(0) if widths.dim() == 2 else widths)

    def neutral_init(self) -> None:
        """Learned steps: W = 0, so every step is the center (0, or RoPE's omega_b with center='rope')."""
        if self.mode == "learned":
            nn.init.zeros_(self.step.weight)

    def zero_init(self) -> tuple[nn.Module, ...]:
        return (self.step,) if self.mode == "learned" and self.init == "zero" else ()

    def describe(self) -> str:
        dist = "U[0, 2 omega_b]" if self.center == "rope" else f"U[-{self.a:g}, {self.a:g}]"
        src = {
            "random": "i.i.d. per position",
            "token": "fixed per token id",
            "learned": f"learned a*tanh(Wx), W {'= 0' if self.init == 'zero' else '~ N(0, 0.02^2)'} at init"
            + (", learned a per head and block" if self.log_a is not None else ""),
        }[self.mode]
        head = (
            f"accumulated SO(2) {'QKV' if self.rotate_v else 'QK'}"
            + (f" on {self.rotary_fraction:g} of each head" if self.rotary_fraction < 1 else "")
            + ", steps "
        )
        if self.mode == "learned":
            bound = "a" if self.log_a is not None else f"{self.a:g}"
            return head + f"in [-{bound}, {bound}], {src}; step law known after training (posenc diagnose)"
        beta = self.spectral_gap()
        return head + f"{dist}, {src}; spectral gap beta range [{beta.min():.3f}, {beta.max():.3f}]"


def _check_choice(key: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise PosencError(f"accumulated {key} must be one of {', '.join(valid)}; got {value!r}")


alias(
    "acc-rand-qk",
    "accumulated",
    "accumulated random rotations on Q/K, steps U[-1, 1] (Example 1)",
    mode="random",
    rotate="qk",
)
alias(
    "acc-rand-qkv",
    "accumulated",
    "accumulated random rotations on Q/K/V, steps U[-1, 1] (Example 1)",
    mode="random",
    rotate="qkv",
)
alias(
    "acc-drift-qk",
    "accumulated",
    "ablation: random rotations on Q/K, steps U[0, 2 omega_b] around RoPE's frequencies",
    mode="random",
    rotate="qk",
    center="rope",
)
alias(
    "acc-drift-qkv",
    "accumulated",
    "ablation: random rotations on Q/K/V, steps U[0, 2 omega_b] around RoPE's frequencies",
    mode="random",
    rotate="qkv",
    center="rope",
)
alias(
    "acc-token-qk",
    "accumulated",
    "accumulated per-token-id rotations on Q/K, steps U[-1, 1]",
    mode="token",
    rotate="qk",
)
alias(
    "acc-token-qkv",
    "accumulated",
    "accumulated per-token-id rotations on Q/K/V, steps U[-1, 1]",
    mode="token",
    rotate="qkv",
)
alias(
    "acc-learned-qk",
    "accumulated",
    "accumulated learned rotations on Q/K, steps tanh(Wx) in [-1, 1], W = 0 at init",
    mode="learned",
    rotate="qk",
)
alias(
    "acc-learned-qkv",
    "accumulated",
    "accumulated learned rotations on Q/K/V, steps tanh(Wx) in [-1, 1], W = 0 at init",
    mode="learned",
    rotate="qkv",
)
alias(
    "hybrid", "acc-learned-qkv+forget", "accumulated learned Q/K/V rotations with a FoX forget gate (far-mass control)"
)
alias("rope-adjacent", "rope", "RoPE with adjacent (RoFormer/Meta) pairing", pairing="adjacent")
