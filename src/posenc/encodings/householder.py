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
2. ``path_attention`` (CPU/any device, PyTorch), flash-linear-attention's chunked
   form (``fla/ops/path_attn``): chunks of C tokens (``chunk_size``). In chunk b,
   with W, beta, K, Q its rows, the UT transform A = I + diag(beta) tril(W W^T, -1)
   gives U = A^-1 diag(beta) W with H_{last} ... H_{first} = I - W^T U, and
   C = A^-1 diag(beta) tril(W K^T, -1) (one triangular solve for [U | C]). Then
     intra-chunk scores     S = Q K^T - tril(Q W^T) C     (on and below the diagonal),
     keys to the chunk end  K^ = K - C^T W           (k^_j = H_last ... H_{j+1} k_j),
     queries to its start   Q^ = Q - tril(Q W^T) U   (q^_i = H_first ... H_i q_i).
   Query chunks then go left to right over a key cache K~ of the earlier chunks' keys
   carried to the chunk's start (the decoding cache at that point): scores Q^_b K~^T
   and S_b make one (C, (b + 1) C) tile, one softmax; then K~ <- [K~ M_b^T ; K^_b]
   with M_b^T = I - U_b^T W_b, a dense D x D product (D^2 per cached key and chunk,
   less than the rank-C form's 2 C D for C > D / 2). Without autograd the tiles
   and the cache live in buffers allocated once (``_rows_inference``); memory O(T (C + D)).
3. on CUDA, flash-linear-attention's ``parallel_path_attn`` (``posenc[cuda]``),
   layout [B, T, H, D], fp32 w and beta; used when ``fla`` imports, there is no
   extra bias and the head dim is 16, 32 or 64 (else a one-line warning and 2.).
   Untested here (no GPU).
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from posenc.encodings.base import (
    Bias,
    Buffer,
    CachePart,
    DecodeState,
    Dims,
    Encoding,
    Inputs,
    batch_rows,
    tensor_nbytes,
)
from posenc.encodings.registry import register
from posenc.errors import PosencError

FLA_HEAD_DIMS = (16, 32, 64)


def _ut_blocks(q, k, w, beta, carry: bool):
    """Per-block UT quantities (module docstring, 2.); inputs blocked: (B, H, n, C, D), beta (B, H, n, C).

    Returns (S, Q^, K^, U): S the intra-block scores (.., C, C), valid on and below the
    diagonal (None when q is None); with ``carry`` also Q^ (.., C, D) the queries taken to
    their block's start, K^ (.., C, D) the keys taken to its end and U (.., C, D), the
    block's transform being I - W^T U (``_transform``); else None, None, None.
    """
    C = k.shape[-2]
    lower = torch.ones(C, C, dtype=k.dtype, device=k.device).tril()  # multiplied in: masked_fill is ~5x slower on CPU
    strict = lower.tril(-1)
    bcol = beta[..., None]
    if q is not None:  # the four products of the block in one matmul: [q; w] [w; k]^T
        P = torch.cat((q, w), dim=-2) @ torch.cat((w, k), dim=-2).transpose(-1, -2)
        qw, qk, ww, wk = P[..., :C, :C], P[..., :C, C:], P[..., C:, :C], P[..., C:, C:]
    else:
        P = w @ torch.cat((w, k), dim=-2).transpose(-1, -2)
        ww, wk = P[..., :C], P[..., C:]
    A = torch.eye(C, dtype=k.dtype, device=k.device) + bcol * ww * strict
    rhs = bcol * wk * strict
    if carry:  # one solve for both right-hand sides: [U | C] = A^-1 diag(beta) [W | tril(W K^T, -1)]
        rhs = torch.cat((bcol * w, rhs), dim=-1)
    X = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)
    U, Cm = X[..., : X.shape[-1] - C], X[..., X.shape[-1] - C :]
    S = Qh = None
    if q is not None:
        qw = qw * lower
        S = qk - qw @ Cm
        Qh = q - qw @ U if carry else None
    if not carry:
        return S, None, None, None
    return S, Qh, k - Cm.transpose(-1, -2) @ w, U


def _transform(U, w) -> torch.Tensor:
    """M^T = I - U^T W (.., D, D): a block's H_last ... H_first acting on rows (k^T <- k^T M^T)."""
    return torch.eye(w.shape[-1], dtype=w.dtype, device=w.device) - U.transpose(-1, -2) @ w


