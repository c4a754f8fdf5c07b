"""A scheme written outside posenc: ALiBi with its slopes scaled (a worked plugin, docs/plugins.md).

``posenc --import docs/examples/my_plugin.py list`` shows it; ``scaled-alibi`` (scale 1) is ``alibi``.
"""

import torch

from posenc.encodings import Dims, Encoding, Inputs, register
from posenc.encodings.base import Bias, PositionState
from posenc.encodings.bias import alibi_slopes, distance_bias
from posenc.errors import PosencError


@register  # usable by name in every command and spec from here on
class ScaledALiBi(Encoding):
    """ALiBi's bias -s m_h (i - j): the reference slopes m_h times a scale s (Press et al. 2022, sec. 3).

    Parameters:
        scale: s, the factor on every head's slope, > 0 (1: ALiBi)
    """

    name = "scaled-alibi"
    family, source = "plugins", "docs/examples/my_plugin.py (after Press et al. 2022, arXiv:2108.12409)"
    has_bias = True  # the flag that says bias() gives a value; register() checks the two agree

    def __init__(self, dims: Dims, scale: float = 1.0):
        super().__init__(dims)
        if not scale > 0:
            raise PosencError(f"scaled-alibi: scale must be > 0, got {scale}")  # bad input: one line, exit code 2
        # (H,) float64; a buffer of an Encoding keeps float64 under model.half() / .to(torch.bfloat16)
        self.register_buffer("slopes", scale * alibi_slopes(dims.n_head), persistent=False)

    def bias(self, inp: Inputs) -> Bias:
        # inp.x: (B, T, d_model) the layer's input, only its dtype used here; inp.pos: (T,) int64 positions
        return distance_bias(self.slopes, inp.pos, torch.promote_types(inp.x.dtype, torch.float32))

    def decoder(self) -> PositionState:
        return PositionState(self)  # decoding: the new query rows of the same bias over the cached positions
