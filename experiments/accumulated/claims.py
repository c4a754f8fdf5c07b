"""The claims of arXiv 2606.24975 ("Why do accumulated transformations extrapolate?") and the retrieval predictions
R1-R8 (``../shared/DESIGN.md``), as a posenc claim set (``posenc.reports.claims.ClaimSet``).

Load it into any posenc command with ``posenc --import experiments/accumulated/claims.py ...``: that command's
compare reports, ``posenc report`` and the scoreboard then check these claims (``make demo`` does), and its reports
show the paper's mixing window (``experiments.accumulated.window``).

One stated test per claim (issue 57; the statistics are ``posenc.reports.claims``: ``decide``, ``with_robustness``).
Each claim is one or more comparisons; each comparison is an effect oriented so that positive is the claimed side (a
difference of means over seeds: of ln perplexity or ln ratio for the text claims (i)-(vi), of accuracy for R3-R5, of
log2(1 + horizon in tokens) for R1, R2, R6-R8), with a 95% interval (RULE: Welch t over seeds, plus the noise the seeds
do not show, in quadrature), held to a symmetric margin (TEXT_MARGIN, ACC_MARGIN, HORIZON_MARGIN). A claim holds when
all its comparisons hold (R1: when one does), does not hold when one does not (R1: when all do), else within noise.
Each verdict is recomputed under the named alternative rules (``posenc.reports.claims.ALTERNATIVES`` and
TASK_ALTERNATIVES) and called robust when none flips it. Claims whose schemes were not run are omitted; a task claim
whose schemes were run but did not all learn is undecided, with the budget that would decide it
(``posenc.reports.tasks.not_learned``).

Thresholds of the claims themselves: "flat" is a ratio <= 1 + FLAT_TOL at the longest length; "degrades" a ratio
above it; "matches RoPE at 1x" (ii) a perplexity <= RoPE's x (1 + MATCH_TOL); "near training-length perplexity at 16x"
a ratio <= NEAR_16X; (v) and (vi) no worse perplexity than the baseline.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from experiments.accumulated import window
from posenc.encodings import canonical
from posenc.encodings.bias import alibi_slopes
from posenc.eval.tasks import standard_error
from posenc.reports.claims import (
    ALTERNATIVES,
    UNDECIDED,
    Claim,
    ClaimSet,
    Comparison,
    Outcome,
    Rule,
    claims_table,
    decide,
    decided,
    register_claims,
    robustness_table,
    with_robustness,
)
from posenc.reports.render import seed_cell
from posenc.reports.tasks import TaskTable, horizon, horizon_cell, horizon_value, not_learned
from posenc.reports.text import with_ratios
from posenc.store.presets import register_presets
from posenc.store.records import Ppl

# the study's presets (paper, baselines, learned, window, retrieval, state-tracking, flipflop-path) load by name
# once this module is imported (posenc --import experiments/accumulated/claims.py)
register_presets(Path(__file__).with_name("presets"))

FLAT_TOL = 0.02
MATCH_TOL = 0.02
NEAR_16X = 1.10
# Margins: the smallest effect that counts, the same on both sides. Text: 1% in perplexity or ratio (ln units), below
# every claim's own tolerance; accuracy: 2 points, about two binomial standard errors of a 500-answer cell at 90%;
# horizon: half a bucket (buckets are powers of two) in log2 tokens. Task accuracies are compared in points.
TEXT_MARGIN, ACC_MARGIN, HORIZON_MARGIN = 0.01, 2.0, 0.5


def _machine_noise(path: Path) -> dict[str, dict[str, float]]:
    """{scheme: {"ppl": ln(1 + change), "ratio": ...}}: each scheme's largest relative change of perplexity and of its
    ratio over every length between two machines (``benchmarks/run_noise.py --between``), in ln units."""
    data = json.loads(path.read_text())["largest_by_scheme"]
    return {s: {k: math.log1p(v) for k, v in d.items()} for s, d in data.items()}


# Run-to-run noise the seeds do not show: one seed's change between two machines (results/run_noise_machines.md; the
# thread count changes nothing on one machine, results/run_noise.md). A scheme measured there gets its own; any other
# (and every task quantity) the largest measured (acc-learned-qkv: ratio 3.6%, perplexity 3.3%). It enters each side
# of a comparison as a standard deviation.
MACHINE = _machine_noise(Path(__file__).resolve().parents[2] / "results" / "run_noise_machines.json")
MACHINE_MAX = {k: max(d[k] for d in MACHINE.values()) for k in ("ppl", "ratio")}


def machine(scheme: str, kind: str) -> float:
    """The machine noise (ln units) of ``scheme``'s ``kind`` ("ppl" or "ratio"): its own where measured, else the
    largest measured."""
    return MACHINE.get(scheme, MACHINE_MAX)[kind]


RULE = (
    "Each claim is one or more comparisons, each an effect oriented so that positive is the claimed side: a difference "
    "of means over seeds (Welch; against a fixed bar, one sample), with a 95% interval whose half-width is the "
    "quadrature sum of t_0.975 (Welch-Satterthwaite degrees of freedom) x the seeds' standard error and 1.96 x the "
    "noise the seeds do not show (the machine noise of `results/run_noise_machines.md`, each scheme's own where "
    "measured, else the largest measured; for tasks also the binomial standard error of the accuracies, the largest "
    "among the seeds, per side). A comparison **holds** when its interval lies entirely above +margin, **does not "
    "hold** when it lies entirely below -margin, and is **within noise** otherwise, including an interval inside "
    "±margin (marked: no effect that counts) and one seed (no interval). A claim holds when all its comparisons "
    "hold, does not hold when one does not, and is within noise otherwise; the table shows the deciding comparison "
    "(of a conjunction the weakest, or the failing one). Each verdict is recomputed under the alternative rules of "
    "the robustness table and is robust when none flips it."
)


def _censoring(up: bool, down: bool) -> str:
    """``Comparison.censored`` from whether the true effect may lie above (``up``) or below (``down``) the computed."""
    return "both" if up and down else "above" if up else "below" if down else ""


def more(
    x,
    y,
    margin: float,
    what: str,
    rule: Rule,
    noise_x: float = 0.0,
    noise_y: float = 0.0,
    cens_x: bool = False,
    cens_y: bool = False,
    paired: bool = False,
) -> Outcome:
    """The claim mean(x) > mean(y) (``y`` per seed, or a bar) decided under ``rule``; ``cens_x`` (``cens_y``): some of
    x's (y's) values are lower bounds of the true ones (a censored horizon)."""
    y = float(y) if isinstance(y, (int, float)) else tuple(y)
    c = Comparison(tuple(x), y, margin, noise_x, noise_y, paired, _censoring(cens_x, cens_y), what)
    return decide(c, rule)


def less(
    x, y, margin: float, what: str, rule: Rule, noise_x=0.0, noise_y=0.0, cens_x=False, cens_y=False, paired=False
):
    """The claim mean(x) < mean(y): :func:`more` of the negated values (the effect is mean(y) - mean(x))."""
    neg_y = -float(y) if isinstance(y, (int, float)) else [-v for v in y]
    c = Comparison(
        tuple(-v for v in x),
        neg_y if isinstance(neg_y, float) else tuple(neg_y),
        margin,
        noise_x,
        noise_y,
        paired,
        _censoring(cens_y, cens_x),
        what,
    )
    return decide(c, rule)


# the roles the claims compare, by scheme name in the default preset; a run's scheme takes a role when their
# canonical specs agree (``encodings.canonical``: rope:rope_theta=10000 is rope)
ROPE, ALIBI, HYBRID, ROPE_FORGET, FORGET = "rope", "alibi", "hybrid", "rope+forget", "forget"
RANDOM_QK, RANDOM_QKV, LEARNED_QK, LEARNED_QKV = "acc-rand-qk", "acc-rand-qkv", "acc-learned-qk", "acc-learned-qkv"
ROLES = [ROPE, ALIBI, HYBRID, ROPE_FORGET, FORGET, RANDOM_QK, RANDOM_QKV, LEARNED_QK, LEARNED_QKV]


def role_names(schemes, roles: list[str]) -> dict[str, str]:
    """scheme as a run spells it -> the role it plays (its own name when it plays none): a scheme plays a role when
    their canonical specs agree (``posenc.encodings.canonical``: rope:rope_theta=10000 is rope)."""
    keys = {canonical(r): r for r in roles}
    return {s: keys.get(canonical(s), s) for s in set(schemes)}


class Table:
    """Values over seeds by (scheme, evaluation length): perplexity and ratio."""

    def __init__(self, records: list[Ppl], train_length: int):
        self.L0 = train_length
        self.ppl: dict = defaultdict(lambda: defaultdict(list))
        self.ratio: dict = defaultdict(lambda: defaultdict(list))
        name = role_names([r.scheme for r in records], ROLES)
        for r in records:
            if r.ppl is not None:
                self.ppl[name[r.scheme]][r.eval_length].append(r.ppl)
            if r.ratio is not None:
                self.ratio[name[r.scheme]][r.eval_length].append(r.ratio)
        self.longest = max((L for row in self.ratio.values() for L in row), default=None)

    def has(self, *schemes: str, L: int | None = None) -> bool:
        return all(self.ppl[s].get(self.L0) and (L is None or self.ratio[s].get(L)) for s in schemes)

    def ppl1(self, s: str) -> list[float]:
        return self.ppl[s][self.L0]

    def r(self, s: str, L: int) -> list[float]:
        return self.ratio[s][L]

    def ln(self, s: str, L: int | None = None, kind: str = "ratio") -> list[float]:
        """ln of ``s``'s ratio (``kind`` "ratio") or perplexity ("ppl") per seed at ``L`` (None: 1x)."""
        row = self.ratio if kind == "ratio" else self.ppl
        return [math.log(v) for v in row[s][self.L0 if L is None else L]]


