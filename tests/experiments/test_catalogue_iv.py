"""Catalogue IV's text verdicts (experiments/catalogue_iv/claims.py) on synthetic records with known answers, and the
committed comparison's verdict report is what the code prints from its records."""

import math

import pytest

from posenc.reports.claims import FAILS, HOLDS, NOISE, claim_sets, unregister_claims
from posenc.reports.text import with_ratios
from posenc.store.records import Ppl

L0 = 128


@pytest.fixture
def catalogue():
    from experiments.catalogue_iv import claims

    claims.register_claims(claims.CLAIMS)  # imported once per process: registered again after an earlier test's removal
    yield claims
    unregister_claims("catalogue IV")


def _records(rows: dict[str, list[tuple[float, float]]]) -> list[Ppl]:
    """{scheme: [(ratio at 16x, ratio at 128x) per seed]} as ppl records (1x perplexity 5)."""
    return with_ratios(
        [
            Ppl(scheme=s, seed=seed, train_length=L0, eval_length=m * L0, ppl=5.0 * r)
            for s, seeds in rows.items()
            for seed, (r16, r128) in enumerate(seeds)
            for m, r in ((1, 1.0), (16, r16), (128, r128))
        ]
    )


def test_flat_and_better_than_rope_verdicts_with_their_effects(catalogue):
    records = _records(
        {
            "rope": [(2.0, 3.0), (2.2, 3.5), (2.4, 4.0)],
            "p-rope": [(0.99, 0.98), (0.99, 0.985), (0.99, 0.99)],
            "fope": [(1.01, 1.05), (1.02, 1.06), (1.03, 1.07)],
            "stick-breaking": [(1.0, 1.0)],  # one seed: no interval
        }
    )
    claims = {c.key: c for c in catalogue.check(records, L0)}
    assert set(claims) == {
        "flat p-rope",
        "rope p-rope",
        "flat fope",
        "rope fope",
        "flat stick-breaking",
        "rope stick-breaking",
    }
    flat = claims["flat p-rope"]
    assert flat.verdict == HOLDS
    expected = sum(math.log(1.02 / r) for r in (0.98, 0.985, 0.99)) / 3
    assert flat.outcome.effect == pytest.approx(expected) and flat.outcome.effect == pytest.approx(0.03493, abs=1e-5)
    # fope: ln(1.02 / r) = -0.0290, -0.0385, -0.0479; mean -0.0384, se 0.00545, t(2) 4.303: [-0.0619, -0.0150]
    fope = claims["flat fope"]
    assert fope.verdict == FAILS
    assert (fope.outcome.lo, fope.outcome.hi) == pytest.approx((-0.0619, -0.0150), abs=2e-4)
    assert claims["rope fope"].verdict == HOLDS
    mean_ln = sum(math.log(a / b) for a, b in zip((2.0, 2.2, 2.4), (1.01, 1.02, 1.03))) / 3  # means of logs
    assert claims["rope fope"].outcome.effect == pytest.approx(mean_ln) and mean_ln == pytest.approx(0.76592, abs=1e-5)
    assert claims["flat stick-breaking"].verdict == NOISE and claims["flat stick-breaking"].outcome.lo is None
    assert dict(flat.alternatives) == {"margin 0": HOLDS, "margin doubled": HOLDS, "band rule": HOLDS}


def test_a_run_without_the_designs_gets_no_section(catalogue):
    records = _records({"rope": [(2.0, 3.0)], "alibi": [(1.0, 1.0)]})
    assert catalogue.check(records, L0) == [] and catalogue.markdown(records, L0) == ""
    assert any(cs.name == "catalogue IV" for cs in claim_sets())


@pytest.mark.parametrize(
    "run, verdict",
    [
        ("catalogue-iv-text", "(flat rope+selective) **holds**"),
        ("catalogue-iv-gemma3", "(rope gemma3:window=64) **holds**"),
    ],
)
def test_the_committed_verdicts_are_what_the_code_prints_from_the_records(
    tmp_path, monkeypatch, catalogue, run, verdict
):
    """Rewrite with `posenc --import experiments/catalogue_iv/claims.py report results/RUN --out
    results/RUN/verdicts`."""
    from pathlib import Path

    from posenc.reports.runs import write_runs_report

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)  # the report names the run by the path it was given
    write_runs_report([Path("results") / run], tmp_path)
    committed = root / "results" / run / "verdicts" / "report.md"
    assert (tmp_path / "report.md").read_text() == committed.read_text()
    assert verdict in committed.read_text()
