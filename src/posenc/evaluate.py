"""Perplexity against evaluation length on held-out documents.

Windows never cross a document boundary: a window of length L at offset s reads
tokens [s, s+L) and predicts targets [s+1, s+L+1), i.e. a ``posenc.scoring``
window of L + 1 text tokens, so consecutive windows (stride L) score every
target exactly once; a document's last window may overlap its predecessor
(``posenc.scoring.text_windows``) and then scores only the targets after it.
Perplexity is exp(sum of NLL / number of scored tokens), never a mean of window means.
"""

from __future__ import annotations

import math
import time
from typing import Iterable

import numpy as np
import torch
from tqdm.auto import tqdm

from posenc.encodings.absolute import LengthNotSupported
from posenc.errors import PosencError
from posenc.model import LM
from posenc.records import Ppl
from posenc.scoring import Window, text_windows


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
        longest = max((len(a) for _, a in docs), default=0)
        raise PosencError(f"evaluation length {length} exceeds the longest held-out document ({longest - 1} targets)")


def bucket_edges(length: int, train_length: int) -> list[int]:
    """Position buckets inside a window: [0, L0), [L0, 2 L0), [2 L0, 4 L0), ... up to ``length``."""
    edges, e = [0], train_length
    while e < length:
        edges.append(e)
        e *= 2
    return edges + [length]


@torch.inference_mode()
def evaluate_length(
    model: LM,
    docs: list[tuple[str, np.ndarray]],
    length: int,
    base: dict,
    max_tokens: int | None = None,
    batch_tokens: int = 8192,
    progress: bool = True,
    span: int | None = None,
) -> Ppl:
    """Perplexity of ``model`` on the windows of ``length`` tokens that :func:`plan` gives (``max_tokens``, ``span``).

    Returns the record: eval_length, windows, scored_tokens, nll (sum, nats), ppl, bucket_edges and bucket_ppl
    (per position bucket), seconds, the model's train_length and ``base``'s fields ({"scheme"} at least; compare
    adds "seed"). Learned tables too short for ``length`` give ``ppl: None`` and ``note: "n/a: ..."``.
    ``progress``: a bar of windows on stderr when stderr is a terminal (never in a log file).
    """
    model.eval()
    t0, base = time.time(), dict(base, train_length=model.cfg.train_length, eval_length=length)
    wins = plan(docs, length, max_tokens, span)
    edges = bucket_edges(length, model.cfg.train_length)
    b_nll, b_count = np.zeros(len(edges) - 1), np.zeros(len(edges) - 1, dtype=np.int64)
    nll_sum, count = 0.0, 0
    per_batch = max(1, batch_tokens // length)
    bar = tqdm(total=len(wins), desc=f"eval L={length}", unit="win", leave=False, disable=None if progress else True)
    try:
        for b in range(0, len(wins), per_batch):
            chunk = wins[b : b + per_batch]
            batch = np.stack([docs[d][1][w.begin : w.begin + length + 1] for d, w in chunk]).astype(np.int64)
            t = torch.from_numpy(batch).to(next(model.parameters()).device)
            nll = model.token_nll(t[:, :-1], t[:, 1:]).double().cpu()  # (B, L): entry j predicts text token begin + 1 + j
            # a document's last window may overlap its predecessor: only its targets from w.lo on count
            first = torch.tensor([w.lo - w.begin - 1 for _, w in chunk])
            keep = torch.arange(length)[None] >= first[:, None]
            nll_sum += float(nll[keep].sum())
            count += int(keep.sum())
            per_pos, n_pos = (nll * keep).sum(0).numpy(), keep.sum(0).numpy()
            for i in range(len(edges) - 1):
                b_nll[i] += per_pos[edges[i] : edges[i + 1]].sum()
                b_count[i] += n_pos[edges[i] : edges[i + 1]].sum()
            bar.update(len(batch))
    except LengthNotSupported as exc:
        return Ppl(**base, windows=0, scored_tokens=0, note=f"n/a: {exc}")
    finally:
        bar.close()
    return Ppl(**base, windows=len(wins), scored_tokens=count, nll=nll_sum, ppl=math.exp(nll_sum / count), bucket_edges=edges,
               bucket_ppl=[math.exp(n / c) for n, c in zip(b_nll, b_count)], seconds=time.time() - t0)


def eval_lengths(train_length: int, multiples: Iterable[int]) -> list[int]:
    """Evaluation lengths as multiples of the training length; each must be >= 1."""
    out = []
    for m in multiples:
        if m < 1:
            raise PosencError(f"evaluation multiple must be >= 1, got {m}")
        out.append(train_length * m)
    return out
