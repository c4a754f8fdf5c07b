"""Passkey retrieval: the prompt (one set of texts) and its two ways of scoring.

The task of Mohtashami & Jaggi 2023 ("Landmark Attention", sec. 4.2): a key is
hidden at a chosen depth in repeated filler text and asked for at the end::

    [TASK] <filler> The pass key is 12345. Remember it. 12345 is the pass key. <filler>
    What is the pass key? The pass key is 12345

Depth d puts the needle after round(d * F) of the F filler units (``needle_cut``;
0: at the start, 1: right before the question).

- Small trained models (``make_sample``, ``trial``, ``passkey_records``) hardly
  follow instructions, so the default ``mode: rank`` generates nothing: a trial
  is correct when the true key's continuation has a strictly higher total
  log-probability than each of ``candidates - 1`` other random keys of the same
  token count (chance level 1 / candidates). ``mode: generate`` decodes the key's
  tokens greedily after the prompt (``LM.generate``, KV cache) and is correct on
  an exact match (chance ~0). Either way the model reads exactly ``length``
  tokens: the prompt plus the key without its last token; the filler is cycled
  token by token to fill them.
- Instruction-tuned Hugging Face models (``passkey_prompt``, ``passkey_trial``)
  get the task line and whole filler sentences, and generate greedily; a trial is
  correct when the first integer of the output equals the key.
"""

from __future__ import annotations

import dataclasses
import random
import re
import time
from collections.abc import Iterator
from typing import Annotated, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from posenc.errors import PosencError
from posenc.model import LM
from posenc.scoring import eval_lengths
from posenc.store.presets import MAX_COUNT, CountOrOff, Seed, distinct
from posenc.store.records import PasskeyCell

TASK = (
    "There is an important info hidden inside a lot of irrelevant text. "
    "Find it and memorize it. I will quiz you about the important information there."
)
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key. "
QUESTION = "What is the pass key? The pass key is "


class PasskeyConfig(BaseModel):
    """Passkey settings of a preset (``eval.passkey``); ``trials: 0`` switches it off."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    lengths_multiples: list[Annotated[int, Field(ge=1)]] = [1, 4]
    """Prompt lengths, as multiples of the training length."""
    _distinct = field_validator("lengths_multiples")(distinct)
    depths: list[Annotated[float, Field(ge=0, le=1)]] = [0.1, 0.5, 0.9]
    """Where the key sits in the prompt, as fractions of its length in [0, 1]."""
    trials: CountOrOff = 4
    """Trials per (length, depth) cell; 0 switches passkey off."""
    candidates: int = Field(5, ge=2, le=MAX_COUNT)
    """Keys ranked per trial: the true key and ``candidates - 1`` others."""
    digits: int = Field(5, ge=1, le=18)
    """Digits of the key."""
    seed: Seed = 0
    """Seed of the keys (the true one and the candidates), in [0, 2^31): every model sees the same."""
    mode: Literal["rank", "generate"] = "rank"
    """``rank``: the log-probability rank of the true key; ``generate``: exact greedy generation of it."""


@dataclasses.dataclass
class Sample:
    """tokens: (length + 1,) int64; the model reads tokens[:-1] and is scored on tokens[1:].

    needle_start: index of the needle's first token; key_len: tokens of the key
    (the last ``key_len`` entries of ``tokens``).
    """

    tokens: np.ndarray
    needle_start: int
    key_len: int


def _encode(tokenizer, text: str) -> np.ndarray:
    return np.asarray(tokenizer.encode(text), dtype=np.int64)


def make_sample(tokenizer, length: int, depth: float, key: str, filler: str = FILLER) -> Sample:
    """The passkey sequence for ``key`` at ``depth`` in [0, 1], exactly ``length`` input tokens.

    Raises PosencError when ``length`` cannot hold the needle and the question.
    """
    needle, question, key_t = (
        _encode(tokenizer, NEEDLE.format(key=key)),
        _encode(tokenizer, QUESTION),
        _encode(tokenizer, key),
    )
    n_fill = length + 1 - len(needle) - len(question) - len(key_t)
    if n_fill < 0:
        raise PosencError(f"passkey length {length} is shorter than the needle and question ({length - n_fill} tokens)")
    fill = np.resize(_encode(tokenizer, filler), n_fill)  # the filler repeated (cycled) to n_fill tokens
    cut = needle_cut(n_fill, depth)
    tokens = np.concatenate([fill[:cut], needle, fill[cut:], question, key_t])
    return Sample(tokens, cut, len(key_t))


def needle_cut(n_filler: int, depth: float) -> int:
    """Filler units (tokens or sentences) before the needle at ``depth`` in [0, 1]."""
    return round(depth * n_filler)


def draw_keys(rng: np.random.Generator, tokenizer, n: int, digits: int, tries: int = 1000) -> list[str]:
    """``n`` distinct random digit strings whose token counts equal the first one's (BPE may merge digits)."""
    keys = ["".join(map(str, rng.integers(0, 10, digits)))]
    n_tok = len(_encode(tokenizer, keys[0]))
    for _ in range(tries):
        if len(keys) == n:
            return keys
        k = "".join(map(str, rng.integers(0, 10, digits)))
        if k not in keys and len(_encode(tokenizer, k)) == n_tok:
            keys.append(k)
    raise PosencError(f"could not draw {n} distinct {digits}-digit keys of {n_tok} tokens each")


