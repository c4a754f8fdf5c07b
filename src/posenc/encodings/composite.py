"""Composition of schemes: one part per hook (e.g. accumulated rotation + ALiBi).

``get("acc-rand-qkv+alibi")`` builds each part once; phases, q/k transform,
rotate_v, pairing and logit scale come from the single rotary part, biases add;
the composite's flags (``rotary``, ``has_bias``, ``replaces_attention``) are its parts';
a part that replaces attention (``attend``: PaTH, xPos, PoPE, ReRoPE) gets the
other parts' bias, e.g. ``path+forget``; one whose logits are q . k (``attends_rotated``: learned sinks, the
length-scaled schemes, stick-breaking) also takes a rotary part, which rotates q, k (and v, the output back
with ``rotate_v``) before it attends and scales q by its ``logit_scale``, e.g. gpt-oss's ``rope+learned-sinks``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
from torch import nn

from posenc.attention import Bias, cos_sin, far_keys, repeat_kv, rotate_rows, rotate_shared, rotation_dtype
from posenc.encodings.base import DecodeState, Dims, Encoding, Inputs
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
        rotary = [p for p in parts if p.rotary]
        if len(rotary) > 1:
            raise PosencError(f"{spec!r}: at most one rotary part can be combined")
        self._rotary = rotary  # a plain list: each part is registered once (under parts), so weights save
        self.rotary, self.has_bias = bool(rotary), any(p.has_bias for p in parts)
        self.position_indexed = any(p.position_indexed for p in parts)
        if rotary:
            self.rotate_v, self.pairing, self.logit_scale = rotary[0].rotate_v, rotary[0].pairing, rotary[0].logit_scale
        self._attenders = [p for p in parts if p.replaces_attention]
        self.replaces_attention = bool(self._attenders)
        self.attends_window = self.replaces_attention and self._attenders[0].attends_window
        self.has_logits = self.replaces_attention and self._attenders[0].has_logits
        if len(self._attenders) > 1:
            raise PosencError(f"{spec!r}: at most one part may replace attention")
        # an attending part that is not the rotary part attends q and k rotated by it (None: no such pair)
        self._rotated = rotary[0] if self._attenders and rotary and self._attenders[0] is not rotary[0] else None
        if self._rotated is not None and not self._attenders[0].attends_rotated:
            raise PosencError(
                f"{spec!r}: {self._attenders[0].name!r} replaces attention with its own use of positions in q and k "
                f"(its logits are not q . k), so it cannot take the rotary part {rotary[0].name!r}"
            )

    @property
    def rotary_part(self) -> Encoding | None:
        """The rotary part (phases), or None."""
        return self._rotary[0] if self._rotary else None

    @property
    def _parts(self) -> Sequence[Encoding]:
        """``parts`` as the schemes they are (a type checker sees an nn.ModuleList of nn.Module)."""
        return cast("Sequence[Encoding]", self.parts)

    def phases(self, inp: Inputs):
        return self._rotary[0].phases(inp) if self.rotary else None

    def bias(self, inp: Inputs):
        return sum_biases(cast("list[Bias]", [p.bias(inp) for p in self._parts if p.has_bias]))  # has_bias: not None

    def length_key(self, length: int):
        """The parts' ``length_key`` at ``length`` (None when every part's is None)."""
        keys = tuple(p.length_key(length) for p in self._parts)
        return None if all(k is None for k in keys) else keys

    def decoder(self) -> CompositeState | None:
        """Each part's state (None, the reference, if any part has none)."""
        states = [s for p in self._parts if (s := p.decoder()) is not None]
        return None if len(states) < len(self._parts) else CompositeState(self, states)

    def logits(self, q, k, inp: Inputs, bias, qs: int, qe: int):
        """The attending part's logits, given the other parts' summed bias (``bias(inp)``)."""
        return self._attenders[0].logits(q, k, inp, bias, qs, qe) if self.has_logits else None

    def attend(self, q, k, v, inp: Inputs, bias=None):
        """The attending part's attention, given the other parts' summed bias: ``bias`` as ``self.bias(inp)``
        gave it (the layer's hooks have it; None computes it)."""
        if not self.replaces_attention:
            return None
        bias = self.bias(inp) if bias is None else bias
        if self._rotated is None:
            return self._attenders[0].attend(q, k, v, inp, bias=bias)
        phi, out_dtype = self._rotated.phases(inp), v.dtype
        assert phi is not None  # the rotary part's phases
        cos, sin = cos_sin(phi, rotation_dtype(q))
        q, k = (rotate_shared(t.to(cos.dtype), phi, cos, sin, self.pairing) for t in (q, k))
        if self.rotate_v:
            v = rotate_shared(v.to(cos.dtype), phi, cos, sin, self.pairing)
        out = self._attenders[0].attend(self._scaled(q), k, v, inp, bias=bias)
        assert out is not None  # the attending part's attention
        out = rotate_shared(out, phi, cos, sin, self.pairing, sign=-1) if self.rotate_v else out
        return out.to(out_dtype)

    def _scaled(self, q: torch.Tensor) -> torch.Tensor:
        """q times the rotary part's ``logit_scale`` (YaRN's attention factor squared): the attending part's logits
        are q . k, so this scales them as the core's attention does."""
        return q if self.logit_scale == 1.0 else q * self.logit_scale

    def spectral_gap(self):
        return self._rotary[0].spectral_gap() if self.rotary else None

    def describe(self) -> str:
        return " + ".join(p.describe() for p in self._parts)


