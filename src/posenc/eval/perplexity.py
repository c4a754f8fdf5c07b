"""Perplexity with exact token accounting, of posenc's own models (``evaluate_length``: the windows of one
evaluation length, batched, one ``Ppl`` record) and of Hugging Face causal LMs (``score_window``, one window at a
time with a BOS policy); both take their windows from ``posenc.scoring``. Passkey retrieval: ``posenc.eval.passkey``.

Token accounting of a Hugging Face model (one BOS policy at every length; ``length`` = model positions):

- ``bos="none"``: a window is ``length`` text tokens; its first token is context only.
- ``bos="prepend"``: a window is BOS + ``length - 1`` text tokens; every text token in
  it is predictable.

Either way a window has ``length - 1`` targets, and windows start every ``stride``
text tokens (default ``length - 1``: the targets of consecutive windows tile the
text). Each window scores only targets not scored by the previous window, so every
scored token is counted exactly once and PPL = exp(sum NLL / number of scored tokens).
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from posenc import scoring
from posenc.data.positions import eval_positions, scored_max
from posenc.encodings.absolute import LengthNotSupported
from posenc.eval.progress import bar as progress_bar
from posenc.model import LM
from posenc.scoring import Window, bucket_edges, plan
from posenc.store.records import Ppl


def model_windows(n_tokens: int, length: int, stride: int | None = None, bos: bool = False) -> list[Window]:
    """All full windows of ``length`` model positions over ``n_tokens`` text tokens
    (``posenc.scoring.text_windows`` of ``length - bos`` text tokens; its errors)."""
    return scoring.text_windows(n_tokens, length - bos, stride, bos)


@torch.inference_mode()
def token_nll(model, ids: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """Next-token NLL (nats) of ``ids`` (T,) int64: returns (T-1,) float64, entry p is
    -log P(ids[p+1] | ids[:p+1]). The model reads all T ids; ``posenc.scoring.token_nll``
    applies the head ``chunk`` positions at a time."""
    hidden = model.model(input_ids=ids[None]).last_hidden_state[:, :-1]
    return scoring.token_nll(hidden, _head(model), ids[None, 1:], chunk)[0].double()


def _head(model):
    """The output head as (B, t, d) -> (B, t, vocab) float32 logits, with Gemma 2 style soft-capping."""
    head, cap = model.get_output_embeddings(), getattr(model.config, "final_logit_softcapping", None)
    if not cap:
        return lambda h: head(h).float()
    return lambda h: cap * torch.tanh(head(h).float() / cap)


POSITION_BUCKETS = 32  # position buckets per window when no bucket width is given


def bucket_width(length: int, bucket: int | None = None) -> int:
    """Position-bucket width (tokens) for a window of ``length`` model positions: ``bucket`` when given, else the
    largest power of two at most length / POSITION_BUCKETS, at least 1 (32 buckets of 16 tokens at 512, of 1,024
    at 32K), so that a per-position plot has points at any length."""
    if bucket is not None:
        return bucket
    return 1 << max(0, (length // POSITION_BUCKETS).bit_length() - 1)


def stream_buckets(nll: np.ndarray, parts: int = 8) -> tuple[list[int], list[float]]:
    """A streamed text's perplexity by position: (edges, perplexity) of ``parts`` equal spans of its per-target NLL
    (``nll`` (T,) nats, float64), edges in targets from 0 to T. The one bucketing of ``posenc eval --stream`` and
    ``posenc extend --stream``."""
    edges = sorted({round(len(nll) * b / parts) for b in range(parts + 1)})
    return edges, [math.exp(float(np.mean(nll[a:b], dtype=np.float64))) for a, b in zip(edges, edges[1:])]


def score_window(model, tokens: np.ndarray, win: Window, bos_id: int | None, bucket: int) -> dict:
    """Forward one window; NLL sum and count of its scored targets, and per-bucket
    sums by position in the window (bucket = model input index of the target // ``bucket``)."""
    text = torch.as_tensor(np.asarray(tokens[win.begin : win.begin + win.span], dtype=np.int64))
    prefix = 0 if bos_id is None else 1
    ids = torch.cat([torch.tensor([bos_id]), text]) if prefix else text
    nll = token_nll(model, ids)
    # target text index t sits at input index t - begin + prefix, predicted from the entry before it
    first = win.lo - win.begin + prefix
    scored = nll[first - 1 : win.hi - win.begin + prefix - 1]
    pos = torch.arange(first, first + len(scored))
    n_buckets = math.ceil(len(ids) / bucket)
    b_sum = torch.zeros(n_buckets, dtype=torch.float64).index_add_(0, pos // bucket, scored)
    b_n = torch.bincount(pos // bucket, minlength=n_buckets)
    assert len(scored) == win.n_scored
    return {
        "nll_sum": float(scored.sum()),
        "n_scored": int(win.n_scored),
        "bucket_nll": b_sum.tolist(),
        "bucket_n": b_n.tolist(),
    }


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
    positions: int | None = None,
) -> Ppl:
    """Perplexity of ``model`` on the windows of ``length`` tokens that :func:`plan` gives (``max_tokens``, ``span``).

    Returns the record: eval_length, windows, scored_tokens, nll (sum, nats), ppl, bucket_edges and bucket_ppl
    (per position bucket), seconds, the model's train_length and ``base``'s fields ({"scheme"} at least; compare
    adds "seed"). Learned tables too short for ``length`` give ``ppl: None`` and ``note: "n/a: ..."``.
    ``progress``: a bar of windows with an ETA on stderr, as ``posenc.eval.progress`` shows bars (a terminal; a log
    file under ``--verbose`` only). ``positions``: N of a
    model trained on randomized positions (``train.positions: randomized:max=N``), scored on them as the paper does
    (``posenc.data.positions``: one seeded draw per batch of windows) unless an inference method or a RoPE schedule is
    applied (``posenc.data.positions.scored_max``: then 0..length-1); None: positions 0..length-1. A length above N
    gives ``ppl: None`` with its note.
    """
    model.eval()
    positions = scored_max(model, positions)
    t0, base = time.time(), dict(base, train_length=model.cfg.train_length, eval_length=length)
    wins = plan(docs, length, max_tokens, span)
    edges = bucket_edges(length, model.cfg.train_length)
    b_nll, b_count = np.zeros(len(edges) - 1), np.zeros(len(edges) - 1, dtype=np.int64)
    nll_sum, count = 0.0, 0
    per_batch = max(1, batch_tokens // length)
    bar = progress_bar(total=len(wins), desc=f"eval L={length}", unit="win", leave=False, shown=progress)
    try:
        for b in range(0, len(wins), per_batch):
            chunk = wins[b : b + per_batch]
            batch = np.stack([docs[d][1][w.begin : w.begin + length + 1] for d, w in chunk]).astype(np.int64)
            t = torch.from_numpy(batch).to(next(model.parameters()).device)
            pos = eval_positions(positions, length, (length, b), t.device)
            nll = (
                model.token_nll(t[:, :-1], t[:, 1:], pos=pos).double().cpu()
            )  # (B, L): entry j predicts text token begin + 1 + j
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
    return Ppl(
        **base,
        windows=len(wins),
        scored_tokens=count,
        nll=nll_sum,
        ppl=math.exp(nll_sum / count),
        bucket_edges=edges,
        bucket_ppl=[math.exp(n / c) for n, c in zip(b_nll, b_count)],
        seconds=time.time() - t0,
    )
