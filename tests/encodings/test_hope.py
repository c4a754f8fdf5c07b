"""HoPE (Chen et al. 2025): RoPE's frequencies that complete a period within the training length rotate, the rest
are position-free; which end of the spectrum it keeps against p-RoPE and rotary_fraction."""

import math

import pytest
import torch

from posenc import encodings
from posenc.encodings.base import Dims, Inputs
from posenc.errors import PosencError
from tests.decoding import assert_grouped_query_decoding_equals_the_parallel_forward

DIMS = Dims(n_head=2, head_dim=32, d_model=64, vocab_size=0, train_length=512)


def phases(spec, T=700, dims=DIMS):
    return encodings.get(spec, dims).phases(Inputs(torch.zeros(1, T, dims.d_model), torch.arange(T)))


def test_phases_are_the_papers_definition():
    """Pair i rotates by t * 10000^(-2i/32) where that frequency turns once within L = 512 tokens (omega L >= 2 pi),
    else 0: by hand, omega_7 = 10000^(-7/16) = 0.0178 (a period of 353 tokens) is kept, omega_8 = 0.01 (628) is not."""
    assert 10000 ** (-7 / 16) * 512 >= 2 * math.pi > 10000 ** (-8 / 16) * 512
    T = torch.arange(700, dtype=torch.float64)[:, None]
    omega = torch.tensor([10000 ** (-i / 16) if i < 8 else 0.0 for i in range(16)], dtype=torch.float64)
    want = torch.remainder(T * omega, 2 * math.pi).float()
    got = phases("hope")[0, 0]
    assert torch.allclose(got, want, atol=1e-5) and not got[:, 8:].any()
    assert encodings.get("hope", DIMS).kept == 8
    assert encodings.get("hope:base_length=100", DIMS).kept == 5  # 10000^(-4/16) * 100 = 10 >= 2 pi > 5.6


@pytest.mark.parametrize("length", [16, 100, 512, 4096])
def test_hope_is_p_rope_with_the_fraction_its_training_length_keeps(length):
    """The same end of the spectrum as p-RoPE, the highest frequencies; HoPE's count follows L."""
    hope = encodings.get(f"hope:base_length={length}", DIMS)
    p = hope.kept / 16
    assert torch.equal(hope.inv_freq, encodings.get(f"p-rope:p={p}", DIMS).inv_freq)
    kept = hope.inv_freq[: hope.kept]
    assert (kept * length >= 2 * math.pi).all() and (kept > 0).all()


def test_rotary_fraction_keeps_the_lowest_frequencies_that_hope_drops():
    """rope:rotary_fraction=0.5 rotates down to RoPE's lowest frequency (~1e-4 rad per token at base 1e4), which
    never completes a period in 512 tokens; HoPE's lowest rotated frequency completes one."""
    partial = encodings.get("rope:rotary_fraction=0.5", DIMS).inv_freq
    assert partial.min() * 512 < 2 * math.pi and partial.min() < 2e-3
    hope = encodings.get("hope", DIMS).inv_freq
    assert hope[hope > 0].min() * 512 >= 2 * math.pi


@pytest.mark.parametrize("spec", ["hope", "hope:pairing=adjacent+alibi", "hope:window=4"])
def test_grouped_query_decoding_equals_the_parallel_forward(spec):
    assert_grouped_query_decoding_equals_the_parallel_forward(spec)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("hope:base_length=6", r"hope: base_length must be an integer >= 7 .* got 6 \(the training length if unset\)$"),
        ("hope:base_length=1.5", r"base_length=1.5: expected int$"),
        ("hope:rope_theta=1", r"rope_theta must be a finite number > 1, got 1$"),
        ("hope:pairing=odd", r"pairing must be 'half' or 'adjacent', got 'odd'$"),
        ("hope:p=0.5", r"has no parameter 'p'"),
    ],
)
def test_bad_parameters_are_one_line_errors(spec, message):
    with pytest.raises(PosencError, match=message) as err:
        encodings.get(spec, DIMS)
    assert "\n" not in str(err.value)


def test_a_training_length_below_one_period_is_refused():
    with pytest.raises(PosencError, match=r"got 4 \(the training length if unset\)$"):
        encodings.get("hope", Dims(2, 32, 64, 0, 4))


def test_hope_is_listed_with_its_source():
    rows = {name: (doc, source) for rows in encodings.catalogue().values() for name, doc, source in rows}
    doc, source = rows["hope"]
    assert doc.startswith("HoPE: RoPE's frequencies") and "2410.21216" in source
