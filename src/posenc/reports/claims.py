"""Claims checked on a comparison: the statistics of a verdict, and the registry of claim sets a report checks.

A claim set is a study's hypotheses written as code (``ClaimSet``): checks of a text comparison's perplexity records
and of a task comparison's table (``posenc.reports.tasks.TaskTable``), each returning ``Claim``s with a verdict.
posenc ships none: a study registers its own (``register_claims``) in a module loaded as a plugin
(``posenc --import experiments/accumulated/claims.py``, or ``POSENC_IMPORT``: ``posenc.encodings.import_schemes``),
and every report of that process checks them. The verdict vocabulary is shared: a comparison *holds*, *does not
hold*, is *within noise*, or is *undecided* (a scheme it needs did not learn).

One rule decides every comparison (issue 57; ``decide``): an effect oriented so that positive is the claimed side
(``Comparison``: a difference of means over seeds, Welch's or paired, or one sample against a bar), with a 95%
interval whose half-width is the quadrature sum of t_0.975 (``t_quantile``, Welch-Satterthwaite degrees of freedom)
x the seeds' standard error and z_0.975 x the noise the seeds do not show; it holds when the interval lies entirely
above +margin, does not hold when it lies entirely below -margin, and is within noise otherwise (one seed: no
interval). A claim is recomputed under alternative rules (``Rule``, ``ALTERNATIVES``, ``with_robustness``) and is
robust when none flips its verdict.

A set may also add to the reports what its claims read (it never renames the library's rows): per-scheme quantities
(``Quantity``: a column of each task's distance table and a line on its distance plot, in ``meta["quantities"]``
for its checks), and sections and figures of the text comparison's report (``ClaimSet.text_section``,
``ClaimSet.text_figures``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from posenc import encodings
from posenc.config.plan import Preset, scheme_values
from posenc.reports.render import markdown_table

HOLDS, FAILS, NOISE, UNDECIDED = "holds", "does not hold", "within noise", "undecided"
LEVEL = 0.95  # the intervals' coverage


# ---------------------------------------------------------------- Student t (scipy is not a dependency)


def _beta_cf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz; Numerical Recipes 6.4)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1 + num * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-14:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for 0 <= x <= 1."""
    if x <= 0 or x >= 1:
        return float(x >= 1)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _beta_cf(a, b, x) / a
    return 1 - front * _beta_cf(b, a, 1 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` > 0 degrees of freedom (real); the normal CDF for df = inf."""
    if math.isinf(df):
        return 0.5 * math.erfc(-t / math.sqrt(2))
    tail = 0.5 * _betainc(df / 2, 0.5, df / (df + t * t))
    return 1 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile (0 < p < 1) of Student's t with ``df`` > 0 degrees of freedom, by bisection of
    :func:`t_cdf` to 1e-10 (t_{0.975, 2} = 4.303, t_{0.975, 4} = 2.776; df = inf: the normal's, 1.960)."""
    if p < 0.5:
        return -t_quantile(1 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, 2 * hi
    while hi - lo > 1e-10:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


# ---------------------------------------------------------------- one comparison: effect, interval, verdict


@dataclasses.dataclass(frozen=True)
class Rule:
    """How comparisons are decided. ``interval``: "t" (the stated rule: a t-interval over seeds, :func:`decide`) or
    "band" (each side's seed range widened by its noise, no margin); ``noise``, ``margin``:
    multipliers of the measured noise and of the stated margin; ``options``: a study's own knobs, as (key, value)
    pairs (e.g. ("tol", 0.1): a task's horizon tolerance). ``name`` says it in the robustness table."""

    name: str = "stated"
    interval: str = "t"
    noise: float = 1.0
    margin: float = 1.0
    options: tuple[tuple[str, Any], ...] = ()

    def get(self, key: str, default: Any = None) -> Any:
        """The option ``key``, else ``default``."""
        return dict(self.options).get(key, default)


STATED = Rule()
# the alternatives every claim is recomputed under (a study adds its own: tolerance, weighting, horizon definition)
ALTERNATIVES = (
    Rule("noise 0", noise=0.0),
    Rule("noise doubled", noise=2.0),
    Rule("margin 0", margin=0.0),
    Rule("margin doubled", margin=2.0),
    Rule("band rule", interval="band", margin=0.0),
)


@dataclasses.dataclass(frozen=True)
class Comparison:
    """A claimed effect over seeds, oriented so that positive is the claimed side: mean(x) - mean(y), with ``y`` the
    other scheme's values per seed or a fixed bar (a float). ``noise_x``, ``noise_y``: the standard deviation of each
    side's mean that the seeds do not show (machine noise, probe sampling; in the effect's unit, already combined in
    quadrature per side). ``margin``: the smallest effect that counts (the effect's unit). ``paired``: x[i] and y[i]
    share seed i and the design pairs them. ``censored``: where some values are censored bounds, the side the true
    effect may lie on: "above" (the computed effect is a lower bound: "does not hold" is not established), "below"
    (an upper bound: "holds" is not), "both", or "" (none). ``what``: the label of the effect in the report."""

    x: tuple[float, ...]
    y: tuple[float, ...] | float
    margin: float
    noise_x: float = 0.0
    noise_y: float = 0.0
    paired: bool = False
    censored: str = ""
    what: str = ""


@dataclasses.dataclass(frozen=True)
class Outcome:
    """A comparison decided: its verdict, effect and interval (``lo``, ``hi``; None with one seed: no interval), the
    margin it was held to and ``what`` it compares."""

    verdict: str
    effect: float
    lo: float | None
    hi: float | None
    margin: float
    what: str = ""
    censored: str = ""

    def cell(self, fmt: str = "+.3f") -> str:
        """ "+0.102 [+0.031, +0.173]" (effect and interval), "+0.102 (1 seed: no interval)"; "(inside ±margin:
        no effect that counts)" when the interval lies within the margin band, "(censored: a bound)" when it rests
        on censored values."""
        if self.lo is None:
            return f"{self.effect:{fmt}} (1 seed: no interval)"
        out = f"{self.effect:{fmt}} [{self.lo:{fmt}}, {self.hi:{fmt}}]"
        if self.margin > 0 and -self.margin <= self.lo and self.hi <= self.margin:
            out += f" (inside ±{self.margin:g}: no effect that counts)"
        return out + (" (censored: a bound)" if self.censored else "")


def seed_difference(x, y, paired: bool = False) -> tuple[float, float, float] | None:
    """(mean(x) - mean(y), its standard error over seeds, degrees of freedom), or None when a side has one seed.
    ``y`` a float: one sample against a bar (df n - 1). ``paired``: the per-seed differences (df n - 1; ValueError
    when the lengths differ). Else Welch: se^2 = s_x^2 / n_x + s_y^2 / n_y, df by Welch-Satterthwaite (n_x + n_y - 2
    when neither side varies)."""
    x = np.asarray(x, dtype=float)
    if isinstance(y, (int, float)):
        d = x - float(y)
    elif paired:
        if len(x) != len(y):
            raise ValueError(f"a paired comparison needs one value per seed on each side, not {len(x)} and {len(y)}")
        d = x - np.asarray(y, dtype=float)
    else:
        y = np.asarray(y, dtype=float)
        if min(len(x), len(y)) < 2:
            return None
        vx, vy = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
        welch = (vx + vy) ** 2 / (vx**2 / (len(x) - 1) + vy**2 / (len(y) - 1)) if vx + vy > 0 else len(x) + len(y) - 2
        return float(x.mean() - y.mean()), math.sqrt(vx + vy), float(welch)
    if len(d) < 2:
        return None
    return float(d.mean()), float(d.std(ddof=1) / math.sqrt(len(d))), float(len(d) - 1)


def interval(c: Comparison, rule: Rule = STATED) -> tuple[float, float | None, float | None]:
    """(effect, lo, hi) of ``c`` under ``rule``. "t": effect ± the quadrature sum of t_{0.975, df} x the seeds' standard
    error and z_{0.975} x the noise the seeds do not show (rule.noise x hypot(noise_x, noise_y)); (effect, None, None)
    with one seed on a side. "band": [min x - max y - w, max x - min y + w], w = rule.noise x (noise_x + noise_y), the
    seed ranges widened by their noise (defined for one seed)."""
    y = (c.y,) if isinstance(c.y, (int, float)) else c.y
    effect = float(np.mean(c.x) - np.mean(y))
    if rule.interval == "band":
        w = rule.noise * (c.noise_x + c.noise_y)
        return effect, min(c.x) - max(y) - w, max(c.x) - min(y) + w
    seeds = seed_difference(c.x, c.y, c.paired)
    if seeds is None:
        return effect, None, None
    _, se, df = seeds
    q = 1 - (1 - LEVEL) / 2
    half = math.hypot(t_quantile(q, df) * se, t_quantile(q, math.inf) * rule.noise * math.hypot(c.noise_x, c.noise_y))
    return effect, effect - half, effect + half


def verdict(lo: float | None, hi: float | None, margin: float, censored: str = "") -> str:
    """Holds when the interval lies entirely above +margin, does not hold when it lies entirely below -margin, within
    noise otherwise (an interval inside ±margin included: no effect that counts; no interval: within noise). A
    verdict the censored values do not establish (``Comparison.censored``) is within noise."""
    if lo is None or hi is None:
        return NOISE
    v = HOLDS if lo > margin else FAILS if hi < -margin else NOISE
    if (v == HOLDS and censored in ("below", "both")) or (v == FAILS and censored in ("above", "both")):
        return NOISE
    return v


def decide(c: Comparison, rule: Rule = STATED) -> Outcome:
    """``c`` decided under ``rule``: :func:`interval`, then :func:`verdict` at rule.margin x c.margin."""
    effect, lo, hi = interval(c, rule)
    m = rule.margin * c.margin
    return Outcome(verdict(lo, hi, m, c.censored), effect, lo, hi, m, c.what, c.censored)


def combine(verdicts: list[str]) -> str:
    """A conjunction: does not hold if any part does not, holds if all hold, else within noise."""
    if FAILS in verdicts:
        return FAILS
    return HOLDS if all(v == HOLDS for v in verdicts) else NOISE


def any_of(verdicts: list[str]) -> str:
    """A disjunction: holds if some part holds, does not hold if every part does not, else within noise."""
    if HOLDS in verdicts:
        return HOLDS
    return FAILS if all(v == FAILS for v in verdicts) else NOISE


def deciding(outcomes: list[Outcome], disjunction: bool = False) -> Outcome:
    """The part that decides a claim of several: of a conjunction, the failing part farthest below (lowest hi) when one
    fails, else the weakest (lowest lo); of a disjunction, the strongest (highest lo). No interval sorts as weakest."""
    low = -math.inf

    def lo(o):
        return low if o.lo is None else o.lo

    if disjunction:
        return max(outcomes, key=lo)
    failing = [o for o in outcomes if o.verdict == FAILS]
    if failing:
        return min(failing, key=lambda o: o.hi)
    return min(outcomes, key=lo)


@dataclasses.dataclass
class Claim:
    """One checked claim: its key (e.g. "iv", "R2"), its text, verdict and the numbers it rests on (``evidence``: the
    effect and interval first, then the robustness and the raw numbers). ``outcome``: the deciding comparison (None:
    undecided or no comparison); ``numbers``: the raw numbers alone; ``alternatives``: (rule name, verdict) under each
    alternative rule it was recomputed under (:func:`with_robustness`)."""

    key: str
    text: str
    verdict: str
    evidence: str
    outcome: Outcome | None = None
    numbers: str = ""
    alternatives: tuple[tuple[str, str], ...] = ()

    @property
    def flips(self) -> list[tuple[str, str]]:
        """The alternatives whose verdict differs from the stated one."""
        return [(name, v) for name, v in self.alternatives if v != self.verdict]

    def robust_cell(self) -> str:
        """ "robust" when no alternative flips the verdict, else "not robust: within noise at tolerance 10, ...";
        "" when it was recomputed under none."""
        if not self.alternatives:
            return ""
        by = {}
        for name, v in self.flips:
            by.setdefault(v, []).append(name)
        return "not robust: " + "; ".join(f"{v} at {', '.join(n)}" for v, n in by.items()) if by else "robust"

    def shown_verdict(self) -> str:
        """The verdict, with "(not robust: ...)" when an alternative rule flips it."""
        return self.verdict if not self.flips else f"{self.verdict} ({self.robust_cell()})"


def decided(
    key: str, text: str, outcomes: list[Outcome], numbers: str, disjunction: bool = False, fmt: str = "+.3f"
) -> Claim:
    """A claim of one or more comparisons: verdict (:func:`combine`, or :func:`any_of` for a ``disjunction``), the
    deciding part's effect and interval first in the evidence, then every part's when there are several, then
    ``numbers``."""
    v = (any_of if disjunction else combine)([o.verdict for o in outcomes])
    d = deciding(outcomes, disjunction)
    parts = f"effect {d.what} {d.cell(fmt)}"
    if len(outcomes) > 1:
        parts += " (parts: " + "; ".join(f"{o.what} {o.cell(fmt)} {o.verdict}" for o in outcomes) + ")"
    return Claim(key, text, v, f"{parts}; {numbers}", d, numbers)


def with_robustness(check: Callable[[Rule], Claim | None], alternatives) -> Claim | None:
    """``check`` under the stated rule, with its verdict under each of ``alternatives`` (rules) recorded
    (``Claim.alternatives``; "robust" or not is appended to the evidence). None when the stated check gives none."""
    stated = check(STATED)
    if stated is None or stated.verdict == UNDECIDED:
        return stated
    alts = tuple((r.name, c.verdict) for r in alternatives if (c := check(r)) is not None)
    out = dataclasses.replace(stated, alternatives=alts)
    out.evidence = f"{out.robust_cell()}; {out.evidence}"
    return out


@dataclasses.dataclass(frozen=True)
class Quantity:
    """A per-scheme distance a study adds to the task reports: ``of(model)`` its value in tokens for a
    ``posenc.model.ModelConfig`` (None where the scheme has none), ``label`` its column heading in each task's distance
    table (rounded to a token; empty where None), ``legend`` what its vertical line on the distance plot (in the
    scheme's colour, line style ``ls``) stands for."""

    label: str
    legend: str
    of: Callable[[Any], float | None]
    ls: str = "-."


@dataclasses.dataclass(frozen=True)
class GapColumns:
    """What a study adds to the spectral-gap table of ``posenc diagnose`` (``posenc.reports.diagnose``):
    ``clause``, appended to the section's first sentence after "; "; ``paragraph``, a paragraph after it;
    ``columns``, (heading, cell(layer_gap, diagnosis) -> text) after the library's columns, one cell per layer."""

    clause: str
    paragraph: str
    columns: tuple[tuple[str, Callable[[Any, Any], str]], ...]


@dataclasses.dataclass(frozen=True)
class ClaimSet:
    """A study's claims. ``text(records, train_length)``: the claims of a text comparison (``Ppl`` records with
    ``ratio``); ``text_markdown(records, train_length)``: its section of the comparison report ("" for none);
    ``tasks(table, meta, text_records)``: the claims of one task (a ``TaskTable``; ``meta``: the run's, with
    ``quantities``: {label: {scheme: value}} of the set's ``quantities``, each scheme's of the spec it trained;
    ``text_records``: the text comparison it is read against, or []). ``title``: the heading of its section in the
    side-by-side report. ``text_section(records, meta, train_length)``: a section of the text report after its
    tables and claims ("" for none; ``meta``: the report's, with ``quantities``); ``text_figures(records, meta,
    train_length)``: {file name: writer(path)} of the figures the text report lists and writes beside it.
    ``gap_columns``: its additions to ``posenc diagnose``'s spectral-gap table (:class:`GapColumns`). A set adds
    claims, columns and report sections; it never renames the library's rows: the records and tables it receives
    name each scheme as its run did, and a set that looks a scheme up under its own name matches the run's by spec
    itself (``encodings.canonical``)."""

    name: str
    title: str
    text: Callable[[list[Any], int], list[Claim]] | None = None
    text_markdown: Callable[[list[Any], int], str] | None = None
    tasks: Callable[[Any, dict, list[Any]], list[Claim]] | None = None
    quantities: tuple[Quantity, ...] = ()
    text_section: Callable[[list[Any], dict, int], str] | None = None
    text_figures: Callable[[list[Any], dict, int], dict[str, Callable[[Path], None]]] | None = None
    gap_columns: GapColumns | None = None


_SETS: dict[str, ClaimSet] = {}


def register_claims(claim_set: ClaimSet) -> ClaimSet:
    """Register ``claim_set`` under its name (a module imported twice replaces its own set); returns it."""
    _SETS[claim_set.name] = claim_set
    return claim_set


def unregister_claims(name: str) -> None:
    """Remove the claim set ``name`` (KeyError if none)."""
    del _SETS[name]


def claim_sets() -> list[ClaimSet]:
    """The registered claim sets, in registration order, after the plugins (``encodings.plugin_modules``) loaded."""
    encodings.plugin_modules()
    return list(_SETS.values())


def text_claims(records: list[Any], train_length: int) -> list[tuple[ClaimSet, Claim]]:
    """Each registered set's claims of a text comparison, with their set."""
    return [(cs, c) for cs in claim_sets() if cs.text for c in cs.text(records, train_length)]


def text_claims_markdown(records: list[Any], train_length: int) -> str:
    """The comparison report's claims sections: each registered set's ``text_markdown``."""
    return "".join(cs.text_markdown(records, train_length) for cs in claim_sets() if cs.text_markdown)


def quantities() -> list[Quantity]:
    """Every registered set's quantities, in registration order."""
    return [q for cs in claim_sets() for q in cs.quantities]


def scheme_quantities(preset: Preset, schemes: set[str] = frozenset()) -> dict[str, dict[str, float | None]]:
    """{label: {spec: value}} of every registered quantity over the preset's schemes, the sweep variants its jobs
    train (``posenc.config.plan.scheme_values``) and ``schemes`` (records of schemes the preset no longer lists).
    Raises PosencError for a grid point whose settings are invalid."""
    out = {}
    for q in quantities():
        values = scheme_values(preset, q.of)
        out[q.label] = values | {s: q.of(dataclasses.replace(preset.model, encoding=s)) for s in schemes - set(values)}
    return out


def text_sections_markdown(records: list[Any], meta: dict, train_length: int) -> str:
    """Each registered set's ``text_section`` of a text comparison's report."""
    return "".join(cs.text_section(records, meta, train_length) for cs in claim_sets() if cs.text_section)


def text_figures(records: list[Any], meta: dict, train_length: int) -> dict[str, Callable[[Path], None]]:
    """{file name: writer(path)} of every registered set's figures of a text comparison."""
    sets = [cs for cs in claim_sets() if cs.text_figures]
    return {k: f for cs in sets for k, f in cs.text_figures(records, meta, train_length).items()}


def task_claims(table: Any, meta: dict, text_records: list[Any]) -> list[Claim]:
    """Every registered set's claims of one task's table."""
    return [c for cs in claim_sets() if cs.tasks for c in cs.tasks(table, meta, text_records)]


def claims_table(claims: list[Claim]) -> str:
    """The markdown table of ``claims``: claim (key and text), verdict, effect with its 95% interval, robust or not
    (the rules that flip it), numbers."""
    return markdown_table(
        ["claim", "verdict", "effect [95% interval]", "robust", "numbers"],
        [
            [
                f"({c.key}) {c.text}",
                f"**{c.verdict}**",
                f"{c.outcome.what} {c.outcome.cell()}" if c.outcome else "",
                c.robust_cell(),
                c.numbers or c.evidence,
            ]
            for c in claims
        ],
    )


def robustness_table(claims: list[Claim]) -> str:
    """The markdown table of each claim's verdict under every alternative rule it was recomputed under (a column per
    rule, empty where the rule does not apply to it; a flipped verdict in bold), and whether it is robust. "" when no
    claim was recomputed."""
    rules = list(dict.fromkeys(name for c in claims for name, _ in c.alternatives))
    if not rules:
        return ""
    rows = []
    for c in claims:
        alt = dict(c.alternatives)
        cells = [("" if r not in alt else alt[r] if alt[r] == c.verdict else f"**{alt[r]}**") for r in rules]
        rows.append(
            [f"({c.key})", c.verdict, *cells, "yes" if c.alternatives and not c.flips else "no" if c.flips else ""]
        )
    return markdown_table(["claim", "stated rule", *rules, "robust"], rows)
