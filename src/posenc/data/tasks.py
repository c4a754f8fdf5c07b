"""Synthetic retrieval tasks with a known answer and a known distance to its evidence.

A task is a seeded generator of token sequences: the training batch of a step is a pure
function of (seed, step, row), so runs are reproducible and resume exactly like text runs,
and no data file is needed. Every sequence marks its *answer positions* (targets fixed by
the context) and, for each, the *evidence distance* (tokens from the answer back to the
token that determines it). Specs follow the scheme form, ``NAME[:key=value,...]``:

- ``flipflop`` (Liu et al. 2023, arXiv 2306.00946): instruction/bit pairs over
  {w, r, i, 0, 1}, the first a write, p(w) = p(r) = (1 - p_ignore) / 2; after ``r`` the bit
  repeats the last written one (the answer; evidence: that write's bit). Chance: 1/2.
- ``mqar`` (multi-query associative recall with a gap, after Zoology, Arora et al. 2023,
  arXiv 2312.04927): filler, K key-value pairs, a gap of g filler tokens, then the K keys
  again in random order, each followed by its value (the answer; evidence: the value in the
  pair). Training gaps are drawn in ``gap=LO-HI``; the filler before the pairs pads every
  sequence to the training length. ``fused=true`` writes each pair as one token (key, value),
  a one-hop lookup. ``queries=all`` (default) asks every key once, in random order;
  ``queries=random`` asks P keys drawn with replacement from the pairs, which removes the
  elimination shortcut of ``all`` (answer each query with a value of the context not yet
  given: exact on the last query, 1/k on the k-th from last, so (1 + 1/2 + ... + 1/P) / P
  of the answers, 75% at P = 2, without binding any key to its value); with it, ``asks=Q``
  asks Q keys (default P): more answers per sequence, each key asked about Q / P times. A key
  asked again has its earlier answer as evidence (the nearest copy of its value), so repeats
  score at their short distance, not at the gap.
  Chance: 1/values.
- ``modsum`` (state tracking: the word problem of the cyclic group Z_m, Merrill et al. 2024,
  arXiv 2404.08819; parity at m = 2): a stream of elements 0..m-1 in which a query token ``?``
  is followed by the running sum mod m of every element so far (the answer; evidence: the last
  revealed sum, or the sequence start). The answer needs every element since that evidence, so
  a scheme must carry a state across the whole interval, not copy one token. Chance: 1/m.

Training distances (``distances=log-uniform``, the default of every task): a training row's evidence distances
are spread over 1 .. L (L the training length) with every power-of-two distance bucket (2-4, 4-8, ..., 64-128
tokens at L = 128) equally likely. Flip-flop and modsum rows are segments (a write, ignores, one read; or elements,
a query, its sum) whose distance is drawn in one bucket per row, the row's bucket drawn with probability
inversely proportional to the answers a row of it holds (exact, :func:`_segments`), so every bucket holds the same
expected share of the answers. ``distances=geometric`` keeps the i.i.d. stream at density ``p_ignore`` /
``p_query`` (geometric distances: at L = 128, flip-flop had 33 of 1,534 answers at >= 64 tokens). MQAR draws its
gap with each power-of-two gap bucket of ``gap=LO-HI`` equally likely (``gaps=log-uniform``; ``gaps=uniform``:
uniform in LO..HI); ``gap=LO-fit`` (the default ``0-fit``) reaches the largest gap the training length holds.

Tests (``Task.tests``) probe one thing each: the training distribution at longer lengths,
denser or sparser writes, a controlled gap between evidence and answer up to 32x the
training length, and near recall after a long context. The controlled-gap probe (test ``gap``, settings
``{"bucket": b}``) draws its distance uniformly in [b, 2b) and its evidence position uniformly over the sequence
(a training-distribution prefix of random length before it, unscored tokens after the answer), so a bucket holds
many distances and positions, never one realisation. Only numpy is needed here; the
model side is ``posenc.eval.tasks``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import torch

from posenc.encodings.registry import split_part
from posenc.errors import PosencError


@dataclasses.dataclass(frozen=True)
class TaskBatch:
    """Model inputs and targets with their answer marks.

    ``inputs``, ``targets``: (B, T) int64 (targets are the inputs shifted by one);
    ``answer``: (B, T) bool, True where the target is an answer; ``distance``: (B, T) int64,
    tokens from the answer target back to its evidence (0 off answers).
    """

    inputs: torch.Tensor
    targets: torch.Tensor
    answer: torch.Tensor
    distance: torch.Tensor


@dataclasses.dataclass(frozen=True)
class Test:
    """One evaluation cell family: ``name`` (``id``, ``sparse``, ``gap``, ...), sequence ``length``
    (tokens) and the generator settings that differ from training (``settings``)."""

    name: str
    length: int
    settings: dict[str, Any]


def _stack(rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> TaskBatch:
    """Rows of (tokens (T+1,), answer (T,), distance (T,)) of one length into a TaskBatch."""
    tok = torch.from_numpy(np.stack([r[0] for r in rows]).astype(np.int64))
    ans = torch.from_numpy(np.stack([r[1] for r in rows]))
    dist = torch.from_numpy(np.stack([r[2] for r in rows]).astype(np.int64))
    return TaskBatch(tok[:, :-1], tok[:, 1:], ans, dist)


class Task:
    """A task family: parameters from the spec, a row generator and its tests."""

    name: str = ""
    params: dict[str, tuple[type, Any]] = {}  # key -> (type, default)
    vocab_size: int = 0
    chance: float = 0.0

    def __init__(self, spec: str, **params: Any):
        self.spec = spec
        unknown = sorted(set(params) - set(self.params))
        if unknown:
            raise PosencError(f"task {spec!r}: unknown parameter {unknown[0]!r} (valid: {', '.join(self.params)})")
        self.values = {k: params.get(k, default) for k, (_, default) in self.params.items()}
        for k, (kind, _) in self.params.items():
            v = self.values[k]
            ok = isinstance(v, kind) and not isinstance(v, bool) if kind in (int, float) else isinstance(v, kind)
            if kind is float and isinstance(v, int) and not isinstance(v, bool):
                self.values[k] = v = float(v)
                ok = True
            if not ok:
                raise PosencError(f"task {spec!r}: {k} must be {kind.__name__}, got {v!r}")
        self.check()

    def check(self) -> None:
        """Raise PosencError for out-of-range parameters."""

    def check_length(self, train_length: int) -> None:
        """Raise PosencError when training sequences of ``train_length`` tokens cannot hold the task."""

    def row(self, rng: np.random.Generator, length: int, **settings: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One sequence: tokens (length + 1,), answer (length,) bool, distance (length,)."""
        raise NotImplementedError

    def batch(self, seed: int, step: int, rows: range, length: int, **settings: Any) -> TaskBatch:
        """Rows ``rows`` of the batch of (seed, step): each row drawn from its own generator seeded by
        (seed, step, row), so a data-parallel rank or a resumed run draws exactly these rows."""
        return _stack([self.row(np.random.default_rng([seed, step, r]), length, **settings) for r in rows])

    def tests(self, train_length: int, multiples: list[int]) -> list[Test]:
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.name} ({', '.join(f'{k}={v}' for k, v in self.values.items())}; chance {self.chance:.3g})"


