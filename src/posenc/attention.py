"""The one attention core that every positional scheme goes through.

``attention(q, k, v, ...)`` applies a scheme's rotation phases and score bias:

- no bias: ``scaled_dot_product_attention`` with ``is_causal`` (PyTorch's fused
  kernels; O(T) memory on CPU and CUDA);
- with a bias: a chunked path over query blocks, each block one SDPA call with
  its (block x keys) bias tile as the mask, so at most (block x T) scores exist;
- with a separable bias on CPU (ALiBi, the forget gate, their sums; T5 on the keys
  beyond its max_distance: a :class:`Bias` with ``keys`` or ``far``): ``fused_separable``,
  the far keys of a block through the flash kernel with the bias on one extra
  feature, the near ones with their tile;
- with a bias of the distance only over consecutive positions, in evaluation (T5,
  Kerple: a :class:`Bias` with ``toeplitz``): ``toeplitz_causal``, each block's mask a
  strided view of one table of 2T - 1 values, read in place by the kernel;
- with a :class:`Window` (sliding-window or chunked layers: Gemma 3, Mistral, Llama 4):
  ``windowed``, each query block over the keys its window can reach only, so at most
  (block x (block + window)) scores exist however long the sequence.

``naive_attention`` beside it builds the full T x T matrix and is the reference
the tests compare against. Rotations likewise: ``rotate_shared`` (the core's, one
cos/sin per layer and an analytic phase gradient) beside ``rotate`` (autograd).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from posenc.errors import PosencError

BiasFn = Callable[[int, int, int, int], torch.Tensor]  # a tile function, (qs, qe, ks, ke) -> tile (``Bias.tile``)


@dataclasses.dataclass(frozen=True, eq=False)
class Bias:
    """An additive score bias f(i, j) of query row i and key row j (rows of the keys' sequence), in the forms the
    core's paths read. ``tile`` is the bias; each other form (None: absent) gives a path that computes the same
    attention faster, and the tests compare it with the tiles.

    - ``tile(qs, qe, ks, ke)``: (B|1, H, qe - qs, ke - ks) float32+, f over the query rows [qs, qe) and key rows
      [ks, ke); a new tensor each call (the core masks it in place). Every path with a bias reads it: the chunked
      path, ``windowed``, the near keys of ``fused_separable``, ``naive_attention``.
    - ``at(b, h, q_idx, kv_idx)``: f at the given batch rows, heads, query and key rows (int64 index tensors that
      broadcast, 0-dim under FlexAttention; float32+ out), a pointwise bias's form for FlexAttention's
      ``score_mod``: ``flex_causal`` (CUDA, evaluation).
    - ``keys(qs, ke)``: (B|1, H, ke) float32+, the row f(qs, j) over the keys [0, ke) of a separable bias, f(i, j)
      = r(i) + c(j) at every i >= j (ALiBi, the forget gate): ``fused_separable`` (CPU).
    - ``far(qs, qe)``: (near, row): the keys [0, near), near <= qs, on which f(i, j) = r(i) + c(j) for the
      queries [qs, qe), and their row f(qs, j), (B|1, H, near) float32+; a bias separable on the keys far from a
      query block only (T5 beyond its max_distance): ``fused_separable`` (CPU).
    - ``toeplitz(n)``: (H, n) float32+, b at the distances 0..n-1 of a bias of the distance only over consecutive
      positions, f(i, j) = b(i - j) (T5, Kerple): ``toeplitz_causal`` (evaluation).
    """

    tile: BiasFn
    at: Callable[..., torch.Tensor] | None = None
    keys: Callable[[int, int], torch.Tensor] | None = None
    far: Callable[[int, int], tuple[int, torch.Tensor]] | None = None
    toeplitz: Callable[[int], torch.Tensor] | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class Window:
    """The keys a query sees besides the causal mask, counted in tokens of the sequence (rows, never position ids).

    size: tokens, an integer >= 1. Sliding (``chunked`` False): query i sees the keys j with i - size < j <= i
    (transformers' ``sliding_window``: Gemma 3, Mistral). Chunked: query i sees the keys j <= i of its own chunk
    of ``size`` tokens, floor(i / size) == floor(j / size) (Llama 4's ``attention_chunk_size``). Either way a query
    sees at most ``size`` keys, none more than ``size - 1`` tokens back. offset: the sequence row of key row 0 (a
    decoding cache that dropped the keys no later query sees); first: (B,) int64, each batch row's first real
    row of a left-padded batch (``posenc.layer.padding_starts``), from which its chunks count, as transformers'
    ``chunked_overlay`` counts them from the left padding (a padded row then equals the row alone). None: no padding.
    """

    size: int
    chunked: bool = False
    offset: int = 0
    first: torch.Tensor | None = None

    def start(self, qs: int) -> int:
        """The first key row any query row >= ``qs`` can see (key rows, as ``qs``)."""
        return max(0, qs - self.size + 1)

    def keep(self, qs: int, qe: int, ks: int, ke: int, device) -> torch.Tensor:
        """(B|1, 1, qe - qs, ke - ks) bool: True where query row i in [qs, qe) sees key row j in [ks, ke), causal
        mask included; rows of the keys' frame (the sequence's rows minus ``offset``)."""
        i = torch.arange(qs, qe, device=device)[:, None] + self.offset
        j = torch.arange(ks, ke, device=device)[None] + self.offset
        seen = j <= i
        if not self.chunked:
            return (seen & (i - j < self.size))[None, None]
        f = (torch.zeros(1, dtype=torch.int64) if self.first is None else self.first).to(device)[:, None, None, None]
        same = torch.div(i - f, self.size, rounding_mode="floor") == torch.div(j - f, self.size, rounding_mode="floor")
        return seen & same

    def describe(self) -> str:
        return f"{'chunks' if self.chunked else 'a sliding window'} of {self.size} tokens"


def rotate(x: torch.Tensor, phi: torch.Tensor, pairing: str = "half") -> torch.Tensor:
    """Rotate feature pairs of ``x`` by angles ``phi``: returns R(phi) x.

    x: (B, H, T, D); phi: broadcastable to (B, H, T, P), float32 or float64
    radians, P <= D/2 pairs: with P < D/2 only the first 2P features rotate and
    the rest pass unchanged (partial rotary, GPT-NeoX / Hugging Face
    ``partial_rotary_factor``; pairs within those 2P features). Pairing "half"
    rotates (x_i, x_{i+D/2}) as Hugging Face's ``rotate_half`` (x cos +
    rotate_half(x) sin); "adjacent" rotates (x_{2i}, x_{2i+1}) as RoFormer / Meta
    Llama. cos and sin are taken in the angles' dtype and only then cast to the
    rotation's (never bf16 angles): x's dtype, float32+ under autocast
    (``rotation_dtype``, the dtype returned).
    Gradients by autograd through cos and sin: the reference for ``rotate_shared``.
    Raises ValueError for an unknown pairing.
    """
    if pairing not in ("half", "adjacent"):
        raise ValueError(f"unknown pairing {pairing!r}")
    x = x.to(rotation_dtype(x))
    r = 2 * phi.shape[-1]
    if r < x.shape[-1]:
        return torch.cat((rotate(x[..., :r], phi, pairing), x[..., r:]), dim=-1)
    cos, sin = torch.cos(phi).to(x.dtype), torch.sin(phi).to(x.dtype)
    x1, x2 = _pairs(x, pairing)
    return _join(x1 * cos - x2 * sin, x2 * cos + x1 * sin, pairing)


def _pairs(x: torch.Tensor, pairing: str) -> tuple[torch.Tensor, torch.Tensor]:
    if pairing == "half":
        x1, x2 = x.chunk(2, dim=-1)
        return x1, x2
    return x[..., 0::2], x[..., 1::2]


def _join(y1: torch.Tensor, y2: torch.Tensor, pairing: str) -> torch.Tensor:
    """The inverse of ``_pairs``."""
    return torch.cat((y1, y2), dim=-1) if pairing == "half" else torch.stack((y1, y2), dim=-1).flatten(-2)


def _rotate_into(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: int, pairing: str) -> torch.Tensor:
    """R(sign * phi) x without autograd, written into one output (no cat, no negated sin): 4 elementwise passes."""
    if torch.compiler.is_compiling():  # dynamo cannot trace out= into strided views; inductor fuses these anyway
        x1, x2 = _pairs(x, pairing)
        return _join(x1 * cos - sign * x2 * sin, x2 * cos + sign * x1 * sin, pairing)
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    (x1, x2), (y1, y2) = _pairs(x, pairing), _pairs(y, pairing)
    torch.mul(x1, cos, out=y1).addcmul_(x2, sin, value=-sign)
    torch.mul(x2, cos, out=y2).addcmul_(x1, sin, value=sign)
    return y


class _Rotation(torch.autograd.Function):
    """y = R(sign * phi) x with the analytic phase gradient.

    Each pair's derivative is d(y1, y2)/dphi = sign * (-y2, y1), so the phase
    gradient is sign * (g2 y1 - g1 y2) and the input gradient is R(-sign * phi) g:
    no autograd graph through cos and sin, and cos/sin are shared by q, k, v and
    the output. ``rotate`` (autograd through cos/sin) is the reference.
    """

    @staticmethod
    def forward(ctx, x, phi, cos, sin, sign, pairing):
        y = _rotate_into(x, cos, sin, sign, pairing)
        ctx.save_for_backward(y, cos, sin)
        ctx.sign, ctx.pairing, ctx.phi_shape, ctx.phi_dtype = sign, pairing, phi.shape, phi.dtype
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable  # no double backward (nor has the CPU SDPA kernel)
    def backward(ctx, g):
        y, cos, sin = ctx.saved_tensors
        gx = _rotate_into(g, cos, sin, -ctx.sign, ctx.pairing) if ctx.needs_input_grad[0] else None
        gphi = None
        if ctx.needs_input_grad[1]:
            (g1, g2), (y1, y2) = _pairs(g, ctx.pairing), _pairs(y, ctx.pairing)
            a, b = ((g2, y1), (g1, y2)) if ctx.sign > 0 else ((g1, y2), (g2, y1))
            gphi = torch.mul(*a).addcmul_(*b, value=-1)
            gphi = gphi.sum_to_size(ctx.phi_shape).to(ctx.phi_dtype)
        return gx, gphi, None, None, None, None


def rotate_shared(
    x: torch.Tensor, phi: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pairing: str = "half", sign: int = 1
) -> torch.Tensor:
    """R(sign * phi) x from precomputed ``cos = cos(phi)``, ``sin = sin(phi)`` (x's dtype), gradients to x and phi.

    x: (B, H, T, D); phi: broadcastable to (B, H, T, P), float32+ radians, P <= D/2
    (P < D/2: partial rotary, as ``rotate``); sign: +1 or -1.
    Same values and gradients as ``rotate(x, sign * phi, pairing)`` (tested), with
    one cos/sin per layer and a cheaper backward (``_Rotation``). Raises ValueError
    for an unknown pairing, a sign other than +-1, or phases that do not broadcast
    to x's pairs without enlarging them.
    """
    if pairing not in ("half", "adjacent") or sign not in (1, -1):
        raise ValueError(f"pairing must be 'half' or 'adjacent' and sign +-1, got {pairing!r}, {sign!r}")
    r = 2 * phi.shape[-1]
    if r < x.shape[-1]:
        return torch.cat((rotate_shared(x[..., :r], phi, cos, sin, pairing, sign), x[..., r:]), dim=-1)
    pairs = (*x.shape[:-1], x.shape[-1] // 2)
    if x.shape[-1] % 2 or torch.broadcast_shapes(pairs, phi.shape, cos.shape, sin.shape) != pairs:
        raise ValueError(f"phases {tuple(phi.shape)} do not broadcast to the feature pairs {pairs} of x")
    return _Rotation.apply(x, phi, cos.detach(), sin.detach(), sign, pairing)


def rotate_rows(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pairing: str = "half", sign: int = 1
) -> torch.Tensor:
    """R(sign * phi) x from cos/sin, as ``rotate_shared`` computes it, without its shape check and autograd node:
    decoding's rotation of a step's new rows (the check's broadcast costs more than the rotation of one row);
    differentiable where x requires grad.
    x: (B, H, n, D); cos, sin: (B|1, H|1, n, P), P <= D/2."""
    r = 2 * cos.shape[-1]
    if r < x.shape[-1]:
        return torch.cat((rotate_rows(x[..., :r], cos, sin, pairing, sign), x[..., r:]), dim=-1)
    if x.requires_grad:  # decoding outside no_grad: the same products, differentiable (no out=)
        x1, x2 = _pairs(x, pairing)
        return _join(x1 * cos - sign * x2 * sin, x2 * cos + sign * x1 * sin, pairing)
    return _rotate_into(x, cos, sin, sign, pairing)


def half_to_adjacent(x: torch.Tensor) -> torch.Tensor:
    """The feature permutation taking half pairing to adjacent pairing.

    (x_0..x_{D/2-1}, x_{D/2}..x_{D-1}) -> (x_0, x_{D/2}, x_1, x_{D/2+1}, ...), so
    ``rotate(half_to_adjacent(x), phi, "adjacent") == half_to_adjacent(rotate(x, phi, "half"))``.
    """
    x1, x2 = x.chunk(2, dim=-1)
    return torch.stack((x1, x2), dim=-1).flatten(-2)


def causal_tile(bias: Bias | None, qs: int, qe: int, ke: int, device, dtype) -> torch.Tensor:
    """Additive mask for queries [qs, qe) over keys [0, ke): bias tile + causal -inf.

    Keys before ``qs`` are visible to every query of the block, so only the diagonal
    square gets -inf (in place: a bias returns a new tile that the caller owns).
    """
    tile = (
        torch.zeros(1, 1, qe - qs, ke, device=device, dtype=dtype)
        if bias is None
        else bias.tile(qs, qe, 0, ke).to(dtype)
    )
    diag = torch.ones(qe - qs, ke - qs, device=device, dtype=torch.bool).triu(1)
    tile[..., qs:ke].masked_fill_(diag, float("-inf"))
    return tile


def check_shapes(q: torch.Tensor, k: torch.Tensor, phases: torch.Tensor | None) -> None:
    """PosencError (one line) for an empty sequence, more queries than keys, or phases that do not fit."""
    if q.shape[-2] == 0:
        raise PosencError("attention needs T >= 1 positions, got an empty sequence")
    if q.shape[-2] > k.shape[-2]:
        raise PosencError(f"more queries ({q.shape[-2]}) than keys ({k.shape[-2]})")
    if phases is not None and (phases.shape[-2] != k.shape[-2] or 2 * phases.shape[-1] > q.shape[-1]):
        raise PosencError(
            f"phases {tuple(phases.shape)} do not fit T = {k.shape[-2]} positions of head dim {q.shape[-1]}"
        )


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    phases: torch.Tensor | None = None,
    rotate_v: bool = False,
    pairing: str = "half",
    bias: Bias | None = None,
    logit_scale: float = 1.0,
    block_size: int = 512,
    window: Window | None = None,
) -> torch.Tensor:
    """Causal attention with a scheme's phases and bias.

    q: (B, H, Tq, Dk), the queries of the last Tq positions (Tq = T in a parallel
    forward; fewer when decoding with a cache); k: (B, H, T, Dk); v: (B, H, T, Dv);
    phases: (B|1, H|1, T, P) radians, P <= Dk/2
    (P < Dk/2: only the first 2P features of each head rotate, partial rotary);
    with ``rotate_v`` (Dv == Dk), v is rotated by Phi before attention and the
    output by -Phi after (value transport, ``posenc.encodings.accumulated``; with
    partial rotary the unrotated value features are plain attention values). Scores are
    ``logit_scale * q.k / sqrt(Dk) + bias``. Returns (B, H, Tq, Dv) in v's dtype.
    Under autocast q, k, v are rotated in float32+ (``rotation_dtype``) and reach the
    kernel so; autocast then sets only the kernel's precision. A NaN in q, k or v makes
    NaN every output row that reads it, on every path (``nan_rows``). ``window``: each query sees only the keys
    of its sliding window or chunk (:class:`Window`; key row 0 is the sequence row ``window.offset``), blockwise
    (``windowed``).
    """
    T = k.shape[-2]
    q_start = T - q.shape[-2]  # absolute row of the first query
    check_shapes(q, k, phases)
    out_dtype = v.dtype
    if phases is not None:
        rows, dtype = slice(q_start, T), rotation_dtype(q)
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)  # no-ops outside autocast
        cos, sin = cos_sin(phases, dtype)
        q = rotate_shared(q, phases[..., rows, :], cos[..., rows, :], sin[..., rows, :], pairing)
        k = rotate_shared(k, phases, cos, sin, pairing)
        if rotate_v:
            v = rotate_shared(v, phases, cos, sin, pairing)
    scale = logit_scale / math.sqrt(q.shape[-1])
    if window is not None:
        out = windowed(q, k, v, bias, window, scale, block_size)
    elif q.is_cuda and q_start == 0 and not torch.is_grad_enabled() and bias is not None and bias.at is not None:
        out = flex_causal(q, k, v, bias.at, scale)
    elif q_start == 0 and not torch.is_grad_enabled() and bias is not None and bias.toeplitz is not None:
        out = toeplitz_causal(q, k, v, bias.toeplitz(T), scale, block_size) + nan_rows(q, k)
    elif q_start == 0 and bias is not None and fusable(q, bias, block_size):
        out = fused_separable(q, k, v, bias, scale, block_size) + nan_rows(q, k)
    elif bias is None and q_start == 0:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale) + nan_rows(q, k)
    elif bias is None and q.shape[-2] == 1:  # one new token sees every key
        out = F.scaled_dot_product_attention(q, k, v, scale=scale) + nan_rows(q, k)
    else:
        blocks = []
        for qs in range(q_start, T, block_size):
            qe = min(qs + block_size, T)
            mask = causal_tile(bias, qs, qe, qe, q.device, q.dtype)
            blocks.append(
                F.scaled_dot_product_attention(
                    q[..., qs - q_start : qe - q_start, :], k[..., :qe, :], v[..., :qe, :], attn_mask=mask, scale=scale
                )
            )
        out = torch.cat(blocks, dim=-2)
    if phases is not None and rotate_v:
        out = rotate_shared(out.to(dtype), phases[..., rows, :], cos[..., rows, :], sin[..., rows, :], pairing, sign=-1)
    return out.to(out_dtype)


def windowed(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: Bias | None,
    window: Window,
    scale: float,
    block_size: int,
) -> torch.Tensor:
    """Causal attention within ``window``: each block of ``block_size`` query rows over the keys it can see only,
    [window.start(qs), qe), one SDPA call with the bias tile (if any) and the window's mask as -inf: at most
    block_size x (block_size + window.size - 1) scores at a time, whatever T. q: (B, H, Tq, Dk), the last Tq of
    the T key rows; k: (B, H, T, Dk), v: (B, H, T, Dv); scores ``scale * q.k + bias``. Returns (B, H, Tq, Dv)
    in q's dtype. Reference: ``naive_attention`` with the window."""
    T = k.shape[-2]
    q_start, blocks = T - q.shape[-2], []
    for qs in range(q_start, T, block_size):
        qe = min(qs + block_size, T)
        ks = window.start(qs)
        tile = (
            torch.zeros((), device=q.device, dtype=q.dtype) if bias is None else bias.tile(qs, qe, ks, qe).to(q.dtype)
        )
        mask = torch.where(window.keep(qs, qe, ks, qe, q.device), tile, float("-inf"))
        rows = q[..., qs - q_start : qe - q_start, :]
        blocks.append(
            F.scaled_dot_product_attention(rows, k[..., ks:qe, :], v[..., ks:qe, :], attn_mask=mask, scale=scale)
        )
    return torch.cat(blocks, dim=-2)


def nan_rows(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """(B, H, Tq, 1): NaN for a query row holding a NaN (or inf), or every row when the first key does, else 0.

    Added to the fused kernel's output (no bias) so NaN propagates as on the bias path: PyTorch's CPU flash
    kernel takes a row whose visible scores are all NaN for a fully masked one and writes zeros (its scalar
    row maximum, used for rows of fewer keys than a vector, drops NaN); a row with one finite score is NaN
    already. All of a causal row's scores are NaN only through its query or through every key it sees, key 0
    among them, so the two sums suffice: O(Tq D), nothing of size T.
    """
    with torch.no_grad():
        dtype = torch.promote_types(q.dtype, torch.float32)  # the sums of finite features stay finite
        return (
            q.sum(-1, keepdim=True, dtype=dtype)
            .add_(k[..., :1, :].sum(-1, keepdim=True, dtype=dtype))
            .mul_(0)
            .to(q.dtype)
        )


def fusable(q: torch.Tensor, bias: Bias | None, block_size: int) -> bool:
    """Whether ``fused_separable`` computes this forward (of all T queries), with its gradients where grad is
    enabled: a separable bias on CPU, float32 or float64 outside autocast (the key term rides on a feature of q
    and k, which must not be bf16), and no grad (``keys`` or ``far``), or T <= block_size and ``keys`` (one SDPA
    call, differentiable to the bias parameters)."""
    if (
        bias is None
        or q.device.type != "cpu"
        or q.dtype not in (torch.float32, torch.float64)
        or torch.is_autocast_enabled("cpu")
    ):
        return False
    if torch.is_grad_enabled():
        return bias.keys is not None and q.shape[-2] <= block_size
    return bias.keys is not None or bias.far is not None


def far_keys(bias: Bias, qs: int, qe: int) -> tuple[int, torch.Tensor]:
    """A separable bias's far keys for the queries [qs, qe): (near, row f(qs, j) over j in [0, near)); every key
    before qs for a bias with ``keys`` (see :class:`Bias`)."""
    if bias.far is not None:
        return bias.far(qs, qe)
    assert bias.keys is not None  # a separable bias has one of the two (``fusable``)
    return qs, bias.keys(qs, qs)


def fused_separable(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Bias, scale: float, block_size: int
) -> torch.Tensor:
    """Causal attention with a separable score bias: no (block x T) bias tile, the far keys' bias on one feature.

    q, k: (B, H, T, Dk), v: (B, H, T, Dv), every query (no cache), float32 or float64; bias: a Bias with
    ``keys`` or ``far``; scores ``scale * q.k + f(i, j)``. For a query block [qs, qe) and its far keys j < near
    (``far_keys``), f(i, j) = r(i) + c(j): their scores are ``scale * q.k + f(qs, j)`` plus the query's
    r(i) - r(qs), the queries' extra feature 1 / scale and the keys' f(qs, j) (the row of the block's first
    query: the far keys nearest the block, which carry the far part's weight, keep its precision), through the
    CPU flash kernel unmasked. The near keys [near, qe) take the bias tile, -inf above the diagonal (the tile
    path's values); the tile also covers key near - 1, whose column gives r(i) - r(qs) = f(i, near-1) - f(qs,
    near-1), added to the far part's log-sum-exp before the two parts merge by their log-sum-exps. T <=
    block_size with ``keys`` is one causal SDPA call with the key feature f(0, j) (differentiable to the bias
    parameters; its float32 rounding is that of the dot product's magnitude, ~1e-5 in a score for ALiBi's
    slope 0.5 at T = 512). Returns (B, H, T, Dv) in q's dtype. Reference: ``naive_attention``; the tile path.
    The merge is FlashAttention's (Dao et al. 2022, arXiv:2205.14135, sec. 3.1) over two key ranges.
    """
    B, H, T, D = q.shape
    width = max(D + 1, v.shape[-1])  # the CPU flash kernel needs one head size for q, k and v
    if T <= block_size and bias.keys is not None:
        qx, kx, vx = (_pad(t, width, c) for t, c in ((q, 1 / scale), (k, bias.keys(0, T)), (v, 0.0)))
        return F.scaled_dot_product_attention(qx, kx, vx, is_causal=True, scale=scale)[..., : v.shape[-1]]
    qx, kx, vx = (_pad(t, width, c) for t, c in ((q, 1 / scale), (k, 0.0), (v, 0.0)))
    flash, blocks = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu, []
    for qs in range(0, T, block_size):
        qe = min(qs + block_size, T)
        near, row = far_keys(bias, qs, qe)
        ks = max(near - 1, 0)
        tile = bias.tile(qs, qe, ks, qe).to(q.dtype)
        tile.masked_fill_(torch.arange(ks, qe) > torch.arange(qs, qe)[:, None], float("-inf"))
        kx[..., near:qe, D] = 0.0  # the near keys' bias is the tile's (an earlier block may have written a far row)
        rows, mask = qx[..., qs:qe, :], tile[..., near - ks :].expand(B, H, -1, -1)
        out, lse = flash(rows, kx[..., near:qe, :], vx[..., near:qe, :], attn_mask=mask, scale=scale)
        if near:
            kx[..., :near, D] = row
            far, far_lse = flash(rows, kx[..., :near, :], vx[..., :near, :], scale=scale)
            far_lse = far_lse + (tile[..., 0] - tile[..., :1, 0])  # r(i) - r(qs), from key near - 1's column
            out = merge_lse([(out, lse), (far, far_lse)])
        blocks.append(out[..., : v.shape[-1]])
    return torch.cat(blocks, dim=-2)


def toeplitz_causal(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor, scale: float, block_size: int
) -> torch.Tensor:
    """Causal attention with a bias of the distance only, b_h(i - j), with no bias tile written.

    q, k: (B, H, T, Dk), v: (B, H, T, Dv), every query of consecutive positions (no cache); table: (H, n), n >= T,
    b_h at the distances 0..n-1; scores ``scale * q.k + b_h(i - j)``. The signed table w (H, 2T - 1) holds
    b_h(c - T + 1) at c >= T - 1 and -inf before (the causal mask). With the keys [0, qe) of a query block
    [qs, qe) in reverse order (key j at column j' = qe - 1 - j), the block's mask is w[qs + i + j' - qe + T]: a
    view of w with strides (1, 1) over (i, j') that the kernel reads in place, so a block costs its scores and
    2T - 1 bias values, not a (block x T) tile (attention alone at 8K, one thread: 1.1x causal SDPA, against
    3.7x for the tiles). No gradient (evaluation); the tile path is the reference (``naive_attention``).
    Returns (B, H, T, Dv) in q's dtype."""
    H, T = q.shape[1], q.shape[-2]
    w = torch.full((H, 2 * T - 1), float("-inf"), dtype=q.dtype, device=q.device)
    w[:, T - 1 :] = table[:, :T]
    k_rev, v_rev, blocks = k.flip(-2), v.flip(-2), []
    for qs in range(0, T, block_size):
        qe = min(qs + block_size, T)
        mask = w.as_strided((1, H, qe - qs, qe), (0, w.stride(0), 1, 1), storage_offset=qs - qe + T)
        rows = q[..., qs:qe, :]
        blocks.append(
            F.scaled_dot_product_attention(
                rows, k_rev[..., T - qe :, :], v_rev[..., T - qe :, :], attn_mask=mask, scale=scale
            )
        )
    return torch.cat(blocks, dim=-2)


def merge_lse(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """One softmax over disjoint key sets from each set's attention: parts of (out (..., n, Dv), lse (..., n)), the
    softmax output and log-sum-exp of each query row over that set. FlashAttention's merge (Dao et al. 2022,
    arXiv:2205.14135, sec. 3.1): total = logsumexp over the parts, out = sum_p out_p exp(lse_p - total). A row
    without keys in a part has lse -inf there and must have a finite out (weight 0); a NaN lse makes its row NaN.
    Returns (..., n, Dv) in the parts' dtype."""
    total = torch.stack([lse for _, lse in parts]).logsumexp(0)
    merged = parts[0][0] * (parts[0][1] - total).exp()[..., None]
    for out, lse in parts[1:]:
        merged = merged + out * (lse - total).exp()[..., None]
    return merged


def _pad(t: torch.Tensor, width: int, feature) -> torch.Tensor:
    """t (B, H, T, D) widened to ``width`` features: feature D is ``feature`` (a number, or (B|1, H, T) in
    float32+, cast to t's dtype), the rest 0; differentiable in t and a tensor feature."""
    if width == t.shape[-1]:  # values as wide as the widened keys already
        return t
    extra = torch.zeros(*t.shape[:-1], width - t.shape[-1], dtype=t.dtype, device=t.device)
    if isinstance(feature, torch.Tensor):
        extra = torch.cat((feature.to(t.dtype).expand(*t.shape[:-1])[..., None], extra[..., 1:]), dim=-1)
    else:
        extra[..., 0] = feature
    return torch.cat((t, extra), dim=-1)


def rotation_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the core rotates ``x`` in: x's own, or at least float32 under autocast.

    Autocast hands bf16/fp16 q, k, v from its Linear layers; rotating them there
    would quantise cos/sin and the rotated vectors (a fixed q, k pair's score then
    drifts with position by ~0.1). Under autocast the rotation (elementwise ops,
    which autocast leaves alone) runs in float32+ and its outputs stay float32, so
    only the attention kernel runs at autocast's precision. A model cast to bf16
    (no autocast) rotates in bf16, from float32+ angles.
    """
    dtype = x.dtype
    if torch.is_autocast_enabled(x.device.type):
        dtype = torch.promote_types(dtype, torch.float32)
    return dtype


def cos_sin(phases: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin once per layer, taken in the angles' float32+ dtype, then cast to the rotation's; shared by q, k,
    v and the output (no gradient: the phase gradient comes from rotate_shared's backward)."""
    with torch.no_grad():
        return torch.cos(phases).to(dtype), torch.sin(phases).to(dtype)


@functools.cache
def _compiled_flex():
    return torch.compile(flex_attention, dynamic=False)


def flex_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, at: Callable, scale: float) -> torch.Tensor:
    """Causal FlexAttention (compiled) with scores ``scale * q.k + at(b, h, q_idx, kv_idx)``: (B, H, T, Dv).

    The CUDA evaluation path of pointwise score biases (a Bias's ``at``: ALiBi, the
    forget gate and their sums): a block mask skips the masked half, no bias tile is
    stored. Training keeps the chunked path (its bias gradients, e.g. the forget gate's,
    are the tested ones; FlexAttention has no backward on CPU to test against). On CPU
    ``fused_separable`` is faster and the chunked path is the reference; ``tests/test_flex.py``
    checks this one against the CPU path (compiled).
    """
    T = q.shape[-2]
    mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, T, T, device=q.device)
    return _compiled_flex()(
        q, k, v, score_mod=lambda score, b, h, qi, ki: score + at(b, h, qi, ki), block_mask=mask, scale=scale
    )


def naive_attention(
    q, k, v, *, bias: Bias | None = None, logit_scale: float = 1.0, window: Window | None = None
) -> torch.Tensor:
    """Reference: the full T x T causal softmax, no rotation. Shapes as ``attention`` (every query: Tq = T).
    ``window``: key j hidden from query i unless i - size < j (sliding) or, chunked, (i - f) // size ==
    (j - f) // size, f the batch row's first real row (0 without padding), by the definitions over the whole
    matrix (``window.offset`` is not read: the rows are the sequence's)."""
    T = q.shape[-2]
    scores = logit_scale * (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores + causal_tile(bias, 0, T, T, q.device, q.dtype)
    if window is not None:
        i, j, w = torch.arange(T)[:, None], torch.arange(T)[None], window.size
        if window.chunked:
            f = torch.zeros(1, dtype=torch.int64) if window.first is None else window.first.cpu()
            inside = torch.stack([(i - fb) // w == (j - fb) // w for fb in f.tolist()])[:, None]
        else:
            inside = i - j < w
        scores = scores.masked_fill(~inside.to(scores.device), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def repeat_kv(t: torch.Tensor, n_head: int) -> torch.Tensor:
    """(B, Hkv, T, D) -> (B, n_head, T, D), head h from head h // (n_head / Hkv); PosencError if Hkv does not divide
    n_head."""
    if n_head % t.shape[1]:
        raise PosencError(f"{t.shape[1]} key/value heads do not divide {n_head} query heads")
    return t if t.shape[1] == n_head else t.repeat_interleave(n_head // t.shape[1], dim=1)
