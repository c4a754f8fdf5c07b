"""(Leaky) ReRoPE inside a Hugging Face Llama-family model: the rotary embedding as the identity and an attention
function.

:func:`install` swaps ``model.model.rotary_emb`` for :class:`IdentityRotary` (``cos = 1, sin = 0``:
attention receives unrotated q and k, and the KV cache stores unrotated keys, as ReRoPE decoding
needs), registers :func:`attention_forward` (``posenc.rope.rerope_attention``) in transformers'
``AttentionInterface`` and hands it the setting through a forward pre-hook on each ``self_attn``.
Works for models whose attention rotates q/k with ``apply_rotary_pos_emb`` from
``model.model.rotary_emb`` and then calls the attention interface (Llama, Mistral, Qwen2/3,
SmolLM, ...), with the half-split (``rotate_half``) pairing.
"""

from __future__ import annotations

import functools

import torch

from posenc import rope
from posenc.attention import Bias
from posenc.encodings.base import KeepsPrecision
from posenc.errors import PosencError

ATTN_NAME = "posenc_rerope"


class IdentityRotary(KeepsPrecision):
    """Stands in for ``model.model.rotary_emb``: cos = 1, sin = 0 (no rotation).

    Keeps the real frequencies as ``inv_freq`` (D/2,) float32+, also under a cast of the model, and
    ``attention_scaling`` (1.0) so they can be read back like any transformers rotary embedding.
    """

    def __init__(self, inv_freq: torch.Tensor):
        super().__init__()
        self.register_buffer("inv_freq", inv_freq.clone(), persistent=False)
        self.attention_scaling = 1.0

    def forward(self, x, position_ids):
        shape = (*position_ids.shape, 2 * self.inv_freq.shape[0])
        return torch.ones(shape, dtype=x.dtype, device=x.device), torch.zeros(shape, dtype=x.dtype, device=x.device)


def attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, rerope=None, **kwargs):
    """transformers ``AttentionInterface`` entry: (B, H, Tq, D) -> ((B, Tq, H, D), None).

    ``rerope`` = (inv_freq (D/2,), window, leak), passed by :func:`install`'s pre-hook; q, k, v
    at float32 or better. Positions are the key indices 0..Tk-1, the queries the last
    Tq (``position_ids`` unused): (leaky) ReRoPE depends only on i - j, so with the pads
    masked a left-padded row scores as its unpadded run. ``attention_mask``: transformers'
    boolean (B, 1, Tq, Tk) mask (True: attend), built for padded batches only, or None.
    Raises PosencError for another mask type (a float 4D mask passed by hand).
    """
    inv_freq, window, leak = rerope
    dtype = torch.promote_types(query.dtype, torch.float32)
    bias = None if attention_mask is None else _mask_bias(attention_mask, key.shape[-2] - query.shape[-2], dtype)
    out = rope.rerope_attention(
        query.to(dtype), key.to(dtype), value.to(dtype), inv_freq, window, leak, bias=bias, scale=scaling
    )
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def _mask_bias(mask: torch.Tensor, first: int, dtype: torch.dtype):
    """``posenc.attention.Bias`` of a boolean mask (B, 1, Tq, Tk) whose row 0 is query position ``first``:
    tiles (B, 1, q1 - q0, k1 - k0) of 0 where the query attends and the dtype's lowest finite value elsewhere
    (finite: a pad query with no key to attend stays finite, and every real query's weight on a pad is 0)."""
    if mask.dtype != torch.bool:
        raise PosencError(f"ReRoPE attention takes transformers' boolean attention mask, got a {mask.dtype} mask")
    low = torch.finfo(dtype).min

    def tile(q0: int, q1: int, k0: int, k1: int) -> torch.Tensor:
        keep = mask[:, :, q0 - first : q1 - first, k0:k1]
        return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill_(~keep, low)

    return Bias(tile)


def pass_setting(name: str, setting: tuple, module, args, kwargs):
    """Forward pre-hook on ``self_attn`` (bind ``name``, ``setting`` with functools.partial): transformers hands the
    layer's extra keyword arguments to the attention function, here ``name=setting``."""
    return args, {**kwargs, name: setting}


def install_attention(model, name: str, forward, inv_freq: torch.Tensor, hook, mask: bool = True) -> list:
    """The one way posenc puts its own attention into a Llama-family model: register ``forward`` as transformers'
    attention function ``name`` (with ``mask``, transformers' SDPA mask under the same name too: a custom attention
    otherwise gets no mask and padding passes unseen), replace ``model.model.rotary_emb`` by
    ``IdentityRotary(inv_freq)`` (the attention rotates by itself), add ``hook`` as a forward pre-hook (with kwargs)
    on every layer's ``self_attn`` and switch the model to ``name``. Returns the hook handles."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, forward)
    if mask:
        AttentionMaskInterface.register(name, sdpa_mask)
    model.model.rotary_emb = IdentityRotary(inv_freq)
    handles = [layer.self_attn.register_forward_pre_hook(hook, with_kwargs=True) for layer in model.model.layers]
    model.set_attn_implementation(name)
    return handles


def install(model, setting: tuple) -> list:
    """Switch a Llama-family model to (leaky) ReRoPE attention in place; returns the hook handles it registered.

    ``setting`` = (inv_freq (D/2,) the unscaled RoPE frequencies, window w (tokens), leak None (ReRoPE)
    or Su's k > 1). Undone by removing the hooks, rebuilding ``model.model.rotary_emb`` and setting the
    attention implementation back (``Adaptation.restore`` does).
    """
    hook = functools.partial(pass_setting, "rerope", setting)
    return install_attention(model, ATTN_NAME, attention_forward, setting[0], hook)