def _x(t: Table, L: int) -> str:
    return f"{L // t.L0}x"


def _ratio_less(t: Table, s: str, other: str | float, L: int, rule: Rule, what: str) -> Outcome:
    """The claim: ``s``'s ratio at ``L`` below ``other``'s (a scheme) or below a bar (a float), in ln units."""
    if isinstance(other, str):
        return less(t.ln(s, L), t.ln(other, L), TEXT_MARGIN, what, rule, machine(s, "ratio"), machine(other, "ratio"))
    return less(t.ln(s, L), math.log(other), TEXT_MARGIN, what, rule, machine(s, "ratio"))


def _ppl_less(t: Table, s: str, other: str, L: int | None, rule: Rule, what: str, tol: float = 0.0) -> Outcome:
    """The claim: ``s``'s perplexity at ``L`` (None: 1x) below ``other``'s x (1 + ``tol``), in ln units."""
    bar = [v + math.log1p(tol) for v in t.ln(other, L, "ppl")]
    return less(t.ln(s, L, "ppl"), bar, TEXT_MARGIN, what, rule, machine(s, "ppl"), machine(other, "ppl"))


def _better_than_rope(t: Table, s: str, rule: Rule) -> Claim | None:
    lengths = [L for L in (16 * t.L0, t.longest) if L in t.ratio[s]]
    if not t.has(s, ROPE) or not lengths or not all(t.ratio[ROPE].get(L) for L in lengths):
        return None
    lengths = sorted(set(lengths))
    parts = [_ratio_less(t, s, ROPE, L, rule, f"ln(rope / {s} ratio) at {_x(t, L)}") for L in lengths]
    ev = "; ".join(
        f"ratio at {_x(t, L)}: {s} {seed_cell(t.r(s, L))} vs rope {seed_cell(t.r(ROPE, L))}" for L in lengths
    )
    return decided("i", f"random accumulated rotations ({s}) extrapolate better than RoPE", parts, ev)


