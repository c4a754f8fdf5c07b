"""The README's claims table against what the claims print from the committed results/default, and the verdict,
effect and interval of every text claim on those records."""

from pathlib import Path

from experiments.accumulated import readme_claims
from experiments.accumulated.claims import check_claims
from posenc.reports.compare import with_ratios
from posenc.reports.tasks import read_text_results

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_claims_block_is_what_the_claims_print_from_the_committed_results():
    """A generated artifact: rewrite it with `.venv/bin/python -m experiments.accumulated.readme_claims README.md`."""
    assert readme_claims.current(ROOT / "README.md") == readme_claims.block()


def test_the_committed_default_runs_verdicts_effects_and_intervals():
    records = with_ratios(read_text_results(ROOT / "results" / "default"))
    got = {
        (c.key, c.text.split("(")[1].split(")")[0] if c.key == "i" else ""): (
            c.verdict,
            c.outcome.cell(),
            c.robust_cell(),
        )
        for c in check_claims(records, 128)
    }
    # ln units, positive the claimed side; every verdict robust to the alternative rules
    assert got == {
        ("i", "acc-rand-qk"): ("holds", "+0.317 [+0.177, +0.458]", "robust"),
        ("i", "acc-rand-qkv"): ("holds", "+0.289 [+0.153, +0.424]", "robust"),
        ("ii", ""): ("within noise", "+0.010 [-0.076, +0.096]", "robust"),  # acc-learned-qkv's 3.6% machine noise
        ("iii", ""): ("does not hold", "-0.102 [-0.175, -0.028]", "robust"),
        ("iv", ""): ("holds", "+0.030 [+0.026, +0.034]", "robust"),
        ("v", ""): ("holds", "+0.031 [+0.030, +0.032]", "robust"),
        ("vi", ""): ("holds", "+0.097 [+0.075, +0.119]", "robust"),
    }