@torch.inference_mode()
def continuation_nll(model: LM, batch: np.ndarray, n_last: int) -> torch.Tensor:
    """Total NLL (nats) of the last ``n_last`` tokens of each row; batch: (N, length + 1) int64 -> (N,) float64."""
    t = torch.from_numpy(batch).to(next(model.parameters()).device)
    return model.token_nll(t[:, :-1], t[:, 1:])[:, -n_last:].double().sum(1).cpu()


def trial(
    model: LM,
    tokenizer,
    length: int,
    depth: float,
    rng: np.random.Generator,
    candidates: int,
    digits: int,
    mode: str = "rank",
) -> bool:
    """One trial. rank: True when the true key (hidden in the prompt) is strictly the most likely candidate;
    generate: True when greedy decoding after the prompt reproduces the key's tokens exactly."""
    keys = draw_keys(rng, tokenizer, candidates, digits)
    sample = make_sample(tokenizer, length, depth, keys[0])
    if mode == "generate":
        key = torch.from_numpy(sample.tokens[-sample.key_len :])
        prompt = torch.from_numpy(sample.tokens[: -sample.key_len]).to(next(model.parameters()).device)
        return bool(torch.equal(model.generate(prompt, sample.key_len, temperature=0)[-sample.key_len :].cpu(), key))
    batch = np.repeat(sample.tokens[None], candidates, axis=0)
    for i, k in enumerate(keys):
        batch[i, -sample.key_len :] = _encode(tokenizer, k)
    nll = continuation_nll(model, batch, sample.key_len)
    return bool(nll[0] < nll[1:].min())


def passkey_records(
    model: LM, tokenizer, cfg: PasskeyConfig, base: dict, done: set = frozenset()
) -> Iterator[PasskeyCell]:
    """One record per (length, depth) cell not in ``done``: trials, correct, accuracy (None: n/a, with a ``note``).

    Lengths are ``cfg.lengths_multiples`` of the model's training length. Keys
    depend on (cfg.seed, length, depth, trial) only, so every model sees the same keys.
    base: the run's fields copied into each record ({"scheme"} at least; compare adds "seed", "train_length").
    """
    model.eval()
    if not cfg.trials:
        return
    for L in eval_lengths(model.cfg.train_length, cfg.lengths_multiples):
        for depth in cfg.depths:
            if (L, depth) in done:
                continue
            t0, correct = time.time(), 0
            cell = dict(base, length=L, depth=depth, mode=cfg.mode, candidates=cfg.candidates, digits=cfg.digits)
            try:
                for t in range(cfg.trials):
                    rng = np.random.default_rng([cfg.seed, L, round(depth * 1e6), t])
                    correct += trial(model, tokenizer, L, depth, rng, cfg.candidates, cfg.digits, cfg.mode)
            except PosencError as exc:  # a learned table too short, or no room for the needle
                yield PasskeyCell(**cell, trials=0, correct=0, note=f"n/a: {exc}")
                continue
            yield PasskeyCell(
                **cell, trials=cfg.trials, correct=correct, accuracy=correct / cfg.trials, seconds=time.time() - t0
            )


