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
``attends_rotated``     (``attend``)         an attending scheme whose logits are
                                             q . k: a composition gives it q and k
                                             (and v) rotated by its rotary part
``attends_window``      (``attend``)         an attending scheme that applies the
                                             layer's ``window`` itself (others
                                             refuse a window)
``accumulates``         ``steps(inp)``       per-position step angles theta
                                             (B|1, H|1, T, P) whose float64 prefix
                                             sum is the phases (incremental
                                             decoding keeps the running sum)
``has_logits``          ``logits(...)``      an attending scheme's causal logits of
                                             one query block (its ``attend`` is a
                                             softmax of them; ``posenc diagnose``
                                             reads them)
(any of the above)      ``decoder()``        a :class:`DecodeState`: the same hooks
                                             for the new positions of a decoding
                                             step only (running phase, cumulative
                                             gates, transformed keys); None: the
                                             layer recomputes the hooks over the
                                             whole prefix (the reference)
======================  ===================  ======================================

A hook whose flag is False returns None. Flags may be set per instance in
``__init__`` (RoPE replaces attention only with the ReRoPE schedule). The test
``tests/encodings/test_contract.py`` builds every registered scheme and checks that each
flag matches what its hook returns. ``spectral_gap`` reports a rotary scheme's
step law (``posenc diagnose``); ``zero_init`` names the layers
the scheme starts at zero, which the model's weight initialisation leaves alone;
``neutral_init`` sets learned parts to start neutral on a pretrained model;
``uses_tokens`` marks schemes that read token ids.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

from posenc.attention import Bias, BiasFn, Window  # noqa: F401 (the bias hook's types, re-exported)
from posenc.errors import PosencError
from posenc.rope.schedules import wrap_phases


@dataclasses.dataclass(frozen=True)
class Dims:
    """Sizes an encoding is built for: PosencError (one line) unless n_head, head_dim, d_model and
    train_length are integers >= 1 and vocab_size, layer_index, seed integers >= 0 (vocab_size 0: no token ids).

    ``seed`` is the run's seed (``posenc train`` gives its ``train.seed``): a scheme that draws at random derives its
    draws from it and the layer index, so two training seeds draw different steps and one seed the same ones."""

    n_head: int
    head_dim: int
    d_model: int
    vocab_size: int
    train_length: int
    layer_index: int = 0
    seed: int = 0

    def __post_init__(self):
        for name, least in (
            ("n_head", 1),
            ("head_dim", 1),
            ("d_model", 1),
            ("vocab_size", 0),
            ("train_length", 1),
            ("layer_index", 0),
            ("seed", 0),
        ):
            check_int(getattr(self, name), name, least)


def check_int(value, name: str, least: int) -> None:
    """PosencError (one line) unless ``value`` is an int (not a bool) >= ``least``: a size or count of the public
    API (``Dims``', ``posenc.Attention``'s, a streaming perplexity's chunk)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise PosencError(f"{name} must be an integer >= {least}, got {value!r}")


@dataclasses.dataclass
class Inputs:
    """What a layer's encoding may look at.

    x: (B, T, d_model) the layer's (normalised) input; pos: (T,) int64 absolute
    positions; tokens: (B, T) int64 token ids, or None where the layer has none
    (a drop-in ``posenc.Attention``, a Hugging Face model): schemes that read them
    (``uses_tokens``) then raise PosencError. first: (B,) int64 for a left-padded
    batch (``attention_mask``), each row's first real position in pos's frame (pos
    then counts the padded rows from 0): positions before it are padding, and the
    row's own positions are pos - first (``row_positions``); None: no padding. The
    layer masks the padding keys; a hook whose value follows the positions along
    the sequence keeps the padding neutral (zero steps, identity transforms, zero
    convolution inputs), so a padded row equals the row alone.
    """

    x: torch.Tensor
    pos: torch.Tensor
    tokens: torch.Tensor | None = None
    first: torch.Tensor | None = None

    def row_positions(self) -> torch.Tensor:
        """Each row's own positions, (1, T) int64 without padding (pos), else (B, T): pos - first, 0 on the padding."""
        if self.first is None:
            return self.pos[None]
        return (self.pos[None] - self.first[:, None]).clamp(min=0)

    def real(self) -> torch.Tensor | None:
        """(B, T) bool, True at the real (not padding) positions; None without padding."""
        return None if self.first is None else self.pos[None] >= self.first[:, None]