def _bias_rows(bias: Bias, T: int, C: int, b: int) -> torch.Tensor:
    """Bias of query block b against keys 0 .. (b + 1) C: (B|1, H, rows, cols), the rows and columns before T."""
    qs, qe = b * C, min((b + 1) * C, T)
    return bias.tile(qs, qe, 0, qe)


def _rows(S, Qh, Kh, Mt, v, bias: Bias | None, T: int) -> torch.Tensor:
    """Query block b's scores: Q^_b K~^T against the keys of blocks < b carried to b's start
    (K~ <- [K~ M_b^T ; K^_b] after block b), then its intra-block scores S_b; one softmax per
    (C, (b + 1) C) tile. S (scaled, -inf above the diagonal), Q^ (scaled), K^ as ``_ut_blocks``
    (n blocks), M^T (``_transform``) of blocks 1 .. n - 2 (the only ones carried across);
    v (B, H, n C, Dv). Returns (B, H, n C, Dv). Autograd's form."""
    n, C = S.shape[2], S.shape[-1]
    S, Qh, Kh, Mt = (
        x.unbind(2) if x is not None else None for x in (S, Qh, Kh, Mt)
    )  # one backward, not one per select
    out, K = [], None
    for b in range(n):
        s = S[b]
        if b:
            assert K is not None  # carried across block b - 1
            s = torch.cat((Qh[b] @ K.transpose(-1, -2), s), dim=-1)
        if bias is not None:
            t = _bias_rows(bias, T, C, b)
            s = s + F.pad(t, (0, s.shape[-1] - t.shape[-1], 0, C - t.shape[-2])).to(s.dtype)
        out.append(torch.softmax(s, dim=-1) @ v[:, :, : (b + 1) * C])
        if b < n - 1:  # carry the keys across block b (dense D x D: cheaper than the rank-C form for C > D / 2)
            K = Kh[0] if b == 0 else torch.cat((K @ Mt[b - 1], Kh[b]), dim=-2)
    return torch.cat(out, dim=-2)


def _rows_inference(S, Qh, Kh, Mt, v, bias: Bias | None, T: int) -> torch.Tensor:
    """``_rows`` (same arguments and result) without autograd, in buffers allocated once: on CPU a fresh
    multi-MB tensor per block costs page faults, ~40% of the score matmul that fills it."""
    B, H, n, C, _ = S.shape
    s_buf = S.new_empty(B, H, C, n * C)
    keys = [S.new_empty(B, H, n * C, Qh.shape[-1]) for _ in range(2)] if n > 1 else []  # none carried for one block
    out = v.new_empty(B, H, n * C, v.shape[-1])
    for b in range(n):
        c0, c1 = b * C, (b + 1) * C
        s = s_buf[..., :c1]
        if b:
            torch.matmul(Qh[:, :, b], keys[0][:, :, :c0].transpose(-1, -2), out=s[..., :c0])
        s[..., c0:].copy_(S[:, :, b])
        if bias is not None:
            t = _bias_rows(bias, T, C, b)
            s[..., : t.shape[-2], : t.shape[-1]].add_(t.to(s.dtype))
        torch.softmax(s, dim=-1, out=s)
        torch.matmul(s, v[:, :, :c1], out=out[:, :, c0:c1])
        if b < n - 1:  # keys[1] <- [keys[0] M_b^T ; K^_b], then swap
            if b:
                torch.matmul(keys[0][:, :, :c0], Mt[:, :, b - 1], out=keys[1][:, :, :c0])
            keys[1][:, :, c0:c1].copy_(Kh[:, :, b])
            keys.reverse()
    return out


SHORT_BLOCK = 32  # chunk floor for short inputs


