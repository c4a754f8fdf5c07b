"""Token accounting and next-token NLL: the one place both own models (``posenc.evaluate``,
``posenc.passkey``, training) and Hugging Face models (``posenc.pretrained.evaluate``) score text.

Accounting. A window reads ``span`` consecutive text tokens of one document,
``[begin, begin + span)``, optionally after a BOS token. Its targets are the text
tokens that have context inside the window: ``[begin + 1, begin + span)`` without
BOS, ``[begin, begin + span)`` with it. Windows start every ``stride`` text tokens;
the default stride is the number of targets per window, so consecutive windows'
targets tile the text. When the last of them ends before the document does, one
more window, the document's last ``span`` tokens, scores the targets left. A window
scores only the targets its predecessor did not, so every target of a document of
N >= span tokens, 1..N-1 (0..N-1 with BOS), is scored exactly once (checked on
every plan) and PPL = exp(sum NLL / scored tokens).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

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
        raise PosencError(f"stride must be in [1, {per_window}] for windows of {span} text tokens"
                          f"{' after BOS' if bos else ''}, got {stride}")
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
        raise RuntimeError(f"token accounting: {scored} targets scored for the {n_tokens - first} targets "
                           f"[{first}, {n_tokens}); each must be scored exactly once")


def token_nll(hidden: torch.Tensor, logits: Callable[[torch.Tensor], torch.Tensor], targets: torch.Tensor,
              chunk: int = 4096) -> torch.Tensor:
    """Next-token NLL in nats: (B, T) float32.

    hidden: (B, T, d) final hidden states (any float dtype) of the positions that
    predict ``targets`` (B, T) int64; logits: the output head, (B, t, d) -> (B, t, vocab).
    The head runs ``chunk`` positions at a time (cast to float32 before the
    softmax), so (T, vocab) logits never exist at once. Raises PosencError when
    the shapes disagree.
    """
    if hidden.shape[:2] != targets.shape:
        raise PosencError(f"hidden states {tuple(hidden.shape)} do not match targets {tuple(targets.shape)}")
    out = [F.cross_entropy(logits(hidden[:, s : s + chunk]).float().flatten(0, 1), targets[:, s : s + chunk].flatten(),
                           reduction="none") for s in range(0, hidden.shape[1], chunk)]
    return torch.cat([o.view(targets.shape[0], -1) for o in out], dim=1)
