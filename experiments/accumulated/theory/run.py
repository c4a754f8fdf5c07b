"""Run all five theory checks, then write plots, ``summary.md`` and ``results.json``."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from pydantic import BaseModel, ConfigDict, Field
from tqdm import tqdm

from experiments.accumulated.theory import decay, mass, mixing, plots, scores
from experiments.accumulated.theory.steps import SO2Uniform, parse_dist
from experiments.accumulated.window import check_eps
from posenc.errors import PosencError
from posenc.reports.render import markdown_table
from posenc.store.checkpoint import atomic_write_bytes
from posenc.store.presets import load_flat

DEFAULT_DISTS = ("so2:1", "so2:0.5", "so2:2", "so2-drift", "householder", "haar")
DEFAULT_DIMS = (8, 16, 32, 64, 128)
BUDGETS = Path(__file__).with_name("budgets")  # full.yaml, quick.yaml


class Budget(BaseModel):
    """Sample sizes of the checks (presets ``budgets/{full,quick}.yaml`` beside this file): full fits in about
    a minute on one core, quick in seconds."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    mix_samples: int = Field(gt=0)
    mix_matrix_samples: int = Field(gt=0)  # householder / haar: d x d products per sample
    context_lengths: tuple[int, ...]
    context_samples: int = Field(gt=0)
    gap_samples: int = Field(gt=0)
    gap_householder_samples: int = Field(gt=0)
    mass_Ms: tuple[int, ...]
    mass_samples: int = Field(gt=0)
    value_Ms: tuple[int, ...]
    value_samples: int = Field(gt=0)
    decay_max_dist: int = Field(gt=0)
    decay_samples: int = Field(gt=0)


class Row(NamedTuple):
    """One row of the summary table; ``simulation`` states the tolerance the check is held to."""

    check: str
    prediction: str  # the bound or closed form
    simulation: str
    holds: bool


@dataclass(frozen=True)
class Check:
    """One Monte Carlo check of the theory command: what it samples and how it is reported.

    ``sample()`` simulates and compares with the closed form or bound within a
    tolerance set by the sample size (:func:`experiments.accumulated.theory.stats.compare`); it
    returns a JSON-ready dict with ``holds``, stored as results[key][name]
    (results[key] when ``name`` is None), or raises PosencError when the check
    does not apply (it is then skipped). ``rows(result)`` are its table rows.
    """

    key: str
    name: str | None
    sample: Callable[[], dict]
    rows: Callable[[dict], list[Row]]


def run_check(check: Check, results: dict) -> list[dict]:
    """Run ``check`` and store its result (or why it was skipped) in ``results``.

    ``results`` needs the dicts ``skipped`` and, for a named check, ``results[check.key]``.
    Returns the rows {check, prediction, simulation, holds} (str, str, str, bool); none if skipped.
    """
    try:
        value = check.sample()
    except PosencError as exc:  # a distribution without a far regime, e.g. so2-drift
        results["skipped"][f"{check.key} {check.name}" if check.name else check.key] = str(exc)
        return []
    if check.name:
        results[check.key][check.name] = value
    else:
        results[check.key] = value
    return [{**row._asdict(), "holds": bool(row.holds)} for row in check.rows(value)]


def load_budget(name: str, overrides: dict | None = None) -> Budget:
    """A budget of ``BUDGETS`` (``full``, ``quick``) or a YAML path, ``overrides`` ({key: value}, the command's
    ``--set``) replacing its keys; PosencError (one line) if invalid."""
    return load_flat(Budget, name, BUDGETS, "theory budget", overrides)


