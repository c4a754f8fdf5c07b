"""AdamW over a model's trainable parameters (:func:`make_optimizer`) and its learning rate at each step (:func:`lr_at`:
linear warmup, cosine decay, then the final rate). The rate is a pure function of the step, so a resumed run needs no
scheduler state."""

from __future__ import annotations

import math

import torch

from posenc.train.settings import LoopConfig


def make_optimizer(model: torch.nn.Module, cfg: LoopConfig) -> torch.optim.AdamW:
    """AdamW (betas 0.9, 0.95) over the parameters of ``model`` that require gradients: weight decay on
    matrices, none on vectors and scalars (norms, biases, gates)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    other = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95))


def lr_at(step: int, cfg: LoopConfig) -> float:
    """Linear warmup to ``lr`` then cosine decay to ``min_lr_ratio * lr`` at ``steps``, and that final rate after it
    (the extra steps of ``train.until.extend_to``)."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
