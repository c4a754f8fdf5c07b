"""PaTH references: the literal product formula and the decoding recurrence.

Both are O(T^2 d^2) / O(T^2 d) with a Python loop over tokens; they exist to
check ``posenc.encodings.householder.path_attention`` (tests, benchmark).
Shapes: q, k, w: (B, H, T, D); v: (B, H, T, Dv); beta: (B, H, T); w unit-norm.
"""

from __future__ import annotations

import math

import torch

from posenc.encodings.base import Bias


def path_scores_naive(q, k, w, beta) -> torch.Tensor:
    """s_ij = q_i^T H_i H_{i-1} ... H_{j+1} k_j with H_t = I - beta_t w_t w_t^T, built as products.

    Keeps P[j] = H_i ... H_{j+1} for the current i; each new token multiplies every
    P[j] by H_i on the left (a rank-1 update) and appends P[i] = I. Returns
    (B, H, T, T), -inf above the diagonal, without 1/sqrt(D).
    """
    B, H, T, D = q.shape
    eye = torch.eye(D, dtype=q.dtype, device=q.device).expand(B, H, 1, D, D)
    P = eye[:, :, :0]
    scores = q.new_full((B, H, T, T), float("-inf"))  # rows written in place: a list of rows fragments the heap
    for i in range(T):
        wi, bi = w[:, :, i], beta[:, :, i]
        # H_i P = P - beta_i w_i (w_i^T P)
        P = (
            P
            - bi[..., None, None, None] * wi[:, :, None, :, None] * torch.einsum("bhd,bhjde->bhje", wi, P)[..., None, :]
        )
        P = torch.cat((P, eye), dim=2)
        scores[:, :, i, : i + 1] = torch.einsum("bhd,bhjde,bhje->bhj", q[:, :, i], P, k[:, :, : i + 1])
    return scores


def path_attention_naive(q, k, v, w, beta, *, bias: Bias | None = None, logit_scale: float = 1.0) -> torch.Tensor:
    """Full T x T causal softmax over ``path_scores_naive`` (+ bias). Returns (B, H, T, Dv)."""
    T = q.shape[-2]
    s = path_scores_naive(q, k, w, beta) * (logit_scale / math.sqrt(q.shape[-1]))
    if bias is not None:
        s = s + bias.tile(0, T, 0, T).to(s.dtype)
    return torch.softmax(s, dim=-1) @ v


def path_decode(q, k, v, w, beta, *, bias: Bias | None = None, logit_scale: float = 1.0) -> torch.Tensor:
    """Token-by-token decoding: appending token t updates every cached key in place of products,
    k_j <- k_j - beta_t (w_t . k_j) w_t, then appends k_t and attends. Returns (B, H, T, Dv)."""
    T = q.shape[-2]
    scale = logit_scale / math.sqrt(q.shape[-1])
    cache = k[:, :, :0]
    out = []
    for t in range(T):
        wt, bt = w[:, :, t], beta[:, :, t]
        cache = cache - bt[..., None, None] * (cache @ wt[..., None]) * wt[:, :, None, :]
        cache = torch.cat((cache, k[:, :, t : t + 1]), dim=2)
        s = (cache @ q[:, :, t, :, None])[..., 0] * scale  # (B, H, t+1)
        if bias is not None:
            s = s + bias.tile(t, t + 1, 0, t + 1)[..., 0, :].to(s.dtype)
        out.append(torch.softmax(s, dim=-1)[:, :, None, :] @ v[:, :, : t + 1])
    return torch.cat(out, dim=2)
