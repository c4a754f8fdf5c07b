"""One attention layer with any positional scheme: the module ``LM`` is built from, and its functional form.

- :class:`Attention`: a drop-in ``nn.Module`` for your own transformer block,
  ``forward(x, positions=None, cache=None)``, with grouped-query attention
  (``n_kv_head``) and incremental decoding (:class:`LayerCache`). ``posenc.model.LM``
  builds every layer from it (:meth:`Attention.from_config`).
- :func:`prepare` / :func:`attend`: the same two steps for q, k, v from your own
  projections: evaluate a scheme's hooks (phases, bias) on the layer input, then
  run the attention core (``posenc.attention.attention``).
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, cast

import torch
from torch import nn

from posenc import encodings
from posenc.attention import Bias, Window, attention, cos_sin, repeat_kv, rotate_rows, rotation_dtype
from posenc.encodings.base import (
    Buffer,
    CachePart,
    DecodeState,
    Dims,
    Encoding,
    Inputs,
    batch_rows,
    check_crop_length,
    check_int,
    check_pos,
    check_rows,
)
from posenc.encodings.composite import Composite, sum_biases
from posenc.encodings.registry import check_capabilities
from posenc.errors import PosencError
from posenc.methods import Method, method_attention, parse_for, scheme_args


@dataclasses.dataclass
class Prepared:
    """A scheme's hooks evaluated on one layer input, as the attention core takes them.

    inp: the hook inputs (x (B, T, d_model), pos (T,) int64, tokens (B, T) or None);
    phases: (B|1, H|1, T, P) float32 radians or None; bias: a ``posenc.attention.Bias`` or None;
    rotate_v, pairing, logit_scale: as ``posenc.attention.attention`` takes them;
    encoding: the scheme (its ``attend`` for schemes that replace attention; its
    ``dims``: the query heads and head dim :func:`attend` takes).
    """

    inp: Inputs
    phases: torch.Tensor | None
    bias: Bias | None
    rotate_v: bool
    pairing: str
    logit_scale: float
    encoding: Encoding


@dataclasses.dataclass
class AttentionInputs(Prepared):
    """One attention layer's inputs: the Prepared hooks and q: (B, H, Tq, Dk), k: (B, H, T, Dk),
    v: (B, H, T, Dv), not yet rotated, keys and values already repeated to the H query heads."""

    q: torch.Tensor | None = None
    k: torch.Tensor | None = None
    v: torch.Tensor | None = None


def _prepare(enc: Encoding, inp: Inputs) -> Prepared:
    """``enc``'s hooks on ``inp`` (whole sequence so far): the one step :func:`prepare` and :meth:`Attention.prepare`
    share; a left-padded ``inp`` (``Inputs.first``) adds the padding mask to the bias (``padding_bias``).
    PosencError (``_check_flags``) for a hook that gives a value under its flag left False."""
    phases, bias = enc.phases(inp), enc.bias(inp)
    _check_flags(enc, phases, bias)
    return Prepared(inp, phases, with_padding(bias, inp.first), enc.rotate_v, enc.pairing, enc.logit_scale, enc)


def padding_starts(attention_mask: Any, batch: int, length: int, device=None) -> torch.Tensor | None:
    """Each row's first real position (B,) int64 from a left-padding ``attention_mask`` (B, T) as transformers
    gives it (1 or True: a token, 0 or False: padding; every row 0s then 1s, at least one 1), on ``device``;
    None for None or a mask without padding (the unpadded computation, unchanged). PosencError (one line) for
    another shape, values other than 0 and 1, padding after a token (right or inner padding: left-pad the
    prompts, ``posenc.model.pad_left``) or a row without tokens."""
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != (batch, length):
        shape = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask)
        raise PosencError(f"attention_mask must be a ({batch}, {length}) tensor of 0s and 1s, got {shape}")
    if attention_mask.is_complex() or not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
        raise PosencError("attention_mask must hold only 0 (padding) and 1 (a token)")
    mask = attention_mask.to(torch.int64)
    if bool((mask.diff(dim=1) < 0).any()):
        row = int((mask.diff(dim=1) < 0).any(dim=1).nonzero()[0])
        raise PosencError(
            f"attention_mask row {row} has padding after a token: padding must be on the left (left-pad the prompts, "
            "posenc.model.pad_left)"
        )
    first = length - mask.sum(dim=1)
    if bool((first == length).any()):
        raise PosencError(f"attention_mask row {int((first == length).nonzero()[0])} has no tokens (all padding)")
    return first.to(device or attention_mask.device) if bool(first.any()) else None


def padding_bias(first: torch.Tensor) -> Bias:
    """The padding mask of a left-padded batch as a score bias: -inf for a real query over a padding key (rows
    and keys counted in the padded sequence, cache rows when decoding), 0 elsewhere, so a padding query (which
    no real query reads) still sees itself and its row stays finite. first: (B,) int64 (``padding_starts``);
    tiles (B, 1, tq, tk) float32, and the pointwise ``at`` (FlexAttention)."""

    def tile(qs: int, qe: int, ks: int, ke: int) -> torch.Tensor:
        f = first[:, None, None, None]
        q = torch.arange(qs, qe, device=first.device)[:, None]
        k = torch.arange(ks, ke, device=first.device)
        masked = (k < f) & (q >= f)
        return torch.zeros(masked.shape, device=first.device).masked_fill_(masked, float("-inf"))

    def at(b, h, qi, ki):
        return torch.where((ki < first[b]) & (qi >= first[b]), float("-inf"), 0.0)

    return Bias(tile, at=at)


def with_padding(bias: Bias | None, first: torch.Tensor | None) -> Bias | None:
    """``bias`` plus the padding mask of a left-padded batch (``padding_bias``); ``bias`` itself without padding."""
    if first is None:
        return bias
    return sum_biases([b for b in (bias, padding_bias(first)) if b is not None])


def check_padding(enc: Encoding, method: Method | None, first: torch.Tensor | None, length: int) -> None:
    """PosencError (one line) where a left-padded batch (``first``, ``length`` positions with the padding) cannot
    give each row what it would get alone: under an inference method (its maps read the positions of the padded
    sequence), or with a scheme whose hooks follow the sequence length (``Encoding.length_key``: dynamic NTK,
    LongRoPE) when the shortest row's length would set them otherwise."""
    if first is None:
        return
    if method is not None:
        raise PosencError(
            f"the inference method {method.label()} does not take a padding mask (its maps read the positions of "
            "the sequence): run the rows one by one"
        )
    shortest = length - int(first.max())
    if enc.length_key(length) != enc.length_key(shortest):
        raise PosencError(
            f"{enc.describe()} changes its frequencies with the sequence length, and the rows of this padded batch "
            f"({shortest} to {length} tokens) would take different ones: run the rows one by one"
        )


