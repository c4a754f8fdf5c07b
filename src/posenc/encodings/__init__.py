"""Registry of positional schemes: ``get(spec, dims)`` builds one for an attention layer.

A spec is one or more parts joined by ``+``, each ``NAME`` or
``NAME:key=value[,key=value]`` (``posenc.encodings.registry``): e.g.
``acc-rand-qkv:a=0.3+alibi``. Parts combine one per hook: phases from the
rotary part, biases added (``posenc.encodings.composite``). Specs joined by
``|`` are a per-layer pattern repeated over the layers (``rope|rope|rope|nope``,
alias ``irope``): layer i gets entry i mod n. Schemes defined outside posenc come in
as plugins (entry points ``posenc.schemes``, ``POSENC_IMPORT``, ``import_schemes``:
``posenc.encodings.registry``).
"""

from __future__ import annotations

from typing import Any

import torch

from posenc.encodings import (  # noqa: F401 (registers the families)
    absolute,
    accumulated,
    bias,
    cope,
    dape,
    fire,
    fope,
    forget,
    hope,
    householder,
    lengthscale,
    mla,
    polar,
    prope,
    relative,
    rotary,
    selective,
    sinks,
    stickbreaking,
    windows,
    xpos,
)
from posenc.encodings.base import Dims, Encoding, Inputs
from posenc.encodings.composite import Composite
from posenc.encodings.registry import (
    LAYER_OPTIONS,
    Parameter,
    _accepted,
    alias,
    alias_of,
    canonical,
    catalogue,
    check_layer_count,
    check_types,
    constructor_defaults,
    format_part,
    import_schemes,
    layer_pattern,
    names,
    parameters,
    parts,
    plugin_modules,
    plugin_sources,
    register,
    resolve,
    split_part,
    unregister,
)
from posenc.errors import PosencError


def _build(
    cls: type[Encoding],
    params: dict[str, Any],
    dims: Dims,
    spec: str,
    defaults: dict[str, Any] | None = None,
    label: str | None = None,
) -> Encoding:
    """One part of ``spec``; its errors name ``label`` (default ``spec``): what the user wrote."""
    label = label or spec
    options = {k: v for k, v in params.items() if k in LAYER_OPTIONS}  # the layer's span, not the constructor's
    window = windows.window_of(label, options)
    params = {k: v for k, v in params.items() if k not in LAYER_OPTIONS}
    ignored = cls.applies_to({**constructor_defaults(cls), **params})  # a default is for the parts it applies to
    params = {**{k: v for k, v in (defaults or {}).items() if k in _accepted(cls) and k not in ignored}, **params}
    check_types(label, cls, params)  # parameters given in Python too, not only in the spec
    try:
        enc = cls(dims, **params)  # invalid values are PosencErrors; anything else is a bug: its traceback
    except PosencError as exc:  # name the whole spec: the part alone is ambiguous in a composition or a sweep
        raise PosencError(f"scheme {label!r}: {exc}") from None
    enc.window = window
    enc.spec = format_part(cls.name, {**{k: v for k, v in params.items() if k not in cls.internal}, **options})
    return enc


def get(spec: str, dims: Dims | None = None, defaults: dict[str, Any] | None = None, **params: Any) -> Encoding:
    """Build scheme ``spec`` for one attention layer (``dims.layer_index`` picks a pattern's entry).

    ``dims`` defaults to a small layer (4 heads of 32, vocab 256, length 128);
    ``params`` apply to a single-part spec (for a composition or a pattern give
    them in the spec, per part); ``defaults`` go to every part that takes them and
    does not set them (a pretrained model's ``rope_theta``). Raises PosencError for an unknown name, an
    unknown parameter, an invalid value, or an additive embedding in a pattern; a pattern's every entry is checked,
    not only the one this layer takes; an error in an entry of a named
    pattern names the pattern as given (``gemma3:window=0``), not its expansion; also for a spec that is not a str
    or ``dims`` that are not a :class:`Dims`.
    """
    dims = Dims(n_head=4, head_dim=32, d_model=128, vocab_size=256, train_length=128) if dims is None else dims
    if not isinstance(dims, Dims):
        raise PosencError(f"dims must be a posenc.encodings.Dims (the layer's sizes), got {type(dims).__name__}")
    pattern = layer_pattern(spec)
    if len(pattern) > 1:
        return _layer_of(pattern, spec, dims, params, defaults)
    return _get(spec, dims, defaults, params, spec)


