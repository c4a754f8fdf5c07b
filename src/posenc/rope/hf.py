"""A schedule as Hugging Face transformers' ``rope_parameters`` (read by ``ROPE_INIT_FUNCTIONS``).

Pure data, no transformers import: ``posenc.pretrained.schedules`` applies the
result to a loaded model. The frequencies transformers computes from it equal
``posenc.rope.SCHEDULES[name]`` for the same parameters (tested), with one
difference of transformers itself: its ``dynamic`` reads L0 from the config's
``max_position_embeddings``, not from ``original_max_position_embeddings``.
ReRoPE keeps plain frequencies (its attention is ``posenc.rope.rerope``); NTK-aware
is ``default`` with the base ``ntk_base`` (transformers has no static NTK type).
LongRoPE always passes ``factor``, so transformers does not derive it from
``max_position_embeddings / original_max_position_embeddings`` (Phi-3's configs, which
leave it unset, are the same schedule with ``factor`` = that ratio).
"""

from __future__ import annotations

from posenc.rope.schedules import longrope_factors, ntk_base

# schedule -> (transformers rope_type, the schedule parameters transformers reads)
HF_TYPES: dict[str, tuple[str, tuple[str, ...]]] = {
    "none": ("default", ()),
    "pi": ("linear", ("factor",)),
    "ntk": ("default", ()),
    "dynamic": ("dynamic", ("factor",)),
    "yarn": ("yarn", ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor", "truncate")),
    "llama3": ("llama3", ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor")),
    "longrope": ("longrope", ("factor", "original_max_position_embeddings", "short_factor", "long_factor", "attention_factor")),
    "rerope": ("default", ()),
    "leaky-rerope": ("default", ()),
}


def hf_rope_parameters(name: str, params: dict, rope_theta: float, head_dim: int) -> dict:
    """transformers ``rope_parameters`` for schedule ``name`` with validated ``params``
    (``posenc.rope.schedule_params``), base ``rope_theta`` and head dim D; unset optional
    parameters (``attention_factor=None``) are left to transformers' defaults. PosencError for LongRoPE
    factor lists of another length than D/2 (transformers would only log a warning)."""
    rope_type, keys = HF_TYPES[name]
    for long in (False, True) if name == "longrope" else ():
        longrope_factors(params, head_dim, long)  # raises for a list of the wrong length
    theta = ntk_base(rope_theta, params["factor"], head_dim) if name == "ntk" else rope_theta
    return {"rope_type": rope_type, "rope_theta": theta, **{k: params[k] for k in keys if params[k] is not None}}