def _check_flags(enc: Encoding, phases, bias) -> None:
    """PosencError (one line) when ``phases`` or ``bias`` (``enc``'s hooks on some input) is a value while the flag
    naming that hook (``rotary``, ``has_bias``) is False: cached decoding reads the flags and would drop it, so the
    parallel forward would differ from decoding (a plugin that lists the flag in ``instance_flags`` and never sets
    it); or when ``bias`` is not a ``posenc.attention.Bias`` (a plugin's bare tile function)."""
    if bias is not None and not isinstance(bias, Bias):
        raise PosencError(
            f"scheme {enc.describe()!r}: bias() gave a {type(bias).__name__}, not a posenc.attention.Bias "
            "(wrap a tile function: Bias(tile))"
        )
    for flag, value in (("rotary", phases), ("has_bias", bias)):
        if value is not None and not getattr(enc, flag):
            hook = "phases" if flag == "rotary" else "bias"
            raise PosencError(
                f"scheme {enc.describe()!r}: {hook}() gave a value while {flag} is False: set {flag} = True "
                f"(on the class, or in the constructor if it is in instance_flags)"
            )


def _check_scheme_flags(enc: Encoding, inp: Inputs) -> None:
    """``_check_flags`` on ``inp`` for the hooks ``enc``'s class implements under a flag left False (only those are
    called: once per cache, at its first step)."""
    unset = [hook for flag, hook in (("rotary", "phases"), ("has_bias", "bias")) if not getattr(enc, flag)]
    if any(getattr(type(enc), hook) is not getattr(Encoding, hook) for hook in unset):
        _check_flags(enc, None if enc.rotary else enc.phases(inp), None if enc.has_bias else enc.bias(inp))