def _get(spec: str, dims: Dims, defaults: dict[str, Any] | None, params: dict[str, Any], label: str) -> Encoding:
    """``get`` of one layer's spec (no pattern), its errors naming ``label``."""
    resolved = parts(spec)
    if len(resolved) == 1:
        cls, merged = resolve(spec, params)  # Python parameters are checked as the spec's are
        clash = sorted(set(params) & set(split_part(spec)[1]))
        if clash:
            raise PosencError(
                f"{spec!r}: parameter {', '.join(map(repr, clash))} given both in the spec and separately"
            )
        enc = _build(cls, merged, dims, spec, defaults, label)
    else:
        if params:
            raise PosencError(f"{spec!r} is a composition: give parameters per part (NAME:key=value)")
        enc = Composite(dims, [_build(c, p, dims, spec, defaults, label) for c, p in resolved], spec)
        spans = [part.window for part in enc.parts if isinstance(part, Encoding) and part.window is not None]
        if len(spans) > 1:
            raise PosencError(f"scheme {label!r}: give window or chunk on one part only (they set the whole layer's)")
        enc.window = spans[0] if spans else None
        for part in enc.parts:  # an attending part that applies the window itself reads the layer's
            if isinstance(part, Encoding) and part.attends_window:
                part.window = enc.window
    windows.check_window(enc, label)
    return enc


def _layer_of(pattern: list[str], spec: str, dims: Dims, params: dict, defaults: dict[str, Any] | None) -> Encoding:
    if params:
        raise PosencError(f"{spec!r} is a per-layer pattern: give parameters per entry (NAME:key=value)")
    if any(cls.additive for entry in pattern for cls, _ in parts(entry)):  # also checks every entry's names
        raise PosencError(
            f"{spec!r}: additive embeddings act at the input, not per layer; they cannot be in a '|' pattern"
        )
    chosen = pattern[dims.layer_index % len(pattern)]
    built = None
    for entry in dict.fromkeys(pattern):  # every entry is checked, whichever layer this is (gemma3:factor=0)
        # a written pattern's entry is what the user wrote; a named pattern's (gemma3) is its expansion: name it
        label = entry if "|" in spec else spec
        if entry == chosen:
            built = _get(entry, dims, defaults, {}, label)
        else:  # built to check it only: the random state (the model's initial weights) as if it had not been
            with torch.random.fork_rng(devices=[]):
                _get(entry, dims, defaults, {}, label)
    assert built is not None  # the chosen entry is one of the pattern's
    return built


def is_additive(spec: str) -> bool:
    """Whether ``spec`` is an additive input embedding (``Encoding.additive``: it acts at the model input, not in
    attention), from its classes without building it. PosencError for an invalid spec."""
    return any(cls.additive for entry in layer_pattern(spec) for cls, _ in parts(entry))


def describe(spec: str, dims: Dims | None = None, **params: Any) -> str:
    """One line for reports: the scheme and its parameters; a pattern as its entries joined by ' | '."""
    pattern = layer_pattern(spec)
    if len(pattern) == 1:
        return _described(get(spec, dims, **params))
    return "per layer, repeating: " + " | ".join(_described(get(entry, dims)) for entry in pattern)


def _described(enc: Encoding) -> str:
    """``enc.describe()``, with its layer's window or chunks when it has one (a scheme's own describe omits it)."""
    return enc.describe() + ("" if enc.window is None else f" within {enc.window.describe()}")


__all__ = [
    "is_additive",
    "Dims",
    "Encoding",
    "Inputs",
    "Parameter",
    "alias",
    "alias_of",
    "canonical",
    "catalogue",
    "check_layer_count",
    "describe",
    "get",
    "import_schemes",
    "layer_pattern",
    "names",
    "parameters",
    "parts",
    "plugin_modules",
    "plugin_sources",
    "register",
    "resolve",
    "unregister",
]