def _learned(t: Table, rule: Rule) -> Claim | None:
    L16 = 16 * t.L0
    if not t.has(LEARNED_QKV, ROPE, L=L16):
        return None
    parts = [
        _ppl_less(
            t, LEARNED_QKV, ROPE, None, rule, f"ln(rope x {1 + MATCH_TOL:g} / {LEARNED_QKV} ppl) at 1x", MATCH_TOL
        ),
        _ratio_less(t, LEARNED_QKV, NEAR_16X, L16, rule, f"ln({NEAR_16X:g} / {LEARNED_QKV} ratio) at 16x"),
    ]
    ev = (
        f"ppl at 1x: {LEARNED_QKV} {seed_cell(t.ppl1(LEARNED_QKV), '.2f')} vs rope {seed_cell(t.ppl1(ROPE), '.2f')} "
        f"(bar: rope x {1 + MATCH_TOL:g}); ratio at 16x: {seed_cell(t.r(LEARNED_QKV, L16))} (bar: {NEAR_16X:g})"
    )
    return decided("ii", "learned rotations match RoPE at 1x and stay near 1x perplexity at 16x", parts, ev)


def _qkv_beats_qk(t: Table, qk: str, qkv: str, rule: Rule) -> Claim | None:
    L = t.longest
    if not t.has(qk, qkv, L=L):
        return None
    ev = f"ratio at {_x(t, L)}: {qkv} {seed_cell(t.r(qkv, L))} vs {qk} {seed_cell(t.r(qk, L))}"
    part = _ratio_less(t, qkv, qk, L, rule, f"ln({qk} / {qkv} ratio) at {_x(t, L)}")
    return decided("iii", f"rotating Q/K/V extrapolates better than Q/K only ({qkv} vs {qk})", [part], ev)


def _rotation_degrades(t: Table, rule: Rule) -> Claim | None:
    L = t.longest
    rotary = [s for s in (ROPE, RANDOM_QK, RANDOM_QKV, LEARNED_QK, LEARNED_QKV) if t.has(s, L=L)]
    if not rotary or not t.has(ALIBI, L=L):
        return None
    flat = math.log(1 + FLAT_TOL)
    parts = [
        more(t.ln(s, L), flat, TEXT_MARGIN, f"ln({s} ratio / {1 + FLAT_TOL:g})", rule, machine(s, "ratio"))
        for s in rotary
    ]
    parts.append(_ratio_less(t, ALIBI, 1 + FLAT_TOL, L, rule, f"ln({1 + FLAT_TOL:g} / alibi ratio)"))
    ev = f"ratio at {_x(t, L)} (flat: <= {1 + FLAT_TOL:g}): " + ", ".join(
        f"{s} {seed_cell(t.r(s, L))}" for s in rotary + [ALIBI]
    )
    return decided("iv", "rotation-only models degrade at the longest length while ALiBi stays flat", parts, ev)


def _hybrid_flat(t: Table, rule: Rule) -> Claim | None:
    L = t.longest
    if not t.has(HYBRID, ROPE, L=L):
        return None
    parts = [
        _ratio_less(t, HYBRID, 1 + FLAT_TOL, L, rule, f"ln({1 + FLAT_TOL:g} / hybrid ratio) at {_x(t, L)}"),
        _ppl_less(t, HYBRID, ROPE, None, rule, "ln(rope / hybrid ppl) at 1x"),
    ]
    ev = (
        f"ratio at {_x(t, L)}: {seed_cell(t.r(HYBRID, L))} (flat: <= {1 + FLAT_TOL:g}); "
        f"ppl at 1x: hybrid {seed_cell(t.ppl1(HYBRID), '.2f')} vs rope {seed_cell(t.ppl1(ROPE), '.2f')}"
    )
    return decided(
        "v",
        "the hybrid (accumulated rotation + far-mass control) is flat and as good as RoPE at 1x (ppl <= RoPE's)",
        parts,
        ev,
    )


def _hybrid_vs_rope_forget(t: Table, rule: Rule) -> Claim | None:
    L = t.longest
    if not t.has(HYBRID, ROPE_FORGET, L=L):
        return None
    parts = [
        _ppl_less(t, HYBRID, ROPE_FORGET, None, rule, "ln(rope+forget / hybrid ppl) at 1x"),
        _ppl_less(t, HYBRID, ROPE_FORGET, L, rule, f"ln(rope+forget / hybrid ppl) at {_x(t, L)}"),
    ]
    far = {s: t.ppl[s][L] for s in (HYBRID, ROPE_FORGET)}
    ev = (
        f"ppl at 1x: hybrid {seed_cell(t.ppl1(HYBRID), '.2f')} vs rope+forget {seed_cell(t.ppl1(ROPE_FORGET), '.2f')}; "
        f"ppl at {_x(t, L)}: {seed_cell(far[HYBRID], '.2f')} vs {seed_cell(far[ROPE_FORGET], '.2f')}"
    )
    return decided("vi", "the hybrid matches or beats rope+forget at 1x and at the longest length (ppl <=)", parts, ev)


def _rotation_adds(t: Table, rule: Rule) -> Claim | None:
    """The control behind (vi)'s reading: with far mass controlled by the same gate, does the accumulated rotation
    add anything? The hybrid (learned accumulated Q/K/V rotation + gate) against forget (NoPE + the gate alone)."""
    L = t.longest
    if not t.has(HYBRID, FORGET, L=L):
        return None
    parts = [
        _ppl_less(t, HYBRID, FORGET, None, rule, "ln(forget / hybrid ppl) at 1x"),
        _ppl_less(t, HYBRID, FORGET, L, rule, f"ln(forget / hybrid ppl) at {_x(t, L)}"),
    ]
    ev = (
        f"ppl at 1x: hybrid {seed_cell(t.ppl1(HYBRID), '.2f')} vs forget {seed_cell(t.ppl1(FORGET), '.2f')}; "
        f"ppl at {_x(t, L)}: {seed_cell(t.ppl[HYBRID][L], '.2f')} vs {seed_cell(t.ppl[FORGET][L], '.2f')}"
    )
    return decided(
        "vi-control",
        "accumulated rotation adds something once far mass is controlled: the hybrid beats the gate alone (forget: "
        "NoPE + gate) at 1x and at the longest length (ppl <)",
        parts,
        ev,
    )