def prepare(
    scheme: str | Encoding,
    x: torch.Tensor,
    positions: torch.Tensor | None = None,
    *,
    n_head: int | None = None,
    head_dim: int | None = None,
    tokens: torch.Tensor | None = None,
    train_length: int = 128,
    attention_mask: torch.Tensor | None = None,
) -> Prepared:
    """Evaluate a scheme's hooks on a layer input, for :func:`attend`.

    scheme: a spec (``"alibi"``, ``"rope:rope_theta=500000"``; needs ``n_head``,
    ``head_dim`` defaults to d_model / n_head) or a built scheme
    (``posenc.encodings.get(spec, dims)``; required for schemes with learned
    parameters, which must live in your module to be trained); x: (B, T, d_model)
    the layer's (normalised) input, any float dtype; positions: (T,) int64,
    default arange(T); tokens: (B, T) int64, only for per-token-id schemes;
    attention_mask: (B, T) left padding as transformers gives it (1: token, 0: padding;
    ``padding_starts``), the rows' positions counted from their first token (give no
    ``positions`` with it): each row's outputs at its tokens equal the row alone's.
    Raises PosencError (one line) for a scheme that is neither a spec nor an Encoding, bad shapes, n_head or
    head_dim < 1 (head_dim None: the default), a d_model that n_head does not divide (without head_dim), an invalid
    spec, an additive scheme (it acts at the input embedding), a spec with learned parameters, or a mask
    ``padding_starts`` refuses (or one with a length-dependent schedule that the rows' lengths set apart).
    """
    x = _check_x(x)
    _check_scheme_arg(scheme)
    if isinstance(scheme, str):
        if n_head is None:
            raise PosencError("prepare(spec, ...) needs n_head (or pass a built scheme)")
        d = x.shape[-1]
        if not (isinstance(n_head, int) and n_head >= 1):
            raise PosencError(f"n_head must be an integer >= 1, got {n_head!r}")
        if head_dim is None and d % n_head:
            raise PosencError(f"d_model {d} does not divide into {n_head} heads (give head_dim)")
        dims = Dims(n_head, d // n_head if head_dim is None else head_dim, d, 0, train_length)  # 0 is refused
        spec, scheme = scheme, encodings.get(scheme, dims)
        if any(True for _ in scheme.parameters()):
            raise PosencError(
                f"{spec!r} has learned parameters: build it once with posenc.encodings.get and keep it in your module"
            )
    _check_scheme(scheme)
    first = _padding(attention_mask, positions, x)
    check_padding(scheme, None, first, x.shape[1])
    return _prepare(scheme, Inputs(x, _positions(positions, x.shape[1], 0, x.device), tokens, first))


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prepared: Prepared, block_size: int = 512
) -> torch.Tensor:
    """Causal attention of q over k, v with the prepared scheme: (B, H, Tq, Dv) in v's dtype.

    q: (B, H, Tq, Dk), the queries of the last Tq of the T positions; k: (B, Hkv, T, Dk);
    v: (B, Hkv, T, Dv), unrotated; Hkv divides H (grouped-query attention: query
    head h uses key/value head h // (H / Hkv)). H and Dk must be those the scheme was
    prepared for (``prepared.encoding.dims``; partial rotary is the scheme's own
    ``rotary_fraction``, not a wider head), and T the positions it was prepared at (``prepared.inp.pos``), Tq <= T.
    ``block_size``: query rows per bias tile. Raises PosencError (one line) for a ``prepared`` that is not a
    :class:`Prepared` (:func:`prepare`'s), for q, k, v that are not floating tensors, a ``block_size`` that is not an
    integer >= 1, for shapes that do not fit and for q, k, v of more than one dtype (float64
    throughout is fine; a mix was silently cast under a rotation, a raw RuntimeError from the kernel under a bias;
    not checked under autocast, which casts).
    """
    if not isinstance(prepared, Prepared):
        raise PosencError(f"prepared must be a posenc.Prepared (posenc.prepare's), got {type(prepared).__name__}")
    if not all(isinstance(t, torch.Tensor) and t.is_floating_point() for t in (q, k, v)):
        got = ", ".join(str(t.dtype) if isinstance(t, torch.Tensor) else type(t).__name__ for t in (q, k, v))
        raise PosencError(f"q, k, v must be floating tensors, got {got}")
    check_int(block_size, "block_size", 1)  # a rotation ignored it, a bias raised a raw error
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or q.shape[0] != k.shape[0] or k.shape[:3] != v.shape[:3]:
        raise PosencError(
            "q, k, v must be (B, H, T, D) with matching batch, heads and length; "
            f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    _check_heads(q, k, v, prepared)
    if len({q.dtype, k.dtype, v.dtype}) > 1 and not torch.is_autocast_enabled(q.device.type):
        raise PosencError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}: cast them (.to) to one")
    k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])
    p = prepared
    if p.encoding.replaces_attention:  # no query-suffix form: every query is given
        if q.shape[-2] != k.shape[-2]:
            raise PosencError(f"{p.encoding.describe()} attends with all T queries; got {q.shape[-2]} of {k.shape[-2]}")
        out = p.encoding.attend(q, k, v, p.inp, bias=p.bias)  # the hooks' bias, not computed twice
        assert out is not None  # the scheme replaces attention
        return out
    return attention(
        q,
        k,
        v,
        phases=p.phases,
        rotate_v=p.rotate_v,
        pairing=p.pairing,
        bias=p.bias,
        logit_scale=p.logit_scale,
        block_size=block_size,
        window=bound_window(p.encoding.window, 0, p.inp.first),
    )


def bound_window(window: Window | None, offset: int, first: torch.Tensor | None) -> Window | None:
    """A scheme's ``window`` (``Encoding.window``) for keys whose row 0 is the sequence row ``offset`` (a cache that
    dropped that many rows) and a left-padded batch's first real rows ``first`` (B,) (None: no padding)."""
    return None if window is None else dataclasses.replace(window, offset=offset, first=first)


def _check_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: Prepared) -> None:
    """PosencError unless q has the heads and q, k (and v, for a scheme rotating values) the head dim that ``p``'s
    phases and bias were built for (a wider head would silently rotate as partial rotary with other frequencies),
    and k the positions they were built at, q at most as many (their last)."""
    T = p.inp.pos.shape[0]
    if k.shape[2] != T or q.shape[2] > T:
        raise PosencError(
            f"the scheme was prepared at {T} positions; got k, v of {k.shape[2]} and q of {q.shape[2]} (k, v need "
            f"all {T}, q at most {T})"
        )
    dims = p.encoding.dims
    given = {"q": q.shape[-1], "k": k.shape[-1], **({"v": v.shape[-1]} if p.rotate_v else {})}
    if set(given.values()) != {dims.head_dim}:
        raise PosencError(
            f"{', '.join(given)} have head dim {', '.join(map(str, given.values()))}; "
            f"the scheme was prepared for head dim {dims.head_dim}"
        )
    if q.shape[1] != dims.n_head:
        raise PosencError(f"q has {q.shape[1]} heads; the scheme was prepared for {dims.n_head}")


