"""The counter-based draw of the random accumulated rotations (posenc.encodings.draw)."""

import math

import torch

from posenc import encodings
from posenc.encodings.accumulated import EVAL_DRAW
from posenc.encodings.base import Dims, Inputs
from posenc.encodings.draw import counter_uniform, counter_uniform_naive, row_key_int, row_keys


def test_counter_uniform_equals_the_integer_reference():
    g = torch.Generator().manual_seed(0)
    for seed, draw in ((0, 0), (7, 5), (2**31 - 1, 2**31 - 1), (2**51 + 12345, 17)):
        rows = torch.randint(0, 2**31, (3,), generator=g)
        pos = torch.cat([torch.arange(4), torch.randint(0, 2**31, (3,), generator=g)])
        u = counter_uniform(seed, torch.tensor(draw), rows, pos, 3, 5)
        assert u.shape == (3, 3, 7, 5) and u.dtype == torch.float32
        for r in range(3):
            for t in (0, 3, 6):
                for h, b in ((0, 0), (2, 4), (1, 3)):
                    assert float(u[r, h, t, b]) == counter_uniform_naive(seed, draw, int(rows[r]), int(pos[t]), h, b, 5)


def test_evaluation_key_computed_once_equals_the_tensor_chain():
    """The evaluation draw's key, a Python integer computed at construction, gives counter_uniform's steps."""
    for seed in (0, 3, 2**31 - 1, 2**51 + 12345):
        for draw, row in ((EVAL_DRAW, 0), (5, 7)):
            assert row_key_int(seed, draw, row) == int(row_keys(seed, torch.tensor(draw), torch.tensor([row]))[0, 0])
    dims = Dims(n_head=3, head_dim=8, d_model=16, vocab_size=256, train_length=16, layer_index=2)
    enc = encodings.get("acc-rand-qk:seed=5", dims).eval()
    pos = torch.tensor([0, 1, 77, 2**31 - 1])
    ref = counter_uniform(enc.seed, torch.tensor(EVAL_DRAW), torch.zeros(1, dtype=torch.int64), pos, 3, 4)
    assert torch.equal(enc._u(Inputs(torch.zeros(1, 4, 16), pos)), ref)


def test_counter_uniform_is_uniform_and_uncorrelated():
    u = counter_uniform(3, torch.tensor(11), torch.arange(64), torch.arange(512), 4, 8).double()  # 1M values
    n = u.numel()
    assert float(u.min()) >= -1 and float(u.max()) < 1
    assert abs(float(u.mean())) < 4 * math.sqrt(1 / 3 / n)
    assert abs(float(u.var()) - 1 / 3) < 4 * math.sqrt(4 / 45 / n)  # Var of u^2 for U[-1, 1] is 4/45
    counts = torch.histc(u, bins=32, min=-1, max=1)
    chi2 = float(((counts - n / 32) ** 2 / (n / 32)).sum())
    assert chi2 < 70  # 31 degrees of freedom: P(chi2 > 70) ~ 1e-4
    for dim in range(4):  # neighbouring rows, heads, positions, blocks
        a, b = u.narrow(dim, 0, u.shape[dim] - 1), u.narrow(dim, 1, u.shape[dim] - 1)
        corr = float(((a * b).mean() - a.mean() * b.mean()) / (a.std() * b.std()))
        assert abs(corr) < 5 / math.sqrt(a.numel()), (dim, corr)
    other = counter_uniform(3, torch.tensor(12), torch.arange(64), torch.arange(512), 4, 8).double()
    assert abs(float((u * other).mean())) < 4 * (1 / 3) / math.sqrt(n)  # the next draw is independent


def test_random_steps_of_a_position_do_not_depend_on_the_length():
    """Evaluation and training draws are prefix-stable: decoding token by token sees the parallel steps."""
    dims = Dims(n_head=2, head_dim=8, d_model=16, vocab_size=256, train_length=16)
    enc = encodings.get("acc-rand-qkv", dims)

    def phases(T, start=0):
        pos = torch.arange(start, start + T)
        return enc.phases(Inputs(torch.zeros(2, T, 16), pos, torch.zeros(2, T, dtype=torch.long)))

    enc.eval()
    long, short = phases(40), phases(25)
    assert torch.equal(long[..., :25, :], short)
    steps = enc._u(Inputs(torch.zeros(1, 1, 16), torch.tensor([30]), torch.zeros(1, 1, dtype=torch.long)))
    assert torch.equal(
        steps[0, :, 0],
        enc._u(Inputs(torch.zeros(1, 40, 16), torch.arange(40), torch.zeros(1, 40, dtype=torch.long)))[0, :, 30],
    )
    enc.train()
    enc.draws.zero_()
    a = phases(40)
    enc.draws.zero_()
    assert torch.equal(phases(25), a[..., :25, :]) and int(enc.draws) == 1