def chunk_size(T: int, block_size: int) -> int:
    """Positions per chunk for T tokens: block_size at long T, less for short inputs (T // 16, at least
    SHORT_BLOCK, at most T). The UT transform's triangular solve (slow on CPU, its backward more so) grows
    with C and the key carries shrink with it: on the default model 32 is fastest at T = 128 (training)
    and 128 at 4K-16K (benchmarks/results/path_prefill.md)."""
    return min(block_size, max(SHORT_BLOCK, T // 16), T)


def path_attention(
    q, k, v, w, beta, *, bias: Bias | None = None, logit_scale: float = 1.0, block_size: int = 128
) -> torch.Tensor:
    """Chunked PaTH attention (module docstring, 2.), the form of flash-linear-attention's ``parallel_path_attn``.

    q, k, w: (B, H, T, D) float32/64 (w unit-norm); v: (B, H, T, Dv); beta: (B, H, T)
    in (0, 2); bias: optional tile function added to the scaled scores. Scores
    are ``logit_scale * s_ij / sqrt(D) + bias``; products in q's dtype. Returns
    (B, H, T, Dv) in v's dtype, float32+ products also under autocast. Chunks of
    ``chunk_size(T, block_size)`` positions; memory O(T (C + D)) without gradients
    (``_rows_inference``: the same arithmetic as ``_rows`` in buffers allocated once),
    O(T^2) under autograd (the softmax tiles are kept for the backward).
    """
    B, H, T, D = q.shape
    C = chunk_size(T, block_size)
    n = -(-T // C)
    pad = n * C - T  # padded tokens: w = 0, beta = 0 (H = I), keys masked by causality
    dt = q.dtype
    with torch.autocast(q.device.type, enabled=False):  # the products in dt under autocast too
        q, k, w = (F.pad(x.to(dt), (0, 0, 0, pad)).view(B, H, n, C, D) for x in (q, k, w))
        vp = F.pad(v.to(dt), (0, 0, 0, pad))
        q = q * (logit_scale / math.sqrt(D))  # S and Q^ are linear in q: scaled once here
        S, Qh, Kh, U = _ut_blocks(q, k, w, F.pad(beta.to(dt), (0, pad)).view(B, H, n, C), carry=n > 1)
        S = S + torch.full((C, C), float("-inf"), dtype=dt, device=q.device).triu(1)  # added: masked_fill is slower
        Mt = _transform(U[:, :, 1:-1], w[:, :, 1:-1]) if n > 2 else None
        grad = torch.is_grad_enabled() and (
            bias is not None or any(x.requires_grad for x in (S, vp))
        )  # out= is not differentiable
        out = (_rows if grad else _rows_inference)(S, Qh, Kh, Mt, vp, bias, T)
    return out[:, :, :T].to(v.dtype)


def path_keys(k, w, beta, block_size: int = 64) -> torch.Tensor:
    """The keys as decoding caches them after T tokens: k~_j = H_{T-1} ... H_{j+1} k_j, (B, H, T, D) in k's dtype.

    k, w: (B, H, T, D), beta: (B, H, T), one float dtype. Blockwise: the UT transform
    takes each key to its block's end (K^ = K - C^T W) and gives the block's transform
    H_last ... H_first = I - W^T U (``_ut_blocks``); the later blocks' transforms are carried
    right to left as one D x D matrix R (k~ = k^ R, R <- (I - U_b^T W_b) R): O(T D (C + D)),
    not the O(T^2 D) of the token loop (``householder_naive.path_decode``, the reference).
    """
    with torch.autocast(k.device.type, enabled=False):  # float32+ products under autocast too
        B, H, T, D = k.shape
        C = min(block_size, T)
        n = -(-T // C)
        pad = n * C - T  # padded tokens: w = 0, beta = 0 (H = I)
        kb, wb = (F.pad(x, (0, 0, 0, pad)).view(B, H, n, C, D) for x in (k, w))
        _, _, Kh, U = _ut_blocks(None, kb, wb, F.pad(beta, (0, pad)).view(B, H, n, C), carry=True)
        Mt = _transform(U, wb)
        R = torch.eye(D, dtype=k.dtype, device=k.device).expand(B, H, D, D)
        out = torch.empty_like(Kh)
        for b in reversed(range(n)):
            out[:, :, b] = Kh[:, :, b] @ R
            R = Mt[:, :, b] @ R
        return out.view(B, H, n * C, D)[:, :, :T]


def path_step(q, k, v, w, beta, keys: Buffer, values: Buffer, bias: Bias | None, scale: float) -> torch.Tensor:
    """n new tokens, one at a time, over the cached keys (``path_keys``' form, in ``keys``' dtype), updated in place.

    q, k, w: (B, H, n, D), v: (B, H, n, Dv), beta: (B, H, n); each token t first applies
    H_t to every cached key (k_j <- k_j - beta_t (w_t . k_j) w_t, O(T D)), then appends
    its key and attends with scores ``scale * q_t . k~_j`` + the bias row of cache row
    T0 + t. Returns (B, H, n, Dv) in v's dtype; ``householder_naive.path_decode`` is the
    reference (the same recurrence over a whole sequence).
    """
    assert keys.data is not None  # the prefill's keys
    wide, T0 = keys.data.dtype, keys.length
    V, out = values.append(v.to(wide)), []
    for t in range(q.shape[-2]):
        K = keys.value
        assert K is not None
        wt = w[:, :, t].to(wide)
        K.sub_((K @ wt[..., None]) * (beta[:, :, t, None, None].to(wide) * wt[:, :, None, :]))
        K = keys.append(k[:, :, t : t + 1].to(wide))
        s = (K @ q[:, :, t, :, None].to(wide))[..., 0] * scale
        if bias is not None:
            s = s + bias.tile(T0 + t, T0 + t + 1, 0, T0 + t + 1)[..., 0, :].to(s.dtype)
        out.append(torch.softmax(s, dim=-1)[:, :, None, :] @ V[:, :, : T0 + t + 1])
    return torch.cat(out, dim=2).to(v.dtype)


class PendingFactors(CachePart):
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
        u, w = self.u.value, self.w.value
        assert u is not None and w is not None  # factors are pending
        return x - u.transpose(-1, -2) @ (w @ x)

    def flush(self, keys: Buffer) -> None:
        """Apply the pending factors to the rows before F at once: k^_j <- H_{T-1} ... H_F k^_j = M^T k^_j, as rows
        K <- K - (K U^T) W (two matmuls, one pass over the cache); the rows from F on are exact already. Then
        F = T and no factors are pending."""
        if self.count and self.flushed:
            held, u, w = keys.value, self.u.value, self.w.value
            assert held is not None and u is not None and w is not None  # keys are cached, factors pending
            K = held[..., : self.flushed, :]
            K.sub_((K @ u.transpose(-1, -2)) @ w)
        self.flushed = keys.length
        self.w.crop(0)
        self.u.crop(0)

    def exact_keys(self, keys: Buffer) -> torch.Tensor:
        """The exact cached keys k~_j (B, H, T, D) (a new tensor; the cache is left as it is)."""
        K = keys.value
        assert K is not None  # keys are cached
        if not self.count:
            return K.clone()
        u, w = self.u.value, self.w.value
        assert u is not None and w is not None  # factors are pending
        old = K[..., : self.flushed, :]
        return torch.cat((old - (old @ u.transpose(-1, -2)) @ w, K[..., self.flushed :, :]), dim=-2)

    def parts(self) -> list[Buffer]:
        return [self.w, self.u]


def path_step_pending(
    q, k, v, w, beta, keys: Buffer, values: Buffer, pending: PendingFactors, bias: Bias | None, scale: float
) -> torch.Tensor:
    """``path_step`` (the reference, same arguments and result) without a pass over the key cache per token.

    Token t's H_t updates only the rows written since the last flush (O(p D)) and joins
    ``pending``; its query meets the flushed rows as M q_t (O(p D): q^T M^T k^_j = (M q)^T k^_j)
    and the recent rows as q_t. Every ``pending.every`` tokens the factors are flushed into the
    cache at once (``PendingFactors.flush``, O(T D p) in two matmuls). Per token: O(T D) reads
    for the scores and values, no writes to the cache.
    """
    assert keys.data is not None  # the prefill's keys
    wide, T0 = keys.data.dtype, keys.length
    V, out = values.append(v.to(wide)), []
    for t in range(q.shape[-2]):
        wt, bt = w[:, :, t, None, :].to(wide), beta[:, :, t, None, None].to(wide)
        F = pending.flushed
        held = keys.value
        assert held is not None
        recent = held[..., F:, :]
        recent.sub_((recent @ wt.transpose(-1, -2)) * (bt * wt))
        pending.push(wt, bt)
        K = keys.append(k[:, :, t : t + 1].to(wide))
        qt = q[:, :, t, None, :].to(wide)  # a row: q K^T runs ~5x faster on CPU than the matrix-vector K q
        qf = pending.apply(qt.transpose(-1, -2)).transpose(-1, -2)
        s = (
            torch.cat((qf @ K[..., :F, :].transpose(-1, -2), qt @ K[..., F:, :].transpose(-1, -2)), dim=-1)[..., 0, :]
            * scale
        )
        if bias is not None:
            s = s + bias.tile(T0 + t, T0 + t + 1, 0, T0 + t + 1)[..., 0, :].to(s.dtype)
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
        q=q.transpose(1, 2),
        k=k.transpose(1, 2),
        v=v.transpose(1, 2),
        w=w.transpose(1, 2).float().contiguous(),
        beta=beta.transpose(1, 2).float().contiguous(),
        scale=logit_scale / math.sqrt(q.shape[-1]),
    )
    return o.transpose(1, 2)


@register
class PaTH(Encoding):
    """PaTH: scores q_i^T H_i ... H_{j+1} k_j, H_t = I - beta_t w_t w_t^T (Yang et al. 2025).

    Parameters:
        rank: rank of the low-rank projection giving w (fla's default), >= 1
        conv_size: width of the short causal depthwise convolution on w, >= 1
        block_size: positions per chunk C of the chunked product at long inputs, >= 1 (speed and
            memory, not results; short inputs use less: ``chunk_size``)
        use_kernel: flash-linear-attention's CUDA kernel where it is installed (on CUDA)

    w: (B, H, T, D) float32,
    beta: (B, H, T) float32, from the layer's input x. Replaces attention.
    """

    name = "path"
    family, source = "accumulated transports", "Yang et al. 2025, PaTH attention (Householder transforms)"
    replaces_attention = True

    def __init__(self, dims: Dims, rank: int = 32, conv_size: int = 3, block_size: int = 128, use_kernel: bool = True):
        super().__init__(dims)
        if rank < 1 or conv_size < 1 or block_size < 1:
            raise PosencError(
                f"path: rank, conv_size and block_size must be >= 1, got {rank}, {conv_size}, {block_size}"
            )
        width = dims.n_head * dims.head_dim
        self.w_proj = nn.Sequential(nn.Linear(dims.d_model, rank, bias=False), nn.Linear(rank, width, bias=False))
        self.w_conv = nn.Conv1d(width, width, conv_size, groups=width, bias=False, padding=conv_size - 1)
        self.beta_proj = nn.Linear(dims.d_model, dims.n_head, bias=True)
        self.block_size, self.use_kernel, self._warned = block_size, use_kernel, False

    def gates(self, x: torch.Tensor, real: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, d_model) -> w (B, H, T, D) unit-norm, beta (B, H, T) in (0, 2), float32 or better (float64 in a
        float64 model). real: (B, T) bool, False on the padding of a left-padded batch (``Inputs.real``): there the
        convolution's inputs are 0 and beta is 0 (H_t = I), so a row's gates are those of the row alone."""
        u = self.w_conv(self.project(x, real))[..., : x.shape[1]]  # causal: left padding only kept
        w, beta = self._gates(u, x)
        return w, beta if real is None else beta * real[:, None, :]

    def project(self, x: torch.Tensor, real: torch.Tensor | None = None) -> torch.Tensor:
        """The convolution's input (B, H D, T): the low-rank projection of x, 0 where ``real`` (B, T) is False."""
        proj = self.w_proj(x).transpose(1, 2)
        return proj if real is None else proj * real[:, None, :]

    def _gates(self, u: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """w, beta from the convolved projection u (B, H D, T) and x (B, T, d_model)."""
        B, T, _ = x.shape
        wide = torch.promote_types(x.dtype, torch.float32)
        w = F.normalize(F.silu(u.to(wide)).view(B, self.dims.n_head, self.dims.head_dim, T).transpose(-1, -2), dim=-1)
        return w, 2 * torch.sigmoid(self.beta_proj(x).to(wide)).transpose(1, 2)

    def decoder(self) -> PaTHState:
        return PaTHState(self)

    def attend(self, q, k, v, inp: Inputs, bias: Bias | None = None):
        return self.attend_gated(q, k, v, *self.gates(inp.x, inp.real()), bias)

    def attend_gated(self, q, k, v, w, beta, bias: Bias | None = None):
        """``attend`` given the gates w (B, H, T, D), beta (B, H, T)."""
        kernel = _fla_kernel() if (self.use_kernel and q.is_cuda and bias is None) else None
        if kernel is not None and q.shape[-1] not in FLA_HEAD_DIMS:
            if not self._warned:
                warnings.warn(
                    f"path: head dim {q.shape[-1]} not supported by the fla kernel {FLA_HEAD_DIMS}; "
                    "using the PyTorch path",
                    stacklevel=2,
                )
                self._warned = True
            kernel = None
        if kernel is not None:
            return fla_path_attention(kernel, q, k, v, w, beta, self.logit_scale)
        wide = torch.promote_types(q.dtype, torch.float32)  # the Householder products in float32+ (bf16 autocast too)
        out = path_attention(
            q.to(wide),
            k.to(wide),
            v.to(wide),
            w.to(wide),
            beta.to(wide),
            bias=bias,
            logit_scale=self.logit_scale,
            block_size=self.block_size,
        )
        return out.to(v.dtype)

    def describe(self) -> str:
        return (
            f"PaTH (accumulated Householder), w rank {self.w_proj[0].out_features}, "
            f"conv {self.w_conv.kernel_size[0]}, block {self.block_size}"
        )


class PaTHState(DecodeState):
    """PaTH decoding, fla's recurrence: the cached keys are k~_j = H_{T-1} ... H_{j+1} k_j (float32+); each new
    token's H_t is kept pending (``PendingFactors``: its query goes through the pending factors instead, the rows
    since the last flush are updated exactly) and every ``flush_every`` tokens the pending factors are applied to
    the cache at once (``path_step_pending``; ``path_step``, a rank-one update of every cached key per token, is
    the reference); the prefill is the parallel attention and ``path_keys``. Keeps the last conv_size - 1
    low-rank projections of x, so the new tokens' w needs only their own inputs. Cannot ``crop`` (H_t is not
    invertible at beta = 1)."""

    enc: PaTH
    per_head_keys = True
    flush_every = (
        32  # pending factors before a flush: a flush costs ~ 2 p of the per-token score passes, once per p tokens
    )

    def __init__(self, enc: PaTH):
        super().__init__(enc)
        self.tail: torch.Tensor | None = None  # (B, H D, conv_size - 1) projections before the new tokens
        self.pending: PendingFactors | None = None
        self.length = 0

    def attend(self, q, k, v, inp: Inputs, pos: torch.Tensor, bias, keys: Buffer, values: Buffer) -> torch.Tensor:
        enc, x = self.enc, inp.x
        proj = enc.project(x, inp.real())
        if self.tail is None:
            w, beta = enc.gates(x, inp.real())
            out = enc.attend_gated(q, k, v, w, beta, bias)
            wide = torch.promote_types(q.dtype, torch.float32)
            keys.append(path_keys(k.to(wide), w.to(wide), beta.to(wide), enc.block_size))
            values.append(v.to(wide))
            self.tail = proj.new_zeros(*proj.shape[:2], enc.w_conv.kernel_size[0] - 1)
            self.pending = PendingFactors(self.flush_every, keys.length)
        else:
            assert self.pending is not None  # set with the tail
            u = torch.cat((self.tail, proj), dim=-1)
            w, beta = enc._gates(F.conv1d(u, enc.w_conv.weight, groups=u.shape[1]), x)
            out = path_step_pending(
                q, k, v, w, beta, keys, values, self.pending, bias, enc.logit_scale / math.sqrt(q.shape[-1])
            )
        self.tail = torch.cat((self.tail, proj), dim=-1)[..., proj.shape[-1] :]
        self.length += x.shape[1]
        return out

    def check_crop(self, length: int) -> None:
        if length < self.length:
            raise PosencError("path cannot crop its decoding cache: the cached keys carry every later Householder step")

    def parts(self) -> list[PendingFactors]:
        return [] if self.pending is None else [self.pending]

    def reorder(self, index: torch.Tensor) -> None:
        super().reorder(index)
        if self.tail is not None:
            self.tail = batch_rows(self.tail, index)

    def nbytes(self) -> int:
        return super().nbytes() + tensor_nbytes(self.tail)