def check_ids(ids: torch.Tensor, vocab_size: int | None, what: str) -> None:
    """PosencError (one line) unless ``ids`` is an int64 tensor (the only dtype both the embedding and the loss
    take: another is a raw RuntimeError from one of them, and a uint8 index a mask to a scheme's table) of
    ids in [0, vocab_size) (None: >= 0; the embedding and the loss would raise a raw IndexError, or assert on the
    device). One host sync; the range is skipped while torch.compile traces, as a graph cannot raise on a value (the
    eager forward checks)."""
    if not isinstance(ids, torch.Tensor) or ids.dtype != torch.int64:
        what_type = ids.dtype if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise PosencError(f"{what} must be an int64 tensor, got {what_type}")
    if torch.compiler.is_compiling() or ids.numel() == 0:
        return
    lo, hi = torch.stack(torch.aminmax(ids)).tolist()
    if lo < 0 or (vocab_size is not None and hi >= vocab_size):
        span = "be >= 0" if vocab_size is None else f"lie in [0, {vocab_size})"
        raise PosencError(f"{what} must {span}, got [{lo}, {hi}]")


def check_pos(pos, n: int | None = None) -> None:
    """PosencError (one line) unless ``pos`` is an int64 tensor of positions >= 0, of shape (n,) where ``n`` is given
    (``Inputs.pos`` for T = n): the contract of every scheme's hooks, checked where positions enter (``LM``,
    ``posenc.Attention``, a learned table's lookup). A float position would fail a learned table's lookup with a raw
    RuntimeError, a negative one index it from its end or give sinusoidal, FIRE and the others a value of no
    position. One host sync; skipped while torch.compile traces (as ``check_ids``)."""
    size, tail = ("", "") if n is None else (f"({n},) ", f" for T = {n}")
    if not isinstance(pos, torch.Tensor):
        raise PosencError(f"positions must be a {size}int64 tensor{tail}, got {type(pos).__name__}")
    if pos.dtype != torch.int64 or (n is not None and pos.shape != (n,)):
        raise PosencError(f"positions must be {size}int64{tail}, got shape {tuple(pos.shape)} {pos.dtype}")
    if not torch.compiler.is_compiling() and pos.numel() and int(pos.min()) < 0:
        raise PosencError(f"positions must be >= 0 (absolute positions count from 0), got {int(pos.min())}")


