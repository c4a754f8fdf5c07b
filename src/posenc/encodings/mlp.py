"""The small pointwise MLP of FIRE and DAPE: one hidden layer over the last axis."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class PointMLP(nn.Module):
    """y = W2 act(W1 x + b1) + b2 over the last axis: (..., n_in) -> (..., n_out).

    ``act``: "relu" (FIRE) or "leaky_relu" (DAPE, slope 0.01). Computed in x's dtype
    (parameters cast to it), also under autocast: FIRE's inputs are positions and DAPE's
    include distance biases of size ~T, which bf16 would round. Weights are plain
    parameters initialised as ``nn.Linear``'s default, U(-1/sqrt(fan_in),
    1/sqrt(fan_in)), as both reference implementations construct them; not ``nn.Linear``
    layers, because the model's N(0, 0.02^2) init of every Linear would start FIRE's
    bias at ~0. Raises ValueError for an unknown act.
    """

    def __init__(self, n_in: int, width: int, n_out: int, act: str):
        super().__init__()
        if act not in ("relu", "leaky_relu"):
            raise ValueError(f"unknown activation {act!r}")
        self.act = act
        self.w1, self.b1 = self._uniform(width, n_in), self._uniform(width, n_in, bias=True)
        self.w2, self.b2 = self._uniform(n_out, width), self._uniform(n_out, width, bias=True)

    @staticmethod
    def _uniform(n_out: int, fan_in: int, bias: bool = False) -> nn.Parameter:
        shape = (n_out,) if bias else (n_out, fan_in)
        return nn.Parameter((torch.rand(shape) * 2 - 1) / math.sqrt(fan_in))

    def piecewise(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """This MLP of one input as the piecewise-linear function it is: (knots (K,), table (K + 1, 2 n_out)), both
        ``dtype``, computed in float64 from the current weights (no gradient). On the segment s of
        ``torch.bucketize(x, knots)`` the MLP is ``table[s, :n_out] * x + table[s, n_out:]``: each hidden unit
        switches at its knot -b1 / w1, so its slope (1, or the activation's negative slope) is fixed between knots.
        Equal to ``forward`` up to rounding; ValueError unless n_in is 1."""
        if self.w1.shape[1] != 1:
            raise ValueError(f"a piecewise form needs one input, got {self.w1.shape[1]}")
        w, b, w2, b2 = (p.detach().double() for p in (self.w1[:, 0], self.b1, self.w2, self.b2))
        knots = (-b[w != 0] / w[w != 0]).sort().values
        points = torch.cat([knots[:1] - 1, (knots[1:] + knots[:-1]) / 2, knots[-1:] + 1]) if len(knots) else b[:1] * 0
        slope = torch.where(w * points[:, None] + b > 0, 1.0, 0.0 if self.act == "relu" else 0.01)  # (K + 1, width)
        table = torch.cat([(slope * w) @ w2.T, (slope * b) @ w2.T + b2], dim=1)
        return knots.to(dtype), table.to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w1, b1, w2, b2 = (p.to(x.dtype) for p in (self.w1, self.b1, self.w2, self.b2))
        with torch.autocast(x.device.type, enabled=False):
            h = F.linear(x, w1, b1)
            h = F.relu(h) if self.act == "relu" else F.leaky_relu(h)
            return F.linear(h, w2, b2)
