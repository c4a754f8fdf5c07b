"""Context-extension methods for a loaded Hugging Face RoPE model.

Each method is a RoPE configuration (transformers' ``rope_parameters``, read by
the rotary embedding; frequencies from
``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS``) or, for ReRoPE, an
attention function. With scale factor s, native context L0, head dim d, base b:

- ``none``: plain RoPE, omega_i = b^(-2i/d).
- ``pi``: position interpolation, omega_i / s (Chen et al. 2023, eq. 2); ``linear``.
- ``ntk``: NTK-aware static base b * s^(d/(d-2)) (bloc97 2023); ``default`` with a new base.
- ``dynamic``: dynamic NTK, base b * (s L/L0 - (s-1))^(d/(d-2)) at length L > L0 (emozilla 2023).
- ``yarn``: NTK-by-parts + attention temperature (Peng et al. 2023, sec. 3.2-3.4):
  omega_i unchanged where r_i = L0 omega_i / (2 pi) > beta_fast = 32, omega_i / s where
  r_i < beta_slow = 1; cos and sin scaled by 0.1 ln s + 1 (logits by its square).
  Between, transformers (like the authors' code) ramps linearly in the dimension
  index i (i.e. in log r) between the integer indices bracketing r = 32 and r = 1;
  the paper's eq. 18 writes the ramp linear in r itself. Same end points, different
  weights in between; posenc keeps transformers' (the published YaRN figures use it).
- ``llama3``: Llama 3.1 bands, wavelengths < L0/4 unchanged, > L0 divided by s, smooth between.
- ``rerope`` / ``leaky_rerope``: relative positions clamped at a window (Su 2023), see
  :mod:`posenc.pretrained.rerope`.
"""

from __future__ import annotations

import dataclasses
import hashlib

import torch

from posenc.errors import PosencError
from posenc.pretrained import rerope

METHODS = ("none", "pi", "ntk", "dynamic", "yarn", "llama3", "rerope", "leaky_rerope")


@dataclasses.dataclass(frozen=True)
class Extension:
    """One context-extension setting.

    ``factor`` s >= 1; ``window`` w (tokens) and ``leaky_k`` k only for the ReRoPE
    methods (``None``: w = L0/4, k = (s L0 - w)/(L0 - w), so that the largest
    relative position at s L0 is L0).
    """

    method: str
    factor: float = 2.0
    window: int | None = None
    leaky_k: float | None = None


def native_context(config) -> int:
    """The pretraining context L0 (``original_max_position_embeddings`` if set)."""
    params = config.rope_parameters or {}
    return int(params.get("original_max_position_embeddings") or config.max_position_embeddings)


def head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rerope_params(ext: Extension, l0: int) -> tuple[int, float]:
    """(window w, leak) for a ReRoPE method; leak = 0 for ReRoPE, 1/k for leaky."""
    w = ext.window or l0 // 4
    if w < 1:
        raise PosencError(f"ReRoPE window must be >= 1 token, got {w}")
    if ext.method == "rerope":
        return w, 0.0
    if ext.leaky_k is None and w >= l0:
        raise PosencError(f"leaky ReRoPE window {w} must be below the native context {l0} (or give --leaky-k)")
    k = ext.leaky_k or max(1.0, (ext.factor * l0 - w) / (l0 - w))
    if k < 1:
        raise PosencError(f"leaky ReRoPE k must be >= 1, got {k}")
    return w, 1.0 / k


def rope_parameters(ext: Extension, base_params: dict, config) -> dict:
    """The ``rope_parameters`` dict for ``ext`` given the model's original ones."""
    theta = float(base_params["rope_theta"])
    s, l0, d = float(ext.factor), native_context(config), head_dim(config)
    common = {"rope_theta": theta}
    if ext.method in ("none", "rerope", "leaky_rerope"):
        return {"rope_type": "default", **common}
    if ext.method == "pi":
        return {"rope_type": "linear", "factor": s, **common}
    if ext.method == "ntk":
        return {"rope_type": "default", "rope_theta": theta * s ** (d / (d - 2))}
    if ext.method == "dynamic":
        return {"rope_type": "dynamic", "factor": s, **common}
    if ext.method == "yarn":
        return {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": l0,
                "beta_fast": 32.0, "beta_slow": 1.0, **common}
    if ext.method == "llama3":
        return {"rope_type": "llama3", "factor": s, "original_max_position_embeddings": l0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0, **common}
    raise PosencError(f"unknown method {ext.method!r} (choose from {', '.join(METHODS)})")


def apply_method(model, ext: Extension) -> None:
    """Configure ``model`` (a loaded Llama-family causal LM) for ``ext``, in place.

    Sets ``config.rope_parameters`` and rebuilds ``model.model.rotary_emb`` from it
    (the only module that reads it), so ``rotary_emb.inv_freq`` and
    ``attention_scaling`` are the method's. The original RoPE parameters are kept
    in ``model.posenc_base_rope`` so methods can be switched repeatedly.
    Raises PosencError for factor < 1 or an unknown method.
    """
    if ext.factor < 1:
        raise PosencError(f"scale factor must be >= 1, got {ext.factor}")
    if ext.method not in METHODS:
        raise PosencError(f"unknown method {ext.method!r} (choose from {', '.join(METHODS)})")
    config = model.config
    if not hasattr(model, "posenc_base_rope"):
        model.posenc_base_rope = dict(config.rope_parameters)
        model.posenc_rotary_cls = type(model.model.rotary_emb)
        model.posenc_attn = config._attn_implementation
    config.rope_parameters = rope_parameters(ext, model.posenc_base_rope, config)
    rotary = model.posenc_rotary_cls(config=config)
    if ext.method in ("rerope", "leaky_rerope"):
        window, leak = rerope_params(ext, native_context(config))
        rerope.install(model, rotary.inv_freq, window, leak)
    else:
        model.model.rotary_emb = rotary
        model.set_attn_implementation(model.posenc_attn)
    model.posenc_extension = ext


def reset_rotary(model) -> None:
    """Rebuild the rotary embedding from the config: clears dynamic NTK's cached
    frequencies, which otherwise leak from a longer forward into a shorter one."""
    if type(model.model.rotary_emb) is model.posenc_rotary_cls:
        model.model.rotary_emb = model.posenc_rotary_cls(config=model.config)


def signature(model, length: int) -> str:
    """Hash of everything that decides a forward of ``length`` tokens: effective
    frequencies, attention scaling and attention path. Equal signatures give equal
    outputs (e.g. dynamic NTK at L <= L0 equals ``none``; ReRoPE with w >= L too)."""
    reset_rotary(model)
    rot = model.model.rotary_emb
    rot(torch.zeros(1), torch.tensor([[length - 1]]))  # dynamic NTK updates here
    h = hashlib.sha256(rot.inv_freq.float().numpy().tobytes())
    h.update(repr(float(rot.attention_scaling)).encode())
    rr = getattr(model.model.layers[0].self_attn, "rerope", None)
    if model.config._attn_implementation == rerope.ATTN_NAME and rr[1] < length:
        h.update(repr(rr[1:]).encode())
    reset_rotary(model)
    return h.hexdigest()[:16]
