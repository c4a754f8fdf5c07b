"""posenc.train.curves: the one "loss still falling" rule the training loop and the task report share."""

import pytest

from posenc.errors import PosencError
from posenc.train.curves import LOSS_FALLING, Trend, loss_trend


def test_the_trend_compares_the_last_eighth_with_the_window_a_quarter_earlier():
    falling = [(s, 1.0 - s / 1000) for s in range(20, 620, 20)]  # 30 logged steps: windows of 3
    t = loss_trend(falling)
    assert (t.before, t.late, t.span) == pytest.approx((0.58, 0.42, 160)) and t.falling
    assert t.falling_at(600) == "loss still falling at the step cap 600 (0.580 -> 0.420 over its last 160 steps)"
    assert not loss_trend([(s, 0.7) for s in range(20, 620, 20)]).falling
    assert loss_trend(falling[:3]) is None  # too few logged steps to tell


def test_the_threshold_is_relative():
    assert Trend(before=1.0, late=1.0 - LOSS_FALLING - 1e-9, span=1).falling
    assert not Trend(before=1.0, late=1.0 - LOSS_FALLING + 1e-9, span=1).falling


@pytest.mark.parametrize(
    ("curve", "message"),
    [
        ([(1, 1.0), (3, 0.9), (2, 0.8), (4, 0.7)], "steps must increase"),
        ([(1, 1.0), (2, float("nan")), (3, 0.8), (4, 0.7)], "not finite"),
    ],
)
def test_a_bad_curve_is_one_line(curve, message):
    with pytest.raises(PosencError, match=message):
        loss_trend(curve)