def batch_rows(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """t's rows ``index`` (B',) int64 along axis 0, the batch (beam search's reorder), on t's device."""
    return t.index_select(0, index.to(t.device))


def check_crop_length(length, held: int) -> None:
    """PosencError (one line) unless ``length`` is an integer in [0, ``held``]: the positions a crop of a cache of
    ``held`` positions keeps, checked before what the parts can undo."""
    if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= held:
        raise PosencError(
            f"cannot crop a cache of {held} positions to {length!r}: the length kept must be an integer in [0, {held}]"
        )


def check_rows(index, batch: int | None) -> None:
    """PosencError (one line) unless ``index`` is a (B',) integer tensor, B' >= 1, of rows of a batch of ``batch``
    (None: no batch yet, any row): what a cache's ``reorder`` checks before any part changes (a row past the batch
    would be an IndexError, or kept unseen where a part broadcasts a batch of 1; no row, a cache of batch size 0
    that the next step refuses). One host sync."""
    if not isinstance(index, torch.Tensor) or index.dim() != 1 or index.dtype not in (torch.int64, torch.int32):
        what = f"shape {tuple(index.shape)} {index.dtype}" if isinstance(index, torch.Tensor) else type(index).__name__
        raise PosencError(f"a reorder index must be a (rows,) int64 tensor, got {what}")
    if index.numel() == 0:
        raise PosencError("a reorder index must select at least one row, got none")
    if batch is not None:
        lo, hi = torch.stack(torch.aminmax(index)).tolist()
        if lo < 0 or hi >= batch:
            raise PosencError(f"reorder index rows must lie in [0, {batch}) (the cached batch), got [{lo}, {hi}]")


def tensor_nbytes(t: torch.Tensor | None) -> int:
    """Bytes of t's elements (numel x element size); 0 for None."""
    return 0 if t is None else t.numel() * t.element_size()


class CachePart:
    """A decoding cache or a part of one (:class:`Buffer`, :class:`DecodeState`, ``posenc.layer.LayerCache``,
    ``posenc.model.CanonState``, ``posenc.model.Cache``): ``crop(length)`` keeps the first ``length`` positions,
    ``reorder(index)`` selects batch rows (beam search; index (B',) int64 into the current batch), ``nbytes()``
    counts the bytes held (allocated capacity, not only the used rows). Each acts on every part ``parts()`` gives,
    in order; ``crop`` first asks every part ``check_crop`` (PosencError, one line, where one cannot go back), so a
    refused crop changes nothing. A class holding tensors of its own extends them (``batch_rows``,
    ``tensor_nbytes``)."""

    def parts(self) -> Sequence[CachePart]:
        return ()

    def check_crop(self, length: int) -> None:
        for part in self.parts():
            part.check_crop(length)

    def crop(self, length: int) -> None:
        self.check_crop(length)
        for part in self.parts():
            part.crop(length)

    def reorder(self, index: torch.Tensor) -> None:
        for part in self.parts():
            part.reorder(index)

    def nbytes(self) -> int:
        return sum(part.nbytes() for part in self.parts())


class Buffer(CachePart):
    """A tensor growing along axis ``dim`` inside preallocated storage whose capacity doubles.

    ``append(t)`` copies only t's rows (the prefix moves only when the capacity
    doubles: O(1) amortised per row, never a ``torch.cat`` of the whole prefix per
    step) and returns the view of all rows so far; ``capacity``: rows to reserve
    at the first append (PosencError, one line, unless an integer >= 0). ``batched``: axis 0 is the batch
    (``reorder`` selects its rows; a batch of 1 is kept, as one broadcast over a larger batch, unless the index is
    all 0: the row copied to each, beam search's first step from a batch of 1).
    """

    def __init__(self, dim: int, capacity: int = 0, batched: bool = True):
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
            raise PosencError(f"capacity must be an integer >= 0 (positions to reserve), got {capacity!r}")
        self.dim, self.capacity, self.batched = dim, capacity, batched
        self.data: torch.Tensor | None = None
        self.length = 0

    @property
    def value(self) -> torch.Tensor | None:
        return None if self.data is None else self._rows(self.data)

    def append(self, t: torch.Tensor) -> torch.Tensor:
        n, data = t.shape[self.dim], self.data
        if data is None or self.length + n > data.shape[self.dim]:
            size = 0 if data is None else data.shape[self.dim]
            shape = list(t.shape)
            shape[self.dim] = max(self.length + n, 2 * size, self.capacity)
            if self.batched and data is not None:  # the rows held (t may be a batch of 1 broadcast over them)
                shape[0] = data.shape[0]
            grown = t.new_empty(shape)
            if self.length:
                assert data is not None  # rows were appended before
                self._rows(grown).copy_(self._rows(data))
            self.data = data = grown
        data.narrow(self.dim, self.length, n).copy_(t)
        self.length += n
        return self._rows(data)

    def _rows(self, data: torch.Tensor) -> torch.Tensor:
        """The view of the rows held so far in ``data`` (the storage)."""
        return data.narrow(self.dim, 0, self.length)

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)

    def drop(self, start: int, stop: int) -> None:
        """Remove rows [start, stop), the later rows moving down in place (a bounded cache's eviction)."""
        assert self.data is not None  # rows [start, stop) are held
        tail = self.data.narrow(self.dim, stop, self.length - stop).clone()  # source and target may overlap
        self.data.narrow(self.dim, start, tail.shape[self.dim]).copy_(tail)
        self.length -= stop - start

    def reorder(self, index: torch.Tensor) -> None:
        if self.data is not None and self.batched and (self.data.shape[0] > 1 or not index.any()):
            self.data = batch_rows(self.data, index)

    def nbytes(self) -> int:
        return tensor_nbytes(self.data)