def run_theory(
    out: str | Path = "runs/theory",
    dists: tuple[str, ...] = DEFAULT_DISTS,
    dims: tuple[int, ...] = DEFAULT_DIMS,
    mix_dim: int = 16,
    eps: float = 0.01,
    seed: int = 0,
    quick: bool = False,
    preset: str | None = None,
    overrides: dict | None = None,
) -> dict:
    """Run every check, write ``out``/{summary.md, results.json, *.png}; return the report dict.

    ``dists`` are step distributions (:func:`experiments.accumulated.theory.steps.parse_dist`) for
    the mixing and score-gap checks; ``mix_dim`` is d for the mixing, far-mass and
    value checks; ``dims`` are the dimensions of the score-gap check. The first
    ``so2:<a>`` distribution (else so2:1) drives the context, far-mass and value checks. The sample sizes: the
    budget ``preset`` (a shipped name or a YAML path; default ``quick`` with ``quick``, else ``full``) with
    ``overrides`` ({key: value}) replacing its keys (:func:`load_budget`).
    """
    check_eps(eps)
    if not dists or not dims:
        raise PosencError("need at least one distribution and one dimension")
    if Path(out).exists() and not Path(out).is_dir():  # found before the checks run, not when writing their results
        raise PosencError(f"--out {out} is a file; give a folder (new or existing)")
    steps = [parse_dist(s, d) for s in dists for d in (mix_dim, *dims)]  # validate before any work
    so2 = next((s for s in steps if isinstance(s, SO2Uniform)), SO2Uniform(mix_dim, 1.0))
    budget = load_budget(preset or ("quick" if quick else "full"), overrides)
    checks = _checks(list(dict.fromkeys(dists)), tuple(dims), mix_dim, eps, seed, so2.a, budget)
    start = time.perf_counter()
    results, table = {"mixing": {}, "score_gap": {}, "skipped": {}}, []
    with _torch_threads(1):  # small tensors: one thread is faster and leaves the shared cores free
        for check in tqdm(checks, desc="posenc theory", unit="check", disable=None):
            table += run_check(check, results)
    runtime = time.perf_counter() - start
    config = {
        "dists": list(dists),
        "dims": list(dims),
        "mix_dim": mix_dim,
        "eps": eps,
        "seed": seed,
        "quick": quick,
        "budget": budget.model_dump(),
    }
    report = {
        "config": config,
        "runtime_s": runtime,
        "all_hold": all(r["holds"] for r in table),
        "table": table,
        "results": results,
    }
    _write(Path(out), report)
    return report


def _checks(names: list[str], dims, mix_dim, eps, seed, a, b: Budget) -> list[Check]:
    """Every check in table order; each samples with its own seed."""

    def mix(name):
        matrix = name in ("householder", "haar")
        return Check(
            "mixing",
            name,
            lambda: mixing.mixing_check(
                name,
                mix_dim,
                eps,
                b.mix_matrix_samples if matrix else b.mix_samples,
                n_max=4 if name == "haar" else None,
                seed=seed,
            ),
            _mixing_rows,
        )

    def gap(name):
        n = b.gap_householder_samples if name == "householder" else b.gap_samples
        return Check("score_gap", name, lambda: scores.score_gap(name, dims, eps, n, seed=seed + 1), _gap_rows)

    so2 = f"so2:{a:g}"
    return [
        *[mix(name) for name in names],
        Check(
            "window_vs_context",
            None,
            lambda: mixing.window_vs_context(so2, mix_dim, b.context_lengths, eps, b.context_samples, seed=seed + 2),
            _context_rows,
        ),
        *[gap(name) for name in names],
        Check(
            "far_mass",
            None,
            lambda: mass.far_mass(Ms=b.mass_Ms, d=mix_dim, a=a, samples=b.mass_samples, seed=seed + 3),
            _mass_rows,
        ),
        Check(
            "value",
            None,
            lambda: mass.value_incoherence(Ms=b.value_Ms, d=mix_dim, a=a, samples=b.value_samples, seed=seed + 4),
            _value_rows,
        ),
        Check(
            "decay",
            None,
            lambda: decay.long_range_decay(max_dist=b.decay_max_dist, samples=b.decay_samples, seed=seed + 5),
            _decay_rows,
        ),
        Check("translation", None, lambda: decay.translation_invariance(seed=seed + 6), _translation_rows),
    ]


@contextmanager
def _torch_threads(n: int):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


# ---- table rows: one function per check (Check.rows), each row check | prediction | simulation | holds


def _g(x: float, digits: int = 3) -> str:
    return "inf" if x is None or x == math.inf else f"{x:.{digits}g}"


