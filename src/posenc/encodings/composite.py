"""Composition of schemes: one part per hook (e.g. accumulated rotation + ALiBi).

``get("acc-rand-qkv+alibi")`` builds each part once; phases, q/k transform,
rotate_v, pairing and logit scale come from the single rotary part, biases add;
a part that replaces attention (``attend``: PaTH, xPos, PoPE, ReRoPE) gets the
other parts' bias, e.g. ``path+forget``.
"""

from __future__ import annotations

from torch import nn

from posenc.encodings.base import Dims, Encoding, Inputs
from posenc.errors import PosencError


class Composite(Encoding):
    """Several distinct schemes in one attention layer; at most one rotary and one ``attend`` part."""

    name = "composite"

    def __init__(self, dims: Dims, parts: list[Encoding], spec: str):
        super().__init__(dims)
        self.parts = nn.ModuleList(parts)
        self.spec = spec
        names = [p.name for p in parts]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:  # e.g. alibi+alibi would silently double the bias
            raise PosencError(f"{spec!r}: each part may appear once; repeated {', '.join(map(repr, repeated))}")
        if any(p.additive for p in parts):
            raise PosencError(f"{spec!r}: additive embeddings cannot be combined with '+'")
        rotary = [p for p in parts if type(p).phases is not Encoding.phases or type(p).transform_qk is not Encoding.transform_qk]
        if len(rotary) > 1:
            raise PosencError(f"{spec!r}: at most one rotary part can be combined")
        self._rotary = rotary  # a plain list: each part is registered once (under parts), so weights save
        if self.rotary is not None:
            self.rotate_v, self.pairing, self.logit_scale = self.rotary.rotate_v, self.rotary.pairing, self.rotary.logit_scale
        self.attenders = [p for p in parts if type(p).attend is not Encoding.attend]
        if len(self.attenders) > 1:
            raise PosencError(f"{spec!r}: at most one part may replace attention")
        if self.attenders and self.rotary is not None and self.attenders[0] is not self.rotary:
            raise PosencError(f"{spec!r}: {self.attenders[0].name!r} replaces attention and cannot take another rotary part")

    @property
    def rotary(self):
        """The rotary part (phases / transform_qk), or None."""
        return self._rotary[0] if self._rotary else None

    def transform_qk(self, q, k, inp: Inputs):
        return self.rotary.transform_qk(q, k, inp) if self.rotary is not None else (q, k)

    def phases(self, inp: Inputs):
        return self.rotary.phases(inp) if self.rotary is not None else None

    def bias(self, inp: Inputs):
        fns = [f for f in (p.bias(inp) for p in self.parts) if f is not None]
        if not fns:
            return None
        if len(fns) == 1:
            return fns[0]
        return lambda qs, qe, ks, ke: sum(f(qs, qe, ks, ke) for f in fns)

    def attend(self, q, k, v, inp: Inputs):
        """The attending part's attention, given the other parts' summed bias."""
        return self.attenders[0].attend(q, k, v, inp, bias=self.bias(inp)) if self.attenders else None

    def mixing_window(self, eps: float = 0.01):
        return self.rotary.mixing_window(eps) if self.rotary is not None else None

    def describe(self) -> str:
        return " + ".join(p.describe() for p in self.parts)