CHECKS: list[Callable[[Table, Rule], Claim | None]] = [
    lambda t, rule: _better_than_rope(t, RANDOM_QK, rule),
    lambda t, rule: _better_than_rope(t, RANDOM_QKV, rule),
    _learned,
    lambda t, rule: _qkv_beats_qk(t, RANDOM_QK, RANDOM_QKV, rule),
    lambda t, rule: _qkv_beats_qk(t, LEARNED_QK, LEARNED_QKV, rule),
    _rotation_degrades,
    _hybrid_flat,
    _hybrid_vs_rope_forget,
    _rotation_adds,
]


def check_claims(records: list[Ppl], train_length: int, rule: Rule | None = None) -> list[Claim]:
    """Every claim whose schemes are in ``records`` (ppl records with ``ratio``), in the paper's order: under the
    stated rule with its verdict under each of ALTERNATIVES (``rule`` None), or under ``rule`` alone."""
    table = Table(records, train_length)
    if table.longest is None:
        return []
    if rule is not None:
        return [c for c in (check(table, rule) for check in CHECKS) if c is not None]
    found = (with_robustness(lambda r, check=check: check(table, r), ALTERNATIVES) for check in CHECKS)
    return [c for c in found if c is not None]


def _one_seed(records: list[Ppl]) -> bool:
    return len({r.seed for r in records}) == 1


def rule_markdown(margins: str) -> str:
    """The stated rule as the reports write it, with the ``margins`` line."""
    return f"{RULE} {margins}"


TEXT_MARGINS = (
    f"Margin: {TEXT_MARGIN:g} in ln perplexity or ln ratio (1%). Thresholds: flat: ratio <= {1 + FLAT_TOL:g}, "
    f"degrades: ratio > {1 + FLAT_TOL:g}; matches RoPE at 1x (ii): perplexity <= RoPE's x {1 + MATCH_TOL:g}; near "
    f"1x perplexity at 16x: ratio <= {NEAR_16X:g}; (v) and (vi): perplexity <= the baseline's."
)


def claims_markdown(records: list[Ppl], train_length: int) -> str:
    """The report's claims section (the stated rule, the claims table, then the robustness table); without a claim
    whose schemes were run, one line saying which roles it needs."""
    claims = check_claims(records, train_length)
    if not claims:
        return (
            f"\nNo claim of arXiv 2606.24975 is checked: each compares two of {', '.join(ROLES)} "
            "(by spec: another spelling of one of them counts), and this run lacks the pairs.\n"
        )
    one = " One seed: no interval, so every verdict is within noise." if _one_seed(records) else ""
    return (
        "\n## The paper's claims (arXiv 2606.24975), checked on this run\n\n"
        f"Computed from the tables above. {rule_markdown(TEXT_MARGINS)}{one}\n\n"
        + claims_table(claims)
        + "\n\n### Robustness of the verdicts\n\n"
        + ROBUSTNESS_NOTE
        + "\n\n"
        + robustness_table(claims)
        + "\n"
    )


ROBUSTNESS_NOTE = (
    "Each verdict recomputed under alternative rules (a flipped verdict in bold): the noise the seeds do not show "
    "left out (noise 0) or doubled; the margin 0 or doubled; the band rule used before issue 57 (each side's seed "
    "range widened by its noise, no margin); task claims also at a horizon and erosion tolerance of 2, 10 and 20 "
    "points (5 stated), with the far accuracy of R3 weighted by answers or taken as the median of the buckets "
    "(the bucket mean stated), and with the half-way-to-chance horizon (the largest bucket up to which accuracy "
    "stays above the midpoint of id accuracy and chance)."
)


def readme_claims(records: list[Ppl], train_length: int) -> str:
    """The README's claims table: claim, verdict (marked "(not robust: ...)" where an alternative rule flips it),
    effect with its 95% interval."""
    from posenc.reports.render import markdown_table

    return (
        markdown_table(
            ["claim", "verdict", "effect [95% interval]"],
            [
                [
                    f"({c.key}) {c.text}",
                    f"**{c.verdict}**" + (f" ({c.robust_cell()})" if c.flips else ""),
                    f"{c.outcome.what} {c.outcome.cell()}" if c.outcome else "",
                ]
                for c in check_claims(records, train_length)
            ],
        )
        + "\n"
    )


# ---------------------------------------------------------------- task claims (R1-R8)

ROTATION_ONLY = ("rope", "acc-rand-qk", "acc-rand-qkv", "acc-learned-qkv")
FAR_MASS_CONTROLS = ("alibi", "forget", "rope+forget", "hybrid")
RAND_QKV, RAND_QK = "acc-rand-qkv", "acc-rand-qk"
# Householder transports with beta in [0, 2]: a reflection flips a state, an SO(2) step of at most 1 rad cannot
REFLECTING = "path"
FORGET_GATES = ("forget", "rope+forget", "path+forget")  # the schemes whose jobs measure the gate's leak (Task.leak)
# every scheme a task claim names
TASK_ROLES = list(dict.fromkeys([*ROTATION_ONLY, *FAR_MASS_CONTROLS, RAND_QKV, RAND_QK, REFLECTING, *FORGET_GATES]))
# R7, R8: a distance bias of r nats per token reaches WINDOW_NATS at w = WINDOW_NATS / r (a key's weight down by e);
# a horizon "follows" w within HORIZON_FACTOR either way (horizons are powers of two: two buckets each side)
WINDOW_NATS, HORIZON_FACTOR = 1.0, 4.0
# the task claims' alternatives besides ALTERNATIVES: the horizon and erosion tolerance (the runs state 5 points),
# the weighting of R3's far buckets (stated: the mean of the buckets), the horizon's definition
TASK_ALTERNATIVES = (
    *ALTERNATIVES,
    *(Rule(f"tolerance {p}", options=(("tol", p / 100),)) for p in (2, 10, 20)),
    Rule("answer-weighted", options=(("weighting", "answers"),)),
    Rule("median", options=(("weighting", "median"),)),
    Rule("half-way horizon", options=(("horizon", "half-way"),)),
)
# the machine noise of a task quantity: the largest measured relative change (no task run was measured on two machines)
TASK_MACHINE = MACHINE_MAX["ratio"]


