"""The encoding contract: the hooks a positional scheme may implement.

One attention core (``posenc.attention``) serves every scheme. A scheme is a
small ``nn.Module`` per attention layer that declares what it does (the flags)
and implements the matching hooks; the model and compositions read the flags,
never which methods a class overrides:

======================  ===================  ======================================
flag                    hook                 what it gives
======================  ===================  ======================================
``additive``            ``embed(pos)``       additive input embedding (T, d_model),
                                             built once at model level
``rotary``              ``phases(inp)``      rotation angles Phi (B|1, H|1, T, D/2)
                                             float32 in [0, 2 pi): q, k (and with
                                             ``rotate_v``, v) rotated by Phi, the
                                             output back by -Phi
``has_bias``            ``bias(inp)``        an additive score bias, as a callable
                                             giving any (query block, key block)
                                             tile without a T x T tensor
``replaces_attention``  ``attend(...)``      the whole attention, for schemes that
                                             do not factor; takes the other parts'
                                             bias in a composition
``has_logits``          ``logits(...)``      an attending scheme's causal logits of
                                             one query block (its ``attend`` is a
                                             softmax of them; ``posenc diagnose``
                                             reads them)
======================  ===================  ======================================

A hook whose flag is False returns None. Flags may be set per instance in
``__init__`` (RoPE replaces attention only with the ReRoPE schedule). The test
``tests/test_contract.py`` builds every registered scheme and checks that each
flag matches what its hook returns. ``spectral_gap`` and ``mixing_window`` report
a rotary scheme's step law (``posenc diagnose``); ``zero_init`` names the layers
the scheme starts at zero, which the model's weight initialisation leaves alone;
``neutral_init`` sets learned parts to start neutral on a pretrained model;
``uses_tokens`` marks schemes that read token ids.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
from torch import nn

from posenc.attention import BiasFn  # noqa: F401 (the bias hook's type, re-exported)


@dataclasses.dataclass(frozen=True)
class Dims:
    """Sizes an encoding is built for."""

    n_head: int
    head_dim: int
    d_model: int
    vocab_size: int
    train_length: int
    layer_index: int = 0


@dataclasses.dataclass
class Inputs:
    """What a layer's encoding may look at.

    x: (B, T, d_model) the layer's (normalised) input; pos: (T,) int64 absolute
    positions; tokens: (B, T) int64 token ids, or None where the layer has none
    (a drop-in ``posenc.Attention``, a Hugging Face model): schemes that read them
    (``uses_tokens``) then raise PosencError.
    """

    x: torch.Tensor
    pos: torch.Tensor
    tokens: Optional[torch.Tensor] = None


class Encoding(nn.Module):
    """Base class: no positional information (NoPE). Subclasses override hooks."""

    name: str = "nope"
    additive: bool = False  # True: embed() at the input instead of attention hooks
    rotate_v: bool = False  # rotate values by Phi and the output by -Phi
    pairing: str = "half"  # rotary feature pairing: "half" (rotate_half) or "adjacent"
    logit_scale: float = 1.0  # multiplies q.k / sqrt(D) (YaRN attention factor squared)
    max_length: Optional[int] = None  # longest input the scheme supports (learned table)
    internal: tuple[str, ...] = ()  # constructor parameters a scheme spec may not set
    family: str = "other"  # the group `posenc list` shows it in
    source: str = ""  # the paper (authors, year, arXiv id, equation)
    rotary: bool = False  # phases() gives rotation angles
    has_bias: bool = False  # bias() gives a score bias
    replaces_attention: bool = False  # attend() gives the attention output
    has_logits: bool = False  # logits() gives an attending scheme's logits per query block
    uses_tokens: bool = False  # the hooks read Inputs.tokens (token ids), not only x and pos

    def __init__(self, dims: Dims):
        super().__init__()
        self.dims = dims

    def _apply(self, fn, recurse=True):
        """Casts of the model (``.float()``, ``.half()``, ``.to(torch.bfloat16)``) move this scheme's floating
        buffers (frequencies, step laws, slopes) to the new device but never lower their precision (``.double()``
        may raise it): in bf16, RoPE's angle t * omega at t = 10^4 would be off by up to pi, and float32
        frequencies put it 3.9e-3 rad off at t = 131072."""
        before = {n: b for n, b in self._buffers.items() if b is not None and b.is_floating_point()}
        super()._apply(fn, recurse)
        for n, b in before.items():
            now = self._buffers[n]
            if torch.finfo(now.dtype).bits < torch.finfo(b.dtype).bits:
                self._buffers[n] = b.to(now.device)
        return self

    def embed(self, pos: torch.Tensor) -> Optional[torch.Tensor]:
        return None

    def phases(self, inp: Inputs) -> Optional[torch.Tensor]:
        return None

    def bias(self, inp: Inputs) -> Optional[BiasFn]:
        return None

    def attend(self, q, k, v, inp: Inputs, bias: Optional[BiasFn] = None) -> Optional[torch.Tensor]:
        """q, k: (B, H, T, Dk), v: (B, H, T, Dv) -> (B, H, T, Dv); ``bias``: the other parts' score bias."""
        return None

    def logits(self, q, k, inp: Inputs, bias: Optional[BiasFn], qs: int, qe: int) -> Optional[torch.Tensor]:
        """Causal logits of queries [qs, qe) over keys [0, qe): (B, H, qe-qs, qe) float32+, -inf above the diagonal."""
        return None

    def attend_by_logits(self, q, k, v, inp: Inputs, bias: Optional[BiasFn], block_size: int) -> torch.Tensor:
        """``attend`` of a scheme with ``logits``: softmax per query block of ``block_size``, then values; (B, H, T, Dv) in v's dtype."""
        T, out = q.shape[-2], []
        for qs in range(0, T, block_size):
            qe = min(qs + block_size, T)
            out.append(torch.softmax(self.logits(q, k, inp, bias, qs, qe), dim=-1).to(v.dtype) @ v[..., :qe, :])
        return torch.cat(out, dim=-2)

    def spectral_gap(self) -> Optional[torch.Tensor]:
        """(D/2,) float64 |E exp(i theta_b)| of the step law per frequency block, or None (no step law)."""
        return None

    def zero_init(self) -> tuple[nn.Module, ...]:
        """Layers this scheme initialises to zero (the model's normal init skips them)."""
        return ()

    def neutral_init(self) -> None:
        """Set the learned parts (if any) so the scheme starts as close as it can to adding nothing learned:
        used when a scheme is attached to a pretrained model (``posenc.hf.apply_scheme``). Default: nothing."""

    def mixing_window(self, eps: float = 0.01) -> Optional[float]:
        """Tokens after which the scheme's random step law decorrelates routes to ``eps`` (arXiv 2606.24975,
        Theorem 1), known before training; None when the scheme has no step law (or a learned one)."""
        return None

    def describe(self) -> str:
        """One line for reports: the scheme and its parameters."""
        return self.name
