"""Scoring a model on a synthetic task (``posenc.data.tasks``): accuracy and NLL at the answer positions.

Each test cell (test, sequence length) is scored on sequences drawn from a seed of the run's training seed
(:func:`cell_seed`): every scheme trained on seed k sees the same sequences, and two training seeds see different
ones, so the spread over seeds includes the draw of the probes. Answers are counted per evidence-distance bucket
(powers of two: bucket b holds distances in [b, 2b)). A cell draws whole batches (``batch_tokens`` tokens, at least
one row) until it holds at least ``answers`` answers or has used at least ``max_tokens`` tokens, or, given a target
``se``, until every bucket it holds is that precise (:func:`precise`), whichever is first: the last batch may pass
either cap, and each record's ``n`` is the count actually scored.
"""

from __future__ import annotations

import math
import zlib

import torch

from posenc.data.positions import eval_positions, scored_max
from posenc.data.tasks import Task, Test
from posenc.encodings.forget import ForgetGate
from posenc.errors import PosencError
from posenc.eval import progress

EVAL_SEED = 1_000_003  # evaluation sequences never coincide with a training seed's batches
CRITERION_SEED = 2_000_003  # train.until's held-out set: neither a training batch nor a test's sequences
LEAK_MULTIPLE, LEAK_ROWS = 8, 8  # gate_leak: the probe's distance in training lengths, and how many probes
SEED_STRIDE = 2**33  # cell_seed: the run's seed times this, above every base seed + crc32 (< 2**33)


def cell_seed(base_seed: int, test: Test, seed: int = 0) -> int:
    """The generator seed (int >= 0) of a test cell: ``base_seed`` (EVAL_SEED, CRITERION_SEED) + crc32 of the test's
    name and length + ``seed`` x SEED_STRIDE, ``seed`` the run's training seed (>= 0; PosencError otherwise). Never
    a training seed (those are the small run seeds themselves), nor another base's cell; seed 0 adds nothing."""
    if seed < 0:
        raise PosencError(f"evaluation seed: the run's seed must be >= 0, got {seed}")
    return base_seed + zlib.crc32(f"{test.name}:{test.length}".encode()) + seed * SEED_STRIDE


def bucket(distance: torch.Tensor) -> torch.Tensor:
    """Power-of-two bucket of each distance >= 1 (int64 in, int64 out): 2**floor(log2 d)."""
    return torch.pow(2, torch.floor(torch.log2(distance.double())).long())


def score_batch(
    logits: torch.Tensor, targets: torch.Tensor, answer: torch.Tensor, distance: torch.Tensor
) -> dict[int, list[float]]:
    """{bucket: [answers, correct, nll sum]} of one batch. logits (B, T, V); the rest (B, T)."""
    logp = torch.log_softmax(logits[answer].double(), dim=-1)
    y = targets[answer]
    correct = (logp.argmax(-1) == y).double()
    nll = -logp.gather(-1, y[:, None])[:, 0]
    b = bucket(distance[answer])
    out = {}
    for key in b.unique().tolist():
        sel = b == key
        out[int(key)] = [float(sel.sum()), float(correct[sel].sum()), float(nll[sel].sum())]
    return out


