"""The text claims (i)-(vi) of experiments/accumulated (arXiv 2606.24975) and the report's mixing-window section, on
synthetic results tables."""

import math

import numpy as np
import pytest

from experiments.accumulated import claims
from experiments.accumulated.claims import check_claims, claims_markdown
from posenc.reports.claims import FAILS, HOLDS, NOISE, Rule, t_quantile
from posenc.reports.text import markdown, with_ratios
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


def three(values: list[float]) -> list[float]:
    """One value as three seeds 0.1% apart (an interval needs two)."""
    return [v * f for v in values for f in (0.999, 1.0, 1.001)]


def seeds3(rows):
    return {s: {m: three(v) for m, v in r.items()} for s, r in rows.items()}


def test_machine_noise_per_scheme_else_the_largest_measured():
    """results/run_noise_machines.json: acc-learned-qkv's ratio moved by 3.64% between two machines, alibi's by
    0.001%; a scheme not measured there takes the largest (3.64%)."""
    assert claims.machine("acc-learned-qkv", "ratio") == pytest.approx(math.log1p(0.0364177), abs=1e-6)
    assert claims.machine("alibi", "ratio") == pytest.approx(1.07e-5, abs=1e-7)
    assert claims.machine("path", "ratio") == claims.machine("acc-learned-qkv", "ratio")
    assert claims.machine("acc-learned-qkv", "ppl") == pytest.approx(math.log1p(0.0330464), abs=1e-6)


def test_paper_pattern_every_claim_holds():
    rows = {
        "rope": row([6.4], [1.8], [3.3]),
        "alibi": row([6.7], [0.99], [0.98]),
        "acc-rand-qk": row([7.2], [1.3], [2.0]),
        "acc-rand-qkv": row([7.3], [1.05], [1.2]),
        "acc-learned-qkv": row([6.0], [1.0], [1.3]),  # 10% under each bar: beyond its 3.3-3.6% machine noise
        "hybrid": row([5.8], [0.99], [0.99]),
        "rope+forget": row([6.4], [0.99], [0.98]),
    }
    v = verdicts(seeds3(rows))
    assert v == {
        "i:acc-rand-qk": HOLDS,
        "i:acc-rand-qkv": HOLDS,
        "ii:": HOLDS,
        "iii:acc-rand-qkv vs acc-rand-qk": HOLDS,
        "iv:": HOLDS,
        "v:": HOLDS,
        "vi:": HOLDS,
    }
    assert set(verdicts(rows).values()) == {NOISE}  # one seed: no interval, every verdict within noise


def test_each_claim_can_fail():
    rows = {
        "rope": row([6.4], [1.2], [1.5]),
        "alibi": row([6.7], [1.1], [1.3]),  # ALiBi not flat: (iv) fails
        "acc-rand-qk": row([7.2], [1.3], [1.4]),
        "acc-rand-qkv": row([7.3], [1.3], [1.6]),  # worse than RoPE and than QK
        "acc-learned-qkv": row([7.4], [1.06], [1.3]),  # 16% worse than RoPE at 1x: (ii) fails
        "hybrid": row([6.6], [0.99], [1.05]),  # not flat, worse than RoPE at 1x
        "rope+forget": row([6.4], [0.99], [0.98]),
    }
    v = verdicts(seeds3(rows))
    assert v == {
        "i:acc-rand-qk": FAILS,
        "i:acc-rand-qkv": FAILS,
        "ii:": FAILS,
        "iii:acc-rand-qkv vs acc-rand-qk": FAILS,
        "iv:": FAILS,
        "v:": FAILS,
        "vi:": FAILS,
    }


def test_claim_iii_effect_and_interval_by_hand():
    """ln(qk / qkv ratio) at 128x, Welch over three seeds each, plus each scheme's machine noise in quadrature (both
    measured at 0.0003% or less: negligible)."""
    qk, qkv = [1.07, 1.08, 1.09], [1.16, 1.20, 1.23]
    rows = {
        "acc-rand-qk": {1: [8.0] * 3, 128: [8 * r for r in qk]},
        "acc-rand-qkv": {1: [8.0] * 3, 128: [8 * r for r in qkv]},
    }
    (c,) = [c for c in check_claims(table(rows), L0) if c.key == "iii"]
    a, b = np.log(qk), np.log(qkv)
    se = math.sqrt(a.var(ddof=1) / 3 + b.var(ddof=1) / 3)
    df = se**4 / ((a.var(ddof=1) / 3) ** 2 / 2 + (b.var(ddof=1) / 3) ** 2 / 2)
    effect = a.mean() - b.mean()
    assert c.outcome.effect == pytest.approx(effect)
    assert c.outcome.lo == pytest.approx(effect - t_quantile(0.975, df) * se, abs=1e-5)
    assert c.verdict == FAILS and c.outcome.hi < -claims.TEXT_MARGIN


