"""One record per RoPE schedule (issue 25 item 5): a schedule is one entry of ``posenc.rope.SCHEDULES``."""

import pytest
import torch

from posenc import encodings, rope
from posenc.encodings.base import Dims
from posenc.errors import PosencError
from posenc.hf.rope_parameters import hf_rope_parameters
from posenc.rope.schedules import REQUIRED, TRAIN_LENGTH, HFRope, Schedule


def test_every_record_is_named_by_its_key_and_the_name_lists_follow_the_records():
    assert all(isinstance(s, Schedule) and s.name == n for n, s in rope.SCHEDULES.items())
    assert rope.RELATIVE == ("rerope", "leaky-rerope") and rope.SHIPPED == ("longrope",)
    assert set(rope.NAMES) | set(rope.SHIPPED) == set(rope.SCHEDULES)


def test_a_new_schedule_is_one_entry(monkeypatch):
    half = Schedule(
        "half",
        lambda d, theta, p, seq_len: rope.rope_inv_freq(d, theta) / (2 * p["factor"]),
        HFRope("linear", ("factor",), base=lambda theta, p, d: theta),
        {"factor": REQUIRED, "original_max_position_embeddings": TRAIN_LENGTH},
        attention_factor=lambda p: 1.5,
    )
    monkeypatch.setitem(rope.SCHEDULES, "half", half)
    assert rope.schedule_params("half", 32, {"factor": 2.0}) == {"factor": 2.0, "original_max_position_embeddings": 32}
    with pytest.raises(PosencError, match="'half' needs factor"):
        rope.schedule_params("half", 32)
    enc = encodings.get(
        "rope",
        Dims(n_head=2, head_dim=8, d_model=16, vocab_size=16, train_length=32),
        schedule="half",
        schedule_params={"factor": 2.0},
    )
    assert torch.equal(enc.inv_freq, rope.rope_inv_freq(8) / 4) and enc.logit_scale == 1.5**2
    assert hf_rope_parameters("half", enc.schedule_params, 10000.0, 8) == {
        "rope_type": "linear",
        "rope_theta": 10000.0,
        "factor": 2.0,
    }