@torch.no_grad()
def score_test(
    model: torch.nn.Module,
    task: Task,
    test: Test,
    answers: int,
    max_tokens: int,
    batch_tokens: int,
    base_seed: int = EVAL_SEED,
    positions: int | None = None,
    seed: int = 0,
    se: float | None = None,
) -> dict[int, list[float]]:
    """{bucket: [answers, correct, nll sum]} of one test cell, drawn from :func:`cell_seed` of ``base_seed``, the
    cell and ``seed`` (the run's training seed, >= 0); ``se``: also stop once :func:`precise` to it (None: never).
    ``positions``: N of a model trained on randomized positions,
    scored on them (``posenc.data.positions``: one draw per batch, seeded by the cell's seed and the batch) unless a
    method or schedule is applied (``scored_max``); None: 0..length-1. LengthNotSupported when the length exceeds N."""
    seed, positions = cell_seed(base_seed, test, seed), scored_max(model, positions)
    totals: dict[int, list[float]] = {}
    rows_per_batch = max(1, batch_tokens // test.length)
    device = next(model.parameters()).device
    step, tokens, found = 0, 0, 0
    while found < answers and tokens < max_tokens and not (se is not None and precise(totals, se)):
        b = task.batch(seed, step, range(rows_per_batch), test.length, **test.settings)
        pos = eval_positions(positions, test.length, (seed, step), device)
        logits = model(b.inputs.to(device), pos).float().cpu()
        for key, (n, c, nll) in score_batch(logits, b.targets, b.answer, b.distance).items():
            t = totals.setdefault(key, [0.0, 0.0, 0.0])
            t[0], t[1], t[2] = t[0] + n, t[1] + c, t[2] + nll
        found += int(b.answer.sum())
        tokens += b.inputs.numel()
        step += 1
    return totals


def evaluate_task(
    model: torch.nn.Module,
    task: Task,
    train_length: int,
    multiples: list[int],
    answers: int,
    max_tokens: int,
    batch_tokens: int,
    positions: int | None = None,
    done: list[dict] = (),
    only: tuple[str, ...] | None = None,
    seed: int = 0,
    se: float | None = None,
) -> list[dict]:
    """One record per (test, length, bucket): ``n`` answers, ``correct``, ``nll`` (sum, nats). ``positions``: as
    ``score_test``'s. ``done``: records of an earlier evaluation of this model (fewer ``multiples``: a sweep's
    screening): their tests are not scored again but kept, in test order, so the result equals one evaluation of
    every test (each test's cells are drawn from a seed of its own, ``score_test``). ``only``: the names of the tests
    to score (None: every test; a sweep's screening scores ``("id",)`` at the training length). ``seed``: the run's
    training seed (>= 0), from which every cell's sequences are drawn (:func:`cell_seed`); ``se``: as
    ``score_test``'s. A bar of tests with an ETA on stderr, as ``posenc.eval.progress`` shows bars."""
    was_training = model.training
    model.eval()
    records, have = [], {}
    for r in done:
        have.setdefault((r["test"], r["length"]), []).append(r)
    tests = list(task.tests(train_length, multiples))
    try:
        for test in progress.bar(iterable=tests, desc=f"{task.name} tests", unit="test", leave=False):
            if only is not None and test.name not in only:
                continue
            if (test.name, test.length) in have:
                records += have[(test.name, test.length)]
                continue
            cell = score_test(
                model, task, test, answers, max_tokens, batch_tokens, positions=positions, seed=seed, se=se
            )
            for b, (n, c, nll) in sorted(cell.items()):
                records.append(
                    {"test": test.name, "length": test.length, "bucket": b, "n": int(n), "correct": int(c), "nll": nll}
                )
    finally:
        model.train(was_training)
    return records


def id_accuracy(
    model: torch.nn.Module,
    task: Task,
    train_length: int,
    answers: int,
    batch_tokens: int = 16384,
    positions: int | None = None,
    seed: int = 0,
) -> float:
    """Accuracy (fraction in [0, 1]) on ``answers`` answers of the in-distribution held-out set of ``train.until``:
    sequences of ``train_length`` tokens at the training settings drawn from ``CRITERION_SEED`` (never a training
    batch, nor the sequences the report's "id" test scores). The model is put in eval mode
    and back; the global random state is left as it was (a check does not change training).
    ``positions``: as ``score_test``'s (a model trained on randomized positions is checked on them). ``seed``: the
    run's training seed (>= 0): the held-out set is drawn from :func:`cell_seed` of CRITERION_SEED and it, the same
    for every scheme and step of that seed."""
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=[]):
            totals = score_test(
                model,
                task,
                Test("id", train_length, {}),
                answers,
                64 * answers * train_length,
                batch_tokens,
                base_seed=CRITERION_SEED,
                positions=positions,
                seed=seed,
            )
    finally:
        model.train(was_training)
    n = sum(t[0] for t in totals.values())
    return sum(t[1] for t in totals.values()) / n


def precise(totals: dict[int, list[float]], se: float) -> bool:
    """Whether every bucket of a cell's ``totals`` ({bucket: [answers, correct, ...]}; none: False) has a
    :func:`bucket_error` at most ``se`` (a fraction). At an accuracy of 1/2 and ``se`` 0.02 that is 625 answers;
    all right, 68."""
    if not totals:
        return False
    return all(bucket_error(int(n), c) <= se for n, c, *_ in totals.values())


def bucket_error(n: int, correct: float) -> float:
    """The standard error of a bucket of ``n`` answers, ``correct`` of them right, its accuracy first moved toward
    1/2 as Agresti and Coull's (c + 2) / (n + 4) does: never below the plain :func:`standard_error`, so that a few
    answers all right (or all wrong) do not read as exact. What ``task_eval.se`` stops at and the reports give."""
    return standard_error((correct + 2) / (n + 4), n)


def standard_error(p: float, n: int) -> float:
    """Binomial standard error of an accuracy ``p`` measured on ``n`` answers."""
    return math.sqrt(max(p * (1 - p), 0.0) / n) if n else float("nan")


@torch.no_grad()
def gate_leak(model: torch.nn.Module, task: Task, train_length: int) -> list[list[float]] | None:
    """The forget gate's leak: mean -log f per token (nats) of each head of each layer with a forget gate (FoX, Lin et
    al. 2025, arXiv:2503.02130; alone or a part of a composite, several summed), over the last g = LEAK_MULTIPLE x
    ``train_length`` positions of the task's controlled-gap probe at distance g (LEAK_ROWS probes drawn from
    EVAL_SEED). On a stream task (flip-flop, modsum) that span runs from the evidence to the answer, so the bias the
    answer's query pays against its evidence is g x the leak (``results/retrieval/forget_gap.txt`` measured it by
    hand, with ``experiments/accumulated/forget_gap.py``). Returns (gated layers, H) floats, layers in order; None
    when no layer has a forget gate."""
    if not any(isinstance(m, ForgetGate) for m in model.modules()):
        return None
    g = LEAK_MULTIPLE * train_length
    test = task.end_probe(train_length, g)
    tokens = task.batch(EVAL_SEED, 0, range(LEAK_ROWS), test.length, **test.settings).inputs
    was_training = model.training
    model.eval()
    try:
        out = []
        for a in model.prepare(tokens.to(next(model.parameters()).device)):
            gates = [m for m in a.encoding.modules() if isinstance(m, ForgetGate)]
            if gates:
                lam = sum(m.log_lambda(a.inp) for m in gates)  # (B, H, T) float64: the bias's prefix sum
                out.append((-(lam[..., -1] - lam[..., -1 - g]) / g).mean(0).tolist())
    finally:
        model.train(was_training)
    return out or None
