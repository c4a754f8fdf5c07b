"""Randomized positions (Ruoss et al. 2023, "Randomized Positional Encodings Boost Length Generalization of
Transformers", arXiv:2305.16843, sec. 3): the positions of a sequence of T tokens are a sorted uniform subset of
0..N-1 (N >= T, the longest length the model will see), drawn afresh for every forward.

The paper's model draws them in training and at test alike: its reference code
(google-deepmind/randomized_positional_encodings, ``noisy_fixed_positional_encodings``) samples the subset on every
apply, and its length evaluation passes a fresh random key to each batch as training does. A model trained on them is
therefore scored on them too (``posenc.eval``): one draw per batch, shared by the batch's sequences (a layer takes
one position vector), seeded so a score is reproducible. At T = N the draw is every position, 0..N-1. An inference
method or a RoPE schedule applied at evaluation keeps 0..T-1 (``scored_max``, the one rule every command follows).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from posenc.encodings.absolute import LengthNotSupported

TRAIN_STREAM = 1  # a training step's draw is seeded (seed, step, 1): a stream apart from the batch's (seed, step)
EVAL_STREAM = 2  # an evaluation batch's draw: (length, batch index, 2) for text, (test seed, step, 2) for tasks


def randomized_positions(n_max: int, length: int, key: Sequence[int]) -> torch.Tensor:
    """``length`` distinct positions drawn uniformly from 0..n_max-1, sorted, from a generator seeded by ``key``
    (non-negative ints); (length,) int64. Raises LengthNotSupported (a PosencError) when length > n_max: the model
    has no positions for that many tokens."""
    if length > n_max:
        raise LengthNotSupported(f"randomized positions of max {n_max} cannot place {length} tokens")
    rng = np.random.default_rng(list(key))
    return torch.from_numpy(np.sort(rng.choice(n_max, size=length, replace=False)).astype(np.int64))


def scored_max(model, n_max: int | None) -> int | None:
    """N to score ``model`` (a ``posenc.model.LM``) on, trained on randomized positions of max ``n_max`` (None:
    contiguous): ``n_max`` as trained, but None (0..T-1) once an inference method (``posenc.model.set_method``) or a
    RoPE schedule (``posenc.model.with_rope_schedule``) is applied, whose maps are defined on the positions in order.
    ``posenc.eval``'s perplexity and task scoring read it, so ``eval``, ``compare`` and every other command agree."""
    if n_max is None:  # contiguous positions: nothing to decide (and ``model`` may be any callable scorer)
        return None
    adapted = any(block.attn.method is not None for block in model.blocks) or bool(
        model.cfg.encoding_params.get("schedule")
    )
    return None if adapted else n_max


def eval_positions(n_max: int | None, length: int, key: Sequence[int], device) -> torch.Tensor | None:
    """An evaluation batch's positions on ``device``: the draw of ``randomized_positions`` keyed by (*key,
    EVAL_STREAM) for a model trained on randomized positions of max ``n_max``; None (0..length-1) when ``n_max`` is
    None. Its errors."""
    if n_max is None:
        return None
    return randomized_positions(n_max, length, (*key, EVAL_STREAM)).to(device)
