"""Issue 57: training rows spread their evidence distances over 1 .. L (every power-of-two bucket an equal
expected share), probes put the evidence at random positions and distances inside their bucket, and every
evaluation draw derives from the run's training seed."""

import zlib

import numpy as np
import pytest
import torch

from posenc.data.tasks import B0, B1, I, R, W, _expected_segments, _flipflop_pairs, _modsum_stream, get_task
from posenc.data.tasks import Test as TaskTest
from posenc.errors import PosencError
from posenc.eval.tasks import CRITERION_SEED, EVAL_SEED, SEED_STRIDE, bucket, cell_seed, score_test
from tests.data.test_tasks import _check_flipflop, _check_modsum


def _shares(spec: str, length: int = 128, steps: int = 60, rows: int = 32) -> tuple[dict[int, float], int]:
    """{distance bucket: share of the answers} over ``steps`` training batches of ``rows`` rows, and the answers."""
    task = get_task(spec)
    dist = torch.cat([task.batch(0, s, range(rows), length).distance.flatten() for s in range(steps)])
    dist = dist[dist > 0]
    b = bucket(dist)
    return {int(k): float((b == k).double().mean()) for k in b.unique()}, len(dist)


@pytest.mark.parametrize(
    "spec, buckets",
    [("flipflop", [2, 4, 8, 16, 32, 64]), ("modsum:m=2", [2, 4, 8, 16, 32, 64, 128])],
)
def test_training_distances_are_log_uniform_over_the_training_length(spec, buckets):
    """60 batches of 32 rows at L = 128: every power-of-two bucket from 2 to the largest holds 1/k of the answers
    within 0.035 (k buckets; about 3 standard errors of the row-scale draw); before, flip-flop had 2% at >= 64."""
    shares, n = _shares(spec)
    assert sorted(shares) == buckets and n > 4000
    for b, share in shares.items():
        assert share == pytest.approx(1 / len(buckets), abs=0.035), (b, shares)


def test_expected_segments_is_exact():
    """The row-scale weights rest on the expected segments a row holds: by hand, and against a simulation."""
    assert _expected_segments(63, 1, 1, 1) == 32  # j = 1 and a cost of 1: two pairs a segment
    assert _expected_segments(63, 32, 63, 1) == 1
    assert _expected_segments(5, 6, 9, 0) == 0
    assert _expected_segments(4, 2, 3, 0) == pytest.approx(1 + (1 + 0) / 2)  # 2 then 2 (or 3 then none)
    rng = np.random.default_rng(0)
    runs = []
    for _ in range(4000):
        room, k = 63, 0
        while room >= 8:
            room -= int(rng.integers(8, min(15, room) + 1)) + 1
            k += 1
        runs.append(k)
    assert np.mean(runs) == pytest.approx(_expected_segments(63, 8, 15, 1), abs=0.03)


def test_geometric_keeps_the_stream_of_before():
    """distances=geometric is the i.i.d. stream of the releases before issue 57, draw for draw."""
    ff = get_task("flipflop:distances=geometric").row(np.random.default_rng(5), 128)
    old = _flipflop_pairs(np.random.default_rng(5), 129, 0.8)
    assert all(np.array_equal(a, b) for a, b in zip(ff, old))
    ms = get_task("modsum:m=3,distances=geometric").row(np.random.default_rng(5), 128)
    old = _modsum_stream(np.random.default_rng(5), 129, 3, 0.1)
    assert all(np.array_equal(a, b) for a, b in zip(ms, old))
    shares, _ = _shares("flipflop:distances=geometric", steps=30)
    assert shares.get(64, 0.0) < 0.04  # the long bucket the old distribution hardly trains


@pytest.mark.parametrize("length", [5, 16, 127, 128, 300])
def test_log_uniform_rows_match_brute_force(length):
    ff, ms = get_task("flipflop"), get_task("modsum:m=3")
    for seed in range(20):
        tok, answer, distance = ff.row(np.random.default_rng(seed), length)
        assert len(tok) == length + 1 and tok[0] == W and set(tok[0::2]) <= {W, R, I} and set(tok[1::2]) <= {B0, B1}
        _check_flipflop(tok, answer, distance)
        tok, answer, distance = ms.row(np.random.default_rng(seed), length)
        assert len(tok) == length + 1 and tok.max() <= 6
        _check_modsum(3, tok, answer, distance)


def test_mqar_gaps_are_log_uniform_and_reach_the_training_length():
    """gap=0-fit (the default) with gaps=log-uniform: the gap's buckets {0}, {1}, 2-3, ..., 64-113 equally likely
    (1/8 each within 0.03 over 4,000 rows) and the longest gap the training length holds is drawn; gaps=uniform
    draws 0..HI uniformly."""
    task = get_task("mqar:pairs=4,keys=8,values=8,filler=16")
    gaps = np.array([task.draw_gap(np.random.default_rng(r), 129) for r in range(4000)])
    assert gaps.min() == 0 and gaps.max() == 129 - task.span()
    b = np.where(gaps == 0, 0, 2 ** np.floor(np.log2(np.maximum(gaps, 1))))
    for k in np.unique(b):
        assert np.mean(b == k) == pytest.approx(1 / 8, abs=0.03)
    uni = get_task("mqar:pairs=4,keys=8,values=8,filler=16,gap=0-64,gaps=uniform")
    gaps = np.array([uni.draw_gap(np.random.default_rng(r), 129) for r in range(4000)])
    assert gaps.max() == 64 and np.mean(gaps < 32) == pytest.approx(32 / 65, abs=0.03)
    shares, _ = _shares("mqar:pairs=4,keys=8,values=8,filler=16", steps=30)
    assert shares[64] > 0.12  # the bucket 64-128, which gap=0-64 barely reaches


