"""The statistics of posenc.reports.claims: the Student-t quantile, the interval of a difference over seeds, the
verdict from interval and margin (symmetric), censoring, the band rule and the robustness recomputation."""

import math

import pytest

from posenc.reports.claims import (
    FAILS,
    HOLDS,
    NOISE,
    Claim,
    Comparison,
    Rule,
    any_of,
    claims_table,
    combine,
    decide,
    decided,
    interval,
    robustness_table,
    seed_difference,
    t_cdf,
    t_quantile,
    verdict,
    with_robustness,
)


@pytest.mark.parametrize(
    "df, q", [(1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (10, 2.228), (30, 2.042), (math.inf, 1.960)]
)
def test_t_quantile_matches_the_tables(df, q):
    assert t_quantile(0.975, df) == pytest.approx(q, abs=5e-4)
    assert t_quantile(0.025, df) == pytest.approx(-q, abs=5e-4)
    assert t_cdf(q, df) == pytest.approx(0.975, abs=1e-4)


def test_t_quantile_at_other_levels_and_real_degrees_of_freedom():
    assert t_quantile(0.95, 5) == pytest.approx(2.015, abs=5e-4)
    assert t_quantile(0.5, 3) == pytest.approx(0.0, abs=1e-9)
    assert t_quantile(0.975, 2) > t_quantile(0.975, 2.5) > t_quantile(0.975, 3)  # Welch's df are real


def test_welch_difference_by_hand():
    effect, se, df = seed_difference([1.0, 2.0, 3.0], [2.0, 4.0, 6.0])
    # s_x^2 / 3 = 1/3, s_y^2 / 3 = 4/3; df = (5/3)^2 / ((1/3)^2 / 2 + (4/3)^2 / 2) = 50/17
    assert (effect, se, df) == pytest.approx((-2.0, math.sqrt(5 / 3), 50 / 17))
    assert seed_difference([1.0, 1.0], [2.0, 2.0]) == pytest.approx((-1.0, 0.0, 2.0))  # no spread: n_x + n_y - 2
    assert seed_difference([1.0], [2.0, 3.0]) is None  # one seed on a side: no interval


def test_paired_and_one_sample_differences_by_hand():
    effect, se, df = seed_difference([1.0, 2.0, 3.0], [0.5, 1.8, 2.4], paired=True)  # d = 0.5, 0.2, 0.6
    assert (effect, se, df) == pytest.approx((1.3 / 3, math.sqrt(0.13 / 3 / 3), 2.0))
    assert seed_difference([1.0, 1.2, 1.4], 1.0) == pytest.approx((0.2, 0.2 / math.sqrt(3), 2.0))
    with pytest.raises(ValueError, match="one value per seed"):
        seed_difference([1.0, 2.0], [1.0], paired=True)


def test_t_interval_by_hand_with_the_noise_the_seeds_do_not_show():
    c = Comparison((1.0, 1.2, 1.4), 1.0, margin=0.1)
    half = 4.303 * 0.2 / math.sqrt(3)  # t_{0.975, 2} x se = 0.4969
    assert interval(c) == pytest.approx((0.2, 0.2 - half, 0.2 + half), abs=2e-4)
    noisy = Comparison((1.0, 1.2, 1.4), 1.0, margin=0.1, noise_x=0.1)
    wide = math.hypot(half, 1.95996 * 0.1)  # the known noise at z, in quadrature
    assert interval(noisy) == pytest.approx((0.2, 0.2 - wide, 0.2 + wide), abs=2e-4)
    assert interval(noisy, Rule(noise=0)) == pytest.approx(interval(c))
    assert interval(Comparison((1.3,), 1.0, 0.1)) == (pytest.approx(0.3), None, None)


def test_verdicts_and_symmetric_margins():
    assert verdict(0.2, 0.5, 0.1) == HOLDS  # entirely above +margin
    assert verdict(-0.5, -0.2, 0.1) == FAILS  # entirely below -margin
    assert verdict(0.05, 0.5, 0.1) == NOISE and verdict(-0.5, -0.05, 0.1) == NOISE  # inside the margin on either side
    assert verdict(-0.05, 0.05, 0.1) == NOISE  # inside ±margin: no effect that counts
    assert verdict(0.1, 0.5, 0.1) == NOISE and verdict(-0.5, -0.1, 0.1) == NOISE  # at the margin: not beyond it
    assert verdict(0.01, 0.5, 0.0) == HOLDS and verdict(-0.5, -0.01, 0.0) == FAILS
    assert verdict(None, None, 0.0) == NOISE  # one seed


def test_censored_effects_decide_only_the_way_the_bound_allows():
    assert verdict(0.2, 0.5, 0.1, "above") == HOLDS  # the true effect is larger still
    assert verdict(-0.5, -0.2, 0.1, "above") == NOISE  # it may be larger: not shown to fail
    assert verdict(0.2, 0.5, 0.1, "below") == NOISE and verdict(-0.5, -0.2, 0.1, "below") == FAILS
    assert verdict(0.2, 0.5, 0.1, "both") == NOISE == verdict(-0.5, -0.2, 0.1, "both")
    o = decide(Comparison((3.0, 3.1, 3.2), 1.0, 0.5, censored="above", what="h"))
    assert o.verdict == HOLDS and o.cell("+.2f").endswith("(censored: a bound)")


def test_outcome_cells():
    o = decide(Comparison((1.0, 1.2, 1.4), 1.0, 0.1))
    assert o.verdict == NOISE and o.cell("+.2f") == "+0.20 [-0.30, +0.70]"
    assert decide(Comparison((1.3,), 1.0, 0.1)).cell("+.1f") == "+0.3 (1 seed: no interval)"
    tight = decide(Comparison((1.01, 1.0, 0.99), 1.0, 0.1))
    assert tight.verdict == NOISE and tight.cell("+.2f") == "+0.00 [-0.02, +0.02] (inside ±0.1: no effect that counts)"


def test_the_band_rule_is_the_seed_ranges_widened_by_their_noise():
    c = Comparison((1.2, 1.4), (1.0, 1.1), 0.05, noise_x=0.02, noise_y=0.03)
    assert interval(c, Rule(interval="band")) == pytest.approx((0.25, 0.05, 0.45))
    assert decide(c, Rule(interval="band", margin=0)).verdict == HOLDS
    assert decide(Comparison((1.3,), 1.0, 0.1), Rule(interval="band")).verdict == HOLDS  # one seed decides there


def test_combining_parts():
    assert combine([HOLDS, HOLDS]) == HOLDS and combine([HOLDS, NOISE]) == NOISE and combine([NOISE, FAILS]) == FAILS
    assert any_of([FAILS, HOLDS]) == HOLDS and any_of([FAILS, NOISE]) == NOISE and any_of([FAILS, FAILS]) == FAILS
    strong = decide(Comparison((1.0, 1.1, 1.2), 0.0, 0.1, what="strong"))
    weak = decide(Comparison((0.2, 0.3, 0.4), 0.0, 0.1, what="weak"))
    c = decided("k", "text", [strong, weak], "raw", fmt="+.1f")
    assert c.verdict == NOISE and c.outcome is weak  # the weakest part decides a conjunction
    assert c.evidence.startswith("effect weak +0.3 [") and c.evidence.endswith("; raw") and c.numbers == "raw"
    assert decided("k", "text", [strong, weak], "raw", disjunction=True).outcome is strong


def _check(x):
    """A claim of one comparison of ``x`` against 0 with margin 0.1."""

    def check(rule):
        return decided("k", "a claim", [decide(Comparison(tuple(x), 0.0, 0.1, what="e"), rule)], "raw")

    return check


def test_a_verdict_one_alternative_flips_is_not_robust():
    rules = [Rule("margin 0", margin=0.0), Rule("margin doubled", margin=2.0), Rule("band rule", interval="band")]
    # effect 1.0, se 0.0577, half-width 0.248: lo 0.75 is beyond 0.1 and 0.2; robust
    robust = with_robustness(_check([0.9, 1.0, 1.1]), rules)
    assert robust.verdict == HOLDS and robust.flips == [] and robust.robust_cell() == "robust"
    assert robust.evidence.startswith("robust; effect e +1.000 [")
    # effect 0.4, half-width 0.248: lo 0.152 holds at margin 0.1, not at 0.2
    shaky = with_robustness(_check([0.3, 0.4, 0.5]), rules)
    assert shaky.verdict == HOLDS and shaky.flips == [("margin doubled", NOISE)]
    assert shaky.shown_verdict() == "holds (not robust: within noise at margin doubled)"
    table = robustness_table([robust, shaky])
    assert "| claim | stated rule | margin 0 | margin doubled | band rule | robust |" in table
    assert "| (k) | holds | holds | **within noise** | holds | no |" in table
    assert "| (k) | holds | holds | holds | holds | yes |" in table
    assert with_robustness(lambda rule: None, rules) is None


def test_the_claims_table_puts_effect_interval_and_robustness_beside_the_verdict():
    c = with_robustness(_check([0.3, 0.4, 0.5]), [Rule("margin doubled", margin=2.0)])
    undecided = Claim("u", "another", "undecided", "x did not learn")
    table = claims_table([c, undecided])
    assert table.splitlines()[0] == "| claim | verdict | effect [95% interval] | robust | numbers |"
    assert (
        "| (k) a claim | **holds** | e +0.400 [+0.152, +0.648] | not robust: within noise at margin doubled | raw |"
        in (table)
    )
    assert "| (u) another | **undecided** | | | x did not learn |" in table
    assert robustness_table([undecided]) == ""
