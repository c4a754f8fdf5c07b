"""Local and global layers: sliding-window and chunked attention on any scheme, and the patterns that ship them.

Any part of a layer's spec may set that layer's attention span (``posenc.encodings.registry.LAYER_OPTIONS``):

- ``window=W``: a sliding window, query i sees the keys j with i - W < j <= i (transformers' ``sliding_window``;
  Gemma 3's local layers, Mistral);
- ``chunk=C``: chunked attention, query i sees the keys j <= i of its own chunk, floor(i / C) == floor(j / C)
  (Llama 4's ``attention_chunk_size`` on its RoPE layers).

Both count tokens of the sequence (each row's own from its first token in a left-padded batch), never position
ids, and apply to the layer's whole attention (``posenc.attention.Window``): ``rope:rope_theta=10000,window=1024``,
``alibi:window=64``, ``rope:chunk=8192+forget``. A decoding cache keeps the last W - 1 (C - 1) keys of such a layer
(``posenc.layer.LayerCache``). A scheme that replaces attention with its own softmax (``learned-sinks``, the
length-scaled schemes, PaTH, ReRoPE, ...) and an additive input embedding refuse them in one line, unless its
``attend`` applies the window itself (``Encoding.attends_window``: ``fope``, ``selective``).

The named per-layer patterns (``gemma3``, ``rnope-swa``, ``irope-shipped``) take ``window=`` / ``chunk=`` for the
entries that set one: ``gemma3:window=64`` (``posenc.encodings.registry.layer_pattern``).
"""

from __future__ import annotations

from typing import Any

from posenc.attention import Window
from posenc.encodings.base import Encoding
from posenc.encodings.registry import LAYER_OPTIONS, alias
from posenc.errors import PosencError


def window_of(spec: str, options: dict[str, Any]) -> Window | None:
    """The Window that ``options`` (the ``LAYER_OPTIONS`` a part of ``spec`` sets) give, None for none;
    PosencError (one line) naming the spec for both, or a value that is not an integer from 1 to 2^63 - 1."""
    if not options:
        return None
    if len(options) > 1:
        raise PosencError(f"scheme {spec!r}: give window or chunk, not both (a layer has one attention span)")
    ((key, value),) = options.items()
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2**63:  # compared in int64
        raise PosencError(f"scheme {spec!r}: {key}={value!r}: must be an integer from 1 to 2^63 - 1 (tokens)")
    return Window(value, chunked=key == "chunk")


def check_window(enc: Encoding, spec: str) -> None:
    """PosencError (one line) where ``enc``'s window cannot apply: the scheme replaces attention (its ``attend``
    runs in place of the core's path, which applies the window, and takes none: ``mla`` too, whose attend calls the
    core's attention without one) or is an additive input embedding."""
    if enc.window is None:
        return
    key = "chunk" if enc.window.chunked else "window"
    if enc.additive:
        raise PosencError(
            f"scheme {spec!r}: {key} applies to an attention layer; {enc.name!r} is an additive input embedding"
        )
    if enc.replaces_attention and not enc.attends_window:  # its attend() runs in place of the core's path
        name = next(
            p.name for p in getattr(enc, "parts", [enc]) if p.replaces_attention
        )  # a composite's attending part
        raise PosencError(
            f"scheme {spec!r}: {key} is not supported on {name!r}, which replaces attention (its own "
            f"attend(), which takes no {key}); a {key} applies to schemes that attend through posenc's core"
        )


def _repeat(entry: str, n: int) -> list[str]:
    return [entry] * n


# Gemma 3 (Gemma Team 2025, arXiv:2503.19786, sec. 2): 5 local layers (sliding window 1,024, RoPE base 10K) per
# global layer (RoPE base 1M); transformers' Gemma3TextConfig: layer_types, sliding_window, rope_local_base_freq.
# The 4B-27B models scale the global layers' RoPE only (rope_scaling linear, factor 8; the 1B none): gemma3:factor=8
alias(
    "gemma3",
    "|".join(_repeat("rope:rope_theta=10000,window=1024", 5) + ["rope:rope_theta=1000000,factor=1"]),
    "Gemma 3's local/global layers: 5 sliding-window RoPE layers (base 10K) per global RoPE layer (base 1M); "
    "gemma3:window=W sets the window, gemma3:factor=8 the global layers' linear RoPE scaling (Gemma 3 4B-27B)",
    source="Gemma Team 2025, arXiv:2503.19786, sec. 2 (Gemma 3)",
    takes=("factor",),
)
# RNoPE-SWA (Yang et al. 2025, arXiv:2501.18795; Cohere Command A): RoPE layers with a sliding window, every fourth
# layer global NoPE
alias(
    "rnope-swa",
    "|".join(_repeat("rope:window=4096", 3) + ["nope"]),
    "RNoPE-SWA (Cohere): 3 sliding-window RoPE layers (4,096) per global NoPE layer; "
    "rnope-swa:window=W sets the window",
    source="Yang et al. 2025 (Cohere), arXiv:2501.18795 (RNoPE-SWA)",
)
# Llama 4 as shipped (transformers models/llama4): layers i with (i + 1) % 4 == 0 are NoPE with attention-temperature
# tuning over every key; the others RoPE (base 500K, Meta's interleaved pairs) in chunks of attention_chunk_size 8,192
alias(
    "irope-shipped",
    "|".join(_repeat("rope:rope_theta=500000,pairing=adjacent,chunk=8192", 3) + ["llama4-temp"]),
    "Llama 4's iRoPE as shipped: 3 chunked RoPE layers (chunks of 8,192, base 500K) per global NoPE layer with "
    "attention-temperature tuning; irope-shipped:chunk=C sets the chunk",
    source="Meta Llama 4 (transformers models/llama4)",
)

__all__ = ["LAYER_OPTIONS", "check_window", "window_of"]