@pytest.mark.parametrize("spec", ["flipflop", "modsum:m=2", "mqar:pairs=4,keys=8,values=8,filler=16"])
def test_probes_spread_their_position_and_distance_over_the_bucket(spec):
    """The gap probe at bucket 64: every answer's distance is in [64, 128); over 200 probes the distances take
    more than 20 values and the answers more than 50 positions (before: one distance, one position)."""
    task = get_task(spec)
    test = next(t for t in task.tests(128, [1, 4]) if t.name == "gap" and t.settings["bucket"] == 64)
    b = task.batch(EVAL_SEED, 0, range(200), test.length, **test.settings)
    d = b.distance[b.answer]
    assert d.min() >= 64 and d.max() < 128 and len(d) >= 200
    assert len(d.unique()) > 20
    assert len(b.answer.nonzero()[:, 1].unique()) > 50
    if spec == "flipflop":
        for row in range(20):
            _check_flipflop(b.inputs[row].numpy().tolist() + [int(b.targets[row, -1])], *_marks(b, row))
    if spec.startswith("modsum"):  # the probe's sum is the running sum of every element before it
        for row in range(20):
            tok = np.array(b.inputs[row].tolist() + [int(b.targets[row, -1])])
            t = int(b.answer[row].nonzero()[0, 0])
            assert tok[t + 1] == 3 + tok[: t + 1][tok[: t + 1] < 2].sum() % 2


def _marks(b, row):
    """A probe row's marks as the brute force sees them: every read is an answer there (the prefix's too)."""
    tok = np.array(b.inputs[row].tolist() + [int(b.targets[row, -1])])
    reads = np.zeros(len(tok) - 1, dtype=bool)
    reads[0::2] = tok[0:-1:2] == R
    dist = np.zeros(len(tok) - 1, dtype=np.int64)
    last = None
    for t in range(len(tok) - 1):
        if t % 2 == 0 and tok[t] == W:
            last = t + 1
        if reads[t]:
            dist[t] = t + 1 - last
    assert b.answer[row].sum() == 1 and dist[b.answer[row].numpy()][0] == b.distance[row][b.answer[row]][0]
    return reads, dist


def test_probes_that_do_not_fit_are_one_line():
    with pytest.raises(PosencError, match="too short for distance"):
        get_task("flipflop").row(np.random.default_rng(0), 20, bucket=16)
    with pytest.raises(PosencError, match="bucket 1 must be >= 2"):
        get_task("modsum").row(np.random.default_rng(0), 20, bucket=1)


def test_probe_sequences_derive_from_the_runs_seed():
    """Two training seeds see different probe sequences, the same seed the same ones; seed 0 keeps the seeds of
    before; none is a training batch's seed, and the criterion's differ from the report's."""
    task, test = get_task("flipflop"), TaskTest("gap", 128 + 64, {"bucket": 32})
    s0, s1 = cell_seed(EVAL_SEED, test, 0), cell_seed(EVAL_SEED, test, 1)
    assert s0 == EVAL_SEED + zlib.crc32(b"gap:192") and s1 == s0 + SEED_STRIDE
    assert cell_seed(CRITERION_SEED, test, 1) not in (s0, s1)
    a, b = (task.batch(s, 0, range(8), test.length, **test.settings).inputs for s in (s0, s1))
    assert not torch.equal(a, b)
    assert torch.equal(a, task.batch(cell_seed(EVAL_SEED, test, 0), 0, range(8), test.length, **test.settings).inputs)
    with pytest.raises(PosencError, match="must be >= 0"):
        cell_seed(EVAL_SEED, test, -1)

    class Spy(torch.nn.Module):  # records what it is fed; predicts token 0 everywhere
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.seen = []

        def forward(self, x, pos=None):
            self.seen.append(x.clone())
            return torch.zeros(*x.shape, 5) + self.w

    runs = {}
    for seed in (0, 1, 1):
        spy = Spy()
        score_test(spy, task, test, answers=4, max_tokens=10**6, batch_tokens=4 * test.length, seed=seed)
        runs.setdefault(seed, []).append(torch.cat(spy.seen))
    assert torch.equal(runs[0][0], a[:4]) and torch.equal(runs[1][0], runs[1][1])
    assert not torch.equal(runs[0][0], runs[1][0])


def test_a_cell_draws_whole_batches_until_either_cap_is_reached():
    """The stated rule (header and docs): whole batches until >= answers answers or >= max_tokens tokens, so the
    last batch may pass a cap by less than one batch; the records count what was scored. One answer per probe row."""
    task, test = get_task("flipflop"), TaskTest("gap", 128 + 64, {"bucket": 32})

    class Zero(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))  # the scorer reads the device from a parameter

        def forward(self, x, pos=None):
            return torch.zeros(*x.shape, 5) + self.w

    def scored(answers, max_tokens):
        cell = score_test(Zero(), task, test, answers, max_tokens, batch_tokens=4 * test.length)
        return int(sum(n for n, _, _ in cell.values()))

    assert scored(10, 10**6) == 12  # three batches of 4 rows: 8 < 10 <= 12
    assert scored(8, 10**6) == 8  # a cap met exactly draws no further batch
    assert scored(10**6, 5 * test.length) == 8  # 4 rows used 4 L < 5 L tokens: one more batch, 8 L >= 5 L
