"""PaTH: attention with accumulated Householder-like transforms (Yang et al. 2025,
"PaTH Attention: Position Encoding via Accumulating Householder Transformations", sec. 2-3).

Per head, token t has H_t = I - beta_t w_t w_t^T with beta_t = 2 sigmoid(.) in
(0, 2) and w_t unit-norm (low-rank projection of x, short causal depthwise
convolution, SiLU, L2 norm; as flash-linear-attention's ``PaTHAttention``)::

    s_ij = q_i^T H_i H_{i-1} ... H_{j+1} k_j   (j <= i; the empty product for j = i)

Three implementations that agree (tests):

1. ``householder_naive.path_scores_naive`` builds the products; ``path_decode``
   is the decoding form (appending token t updates every cached key:
   k_j <- k_j - beta_t (w_t . k_j) w_t), which ``path_step`` runs on the
   layer's key cache (the prefill's keys by ``path_keys``); ``PaTHState`` runs
   ``path_step_pending``, which defers the update of the older keys and applies
   the deferred factors every few tokens in UT form (``PendingFactors``);
2. ``path_attention`` (CPU/any device, PyTorch): blocks of C tokens. In block b,
   with W, beta, K, Q its rows, the UT transform A = I + diag(beta) tril(W W^T, -1)
   gives U = A^-1 diag(beta) W with H_{last} ... H_{first} = I - W^T U, and
   C = A^-1 diag(beta) tril(W K^T, -1). Then
     intra-block scores     S = tril(Q K^T) - tril(Q W^T) C,
     keys to the block end  K^ = K - C^T W           (k^_j = H_last ... H_{j+1} k_j),
     queries to its start   Q^ = Q - tril(Q W^T) U   (q^_i = H_first ... H_i q_i).
   Key blocks are then scanned right to left with an online softmax: scores
   Q^ K^_b^T, then Q^ <- Q^ - (Q^ W_b^T) U_b carries the queries across block b.
   All query blocks advance together, so the loop has T/C steps and holds
   O(T C) scores at a time (forward memory O(T (C + D))).
3. on CUDA, flash-linear-attention's ``parallel_path_attn`` (``posenc[cuda]``),
   layout [B, T, H, D], fp32 w and beta; used when ``fla`` imports, there is no
   extra bias and the head dim is 16, 32 or 64 (else a one-line warning and 2.).
   Untested here (no GPU).
"""

from __future__ import annotations

import math
import warnings
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from posenc.encodings.registry import register
from posenc.encodings.base import BiasFn, Buffer, DecodeState, Dims, Encoding, Inputs
from posenc.errors import PosencError

FLA_HEAD_DIMS = (16, 32, 64)


def _ut_transform(q, k, w, beta):
    """Per-block quantities; all inputs blocked: (B, H, n, C, D) and beta (B, H, n, C).

    Returns (S intra-block scores (.., C, C), K^ (.., C, D), Q^ (.., C, D), U (.., C, D)).
    """
    C = q.shape[-2]
    eye = torch.eye(C, dtype=q.dtype, device=q.device)
    bcol = beta[..., None]
    A = eye + bcol * (w @ w.transpose(-1, -2)).tril(-1)
    U = torch.linalg.solve_triangular(A, bcol * w, upper=False, unitriangular=True)
    Cm = torch.linalg.solve_triangular(A, bcol * (w @ k.transpose(-1, -2)).tril(-1), upper=False, unitriangular=True)
    qw = (q @ w.transpose(-1, -2)).tril()
    S = (q @ k.transpose(-1, -2)).tril() - qw @ Cm
    return S, k - Cm.transpose(-1, -2) @ w, q - qw @ U, U


def _bias_tiles(bias: BiasFn, T: int, C: int, q_blocks: range, r: int) -> torch.Tensor:
    """Bias tiles of (query block b, key block b - r) for b in q_blocks, zero-padded to C x C: (B|1, H, nb, C, C)."""
    tiles = []
    for b in q_blocks:
        qs, ks = b * C, (b - r) * C
        t = bias(qs, min(qs + C, T), ks, min(ks + C, T))
        tiles.append(F.pad(t, (0, C - t.shape[-1], 0, C - t.shape[-2])))
    return torch.stack(tiles, dim=2)


