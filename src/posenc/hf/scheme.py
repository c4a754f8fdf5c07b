"""Any posenc scheme inside a Hugging Face Llama-family model, through transformers' own attention interface.

:func:`apply_scheme` keeps every weight of the model and changes only how
attention sees positions: the rotary embedding becomes the identity
(``posenc.hf.rerope.IdentityRotary``: q and k reach attention, and the
KV cache, unrotated), each layer's ``self_attn`` gets the scheme as a submodule
``posenc`` (built for the model's heads, head dim and ``rope_theta``), and
:func:`attention_forward`, registered in ``AttentionInterface`` as ``"posenc"``,
evaluates the scheme's hooks and calls the posenc attention core
(``posenc.layer.attend``: GQA key/value heads repeated, the model's softmax
scaling kept). No modelling code is copied: projections, norms, MLPs and the
cache are the model's. The :class:`Scheme` it returns owns what it added and
replaced (:meth:`Scheme.remove` undoes it); ``posenc.hf.adaptation``
swaps schemes and RoPE schedules on one model.

Decoding state: a scheme's hooks are recomputed over the whole prefix at every
step from each position's normalised layer input x, so x is decoding state
beside the keys and values. It lives in transformers' ``Cache``, never on the
model: each layer entry of a ``DynamicCache`` (the default cache of ``generate``
and of ``model(..., use_cache=True)``) becomes a :func:`cache_layer_type`, a
``DynamicLayer`` that keeps x with its keys and values and reorders, crops,
selects, repeats and resets it with them (beam search, assisted decoding, a new
sequence). Two caches never share state, so a forward of another sequence
between two decoding steps changes nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from posenc import encodings
from posenc.encodings.base import Dims, Encoding
from posenc.errors import PosencError
from posenc.hf.loading import check_rope
from posenc.hf.rerope import IdentityRotary, install_attention
from posenc.hf.schedules import head_dim, native_context
from posenc.layer import attend, prepare

ATTN_NAME = "posenc"


@dataclasses.dataclass
class Scheme:
    """Scheme ``spec`` in ``model``'s attention (:func:`apply_scheme`) and what it replaced: the rotary embedding
    ``rotary``, the attention implementation ``attn``, and the forward pre-hook handles it added (``hooks``).
    ``full_forward``: it replaces attention, so generation runs without the KV cache."""

    model: object
    spec: str
    full_forward: bool
    rotary: object
    attn: str
    hooks: list

    def remove(self) -> None:
        """Undo :func:`apply_scheme`: the hooks and each layer's ``self_attn.posenc`` go, the rotary embedding and
        attention implementation come back."""
        for handle in self.hooks:
            handle.remove()
        for layer in self.model.model.layers:
            del layer.self_attn.posenc
        self.model.model.rotary_emb = self.rotary
        self.model.set_attn_implementation(self.attn)


def apply_scheme(model, spec: str) -> Scheme:
    """Replace the RoPE attention of ``model`` (a transformers Llama-family causal LM) with scheme ``spec``, in place.

    Every layer gets ``self_attn.posenc``, the scheme built for the model's query
    heads, head dim, hidden size, vocabulary, native context (train length) and
    layer index, with the model's ``rope_theta`` for every part that takes one and
    does not set it. Learned parts are new parameters of the model (trained with
    it), started neutral where the scheme allows (``Encoding.neutral_init``:
    learned steps W = 0, forget gate f ~ 1). What happens to the pretrained behaviour:

    - ``rope`` (the model's ``rope_theta``, half pairing): identical logits
      (tested: within float32 rounding of the angles);
    - ``acc-learned-qk:center=rope`` at W = 0: RoPE shifted by one step, identical at start
      (the Q/K/V variant also rotates values: a change);
    - every other family (random or learned accumulated steps, ALiBi, forget
      gates, NoPE, PaTH, ...) changes what attention sees: the model must be
      fine-tuned to recover its quality.

    Inputs must be unpadded batches starting at position 0 (an ``attention_mask`` with zeros
    raises PosencError; positions are 0..T-1; key positions come from the cache length); cached
    decoding takes transformers' ``DynamicCache`` (the default; another cache type, or one holding
    positions this model did not decode, raises PosencError); token ids
    are not available to attention, so per-token-id schemes (``acc-token-*``) are refused;
    schemes that replace attention (xPos, PoPE, PaTH, CoPE, DAPE) need every query, so
    decoding them with the model's KV cache raises PosencError (full forwards work; such a
    scheme has ``full_forward`` True, and ``posenc extend`` generates passkeys without the cache).
    Returns the :class:`Scheme`. Raises PosencError for a model that is not a plain full-RoPE
    Llama-family decoder or already has a scheme, an invalid spec, a '|' pattern of more entries than the model has
    layers (``posenc.encodings.check_layer_count``), an additive scheme, or one that needs token ids; the model's
    check comes first (``posenc.hf.loading.check_rope``: another architecture is named with those posenc supports).
    """
    check_rope(model, type(model).__name__)
    if isinstance(model.model.rotary_emb, IdentityRotary):
        raise PosencError(
            "the model's rotary embedding is already swapped (a posenc scheme or ReRoPE): "
            "remove that first (Scheme.remove, or posenc.hf.adaptation.Adaptation)"
        )
    param = next(model.parameters())
    schemes = layer_schemes(model, spec)
    for layer, enc in zip(model.model.layers, schemes):
        # a submodule, not adaptation state: its parameters train, save and move with the model's (eval: fixed draws)
        layer.self_attn.posenc = enc.to(device=param.device, dtype=param.dtype).train(model.training)
    rotary, implementation = model.model.rotary_emb, model.config._attn_implementation
    hooks = [model.model.register_forward_pre_hook(_refuse_padding, with_kwargs=True)]
    # no mask: a scheme refuses padding, and its attention builds its own causal mask
    hooks += install_attention(
        model, ATTN_NAME, attention_forward, rotary.inv_freq, functools.partial(_decoding_state, spec), mask=False
    )
    return Scheme(model, spec, any(enc.replaces_attention for enc in schemes), rotary, implementation, hooks)


def layer_schemes(model, spec: str) -> list[Encoding]:
    """Scheme ``spec`` built for each layer of ``model`` (sizes, native context, ``rope_theta``), learned parts
    neutral; the model is not changed. Raises PosencError as :func:`apply_scheme`."""
    check_rope(model, type(model).__name__)
    encodings.check_layer_count(spec, len(model.model.layers))
    config = model.config
    theta = float(config.rope_parameters["rope_theta"])
    out = []
    for i in range(len(model.model.layers)):
        dims = Dims(
            config.num_attention_heads,
            head_dim(config),
            config.hidden_size,
            config.vocab_size,
            native_context(config),
            i,
        )
        enc = encodings.get(spec, dims, defaults={"rope_theta": theta})
        _check_scheme(enc, spec)
        for part in enc.modules():
            if isinstance(part, Encoding):
                part.neutral_init()
        out.append(enc)
    return out


# a SmolLM2-135M layer: the shape a spec is checked on before the model loads (sizes are checked again on the model)
STAND_IN = Dims(n_head=9, head_dim=64, d_model=576, vocab_size=49152, train_length=8192)


def check_spec(spec: str) -> None:
    """What :func:`layer_schemes` refuses that needs no model: names, parameters and their values, an additive or
    token-id scheme, each distinct layer entry built on a stand-in layer (``STAND_IN``). PosencError (one line);
    the layer count and the sizes are checked once the model is loaded."""
    for i in range(len(encodings.layer_pattern(spec))):
        _check_scheme(encodings.get(spec, dataclasses.replace(STAND_IN, layer_index=i)), spec)


def _check_scheme(enc: Encoding, spec: str) -> None:
    if enc.additive:
        raise PosencError(f"{spec!r} is an additive input embedding; apply_scheme replaces attention only")
    if any(getattr(m, "uses_tokens", False) for m in enc.modules()):
        raise PosencError(f"{spec!r} reads token ids, which a Hugging Face attention layer does not receive")


def _refuse_padding(module, args, kwargs):
    """Forward pre-hook on the decoder: posenc's attention reads positions 0..T-1 of every row, so a padded
    batch (zeros in ``attention_mask``) would be scored wrongly; refuse it instead."""
    mask = kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and not bool(mask.all()):
        raise PosencError(
            "a model with a posenc scheme takes unpadded batches (attention_mask has zeros): "
            "run rows of different lengths one at a time"
        )


@functools.cache
def cache_layer_type():
    """The cache layer of a model with a posenc scheme: transformers' ``DynamicLayer`` (keys, values
    (B, Hkv, T, D)) that also holds ``x`` (B, T, hidden), every cached position's normalised layer input
    in the model's dtype (None while empty), and applies each of the cache's operations (reorder for beam
    search, crop, batch select and repeat, reset, offload) to x as to the keys. Built on first use:
    transformers is an optional dependency."""
    from transformers.cache_utils import DynamicLayer

    class PosencLayer(DynamicLayer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.x: torch.Tensor | None = None

        def reset(self) -> None:
            super().reset()
            self.x = None

        def crop(self, tokens_to_remove: int) -> None:
            super().crop(tokens_to_remove)  # raises for the legacy positive form, as for the keys
            if tokens_to_remove and self.x is not None:
                self.x = self.x[:, : -abs(tokens_to_remove)]

        def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
            super().reorder_cache(beam_idx)
            if self.x is not None:
                self.x = self.x.index_select(0, beam_idx.to(self.x.device))

        def batch_repeat_interleave(self, repeats: int) -> None:
            super().batch_repeat_interleave(repeats)
            if self.x is not None:
                self.x = self.x.repeat_interleave(repeats, dim=0)

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            super().batch_select_indices(indices)
            if self.x is not None:
                self.x = self.x[indices, ...]

        def offload(self):
            super().offload()
            if self.x is not None:
                self.x = self.x.to("cpu", non_blocking=True)

        def prefetch(self):
            super().prefetch()
            if self.x is not None:
                self.x = self.x.to(self.device, non_blocking=True)

    return PosencLayer


def _cache_layer(cache, layer_idx: int):
    """Entry ``layer_idx`` of ``cache`` as a :func:`cache_layer_type`: an empty ``DynamicLayer`` (or a
    lazily grown cache's missing entry) is replaced by one. PosencError for another cache type or an
    entry that already holds positions without posenc's state (filled before ``apply_scheme``)."""
    from transformers.cache_utils import DynamicLayer

    kind, layers = cache_layer_type(), getattr(cache, "layers", None)
    if (
        layers is not None
        and len(layers) <= layer_idx
        and getattr(cache, "layer_class_to_replicate", None) is DynamicLayer
    ):
        layers.extend(kind() for _ in range(layer_idx + 1 - len(layers)))  # what Cache.update would append
    entry = layers[layer_idx] if layers is not None and layer_idx < len(layers) else None
    if isinstance(entry, kind):
        return entry
    if type(entry) is not DynamicLayer:
        raise PosencError(
            f"a model with a posenc scheme decodes with transformers' DynamicCache (the default); got "
            f"{type(cache).__name__}{f' with {type(entry).__name__} layers' if entry is not None else ''}"
        )
    if entry.get_seq_length():
        raise PosencError(
            f"the KV cache holds {entry.get_seq_length()} positions this posenc model did not decode "
            "(filled before apply_scheme?): start from an empty cache"
        )
    layers[layer_idx] = kind()
    return layers[layer_idx]


def _decoding_state(spec: str, module, args, kwargs):
    """Forward pre-hook on ``self_attn`` (transformers hands the layer's extra keyword arguments to the attention
    function): gives :func:`attention_forward` this call's normalised layer input (B, Tq, hidden) as ``posenc_x``,
    the layer's cache entry (None without a cache) as ``posenc_layer`` and the scheme's spec as ``posenc_spec``."""
    new = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    layer = None if cache is None else _cache_layer(cache, module.layer_idx)
    return args, {**kwargs, "posenc_x": new, "posenc_layer": layer, "posenc_spec": spec}


def _layer_input(new: torch.Tensor, layer, n_keys: int) -> torch.Tensor:
    """The inputs x (B, n_keys, hidden) of all n_keys positions: the cache entry's, then this call's rows
    ``new``; the entry keeps them (no graph) for the next step."""
    old = None if layer is None else layer.x
    have = 0 if old is None else old.shape[1]
    if have + new.shape[1] != n_keys or (old is not None and old.shape[0] != new.shape[0]):
        raise PosencError(
            f"posenc attention got {n_keys} keys for {new.shape[1]} new positions and {have} cached inputs "
            "(a KV cache changed outside transformers' Cache methods?)"
        )
    x = new if old is None else torch.cat((old.to(new.device), new), dim=1)  # an offloaded cache keeps x on the CPU
    if layer is not None:
        layer.x = x.detach()
    return x


def attention_forward(
    module,
    query,
    key,
    value,
    attention_mask,
    scaling: float,
    dropout: float = 0.0,
    position_ids: torch.Tensor | None = None,
    posenc_x: torch.Tensor | None = None,
    posenc_layer=None,
    posenc_spec: str = "",
    **kwargs,
):
    """transformers ``AttentionInterface`` entry: query (B, H, Tq, D), key, value (B, Hkv, T, D) unrotated
    -> ((B, Tq, H, D), None). The queries are the last Tq of the T positions 0..T-1; ``posenc_x``,
    ``posenc_layer`` and ``posenc_spec`` come from the pre-hook :func:`_decoding_state`."""
    n_keys = key.shape[-2]
    if module.posenc.replaces_attention and query.shape[-2] != n_keys:
        raise PosencError(
            f"{posenc_spec!r} replaces attention and needs every query: "
            "decode without the KV cache (generate(..., use_cache=False))"
        )
    x = _layer_input(posenc_x, posenc_layer, n_keys)
    prepared = prepare(module.posenc, x)  # positions 0..T-1
    scale = prepared.logit_scale * scaling * math.sqrt(query.shape[-1])  # the model's softmax scale, not 1/sqrt(D)
    out = attend(query, key, value, dataclasses.replace(prepared, logit_scale=scale))
    return out.transpose(1, 2).contiguous(), None