def _mixing_rows(r: dict) -> list[Row]:
    forms = {"so2-drift": "beta_b = |sin w_b / w_b|", "householder": "beta = 1 - E[beta_H]/d", "haar": "beta = ||E U||"}
    form = forms.get(r["dist"].split(":")[0], "beta = |sin a / a|")
    if r["dist"].startswith("so2-drift"):
        b = r["blocks"]
        pred = (
            f"{form} in [{_g(min(b['beta']), 4)}, {_g(max(b['beta']), 10)}]; ‖E P_n‖ = beta^n; "
            f"w_b = {_g(min(b['window']))} .. {_g(max(b['window']))}"
        )
        sim = f"per-block max err {_g(b['max_error'])} (tol {_g(b['tolerance'])}); op-norm max err {_g(r['max_error'])}"
    else:
        pred = f"{form} = {_g(r['beta'], 4)}; ‖E P_n‖ = beta^n; w_eps = {_g(r['window'])}"
        sim = (
            f"‖mean M‖ = {_g(r['beta_mc'], 4)}; max_n err {_g(r['max_error'])} "
            f"(tol {_g(r['tolerance'])}, N={r['samples']})"
        )
    return [Row(f"1 mixing {r['dist']} (d={r['d']}, eps={r['eps']:g})", pred, sim, r["holds"])]


def _context_rows(r: dict) -> list[Row]:
    ctx = r["contexts"]
    sim = "; ".join(f"L={c['length']}: w={c['window_sim']} (±{c['tolerance']:.1f})" for c in ctx)
    return [Row(f"1 window vs context {r['dist']}", f"w_eps = {r['window']} for every L", sim, r["holds"])]


def _gap_rows(r: dict) -> list[Row]:
    t = 0.5
    ti = min(range(len(r["thresholds"])), key=lambda i: abs(r["thresholds"][i] - t))
    bound = {"haar": "Levy 2exp(-d t^2/2)", "householder": "Chebyshev E[s^2]/t^2"}.get(r["dist"], "Hoeffding")
    dims = "/".join(str(p["d"]) for p in r["per_dim"])
    last = r["per_dim"][-1]
    pred = (
        f"P(|s_far|>{t}) <= {bound}: "
        + "/".join(_g(p["tail_bound"][ti], 2) for p in r["per_dim"])
        + f" (d={dims}); E s_near = {_g(last['near_pred'], 3)} (n={last['n_near']}, d={last['d']})"
    )
    sim = (
        "tail "
        + "/".join(_g(p["tail_sim"][ti], 2) for p in r["per_dim"])
        + "; far std "
        + "/".join(_g(p["far_std"], 2) for p in r["per_dim"])
        + f"; near mean {_g(last['near_mean'], 3)}"
    )
    return [Row(f"2 score gap {r['dist']} (n_far = 2w)", pred, sim, r["holds"])]


def _mass_rows(r: dict) -> list[Row]:
    m0, m1, c = r["Ms"][0], r["Ms"][-1], r["checks"]
    span = f"M={m0}..{m1}"
    mean = r["rho_mean"]
    return [
        Row(
            f"3 far mass, bounded logits (K={r['K']}, lambda={r['lambda']:g})",
            f"rho_D >= M/(M+K e^(2 lambda)): {_g(r['lower_bound'][0])} -> {_g(r['lower_bound'][-1])} ({span})",
            f"min rho_D {_g(r['rho_min']['none'][0])} -> {_g(r['rho_min']['none'][-1], 4)}; "
            f"worst case attains the bound: {'yes' if c['tight'] else 'no'}",
            c["bound"] and c["tight"],
        ),
        Row(
            f"3 far mass, ALiBi slope {r['alibi_slope']:g}",
            f"rho_D <= 1/(1+e^(-2 lambda)(e^(mK)-1)) = {_g(r['alibi_sup'])} for all M",
            f"mean rho_D {_g(mean['alibi'][0])} -> {_g(mean['alibi'][-1])}, max {_g(max(r['rho_max']['alibi']))}",
            c["alibi"],
        ),
        Row(
            f"3 far mass, forget gate z~N({r['gate']['mu']:g},{r['gate']['sigma']:g})",
            f"E rho_D <= {_g(r['forget_gate_sup'])} for all M (Jensen, E f = {_g(r['gate']['mean'])})",
            f"mean rho_D {_g(mean['forget_gate'][0])} -> {_g(mean['forget_gate'][-1])}",
            c["forget_gate"],
        ),
    ]


