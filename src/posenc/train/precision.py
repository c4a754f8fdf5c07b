"""The forward's compute dtype (``train.precision``): "bf16" runs it under bfloat16 autocast with float32 master weights
and optimizer state (phases, their cos/sin, gates and cumulative sums stay float32+:
``posenc.attention.rotation_dtype``), "fp32" without autocast, and "auto" picks bf16 where the device has bf16 matrix
units (``posenc.store.stamp.bf16_native``, the rule pretrained models' ``--dtype auto`` follows too), else fp32."""

from __future__ import annotations

import contextlib
from typing import Literal

import torch

from posenc.store.stamp import bf16_native
from posenc.train import distributed
from posenc.train.settings import Precision, TrainConfig


def resolve_precision(precision: Precision, device: torch.device) -> Literal["bf16", "fp32"]:
    """The compute dtype a run uses: "auto" is "bf16" where ``device`` has bf16 matrix units
    (``posenc.store.stamp.bf16_native``: CUDA, AMX, AVX512-BF16), else "fp32"; the others as given."""
    if precision != "auto":
        return precision
    return "bf16" if bf16_native(device) else "fp32"


def machine_precision(tcfg: TrainConfig) -> Literal["bf16", "fp32"]:
    """The precision ``tcfg`` resolves to on this machine's default device (a job runs on it)."""
    return resolve_precision(tcfg.precision, distributed.default_device())


def unrecorded_precision() -> Literal["bf16", "fp32"]:
    """The precision of a run whose ``config.json`` or ``preset.json`` records no ``train.precision``, on this machine:
    bf16 autocast on CUDA, fp32 on CPU (what such a run trained with)."""
    return "bf16" if distributed.default_device().type == "cuda" else "fp32"


def autocast(precision: Literal["bf16", "fp32"], device: torch.device) -> contextlib.AbstractContextManager:
    """bfloat16 autocast on ``device`` for "bf16", nothing for "fp32"."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