def path_attention(q, k, v, w, beta, *, bias: Optional[BiasFn] = None, logit_scale: float = 1.0, block_size: int = 64) -> torch.Tensor:
    """Blockwise PaTH attention (module docstring, 2.).

    q, k, w: (B, H, T, D) float32/64 (w unit-norm); v: (B, H, T, Dv); beta: (B, H, T)
    in (0, 2); bias: optional tile function added to the scaled scores. Scores
    are ``logit_scale * s_ij / sqrt(D) + bias``. Returns (B, H, T, Dv) in v's dtype.
    """
    B, H, T, D = q.shape
    C = min(block_size, T)
    n = -(-T // C)
    pad = n * C - T  # padded tokens: w = 0, beta = 0 (H = I), keys masked by causality
    dt = q.dtype
    q, k, w = (F.pad(x.to(dt), (0, 0, 0, pad)).view(B, H, n, C, D) for x in (q, k, w))
    vb = F.pad(v, (0, 0, 0, pad)).view(B, H, n, C, -1).to(dt)
    beta = F.pad(beta.to(dt), (0, pad)).view(B, H, n, C)
    S, Kh, Qh, U = _ut_transform(q, k, w, beta)
    scale = logit_scale / math.sqrt(D)
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    s = (S * scale).masked_fill(~causal, float("-inf"))
    if bias is not None:
        s = s + _bias_tiles(bias, T, C, range(n), 0).to(s.dtype)
    m = s.amax(-1)  # online softmax state per query: max, normaliser, output
    p = torch.exp(s - m[..., None])
    l, o = p.sum(-1), p @ vb
    for r in range(1, n):  # key block b - r for every query block b >= r
        qc = Qh[:, :, r:]
        s = (qc @ Kh[:, :, : n - r].transpose(-1, -2)) * scale
        if bias is not None:
            s = s + _bias_tiles(bias, T, C, range(r, n), r).to(s.dtype)
        m_new = torch.maximum(m[:, :, r:], s.amax(-1))
        p = torch.exp(s - m_new[..., None])
        corr = torch.exp(m[:, :, r:] - m_new)
        l = torch.cat((l[:, :, :r], l[:, :, r:] * corr + p.sum(-1)), dim=2)
        o = torch.cat((o[:, :, :r], o[:, :, r:] * corr[..., None] + p @ vb[:, :, : n - r]), dim=2)
        m = torch.cat((m[:, :, :r], m_new), dim=2)
        if r < n - 1:  # carry the queries across key block b - r
            Qh = torch.cat((Qh[:, :, :r], qc - (qc @ w[:, :, : n - r].transpose(-1, -2)) @ U[:, :, : n - r]), dim=2)
    out = (o / l[..., None]).view(B, H, n * C, -1)[:, :, :T]
    return out.to(v.dtype)


def path_keys(k, w, beta, block_size: int = 64) -> torch.Tensor:
    """The keys as decoding caches them after T tokens: k~_j = H_{T-1} ... H_{j+1} k_j, (B, H, T, D) in k's dtype.

    k, w: (B, H, T, D), beta: (B, H, T), one float dtype. Blockwise: the UT transform
    takes each key to its block's end (K^ = K - C^T W) and gives the block's transform
    H_last ... H_first = I - W^T U; the later blocks' transforms are carried right to
    left as one D x D matrix R (k~ = k^ R, R <- (I - U_b^T W_b) R): O(T D (C + D)),
    not the O(T^2 D) of the token loop (``householder_naive.path_decode``, the reference).
    """
    B, H, T, D = k.shape
    C = min(block_size, T)
    n = -(-T // C)
    pad = n * C - T  # padded tokens: w = 0, beta = 0 (H = I)
    kb, wb = (F.pad(x, (0, 0, 0, pad)).view(B, H, n, C, D) for x in (k, w))
    bcol = F.pad(beta, (0, pad)).view(B, H, n, C)[..., None]
    A = torch.eye(C, dtype=k.dtype, device=k.device) + bcol * (wb @ wb.transpose(-1, -2)).tril(-1)
    U = torch.linalg.solve_triangular(A, bcol * wb, upper=False, unitriangular=True)
    Cm = torch.linalg.solve_triangular(A, bcol * (wb @ kb.transpose(-1, -2)).tril(-1), upper=False, unitriangular=True)
    Kh = kb - Cm.transpose(-1, -2) @ wb
    R = torch.eye(D, dtype=k.dtype, device=k.device).expand(B, H, D, D)
    out = torch.empty_like(Kh)
    for b in reversed(range(n)):
        out[:, :, b] = Kh[:, :, b] @ R
        R = R - U[:, :, b].transpose(-1, -2) @ (wb[:, :, b] @ R)
    return out.view(B, H, n * C, D)[:, :, :T]


def path_step(q, k, v, w, beta, keys: Buffer, values: Buffer, bias: Optional[BiasFn], scale: float) -> torch.Tensor:
    """n new tokens, one at a time, over the cached keys (``path_keys``' form, in ``keys``' dtype), updated in place.

    q, k, w: (B, H, n, D), v: (B, H, n, Dv), beta: (B, H, n); each token t first applies
    H_t to every cached key (k_j <- k_j - beta_t (w_t . k_j) w_t, O(T D)), then appends
    its key and attends with scores ``scale * q_t . k~_j`` + the bias row of cache row
    T0 + t. Returns (B, H, n, Dv) in v's dtype; ``householder_naive.path_decode`` is the
    reference (the same recurrence over a whole sequence).
    """
    wide, T0 = keys.data.dtype, keys.length
    V, out = values.append(v.to(wide)), []
    for t in range(q.shape[-2]):
        K = keys.value
        wt = w[:, :, t].to(wide)
        K.sub_((K @ wt[..., None]) * (beta[:, :, t, None, None].to(wide) * wt[:, :, None, :]))
        K = keys.append(k[:, :, t : t + 1].to(wide))
        s = (K @ q[:, :, t, :, None].to(wide))[..., 0] * scale
        if bias is not None:
            s = s + bias(T0 + t, T0 + t + 1, 0, T0 + t + 1)[..., 0, :].to(s.dtype)
        out.append(torch.softmax(s, dim=-1)[:, :, None, :] @ V[:, :, : T0 + t + 1])
    return torch.cat(out, dim=2).to(v.dtype)


class PendingFactors:
    """The Householder factors of the tokens since the last flush, in UT form, for ``path_step_pending``.

    With F the flush point (``flushed``, a cache row), rows j < F of the key cache hold
    k^_j = H_{F-1} ... H_{j+1} k_j and rows j >= F the exact k~_j = H_{T-1} ... H_{j+1} k_j.
    The p pending factors give M = H_F ... H_{T-1} = I - U^T W, W: (B, H, p, D) their
    w_t, U: (B, H, p, D); appending H_t adds the rows w_t and u_t = beta_t M w_t (M H_t =
    M - beta_t (M w_t) w_t^T), O(p D). ``every``: factors kept before a flush (>= 1).
    """

    def __init__(self, every: int, flushed: int):
        self.every, self.flushed = every, flushed
        self.w, self.u = Buffer(-2, every), Buffer(-2, every)

    @property
    def count(self) -> int:
        return self.w.length

    def push(self, wt: torch.Tensor, bt: torch.Tensor) -> None:
        """Append H_t: wt (B, H, 1, D), bt (B, H, 1, 1), in the cache's dtype."""
        ut = bt * self.apply(wt.transpose(-1, -2)).transpose(-1, -2)  # beta_t M w_t, before H_t joins M
        self.w.append(wt)
        self.u.append(ut)

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """M x = x - U^T (W x) for columns x (B, H, D, c)."""
        if not self.count:
            return x
        return x - self.u.value.transpose(-1, -2) @ (self.w.value @ x)

    def flush(self, keys: Buffer) -> None:
        """Apply the pending factors to the rows before F at once: k^_j <- H_{T-1} ... H_F k^_j = M^T k^_j, as rows
        K <- K - (K U^T) W (two matmuls, one pass over the cache); the rows from F on are exact already. Then
        F = T and no factors are pending."""
        if self.count and self.flushed:
            K = keys.value[..., : self.flushed, :]
            K.sub_((K @ self.u.value.transpose(-1, -2)) @ self.w.value)
        self.flushed = keys.length
        self.w.crop(0)
        self.u.crop(0)

    def exact_keys(self, keys: Buffer) -> torch.Tensor:
        """The exact cached keys k~_j (B, H, T, D) (a new tensor; the cache is left as it is)."""
        K = keys.value
        if not self.count:
            return K.clone()
        old = K[..., : self.flushed, :]
        return torch.cat((old - (old @ self.u.value.transpose(-1, -2)) @ self.w.value, K[..., self.flushed :, :]), dim=-2)

    def reorder(self, index: torch.Tensor) -> None:
        self.w.reorder(index)
        self.u.reorder(index)

    def nbytes(self) -> int:
        return self.w.nbytes() + self.u.nbytes()


def path_step_pending(q, k, v, w, beta, keys: Buffer, values: Buffer, pending: PendingFactors, bias: Optional[BiasFn], scale: float) -> torch.Tensor:
    """``path_step`` (the reference, same arguments and result) without a pass over the key cache per token.

    Token t's H_t updates only the rows written since the last flush (O(p D)) and joins
    ``pending``; its query meets the flushed rows as M q_t (O(p D): q^T M^T k^_j = (M q)^T k^_j)
    and the recent rows as q_t. Every ``pending.every`` tokens the factors are flushed into the
    cache at once (``PendingFactors.flush``, O(T D p) in two matmuls). Per token: O(T D) reads
    for the scores and values, no writes to the cache.
    """
    wide, T0 = keys.data.dtype, keys.length
    V, out = values.append(v.to(wide)), []
    for t in range(q.shape[-2]):
        wt, bt = w[:, :, t, None, :].to(wide), beta[:, :, t, None, None].to(wide)
        F = pending.flushed
        recent = keys.value[..., F:, :]
        recent.sub_((recent @ wt.transpose(-1, -2)) * (bt * wt))
        pending.push(wt, bt)
        K = keys.append(k[:, :, t : t + 1].to(wide))
        qt = q[:, :, t, None, :].to(wide)  # a row: q K^T runs ~5x faster on CPU than the matrix-vector K q
        qf = pending.apply(qt.transpose(-1, -2)).transpose(-1, -2)
        s = torch.cat((qf @ K[..., :F, :].transpose(-1, -2), qt @ K[..., F:, :].transpose(-1, -2)), dim=-1)[..., 0, :] * scale
        if bias is not None:
            s = s + bias(T0 + t, T0 + t + 1, 0, T0 + t + 1)[..., 0, :].to(s.dtype)
        out.append(torch.softmax(s, dim=-1)[:, :, None, :] @ V[:, :, : T0 + t + 1])
        if pending.count >= pending.every:
            pending.flush(keys)
    return torch.cat(out, dim=2).to(v.dtype)


def _fla_kernel():
    """flash-linear-attention's PaTH kernel, or None (no CUDA or ``fla`` not installed)."""
    if not torch.cuda.is_available():
        return None
    try:
        from fla.ops.path_attn.parallel import parallel_path_attn
    except ImportError:
        try:  # older releases name it parallel_path_attention
            from fla.ops.path_attn.parallel import parallel_path_attention as parallel_path_attn
        except ImportError:
            return None
    return parallel_path_attn


def fla_path_attention(kernel, q, k, v, w, beta, logit_scale: float = 1.0) -> torch.Tensor:
    """Call ``parallel_path_attn`` (layout [B, T, H, D], w and beta float32); shapes as ``path_attention``."""
    o, _ = kernel(
        q=q.transpose(1, 2), k=k.transpose(1, 2), v=v.transpose(1, 2),
        w=w.transpose(1, 2).float().contiguous(), beta=beta.transpose(1, 2).float().contiguous(),
        scale=logit_scale / math.sqrt(q.shape[-1]),
    )
    return o.transpose(1, 2)


@register
class PaTH(Encoding):
    """PaTH: scores q_i^T H_i ... H_{j+1} k_j, H_t = I - beta_t w_t w_t^T (Yang et al. 2025).

    Parameters:
        rank: rank of the low-rank projection giving w (fla's default), >= 1
        conv_size: width of the short causal depthwise convolution on w, >= 1
        block_size: positions per chunk C of the blockwise product, >= 1 (memory, not results)
        use_kernel: flash-linear-attention's CUDA kernel where it is installed (on CUDA)

    w: (B, H, T, D) float32,
    beta: (B, H, T) float32, from the layer's input x. Replaces attention.
    """

    name = "path"
    family, source = "accumulated transports", "Yang et al. 2025, PaTH attention (Householder transforms)"
    replaces_attention = True

    def __init__(self, dims: Dims, rank: int = 32, conv_size: int = 3, block_size: int = 64, use_kernel: bool = True):
        super().__init__(dims)
        if rank < 1 or conv_size < 1 or block_size < 1:
            raise PosencError(f"path: rank, conv_size and block_size must be >= 1, got {rank}, {conv_size}, {block_size}")
        width = dims.n_head * dims.head_dim
        self.w_proj = nn.Sequential(nn.Linear(dims.d_model, rank, bias=False), nn.Linear(rank, width, bias=False))
        self.w_conv = nn.Conv1d(width, width, conv_size, groups=width, bias=False, padding=conv_size - 1)
        self.beta_proj = nn.Linear(dims.d_model, dims.n_head, bias=True)
        self.block_size, self.use_kernel, self._warned = block_size, use_kernel, False

    def gates(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, d_model) -> w (B, H, T, D) unit-norm, beta (B, H, T) in (0, 2), float32 or better (float64 in a float64 model)."""
        u = self.w_conv(self.w_proj(x).transpose(1, 2))[..., : x.shape[1]]  # causal: left padding only kept
        return self._gates(u, x)

    def _gates(self, u: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """w, beta from the convolved projection u (B, H D, T) and x (B, T, d_model)."""
        B, T, _ = x.shape
        wide = torch.promote_types(x.dtype, torch.float32)
        w = F.normalize(F.silu(u.to(wide)).view(B, self.dims.n_head, self.dims.head_dim, T).transpose(-1, -2), dim=-1)
        return w, 2 * torch.sigmoid(self.beta_proj(x).to(wide)).transpose(1, 2)

    def decoder(self) -> "PaTHState":
        return PaTHState(self)

    def attend(self, q, k, v, inp: Inputs, bias: Optional[BiasFn] = None):
        return self.attend_gated(q, k, v, *self.gates(inp.x), bias)

    def attend_gated(self, q, k, v, w, beta, bias: Optional[BiasFn] = None):
        """``attend`` given the gates w (B, H, T, D), beta (B, H, T)."""
        kernel = _fla_kernel() if (self.use_kernel and q.is_cuda and bias is None) else None
        if kernel is not None and q.shape[-1] not in FLA_HEAD_DIMS:
            if not self._warned:
                warnings.warn(f"path: head dim {q.shape[-1]} not supported by the fla kernel {FLA_HEAD_DIMS}; using the PyTorch path")
                self._warned = True
            kernel = None
        if kernel is not None:
            return fla_path_attention(kernel, q, k, v, w, beta, self.logit_scale)
        wide = torch.promote_types(q.dtype, torch.float32)  # the Householder products in float32+ (bf16 autocast too)
        out = path_attention(q.to(wide), k.to(wide), v.to(wide), w.to(wide), beta.to(wide), bias=bias, logit_scale=self.logit_scale, block_size=self.block_size)
        return out.to(v.dtype)

    def describe(self) -> str:
        return f"PaTH (accumulated Householder), w rank {self.w_proj[0].out_features}, conv {self.w_conv.kernel_size[0]}, block {self.block_size}"


class PaTHState(DecodeState):
    """PaTH decoding, fla's recurrence: the cached keys are k~_j = H_{T-1} ... H_{j+1} k_j (float32+); each new
    token's H_t is kept pending (``PendingFactors``: its query goes through the pending factors instead, the rows
    since the last flush are updated exactly) and every ``flush_every`` tokens the pending factors are applied to
    the cache at once (``path_step_pending``; ``path_step``, a rank-one update of every cached key per token, is
    the reference); the prefill is the parallel attention and ``path_keys``. Keeps the last conv_size - 1
    low-rank projections of x, so the new tokens' w needs only their own inputs. Cannot ``crop`` (H_t is not
    invertible at beta = 1)."""

    per_head_keys = True
    flush_every = 32  # pending factors before a flush: a flush costs ~ 2 p of the per-token score passes, once per p tokens

    def __init__(self, enc: PaTH):
        super().__init__(enc)
        self.tail: Optional[torch.Tensor] = None  # (B, H D, conv_size - 1) projections before the new tokens
        self.pending: Optional[PendingFactors] = None
        self.length = 0

    def attend(self, q, k, v, inp: Inputs, pos: torch.Tensor, bias, keys: Buffer, values: Buffer) -> torch.Tensor:
        enc, x = self.enc, inp.x
        proj = enc.w_proj(x).transpose(1, 2)
        if self.tail is None:
            w, beta = enc.gates(x)
            out = enc.attend_gated(q, k, v, w, beta, bias)
            wide = torch.promote_types(q.dtype, torch.float32)
            keys.append(path_keys(k.to(wide), w.to(wide), beta.to(wide), enc.block_size))
            values.append(v.to(wide))
            self.tail = proj.new_zeros(*proj.shape[:2], enc.w_conv.kernel_size[0] - 1)
            self.pending = PendingFactors(self.flush_every, keys.length)
        else:
            u = torch.cat((self.tail, proj), dim=-1)
            w, beta = enc._gates(F.conv1d(u, enc.w_conv.weight, groups=u.shape[1]), x)
            out = path_step_pending(q, k, v, w, beta, keys, values, self.pending, bias, enc.logit_scale / math.sqrt(q.shape[-1]))
        self.tail = torch.cat((self.tail, proj), dim=-1)[..., proj.shape[-1] :]
        self.length += x.shape[1]
        return out

    def crop(self, length: int) -> None:
        if length < self.length:
            raise PosencError("path cannot crop its decoding cache: the cached keys carry every later Householder step")

    def reorder(self, index: torch.Tensor) -> None:
        if self.tail is not None:
            self.tail = self.tail.index_select(0, index.to(self.tail.device))
            self.pending.reorder(index)

    def nbytes(self) -> int:
        return 0 if self.tail is None else self.tail.numel() * self.tail.element_size() + self.pending.nbytes()