class DecodeState(CachePart):
    """A scheme's incremental decoding state in one layer (``Encoding.decoder``): its hooks for the new positions only.

    Per decoding step the layer calls, in this order and once each, the methods its
    scheme's flags name, with inp the n new positions' Inputs (x (B, n, d_model),
    pos (n,), tokens (B, n) or None) and pos the (T,) int64 positions of the whole
    cached sequence (these n last):

    - ``phases(inp)`` (``rotary``): the new positions' phases (B|1, H|1, n, P)
      float32+ in the absolute frame (the layer caches keys, and values with
      ``rotate_v``, rotated by them once);
    - ``bias(inp, pos)`` (``has_bias``): a Bias over the whole cached sequence,
      indexed by cache row, that the core asks only for the new query rows
      [T - n, T): O(n T) per step;
    - ``attend(q, k, v, inp, pos, bias, keys, values)`` (``replaces_attention``):
      q (B, H, n, Dk), k, v (B, Hkv, n, D) of the new positions; ``keys``, ``values``
      the layer's :class:`Buffer` s, which the state fills with keys and values in
      the form its attention reads (rotated, transformed); returns (B, H, n, Dv).

    This base class is a scheme without hooks (NoPE). ``per_head_keys``: the cached
    keys differ per query head (per-head phases, PaTH's transforms), so under
    grouped-query attention the layer gives ``attend`` (and caches) keys and values
    repeated to the H query heads. Its parts (:class:`CachePart`) are its Buffer
    attributes; a state with other running values extends ``crop``, ``reorder`` and
    ``nbytes`` (and ``check_crop``, PosencError where the state cannot go back).
    """

    per_head_keys = False

    def __init__(self, enc: Encoding):
        self.enc = enc

    if TYPE_CHECKING:  # the hooks, declared for the type checker only: a state has those its scheme's flags name

        def phases(self, inp: Inputs) -> torch.Tensor: ...

        def bias(self, inp: Inputs, pos: torch.Tensor) -> Bias: ...

        def attend(
            self, q, k, v, inp: Inputs, pos: torch.Tensor, bias: Bias | None, keys: Buffer, values: Buffer
        ) -> torch.Tensor: ...

    def buffers(self) -> list[Buffer]:
        return [b for b in vars(self).values() if isinstance(b, Buffer)]

    def parts(self) -> Sequence[CachePart]:
        return self.buffers()

    def drop(self, stop: int) -> None:
        """Forget the first ``stop`` positions' rows (a windowed layer's cache, which no later query reads them
        from); the running values stay (a crop below the dropped rows is refused by the layer's cache)."""
        for b in self.buffers():
            b.drop(0, stop)


class PositionState(DecodeState):
    """Hooks whose value at a position depends on the positions only (RoPE's phases; ALiBi, T5, Kerple
    and FIRE biases): the hooks themselves on the new positions (phases, O(n D)) or on the cached
    positions (the bias, of which the core evaluates the new rows only, O(n T)); no state."""

    def phases(self, inp: Inputs) -> torch.Tensor:
        phases = self.enc.phases(inp)
        assert phases is not None  # called for a rotary scheme only
        return phases

    def bias(self, inp: Inputs, pos: torch.Tensor) -> Bias:
        bias = self.enc.bias(Inputs(inp.x, pos, first=inp.first))
        assert bias is not None  # called for a scheme with a bias only
        return bias


class RunningPhaseState(DecodeState):
    """Phases that are the prefix sum of per-position steps (``accumulates``: the accumulated rotations).

    Keeps the running unwrapped float64 phase Phi_{T-1} (B|1, H, 1, P), the same
    sums as the parallel ``cumsum``; a step computes only the new positions'
    step angles (``steps``: one random draw per position, tanh(W x_t) of the new
    inputs, the new token ids' steps), adds their float64 prefix sum to Phi_{T-1}
    and returns them wrapped mod 2 pi in float32+. For ``crop`` only, it keeps
    every position's steps ``theta`` in their own dtype (float32 in a float32
    model: half the bytes of a float64 phase per position); a crop to L resets
    the running phase to their float64 sum over [0, L), the parallel forward's Phi_{L-1}.
    """

    per_head_keys = True

    def __init__(self, enc: Encoding):
        super().__init__(enc)
        self.theta = Buffer(-2)
        self.last: torch.Tensor | None = None

    def phases(self, inp: Inputs) -> torch.Tensor:
        theta = self.enc.steps(inp)
        assert theta is not None  # an accumulating scheme has steps
        self.theta.append(theta)
        phi = torch.cumsum(theta.to(torch.float64), dim=-2)
        if self.last is not None:
            phi = phi + self.last
        self.last = phi[..., -1:, :].clone()  # a copy: a view would keep the whole chunk's phases alive
        return wrap_phases(phi, inp.x.dtype)

    def crop(self, length: int) -> None:
        if length < self.theta.length:
            held = self.theta.value
            assert held is not None  # rows are held
            kept = held[..., :length, :].to(torch.float64)
            self.last = torch.cumsum(kept, dim=-2)[..., -1:, :] if length else None
        super().crop(length)

    def reorder(self, index: torch.Tensor) -> None:
        super().reorder(index)
        if self.last is not None and self.last.shape[0] > 1:  # a broadcast batch of 1 is kept
            self.last = batch_rows(self.last, index)

    def nbytes(self) -> int:
        return super().nbytes() + tensor_nbytes(self.last)