# ---------------------------------------------------------------- generation (Hugging Face models)


def passkey_prompt(tokenizer, length: int, depth: float, key: int, bos_id: int | None = None) -> tuple[list[int], str]:
    """Token ids of the prompt with ``TASK`` and whole filler sentences, at most ``length``
    tokens, the needle after ``needle_cut`` of them; ends with the question (no key).

    The filler count is the largest that fits; the returned ids are exactly the
    tokenization of the returned text (no truncation), after ``bos_id`` when given (BOS +
    at most ``length - 1`` text tokens, as ``posenc extend --bos prepend`` scores text).
    Raises PosencError when ``length`` cannot hold the BOS, task, needle and question.
    """
    bos = [] if bos_id is None else [bos_id]
    length -= len(bos)

    def build(n: int) -> str:
        before = needle_cut(n, depth)
        return (TASK + " " + FILLER * before + NEEDLE.format(key=key) + FILLER * (n - before) + QUESTION).rstrip()

    def count(n: int) -> int:
        return len(tokenizer(build(n), add_special_tokens=False, truncation=False)["input_ids"])

    per = count(11) - count(10)
    n = max(0, (length - count(0)) // per)
    while n > 0 and count(n) > length:
        n -= 1
    text = build(n)
    ids = tokenizer(text, add_special_tokens=False, truncation=False)["input_ids"]
    if len(ids) > length:
        raise PosencError(
            f"passkey length {length + len(bos)} is too short for the prompt ({len(ids) + len(bos)} tokens "
            "without filler)"
        )
    return bos + ids, text


def first_integer(text: str) -> int | None:
    """The first run of digits in ``text`` as an int (None if there is none)."""
    m = re.search(r"\d+", text)
    return int(m.group()) if m else None


def passkey_key(seed: int, length: int, depth: float, trial: int) -> int:
    """A reproducible 5-digit key for one (length, depth, trial) cell."""
    return random.Random(f"{seed}-{length}-{depth}-{trial}").randint(10000, 99999)


@torch.inference_mode()
def passkey_trial(
    model,
    tokenizer,
    length: int,
    depth: float,
    key: int,
    new_tokens: int = 8,
    use_cache: bool = True,
    bos_id: int | None = None,
) -> dict:
    """Greedy generation on one ``passkey_prompt`` (BOS ``bos_id`` first when given); correct iff the first integer
    equals ``key``.

    Returns {passkey (``key``), answer (the decoded output), got (its first integer or None), correct,
    prompt_tokens}. model: a Hugging Face causal LM, generating with its KV cache unless ``use_cache`` is
    False (a posenc scheme that replaces attention: ``posenc.hf.scheme.Scheme.full_forward``). The model input is
    asserted to be the full prompt: its length is recorded as ``prompt_tokens`` (<= ``length``).
    """
    ids, _ = passkey_prompt(tokenizer, length, depth, key, bos_id)
    x = torch.tensor([ids])
    assert x.shape[1] == len(ids) <= length
    pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    out = model.generate(
        x,
        attention_mask=torch.ones_like(x),
        max_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=pad,
        use_cache=use_cache,
    )
    answer = tokenizer.decode(out[0, x.shape[1] :], skip_special_tokens=True)
    got = first_integer(answer)
    return {"passkey": key, "answer": answer, "got": got, "correct": got == key, "prompt_tokens": len(ids)}
