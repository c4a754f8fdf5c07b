"""Token accounting and next-token NLL: the one place both own models (``posenc.eval.perplexity.evaluate_length``,
``posenc.eval.passkey``, training) and Hugging Face models (``posenc.eval.perplexity``) score text.

Accounting. A window reads ``span`` consecutive text tokens of one document,
``[begin, begin + span)``, optionally after a BOS token. Its targets are the text
tokens that have context inside the window: ``[begin + 1, begin + span)`` without
BOS, ``[begin, begin + span)`` with it. Windows start every ``stride`` text tokens;
the default stride is the number of targets per window, so consecutive windows'
targets tile the text. When the last of them ends before the document does, one
more window, the document's last ``span`` tokens, scores the targets left. A window
scores only the targets its predecessor did not, so every target of a document of
N >= span tokens, 1..N-1 (0..N-1 with BOS), is scored exactly once (checked on
every plan) and PPL = exp(sum NLL / scored tokens), never a mean of window means.

Own models' evaluation lengths (:func:`plan`). A window of length L at offset s reads tokens
[s, s+L) and predicts targets [s+1, s+L+1), i.e. a window of L + 1 text tokens, so consecutive
windows (stride L) score every target exactly once; a document's last window may overlap its
predecessor and then scores only the targets after it. Windows never cross a document boundary.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

import numpy as np
import torch
import torch.nn.functional as F

from posenc.errors import PosencError


@dataclasses.dataclass(frozen=True)
class Window:
    """Reads text tokens ``[begin, begin + span)``; scores targets ``[lo, hi)`` (text-token indices)."""

    begin: int
    span: int
    lo: int
    hi: int

    @property
    def n_scored(self) -> int:
        return self.hi - self.lo


def text_windows(n_tokens: int, span: int, stride: int | None = None, bos: bool = False) -> list[Window]:
    """Windows of ``span`` text tokens that score every target of a document of ``n_tokens`` tokens once.

    ``stride`` (text tokens between window starts) defaults to the targets per
    window (``span - 1`` without BOS, ``span`` with it); a smaller stride gives
    sliding windows whose later members score only their last ``stride`` targets.
    If the windows on the stride grid end before the document does, a last window
    reads the document's last ``span`` tokens (off the grid: every window keeps the
    full length) and scores only the targets after its predecessor's. Returns []
    when the document is shorter than one window. Raises PosencError for a stride
    outside [1, targets per window] (a larger one would skip targets), RuntimeError
    if the plan does not score each target exactly once.
    """
    first = 0 if bos else 1  # a window's first target, relative to its begin
    per_window = span - first
    stride = per_window if stride is None else stride
    if per_window < 1 or not 1 <= stride <= per_window:
        raise PosencError(
            f"stride must be in [1, {per_window}] for windows of {span} text tokens"
            f"{' after BOS' if bos else ''}, got {stride}"
        )
    out, done = [], 0
    for begin in range(0, n_tokens - span + 1, stride):
        out.append(Window(begin, span, max(begin + first, done), begin + span))
        done = begin + span
    if out and done < n_tokens:  # the targets after the grid's last window (fewer than stride)
        out.append(Window(n_tokens - span, span, done, n_tokens))
    check_once(out, first, n_tokens)
    return out


def check_once(wins: list[Window], first: int, n_tokens: int) -> None:
    """Raise RuntimeError unless ``wins`` score each target ``first``..``n_tokens - 1`` of the document exactly
    once (no window: nothing to check): each window's targets are non-empty, lie inside it with their context,
    and start where its predecessor's end; the first starts at ``first``, the last ends at ``n_tokens``."""
    if not wins:
        return
    starts = [first] + [w.hi for w in wins[:-1]]
    inside = all(w.begin + first <= w.lo < w.hi <= w.begin + w.span <= n_tokens for w in wins)
    if not inside or [w.lo for w in wins] != starts or wins[-1].hi != n_tokens:
        scored = sum(w.n_scored for w in wins)
        raise RuntimeError(
            f"token accounting: {scored} targets scored for the {n_tokens - first} targets "
            f"[{first}, {n_tokens}); each must be scored exactly once"
        )