def _value_rows(r: dict) -> list[Row]:
    lo, hi = r["per_M"][0], r["per_M"][-1]
    pred = (
        f"coherent ‖Cov‖ = rho_D^2 + Σa^2 = {_g(hi['coherent'])}; incoherent E tr(Cov)/d = "
        f"Σ a_j a_l beta^|j-l| + Σa^2 = {_g(hi['incoherent_pred'])} (M={hi['M']})"
    )
    sim = (
        f"incoherent tr/d {_g(hi['incoherent_trace'])} ± {_g(hi['incoherent_se'], 2)}, "
        f"‖Cov‖ {_g(hi['incoherent'])}; "
        f"coherent/incoherent {_g(lo['coherent'] / lo['incoherent'])}x (M={lo['M']}) -> "
        f"{_g(hi['coherent'] / hi['incoherent'])}x (M={hi['M']})"
    )
    return [Row("4 value-side incoherence (SO(2) vs identity)", pred, sim, r["holds"])]


def _decay_rows(r: dict) -> list[Row]:
    rows = []
    for name, s in r["schemes"].items():
        if "holds" not in s:  # closed form only: reported as a note
            continue
        at = ", ".join(f"{_g(v, 2)}@{D}" for D, v in s["at"].items())
        rows.append(
            Row(
                f"5 decay {name} (d={r['d']})",
                f"E s(D)/E s(0): {at}; far |.| {_g(s['far_residual'], 2)}",
                f"max |MC - closed| = {s['max_z_error']:.2f} SE (tol {r['z']:.2f})",
                s["holds"],
            )
        )
    return rows


def _translation_rows(r: dict) -> list[Row]:
    s = r["schemes"]
    groups = {
        "relative: " + ", ".join(decay.TRANSLATION_INVARIANT): (
            decay.TRANSLATION_INVARIANT,
            "invariant: s(i+s, j+s) = s(i, j)",
        ),
        "additive sinusoidal, accumulated i.i.d.": (("sinusoidal", "accumulated-iid"), "not invariant"),
        "accumulated, token-id angles, same tokens in between": (("accumulated-token",), "invariant"),
    }
    rows = []
    for label, (names, pred) in groups.items():
        sim = "rel change " + ", ".join(f"{_g(s[n]['rel_change'], 2)}" for n in names) + f" (shifts {r['shifts']})"
        rows.append(Row(f"5 translation {label}", pred, sim, all(s[n]["holds"] for n in names)))
    return rows


# ---- outputs


def checks_table(rows: list[dict]) -> str:
    """The summary table: one markdown row per row dict of :func:`run_check`."""
    return markdown_table(
        ["check", "prediction (bound / closed form)", "simulation", "holds"],
        [[r["check"], r["prediction"], r["simulation"], "yes" if r["holds"] else "**no**"] for r in rows],
    )


def _summary_markdown(report: dict, plot_files: list[str]) -> str:
    c, rows = report["config"], report["table"]
    held = sum(r["holds"] for r in rows)
    parts = [
        "# posenc theory: stylized model of accumulated transports",
        f'Paper: "Why do accumulated transformations extrapolate?" (arXiv 2606.24975); survey seeds/003. '
        f"Seed {c['seed']}, eps {c['eps']}, mixing d={c['mix_dim']}, score-gap d={c['dims']}"
        f"{', quick budget' if c['quick'] else ''}; float64; runtime {report['runtime_s']:.1f} s. "
        f"**{held}/{len(rows)} checks hold.**",
        checks_table(rows),
    ]
    survey = report["results"].get("decay", {}).get("schemes", {}).get("pope-survey-sign")
    if survey:
        at = ", ".join(f"{_g(v, 2)} at D={D}" for D, v in survey["at"].items())
        parts.append(
            "Note: PoPE with the survey's frequencies base^((c-1)/d) (minus sign dropped) has no locality: "
            f"E s(D)/E s(0) = {at}; see `decay.png` (dotted)."
        )
    if report["results"]["skipped"]:
        parts.append("Skipped:\n" + "\n".join(f"- {k}: {v}" for k, v in report["results"]["skipped"].items()))
    parts.append("Plots: " + ", ".join(f"`{p}`" for p in plot_files))
    return "\n\n".join(parts) + "\n"


def _write(out: Path, report: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    written = plots.write_all(out, report["results"])
    atomic_write_bytes(out / "summary.md", _summary_markdown(report, [p.name for p in written]).encode())
    atomic_write_bytes(out / "results.json", json.dumps(_finite(report), indent=1, allow_nan=False).encode())


def _finite(obj):
    """JSON has no inf/nan: write them as null (an infinite window means 'no window')."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
