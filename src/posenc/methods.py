"""Training-free long-context methods at inference: Self-Extend, LM-Infinite, attention sinks (StreamingLLM)
and dual-chunk attention.

Each method replaces the relative position ``i - j`` that a position-indexed scheme consumes by a map
``d(i, j)`` and may hide keys (query position i >= key position j, tokens):

- Self-Extend (Jin et al. 2024, "LLM Maybe LongLM", arXiv:2401.01325, eq. 3-4 and Algorithm 1), neighbour
  window W, group size G: ``d = i - j`` for ``i - j < W``, else
  ``floor(i/G) - floor(j/G) + W - floor(W/G)`` (the grouped query position shifted by W - W//G so the two
  regions meet); every key visible. llama.cpp's ``--grp-attn-n G --grp-attn-w W`` compresses the cached
  positions instead (one position per token), an approximation of this map that posenc does not copy.
- LM-Infinite (Han et al. 2023, arXiv:2308.16137, sec. 4): a Lambda-shaped mask, the first ``n_global``
  tokens plus a local window of W tokens (``i - j < W``, W = L_pretrain), and the distance capped at W:
  ``d = min(i - j, W)``.
- Attention sinks (Xiao et al. 2024, StreamingLLM, arXiv:2309.17453, sec. 3.2): the cache holds the first
  ``n_sink`` tokens and the last W (the query among them); positions are assigned inside the cache, so
  ``d`` is the query's cache slot minus the key's: ``i - j`` in the window, ``min(i, n_sink + W - 1) - j``
  for a sink; the other keys are evicted (hidden).
- Dual-chunk attention (An et al. 2024, "Training-Free Long-Context Scaling of Large Language Models",
  ChunkLlama, arXiv:2402.17463, sec. 3), chunk length S, local window w: the input is cut into chunks of S
  tokens, every key sits at ``j mod S``; a query at ``i mod S`` for keys of its own chunk (intra-chunk:
  ``d = i - j``), at ``min(i mod S + S, S + w)`` for the previous chunk (successive-chunk: the first w
  queries keep their distance to the keys just before the chunk) and at ``min(2S - 1, S + w)`` for every
  earlier one (inter-chunk); every key visible, the largest distance S + w. These are the reference code's
  positions (HKUNLP/ChunkLlama, ``chunkllama_attn_replace.py``: its ``chunk_len``, ``local_window`` and the
  clamp at ``chunk_size`` = S + w; the paper writes c - 1 where the code has S + w).

``relative_positions`` writes each definition directly (the naive reference, tested against hand-computed
tables); the blockwise path (``method_attention``) uses each method's split into regions (``Method.region``: near
and far; dual-chunk's intra, successive and inter), in each of which ``d`` is a difference of per-row and
per-column positions (``Method.query_positions``, ``key_positions``), so RoPE needs one rotation of q and k per
region, never one per pair (tested equal). In evaluation on CPU (``fast_applies``) the keys that every query of
a block sees in one region go through the CPU flash kernel unmasked, the others through it with a mask, once per
region (``fast_blocks``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch

from posenc.attention import Bias, _pad, merge_lse, nan_rows
from posenc.encodings.base import Encoding, Inputs, check_int
from posenc.encodings.bias import ALiBi
from posenc.encodings.registry import format_part, split_part
from posenc.encodings.relative import Kerple, T5Bias
from posenc.encodings.rotary import RoPE
from posenc.errors import PosencError
from posenc.rope.rerope import _rot

# name -> (parameters with their defaults; None: from the training length, as ``parse`` says)
PARAMETERS: dict[str, dict[str, int | None]] = {
    "self-extend": {"group": 4, "window": None},
    "lm-infinite": {"n_global": 10, "window": None},
    "sinks": {"n_sink": 4, "window": None},
    "dual-chunk": {"chunk": None, "local": None},
}
# the defaults from the training length L (ChunkLlama's: chunk_size = 3L/4, local_window = L/16, S = their difference)
DEFAULTS = {
    "self-extend": lambda L, p: {"window": L // 2},
    "lm-infinite": lambda L, p: {"window": L},
    "sinks": lambda L, p: {"window": L - p["n_sink"]},
    "dual-chunk": lambda L, p: {
        "local": L // 16,
        "chunk": 3 * L // 4 - (L // 16 if p["local"] is None else p["local"]),
    },
}


@dataclasses.dataclass(frozen=True)
class Method:
    """One method and its parameters (tokens): ``group`` G (Self-Extend), ``window`` W (Self-Extend, LM-Infinite,
    sinks; dual-chunk: its chunk length), ``n_global`` (LM-Infinite's starting tokens), ``n_sink`` (attention
    sinks), ``chunk`` S and ``local`` w (dual-chunk)."""

    name: str
    window: int
    group: int = 1
    n_global: int = 0
    n_sink: int = 0
    chunk: int = 0
    local: int = 0

    @property
    def bounded(self) -> bool:
        """Whether decoding keeps only a bounded set of keys (sinks: the evicted tokens are gone)."""
        return self.name == "sinks"

    @property
    def kept(self) -> int:
        """Keys a bounded cache holds: n_sink + W."""
        return self.n_sink + self.window

    @property
    def exact(self) -> int:
        """The largest position the method keeps exact (tokens): Self-Extend's and LM-Infinite's window W, the sinks
        cache's n_sink + W, dual-chunk's S + w; past it positions are grouped, capped, evicted or chunked."""
        return self.n_sink + self.window + (self.local if self.name == "dual-chunk" else 0)

    def label(self) -> str:
        """The spec with every parameter, e.g. ``self-extend:group=4,window=64`` (recorded in eval records)."""
        return format_part(self.name, {k: getattr(self, k) for k in PARAMETERS[self.name]})

    def describe(self) -> str:
        """The row label's form, e.g. ``self-extend(group=4,window=64)`` (``rope+self-extend(...)`` in a report)."""
        return f"{self.name}({','.join(f'{k}={getattr(self, k)}' for k in PARAMETERS[self.name])})"

    def region(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """The region of (i, j) (int64, broadcast shape), an index into ``query_positions`` and ``key_positions``:
        0 near (i - j < W), 1 far; dual-chunk: 0 intra-chunk, 1 successive-chunk, 2 inter-chunk."""
        if self.name == "dual-chunk":
            return (i // self.chunk - j // self.chunk).clamp(min=0, max=2)
        return (i - j >= self.window).long()

    def query_positions(self, i: torch.Tensor) -> list[torch.Tensor]:
        """The query's position in each region (int64, i's shape each): d(i, j) = query_positions(i)[r] -
        key_positions(j)[r] for (i, j) in region r."""
        if self.name == "dual-chunk":
            S, top = self.chunk, self.chunk + self.local
            return [i % S, (i % S + S).clamp(max=top), torch.full_like(i, min(2 * S - 1, top))]
        if self.name == "self-extend":
            far = i // self.group + (self.window - self.window // self.group)
        elif self.name == "lm-infinite":
            far = torch.full_like(i, self.window)
        else:
            far = i.clamp(max=self.n_sink + self.window - 1)
        return [i, far]

    def key_positions(self, j: torch.Tensor) -> list[torch.Tensor]:
        """The key's position in each region (int64, j's shape each); see ``query_positions``."""
        if self.name == "dual-chunk":
            return [j % self.chunk] * 3
        if self.name == "self-extend":
            return [j, j // self.group]
        return [j, torch.zeros_like(j) if self.name == "lm-infinite" else j]

    def visible(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """Causal mask of the keys a query sees (bool, broadcast shape of i, j)."""
        causal = j <= i
        if self.name in ("self-extend", "dual-chunk"):
            return causal
        first = self.n_global if self.name == "lm-infinite" else self.n_sink
        return causal & ((j < first) | (i - j < self.window))

    def reach(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> int:
        """The largest distance d(i, j) >= 0 of a visible pair of queries at positions ``q_pos`` and keys at
        ``k_pos`` (int64, any shapes), or a bound of it: the size a distance table needs. Each region's largest query
        position less its smallest key position, the near region (i - j < W; all but dual-chunk) at most W - 1, so
        under sinks it stays below n_sink + W however far the stream has run."""
        bounds = [int(qp.max() - kp.min()) for qp, kp in zip(self.query_positions(q_pos), self.key_positions(k_pos))]
        if self.name != "dual-chunk":
            bounds[0] = min(bounds[0], self.window - 1)
        return max(*bounds, 0)

    def distance(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """d(i, j) from the regions (int64), the blockwise path's; equals ``relative_positions`` where visible."""
        region = self.region(i, j)
        d = torch.zeros(region.shape, dtype=torch.int64, device=region.device)
        for r, (qp, kp) in enumerate(zip(self.query_positions(i), self.key_positions(j))):
            d = torch.where(region == r, qp - kp, d)
        return d


def check_reach(method: Method, train_length: int, factor: float = 1) -> None:
    """PosencError (one line) for a method whose exact positions (``Method.exact``) pass the trained length: the
    training (or native) length ``train_length`` in tokens times ``factor``, a fixed-frequency RoPE schedule's (1
    without one). Those positions were never trained, and up to that length the method is plain attention, so its
    row would carry its name without its mechanism."""
    trained = int(train_length * factor)
    if method.exact > trained:
        what = {"sinks": "n_sink + window", "dual-chunk": "chunk + local"}.get(method.name, "window")
        raise PosencError(
            f"method {method.name}: {what} = {method.exact} passes the trained length {trained}; the method keeps "
            "exact positions up to it (give a smaller one)"
        )


def parse_for(spec: str, encs: list[Encoding], d_model: int, train_length: int, factor: float = 1) -> Method:
    """Method ``spec`` (:func:`parse`, defaults from ``train_length``) for layers of schemes ``encs`` and width
    ``d_model``: PosencError (one line), before any layer changes, for a bad spec, a scheme it does not apply to
    (:func:`scheme_args`, every layer) or exact positions past ``train_length`` times ``factor`` (a RoPE
    schedule's; :func:`check_reach`). What ``posenc.model.set_method`` and ``posenc.Attention.set_method`` apply."""
    method = parse(spec, train_length)
    for enc in encs:
        scheme_args(enc, method, torch.zeros(1, 1, d_model))
    check_reach(method, train_length, factor)
    return method


def parse(spec: str, train_length: int) -> Method:
    """A method from its spec ``NAME:k=v,...`` (``self-extend:group=4,window=64``, ``lm-infinite:n_global=10``,
    ``sinks:n_sink=4,window=252``, ``dual-chunk:chunk=88,local=8``). Defaults: window = train_length // 2
    (Self-Extend), train_length (LM-Infinite: L_pretrain), train_length - n_sink (sinks: the cache holds the
    training length); dual-chunk local = L // 16 and chunk = 3L // 4 - local (ChunkLlama's). Raises PosencError
    (one line) for a spec that is not a str, an unknown name or parameter, or a value out of range (group, window,
    chunk >= 1 integers; n_global, n_sink, local >= 0 integers)."""
    name, given = split_part(spec, "method")
    if name not in PARAMETERS:
        raise PosencError(f"unknown method {name!r} (methods: {', '.join(PARAMETERS)})")
    unknown = sorted(set(given) - set(PARAMETERS[name]))
    if unknown:
        raise PosencError(f"method {name!r}: unknown parameter {unknown[0]!r} (valid: {', '.join(PARAMETERS[name])})")
    p = {**PARAMETERS[name], **given}
    _check_values(name, {k: v for k, v in p.items() if v is not None}, train_length, None)
    defaults = {k: v for k, v in DEFAULTS[name](train_length, p).items() if p[k] is None}
    _check_values(name, defaults, train_length, {k: v for k, v in given.items() if v is not None})
    p.update(defaults)
    if name == "dual-chunk":
        return Method(name, window=p["chunk"], chunk=p["chunk"], local=p["local"])
    return Method(name, **p)


MAX_PARAMETER = 2**31 - 1  # tokens: positions are int64 tensors, and no context comes near this


def _check_values(name: str, values: dict, train_length: int, given: dict | None) -> None:
    """PosencError (one line) for a parameter out of range: group, window, chunk in [1, MAX_PARAMETER], the others
    in [0, MAX_PARAMETER] (integers). ``given``: None for the parameters as given, else those given (the values
    checked are the defaults derived from them and the training length, and the message names both)."""
    for key, value in values.items():
        low = 1 if key in ("group", "window", "chunk") else 0
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_PARAMETER:
            source = ", ".join([f"the training length {train_length}", *(f"{k}={v}" for k, v in (given or {}).items())])
            raise PosencError(
                f"method {name!r}: {key} must be an integer in [{low}, {MAX_PARAMETER}], got {value!r}"
                + (f" (default: from {source})" if given is not None else "")
            )


def relative_positions(method: Method, i: torch.Tensor, j: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The naive reference: each paper's definition written out. i (Tq, 1), j (1, Tk) int64 positions.

    Returns (d (Tq, Tk) int64 relative positions, visible (Tq, Tk) bool); d is 0 where hidden.
    Sinks: the cache at query i holds {j < n_sink} and {i - W < j <= i} (StreamingLLM's rolling cache), and
    d is the difference of ranks (cache slots) of i and j in it.
    """
    causal = j <= i
    rel = i - j
    if method.name == "dual-chunk":  # An et al. 2024, sec. 3 (the reference code's positions)
        S, w = method.chunk, method.local
        intra, succ, inter = i % S, torch.minimum(i % S + S, torch.tensor(S + w)), min(2 * S - 1, S + w)
        chunks = i // S - j // S
        d = torch.where(chunks == 0, intra, torch.where(chunks == 1, succ, inter)) - j % S
        return torch.where(causal, d, 0), causal
    if method.name == "self-extend":
        W, G = method.window, method.group
        d = torch.where(rel < W, rel, i // G - j // G + W - W // G)
        return torch.where(causal, d, 0), causal
    first = method.n_global if method.name == "lm-infinite" else method.n_sink
    visible = causal & ((j < first) | (rel < method.window))
    if method.name == "lm-infinite":
        return torch.where(visible, rel.clamp(max=method.window), 0), visible
    slot = visible.long().cumsum(-1) - 1  # the rank of each cached key (j: the columns 0..Tk-1)
    query_slot = slot.gather(-1, i)
    return torch.where(visible, query_slot - slot, 0), visible


def distance_table(bias_of: Callable[[torch.Tensor], Bias], n: int, device=None) -> torch.Tensor:
    """A distance-only score bias at distances 0..n-1: (1, H, n), from the scheme's own tile function.

    bias_of(pos) is the scheme's Bias for positions ``pos`` (T,); with pos = arange(n) the last query's row
    holds distances n-1..0. For schemes whose bias depends on i - j only (ALiBi, T5, Kerple); differentiable
    in their parameters.
    """
    return bias_of(torch.arange(n, device=device)).tile(n - 1, n, 0, n)[:, :, 0].flip(-1)


def method_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    method: Method,
    *,
    inv_freq: torch.Tensor | None = None,
    pairing: str = "half",
    bias_of: Callable | None = None,
    scale: float | None = None,
    block_size: int = 512,
    fast: bool | None = None,
) -> torch.Tensor:
    """Causal attention under ``method``'s position map and mask, blockwise over query blocks.

    q: (B, H, Tq, D), k: (B, H, Tk, D), v: (B, H, Tk, Dv), all unrotated, H heads each (repeat grouped keys
    first); q_pos (Tq,), k_pos (Tk,) int64 absolute token positions (decoding: the new rows and the cached
    keys, which for sinks are the kept ones only). RoPE (``inv_freq`` (P,) radians per token, P <= D/2,
    ``pairing``): in region r the score <R(qpos_r(i)) q, R(kpos_r(j)) k> (``Method.query_positions``,
    ``key_positions``). A distance-only
    bias (``bias_of``: the scheme's Bias builder, see ``distance_table``): its value at d(i, j). scale:
    multiplies q.k (default 1/sqrt(D)). At most H x block x Tk scores exist at once (one tile per region for
    RoPE), never Tq x Tk; under a Lambda mask only the keys the block may see (``block_keys``). Returns (B, H, Tq, Dv)
    in v's dtype; differentiable (autograd). Reference: ``naive_method_attention`` (tested: values and gradients).

    Evaluation (``fast_applies``: no grad, CPU, float32/float64/bfloat16 outside autocast, no bias) takes the fast
    path (``fast_blocks``): a block's keys that every query of it sees in one region go through the CPU flash kernel
    unmasked, the rest (the diagonal, the band where a key changes region or leaves the window) through it with a
    mask per region, in float32 or better, the parts merged by their log-sum-exps; the same values as the explicit
    path (tested). The distance-bias schemes (ALiBi, T5, Kerple) keep the explicit path: their bias varies along a
    run of such keys.
    ``fast``: None takes the path ``fast_applies`` picks; False the explicit one, the reference path (any device,
    dtype and grad mode); True the fast one where ``fast_applies`` holds (ValueError with a bias or gradients).
    The tests and ``benchmarks/method_prefill.py`` set it to compare the two.
    """
    fast = fast_applies(q, k, v, bias_of) if fast is None else fast
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    q_maps, k_maps = method.query_positions(q_pos), method.key_positions(k_pos)
    q_rot, k_rot = [q], [k]  # no RoPE: one product for every region
    if inv_freq is not None:
        q_rot = [_rot(q, p, inv_freq, pairing) for p in q_maps]
        k_rot = [_rot(k, p, inv_freq, pairing) for p in k_maps]
    if fast:
        if bias_of is not None or torch.is_grad_enabled():
            raise ValueError("the fast path of method_attention takes no score bias and no gradients (fast_applies)")
        return fast_blocks(q_rot, k_rot, v, q_pos, k_pos, method, scale, block_size)
    table = None
    if bias_of is not None:  # over the distances visible pairs can have: bounded under sinks (Method.reach)
        table = distance_table(bias_of, method.reach(q_pos, k_pos) + 1, q.device)
    out = []
    for a in range(0, q.shape[-2], block_size):
        b, i = a + block_size, q_pos[a : a + block_size, None]
        keys = block_keys(method, k_pos, int(i.min()), int(i.max()))
        j = k_pos[None, keys]
        s = q_rot[0][..., a:b, :] @ k_rot[0][..., keys, :].transpose(-1, -2)
        if len(q_rot) > 1:
            region = method.region(i, j)
            for r in range(1, len(q_rot)):
                s = torch.where(region == r, q_rot[r][..., a:b, :] @ k_rot[r][..., keys, :].transpose(-1, -2), s)
        s = s * scale
        if table is not None:
            d = method.distance(i, j).clamp(min=0)  # hidden pairs may fall below 0
            s = s + table[..., d].to(s.dtype)
        s = s.masked_fill(~method.visible(i, j), -math.inf)
        out.append(torch.softmax(s, -1) @ v[..., keys, :].to(s.dtype))
    return torch.cat(out, dim=-2).to(v.dtype)


_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu  # (out, lse): the fast path's one kernel


def fast_applies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias_of: Callable | None) -> bool:
    """Whether ``method_attention`` takes the fast path: no grad (the kernel's log-sum-exp has no backward), CPU
    (it is the CPU flash kernel), q, k, v of one dtype, float32, float64 or bfloat16 (a bfloat16 model's
    evaluation at the kernel's bf16 speed, as its native SDPA attention), outside autocast, and no score bias."""
    return (
        not torch.is_grad_enabled()
        and bias_of is None
        and q.device.type == "cpu"
        and q.dtype in (torch.float32, torch.float64, torch.bfloat16)
        and k.dtype == v.dtype == q.dtype
        and not torch.is_autocast_enabled("cpu")
    )


def block_keys(method: Method, k_pos: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Indices (int64) of the keys some query of positions [lo, hi] may see, k_pos (Tk,) ascending: those up to
    hi, and for LM-Infinite and sinks only the first tokens and those from lo - W + 1 on (the Lambda mask), so a
    block costs O(block x (n_first + W + block)), not O(block x T)."""
    end = int(torch.searchsorted(k_pos, hi, right=True))
    if method.name in ("self-extend", "dual-chunk"):
        return torch.arange(end, device=k_pos.device)
    first = int(torch.searchsorted(k_pos, method.n_global if method.name == "lm-infinite" else method.n_sink))
    start = max(first, int(torch.searchsorted(k_pos, lo - method.window + 1)))  # past end: a block before n_first
    return torch.cat(
        (torch.arange(min(first, end), device=k_pos.device), torch.arange(start, max(start, end), device=k_pos.device))
    )


def fast_blocks(
    q_rot: list[torch.Tensor],
    k_rot: list[torch.Tensor],
    v: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    method: Method,
    scale: float,
    block_size: int,
) -> torch.Tensor:
    """The fast path, no grad, CPU float32/float64/bfloat16: q_rot[r] (B, H, Tq, D) and k_rot[r] (B, H, Tk, D) q
    and k rotated at region r's positions (one entry each without RoPE), v (B, H, Tk, Dv), one dtype.

    Per query block (``fast_query_blocks``) the runs of uniform keys (``uniform_regions``, ``key_runs``) go through
    the CPU flash kernel unmasked (q and k of their region), the block's other keys through it with a mask per
    region (``_masked_part``, float32 or better: a bfloat16 part's output would be rounded before the merge), and
    the parts merge by their log-sum-exps (``merge_lse``, float32 or better). Returns (B, H, Tq, Dv) in v's dtype.
    At most H x block x (keys of a block) scores exist at once.
    """
    Dv, width = v.shape[-1], max(q_rot[0].shape[-1], v.shape[-1])  # the kernel takes one head size for q, k and v
    qw, kw, vw = [_pad(t, width, 0.0) for t in q_rot], [_pad(t, width, 0.0) for t in k_rot], _pad(v, width, 0.0)
    out = []
    far = _far_part(qw, kw, vw, q_pos, k_pos, method, scale, Dv)
    for a, b in fast_query_blocks(method, q_pos, block_size):
        i = q_pos[a:b, None]
        lo, hi = int(i.min()), int(i.max())
        keys = block_keys(method, k_pos, lo if far is None else lo - method.window + 1, hi)
        label = uniform_regions(method, k_pos[keys], lo, hi)
        parts = [] if far is None else [(far[0][..., a:b, :], far[1][..., a:b])]
        for r, ks, ke in key_runs(label, keys):
            if far is not None and r == 1:
                continue
            rows, run = qw[min(r, len(qw) - 1)][..., a:b, :], kw[min(r, len(kw) - 1)][..., ks:ke, :]
            o, lse = _FLASH(rows, run, vw[..., ks:ke, :], scale=scale)
            # the kernel writes 0 (lse 0) for a row whose scores are all NaN: nan_rows gives the NaN back
            parts.append((o[..., :Dv], lse + nan_rows(rows, run)[..., 0]))
        rest = keys[label < 0]
        if len(rest):
            parts += _masked_part(qw, kw, vw, a, b, i, rest, k_pos[None, rest], method, scale, Dv, far is not None)
        wide = torch.promote_types(v.dtype, torch.float32)
        out.append(merge_lse([(o.to(wide), lse) for o, lse in parts]))
    return torch.cat(out, dim=-2).to(v.dtype)


def fast_query_blocks(method: Method, q_pos: torch.Tensor, block_size: int) -> list[tuple[int, int]]:
    """The fast path's query blocks, row ranges [a, b) of at most ``block_size`` rows; dual-chunk's also end where
    q_pos (ascending) enters a new chunk: there every key changes region at once, and a block across it would
    send a whole chunk of keys to the masked part."""
    cuts = set(range(0, len(q_pos), block_size))
    if method.name == "dual-chunk":
        chunk = q_pos // method.chunk
        cuts.update((torch.nonzero(chunk[1:] != chunk[:-1]).flatten() + 1).tolist())
    edges = sorted(cuts) + [len(q_pos)]
    return list(zip(edges[:-1], edges[1:]))


def uniform_regions(method: Method, j: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """For key positions j (n,) int64: the region that every query position i in [lo, hi] gives the key, where
    every such query sees it (a uniform key), else -1; (n,) int64. Two evaluations of ``Method.region`` and
    ``Method.visible``, at lo and at hi, decide it, since for each method and fixed j:

    - the region is non-decreasing in i: self-extend, LM-Infinite and sinks have (i - j >= W), dual-chunk
      clamp(i // S - j // S, 0, 2) (floor division by S > 0 is monotone); equal at lo and hi, it is equal at
      every i between;
    - the visible i form an interval: j <= i (self-extend, dual-chunk: [j, inf)), and under the Lambda mask
      (LM-Infinite, sinks) also j < n_first or i - j < W ([j, inf) or [j, j + W - 1]); visible at lo and hi,
      the key is visible at every i between.

    Within region r the score is <R(qpos_r(i)) q_i, R(kpos_r(j)) k_j>, the product of q_rot[r] and k_rot[r], so
    the kernel, unmasked, computes the explicit path's scores for these keys (the claim is also tested directly).
    """
    ends = torch.tensor([[lo], [hi]], device=j.device)
    region, seen = method.region(ends, j[None, :]), method.visible(ends, j[None, :])
    return torch.where((region[0] == region[1]) & seen.all(0), region[0], -1)


def key_runs(label: torch.Tensor, keys: torch.Tensor) -> list[tuple[int, int, int]]:
    """The maximal runs of uniform keys of one region, contiguous in k: (region, start, end) for the keys
    start..end-1 of k, from ``uniform_regions``' label (n,) of the key indices ``keys`` (n,) int64 ascending."""
    if not len(keys):
        return []
    cut = (label[1:] != label[:-1]) | (keys[1:] != keys[:-1] + 1)
    starts = torch.cat((cut.new_zeros(1, dtype=torch.int64), torch.nonzero(cut).flatten() + 1))
    last = torch.cat((starts[1:] - 1, starts.new_full((1,), len(keys) - 1)))
    runs = zip(label[starts].tolist(), keys[starts].tolist(), (keys[last] + 1).tolist())
    return [run for run in runs if run[0] >= 0]


def _far_part(qw, kw, vw, q_pos, k_pos, method: Method, scale: float, Dv: int):
    """Self-Extend's grouped region (i - j >= W) for every query at once in a prefill (q_pos = k_pos = 0..T-1, T > W,
    with RoPE): row i sees the keys 0..i-W, the kernel's causal pattern on the rows W.. against the keys ..T-W-1,
    so one call at the kernel's own tiling, not one per query block. (out (B, H, T, Dv), lse (B, H, T)), rows
    below W without keys (out 0, lse -inf); None where it does not apply (the blocks then take the region)."""
    T, W = len(q_pos), method.window
    if method.name != "self-extend" or len(qw) < 2 or T <= W or len(k_pos) != T:
        return None
    if not (torch.equal(q_pos, k_pos) and int(q_pos[0]) == 0 and int(q_pos[-1]) == T - 1):
        return None
    rows, run = qw[1][..., W:, :], kw[1][..., : T - W, :]
    o, lse = _FLASH(rows, run, vw[..., : T - W, :], is_causal=True, scale=scale)
    lse = lse + nan_rows(rows, run)[..., 0]  # as the blocks' unmasked runs: an all-NaN row's 0 made NaN
    o = torch.nn.functional.pad(o[..., :Dv], (0, 0, W, 0))
    return o, torch.nn.functional.pad(lse, (W, 0), value=-math.inf)


def _masked_part(qw, kw, vw, a: int, b: int, i, keys, j, method: Method, scale: float, Dv: int, far: bool = False):
    """Attention of the queries a:b (positions i (n, 1)) over the keys ``keys`` (m,) of positions j (1, m), the
    ones a block's queries do not all see in one region, through the CPU flash kernel: per region r and square
    tile of n keys, its pairs of region r that are visible (qw[r], kw[r] q and k rotated at region r's positions,
    padded to one width; vw v padded likewise). A tile whose pairs form a triangle (the diagonal in prefill; the
    band where a key changes region or leaves the window) runs with the kernel's causal flag (``_kernel``), any
    other with a mask; in float32 or better (bfloat16 inputs widened, so a part's output is not rounded to
    bfloat16 before the merge). Returns parts [(out (B, H, n, Dv), lse (B, H, n))]; a row that sees none of a
    part's keys has out 0 and lse -inf (weight 0 in the merge; the kernel writes lse 0); a row with a NaN or inf
    in its query or in a key it sees has lse NaN (the kernel writes 0 for an all-NaN row)."""
    wide = torch.promote_types(vw.dtype, torch.float32)  # bfloat16 parts widened: only these keys' rows
    region, seen = method.region(i, j).clamp_(max=len(qw) - 1), method.visible(i, j)
    n, parts = b - a, []
    for r in range(len(qw)):
        if far and r == 1:  # Self-Extend's grouped pairs: all in ``_far_part``
            continue
        rows = qw[r][..., a:b, :].to(wide)
        rows_finite = bool(rows.isfinite().all())  # once per region, not per tile
        for c0 in range(0, len(keys), n):
            allowed = (region[:, c0 : c0 + n] == r) & seen[:, c0 : c0 + n]
            if not bool(allowed.any()):
                continue
            ks = keys[c0 : c0 + n]
            run, values = kw[r][..., ks, :].to(wide), vw[..., ks, :].to(wide)
            bad = None
            if not (rows_finite and bool(run.isfinite().all())):  # rare: checked whole first
                broken = ~run.isfinite().all(-1)  # (B, H, m): a NaN score under the mask would still reach its row
                bad = ~rows.isfinite().all(-1) | (allowed & broken[..., None, :]).any(-1)
                run = run.nan_to_num(0.0, 0.0, 0.0)
            o, lse = _kernel(rows, run, values, allowed, scale)
            lse = torch.where(allowed.any(-1), lse, -math.inf)
            parts.append((o[..., :Dv], lse if bad is None else lse.masked_fill(bad, math.nan)))
    return parts


def _kernel(q, k, v, allowed, scale: float):
    """The CPU flash kernel over the pairs ``allowed`` (n, m) of q (B, H, n, D) and k, v (B, H, m, D): with its
    causal flag where they are the lower triangle (key c for rows c.., n = m), on the reversed rows and keys
    where they are the strict upper one (key c for rows ..c-1: reversed, row n-1-r sees the keys n-1-c < n-1-r,
    the causal pattern one row down), else with an additive mask. (out (B, H, n, D), lse (B, H, n)); a row
    without keys has out 0 and lse 0 (the caller sets -inf)."""
    flash, (n, m) = _FLASH, allowed.shape
    if n == m and bool(torch.equal(allowed, _triangle(n, allowed.device, upper=False))):
        return flash(q, k, v, is_causal=True, scale=scale)
    if n == m and n > 1 and bool(torch.equal(allowed, _triangle(n, allowed.device, upper=True))):
        o, lse = flash(
            q.flip(-2)[..., 1:, :], k.flip(-2)[..., :-1, :], v.flip(-2)[..., :-1, :], is_causal=True, scale=scale
        )
        pad = (0, 0, 0, 1)  # the last row sees no key of the tile
        return torch.nn.functional.pad(o.flip(-2), pad), torch.nn.functional.pad(lse.flip(-1), (0, 1))
    mask = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill_(~allowed, -math.inf)
    return flash(q, k, v, attn_mask=mask, scale=scale)


def _triangle(n: int, device, upper: bool) -> torch.Tensor:
    """(n, n) bool: the lower triangle with its diagonal, or (``upper``) the upper one without it."""
    ones = torch.ones(n, n, dtype=torch.bool, device=device)
    return ones.triu(1) if upper else ones.tril()


def naive_method_attention(q, k, v, q_pos, k_pos, method, *, inv_freq=None, pairing="half", bias_of=None, scale=None):
    """Reference for ``method_attention`` (same arguments): the full Tq x Tk map ``relative_positions``, each
    RoPE score <R(d(i, j)) q_i, k_j> (q rotated per pair), the bias at d; O(Tq Tk D) memory, tests only.
    Key positions must be 0..Tk-1 (the parallel forward), the definition's cache."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    d, visible = relative_positions(method, q_pos[:, None], k_pos[None, :])
    if inv_freq is not None:
        pairs = q[:, :, :, None, :].expand(-1, -1, -1, k.shape[-2], -1)  # (B, H, Tq, Tk, D): one rotation per pair
        scores = (_rot(pairs, d, inv_freq, pairing) * k[:, :, None]).sum(-1) * scale
    else:
        scores = q @ k.transpose(-1, -2) * scale
    if bias_of is not None:
        scores = scores + distance_table(bias_of, int(d.max()) + 1, q.device)[..., d].to(scores.dtype)
    return scores.masked_fill(~visible, -math.inf).softmax(-1) @ v.to(scores.dtype)


def check_stream(text, chunk) -> None:
    """PosencError (one line) unless ``chunk`` is an integer >= 1 and ``text`` a (T,) tensor of T >= 2 token ids: what
    a streaming perplexity through a sinks cache takes (``LM.streaming_nll``, ``posenc.hf.sink_cache.streaming_nll``;
    a float chunk was a TypeError from range, True taken for 1, a list of ids an AttributeError)."""
    check_int(chunk, "chunk", 1)
    if not isinstance(text, torch.Tensor) or text.dim() != 1 or text.shape[0] < 2:
        got = f"shape {tuple(text.shape)}" if isinstance(text, torch.Tensor) else type(text).__name__
        raise PosencError(f"streaming needs a (T,) tensor of token ids, T >= 2, got {got}")


def table_nbytes(enc: Encoding, method: Method, x: torch.Tensor) -> int:
    """Bytes of the largest distance table ``method_attention`` builds for a layer's scheme ``enc`` under a bounded
    ``method`` (sinks) on the layer input x (B, T, d_model): the table over the cache's n_sink + W distances (0 for
    a scheme without a distance bias, RoPE). A transient of each step, beside the cache's bytes in a peak."""
    bias_of = scheme_args(enc, method, x).get("bias_of")
    return 0 if bias_of is None else distance_table(bias_of, method.kept, x.device).nbytes


def scheme_args(enc: Encoding, method: Method, x: torch.Tensor) -> dict:
    """``method_attention``'s scheme arguments for a layer's scheme ``enc`` on the layer input x (B, T, d_model):
    RoPE with fixed frequencies (plain or a pi/ntk/yarn/llama3 schedule): its inv_freq, pairing and scale;
    ALiBi, T5, Kerple (a bias of i - j only): their tile builder. PosencError (one line) for any other scheme:
    length-dependent or attention-replacing RoPE schedules (dynamic, longrope, rerope), FIRE (it also reads the
    query position), accumulated or data-dependent phases, compositions, NoPE and additive embeddings, and a layer
    with a sliding window or chunks (``Encoding.window``: the method's map would read keys the window hides)."""
    if enc.window is not None:
        raise PosencError(f"method {method.name} does not apply to a layer with {enc.window.describe()}")
    if isinstance(enc, RoPE) and enc.schedule not in ("dynamic", "longrope") and not enc.replaces_attention:
        return {
            "inv_freq": enc.inv_freq,
            "pairing": enc.pairing,
            "scale": enc.logit_scale / math.sqrt(enc.dims.head_dim),
        }
    if isinstance(enc, (ALiBi, T5Bias, Kerple)):
        return {"bias_of": lambda pos: enc.bias(Inputs(x, pos))}
    raise PosencError(
        f"method {method.name} applies to rope (fixed-frequency schedules), alibi, t5 and kerple; "
        f"this layer uses {enc.describe()}"
    )
