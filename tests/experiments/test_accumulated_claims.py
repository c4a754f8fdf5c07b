"""The text claims (i)-(vi) of experiments/accumulated (arXiv 2606.24975) and the report's mixing-window section, on
synthetic results tables."""

import pytest

from experiments.accumulated import claims
from experiments.accumulated.claims import check_claims, claims_markdown
from posenc.reports.claims import FAILS, HOLDS, NOISE, at_most, combine, exceeds
from posenc.reports.compare import markdown, window_markdown, window_rows, with_ratios
from posenc.store.records import Ppl

L0 = 128


def table(rows: dict[str, dict[int, list[float]]]) -> list[Ppl]:
    """scheme -> {multiple: [ppl per seed]} -> ppl records with ratios (seed i is the i-th value)."""
    recs = [
        Ppl(scheme=s, seed=i, train_length=L0, eval_length=m * L0, ppl=p)
        for s, by_m in rows.items()
        for m, ppls in by_m.items()
        for i, p in enumerate(ppls)
    ]
    return with_ratios(recs)


def row(p1: list[float], r16: list[float], r128: list[float]) -> dict[int, list[float]]:
    return {1: p1, 16: [p * r for p, r in zip(p1, r16)], 128: [p * r for p, r in zip(p1, r128)]}


def verdicts(rows) -> dict[str, str]:
    return {
        f"{c.key}:{c.text.split('(')[1].split(')')[0] if c.key in ('i', 'iii') else ''}": c.verdict
        for c in check_claims(table(rows), L0)
    }


def test_comparison_verdicts():
    assert at_most([1.0, 1.1], [1.2, 1.3]) == HOLDS
    assert at_most([1.0], [1.0]) == HOLDS
    assert at_most([1.4, 1.5], [1.2, 1.3]) == FAILS
    assert at_most([1.0, 1.25], [1.2, 1.3]) == NOISE
    assert combine([HOLDS, HOLDS]) == HOLDS and combine([HOLDS, NOISE]) == NOISE and combine([NOISE, FAILS]) == FAILS


def test_run_to_run_noise_widens_each_band():
    # 1.101 against the fixed bar 1.10 does not hold as points, is within noise with a 0.5% band
    assert at_most([1.101], [1.10]) == FAILS
    assert at_most([1.101], [1.10], 0.005) == NOISE
    assert at_most([1.12], [1.10], 0.005) == FAILS  # 1.12 x 0.995 = 1.114 > 1.10
    # both sides widened: 7.45 vs 7.57 x 1.02 = 7.72 holds at 1%, is within noise at 2%
    assert at_most([7.45], [7.7214], 0.01, 0.01) == HOLDS
    assert at_most([7.45], [7.7214], 0.02, 0.02) == NOISE
    assert (
        exceeds([1.03], 1.02) == HOLDS and exceeds([1.03], 1.02, 0.02) == NOISE and exceeds([0.99], 1.02, 0.02) == FAILS
    )


def test_paper_pattern_every_claim_holds():
    rows = {
        "rope": row([6.4], [1.8], [3.3]),
        "alibi": row([6.7], [0.99], [0.98]),
        "acc-rand-qk": row([7.2], [1.3], [2.0]),
        "acc-rand-qkv": row([7.3], [1.05], [1.2]),
        "acc-learned-qkv": row([6.4], [1.06], [1.3]),
        "hybrid": row([5.8], [0.99], [0.99]),
        "rope+forget": row([6.4], [0.99], [0.98]),
    }
    v = verdicts(rows)
    assert v == {
        "i:acc-rand-qk": HOLDS,
        "i:acc-rand-qkv": HOLDS,
        "ii:": HOLDS,
        "iii:acc-rand-qkv vs acc-rand-qk": HOLDS,
        "iv:": HOLDS,
        "v:": HOLDS,
        "vi:": HOLDS,
    }


def test_each_claim_can_fail():
    rows = {
        "rope": row([6.4], [1.2], [1.5]),
        "alibi": row([6.7], [1.1], [1.3]),  # ALiBi not flat: (iv) fails
        "acc-rand-qk": row([7.2], [1.3], [1.4]),
        "acc-rand-qkv": row([7.3], [1.3], [1.6]),  # worse than RoPE and than QK
        "acc-learned-qkv": row([6.9], [1.06], [1.3]),  # 7.8% worse than RoPE at 1x: (ii) fails
        "hybrid": row([6.6], [0.99], [1.05]),  # not flat, worse than RoPE at 1x
        "rope+forget": row([6.4], [0.99], [0.98]),
    }
    v = verdicts(rows)
    assert v == {
        "i:acc-rand-qk": FAILS,
        "i:acc-rand-qkv": FAILS,
        "ii:": FAILS,
        "iii:acc-rand-qkv vs acc-rand-qk": FAILS,
        "iv:": FAILS,
        "v:": FAILS,
        "vi:": FAILS,
    }


@pytest.fixture
def no_run_noise(monkeypatch):
    """Bands of the seed ranges alone: the band logic, apart from the measured noise."""
    monkeypatch.setattr(claims, "PPL_NOISE", 0.0)
    monkeypatch.setattr(claims, "RATIO_NOISE", 0.0)


def test_the_measured_noise_makes_a_margin_below_it_within_noise():
    """Seed 0 of the default run on which the noise was measured (results/demo-epyc: ratio 1.0770 at 16x) against
    the bar 1.10: 2.1% below it, inside the 2.2% measured between two machines (where the same seed gave 1.101), so
    claim (ii) is within noise."""
    rows = {"rope": row([7.5750], [1.3747], [1.9816]), "acc-learned-qkv": row([7.4707], [1.0770], [1.3298])}
    (claim,) = [c for c in check_claims(table(rows), L0) if c.key == "ii"]
    assert claims.RATIO_NOISE == pytest.approx(abs(1.101 - 1.0770) / 1.0770, abs=5e-4)
    assert claim.verdict == NOISE


