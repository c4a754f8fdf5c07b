"""Catalogue IV's verdicts on text (issue 60): which of 2025's positional designs stay flat past the training length,
and which extrapolate better than RoPE trained beside them.

Load it into any command with ``posenc --import experiments/catalogue_iv/claims.py ...``: every text report of a run
holding these schemes gets this section (``posenc report``'s too). Two stated tests per
design ``s`` of :data:`SCHEMES` that the run holds (matched by spec, ``posenc.encodings.canonical``):

- (flat s): s's perplexity ratio at the longest evaluated length is at most :data:`FLAT` (1.02), the bar of the
  accumulated study's flatness claims: effect ln(FLAT / ratio) per seed against 0, one sample.
- (rope s): s's ratio at 16x (or the longest length below it) is below RoPE's: effect ln(RoPE's ratio / s's), Welch
  over the two schemes' seeds.

Each is decided by ``posenc.reports.claims.decide`` (95% t-interval over seeds, margin :data:`MARGIN` on both sides)
and recomputed under the library's alternatives that apply without a measured machine noise (margin 0, margin
doubled, the band rule). Machine noise is not added: it was measured for the accumulated study's schemes only
(``results/run_noise_machines.md``), not for these.
"""

from __future__ import annotations

import math
from collections import defaultdict

from posenc.encodings import canonical
from posenc.reports.claims import (
    ALTERNATIVES,
    Claim,
    ClaimSet,
    Comparison,
    Rule,
    claims_table,
    decide,
    decided,
    register_claims,
    robustness_table,
    with_robustness,
)

ROPE = "rope"
SCHEMES = (
    "rope+learned-sinks",
    "mla",
    "rope+selective",
    "stick-breaking",
    "rope+ssmax",
    "rope+logn",
    "p-rope",
    "hope",
    "fope",
    "rnope-swa:window=64",
    "gemma3:window=64",
    "rope:rope_theta=500000,pairing=adjacent,chunk=64|rope:rope_theta=500000,pairing=adjacent,chunk=64|"
    "rope:rope_theta=500000,pairing=adjacent,chunk=64|llama4-temp:floor_scale=64",
)
LABELS = {SCHEMES[-1]: "irope-shipped (chunk 64, floor 64)"}  # the pattern's spec is too long for a claim's text
FLAT, MARGIN, AT = 1.02, 0.01, 16
RULES = tuple(r for r in ALTERNATIVES if r.noise == 1.0)  # those that change something without a machine noise


def ratios(records, train_length: int) -> dict[str, dict[int, list[float]]]:
    """{canonical spec: {evaluation length: ratio per seed}} of the text records (``Ppl`` with ``ratio``)."""
    out: dict = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r.ratio is not None and r.eval_length % train_length == 0:
            out[canonical(r.scheme)][r.eval_length].append(r.ratio)
    return out


def _flat(s: str, row: dict[int, list[float]], rule: Rule) -> Claim:
    L = max(row)
    x = tuple(math.log(FLAT / v) for v in row[L])
    o = decide(Comparison(x, 0.0, MARGIN, what=f"ln({FLAT} / ratio) at {L}"), rule)
    numbers = "ratio at " + f"{L}: " + ", ".join(f"{v:.3f}" for v in row[L])
    return decided(
        f"flat {LABELS.get(s, s)}", f"{LABELS.get(s, s)} stays flat to {L} tokens (ratio <= {FLAT})", [o], numbers
    )


def _beats_rope(s: str, row: dict[int, list[float]], rope: dict[int, list[float]], L0: int, rule: Rule) -> Claim | None:
    shared = [L for L in row if L in rope and L <= AT * L0 and L > L0]
    if not shared:
        return None
    L = max(shared)
    x, y = tuple(math.log(v) for v in rope[L]), tuple(math.log(v) for v in row[L])
    o = decide(Comparison(x, y, MARGIN, what=f"ln(rope / scheme ratio) at {L}"), rule)
    numbers = (
        f"ratio at {L}: " + ", ".join(f"{v:.3f}" for v in row[L]) + "; rope " + ", ".join(f"{v:.3f}" for v in rope[L])
    )
    label = LABELS.get(s, s)
    return decided(f"rope {label}", f"{label} extrapolates better than RoPE (ratio at {L} below RoPE's)", [o], numbers)


def check(records, train_length: int) -> list[Claim]:
    """Both tests for each design of :data:`SCHEMES` the records hold (the RoPE one where RoPE was run beside it)."""
    table = ratios(records, train_length)
    rope = table.get(canonical(ROPE))
    out = []
    for s in SCHEMES:
        row = table.get(canonical(s))
        if not row:
            continue
        out.append(with_robustness(lambda rule, s=s, row=row: _flat(s, row, rule), RULES))
        if rope:
            claim = with_robustness(lambda rule, s=s, row=row: _beats_rope(s, row, rope, train_length, rule), RULES)
            if claim is not None:
                out.append(claim)
    return out


def markdown(records, train_length: int) -> str:
    """The report's section: the stated rule, the claims table, the robustness table; "" when the run holds none of
    the designs."""
    claims = check(records, train_length)
    if not claims:
        return ""
    return (
        "\n## Catalogue IV on text: flat, and better than RoPE?\n\n"
        f"Two stated tests per design (experiments/catalogue_iv/claims.py): (flat) ln({FLAT} / ratio) at the longest "
        f"length against 0, one sample over seeds; (rope) ln(RoPE's ratio / the design's) at {AT}x, Welch over both "
        f"schemes' seeds. 95% t-interval; **holds** above +{MARGIN}, **does not hold** below -{MARGIN}, else "
        "**within noise**. No machine noise is added (not measured for these schemes).\n\n"
        + claims_table(claims)
        + "\n\n"
        + robustness_table(claims)
        + "\n"
    )


CLAIMS = register_claims(
    ClaimSet(name="catalogue IV", title="Catalogue IV on text", text=check, text_markdown=markdown)
)
