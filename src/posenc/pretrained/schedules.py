"""Context-extension methods for a loaded Hugging Face RoPE model: the adapter to ``posenc.rope``.

A method is a ``posenc.rope`` schedule (none, pi, ntk, dynamic, yarn, llama3,
longrope, rerope, leaky-rerope: formulas, defaults and sources there). The frequency
schedules become transformers' ``rope_parameters`` (``posenc.rope.hf``), read by
the model's rotary embedding through ``ROPE_INIT_FUNCTIONS``; ReRoPE becomes an
attention function: :func:`install` swaps the rotary embedding for one that
returns ``cos = 1, sin = 0`` (so attention receives unrotated q and k, and the KV
cache stores unrotated keys, as ReRoPE decoding needs) and registers
:func:`attention_forward` (``posenc.rope.rerope_attention``) in transformers'
``AttentionInterface``. Works for models whose attention rotates q/k with
``apply_rotary_pos_emb`` from ``model.model.rotary_emb`` and then calls the
attention interface (Llama, Mistral, Qwen2/3, SmolLM, ...), with the half-split
(``rotate_half``) pairing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import warnings

import torch
from torch import nn

from posenc import rope
from posenc.errors import PosencError

METHODS = rope.NAMES
ATTN_NAME = "posenc_rerope"


@dataclasses.dataclass(frozen=True)
class Extension:
    """One context-extension setting.

    ``factor`` s >= 1; ``window`` w (tokens) and ``leak`` k (Su's k > 1) only for the
    ReRoPE methods (``None``: w = L0/4, k = (s L0 - w)/(L0 - w), so that the largest
    relative position at s L0 is L0); ``short_factor``, ``long_factor`` (D/2 numbers
    each, a model's searched lists) only for ``longrope``, which needs them.
    """

    method: str
    factor: float = 2.0
    window: int | None = None
    leak: float | None = None
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None


def native_context(config) -> int:
    """The pretraining context L0 (``original_max_position_embeddings`` if set)."""
    params = config.rope_parameters or {}
    return int(params.get("original_max_position_embeddings") or config.max_position_embeddings)


def head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def method_params(ext: Extension, l0: int) -> dict:
    """The validated ``posenc.rope`` parameters of ``ext`` for native context ``l0``.

    Raises PosencError for an unknown or renamed method, factor < 1, a window < 1,
    k <= 1, a default k with s = 1 or w >= L0, or longrope without valid factor lists.
    """
    name = rope.check_name(ext.method)
    if ext.factor < 1:
        raise PosencError(f"scale factor must be >= 1, got {ext.factor}")
    if name == "none":
        return {}
    if name in rope.SHIPPED:
        lists = {"short_factor": ext.short_factor, "long_factor": ext.long_factor}
        return rope.schedule_params(name, l0, {"factor": float(ext.factor), **{k: v and list(v) for k, v in lists.items()}})
    if name not in rope.RELATIVE:
        return rope.schedule_params(name, l0, {"factor": float(ext.factor)})
    w = ext.window or l0 // 4
    given = {"window": w}
    if name == "leaky-rerope":
        if ext.leak is None and not (w < l0 and ext.factor > 1):  # else the default k would be <= 1
            raise PosencError(f"leaky-rerope's default k = (s L0 - w)/(L0 - w) needs factor s > 1 and window {w} "
                              f"< L0 = {l0}; give --leak k > 1")
        given["leak"] = ext.leak if ext.leak is not None else (ext.factor * l0 - w) / (l0 - w)
    return rope.schedule_params(name, l0, given)


def apply_method(model, ext: Extension) -> None:
    """Configure ``model`` (a loaded Llama-family causal LM) for ``ext``, in place.

    Sets ``config.rope_parameters`` and rebuilds ``model.model.rotary_emb`` from it
    (the only module that reads it), so ``rotary_emb.inv_freq`` and
    ``attention_scaling`` are the method's. The original RoPE parameters are kept
    in ``model.posenc_base_rope`` (and L0 in ``posenc_l0``) so methods can be switched
    repeatedly.

    Padded batches (``attention_mask`` with zeros) score each row as its unpadded run
    (tested for every method), except dynamic NTK and LongRoPE past L0, which transformers
    computes with one base or factor list for the whole batch: refused (PosencError). Both
    warn once when decoded with the KV cache past L0 (:func:`_length_switch`).
    Raises PosencError as :func:`method_params`.
    """
    config = model.config
    if not hasattr(model, "posenc_base_rope"):
        model.posenc_base_rope, model.posenc_l0 = dict(config.rope_parameters), native_context(config)
        model.posenc_rotary_cls = type(model.model.rotary_emb)
        model.posenc_attn = config._attn_implementation
    params = method_params(ext, model.posenc_l0)
    theta = float(model.posenc_base_rope["rope_theta"])
    config.rope_parameters = rope.hf_rope_parameters(ext.method, params, theta, head_dim(config))
    rotary = model.posenc_rotary_cls(config=config)
    # where transformers switches frequencies with the length: dynamic NTK past max_position_embeddings
    # (its original_max_seq_len), LongRoPE past original_max_position_embeddings
    l0 = rotary.original_max_seq_len if ext.method == "dynamic" else params.get("original_max_position_embeddings")
    model.model.posenc_switch = (ext.method, l0) if ext.method in _SWITCHES else None
    if not hasattr(model.model, "posenc_switch_hook"):
        model.model.posenc_switch_hook = model.model.register_forward_pre_hook(_length_switch, with_kwargs=True)
    if ext.method in rope.RELATIVE:
        install(model, rotary.inv_freq, params["window"], params.get("leak"))
    else:
        model.model.rotary_emb = rotary
        model.set_attn_implementation(model.posenc_attn)
    model.posenc_extension = ext


# the schedules whose frequencies transformers picks per forward from the largest position + 1:
# (name, what is picked, what keys cached before a later forward keep)
_SWITCHES = {"dynamic": ("dynamic NTK", "its base", "the base of the step that cached them"),
             "longrope": ("LongRoPE", "its factor list", "the short factors up to L0")}


def _length_switch(module, args, kwargs):
    """Forward pre-hook on the decoder (``model.model``), active while dynamic NTK or LongRoPE is
    set (``module.posenc_switch`` = (method, L0)). transformers picks their frequencies once per
    forward, from the batch's largest position + 1: a padded batch of more than L0 positions
    would score its shorter rows otherwise than alone (PosencError). It rotates each key once,
    when it is cached: decoding with the KV cache past L0 keeps the cached keys at the
    frequencies of their step while the new query takes the current ones, so logits differ
    from a full forward of the same tokens (a one-line warning, once)."""
    ids = kwargs.get("input_ids")
    ids = ids if ids is not None else kwargs.get("inputs_embeds", args[0] if args else None)
    if module.posenc_switch is None or ids is None:
        return
    (method, l0), cache = module.posenc_switch, kwargs.get("cache", kwargs.get("past_key_values"))
    label, picked, kept = _SWITCHES[method]
    total = ids.shape[1] + (cache.get_seq_length() if cache is not None else 0)
    mask = kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and not bool(mask.all()) and total > l0:
        raise PosencError(f"{label} takes {picked} for a padded batch from its longest row: past L0 = {l0} positions its "
                          "shorter rows would score otherwise than alone; run rows of different lengths one at a time")
    if total > ids.shape[1] and total > l0:
        warnings.warn(f"{label} decoded with the KV cache past L0 = {l0}: cached keys keep {kept}, so logits differ "
                      "from a full forward (generate(..., use_cache=False) is exact)")


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
    if model.config._attn_implementation == ATTN_NAME and rr[1] < length:
        h.update(repr(rr[1:]).encode())
    if getattr(model, "posenc_scheme", None):  # a posenc scheme in attention (posenc.hf.apply_scheme)
        h.update(b"scheme:" + model.posenc_scheme.encode())
    if getattr(model, "posenc_weights", None):  # weights changed since loading (posenc.finetune)
        h.update(b"weights:" + model.posenc_weights.encode())
    reset_rotary(model)
    return h.hexdigest()[:16]


class IdentityRotary(nn.Module):
    """Stands in for ``model.model.rotary_emb``: cos = 1, sin = 0 (no rotation).

    Keeps the real frequencies as ``inv_freq`` (D/2,) and ``attention_scaling``
    (1.0) so they can be read back like any transformers rotary embedding.
    """

    def __init__(self, inv_freq: torch.Tensor):
        super().__init__()
        self.register_buffer("inv_freq", inv_freq.clone(), persistent=False)
        self.attention_scaling = 1.0

    def forward(self, x, position_ids):
        shape = (*position_ids.shape, 2 * self.inv_freq.shape[0])
        return torch.ones(shape, dtype=x.dtype, device=x.device), torch.zeros(shape, dtype=x.dtype, device=x.device)


def attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """transformers ``AttentionInterface`` entry: (B, H, Tq, D) -> ((B, Tq, H, D), None).

    Reads ``module.rerope = (inv_freq, window, leak)`` set by :func:`install`; q, k, v
    at float32 or better. Positions are the key indices 0..Tk-1, the queries the last
    Tq (``position_ids`` unused): (leaky) ReRoPE depends only on i - j, so with the pads
    masked a left-padded row scores as its unpadded run. ``attention_mask``: transformers'
    boolean (B, 1, Tq, Tk) mask (True: attend), built for padded batches only, or None.
    Raises PosencError for another mask type (a float 4D mask passed by hand).
    """
    inv_freq, window, leak = module.rerope
    dtype = torch.promote_types(query.dtype, torch.float32)
    bias = None if attention_mask is None else _mask_bias(attention_mask, key.shape[-2] - query.shape[-2], dtype)
    out = rope.rerope_attention(query.to(dtype), key.to(dtype), value.to(dtype), inv_freq, window, leak,
                                bias=bias, scale=scaling)
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def _mask_bias(mask: torch.Tensor, first: int, dtype: torch.dtype):
    """``posenc.attention.BiasFn`` of a boolean mask (B, 1, Tq, Tk) whose row 0 is query position ``first``:
    tiles (B, 1, q1 - q0, k1 - k0) of 0 where the query attends and the dtype's lowest finite value elsewhere
    (finite: a pad query with no key to attend stays finite, and every real query's weight on a pad is 0)."""
    if mask.dtype != torch.bool:
        raise PosencError(f"ReRoPE attention takes transformers' boolean attention mask, got a {mask.dtype} mask")
    low = torch.finfo(dtype).min

    def tile(q0: int, q1: int, k0: int, k1: int) -> torch.Tensor:
        keep = mask[:, :, q0 - first : q1 - first, k0:k1]
        return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill_(~keep, low)

    return tile


def install(model, inv_freq: torch.Tensor, window: int, leak: float | None) -> None:
    """Switch a Llama-family model to (leaky) ReRoPE attention in place.

    ``inv_freq`` (D/2,) are the unscaled RoPE frequencies; ``window`` w (tokens);
    ``leak`` None (ReRoPE) or Su's k > 1. Undone by rebuilding ``model.model.rotary_emb``
    and setting the attention implementation back (:func:`apply_method` does).
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN_NAME, attention_forward)
    AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)  # else a custom attention gets no mask: padding ignored
    model.model.rotary_emb = IdentityRotary(inv_freq)
    for layer in model.model.layers:
        layer.self_attn.rerope = (inv_freq, int(window), None if leak is None else float(leak))
    model.set_attn_implementation(ATTN_NAME)