LOG_UNIFORM = "log-uniform"  # the default training distribution of evidence distances (power-of-two buckets equal)


def _expected_segments(room: int, lo: int, hi: int, cost: int) -> float:
    """Expected number of segments :func:`_segments` fits into ``room`` (exact): A(r) = 0 for r < lo, else
    1 + the mean over j in lo..min(hi, r) of A(r - j - cost)."""
    a = np.zeros(room + 2)  # a[k + 1] = A(k), a[0] = A(-1) = 0
    prefix = np.zeros(room + 3)  # prefix[k] = a[0] + ... + a[k - 1]
    for r in range(room + 1):
        if r >= lo:
            top = min(hi, r)
            # A(r - j - cost) for j = lo..top: indices r - top - cost .. r - lo - cost, each >= -1 (clamped: A(<0) = 0)
            first, last = r - top - cost, r - lo - cost
            total = prefix[max(last, -1) + 2] - prefix[max(first, -1) + 1] if last >= 0 else 0.0
            a[r + 1] = 1.0 + total / (top - lo + 1)
        prefix[r + 2] = prefix[r + 1] + a[r + 1]
    return float(a[room + 1])


def _spread_scales(room: int, cost: int, unit_min: int) -> tuple[list[tuple[int, int]], np.ndarray]:
    """The row scales of a log-uniform training row: power-of-two ranges (lo, hi) of the segment unit (pairs for
    flip-flop, tokens for modsum) that fit ``room``, and the probability of each, inversely proportional to the
    expected answers (segments) a row at that scale holds, so every scale holds the same expected share."""
    scales = []
    k = 0
    while 2**k <= room:
        lo, hi = max(2**k, unit_min), 2 ** (k + 1) - 1
        if lo <= min(hi, room):
            scales.append((lo, hi))
        k += 1
    if not scales:
        return [], np.zeros(0)
    w = np.array([1.0 / _expected_segments(room, lo, hi, cost) for lo, hi in scales])
    return scales, w / w.sum()


