"""The RoPE context-extension schedules of a Hugging Face model, as settings: :class:`Extension` and its parameters.

A schedule is a ``posenc.rope`` schedule (none, pi, ntk, dynamic, yarn, llama3,
longrope, rerope, leaky-rerope: formulas, defaults and sources there). This module
only validates a setting against the model's native context L0
(:func:`extension_params`); :class:`posenc.hf.adaptation.Adaptation` puts it
into a model, and :mod:`posenc.hf.rerope` is ReRoPE's attention function.
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

    ``original_max_position_embeddings``: L0 in tokens for every schedule (None: the model's native context,
    ``native_context``), e.g. 32,768 for a Qwen3-style config that has only ``max_position_embeddings`` 40,960.
    The schedule parameters of ``posenc.rope`` (defaults and meaning there; None: that default), each refused
    (PosencError) by a schedule that does not take it: ``attention_factor`` (> 0; yarn, longrope),
    ``beta_fast``, ``beta_slow`` (rotations per L0, beta_fast > beta_slow > 0; yarn), ``truncate`` (yarn),
    ``low_freq_factor``, ``high_freq_factor`` (wavelength bands L0 / factor, high > low > 0; llama3),
    ``mscale``, ``mscale_all_dim`` (DeepSeek's YaRN, both > 0 and together, not with ``attention_factor``: attention
    factor (0.1 mscale ln s + 1) / (0.1 mscale_all_dim ln s + 1), ``posenc.rope.schedules.yarn_factor``; yarn).
    """

    schedule: str
    factor: float = 2.0
    window: int | None = None
    leak: float | None = None
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None
    original_max_position_embeddings: int | None = None
    attention_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    truncate: bool | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None


# schedule parameters refused where not taken
TUNED = (
    "attention_factor",
    "beta_fast",
    "beta_slow",
    "truncate",
    "low_freq_factor",
    "high_freq_factor",
    "mscale",
    "mscale_all_dim",
)


def native_context(config) -> int:
    """The pretraining context L0 (``original_max_position_embeddings`` if set)."""
    params = config.rope_parameters or {}
    return int(params.get("original_max_position_embeddings") or config.max_position_embeddings)


def head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def original_length(ext: Extension, native: int) -> int:
    """L0 of ``ext`` in tokens: its ``original_max_position_embeddings``, else ``native``.
    PosencError unless an integer >= 2."""
    l0 = native if ext.original_max_position_embeddings is None else ext.original_max_position_embeddings
    if isinstance(l0, bool) or not isinstance(l0, int) or l0 < 2:
        raise PosencError(f"original_max_position_embeddings (L0) must be an integer >= 2 tokens, got {l0!r}")
    return l0


def extension_params(ext: Extension, l0: int) -> dict:
    """The validated ``posenc.rope`` parameters of ``ext`` for native context ``l0`` (replaced by
    ``ext.original_max_position_embeddings`` when given: :func:`original_length`).

    Raises PosencError for an unknown or renamed schedule, factor < 1, a window < 1 or >= L0,
    k <= 1, a default k with s = 1 or w >= L0, longrope without valid factor lists, an L0 < 2,
    or a ``TUNED`` parameter the schedule does not take or out of its range (``posenc.rope.schedule_params``).
    """
    name = rope.check_name(ext.schedule)
    l0 = original_length(ext, l0)
    if ext.factor < 1:
        raise PosencError(f"scale factor must be >= 1, got {ext.factor}")
    given = {k: getattr(ext, k) for k in TUNED if getattr(ext, k) is not None}
    if name == "none":
        return rope.schedule_params(name, l0, given)
    if name in rope.SHIPPED:
        lists = {"short_factor": ext.short_factor, "long_factor": ext.long_factor}
        return rope.schedule_params(
            name, l0, {"factor": float(ext.factor), **given, **{k: v and list(v) for k, v in lists.items()}}
        )
    if name not in rope.RELATIVE:
        return rope.schedule_params(name, l0, {"factor": float(ext.factor), **given})
    w = ext.window if ext.window is not None else l0 // WINDOW_DIVISOR  # 0 is refused below, not the default
    if w >= l0:  # within the window positions stay exact: past L0 untrained, and below it plain RoPE
        raise PosencError(
            f"{name} window {w} must be below the native context L0 = {l0} (ReRoPE keeps exact positions "
            "within it: a window past L0 reads untrained ones, and at every length up to it ReRoPE is plain RoPE)"
        )
    given["window"] = w
    if name == "leaky-rerope":
        if ext.leak is None and not (w < l0 and ext.factor > 1):  # else the default k would be <= 1
            raise PosencError(
                f"leaky-rerope's default k = (s L0 - w)/(L0 - w) needs factor s > 1 and window {w} "
                f"< L0 = {l0}; give --leak k > 1"
            )
        given["leak"] = ext.leak if ext.leak is not None else (ext.factor * l0 - w) / (l0 - w)
    return rope.schedule_params(name, l0, given)
