"""RoPE context-extension schedules, applied at evaluation to a trained RoPE model.

Each frequency schedule is a small pure function in the style of Hugging Face's
``modeling_rope_utils`` (one registry dict, ``SCHEDULES``)::

    fn(head_dim, rope_theta, params, seq_len) -> (inv_freq (D/2,) float64 rad/token, attention_factor)

``attention_factor`` multiplies both cos and sin, so the attention logits are
scaled by its square (``RoPE.logit_scale = attention_factor ** 2``). ``L0`` below
is ``original_max_position_embeddings`` (default: the model's training length),
``s`` the ``factor`` and ``omega_i = rope_theta^(-2i/D)``.

=================  ==========================================================  ==================
name               inverse frequencies                                          source
=================  ==========================================================  ==================
``pi``             omega_i / s (positions / s)                                  Chen et al. 2023, eq. 2
``ntk``            base' = base * s^(D/(D-2)) (static)                          bloc97 2023 (NTK-aware)
``dynamic``        base' = base * (s L/L0 - (s-1))^(D/(D-2)) for L = the        emozilla 2023;
                   current sequence length > L0, else omega                     HF ``dynamic``
``yarn``           ramp between omega_i/s and omega_i over the pair index,      Peng et al. 2023,
                   from r_i = L0/lambda_i = beta_fast (unchanged) down to       sec. 3.2-3.4 and the
                   r_i = beta_slow (fully interpolated); attention factor       reference code
                   0.1 ln s + 1 unless ``attention_factor`` is given
``llama3``         wavelength bands: > L0/low_freq_factor -> omega/s,           Meta Llama 3.1;
                   < L0/high_freq_factor -> omega, smooth in between            HF ``llama3``
``rerope``         omega; relative position min(i-j, w) (``window`` w)          Su 2023 (ReRoPE)
``leaky-rerope``   omega; relative position w + (i-j-w)/k beyond w (``leak``)   Su 2023
=================  ==========================================================  ==================

YaRN's ramp: the paper writes gamma(r) linear in r; the reference implementation
(and Hugging Face) ramps linearly in the pair index between the (floored/ceiled
with ``truncate``) indices where r = beta_fast and r = beta_slow. posenc follows
the reference code, so its frequencies equal transformers' (golden tests).
``factor`` is always the given s, never replaced by a length ratio.

ReRoPE is an attention path (``rerope_attention``): per query block, in-window
scores use the normal rotation and beyond-window scores rotate q by position w
(or the leaky position) relative to k; at most two (block x keys) tiles exist.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import torch

from posenc.attention import causal_tile, rotate
from posenc.encodings.base import BiasFn
from posenc.encodings.phase import rope_inv_freq, wrap_phases
from posenc.errors import PosencError

ScheduleFn = Callable[[int, float, dict, Optional[int]], tuple[torch.Tensor, float]]


def _pi(head_dim, rope_theta, p, seq_len):
    return rope_inv_freq(head_dim, rope_theta) / p["factor"], 1.0


def _ntk(head_dim, rope_theta, p, seq_len):
    base = rope_theta * p["factor"] ** (head_dim / (head_dim - 2))
    return rope_inv_freq(head_dim, base), 1.0


def _dynamic(head_dim, rope_theta, p, seq_len):
    L0, s = p["original_max_position_embeddings"], p["factor"]
    L = max(seq_len or L0, L0)  # the current length only: never a stale longer one
    base = rope_theta * (s * L / L0 - (s - 1)) ** (head_dim / (head_dim - 2))
    return rope_inv_freq(head_dim, base), 1.0


def yarn_attention_factor(s: float) -> float:
    """YaRN's sqrt(1/t) = 0.1 ln s + 1 for s > 1, else 1 (Peng et al. 2023, eq. 22)."""
    return 0.1 * math.log(s) + 1.0 if s > 1 else 1.0