class LayerCache(CachePart):
    """One layer's decoding state, filled by ``Attention.decode``.

    Incremental (the default, for a scheme with a ``DecodeState``): keys and values
    ``k``, ``v`` (B, Hkv, T, D) in the form the attention reads them (rotated into
    the absolute frame once for rotary schemes; a scheme that replaces attention
    keeps its own form, e.g. PaTH's transformed keys), positions ``pos`` (T,), and
    the scheme's state (running phase, cumulative log-gates); a step costs O(T D)
    and never re-runs the hooks over the prefix. Keys that differ per query head
    (per-head accumulated phases, PaTH, PoPE: ``DecodeState.per_head_keys``) are
    cached for all H heads, so grouped-query attention saves no cache memory for
    them. Reference (``reference=True``, and every scheme without a DecodeState):
    every position's input ``x``, token ids, unrotated ``k``, ``v`` (and
    ``q`` for schemes that replace attention), the hooks recomputed over the whole
    prefix at every step. All in preallocated buffers whose capacity doubles (``capacity``: rows reserved at the
    first step, an integer >= 0, else PosencError). A layer with a sliding window or chunks of W tokens
    (``Encoding.window``) keeps only the last W - 1 positions' keys, values and scheme rows after each incremental
    step (``evicted``: the positions dropped; ``length`` still counts every position fed), so its memory stays
    bounded however long the decoding; such a cache cannot be cropped. A cache belongs to the layer of its first
    step (``owner``): another layer's ``decode`` with it raises PosencError, as its keys, scheme state and head
    count are that layer's. ``crop``, ``reorder``, ``nbytes``: :class:`CachePart`'s, over the scheme's state and the
    buffers.
    """

    def __init__(self, reference: bool = False, capacity: int = 0):
        self.reference = reference
        self.owner: weakref.ref | None = None  # the layer that filled it (its first ``decode``); no other may use it
        self.state: DecodeState | None = None
        self.batch: int | None = None
        self.has_tokens = False
        self.first: torch.Tensor | None = None  # (B,) a left-padded batch's first real rows (``padding_starts``)
        self._pos = Buffer(-1, capacity, batched=False)
        self._x, self._tokens = Buffer(-2, capacity), Buffer(-1, capacity)
        self._q, self._k, self._v = Buffer(-2, capacity), Buffer(-2, capacity), Buffer(-2, capacity)
        self.evicted = 0  # positions whose rows a windowed layer dropped (the rows held start at this one)

    @property
    def length(self) -> int:
        """Positions fed so far (the rows held and those a windowed layer dropped)."""
        return self.evicted + self._pos.length

    x = property(lambda self: self._x.value)
    q = property(lambda self: self._q.value)
    k = property(lambda self: self._k.value)
    v = property(lambda self: self._v.value)
    pos = property(lambda self: self._pos.value)
    tokens = property(lambda self: self._tokens.value)

    def parts(self) -> list[CachePart]:
        held: list[CachePart] = [self._pos, self._x, self._tokens, self._q, self._k, self._v]
        return held if self.state is None else [self.state, *held]

    def check_crop(self, length: int) -> None:
        """PosencError (one line) unless ``crop(length)`` can keep the first ``length`` positions (e.g. after
        rejected speculative tokens): a length beyond the cache's, below it in a windowed layer's cache (the keys a
        query at ``length`` would see are gone), or where the scheme's state cannot go back (PaTH's transformed
        keys)."""
        check_crop_length(length, self.length)
        if self.evicted and length < self.length:
            raise PosencError(
                "a windowed layer's cache keeps only its window's last keys: it cannot be cropped (the earlier ones "
                "are gone)"
            )
        super().check_crop(length)

    def begin(self, owner, batch: int, has_tokens: bool, first: torch.Tensor | None, state: DecodeState | None):
        """The first step's settings: the layer ``owner`` (no other may use the cache), the batch size, whether token
        ids come with each step, a left-padded batch's first real rows (B,) int64 or None, and the scheme's decoding
        state (None: the reference cache, which recomputes the hooks over the prefix)."""
        self.owner, self.batch, self.has_tokens, self.first = weakref.ref(owner), batch, has_tokens, first
        self.state, self.reference = state, state is None

    def add_positions(self, pos: torch.Tensor) -> torch.Tensor:
        """Hold the new positions pos (n,) int64; returns every held position (T,)."""
        return self._pos.append(pos)

    def add_keys(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Hold the new rows' keys and values (B, Hkv|H, n, D) as the attention reads them; returns every held key
        and value (B, Hkv|H, T, D)."""
        return self._k.append(k), self._v.append(v)

    def key_buffers(self) -> tuple[Buffer, Buffer]:
        """The key and value Buffers, for a scheme's state that fills them in its own form (``DecodeState.attend``)."""
        return self._k, self._v

    def add_inputs(self, x, q, k, v, pos, tokens) -> None:
        """The reference's step: hold the new positions' inputs x (B, n, d_model), q (B, H, n, D) or None (kept only
        for a scheme that replaces attention), unrotated k, v (B, Hkv, n, D), positions (n,) and token ids (B, n)
        or None."""
        for buf, t in zip((self._x, self._q, self._k, self._v, self._pos, self._tokens), (x, q, k, v, pos, tokens)):
            if t is not None:
                buf.append(t)

    def drop(self, start: int, stop: int) -> None:
        """Forget the held rows [start, stop) of positions, keys and values (a bounded method's eviction: sinks)."""
        for buf in (self._pos, self._k, self._v):
            buf.drop(start, stop)

    def evict(self, keep: int) -> None:
        """Drop every held position's rows but the last ``keep`` (keys, values, positions, the scheme state's)."""
        stop = self._pos.length - keep
        if stop > 0:
            self.drop(0, stop)
            if self.state is not None:
                self.state.drop(stop)
            self.evicted += stop

    def reorder(self, index: torch.Tensor) -> None:
        """Select batch rows: index (B',) int64 into the cached batch; PosencError (one line) for another index or a
        row outside the batch (``check_rows``), before any part changes."""
        check_rows(index, self.batch)
        super().reorder(index)
        if self.first is not None:
            self.first = batch_rows(self.first, index)
        self.batch = int(index.shape[0])


def _padding(attention_mask, positions: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor | None:
    """``padding_starts`` of a layer input x (B, T, d); PosencError for a mask given with positions (the mask sets
    them)."""
    if attention_mask is not None and positions is not None:
        raise PosencError("give an attention_mask or positions, not both: the mask sets each row's positions")
    return padding_starts(attention_mask, x.shape[0], x.shape[1], x.device)


def _check_x(x: torch.Tensor, d_model: int | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
    """x as given; PosencError (one line) unless it is a floating (batch, T, d_model) tensor, T >= 1 (d_model: any
    width where None: ``prepare``, whose empty batch gives ``attend`` an empty one; given, a layer's input, which also
    needs batch >= 1 as ``LM``'s tokens do: its projection raised a raw RuntimeError), of ``dtype`` where given (a
    layer's weights': the projection would raise a raw dtype mismatch; not checked under autocast, which casts)."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise PosencError(
            f"x must be a floating tensor, got {x.dtype if isinstance(x, torch.Tensor) else type(x).__name__}"
        )
    rows = d_model is not None  # a layer's input: a batch of rows
    if x.dim() != 3 or x.shape[1] == 0 or (rows and (x.shape[0] == 0 or x.shape[2] != d_model)):
        want, batch = (d_model, "batch >= 1 and ") if rows else ("d_model", "")
        raise PosencError(f"x must be (batch, T, {want}) with {batch}T >= 1, got shape {tuple(x.shape)}")
    if dtype is not None and x.dtype != dtype and not torch.is_autocast_enabled(x.device.type):
        raise PosencError(f"x is {x.dtype} but the layer's weights are {dtype}: cast x (x.to) or the layer (.to)")
    return x


def _positions(positions: torch.Tensor | None, n: int, start: int, device) -> torch.Tensor:
    """positions (n,) int64 as given, default arange(start, start + n); PosencError for another shape or dtype,
    positions that are not a tensor (a list) or a negative one (``check_pos``)."""
    if positions is None:
        return torch.arange(start, start + n, device=device)
    check_pos(positions, n)
    return positions


def _check_classes(enc: Encoding) -> None:
    """``posenc.encodings.registry.check_capabilities`` on the class of ``enc`` (of each part of a composition):
    PosencError (one line) for flags that disagree with the hooks the class implements."""
    parts = cast("list[Encoding]", list(enc.parts)) if isinstance(enc, Composite) else [enc]
    for part in parts:
        check_capabilities(type(part))


def _check_scheme_arg(scheme) -> None:
    """PosencError (one line) unless ``scheme`` is a spec (str) or a built Encoding: ``Attention``'s and
    ``prepare``'s scheme argument (an int was an AttributeError in ``prepare``)."""
    if not isinstance(scheme, (str, Encoding)):
        raise PosencError(
            f"scheme must be a scheme spec (str, see `posenc list`) or an Encoding, got {type(scheme).__name__}"
        )


def _check_scheme(enc: Encoding) -> None:
    if enc.additive:
        raise PosencError(
            f"{enc.describe()} is an additive input embedding: add enc.embed(positions) to the token embeddings instead"
        )


class Attention(nn.Module):
    """Causal self-attention with a positional scheme: ``forward(x, positions=None, cache=None)``.

    d_model: model width; n_head: query heads (head dim d_model / n_head);
    scheme: a scheme spec (``posenc list``) or a built Encoding; n_kv_head: key/value
    heads for grouped-query attention (divides n_head; None: n_head, with one fused
    ``qkv`` projection d_model -> 3 d_model, as every posenc checkpoint); train_length:
    the training context (tokens) the scheme is told; vocab_size: only for
    per-token-id schemes (``acc-token-*``, which also need ``tokens``); layer_index:
    the entry of a per-layer pattern (``rope|nope``) and the random-step seed offset;
    block_size: query rows per bias tile; params: the scheme's parameters, with a spec
    (as its ``:k=v`` parts); seed: the run's seed, from which a scheme that draws at random
    derives its draws (``Dims.seed``). Projections have no bias. Raises PosencError (one line) for sizes (d_model,
    n_head, n_kv_head, block_size) that are not integers >= 1 (``n_kv_head=0`` too) or do not divide, an invalid
    spec, an additive scheme, params that are not a dict or given with an Encoding, or an
    Encoding whose class's flags disagree with the hooks it implements
    (``posenc.encodings.registry.check_capabilities``, what ``register`` checks); at the first forward or cached
    step, for a hook that gives a value under its flag left False (a flag in ``instance_flags`` the constructor
    never set).
    """

    def __init__(
        self,
        d_model: int,
        n_head: int,
        scheme: str | Encoding = "acc-rand-qkv:a=1",
        n_kv_head: int | None = None,
        train_length: int = 128,
        *,
        vocab_size: int = 0,
        layer_index: int = 0,
        block_size: int = 512,
        params: dict[str, Any] | None = None,
        seed: int = 0,
    ):
        super().__init__()
        kv = n_head if n_kv_head is None else n_kv_head  # 0 is refused below, not taken for None
        for name, value in (("d_model", d_model), ("n_head", n_head), ("n_kv_head", kv), ("block_size", block_size)):
            check_int(value, name, 1)  # before the modulo below divides by them
        if params is not None and not isinstance(params, dict):
            raise PosencError(f"params must be a dict of the scheme's parameters, got {type(params).__name__}")
        _check_scheme_arg(scheme)
        if d_model % n_head:  # one message per size at fault (one message named n_kv_head for either)
            raise PosencError(f"d_model {d_model} is not divisible by n_head {n_head}")
        if n_head % kv:
            raise PosencError(f"n_head {n_head} is not divisible by n_kv_head {kv}")
        self.d_model, self.n_head, self.n_kv_head, self.head_dim, self.block = (
            d_model,
            n_head,
            kv,
            d_model // n_head,
            block_size,
        )
        self.qkv = nn.Linear(d_model, (n_head + 2 * kv) * self.head_dim, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        dims = Dims(n_head, self.head_dim, d_model, vocab_size, train_length, layer_index, seed)
        if params and not isinstance(scheme, str):
            raise PosencError("params apply to a scheme spec; an Encoding comes built with its own")
        # built after the projections: the random-number order (hence the initial weights) of every posenc model
        self.enc = encodings.get(scheme, dims, **(params or {})) if isinstance(scheme, str) else scheme
        if not isinstance(scheme, str):  # a built scheme, maybe of an unregistered class: the check register makes
            _check_classes(scheme)
        _check_scheme(self.enc)
        self.method: Method | None = None  # an inference method (posenc.methods; set_method): attention under its map

    @classmethod
    def from_config(cls, cfg, layer_index: int) -> Attention:
        """Layer ``layer_index`` of a ``posenc.model.ModelConfig`` (an additive scheme gives NoPE layers:
        its embedding lives at the model input)."""
        additive = encodings.is_additive(cfg.encoding)
        return cls(
            cfg.d_model,
            cfg.n_head,
            "nope" if additive else cfg.encoding,
            cfg.n_kv_head,
            cfg.train_length,
            vocab_size=cfg.vocab_size,
            layer_index=layer_index,
            block_size=cfg.attn_block_size,
            params=None if additive else cfg.encoding_params,
            seed=cfg.seed,
        )

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q: (B, H, T, D), k, v: (B, Hkv, T, D), from x (B, T, d_model)."""
        B, T, _ = x.shape
        q, k, v = (
            self.qkv(x)
            .view(B, T, -1, self.head_dim)
            .transpose(1, 2)
            .split((self.n_head, self.n_kv_head, self.n_kv_head), dim=1)
        )
        return q, k, v

    def prepare(
        self,
        x: torch.Tensor,
        pos: torch.Tensor,
        tokens: torch.Tensor | None = None,
        qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
        first: torch.Tensor | None = None,
    ) -> AttentionInputs:
        """The layer's q, k, v and the scheme's hooks evaluated on x, before attention.

        x: (B, T, d_model) the normalised layer input; pos: (T,) int64; tokens: (B, T) int64 or None;
        qkv: q (B, H, Tq, D) of the last Tq positions, k, v (B, Hkv, T, D), if already projected
        (default: projected from x); first: (B,) int64, a left-padded batch's first real rows in pos's frame
        (``padding_starts``; None: no padding), PosencError where the layer cannot honour it (``check_padding``).
        """
        check_padding(self.enc, self.method, first, len(pos))
        q, k, v = qkv if qkv is not None else self.project(x)
        p = _prepare(self.enc, Inputs(x, pos, tokens, first))
        return AttentionInputs(**vars(p), q=q, k=repeat_kv(k, self.n_head), v=repeat_kv(v, self.n_head))

    def set_method(self, method: Method | str | None) -> Method | None:
        """Attend under an inference method (``posenc.methods``) from now on, None to stop; returns it. A spec string
        (``"sinks:n_sink=4,window=60"``) is parsed and checked as ``posenc.model.set_method`` does
        (``posenc.methods.parse_for``: defaults and reach from the layer's train_length, times a RoPE schedule's
        factor). PosencError (one line) for a bad spec (or one of another type) and a scheme the method does not
        apply to (``posenc.methods.scheme_args``); the layer is unchanged then."""
        if isinstance(method, Method):
            scheme_args(self.enc, method, torch.zeros(1, 1, self.d_model))
        elif method is not None:  # a spec, or a value parse refuses in one line (a str was stored, then raised)
            factor = (getattr(self.enc, "schedule_params", None) or {}).get("factor", 1)
            method = parse_for(method, [self.enc], self.d_model, self.enc.dims.train_length, factor)
        self.method = method
        return method

    def output(self, a: AttentionInputs) -> torch.Tensor:
        """Attention of captured inputs, projected: (B, Tq, d_model)."""
        assert a.q is not None and a.k is not None and a.v is not None  # as ``prepare`` gives them
        if self.method is not None:
            pos = a.inp.pos
            out = method_attention(
                a.q,
                a.k,
                a.v,
                pos[pos.shape[0] - a.q.shape[-2] :],
                pos,
                self.method,
                block_size=self.block,
                **scheme_args(self.enc, self.method, a.inp.x),
            )
        else:
            out = attend(a.q, a.k, a.v, a, self.block)
        B, _, T, _ = out.shape
        return self.proj(out.transpose(1, 2).reshape(B, T, -1))

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor | None = None,
        cache: LayerCache | None = None,
        tokens: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x: (B, T, d_model) -> (B, T, d_model), x's dtype.

        positions: (T,) int64 absolute positions of x's rows (default arange(T), or
        the T positions after the cache's); cache: a LayerCache, updated in place,
        for incremental decoding (feed a prompt, then one token at a time; outputs
        equal the parallel forward's, in evaluation mode); tokens: (B, T) int64,
        only for per-token-id schemes (ids in [0, vocab_size), else PosencError); attention_mask: (B, T) left padding as
        transformers gives it (1: token, 0: padding; with a cache, at its first step
        only), each row's positions counted from its first token (no ``positions``
        with it): a row's outputs at its tokens equal the row alone's, or PosencError
        (one line) where the layer cannot give them (an inference method, a
        length-dependent schedule over rows of different lengths). Raises
        PosencError for bad shapes, an x that is not floating or not of the layer's dtype (``_check_x``), positions
        that are not a tensor, a cache that is not a LayerCache, or a mask ``padding_starts`` refuses.
        """
        _check_x(x, self.d_model, self.qkv.weight.dtype)
        if cache is not None:
            return self.decode(x, cache, positions, tokens, attention_mask)
        first = _padding(attention_mask, positions, x)
        return self.output(self.prepare(x, _positions(positions, x.shape[1], 0, x.device), tokens, first=first))

    def decode(
        self,
        x: torch.Tensor,
        cache: LayerCache,
        positions: torch.Tensor | None = None,
        tokens: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention of the n new positions over the cached prefix and themselves: (B, n, d_model).

        x: (B, n, d_model) the normalised inputs of the new positions; positions: (n,)
        int64 (default the n after the cache's); tokens: (B, n) int64 or None, as before;
        attention_mask: (B, n) left padding, at the first step only (``forward``).
        The cache picks its mode at the first call (``LayerCache``) and belongs to this layer from then
        on. Raises PosencError for a cache another layer filled, another batch size, token ids given at
        one step and not another, or a scheme whose hooks follow the sequence length
        (``Encoding.length_key``: RoPE's dynamic NTK and LongRoPE schedules): past their switch every
        cached input of a deeper layer would be stale, and one layer cannot re-run the layers below it
        (``posenc.model.LM.decode`` does; or run the parallel forward over the whole sequence), and for a cache
        that is not a :class:`LayerCache` (``posenc.model.Cache`` is a whole model's), and for an x ``forward``
        refuses.
        """
        _check_x(x, self.d_model, self.qkv.weight.dtype)
        if not isinstance(cache, LayerCache):
            raise PosencError(f"cache must be a posenc.LayerCache (one per layer), got {type(cache).__name__}")
        if self.enc.length_key(cache.length + x.shape[1]) is not None:
            raise PosencError(
                f"{self.enc.describe()} changes its frequencies with the sequence length: "
                "a drop-in layer cannot decode it with a cache (the deeper layers' cached inputs would go stale); "
                "run the forward over the whole sequence, or decode with posenc's LM"
            )
        return self._decode(x, cache, positions, tokens, _padding(attention_mask, positions, x))

    def _decode(
        self,
        x: torch.Tensor,
        cache: LayerCache,
        positions: torch.Tensor | None = None,
        tokens: torch.Tensor | None = None,
        first: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``decode`` for a caller that re-runs the prefix when a layer's ``length_key`` changes (``LM.decode``),
        so a length-dependent scheme's cached inputs are never stale. first: (B,) int64, a left-padded batch's first
        real rows (``padding_starts``), at the cache's first step only: PosencError at a later one (the padding of
        a batch comes before its tokens) and where the layer cannot honour it (``check_padding``)."""
        if cache.owner is not None and cache.owner() is not self:
            raise PosencError(
                "this LayerCache holds another layer's keys and scheme state: give each layer its own LayerCache"
            )
        if cache.batch is not None and (cache.batch != x.shape[0] or (tokens is None) == cache.has_tokens):
            raise PosencError(
                f"the cache holds batch size {cache.batch}{' and token ids' if cache.has_tokens else ''}; "
                f"got {x.shape[0]} rows{' and token ids' if tokens is not None else ''}"
            )
        if first is not None and cache.batch is not None:
            raise PosencError(
                "padding (an attention_mask with 0s) goes with the first step only: it must come before every token"
            )
        check_padding(self.enc, self.method, first if cache.first is None else cache.first, cache.length + x.shape[1])
        if cache.batch is None:
            _check_scheme_flags(self.enc, Inputs(x, _positions(positions, x.shape[1], 0, x.device), tokens))
            cache.begin(self, x.shape[0], tokens is not None, first, None if cache.reference else self.enc.decoder())
        if self.method is not None:
            return self._decode_method(x, cache, positions)
        pos = _positions(positions, x.shape[1], cache.length, x.device)
        q, k, v = self.project(x)
        if cache.reference:
            return self._decode_reference(x, q, k, v, pos, tokens, cache)
        inp, enc, state = Inputs(x, pos, tokens, cache.first), self.enc, cache.state
        assert state is not None  # an incremental cache has its scheme's state
        every = cache.add_positions(pos)
        phi = state.phases(inp) if enc.rotary and not enc.replaces_attention else None
        rows_first = None if cache.first is None else cache.first - cache.evicted  # the padding in held rows
        bias = state.bias(inp, every) if enc.has_bias else None
        _check_flags(enc, None, bias)
        bias = with_padding(bias, rows_first)
        if enc.replaces_attention:
            if state.per_head_keys:  # keys transformed per query head: the cache keeps all H (as attend() repeats them)
                k, v = repeat_kv(k, self.n_head), repeat_kv(v, self.n_head)
            out = state.attend(q, k, v, inp, every, bias, *cache.key_buffers())
        else:
            out = self._attend_cached(q, k, v, phi, bias, cache)
        if enc.window is not None:  # no later query sees more than the window's last size - 1 keys
            cache.evict(enc.window.size - 1)
        B, _, n, _ = out.shape
        return self.proj(out.transpose(1, 2).reshape(B, n, -1))

    def _decode_method(self, x, cache: LayerCache, positions) -> torch.Tensor:
        """Decoding under ``self.method``: unrotated keys and values cached with their positions, the new rows
        through ``method_attention`` (equal to the parallel forward); a bounded method (sinks) then evicts every
        key but the n_sink first and the W last, so the cache stays at n_sink + W rows."""
        m = self.method
        assert m is not None  # ``decode`` calls it under a method
        last = cache.pos
        pos = _positions(positions, x.shape[1], 0 if last is None else int(last[-1]) + 1, x.device)
        q, k, v = self.project(x)
        every, (keys, values) = cache.add_positions(pos), cache.add_keys(k, v)
        out = method_attention(
            q,
            repeat_kv(keys, self.n_head),
            repeat_kv(values, self.n_head),
            pos,
            every,
            m,
            block_size=self.block,
            **scheme_args(self.enc, m, x),
        )
        if m.bounded and cache.length > m.kept:
            cache.drop(m.n_sink, cache.length - m.window)
        B, _, n, _ = out.shape
        return self.proj(out.transpose(1, 2).reshape(B, n, -1))

    def _attend_cached(self, q, k, v, phi, bias, cache: LayerCache) -> torch.Tensor:
        """The new queries over the cached keys (rotated once, by their own phases ``phi``) with the bias rows:
        the parallel core's operations on the new rows only (``_decode_reference`` is the reference). (B, H, n, Dv)."""
        enc, out_dtype = self.enc, v.dtype
        if phi is not None:
            dtype = rotation_dtype(q)
            cos, sin = cos_sin(phi, dtype)
            if phi.shape[1] > 1:  # per-head phases: keys differ per query head, the cache keeps all H
                k, v = repeat_kv(k, self.n_head), repeat_kv(v, self.n_head)
            q, k = (rotate_rows(t.to(dtype), cos, sin, enc.pairing) for t in (q, k))
            v = rotate_rows(v.to(dtype), cos, sin, enc.pairing) if enc.rotate_v else v.to(dtype)
        keys, values = cache.add_keys(k, v)
        out = attention(
            q,
            repeat_kv(keys, self.n_head),
            repeat_kv(values, self.n_head),
            bias=bias,
            logit_scale=enc.logit_scale,
            block_size=self.block,
            window=bound_window(enc.window, cache.evicted, cache.first),
        )
        if phi is not None and enc.rotate_v:
            out = rotate_rows(out, cos, sin, enc.pairing, sign=-1)
        return out.to(out_dtype)

    def _decode_reference(self, x, q, k, v, pos, tokens, cache: LayerCache) -> torch.Tensor:
        """The reference: the hooks over the whole prefix and the whole attention (schemes that replace it), last rows
        kept."""
        whole = self.enc.replaces_attention  # no query-suffix form: the whole attention, last rows kept
        cache.add_inputs(x, q if whole else None, k, v, pos, tokens)
        a = self.prepare(
            cache.x, cache.pos, cache.tokens, qkv=(cache.q if whole else q, cache.k, cache.v), first=cache.first
        )
        return self.output(a)[:, -x.shape[1] :]