class KeepsPrecision(nn.Module):
    """A module whose floating buffers decide phases (frequencies, step laws, slopes): casts of the model
    (``.float()``, ``.half()``, ``.to(torch.bfloat16)``) move them to the new device but never lower their
    precision (``.double()`` may raise it). In bf16, RoPE's angle t * omega at t = 10^4 would be off by up to pi,
    and float32 frequencies put it 3.9e-3 rad off at t = 131072. Every scheme (:class:`Encoding`) is one; a
    transformers rotary embedding becomes one through :func:`keeping_precision`."""

    def _apply(self, fn, recurse=True):
        before = {n: b for n, b in self._buffers.items() if b is not None and b.is_floating_point()}
        super()._apply(fn, recurse)
        for n, b in before.items():
            now = self._buffers[n]
            if torch.finfo(now.dtype).bits < torch.finfo(b.dtype).bits:
                self._buffers[n] = b.to(now.device)
        return self


@functools.cache
def keeping_precision(cls: type) -> type:
    """``cls`` (an ``nn.Module`` class, e.g. transformers' ``LlamaRotaryEmbedding``) as a :class:`KeepsPrecision`:
    the same name, constructor and forward; one class per ``cls``."""
    if issubclass(cls, KeepsPrecision):
        return cls
    return type(cls.__name__, (KeepsPrecision, cls), {"__module__": __name__, "__qualname__": cls.__qualname__})