def test_a_margin_inside_the_noise_is_within_noise():
    """Claim (ii) at 16x: acc-learned-qkv's ratio 2% under the 1.10 bar on three close seeds is within noise: its
    measured machine noise (3.6%) is larger than the margin it leaves."""
    rows = seeds3({"rope": row([7.5750], [1.3747], [1.9816]), "acc-learned-qkv": row([7.4707], [1.0770], [1.3298])})
    (claim,) = [c for c in check_claims(table(rows), L0) if c.key == "ii"]
    assert claim.verdict == NOISE and claim.outcome.what == "ln(1.1 / acc-learned-qkv ratio) at 16x"
    assert claim.outcome.effect == pytest.approx(math.log(1.10 / 1.0770), abs=1e-4)
    assert claim.outcome.lo < claims.TEXT_MARGIN < claim.outcome.hi


def test_overlapping_seed_ranges_are_within_noise():
    rows = {
        "rope": row([6.4, 6.3, 6.5], [1.8, 1.5, 2.0], [3.3, 2.6, 3.5]),
        "acc-rand-qk": row([7.2, 7.1, 7.3], [1.3, 1.2, 1.4], [2.0, 1.5, 2.5]),
        "acc-rand-qkv": row([7.3, 7.2, 7.4], [1.1, 1.0, 1.2], [1.9, 1.4, 2.5]),
        "hybrid": row([5.8, 5.9, 6.35], [0.99, 0.99, 0.99], [0.99, 0.99, 0.99]),
        "rope+forget": row([6.4, 6.3, 6.3], [0.99, 0.99, 0.99], [0.98, 0.98, 0.98]),
    }
    v = verdicts(rows)
    assert v["iii:acc-rand-qkv vs acc-rand-qk"] == NOISE  # QKV 1.4-2.5 vs QK 1.5-2.5 at 128x
    # 16x and 128x ranges below RoPE's: the old band rule held it, three seeds' t-interval at 128x reaches below 0
    assert v["i:acc-rand-qkv"] == NOISE
    (i_qkv,) = [c for c in check_claims(table(rows), L0) if c.key == "i" and "acc-rand-qkv" in c.text]
    assert i_qkv.robust_cell() == "not robust: holds at band rule" and i_qkv.outcome.lo < 0
    assert v["v:"] == NOISE and v["vi:"] == NOISE  # hybrid 1x 5.8-6.35 against RoPE's 6.3-6.5: the interval is wide
    md = claims_markdown(table(rows), L0)
    assert "ratio at 128x: acc-rand-qkv 1.933 ± 0.550 vs acc-rand-qk 2.000 ± 0.500" in md  # mean ± half-range
    assert "One seed" not in md and "### Robustness of the verdicts" in md
    assert "| claim | verdict | effect [95% interval] | robust | numbers |" in md
    one = {s: {m: v[:1] for m, v in r.items()} for s, r in rows.items()}
    assert "One seed: no interval, so every verdict is within noise." in claims_markdown(table(one), L0)


def test_degrading_is_above_the_flat_threshold_by_the_margin():
    rows = seeds3({"rope": row([6.4], [1.5], [1.0]), "alibi": row([6.7], [1.0], [1.0])})
    (claim,) = [c for c in check_claims(table(rows), L0) if c.key == "iv"]
    assert claim.verdict == FAILS  # RoPE at 1.0 is flat: ln(1.0 / 1.02) = -0.0198 < -0.01


def test_text_verdicts_under_the_old_band_rule_are_in_the_robustness_record():
    """A claim the t-interval leaves within noise but the band rule (ranges widened by the noise) decides is marked
    not robust: two seeds of acc-rand-qkv just under acc-rand-qk's at 128x."""
    rows = {
        "acc-rand-qk": {1: [8.0, 8.0], 128: [8 * 1.100, 8 * 1.130]},
        "acc-rand-qkv": {1: [8.0, 8.0], 128: [8 * 1.060, 8 * 1.095]},
    }
    (c,) = [c for c in check_claims(table(rows), L0) if c.key == "iii"]
    assert c.verdict == NOISE and dict(c.alternatives)["band rule"] == HOLDS
    assert c.robust_cell() == "not robust: holds at band rule"
    assert [x.verdict for x in check_claims(table(rows), L0, Rule("band rule", interval="band", margin=0))] == [HOLDS]


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
