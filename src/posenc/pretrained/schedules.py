"""The RoPE context-extension schedules of a Hugging Face model, as settings: :class:`Extension` and its parameters.

A schedule is a ``posenc.rope`` schedule (none, pi, ntk, dynamic, yarn, llama3,
longrope, rerope, leaky-rerope: formulas, defaults and sources there). This module
only validates a setting against the model's native context L0
(:func:`extension_params`); :class:`posenc.pretrained.adaptation.Adaptation` puts it
into a model, and :mod:`posenc.pretrained.rerope` is ReRoPE's attention function.
"""

from __future__ import annotations

import dataclasses

from posenc import rope
from posenc.errors import PosencError

WINDOW_DIVISOR = 4  # ReRoPE's window when none is given: L0 // WINDOW_DIVISOR tokens


@dataclasses.dataclass(frozen=True)
class Extension:
    """One context-extension setting.

    ``schedule``: a ``posenc.rope`` schedule name; ``factor`` s >= 1; ``window`` w (tokens) and
    ``leak`` k (Su's k > 1) only for the ReRoPE schedules (``None``: w = L0/4, k = (s L0 - w)/(L0 - w),
    so that the largest relative position at s L0 is L0); ``short_factor``, ``long_factor`` (D/2
    numbers each, a model's searched lists) only for ``longrope``, which needs them.
    """

    schedule: str
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


def extension_params(ext: Extension, l0: int) -> dict:
    """The validated ``posenc.rope`` parameters of ``ext`` for native context ``l0``.

    Raises PosencError for an unknown or renamed schedule, factor < 1, a window < 1,
    k <= 1, a default k with s = 1 or w >= L0, or longrope without valid factor lists.
    """
    name = rope.check_name(ext.schedule)
    if ext.factor < 1:
        raise PosencError(f"scale factor must be >= 1, got {ext.factor}")
    if name == "none":
        return {}
    if name in rope.SHIPPED:
        lists = {"short_factor": ext.short_factor, "long_factor": ext.long_factor}
        return rope.schedule_params(name, l0, {"factor": float(ext.factor), **{k: v and list(v) for k, v in lists.items()}})
    if name not in rope.RELATIVE:
        return rope.schedule_params(name, l0, {"factor": float(ext.factor)})
    w = ext.window or l0 // WINDOW_DIVISOR
    given = {"window": w}
    if name == "leaky-rerope":
        if ext.leak is None and not (w < l0 and ext.factor > 1):  # else the default k would be <= 1
            raise PosencError(f"leaky-rerope's default k = (s L0 - w)/(L0 - w) needs factor s > 1 and window {w} "
                              f"< L0 = {l0}; give --leak k > 1")
        given["leak"] = ext.leak if ext.leak is not None else (ext.factor * l0 - w) / (l0 - w)
    return rope.schedule_params(name, l0, given)
