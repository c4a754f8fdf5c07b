"""Stick-breaking attention (Tan et al. 2025): a hand-computed case, the naive reference, decoding, GQA."""

import math

import pytest
import torch

from posenc import encodings
from posenc.encodings.base import Dims, Inputs
from posenc.encodings.stickbreaking import stick_breaking_attention, stick_breaking_naive
from posenc.errors import PosencError
from tests.decoding import assert_grouped_query_decoding_equals_the_parallel_forward

DIMS = Dims(n_head=2, head_dim=8, d_model=16, vocab_size=0, train_length=8)


@pytest.mark.parametrize("attend_current,want", [(False, [0.0, 0.5, 7.625]), (True, [0.5, 7.625, 30.71875])])
def test_a_hand_computed_case(attend_current, want):
    """D = 1, q = 1: z_ij = k_j; k = (0, ln 3, -ln 3) gives beta 1/2, 3/4, 1/4; v = (1, 10, 100).
    Keys before the query only: o_0 = 0; o_1 = 1/2; o_2 = A_21 10 + A_20 = 3/4 10 + 1/2 (1 - 3/4) = 7.625.
    With its own key: o_0 = 1/2; o_1 = 3/4 10 + 1/2 1/4 = 7.625; o_2 = 1/4 100 + 3/4 3/4 10 + 1/2 1/4 3/4 = 30.71875."""
    q = torch.ones(1, 1, 3, 1, dtype=torch.float64)
    k = torch.tensor([0.0, math.log(3), -math.log(3)], dtype=torch.float64).view(1, 1, 3, 1)
    v = torch.tensor([1.0, 10.0, 100.0], dtype=torch.float64).view(1, 1, 3, 1)
    for out in (stick_breaking_attention(q, k, v, 1.0, attend_current), stick_breaking_naive(q, k, v, attend_current)):
        assert torch.allclose(out.flatten(), torch.tensor(want, dtype=torch.float64), atol=1e-12)


@pytest.mark.parametrize("attend_current", [False, True])
def test_the_blockwise_path_equals_the_definition(attend_current):
    g = torch.Generator().manual_seed(0)
    q, k, v = (2 * torch.randn(2, 2, 12, 8, generator=g, dtype=torch.float64) for _ in range(3))
    want = stick_breaking_naive(q, k, v, attend_current)
    got = stick_breaking_attention(q, k, v, 1 / math.sqrt(8), attend_current)
    assert torch.allclose(got, want, atol=1e-12)
    future = torch.ones(12, 12, dtype=torch.bool).triu(1)
    softmax = torch.softmax((q @ k.transpose(-1, -2) / math.sqrt(8)).masked_fill(future, -math.inf), -1)
    assert (softmax @ v - got).abs().max() > 0.1  # not a softmax


def test_a_composed_bias_joins_z_and_blocks_of_rows_agree():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 600, 8, generator=g) for _ in range(3))
    enc = encodings.get("stick-breaking:attend_current=false+alibi", DIMS)
    inp = Inputs(torch.zeros(1, 600, 16), torch.arange(600))
    got = enc.attend(q, k, v, inp)  # two query blocks of 512 and 88 rows
    small = [t[..., :10, :].double() for t in (q, k, v)]
    bias = encodings.get("alibi", DIMS).bias(Inputs(torch.zeros(1, 10, 16), torch.arange(10)))
    assert torch.allclose(got[..., :10, :].double(), stick_breaking_naive(*small, bias=bias), atol=1e-5)
    whole = stick_breaking_attention(q.double(), k.double(), v.double(), 1 / math.sqrt(8), False, enc.bias(inp))
    assert torch.allclose(got.double(), whole, atol=1e-5)


@pytest.mark.parametrize("spec", ["stick-breaking", "stick-breaking:attend_current=false+forget"])
def test_grouped_query_decoding_equals_the_parallel_forward(spec):
    assert_grouped_query_decoding_equals_the_parallel_forward(spec)


def test_the_default_attends_the_current_position():
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=g, dtype=torch.float64) for _ in range(3))
    inp = Inputs(torch.zeros(1, 6, 16), torch.arange(6))
    got = encodings.get("stick-breaking", DIMS).attend(q, k, v, inp)
    assert torch.allclose(got, stick_breaking_naive(q, k, v, attend_current=True), atol=1e-12)
    assert (got - stick_breaking_naive(q, k, v, attend_current=False)).abs().max() > 0.1


@pytest.mark.parametrize(
    "spec,message",
    [
        ("stick-breaking:attend_current=1", "attend_current=1: expected bool"),
        ("stick-breaking+learned-sinks", "at most one part may replace attention"),
    ],
)
def test_bad_settings_are_one_line_errors(spec, message):
    with pytest.raises(PosencError) as err:
        encodings.get(spec, DIMS)
    assert message in str(err.value) and "\n" not in str(err.value)