def flat_schemes(text_records: list[Ppl]) -> dict[str, list[float]]:
    """{scheme: ratio per seed at the longest length} of the schemes flat (ratio <= 1 + FLAT_TOL) in a text run."""
    ppl = with_ratios(text_records)
    if not ppl:
        return {}
    t = Table(ppl, min(r.train_length for r in ppl))
    return {s: t.r(s, t.longest) for s in t.ratio if t.r(s, t.longest) and max(t.r(s, t.longest)) <= 1 + FLAT_TOL}


def log_horizon(h: float) -> float:
    """A horizon (tokens; None: the first bucket already short, 0) as log2(1 + h): 0 stays finite."""
    return math.log2(1 + horizon_value(h))


def _bias_there(h: int | None, rate: float) -> str:
    """ " (bias there X nats)": the bias (``rate`` nats per token) at a horizon of h tokens; "" for none (no bucket
    within the rule: no distance to read a bias at, not 0 tokens)."""
    return "" if h is None else f" (bias there {h * rate:.2g} nats)"


def horizons(t: TaskTable, s: str, rule: Rule) -> tuple[list[float], list[bool], list[int | None]]:
    """``s``'s horizon per seed under ``rule``: (log2(1 + horizon), censored: the largest distance probed, so a lower
    bound, horizon in tokens). The stated horizon: the largest gap bucket up to which accuracy stays within the
    run's tolerance of id accuracy (rule option "tol" another tolerance); "half-way": within half the way from id
    accuracy down to chance."""
    logs, cut, raw = [], [], []
    for seed, scores in t.scores[s].items():
        curve, id_acc = t.curve(s, seed), scores.acc("id", t.L0)[0]
        tol = (id_acc - t.chance) / 2 if rule.get("horizon") == "half-way" else rule.get("tol", t.tol)
        h = horizon(curve, id_acc, tol)
        logs.append(log_horizon(h)), cut.append(h is not None and h == max(curve)), raw.append(h)
    return logs, cut, raw


H_NOISE = math.log2(1 + TASK_MACHINE)  # a relative change of a horizon in log2 units


def _h_less(t, s, bar_tokens, rule, what) -> Outcome:
    h, cut, _ = horizons(t, s, rule)
    return less(h, log_horizon(bar_tokens), HORIZON_MARGIN, what, rule, H_NOISE, cens_x=any(cut))


def _undecided(key: str, text: str, t: TaskTable, schemes: list[str]) -> Claim:
    return Claim(key, text, UNDECIDED, not_learned(t, schemes))


def _robust(check: Callable[[Rule], Claim | None], rule: Rule | None) -> Claim | None:
    """``check`` under ``rule`` alone, or (None) under the stated rule with TASK_ALTERNATIVES."""
    return check(rule) if rule is not None else with_robustness(check, TASK_ALTERNATIVES)


def claim_r1(t: TaskTable, flat: dict[str, list[float]], rule: Rule | None = None) -> Claim | None:
    """(R1) some scheme flat in the text run has a horizon at or below the training length: a disjunction over the
    flat schemes that learned, each log2(1 + L0) - mean log2(1 + horizon) against HORIZON_MARGIN (censored horizons
    are lower bounds: their claim cannot hold)."""
    text = (
        f"{t.task}: flat perplexity is not far retrieval "
        f"(some scheme flat in the text run has a horizon <= the training length {t.L0})"
    )
    run = [s for s in flat if s in t.scores]
    schemes = [s for s in run if t.learned(s)]
    if not run:
        return None
    if not schemes:
        return _undecided("R1", text, t, run)

    def check(r: Rule) -> Claim:
        parts = [_h_less(t, s, t.L0, r, f"log2(1 + {t.L0}) - log2(1 + {s} horizon)") for s in schemes]
        # the ratio as the text run's table shows it (mean ± half-range over seeds), not one seed's
        numbers = "; ".join(
            f"{s} (ratio {seed_cell(flat[s], '.3f')} at the longest length): horizon "
            f"{horizon_cell(horizons(t, s, r)[2])}" + t.trained_as(s)
            for s in schemes
        )
        return decided("R1", text, parts, numbers, disjunction=True)

    return _robust(check, rule)


def _rand_qkv_variants(t: TaskTable, windows: dict[str, float | None]) -> list[tuple[float, str]]:
    return sorted(
        (windows[s], s)
        for s in t.scores
        if (s == RAND_QKV or s.startswith(RAND_QKV + ":")) and "+" not in s and windows.get(s)
    )


def claim_r2(t: TaskTable, windows: dict[str, float | None], rule: Rule | None = None) -> Claim | None:
    """(R2) each learned random-rotation variant's horizon below 4 w_0.01 (log2 units), and the horizon growing with
    w (each variant's mean log2 horizon above the next smaller window's, Welch)."""
    text = (
        f"{t.task}: random accumulated rotations retrieve only within about their mixing window "
        "(horizon <= 4 w_0.01, growing with w)"
    )
    run = _rand_qkv_variants(t, windows)
    variants = [(w, s) for w, s in run if t.learned(s)]
    if len(run) < 2:
        return None
    if len(variants) < 2:
        return _undecided("R2", text, t, [s for _, s in run])

    def check(r: Rule) -> Claim:
        parts = [_h_less(t, s, 4 * w, r, f"log2(1 + 4 w) - log2(1 + {s} horizon)") for w, s in variants]
        for (_, a), (_, b) in zip(variants, variants[1:]):
            (ha, ca, _), (hb, cb, _) = horizons(t, a, r), horizons(t, b, r)
            what = f"log2(1 + horizon): {b} - {a}"
            parts.append(more(hb, ha, HORIZON_MARGIN, what, r, H_NOISE, H_NOISE, any(cb), any(ca)))
        numbers = "; ".join(f"{s}: w_0.01 {w:.0f}, horizon {horizon_cell(horizons(t, s, r)[2])}" for w, s in variants)
        return decided("R2", text, parts, numbers)

    return _robust(check, rule)


