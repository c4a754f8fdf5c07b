"""RoPE and its context extensions, one definition for own models and Hugging Face models.

- :mod:`.schedules`: frequencies ``rope_inv_freq``, angle wrapping ``wrap_phases``,
  one record per schedule (``SCHEDULES`` of :class:`Schedule`: none, pi, ntk, dynamic, yarn,
  llama3, longrope, rerope, leaky-rerope) with its defaults, checks, frequency function,
  attention factor and transformers mapping; ``schedule_params`` validates against it.
- :mod:`.rerope`: ReRoPE / leaky ReRoPE attention, blockwise, beside its naive reference.

Users: ``posenc.encodings.rotary.RoPE`` (own models, ``posenc eval --rope-schedule``)
and ``posenc.hf.schedules`` (``posenc extend``; ``posenc.hf.rope_parameters`` turns a schedule's record into
transformers' ``rope_parameters``). Layering: this package
depends only on ``posenc.errors`` and ``posenc.attention``.
"""

from posenc.rope.rerope import rerope_attention
from posenc.rope.schedules import (
    NAMES,
    RELATIVE,
    SCHEDULES,
    SHIPPED,
    Schedule,
    check_name,
    check_window,
    rope_inv_freq,
    schedule_label,
    schedule_params,
    wrap_phases,
)

__all__ = [
    "NAMES",
    "RELATIVE",
    "SCHEDULES",
    "SHIPPED",
    "Schedule",
    "check_name",
    "check_window",
    "rerope_attention",
    "rope_inv_freq",
    "schedule_label",
    "schedule_params",
    "wrap_phases",
]
