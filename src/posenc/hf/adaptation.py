"""One loaded Hugging Face RoPE model and posenc's change to it: a RoPE schedule, ReRoPE, or a posenc scheme.

:class:`Adaptation` records the model's native RoPE parameters, rotary embedding type and attention
implementation once, puts one adaptation in at a time (:meth:`~Adaptation.set_schedule`,
:meth:`~Adaptation.set_scheme`; each first undoes the previous one, :meth:`~Adaptation.restore`)
and owns what it added: forward pre-hook handles, the ReRoPE setting, the scheme
(``posenc.hf.scheme.Scheme``), the weights' label. :meth:`~Adaptation.key`, the signature under which
``posenc extend`` reuses scores, is computed from that state alone, so no mutation can leave it stale.

What stays on transformers objects, because transformers reads it there: ``config.rope_parameters``
and the rotary embedding ``model.model.rotary_emb`` built from a copy of the config with them (the
frequencies; the copy, ``rotary_emb.config``, also holds the attributes transformers reads a schedule
parameter from, ``posenc.hf.rope_parameters.hf_config_attributes``: dynamic NTK's L0 as ``max_position_embeddings``,
while the model's own stays its generation limit), the attention implementation, and a scheme's
``self_attn.posenc`` submodules (their parameters train, save and move with the model's).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import math
import warnings

import torch

from posenc import methods, rope
from posenc.encodings.base import keeping_precision
from posenc.errors import PosencError
from posenc.hf import long_context, rerope
from posenc.hf import scheme as hf
from posenc.hf.loading import check_rope
from posenc.hf.rope_parameters import hf_config_attributes, hf_rope_parameters
from posenc.hf.schedules import Extension, extension_params, head_dim, native_context, original_length

# the schedules whose frequencies transformers picks per forward from the largest position + 1:
# (name, what is picked, what keys cached before a later forward keep)
SWITCHES = {
    "dynamic": ("dynamic NTK", "its base", "the base of the step that cached them"),
    "longrope": ("LongRoPE", "its factor list", "the short factors up to L0"),
}


class Adaptation:
    """A loaded Llama-family causal LM (``model``) and the one adaptation posenc put into it.

    ``extension``: the RoPE schedule set (``Extension("none")`` when native); ``rerope``: (inv_freq (D/2,),
    window, leak) while (leaky) ReRoPE is set, else None; ``scheme``: the ``posenc.hf.scheme.Scheme`` in attention,
    else None; ``method``: the long-context method (``posenc.methods.Method``) on top of the schedule, else None;
    ``weights``: what changed the weights since loading (set it after training: it enters
    :meth:`key`), else None; ``l0``: the native context. Creating it changes nothing in the model; PosencError
    for a model posenc cannot extend (``posenc.hf.loading.check_rope``: not a Llama-family full-RoPE model) or whose
    rotary embedding is already swapped (``posenc.hf.scheme.apply_scheme`` ran on it): its native RoPE is not there
    to record.
    """

    def __init__(self, model):
        check_rope(model, type(model).__name__)
        if isinstance(model.model.rotary_emb, rerope.IdentityRotary):
            raise PosencError(
                "the model's rotary embedding is already swapped (a posenc scheme or ReRoPE): "
                "adapt it from its native state (Scheme.remove first)"
            )
        config = model.config
        self.model = model
        self.l0 = native_context(config)
        self._rope = dict(config.rope_parameters)
        self._rotary_type = type(model.model.rotary_emb)
        self._attn = config._attn_implementation
        self._hooks: list = []
        self.extension = Extension("none")
        self.rerope: tuple | None = None
        self.scheme: hf.Scheme | None = None
        self.method: methods.Method | None = None
        self.weights: str | None = None

    @property
    def full_forward(self) -> bool:
        """Whether generation must run without the KV cache (a scheme that replaces attention: every query is
        needed)."""
        return self.scheme is not None and self.scheme.full_forward

    def restore(self) -> None:
        """Undo the adaptation: the native RoPE parameters, rotary embedding and attention, no posenc hook or
        submodule (logits equal the loaded model's bit for bit). ``weights`` is kept: training is not undone."""
        if self.scheme is not None:
            self.scheme.remove()
        for handle in self._hooks:
            handle.remove()
        self._hooks, self.rerope, self.scheme, self.method, self.extension = [], None, None, None, Extension("none")
        self.model.config.rope_parameters = dict(self._rope)
        self.model.model.rotary_emb = self._rotary_type(config=self.model.config)
        self.model.set_attn_implementation(self._attn)

    def set_schedule(self, ext: Extension) -> None:
        """Set the RoPE schedule ``ext`` in place of the current adaptation.

        Sets ``config.rope_parameters`` and rebuilds ``model.model.rotary_emb`` from it (the only
        module that reads it), so ``rotary_emb.inv_freq`` and ``attention_scaling`` are the
        schedule's at every length, equal to ``posenc.rope.SCHEDULES`` with L0 = :attr:`l0` (tested against
        transformers' own rotary embedding for the same L0); the ReRoPE schedules become an attention
        function (:mod:`posenc.hf.rerope`).

        Padded batches (``attention_mask`` with zeros) score each row as its unpadded run
        (tested for every schedule), except dynamic NTK and LongRoPE past L0, which transformers
        computes with one base or factor list for the whole batch: refused (PosencError). Both
        warn once when decoded with the KV cache past L0 (:func:`_length_switch`).
        L0 is ``ext.original_max_position_embeddings`` when given, else :attr:`l0`; a ``factor`` other than the
        config's ``max_position_embeddings`` / L0 (where they differ) warns once (:func:`_check_factor`).
        Raises PosencError as ``extension_params``, before the model changes.
        """
        params = extension_params(ext, self.l0)
        _check_factor(params, self.model.config.max_position_embeddings, original_length(ext, self.l0))
        self.restore()
        config = self.model.config
        config.rope_parameters = hf_rope_parameters(
            ext.schedule, params, float(self._rope["rope_theta"]), head_dim(config)
        )
        rotary = self._rotary(hf_config_attributes(ext.schedule, params))
        if ext.schedule in SWITCHES:  # transformers switches their frequencies with the length, past L0
            hook = functools.partial(_length_switch, ext.schedule, params["original_max_position_embeddings"])
            self._hooks.append(self.model.model.register_forward_pre_hook(hook, with_kwargs=True))
        if ext.schedule in rope.RELATIVE:
            self.rerope = (
                rotary.inv_freq,
                int(params["window"]),
                None if params.get("leak") is None else float(params["leak"]),
            )
            self._hooks += rerope.install(self.model, self.rerope)
        else:
            self.model.model.rotary_emb = rotary
        self.extension = ext

    def set_method(self, spec: str) -> methods.Method:
        """Put long-context method ``spec`` (``posenc.methods.parse``, defaults from L0 = :attr:`l0`: Self-Extend's
        window L0 // 2, LM-Infinite's L0) on top of the current schedule (native RoPE, or one :meth:`set_schedule`
        set: call it first, it undoes the method); returns the method. Its attention is
        :mod:`posenc.hf.long_context` (KV-cache decoding exact). Raises PosencError (one line), before the
        model changes, for a bad spec, a method already set, a posenc scheme, ReRoPE, a schedule
        whose frequencies switch with the length (dynamic NTK, LongRoPE), or exact positions past what the model
        reaches (``posenc.methods.check_reach``: L0, times a fixed-frequency schedule's factor)."""
        method = methods.parse(spec, self.l0)
        if (
            self.method is not None
            or self.scheme is not None
            or self.rerope is not None
            or self.extension.schedule in SWITCHES
        ):
            now = (
                f"method {self.method.label()}"
                if self.method
                else f"scheme {self.scheme.spec}"
                if self.scheme
                else f"schedule {self.extension.schedule}"
            )
            raise PosencError(
                f"method {method.name} applies to native RoPE or a fixed-frequency schedule (pi, ntk, yarn, "
                f"llama3); the model has {now}"
            )
        factor = self.extension.factor if self.extension.schedule != "none" else 1  # the positions the model reaches
        methods.check_reach(method, original_length(self.extension, self.l0), factor)
        if (
            self.extension.schedule == "none"
        ):  # float32 frequencies also after a cast of the model (bf16: 40 rad off at 32K)
            self.model.model.rotary_emb = self._rotary({})
        self._hooks += long_context.install(self.model, method)
        self.method = method
        return method

    def _rotary(self, attributes: dict):
        """A rotary embedding of the model's type built from a copy of its config with ``attributes`` set: transformers
        reads them from the config it was given, and the model's own keep their other uses (generate's length limit).
        Its frequencies stay float32 under a cast of the model (``posenc.encodings.base.KeepsPrecision``): in bf16
        transformers' ``inv_freq`` is 3.5e-3 off, 40 rad of phase at position 32,768."""
        config = copy.deepcopy(self.model.config)
        for name, value in attributes.items():
            setattr(config, name, value)
        return keeping_precision(self._rotary_type)(config=config)

    def set_scheme(self, spec: str) -> None:
        """Put posenc scheme ``spec`` into the native model's attention in place of the current adaptation
        (``posenc.hf.scheme.apply_scheme``: its behaviour and errors)."""
        self.restore()
        self.scheme = hf.apply_scheme(self.model, spec)

    def reset_rotary(self) -> None:
        """Rebuild the rotary embedding from the config: clears dynamic NTK's cached
        frequencies, which otherwise leak from a longer forward into a shorter one."""
        rot = self.model.model.rotary_emb
        if not isinstance(rot, rerope.IdentityRotary):
            self.model.model.rotary_emb = type(rot)(config=rot.config)

    def key(self, length: int) -> str:
        """Hash (16 hex digits) of everything that decides a forward of ``length`` tokens: effective frequencies,
        attention scaling, the ReRoPE window where it acts, the scheme, the weights' label and their dtype when
        not float32. Equal keys give equal outputs (e.g. dynamic NTK at L <= L0 equals ``none``; ReRoPE with
        w >= L too)."""
        self.reset_rotary()
        rot = self.model.model.rotary_emb
        rot(torch.zeros(1), torch.tensor([[length - 1]]))  # dynamic NTK updates here
        h = hashlib.sha256(rot.inv_freq.float().numpy().tobytes())
        h.update(repr(float(rot.attention_scaling)).encode())
        if self.rerope is not None and self.rerope[1] < length:
            h.update(repr(self.rerope[1:]).encode())
        if self.scheme is not None:
            h.update(b"scheme:" + self.scheme.spec.encode())
        if self.method is not None:
            h.update(b"method:" + self.method.label().encode())
        if self.weights:
            h.update(b"weights:" + self.weights.encode())
        dtype = self.model.get_input_embeddings().weight.dtype
        if dtype != torch.float32:  # float32 keeps the keys of the records made before other dtypes
            h.update(b"dtype:" + str(dtype).encode())
        self.reset_rotary()
        return h.hexdigest()[:16]


def _check_factor(params: dict, max_positions: int, l0: int) -> None:
    """A one-line warning (once per setting: Python's warnings filter) when schedule parameters ``params`` have a
    ``factor`` s other than ``max_positions / l0`` while the two lengths differ: the config says the model was
    extended by that ratio (transformers derives yarn's and longrope's factor from it when none is given)."""
    ratio = max_positions / l0
    if "factor" in params and max_positions != l0 and not math.isclose(params["factor"], ratio):
        warnings.warn(
            f"factor {params['factor']:g} differs from the model's max_position_embeddings / L0 = "
            f"{max_positions} / {l0} = {ratio:g}: the schedule scales by {params['factor']:g}, "
            "not by the config's ratio",
            stacklevel=2,
        )


def _length_switch(schedule: str, l0: int, module, args, kwargs):
    """Forward pre-hook on the decoder (``model.model``) while dynamic NTK or LongRoPE is set: transformers
    picks their frequencies once per forward, from the batch's largest position + 1, so a padded batch of
    more than L0 positions would score its shorter rows otherwise than alone (PosencError). It rotates each
    key once, when it is cached: decoding with the KV cache past L0 keeps the cached keys at the frequencies
    of their step while the new query takes the current ones, so logits differ from a full forward of the
    same tokens (a one-line warning, once)."""
    ids = kwargs.get("input_ids")
    ids = ids if ids is not None else kwargs.get("inputs_embeds", args[0] if args else None)
    if ids is None:
        return
    label, picked, kept = SWITCHES[schedule]
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    total = ids.shape[1] + (cache.get_seq_length() if cache is not None else 0)
    mask = kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and not bool(mask.all()) and total > l0:
        raise PosencError(
            f"{label} takes {picked} for a padded batch from its longest row: past L0 = {l0} positions its "
            "shorter rows would score otherwise than alone; run rows of different lengths one at a time"
        )
    if total > ids.shape[1] and total > l0:
        warnings.warn(
            f"{label} decoded with the KV cache past L0 = {l0}: cached keys keep {kept}, so logits differ "
            "from a full forward (generate(..., use_cache=False) is exact)",
            stacklevel=2,
        )
