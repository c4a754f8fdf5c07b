"""What each training step reads: its batch (:func:`batch_at`, :func:`training_batch`: a pure function of (seed, step),
so a resumed run sees exactly the batches an uninterrupted run would), its positions (:func:`training_positions`
under ``train.positions`` ``randomized:max=N``) and the loss over its targets (:func:`mean_loss`); and the checks that
the data and positions can train the model (:func:`check_trainable`, :func:`check_positions`)."""

from __future__ import annotations

import sys

import numpy as np
import torch

from posenc import encodings
from posenc.data.corpora import TokenData
from posenc.data.positions import TRAIN_STREAM, randomized_positions
from posenc.data.tasks import TaskData, is_task
from posenc.errors import PosencError
from posenc.model import ModelConfig
from posenc.train.settings import TrainConfig


def batch_at(stream: np.ndarray, step: int, batch_size: int, length: int, seed: int, rows: slice = slice(None)):
    """The global batch of ``step``: (B, length) inputs and targets, int64.

    Offsets are drawn from a generator seeded by (seed, step); ``rows`` selects
    this process's share of the global batch (data-parallel ranks).
    """
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, len(stream) - length - 1, size=batch_size)[rows]
    chunk = np.stack([stream[s : s + length + 1] for s in starts]).astype(np.int64)
    t = torch.from_numpy(chunk)
    return t[:, :-1], t[:, 1:]


def training_batch(data: TokenData | TaskData, step: int, tcfg: TrainConfig, length: int, rows: slice = slice(None)):
    """(inputs, targets, answers) of ``step``: (B, length) int64 twice, then the (B, length) bool mask of the
    targets the loss averages over (``tcfg.loss`` "answers" on a task), or None for every target."""
    if isinstance(data, TaskData):
        b = data.batch(step, tcfg.batch_size, length, tcfg.seed, rows)
        return b.inputs, b.targets, b.answer if tcfg.loss == "answers" else None
    return (*batch_at(data.train, step, tcfg.batch_size, length, tcfg.seed, rows), None)


def randomized_max(spec: str) -> int | None:
    """N of ``train.positions`` ``randomized:max=N``; None for ``contiguous``. PosencError (one line) for another
    spec or a max that is not an integer >= 1 (``check_positions`` compares it with the training length)."""
    name, params = encodings.split_part(spec, "train.positions")
    if name == "contiguous" and not params:
        return None
    if name != "randomized" or set(params) != {"max"}:
        raise PosencError(f"train.positions must be 'contiguous' or 'randomized:max=N', got {spec!r}")
    n = params["max"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise PosencError(f"train.positions {spec!r}: max must be an integer >= 1")
    return n


def training_positions(n_max: int, length: int, seed: int, step: int) -> torch.Tensor:
    """The training positions of ``step`` under ``randomized:max=n_max`` (``posenc.data.positions``): ``length``
    sorted distinct positions in 0..n_max-1, (length,) int64. One draw per step, shared by the batch's sequences,
    seeded by (seed, step), so a resumed run draws what it would have."""
    return randomized_positions(n_max, length, (seed, step, TRAIN_STREAM))


def check_positions(mcfg: ModelConfig, tcfg: TrainConfig) -> int | None:
    """N of randomized training positions (None: contiguous), checked against the model before it is built:
    PosencError (one line) when N < the training length, when no layer's scheme reads positions
    (``Encoding.position_indexed``: nope, the accumulated, PaTH and forget-gate schemes take none), or when a
    scheme takes fewer than N positions (a learned table, ``Encoding.positions_supported``)."""
    n = randomized_max(tcfg.positions)
    if n is None:
        return None
    L, scheme = mcfg.train_length, mcfg.encoding
    if n < L:
        raise PosencError(f"train.positions {tcfg.positions!r}: max must be >= the training length {L}")
    classes = [cls for spec in encodings.layer_pattern(scheme) for cls, _ in encodings.parts(spec)]
    if not any(cls.position_indexed for cls in classes):
        raise PosencError(
            f"train.positions {tcfg.positions!r}: scheme {scheme!r} reads no position (randomized "
            "positions apply to position-indexed schemes: rope, alibi, t5, kerple, fire, xpos, pope, ...)"
        )
    short = [m for cls in classes if (m := cls.positions_supported(mcfg.dims())) is not None and m < n]
    if short:
        raise PosencError(
            f"train.positions {tcfg.positions!r}: scheme {scheme!r} takes {short[0]} positions, fewer than max"
        )
    return n


def mean_loss(nll: torch.Tensor, answers: torch.Tensor | None) -> torch.Tensor:
    """The mean of the (B, T) per-target NLL over ``answers`` (every target when None)."""
    if answers is None:
        return nll.mean()
    return (nll * answers).sum() / answers.sum().clamp(min=1)


SMALL_CORPUS = 100_000  # tokens; nanoGPT's smallest corpus (Shakespeare, characters) has 1M


def check_task_settings(tcfg: TrainConfig) -> None:
    """PosencError when ``train.until`` or answer-only loss is set on a corpus that is not a synthetic task (text has
    no answer positions), or a tokenizer other than the default on a task (its tokens are its own vocabulary): decided
    from the corpus spec, so ``--dry-run`` refuses what the run refuses."""
    if is_task(tcfg.corpus):
        if tcfg.tokenizer != "byte":  # was ignored, and recorded in config.json as if used
            raise PosencError(
                f"train.tokenizer {tcfg.tokenizer!r}: the synthetic task {tcfg.corpus!r} has its own token "
                "vocabulary; a tokenizer applies to text only"
            )
        return
    if tcfg.until is not None:
        raise PosencError(f"train.until needs a synthetic task corpus (posenc.data.tasks), not {tcfg.corpus!r}")
    if tcfg.loss == "answers":
        raise PosencError(
            f"train.loss 'answers' needs a synthetic task corpus (posenc.data.tasks), not {tcfg.corpus!r}"
        )


def check_trainable(data: TokenData | TaskData, mcfg: ModelConfig, tcfg: TrainConfig) -> None:
    """PosencError when the data cannot train this model: a text stream shorter than a window, answer-only
    loss on text (it has no answer positions), a task whose training sequences do not fit the length, randomized
    positions the scheme cannot take (``check_positions``)."""
    check_positions(mcfg, tcfg)
    check_task_settings(tcfg)
    if isinstance(data, TaskData):
        data.task.check_length(mcfg.train_length)
    elif len(data.train) <= mcfg.train_length + 1:
        raise PosencError(f"training split has {len(data.train)} tokens, fewer than train_length {mcfg.train_length}")
    elif len(data.train) < SMALL_CORPUS:
        seen = tcfg.steps * tcfg.batch_size * mcfg.train_length
        print(
            f"posenc: warning: the training split has only {len(data.train):,} tokens (the budget reads {seen:,}, "
            f"{seen / len(data.train):.2g} times the split): numbers will measure memorisation",
            file=sys.stderr,
        )
