"""Self-Extend, LM-Infinite, dual-chunk attention and attention sinks inside a Hugging Face Llama-family model
(``posenc generate MODEL --method SPEC``).

:func:`install` does what :mod:`posenc.hf.rerope` does for ReRoPE: it swaps ``model.model.rotary_emb``
for ``rerope.IdentityRotary`` (attention receives unrotated q and k; the KV cache stores unrotated keys), registers
:func:`attention_forward` in transformers' ``AttentionInterface`` and hands it the method and the frequencies
through a forward pre-hook on each ``self_attn``. The attention function is ``posenc.methods.method_attention``
(blockwise: O(block x T) scores in a prefill, never T x T), with the model's RoPE frequencies or a schedule's
(``Adaptation.set_schedule`` first: PI, NTK-aware, YaRN, Llama-3; YaRN's attention factor as its cos/sin scaling).

Decoding with the KV cache is exact for these methods: every key stays cached (none evicts) unrotated, and each
step rotates the new query and all keys at the positions the method assigns (absolute positions 0..Tk-1), so the
cache gives the logits of a full forward (tested against ``generation.greedy_reference``). Attention sinks
decode through the bounded cache of :mod:`posenc.hf.sink_cache` (the evicted keys gone; the full
forward under the sinks mask gives the same logits). Sources: Self-Extend, Jin et al. 2024,
arXiv:2401.01325; LM-Infinite, Han et al. 2023, arXiv:2308.16137; dual-chunk attention, An et al. 2024,
arXiv:2402.17463; attention sinks, Xiao et al. 2024, arXiv:2309.17453 (``posenc.methods``).
"""

from __future__ import annotations

import functools

import torch

from posenc import methods
from posenc.attention import repeat_kv
from posenc.errors import PosencError
from posenc.hf.rerope import IdentityRotary, install_attention, pass_setting

ATTN_NAME = "posenc_method"
SUPPORTED = ("self-extend", "lm-infinite", "dual-chunk", "sinks")


def attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, posenc_method=None, **kwargs):
    """transformers ``AttentionInterface`` entry: q (B, H, Tq, D), k, v (B, Hkv, Tk, D) unrotated
    -> ((B, Tq, H, D), None).

    ``posenc_method`` = (method, inv_freq (D/2,) radians per token, attention_scaling), passed by :func:`install`'s
    pre-hook. Keys are at positions 0..Tk-1, the queries the last Tq (``position_ids`` other than those are refused by
    :func:`install`'s hook on the decoder); grouped keys are
    repeated (``posenc.attention.repeat_kv``); scores are q.k x ``scaling`` x attention_scaling**2 (transformers
    scales cos and sin of both q and k by it), computed at float32 or better, except a bfloat16 model's evaluation
    (``posenc.methods.fast_applies``), whose kernel runs in bfloat16 as its native SDPA attention does (the angles
    float32 in every case; the masked band and the merge float32). ``attention_mask``: None or
    transformers' boolean (B, 1, Tq, Tk) mask; PosencError (one line) unless it is the plain causal mask (a padded
    batch: the methods' positions count from each row's first token, which a left-padded row does not start at),
    and for a layer with a sliding window (``sliding_window`` set: Mistral, Qwen2 with use_sliding_window).
    """
    method, inv_freq, mscale = posenc_method
    tq, tk = query.shape[-2], key.shape[-2]
    if kwargs.get("sliding_window") is not None:  # a sliding-window model (Mistral, Qwen2 with use_sliding_window)
        raise PosencError(
            f"{method.name} on a pretrained model replaces its attention; this model's layers attend "
            f"within a sliding window of {kwargs['sliding_window']} tokens, which it would drop"
        )
    if attention_mask is not None and not _is_causal(attention_mask, tq, tk):
        raise PosencError(
            f"{method.name} on a pretrained model takes unpadded rows only: run rows of different lengths "
            "one at a time (the attention mask hides some keys)"
        )
    k, v = (repeat_kv(t, query.shape[1]) for t in (key, value))
    fast = methods.fast_applies(query, k, v, None)
    dtype = query.dtype if fast else torch.promote_types(query.dtype, torch.float32)
    k, v = k.to(dtype), v.to(dtype)
    pos = torch.arange(tk, device=query.device)
    out = methods.method_attention(
        query.to(dtype), k, v, pos[tk - tq :], pos, method, inv_freq=inv_freq, pairing="half", scale=scaling * mscale**2
    )
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def _is_causal(mask: torch.Tensor, tq: int, tk: int) -> bool:
    """Whether a boolean mask (B, 1, Tq, Tk) whose row 0 is query position tk - tq is the causal mask (j <= i)."""
    if mask.dtype != torch.bool or mask.shape[-2:] != (tq, tk):
        return False
    i = torch.arange(tk - tq, tk, device=mask.device)[:, None]
    return bool((mask == (torch.arange(tk, device=mask.device)[None] <= i)).all())


def _check_positions(method: methods.Method, module, args, kwargs) -> None:
    """Forward pre-hook on the decoder: the method places the T new positions at past..past + T - 1 (past: the
    positions its cache has seen), whatever ``position_ids`` say, so explicit ones that are not those are
    refused (PosencError, one line) rather than ignored."""
    given = kwargs.get("position_ids")
    if given is None:
        return
    cache = kwargs.get("cache", kwargs.get("past_key_values"))  # transformers 5.x names it cache
    past = 0 if cache is None else int(cache.get_seq_length())
    want = torch.arange(past, past + given.shape[-1], device=given.device)
    if not bool((given == want).all()):
        raise PosencError(
            f"{method.name} on a pretrained model places the new tokens at positions "
            f"{past}..{past + given.shape[-1] - 1} in order; explicit position_ids that differ "
            "(gapped, shifted) are not supported: give none"
        )


def check_supported(method: methods.Method) -> None:
    """PosencError (one line) for a method the pretrained attention does not implement."""
    if method.name not in SUPPORTED:
        raise PosencError(
            f"method {method.name} on a pretrained model is not supported (pretrained: {', '.join(SUPPORTED)})"
        )


def install(model, method: methods.Method) -> list:
    """Switch a Llama-family model to ``method``'s attention in place; returns the hook handles it registered.

    The frequencies and attention scaling are read from the model's current rotary embedding (native or a
    schedule's). PosencError (one line), before the model changes, for a method not in SUPPORTED or a rotary embedding
    that is already swapped (ReRoPE, a posenc scheme); afterwards a forward with ``position_ids`` other than the
    positions in order after the cache's raises PosencError (one line): the method assigns positions itself.
    Undone as ReRoPE is (``Adaptation.restore``).
    """
    check_supported(method)
    rotary = model.model.rotary_emb
    if isinstance(rotary, IdentityRotary):
        raise PosencError(
            f"method {method.name} needs the model's rotary embedding; it is swapped (ReRoPE or a posenc scheme)"
        )
    setting = (method, rotary.inv_freq.float().clone(), float(rotary.attention_scaling))
    hook = functools.partial(pass_setting, "posenc_method", setting)
    handles = [model.model.register_forward_pre_hook(functools.partial(_check_positions, method), with_kwargs=True)]
    handles += install_attention(model, ATTN_NAME, attention_forward, setting[1], hook)
    model.model.rotary_emb.attention_scaling = setting[2]  # read back only (Adaptation.key); still cos 1, sin 0
    return handles
