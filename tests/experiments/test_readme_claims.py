"""The README's claims table against what the claims print from the committed results/default, and the verdict,
effect and interval of every text claim on those records."""

from pathlib import Path

from experiments.accumulated import readme_claims
from experiments.accumulated.claims import check_claims
from posenc.reports.tasks import read_text_results
from posenc.reports.text import with_ratios

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
    # ln units, positive the claimed side (five seeds, each with its own rotation draws)
    assert got == {
        ("i", "acc-rand-qk"): ("holds", "+0.314 [+0.250, +0.379]", "robust"),
        ("i", "acc-rand-qkv"): ("holds", "+0.291 [+0.226, +0.355]", "robust"),
        ("ii", ""): ("within noise", "+0.008 [-0.065, +0.080]", "robust"),  # acc-learned-qkv's 3.6% machine noise
        ("iii", ""): ("does not hold", "-0.093 [-0.119, -0.067]", "robust"),
        ("iv", ""): ("holds", "+0.030 [+0.028, +0.031]", "robust"),
        ("v", ""): ("holds", "+0.031 [+0.030, +0.031]", "robust"),
        ("vi", ""): ("holds", "+0.100 [+0.089, +0.110]", "robust"),
        ("vi-control", ""): ("holds", "+0.119 [+0.055, +0.183]", "not robust: within noise at noise doubled"),
    }
