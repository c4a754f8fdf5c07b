"""A schedule as Hugging Face transformers' ``rope_parameters`` (read by ``ROPE_INIT_FUNCTIONS``).

Pure data, no transformers import: ``posenc.hf.schedules`` applies the
result to a loaded model. The frequencies transformers computes from it equal
``posenc.rope.SCHEDULES[name]`` for the same parameters (tested at several lengths on
a model whose ``max_position_embeddings`` is not its L0), given the config attributes of
:func:`hf_config_attributes`: transformers' ``dynamic`` reads L0 from the config's
``max_position_embeddings``, not from ``rope_parameters``.
The mapping is each schedule's ``Schedule.hf``: ReRoPE keeps plain frequencies (its
attention is ``posenc.rope.rerope``); NTK-aware is ``default`` with the base ``ntk_base``
(transformers has no static NTK type).
LongRoPE always passes ``factor``, so transformers does not derive it from
``max_position_embeddings / original_max_position_embeddings`` (Phi-3's configs, which
leave it unset, are the same schedule with ``factor`` = that ratio).
"""

from __future__ import annotations

from typing import Any

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


def hf_config_attributes(name: str, params: dict) -> dict[str, Any]:
    """The model-config attributes transformers reads schedule ``name``'s validated ``params`` from, outside
    ``rope_parameters`` (its record's ``hf.config``): ``{"max_position_embeddings": L0}`` for ``dynamic``, whose
    frequency update (``dynamic_rope_update``) takes L0 there; empty for the others."""
    return {attr: params[key] for attr, key in SCHEDULES[name].hf.config}