def sum_biases(biases: list[Bias]) -> Bias | None:
    """The sum of biases (None for none, the one itself for one): its tiles; pointwise ``at`` and separable
    ``keys`` when every part has one, else ``far`` on the keys far from every part's queries
    (``posenc.attention.Bias``)."""
    if not biases:
        return None
    if len(biases) == 1:
        return biases[0]

    def tile(qs, qe, ks, ke):
        return sum(b.tile(qs, qe, ks, ke) for b in biases)

    def at(b, h, qi, ki):  # pointwise parts sum pointwise (FlexAttention on CUDA)
        return sum(a(b, h, qi, ki) for a in ats)

    def keys(qs: int, ke: int):  # separable parts sum separably (the fused CPU path)
        return sum(c(qs, ke) for c in rows)

    def far(qs: int, qe: int):  # separable on the keys all parts are far from
        parts = [far_keys(b, qs, qe) for b in biases]
        near = min(n for n, _ in parts)
        return near, sum(row[..., :near] for _, row in parts)

    ats = [b.at for b in biases if b.at is not None]
    rows = [b.keys for b in biases if b.keys is not None]
    separable = all(b.keys is not None or b.far is not None for b in biases)
    return Bias(
        tile,
        at=at if len(ats) == len(biases) else None,
        keys=keys if len(rows) == len(biases) else None,
        far=far if separable and len(rows) < len(biases) else None,
    )


class CompositeState(DecodeState):
    """The parts' states, one per hook as ``Composite``: the rotary part's phases, the biases summed, the
    attending part's attention given the other parts' bias."""

    def __init__(self, enc: Composite, states: list[DecodeState]):
        super().__init__(enc)
        self.states = states
        self.per_head_keys = any(s.per_head_keys for s in states)

    def phases(self, inp: Inputs) -> torch.Tensor:
        return next(s for s in self.states if s.enc.rotary).phases(inp)

    def bias(self, inp: Inputs, pos: torch.Tensor) -> Bias:
        bias = sum_biases([s.bias(inp, pos) for s in self.states if s.enc.has_bias])
        assert bias is not None  # called for a composite with a bias part only
        return bias

    def attend(self, q, k, v, inp: Inputs, pos: torch.Tensor, bias, keys, values) -> torch.Tensor:
        """The attending part's state; with a rotary part beside it (``Composite._rotated``), the new rows of q, k
        (and v) rotated by the rotary state's phases first, so the attending state caches rotated keys."""
        attender = next(s for s in self.states if s.enc.replaces_attention)
        enc = cast("Composite", self.enc)
        if enc._rotated is None:
            return attender.attend(q, k, v, inp, pos, bias, keys, values)
        phi = next(s for s in self.states if s.enc is enc._rotated).phases(inp)
        cos, sin = cos_sin(phi, rotation_dtype(q))
        if phi.shape[1] > 1 and k.shape[1] != q.shape[1]:  # per-head phases: keys differ per query head
            k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])
        q, k = (rotate_rows(t.to(cos.dtype), cos, sin, enc.pairing) for t in (q, k))
        if enc.rotate_v:
            v = rotate_rows(v.to(cos.dtype), cos, sin, enc.pairing)
        out = attender.attend(enc._scaled(q), k, v, inp, pos, bias, keys, values)
        return rotate_rows(out, cos, sin, enc.pairing, sign=-1) if enc.rotate_v else out

    def parts(self) -> list[DecodeState]:
        return self.states

    def drop(self, stop: int) -> None:
        for s in self.states:
            s.drop(stop)
