"""Perplexity with exact token accounting, and passkey retrieval, for a HF causal LM.

Token accounting (one BOS policy at every length):

- ``bos="none"``: a window is ``length`` text tokens; its first token is context only.
- ``bos="prepend"``: a window is BOS + ``length - 1`` text tokens; every text token in
  it is predictable.

Windows start every ``stride`` text tokens (default: the window's text span, i.e.
non-overlapping). Each window scores only targets not scored by the previous
window, so every scored token is counted exactly once and PPL =
exp(sum NLL / number of scored tokens).
"""

from __future__ import annotations

import dataclasses
import math
import random
import re

import numpy as np
import torch
import torch.nn.functional as F

from posenc.errors import PosencError

PASSKEY_TASK = ("There is an important info hidden inside a lot of irrelevant text. "
                "Find it and memorize it. I will quiz you about the important information there.")
PASSKEY_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
PASSKEY_QUESTION = "What is the pass key? The pass key is"


@dataclasses.dataclass(frozen=True)
class Window:
    """Input text tokens ``[begin, begin + span)`` of one document; targets
    ``[lo, hi)`` (text-token indices) are scored."""

    begin: int
    span: int
    lo: int
    hi: int

    @property
    def n_scored(self) -> int:
        return self.hi - self.lo


def windows(n_tokens: int, length: int, stride: int | None = None, bos: bool = False) -> list[Window]:
    """All full windows of ``length`` model positions over ``n_tokens`` text tokens.

    ``stride`` (text tokens between window starts) defaults to the text span
    (non-overlapping); ``stride < span`` gives sliding windows in which only the
    last ``stride`` targets are scored. Returns [] when the text is shorter than
    one window. Raises PosencError for a stride outside [1, span].
    """
    span = length - 1 if bos else length
    stride = stride or span
    if not 1 <= stride <= span:
        raise PosencError(f"stride must be in [1, {span}] for length {length}, got {stride}")
    out, done = [], 0
    for begin in range(0, n_tokens - span + 1, stride):
        lo = max(begin if bos else begin + 1, done)
        out.append(Window(begin, span, lo, begin + span))
        done = begin + span
    return out


@torch.inference_mode()
def token_nll(model, ids: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """Next-token NLL (nats) of ``ids`` (T,) int64: returns (T-1,) float64, entry p is
    -log P(ids[p+1] | ids[:p+1]). Logits are made ``chunk`` positions at a time, so
    a (T, vocab) float32 tensor never exists."""
    hidden = model.model(input_ids=ids[None]).last_hidden_state[0]
    head = model.get_output_embeddings()
    out = torch.empty(len(ids) - 1, dtype=torch.float64)
    for a in range(0, len(ids) - 1, chunk):
        b = min(a + chunk, len(ids) - 1)
        logits = head(hidden[a:b]).float()
        if cap := getattr(model.config, "final_logit_softcapping", None):  # Gemma 2 style models
            logits = cap * torch.tanh(logits / cap)
        out[a:b] = F.cross_entropy(logits, ids[a + 1 : b + 1], reduction="none").double()
    return out


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
    return {"nll_sum": float(scored.sum()), "n_scored": int(win.n_scored),
            "bucket_nll": b_sum.tolist(), "bucket_n": b_n.tolist()}


# ---------------------------------------------------------------- passkey


def passkey_prompt(tokenizer, length: int, depth: float, key: int) -> tuple[list[int], str]:
    """Token ids of the standard passkey prompt (Mohtashami & Jaggi 2023) of at most
    ``length`` tokens, with the key line after a ``depth`` (0..1) fraction of the filler.

    The filler count is the largest that fits; the returned ids are exactly the
    tokenization of the returned text (no truncation). Raises PosencError when
    ``length`` cannot hold the task, key and question.
    """

    def build(n: int) -> str:
        before = round(n * depth)
        parts = [PASSKEY_TASK, *[PASSKEY_FILLER] * before, f"The pass key is {key}. Remember it. {key} is the pass key.",
                 *[PASSKEY_FILLER] * (n - before), PASSKEY_QUESTION]
        return " ".join(parts)

    def count(n: int) -> int:
        return len(tokenizer(build(n), add_special_tokens=False, truncation=False)["input_ids"])

    per = count(11) - count(10)
    n = max(0, (length - count(0)) // per)
    while n > 0 and count(n) > length:
        n -= 1
    text = build(n)
    ids = tokenizer(text, add_special_tokens=False, truncation=False)["input_ids"]
    if len(ids) > length:
        raise PosencError(f"passkey length {length} is too short for the prompt ({len(ids)} tokens without filler)")
    return ids, text


def first_integer(text: str) -> int | None:
    """The first run of digits in ``text`` as an int (None if there is none)."""
    m = re.search(r"\d+", text)
    return int(m.group()) if m else None


def passkey_key(seed: int, length: int, depth: float, trial: int) -> int:
    """A reproducible 5-digit key for one (length, depth, trial) cell."""
    return random.Random(f"{seed}-{length}-{depth}-{trial}").randint(10000, 99999)


@torch.inference_mode()
def passkey_trial(model, tokenizer, length: int, depth: float, key: int, new_tokens: int = 8) -> dict:
    """Greedy generation on one passkey prompt; correct iff the first integer equals ``key``.

    The model input is asserted to be the full prompt: its length is recorded as
    ``prompt_tokens`` (<= ``length``).
    """
    ids, _ = passkey_prompt(tokenizer, length, depth, key)
    x = torch.tensor([ids])
    assert x.shape[1] == len(ids) <= length
    pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens, do_sample=False,
                         pad_token_id=pad)
    answer = tokenizer.decode(out[0, x.shape[1] :], skip_special_tokens=True)
    got = first_integer(answer)
    return {"key": key, "answer": answer, "got": got, "correct": got == key, "prompt_tokens": len(ids)}
