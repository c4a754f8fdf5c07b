"""FIRE: functional interpolation for relative positions (Li et al. 2024, "Functional
Interpolation for Relative Positions Improves Long Context Transformers", ICLR,
arXiv 2310.04418: the FIRE bias and the PyTorch listing of its appendix).

Score bias of query i over key j <= i, per head h::

    b_h(i, j) = f_h( psi(i - j) / (psi(max(L, i)) + 1e-6) ),   psi(x) = log(1 + c x)

f: R -> R^H a one-hidden-layer ReLU MLP per layer (width 32, shared by the heads, one
output per head); c > 0 and the threshold L > 0 are learned. Initialisation as the
reference listing: c = 0.1 (used as |c|), MLP as ``nn.Linear``'s default; L = |m| L0
with a learned multiplier m = 1 and L0 fixed. L0 defaults to a quarter of the training
length: the listing's ``init_L=512`` (FIRE trains at 2048) and the DAPE authors' FIRE
(``noise_seq_length: 128`` in ``configs/125M/512/125M_fire.yml``, training length 512)
are both that ratio. Positions, psi and the MLP are evaluated in float32 (float64 for a
float64 module); tiles are computed in key chunks so no (T x T x width) tensor exists.
Without grad (evaluation) a tile takes the MLP's piecewise-linear form instead
(``PointMLP.piecewise``: a ReLU MLP of one input is linear between its knots), one
lookup and one multiply-add per score and head in place of the hidden layer; the MLP path is its
reference.
From ``COMPILE_FROM`` positions on, that form runs as one kernel by ``torch.compile``
(``piecewise_bias``; dynamic shapes, compiled once per process, about 5 s): eager PyTorch
writes each of its steps (input, segment, slope, intercept) as a tile of its own, the kernel
writes the bias once (a 16K-token prefill of the default model, 3.98x -> 2.41x RoPE's time:
benchmarks/results/bias_prefill.md). The eager
function is its reference (equal to rounding).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import torch
from torch import nn

from posenc.encodings.base import Bias, Dims, Encoding, Inputs, PositionState
from posenc.encodings.mlp import PointMLP
from posenc.encodings.registry import register
from posenc.errors import PosencError

FIRE_EPS = 1e-6  # the reference's guard on the normaliser psi(max(L, i)), 0 at i = 0 with L -> 0
KEY_CHUNK = 512  # keys per MLP call: the hidden layer is (queries x KEY_CHUNK x width)
# positions from which an evaluation forward's tiles take the compiled kernel: below, its one-off compile (about 5 s)
# costs more than it saves (a 4K prefill of the default model takes 1.8 s in all)
COMPILE_FROM = 8192


def fire_input(i: torch.Tensor, j: torch.Tensor, c: torch.Tensor, L: torch.Tensor) -> torch.Tensor:
    """psi(i - j) / (psi(max(L, i)) + eps), psi(x) = log(1 + c x), distances below 0 (masked keys) taken as 0.

    i: (..., tq, 1), j: (..., 1, tk) positions, c, L: scalars, all one float dtype -> (..., tq, tk).
    """
    return torch.log1p(c * (i - j).clamp(min=0)) / (torch.log1p(c * torch.maximum(i, L)) + FIRE_EPS)


def piecewise_bias(
    i: torch.Tensor, j: torch.Tensor, c: torch.Tensor, L: torch.Tensor, knots: torch.Tensor, table: torch.Tensor
) -> torch.Tensor:
    """The FIRE bias by the MLP's piecewise form (``PointMLP.piecewise``) at ``fire_input(i, j, c, L)``.

    i: (tq, 1), j: (1, tk) positions, c, L: scalars, knots (K,), table (K + 1, 2H), all one float dtype ->
    (1, H, tq, tk), contiguous. ``compiled_piecewise_bias`` is this function as one kernel."""
    x = fire_input(i, j, c, L)
    s = torch.bucketize(x, knots)
    H = table.shape[1] // 2
    return torch.stack([table[:, h][s] * x + table[:, H + h][s] for h in range(H)])[None]


@functools.cache
def compiled_piecewise_bias() -> Callable[..., torch.Tensor]:
    """``piecewise_bias`` compiled (inductor, dynamic shapes: one compile serves every tile size); where this machine
    cannot compile it (inductor needs a C++ compiler on CPU), the eager function from then on, with a warning."""
    kernel: list[Callable[..., torch.Tensor]] = [torch.compile(piecewise_bias, dynamic=True)]

    def run(*args: torch.Tensor) -> torch.Tensor:
        try:
            return kernel[0](*args)
        except torch._dynamo.exc.BackendCompilerFailed as exc:
            why = exc.inner_exception
            warnings.warn(f"FIRE tiles run eager: torch.compile failed ({type(why).__name__}: {why})", stacklevel=2)
            kernel[0] = piecewise_bias
            return piecewise_bias(*args)

    return run


@register
class FIRE(Encoding):
    """FIRE: bias f(psi(i-j) / psi(max(L, i))), psi(x) = log(1 + c x), f a learned MLP (Li et al. 2024).

    Parameters:
        mlp_width: hidden width of f, >= 1
        init_c: the learned c of psi(x) = log(1 + c x) at the start, > 0
        init_L: the learned threshold L at the start, in tokens, > 0 (None: train_length / 4)

    Tiles (1, H, tq, tk) float32 (float64 for a float64
    module). Raises PosencError for a parameter out of range.
    """

    name = "fire"
    position_indexed = True
    has_bias = True
    family, source = "score biases", "Li et al. 2024, arXiv:2310.04418 (FIRE)"

    def __init__(self, dims: Dims, mlp_width: int = 32, init_c: float = 0.1, init_L: float | None = None):
        super().__init__(dims)
        init_L = float(dims.train_length / 4 if init_L is None else init_L)
        if mlp_width < 1 or not init_c > 0 or not init_L > 0:
            raise PosencError(
                f"fire needs mlp_width >= 1, init_c > 0 and init_L > 0, got {mlp_width}, {init_c}, {init_L}"
            )
        self.init_c, self.init_L = init_c, init_L
        self.mlp = PointMLP(1, mlp_width, dims.n_head, "relu")
        self.c = nn.Parameter(torch.tensor(float(init_c)))
        self.L_multiplier = nn.Parameter(torch.tensor(1.0))

    def coefficients(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(c, L) as used: |c| and |m| L0, 0-dim, float32 (float64 for a float64 module)."""
        dt = torch.promote_types(self.c.dtype, torch.float32)
        return self.c.to(dt).abs(), (self.L_multiplier.to(dt) * self.init_L).abs()

    def bias(self, inp: Inputs) -> Bias:
        """Tiles (1, H, tq, tk); (B, H, tq, tk) for a left-padded batch, whose rows have positions of their own (the
        bias reads the query's position, not only the distance)."""
        pos = inp.row_positions()  # (1|B, T)
        piecewise = compiled_piecewise_bias() if pos.shape[1] >= COMPILE_FROM else piecewise_bias

        def chunk(qs: int, qe: int, ks: int, ke: int) -> torch.Tensor:
            c, L = self.coefficients()
            x = fire_input(pos[:, qs:qe, None].to(c.dtype), pos[:, None, ks:ke].to(c.dtype), c, L)
            return self.mlp(x[..., None]).permute(0, 3, 1, 2)

        def tile(qs: int, qe: int, ks: int, ke: int) -> torch.Tensor:
            if not torch.is_grad_enabled():
                return piecewise_tile(qs, qe, ks, ke)
            return torch.cat([chunk(qs, qe, a, min(a + KEY_CHUNK, ke)) for a in range(ks, ke, KEY_CHUNK)], dim=-1)

        @functools.cache  # the MLP's knots and segment table, once per bias (the weights do not change in it)
        def segments() -> tuple[torch.Tensor, torch.Tensor]:
            return self.mlp.piecewise(self.coefficients()[0].dtype)

        def piecewise_tile(qs: int, qe: int, ks: int, ke: int) -> torch.Tensor:
            (c, L), (knots, table) = self.coefficients(), segments()
            i, j = pos[:, qs:qe, None].to(c.dtype), pos[:, None, ks:ke].to(c.dtype)
            return torch.cat([piecewise(i[b], j[b], c, L, knots, table) for b in range(pos.shape[0])])

        return Bias(tile)

    def decoder(self) -> PositionState:
        return PositionState(self)  # the MLP on the new query rows' (T,) inputs only: O(T width) per step

    def describe(self) -> str:
        return (
            f"FIRE: bias f(log(1+c(i-j)) / log(1+c max(L,i))), MLP width {self.mlp.w1.shape[0]}, "
            f"learned c (init {self.init_c:g}), L (init {self.init_L:g})"
        )


def fire_bias_naive(enc: FIRE, pos: list[int]) -> torch.Tensor:
    """Reference: b[h, i, j] by an explicit loop over query/key pairs, (1, H, T, T) float64 (0 above the diagonal)."""
    H, T = enc.dims.n_head, len(pos)
    c, L = enc.c.double().abs(), (enc.L_multiplier.double() * enc.init_L).abs()
    w1, b1, w2, b2 = (p.double() for p in (enc.mlp.w1, enc.mlp.b1, enc.mlp.w2, enc.mlp.b2))
    out = torch.zeros(1, H, T, T, dtype=torch.float64)
    for i in range(T):
        for j in range(i + 1):
            x = torch.log(1 + c * (pos[i] - pos[j])) / (torch.log(1 + c * torch.clamp(L, min=pos[i])) + FIRE_EPS)
            out[0, :, i, j] = w2 @ torch.relu(w1[:, 0] * x + b1) + b2
    return out