def far_accuracy(t: TaskTable, s: str, far: list[int], weighting: str) -> tuple[list[float], float]:
    """Accuracy per seed over the gap buckets ``far`` (the mean of the buckets; ``weighting`` "answers": every
    answer counts once; "median": the buckets' median) and the largest binomial standard error among the seeds (on
    all their answers)."""
    accs, se = [], 0.0
    for scores in t.scores[s].values():
        cells = [scores.acc("gap", bucket=b) for b in far]
        cells = [(a, n) for a, n in cells if a is not None]
        n = sum(c[1] for c in cells)
        if weighting == "answers":
            acc = sum(a * k for a, k in cells) / n
        else:
            acc = float((np.median if weighting == "median" else np.mean)([a for a, _ in cells]))
        accs.append(acc)
        se = max(se, standard_error(acc, n))
    return accs, se


def points(values: list[float], se: float) -> tuple[list[float], float]:
    """Accuracies (fractions) per seed and their standard error as (points per seed, the noise the seeds do not show,
    in points): the probe sampling (``se``) and TASK_MACHINE x the mean, in quadrature."""
    pts = [100 * v for v in values]
    return pts, math.hypot(100 * se, TASK_MACHINE * abs(float(np.mean(pts))))


def claim_r3(t: TaskTable, windows: dict[str, float | None], rule: Rule | None = None) -> Claim | None:
    """(R3) beyond the mixing window Q/K/V retrieves no better than Q/K: the far accuracy of acc-rand-qk minus
    acc-rand-qkv's (points) against ACC_MARGIN."""
    if RAND_QK not in t.scores or RAND_QKV not in t.scores or not windows.get(RAND_QK):
        return None
    w = windows[RAND_QK]
    text = (
        f"{t.task}: beyond the mixing window ({w:.0f} tokens) Q/K/V retrieves no better than Q/K "
        "(value transport scrambles far content)"
    )
    if not (t.learned(RAND_QK) and t.learned(RAND_QKV)):
        return _undecided("R3", text, t, [RAND_QK, RAND_QKV])
    far = [b for b in next(iter(t.scores[RAND_QK].values())).buckets("gap") if b >= w]
    if not far:
        return None

    def check(r: Rule) -> Claim:
        weighting = r.get("weighting", "bucket")
        (qk, n_qk), (qkv, n_qkv) = (points(*far_accuracy(t, s, far, weighting)) for s in (RAND_QK, RAND_QKV))
        part = more(qk, qkv, ACC_MARGIN, "accuracy (points) acc-rand-qk - acc-rand-qkv", r, n_qk, n_qkv)
        numbers = (
            f"accuracy over gap buckets >= {far[0]} ({weighting}): acc-rand-qkv {seed_cell(qkv, '.1f')}% vs "
            f"acc-rand-qk {seed_cell(qk, '.1f')}%"
        )
        return decided("R3", text, [part], numbers)

    return _robust(check, rule)


NEAR = 16  # flip-flop near recall: answers whose evidence is fewer than NEAR tokens back


def near_values(t: TaskTable, s: str, length: int) -> tuple[list[float | None], float]:
    """Near-recall accuracy per seed at sequence ``length`` (and its standard error): the ``near`` test
    (mqar: the pairs right before the queries, after ``length`` tokens of filler), else the ``id`` test's
    answers with evidence < NEAR tokens back (flip-flop: near reads anywhere in a long sequence); None for a seed
    whose ``id`` test has no such answer at that length (its evidence distances drawn all longer)."""
    first = next(iter(t.scores[s].values()))
    if first.lengths("near"):
        return t.values(s, "near", length)
    accs: list[float | None] = []
    se = 0.0
    for scores in t.scores[s].values():
        cells = [scores.acc("id", length, b) for b in scores.buckets("id") if b < NEAR]
        n = sum(c[1] for c in cells if c[0] is not None)
        if not n:
            accs.append(None)
            continue
        acc = sum(c[0] * c[1] for c in cells if c[0] is not None) / n
        accs.append(acc)
        se = max(se, standard_error(acc, n))
    return accs, se


def claim_r4(t: TaskTable, rule: Rule | None = None) -> Claim | None:
    """(R4) near recall erodes in a long context for rotation-only schemes, not for far-mass controls: each
    rotation-only scheme's drop (points) above the tolerance, each control's below it, against ACC_MARGIN."""
    rot_run, ctrl_run = [s for s in ROTATION_ONLY if s in t.scores], [s for s in FAR_MASS_CONTROLS if s in t.scores]
    if not rot_run or not ctrl_run:
        return None
    rot, ctrl = [s for s in rot_run if t.learned(s)], [s for s in ctrl_run if t.learned(s)]
    first = next(iter(t.scores[rot_run[0]].values()))
    lengths = first.lengths("near") or first.lengths("id")
    near, far = lengths[0], lengths[-1]
    what = (
        "the pairs right before the queries" if first.lengths("near") else f"reads whose write is < {NEAR} tokens back"
    )
    text = (
        f"{t.task}: near recall ({what}) in a long context ({near} -> {far} tokens) erodes "
        f"(drop > {100 * t.tol:.0f} points) for rotation-only schemes, not for ALiBi or forget-gate schemes"
    )
    if not rot or not ctrl:  # the side with no learned scheme is what would decide it
        return _undecided("R4", text, t, (rot_run if not rot else []) + (ctrl_run if not ctrl else []))

    def drop(s):  # per seed with near reads at both lengths
        a, se_a = near_values(t, s, near)
        b, se_b = near_values(t, s, far)
        return [x - y for x, y in zip(a, b) if x is not None and y is not None], math.hypot(se_a, se_b)

    unread = [s for s in rot + ctrl if not drop(s)[0]]  # no seed has reads that near at both lengths
    if unread:
        why = f"no seed has reads < {NEAR} tokens back at both {near} and {far} tokens: {', '.join(unread)}"
        return Claim("R4", text, UNDECIDED, why)

    def check(r: Rule) -> Claim:
        tol = r.get("tol", t.tol)
        parts, numbers = [], []
        for s in rot + ctrl:
            d, noise = points(*drop(s))
            cmp, side = (more, "-") if s in rot else (less, "below")
            parts.append(cmp(d, 100 * tol, ACC_MARGIN, f"{s} drop {side} {100 * tol:g} points", r, noise))
            numbers.append(f"{s} {seed_cell(d, '.1f')}")
        return decided("R4", text, parts, "accuracy drop in points: " + ", ".join(numbers))

    return _robust(check, rule)


