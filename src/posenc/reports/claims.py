"""Claims checked on a comparison: verdicts, and the registry of claim sets a report checks.

A claim set is a study's hypotheses written as code (``ClaimSet``): checks of a text comparison's perplexity records
and of a task comparison's table (``posenc.reports.tasks.TaskTable``), each returning ``Claim``s with a verdict.
posenc ships none: a study registers its own (``register_claims``) in a module loaded as a plugin
(``posenc --import experiments/accumulated/claims.py``, or ``POSENC_IMPORT``: ``posenc.encodings.import_schemes``),
and every report of that process checks them. The verdict vocabulary is shared: a comparison *holds*, *does not
hold*, is *within noise*, or is *undecided* (a scheme it needs did not learn).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from posenc import encodings
from posenc.reports.render import markdown_table

HOLDS, FAILS, NOISE, UNDECIDED = "holds", "does not hold", "within noise", "undecided"


@dataclasses.dataclass
class Claim:
    """One checked claim: its key (e.g. "iv", "R2"), its text, verdict and the numbers it rests on."""

    key: str
    text: str
    verdict: str
    evidence: str


def band(values: list[float], noise: float) -> tuple[float, float]:
    """The seed range of ``values`` widened by a relative ``noise`` on each side."""
    return min(values) * (1 - noise), max(values) * (1 + noise)


def at_most(x: list[float], y: list[float], x_noise: float = 0.0, y_noise: float = 0.0) -> str:
    """Verdict of x <= y over seeds, each side widened by its relative noise: holds if x's band lies at or
    below y's, does not hold if it lies above, else within noise."""
    (x_lo, x_hi), (y_lo, y_hi) = band(x, x_noise), band(y, y_noise)
    if x_hi <= y_lo:
        return HOLDS
    return FAILS if x_lo > y_hi else NOISE


def exceeds(x: list[float], t: float, noise: float = 0.0) -> str:
    """Verdict of x > t over seeds: holds if x's band lies above t, does not hold if at or below, else within noise."""
    lo, hi = band(x, noise)
    if lo > t:
        return HOLDS
    return FAILS if hi <= t else NOISE


def combine(verdicts: list[str]) -> str:
    """A conjunction: does not hold if any part does not, holds if all hold, else within noise."""
    if FAILS in verdicts:
        return FAILS
    return HOLDS if all(v == HOLDS for v in verdicts) else NOISE


def role_names(schemes, roles: list[str]) -> dict[str, str]:
    """scheme as a run spells it -> the role it plays (its own name when it plays none): a scheme plays a role when
    their canonical specs agree (``encodings.canonical``: rope:rope_theta=10000 is rope)."""
    keys = encodings.by_role(roles)
    return {s: keys.get(encodings.canonical(s), s) for s in set(schemes)}


@dataclasses.dataclass(frozen=True)
class ClaimSet:
    """A study's claims. ``text(records, train_length)``: the claims of a text comparison (``Ppl`` records with
    ``ratio``); ``text_markdown(records, train_length)``: its section of the comparison report ("" for none);
    ``tasks(table, meta, text_records)``: the claims of one task (a ``TaskTable``; ``meta``: the run's, with
    ``mixing_windows``; ``text_records``: the text comparison it is read against, or []). ``roles``: the scheme names
    its checks use (a run's scheme takes one when their canonical specs agree). ``title``: the heading of its section
    in the side-by-side report."""

    name: str
    title: str
    roles: tuple[str, ...] = ()
    text: Callable[[list[Any], int], list[Claim]] | None = None
    text_markdown: Callable[[list[Any], int], str] | None = None
    tasks: Callable[[Any, dict, list[Any]], list[Claim]] | None = None


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


def roles() -> list[str]:
    """Every role a registered claim set names, once each."""
    return list(dict.fromkeys(r for cs in claim_sets() for r in cs.roles))


def text_claims(records: list[Any], train_length: int) -> list[tuple[ClaimSet, Claim]]:
    """Each registered set's claims of a text comparison, with their set."""
    return [(cs, c) for cs in claim_sets() if cs.text for c in cs.text(records, train_length)]


def text_claims_markdown(records: list[Any], train_length: int) -> str:
    """The comparison report's claims sections: each registered set's ``text_markdown``."""
    return "".join(cs.text_markdown(records, train_length) for cs in claim_sets() if cs.text_markdown)


def task_claims(table: Any, meta: dict, text_records: list[Any]) -> list[Claim]:
    """Every registered set's claims of one task's table."""
    return [c for cs in claim_sets() if cs.tasks for c in cs.tasks(table, meta, text_records)]


def claims_table(claims: list[Claim]) -> str:
    """The markdown table of ``claims``: claim (key and text), verdict, numbers."""
    return markdown_table(
        ["claim", "verdict", "numbers"], [[f"({c.key}) {c.text}", f"**{c.verdict}**", c.evidence] for c in claims]
    )