def test_overlapping_seed_ranges_are_within_noise(no_run_noise):
    rows = {
        "rope": row([6.4, 6.3, 6.5], [1.8, 1.5, 2.0], [3.3, 2.6, 3.5]),
        "acc-rand-qk": row([7.2, 7.1, 7.3], [1.3, 1.2, 1.4], [2.0, 1.5, 2.5]),
        "acc-rand-qkv": row([7.3, 7.2, 7.4], [1.1, 1.0, 1.2], [1.9, 1.4, 2.5]),
        "hybrid": row([5.8, 5.9, 6.35], [0.99, 0.99, 0.99], [0.99, 0.99, 0.99]),
        "rope+forget": row([6.4, 6.3, 6.3], [0.99, 0.99, 0.99], [0.98, 0.98, 0.98]),
    }
    v = verdicts(rows)
    assert v["iii:acc-rand-qkv vs acc-rand-qk"] == NOISE  # QKV 1.4-2.5 vs QK 1.5-2.5 at 128x
    assert v["i:acc-rand-qkv"] == HOLDS  # 16x and 128x ranges below RoPE's
    assert v["v:"] == NOISE and v["vi:"] == NOISE  # hybrid 1x range 5.8-6.35 overlaps RoPE's 6.3-6.5
    md = claims_markdown(table(rows), L0)
    assert "ratio at 128x: acc-rand-qkv 1.933 ± 0.550 vs acc-rand-qk 2.000 ± 0.500" in md  # mean ± half-range
    assert "One seed" not in md
    one = {s: {m: v[:1] for m, v in r.items()} for s, r in rows.items()}
    assert "One seed: the bands are the run-to-run noise alone" in claims_markdown(table(one), L0)


def test_degrading_is_strictly_above_the_flat_threshold(no_run_noise):
    rows = {"rope": row([6.4], [1.5], [1.02]), "alibi": row([6.7], [1.0], [1.02])}
    (claim,) = [c for c in check_claims(table(rows), L0) if c.key == "iv"]
    assert claim.verdict == FAILS  # 1.02 is flat, so RoPE does not degrade


def test_claims_whose_schemes_were_not_run_are_omitted():
    assert check_claims(table({"nope": row([10.0], [1.1], [1.2]), "alibi": row([6.7], [1.0], [1.0])}), L0) == []
    assert "No claim of arXiv 2606.24975 is checked" in claims_markdown(table({"nope": row([10.0], [1.1], [1.2])}), L0)
    keys = [
        c.key
        for c in check_claims(table({"rope": row([6.4], [1.8], [3.3]), "acc-rand-qkv": row([7.3], [1.05], [1.2])}), L0)
    ]
    assert keys == ["i"]


def test_report_carries_the_claims_section():
    rows = {"rope": row([6.4], [1.8], [3.3]), "alibi": row([6.7], [0.99], [0.98])}
    md = markdown(table(rows), {}, {"name": "t", "train_length": L0})
    assert "## The paper's claims" in md and "| (iv) rotation-only models degrade" in md and "**holds**" in md


def test_window_section_sorts_by_window_and_predicts_from_the_training_length():
    rows = {f"acc-rand-qkv:a={a}": row([7.0], [1.0 + a / 10], [1.1]) for a in (2, 1, 0.1)}
    windows = {"acc-rand-qkv:a=2": 6, "acc-rand-qkv:a=1": 27, "acc-rand-qkv:a=0.1": 2763, "rope": None}
    got = window_rows(table(rows), windows, L0)
    assert [r["scheme"] for r in got] == ["acc-rand-qkv:a=2", "acc-rand-qkv:a=1", "acc-rand-qkv:a=0.1"]
    assert got[2]["w_ratio"] == pytest.approx(2763 / 128) and got[0]["rmax"] == [pytest.approx(1.1)]
    md = window_markdown(table(rows), windows, L0)
    assert (
        "| acc-rand-qkv:a=1 | 27 | 0.211 | extrapolates |" in md
        and "| acc-rand-qkv:a=0.1 | 2763 | 21.6 | degrades |" in md
    )
    assert window_rows(table(rows), {"acc-rand-qkv:a=2": 6, "acc-rand-qkv:a=1": 27}, L0) == []  # fewer than 3 windows


def test_claims_find_their_schemes_by_canonical_spec():
    """rope:rope_theta=10000 is rope and acc-rand-qk:a=1 is acc-rand-qk: the same runs give the same claims."""
    plain = {
        "rope": row([6.4], [1.8], [3.3]),
        "acc-rand-qk": row([7.3], [1.05], [1.2]),
        "alibi": row([6.7], [0.99], [0.98]),
    }
    spelled = {"rope:rope_theta=10000": plain["rope"], "acc-rand-qk:a=1": plain["acc-rand-qk"], "alibi": plain["alibi"]}
    want = [(c.key, c.verdict, c.evidence) for c in check_claims(table(plain), L0)]
    assert [c.key for c in check_claims(table(plain), L0)] == ["i", "iv"]
    assert [(c.key, c.verdict, c.evidence) for c in check_claims(table(spelled), L0)] == want
    other = {
        "rope:rope_theta=500000": plain["rope"],
        "acc-rand-qk": plain["acc-rand-qk"],
    }  # another theta is another scheme
    assert check_claims(table(other), L0) == []


def test_a_report_whose_claims_find_none_of_their_roles_says_so():
    md = claims_markdown(table({"nope": row([10.0], [1.1], [1.2])}), L0)
    assert md.strip().startswith("No claim of arXiv 2606.24975 is checked") and "rope, alibi, hybrid" in md