def claim_r5(t: TaskTable, rule: Rule | None = None) -> Claim | None:
    """(R5) PaTH errs at most as often as FoX and RoPE on the sparse test at the training length: each other's error
    minus PaTH's (points) against ACC_MARGIN."""
    schemes = ("path", "forget", "rope")
    text = (
        f"{t.task}: PaTH errs at most as often as FoX and RoPE on the sparse test at the training length "
        "(the PaTH paper's order)"
    )
    if not all(s in t.scores for s in schemes):
        return None
    if not all(t.learned(s) for s in schemes):
        return _undecided("R5", text, t, list(schemes))
    errs = {}  # error in points per seed, and the noise the seeds do not show
    for s in schemes:
        acc, se = t.values(s, "sparse", t.L0)
        errs[s] = points([1 - a for a in acc], se)

    def check(r: Rule) -> Claim:
        path = errs["path"]
        parts = [
            more(errs[o][0], path[0], ACC_MARGIN, f"error (points) {o} - path", r, errs[o][1], path[1])
            for o in ("forget", "rope")
        ]
        return decided("R5", text, parts, ", ".join(f"{s} {seed_cell(v[0], '.1f')}%" for s, v in errs.items()))

    return _robust(check, rule)


def claim_r6(t: TaskTable, rule: Rule | None = None) -> Claim | None:
    """State tracking (modsum): PaTH carries the running sum beyond the training length, no other learned scheme does:
    PaTH's mean log2(1 + horizon) above log2(1 + L0), each other learned scheme's below it, against HORIZON_MARGIN.
    Undecided when PaTH did not learn the task; None when it was not run."""
    text = (
        f"{t.task}: state tracking beyond the training length {t.L0}: PaTH's horizon exceeds it and no other "
        "learned scheme's does (a reflection can flip a state; SO(2) steps of at most 1 rad and position biases cannot)"
    )
    if REFLECTING not in t.scores:
        return None
    if not t.learned(REFLECTING):
        return _undecided("R6", text, t, [REFLECTING])
    others = [s for s in t.scores if s != REFLECTING and t.learned(s)]
    unlearned = [s for s in t.scores if s != REFLECTING and not t.learned(s)]

    def check(r: Rule) -> Claim:
        h, cut, _ = horizons(t, REFLECTING, r)
        bar = log_horizon(t.L0)
        parts = [
            more(h, bar, HORIZON_MARGIN, f"log2(1 + path horizon) - log2(1 + {t.L0})", r, H_NOISE, cens_x=any(cut))
        ]
        parts += [_h_less(t, s, t.L0, r, f"log2(1 + {t.L0}) - log2(1 + {s} horizon)") for s in others]
        numbers = "horizon: " + ", ".join(f"{s} {horizon_cell(horizons(t, s, r)[2])}" for s in [REFLECTING] + others)
        numbers += f"; did not learn: {', '.join(unlearned)}" if unlearned else ""
        return decided("R6", text, parts, numbers)

    return _robust(check, rule)


def decay_window(rate: float) -> float:
    """The distance (tokens) at which a distance bias of ``rate`` nats per token reaches WINDOW_NATS, i.e. drops a
    key's softmax weight by e^WINDOW_NATS against a key at distance 0: w = WINDOW_NATS / rate (inf for rate <= 0)."""
    return WINDOW_NATS / rate if rate > 0 else math.inf


def follows_window(h: list[float], windows: list[float], censored: list[bool], what: str, rule: Rule) -> list[Outcome]:
    """ "The horizon follows the window" over seeds: two comparisons of log2(1 + horizon) (``h``), paired with each
    seed's own window, against log2(1 + w / HORIZON_FACTOR) (above it) and log2(1 + w x HORIZON_FACTOR) (below it), each
    against HORIZON_MARGIN; a censored horizon (the largest distance probed) is a lower bound, so it cannot show the
    horizon below the upper end. An infinite window has no upper end (that part is left out)."""
    low = [log_horizon(w / HORIZON_FACTOR) for w in windows]
    parts = [
        more(
            h,
            low,
            HORIZON_MARGIN,
            f"{what} above w/{HORIZON_FACTOR:g}",
            rule,
            H_NOISE,
            cens_x=any(censored),
            paired=True,
        )
    ]
    if all(math.isfinite(w) for w in windows):
        high = [log_horizon(w * HORIZON_FACTOR) for w in windows]
        parts.append(
            less(
                h,
                high,
                HORIZON_MARGIN,
                f"{what} below {HORIZON_FACTOR:g} w",
                rule,
                H_NOISE,
                cens_x=any(censored),
                paired=True,
            )
        )
    return parts


def _band(w: float) -> str:
    return f"[{w / HORIZON_FACTOR:.0f}, {w * HORIZON_FACTOR:.0f}]" if math.isfinite(w) else "unbounded"