class Encoding(KeepsPrecision):
    """Base class: no positional information (NoPE). Subclasses override hooks."""

    name: str = "nope"
    additive: bool = False  # True: embed() at the input instead of attention hooks
    rotate_v: bool = False  # rotate values by Phi and the output by -Phi
    pairing: str = "half"  # rotary feature pairing: "half" (rotate_half) or "adjacent"
    logit_scale: float = 1.0  # multiplies q.k / sqrt(D) (YaRN attention factor squared)
    max_length: int | None = None  # longest input the scheme supports (learned table)
    internal: tuple[str, ...] = ()  # constructor parameters a scheme spec may not set
    family: str = "other"  # the group `posenc list` shows it in
    source: str = ""  # the paper (authors, year, arXiv id, equation)
    rotary: bool = False  # phases() gives rotation angles
    has_bias: bool = False  # bias() gives a score bias
    replaces_attention: bool = False  # attend() gives the attention output
    attends_rotated: bool = False  # attend() takes q, k (and v) rotated by a composition's rotary part (its logits q.k)
    has_logits: bool = False  # logits() gives an attending scheme's logits per query block
    uses_tokens: bool = False  # the hooks read Inputs.tokens (token ids), not only x and pos
    position_indexed: bool = False  # the hooks read Inputs.pos as positions (randomized training positions apply)
    accumulates: bool = False  # phases() is the float64 prefix sum of steps()
    window: Window | None = None  # the layer's sliding window or chunk (a spec's window= / chunk=); None: every key
    attends_window: bool = False  # attend() applies ``window`` itself, so a scheme replacing attention takes one
    instance_flags: tuple[str, ...] = ()  # capability flags the constructor sets (their hooks give None while unset)
    spec: str = (
        ""  # the full spec it was built from, every parameter given (set by posenc.encodings.get; "" if built directly)
    )

    def __init__(self, dims: Dims):
        super().__init__()
        self.dims = dims

    @classmethod
    def effective(cls, params: dict) -> dict:
        """The constructor's parameters as the scheme uses them, given ``params`` (every default filled in): a
        scheme whose default is resolved in ``__init__`` (None standing for a value) fills it here, so two
        spellings of one scheme have one ``encodings.canonical`` key."""
        return params

    @classmethod
    def applies_to(cls, params: dict) -> dict[str, str]:
        """The parameters that do nothing given ``params`` (every default filled in), each with the setting it
        applies to (``{"rope_theta": "center='rope'"}``): a spec that sets one is refused, the ``valid:`` list of
        an unknown parameter leaves them out, and ``get``'s ``defaults`` skip them. None by default."""
        return {}

    @classmethod
    def positions_supported(cls, dims: Dims) -> int | None:
        """The number of positions a layer of ``dims`` can take (a learned table's rows), known before it is
        built; None: any."""
        return None

    @classmethod
    def check_applies(cls, params: dict) -> None:
        """PosencError (one line) for a parameter in ``params`` (every constructor parameter) set away from its
        default where ``applies_to`` says it does nothing: the constructor's form of the spec's refusal, for a
        scheme built directly (``Accumulated(dims, center="rope", a=0.5)``)."""
        defaults = {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items() if k in params}
        for key, where in cls.applies_to(params).items():
            if params[key] != defaults[key]:
                raise PosencError(f"scheme {cls.name!r}: {key} applies to {where} only; here it would do nothing")

    def extra_repr(self) -> str:
        """The spec, then the parameters a spec cannot set (``internal``) that are set:
        ``RoPE(rope:rope_theta=500000)``."""
        internal = [f"{k}={getattr(self, k)!r}" for k in self.internal if getattr(self, k, None) is not None]
        return ", ".join([self.spec, *internal] if self.spec else internal)

    def embed(self, pos: torch.Tensor) -> torch.Tensor | None:
        return None

    def phases(self, inp: Inputs) -> torch.Tensor | None:
        return None

    def steps(self, inp: Inputs) -> torch.Tensor | None:
        return None

    def bias(self, inp: Inputs) -> Bias | None:
        return None

    def attend(self, q, k, v, inp: Inputs, bias: Bias | None = None) -> torch.Tensor | None:
        """q, k: (B, H, T, Dk), v: (B, H, T, Dv) -> (B, H, T, Dv); ``bias``: the other parts' score bias."""
        return None

    def logits(self, q, k, inp: Inputs, bias: Bias | None, qs: int, qe: int) -> torch.Tensor | None:
        """Causal logits of queries [qs, qe) over keys [0, qe): (B, H, qe-qs, qe) float32+, -inf above the diagonal."""
        return None

    def attend_by_logits(self, q, k, v, inp: Inputs, bias: Bias | None, block_size: int) -> torch.Tensor:
        """``attend`` of a scheme with ``logits``: softmax per query block of ``block_size``, then values; (B, H, T, Dv)
        in v's dtype."""
        T, out = q.shape[-2], []
        for qs in range(0, T, block_size):
            qe = min(qs + block_size, T)
            logits = self.logits(q, k, inp, bias, qs, qe)
            assert logits is not None  # a scheme with ``has_logits``
            out.append(torch.softmax(logits, dim=-1).to(v.dtype) @ v[..., :qe, :])
        return torch.cat(out, dim=-2)

    def decoder(self) -> DecodeState | None:
        """A fresh incremental decoding state for one layer's cache (``DecodeState``), or None: no incremental
        form, so decoding recomputes the hooks over the whole prefix at each step (the reference). Default: the
        stateless NoPE state for a scheme without hooks, the running phase for ``accumulates``, else None (a new
        scheme is exact before it is fast)."""
        if self.accumulates and not (self.has_bias or self.replaces_attention):
            return RunningPhaseState(self)
        return None if (self.rotary or self.has_bias or self.replaces_attention) else DecodeState(self)

    def length_key(self, length: int) -> Hashable:
        """What the hooks depend on besides the positions, for a sequence of ``length`` positions: None (the
        default) when nothing; RoPE's dynamic NTK and LongRoPE: their frequencies at that length. A scheme whose
        key varies decodes by the reference (``decoder()`` None); a model decoding with a cache re-runs its
        prefix when a layer's key changes, as the later layers' cached inputs came from the old value
        (``posenc.model.LM.decode``)."""
        return None

    def spectral_gap(self) -> torch.Tensor | None:
        """(D/2,) float64 |E exp(i theta_b)| of the step law per frequency block, or None (no step law)."""
        return None

    def zero_init(self) -> tuple[nn.Module, ...]:
        """Layers this scheme initialises to zero (the model's normal init skips them)."""
        return ()

    def neutral_init(self) -> None:
        """Set the learned parts (if any) so the scheme starts as close as it can to adding nothing learned:
        used when a scheme is attached to a pretrained model (``posenc.hf.scheme.apply_scheme``). Default: nothing."""

    def describe(self) -> str:
        """One line for reports: the scheme and its parameters (here the full spec, every parameter given:
        a scheme that overrides this names the parameters it was built with)."""
        return self.spec or self.name