_SCALES: dict[tuple[int, int, int], tuple[list[tuple[int, int]], np.ndarray]] = {}


def _segments(rng: np.random.Generator, room: int, cost: int, unit_min: int) -> list[int]:
    """One log-uniform row's segment sizes: a scale (lo, hi) drawn by :func:`_spread_scales`, then sizes uniform in
    lo..min(hi, room left) while the room left holds lo (each segment uses its size plus ``cost`` of the room)."""
    key = (room, cost, unit_min)
    if key not in _SCALES:
        _SCALES[key] = _spread_scales(room, cost, unit_min)
    scales, probs = _SCALES[key]
    if not scales:
        return []
    lo, hi = scales[int(rng.choice(len(scales), p=probs))]
    out = []
    while room >= lo:
        j = int(rng.integers(lo, min(hi, room) + 1))
        out.append(j)
        room -= j + cost
    return out


def _check_distances(task: Task, key: str, values: tuple[str, ...]) -> None:
    if task.values[key] not in values:
        raise PosencError(f"task {task.spec!r}: {key} must be {' or '.join(values)}, got {task.values[key]!r}")


# flip-flop vocabulary: instructions then bits
W, R, I, B0, B1 = range(5)  # noqa: E741 (write, read, ignore: the task's own letters)


class FlipFlop(Task):
    """Flip-flop language modelling (Liu et al. 2023): repeat the last written bit after each read."""

    name = "flipflop"
    params = {
        "p_ignore": (float, 0.8),
        "sparse": (float, 0.98),
        "dense": (float, 0.1),
        "distances": (str, LOG_UNIFORM),  # or "geometric": i.i.d. pairs at p_ignore
    }
    vocab_size = 5
    chance = 0.5

    def check(self) -> None:
        for k in ("p_ignore", "sparse", "dense"):
            if not 0.0 <= self.values[k] < 1.0:
                raise PosencError(f"task {self.spec!r}: {k} must be in [0, 1), got {self.values[k]}")
        _check_distances(self, "distances", (LOG_UNIFORM, "geometric"))

    def train_row(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``n`` tokens of the training distribution (``distances``) with the marks of its ``n - 1`` targets."""
        if self.values["distances"] == "geometric":
            return _flipflop_pairs(rng, n, self.values["p_ignore"])
        return _flipflop_spread(rng, n)

    def row(self, rng, length, p_ignore=None, gap=None, bucket=None):
        """``gap``, ``bucket`` None: the training distribution, or i.i.d. pairs at density ``p_ignore`` when it is
        given (``sparse``, ``dense``). ``bucket`` = b (>= 2): the controlled-gap probe: an even distance d uniform in
        [b, 2b), a training-distribution prefix of an even length uniform in 0 .. length + 1 - d - 2, then a write,
        ignores and one read whose bit is d tokens after the write's bit (the only answer), then ignores to the end.
        ``gap`` = g (even, >= 2): the probe at the end: ``length - g - 1`` tokens of training-density (``p_ignore``)
        pairs, then the write, ignores and the read. PosencError when the probe does not fit ``length``."""
        if bucket is not None:
            return self._bucket_probe(rng, length + 1, bucket)
        if gap is None:
            if p_ignore is None:
                return self.train_row(rng, length + 1)
            return _flipflop_pairs(rng, length + 1, p_ignore)
        prefix = length - gap - 1
        if gap < 2 or gap % 2 or prefix < 0 or prefix % 2:
            raise PosencError(
                f"flip-flop probe: gap {gap} must be even and >= 2, and length - gap - 1 = {prefix} even and >= 0"
            )
        bit = B0 + rng.integers(0, 2)
        probe = np.empty(gap + 2, dtype=np.int64)
        probe[0], probe[1], probe[-2], probe[-1] = W, bit, R, bit
        probe[2:-2:2] = I
        probe[3:-2:2] = B0 + rng.integers(0, 2, size=gap // 2 - 1)
        tok = np.concatenate(
            [_flipflop_pairs(rng, prefix, self.values["p_ignore"])[0] if prefix else np.empty(0, np.int64), probe]
        )
        return _probe(tok, gap)

    def _bucket_probe(self, rng: np.random.Generator, n: int, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if b < 2:
            raise PosencError(f"flip-flop probe: bucket {b} must be >= 2")
        d = 2 * int(rng.integers(-(-b // 2), (2 * b - 1) // 2 + 1))  # even, in [b, 2b)
        if d + 2 > n:
            raise PosencError(f"flip-flop probe: length {n - 1} is too short for distance {d}")
        pre = 2 * int(rng.integers(0, (n - d - 2) // 2 + 1))
        core = np.empty(d + 2, dtype=np.int64)
        bit = B0 + rng.integers(0, 2)
        core[0], core[1], core[-2], core[-1] = W, bit, R, bit
        core[2:-2:2] = I
        core[3:-2:2] = B0 + rng.integers(0, 2, size=d // 2 - 1)
        post = n - pre - d - 2
        tail = np.empty(post, dtype=np.int64)
        tail[0::2], tail[1::2] = I, B0 + rng.integers(0, 2, size=post // 2)
        head = self.train_row(rng, pre)[0] if pre else np.empty(0, np.int64)
        return _marked(np.concatenate([head, core, tail]), pre + d, d)

    def tests(self, train_length, multiples):
        return _stream_tests(train_length, multiples, "p_ignore", self.values["sparse"], self.values["dense"])

    def end_probe(self, train_length: int, gap: int) -> Test:
        """The probe at distance ``gap`` with its answer at the end after ``train_length`` tokens (``gate_leak``)."""
        return Test("gap", train_length + gap + 1, {"gap": gap})


def _marked(tok: np.ndarray, target: int, distance: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A probe's row: ``tok`` (T + 1,) whose target ``target`` alone is an answer, ``distance`` tokens from its
    evidence."""
    answer = np.zeros(len(tok) - 1, dtype=bool)
    dist = np.zeros(len(tok) - 1, dtype=np.int64)
    answer[target], dist[target] = True, distance
    return tok, answer, dist


def _flipflop_spread(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` tokens of log-uniform flip-flop: segments of a write, j - 1 ignores and a read (evidence distance 2j
    tokens, j drawn by :func:`_segments`), then a write and ignores to the end; answer and distance marks of the
    ``n - 1`` targets."""
    pairs = -(-n // 2)
    instr = np.full(pairs, I, dtype=np.int64)
    bits = rng.integers(0, 2, size=pairs)
    answer = np.zeros(max(n - 1, 0), dtype=bool)
    distance = np.zeros(max(n - 1, 0), dtype=np.int64)
    p = 0
    for j in _segments(rng, (n - 2) // 2, 1, 1) if n >= 4 else []:
        instr[p], instr[p + j], bits[p + j] = W, R, bits[p]
        answer[2 * (p + j)], distance[2 * (p + j)] = True, 2 * j
        p += j + 1
    if p < pairs:
        instr[p] = W
    tok = np.empty(2 * pairs, dtype=np.int64)
    tok[0::2], tok[1::2] = instr, B0 + bits
    return tok[:n], answer, distance


def _probe(tok: np.ndarray, gap: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A controlled-gap probe's row: ``tok`` (T + 1,) whose last target alone is an answer, ``gap`` tokens from its
    evidence."""
    answer = np.zeros(len(tok) - 1, dtype=bool)
    distance = np.zeros(len(tok) - 1, dtype=np.int64)
    answer[-1], distance[-1] = True, gap
    return tok, answer, distance


def _stream_tests(train_length: int, multiples: list[int], density: str, sparse: float, dense: float) -> list[Test]:
    """A stream task's tests: in distribution, ``sparse`` and ``dense`` (values of the ``density`` setting) at each
    multiple of the training length, and the controlled-gap probe at buckets 8 .. the longest length (powers of two;
    sequences of ``train_length + 2b`` tokens)."""
    lengths = [k * train_length for k in multiples]
    out = [
        Test(name, L, settings)
        for name, settings in (("id", {}), ("sparse", {density: sparse}), ("dense", {density: dense}))
        for L in lengths
    ]
    buckets = [2**k for k in range(3, int(math.log2(max(lengths))) + 1)]
    # distances in [b, 2b), a prefix of 0 .. about train_length tokens before the probe
    return out + [Test("gap", train_length + 2 * b, {"bucket": b}) for b in buckets]


def _flipflop_pairs(rng: np.random.Generator, n: int, p_ignore: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` tokens of flip-flop pairs (instruction at even positions, the first a write); answer and
    distance marks for the ``n - 1`` targets."""
    pairs = -(-n // 2)
    p_wr = (1 - p_ignore) / 2
    instr = rng.choice(3, size=pairs, p=[p_wr, p_wr, p_ignore])  # W, R, I
    instr[0] = W
    bits = rng.integers(0, 2, size=pairs)
    idx = np.arange(pairs)
    last_write = np.maximum.accumulate(np.where(instr == W, idx, 0))
    bits = np.where(instr == R, bits[last_write], bits)  # writes never read overwrite: last_write points at writes only
    tok = np.empty(2 * pairs, dtype=np.int64)
    tok[0::2], tok[1::2] = instr, B0 + bits
    tok = tok[:n]
    answer = np.zeros(n - 1, dtype=bool)
    distance = np.zeros(n - 1, dtype=np.int64)
    reads = idx[(instr == R)]
    reads = reads[2 * reads + 1 < n]  # the read's bit is in the sequence
    answer[2 * reads] = True  # target 2j is token 2j + 1, the bit after instruction j
    distance[2 * reads] = 2 * (reads - last_write[reads])
    return tok, answer, distance


class MQAR(Task):
    """Multi-query associative recall with a gap (Zoology): each key's value after a filler gap."""

    name = "mqar"
    params = {
        "pairs": (int, 4),
        "keys": (int, 16),
        "values": (int, 16),
        "filler": (int, 16),
        "gap": (str, "0-fit"),  # training gaps LO-HI in tokens; HI "fit": the largest the training length holds
        "gaps": (str, LOG_UNIFORM),  # or "uniform": uniform in LO..HI
        "fused": (bool, False),
        "queries": (str, "all"),
        "asks": (int, 0),  # queries per sequence with queries=random; 0: pairs
    }

    @property
    def vocab_size(self) -> int:
        v = self.values
        return (v["keys"] * v["values"] if v["fused"] else 0) + v["keys"] + v["values"] + v["filler"]

    @property
    def chance(self) -> float:
        return 1.0 / self.values["values"]

    def gap_range(self, n: int | None = None) -> tuple[int, int | None]:
        """(LO, HI) of the training gaps in tokens; HI None for ``LO-fit`` without ``n``, else the largest gap a
        sequence of ``n`` tokens holds."""
        lo, dash, hi = self.values["gap"].partition("-")
        if not (lo.isdigit() and (not dash or hi.isdigit() or hi == "fit")):
            raise PosencError(
                f"task {self.spec!r}: gap must be N, LO-HI or LO-fit in tokens, got {self.values['gap']!r}"
            )
        lo_i = int(lo)
        hi_i = (None if n is None else n - self.span()) if hi == "fit" else int(hi) if dash else lo_i
        if hi_i is not None and hi != "fit" and lo_i > hi_i:
            raise PosencError(f"task {self.spec!r}: gap {self.values['gap']!r} has LO > HI")
        return lo_i, hi_i

    def check(self) -> None:
        v = self.values
        for k in ("pairs", "keys", "values", "filler"):
            if v[k] < 1:
                raise PosencError(f"task {self.spec!r}: {k} must be >= 1, got {v[k]}")
        if v["queries"] not in ("all", "random"):
            raise PosencError(f"task {self.spec!r}: queries must be 'all' or 'random', got {v['queries']!r}")
        if v["asks"] < 0:
            raise PosencError(f"task {self.spec!r}: asks must be >= 0, got {v['asks']}")
        if v["queries"] == "all" and v["asks"] not in (0, v["pairs"]):
            raise PosencError(f"task {self.spec!r}: asks={v['asks']} needs queries=random (all asks every key once)")
        if v["pairs"] > v["keys"]:
            raise PosencError(f"task {self.spec!r}: pairs {v['pairs']} needs at least as many keys, got {v['keys']}")
        _check_distances(self, "gaps", (LOG_UNIFORM, "uniform"))
        self.gap_range()

    def asks(self) -> int:
        """Queries per sequence."""
        return self.values["asks"] or self.values["pairs"]

    def span(self) -> int:
        """Tokens of the pairs plus the queries with their answers."""
        return (1 if self.values["fused"] else 2) * self.values["pairs"] + 2 * self.asks()

    def check_length(self, train_length: int) -> None:
        """PosencError when the largest training gap (or, with ``LO-fit``, the smallest) does not fit the training
        length."""
        lo, hi = self.gap_range()
        hi = lo if hi is None else hi
        if hi + self.span() > train_length + 1:
            raise PosencError(
                f"task {self.spec!r}: gap up to {hi} plus {self.span()} tokens of pairs and queries "
                f"exceeds the training length {train_length} + 1"
            )

    def draw_gap(self, rng: np.random.Generator, n: int) -> int:
        """A training gap for a sequence of ``n`` tokens: in LO .. min(HI, n - span), uniform (``gaps=uniform``) or
        with each power-of-two gap bucket ({0}, {1}, 2-3, 4-7, ...) that meets the range equally likely, uniform
        inside it (``gaps=log-uniform``)."""
        lo, hi = self.gap_range(n)
        hi = min(hi, n - self.span())
        if self.values["gaps"] == "uniform" or hi < lo:
            return int(rng.integers(lo, hi + 1))
        edges = [(0, 0)] + [(2**k, 2 ** (k + 1) - 1) for k in range(int(math.log2(max(hi, 1))) + 1)]
        parts = [(max(a, lo), min(b, hi)) for a, b in edges if max(a, lo) <= min(b, hi)]
        a, b = parts[int(rng.integers(0, len(parts)))]
        return int(rng.integers(a, b + 1))

    def row(self, rng, length, gap=None, pre=None, bucket=None):
        """Filler, pairs, ``gap`` filler tokens, queries; the filler before the pairs pads to ``length + 1``
        (``pre`` fixes it instead: near recall after ``pre`` filler tokens). Training gaps: :meth:`draw_gap`.
        ``bucket`` = b (>= 1): the controlled-gap probe: a gap uniform in max(0, b - span + 1) .. 2b - 3, the pairs
        at a position uniform over what the sequence leaves, filler after the queries; only the answers at a distance
        in [b, 2b) are marked. PosencError when ``length`` is too short."""
        v = self.values
        P, K, V, Q = v["pairs"], v["keys"], v["values"], self.asks()
        n = length + 1
        post = 0
        if bucket is not None:
            if bucket < 1:
                raise PosencError(f"task {self.spec!r}: probe bucket {bucket} must be >= 1")
            lo = max(0, bucket - self.span() + 1)
            gap = int(rng.integers(lo, max(lo, 2 * bucket - 3) + 1))
            if n - self.span() - gap < 0:
                raise PosencError(f"task {self.spec!r}: length {length} is too short for gap {gap}")
            post = int(rng.integers(0, n - self.span() - gap + 1))
        elif gap is None and pre is None:
            gap = self.draw_gap(rng, n)
        if pre is not None:
            gap = n - self.span() - pre
        pre = n - self.span() - gap - post
        if pre < 0 or gap < 0:
            raise PosencError(f"task {self.spec!r}: length {length} is too short for gap {gap}")
        keys = rng.permutation(K)[:P]
        vals = rng.integers(0, V, size=P)
        key_tok, val_tok, filler0 = keys, K + vals, K + V
        fused0 = K + V + v["filler"]
        pairs = fused0 + keys * V + vals if v["fused"] else np.stack([key_tok, val_tok], 1).reshape(-1)
        order = rng.permutation(P) if v["queries"] == "all" else rng.integers(0, P, size=Q)
        queries = np.stack([key_tok[order], val_tok[order]], 1).reshape(-1)
        filler = filler0 + rng.integers(0, v["filler"], size=pre + gap + post)
        tok = np.concatenate([filler[:pre], pairs, filler[pre : pre + gap], queries, filler[pre + gap :]])
        answer = np.zeros(n - 1, dtype=bool)
        distance = np.zeros(n - 1, dtype=np.int64)
        q0 = n - post - 2 * Q  # position of the first query key
        targets = q0 + 2 * np.arange(Q)  # target t predicts token t + 1, the answer after query key t
        evidence = pre + (order if v["fused"] else 2 * order + 1)  # the value (or fused pair) in the pairs,
        for m in range(1, Q):  # or the answer to the latest earlier query of the same key (queries=random)
            earlier = np.flatnonzero(order[:m] == order[m])
            if earlier.size:
                evidence[m] = targets[earlier[-1]] + 1
        dist = targets + 1 - evidence
        if bucket is not None:  # the probe scores its bucket's distances only
            targets, dist = (
                targets[(dist >= bucket) & (dist < 2 * bucket)],
                dist[(dist >= bucket) & (dist < 2 * bucket)],
            )
        answer[targets] = True
        distance[targets] = dist
        return tok, answer, distance

    def end_probe(self, train_length: int, gap: int) -> Test:
        """The probe with ``gap`` filler tokens between the pairs and the queries, the queries at the end."""
        return Test("gap", gap + self.span() - 1, {"gap": gap})

    def tests(self, train_length, multiples):
        top = max(multiples) * train_length
        out = [Test("id", train_length, {})]
        buckets = [2**k for k in range(3, int(math.log2(top)) + 1)]
        # distances in [b, 2b), the pairs anywhere in train_length + 2b + span tokens
        out += [Test("gap", train_length + 2 * b + self.span() - 1, {"bucket": b}) for b in buckets]
        out += [Test("near", m * train_length, {"pre": m * train_length + 1 - self.span()}) for m in multiples]
        return out


class ModSum(Task):
    """State tracking (Z_m word problem): after each query, the running sum mod m of the elements so far."""

    name = "modsum"
    params = {
        "m": (int, 2),
        "p_query": (float, 0.1),
        "sparse": (float, 0.02),
        "dense": (float, 0.3),
        "distances": (str, LOG_UNIFORM),  # or "geometric": i.i.d. queries at p_query
    }

    @property
    def vocab_size(self) -> int:
        return 2 * self.values["m"] + 1  # elements 0..m-1, the query token m, sums m+1..2m

    @property
    def chance(self) -> float:
        return 1.0 / self.values["m"]

    def check(self) -> None:
        if self.values["m"] < 2:
            raise PosencError(f"task {self.spec!r}: m must be >= 2, got {self.values['m']}")
        for k in ("p_query", "sparse", "dense"):
            if not 0.0 < self.values[k] < 1.0:
                raise PosencError(f"task {self.spec!r}: {k} must be in (0, 1), got {self.values[k]}")
        _check_distances(self, "distances", (LOG_UNIFORM, "geometric"))

    def train_row(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``n`` tokens of the training distribution (``distances``) with the marks of its ``n - 1`` targets."""
        if self.values["distances"] == "geometric":
            return _modsum_stream(rng, n, self.values["m"], self.values["p_query"])
        return _modsum_spread(rng, n, self.values["m"])

    def row(self, rng, length, p_query=None, gap=None, bucket=None):
        """``gap``, ``bucket`` None: the training distribution, or a stream at query density ``p_query`` when it is
        given (``sparse``, ``dense``). ``bucket`` = b (>= 2): the controlled-gap probe: a distance d uniform in
        [max(b, 2), 2b), a training-distribution prefix of a length uniform in 0 .. length + 1 - d - 2, a query with
        its sum (the evidence), d - 2 elements and one query whose sum is d tokens after the revealed one (the only
        answer), then elements to the end. ``gap`` = g (>= 2): the probe at the end: ``length - g - 3`` tokens of
        training-density (``p_query``) stream, then the revealed sum, g - 2 elements and the query. PosencError when
        the probe does not fit ``length``."""
        n, m = length + 1, self.values["m"]
        if bucket is not None:
            if bucket < 2:
                raise PosencError(f"modsum probe: bucket {bucket} must be >= 2")
            d = int(rng.integers(max(bucket, 2), 2 * bucket))
            if d + 2 > n:
                raise PosencError(f"modsum probe: length {length} is too short for distance {d}")
            pre = int(rng.integers(0, n - d - 2 + 1))
            head = self.train_row(rng, pre)[0] if pre else np.empty(0, np.int64)
            state = int(head[head < m].sum()) % m
            elems = rng.integers(0, m, size=d - 2)
            core = [m, m + 1 + state, *elems, m, m + 1 + (state + int(elems.sum())) % m]
            tail = rng.integers(0, m, size=n - pre - d - 2)
            return _marked(np.concatenate([head, np.asarray(core, dtype=np.int64), tail]), pre + d, d)
        if gap is None:
            if p_query is None:
                return self.train_row(rng, n)
            return _modsum_stream(rng, n, m, p_query)
        pre = n - gap - 2
        if gap < 2 or pre < 0:
            raise PosencError(f"modsum probe: gap {gap} must be >= 2 and fit the length {length}")
        tok = _modsum_stream(rng, pre, m, self.values["p_query"])[0] if pre else np.empty(0, np.int64)
        elems = rng.integers(0, m, size=gap - 2)
        state = int(tok[tok < m].sum()) % m
        return _probe(
            np.concatenate([tok, [m, m + 1 + state], elems, [m, m + 1 + (state + int(elems.sum())) % m]]), gap
        )

    def tests(self, train_length, multiples):
        return _stream_tests(train_length, multiples, "p_query", self.values["sparse"], self.values["dense"])

    def end_probe(self, train_length: int, gap: int) -> Test:
        """The probe at distance ``gap`` with its answer at the end after ``train_length`` tokens (``gate_leak``)."""
        return Test("gap", train_length + gap + 1, {"gap": gap})


def _modsum_spread(rng: np.random.Generator, n: int, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` tokens of log-uniform Z_m: segments of d - 2 elements, a query and its sum (evidence distance d from the
    previous sum, or from the start, d drawn by :func:`_segments`), then elements to the end; answer and distance
    marks of the ``n - 1`` targets."""
    tok = rng.integers(0, m, size=n).astype(np.int64)
    answer = np.zeros(max(n - 1, 0), dtype=bool)
    distance = np.zeros(max(n - 1, 0), dtype=np.int64)
    p, state = 0, 0
    for d in _segments(rng, n, 0, 2) if n >= 2 else []:
        state = (state + int(tok[p : p + d - 2].sum())) % m
        tok[p + d - 2], tok[p + d - 1] = m, m + 1 + state
        answer[p + d - 2], distance[p + d - 2] = True, d
        p += d
    return tok, answer, distance


def _modsum_stream(
    rng: np.random.Generator, n: int, m: int, p_query: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` tokens of a Z_m stream: elements, and queries ``m`` each followed by the running sum (token
    ``m + 1 + sum mod m``); answer and distance marks for the ``n - 1`` targets. A query cut off by the end
    becomes the element 0 (the identity), so every query has its sum."""
    is_query = rng.random(n) < p_query  # one unit per token at most: a query unit takes two
    elems = rng.integers(0, m, size=n)
    sums = np.cumsum(np.where(is_query, 0, elems)) % m
    tok = np.where(
        is_query[:, None], np.stack([np.full(n, m), m + 1 + sums], 1), np.stack([elems, np.full(n, -1)], 1)
    ).reshape(-1)
    tok = tok[tok >= 0][:n]
    if tok[-1] == m:
        tok[-1] = 0
    sum_pos = np.flatnonzero(tok > m)  # the answers are these tokens: targets sum_pos - 1
    answer = np.zeros(n - 1, dtype=bool)
    distance = np.zeros(n - 1, dtype=np.int64)
    answer[sum_pos - 1] = True
    distance[sum_pos - 1] = sum_pos - np.concatenate(
        [[-1], sum_pos[:-1]]
    )  # back to the last revealed sum (the start: -1)
    return tok, answer, distance


TASKS: dict[str, type[Task]] = {"flipflop": FlipFlop, "mqar": MQAR, "modsum": ModSum}


def is_task(spec: str) -> bool:
    """True when ``spec`` names a synthetic task (``flipflop``, ``mqar:pairs=8``), not a text corpus."""
    return isinstance(spec, str) and spec.partition(":")[0] in TASKS


def get_task(spec: str) -> Task:
    """The task of ``spec`` (``NAME[:key=value,...]``); PosencError (one line) for a malformed spec,
    an unknown name or parameter, or a value of the wrong type or range."""
    name, params = split_part(spec, "task")
    if name not in TASKS:
        raise PosencError(f"unknown task {name!r} in {spec!r} (tasks: {', '.join(TASKS)})")
    return TASKS[name](spec, **params)


@dataclasses.dataclass(frozen=True)
class TaskData:
    """A task in the place of a tokenised corpus (``posenc.data.corpora.load_tokens`` of a task spec)."""

    corpus: str
    task: Task

    @property
    def vocab_size(self) -> int:
        return self.task.vocab_size

    def batch(self, step: int, batch_size: int, length: int, seed: int, rows: slice = slice(None)) -> TaskBatch:
        """The global training batch of ``step`` (rows ``rows`` of it, for a data-parallel rank)."""
        return self.task.batch(seed, step, range(batch_size)[rows], length)