def claim_alibi_slopes(t: TaskTable, rule: Rule | None = None) -> Claim | None:
    """(R7) ALiBi's horizon follows its slopes: the bias of head h at distance d is -m_h d (Press et al. 2022,
    arXiv 2108.12409, sec. 3), so the flattest head (the smallest slope of ``alibi_slopes(n_head)``) reaches farthest,
    and its window w = WINDOW_NATS / m_min (``decay_window``) predicts the horizon within HORIZON_FACTOR
    (``follows_window``). The slopes' geometric sequence ends at 2^-8 for every head count (w = 256 tokens): the head
    count changes the steeper heads, not the flattest. The head count is each record's (``Task.n_head``), else the
    run's. None when ALiBi was not run; undecided when it did not learn or the head count is unknown."""
    text = (
        f"{t.task}: ALiBi's horizon follows its slopes (within x{HORIZON_FACTOR:g} of w = {WINDOW_NATS:g} / m of its "
        "flattest head: where that head's bias reaches 1 nat)"
    )
    if ALIBI not in t.scores:
        return None
    if not t.learned(ALIBI):
        return _undecided("R7", text, t, [ALIBI])
    heads = [t.records[(ALIBI, seed)].n_head for seed in t.scores[ALIBI]]
    if None in heads:
        return Claim(
            "R7",
            text,
            UNDECIDED,
            "the head count is unknown (records without n_head and no preset.json): rerun the "
            "report on a run whose records or preset give it",
        )
    slopes = [float(alibi_slopes(n).min()) for n in heads]
    windows = [decay_window(m) for m in slopes]

    def check(r: Rule) -> Claim:
        h, cut, raw = horizons(t, ALIBI, r)
        numbers = "; ".join(
            f"seed {seed}: {n} heads, flattest slope {m:.4g}/token, w {w:.0f}, band {_band(w)}, "
            f"horizon {horizon_cell([hs])}{_bias_there(hs, m)}"
            for seed, n, m, w, hs in zip(t.scores[ALIBI], heads, slopes, windows, raw)
        )
        return decided("R7", text, follows_window(h, windows, cut, "log2(1 + alibi horizon)", r), numbers)

    return _robust(check, rule)


def claim_forget_leak(t: TaskTable, rule: Rule | None = None) -> Claim | None:
    """(R8) A forget gate's horizon follows its measured leak: the bias against a key d tokens back is the sum of the
    log forget gates over those d tokens (Lin et al. 2025, arXiv 2503.02130, eq. 4-6), about -r d for a gate that leaks
    r nats per token over the gap (``Task.leak``, measured by ``posenc.eval.tasks.gate_leak`` on each job), so the
    horizon of the flattest head (the smallest leak over every gated layer) should follow w = WINDOW_NATS / r within
    HORIZON_FACTOR (``follows_window``), each seed against its own leak; every forget-gate scheme that learned, each
    its own comparisons. None when no forget-gate scheme was run; undecided when none learned, or the records keep no
    leak."""
    text = (
        f"{t.task}: a forget gate's horizon follows its measured leak "
        f"(within x{HORIZON_FACTOR:g} of w = {WINDOW_NATS:g} / r "
        "of its flattest head, r its mean -log f per token over the probe's gap)"
    )
    run = [s for s in FORGET_GATES if s in t.scores]
    learned = [s for s in run if t.learned(s)]
    if not run:
        return None
    if not learned:
        return _undecided("R8", text, t, run)
    measured = [s for s in learned if all(t.records[(s, seed)].leak for seed in t.scores[s])]
    if not measured:
        return Claim(
            "R8",
            text,
            UNDECIDED,
            f"no leak in the records of {', '.join(learned)} (written before Task.leak; a job "
            "run now measures it after training)",
        )
    leaks = {s: [min(min(row) for row in t.records[(s, seed)].leak) for seed in t.scores[s]] for s in measured}

    def check(r: Rule) -> Claim:
        parts, numbers = [], []
        for s in measured:
            h, cut, raw = horizons(t, s, r)
            ws = [decay_window(x) for x in leaks[s]]
            parts += follows_window(h, ws, cut, f"log2(1 + {s} horizon)", r)
            numbers += [
                f"{s} seed {seed}: leak {x:.4f} nats/token, w {w:.0f}, band {_band(w)}, horizon {horizon_cell([hs])}"
                f"{_bias_there(hs, x)}"
                for seed, x, w, hs in zip(t.scores[s], leaks[s], ws, raw)
            ]
        return decided("R8", text, parts, "; ".join(numbers))

    return _robust(check, rule)


def in_roles(t: TaskTable) -> TaskTable:
    """The study's view of a task table: ``t`` (the library's, each scheme as its run named it) with each scheme under
    the role it plays (:func:`role_names` over ROLES and TASK_ROLES), as the task claims look them up."""
    names = role_names(t.scores, [*ROLES, *TASK_ROLES])
    records = [r.model_copy(update={"scheme": names[r.scheme]}) for r in t.records.values()]
    return TaskTable(records, t.task, t.L0, t.tol, t.bar)


def check_task_claims(table: TaskTable, meta: dict, text_records: list[Ppl]) -> list[Claim]:
    """R1-R8 on one task's table (the ``ClaimSet.tasks`` hook), its schemes looked up by role (:func:`in_roles`)."""
    t = in_roles(table)
    windows = (meta.get("quantities") or {}).get(window.LABEL) or {}
    out = [claim_r1(t, flat_schemes(text_records)), claim_r2(t, windows), claim_r3(t, windows), claim_r4(t)]
    kind = t.task.partition(":")[0]
    if kind == "flipflop":
        out.append(claim_r5(t))
    if kind == "modsum":
        out.append(claim_r6(t))
    out += [claim_alibi_slopes(t), claim_forget_leak(t)]
    return [c for c in out if c is not None]


ACCUMULATED = register_claims(
    ClaimSet(
        name="arXiv 2606.24975",
        title="The paper's claims",
        text=check_claims,
        text_markdown=claims_markdown,
        tasks=check_task_claims,
        quantities=(window.WINDOW,),
        text_section=window.window_section,
        text_figures=window.window_figures,
        gap_columns=window.GAP_COLUMNS,
    )
)