def token_nll(
    hidden: torch.Tensor, logits: Callable[[torch.Tensor], torch.Tensor], targets: torch.Tensor, chunk: int = 4096
) -> torch.Tensor:
    """Next-token NLL in nats: (B, T) float32.

    hidden: (B, T, d) final hidden states (any float dtype) of the positions that
    predict ``targets`` (B, T) int64; logits: the output head, (B, t, d) -> (B, t, vocab).
    The head runs ``chunk`` positions at a time (cast to float32 before the
    softmax), so (T, vocab) logits never exist at once. Raises PosencError when
    the shapes disagree.
    """
    if hidden.shape[:2] != targets.shape:
        raise PosencError(f"hidden states {tuple(hidden.shape)} do not match targets {tuple(targets.shape)}")
    out = [
        F.cross_entropy(
            logits(hidden[:, s : s + chunk]).float().flatten(0, 1),
            targets[:, s : s + chunk].flatten(),
            reduction="none",
        )
        for s in range(0, hidden.shape[1], chunk)
    ]
    return torch.cat([o.view(targets.shape[0], -1) for o in out], dim=1)


def window_starts(
    docs: list[tuple[str, np.ndarray]], length: int, max_tokens: int | None = None, span: int | None = None
) -> list[tuple[int, int]]:
    """(doc index, start) of the windows of ``length`` that :func:`plan` scores (its arguments and errors)."""
    return [(d, w.begin) for d, w in plan(docs, length, max_tokens, span)]


def plan(
    docs: list[tuple[str, np.ndarray]], length: int, max_tokens: int | None = None, span: int | None = None
) -> list[tuple[int, Window]]:
    """(doc index, ``posenc.scoring.Window`` of ``length + 1`` text tokens) of every window scored at ``length``.

    With ``span`` (a multiple of ``length``), every length scores the same text:
    the first ``span`` targets of each document long enough, in order, for as
    many documents as ``max_tokens`` needs (rounded up to whole spans); use the
    longest evaluation length as the span so that perplexity ratios between
    lengths compare the same tokens. Without it, windows are taken round-robin
    over documents until ``max_tokens`` targets are covered (None: every target of
    every document at least ``length + 1`` tokens long, each once). Raises
    PosencError when no document is long enough for one window, or when
    ``max_tokens`` < 1 (no windows: nothing to score).
    """
    if max_tokens is not None and max_tokens < 1:
        raise PosencError(f"max_tokens (scored tokens per length) must be >= 1, got {max_tokens}")
    if span is not None:
        if span % length:
            raise PosencError(f"evaluation span {span} is not a multiple of the evaluation length {length}")
        usable = [d for d, (_, a) in enumerate(docs) if len(a) > span]
        _check_long_enough(usable, docs, span)
        n = len(usable) if max_tokens is None else min(len(usable), -(-max_tokens // span))
        return [(d, w) for d in usable[:n] for w in text_windows(span + 1, length + 1)]
    per_doc = [text_windows(len(a), length + 1) for _, a in docs]
    out, i = [], 0
    while any(per_doc):
        for d, wins in enumerate(per_doc):
            if wins:
                out.append((d, wins.pop(0)))
                i += out[-1][1].n_scored
                if max_tokens is not None and i >= max_tokens:
                    return out
    _check_long_enough(out, docs, length)
    return out


def _check_long_enough(found: list, docs, length: int) -> None:
    if not found:
        sizes = [len(a) for _, a in docs]
        if sum(sizes) <= length:  # no layout of the documents would hold one window: the corpus is what is short
            raise PosencError(
                f"corpus too small: its held-out text has {sum(sizes)} tokens in {len(sizes)} document(s), and "
                f"one window of evaluation length {length} needs {length + 1} tokens in one document"
            )
        raise PosencError(
            f"evaluation length {length} exceeds the longest held-out document ({max(sizes) - 1} targets)"
        )


def bucket_edges(length: int, train_length: int) -> list[int]:
    """Position buckets inside a window: [0, L0), [L0, 2 L0), [2 L0, 4 L0), ... up to ``length``."""
    edges, e = [0], train_length
    while e < length:
        edges.append(e)
        e *= 2
    return edges + [length]


def eval_lengths(train_length: int, multiples: Iterable[int]) -> list[int]:
    """Evaluation lengths as multiples of the training length; each must be >= 1."""
    out = []
    for m in multiples:
        if m < 1:
            raise PosencError(f"evaluation multiple must be >= 1, got {m}")
        out.append(train_length * m)
    return out
