"""A schedule as Hugging Face transformers' ``rope_parameters`` (read by ``ROPE_INIT_FUNCTIONS``).

Pure data, no transformers import: ``posenc.pretrained.schedules`` applies the
result to a loaded model. The frequencies transformers computes from it equal
``posenc.rope.SCHEDULES[name]`` for the same parameters (tested), with one
difference of transformers itself: its ``dynamic`` reads L0 from the config's
``max_position_embeddings``, not from ``original_max_position_embeddings``.
The mapping is each schedule's ``Schedule.hf``: ReRoPE keeps plain frequencies (its
attention is ``posenc.rope.rerope``); NTK-aware is ``default`` with the base ``ntk_base``
(transformers has no static NTK type).
LongRoPE always passes ``factor``, so transformers does not derive it from
``max_position_embeddings / original_max_position_embeddings`` (Phi-3's configs, which
leave it unset, are the same schedule with ``factor`` = that ratio).
"""

from __future__ import annotations

from posenc.rope.schedules import SCHEDULES


def hf_rope_parameters(name: str, params: dict, rope_theta: float, head_dim: int) -> dict:
    """transformers ``rope_parameters`` for schedule ``name`` (its record's ``hf``) with validated ``params``
    (``posenc.rope.schedule_params``), base ``rope_theta`` and head dim D; unset optional
    parameters (``attention_factor=None``) are left to transformers' defaults. PosencError for parameters
    that do not fit D (LongRoPE factor lists of another length than D/2: transformers would only log a warning)."""
    schedule = SCHEDULES[name]
    schedule.check_head_dim(params, head_dim)
    hf = schedule.hf
    theta = hf.base(rope_theta, params, head_dim) if hf.base else rope_theta
    return {"rope_type": hf.rope_type, "rope_theta": theta, **{k: params[k] for k in hf.keys if params[k] is not None}}
