"""Decoder-only pre-norm transformer with any positional scheme by name.

nanoGPT-shaped: token embedding (tied with the output head), optional additive
position embedding, ``n_layer`` blocks of attention + MLP, final norm. Every
attention layer goes through ``posenc.attention.attention`` with its scheme's
hooks.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator, Sequence
from typing import Any, Literal, cast, get_args

import torch
import torch.nn.functional as F
from torch import nn

from posenc import encodings, methods, scoring
from posenc.encodings.base import (
    Buffer,
    CachePart,
    Dims,
    Encoding,
    batch_rows,
    check_crop_length,
    check_ids,
    check_pos,
    check_rows,
    tensor_nbytes,
)
from posenc.encodings.rotary import RoPE
from posenc.errors import PosencError
from posenc.layer import Attention, AttentionInputs, LayerCache, check_padding, padding_starts
from posenc.rope import schedule_label, schedule_params

Mlp = Literal["gelu", "swiglu"]
Norm = Literal["rmsnorm", "layernorm"]
_POSITIVE = {
    "vocab_size": int,
    "n_layer": int,
    "n_head": int,
    "d_model": int,
    "mlp_ratio": (int, float),
    "train_length": int,
    "attn_block_size": int,
    "n_kv_head": int,
}


@dataclasses.dataclass
class ModelConfig:
    """Model hyper-parameters; lengths are in tokens. ``n_kv_head``: grouped-query attention (None: ``n_head``).

    Raises ValueError (naming the field) for a size that is not a positive number (an integer size: or not below
    2^31), a ``canon`` width that is not an integer in [0, train_length], an unknown ``mlp`` or ``norm``, a spec that
    is not a str, params that are not a dict, or heads that do not divide evenly. As a field of a pydantic model (a
    preset's ``model``) it is validated by pydantic, which coerces the types first and turns the ValueError into a
    ValidationError; from a dict of settings: :func:`build_model`.
    """

    __pydantic_config__ = {
        "extra": "forbid",
        "use_attribute_docstrings": True,
        "allow_inf_nan": False,
    }  # read by pydantic when it validates this: unknown keys and non-finite numbers refused

    vocab_size: int = 256
    """Vocabulary size (tokens, > 0); a run sets it from its data's tokenizer."""
    n_layer: int = 4
    """Transformer blocks (> 0)."""
    n_head: int = 4
    """Attention heads per block (> 0); divides ``d_model``."""
    d_model: int = 256
    """Width of the residual stream (features, > 0)."""
    mlp: Mlp = "gelu"
    """Feed-forward block: ``gelu`` (two matrices) or ``swiglu`` (three)."""
    mlp_ratio: float = 4.0
    """Hidden width of the feed-forward block, as a multiple of ``d_model`` (> 0)."""
    norm: Norm = "rmsnorm"
    """Normalisation before attention and MLP: ``rmsnorm`` or ``layernorm``."""
    train_length: int = 128
    """Training sequence length (tokens, > 0); evaluation lengths are multiples of it."""
    encoding: str = "rope"
    """The positional scheme (``posenc list``); a comparison sets it per scheme from ``schemes``."""
    encoding_params: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Parameters of the scheme (a mapping; a spec's ``:k=v`` parts do the same)."""
    attn_block_size: int = 512
    """Query/key block of the chunked attention (tokens, > 0): memory and speed only, never the result."""
    n_kv_head: int | None = None
    """Key/value heads (grouped-query attention; > 0, divides ``n_head``); null: ``n_head``."""
    canon: int = 0
    """Width (tokens, 0 to ``train_length``) of a Canon-A layer before every attention (``posenc.model.Canon``): the
    normalised attention input plus a causal depthwise convolution of it over this many positions; 0: none."""
    seed: int = 0
    """Seed of the scheme's own random draws (integer >= 0; the random accumulated rotations' steps): training sets
    it to ``train.seed`` (``posenc.train.loop.train``), so every draw of a run comes from the run's seed; a spec's
    explicit ``seed=`` overrides it."""

    def __post_init__(self):
        for name, kind in _POSITIVE.items():
            value = getattr(self, name)
            if not (
                isinstance(value, kind)
                and not isinstance(value, bool)
                and 0 < value < math.inf
                or name == "n_kv_head"
                and value is None
            ):  # a bool is an int to Python (True layers built one), inf a float (an OverflowError at the MLP)
                raise ValueError(
                    f"{name} must be {'an integer' if kind is int else 'a finite number'} > 0, got {value!r}"
                )
            if kind is int and value is not None and value >= 2**31:  # before the heads: a size, not "not divisible"
                raise ValueError(f"{name} must be an integer below 2^31 (a size), got {value!r}")
        if isinstance(self.canon, bool) or not isinstance(self.canon, int) or not 0 <= self.canon <= self.train_length:
            raise ValueError(
                f"canon must be an integer in [0, train_length {self.train_length}] (a width in tokens; 0: none), "
                f"got {self.canon!r}"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**31:
            raise ValueError(f"seed must be an integer in [0, 2^31), got {self.seed!r}")
        for name, choices in (("mlp", get_args(Mlp)), ("norm", get_args(Norm))):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {', '.join(choices)}, got {getattr(self, name)!r}")
        for name, kind in (("encoding", str), ("encoding_params", dict)):
            if not isinstance(getattr(self, name), kind):
                raise ValueError(f"{name} must be a {kind.__name__}, got {type(getattr(self, name)).__name__}")
        if self.d_model % self.n_head:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_head {self.n_head}")
        if int(self.mlp_ratio * self.d_model) < 1:  # a 0-wide MLP would train a model without one
            raise ValueError(f"mlp_ratio {self.mlp_ratio:g} x d_model {self.d_model} leaves the MLP no hidden unit")
        if self.n_kv_head is not None and self.n_head % self.n_kv_head:
            raise ValueError(f"n_head {self.n_head} is not divisible by n_kv_head {self.n_kv_head}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    def dims(self, layer_index: int = 0) -> Dims:
        """The sizes layer ``layer_index``'s scheme is built for."""
        return Dims(
            self.n_head, self.head_dim, self.d_model, self.vocab_size, self.train_length, layer_index, self.seed
        )

    def distinct_layers(self) -> range:
        """Indices of the layers whose schemes can differ (a '|' pattern repeats after its length); PosencError
        (one line) for a pattern longer than ``n_layer`` (``posenc.encodings.check_layer_count``)."""
        encodings.check_layer_count(self.encoding, self.n_layer)
        return range(len(encodings.layer_pattern(self.encoding)))

    def layer_schemes(self) -> list[Encoding]:
        """The scheme of each distinct layer, built (PosencError, one line, if the encoding is invalid)."""
        return [encodings.get(self.encoding, self.dims(i), **self.encoding_params) for i in self.distinct_layers()]

    def check_encoding(self) -> None:
        """Build the scheme of each distinct layer once: PosencError (one line) before any work if it is invalid or
        a '|' pattern longer than ``n_layer``."""
        self.layer_schemes()


class Cache(CachePart):
    """Incremental decoding state of an ``LM`` (``LM.decode``): the token ids so far ``tokens`` (B, T), one
    LayerCache per layer and, for a model with a Canon layer, its last inputs per layer (``canon``).
    ``reference=True`` recomputes every scheme's hooks over the prefix at each step (the reference the incremental
    states are tested against); ``capacity``: positions reserved at the first step
    (buffers double past it). ``first``: (B,) int64, each row's first real position of a left-padded batch
    (its first step's ``attention_mask``), None without padding. ``crop``, ``reorder``, ``nbytes``:
    :class:`posenc.encodings.base.CachePart`'s, over the Canon states, the layers and the token ids. PosencError
    (one line) for ``n_layer`` not an integer >= 1 or ``capacity`` not one >= 0."""

    def __init__(self, n_layer: int, reference: bool = False, capacity: int = 0):
        if isinstance(n_layer, bool) or not isinstance(n_layer, int) or n_layer < 1:
            raise PosencError(f"a Cache's n_layer must be an integer >= 1 (the model's layers), got {n_layer!r}")
        self._n_layer, self._reference, self._capacity = n_layer, reference, capacity
        self.clear()

    def clear(self) -> None:
        """Forget every position (the same number of layers, mode and capacity): ``LM.decode`` re-runs the
        prefix through it when a layer's frequencies change with the length."""
        self._tokens = Buffer(-1, self._capacity)
        self.uncounted = 0  # positions fed but not kept in ``tokens`` (a bounded method: sinks)
        self.layers = [LayerCache(self._reference, self._capacity) for _ in range(self._n_layer)]
        self.canon = [CanonState() for _ in range(self._n_layer)]  # used by models with a Canon layer
        self.length_keys: tuple | None = None  # the layers' Encoding.length_key the cached inputs were computed under
        self.first: torch.Tensor | None = None  # set by the first step

    @property
    def tokens(self) -> torch.Tensor | None:
        return self._tokens.value

    @property
    def length(self) -> int:
        """Positions fed so far (with a bounded method, more than the layers keep)."""
        return self._tokens.length + self.uncounted

    def add_tokens(self, tokens: torch.Tensor, kept: bool = True) -> None:
        """Count the new positions' ids (B, n) int64, holding them unless ``kept`` is False (a bounded method:
        sinks, whose memory stays flat)."""
        if kept:
            self._tokens.append(tokens)
        else:
            self.uncounted += tokens.shape[1]

    def parts(self) -> list[CachePart]:
        return [*self.canon, *self.layers, self._tokens]

    def check_crop(self, length: int) -> None:
        """PosencError (one line) unless ``crop(length)`` can keep the first ``length`` positions: not if it is not an
        integer in [0, the cached length] (``check_crop_length``, checked first), a scheme cannot go back (PaTH), the
        model has a Canon layer (its earlier inputs are not kept), or the cache is bounded (sinks, or a windowed
        layer that dropped keys: the evicted positions are gone)."""
        check_crop_length(length, self.length)
        if self.uncounted:
            raise PosencError("a bounded cache (sinks) cannot be cropped: the evicted positions are gone")
        super().check_crop(length)

    def reorder(self, index: torch.Tensor) -> None:
        """Select batch rows, e.g. the surviving beams: index (B',) int64 into the current batch (a batch of 1 to
        [0] * B', beam search's first step: B' copies of the row); PosencError (one line) for another index or a row
        outside the batch (``check_rows``), before any part changes."""
        check_rows(index, self.layers[0].batch)  # every layer holds the batch of the first step
        super().reorder(index)
        if self.first is not None:
            self.first = batch_rows(self.first, index)


def _norm(cfg: ModelConfig) -> nn.Module:
    return nn.RMSNorm(cfg.d_model) if cfg.norm == "rmsnorm" else nn.LayerNorm(cfg.d_model)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        hidden = int(cfg.mlp_ratio * cfg.d_model)
        self.swiglu = cfg.mlp == "swiglu"
        if self.swiglu:
            hidden = 2 * hidden // 3  # same parameter count as the GELU MLP
        self.up = nn.Linear(cfg.d_model, hidden * (2 if self.swiglu else 1), bias=False)
        self.down = nn.Linear(hidden, cfg.d_model, bias=False)

    def forward(self, x):
        h = self.up(x)
        if self.swiglu:
            a, b = h.chunk(2, dim=-1)
            return self.down(F.silu(a) * b)
        return self.down(F.gelu(h))


class Canon(nn.Module):
    """Canon-A layer (Allen-Zhu 2025, "Physics of Language Models: Part 4.1", arXiv 2512.17351): h + conv(h), conv a
    causal depthwise convolution over ``width`` positions (each feature mixes its own value at t - width + 1 .. t),
    no bias, ``nn.Conv1d``'s default initialisation; its weight (d, 1, width) is a matrix to the optimiser, so it
    takes weight decay, which pulls the layer towards the identity. The horizontal mixing an induction step needs (a
    token's predecessor in its own residual), which a position-only attention must otherwise learn with a head of
    its own.

    ``forward``: h (B, T, d) -> (B, T, d) in h's dtype; ``step``: the new positions given the ``width - 1`` inputs
    before them (decoding). ``canon_naive`` is the reference.
    """

    def __init__(self, d_model: int, width: int):
        super().__init__()
        self.conv = nn.Conv1d(d_model, d_model, width, groups=d_model, bias=False)

    @property
    def width(self) -> int:
        """Positions each output mixes (tokens), its own included."""
        return self.conv.kernel_size[0]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.step(h, h.new_zeros(h.shape[0], self.width - 1, h.shape[2]))

    def step(self, h: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
        """h (B, n, d) the new positions, ``before`` (B, width - 1, d) the inputs before them (zeros at the start)
        -> (B, n, d) in h's dtype."""
        u = torch.cat((before, h), dim=1).transpose(1, 2)
        return h + F.conv1d(u, self.conv.weight, groups=u.shape[1]).transpose(1, 2)


def canon_naive(h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Reference of ``Canon``: out[b, t] = h[b, t] + sum_s weight[:, 0, width - 1 - s] * h[b, t - s] over s < width,
    t - s >= 0, by a loop over the shifts. h (B, T, d), weight (d, 1, width), one float dtype -> (B, T, d) in it."""
    out, width = h.clone(), weight.shape[-1]
    for s in range(min(width, h.shape[1])):
        out[:, s:] += weight[:, 0, width - 1 - s] * h[:, : h.shape[1] - s]
    return out


class CanonState(CachePart):
    """The last ``width - 1`` Canon inputs of a layer while decoding (B, width - 1, d), zeros before the start."""

    def __init__(self):
        self.before: torch.Tensor | None = None
        self.length = 0

    def step(self, canon: Canon, h: torch.Tensor) -> torch.Tensor:
        """Canon of the new positions h (B, n, d); keeps their inputs for the next step."""
        if self.before is None:
            self.before = h.new_zeros(h.shape[0], canon.width - 1, h.shape[2])
        out = canon.step(h, self.before)
        self.before = torch.cat((self.before, h), dim=1)[:, h.shape[1] :]
        self.length += h.shape[1]
        return out

    def check_crop(self, length: int) -> None:
        """Nothing at the state's own length; PosencError below it (the inputs before the last ones are gone)."""
        if length < self.length:
            raise PosencError("a model with a Canon layer cannot crop its decoding cache: earlier inputs are not kept")

    def reorder(self, index: torch.Tensor) -> None:
        if self.before is not None:
            self.before = batch_rows(self.before, index)

    def nbytes(self) -> int:
        """Bytes held: the kept inputs."""
        return tensor_nbytes(self.before)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_index: int):
        super().__init__()
        self.norm1, self.norm2 = _norm(cfg), _norm(cfg)
        self.attn = Attention.from_config(cfg, layer_index)
        self.mlp = MLP(cfg)
        self.canon = Canon(cfg.d_model, cfg.canon) if cfg.canon else None

    def prepare(self, x, pos, tokens, first: torch.Tensor | None = None) -> AttentionInputs:
        """``first``: (B,) int64, a left-padded batch's first real rows (``posenc.layer.padding_starts``) or None."""
        h = self.norm1(x)
        h = h if self.canon is None else self.canon(_zero_padding(h, pos, first))
        return self.attn.prepare(h, pos, tokens, first=first)

    def forward(self, x, pos, tokens, captured: AttentionInputs | None = None, first: torch.Tensor | None = None):
        """``captured``: this block's ``prepare(x, ...)`` if already computed; ``first`` as ``prepare``."""
        if captured is None:
            captured = self.prepare(x, pos, tokens, first)
        x = x + self.attn.output(captured)
        return x + self.mlp(self.norm2(x))

    def decode(self, x, cache: LayerCache, pos, tokens, canon: CanonState, first: torch.Tensor | None = None):
        """x: (B, n, d_model), pos: (n,), tokens: (B, n): the new positions only; ``canon``: this layer's Canon
        state (unused without a Canon layer); ``first``: a left-padded batch's first real rows, at the first step
        only (as ``Attention._decode``)."""
        h = self.norm1(x)
        h = h if self.canon is None else canon.step(self.canon, _zero_padding(h, pos, first))
        x = x + self.attn._decode(h, cache, pos, tokens, first)
        return x + self.mlp(self.norm2(x))


def _zero_padding(h: torch.Tensor, pos: torch.Tensor, first: torch.Tensor | None) -> torch.Tensor:
    """h (B, T, d) with the rows before ``first`` (B,) (left padding; ``pos`` (T,) their rows) set to 0: a Canon
    layer's input, whose convolution then reads zeros before a row's first token, as the row alone does."""
    return h if first is None else h * (pos[None, :, None] >= first[:, None, None])


def check_tokens(tokens, n: str = "T") -> None:
    """PosencError (one line) unless ``tokens`` is a tensor of shape (batch, ``n``), both >= 1: the token ids
    ``LM.forward`` and ``decode`` take (``check_ids`` then checks their dtype and range). A list is refused, not
    converted (``generate`` takes one: a prompt); a batch of 0 rows was a raw RuntimeError from a reshape."""
    if not isinstance(tokens, torch.Tensor):
        raise PosencError(
            f"tokens must be a (batch, {n}) int64 tensor (torch.tensor(ids); generate takes a list too), "
            f"got {type(tokens).__name__}"
        )
    if tokens.dim() != 2 or 0 in tokens.shape:
        raise PosencError(f"tokens must be (batch, {n}) with batch >= 1 and {n} >= 1, got shape {tuple(tokens.shape)}")


class LM(nn.Module):
    """Decoder-only language model of a ``ModelConfig`` (PosencError, one line, for another type: ``build_model``
    takes a dict). ``forward(tokens)`` (B, T) int64 -> logits (B, T, vocab) (PosencError for ids outside the
    vocabulary)."""

    def __init__(self, cfg: ModelConfig):
        if not isinstance(cfg, ModelConfig):
            raise PosencError(
                f"LM takes a ModelConfig (build_model takes a dict of its settings too), got {type(cfg).__name__}"
            )
        super().__init__()
        self.cfg = cfg
        encodings.check_layer_count(cfg.encoding, cfg.n_layer)  # no draw: the initial weights stay the same
        check_fits(cfg)
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        additive = encodings.is_additive(cfg.encoding)
        self.pos_embed = encodings.get(cfg.encoding, cfg.dims(), **cfg.encoding_params) if additive else None
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layer))
        self.norm = _norm(cfg)
        self._init_weights()
        for name, p in self.named_parameters():  # GPT-2 scaled init of residual projections
            if name.endswith(("proj.weight", "down.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @property
    def _blocks(self) -> Sequence[Block]:
        """``blocks`` as the Blocks they are (a type checker sees an nn.ModuleList of nn.Module)."""
        return cast("Sequence[Block]", self.blocks)

    @property
    def method(self) -> methods.Method | None:
        """The inference method every layer attends under (``set_method``), or None."""
        return self._blocks[0].attn.method

    def _init_weights(self) -> None:
        """N(0, 0.02^2) for every Linear and Embedding weight except the layers a scheme starts at zero
        (``Encoding.zero_init``, e.g. the learned step map: the model starts without rotation)."""
        keep = {id(m) for enc in self.modules() if isinstance(enc, Encoding) for m in enc.zero_init()}
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)) and id(m) not in keep:
                nn.init.normal_(m.weight, std=0.02)

    def _embed(
        self, tokens: torch.Tensor, pos: torch.Tensor | None, first: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Token (and additive position) embeddings (B, T, d_model) and the positions (T,); ``first`` (B,): a
        left-padded batch's first real rows, whose additive embeddings take each row's own positions, pos - first."""
        check_tokens(tokens)
        if pos is not None:
            check_pos(pos, tokens.shape[1])
        check_ids(tokens, self.cfg.vocab_size, "token ids")
        pos = torch.arange(tokens.shape[1], device=tokens.device) if pos is None else pos
        x = self.tok(tokens)
        if self.pos_embed is not None:
            emb = self.pos_embed.embed(pos if first is None else (pos[None] - first[:, None]).clamp(min=0))
            assert emb is not None  # an additive scheme
            x = x + emb.to(x.dtype)
        return x, pos

    def hidden(
        self, tokens: torch.Tensor, pos: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """tokens: (B, T) int64 -> final hidden states (B, T, d_model); ``pos``, ``attention_mask`` as ``forward``.
        PosencError for a bad shape, ids outside the vocabulary, or a mask ``forward`` refuses."""
        first = self._padding(tokens, pos, attention_mask)
        x, pos = self._embed(tokens, pos, first)
        for block in self.blocks:
            x = block(x, pos, tokens, first=first)
        return self.norm(x)

    def _padding(self, tokens: torch.Tensor, pos: torch.Tensor | None, attention_mask) -> torch.Tensor | None:
        """``padding_starts`` of ``attention_mask`` for tokens (B, T), checked against every layer
        (``posenc.layer.check_padding``) before any runs; PosencError for a mask given with positions."""
        if attention_mask is None:
            return None
        if pos is not None:
            raise PosencError("give an attention_mask or positions, not both: the mask sets each row's positions")
        check_tokens(tokens)
        first = padding_starts(attention_mask, tokens.shape[0], tokens.shape[1], tokens.device)
        for block in self._blocks:
            check_padding(block.attn.enc, block.attn.method, first, tokens.shape[1])
        return first

    def prepare(self, tokens: torch.Tensor, pos: torch.Tensor | None = None) -> Iterator[AttentionInputs]:
        """Run the model on ``tokens`` (B, T) and yield each layer's AttentionInputs (its ``Attention.prepare``), first
        layer first.

        Each layer runs after its inputs are yielded (from the same capture), so a
        consumer holds one layer's q, k, v at a time (diagnostics, ``posenc.eval.diagnose``).
        """
        x, pos = self._embed(tokens, pos)
        for block in self._blocks:
            captured = block.prepare(x, pos, tokens)
            yield captured
            x = block(x, pos, tokens, captured)

    def forward(
        self, tokens: torch.Tensor, pos: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logits (B, T, vocab) of tokens (B, T) int64 at positions ``pos`` (T,) int64 >= 0 (None: 0..T-1).

        attention_mask: (B, T) left padding as transformers gives it (1 or True: a token, 0: padding, each row 0s
        then 1s; ``pad_left`` builds it), without ``pos``: each row's positions count from its first token
        (cumsum(mask) - 1), no token attends to padding, and every scheme keeps the padding neutral, so a row's
        logits at its tokens equal the row alone's (float32 rounding; at the padding they mean nothing).
        PosencError (one line) for tokens that are not a (B, T) tensor with B, T >= 1 (``check_tokens``: a list too;
        ``generate`` takes one), positions ``check_pos`` refuses (not (T,) int64, or negative), a mask
        ``posenc.layer.padding_starts`` refuses, under an inference method
        (``set_method``), or with a length-dependent RoPE schedule (dynamic NTK, LongRoPE) whose frequencies the
        rows' lengths would set apart.
        """
        return self.hidden(tokens, pos, attention_mask) @ self.tok.weight.T

    def decode(self, tokens: torch.Tensor, cache: Cache, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Feed the next n tokens (B, n) int64 through ``cache`` (updated in place): their logits (B, n, vocab).

        A prompt may be fed at once or in chunks and then one token at a time; the
        logits equal those of the parallel forward of the prefix so far at the same
        positions, for every scheme and schedule (dynamic NTK and LongRoPE: the
        frequencies of the current length). When a layer's frequencies change with
        the length (``Encoding.length_key``: dynamic NTK at every step past L0,
        LongRoPE once, past L0) on a model of more than one layer, the step re-runs
        the whole prefix (the deeper layers' cached inputs were computed under the
        old ones): exact, at the cost of a parallel forward of the prefix.
        attention_mask: (B, n) left padding of a batch of prompts (as ``forward``), at the first step only (the
        cache keeps it: later steps' tokens are each row's next ones); each row's logits equal the row alone's.
        Raises PosencError for tokens that are not a (B, n) tensor with B, n >= 1 (``check_tokens``), token ids that
        are not int64 or lie outside the vocabulary, a cache that is not a :class:`Cache` or of another number of
        layers or batch size, a length beyond a learned position table, or a mask ``forward`` refuses or given after
        the first step.
        """
        check_tokens(tokens, "n")
        check_ids(tokens, self.cfg.vocab_size, "token ids")  # before the cache's prefix joins them
        if not isinstance(cache, Cache):
            raise PosencError(f"cache must be a posenc.model.Cache (one per model), got {type(cache).__name__}")
        if len(cache.layers) != len(self.blocks):
            raise PosencError(
                f"the cache has {len(cache.layers)} layers, the model {len(self.blocks)}: use Cache({len(self.blocks)})"
            )
        if cache.tokens is not None and cache.tokens.shape[0] != tokens.shape[0]:
            raise PosencError(f"the cache holds batch size {cache.tokens.shape[0]}, got {tokens.shape[0]} new rows")
        n = tokens.shape[1]
        first = cache.first
        if attention_mask is not None:
            if cache.length:
                raise PosencError(
                    "an attention_mask goes with the first step only (the padding comes before every token); "
                    "the cache keeps it"
                )
            first = padding_starts(attention_mask, tokens.shape[0], n, tokens.device)
        for block in self._blocks:  # before any layer changes
            check_padding(block.attn.enc, block.attn.method, first, cache.length + n)
        cache.first = first
        keys = self._length_keys(cache.length + n)
        if cache.length and keys != cache.length_keys:  # the deeper layers' cached inputs came from other frequencies
            assert cache.tokens is not None  # the ids of the cached positions
            tokens = torch.cat((cache.tokens, tokens), dim=1)
            cache.clear()
            cache.first = first
        cache.length_keys = keys
        pos = torch.arange(cache.length, cache.length + tokens.shape[1], device=tokens.device)
        x, _ = self._embed(tokens, pos, cache.first)
        padding = None if cache.length else cache.first  # the layers take it at their first step
        for block, layer, canon in zip(self._blocks, cache.layers, cache.canon):
            x = block.decode(x, layer, pos, tokens, canon, padding)
        cache.add_tokens(tokens, kept=self.method is None or not self.method.bounded)
        return self.norm(x[:, -n:]) @ self.tok.weight.T

    def _length_keys(self, length: int) -> tuple:
        """``Encoding.length_key`` of every layer but the last at ``length`` positions: the last layer's cached
        inputs depend on no layer's frequencies, and a scheme whose key varies decodes by the reference
        (its hooks recomputed over the prefix), so only a change here leaves a cached input stale."""
        return tuple(block.attn.enc.length_key(length) for block in self._blocks[:-1])

    def check_length(self, length: int) -> None:
        """PosencError if some layer's scheme (a learned position table) cannot take ``length`` tokens."""
        limit = None if self.pos_embed is None else self.pos_embed.max_length  # only additive tables have one
        if limit is not None and length > limit:
            raise PosencError(f"{length} tokens exceed the learned position table of {limit} positions")

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        seed: int | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The prompt (B, T) or (T,) int64 (a tensor, or a list of ints) followed by ``max_new_tokens`` sampled
        tokens: (B, T + n) or (T + n,) int64.

        temperature 0 is greedy; top_k keeps the k most likely tokens; seed makes
        sampling reproducible. Runs in evaluation mode (fixed random draws) with
        the KV cache (``decode``). attention_mask: (B, T) left padding of prompts of
        different lengths (``pad_left`` builds both), as ``forward``: each row's tokens
        are those it would get alone (greedy; sampled rows draw from one generator in
        batch order), its padding kept at the left of the result. Raises PosencError
        for an empty prompt, ids that are not int64 or lie outside the vocabulary (``check_ids``), a bad argument
        (``check_sampling``: a seed that is not an integer in [0, 2^64)) or a mask ``forward`` refuses.
        """
        check_sampling(max_new_tokens, temperature, top_k, seed, self.cfg.vocab_size)
        if not isinstance(prompt_ids, torch.Tensor):  # a list of ids is as good as a tensor; checked below
            try:
                prompt_ids = torch.as_tensor(prompt_ids, device=self.tok.weight.device)
            except (TypeError, ValueError, RuntimeError):
                raise PosencError(
                    f"the prompt must be token ids (a tensor or a list of ints), got {type(prompt_ids).__name__}"
                ) from None
        flat = prompt_ids.dim() == 1
        ids = prompt_ids[None] if flat else prompt_ids
        if ids.dim() != 2 or 0 in ids.shape:
            raise PosencError(
                "the prompt must be (T,) or (batch, T) token ids, batch >= 1 and T >= 1; "
                f"got shape {tuple(prompt_ids.shape)}"
            )
        check_ids(ids, self.cfg.vocab_size, "prompt token ids")
        mask = attention_mask[None] if flat and isinstance(attention_mask, torch.Tensor) else attention_mask
        first = padding_starts(mask, ids.shape[0], ids.shape[1], ids.device)
        self.check_length(ids.shape[1] - (0 if first is None else int(first.min())) + max_new_tokens)
        self._check_padded_steps(first, ids.shape[1], max_new_tokens)
        gen = None if seed is None else torch.Generator(ids.device).manual_seed(seed)
        was_training, cache, out = self.training, Cache(len(self.blocks)), [ids]
        self.eval()
        try:
            logits = self.decode(ids, cache, mask)[:, -1]
            for i in range(max_new_tokens):
                out.append(sample(logits, temperature, top_k, gen))
                if i + 1 < max_new_tokens:
                    logits = self.decode(out[-1], cache)[:, -1]
        finally:
            self.train(was_training)
        result = torch.cat(out, dim=1)
        return result[0] if flat else result

    def _check_padded_steps(self, first: torch.Tensor | None, length: int, max_new_tokens: int) -> None:
        """``posenc.layer.check_padding`` at every length a generation of ``max_new_tokens`` from ``length`` padded
        positions decodes at, before the first step: a length-dependent schedule that would set the rows apart
        only later (LongRoPE past L0) is refused before any token is generated."""
        if first is None:
            return
        gap = int(first.max())  # the shortest row's padding
        for block in self._blocks:
            enc = block.attn.enc
            for at in range(length, length + max_new_tokens):
                if block.attn.method is not None or enc.length_key(at) != enc.length_key(at - gap):
                    check_padding(enc, block.attn.method, first, at)  # raises, naming why

    @torch.no_grad()
    def streaming_nll(self, text: torch.Tensor, chunk: int = 256) -> tuple[torch.Tensor, int]:
        """Next-token NLL (nats) of one long text streamed through the bounded cache ``chunk`` tokens at a time.

        text: (T,) int64, T >= 2; needs a bounded method (``set_method(model, "sinks:...")``): the cache holds
        n_sink + window keys per layer (plus one chunk while it is scored), so memory stays flat however long the
        text. Returns ((T-1,) float32, entry t predicting text[t + 1]; the peak bytes: the largest ``Cache.nbytes``
        seen plus the largest distance table a step builds, ``posenc.methods.table_nbytes``, flat too). Equals
        ``token_nll`` of the parallel forward under the method (tested: the streaming definition). Raises
        PosencError without a bounded method, for a chunk that is not an integer >= 1 or a text that is not a (T,)
        tensor of T >= 2 token ids (``posenc.methods.check_stream``).
        """
        method = self.method
        if method is None or not method.bounded:
            raise PosencError(
                "a streaming perplexity needs a bounded cache: apply a sinks method first (--method sinks:...)"
            )
        methods.check_stream(text, chunk)
        was_training, cache, out, peak = self.training, Cache(len(self.blocks)), [], 0
        x = self.tok.weight.new_zeros(1, 1, self.cfg.d_model)
        table = max(methods.table_nbytes(block.attn.enc, method, x) for block in self._blocks)
        self.eval()
        try:
            for s in range(0, text.shape[0] - 1, chunk):
                ids = text[None, s : min(s + chunk, text.shape[0] - 1)]
                logits = self.decode(ids, cache)[0].float()
                out.append(F.cross_entropy(logits, text[s + 1 : s + 1 + ids.shape[1]], reduction="none"))
                peak = max(peak, cache.nbytes() + table)
        finally:
            self.train(was_training)
        return torch.cat(out), peak

    def token_nll(
        self, tokens: torch.Tensor, targets: torch.Tensor, chunk: int = 4096, pos: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Per-token negative log-likelihood (nats), (B, T) float32 (``posenc.scoring.token_nll``): tokens, targets
        (B, T) int64; ``pos`` (T,) int64 the positions (``hidden``; None: 0..T-1). Raises PosencError for a bad
        shape or ids outside the vocabulary."""
        check_ids(targets, self.cfg.vocab_size, "target ids")
        return scoring.token_nll(self.hidden(tokens, pos), lambda h: h @ self.tok.weight.T, targets, chunk)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def pad_left(prompts: Sequence[Sequence[int] | torch.Tensor], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of different lengths (token id lists or (T_i,) int64 tensors) as one left-padded batch, as
    transformers' tokenizers pad for generation: (ids (B, T) int64 with ``pad_id`` before each row's tokens,
    attention_mask (B, T) int64, 1 at the tokens), T the longest prompt, for ``LM.forward``, ``decode`` and
    ``generate``. PosencError (one line) for no prompts, an empty one, one that is not 1-D or not ids ``check_ids``
    takes (int64, >= 0: not floats, which would be truncated) or a ``pad_id`` that is not an integer in [0, 2^63)
    (a token id, an int64)."""
    if isinstance(pad_id, bool) or not isinstance(pad_id, int) or not 0 <= pad_id < 2**63:
        raise PosencError(f"pad_id must be an integer in [0, 2^63) (a token id), got {pad_id!r}")
    try:
        rows = [torch.as_tensor(p) for p in prompts]
    except (TypeError, ValueError, RuntimeError, OverflowError):
        raise PosencError("pad_left takes a list of prompts, each a list of token ids (ints) or a tensor") from None
    if not rows or any(r.dim() == 1 and len(r) == 0 for r in rows):
        raise PosencError("pad_left needs at least one prompt, each of at least one token")
    for i, r in enumerate(rows):
        if r.dim() != 1:
            raise PosencError(
                f"each prompt must be a (T,) list or tensor of token ids; prompt {i} has shape {tuple(r.shape)}"
            )
        check_ids(r, None, f"prompt {i}'s token ids")
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.int64)
    mask = torch.zeros(len(rows), T, dtype=torch.int64)
    for b, r in enumerate(rows):
        ids[b, T - len(r) :], mask[b, T - len(r) :] = r, 1
    return ids, mask


def sample(
    logits: torch.Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None
) -> torch.Tensor:
    """One token per row from logits (B, vocab): (B, 1) int64. temperature 0 is argmax."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    # float64 and shifted to a maximum of 0 first: any temperature > 0 then gives finite or -inf logits, never
    # inf - inf (1e-39 underflows float32)
    logits = logits.double()
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)


def physical_memory() -> float:
    """Bytes of this machine's physical memory (``math.inf`` where the platform does not say)."""
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return math.inf


def check_fits(cfg: ModelConfig) -> None:
    """PosencError (one line) for a model whose float32 weights cannot fit this machine's memory, judged by a lower
    bound (the token embedding, each layer's query and output projections and its MLP: vocab x d + n_layer (2 + 2
    mlp_ratio) d^2), before any is allocated: a huge ``n_layer`` would otherwise build modules for hours."""
    need = 4.0 * (cfg.vocab_size * cfg.d_model + (2 + 2 * cfg.mlp_ratio) * cfg.n_layer * cfg.d_model**2)
    have = physical_memory()
    if need > have:
        raise PosencError(
            f"model of n_layer={cfg.n_layer}, d_model={cfg.d_model} needs at least {need / 2**30:,.0f} GiB for its "
            f"float32 weights; this machine has {have / 2**30:,.0f} GiB"
        )


# Bytes one training step keeps per element of (batch rows, train_length, d_model) in each layer, at least: both
# normalisations of a (pre-norm) layer keep their input, the float32 residual stream (float32 under bf16 autocast
# too: the master weights are float32 and the residual sum promotes), for the backward. Two float32 copies; the
# rest a step keeps (q, k, v, the attention output, the MLP's hidden units, the logits) is left out, so the bound
# never refuses a batch that fits.
ACTIVATION_BYTES = 2 * 4


def device_memory(device: torch.device | None) -> float:
    """Bytes of memory tensors on ``device`` live in: a CUDA device's own, else this machine's (:func:`physical_memory`;
    MPS shares it)."""
    if device is not None and device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    return physical_memory()


def score_tile_bytes(cfg: ModelConfig) -> float:
    """Bytes of the one score tile a training step of ``cfg`` surely holds at once: with a score bias and a
    ``train_length`` past ``attn_block_size``, the chunked path (``posenc.attention.attention``) masks each query
    block with a (B|1, n_head, block, keys) float32 tile, the first block's keys ``block`` (no batch factor: a bias
    may broadcast over the rows); else 0 (SDPA's fused kernels, and the fused separable path, tile the scores
    themselves, so no B x n_head x T x T tensor is sure to exist)."""
    biased = any(cls.has_bias for entry in encodings.layer_pattern(cfg.encoding) for cls, _ in encodings.parts(entry))
    block = cfg.attn_block_size
    return 4.0 * cfg.n_head * block * block if biased and cfg.train_length > block else 0.0


def check_batch_fits(cfg: ModelConfig, batch_size: int, rows: int, device: torch.device | None = None) -> None:
    """PosencError (one line naming ``train.batch_size`` and the estimate) for a training batch whose activations
    cannot fit the memory of ``device`` (:func:`device_memory`), judged by a lower bound of one step's: ``rows`` (this
    process's rows of the global ``batch_size``) x train_length x d_model x n_layer x ``ACTIVATION_BYTES``, plus
    :func:`score_tile_bytes`; before any is allocated, so the run is refused in a line, not killed for memory."""
    tile = score_tile_bytes(cfg)
    need = float(rows * cfg.train_length * cfg.d_model * cfg.n_layer) * ACTIVATION_BYTES + tile
    have = device_memory(device)
    if need > have:
        where = "this machine" if device is None or device.type != "cuda" else str(device)
        per = f"{rows:,} rows" if rows == batch_size else f"{rows:,} rows of it per process"
        scores = f", and a {tile / 2**20:,.0f} MiB score tile" if tile else ""
        raise PosencError(
            f"train.batch_size={batch_size} needs at least {need / 2**30:,.1f} GiB of activations per training step "
            f"({per} x train_length {cfg.train_length} x d_model {cfg.d_model} x n_layer {cfg.n_layer} x "
            f"{ACTIVATION_BYTES} bytes{scores}); {where} has {have / 2**30:,.1f} GiB: lower train.batch_size"
        )


def build_model(config: ModelConfig | dict) -> LM:
    """Build an LM from a ModelConfig or a dict of its settings; a one-line PosencError if the dict is invalid
    (not a dict, an unknown key, a value ModelConfig refuses)."""
    if isinstance(config, ModelConfig):
        return LM(config)
    if not isinstance(config, dict):
        raise PosencError(
            "a model config is a ModelConfig or a dict of its settings (e.g. {'encoding': 'rope'}), "
            f"got {type(config).__name__}"
        )
    names = [f.name for f in dataclasses.fields(ModelConfig)]
    unknown = [k for k in config if k not in names]
    if unknown:
        raise PosencError(f"invalid model config: {unknown[0]}: not a setting (valid: {', '.join(names)})")
    try:
        cfg = ModelConfig(**config)
    except ValueError as exc:  # ModelConfig's checks
        raise PosencError(f"invalid model config: {exc}") from None
    return LM(cfg)


MAX_NEW_TOKENS = 1 << 20  # the most tokens one generate call produces (1,048,576): about a day on one CPU thread


def check_sampling(max_new_tokens, temperature, top_k, seed=None, vocab_size: int | None = None) -> None:
    """PosencError (one line) unless ``max_new_tokens`` is an integer in [0, ``MAX_NEW_TOKENS``], ``temperature`` a
    number (an int or float, not a bool), finite and >= 0 (0: greedy), ``top_k`` None or an integer in [1,
    ``vocab_size``] (not a bool; past the vocabulary it would keep every token without a word) and ``seed`` None or
    an integer in [0, 2^64) (what a torch generator takes; not a bool): the generation settings of ``LM.generate``,
    of pretrained models' (``posenc.hf.generation``) and of ``posenc generate``."""
    if not (isinstance(max_new_tokens, int) and not isinstance(max_new_tokens, bool) and max_new_tokens >= 0):
        raise PosencError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if max_new_tokens > MAX_NEW_TOKENS:
        raise PosencError(
            f"max_new_tokens must be at most {MAX_NEW_TOKENS:,} (posenc.model.MAX_NEW_TOKENS), got {max_new_tokens:,}"
        )
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise PosencError(f"temperature must be a number (0: greedy), got {type(temperature).__name__} {temperature!r}")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise PosencError(f"temperature must be finite and >= 0, got {temperature!r}")
    if top_k is not None and not (isinstance(top_k, int) and not isinstance(top_k, bool) and top_k >= 1):
        raise PosencError(f"top_k must be an integer >= 1, got {top_k!r}")
    if top_k is not None and vocab_size is not None and top_k > vocab_size:
        raise PosencError(f"top_k {top_k} exceeds the vocabulary ({vocab_size} tokens): it would keep every token")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64):
        raise PosencError(f"seed must be an integer in [0, 2^64) (a torch generator's) or None, got {seed!r}")


def set_method(model: LM, spec: str | None) -> methods.Method | None:
    """Apply the inference method ``spec`` (``posenc.methods.parse``: ``self-extend:group=4,window=64``,
    ``lm-infinite``, ``sinks:n_sink=4,window=60``) to every layer of ``model`` in place (None: none); returns the
    Method (``label()``: its spec with every parameter), or None. PosencError (one line) for a bad spec (or one
    that is not a str), a ``model`` that is not an :class:`LM` (the arguments swapped were an AttributeError), a
    scheme it does not apply to (every layer is checked before any changes), or exact positions past the trained
    length (``posenc.methods.check_reach``: the training length times a RoPE schedule's factor)."""
    if not isinstance(model, LM):
        swapped = " (the method spec comes second)" if isinstance(model, str) else ""
        got = f"str {model!r}" if isinstance(model, str) else type(model).__name__
        raise PosencError(f"set_method(model, spec) takes a posenc.LM first, got {got}{swapped}")
    cfg = model.cfg
    factor = (cfg.encoding_params.get("schedule_params") or {}).get("factor", 1)  # a RoPE schedule's
    encs = [block.attn.enc for block in model._blocks]
    method = None if spec is None else methods.parse_for(spec, encs, cfg.d_model, cfg.train_length, factor)
    for block in model._blocks:
        block.attn.set_method(method)
    return method


def is_rope(spec: str) -> bool:
    """Whether ``spec`` is plain RoPE (any parameters) in every layer, the schemes RoPE schedules apply to."""
    return len(encodings.layer_pattern(spec)) == 1 and [cls for cls, _ in encodings.parts(spec)] == [RoPE]


def with_rope_schedule(model, name: str, params: dict | None = None):
    """A copy of a trained RoPE ``LM`` whose RoPE layers use schedule ``name``.

    Returns (model, label) with label like ``rope+yarn(s=8)``. Raises PosencError
    if the model's scheme is not one plain RoPE spec (``is_rope``: a '|' pattern, even of RoPE entries, takes no
    schedule) or the parameters are invalid.
    """
    cfg = model.cfg
    if not is_rope(cfg.encoding):
        entries = len(encodings.layer_pattern(cfg.encoding))
        why = (
            f"is a per-layer pattern of {entries} entries: a schedule is set on the model's one scheme spec, not per "
            "layer entry"
            if entries > 1
            else "is not plain RoPE"
        )
        raise PosencError(
            f"rope schedules apply to models whose every layer is one plain RoPE spec; this run's {cfg.encoding!r} "
            + why
        )
    full = schedule_params(name, cfg.train_length, params)
    new_cfg = dataclasses.replace(
        cfg, encoding_params={**cfg.encoding_params, "schedule": name, "schedule_params": full}
    )
    out = LM(new_cfg)
    out.load_state_dict(model.state_dict())
    return out, f"{cfg.encoding}+{schedule_label(name, full, cfg.train_length)}"