def _yarn(head_dim, rope_theta, p, seq_len):
    s, L0 = p["factor"], p["original_max_position_embeddings"]
    omega = rope_inv_freq(head_dim, rope_theta)

    def pair_index(rotations):  # the i with r_i = L0 omega_i / (2 pi) = rotations
        return head_dim * math.log(L0 / (rotations * 2 * math.pi)) / (2 * math.log(rope_theta))

    low, high = pair_index(p["beta_fast"]), pair_index(p["beta_slow"])
    if p["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # as the reference: avoid a zero-width ramp
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    inv_freq = omega / s * ramp + omega * (1 - ramp)  # ramp 0: high frequencies kept
    af = p["attention_factor"] if p["attention_factor"] is not None else yarn_attention_factor(s)
    return inv_freq, float(af)


def _llama3(head_dim, rope_theta, p, seq_len):
    s, L0 = p["factor"], p["original_max_position_embeddings"]
    lo, hi = p["low_freq_factor"], p["high_freq_factor"]
    omega = rope_inv_freq(head_dim, rope_theta)
    wavelen = 2 * math.pi / omega
    smooth = (L0 / wavelen - lo) / (hi - lo)
    mid = (1 - smooth) * omega / s + smooth * omega
    out = torch.where(wavelen > L0 / lo, omega / s, omega)
    return torch.where((wavelen >= L0 / hi) & (wavelen <= L0 / lo), mid, out), 1.0


def _plain(head_dim, rope_theta, p, seq_len):
    return rope_inv_freq(head_dim, rope_theta), 1.0


SCHEDULES: dict[str, ScheduleFn] = {
    "pi": _pi,
    "ntk": _ntk,
    "dynamic": _dynamic,
    "yarn": _yarn,
    "llama3": _llama3,
    "rerope": _plain,
    "leaky-rerope": _plain,
}

# Parameters each schedule takes and their defaults (None: required; L0 filled in).
_PARAMS: dict[str, dict[str, Any]] = {
    "pi": {"factor": None},
    "ntk": {"factor": None},
    "dynamic": {"factor": None, "original_max_position_embeddings": "L0"},
    "yarn": {"factor": None, "original_max_position_embeddings": "L0", "beta_fast": 32.0, "beta_slow": 1.0, "attention_factor": None, "truncate": True},
    "llama3": {"factor": None, "original_max_position_embeddings": "L0", "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    "rerope": {"window": None},
    "leaky-rerope": {"window": None, "leak": None},
}
_REQUIRED = {"factor", "window", "leak"}


def schedule_params(name: str, train_length: int, params: Optional[dict] = None) -> dict[str, Any]:
    """Validated parameters of schedule ``name`` with defaults filled in.

    Raises PosencError (one line) for an unknown schedule or parameter, a missing
    required one, a non-finite number, factor < 1, attention_factor <= 0,
    beta_fast <= beta_slow, window <= 0, leak <= 1, high_freq_factor <= low_freq_factor.
    """
    if name not in SCHEDULES:
        raise PosencError(f"unknown rope schedule {name!r}; valid: {', '.join(SCHEDULES)}")
    given = {k: v for k, v in (params or {}).items() if v is not None}
    unknown = set(given) - set(_PARAMS[name])
    if unknown:
        raise PosencError(f"rope schedule {name!r} takes {', '.join(_PARAMS[name])}; got {', '.join(sorted(unknown))}")
    out = {k: train_length if d == "L0" else d for k, d in _PARAMS[name].items()}
    out.update(given)
    missing = [k for k in _REQUIRED & set(out) if out[k] is None]
    if missing:
        raise PosencError(f"rope schedule {name!r} needs {', '.join(sorted(missing))}")
    for k, v in out.items():  # inf/nan pass the range checks below as NaN logits
        if isinstance(v, float) and not math.isfinite(v):
            raise PosencError(f"rope schedule {name!r}: {k} must be finite, got {v}")
    if "factor" in out and not out["factor"] >= 1:
        raise PosencError(f"rope schedule {name!r}: factor must be >= 1, got {out['factor']}")
    if out.get("attention_factor") is not None and not out["attention_factor"] > 0:
        raise PosencError(f"rope schedule {name!r}: attention_factor must be > 0, got {out['attention_factor']}")
    if name == "yarn" and not out["beta_fast"] > out["beta_slow"] > 0:
        raise PosencError(f"yarn needs beta_fast > beta_slow > 0, got beta_fast={out['beta_fast']}, beta_slow={out['beta_slow']}")
    if name == "llama3" and not out["high_freq_factor"] > out["low_freq_factor"] > 0:
        raise PosencError("llama3 needs high_freq_factor > low_freq_factor > 0")
    if "window" in out and not (out["window"] > 0 and float(out["window"]).is_integer()):
        raise PosencError(f"rope schedule {name!r}: window must be a positive integer, got {out['window']}")
    if "leak" in out and not out["leak"] > 1:
        raise PosencError(f"leaky-rerope: leak k must be > 1, got {out['leak']}")
    return out


def check_window(params: dict, eval_length: int) -> None:
    """ReRoPE's window must be shorter than the evaluation length (else it is plain RoPE)."""
    w = params.get("window")
    if w is not None and w >= eval_length:
        raise PosencError(f"rerope window {w} must be < the evaluation length {eval_length}")


def schedule_label(name: str, params: dict) -> str:
    """Short row name, e.g. ``yarn(s=8)``, ``rerope(w=64)``, ``leaky-rerope(w=64,k=16)``."""
    if "window" in params:
        return f"{name}(w={params['window']:g}" + (f",k={params['leak']:g})" if "leak" in params else ")")
    return f"{name}(s={params['factor']:g})"


def rerope_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pos: torch.Tensor,
    inv_freq: torch.Tensor,
    window: int,
    leak: Optional[float] = None,
    *,
    pairing: str = "half",
    bias: Optional[BiasFn] = None,
    logit_scale: float = 1.0,
    block_size: int = 512,
) -> torch.Tensor:
    """Causal attention with ReRoPE / leaky ReRoPE relative positions (Su 2023).

    q, k: (B, H, T, D), v: (B, H, T, Dv), pos: (T,) int64, inv_freq: (D/2,)
    float64. Relative position of query i and key j: i-j for i-j < w, else w
    (``leak`` None) or w + (i-j-w)/leak. Beyond-window scores rotate q by
    w (leaky: i/k + w - w/k) and k by 0 (leaky: j/k): only positions of one token
    each, so per query block only (block x keys) tiles exist, never T x T.
    Angles in float64 mod 2 pi. Returns (B, H, T, Dv) in v's dtype.
    """
    if window >= q.shape[-2]:
        raise PosencError(f"rerope window {window} must be < the evaluation length {q.shape[-2]}")
    p = pos.to(torch.float64)

    def rot(x, positions):
        return rotate(x, wrap_phases(positions[:, None] * inv_freq.to(pos.device), x.dtype), pairing)

    q_in, k_in = rot(q, p), rot(k, p)
    if leak is None:
        q_out, k_out = rot(q, torch.full_like(p, float(window))), k
    else:
        q_out, k_out = rot(q, p / leak + window * (1 - 1 / leak)), rot(k, p / leak)
    scale = logit_scale / math.sqrt(q.shape[-1])
    out = []
    for qs in range(0, q.shape[-2], block_size):
        qe = min(qs + block_size, q.shape[-2])
        band = max(0, qs - window + 1)  # keys before `band` are beyond the window for every query here
        far = q_out[..., qs:qe, :] @ k_out[..., :qe, :].transpose(-1, -2)
        near = q_in[..., qs:qe, :] @ k_in[..., band:qe, :].transpose(-1, -2)
        dist = (pos[qs:qe, None] - pos[None, band:qe])
        far[..., band:] = torch.where(dist < window, near, far[..., band:])
        s = far * scale + causal_tile(bias, qs, qe, qe, q.device, far.dtype)
        out.append(torch.softmax(s, dim=-1).to(v.dtype) @ v[..., :qe, :])
    return torch.cat(out, dim=-2)
